"""The device D quantizer (``kernels/blockscaled/quantize_d.py``) against the reference's
quantizers on the same fp32 input, on the same GPU: ``quantize_d_row`` / ``quantize_d_col``
(global and ``discrete_col_sfd`` SFD_col) and the plain saturating conversion
(``formats.encode_fp8``). Bytes must be identical, on random data and on the hard cases: NaN
and infinities in blocks, all-zero blocks, huge and subnormal magnitudes (e8m0 codes 0, 1 and
the round-up near a power of two), round-to-nearest-even ties, norm_const 1, 3.7 and 1/1024,
an expert without rows, SFD padding entries (2N = 192: half an SFD_row k-atom and half an
SFD_col column atom), rows past the last offset (poisoned before, unchanged after), a single
group (offsets never read: a null pointer)."""
import pytest
import torch

from cudnn_ext.quant import formats as F
from cudnn_ext.quant.sf_layout import ATOM_ELEMS, empty_sf, sf_numel, sf_shape, storage_of
from cudnn_ext.reference.blockscaled import quantize_d_col, quantize_d_row
from gpu_skips import needs_cuda_and_dsl

pytestmark = pytest.mark.gpu

POISON = 0xFF  # e4m3 / e5m2 -NaN, e8m0 NaN: never a value the quantizer writes by accident




