"""CPU tier: the SM90 engine's configuration, knob space and plans, without compiling
(``tests/compile/test_sm90_compile.py`` compiles every selectable variant). Pins what the
config holds (and, as important, what it does not: M, L, pointers, runtime activation
constants), which knobs the engine offers where, the workspace layouts and the launch's
argument order. Needs the CuTe DSL's modules (skipped cleanly without them).
"""
import dataclasses
import importlib.util

import pytest
import torch

from cudnn_ext.engines.sm90 import (CLUSTER_MS, COOPERATIVE_DEEP_KNOBS, COOPERATIVE_KNOBS,
                                    Sm90DgluEngine, config_for, cooperative_config)
from cudnn_ext.kernels.sm90.config import (SMEM_CAPACITY, SPLIT_SLOTS, TRACE_MAX_CTAS,
                                           Sm90Config, Sm90TraceConfig)
from cudnn_ext.problem import ActConfig
from sm90_problem import BF16, FP16, FP32, problem as _problem

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


# ---------------------------------------------------------------------- the config
def test_config_fields_are_pinned():
    """The compile key: everything the kernel is specialized on, nothing else."""
    names = [f.name for f in dataclasses.fields(Sm90Config)]
    assert names == ["n", "k", "ab_dtype", "c_dtype", "d_dtype", "act_func", "generate_dbias",
                     "weight_mode", "b_major", "generate_activation", "round_dgrad", "geglu_beta",
                     "has_prob", "has_dprob", "generate_amax", "d_scales", "discrete_col_sfd",
                     "situ_beta1", "situ_beta2", "tile_n", "ab_stages", "c_stages", "c_split",
                     "cluster_m", "cluster_n", "raster_group_m", "cooperative", "split_last",
                     "act_staged", "wg_stagger",
                     "init_outputs", "ws_zeroed", "fold_dbias", "ragged_m", "deterministic"]
    assert [f.name for f in dataclasses.fields(Sm90TraceConfig)] == names + ["trace"]


def test_config_ignores_runtime_sizes_and_constants():
    base = config_for(_problem(), tile_n=128)
    assert config_for(_problem(m=4096, L=64), tile_n=128) == base
    p = _problem(act="dgeglu")
    q = dataclasses.replace(p, act=ActConfig(act_func="dgeglu", geglu_alpha=1.0,
                                             clamp_max=3.0, clamp_min=-2.0, linear_offset=0.5))
    assert config_for(p, tile_n=128) == config_for(q, tile_n=128)
    assert config_for(_problem(), tile_n=256) != base
    assert config_for(_problem(), tile_n=128, cluster_m=2, cluster_n=2) != \
        config_for(_problem(), tile_n=128, cluster_m=2)
    disc = config_for(_problem(weight_mode="discrete"), tile_n=128)
    assert disc != base and (disc.weight_mode, disc.b_major) == ("discrete", "k")
    assert config_for(_problem(weight_mode="discrete", b_major="n"), tile_n=128) != disc
    assert config_for(_problem(weight_mode="discrete", L=64), tile_n=128) == disc
    assert config_for(_problem(), tile_n=128, cluster_m=2).raster_group_m == 4
    assert config_for(_problem(), tile_n=128, trace=8) != base  # the debug build's own key
    hash(base)  # usable as a dict key


def test_config_keys_on_the_situ_betas_for_dsituglu_only():
    """dSiTU-GLU's beta1/beta2 are compile-time constants (part of the key, as in the
    vendor's kernel); the other activations keep the defaults whatever the problem's
    ActConfig holds, so they compile once."""
    from cudnn_ext.kernels.sm90.config import SITU_DEFAULTS

    def situ(b1=4.0, b2=25.0, act="dsituglu"):
        return dataclasses.replace(_problem(), act=ActConfig(act_func=act, situ_beta1=b1,
                                                             situ_beta2=b2))

    base = config_for(situ(), tile_n=128)
    assert (base.act_func, base.situ_beta1, base.situ_beta2) == ("dsituglu", 4.0, 25.0)
    assert config_for(situ(3.0), tile_n=128) != base
    assert config_for(situ(b2=8.0), tile_n=128) != base
    assert config_for(situ(3.0), tile_n=128).situ_beta1 == 3.0
    for act in ("dswiglu", "dgeglu"):
        cfg = config_for(situ(3.0, 8.0, act=act), tile_n=128)
        assert (cfg.situ_beta1, cfg.situ_beta2) == SITU_DEFAULTS
        assert cfg == config_for(_problem(act=act), tile_n=128)
    for b1, b2 in ((0.0, 25.0), (4.0, -1.0), (float("inf"), 25.0), (4.0, float("nan")),
                   (True, 25.0)):
        with pytest.raises(ValueError, match="situ_beta1/situ_beta2 must be finite and positive"):
            dataclasses.replace(base, situ_beta1=b1, situ_beta2=b2).check()
    with pytest.raises(ValueError, match="must stay .* with act_func 'dswiglu'"):
        dataclasses.replace(base, act_func="dswiglu", situ_beta1=3.0).check()
    # the activation output: the epilogue stores it for every activation
    for act in ("dswiglu", "dgeglu", "dsituglu"):
        cfg = dataclasses.replace(base, act_func=act, generate_activation=True)
        if act != "dsituglu":
            cfg = dataclasses.replace(cfg, situ_beta1=SITU_DEFAULTS[0], situ_beta2=SITU_DEFAULTS[1])
        cfg.check()


def test_config_round_trips_through_its_dict():
    """What serialized plans store (``as_dict``) and load (``knobs_from_dict``)."""
    eng = Sm90DgluEngine()
    for cfg in (cooperative_config(_problem(n=512, k=7168, m=32768)),
                config_for(_problem(), tile_n=64, trace=4)):
        again = eng.knobs_from_dict(cfg.as_dict())
        assert again == cfg and type(again) is type(cfg)
    with pytest.raises(ValueError, match=r"unknown fields \['stages'\]"):
        Sm90Config.from_dict({**cfg.as_dict(), "stages": 0})
    with pytest.raises(ValueError, match="missing"):
        Sm90Config.from_dict({"n": 64})


def test_build_refuses_a_config_of_another_problem():
    eng, p = Sm90DgluEngine(), _problem()
    with pytest.raises(ValueError, match=r"another problem: n=128 \(the problem's: 96\)"):
        eng.build(p, config_for(_problem(n=128), tile_n=128))
    with pytest.raises(TypeError, match="Sm90Config"):
        eng.build(p, {"tile_n": 128})


def test_declines_with_reasons():
    eng = Sm90DgluEngine()
    p = dataclasses.replace(_problem(), act=ActConfig("dsituglu"), device_type="cpu")
    reasons = " | ".join(eng.check_support(p))
    assert "dsituglu" in reasons and "block-scaled" in reasons and "cpu" in reasons
    assert eng.check_support(_problem()) == []
    assert eng.check_support(_problem(b_major="n")) == []  # dense N-major (e.g. the MLP's w2^T)


@pytest.mark.parametrize("b_major", ["k", "n"])
def test_discrete_is_supported(b_major):
    """Discrete B (K- and N-major) is offered: verified on the H200 (tests/gpu)."""
    eng = Sm90DgluEngine()
    assert eng.check_support(_problem(weight_mode="discrete", b_major=b_major)) == []
    bad = dataclasses.replace(_problem(), weight_mode="gathered")
    assert any("weight_mode" in r for r in eng.check_support(bad))


def _cfg(**kw):
    base = dict(n=512, k=64, ab_dtype="bf16", c_dtype="bf16", d_dtype="bf16",
                act_func="dswiglu", generate_dbias=True)
    return Sm90Config(**{**base, **kw})


