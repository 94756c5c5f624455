"""The block-scaled Hopper engine's host side, without a GPU: what it declines (with reasons),
its configurations (the sm90 kernel's for the dequantized problem, with the block-scaled
epilogue's fields; bf16 C where the call's is FP8, FP8 D quantized by the kernel with the
problem's scale outputs), its workspace layout, and that every kernel it can select compiles
for sm_90a."""
import dataclasses
import re
import types
import importlib.util

import pytest
import torch

from cudnn_ext.engines.sm90 import config_for
from cudnn_ext.engines.sm90_blockscaled import (Sm90BlockScaledEngine, Sm90BlockScaledPlan, dense_problem,
                                                kernel_scalars)
from cudnn_ext.problem import ActConfig, BlockScaleConfig, DgluProblem

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")
FP4, E4M3, E5M2, E8M0 = torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu


def _problem(ab=FP4, sf=E4M3, vec=16, act="dgeglu", d=torch.bfloat16, c=torch.bfloat16, prob=True,
             amax=True, dbias=False, mode="dense", k=256, n=96, m=2048, experts=4, beta1=4.0,
             beta2=25.0, b_major="k", deterministic=False, activation=False, **bs):
    return DgluProblem(deterministic=deterministic, generate_activation=activation, n=n, k=k, num_experts=experts, m=m, weight_mode=mode, b_major=b_major, ab_dtype=ab,
                       c_dtype=c, d_dtype=d, act=ActConfig(act_func=act, dgeglu_applies_beta=False,
                                                           situ_beta1=beta1, situ_beta2=beta2),
                       generate_dbias=dbias, has_prob=prob, has_dprob=prob, device_type="cuda",
                       block_scale=BlockScaleConfig(sf_dtype=sf, sf_vec_size=vec, generate_amax=amax, **bs))


def _mxfp8(ab=E4M3, d=E4M3, sfd=True, **kw):
    """An MXFP8 problem: FP8 operands with e8m0 scales over 32 elements, FP8 D (with SFD)."""
    return _problem(ab=ab, sf=E8M0, vec=32, d=d, generate_sfd=sfd, **kw)


def test_declines_with_reasons():
    eng = Sm90BlockScaledEngine()
    assert eng.check_support(_problem()) == []
    assert eng.check_support(_problem(mode="discrete", sf=E8M0, vec=32, act="dswiglu")) == []
    supported = [_mxfp8(), _mxfp8(ab=E5M2, mode="discrete", discrete_col_sfd=True),
                 _mxfp8(d=E5M2, sfd=False, c=E5M2), _mxfp8(c=E4M3, act="dswiglu", dbias=True),
                 _mxfp8(experts=1, single_group_runtime_offsets=True), _problem(c=E5M2),
                 _problem(experts=1, single_group_runtime_offsets=True),
                 _problem(deterministic=True), _mxfp8(deterministic=True)]  # (the kernel's fixed-order form)
    for p in supported:
        assert eng.check_support(p) == [], p
    bf16 = dataclasses.replace(_problem(), block_scale=None, ab_dtype=torch.bfloat16)
    assert "not block-scaled" in eng.check_support(bf16)[0]
    assert eng.check_support(_problem(act="dsituglu", beta1=3.0, dbias=True, d=torch.float32)) == []
    cases = [(_problem(c=torch.float64), "C dtype"),
             (_mxfp8(d=torch.bfloat16, sfd=False), "with FP8 operands: the kernel writes FP8 D"),
             (_problem(d=E4M3), "with FP4 operands"),
             (_mxfp8(d=E5M2), "the kernel writes e4m3 only"),
             (_problem(ab=torch.float16), "not block-scaled FP8 or FP4"),
             (_problem(single_group_runtime_offsets=True), "needs one expert, got L=4"),
             (_problem(k=80), "K % 32 == 0"),
             (_mxfp8(n=80), "N % 32 == 0")]
    for p, needle in cases:
        why = eng.check_support(p)
        assert any(needle in w for w in why), (p, why)
    cpu = dataclasses.replace(_problem(), device_type="cpu")
    assert any("not cuda" in w for w in eng.check_support(cpu))


