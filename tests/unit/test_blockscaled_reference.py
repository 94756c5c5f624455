"""Block-scaled pieces of the reference engine (cudnn_ext.reference.blockscaled) and the
dSiTU-GLU epilogue derivative, on CPU.

Independent routes only: hand-computed scale codes and byte positions, the transposition
identity between the row and column quantizers, the public helpers for dequantization, and
torch autograd of the dSiTU-GLU forward. The engine's block path (the form every CUDA call
takes) is held to the host walk over the experts, bit for bit, and run on meta tensors to show
that it reads no device data on the host.
Reproduce a failure with: .venv/bin/python -m pytest tests/unit/test_blockscaled_reference.py -q -k <name>
"""
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cudnn_ext.quant import (dequantize, quantize_mxfp8, quantize_nvfp4, sf_offset, storage_of,
                             swizzle_sf, unswizzle_sf)
from cudnn_ext.quant import formats as F
from cudnn_ext.reference.blockscaled import (amax_per_expert, dequantize_a, dequantize_b_expert,
                                             quantize_d_col, quantize_d_row, sfd_col_expert_view)

from exact_operands import FORMATS, exact_values

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


# ------------------------------------------------------------------------------------------
# the block path (no host read) against the host walk over the experts
# ------------------------------------------------------------------------------------------

def _fill_random_bytes(t, g):
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    raw = torch.randint(0, 256, (t.numel() * t.element_size(),), generator=g, dtype=torch.uint8)
    t.view(bits).copy_(raw.view(bits).view(t.shape))


