"""The block-scaled contract's cross, one small problem per point: format (MXFP8 e4m3/e5m2,
NVFP4, MXFP4) x ``b_major`` (k; n where the format allows it, FP8) x weights (dense, pointer
tables) x activation (dSwiGLU, dGeGLU, dSiTU-GLU) x prob/dprob (on: dbias off; off: dbias on).

Each point builds fresh random operands on a device, runs one class-API call on one engine
with poisoned outputs (D 0xFF bytes or NaN, SFD 0xFF bytes, amax -inf) and checks it against
the float64 oracle of the dequantized operands. Pointer-table points take beta 0 on the first
expert and a negative beta and alpha on the last. N-major weights hold the same values as the
K-major ones (the oracle's), stored (K, N) per expert. The CPU tier runs it on the reference
engine (tests/unit/test_blockscaled_cross.py), the GPU tier on ``sm90_blockscaled``
(tests/gpu/test_sm90_blockscaled_cross.py): an engine that reads an N-major or per-expert B
wrongly fails every point that has one.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

import cudnn_ext as cudnn
from cudnn_ext.quant import dequantize, quantize_mxfp8, quantize_nvfp4
from cudnn_ext.quant import formats as F
from cudnn_ext.quant.sf_layout import empty_sf, unswizzle_sf

from oracle import oracle

E4M3, E5M2, E8M0, FP4 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.uint8
#: format -> (element dtype, sf_vec_size, scale dtype)
FORMATS = {"mxfp8-e4m3": (E4M3, 32, E8M0), "mxfp8-e5m2": (E5M2, 32, E8M0),
           "nvfp4": (FP4, 16, E4M3), "mxfp4": (FP4, 32, E8M0)}
ACTS = ("dswiglu", "dgeglu", "dsituglu")
POISON = 0xFF
#: rows per expert (an empty one between), N, K, rows past the last offset
COUNTS, N, K, EXTRA = (256, 0, 512), 64, 128, 256
#: D and dprob against the float64 oracle (sm90_cases.rel_err: Frobenius and 4x per element).
#: The dequantized operands are exact in bf16, so the GEMM is exact to fp32 sums: bf16 D and
#: dbias carry their one rounding (2^-9 per element), dprob (fp32) only the epilogue's
#: transcendental approximations; a misread B is off by O(1). Measured on sm90_blockscaled
#: (H200, 2026-12-07): bf16 D 1.7e-3, dbias 1.9e-3, dprob 1.5e-7, FP8 D 0.027
TOL = {"d_fp8": 0.07,  # dequantized FP8 D: e4m3's half step, 2^-4
       "d_bf16": 4e-3, "dprob": 1e-5, "dbias": 4.5e-3}


@dataclass(frozen=True)
class Point:
    fmt: str
    b_major: str
    mode: str  # "dense" or "discrete" (b_ptrs / sfb_ptrs)
    act: str
    prob: bool  # prob and dprob; without them dbias is generated instead

    @property
    def fp8(self) -> bool:
        return FORMATS[self.fmt][0] is not FP4

    def label(self) -> str:
        return f"{self.fmt}-{self.b_major}-{self.mode}-{self.act}-{'prob' if self.prob else 'dbias'}"


def points() -> list:
    out = []
    for fmt, (elem, _vec, _sf) in FORMATS.items():
        for b_major in (("k", "n") if elem is not FP4 else ("k",)):
            for mode in ("dense", "discrete"):
                for act in ACTS:
                    for prob in (True, False):
                        out.append(Point(fmt, b_major, mode, act, prob))
    return out


def _quantize(x: torch.Tensor, fmt: str):
    elem, vec, sf = FORMATS[fmt]
    if elem is FP4:
        return quantize_nvfp4(x, sf_vec_size=vec, sf_dtype=sf)
    return quantize_mxfp8(x, elem)


def _n_major(q: torch.Tensor) -> torch.Tensor:
    """The same (N, K, L) or (N, K) values stored N-major: (L, K, N) or (K, N) contiguous."""
    if q.dim() == 3:
        return q.view(torch.uint8).permute(2, 1, 0).contiguous().permute(2, 1, 0).view(q.dtype)
    return q.view(torch.uint8).t().contiguous().t().view(q.dtype)


def make(pt: Point, device) -> dict:
    """Operands of ``pt`` on ``device`` (seeded by its label) and their float64 oracle."""
    g = torch.Generator().manual_seed(zlib.crc32(pt.label().encode()))
    elem, vec, _sf = FORMATS[pt.fmt]
    L = len(COUNTS)
    offs = torch.tensor(COUNTS, dtype=torch.int64).cumsum(0).to(torch.int32)
    m = int(offs[-1]) + EXTRA
    a = torch.randn(m, K, generator=g)
    w = torch.randn(L, N, K, generator=g) * 0.2
    c = (torch.randn(m, 2 * N, generator=g) * 2).to(torch.bfloat16)
    alpha, beta = torch.rand(L, generator=g) + 0.5, torch.rand(L, generator=g) + 0.5
    if pt.mode == "discrete":  # beta 0 on the first expert, negative on the last, alpha negative
        beta[0], beta[-1], alpha[-1] = 0.0, -beta[-1], -alpha[-1]
    prob = torch.rand(m, generator=g)
    a_q, sfa = _quantize(a.to(device), pt.fmt)
    b_q, sfb = _quantize(w.permute(1, 2, 0).to(device), pt.fmt)
    experts = [_quantize(w[e].to(device), pt.fmt) for e in range(L)]
    if pt.b_major == "n":
        b_q = _n_major(b_q)
        assert b_q.stride() == (1, N, N * K)
    a64 = dequantize(a_q, sfa, vec, out_dtype=torch.float64).cpu()
    w64 = [dequantize(q, sf, vec, out_dtype=torch.float64).cpu() for q, sf in experts]
    # dGeGLU reads C without beta on block-scaled operands; dSwiGLU and dSiTU-GLU scale it
    beta_o = torch.ones(L) if pt.act == "dgeglu" else beta
    ref = oracle(a64, w64, c, offs, alpha, beta_o, prob if pt.prob else torch.ones(m),
                 act_func=pt.act)
    on = lambda x: x.to(device)  # noqa: E731
    t = dict(pt=pt, L=L, M=m, vec=vec, elem=elem, last=int(offs[-1]), offs=on(offs), a_q=a_q,
             sfa=sfa, b_q=b_q, sfb=sfb, c=on(c), alpha=on(alpha), beta=on(beta), prob=on(prob),
             nc=torch.full((1,), 3.7, device=device), ref=ref)
    if pt.mode == "discrete":
        # N-major experts stored (K, N); the scales of each expert its own 6-D buffer; the
        # empty expert's pointers null (never read)
        qs = [q.contiguous() if pt.b_major == "k" else _n_major(q).t() for q, _ in experts]
        sfs = [sf.permute(5, 2, 4, 0, 1, 3).contiguous() for _, sf in experts]
        empty = [COUNTS[e] == 0 for e in range(L)]
        t["keep"] = (qs, sfs)
        t["b_ptrs"] = torch.tensor([0 if empty[e] else q.data_ptr() for e, q in enumerate(qs)],
                                   dtype=torch.int64, device=device)
        t["sfb_ptrs"] = torch.tensor([0 if empty[e] else s.data_ptr() for e, s in enumerate(sfs)],
                                     dtype=torch.int64, device=device)
    return t


def run(t: dict, engine: str) -> dict:
    """One class-API call of ``t`` on ``engine``, on poisoned outputs; returns them."""
    pt, m, L, dev = t["pt"], t["M"], t["L"], t["c"].device
    outs = {}
    if pt.fp8:  # FP8 D_row / D_col with their e8m0 scales
        byte = lambda: torch.full((m, 2 * N), POISON, dtype=torch.uint8, device=dev).view(E4M3)  # noqa: E731
        outs.update(d_row=byte(), d_col=byte(),
                    sfd_row=empty_sf(m, 2 * N // 32, dtype=E8M0, device=dev, fill=POISON),
                    sfd_col=empty_sf(2 * N, m // 32, dtype=E8M0, device=dev, fill=POISON))
    else:
        outs.update(d_row=torch.full((m, 2 * N), float("nan"), dtype=torch.bfloat16, device=dev),
                    amax=torch.full((L, 2), float("-inf"), device=dev))
    if pt.prob:
        outs["dprob"] = torch.zeros(m, device=dev)
    else:
        outs["dbias"] = torch.zeros(L, 2 * N, dtype=torch.bfloat16, device=dev)
    nc = t["nc"] if pt.fp8 else None
    samples = dict(sample_dbias=outs.get("dbias"), sample_sfd_row=outs.get("sfd_row"),
                   sample_sfd_col=outs.get("sfd_col"), sample_amax=outs.get("amax"),
                   sample_norm_const=nc)
    weights = {}
    if pt.mode == "dense":
        weights.update(b_tensor=t["b_q"], sfb_tensor=t["sfb"])
        samples.update(sample_b=t["b_q"], sample_sfb=t["sfb"])
    else:
        weights.update(b_ptrs=t["b_ptrs"], sfb_ptrs=t["sfb_ptrs"])
        samples.update(num_experts=L, b_shape=(N, K), b_dtype=t["a_q"].dtype, b_major=pt.b_major)
    prob = t["prob"] if pt.prob else None
    op = cudnn.GroupedGemmDglu(
        t["a_q"], t["c"], outs["d_row"], outs.get("d_col"), t["sfa"], t["offs"], t["alpha"],
        t["beta"], prob, outs.get("dprob"), sf_vec_size=t["vec"], act_func=pt.act, engine=engine,
        **samples)
    op.compile()
    assert op.engine_name == engine, op.engine_name
    op.execute(a_tensor=t["a_q"], c_tensor=t["c"], d_row_tensor=outs["d_row"],
               d_col_tensor=outs.get("d_col"), sfa_tensor=t["sfa"], padded_offsets=t["offs"],
               alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=prob,
               dprob_tensor=outs.get("dprob"), dbias_tensor=outs.get("dbias"),
               sfd_row_tensor=outs.get("sfd_row"), sfd_col_tensor=outs.get("sfd_col"),
               amax_tensor=outs.get("amax"), norm_const_tensor=nc, **weights)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return outs


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    from sm90_cases import rel_err as _rel

    return _rel(x.cpu(), ref.cpu())


def check(t: dict, outs: dict) -> dict:
    """``outs`` against the oracle (raises AssertionError); returns the errors."""
    pt, last, ref = t["pt"], t["last"], t["ref"]
    err = {}
    if pt.fp8:
        assert (outs["d_row"][last:].view(torch.uint8) == POISON).all(), "D_row past the last offset"
        assert (outs["sfd_row"][:, :, last // 128:].view(torch.uint8) == POISON).all()
        codes = unswizzle_sf(outs["sfd_row"], t["M"], 2 * N // 32)[:last, :, 0].cpu()
        scale = F.decode_sf(codes).double().repeat_interleave(32, dim=1)
        d = outs["d_row"][:last].cpu().float().double() * scale / t["nc"].item()
        err["d"], tol = rel_err(d, ref["d"][:last]), TOL["d_fp8"]
    else:
        d = outs["d_row"]
        assert torch.isnan(d[last:]).all(), "D past the last offset"
        err["d"], tol = rel_err(d[:last].double(), ref["d"][:last]), TOL["d_bf16"]
        amax = outs["amax"].cpu()
        assert torch.isinf(amax[1]).all() and (amax[1] < 0).all(), "the empty expert's amax"
    assert err["d"] < tol, (pt.label(), "D", err["d"])
    if pt.prob:
        err["dprob"] = rel_err(outs["dprob"][:last], ref["dprob"][:last])
        assert err["dprob"] < TOL["dprob"], (pt.label(), "dprob", err["dprob"])
        assert (outs["dprob"][last:] == 0).all(), "dprob past the last offset"
    else:
        err["dbias"] = rel_err(outs["dbias"].double(), ref["dbias"])
        assert err["dbias"] < TOL["dbias"], (pt.label(), "dbias", err["dbias"])
    return err
