"""CPU tier: every configuration of the blockwise FP8 quantizer (``kernels/blockwise``) that
``cudnn_ext.torch.quantize_fp8_blockwise`` or the fp8_blockwise engine can select compiles for
sm_90a with the instructions its bit-exactness rests on, and the configuration and launch rules
refuse the rest before anything compiles or launches."""
import importlib.util

import pytest
from launch_refusals import assert_refused_before_compiling

from cudnn_ext.kernels.blockwise.config import BLOCK_SETS, SOURCE_DTYPES, BlockwiseQuantConfig
from cudnn_ext.quant.blockwise import BLOCKS

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")

#: the op: each source, each block, both scale rules; the engine: fp32 D, masked, both blocks
SELECTABLE = ([BlockwiseQuantConfig(src, (block,), pow2) for src in SOURCE_DTYPES for block in BLOCKS
               for pow2 in (False, True)]
              + [BlockwiseQuantConfig("fp32", ((1, 128), (128, 1)), masked=True)])


def _id(c):
    return f"{c.src}-{'+'.join(f'{a}x{b}' for a, b in c.blocks)}{'-pow2' if c.pow2_scales else ''}" \
           f"{'-masked' if c.masked else ''}"


@pytest.mark.parametrize("bad,match", [
    (dict(src="fp64"), "src must be one of"), (dict(blocks=((128, 128), (1, 128))), "blocks must be one of"),
    (dict(blocks=((64, 128),)), "blocks must be one of")])
def test_config_rule(bad, match):
    with pytest.raises(ValueError, match=match):
        BlockwiseQuantConfig(**bad).check()


def test_block_sets_are_the_recipes_blocks():
    assert {b for s in BLOCK_SETS for b in s} == set(BLOCKS)


@needs_dsl
@pytest.mark.parametrize("kw,match", [
    (dict(rows=0), "rows, k, groups: must be positive"), (dict(k=130), "k, ld, gstride: must be multiples of 4"),
    (dict(ld=130), "multiples of 4"), (dict(ld=64), "ld >= k"), (dict(groups=2, gstride=6), "multiples of 4"),
    (dict(k=2 ** 31), "within int32"), (dict(x=4), "x, q_a, s_a: must be 8-"),
    (dict(q_a=2), "x, q_a, s_a"), (dict(cfg=BlockwiseQuantConfig(blocks=((1, 128), (128, 1)))), "q_b, s_b"),
    (dict(cfg=BlockwiseQuantConfig(masked=True)), "offsets: a masked quantizer"),
    (dict(cfg=BlockwiseQuantConfig(src="int8")), "src must be one of")])
def test_launch_refuses_bad_arguments_before_compiling(kw, match):
    from cudnn_ext.kernels.blockwise import launch

    args = dict(cfg=BlockwiseQuantConfig(), x=256, q_a=512, s_a=1024, rows=256, k=128, ld=128, gstride=0,
                groups=1, stream_handle=0)
    args.update(kw)
    assert_refused_before_compiling(launch, "launch_quantize", args, match)


@needs_dsl
@pytest.mark.parametrize("cfg", SELECTABLE, ids=[_id(c) for c in SELECTABLE])
def test_quantizer_compiles_for_sm90a(cfg, tmp_path):
    from cudnn_ext.kernels.blockwise.build import compile_quantize

    compile_quantize(cfg, ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    # one vector load per lane and row, 4-byte stores of e4m3, the hardware's saturating
    # conversion, and the IEEE division the rule names (scale and quotients alike)
    assert ("ld.global.v4.b32" if cfg.src == "fp32" else "ld.global.v4.b16") in text
    assert "st.global.b32" in text and "cvt.rn.satfinite.e4m3x2.f32" in text
    assert "div.rn.f32" in text and "div.approx" not in text and "div.full" not in text
    # no flushing (subnormal sources and the 2^-126 floor), the tile stays in registers
    assert ".ftz" not in text and "ld.local" not in text and "st.local" not in text
    # the row blocks' amax: butterfly shuffles; column and tile blocks: the CTA's barrier
    assert ("shfl.sync.bfly.b32" in text) == (cfg.has((1, 128)) or cfg.has((128, 128)))
    assert ("bar.sync" in text) == (cfg.has((128, 1)) or cfg.has((128, 128)))