def _hard_input(m, two_n, seed):
    """fp32 (M, 2N): random magnitudes spread over fp32's range per 32-row band, with the
    hard cases planted at fixed places (all inside the first 768 rows)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, two_n, device="cuda", generator=g)
    x *= torch.exp2(torch.randint(-60, 60, (m // 32, 1, 1), device="cuda", generator=g)
                    .float()).expand(-1, 32, 1).reshape(m, 1)
    nan, inf = float("nan"), float("inf")
    # NaN in a row and a column block (a positive NaN: inside a scaled block a NaN becomes
    # the product x * NaN, whose sign is the multiply's, not the input's)
    x[3, 5], x[40, 33], x[41, 100] = nan, nan, inf
    x[100, 70] = -inf
    x[128:160, 32:64] = 0.0                                    # an all-zero 32 x 32 block
    x[160:192, :] = -0.0                                       # negative zeros
    x[192:224, 0:64] = 3.0e38                                  # near FLT_MAX
    x[193, 1] = torch.finfo(torch.float32).max
    x[224:256, 64:128] = 1.0e-40                               # fp32 subnormals: code 0
    x[225, 65] = 2.0 ** -127 * 448                             # s exactly 2^-127
    x[260, 0:32] = 2.0 ** -120                                 # tiny, normal
    # round-up at a power of two: s = amax / 448 exactly 2^3 (keeps the code), and one ulp
    # above it (rounds up) in the next row
    x[300, 0:32] = 1.0
    x[300, 7] = 448.0 * 8
    x[301, 0:32] = 1.0
    x[301, 7] = torch.nextafter(torch.tensor(448.0 * 8), torch.tensor(1e9)).item()
    # e4m3 ties with scale 1 (amax 448): 1.0625 -> 1.0, 1.1875 -> 1.25, 17 -> 16, 19 -> 20
    x[302, 32:64] = torch.tensor([448.0, 1.0625, 1.1875, -1.0625, 17.0, 19.0, -19.0, 0.0] * 4)
    # subnormal e4m3 results and the smallest: 2^-9 ties to 0 / 2^-9 * 3 to 2^-8
    x[303, 64:96] = torch.tensor([448.0, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -9, -2.0 ** -9,
                                  2.0 ** -6, 0.0, 1.0] * 4)
    return x


def _launch(cfg, x, outs, offs, nc, m, two_n, groups):
    from cudnn_ext.kernels.blockscaled.launch import launch_quantize_d

    kw = {}
    if cfg.scales:
        kw = dict(d_col=outs["d_col"].data_ptr(), sfd_row=outs["sfd_row"].data_ptr(),
                  sfd_col=outs["sfd_col"].data_ptr(), norm_const=nc.data_ptr())
    launch_quantize_d(cfg, x.data_ptr(), outs["d_row"].data_ptr(), m, two_n, groups,
                      torch.cuda.current_stream().cuda_stream,
                      offsets=0 if offs is None else offs.data_ptr(), **kw)
    torch.cuda.synchronize()


def _poisoned(m, two_n, dtype=torch.float8_e4m3fn):
    d = lambda: torch.full((m, two_n), POISON, dtype=torch.uint8, device="cuda").view(dtype)  # noqa: E731
    return dict(d_row=d(), d_col=d(),
                sfd_row=empty_sf(m, two_n // 32, dtype=torch.float8_e8m0fnu, device="cuda", fill=POISON),
                sfd_col=empty_sf(two_n, m // 32, dtype=torch.float8_e8m0fnu, device="cuda", fill=POISON))


def _expected(x, nc, ends, last, discrete):
    """What the reference engine's ``finish_outputs`` writes into poisoned outputs: rows
    below ``last``, the SFD_row row atoms and SFD_col k atoms (or per-expert regions) that
    cover them; everything else keeps the poison."""
    m, two_n = x.shape
    want = _poisoned(m, two_n)
    q_row, sf_row = quantize_d_row(x, nc)
    q_col, sf_col = quantize_d_col(x, nc, padded_offsets=ends, discrete_col_sfd=discrete)
    want["d_row"][:last] = q_row[:last]
    want["d_col"][:last] = q_col[:last]
    want["sfd_row"][:, :, :last // 128] = sf_row[:, :, :last // 128]
    if not discrete:
        want["sfd_col"][:, :, :, :, :last // 128] = sf_col[:, :, :, :, :last // 128]
    else:
        dst = storage_of(want["sfd_col"]).reshape(-1)
        src = storage_of(sf_col).reshape(-1)
        rmn, start = sf_shape(two_n, 1)[2], 0
        for end in ends:
            if end > start:
                base = (start // 128) * rmn * ATOM_ELEMS
                n_el = sf_numel(two_n, (end - start) // 32)
                dst[base:base + n_el] = src[base:base + n_el]
            start = end
    return want


def _assert_bytes_equal(got, want, name):
    g = storage_of(got).reshape(-1).view(torch.uint8) if got.dim() == 6 else got.view(torch.uint8)
    w = storage_of(want).reshape(-1).view(torch.uint8) if want.dim() == 6 else want.view(torch.uint8)
    bad = (g != w).nonzero()
    assert bad.numel() == 0, (f"{name}: {bad.shape[0]} bytes differ, first at {bad[:4].tolist()}: "
                              f"got {g[tuple(bad[0])].item():#x}, want {w[tuple(bad[0])].item():#x}")


CASES = [  # (2N, offsets, discrete_col_sfd, norm_const)
    (192, [256, 256, 768], False, 1.0),
    (192, [256, 256, 768], True, 3.7),
    (256, [512, 768, 768], True, 1.0 / 1024),
    (128, [1024], False, 3.7),
]


@pytest.mark.parametrize("two_n,ends,discrete,nc", CASES,
                         ids=[f"2N{c[0]}-{'discrete' if c[2] else 'global'}-nc{c[3]:g}" for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_quantizer_matches_the_reference_bit_for_bit(two_n, ends, discrete, nc, seed):
    needs_cuda_and_dsl()
    from cudnn_ext.kernels.blockscaled.config import QuantizeDConfig

    m = 1024
    x = _hard_input(m, two_n, seed)
    ncs = torch.full((1,), nc, dtype=torch.float32, device="cuda")
    offs = torch.tensor(ends, dtype=torch.int32, device="cuda")
    outs = _poisoned(m, two_n)
    x_before = x.clone()
    _launch(QuantizeDConfig("e4m3", True, discrete_col_sfd=discrete), x, outs, offs, ncs, m,
            two_n, len(ends))
    want = _expected(x, ncs, ends, ends[-1], discrete)
    for k in ("d_row", "d_col", "sfd_row", "sfd_col"):
        _assert_bytes_equal(outs[k], want[k], k)
    assert torch.equal(x.view(torch.int32), x_before.view(torch.int32))  # the input is read only


@pytest.mark.parametrize("discrete", [False, True])
def test_single_group_ends_at_m_and_never_reads_the_offsets(discrete):
    """One group of all M rows: the offsets' address is null (a read would fault), and the
    per-expert layout of one group is the global one."""
    needs_cuda_and_dsl()
    from cudnn_ext.kernels.blockscaled.config import QuantizeDConfig

    m, two_n = 512, 192
    x = _hard_input(m * 2, two_n, 3)[:m].contiguous()
    ncs = torch.full((1,), 3.7, dtype=torch.float32, device="cuda")
    outs = _poisoned(m, two_n)
    cfg = QuantizeDConfig("e4m3", True, single_group=True)
    _launch(cfg, x, outs, None, ncs, m, two_n, 1)
    want = _expected(x, ncs, [m], m, discrete)
    for k in ("d_row", "d_col", "sfd_row", "sfd_col"):
        _assert_bytes_equal(outs[k], want[k], k)


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_plain_conversion_saturates_like_the_reference(fmt, single):
    """FP8 D without scale factors: round to nearest even, saturate at +-qmax (infinities
    too), a NaN stored as its sign and 0x7F (torch's encoding of both formats); only D_row is
    written, rows past the last offset keep their bytes."""
    needs_cuda_and_dsl()
    from cudnn_ext.kernels.blockscaled.config import QuantizeDConfig

    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    m, two_n = 1024, 192
    x = _hard_input(m, two_n, 5)
    x[10, 0:8] = torch.tensor([448.0, 464.0, 480.0, 57344.0, 61440.0, 1e30, -1e30, -464.0])
    x[11, 0:4] = torch.tensor([2.0 ** -17, 2.0 ** -16, 3 * 2.0 ** -17, -2.0 ** -20])
    x[12, 0:2] = torch.tensor([-float("nan"), float("nan")])  # both signs of NaN
    offs = torch.tensor([256, 768], dtype=torch.int32, device="cuda")
    last = m if single else 768
    outs = _poisoned(m, two_n, dtype)
    untouched = {k: v.clone() for k, v in outs.items() if k != "d_row"}
    _launch(QuantizeDConfig(fmt, False, single_group=single), x, outs,
            None if single else offs, None, m, two_n, 2)
    want = torch.full((m, two_n), POISON, dtype=torch.uint8, device="cuda")
    enc = F.encode_fp8(x[:last], dtype).view(torch.uint8).clone()
    nan = torch.isnan(x[:last])
    sign = ((x[:last].view(torch.int32) >> 24) & 0x80).to(torch.uint8)
    enc[nan] = sign[nan] | 0x7F
    want[:last] = enc
    _assert_bytes_equal(outs["d_row"], want, "d_row")
    for k, v in untouched.items():  # D_col and the scales: not written without scales
        _assert_bytes_equal(outs[k], v, k)
