"""An independent float64 oracle for grouped GEMM + dGLU backward (tests only).

Owns nothing the library uses. It derives every output from the *forward* gated activation by
torch.autograd and never reuses the derivative formulas of ``cudnn_ext.reference.epilogue``
(nor its column bookkeeping): if both were written from the same misreading, a test comparing
them would pass, so the oracle states only the forward and lets autograd differentiate.

For expert g with rows [offs[g-1], offs[g]) (its padded range):

    R   = alpha_g**2 * A_g @ B_g^T             (float64; optionally rounded to bf16)
    X   = beta_g * C_g                          (float64 leaf, in C's interleaved layout)
    out = prob * glu(gate(X), up(X))            (the forward, (rows, N))
    D     = d sum(R * out) / dX                 == autograd.grad(out, X, grad_outputs=R)
    dprob = d sum(R * out) / dprob              (row sums of R * glu: no prob factor)
    dbias[g] = column sums of D over the expert's padded rows

gate/up split: C is viewed as (rows, N/32, 2, 32); index 0 of the pair axis is gate, 1 is up
(docs/vendor_contract.md §1.3: in every 64-column pair the first 32 columns are gate). D comes back from
autograd already in C's layout, so no re-interleaving is needed.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

f64 = torch.float64


# --------------------------------------------------------------------------- forwards
def clamp_with_inclusive_grad(x: torch.Tensor, lo: Optional[float], hi: Optional[float]) -> torch.Tensor:
    """clamp(x, lo, hi) whose gradient is 1 where lo <= x <= hi (bounds included), else 0.

    The contract keeps the gradient at equality with either bound (docs/vendor_contract.md §1.6). torch's
    own clamp backward does the same (its mask is ``x >= min & x <= max``), which
    ``clamp_grad_is_inclusive`` probes and a test pins; note ``torch.minimum``/``maximum`` would
    split the gradient 0.5/0.5 at a tie, so they are not used here.
    """
    return torch.clamp(x, min=lo, max=hi)


def clamp_grad_is_inclusive() -> bool:
    """True if torch.clamp's backward passes the gradient at exactly the bounds."""
    x = torch.tensor([7.0, -7.0], dtype=f64, requires_grad=True)
    (g,) = torch.autograd.grad(clamp_with_inclusive_grad(x, -7.0, 7.0).sum(), x)
    return bool((g == 1).all())


def swiglu(gate, up):
    """SwiGLU forward: silu(gate) * up."""
    return F.silu(gate) * up


def clamped_geglu(gate, up, *, alpha: float, clamp_max: float, clamp_min: float, linear_offset: float):
    """Clamped GeGLU forward: y1*sigmoid(alpha*y1) * (clamp(up, cmin, cmax) + lo), y1 = min(gate, cmax).

    The gate is clamped above only; the up branch on both sides; the offset is added after
    the clamp.
    """
    y1 = clamp_with_inclusive_grad(gate, None, clamp_max)
    y2 = clamp_with_inclusive_grad(up, clamp_min, clamp_max)
    return y1 * torch.sigmoid(alpha * y1) * (y2 + linear_offset)


def situglu(gate, up, *, beta1: float, beta2: float):
    """SiTU-GLU forward (block-scaled contract only): beta1*tanh(gate/beta1)*sigmoid(gate) *
    beta2*tanh(up/beta2)."""
    return beta1 * torch.tanh(gate / beta1) * torch.sigmoid(gate) * (beta2 * torch.tanh(up / beta2))


