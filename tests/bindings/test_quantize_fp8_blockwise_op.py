"""torch.ops.cudnn_ext.quantize_fp8_blockwise: the reference's bits on the CPU (where it runs
the reference), its fake under FakeTensorMode and torch.compile, the reference's argument
rules, and which tensors the device kernel takes (the rest fall back to the reference)."""
import types

import pytest
import torch

from cudnn_ext.quant import quantize_fp8_blockwise as reference
from cudnn_ext.quant.blockwise import BLOCKS
from cudnn_ext.torch import quant_ops, quantize_fp8_blockwise


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("shape", [(300, 260), (256, 384, 3)])
def test_op_returns_the_references_bits_strides_and_shapes(block, shape):
    x = torch.randn(shape, dtype=torch.bfloat16) * 1e3
    for pow2 in (False, True):
        q, s = quantize_fp8_blockwise(x, block, pow2_scales=pow2)
        q_ref, s_ref = reference(x, block, pow2_scales=pow2)
        assert q.stride() == q_ref.stride() and s.stride() == s_ref.stride()
        assert torch.equal(_bits(q), _bits(q_ref)) and torch.equal(_bits(s), _bits(s_ref))


def test_fake_opcheck_and_compile():
    x = torch.randn(256, 384, 2)
    torch.library.opcheck(torch.ops.cudnn_ext.quantize_fp8_blockwise.default, (x, [128, 128], True),
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))
    q_ref, s_ref = reference(x, (128, 1))
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        q, s = quantize_fp8_blockwise(mode.from_tensor(x), (128, 1))
        assert (q.shape, q.stride(), q.dtype) == (q_ref.shape, q_ref.stride(), q_ref.dtype)
        assert (s.shape, s.stride(), s.dtype) == (s_ref.shape, s_ref.stride(), s_ref.dtype)
    compiled = torch.compile(lambda t: quantize_fp8_blockwise(t, (1, 128)), fullgraph=True)
    got, want = compiled(x[..., 0]), reference(x[..., 0], (1, 128))
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(got, want))


@pytest.mark.parametrize("bad,err,match", [
    (dict(block=(64, 128)), ValueError, r"block: must be one of"),
    (dict(pow2_scales=1), TypeError, r"pow2_scales: expected a bool"),
    (dict(x=torch.zeros(4, 128, dtype=torch.int32)), TypeError, r"x: expected a bfloat16/float16/float32"),
    (dict(x=torch.zeros(128)), ValueError, r"x: expected shape \(rows, K\)")])
def test_argument_rules_are_the_references(bad, err, match):
    args = dict(x=torch.randn(4, 128), block=(1, 128), pow2_scales=False)
    args.update(bad)
    for fn in (quantize_fp8_blockwise, reference):
        with pytest.raises(err, match=match):
            fn(args["x"], args["block"], pow2_scales=args["pow2_scales"])


def _cuda_like(t, ptr=1 << 20, major=9):
    """A stand-in with ``t``'s metadata as a CUDA tensor at ``ptr`` on an sm_``major``0 GPU."""
    return types.SimpleNamespace(is_cuda=True, dtype=t.dtype, shape=t.shape, stride=t.stride, dim=t.dim,
                                 data_ptr=lambda: ptr, element_size=t.element_size, device=("cuda", major))


@pytest.mark.parametrize("make,taken", [
    (lambda: torch.empty(300, 260, dtype=torch.bfloat16), (260, 0)),
    (lambda: torch.empty(4, 256, 384).permute(1, 2, 0), (384, 256 * 384)),  # (N, K, L) weights
    (lambda: torch.empty(300, 640, dtype=torch.float16)[:, 64:576], (640, 0)),  # a column slice
    (lambda: torch.empty(1, 8), (8, 0)),  # one row: its stride is never used
    (lambda: torch.empty(300, 262, dtype=torch.bfloat16), None),  # K % 4
    (lambda: torch.empty(300, 640, dtype=torch.bfloat16)[:, 2:258], None),  # a misaligned start
    (lambda: torch.empty(260, 300, dtype=torch.bfloat16).t(), None),  # K strided
    (lambda: torch.empty(300, 256, dtype=torch.float64), None),  # fp64: the reference
])
def test_kernel_geometry_decides_kernel_or_reference(monkeypatch, make, taken):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (device[1], 0))
    t = make()
    base = t.data_ptr() - t.untyped_storage().data_ptr()  # the view's byte offset
    assert quant_ops.kernel_geometry(_cuda_like(t, (1 << 20) + base)) == taken
    assert quant_ops.kernel_geometry(_cuda_like(t, (1 << 20) + base, major=10)) is None  # sm_100: the reference
    assert quant_ops.kernel_geometry(t) is None  # a CPU tensor: the reference
