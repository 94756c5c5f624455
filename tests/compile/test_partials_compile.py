"""CPU tier: the deterministic form's dprob fold (``kernels/partials``) compiles for sm_90a
with its sum in one order (loads and adds, no atomics), and its launch refuses bad
arguments before anything compiles or launches."""
import importlib.util
import re

import pytest
from launch_refusals import assert_refused_before_compiling

from cudnn_ext.kernels.partials.config import FoldConfig

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


def test_config_rule():
    with pytest.raises(ValueError, match="the fold sums fp32 partials into fp32"):
        FoldConfig(parts="bf16").check()


@needs_dsl
@pytest.mark.parametrize("kw,match", [
    (dict(m=0), "m, p, n_offsets: must be positive"), (dict(p=0), "must be positive"),
    (dict(n_offsets=0), "must be positive"), (dict(m=2 ** 31 - 256), "within int32"),
    (dict(parts=0), "non-null and 4-byte aligned"), (dict(out=6), "non-null and 4-byte aligned"),
    (dict(offsets=2), "non-null and 4-byte aligned")])
def test_launch_refuses_bad_arguments_before_compiling(kw, match):
    from cudnn_ext.kernels.partials import launch

    args = dict(parts=256, out=512, offsets=1024, m=256, p=2, n_offsets=1, stream_handle=0)
    args.update(kw)
    assert_refused_before_compiling(launch, "launch_fold", args, match)


@needs_dsl
def test_fold_compiles_for_sm90a_with_one_order(tmp_path):
    """Each row's partials are plain loads added one after another into one accumulator
    (the chain the determinism rests on), the output written once; no atomic anywhere."""
    from cudnn_ext.kernels.partials.build import compile_fold

    compile_fold(FoldConfig(), ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    assert not re.search(r"\b(atom|red)\.", text)
    assert text.count("st.global.b32") == 1
    # the unrolled body: each add takes the previous sum (the one accumulator) and a loaded part
    adds = re.findall(r"add\.f32\s+(%r\d+),\s*(%r\d+),\s*(%r\d+);", text)
    assert len(adds) >= 4
    loaded = set(re.findall(r"ld\.global\.b32\s+(%r\d+),", text))
    assert all(part in loaded for _, _, part in adds[:-1])
