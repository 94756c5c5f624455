"""The block-scaled cross (tests/support/blockscaled_cross.py) on the Hopper engine
``sm90_blockscaled``: every format (MXFP8 e4m3/e5m2, NVFP4, MXFP4), major-ness (N-major FP8
weights included), weight mode (dense, pointer tables), activation (dSwiGLU, dGeGLU,
dSiTU-GLU) and prob/dbias choice against the float64 oracle of the dequantized operands, on
poisoned outputs. The reference engine runs the same points on the CPU
(tests/unit/test_blockscaled_cross.py)."""
import pytest

import blockscaled_cross as X
from sm90_cases import skip_unless_sm90

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("pt", X.points(), ids=lambda p: p.label())
def test_sm90_blockscaled_on_the_cross(pt):
    skip_unless_sm90()
    t = X.make(pt, "cuda")
    print(pt.label(), X.check(t, X.run(t, "sm90_blockscaled")))