def test_config_refuses_unsupported_cluster_shapes():
    cfg = _cfg(n=64, generate_dbias=False, weight_mode="discrete", cluster_m=2)
    cfg.check()  # 2x1 with discrete B: accepted
    with pytest.raises(ValueError, match="cluster_n must be 1 with discrete B"):
        dataclasses.replace(cfg, cluster_n=2).check()
    with pytest.raises(ValueError, match="cluster_m"):
        dataclasses.replace(cfg, weight_mode="dense", cluster_m=4).check()
    with pytest.raises(ValueError, match="cluster_n"):
        dataclasses.replace(cfg, weight_mode="dense", cluster_m=1, cluster_n=2).check()


def test_tile_n_limit_depends_on_the_schedule():
    """A warpgroup's accumulator is at most 128 fp32 registers per thread: ping-pong 128-row
    tiles stop at 128 columns, cooperative (64 rows per warpgroup) at 256."""
    cfg = _cfg(tile_n=256)
    with pytest.raises(ValueError, match=r"tile_n must be a multiple of 32 in \[32, 128\]"):
        cfg.check()
    dataclasses.replace(cfg, cooperative=True).check()  # accepted
    # a configuration that leaves room for one A/B stage would deadlock: refused by name
    with pytest.raises(ValueError, match=r"ab_stages: 1 .*at least 2"):
        dataclasses.replace(cfg, cooperative=True, c_dtype="fp32", d_dtype="fp32",
                            c_stages=5).check()
    with pytest.raises(ValueError, match=r"ab_stages: 1 .*at least 2"):
        dataclasses.replace(cfg, tile_n=128, ab_stages=1).check()
    with pytest.raises(ValueError, match=r"\[32, 256\].*got 288"):
        dataclasses.replace(cfg, cooperative=True, tile_n=288).check()


def test_pingpong_keeps_six_ab_stages_with_and_without_dbias():
    """Shared memory budget (227 KiB): ping-pong 128 x 128 with one C stage per warpgroup
    keeps 6 A/B stages of 32 KiB with dbias too: its dbias sums are one 64-column slice per
    C stage (2 KiB, summed by the C producer warps), and the mbarriers get a 1 KiB margin;
    the cooperative 128 x 256 schedule keeps 4 stages of 48 KiB next to its 2 KiB dbias slot.
    (The sum below is the buffers' arithmetic; the GPU runs launch the real layout.)"""
    cfg = _cfg(n=768, k=2048, c_stages=1)
    assert cfg.dbias_smem_shape() == (64, 4, 2)
    for db in (True, False):
        c = dataclasses.replace(cfg, generate_dbias=db)
        assert c.stages() == 6
        used = 6 * 32768 + 2 * 16384 + 4 * c.dbias_smem_floats()
        assert SMEM_CAPACITY - used >= 512  # room for the mbarriers (< 200 B here)
    two = dataclasses.replace(cfg, c_stages=2)
    assert two.stages() == 4 and two.dbias_smem_shape() == (64, 4, 4)
    coop = dataclasses.replace(cfg, cooperative=True, tile_n=256, c_stages=2)
    assert coop.dbias_smem_shape() == (64, 8) and coop.stages() == 4


def test_pingpong_dbias_refuses_more_c_stages_than_blocks_per_tile():
    """The C producer warp hands back a stage's dbias sums knowing only the current and the
    previous tile, so with dbias a warpgroup may hold at most a tile's worth of C blocks."""
    cfg = _cfg(n=256, tile_n=64, c_stages=2)
    cfg.check()  # 2 blocks of a 64-column tile: accepted
    with pytest.raises(ValueError, match=r"c_stages must be at most tile_n / 32 = 2 .*got 3"):
        dataclasses.replace(cfg, c_stages=3).check()
    dataclasses.replace(cfg, c_stages=3, generate_dbias=False).check()  # no sums


def test_explicit_ab_stages_that_do_not_fit_are_refused():
    """An explicit A/B stage count bypasses the fit: the deep-K cooperative form (3 A/B
    stages, 4 C stages per warpgroup) fits with 16-bit C, where the engine offers it, and is
    refused with fp32 C (280 KB against 227) before anything compiles."""
    cfg = cooperative_config(_problem(n=512, k=7168, m=32768))
    assert (cfg.ab_stages, cfg.c_stages, cfg.stages_that_fit()) == (3, 4, 3)
    cfg.check()
    wide_c = dataclasses.replace(cfg, c_dtype="fp32")
    assert wide_c.stages_that_fit() == 2
    with pytest.raises(ValueError, match=r"ab_stages: 3 .*do not fit .*at most 2 do"):
        wide_c.check()


def test_quantized_d_rules():
    """FP8 D (the block-scaled contract's, quantized by the epilogue): 16-bit operands on
    256-aligned experts; scales with e4m3 D only; per-expert SFD_col with scales only. The
    scales' amax exchange takes 4 KiB of shared memory (an A/B stage less where it is the
    last one)."""
    base = _cfg(tile_n=128, d_dtype="e4m3", d_scales=True)
    base.check()
    assert base.fp8_d() and base.mx_exchange_ints() * 4 == 4096
    assert base.stages_that_fit() == dataclasses.replace(base, d_scales=False).stages_that_fit() - 1
    dataclasses.replace(base, d_dtype="e5m2", d_scales=False).check()  # plain conversion
    dataclasses.replace(base, discrete_col_sfd=True).check()
    for bad, needle in ((dict(d_dtype="e5m2"), "d_scales with e4m3 D"),
                        (dict(d_scales=False, discrete_col_sfd=True), "discrete_col_sfd with d_scales"),
                        (dict(ragged_m=True), "256-aligned offsets"),
                        (dict(ab_dtype="e4m3", k=512, tile_n=64), "16-bit operands")):
        with pytest.raises(ValueError, match=f"quantized D needs .*{needle}"):
            dataclasses.replace(base, **bad).check()
    with pytest.raises(ValueError, match="d_dtype must be one of"):
        dataclasses.replace(base, d_dtype="e8m0").check()
    with pytest.raises(ValueError, match="c_dtype must be one of"):
        dataclasses.replace(base, c_dtype="e4m3").check()


def test_c_split_is_ping_pong_only():
    cfg = _cfg(tile_n=256, cooperative=True, c_split=2)
    with pytest.raises(ValueError, match="c_split must be 1, or 2 in the ping-pong schedule"):
        cfg.check()
    with pytest.raises(ValueError, match="c_split must be 1, or 2 .*got c_split=4"):
        dataclasses.replace(cfg, cooperative=False, tile_n=128, c_split=4).check()


def test_folder_sums_the_cooperative_dbias_slots_folded_or_not():
    """The folder warp sums the cooperative dbias slots wherever the cooperative kernel has
    dbias, folded in the kernel or not (the JAX path): then warp 3 runs, and the shared slot
    is one block's (64 columns, 8 warps). Ping-pong keeps its C producer hand-back, with a
    folder only to fold."""
    cfg = _cfg(k=7168, tile_n=256, cooperative=True)
    assert cfg.fold_in_kernel() and cfg.coop_dbias_slots() and cfg.has_folder()
    unfolded = dataclasses.replace(cfg, fold_dbias=False)
    assert unfolded.coop_dbias_slots() and unfolded.has_folder() and not unfolded.fold_in_kernel()
    assert cfg.dbias_smem_shape() == (64, 8) == unfolded.dbias_smem_shape()
    assert dataclasses.replace(cfg, tile_n=128).dbias_smem_shape() == (64, 8)
    nodb = dataclasses.replace(cfg, generate_dbias=False)
    assert not nodb.coop_dbias_slots() and not nodb.has_folder()
    pp = dataclasses.replace(cfg, cooperative=False, tile_n=128)
    assert not pp.coop_dbias_slots() and pp.has_folder()
    assert not dataclasses.replace(pp, fold_dbias=False).has_folder()


