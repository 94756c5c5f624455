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
             amax=True, dbias=False, mode="dense", k=256, n=96, m=2048, beta1=4.0, beta2=25.0, **bs):
    return DgluProblem(n=n, k=k, num_experts=4, m=m, weight_mode=mode, b_major="k", ab_dtype=ab,
                       c_dtype=c, d_dtype=d, act=ActConfig(act_func=act, dgeglu_applies_beta=False,
                                                           situ_beta1=beta1, situ_beta2=beta2),
                       generate_dbias=dbias, has_prob=prob, has_dprob=prob, device_type="cuda",
                       block_scale=BlockScaleConfig(sf_dtype=sf, sf_vec_size=vec, generate_amax=amax, **bs))


def test_declines_with_reasons():
    eng = Sm90BlockScaledEngine()
    assert eng.check_support(_problem()) == []
    assert eng.check_support(_problem(mode="discrete", sf=E8M0, vec=32, act="dswiglu")) == []
    assert eng.check_support(_problem(act="dsituglu", beta1=3.0, dbias=True, d=torch.float32)) == []
    bf16 = dataclasses.replace(_problem(), block_scale=None, ab_dtype=torch.bfloat16)
    assert "not block-scaled" in eng.check_support(bf16)[0]
    cases = [(dict(ab=E4M3, sf=E8M0, vec=32, d=E4M3), "FP8 (MXFP8) operands"),
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


def test_dsituglu_configs_carry_the_betas():
    """dSiTU-GLU's configurations: the kernel's dsituglu epilogue with the problem's betas
    (compile-time constants: another beta1 is another kernel), beta applied to C."""
    eng = Sm90BlockScaledEngine()
    p = _problem(act="dsituglu", beta1=3.0, beta2=8.0)
    space = eng.knob_space(p)
    assert space and all((c.act_func, c.situ_beta1, c.situ_beta2, c.geglu_beta)
                         == ("dsituglu", 3.0, 8.0, True) for c in space)
    other = eng.knob_space(_problem(act="dsituglu"))
    assert {(c.situ_beta1, c.situ_beta2) for c in other} == {(4.0, 25.0)}
    with pytest.raises(ValueError, match=r"another problem: situ_beta1=4.0 \(the problem's: 3.0\)"):
        eng.build(p, other[0])


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


#: dSiTU-GLU kernels the engine can select: every knob-space entry of a small problem (ping-pong
#: tiles 64 and 128 in 1x1, 2x1, 2x2 clusters, 64-row C entries), the cooperative forms (shallow
#: K without dbias, deep K with the split last round), C/D types, dbias, no prob, beta1 4 (the
#: shared exponential) and not 4.
_SITU = dict(act="dsituglu")
_SITU_COOP = dict(act="dsituglu", n=512, m=32768)
_SITU_CASES = [
    ("space-b1-4", _problem(**_SITU), "all"),
    ("b1-3-dbias-Dfp32", _problem(beta1=3.0, beta2=8.0, dbias=True, d=torch.float32, **_SITU),
     "first"),
    ("discrete-Cfp32-Dfp32-noprob", _problem(mode="discrete", c=torch.float32, d=torch.float32,
                                             prob=False, amax=False, **_SITU), "first"),
    ("Cfp16-Dfp16-dbias-b1-2", _problem(c=torch.float16, d=torch.float16, dbias=True, beta1=2.0,
                                         **_SITU), "first"),
    ("coop-shallow-Dfp16", _problem(k=2048, d=torch.float16, **_SITU_COOP), "coop"),
    ("coop-deep-dbias-b1-3", _problem(k=7168, dbias=True, beta1=3.0, **_SITU_COOP), "coop"),
]


@needs_dsl
@pytest.mark.parametrize("problem,which", [c[1:] for c in _SITU_CASES], ids=[c[0] for c in _SITU_CASES])
def test_dsituglu_kernels_compile_for_sm90a_without_spills(problem, which):
    """The dSiTU-GLU epilogue (two tanh and a sigmoid per element, more live values than the
    other activations) compiles in the kernels the engine can select, with no more register
    spills than the kernel's own compile tier allows the same C/D types (none for 16-bit C
    and D of one type and for the cooperative form)."""
    from test_sm90_compile import _check_report, _max_spill

    space = Sm90BlockScaledEngine().knob_space(problem)
    cfgs = {"all": space, "first": space[:1], "coop": [c for c in space if c.cooperative]}[which]
    assert cfgs, which
    for cfg in cfgs:
        assert cfg.act_func == "dsituglu"
        _check_report(cfg, 0 if cfg.cooperative else _max_spill(problem))


def test_opt_in_engine_is_ranked_only_when_named():
    """The heuristics leave the block-scaled Hopper engine out unless a caller names it."""
    from cudnn_ext.engines.heuristics import rank
    from cudnn_ext.errors import NoEngineError

    eng = Sm90BlockScaledEngine()
    assert eng.opt_in
    p = dataclasses.replace(_problem(), device_type="cpu")  # runs nowhere but the reference here
    assert [c.engine.name for c in rank(p)] == ["reference", "reference"]
    with pytest.raises(NoEngineError, match="sm90_blockscaled"):
        rank(p, engines=[eng])