def split_gate_up(x: torch.Tensor, swap: bool = False):
    """(rows, 2N) interleaved -> gate (rows, N), up (rows, N). ``swap`` is for sanity tests only."""
    rows, two_n = x.shape
    blocks = x.reshape(rows, two_n // 64, 2, 32)
    gate, up = blocks[:, :, 0, :].reshape(rows, two_n // 2), blocks[:, :, 1, :].reshape(rows, two_n // 2)
    return (up, gate) if swap else (gate, up)


# --------------------------------------------------------------------------- the oracle
def oracle(
    a: torch.Tensor,
    weights: Sequence[torch.Tensor],
    c: torch.Tensor,
    offsets,
    alpha: torch.Tensor,
    beta: torch.Tensor,
    prob: torch.Tensor,
    *,
    act_func: str = "dswiglu",
    geglu_alpha: float = 1.702,
    glu_clamp_max: float = 7.0,
    glu_clamp_min: float = -7.0,
    linear_offset: Optional[float] = None,
    situ_beta1: float = 4.0,
    situ_beta2: float = 25.0,
    dprob_init: Optional[torch.Tensor] = None,
    dbias_init: Optional[torch.Tensor] = None,
    round_dgrad_to_bf16: bool = False,
    swap_gate_up: bool = False,
    alpha_sq_dtype: Optional[torch.dtype] = None,
    x_dtype: Optional[torch.dtype] = None,
) -> dict:
    """float64 outputs of the operation.

    ``a`` (M, K); ``weights[g]`` expert g's (N, K) matrix (any strides/dtype); ``c`` (M, 2N);
    ``offsets`` cumulative padded ends (L,); ``alpha``/``beta`` (L,); ``prob`` (M,).
    ``alpha_sq_dtype``: alpha_g**2 rounded once to this dtype (the exact float64 square of a
    16-bit alpha, then the cast). ``x_dtype``: X = beta_g * C formed in this 16-bit dtype (C's
    and beta's values cast to it, their exact float64 product cast once) and differentiated
    there, as the leaf.
    Returns ``d`` (M, 2N; NaN past the last offset), ``dprob`` (M,; ``dprob_init`` past it),
    ``dbias`` (L, 2N) and ``activation`` (M, N; NaN past the last offset) = prob * glu.
    """
    a = a.reshape(a.shape[0], -1)
    c = c.reshape(c.shape[0], -1)
    prob = prob.reshape(-1)
    m, two_n = c.shape
    n = two_n // 2
    ends = [int(v) for v in torch.as_tensor(offsets).reshape(-1).tolist()]
    num_experts = len(ends)
    lo = (1.0 if act_func == "dgeglu" else 0.0) if linear_offset is None else float(linear_offset)

    def glu(gate, up):
        if act_func == "dswiglu":
            return swiglu(gate, up)
        if act_func == "dgeglu":
            return clamped_geglu(gate, up, alpha=geglu_alpha, clamp_max=glu_clamp_max,
                                 clamp_min=glu_clamp_min, linear_offset=lo)
        if act_func == "dsituglu":
            return situglu(gate, up, beta1=situ_beta1, beta2=situ_beta2)
        raise ValueError(act_func)

    d = torch.full((m, two_n), float("nan"), dtype=f64)
    act_out = torch.full((m, n), float("nan"), dtype=f64)
    dprob = (dprob_init.reshape(-1).to(f64).clone() if dprob_init is not None else torch.zeros(m, dtype=f64))
    dbias = (dbias_init.reshape(num_experts, two_n).to(f64).clone() if dbias_init is not None
             else torch.zeros(num_experts, two_n, dtype=f64))
    start = 0
    for g, end in enumerate(ends):
        r0, r1, start = start, end, end
        if r1 <= r0:
            continue
        w = weights[g].to(f64)
        assert w.shape == (n, a.shape[1]), (w.shape, n, a.shape)
        a2 = float(alpha[g]) ** 2
        if alpha_sq_dtype is not None:
            a2 = float(torch.tensor(a2, dtype=f64).to(alpha_sq_dtype))
        r = a2 * (a[r0:r1].to(f64) @ w.t())
        if round_dgrad_to_bf16:
            r = r.to(torch.bfloat16).to(f64)
        if x_dtype is None:
            x = float(beta[g]) * c[r0:r1].to(f64)
        else:
            b = float(torch.tensor(float(beta[g]), dtype=f64).to(x_dtype))
            x = (b * c[r0:r1].to(x_dtype).to(f64)).to(x_dtype).to(f64)
        x = x.detach().requires_grad_(True)
        p = prob[r0:r1].to(f64).detach().requires_grad_(True)
        gate, up = split_gate_up(x, swap=swap_gate_up)
        out = p[:, None] * glu(gate, up)
        dx, dp = torch.autograd.grad(out, (x, p), grad_outputs=r)
        d[r0:r1] = dx
        dprob[r0:r1] += dp
        dbias[g] += dx.sum(0)
        act_out[r0:r1] = out.detach()
    return {"d": d, "dprob": dprob, "dbias": dbias, "activation": act_out}


def expert_weights_from_dense(b: torch.Tensor):
    """Dense (N, K, L) B -> list of (N, K) views."""
    return [b[:, :, g] for g in range(b.shape[2])]


# --------------------------------------------------------------------------- the MoE expert MLP
def _glu(act: str, gate, up, cfg: dict):
    if act in ("swiglu", "dswiglu"):
        return swiglu(gate, up)
    return clamped_geglu(gate, up, alpha=cfg["geglu_alpha"], clamp_max=cfg["clamp_max"],
                         clamp_min=cfg["clamp_min"], linear_offset=cfg["linear_offset"])


def glu_h(c: torch.Tensor, prob: torch.Tensor, last: int, act: str, cfg: dict) -> torch.Tensor:
    """float64 ``h = prob * glu(gate, up)`` of the interleaved (M, 2N) C; rows at or past
    ``last`` (no expert's) 0 whatever C holds there."""
    gate, up = split_gate_up(c[:last].to(f64))
    h = c.new_zeros((c.shape[0], c.shape[1] // 2), dtype=f64)
    h[:last] = prob[:last].to(f64)[:, None] * _glu(act, gate, up, cfg)
    return h


def glu_mlp(x, prob, w1, b1, w2, offs: Sequence[int], act: str, cfg: dict) -> torch.Tensor:
    """The MoE expert MLP forward in plain autograd (per-expert matmuls, explicit GLU) on the
    tensors' own dtype (float64 leaves give the float64 oracle of every gradient): expert e's
    rows [offs[e-1], offs[e]) get ``(prob * glu(x w1_eᵀ + b1_e)) w2_eᵀ``; rows past offs[-1] 0."""
    ys, start = [], 0
    for e, end in enumerate(offs):
        c = x[start:end] @ w1[e].t() + (b1[e] if b1 is not None else 0)
        gate, up = split_gate_up(c)
        ys.append((prob[start:end, None] * _glu(act, gate, up, cfg)) @ w2[e].t())
        start = end
    ys.append(x.new_zeros(x.shape[0] - start, w2.shape[1]))
    return torch.cat(ys)