def test_split_last_rules():
    """split_last: 1..4, cooperative only, at most tile_n / 32 C stages; refused by name
    before anything compiles."""
    p = _problem(n=512, k=1024)
    for bad in (dict(tile_n=128, split_last=2),
                dict(tile_n=256, cooperative=True, split_last=5),
                dict(tile_n=256, cooperative=True, split_last=0),
                dict(tile_n=64, cooperative=True, split_last=2, c_stages=3)):
        with pytest.raises(ValueError, match="split_last"):
            config_for(p, **bad).check()


# ---------------------------------------------------------------------- the knob space
def test_c_split_is_offered_where_it_was_measured():
    """64-row C ring entries (c_split 2): 16-bit C and D of one type, ping-pong tile 128 in
    1x1 and 2x1 clusters, dense weights at any K, discrete weights at K <= 2048; not for
    tile 64, 2x2 clusters, discrete weights at K > 2048, fp32 C or D, or D of another type
    than C."""
    eng = Sm90DgluEngine()

    def split(p):
        return {(kn.tile_n, kn.cluster_m, kn.cluster_n): kn.c_split
                for kn in eng.knob_space(p) if not kn.cooperative}

    dense = {(64, 1, 1): 1, (128, 1, 1): 2, (64, 2, 1): 1, (128, 2, 1): 2, (64, 2, 2): 1,
             (128, 2, 2): 1}
    assert split(_problem(k=2048)) == dense
    assert split(_problem(k=7168)) == dense
    assert split(_problem(k=2048, weight_mode="discrete", b_major="n")) == {
        (64, 1, 1): 1, (128, 1, 1): 2, (64, 2, 1): 1, (128, 2, 1): 2}
    assert set(split(_problem(k=2056, weight_mode="discrete")).values()) == {1}
    assert split(_problem(k=200, c=FP16, d=FP16))[(128, 2, 1)] == 2
    for c, d in ((BF16, FP32), (FP32, FP32), (BF16, FP16)):
        assert set(split(_problem(k=200, c=c, d=d)).values()) == {1}


def test_knob_space_holds_nothing_else():
    """Every entry is a valid config of the problem, in the launch form plans start from,
    with the cluster's raster group and the A/B stages that fit (cooperative deep: 3, its
    last round split for dSwiGLU only)."""
    eng = Sm90DgluEngine()
    for p in (_problem(), _problem(weight_mode="discrete", b_major="n", c=FP32),
              _problem(n=2048, k=7168, m=32768), _problem(n=1024, k=4096, m=32768, dbias=False),
              _problem(n=2048, k=7168, m=32768, act="dgeglu"), _problem(n=2048, k=7168, m=32768, act="dsituglu")):
        for kn in eng.knob_space(p):
            kn.check()
            assert (kn.init_outputs, kn.ws_zeroed, kn.fold_dbias) == (False, False, True)
            assert kn.raster_group_m == {1: 8, 2: 4}[kn.cluster_m]
            deep = kn.cooperative and p.k >= 5120
            assert kn.ab_stages == (3 if deep else 0)
            assert kn.c_stages == (0 if not kn.cooperative else 4 if deep else 2)
            assert kn.split_last == (3 if deep and p.act.act_func == "dswiglu" else 1)


def test_cluster_shapes_per_weight_mode():
    """Discrete weights get 2x1 clusters (the CTA pair shares one expert, hence one
    device-built descriptor) but not 2x2. 2x2 is never ranked first, but within autotune's
    default top 4."""
    eng = Sm90DgluEngine()
    assert {k.cluster_m for k in eng.knob_space(_problem())} == set(CLUSTER_MS)
    assert {k.cluster_m for k in eng.knob_space(_problem(weight_mode="discrete"))} == {1, 2}
    assert {k.cluster_n for k in eng.knob_space(_problem(weight_mode="discrete"))} == {1}
    assert {k.cluster_n for k in eng.knob_space(_problem())} == {1, 2}
    # the chosen dense schedules run in 2x1 clusters: ping-pong 128 x 128 (mixtral-like with
    # dbias, qwen3-like without) and cooperative 128 x 256 (dsv3-like with dbias: deep K;
    # qwen3-like without dbias, C and D of different 16-bit types)
    for kw, tile_n in ((dict(m=16384, n=14336, k=4096), 128), (dict(m=32768, n=2048, k=7168), 256),
                       (dict(m=16384, n=768, k=2048, dbias=False), 128),
                       (dict(m=16384, n=768, k=2048, dbias=False, d=FP16), 256)):
        p = _problem(**kw)
        ranked = sorted(eng.knob_space(p), key=lambda k: eng.cost(p, k))
        assert (ranked[0].tile_n, ranked[0].cluster_m, ranked[0].cluster_n) == (tile_n, 2, 1)
        assert any(k.cluster_n == 2 for k in ranked[:4]), kw


