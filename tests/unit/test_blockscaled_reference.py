"""Block-scaled pieces of the reference engine (cudnn_ext.reference.blockscaled) and the
dSiTU-GLU epilogue derivative, on CPU.

Independent routes only: hand-computed scale codes and byte positions, the transposition
identity between the row and column quantizers, the public helpers for dequantization, and
torch autograd of the dSiTU-GLU forward.
Reproduce a failure with: .venv/bin/python -m pytest tests/unit/test_blockscaled_reference.py -q -k <name>
"""
import math

import pytest
import torch

from cudnn_ext.quant import (dequantize, quantize_mxfp8, quantize_nvfp4, sf_offset, storage_of,
                             swizzle_sf, unswizzle_sf)
from cudnn_ext.quant import formats as F
from cudnn_ext.reference.blockscaled import (amax_per_expert, dequantize_a, dequantize_b_expert,
                                             quantize_d_col, quantize_d_row, sfd_col_expert_view)

E8M0 = torch.float8_e8m0fnu
E4M3 = torch.float8_e4m3fn
NAN = float("nan")


def _u8(t):
    return t.view(torch.uint8)


def _seeded(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


# ------------------------------------------------------------------------------------------
# operands
# ------------------------------------------------------------------------------------------

def test_dequantize_a_fp8_and_fp4_forms():
    a = _seeded(256, 96, seed=1)
    q, sf = quantize_mxfp8(a)
    want = dequantize(q, sf, 32)
    assert torch.equal(dequantize_a(q, sf, sf_vec_size=32), want)
    assert torch.equal(dequantize_a(q.unsqueeze(-1), storage_of(sf).reshape(-1), sf_vec_size=32),
                       want)
    p, sf4 = quantize_nvfp4(a)
    got = dequantize_a(p.view(torch.float4_e2m1fn_x2).unsqueeze(-1), sf4, sf_vec_size=16)
    assert got.shape == (256, 96)                       # logical K = 2 x bytes
    assert torch.equal(got, dequantize(p, sf4, 16))
    assert dequantize_a(q, sf, sf_vec_size=32, out_dtype=torch.float64).dtype == torch.float64


def test_dequantize_b_dense_and_discrete():
    b = _seeded(160, 64, 3, seed=2)                     # (N, K, L)
    q, sf = quantize_mxfp8(b)
    for e in range(3):
        qe, sfe = quantize_mxfp8(b[:, :, e].contiguous())
        want = dequantize(qe, sfe, 32)
        assert torch.equal(dequantize_b_expert(q, sf, sf_vec_size=32, expert=e), want)
        # discrete: the expert's own (N, K) matrix and its own SF buffer (flat or 6-D)
        assert torch.equal(dequantize_b_expert(qe, storage_of(sfe).reshape(-1), sf_vec_size=32),
                           want)
        # an n-major (N, K) view of the same values
        qn = qe.t().contiguous().t()
        assert qn.stride() == (1, 160)
        assert torch.equal(dequantize_b_expert(qn, sfe, sf_vec_size=32), want)
    p, sf4 = quantize_nvfp4(b)
    assert torch.equal(dequantize_b_expert(p, sf4, sf_vec_size=16, expert=1),
                       dequantize(p, sf4, 16)[:, :, 1])


def test_dequantize_errors():
    b = _seeded(128, 64, 2)
    q, sf = quantize_mxfp8(b)
    with pytest.raises(ValueError, match=r"expert: dense weights .* need an expert index in \[0, 2\)"):
        dequantize_b_expert(q, sf, sf_vec_size=32)
    with pytest.raises(ValueError, match=r"expert: must be an int in \[0, 2\), got 2"):
        dequantize_b_expert(q, sf, sf_vec_size=32, expert=2)
    with pytest.raises(ValueError, match="expert: must be None"):
        dequantize_b_expert(q[:, :, 0], sf[..., :1], sf_vec_size=32, expert=0)
    with pytest.raises(ValueError, match=r"sfb: .*L=2"):
        dequantize_b_expert(q, sf[..., :1], sf_vec_size=32, expert=0)
    with pytest.raises(ValueError, match="sf_vec_size: must be 16 or 32, got 64"):
        dequantize_a(q[:, :, 0], sf[..., :1], sf_vec_size=64)
    with pytest.raises(TypeError, match="a_q: expected float8"):
        dequantize_a(b[:, :, 0], sf[..., :1], sf_vec_size=32)
    with pytest.raises(ValueError, match=r"a_q: expected \(M, K\) or \(M, K, 1\)"):
        dequantize_a(q, sf, sf_vec_size=32)
    with pytest.raises(ValueError, match="sfa: a contiguous"):
        dequantize_a(q[:, :, 0], torch.zeros(7, dtype=E8M0), sf_vec_size=32)


# ------------------------------------------------------------------------------------------
# quantized D
# ------------------------------------------------------------------------------------------

def test_quantize_d_row_hand_computed():
    d = torch.zeros(2, 64)
    d[0, :3] = torch.tensor([1.0, -0.25, 0.5])           # block (0, 0): amax 1
    d[1, 40] = 3.0                                        # block (1, 1): amax 3
    q, sf = quantize_d_row(d, torch.tensor([4.0]))
    codes = _u8(unswizzle_sf(sf, 2, 2))[..., 0]
    # (0,0): s = fl32(1*fl32(1/448))*4 = 0.00893 in (2^-7, 2^-6] -> SF 2^-6, code 121;
    #        mult = 4 * 2^6 = 256 -> 1.0 -> 256, -0.25 -> -64, 0.5 -> 128
    # (1,1): s = 3/448*4 = 0.0268 in (2^-6, 2^-5] -> code 122; mult = 4*32 = 128 -> 384
    # zero blocks: code 0
    assert codes.tolist() == [[121, 0], [0, 122]]
    assert q[0, :3].float().tolist() == [256.0, -64.0, 128.0]
    assert q[1, 40].float().item() == 384.0
    assert tuple(sf.shape) == (32, 4, 1, 4, 1, 1)
    # d ~= D * SFD / norm_const, exactly here
    back = q.float() * F.decode_e8m0(unswizzle_sf(sf, 2, 2)[..., 0]).repeat_interleave(32, 1) / 4
    assert torch.equal(back, d)


def test_quantize_d_row_equals_mxfp8_helper_at_norm_const_1():
    d = _seeded(256, 192, seed=3, scale=5.0)
    q, sf = quantize_d_row(d.unsqueeze(-1), 1.0)
    q2, sf2 = quantize_mxfp8(d)
    assert torch.equal(_u8(q), _u8(q2)) and torch.equal(_u8(sf), _u8(sf2))


def _bound(d, sf, rows, kbs, nc):
    # half an e4m3 ulp relative to the value (3 mantissa bits), or half the smallest subnormal
    # step of the block (2^-9 * SF), back in d units
    scale = F.decode_e8m0(unswizzle_sf(sf, rows, kbs)[..., 0]).repeat_interleave(32, 1)
    return torch.maximum(d.abs() * 2 ** -4, scale[:, :d.shape[1]] * 2 ** -10 / nc)


def test_quantize_d_round_trip_bound():
    d = _seeded(512, 128, seed=4) * torch.logspace(-4, 4, 128).unsqueeze(0)
    for nc in (1.0, 0.37, 1000.0):
        q, sf = quantize_d_row(d, nc)
        y = dequantize(q, sf, 32) / nc
        assert ((y - d).abs() <= _bound(d, sf, 512, 4, nc)).all(), nc
        qc, sfc = quantize_d_col(d, nc)
        yc = dequantize(qc.t().contiguous(), sfc, 32).t() / nc
        assert ((yc - d).abs() <= _bound(d.t(), sfc, 128, 16, nc).t()).all(), nc


def test_quantize_d_col_is_row_quantizer_of_the_transpose():
    # with norm_const = 1 both associations of the scale product coincide, so the column
    # quantizer of d must be the row quantizer of d^T: D_col = D_row(d^T)^T, SFD_col = SFD_row(d^T)
    d = _seeded(512, 192, seed=5, scale=3.0)
    qc, sfc = quantize_d_col(d, 1.0)
    qr, sfr = quantize_d_row(d.t().contiguous(), 1.0)
    assert torch.equal(_u8(qc), _u8(qr.t()))
    assert tuple(sfc.shape) == (32, 4, 2, 4, 4, 1)     # MN = 2N = 192, k-blocks = 512/32 = 16
    assert torch.equal(_u8(sfc), _u8(sfr))
    assert qc.is_contiguous()


def test_row_and_col_associate_the_scale_product_like_the_kernel():
    # amax = 0x1.c8451p-2, norm_const = 0x1.f6b85cp+2 (both fp32):
    #   row  (amax * fl32(1/448)) * nc = 2^-7 exactly      -> e8m0 code 120
    #   col   amax * (fl32(1/448) * nc) = 2^-7 * (1 + 2^-23) -> rounds up to 2^-6, code 121
    amax = float.fromhex("0x1.c8451p-2")
    nc = float.fromhex("0x1.f6b85cp+2")
    d = torch.zeros(32, 64)
    d[0, 0] = amax
    _, sfr = quantize_d_row(d, nc)
    _, sfc = quantize_d_col(d, nc)
    assert _u8(unswizzle_sf(sfr, 32, 2))[0, 0, 0].item() == 120
    assert _u8(unswizzle_sf(sfc, 64, 1))[0, 0, 0].item() == 121


def test_quantize_d_saturation_and_special_values():
    d = torch.zeros(32, 128)
    d[0, 0] = float("inf")
    d[0, 32], d[0, 33] = NAN, 1.0
    q, sf = quantize_d_row(d, 1.0)
    codes = _u8(unswizzle_sf(sf, 32, 4))[0, :, 0].tolist()
    assert codes == [254, 255, 0, 0]            # inf -> 2^127 (satfinite), NaN -> NaN, zeros -> 0
    assert math.isnan(q[0, 0].float().item())  # inf * rcp_ftz(2^127)=0 -> NaN, as the kernel
    assert q[1, 0].float().item() == 0.0
    assert torch.isnan(q[0, 32:64].float()).all()
    assert q[5, 64:].float().eq(0).all()
    # zero blocks stay 0 in the column direction for every norm_const (see module docstring)
    qc, _ = quantize_d_col(torch.zeros(64, 64), 8.0)
    assert qc.float().eq(0).all()


def test_discrete_col_sfd_per_expert_layout():
    # experts of 256, 0 and 512 rows; M = 1024 leaves rows [768, 1024) outside every expert
    offs = torch.tensor([256, 256, 768], dtype=torch.int32)
    d = _seeded(1024, 64, seed=6)
    q_glob, sf_glob = quantize_d_col(d, 2.0)
    q, sf = quantize_d_col(d, 2.0, padded_offsets=offs, discrete_col_sfd=True)
    assert torch.equal(_u8(q), _u8(q_glob))         # values do not depend on the layout
    assert sf.shape == sf_glob.shape == (32, 4, 1, 4, 8, 1)
    plain = _u8(unswizzle_sf(sf_glob, 64, 32))[..., 0]   # (col, row // 32)
    flat = _u8(storage_of(sf)).reshape(-1)
    # expert 2: rows [256, 768) -> base = (256 // 128) * ceil(64/128) * 512 = 1024; its own
    # layout has MN = 64 columns, k-blocks = 16. Column 33, global row 296 -> local block 1:
    #   offset = (33//128)*RK*512 + (1//4)*512 + (33%32)*16 + ((33//32)%4)*4 + 1%4 = 21
    assert flat[1024 + 21].item() == plain[33, 296 // 32].item()
    assert sf_offset(33, 1, mn=64, k_blocks=16) == 21
    # expert 0: rows [0, 256) at base 0, identical to its own swizzled block
    v0 = sfd_col_expert_view(sf, offs, 0, 64)
    assert torch.equal(_u8(v0), _u8(swizzle_sf(plain[:, :8].view(E8M0))))
    v2 = sfd_col_expert_view(sf, offs, 2, 64)
    assert tuple(v2.shape) == (32, 4, 1, 4, 4, 1)
    assert torch.equal(_u8(unswizzle_sf(v2, 64, 16))[..., 0], plain[:, 8:24])
    # rows past the last offset own no region: their bytes stay 0
    assert flat[(768 // 128) * 512:].eq(0).all()
    with pytest.raises(ValueError, match="expert 1 has no rows"):
        sfd_col_expert_view(sf, offs, 1, 64)


def test_quantize_d_errors():
    d = torch.zeros(512, 64)
    with pytest.raises(NotImplementedError, match="e4m3 alone"):
        quantize_d_row(d, 1.0, torch.float8_e5m2)
    with pytest.raises(TypeError, match="fp8_dtype: expected torch.float8_e4m3fn"):
        quantize_d_col(d, 1.0, torch.bfloat16)
    with pytest.raises(ValueError, match=r"norm_const: expected shape \(1,\)"):
        quantize_d_row(d, torch.ones(2))
    with pytest.raises(TypeError, match="norm_const: expected a float"):
        quantize_d_row(d, "1.0")
    with pytest.raises(TypeError, match="d: expected the fp32 dGLU result"):
        quantize_d_row(d.to(torch.int32), 1.0)
    with pytest.raises(ValueError, match=r"d: expected a non-empty \(M, 2N\)"):
        quantize_d_col(torch.zeros(512), 1.0)
    with pytest.raises(ValueError, match="padded_offsets: required when discrete_col_sfd=True"):
        quantize_d_col(d, 1.0, discrete_col_sfd=True)
    with pytest.raises(ValueError, match=r"multiple of 256, got padded_offsets\[0\]=128"):
        quantize_d_col(d, 1.0, padded_offsets=[128, 512], discrete_col_sfd=True)
    with pytest.raises(ValueError, match=r"non-decreasing .* padded_offsets\[1\]=256 after 512"):
        quantize_d_col(d, 1.0, padded_offsets=[512, 256], discrete_col_sfd=True)
    with pytest.raises(ValueError, match="last offset 768 exceeds the 512 rows"):
        quantize_d_col(d, 1.0, padded_offsets=[256, 768], discrete_col_sfd=True)
    with pytest.raises(TypeError, match="padded_offsets: expected a 1-D integer tensor"):
        quantize_d_col(d, 1.0, padded_offsets=torch.tensor([256.0]), discrete_col_sfd=True)
    with pytest.raises(TypeError, match="discrete_col_sfd: expected a bool"):
        quantize_d_col(d, 1.0, discrete_col_sfd=1)


# ------------------------------------------------------------------------------------------
# amax
# ------------------------------------------------------------------------------------------

def test_amax_per_expert():
    dgate = torch.zeros(768, 32)
    dup = torch.zeros(768, 32)
    dgate[10, 3] = -5.0          # expert 0: negative values count by magnitude
    dup[300, 0] = 2.0            # expert 2 (rows [256, 768))
    dup[301, 1] = NAN            # NaN is ignored, as the kernel's NaN-quiet fmax
    dgate[700, 5] = -0.5         # a padding row inside expert 2's range still counts
    amax = amax_per_expert(dgate, dup, torch.tensor([256, 256, 768]))
    assert amax.dtype == torch.float32 and tuple(amax.shape) == (3, 2)
    assert amax[0].tolist() == [5.0, 0.0]        # all-zero dup -> 0, not -inf
    assert amax[1].tolist() == [-math.inf, -math.inf]   # no rows: untouched -inf
    assert amax[2].tolist() == [0.5, 2.0]
    allnan = torch.full((256, 32), NAN)
    assert amax_per_expert(allnan, allnan, [256]).tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="dup: shape"):
        amax_per_expert(dgate, dup[:, :16], [768])
    with pytest.raises(ValueError, match="last offset 1024 exceeds"):
        amax_per_expert(dgate, dup, [1024])


# ------------------------------------------------------------------------------------------
# dSiTU-GLU derivative against autograd of its forward
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("beta1, beta2", [(4.0, 25.0), (1.0, 2.0), (0.5, 100.0)])
def test_dsituglu_matches_autograd_of_forward(beta1, beta2):
    from cudnn_ext.reference.epilogue import dsituglu

    g = torch.Generator().manual_seed(7)
    gate = torch.cat([torch.randn(500, generator=g, dtype=torch.float64) * 3,
                      torch.tensor([0.0, -40.0, 40.0, 1e-8, -3.0 * beta1, 60.0 * beta1],
                               dtype=torch.float64)])
    up = torch.randn(gate.numel(), generator=g, dtype=torch.float64) * 2 * beta2
    gate.requires_grad_(True)
    up.requires_grad_(True)
    t_g = beta1 * torch.tanh(gate / beta1) * torch.sigmoid(gate)
    t_u = beta2 * torch.tanh(up / beta2)
    out = t_g * t_u
    dgate_ref, dup_ref = torch.autograd.grad(out.sum(), (gate, up))
    dgate, dup, act = dsituglu(gate.detach(), up.detach(), beta1=beta1, beta2=beta2)
    torch.testing.assert_close(dgate, dgate_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dup, dup_ref, rtol=1e-12, atol=1e-14)
    # act is the value whose g0-weighted row sum is the dprob term: d out/d p of p*T_g*T_u
    torch.testing.assert_close(act, out.detach(), rtol=1e-12, atol=1e-14)


def test_dsituglu_with_prob_and_g0_against_autograd():
    # the full local contract: dgate = g0*p*dgate_local, dup = g0*p*dup_local,
    # dprob = sum_n g0*act -- the gradients of sum(g0 * p * T_g * T_u)
    from cudnn_ext.reference.epilogue import dsituglu

    g = torch.Generator().manual_seed(8)
    gate = torch.randn(16, 64, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(16, 64, generator=g, dtype=torch.float64, requires_grad=True)
    p = torch.rand(16, 1, generator=g, dtype=torch.float64, requires_grad=True)
    g0 = torch.randn(16, 64, generator=g, dtype=torch.float64)
    t_g = 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate)
    t_u = 25.0 * torch.tanh(up / 25.0)
    dg_ref, du_ref, dp_ref = torch.autograd.grad((g0 * p * t_g * t_u).sum(), (gate, up, p))
    dgl, dul, act = dsituglu(gate.detach(), up.detach(), beta1=4.0, beta2=25.0)
    torch.testing.assert_close(g0 * p.detach() * dgl, dg_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g0 * p.detach() * dul, du_ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close((g0 * act).sum(1, keepdim=True), dp_ref, rtol=1e-12, atol=1e-14)
