"""Operands of the fp8_blockwise recipe for tests: e4m3 A and B with their fp32 block scales,
block magnitudes spread so that a misplaced scale shows, and the float64 oracle on the
dequantized operands (tests/unit/test_fp8_blockwise.py, tests/gpu/test_fp8_blockwise_gpu.py)."""
from __future__ import annotations

import torch
from oracle import oracle

from cudnn_ext.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise

E4M3 = torch.float8_e4m3fn
N, K, L = 160, 384, 3
#: fp32 compute against the float64 oracle, the worst row (measured below 1e-5); a scale applied
#: to another block or expert moves a row by far more
TOL = 2e-5
#: The Hopper kernel's FP8 WGMMA adds its products with fewer than fp32's bits inside a 128-K
#: block (DeepSeek-V3 reports about 14); the promotion keeps that error per block: worst row of
#: D, dprob (relative Frobenius norm). A scale applied to another block or expert moves a row by
#: 2x or more. A bf16 D adds its own rounding: at most 2^-8 relative per element.
KTOL = 1e-3
BF16_D_TOL = KTOL + 2.0 ** -8


def activation_close(got, want):
    """The kernel's bf16 activation output against the oracle's (float64): within bf16's
    rounding of each element plus 1e-3 of the largest."""
    got = got.double()
    return bool(((got - want).abs() <= 2.0 ** -7 * want.abs() + 1e-3 * want.abs().max()).all())


def case(sizes=(256, 0, 512), *, n=N, k=K, extra_rows=256, n_major=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor(sizes).cumsum(0).to(torch.int32)
    m = int(offsets[-1]) + extra_rows
    # block magnitudes spread over 2^-6 .. 2^6 (A) and 2^-4 .. 2^4 (B) so that a misplaced scale shows
    x = torch.randn(m, k, generator=g) * torch.pow(2.0, torch.randint(-6, 7, (m, k // 128), generator=g)
                                                   .float()).repeat_interleave(128, 1) / 8
    w = torch.randn(n, k, L, generator=g) * torch.pow(2.0, torch.randint(-4, 5, (1, k // 128, 1), generator=g)
                                                       .float()).repeat_interleave(128, 1) / 16
    a_q, sfa = quantize_fp8_blockwise(x, (1, 128))
    b_q, sfb = quantize_fp8_blockwise(w, (128, 128))
    if n_major:
        b_q = b_q.permute(2, 1, 0).contiguous().permute(2, 1, 0)  # (N, K, L) stored (L, K, N)
    return dict(a=a_q, sfa=sfa, b=b_q, sfb=sfb, c=(torch.randn(m, 2 * n, generator=g) * 2).bfloat16(),
                offsets=offsets, alpha=torch.rand(L, generator=g) + 0.5, beta=torch.rand(L, generator=g) + 0.5,
                prob=torch.rand(m, generator=g), m=m)


def reference(t, act="dswiglu", **kw):
    a64 = dequantize_fp8_blockwise(t["a"], t["sfa"], (1, 128), out_dtype=torch.float64)
    b64 = dequantize_fp8_blockwise(t["b"], t["sfb"], (128, 128), out_dtype=torch.float64)
    return oracle(a64, [b64[..., e] for e in range(L)], t["c"], t["offsets"], t["alpha"], t["beta"], t["prob"],
                  act_func=act, **kw)


def rel(got, want, rows):
    """The largest relative error of a row (of a vector: of the whole), rows below ``rows``."""
    got, want = got[:rows].double(), want[:rows]
    if want.dim() == 1:
        return ((got - want).norm() / want.norm()).item()
    return ((got - want).norm(dim=1) / want.norm(dim=1).clamp_min(1e-300)).max().item()


def wrapper_on(t, dev, **kw):
    """The wrapper's recipe call on ``t``'s operands moved to ``dev`` (a CUDA call under
    ``set_sync_debug_mode("error")``: a host sync raises), with ``kw`` on top (``b_tensor`` and
    ``sfb_tensor`` from ``t`` unless ``kw`` names weights). Returns (the outputs, the operands on
    ``dev``, the engine that ran it)."""
    import cudnn_ext as cudnn
    from cudnn_ext.runtime.memo import CALLS

    on = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    weights = {} if "b_ptrs" in kw else dict(b_tensor=on["b"], sfb_tensor=on["sfb"])
    cuda = torch.device(dev).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=on["a"], c_tensor=on["c"], sfa_tensor=on["sfa"], padded_offsets=on["offsets"],
            alpha_tensor=on["alpha"], beta_tensor=on["beta"], prob_tensor=on["prob"],
            dprob_tensor=torch.zeros(t["m"], device=dev), recipe="fp8_blockwise", **weights, **kw)
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    if cuda:
        torch.cuda.synchronize()
    return out, on, CALLS.entries("graph")[-1].execution_plan.engine_name