def test_cooperative_is_selected_where_it_measured_faster():
    """Heuristics: the cooperative 128 x 256 schedule is ranked first for dense and
    per-expert weights (the shallow-K case: dense only), 16-bit C and D, N % 256 == 0 and
    enough tiles, where it measured faster than ping-pong (docs/kernels.md, heuristics
    table): at K >= 5120 up to N 8192 with or without dbias (the deep form), at K 4096-5119
    up to N 1024 (the 2-stage form), and without dbias at K <= 2048 for C and D of different
    16-bit types (where ping-pong cannot take 64-row C entries). Everything else keeps
    ping-pong 128 x 128 in 2x1 clusters, with 64-row C entries where they apply."""
    eng = Sm90DgluEngine()

    def best(**kw):
        p = _problem(**{"n": 768, "k": 2048, "m": 16384, "L": 32, **kw})
        return p, min(eng.knob_space(p), key=lambda k: eng.cost(p, k))

    def is_form(knobs, **kw):
        p, choice = best(**kw)
        if knobs is COOPERATIVE_DEEP_KNOBS and p.act.act_func != "dswiglu":  # (split: dSwiGLU only)
            knobs = {**knobs, "split_last": 1}
        return choice == config_for(p, **knobs)

    mixed = dict(c=BF16, d=FP16)
    dsv3 = dict(k=7168, n=2048, L=8, m=32768)
    assert is_form(COOPERATIVE_KNOBS, dbias=False, **mixed)
    assert is_form(COOPERATIVE_KNOBS, dbias=False, act="dgeglu", c=FP16, d=BF16)
    assert is_form(COOPERATIVE_KNOBS, dbias=False, k=1416, **mixed)
    # skew's K and N: dense and per-expert weights, with or without dbias
    for kw in (dict(dbias=True, k=4096, n=1024), dict(dbias=False, k=4096, n=1024),
               dict(dbias=True, k=5112, n=512, m=32768), dict(dbias=True, k=4096, n=768),
               dict(dbias=True, k=4096, n=1024, b_major="n"),
               dict(dbias=False, k=4096, n=1024, **mixed),
               dict(dbias=True, weight_mode="discrete", k=4096),
               dict(dbias=True, weight_mode="discrete", k=4096, n=1024),
               dict(dbias=False, weight_mode="discrete", b_major="n", k=5112, n=1024)):
        assert is_form(COOPERATIVE_KNOBS, **kw), kw
    for kw in (dict(dbias=True, **dsv3), dict(dbias=False, **dsv3),
               dict(dbias=True, **{**dsv3, "k": 8192}), dict(dbias=True, **{**dsv3, "k": 12288}),
               dict(dbias=True, act="dgeglu", **dsv3), dict(dbias=True, **mixed, **dsv3),
               dict(dbias=True, c=FP16, d=FP16, **dsv3),
               dict(dbias=True, b_major="n", **dsv3),
               dict(dbias=True, weight_mode="discrete", **dsv3),
               dict(dbias=False, weight_mode="discrete", b_major="n", **dsv3),
               dict(dbias=True, weight_mode="discrete", **{**dsv3, "k": 7160}),
               dict(dbias=False, weight_mode="discrete", **{**dsv3, "k": 5120}),
               dict(dbias=True, weight_mode="discrete", **{**dsv3, "k": 5120, "n": 8192}),
               dict(dbias=True, **{**dsv3, "k": 6144}),
               dict(dbias=True, **{**dsv3, "k": 5120}),
               dict(dbias=True, **{**dsv3, "k": 6144, "n": 8192}),
               dict(dbias=True, **{**dsv3, "n": 8192})):
        assert is_form(COOPERATIVE_DEEP_KNOBS, **kw), kw
    split, whole = 2, 1
    for kw, c_split in ((dict(dbias=False), split),  # qwen3
                        (dict(dbias=False, c=FP16, d=FP16), split),
                        (dict(dbias=True), split),
                        (dict(dbias=True, k=4088, n=1024), split),  # just below skew's K
                        (dict(dbias=True, k=4096, n=1280), split),  # past N 1024
                        (dict(dbias=True, k=4096, n=640), split),  # N % 256 != 0
                        (dict(dbias=True, k=4096, n=1024, m=4096), split),  # too few tiles
                        (dict(dbias=True, k=4096, n=1024, d=FP32), whole),
                        (dict(dbias=True, k=4096, n=2048, L=8), split),  # k4k
                        (dict(dbias=True, k=2048, n=1024), split),  # skewk2
                        (dict(dbias=True, **{**dsv3, "k": 5112}), split),  # just below
                        (dict(dbias=True, k=6144, n=16384, L=8), split),  # k6k
                        (dict(dbias=True, **{**dsv3, "n": 16384}), split),  # k7kn16
                        (dict(dbias=True, **{**dsv3, "n": 8448}), split),  # past N 8192
                        (dict(dbias=True, **{**dsv3, "n": 12288}), split),  # k7kn12
                        (dict(dbias=True, k=4096, n=14336, L=8), split),  # mixtral
                        (dict(dbias=False, k=4096, n=14336, L=8), split),
                        (dict(dbias=False, k=2056, **mixed), whole),
                        (dict(dbias=False, weight_mode="discrete"), split),
                        (dict(dbias=True, weight_mode="discrete", k=4088, n=1024), whole),
                        (dict(dbias=True, weight_mode="discrete", k=4096, n=1280), whole),
                        (dict(dbias=True, weight_mode="discrete", **{**dsv3, "k": 5112}),
                         whole),
                        (dict(dbias=True, weight_mode="discrete", **{**dsv3, "n": 16384}),
                         whole),
                        (dict(dbias=False, d=FP32), whole),
                        (dict(dbias=True, d=FP32, **dsv3), whole),
                        (dict(dbias=False, c=FP32), whole),
                        (dict(dbias=False, n=96, **mixed), whole),
                        (dict(dbias=False, n=640, **mixed), whole),
                        (dict(dbias=True, **{**dsv3, "n": 1920}), split),  # N % 256 != 0
                        # 64 wide tiles: too few for 132 SMs
                        (dict(dbias=False, m=4096, n=512, **mixed), whole),
                        (dict(dbias=True, **{**dsv3, "m": 4096, "n": 512}), split)):
        _, choice = best(**kw)
        assert not choice.cooperative, (kw, choice)
        assert (choice.tile_n, choice.cluster_m, choice.cluster_n) == (128, 2, 1)
        assert choice.c_split == c_split, (kw, choice)


# ---------------------------------------------------------------------- plans (no compile)
@needs_dsl
@pytest.mark.parametrize("dbias", [True, False])
def test_discrete_workspace_layout(dbias):
    """Discrete plans: L x 128-B descriptors first, then the dbias region (fp32 sums (L, 2N)
    and an int32 arrival counter per (expert, N-tile)), each region 128-B aligned; dense
    plans keep one scratch region of the dbias sums and counters. The dbias region is what
    a launch leaves zero (``zeroed_region``)."""
    from cudnn_ext.engines.sm90 import Sm90Plan
    from cudnn_ext.runtime.workspace import WorkspaceLayout

    for L in (1, 3, 64):
        p = _problem(weight_mode="discrete", L=L, dbias=dbias, n=96)
        plan = Sm90Plan(p, config_for(p, tile_n=128))
        reqs = plan.workspace_requests()
        assert [r.name for r in reqs] == (["b_descriptors", "dbias_partials"] if dbias
                                         else ["b_descriptors"])
        assert reqs[0].nbytes == 128 * L and reqs[0].align == 128
        lay = WorkspaceLayout.of(reqs)
        assert lay.region("b_descriptors").offset == 0
        if dbias:
            r = lay.region("dbias_partials")
            assert r.offset == 128 * L and r.offset % 128 == 0 and r.nbytes == 4 * L * (2 * 96 + 1)
            assert plan.zeroed_region == r.offset
            # the region alone: the layout pads past it, and launches never write the padding
            assert plan.zeroed_region_bytes == r.nbytes
            assert r.offset + r.nbytes <= lay.size
        else:
            assert plan.zeroed_region is None and plan.zeroed_region_bytes == 0
        assert plan.workspace_size == lay.size and lay.size % 128 == 0
    dense = _problem(L=3, dbias=dbias)
    plan = Sm90Plan(dense, config_for(dense, tile_n=128))
    assert plan.workspace_size == (4 * 3 * (2 * 96 + 1) if dbias else 0)
    assert plan.zeroed_region == (0 if dbias else None)
    assert plan.zeroed_region_bytes == plan.workspace_size
    assert [r.name for r in plan.workspace_requests()] == (["scratch"] if dbias else [])
    n300 = _problem(L=3, n=300)  # 3 N-tiles of 128: 3 counters per expert
    plan = Sm90Plan(n300, config_for(n300, tile_n=128))
    assert plan.workspace_size == plan.zeroed_region_bytes == 4 * 3 * (2 * 300 + 3)
    wide = config_for(n300, tile_n=256, cluster_m=2, cooperative=True)  # 2 N-tiles of 256
    assert Sm90Plan(n300, wide).zeroed_region_bytes == 4 * 3 * (2 * 300 + 2)


