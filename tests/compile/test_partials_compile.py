"""CPU tier: the deterministic form's fold of its dprob and dbias partials (``kernels/partials``)
compiles for sm_90a with each sum in one order (loads and adds, no atomics), and its launch
refuses bad arguments before anything compiles or launches."""
import importlib.util
import re

import pytest
from launch_refusals import assert_refused_before_compiling

from cudnn_ext.kernels.partials.config import FoldConfig

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


def test_config_rule():
    for bad in (dict(parts="bf16"), dict(dbias="fp16")):
        with pytest.raises(ValueError, match="the fold sums fp32 partials into fp32 rows and bf16 columns"):
            FoldConfig(**bad).check()


@needs_dsl
@pytest.mark.parametrize("kw,match", [
    (dict(m=0), "m: must be positive with partials"), (dict(p=-1), "must be >= 0"),
    (dict(p=0), "with rows or columns to fold"), (dict(n_offsets=0), "must be >= 0, >= 0, > 0"),
    (dict(m=2 ** 31 - 256), "within int32"),
    (dict(parts=0), "parts: must be non-null and 4-byte aligned"),
    (dict(out=6), "out: must be non-null and 4-byte aligned"),
    (dict(offsets=2), "offsets: must be non-null"),
    (dict(columns=dict(two_n=0)), "columns: two_n, bound_mul, bound_div and unit must be positive"),
    (dict(columns=dict(tiles=-1)), "tiles >= 0"), (dict(columns=dict(bound_div=0)), "must be positive"),
    (dict(columns=dict(unit=0)), "must be positive"), (dict(columns=dict(unit=2 ** 24)), "within int32"),
    (dict(columns=dict(two_n=2 ** 24), n_offsets=256), "within int32"),
    (dict(columns=dict(dbias=3)), "columns.dbias: must be non-null and 2-byte aligned"),
    (dict(columns=dict(cols=0)), "columns.cols: must be non-null"),
    (dict(columns=dict(bounds=6)), "columns.bounds: must be non-null and 4-byte aligned")])
def test_launch_refuses_bad_arguments_before_compiling(kw, match):
    from cudnn_ext.kernels.partials import launch

    args = dict(parts=256, out=512, offsets=1024, m=256, p=2, n_offsets=1, stream_handle=0)
    cols = kw.pop("columns", None)
    args.update(kw)
    if cols is not None:
        fields = dict(cols=2048, dbias=4096, bounds=1024, two_n=64, tiles=4, bound_mul=1, bound_div=128)
        fields.update(cols)
        args["columns"] = launch.ColumnFold(**fields)
    assert_refused_before_compiling(launch, "launch_fold", args, match)


@needs_dsl
def test_fold_compiles_for_sm90a_with_one_order(tmp_path):
    """Each row's and each column's partials are plain loads added one after another into one
    accumulator (the chains the determinism rests on), each output written once (fp32 rows,
    bf16 columns rounded once); no atomic anywhere."""
    from cudnn_ext.kernels.partials.build import compile_fold

    compile_fold(FoldConfig(), ptx_dir=str(tmp_path))
    (ptx,) = list(tmp_path.glob("*.ptx"))
    text = ptx.read_text()
    assert not re.search(r"\b(atom|red)\.", text)
    assert text.count("st.global.b32") == 1 and text.count("st.global.b16") == 1
    assert text.count("cvt.rn.bf16.f32") == 1
    # the unrolled bodies: each add takes the previous sum (the one accumulator) and a loaded part
    adds = re.findall(r"add\.f32\s+(%r\d+),\s*(%r\d+),\s*(%r\d+);", text)
    loaded = set(re.findall(r"ld\.global\.b32\s+(%r\d+),", text))
    chained = [a for a in adds if a[2] in loaded]
    assert len(chained) >= 8, adds
    sums = {a[0] for a in adds}
    assert all(a[1] in sums or a[1] not in loaded for a in chained)
