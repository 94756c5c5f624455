"""CPU tier: every configuration of the D quantizer (``kernels/blockscaled/quantize_d.py``) the
Hopper block-scaled engine can select compiles for sm_90a with the instructions its design
rests on, and the configuration and launch rules refuse the rest before anything compiles or
launches."""
import importlib.util

import pytest
from launch_refusals import assert_refused_before_compiling

from cudnn_ext.kernels.blockscaled.config import QuantizeDConfig

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")

#: what Sm90BlockScaledPlan selects: e4m3 D with scales (global SFD_col, per expert, one
#: group) and the plain conversion to e4m3 / e5m2, with and without a single group
SELECTABLE = [QuantizeDConfig("e4m3", True), QuantizeDConfig("e4m3", True, discrete_col_sfd=True),
              QuantizeDConfig("e4m3", True, single_group=True),
              QuantizeDConfig("e4m3", False), QuantizeDConfig("e5m2", False),
              QuantizeDConfig("e4m3", False, single_group=True),
              QuantizeDConfig("e5m2", False, single_group=True)]


def _id(c):
    return (f"{c.d}-{'sfd' if c.scales else 'plain'}{'-discrete' if c.discrete_col_sfd else ''}"
            f"{'-single' if c.single_group else ''}")


@pytest.mark.parametrize("bad,match", [
    (dict(d="e3m4"), "d must be one of"), (dict(d="e5m2", scales=True), "writes e4m3 D only"),
    (dict(scales=False, discrete_col_sfd=True), "discrete_col_sfd: needs scales")])
def test_config_rule(bad, match):
    with pytest.raises(ValueError, match=match):
        QuantizeDConfig(**bad).check()


@needs_dsl
@pytest.mark.parametrize("kw,match", [
    (dict(m=300), "m: must be a positive multiple of 256"),
    (dict(two_n=96), "two_n: must be a positive multiple of 64"),
    (dict(groups=0), "groups: must be >= 1"), (dict(x=8), "x, d_row: must be 16-byte aligned"),
    (dict(offsets=0), "offsets: the quantizer reads"),
    (dict(sfd_col=0), "sfd_col: scale generation writes")])
def test_launch_refuses_bad_arguments_before_compiling(kw, match):
    from cudnn_ext.kernels.blockscaled import launch

    args = dict(x=256, d_row=512, m=256, two_n=128, groups=1, stream_handle=0, d_col=1024,
                sfd_row=2048, sfd_col=4096, offsets=4, norm_const=8)
    args.update(kw)
    assert_refused_before_compiling(launch, "launch_quantize_d", args, match, QuantizeDConfig())


@needs_dsl
@pytest.mark.parametrize("cfg", SELECTABLE, ids=[_id(c) for c in SELECTABLE])
def test_quantizer_compiles_for_sm90a(cfg, tmp_path):
    from cudnn_ext.kernels.blockscaled.build import compile_quantize_d

    compile_quantize_d(cfg, ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    # 16-byte loads of fp32 D, 4-byte stores of FP8 D, the hardware's saturating conversion
    assert "ld.global.v4.b32" in text and "st.global.b32" in text
    assert f"cvt.rn.satfinite.{cfg.d}x2.f32" in text
    # no flushing arithmetic (tiny blocks and their multipliers are subnormal-sensitive), and
    # the tile's 128 values stay in registers (no local-memory array)
    assert ".ftz" not in text and "ld.local" not in text and "st.local" not in text
    if cfg.scales:
        # the row blocks' amax and SFD_row words: butterfly shuffles within the warp
        assert "shfl.sync.bfly.b32" in text
        assert "cvt.rn.satfinite.e5m2x2" not in text
