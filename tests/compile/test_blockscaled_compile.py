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


def _mix(text):
    """The memory, conversion and multiply instructions of a PTX text, counted."""
    import collections
    import re

    return collections.Counter(re.findall(r"^\s+((?:ld|st|cvt|mul|fma)\.[\w.]+)", text, re.M))


@needs_dsl
@pytest.mark.parametrize("cfg,tables,n_major", VARIANTS,
                         ids=["-".join(map(str, c)) + ("-tables" if t else "-dense") + ("-n" if n else "")
                              for c, t, n in VARIANTS])
def test_dequantizer_pair_is_both_dequantizers_in_one_kernel(cfg, tables, n_major, tmp_path):
    """The engine's one launch for A (dense K-major) and B (``cfg`` with its tables and
    major-ness): its loads, stores, conversions and multiplies are exactly A's kernel's plus
    B's (each thread runs one of them, as the single kernel would)."""
    from cudnn_ext.kernels.blockscaled.build import compile_dequant, compile_dequant_pair
    from cudnn_ext.kernels.blockscaled.config import DequantPairConfig

    a, b = DequantConfig(*cfg), DequantConfig(*cfg, tables, n_major)
    texts = []
    for fn, c, name in ((compile_dequant, a, "a"), (compile_dequant, b, "b"),
                        (compile_dequant_pair, DequantPairConfig(a, b), "pair")):
        (tmp_path / name).mkdir()
        fn(c, ptx_dir=str(tmp_path / name))
        (ptx,) = list((tmp_path / name).glob("*.ptx"))
        texts.append(ptx.read_text())
    assert _mix(texts[2]) == _mix(texts[0]) + _mix(texts[1])


@pytest.mark.parametrize("a,b,match", [
    (DequantConfig("e4m3", "e8m0", 32, tables=True), DequantConfig("e4m3", "e8m0", 32), "a: dense K-major"),
    (DequantConfig("e4m3", "e8m0", 32, n_major=True), DequantConfig("e4m3", "e8m0", 32), "a: dense K-major"),
    (DequantConfig("e2m1", "e4m3", 16), DequantConfig("e2m1", "e4m3", 32), "one format")])
def test_dequantizer_pair_rule(a, b, match):
    from cudnn_ext.kernels.blockscaled.config import DequantPairConfig

    with pytest.raises(ValueError, match=match):
        DequantPairConfig(a, b).check()
