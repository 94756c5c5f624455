"""dGeGLU at its clamp bounds on the Hopper kernel (sm90_cutedsl): the same cases as the CPU
tier (tests/support/boundary_cases.py), the vendor's defaults and DeepSeek-V4.1's slope 1,
clamps +-10, offset 0; the masks' sides exactly, the values within the kernel's tolerances
(its sigmoid is the fast one: elementwise within 1e-2, dprob as the GPU suite's)."""
import pytest
from boundary_cases import CONFIGS, boundary_case, check, run
from gpu_skips import needs_hopper_and_dsl
from sm90_cases import TOL

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_kernel_masks_at_and_beside_the_bounds(config):
    needs_hopper_and_dsl()
    t = boundary_case(config, device="cuda")
    check(t, run(t, engine="sm90_cutedsl"), tol=TOL["dprob"], d_tol=1e-2)
