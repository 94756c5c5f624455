"""The SM90 epilogue's dSiTU-GLU math, emulated in fp32 on the CPU (tests/support/fp32_emulation:
each kernel operation rounded, ``ex2.approx``/``rcp.approx`` at their documented error bounds
in both directions) against float64: the accuracy docs/kernels.md quotes, the saturated
tails (huge |C|: no NaN, exact +-1 and 0), C near 0 (relative accuracy kept), and the same
return convention as ``reference.epilogue.dsituglu``. The kernel itself runs on the H200
(tests/gpu/test_sm90_blockscaled.py)."""
import numpy as np
import pytest
import torch

pytest.importorskip("cutlass")  # the constants live in the kernel's module

import fp32_emulation as E  # noqa: E402

from cudnn_ext.kernels.sm90.epilogue_math import LOG2_E  # noqa: E402

F32 = np.float32
BETAS = [(4.0, 25.0), (3.0, 25.0), (1.5, 2.0), (8.0, 0.5)]


def _tanh_kernel(y, sign):
    e = E.ex2(E.mul(np.abs(y), F32(2.0 * LOG2_E)), sign)
    return E.tanh_sech2(y, e, sign)


def test_tanh_is_accurate_to_2_pow_minus_21_and_sech2_keeps_its_relative_accuracy():
    """tanh: at most 2^-21 relative error over |y| in [1e-6, 30] (the polynomial near 0 where
    1 - 2r would cancel); 1 - tanh^2: relative error within a few 2^-23 x (1 + |y|), the
    exponential's argument rounding, where tanh.approx's 1 - t*t is 0 (relative error 1)."""
    y = np.concatenate([np.geomspace(1e-6, 30, 100000), -np.geomspace(1e-6, 30, 20000)]).astype(F32)
    y64 = y.astype(np.float64)
    t64, sech2 = np.tanh(y64), 1 / np.cosh(y64) ** 2
    for sign in (1, -1, 0):
        t, s2 = _tanh_kernel(y, sign)
        assert np.max(np.abs(t - t64) / np.abs(t64)) < 2.0 ** -21
        rel = np.abs(s2 - sech2) / sech2
        assert np.all(rel < 2.0 ** -23 * 4 * (2 + np.abs(y64))), float(np.max(rel))
    small = np.abs(y64) < 4
    assert np.max((np.abs(_tanh_kernel(y, 1)[1] - sech2) / sech2)[small]) < 1e-6
    # what the exponential form alone (no polynomial) would give near 0, and tanh.approx:
    # the reasons for the choice
    r = E.rcp(E.add(1.0, E.ex2(E.mul(np.abs(y), F32(2 * LOG2_E)))))
    bare = np.copysign(E.fma(-2.0, r, 1.0), y)
    assert np.max(np.abs(bare - t64) / np.abs(t64)) > 1e-2
    assert np.max(np.abs(E.tanh_approx(y) - t64) / np.abs(t64)) > 2.0 ** -12
    sat = np.abs(y64) > 10  # exact tanh rounds to +-1 in fp32 from about 9
    assert np.all(E.add(1.0, -E.mul(E.tanh_approx(y[sat], 0), E.tanh_approx(y[sat], 0))) == 0)


def test_tanh_saturates_without_nan():
    y = np.array([20, -20, 44.5, -44.5, 88.8, -88.8, 1e4, -1e30, np.inf, -np.inf], dtype=F32)
    for sign in (1, -1):
        t, s2 = _tanh_kernel(y, sign)
        assert np.array_equal(t, np.sign(y).astype(F32))
        assert np.all(np.isfinite(s2)) and np.all(s2 >= 0) and np.all(s2[2:] == 0)
    t, s2 = _tanh_kernel(np.array([0.0, -0.0], dtype=F32), 1)
    assert np.array_equal(t, [0, 0]) and np.array_equal(s2, [1, 1])


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    gate = np.concatenate([rng.standard_normal(100000) * 3, np.geomspace(1e-5, 300, 10000),
                           -np.geomspace(1e-5, 300, 10000), rng.standard_normal(10000) * 1e-3])
    up = np.concatenate([rng.standard_normal(100000) * 3, rng.standard_normal(20000) * 60,
                         rng.standard_normal(10000) * 1e-3])
    return gate.astype(F32), up.astype(F32)


@pytest.mark.parametrize("beta1,beta2", BETAS)
def test_dsituglu_local_matches_float64(beta1, beta2):
    """Every output within 5e-6 relative to float64, per element, over |C| from 1e-5 to 300
    (dgate_local relative to its two terms' magnitudes: it crosses 0 where they cancel);
    within 5e-7 of the largest value for N(0, 3) inputs. beta1 == 4 (sigma from the gate
    tanh's exponential) and other beta1 alike."""
    gate, up = _inputs()
    (dg, du, act), terms = E.dsituglu_f64(gate, up, beta1, beta2)
    scales = (terms, np.abs(du), np.abs(act))
    for sign in (1, -1):
        got = E.dsituglu_kernel(gate, up, beta1, beta2, sign)
        for x, ref, scale in zip(got, (dg, du, act), scales):
            assert np.all(np.isfinite(x))
            live = scale > 1e-30  # (below, fp32's range ends: the kernel's values are 0)
            assert np.max(np.abs(x - ref)[live] / scale[live]) < 5e-6
            assert np.all(np.abs(x - ref)[~live] < 1e-30)
            body = slice(0, 100000)
            assert np.max(np.abs(x - ref)[body]) < 5e-7 * np.max(np.abs(ref[body]))


def test_tanh_approx_would_be_three_orders_worse():
    """The alternative measured (tanh.approx.f32, 1 - t*t, the fast sigmoid): ~1e-3 of the
    largest value on N(0, 3) inputs, and unbounded per element where tanh saturates."""
    gate, up = _inputs()
    (dg, du, act), _ = E.dsituglu_f64(gate, up, 4.0, 25.0)
    got = E.dsituglu_tanh_approx(gate, up, 4.0, 25.0)
    body = slice(0, 100000)
    worst = max(np.max(np.abs(x - r)[body]) / np.max(np.abs(r[body]))
                for x, r in zip(got, (dg, du, act)))
    assert worst > 3e-4


def test_emulated_kernel_and_reference_share_the_return_convention():
    """(dgate_local, dup_local, act) of the beta-scaled C values, as
    ``reference.epilogue.dsituglu`` returns them (float64, moderate inputs)."""
    from cudnn_ext.reference.epilogue import dsituglu

    gate, up = _inputs(1)
    gate, up = gate[:100000], up[:100000]
    for beta1, beta2 in BETAS:
        ref = dsituglu(torch.from_numpy(gate).double(), torch.from_numpy(up).double(),
                       beta1=beta1, beta2=beta2)
        got = E.dsituglu_kernel(gate, up, beta1, beta2, 0)
        for x, r in zip(got, ref):
            r = r.numpy()
            assert np.max(np.abs(x - r)) < 1e-6 * np.max(np.abs(r))
