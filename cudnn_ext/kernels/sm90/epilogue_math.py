"""dGLU epilogue math for the SM90 kernel, one scalar fp32 function per activation.

Owns the per-element math only (no memory access, no reductions). Each function mirrors its
twin in ``cudnn_ext.reference.epilogue`` and returns the *local* derivatives and the
activation value ``(dgate_local, dup_local, act)`` of the beta-scaled C values ``gate`` and
``up``; the caller applies ``g0 = alpha^2 * acc`` and ``p = prob[row]``:

    dgate = g0*p*dgate_local     dup = g0*p*dup_local     dprob_term = g0*act

``dgeglu_local`` takes gate and up as the reference does. ``dswiglu_unscaled`` takes the
unscaled C values and returns the reference ``dswiglu(beta*c_gate, beta*c_up)`` divided by
(beta, beta, beta^2): the caller multiplies beta into its per-row factor alpha^2*p and
beta^2 into each dprob row sum once, instead of beta into every C value, and keeps
alpha^2 out of the per-element products the same way (three multiplies fewer per element,
where the cooperative epilogue, not hidden under MMAs, spends much of its time).

Sigmoid is ``1 / (1 + 2^(-x*log2 e))`` with the fast ``ex2.approx`` / ``rcp.approx`` pair, as
the vendor kernel does (docs/vendor_contract.md §1.10: ~1e-6 relative to an exact sigmoid).
Hopper has no packed f32x2 arithmetic, so everything is scalar fp32.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

LOG2_E = 1.4426950408889634


@cute.jit
def sigmoid_of_neg_log2(y: Float32) -> Float32:
    """sigma(x) given y = -x*log2(e): 1 / (1 + 2^y). For x -> -inf, ex2 -> +inf and
    rcp.approx(inf) = 0, so no NaN appears at the tails."""
    return cute.arch.rcp_approx(Float32(1.0) + cute.math.exp2(y, fastmath=True))


@cute.jit
def fast_sigmoid(x: Float32) -> Float32:
    return sigmoid_of_neg_log2(x * Float32(-LOG2_E))


@cute.jit
def dswiglu_unscaled(c_gate: Float32, c_up: Float32, beta: Float32, neg_log2e_beta: Float32):
    """The reference ``dswiglu(beta*c_gate, beta*c_up)`` divided by (beta, beta, beta**2),
    computed from the unscaled C values (``neg_log2e_beta`` = -log2(e)*beta). With gate =
    beta*c_gate, s = sigma(gate) and t = c_gate*s (= silu(gate)/beta): dgate_local/beta =
    c_up*s*(1 + gate*(1-s)) = c_up*s*(1 + beta*(c_gate - t)), dup_local/beta = t,
    act/beta**2 = t*c_up. Holds for any beta, 0 included."""
    s = sigmoid_of_neg_log2(c_gate * neg_log2e_beta)
    t = c_gate * s
    w = Float32(1.0) + beta * (c_gate - t)
    return c_up * s * w, t, t * c_up


@cute.jit
def dgeglu_local(gate: Float32, up: Float32, alpha: Float32, clamp_max: Float32,
                 clamp_min: Float32, linear_offset: Float32):
    """Clamped GeGLU ``y1*sigmoid(alpha*y1)*(y2+lo)``, y1 = min(gate,cmax), y2 = clamp(up).

    Masks are taken on the unclamped (beta-scaled) values and are inclusive at the bounds
    (docs/vendor_contract.md §1.6, gotcha 7)."""
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
