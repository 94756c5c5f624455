"""The racecheck probe (tests/support/racecheck_probe.py) compiles for sm_90a on the CPU in every
mode, so the device run that asks racecheck about mbarrier hand-offs cannot fail on a DSL
error; a mode it does not know is refused by name."""
import importlib.util

import pytest


needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl not installed")


@needs_dsl
@pytest.mark.parametrize("mode", ["bar", "mbar", "none", "mbar1", "war1", "war32", "wartx",
                                  "wartx32", "ring", "ring1", "ringtma", "ringtma32"])
def test_probe_compiles_for_sm90a(mode):
    import racecheck_probe

    assert racecheck_probe.compile_probe(mode) is not None


@needs_dsl
def test_probe_refuses_unknown_modes():
    import re

    import racecheck_probe

    with pytest.raises(ValueError, match=re.escape(
            f"mode must be one of {racecheck_probe.HANDOFF_MODES}, got 'ring'")):
        racecheck_probe.HandOff("ring")
    with pytest.raises(ValueError, match=re.escape(
            f"mode must be one of {racecheck_probe.MODES}, got 'x'")):
        racecheck_probe.main("x")