@needs_dsl
@pytest.mark.parametrize("dbias", [True, False])
def test_split_last_workspace(dbias):
    """The scratch region: the dbias sums and counters, the split's int32 flags (one per
    slot and CTA of the cluster; both kept zero by launches: ``zeroed_region_bytes``), then
    128-byte aligned one 128 x tile_n fp32 partial sum per slot and CTA."""
    from cudnn_ext.engines.sm90 import Sm90Plan

    p = _problem(n=512, k=1024, L=3, dbias=dbias)
    for cl in (1, 2):
        plan = Sm90Plan(p, config_for(p, tile_n=256, cluster_m=cl, cooperative=True,
                                      split_last=3))
        db = 3 * (2 * 512 + 2) if dbias else 0
        zero = db + SPLIT_SLOTS * cl
        assert plan.zeroed_region == 0 and plan.zeroed_region_bytes == 4 * zero
        assert plan.workspace_size == 4 * (-(-zero // 32) * 32 + SPLIT_SLOTS * cl * 128 * 256)
        plain = Sm90Plan(p, config_for(p, tile_n=256, cluster_m=cl, cooperative=True))
        assert plain.workspace_size == 4 * db
    disc = _problem(n=512, k=1024, L=3, dbias=dbias, weight_mode="discrete")
    plan = Sm90Plan(disc, config_for(disc, tile_n=256, cluster_m=2, cooperative=True,
                                     split_last=2))
    assert [r.name for r in plan.workspace_requests()] == ["b_descriptors", "split_partials"]
    assert plan.zeroed_region == 128 * 3 and plan.zeroed_region_bytes == 4 * (
        (3 * (2 * 512 + 2) if dbias else 0) + SPLIT_SLOTS * 2)


@needs_dsl
@pytest.mark.parametrize("dbias,coop,arrivals", [(True, False, 32), (False, False, 1),
                                                 (True, True, 1)])
def test_c_full_barrier_arrivals(dbias, coop, arrivals):
    """With the ping-pong dbias hand-off every lane of a C producer warp arrives on the C
    full barrier (lane 0 with the TMA bytes), each after its own reads of the dbias slice
    that the math warps write once the phase completes: compute-sanitizer racecheck reported
    4 write-after-read hazards with one elected arrival and 0 with 32 (H200). Elsewhere the
    slice does not exist: one arrival."""
    from cudnn_ext.kernels.sm90.build import make_kernel

    kernel = make_kernel(config_for(_problem(dbias=dbias), tile_n=256 if coop else 128,
                                    cluster_m=2, cooperative=coop))
    assert kernel.dbias_via_producer() == (dbias and not coop)
    assert kernel.c_full_arrivals() == arrivals


def test_build_compiles_unless_deferred(monkeypatch):
    """build() compiles the contract variant (class API/graph users expect build = compile);
    under defer_compile (the functional torch path) nothing compiles until an execute picks
    its variant."""
    from cudnn_ext.engines import sm90
    from cudnn_ext.engines.base import defer_compile

    compiled = []
    monkeypatch.setattr(sm90, "compile_cached", lambda cfg: compiled.append(cfg) or object())
    eng, p = Sm90DgluEngine(), _problem()
    knobs = config_for(p, tile_n=128)
    eng.build(p, knobs)
    assert compiled == [knobs]
    with defer_compile():
        plan = eng.build(p, knobs)
    assert len(compiled) == 1
    plan._fn(True)
    assert compiled[1] == dataclasses.replace(knobs, init_outputs=True)


def _cpu_pack(m, n, k, L, dbias=True):
    """A variant pack of zero CPU tensors (the launch tests only read their addresses)."""
    t = lambda *shape, dt=torch.float32: torch.zeros(*shape, dtype=dt)  # noqa: E731
    return {"a": t(m, k, dt=BF16), "b": t(n, k, L, dt=BF16),
            "c": t(m, 2 * n, dt=BF16), "d_row": t(m, 2 * n, dt=BF16),
            "padded_offsets": t(L, dt=torch.int32), "alpha": t(L), "beta": t(L), "prob": t(m),
            "dprob": t(m), "dbias": t(L, 2 * n, dt=BF16) if dbias else None}


def _recording_plan(monkeypatch, problem, knobs, with_cfg=False):
    """The engine's plan with a recording stand-in for every compiled function (no GPU, CPU
    tensors: device index -1); skipped without TVM-FFI (the launch packs DSL pointers)."""
    from cudnn_ext.engines import sm90

    calls = []
    monkeypatch.setattr(sm90, "compile_cached", lambda cfg: (
        lambda *args: calls.append((cfg, args) if with_cfg else args)))
    monkeypatch.setattr(sm90.Sm90Plan, "_resident_ctas", lambda self, idx: 132)
    plan = Sm90DgluEngine().build(problem, knobs)
    if not plan.tvm_ffi:
        pytest.skip("apache-tvm-ffi is not installed: the launch packs DSL pointer objects")
    return plan, calls


@pytest.mark.parametrize("fresh", [False, True])
def test_launch_passes_addresses_in_the_kernels_argument_order(monkeypatch, fresh):
    """The plan's launch: the 22 addresses in ``build._ptr_specs`` order, then M, L,
    resident CTAs, the activation constants and the stream handle; the fresh-outputs variant
    is a separate compiled function."""
    import types

    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, act="dgeglu"), device_type="cpu")
    p = dataclasses.replace(p, act=ActConfig(act_func="dgeglu", geglu_alpha=1.5, clamp_max=6.0,
                                             clamp_min=-5.0, linear_offset=0.25))
    plan, calls = _recording_plan(monkeypatch, p, config_for(p, tile_n=128), with_cfg=True)
    pack = _cpu_pack(m, n, k, L)
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8)
    (plan.execute_fresh if fresh else plan.execute)(pack, ws, types.SimpleNamespace(cuda_stream=77))
    (cfg, args), = calls[-1:]
    ptr = {name: v.data_ptr() for name, v in pack.items()}
    assert cfg.init_outputs is fresh
    # (then the fp8_blockwise recipe's scales and the deterministic form's dbias slab, A's
    # address here; the last four, quantized D's D_col, SFD_row, SFD_col and norm_const, D's)
    assert args[:22] == (ptr["a"], ptr["b"], ptr["c"], ptr["d_row"], ptr["padded_offsets"],
                         ptr["alpha"], ptr["beta"], ptr["prob"], ptr["dprob"], ws.data_ptr(),
                         ptr["a"], ptr["a"], ptr["dbias"], ptr["a"], ptr["a"], ptr["a"], ptr["a"],
                         ptr["a"], *[ptr["d_row"]] * 4)
    assert args[22:] == (m, L, 132, 1.5, 6.0, -5.0, 0.25, 77)


def test_activation_output_takes_its_address_slot(monkeypatch):
    """With the activation output the plan passes its address in the 14th slot, from
    ``execute`` and from the raw-address launcher alike; a call without one is refused
    before any launch (the slot would otherwise be A's address, which the kernel writes)."""
    import types

    from cudnn_ext.engines import sm90

    monkeypatch.setattr(sm90, "current_stream_handle", lambda idx: 77)
    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, act="dgeglu", activation=True,
                                     round_dgrad=True), device_type="cpu")
    cfg = config_for(p, tile_n=128)
    assert (cfg.generate_activation, cfg.round_dgrad) == (True, True)
    plan, calls = _recording_plan(monkeypatch, p, cfg)
    pack = _cpu_pack(m, n, k, L)
    pack["activation"] = torch.zeros(m, n, dtype=BF16)
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8)
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    assert calls[-1][13] == pack["activation"].data_ptr()
    addr = lambda name: pack[name].data_ptr()  # noqa: E731
    args = [addr(x) for x in ("a", "b", "c", "padded_offsets", "alpha", "beta", "prob", "d_row",
                              "dprob", "dbias")] + [ws.data_ptr(), m]
    plan.address_launcher(False, -1)(*args, activation=addr("activation"))
    assert calls[-1] == calls[-2]
    n_calls = len(calls)
    with pytest.raises(ValueError, match="reads or writes activation, got none"):
        plan.execute(dict(pack, activation=None), ws, types.SimpleNamespace(cuda_stream=77))
    with pytest.raises(ValueError, match="reads or writes activation, got none"):
        plan.address_launcher(False, -1)(*args)
    assert len(calls) == n_calls