def test_quantized_d_follows_the_problem():
    """FP8 D: the kernel writes it, with D_col and both scale outputs where the problem
    generates SFD (a single group's per-expert SFD_col layout is the global one); FP4
    operands: D of its 16/32-bit type, no scales."""
    eng = Sm90BlockScaledEngine()
    want = [(_problem(), ("bf16", False, False)),
            (_problem(d=torch.float32), ("fp32", False, False)),
            (_mxfp8(), ("e4m3", True, False)),
            (_mxfp8(discrete_col_sfd=True), ("e4m3", True, True)),
            (_mxfp8(experts=1, single_group_runtime_offsets=True, discrete_col_sfd=True),
             ("e4m3", True, False)),
            (_mxfp8(d=E5M2, sfd=False), ("e5m2", False, False)),
            (_mxfp8(ab=E5M2, d=E4M3, sfd=False, experts=1, single_group_runtime_offsets=True),
             ("e4m3", False, False))]
    for p, fields in want:
        space = eng.knob_space(p)
        assert space and {(c.d_dtype, c.d_scales, c.discrete_col_sfd) for c in space} == {fields}, p
        assert config_for(p).d_dtype == fields[0]


def test_fp8_problems_run_the_kernel_on_bf16_c_and_their_own_d():
    eng = Sm90BlockScaledEngine()
    for p in (_mxfp8(c=E4M3), _mxfp8(c=E5M2, d=E5M2, sfd=False, prob=False, dbias=True),
              _problem(c=E4M3, d=torch.float16)):
        dense = dense_problem(p)
        assert dense.c_dtype == torch.bfloat16 and dense.block_scale is None
        assert dense.d_dtype == p.d_dtype
        space = eng.knob_space(p)
        assert space and all(cfg.c_dtype == "bf16" and cfg.ab_dtype == "bf16" for cfg in space)
        assert all(cfg.d_dtype == {E4M3: "e4m3", E5M2: "e5m2"}.get(p.d_dtype, "fp16") for cfg in space)
        # config_for names the same family, so check_family (build) accepts the knobs
        assert all(cfg == dataclasses.replace(config_for(p, **{f: getattr(cfg, f) for f in (
            "tile_n", "cluster_m", "cluster_n", "c_split", "cooperative", "c_stages", "ab_stages",
            "raster_group_m", "split_last")})) for cfg in space)
    # the passes around the kernel cost: FP8 C's conversion, quantized D's second matrix
    base = _mxfp8()
    cfg = eng.knob_space(base)[0]
    assert eng.cost(dataclasses.replace(base, c_dtype=E4M3), cfg) > eng.cost(base, cfg)
    plain = _mxfp8(sfd=False)
    assert eng.cost(base, cfg) > eng.cost(plain, eng.knob_space(plain)[0]) > 0


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
    assert regions["a_bf16"].nbytes == 2 * p.m * p.k
    # MXFP8: A's copy for the built M too (no fp32 D: the kernel quantizes D), the inner plan
    # on bf16 C and FP8 D with the per-expert SFD_col layout
    q = _mxfp8(c=E5M2, mode="discrete", discrete_col_sfd=True)
    with defer_compile():
        plan8 = Sm90BlockScaledEngine().build(q, Sm90BlockScaledEngine().knob_space(q)[0])
    assert {r.name for r in plan8._layout.regions} - {"kernel_scratch"} == {"b_bf16", "a_bf16"}
    assert plan8._layout.region("b_bf16").nbytes == 2 * q.num_experts * q.n * q.k
    assert all(r.offset % 128 == 0 for r in plan8._layout.regions)
    assert plan8._inner.problem.d_dtype == E4M3 and plan8._inner.problem.c_dtype == torch.bfloat16
    assert plan8.config.d_scales and plan8.config.discrete_col_sfd and plan8._fp8_c


