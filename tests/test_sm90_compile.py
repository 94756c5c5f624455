"""CPU tier: every SM90 kernel variant the engine can select compiles for sm_90a (no GPU).

Skipped cleanly when the CuTe DSL is not importable. Also pins what the compile key holds
(and, as important, what it does not: M, L, pointers, runtime activation constants).
"""
import dataclasses
import importlib.util
import os

import pytest
import torch

from cudnn_ext.engines.base import Knobs
from cudnn_ext.engines.sm90 import Sm90CompileKey, Sm90DgluEngine, TILE_NS
from cudnn_ext.problem import ActConfig, DgluProblem

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


def _problem(act="dswiglu", c=torch.bfloat16, d=torch.bfloat16, dbias=True, n=96, k=200,
             m=1024, L=4):
    return DgluProblem(n=n, k=k, num_experts=L, m=m, weight_mode="dense", b_major="k",
                       ab_dtype=torch.bfloat16, c_dtype=c, d_dtype=d,
                       act=ActConfig(act_func=act), generate_dbias=dbias, device_type="cuda")


def test_compile_key_fields_are_pinned():
    names = [f.name for f in dataclasses.fields(Sm90CompileKey)]
    assert names == ["arch", "n", "k", "ab_dtype", "c_dtype", "d_dtype", "act_func",
                     "generate_dbias", "tile_n", "ab_stages", "raster_group_m", "c_stages", "tvm_ffi"]


def test_compile_key_ignores_runtime_sizes_and_constants():
    knobs = Knobs.of(tile_n=128)
    base = Sm90CompileKey.of(_problem(), knobs)
    assert Sm90CompileKey.of(_problem(m=4096, L=64), knobs) == base
    p = _problem(act="dgeglu")
    q = dataclasses.replace(p, act=ActConfig(act_func="dgeglu", geglu_alpha=1.0,
                                             clamp_max=3.0, clamp_min=-2.0, linear_offset=0.5))
    assert Sm90CompileKey.of(p, knobs) == Sm90CompileKey.of(q, knobs)
    assert Sm90CompileKey.of(_problem(), Knobs.of(tile_n=256)) != base
    hash(base)  # usable as a dict key


def test_declines_with_reasons():
    eng = Sm90DgluEngine()
    p = dataclasses.replace(_problem(), weight_mode="discrete", act=ActConfig("dsituglu"),
                            device_type="cpu")
    reasons = " | ".join(eng.check_support(p))
    assert "discrete" in reasons and "dsituglu" in reasons and "cpu" in reasons
    assert eng.check_support(_problem()) == []


def _variants():
    # every (tile_n, act, dbias) with bf16 C/D, plus each C/D dtype pair once
    out = [(t, a, db, torch.bfloat16, torch.bfloat16)
           for t in TILE_NS for a in ("dswiglu", "dgeglu") for db in (True, False)]
    dts = (torch.bfloat16, torch.float16, torch.float32)
    out += [(128, "dgeglu", True, c, d) for c in dts for d in dts
            if (c, d) != (torch.bfloat16, torch.bfloat16)]
    return out


_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _vid(v):
    t, a, db, c, d = v
    return f"t{t}-{a}-dbias{int(db)}-C{_DT[c]}-D{_DT[d]}"


@needs_dsl
@pytest.mark.parametrize("tile_n,act,dbias,c,d", _variants(), ids=[_vid(v) for v in _variants()])
def test_every_variant_compiles_for_sm90a(tile_n, act, dbias, c, d):
    from cudnn_ext.engines.sm90 import compile_cached

    p = _problem(act=act, c=c, d=d, dbias=dbias)
    assert Knobs.of(tile_n=tile_n, stages=0, raster_group_m=8, scheduler="static_persistent") in \
        Sm90DgluEngine().knob_space(p)
    compiled = compile_cached(Sm90CompileKey.of(p, Knobs.of(tile_n=tile_n)))
    assert compiled is not None
