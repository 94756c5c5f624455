"""CPU tier: the reference engine's pointer-table gather (``cudnn_ext.kernels.pointer_gather``)
compiles for sm_90a without a GPU, once per process. Skipped cleanly when the CuTe DSL is not
importable (tests/gpu/test_pointer_gather.py runs it on the device)."""
import importlib.util

import pytest

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


@needs_dsl
def test_gather_compiles_for_sm90a_once():
    from cudnn_ext.kernels import pointer_gather

    compiled = pointer_gather.compile_gather("sm_90a")
    assert compiled is not None
    assert pointer_gather.compile_gather("sm_90a") is compiled  # no dtype, size or pointer in the key