@needs_dsl
@pytest.mark.parametrize("mode", ["dense", "discrete"])
def test_n_major_fp8_weights_stay_n_major(mode):
    """N-major FP8 weights: the dequantizer keeps their element order (``n_major``) and the
    kernel reads its BF16 copy N-major; A's dequantizer and K-major weights are unchanged."""
    from cudnn_ext.engines.base import defer_compile

    eng = Sm90BlockScaledEngine()
    for b_major in ("k", "n"):
        p = _mxfp8(mode=mode, b_major=b_major, act="dswiglu")
        assert dense_problem(p).b_major == b_major and dense_problem(p).weight_mode == "dense"
        space = eng.knob_space(p)
        assert space and all(cfg.b_major == b_major for cfg in space)
        with defer_compile():
            plan = eng.build(p, space[0])
        assert plan._deq.b.n_major == (b_major == "n") and not plan._deq.a.n_major
        assert plan._deq.b.tables == (mode == "discrete")
        assert plan._inner.problem.b_major == b_major


@needs_dsl
@pytest.mark.parametrize("kw", [dict(), dict(act="dswiglu", prob=False, d=torch.float32, dbias=True),
                                dict(mode="discrete", sf=E8M0, vec=32, c=torch.float32, amax=False),
                                dict(ab=E4M3, sf=E8M0, vec=32, d=E4M3, c=E4M3, amax=False,
                                     generate_sfd=True),
                                dict(act="dswiglu", alpha_dtype=torch.bfloat16,
                                     beta_dtype=torch.float16),
                                dict(ab=E4M3, sf=E8M0, vec=32, d=E4M3, act="dswiglu", amax=False,
                                     generate_sfd=True, b_major="n"),
                                dict(act="dswiglu", dbias=True, deterministic=True),
                                dict(ab=E4M3, sf=E8M0, vec=32, d=E4M3, dbias=True, amax=False,
                                     deterministic=True)],
                         ids=["geglu-amax", "swiglu-noprob-fp32-dbias", "discrete-Cfp32",
                              "mxfp8-Cfp8", "swiglu-fp16-beta-Cbf16", "mxfp8-n-major",
                              "det-amax-dbias", "mxfp8-det-dbias"])
def test_selectable_kernels_compile_for_sm90a(kw):
    """The first-ranked configuration of each family compiles (the kernel's own compile tier
    covers the knob space; these add the block-scaled epilogue's fields)."""
    from cudnn_ext.engines.heuristics import ranked_knobs
    from cudnn_ext.kernels.sm90.build import compile_kernel

    p = _problem(**kw)
    cfg, _ = ranked_knobs(Sm90BlockScaledEngine(), p)[0]
    compile_kernel(cfg)


#: dSiTU-GLU kernels the engine can select: a small problem's knob space, one entry per
#: epilogue form (ping-pong tiles 64 and 128, 64-row C entries, the 2x2 clusters' phantom
#: N-tile), the cooperative forms (shallow K without dbias, deep K with the split last round),
#: C/D types, dbias, no prob, beta1 4 (the shared exponential) and not 4.
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
    # the activation output: every entry (no 64-row C entries: 4 B spilled there)
    ("space-act", _problem(activation=True, **_SITU), "all"),
    ("coop-deep-dbias-act", _problem(k=7168, dbias=True, activation=True, **_SITU_COOP), "coop"),
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
    # "all": one configuration per epilogue form (tile, C entry rows, cluster_n: a phantom
    # N-tile takes the branchy stores); cluster_m changes the mainloop only
    forms = list({(c.tile_n, c.c_split, c.cluster_n, c.cooperative): c for c in reversed(space)}.values())
    cfgs = {"all": forms, "first": space[:1], "coop": [c for c in space if c.cooperative]}[which]
    assert cfgs, which
    for cfg in cfgs:
        assert cfg.act_func == "dsituglu"
        _check_report(cfg, 0 if cfg.cooperative else _max_spill(problem))


#: The quantizing epilogue's kernels (FP8 D): the engine offers ping-pong tiles 64 and 128 for
#: MXFP8; with scales (global and per-expert SFD_col, N 96: a block past 2N in the last column
#: atom) and the plain conversion.
_MX_CASES = [
    ("scales-t128-swiglu-dbias", _mxfp8(act="dswiglu", dbias=True), 128),
    ("scales-t64-geglu-discrete-sfd", _mxfp8(mode="discrete", discrete_col_sfd=True), 64),
    ("plain-e5m2-t128", _mxfp8(d=E5M2, sfd=False, act="dswiglu"), 128),
]


