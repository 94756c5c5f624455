"""The block-scaled Hopper engine's host side, without a GPU: what it declines (with reasons),
its configurations (the sm90 kernel's for the dequantized problem, with the block-scaled
epilogue's fields), its workspace layout, and that every kernel it can select compiles for
sm_90a."""
import dataclasses
import importlib.util

import pytest
import torch

from cudnn_ext.engines.sm90 import config_for
from cudnn_ext.engines.sm90_blockscaled import Sm90BlockScaledEngine, Sm90BlockScaledPlan, dense_problem
from cudnn_ext.problem import ActConfig, BlockScaleConfig, DgluProblem

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")
FP4, E4M3, E8M0 = torch.uint8, torch.float8_e4m3fn, torch.float8_e8m0fnu


def _problem(ab=FP4, sf=E4M3, vec=16, act="dgeglu", d=torch.bfloat16, c=torch.bfloat16, prob=True,
             amax=True, dbias=False, mode="dense", k=256, n=96, **bs):
    return DgluProblem(n=n, k=k, num_experts=4, m=2048, weight_mode=mode, b_major="k", ab_dtype=ab,
                       c_dtype=c, d_dtype=d, act=ActConfig(act_func=act, dgeglu_applies_beta=False),
                       generate_dbias=dbias, has_prob=prob, has_dprob=prob, device_type="cuda",
                       block_scale=BlockScaleConfig(sf_dtype=sf, sf_vec_size=vec, generate_amax=amax, **bs))


def test_declines_with_reasons():
    eng = Sm90BlockScaledEngine()
    assert eng.check_support(_problem()) == []
    assert eng.check_support(_problem(mode="discrete", sf=E8M0, vec=32, act="dswiglu")) == []
    bf16 = dataclasses.replace(_problem(), block_scale=None, ab_dtype=torch.bfloat16)
    assert "not block-scaled" in eng.check_support(bf16)[0]
    cases = [(dict(ab=E4M3, sf=E8M0, vec=32, d=E4M3), "FP8 (MXFP8) operands"),
             (dict(act="dsituglu"), "act_func 'dsituglu'"),
             (dict(c=E4M3), "C dtype"),
             (dict(single_group_runtime_offsets=True), "use_single_group_runtime_offsets"),
             (dict(deterministic=True), "deterministic dprob"),
             (dict(k=80), "K % 32 == 0"),
             (dict(n=80), "N % 32 == 0")]
    for kw, needle in cases:
        why = eng.check_support(_problem(**kw))
        assert any(needle in w for w in why), (kw, why)
    cpu = dataclasses.replace(_problem(), device_type="cpu")
    assert any("not cuda" in w for w in eng.check_support(cpu))


def test_configs_carry_the_block_scaled_epilogue():
    eng = Sm90BlockScaledEngine()
    p = _problem(prob=False)
    space = eng.knob_space(p)
    assert space and all(c.generate_amax and not c.geglu_beta and not c.has_prob and not c.has_dprob
                         and c.ab_dtype == "bf16" and c.weight_mode == "dense" for c in space)
    assert all(c == dataclasses.replace(config_for(p, **{f: getattr(c, f) for f in (
        "tile_n", "cluster_m", "cluster_n", "c_split", "cooperative", "c_stages", "ab_stages",
        "raster_group_m", "split_last")})) for c in space)
    assert eng.cost(p, space[0]) > 0
    with pytest.raises(ValueError, match="another problem"):
        eng.build(p, dataclasses.replace(space[0], generate_amax=False))
    with pytest.raises(TypeError, match="Sm90Config"):
        eng.build(p, object())
    assert dense_problem(p).block_scale is None and dense_problem(p).ab_dtype == torch.bfloat16


@needs_dsl
def test_workspace_holds_the_kernel_scratch_and_bf16_weights():
    from cudnn_ext.engines.base import defer_compile

    p = _problem(dbias=True, mode="discrete", d=torch.float32)
    with defer_compile():
        plan = Sm90BlockScaledEngine().build(p, Sm90BlockScaledEngine().knob_space(p)[0])
    assert isinstance(plan, Sm90BlockScaledPlan)
    regions = {r.name: r for r in plan._layout.regions}
    assert regions["b_bf16"].nbytes == 2 * p.num_experts * p.n * p.k
    assert regions["kernel_scratch"].offset == 0 and regions["b_bf16"].offset % 128 == 0
    assert plan.workspace_size >= regions["b_bf16"].offset + regions["b_bf16"].nbytes
    with pytest.raises(ValueError, match="needs .* bytes"):
        plan.execute({"c": torch.zeros(1, 2 * p.n), "padded_offsets": torch.zeros(4)}, None)


@needs_dsl
@pytest.mark.parametrize("kw", [dict(), dict(act="dswiglu", prob=False, d=torch.float32, dbias=True),
                                dict(mode="discrete", sf=E8M0, vec=32, c=torch.float32, amax=False)],
                         ids=["geglu-amax", "swiglu-noprob-fp32-dbias", "discrete-Cfp32"])
def test_selectable_kernels_compile_for_sm90a(kw):
    """The first-ranked configuration of each family compiles (the kernel's own compile tier
    covers the knob space; these add the block-scaled epilogue's fields)."""
    from cudnn_ext.engines.heuristics import ranked_knobs
    from cudnn_ext.kernels.sm90.launch import compile_kernel

    p = _problem(**kw)
    cfg, _ = ranked_knobs(Sm90BlockScaledEngine(), p)[0]
    compile_kernel(cfg)


def test_opt_in_engine_is_ranked_only_when_named(monkeypatch):
    """An engine marked ``opt_in`` is left out of the heuristics unless a caller names it
    (shown on the block-scaled Hopper engine, marked for the test)."""
    from cudnn_ext.engines.heuristics import rank
    from cudnn_ext.errors import NoEngineError

    eng = Sm90BlockScaledEngine()
    assert not eng.opt_in  # ranked by default
    monkeypatch.setattr(Sm90BlockScaledEngine, "opt_in", True)
    p = dataclasses.replace(_problem(), device_type="cpu")  # runs nowhere but the reference here
    assert [c.engine.name for c in rank(p)] == ["reference", "reference"]
    with pytest.raises(NoEngineError, match="sm90_blockscaled"):
        rank(p, engines=[eng])