@needs_dsl
def test_activation_stores_drop_their_predicate_only_where_every_block_is_inside_n():
    """The epilogue's activation stores go without a branch only where every tile's every
    32-column block lies inside N (N a multiple of tile_n, no phantom N-tile of an odd
    cluster_n pair); elsewhere each pair keeps its predicate (the ragged schedule's rows
    too: the epilogue checks ``ragged_m`` itself)."""
    from cudnn_ext.kernels.sm90.build import make_kernel

    def all_valid(n, tile_n, cm=1, cn=1, **kw):
        p = _problem(n=n, activation=True, **kw)
        return make_kernel(config_for(p, tile_n=tile_n, cluster_m=cm, cluster_n=cn))._blocks_all_valid()

    assert all_valid(1024, 128) and all_valid(512, 128, 2, 2) and all_valid(768, 64)
    assert not all_valid(96, 128)  # an N tail: block 3 of the last tile is outside N
    assert not all_valid(384, 128, 2, 2)  # 3 N-tiles: the pair's second tile is a phantom
    coop = _problem(n=1024, k=4096, m=32768, activation=True)
    assert make_kernel(config_for(coop, tile_n=256, cluster_m=2, cooperative=True))._blocks_all_valid()
    assert not make_kernel(config_for(_problem(n=1152, k=4096, m=32768, activation=True), tile_n=256,
                                      cluster_m=2, cooperative=True))._blocks_all_valid()


def test_staged_activation_refuses_a_misaligned_address(monkeypatch):
    """The staged form TMA-stores the activation output: its plan refuses an address that is
    not 16-byte aligned before any launch (the register form takes any bf16 pair address)."""
    import types

    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, act="dgeglu", activation=True),
                            device_type="cpu")
    pack = _cpu_pack(m, n, k, L)
    buf = torch.zeros(m * n + 8, dtype=BF16)
    pack["activation"] = buf[4:4 + m * n].view(m, n)  # 8 bytes past a 16-byte boundary
    assert pack["activation"].data_ptr() % 16 == 8
    for staged in (True, False):
        plan, calls = _recording_plan(monkeypatch, p, config_for(p, tile_n=128, act_staged=staged))
        ws = torch.empty(plan.workspace_size, dtype=torch.uint8)
        if staged:
            with pytest.raises(ValueError, match="activation: must be 16-byte aligned"):
                plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
            assert calls == []
        else:
            plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
            assert calls[-1][13] == pack["activation"].data_ptr()


def test_activation_forms_in_the_knob_space():
    """With the activation output every entry whose D leaves through shared memory comes in
    the staged form too (ranked just behind its register twin until measured faster), with
    C stages cut where the deep cooperative form's 3 A/B stages would not fit
    beside the staged blocks; none for dSiTU-GLU (spills), fp32 D (register D stores) or
    without the activation output; the ragged schedule keeps tile 64 in both forms."""
    eng = Sm90DgluEngine()

    def space(**kw):
        return eng.knob_space(_problem(activation=True, **kw))

    for kw in (dict(), dict(n=1024, k=4096, m=32768, act="dgeglu"),
               dict(n=2048, k=7168, m=32768), dict(m_aligned=8, act="dgeglu")):
        sp = space(**kw)
        staged = [kn for kn in sp if kn.act_staged]
        plain = [kn for kn in sp if not kn.act_staged]
        assert staged and len(staged) == len(plain)
        for kn in staged:
            kn.check()
            assert any(dataclasses.replace(q, act_staged=True, c_stages=kn.c_stages) == kn
                       for q in plain)
            if kn.cooperative and kn.ab_stages == 3:
                assert kn.c_stages == 3 and kn.stages_that_fit() >= 3
        p = _problem(activation=True, **kw)
        best = min(sp, key=lambda k: eng.cost(p, k))
        (twin,) = [kn for kn in staged if dataclasses.replace(best, act_staged=True, c_stages=kn.c_stages) == kn]
        assert not best.act_staged and 0 < eng.cost(p, twin) - eng.cost(p, best) < 1
    ragged = space(m_aligned=8)
    assert {kn.tile_n for kn in ragged} == {64}
    coop = space(n=1024, k=4096, m=32768, m_aligned=8)  # the cooperative form in both
    assert {kn.act_staged for kn in coop if kn.cooperative} == {True, False}
    assert not any(kn.act_staged for kn in space(act="dsituglu"))
    assert not any(kn.act_staged for kn in space(d=FP32))
    assert not any(kn.act_staged for kn in space(c=FP32, d=FP32))
    assert not any(kn.act_staged for kn in eng.knob_space(_problem()))
    with pytest.raises(ValueError, match="act_staged needs generate_activation"):
        config_for(_problem(), act_staged=True).check()
    with pytest.raises(ValueError, match="act_staged needs generate_activation and D of C's type"):
        config_for(_problem(activation=True, d=FP32), act_staged=True).check()


def test_discrete_launch_passes_the_table_and_workspace_regions(monkeypatch):
    """Discrete weights: B's slot holds A's address (never loaded), the pointer table and the
    descriptor region follow, the dbias sums sit after the descriptors."""
    import types

    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, weight_mode="discrete"), device_type="cpu")
    plan, calls = _recording_plan(monkeypatch, p, config_for(p, tile_n=128))
    pack = _cpu_pack(m, n, k, L)
    del pack["b"]
    pack["b_ptrs"] = torch.zeros(L, dtype=torch.int64)
    ws = torch.empty(plan.workspace_size + 128, dtype=torch.uint8)
    ws = ws[(-ws.data_ptr()) % 128:][:plan.workspace_size]  # 128-B aligned descriptors
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    (args,) = calls
    ptr = {name: v.data_ptr() for name, v in pack.items()}
    assert args[:15] == (ptr["a"], ptr["a"], ptr["c"], ptr["d_row"], ptr["padded_offsets"],
                         ptr["alpha"], ptr["beta"], ptr["prob"], ptr["dprob"],
                         ws.data_ptr() + 128 * L, ptr["b_ptrs"], ws.data_ptr(), ptr["dbias"],
                         ptr["a"], ptr["a"])
    with pytest.raises(ValueError, match="128-byte aligned"):
        plan.execute(pack, ws[4:], types.SimpleNamespace(cuda_stream=77))


@pytest.mark.parametrize("dbias", [True, False])
def test_address_launcher_passes_what_execute_passes(monkeypatch, dbias):
    """The replay's launch on raw addresses hands the compiled function exactly the
    arguments ``execute`` does; with ``zeroed_workspace`` it is the ws_zeroed variant (only
    when there is a dbias region to keep zero)."""
    import types

    from cudnn_ext.engines import sm90

    monkeypatch.setattr(sm90, "current_stream_handle", lambda idx: 77)
    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, dbias=dbias), device_type="cpu")
    plan, calls = _recording_plan(monkeypatch, p, config_for(p, tile_n=128), with_cfg=True)
    pack = _cpu_pack(m, n, k, L, dbias)
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8)
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    addr = lambda name: pack[name].data_ptr() if pack[name] is not None else 0  # noqa: E731
    args = (addr("a"), addr("b"), addr("c"), addr("padded_offsets"), addr("alpha"), addr("beta"),
            addr("prob"), addr("d_row"), addr("dprob"), addr("dbias"), ws.data_ptr() if dbias else 0, m)
    plan.address_launcher(False, -1)(*args)
    plan.address_launcher(False, -1, zeroed_workspace=True)(*args)
    (k0, a0), (k1, a1), (k2, a2) = calls[-3:]
    assert a1 == a0 and a2 == a0
    assert (k0.ws_zeroed, k1.ws_zeroed, k2.ws_zeroed) == (False, False, dbias)


