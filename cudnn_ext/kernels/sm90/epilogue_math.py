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
dSiTU-GLU's tanh is built from the same pair plus a short polynomial near 0 (``tanh_sech2``),
not ``tanh.approx.f32``: its ~2^-11 relative error, and 1 - tanh^2 taken from it, would be the
largest error in the epilogue (figures in docs/kernels.md, "dSiTU-GLU accuracy").
Hopper has no packed f32x2 arithmetic, so everything is scalar fp32.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LOG2_E = 1.4426950408889634
#: tanh(y) = y + y*z*P(z), z = y*y, for |y| < TANH_POLY_MAX, with P's coefficients (constant
#: term first; fp32 values of a fit for the least maximum relative error on (0, 0.55]: 3.7e-8,
#: below fp32's half ulp). Above it the exponential form has no cancellation to fear.
TANH_POLY_MAX = 0.55
TANH_POLY = (-0.3333294689655304, 0.13320735096931458, -0.052672483026981354,
             0.016438836231827736)


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


@cute.jit
def tanh_sech2(y: Float32, e: Float32):
    """(tanh(y), 1 - tanh(y)^2) given ``e`` = exp(2|y|) (``ex2.approx`` of 2|y|*log2(e)).

    With r = 1 / (1 + e) = sigma(-2|y|) (``rcp.approx``): |tanh y| = 1 - 2r and 1 - tanh^2 =
    4r(1 - r), which keeps its relative accuracy where tanh saturates (1 - t*t is 0 once t
    rounds to 1; 4r(1 - r) is exp(-2|y|)-small and exact to a few ulp). Near 0, 1 - 2r
    cancels, so |y| < TANH_POLY_MAX takes the polynomial. At the tails e = inf gives r = 0:
    (+-1, 0), no NaN."""
    r = cute.arch.rcp_approx(Float32(1.0) + e)
    z = y * y
    p = Float32(TANH_POLY[3])
    for i in cutlass.range_constexpr(3):
        p = p * z + Float32(TANH_POLY[2 - i])
    near0 = y + y * z * p
    t = cute.math.copysign(Float32(1.0) - Float32(2.0) * r, y)
    t = near0 if cute.math.absf(y) < Float32(TANH_POLY_MAX) else t
    return t, Float32(4.0) * r * (Float32(1.0) - r)


@cute.jit
def dsituglu_local(gate: Float32, up: Float32, beta1: cutlass.Constexpr,
                   beta2: cutlass.Constexpr):
    """SiTU-GLU ``beta1*tanh(gate/beta1)*sigmoid(gate) * beta2*tanh(up/beta2)`` on the
    beta-scaled C values, as the reference ``dsituglu``; beta1, beta2 are the config's
    compile-time constants (docs/vendor_contract.md §2.4).

    sigma(gate) comes as q = sigma(-|gate|) = 1 / (1 + exp(|gate|)): s = 1 - q for gate >= 0,
    else q, and s(1 - s) = q(1 - q) either way (no 1 - s cancellation at large |gate|). With
    beta1 == 4 exp(|gate|) is the square of the gate tanh's exp(|gate|/2): one ex2 fewer
    (the vendor's sigma = 1/2 + t/(1 + t^2) identity saves the same ex2, but cancels for very
    negative gate)."""
    eg = cute.math.exp2(cute.math.absf(gate) * Float32(2.0 * LOG2_E / beta1), fastmath=True)
    eu = cute.math.exp2(cute.math.absf(up) * Float32(2.0 * LOG2_E / beta2), fastmath=True)
    t, sech2_g = tanh_sech2(gate * Float32(1.0 / beta1), eg)
    u, sech2_u = tanh_sech2(up * Float32(1.0 / beta2), eu)
    e_full = eg * eg
    if cutlass.const_expr(beta1 != 4.0):
        e_full = cute.math.exp2(cute.math.absf(gate) * Float32(LOG2_E), fastmath=True)
    q = cute.arch.rcp_approx(Float32(1.0) + e_full)
    s = Float32(1.0) - q if gate >= Float32(0.0) else q
    gate_value = Float32(beta1) * t * s
    up_value = Float32(beta2) * u
    dgate = up_value * (sech2_g * s + Float32(beta1) * t * (q * (Float32(1.0) - q)))
    return dgate, gate_value * sech2_u, gate_value * up_value
