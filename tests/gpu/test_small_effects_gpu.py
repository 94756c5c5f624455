"""The small-effect checks of tests/unit/test_small_effects.py on the Hopper engines: the
problems of tests/support/exact_cases.py, whose every output the float64 oracle computes
exactly, run on ``sm90_cutedsl`` (BF16 operands) and ``sm90_blockscaled`` (MXFP4). D, dprob
accumulated into the caller's buffer, dbias summed once into the caller's bf16 dbias, the
activation output and amax must match the oracle bit for bit; a 16-bit alpha's square and the
fp32 activation constants within fp32 noise. The CPU tier's
``test_each_option_moves_the_exact_outputs`` shows every option dropped or done another way
(a bf16 partial per 128- or 256-row tile, dbias summed from the stored bf16 D, another
rounding mode, an exclusive clamp mask, beta or linear_offset left out) changes outputs of
these problems, so each would fail here."""
import pytest
import torch

from exact_cases import (ACTS, BF16, CONSTANTS, FP16, SIZES, alpha_squared_case, amax_case, bit_exact_outputs,
                         check_alpha_squared, check_constants, constants_case)
from sm90_cases import skip_unless_sm90

pytestmark = pytest.mark.gpu

#: fp32 noise of the kernels' epilogues on these problems (the transcendental approximations,
#: about 1e-6 relative each: docs/kernels.md); each constant rounded to bf16 moves D by at
#: least 20x this (situ_beta2 2.1e-4, geglu_alpha 2.3e-4 of max |D|)
CONSTANT_TOL = 1e-5
#: (sizes, m_aligned): 256-row groups, and groups of any size on the ragged schedule
SHAPES = {"a256": (SIZES, 256), "a1": ((203, 0, 37, 1, 300), 1)}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("api", ["wrapper", "class"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sm90_outputs_are_bit_exact(act, api, shape):
    skip_unless_sm90()
    sizes, m_aligned = SHAPES[shape]
    name = bit_exact_outputs(act, api, sizes=sizes, device="cuda", m_aligned=m_aligned)
    assert name in (None, "sm90_cutedsl"), name


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("api", ["wrapper", "class"])
def test_sm90_blockscaled_outputs_are_bit_exact(act, api):
    skip_unless_sm90()
    name = bit_exact_outputs(act, api, fmt="mxfp4", device="cuda", engine="sm90_blockscaled")
    assert name in (None, "sm90_blockscaled"), name


@pytest.mark.parametrize("alpha_dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_sm90_blockscaled_squares_alpha_in_its_own_16_bit_type(alpha_dtype):
    skip_unless_sm90()
    check_alpha_squared(*alpha_squared_case(alpha_dtype, device="cuda", engine="sm90_blockscaled"))


@pytest.mark.parametrize("inf", [False, True], ids=["finite", "inf"])
@pytest.mark.parametrize("path", ["wrapper", "class"])
def test_sm90_blockscaled_amax_is_exact_nan_quiet_and_per_half(path, inf):
    skip_unless_sm90()
    amax, want = amax_case(path, inf=inf, device="cuda", engine="sm90_blockscaled")
    assert torch.equal(amax.double(), want), (amax, want)


@pytest.mark.parametrize("act", list(CONSTANTS))
def test_sm90_activation_constants_keep_fp32_precision(act):
    """BF16 dGeGLU on sm90_cutedsl, block-scaled dSiTU-GLU on sm90_blockscaled."""
    skip_unless_sm90()
    check_constants(act, *constants_case(act, device="cuda", engine="sm90_blockscaled"), tol=CONSTANT_TOL, effect=20)