# ---------------------------------------------------------------------- the debug trace build
@pytest.mark.parametrize("dbias", [True, False])
def test_trace_launch_passes_its_region_in_the_descriptor_slot(monkeypatch, dbias):
    """The trace build (dense weights): the workspace holds [trace][dbias sums], the kernel's
    descriptor slot gets the trace region, the dbias slot the sums after it, and the region
    launches keep zero (``zeroed_region``) starts after the trace."""
    import types

    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, dbias=dbias), device_type="cpu")
    plan, calls = _recording_plan(monkeypatch, p, config_for(p, tile_n=128, trace=8))
    trace_bytes = 8 * 4 * 9 * 2 * (TRACE_MAX_CTAS + 1)  # and the grid's header row
    assert [(r.name, r.offset, r.nbytes) for r in plan._layout.regions][0] == ("trace", 0, trace_bytes)
    dbias_off = -(-trace_bytes // 128) * 128  # the next region starts 128-B aligned
    assert plan.zeroed_region == (dbias_off if dbias else None)
    assert plan.zeroed_region_bytes == (4 * L * (2 * n + 1) if dbias else 0)
    pack = _cpu_pack(m, n, k, L, dbias=dbias)
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8)
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    (args,) = calls
    ptr = {name: v.data_ptr() for name, v in pack.items() if v is not None}
    assert args[9] == (ws.data_ptr() + dbias_off if dbias else ptr["dprob"])
    assert args[11] == ws.data_ptr()  # the descriptor slot: the trace region
    with pytest.raises(ValueError, match="needs .* bytes, got None"):
        plan.execute(pack, None, types.SimpleNamespace(cuda_stream=77))
    with pytest.raises(ValueError, match="16-byte aligned for the trace stamps"):
        plan.execute(pack, ws[8:], types.SimpleNamespace(cuda_stream=77))
    # the rows of the launch's grid, which the kernel's CTA 0 writes in the header slot
    region = ws[:trace_bytes].view(torch.int64).view(TRACE_MAX_CTAS + 1, 2, 9, 4)
    region.zero_()
    with pytest.raises(ValueError, match="holds no launch"):
        plan.read_trace(ws)
    region[TRACE_MAX_CTAS, 0, 0, 0] = 132
    region[131, 1, 2, 3] = 7
    stamps = plan.read_trace(ws)
    assert stamps.shape == (132, 2, 9, 4) and stamps.dtype == torch.int64
    assert stamps[131, 1, 2, 3] == 7


def test_trace_rules():
    """Dense weights only, a bounded tile count; refused before anything compiles. Plans of
    the production kernel have no trace to read."""
    eng = Sm90DgluEngine()
    with pytest.raises(ValueError, match="trace must be in .* with dense weights"):
        eng.build(_problem(weight_mode="discrete"), config_for(
            _problem(weight_mode="discrete"), tile_n=128, trace=4))
    with pytest.raises(ValueError, match=r"trace must be in \[1, 4096\].*got trace=-1"):
        eng.build(_problem(), config_for(_problem(), tile_n=128, trace=-1))
    assert not any(isinstance(k, Sm90TraceConfig) for k in eng.knob_space(_problem()))


def test_dsituglu_activation_output_takes_no_64_row_c_entries():
    """(4 B spilled there: test_sm90_blockscaled_engine's compile cases) dSiTU-GLU with the
    activation output gets no c_split 2 entry; without it, and for the other activations,
    the entry stays."""
    eng = Sm90DgluEngine()

    def splits(act, activation):
        p = dataclasses.replace(_problem(k=200, activation=activation), act=ActConfig(act))
        return {kn.c_split for kn in eng.knob_space(p)}

    assert splits("dsituglu", True) == {1}
    assert splits("dsituglu", False) == {1, 2}
    assert splits("dswiglu", True) == {1, 2} and splits("dgeglu", True) == {1, 2}


def test_blockwise_config_rules():
    """e4m3 operands: the cooperative schedule with tile_n <= 128, dense K-major B, K a
    multiple of 128, one part per tile; 128-K k-tiles, and the A/B stage of a 128 x 128 tile
    the same bytes as BF16's."""
    from cudnn_ext.kernels.sm90.config import Sm90Config

    base = dict(n=256, k=1024, ab_dtype="e4m3", c_dtype="bf16", d_dtype="bf16", act_func="dswiglu",
                generate_dbias=True, tile_n=128, c_stages=2, cluster_m=2, cooperative=True)
    ok = Sm90Config(**base)
    ok.check()
    assert ok.blockwise() and ok.tile_k() == 128
    assert ok.stages_that_fit() == dataclasses.replace(ok, ab_dtype="bf16").stages_that_fit()
    for bad, what in ((dict(cooperative=False, c_stages=0), "cooperative"), (dict(tile_n=256), "tile_n <= 128"),
                      (dict(b_major="n"), "K-major"), (dict(weight_mode="discrete", cluster_m=1), "dense"),
                      (dict(k=1000), "multiple of 128"), (dict(split_last=2), "split_last 1"),
                      (dict(round_dgrad=True), "round_dgrad")):
        with pytest.raises(ValueError, match=what):
            dataclasses.replace(ok, **bad).check()


