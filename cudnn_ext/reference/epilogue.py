"""dGLU epilogue math, written once as small pure functions.

Owns the *local* derivatives of each gated activation with respect to its gate and up inputs,
plus the activation value whose accumulator-weighted row sum is the dprob term. The GEMM
result, ``prob`` and the scalars are applied by the caller (``grouped_dglu``), exactly as the
kernels do (docs/vendor_contract.md §1.5, 1.6, 2.4):

    dgate = g0 * p * dgate_local      dup = g0 * p * dup_local      dprob_term = g0 * act

with ``g0 = alpha**2 * (A @ B^T)`` and ``gate``/``up`` the (beta-scaled) C values. The kernel
epilogues mirror these functions (the SM90 kernel's dSwiGLU with beta pulled out of its
per-element products: ``cudnn_ext.kernels.sm90.epilogue_math.dswiglu_unscaled``); tests check
them against autograd of the forward activations, never against these formulas again.

Every function works elementwise on tensors of any floating dtype and returns
``(dgate_local, dup_local, act)``.
"""
from __future__ import annotations

import torch

from ..layout import gate_up_columns  # noqa: F401  (the reference paths index D through it)


def dswiglu(gate: torch.Tensor, up: torch.Tensor):
    """SwiGLU ``out = silu(gate) * up``: d/dgate = up*s*(1 + gate*(1-s)), d/dup = silu(gate)."""
    s = torch.sigmoid(gate)
    silu = gate * s
    return up * s * (1 + gate * (1 - s)), silu, silu * up


def dgeglu(gate, up, *, alpha: float, clamp_max: float, clamp_min: float, linear_offset: float):
    """Clamped GeGLU ``out = y1*sigmoid(alpha*y1) * (y2 + linear_offset)``.

    ``y1 = min(gate, clamp_max)`` (gate clamped above only), ``y2 = clamp(up, clamp_min,
    clamp_max)``. The clamp masks are taken on the unclamped values and are inclusive at the
    bounds (a gradient flows at equality), as in the vendor kernel.
    """
    y1 = torch.clamp(gate, max=clamp_max)
    y2 = torch.clamp(up, min=clamp_min, max=clamp_max)
    s = torch.sigmoid(alpha * y1)
    lin = y2 + linear_offset
    zero = torch.zeros((), dtype=gate.dtype, device=gate.device)
    dgate = torch.where(gate <= clamp_max, s * (1 + alpha * y1 * (1 - s)) * lin, zero)
    dup = torch.where((up >= clamp_min) & (up <= clamp_max), y1 * s, zero)
    return dgate, dup, y1 * s * lin


def dsituglu(gate, up, *, beta1: float, beta2: float):
    """SiTU-GLU ``out = T_g * T_u`` with ``T_g = beta1*tanh(gate/beta1)*sigmoid(gate)`` and
    ``T_u = beta2*tanh(up/beta2)`` (block-scaled contract only)."""
    t = torch.tanh(gate / beta1)
    u = torch.tanh(up / beta2)
    s = torch.sigmoid(gate)
    tg = beta1 * t * s
    tu = beta2 * u
    dtg = (1 - t * t) * s + beta1 * t * s * (1 - s)
    return tu * dtg, tg * (1 - u * u), tg * tu


#: act_func -> the local derivatives of an :class:`cudnn_ext.problem.ActConfig`'s activation
#: (``cudnn_ext.activations`` names them; the reference engine declines any other)
LOCAL_DERIVATIVES = {
    "dswiglu": lambda act, gate, up: dswiglu(gate, up),
    "dgeglu": lambda act, gate, up: dgeglu(gate, up, alpha=act.geglu_alpha, clamp_max=act.clamp_max,
                                           clamp_min=act.clamp_min, linear_offset=act.linear_offset),
    "dsituglu": lambda act, gate, up: dsituglu(gate, up, beta1=act.situ_beta1, beta2=act.situ_beta2),
}


def local_derivatives(act, gate, up):
    """Dispatch on a :class:`cudnn_ext.problem.ActConfig`."""
    try:
        fn = LOCAL_DERIVATIVES[act.act_func]
    except KeyError:
        raise ValueError(f"act_func: unknown activation {act.act_func!r}") from None
    return fn(act, gate, up)


