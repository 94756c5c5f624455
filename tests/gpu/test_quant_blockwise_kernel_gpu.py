"""The blockwise FP8 quantizer's device kernel (``kernels/blockwise``, behind
``cudnn_ext.torch.quantize_fp8_blockwise``) on an sm_90 GPU: bit for bit the CPU reference
(``cudnn_ext.quant.quantize_fp8_blockwise``) on every block shape, source dtype and the
power-of-two option, over hard data (32 decades of magnitude, fp32 subnormals and their
scale floor, signed zeros, NaN and +-inf blocks, values that round to the e4m3 maximum),
ragged rows and K, 3-D weights; no host sync; CUDA-graph capture; and the masked two-block form
the fp8_blockwise engine runs on FP8 D, which leaves poisoned rows past the last offset as they
were."""
import pytest
import torch

from cudnn_ext.quant import quantize_fp8_blockwise as reference
from cudnn_ext.quant.blockwise import BLOCKS

pytestmark = pytest.mark.gpu


def _skip_unless_sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


def hard_data(shape, seed=0):
    """fp32 values over 2^-150..2^110 by row, with the special cases in known blocks."""
    g = torch.Generator().manual_seed(seed)
    rows = shape[0]
    x = torch.randn(shape, generator=g) * torch.logspace(-150, 110, rows, base=2.0).reshape(
        (rows,) + (1,) * (len(shape) - 1))
    x = x.reshape(rows, shape[1], -1)
    k = shape[1]
    specials = [  # (row, columns, group, value): each where the matrix has it
        (3, slice(0, 64), 0, float("nan")), (140, slice(130, 131), 0, float("inf")),
        (141, slice(7, 8), -1, float("-inf")), (slice(20, 40), slice(128, 256), 0, 0.0),
        (21, slice(129, 140), 0, -0.0), (1, slice(0, 3), 0, -0.0),
        (50, slice(None), 0, 448.0 * (1 + 2.0 ** -10)),  # quotients at and above the maximum
        (60, slice(None), -1, 2.0 ** -149),  # one subnormal magnitude: the 2^-126 floor
    ]
    for r, c, grp, v in specials:
        r0 = r.start if isinstance(r, slice) else r
        if r0 < rows and (c.start or 0) < k:
            x[r, c, grp] = v
    if rows > 51:
        x[51, :, 0] = torch.linspace(-1.0, 1.0, k) * 3e38  # amax near FLT_MAX
    return x.reshape(shape)


def _strides(t):
    """The strides that address something (a size-1 dimension's stride is arbitrary)."""
    return tuple(st for n, st in zip(t.shape, t.stride()) if n > 1)


def _equal_bits(a, b):
    view = torch.uint8 if a.element_size() == 1 else torch.int32
    return torch.equal(a.cpu().view(view), b.cpu().view(view))


@pytest.mark.parametrize("pow2", [False, True], ids=["amax448", "pow2"])
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(300, 260), (256, 384, 3), (129, 4)], ids=str)
def test_kernel_matches_reference_bit_for_bit(shape, dtype, block, pow2):
    _skip_unless_sm90()
    from cudnn_ext.torch import quant_ops

    x = hard_data(shape).to(dtype)
    if len(shape) == 3:  # weights as the op takes them: (L, N, K) storage viewed (N, K, L)
        x = x.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    xg = x.cuda()
    assert quant_ops.kernel_geometry(xg) is not None  # the kernel, not the fallback
    q_ref, s_ref = reference(x, block, pow2_scales=pow2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host sync inside raises
    try:
        q, s = quant_ops.quantize_fp8_blockwise(xg, block, pow2_scales=pow2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert q.shape == q_ref.shape and _strides(q) == _strides(q_ref)
    assert s.shape == s_ref.shape and _strides(s) == _strides(s_ref)
    assert _equal_bits(s, s_ref), (s.cpu() - s_ref).abs().max()
    assert _equal_bits(q, q_ref), (q.cpu().view(torch.uint8) != q_ref.view(torch.uint8)).nonzero()[:8]


def test_strided_rows_and_a_side_stream_and_graph_replay():
    """A row stride past K (a column slice of a wider matrix), on a side stream, then captured
    into a CUDA graph and replayed on new data: each result the reference's."""
    _skip_unless_sm90()
    from cudnn_ext.torch import quantize_fp8_blockwise

    wide = hard_data((384, 640), seed=3).to(torch.bfloat16).cuda()
    x = wide[:, 64:576]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q, s = quantize_fp8_blockwise(x)
    torch.cuda.current_stream().wait_stream(side)
    q_ref, s_ref = reference(x.cpu())
    assert _equal_bits(q, q_ref) and _equal_bits(s, s_ref)
    static = x.clone()
    quantize_fp8_blockwise(static)  # compile and load outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qg, sg = quantize_fp8_blockwise(static)
    static.copy_(hard_data((384, 512), seed=4).to(torch.bfloat16).cuda())
    g.replay()
    torch.cuda.synchronize()
    q_ref, s_ref = reference(static.cpu())
    assert _equal_bits(qg, q_ref) and _equal_bits(sg, s_ref)


def test_masked_two_block_form_keeps_rows_past_the_last_offset():
    """The FP8 D form: fp32 (M, 2N) -> D_row/SFD_row and D_col/SFD_col in one launch; rows
    at or past the last offset, and the 128x1 scales of blocks starting there, keep their
    poison; the rest is the reference's ``quantize_d``."""
    _skip_unless_sm90()
    from cudnn_ext.kernels.blockwise.config import BlockwiseQuantConfig
    from cudnn_ext.kernels.blockwise.launch import launch_quantize
    from cudnn_ext.reference.fp8_blockwise import quantize_d

    m, two_n = 1024, 384
    d32 = hard_data((m, two_n), seed=5).cuda()
    offsets = torch.tensor([256, 256, 640], dtype=torch.int32, device="cuda")  # rows 640.. belong to no expert

    def poisoned():
        e4m3 = torch.float8_e4m3fn
        return dict(padded_offsets=offsets,
                    d_row=torch.full((m, two_n), 0x55, dtype=torch.uint8, device="cuda").view(e4m3),
                    d_col=torch.full((m, two_n), 0x66, dtype=torch.uint8, device="cuda").view(e4m3),
                    sfd_row=torch.full((two_n // 128, m), -7.0, device="cuda").t(),
                    sfd_col=torch.full((two_n, m // 128), -9.0, device="cuda").t())

    mine, ref = poisoned(), poisoned()
    launch_quantize(BlockwiseQuantConfig("fp32", ((1, 128), (128, 1)), masked=True), d32.data_ptr(),
                    mine["d_row"].data_ptr(), mine["sfd_row"].data_ptr(), m, two_n, two_n, 0, 1,
                    torch.cuda.current_stream().cuda_stream, q_b=mine["d_col"].data_ptr(),
                    s_b=mine["sfd_col"].data_ptr(), offsets=offsets.data_ptr(), n_offsets=3)
    quantize_d(d32, ref)
    torch.cuda.synchronize()
    for slot in ("d_row", "d_col", "sfd_row", "sfd_col"):
        assert _equal_bits(mine[slot], ref[slot]), slot
    assert (mine["d_row"].view(torch.uint8)[640:] == 0x55).all()
    assert (mine["sfd_col"][5:] == -9.0).all() and (mine["sfd_col"][:5] != -9.0).all()