@needs_dsl
@pytest.mark.parametrize("problem,tile_n", [c[1:] for c in _MX_CASES], ids=[c[0] for c in _MX_CASES])
def test_quantizing_epilogue_compiles_for_sm90a(problem, tile_n):
    """FP8 D from the epilogue compiles in the configurations the engine selects, without
    register spills; with scales the D_col amax
    exchange's pair barriers (64 threads) are in the PTX, without them none, and the FP8
    conversion is the hardware's paired one."""
    from test_sm90_compile import _check_report, _compiled

    cfg = next(c for c in Sm90BlockScaledEngine().knob_space(problem) if c.tile_n == tile_n)
    assert cfg.fp8_d() and not cfg.cooperative
    _check_report(cfg, 0)
    ptx = _compiled(cfg)[1]
    pair_barriers = re.findall(r"bar(?:rier)?\.sync(?:\.aligned)?\s+%r\d+,\s*64;", ptx)
    assert bool(pair_barriers) == cfg.d_scales, len(pair_barriers)
    cvt = "e4m3x2" if cfg.d_dtype == "e4m3" else "e5m2x2"
    assert re.search(rf"cvt\.rn\.satfinite\.{cvt}\.f32", ptx)


@needs_dsl
@pytest.mark.parametrize("n", [32, 64, 96, 160, 256])
def test_quantizing_epilogue_scale_offsets_follow_the_layout(n):
    """The kernel's SFD byte offsets (``quant_d.sfd_row_offset`` / ``sfd_col_offset``, traced
    by the kernel) are ``quant.sf_layout.sf_offset``'s for every row and 32-column block of
    SFD_row (the last column atom's padding blocks included), every column and 32-row block
    of the global SFD_col, and each expert's region of the per-expert one (an expert without
    rows among them), as the reference's ``quantize_d_col`` lays it out."""
    from cudnn_ext.kernels.sm90.quant_d import sfd_col_offset, sfd_row_offset
    from cudnn_ext.quant.sf_layout import ATOM_ELEMS, sf_offset, sf_shape

    m, two_n = 1024, 2 * n
    stripes = -(-two_n // 128)
    for row in range(m):
        for kb in range(4 * stripes):
            assert sfd_row_offset(row, kb, stripes) == sf_offset(row, kb, mn=m, k_blocks=two_n // 32)
    for col in range(128 * stripes):
        for rb in range(m // 32):
            assert sfd_col_offset(col, rb, stripes, m // 128) == sf_offset(col, rb, mn=two_n, k_blocks=m // 32)
    start = 0
    for end in (256, 256, 768, 1024):
        for col in range(128 * stripes):
            for rb in range(start // 32, end // 32):
                base = (start // 128) * sf_shape(two_n, 1)[2] * ATOM_ELEMS
                want = base + sf_offset(col, rb - start // 32, mn=two_n, k_blocks=(end - start) // 32)
                assert sfd_col_offset(col, rb, stripes, m // 128, start, (end - start) // 128) == want
        start = end


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


@needs_dsl
def test_plan_names_every_kernel_it_compiled(tmp_path, monkeypatch):
    """An MXFP8 plan's ``kernel_digests`` (what ``serialize(include_kernels=True)`` carries)
    names the disk-cache entries of all its kernels: the SM90 GEMM (which quantizes D) and
    the dequantizers (A's and B's, one kernel), each one an entry this process can hand on."""
    from cudnn_ext.engines.heuristics import ranked_knobs
    from cudnn_ext.runtime import compile_cache

    monkeypatch.setenv("CUDNN_EXT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDNN_EXT_CACHE_DISABLE", raising=False)
    p = _mxfp8()
    cfg, _ = ranked_knobs(Sm90BlockScaledEngine(), p)[0]
    plan = Sm90BlockScaledPlan(p, cfg)
    plan.warmup()
    digests = plan.kernel_digests()
    assert len(digests) == 2, digests
    for d in digests:
        assert compile_cache.entry_of(d) is not None, d


# ------------------------------------------------------------------ 16-bit alpha and beta
# docs/vendor_contract.md §3.5: the vendor's kernel squares a 16-bit alpha in its dtype and
# forms dSwiGLU's beta * C in the promoted 16-bit type; the sm90 kernel reads fp32 alpha and
# beta, so the plan hands it fp32 values and (dSwiGLU) the rounded product as C.

_HALF = (torch.bfloat16, torch.float16)


def _every_value(dtype):
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)


@pytest.mark.parametrize("dtype", _HALF, ids=str)
def test_kernel_alpha_squares_to_the_16_bit_square(dtype):
    """For every bfloat16 and float16 alpha, the fp32 alpha the plan hands the kernel squares
    (in fp32, as the kernel does) to alpha**2 rounded to alpha's dtype, exactly or one fp32 ulp
    from it (the square root of such a square is rarely an fp32 value); infinities and NaN
    carry over. float32 alpha is the caller's tensor, untouched."""
    alpha = _every_value(dtype)
    p = _problem(act="dgeglu", experts=alpha.numel(), alpha_dtype=dtype)
    c = torch.zeros(256, 2 * p.n, dtype=torch.bfloat16)
    beta = torch.ones(alpha.numel())
    # on the calling thread: the squares of the smallest alphas are subnormal, and torch's
    # worker threads may run in flush-to-zero mode (set by whatever started them; seen once in
    # a CI process), which flushes them on the CPU whatever the kernel does
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, k_alpha, k_beta = kernel_scalars(p, c, alpha, beta, torch.tensor([256], dtype=torch.int32))
        sq = k_alpha * k_alpha
        want = (alpha.double() ** 2).to(dtype).float()  # the exact square, rounded once
    finally:
        torch.set_num_threads(threads)
    assert k_alpha.dtype == torch.float32 and k_beta is beta
    fin = torch.isfinite(want)
    inf = torch.tensor(float("inf"))
    near = (sq == want) | (sq == torch.nextafter(want, inf)) | (sq == torch.nextafter(want, -inf))
    assert near[fin].all(), alpha[fin & ~near][:8]
    assert (sq == want)[fin].float().mean() > 0.5
    assert torch.equal(sq[torch.isinf(want)], want[torch.isinf(want)])
    assert torch.isnan(sq[torch.isnan(want)]).all() and torch.isnan(want[torch.isnan(alpha)]).all()
    f32 = alpha.float()
    _, same, _ = kernel_scalars(_problem(act="dgeglu", experts=alpha.numel()), c, f32, beta,
                                torch.tensor([256], dtype=torch.int32))
    assert same is f32


def _c_beta_case(c_dtype, beta_dtype, act="dswiglu", m=1024):
    g = torch.Generator().manual_seed(3)
    p = _problem(act=act, c=c_dtype, m=m, experts=3, beta_dtype=beta_dtype)
    c = (torch.randn(m, 2 * p.n, generator=g) * 3).to(c_dtype)
    beta = (torch.rand(3, generator=g) + 0.5).to(beta_dtype)
    alpha = torch.ones(3)
    offsets = torch.tensor([256, 256, 768], dtype=torch.int32)  # an empty expert, rows past the last
    return p, c, alpha, beta, offsets


@pytest.mark.parametrize("c_dtype,beta_dtype,want", [
    (torch.bfloat16, torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float16, torch.float16),
    (torch.float16, torch.bfloat16, torch.float16), (E4M3, torch.bfloat16, torch.bfloat16),
    (E5M2, torch.float16, torch.float16)], ids=str)
def test_kernel_c_is_the_16_bit_beta_scaled_c(c_dtype, beta_dtype, want):
    """dSwiGLU with a 16-bit beta and C: the plan hands the kernel beta * C formed in the
    promoted 16-bit type with each row's expert's beta (one rounding of the exact product of
    the values cast to it), and beta 1; the caller's C and beta keep their values."""
    p, c, alpha, beta, offsets = _c_beta_case(c_dtype, beta_dtype)
    assert p.c_beta_dtype == want and dense_problem(p).c_dtype == want
    before = (c.clone(), beta.clone())
    k_c, k_alpha, k_beta = kernel_scalars(p, c, alpha, beta, offsets)
    assert k_c.dtype == want and k_c.shape == c.shape
    assert k_beta.dtype == torch.float32 and torch.equal(k_beta, torch.ones(3)) and k_alpha is alpha
    for e, (r0, r1) in ((0, (0, 256)), (2, (256, 768))):
        b = float(beta[e].to(want))
        exact = (c[r0:r1].to(want).double() * b).to(want)
        assert torch.equal(k_c[r0:r1].view(torch.int16), exact.view(torch.int16)), e
    assert torch.equal(c.view(torch.uint8), before[0].view(torch.uint8)) and torch.equal(beta, before[1])


@pytest.mark.parametrize("act", ["dgeglu", "dsituglu"])
@pytest.mark.parametrize("c_dtype", [torch.bfloat16, E4M3, torch.float32], ids=str)
def test_kernel_c_without_16_bit_product(act, c_dtype):
    """dGeGLU (no beta) and dSiTU-GLU (beta and C converted to fp32 first), and fp32 C for any
    activation: C as before (FP8 C converted to bf16, exactly; other C the caller's tensor)
    and beta converted to fp32, exactly."""
    for a in (act, "dswiglu") if c_dtype == torch.float32 else (act,):
        p, c, alpha, beta, offsets = _c_beta_case(c_dtype, torch.bfloat16, act=a)
        assert p.c_beta_dtype is None
        k_c, _, k_beta = kernel_scalars(p, c, alpha, beta, offsets)
        if c_dtype == E4M3:
            assert k_c.dtype == torch.bfloat16 and torch.equal(k_c.float(), c.float())
        else:
            assert k_c is c
        assert k_beta.dtype == torch.float32 and torch.equal(k_beta, beta.float())
        assert dense_problem(p).c_dtype == (torch.bfloat16 if c_dtype == E4M3 else c_dtype)


def test_kernel_scalars_read_no_device_value_on_the_host():
    """On meta tensors (no data: a host read of a value raises), so on CUDA tensors it
    neither syncs nor breaks a capture: the expert of each row block is found on the device."""
    p, c, alpha, beta, offsets = _c_beta_case(torch.bfloat16, torch.bfloat16)
    p = dataclasses.replace(p, block_scale=dataclasses.replace(p.block_scale, alpha_dtype=torch.bfloat16))
    k_c, k_alpha, k_beta = kernel_scalars(p, c.to("meta"), alpha.bfloat16().to("meta"), beta.to("meta"),
                                          offsets.to("meta"))
    assert k_c.device.type == k_alpha.device.type == k_beta.device.type == "meta"
    assert k_c.dtype == torch.bfloat16 and k_alpha.dtype == k_beta.dtype == torch.float32


def test_16_bit_beta_runs_the_kernel_on_the_product():
    """The configurations of a dSwiGLU problem with a 16-bit beta are the kernel's for C in the
    product's dtype (float16 for bfloat16 C with a float16 beta), which build accepts; the
    product's pass over C costs like FP8 C's conversion."""
    eng = Sm90BlockScaledEngine()
    base = _problem(act="dswiglu")
    fp16_beta = _problem(act="dswiglu", beta_dtype=torch.float16, alpha_dtype=torch.bfloat16)
    assert eng.check_support(fp16_beta) == []
    space = eng.knob_space(fp16_beta)
    assert space and all(cfg.c_dtype == "fp16" for cfg in space)
    assert all(cfg.c_dtype == "bf16" for cfg in eng.knob_space(base))
    assert all(cfg.c_dtype == "bf16" for cfg in eng.knob_space(_problem(act="dswiglu", beta_dtype=torch.bfloat16)))
    cfg = space[0]
    assert eng.cost(fp16_beta, cfg) > eng.cost(base, eng.knob_space(base)[0])
    with pytest.raises(ValueError, match="another problem: c_dtype='bf16'"):
        eng.build(fp16_beta, eng.knob_space(base)[0])
    # alpha alone changes no configuration: the kernel squares the fp32 value it is handed
    alpha_only = _problem(act="dswiglu", alpha_dtype=torch.float16)
    assert eng.knob_space(alpha_only) == eng.knob_space(base)


@needs_dsl
def test_plan_with_16_bit_beta_holds_the_product_plan():
    from cudnn_ext.engines.base import defer_compile

    p = _problem(act="dswiglu", c=E4M3, beta_dtype=torch.float16, alpha_dtype=torch.bfloat16)
    with defer_compile():
        plan = Sm90BlockScaledEngine().build(p, Sm90BlockScaledEngine().knob_space(p)[0])
    assert plan._c_beta == torch.float16 and plan._inner.problem.c_dtype == torch.float16
    assert plan._inner.config.c_dtype == "fp16"


@pytest.mark.parametrize("act,c_dtype,alpha_dtype,beta_dtype", [
    ("dswiglu", torch.bfloat16, torch.bfloat16, torch.bfloat16),
    ("dswiglu", torch.bfloat16, torch.float16, torch.float16),
    ("dswiglu", E4M3, torch.float32, torch.bfloat16),
    ("dgeglu", torch.float16, torch.bfloat16, torch.float16),
    ("dsituglu", torch.bfloat16, torch.float16, torch.bfloat16)], ids=str)
def test_kernel_inputs_compute_the_16_bit_semantics(act, c_dtype, alpha_dtype, beta_dtype):
    """What the plan hands the kernel (C, fp32 alpha and beta from ``kernel_scalars``), run as an
    fp32-scalar problem through the float64 reference, equals the 16-bit problem's float64
    reference to an fp32 ulp of alpha**2: the sm90 kernel, which implements the fp32-scalar
    semantics, computes the vendor's 16-bit roundings."""
    from cudnn_ext import contract
    from cudnn_ext.quant import quantize_nvfp4
    from cudnn_ext.reference import reference_outputs

    g = torch.Generator().manual_seed(5)
    n, k, num_experts, m = 64, 128, 3, 1024
    offs = torch.tensor([256, 256, 768], dtype=torch.int32)
    a_q, sfa = quantize_nvfp4(torch.randn(m, k, generator=g), sf_vec_size=32, sf_dtype=E8M0)
    b_q, sfb = quantize_nvfp4((torch.randn(num_experts, n, k, generator=g) * 0.2).permute(1, 2, 0),
                              sf_vec_size=32, sf_dtype=E8M0)
    c = (torch.randn(m, 2 * n, generator=g) * 2).to(c_dtype)
    alpha = torch.tensor([1.4921875, 1.0625, 0.74609375]).to(alpha_dtype)
    beta = (torch.rand(num_experts, generator=g) + 0.5).to(beta_dtype)
    cfg = contract.CallConfig(act_func=act, sf_vec_size=32)

    def outputs(c, alpha, beta):
        ops = contract.Operands(a=a_q, c=c, sfa=sfa, padded_offsets=offs, alpha=alpha, beta=beta,
                                prob=torch.linspace(0.1, 1, m), dprob=torch.zeros(m), b=b_q, sfb=sfb)
        problem, pack = contract.normalize(ops, cfg, d_dtype=torch.float32)
        pack["d_row"] = torch.empty(m, 2 * n)
        return problem, reference_outputs(problem, pack)

    problem, want = outputs(c, alpha, beta)
    k_c, k_alpha, k_beta = kernel_scalars(dataclasses.replace(problem, device_type="cuda"), c, alpha, beta, offs)
    kernel_problem, got = outputs(k_c, k_alpha, k_beta)
    assert kernel_problem.block_scale.alpha_dtype == kernel_problem.block_scale.beta_dtype == torch.float32
    assert kernel_problem.c_dtype == dense_problem(problem).c_dtype
    last = int(offs[-1])
    for key in ("d_row", "dprob"):
        torch.testing.assert_close(got[key][:last], want[key][:last], rtol=3e-7, atol=1e-12, msg=key)
    # and the fp32-scalar problem on the caller's values is not that: the roundings matter
    _, plain = outputs(c, alpha.float(), beta.float())
    assert not torch.allclose(plain["d_row"][:last], want["d_row"][:last], rtol=1e-5, atol=0)


@needs_dsl
@pytest.mark.parametrize("mode", ["dense", "discrete"])
def test_address_path_launches_what_the_tensor_path_launches(monkeypatch, mode):
    """A call on the current stream with fp32 alpha/beta and C as the kernel reads it goes
    through the inner plan's address launcher and creates no tensor; it launches the
    dequantizers (one launch for A and B) and the GEMM with the same arguments as the general
    path (a given stream), whose temporaries are the same workspace regions; the GEMM writes
    the pack's FP8 D, D_col and scale outputs. More rows than the plan was built for: A's
    copy from the allocator, not the workspace."""
    from cudnn_ext.engines import sm90
    from cudnn_ext.engines import sm90_blockscaled as sbs
    from cudnn_ext.engines.base import defer_compile
    from cudnn_ext.kernels.blockscaled import launch as bl

    calls = []
    monkeypatch.setattr(sm90, "compile_cached", lambda cfg: (lambda *args: calls.append(("gemm", args))))
    monkeypatch.setattr(sm90.Sm90Plan, "_resident_ctas", lambda self, idx: 132)
    monkeypatch.setattr(bl, "launch_dequant_pair", lambda *a, **k: calls.append(("dequant_pair", a[1:], k)))
    for mod in (sm90, sbs):
        monkeypatch.setattr(mod, "current_stream_handle", lambda idx: 77)
    p = dataclasses.replace(_mxfp8(act="dswiglu", dbias=True, mode=mode, m=1024), device_type="cpu")
    with defer_compile():
        plan = Sm90BlockScaledEngine().build(p, Sm90BlockScaledEngine().knob_space(p)[0])
    if not plan._inner.tvm_ffi:
        pytest.skip("apache-tvm-ffi is not installed: the launch packs DSL pointer objects")
    assert plan._plain
    m, n, k, L = p.m, p.n, p.k, p.num_experts
    e4 = torch.float8_e4m3fn
    pack = dict(a=torch.zeros(m, k, dtype=e4), sfa=torch.zeros(4096, dtype=torch.uint8),
                c=torch.zeros(m, 2 * n, dtype=torch.bfloat16), d_row=torch.zeros(m, 2 * n, dtype=e4),
                d_col=torch.zeros(m, 2 * n, dtype=e4), sfd_row=torch.zeros(4096, dtype=torch.uint8),
                sfd_col=torch.zeros(4096, dtype=torch.uint8), norm_const=torch.ones(1),
                padded_offsets=torch.tensor([256, 512, 768, 1024], dtype=torch.int32), alpha=torch.ones(L),
                beta=torch.ones(L), prob=torch.ones(m), dprob=torch.zeros(m), dbias=torch.zeros(L, 2 * n),
                amax=torch.zeros(L, 2), activation=None)
    if mode == "dense":
        pack.update(b=torch.zeros(n, k, L, dtype=e4), sfb=torch.zeros(4096, dtype=torch.uint8))
    else:
        pack.update(b_ptrs=torch.zeros(L, dtype=torch.int64), sfb_ptrs=torch.zeros(L, dtype=torch.int64))
    ws = torch.zeros(plan.workspace_size, dtype=torch.uint8)
    made = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: made.append(a) or real_empty(*a, **kw))
    plan.execute(pack, ws)
    fast, calls[:] = list(calls), []
    assert not made and [c[0] for c in fast] == ["dequant_pair", "gemm"]
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    assert calls == fast
    base = ws.data_ptr()
    (a_addrs, b_addrs), gemm = fast[0][1][:2], fast[1][1]
    assert a_addrs[2] == base + plan._a_off and b_addrs[2] == base + plan._b_off
    assert gemm[3] == pack["d_row"].data_ptr()
    assert gemm[18:22] == tuple(pack[s].data_ptr() for s in ("d_col", "sfd_row", "sfd_col", "norm_const"))
    # more rows than built: A's copy from the allocator
    calls[:] = []
    big = dict(pack, a=torch.zeros(2 * m, k, dtype=e4), c=torch.zeros(2 * m, 2 * n, dtype=torch.bfloat16),
               d_row=torch.zeros(2 * m, 2 * n, dtype=e4), d_col=torch.zeros(2 * m, 2 * n, dtype=e4),
               prob=torch.ones(2 * m), dprob=torch.zeros(2 * m))
    plan.execute(big, ws)
    inside = range(base, base + plan.workspace_size)
    (a_addrs, b_addrs), gemm = calls[0][1][:2], calls[1][1]
    assert a_addrs[2] not in inside and b_addrs[2] == base + plan._b_off
    assert gemm[3] == big["d_row"].data_ptr()
