"""CPU tier: every configuration of the block-scaled dequantizer compiles for sm_90a, and the
configuration rule refuses the rest before anything compiles."""
import importlib.util

import pytest

from cudnn_ext.kernels.blockscaled.config import DequantConfig

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")

VALID = [("e4m3", "e8m0", 32), ("e5m2", "e8m0", 32), ("e2m1", "e4m3", 16), ("e2m1", "e4m3", 32),
         ("e2m1", "e8m0", 16), ("e2m1", "e8m0", 32)]


@pytest.mark.parametrize("bad,match", [
    (("e3m4", "e8m0", 32), "elem must be"), (("e4m3", "ue8m0", 32), "sf must be"),
    (("e2m1", "e4m3", 64), "sf_vec must be"), (("e4m3", "e4m3", 32), "FP8 elements take e8m0"),
    (("e5m2", "e8m0", 16), "FP8 elements take e8m0"),
    (("e2m1", "e8m0", 32, False, True), "FP4 elements are K-major only")])
def test_config_rule(bad, match):
    with pytest.raises(ValueError, match=match):
        DequantConfig(*bad).check()


def test_stored_bytes():
    assert DequantConfig("e2m1", "e4m3", 16).stored_bytes(256) == 128
    assert DequantConfig("e4m3", "e8m0", 32).stored_bytes(256) == 256


#: every (configuration, tables, n_major) the engine can select: FP8 weights may be N-major
VARIANTS = [(c, tables, n_major) for c in VALID for tables in (False, True)
            for n_major in ((False, True) if c[0] != "e2m1" else (False,))]


@needs_dsl
@pytest.mark.parametrize("cfg,tables,n_major", VARIANTS,
                         ids=["-".join(map(str, c)) + ("-tables" if t else "-dense") + ("-n" if n else "")
                              for c, t, n in VARIANTS])
def test_dequantizer_compiles_for_sm90a(cfg, tables, n_major, tmp_path):
    from cudnn_ext.kernels.blockscaled.build import compile_dequant

    elem = cfg[0]
    compile_dequant(DequantConfig(*cfg, tables, n_major), ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    # 16-byte stores of the BF16 results; no flushing multiply (e8m0 code 0 is a subnormal)
    assert "st.global.v4.b32" in text and "mul.ftz" not in text
    if elem != "e2m1":
        assert "cvt.rn.f16x2.e" in text  # the hardware FP8 conversion