def test_blockwise_launch_passes_the_scales_last(monkeypatch):
    """The fp8_blockwise plan passes sfa and sfb in the last two address slots; with an FP8 D
    the kernel writes an fp32 temporary, which the recipe's quantizer turns into the outputs."""
    import types

    from cudnn_ext.engines import sm90
    from cudnn_ext.engines.sm90_fp8_blockwise import Sm90Fp8BlockwiseEngine
    from cudnn_ext.problem import DgluProblem

    calls = []
    monkeypatch.setattr(sm90, "compile_cached", lambda cfg: (lambda *args: calls.append((cfg, args))))
    monkeypatch.setattr(sm90.Sm90Plan, "_resident_ctas", lambda self, idx: 132)
    L, n, k, m = 4, 256, 256, 1024
    p = DgluProblem(n=n, k=k, num_experts=L, m=m, weight_mode="dense", b_major="k", ab_dtype=torch.float8_e4m3fn,
                    c_dtype=BF16, d_dtype=BF16, generate_dbias=True, recipe="fp8_blockwise", device_type="cpu")
    eng = Sm90Fp8BlockwiseEngine()
    (knobs,) = eng.knob_space(p)
    plan = eng.build(p, knobs)
    if not plan.tvm_ffi:
        pytest.skip("apache-tvm-ffi is not installed: the launch packs DSL pointer objects")
    pack = _cpu_pack(m, n, k, L)
    pack.update(sfa=torch.ones(m, k // 128).t().contiguous().t(), sfb=torch.ones(2, 2, L))
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8)
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    cfg, args = calls[-1]
    assert cfg.blockwise() and plan.engine_name == "sm90_fp8_blockwise"
    assert args[15:17] == (pack["sfa"].data_ptr(), pack["sfb"].data_ptr())
    assert args[3] == pack["d_row"].data_ptr()
    # an FP8 D: the kernel's D slot is an fp32 temporary, quantized into D_row/D_col after it
    p8 = dataclasses.replace(p, d_dtype=torch.float8_e4m3fn, m_aligned=128)
    (knobs8,) = eng.knob_space(p8)
    assert knobs8.d_dtype == "fp32"
    plan8 = eng.build(p8, knobs8)
    e4m3 = torch.float8_e4m3fn
    pack8 = dict(pack, d_row=torch.zeros(m, 2 * n, dtype=e4m3), d_col=torch.zeros(m, 2 * n, dtype=e4m3),
                 sfd_row=torch.zeros(m, 2 * n // 128).t().contiguous().t(),
                 sfd_col=torch.zeros(m // 128, 2 * n).t().contiguous().t(),
                 padded_offsets=torch.tensor([256, 512, 768, 1024], dtype=torch.int32))
    seen, quantized = {}, []
    monkeypatch.setattr("cudnn_ext.engines.sm90_fp8_blockwise.quantize_d",
                        lambda d32, pk: seen.update(dtype=d32.dtype, ptr=d32.data_ptr(), pack=pk))
    monkeypatch.setattr("cudnn_ext.engines.sm90_fp8_blockwise.launch_quantize",
                        lambda *a, **kw: quantized.append((a, kw)))
    ws8 = torch.empty(plan8.workspace_size, dtype=torch.uint8)
    plan8.execute(pack8, ws8, types.SimpleNamespace(cuda_stream=77))
    _, args8 = calls[-1]
    # dense D_row/D_col: the device quantizer, one pass, both block shapes, masked by the offsets
    (qa, qkw), = quantized
    qcfg, x, q_row, s_row, rows, k, ld, gstride, groups, handle = qa
    assert qcfg.src == "fp32" and qcfg.blocks == ((1, 128), (128, 1)) and qcfg.masked and not qcfg.pow2_scales
    assert x == args8[3] != pack8["d_row"].data_ptr() and (q_row, s_row) == (pack8["d_row"].data_ptr(),
                                                                           pack8["sfd_row"].data_ptr())
    assert (rows, k, ld, gstride, groups, handle) == (m, 2 * n, 2 * n, 0, 1, 77)
    assert qkw == dict(q_b=pack8["d_col"].data_ptr(), s_b=pack8["sfd_col"].data_ptr(),
                       offsets=pack8["padded_offsets"].data_ptr(), n_offsets=L)
    assert not seen
    # D_row with padded rows (the contract admits them): the reference's quantize_d
    padded = torch.zeros(m, 2 * n + 16, dtype=e4m3)[:, :2 * n]
    plan8.execute(dict(pack8, d_row=padded), ws8, types.SimpleNamespace(cuda_stream=77))
    _, args8 = calls[-1]
    assert len(quantized) == 1 and seen["dtype"] == torch.float32 and args8[3] == seen["ptr"]
    assert seen["pack"]["d_row"] is padded


def test_deterministic_config_rules_and_launch(monkeypatch):
    """The deterministic form: split_last 1 (the cooperative deep form drops its split), no
    fresh-outputs variant, no in-kernel dbias fold and no workspace of its own for dbias; the
    launch passes an (N-tiles, M) slab at dprob's address and a (partial_tiles, 2N) slab last,
    then one launch of the fold (``kernels.partials``) on the kernel's stream adds the N-tile
    partials to dprob and each expert's M-tile sums to dbias (tile bounds from the offsets
    over 128 rows; ragged: from the schedule's table in the workspace, times cluster_m); it
    has no address launcher (execute allocates the slabs)."""
    import types

    from cudnn_ext.engines.sm90 import cooperative_config

    deep = cooperative_config(dataclasses.replace(_problem(n=512, k=7168, m=32768), deterministic=True))
    assert deep.deterministic and deep.split_last == 1
    assert not deep.fold_dbias and deep.dbias_ws_elems(8) == 0
    for bad in (dict(split_last=2), dict(init_outputs=True), dict(fold_dbias=True)):
        with pytest.raises(ValueError, match="deterministic needs"):
            dataclasses.replace(deep, **bad).check()
    assert not config_for(_problem()).deterministic  # the default form
    assert deep.partial_tiles(32768, 8) == 256 and dataclasses.replace(deep, ragged_m=True).partial_tiles(
        32768, 8) == 2 * (32768 // 256 + 8)

    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L), device_type="cpu", deterministic=True)
    cfg = config_for(p, tile_n=128)
    assert cfg.deterministic
    plan, calls = _recording_plan(monkeypatch, p, cfg)
    assert plan.workspace_size == 0  # (dense, unsplit, aligned: no scratch at all)
    pack = _cpu_pack(m, n, k, L)
    pack["padded_offsets"] = torch.tensor([256, 512, 512, 768], dtype=torch.int32)
    pack["dprob"] = torch.full((m,), 0.5)
    slab_p = torch.arange(cfg.num_n_tiles() * m, dtype=torch.float32).view(cfg.num_n_tiles(), m)
    slab_b = torch.zeros(cfg.partial_tiles(m, L), 2 * n)
    monkeypatch.setattr(type(plan), "_partial_slabs", lambda self, c, m_, l_, s: (slab_p, slab_b))
    monkeypatch.setattr("cudnn_ext.kernels.partials.launch.launch_fold", lambda *a: calls.append(("fold", a)))
    plan.execute(pack, None, types.SimpleNamespace(cuda_stream=77))
    args, fold = calls[-2], calls[-1]  # the kernel, then the fold of its partials
    assert args[8] == slab_p.data_ptr() and args[17] == slab_b.data_ptr()
    from cudnn_ext.kernels.partials.launch import ColumnFold

    offs = pack["padded_offsets"].data_ptr()
    cols = ColumnFold(slab_b.data_ptr(), pack["dbias"].data_ptr(), offs, 2 * n, cfg.partial_tiles(m, L), 1, 128, 1)
    assert fold == ("fold", (slab_p.data_ptr(), pack["dprob"].data_ptr(), offs, m, cfg.num_n_tiles(), L, 77,
                             cols))
    with pytest.raises(NotImplementedError, match="deterministic"):
        plan.execute_fresh(pack, None, types.SimpleNamespace(cuda_stream=77))
    assert plan.address_launcher(False, -1) is None

    # ragged (cluster_m 2): the tile bounds are the schedule's table, in the workspace
    pr = dataclasses.replace(p, m_aligned=8)
    cfg = config_for(pr, tile_n=128, cluster_m=2)
    plan, calls = _recording_plan(monkeypatch, pr, cfg)
    monkeypatch.setattr(type(plan), "_partial_slabs", lambda self, c, m_, l_, s: (None, slab_b))
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8)
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    fold = calls[-1]
    table = ws.data_ptr() + plan._dbias_off + 4 * cfg.ragged_table_offset(L)
    cols = ColumnFold(slab_b.data_ptr(), pack["dbias"].data_ptr(), table, 2 * n, cfg.partial_tiles(m, L), 2, 1, 2)
    assert fold == ("fold", (0, 0, offs, m, 0, L, 77, cols))


@needs_dsl
def test_fp8_d_plan_names_the_quantizer_it_compiled(tmp_path, monkeypatch):
    """An fp8_blockwise plan with an FP8 D warms up and names (``kernel_digests``, what
    ``serialize(include_kernels=True)`` carries) both its kernels: the e4m3 GEMM and the
    blockwise D quantizer, each an entry this process can hand on."""
    from cudnn_ext.engines.sm90_fp8_blockwise import Sm90Fp8BlockwiseEngine
    from cudnn_ext.problem import DgluProblem
    from cudnn_ext.runtime import compile_cache

    monkeypatch.setenv("CUDNN_EXT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDNN_EXT_CACHE_DISABLE", raising=False)
    p = DgluProblem(n=256, k=256, num_experts=4, m=1024, weight_mode="dense", b_major="k",
                    ab_dtype=torch.float8_e4m3fn, c_dtype=BF16, d_dtype=torch.float8_e4m3fn, m_aligned=128,
                    recipe="fp8_blockwise", device_type="cpu")
    eng = Sm90Fp8BlockwiseEngine()
    (knobs,) = eng.knob_space(p)
    plan = eng.build(p, knobs)
    plan.warmup()
    digests = plan.kernel_digests()
    assert len(digests) == 2, digests
    for d in digests:
        assert compile_cache.entry_of(d) is not None, d