def _block_case(fmt, weights, counts, extra, *, sfd=False, discrete_col_sfd=False, amax=False, dbias=False,
                prob=True, single_group=False, act="dswiglu", seed=0, scalars=torch.float32):
    """(problem, pack, keep): a canonical pack of exact operands; ``keep`` holds the discrete
    experts' storage (an empty expert's pointers are null); alpha and beta in ``scalars``."""
    from cudnn_ext import contract

    quantize, vec, fp4 = FORMATS[fmt]  # operands whose GEMM is exact: the outputs compare bit for bit
    g = torch.Generator().manual_seed(seed)
    num_experts, n, k = len(counts), 96, 128  # 2N = 192: SFD_col has two column atoms, one half padding
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    m = int(offs[-1]) + extra
    a_q, sfa = quantize(exact_values((m, k), fp4, vec, g))
    w = exact_values((num_experts, n, k), fp4, vec, g)
    ops = dict(a=a_q, sfa=sfa, c=(torch.randn(m, 2 * n, generator=g) * 2).to(torch.bfloat16), padded_offsets=offs,
               alpha=(torch.rand(num_experts, generator=g) + 0.5).to(scalars),
               beta=(torch.rand(num_experts, generator=g) + 0.5).to(scalars))
    if prob:
        ops.update(prob=torch.rand(m, generator=g), dprob=torch.zeros(m))
    keep, extra_kw = [], {}
    if weights == "dense":
        ops["b"], ops["sfb"] = quantize(w.permute(1, 2, 0))
    else:
        for e in range(num_experts):
            q, sf = quantize(w[e])
            keep.append((q.contiguous() if weights == "discrete-k" else q.t().contiguous(), storage_of(sf).contiguous()))
        live = [size > 0 for size in counts]
        ops["b_ptrs"] = torch.tensor([q.data_ptr() if ok else 0 for (q, _), ok in zip(keep, live)])
        ops["sfb_ptrs"] = torch.tensor([sf.data_ptr() if ok else 0 for (_, sf), ok in zip(keep, live)])
        extra_kw = dict(n=n, b_dtype=keep[0][0].dtype)
    d_dtype = torch.bfloat16 if fp4 else E4M3
    ops["d_row"] = torch.empty(m, 2 * n, dtype=d_dtype)
    if sfd:
        from cudnn_ext.quant import empty_sf

        ops.update(d_col=torch.empty(m, 2 * n, dtype=E4M3), sfd_row=empty_sf(m, 2 * n // 32, dtype=E8M0),
                   sfd_col=empty_sf(2 * n, m // 32, dtype=E8M0), norm_const=torch.tensor([0.75]))
    if amax:
        ops["amax"] = torch.empty(num_experts, 2)
    if dbias:
        ops["dbias"] = torch.zeros(num_experts, 2 * n, dtype=torch.bfloat16)
    cfg = contract.CallConfig(sf_vec_size=vec, act_func=act, b_major="n" if weights == "discrete-n" else "k",
                              discrete_col_sfd=discrete_col_sfd, use_single_group_runtime_offsets=single_group)
    problem, pack = contract.normalize(contract.Operands(**ops), cfg, **extra_kw)
    return problem, pack, keep


_OUTS = ("d_row", "d_col", "sfd_row", "sfd_col", "amax", "dprob", "dbias")


def _poisoned(pack, seed):
    """The pack with fresh output buffers of random bytes (the same bytes for the same seed)."""
    g = torch.Generator().manual_seed(seed)
    p = dict(pack)
    for slot in _OUTS:
        if p.get(slot) is not None:
            p[slot] = torch.empty_like(p[slot])
            if slot in ("amax", "dprob", "dbias"):  # accumulated into: finite values
                p[slot].copy_(torch.rand(p[slot].shape, generator=g))
            else:
                _fill_random_bytes(p[slot], g)
    return p


def _same_bits(x, y):
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
    return x.dtype == y.dtype and torch.equal(x.contiguous().view(bits), y.contiguous().view(bits))


def _run_both(problem, pack, monkeypatch, step_blocks=None):
    from cudnn_ext.reference import grouped_dglu

    if step_blocks is not None:  # several steps of the block loop
        monkeypatch.setattr(grouped_dglu, "_BLOCK_GATHER_BYTES", 1)
    walk, blocks, before = _poisoned(pack, 5), _poisoned(pack, 5), _poisoned(pack, 5)
    grouped_dglu.grouped_dglu_reference(problem, walk)
    grouped_dglu.grouped_dglu_blocks(problem, blocks)
    return walk, blocks, before


def _check_block_path(problem, walk, blocks, before, last, ctx):
    """Bit-identical quantized outputs, scale factors, D and amax; dprob/dbias to fp32 summation
    order; rows past ``last`` and the scale-factor atoms that cover only them untouched."""
    for slot in ("d_row", "d_col", "sfd_row", "sfd_col", "amax"):
        if walk.get(slot) is not None:
            assert _same_bits(blocks[slot], walk[slot]), f"{slot} {ctx}"
            assert not _same_bits(blocks[slot], before[slot]), f"{slot} was not written {ctx}"
    if walk.get("dprob") is not None:
        torch.testing.assert_close(blocks["dprob"], walk["dprob"], rtol=1e-6, atol=1e-6, msg=ctx)
        assert _same_bits(blocks["dprob"][last:], before["dprob"][last:]), ctx
    if walk.get("dbias") is not None:
        torch.testing.assert_close(blocks["dbias"], walk["dbias"], rtol=2 ** -8, atol=0, msg=ctx)
    for slot in ("d_row", "d_col"):
        if walk.get(slot) is not None:
            assert _same_bits(blocks[slot][last:], before[slot][last:]), f"{slot} past the last offset {ctx}"
    if walk.get("sfd_row") is not None:
        assert _same_bits(blocks["sfd_row"][:, :, last // 128:], before["sfd_row"][:, :, last // 128:]), ctx
        if problem.block_scale.discrete_col_sfd:  # the regions end at chunk (last // 128) * ceil(2N / 128)
            rmn = blocks["sfd_col"].shape[2]
            tail = slice((last // 128) * rmn * 512, None)
            assert _same_bits(storage_of(blocks["sfd_col"]).reshape(-1)[tail],
                              storage_of(before["sfd_col"]).reshape(-1)[tail]), ctx
        else:
            assert _same_bits(blocks["sfd_col"][..., last // 128:, :], before["sfd_col"][..., last // 128:, :]), ctx


BLOCK_SCALED_CASES = [
    # fmt, weights, counts, extra rows, outputs
    ("mxfp8_e4m3", "dense", (256, 0, 512), 256, dict(sfd=True, dbias=True)),
    ("mxfp8_e4m3", "discrete-k", (512, 0, 256), 512, dict(sfd=True, discrete_col_sfd=True, amax=True)),
    ("mxfp8_e4m3", "discrete-n", (256, 0, 256, 512), 256, dict(sfd=True, discrete_col_sfd=True, dbias=True)),
    ("mxfp8_e5m2", "dense", (0, 512, 0, 256), 256, dict(sfd=True, discrete_col_sfd=True, act="dgeglu")),
    ("mxfp8_e5m2", "discrete-n", (256, 0, 512), 0, dict(sfd=True, act="dsituglu")),
    ("mxfp8_e4m3", "discrete-k", (256, 0, 512), 256, dict(amax=True)),  # fp8 D without SFD
    ("nvfp4", "dense", (256, 0, 512), 256, dict(amax=True, dbias=True)),
    ("nvfp4", "discrete-k", (512, 0, 256), 512, dict(amax=True, prob=False)),
    ("fp4_e8m0_16", "discrete-k", (256, 0, 256, 256), 256, dict(amax=True, dbias=True, act="dgeglu")),
    ("mxfp4", "dense", (256, 0, 512), 256, dict(amax=True, act="dsituglu")),
    ("mxfp4", "discrete-k", (0, 256, 0), 256, dict(amax=True, dbias=True)),
    # 16-bit alpha and beta: alpha**2 and dSwiGLU's beta * C rounded to them (docs/vendor_contract.md §3.5)
    ("nvfp4", "dense", (256, 0, 512), 256, dict(amax=True, dbias=True, scalars=torch.bfloat16)),
    ("mxfp8_e4m3", "discrete-k", (512, 0, 256), 256, dict(sfd=True, scalars=torch.float16)),
    ("mxfp4", "dense", (256, 0, 512), 256, dict(amax=True, act="dsituglu", scalars=torch.bfloat16)),
]


@pytest.mark.parametrize("fmt,weights,counts,extra,outs", BLOCK_SCALED_CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(BLOCK_SCALED_CASES)])
@pytest.mark.parametrize("steps", ["one", "per-block"])
def test_block_path_matches_the_expert_walk(monkeypatch, fmt, weights, counts, extra, outs, steps):
    """The GPU form of the block-scaled reference (each 256-row block's expert found on the
    device, all experts' operands dequantized per block, discrete weights stacked from their
    pointer tables, amax scattered per expert, D and its scale factors quantized per block)
    against the host walk over the experts, on the CPU, from random bytes in every output:
    the same bits, and the same untouched rows and scale-factor atoms past the last offset. An
    empty expert sits in the middle (its pointers null) and rows follow the last offset."""
    problem, pack, keep = _block_case(fmt, weights, counts, extra, **outs)
    walk, blocks, before = _run_both(problem, pack, monkeypatch, step_blocks=steps == "per-block" or None)
    _check_block_path(problem, walk, blocks, before, sum(counts),
                      f"[reproduce: {fmt} {weights} counts={counts} extra={extra} {outs} steps={steps}]")


@pytest.mark.parametrize("discrete_col_sfd", [False, True])
def test_block_path_single_group(monkeypatch, discrete_col_sfd):
    """use_single_group_runtime_offsets: one group of all M rows whatever the offsets hold,
    in the block path as in the host walk (every row written, every atom)."""
    problem, pack, _ = _block_case("mxfp8_e4m3", "dense", (256,), 512, sfd=True, amax=True,
                                   discrete_col_sfd=discrete_col_sfd, single_group=True)
    pack["padded_offsets"] = torch.tensor([100], dtype=torch.int32)  # never read
    walk, blocks, before = _run_both(problem, pack, monkeypatch, step_blocks=True)
    m = pack["c"].shape[0]
    _check_block_path(problem, walk, blocks, before, m, f"[single group, discrete_col_sfd={discrete_col_sfd}]")


def test_block_path_refuses_a_null_pointer_on_the_cpu(monkeypatch):
    """On CPU tensors the block path reads the tables on the host, so it checks them first (an
    expert with rows needs a pointer), before any output is written."""
    problem, pack, _ = _block_case("nvfp4", "discrete-k", (256, 0, 256), 256, amax=True)
    pack["sfb_ptrs"] = pack["sfb_ptrs"].clone()
    pack["sfb_ptrs"][2] = 0
    p = _poisoned(pack, 3)
    before = {k: p[k].clone() for k in ("d_row", "amax", "dprob")}
    from cudnn_ext.reference import grouped_dglu

    with pytest.raises(ValueError, match=r"sfb_ptrs\[2\]: expert 2 has rows \[256, 512\) but its pointer is null"):
        grouped_dglu.grouped_dglu_blocks(problem, p)
    assert all(_same_bits(p[k], v) for k, v in before.items())


class _NoHostToDevice(TorchDispatchMode):
    """Refuses any op that mixes host tensors into device work (a host-to-device copy, which
    syncs a GPU and cannot be captured); 0-dim host tensors are scalars and pass."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(t.device.type == "meta" for t in tensors) and any(t.device.type == "cpu" and t.dim() for t in tensors):
            raise AssertionError(f"{func} copies host data to the device")
        return func(*args, **kwargs)


class _NoHostValues(TorchFunctionMode):
    """Refuses tensors made on a device from Python values (torch.tensor([...], device=...))."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
            if torch.device(kwargs.get("device") or "cpu").type != "cpu":
                raise AssertionError(f"{func.__name__}({args[0]!r}) copies host values to the device")
        return func(*args, **kwargs)


def _bf16_discrete_case():
    from cudnn_ext import contract

    g = torch.Generator().manual_seed(1)
    m, n, k, num_experts = 1024, 64, 128, 3
    keep = [torch.randn(k, n, generator=g).to(torch.bfloat16) for _ in range(num_experts)]  # N-major
    ops = contract.Operands(
        a=torch.randn(m, k, generator=g).to(torch.bfloat16), c=torch.randn(m, 2 * n, generator=g).to(torch.bfloat16),
        padded_offsets=torch.tensor([256, 256, 768], dtype=torch.int32), alpha=torch.rand(num_experts),
        beta=torch.rand(num_experts), prob=torch.rand(m), dprob=torch.zeros(m),
        b_ptrs=torch.tensor([t.data_ptr() for t in keep]), d_row=torch.empty(m, 2 * n, dtype=torch.bfloat16),
        dbias=torch.zeros(num_experts, 2 * n, dtype=torch.bfloat16), activation=torch.empty(m, n, dtype=torch.bfloat16))
    problem, pack = contract.normalize(ops, contract.CallConfig(act_func="dgeglu", b_major="n"), n=n,
                                       b_dtype=torch.bfloat16)
    return problem, pack, keep


@pytest.mark.parametrize("case", ["bf16-discrete", "mxfp8-dense-sfd", "mxfp8-discrete-col-sfd", "nvfp4-discrete-amax",
                                  "mxfp8-single-group", "nvfp4-dense-bf16-scalars"])
def test_block_path_reads_no_device_data_on_the_host(monkeypatch, case):
    """The block path on meta tensors (shapes without data: any host read of a value, a
    data-dependent shape such as nonzero or a boolean mask, or a repeat_interleave without
    output_size raises) and with host-to-device copies refused: what holds here holds for CUDA
    tensors, where each of those is a sync. The device gather of discrete weights is replaced by
    its shape (tests/gpu checks it on the device)."""
    from cudnn_ext.reference import grouped_dglu, memory

    if case == "bf16-discrete":
        problem, pack, keep = _bf16_discrete_case()
    else:
        fmt = "nvfp4" if case.startswith("nvfp4") else "mxfp8_e4m3"
        weights = "discrete-k" if "discrete" in case else "dense"
        outs = dict(amax=True, dbias=True) if fmt == "nvfp4" else \
            dict(sfd=True, amax=True, discrete_col_sfd="col-sfd" in case or "single" in case)
        counts = (256,) if "single" in case else (256, 0, 512)
        scalars = torch.bfloat16 if "bf16-scalars" in case else torch.float32
        problem, pack, keep = _block_case(fmt, weights, counts, 256, single_group="single" in case,
                                          scalars=scalars, **outs)
        assert (problem.c_beta_dtype is not None) == (scalars != torch.float32)
    gathered = []

    def gather_shape(table, nbytes, ends):
        assert table.device.type == ends.device.type == "meta"
        gathered.append(nbytes)
        return torch.zeros(table.shape[0], nbytes, dtype=torch.uint8, device=table.device)

    monkeypatch.setattr(memory, "gather_pointer_table", gather_shape)
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in pack.items()}
    with _NoHostValues(), _NoHostToDevice():
        grouped_dglu.grouped_dglu_blocks(problem, meta)
    assert len(gathered) == {"bf16-discrete": 1}.get(case, 2 if "discrete" in case else 0)
    if "single" not in case:  # the check can fail: the host walk reads the offsets
        with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
            grouped_dglu.grouped_dglu_reference(problem, meta)


def test_reference_outputs_leaves_every_output_of_the_pack_untouched():
    """reference_outputs (the tests' oracle) writes block-scaled outputs (amax, D_col, SFD) into
    copies, never into the pack's tensors."""
    from cudnn_ext.reference import reference_outputs

    problem, pack, _ = _block_case("mxfp8_e4m3", "dense", (256, 0, 512), 256, sfd=True, amax=True)
    p = _poisoned(pack, 9)
    before = {k: p[k].clone() for k in _OUTS if p.get(k) is not None}
    ref = reference_outputs(problem, p)
    assert all(_same_bits(p[k], v) for k, v in before.items())
    assert ref["d_row"].dtype == torch.float64 and torch.isnan(ref["d_row"][768:]).all()
