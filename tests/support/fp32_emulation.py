"""numpy emulation of the SM90 epilogue's fp32 arithmetic (tests only), to measure the
accuracy of ``kernels.sm90.epilogue_math`` against float64 on the CPU.

Each fp32 operation rounds to nearest (``fma`` once, where ptxas contracts ``a*b + c``:
the polynomial's Horner steps). The approximate instructions are modelled
by their documented bounds: the exact value times (1 + d), d = ``sign`` x the bound
(``sign`` +1 or -1: the worst case of a monotone chain is at one end; 0 = exact), then
rounded to fp32:

* ``ex2.approx.ftz.f32``: 2 ulp (relative 2^-22);
* ``rcp.approx.ftz.f32``: 1 ulp (relative 2^-23);
* ``tanh.approx.f32``: relative 2^-11 (for the comparison with the vendor's choice).

Subnormal results flush to zero (``.ftz``).
"""
from __future__ import annotations

import numpy as np

f32, f64 = np.float32, np.float64
EX2_REL = 2.0 ** -22
RCP_REL = 2.0 ** -23
TANH_APPROX_REL = 2.0 ** -11
_TINY = np.finfo(np.float32).tiny


def _ftz(x):
    x = np.asarray(x, dtype=f32)
    return np.where(np.abs(x) < _TINY, f32(0.0), x)


def r32(x):
    """Round float64 values to fp32 (nearest even)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=f64).astype(f32)


def ex2(x, sign=1):
    with np.errstate(over="ignore"):
        return _ftz(r32(np.exp2(np.asarray(x, dtype=f64)) * (1 + sign * EX2_REL)))


def rcp(x, sign=1):
    with np.errstate(divide="ignore"):
        return _ftz(r32((1.0 / np.asarray(x, dtype=f64)) * (1 + sign * RCP_REL)))


def tanh_approx(x, sign=1):
    return r32(np.tanh(np.asarray(x, dtype=f64)) * (1 + sign * TANH_APPROX_REL))


def mul(a, b):
    return r32(np.asarray(a, dtype=f64) * np.asarray(b, dtype=f64))


def add(a, b):
    return r32(np.asarray(a, dtype=f64) + np.asarray(b, dtype=f64))


def fma(a, b, c):
    """a*b + c with one rounding (the fp32 product is exact in float64)."""
    return r32(np.asarray(a, dtype=f64) * np.asarray(b, dtype=f64) + np.asarray(c, dtype=f64))


# ---------------------------------------------------------------------- the kernel's dSiTU-GLU
def tanh_sech2(y, e, sign=1):
    """``epilogue_math.tanh_sech2`` step by step."""
    from cudnn_ext.kernels.sm90.epilogue_math import TANH_POLY, TANH_POLY_MAX

    y = np.asarray(y, dtype=f32)
    r = rcp(add(1.0, e), sign)
    z = mul(y, y)
    p = f32(TANH_POLY[3])
    for i in range(3):
        p = fma(p, z, f32(TANH_POLY[2 - i]))
    near0 = fma(mul(y, z), p, y)
    t = np.copysign(fma(-2.0, r, 1.0), y)
    t = np.where(np.abs(y) < f32(TANH_POLY_MAX), near0, t)
    return t, mul(mul(4.0, r), add(1.0, -r))


def dsituglu_kernel(gate, up, beta1, beta2, sign=1):
    """``epilogue_math.dsituglu_local`` step by step: (dgate_local, dup_local, act)."""
    from cudnn_ext.kernels.sm90.epilogue_math import LOG2_E

    gate, up = np.asarray(gate, dtype=f32), np.asarray(up, dtype=f32)
    eg = ex2(mul(np.abs(gate), f32(2.0 * LOG2_E / beta1)), sign)
    eu = ex2(mul(np.abs(up), f32(2.0 * LOG2_E / beta2)), sign)
    t, sech2_g = tanh_sech2(mul(gate, f32(1.0 / beta1)), eg, sign)
    u, sech2_u = tanh_sech2(mul(up, f32(1.0 / beta2)), eu, sign)
    e_full = mul(eg, eg) if beta1 == 4.0 else ex2(mul(np.abs(gate), f32(LOG2_E)), sign)
    q = rcp(add(1.0, e_full), sign)
    s = np.where(gate >= 0, add(1.0, -q), q)
    gv = mul(mul(f32(beta1), t), s)
    uv = mul(f32(beta2), u)
    inner = fma(sech2_g, s, mul(mul(f32(beta1), t), mul(q, add(1.0, -q))))
    return mul(uv, inner), mul(gv, sech2_u), mul(gv, uv)


def dsituglu_tanh_approx(gate, up, beta1, beta2, sign=1):
    """The same with ``tanh.approx.f32`` and 1 - t*t, sigma as ``fast_sigmoid`` (the other
    choice, measured against)."""
    from cudnn_ext.kernels.sm90.epilogue_math import LOG2_E

    gate, up = np.asarray(gate, dtype=f32), np.asarray(up, dtype=f32)
    t = tanh_approx(mul(gate, f32(1.0 / beta1)), sign)
    u = tanh_approx(mul(up, f32(1.0 / beta2)), sign)
    s = rcp(add(1.0, ex2(mul(gate, f32(-LOG2_E)), sign)), sign)
    gv = mul(mul(f32(beta1), t), s)
    uv = mul(f32(beta2), u)
    inner = fma(add(1.0, -mul(t, t)), s, mul(mul(mul(f32(beta1), t), s), add(1.0, -s)))
    return mul(uv, inner), mul(gv, add(1.0, -mul(u, u))), mul(gv, uv)


def _sigmoid64(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def dsituglu_f64(gate, up, beta1, beta2):
    """float64 truth of the same (dgate_local, dup_local, act) and the magnitude scale of
    dgate_local's two terms (its sum cancels where dgate_local crosses 0)."""
    g, u_in = np.asarray(gate, dtype=f64), np.asarray(up, dtype=f64)
    t, u = np.tanh(g / beta1), np.tanh(u_in / beta2)
    # sigma(g) and 1 - sigma(g) = sigma(-g) each without cancellation or overflow
    s, s_neg = _sigmoid64(g), _sigmoid64(-g)
    with np.errstate(over="ignore"):
        sech2_g = 1 / np.cosh(g / beta1) ** 2
        sech2_u = 1 / np.cosh(u_in / beta2) ** 2
    gv, uv = beta1 * t * s, beta2 * u
    s1s = s * s_neg
    terms = np.abs(uv) * (np.abs(sech2_g * s) + np.abs(beta1 * t * s1s))
    return (uv * (sech2_g * s + beta1 * t * s1s), gv * sech2_u, gv * uv), terms
