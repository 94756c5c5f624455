"""CPU tier: the layer's kernels (``kernels/layer``: the GLU forward of each activation the
layer takes, the tail zeroing, the row gather) compile for sm_90a with the instructions their design rests on,
and the launch rules refuse bad arguments before anything compiles or launches."""
import importlib.util

import pytest
from launch_refusals import assert_refused_before_compiling

from cudnn_ext.kernels.layer.config import GluConfig

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")

#: what GroupedGluMLP selects (glu_config's defaults for each activation)
SELECTABLE = [GluConfig("dswiglu"), GluConfig("dgeglu", linear_offset=1.0)]


def test_config_rule():
    with pytest.raises(ValueError, match="act must be one of"):
        GluConfig("relu").check()


@needs_dsl
@pytest.mark.parametrize("cfg", SELECTABLE, ids=[c.act for c in SELECTABLE])
def test_glu_compiles_for_sm90a(cfg, tmp_path):
    from cudnn_ext.kernels.layer.build import compile_glu

    compile_glu(cfg, ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    # 16-byte loads of gate and up, one 16-byte store of h; the epilogue's fast sigmoid
    assert text.count("ld.global.v4.b32") == 2 and text.count("st.global.v4.b32") == 1
    assert "ex2.approx" in text and "rcp.approx" in text
    assert "ld.local" not in text and "st.local" not in text
    if cfg.act == "dgeglu":
        # the clamps at +-7 (fp32 0x40E00000 / 0xC0E00000), as compares and selects
        assert "0f40E00000" in text and "0fC0E00000" in text


@needs_dsl
def test_zero_tail_compiles_for_sm90a(tmp_path):
    from cudnn_ext.kernels.layer.build import compile_zero_tail

    compile_zero_tail(ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    assert "st.global.v4.b32" in text and "ld.global" in text  # 16-byte zero stores; the offset


@needs_dsl
def test_gather_compiles_for_sm90a(tmp_path):
    from cudnn_ext.kernels.layer.build import compile_gather

    compile_gather(ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    # the row's valid byte and source index, then one 16-byte load and store
    assert "ld.global.b8" in text and "ld.global.b64" in text
    assert text.count("ld.global.v4.b32") == 1 and text.count("st.global.v4.b32") == 1


@needs_dsl
@pytest.mark.parametrize("kw,match", [(dict(row_bytes=20), "row_bytes: must be a positive multiple of 16"),
                                      (dict(out=8), "x, out: must be 16-byte aligned")])
def test_gather_launch_refuses_bad_arguments_before_compiling(kw, match):
    from cudnn_ext.kernels.layer import launch

    args = dict(x=256, idx=512, valid=1024, out=2048, rows_out=4, row_bytes=64, stream_handle=0)
    args.update(kw)
    assert_refused_before_compiling(launch, "launch_gather", args, match)


@needs_dsl
@pytest.mark.parametrize("kw,match", [(dict(n=12), "n: must be a positive multiple of 8"),
                                      (dict(c=8), "c, h: must be 16-byte aligned")])
def test_glu_launch_refuses_bad_arguments_before_compiling(kw, match):
    from cudnn_ext.kernels.layer import launch

    args = dict(c=256, prob=512, offsets=1024, h=2048, m=4, n=64, groups=1, stream_handle=0)
    args.update(kw)
    assert_refused_before_compiling(launch, "launch_glu", args, match, GluConfig())


@needs_dsl
@pytest.mark.parametrize("kw,match", [(dict(row_bytes=24), "row_bytes: must be a positive multiple of 16"),
                                      (dict(x=8), "x: must be 16-byte aligned")])
def test_zero_tail_launch_refuses_bad_arguments_before_compiling(kw, match):
    from cudnn_ext.kernels.layer import launch

    args = dict(x=256, offsets=512, m=4, row_bytes=64, groups=1, stream_handle=0)
    args.update(kw)
    assert_refused_before_compiling(launch, "launch_zero_tail", args, match)
