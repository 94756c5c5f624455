"""dGLU epilogue math for the SM90 kernel, one scalar fp32 function per activation.

Owns the per-element math only (no memory access, no reductions). Each function mirrors its
twin in ``cudnn_ext.reference.epilogue`` one to one and returns the *local* derivatives and
the activation value ``(dgate_local, dup_local, act)``; the caller applies ``g0 = alpha^2 *
acc`` and ``p = prob[row]``:

    dgate = g0*p*dgate_local     dup = g0*p*dup_local     dprob_term = g0*act

Sigmoid is ``1 / (1 + 2^(-x*log2 e))`` with the fast ``ex2.approx`` / ``rcp.approx`` pair, as
the vendor kernel does (vendor_facts 1.10: ~1e-6 relative to an exact sigmoid). Hopper has
no packed f32x2 arithmetic, so everything is scalar fp32.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

LOG2_E = 1.4426950408889634


@cute.jit
def fast_sigmoid(x: Float32) -> Float32:
    # sigma(x) = 1 / (1 + e^-x) = 1 / (1 + 2^(-x*log2(e))); for x -> -inf, ex2 -> +inf and
    # rcp.approx(inf) = 0, so no NaN appears at the tails.
    e = cute.math.exp2(x * Float32(-LOG2_E), fastmath=True)
    return cute.arch.rcp_approx(Float32(1.0) + e)


@cute.jit
def dswiglu_local(gate: Float32, up: Float32):
    """SwiGLU ``silu(gate)*up``: d/dgate = up*s*(1 + gate*(1-s)), d/dup = silu(gate)."""
    s = fast_sigmoid(gate)
    silu = gate * s
    dgate = up * s * (Float32(1.0) + gate * (Float32(1.0) - s))
    return dgate, silu, silu * up


@cute.jit
def dgeglu_local(gate: Float32, up: Float32, alpha: Float32, clamp_max: Float32,
                 clamp_min: Float32, linear_offset: Float32):
    """Clamped GeGLU ``y1*sigmoid(alpha*y1)*(y2+lo)``, y1 = min(gate,cmax), y2 = clamp(up).

    Masks are taken on the unclamped (beta-scaled) values and are inclusive at the bounds
    (vendor_facts 1.6, gotcha 7)."""
    y1 = cute.math.min(gate, clamp_max)
    y2 = cute.math.min(cute.math.max(up, clamp_min), clamp_max)
    s = fast_sigmoid(alpha * y1)
    lin = y2 + linear_offset
    dgate = s * (Float32(1.0) + alpha * y1 * (Float32(1.0) - s)) * lin
    dup = y1 * s
    zero = Float32(0.0)
    dgate = dgate if gate <= clamp_max else zero
    dup = dup if (up >= clamp_min) & (up <= clamp_max) else zero
    return dgate, dup, y1 * s * lin
