"""CPU tier: every SM90 kernel variant the engine can select compiles for sm_90a (no GPU).

Skipped cleanly when the CuTe DSL is not importable. Also pins what the compile key holds
(and, as important, what it does not: M, L, pointers, runtime activation constants).
"""
import dataclasses
import importlib.util
import re

import pytest
import torch

from cudnn_ext.engines.base import Knobs
from cudnn_ext.engines.sm90 import (CLUSTER_MS, RASTER_GROUP_M, Sm90CompileKey, Sm90DgluEngine,
                                    TILE_NS)
from cudnn_ext.problem import ActConfig, DgluProblem

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


def _problem(act="dswiglu", c=torch.bfloat16, d=torch.bfloat16, dbias=True, n=96, k=200,
             m=1024, L=4, weight_mode="dense", b_major="k"):
    return DgluProblem(n=n, k=k, num_experts=L, m=m, weight_mode=weight_mode, b_major=b_major,
                       ab_dtype=torch.bfloat16, c_dtype=c, d_dtype=d,
                       act=ActConfig(act_func=act), generate_dbias=dbias, device_type="cuda")


def test_compile_key_fields_are_pinned():
    names = [f.name for f in dataclasses.fields(Sm90CompileKey)]
    assert names == ["arch", "n", "k", "ab_dtype", "c_dtype", "d_dtype", "act_func",
                     "generate_dbias", "weight_mode", "b_major", "tile_n", "ab_stages",
                     "raster_group_m", "c_stages", "cluster_m", "cluster_n", "init_outputs", "cooperative",
                     "c_split", "ws_zeroed", "tvm_ffi", "trace", "split_last"]


def test_compile_key_ignores_runtime_sizes_and_constants():
    knobs = Knobs.of(tile_n=128)
    base = Sm90CompileKey.of(_problem(), knobs)
    assert Sm90CompileKey.of(_problem(m=4096, L=64), knobs) == base
    p = _problem(act="dgeglu")
    q = dataclasses.replace(p, act=ActConfig(act_func="dgeglu", geglu_alpha=1.0,
                                             clamp_max=3.0, clamp_min=-2.0, linear_offset=0.5))
    assert Sm90CompileKey.of(p, knobs) == Sm90CompileKey.of(q, knobs)
    assert Sm90CompileKey.of(_problem(), Knobs.of(tile_n=256)) != base
    assert Sm90CompileKey.of(_problem(), Knobs.of(tile_n=128, cluster_m=2, cluster_n=2)) != \
        Sm90CompileKey.of(_problem(), Knobs.of(tile_n=128, cluster_m=2))
    disc = Sm90CompileKey.of(_problem(weight_mode="discrete"), knobs)
    assert disc != base and (disc.weight_mode, disc.b_major) == ("discrete", "k")
    assert Sm90CompileKey.of(_problem(weight_mode="discrete", b_major="n"), knobs) != disc
    assert Sm90CompileKey.of(_problem(weight_mode="discrete", L=64), knobs) == disc
    hash(base)  # usable as a dict key


def test_declines_with_reasons():
    eng = Sm90DgluEngine()
    p = dataclasses.replace(_problem(), act=ActConfig("dsituglu"), device_type="cpu")
    reasons = " | ".join(eng.check_support(p))
    assert "dsituglu" in reasons and "cpu" in reasons
    assert eng.check_support(_problem()) == []
    assert eng.check_support(_problem(b_major="n")) == []  # dense N-major (e.g. the MLP's w2^T)


@pytest.mark.parametrize("b_major", ["k", "n"])
def test_discrete_is_supported(b_major):
    """Discrete B (K- and N-major) is offered: verified on the H200 (tests/gpu)."""
    eng = Sm90DgluEngine()
    assert eng.check_support(_problem(weight_mode="discrete", b_major=b_major)) == []
    bad = dataclasses.replace(_problem(), weight_mode="gathered")
    assert any("weight_mode" in r for r in eng.check_support(bad))


@needs_dsl
@pytest.mark.parametrize("dbias", [True, False])
def test_discrete_workspace_layout(dbias):
    """Discrete plans: L x 128-B descriptors first, then the dbias region (fp32 sums (L, 2N)
    and an int32 arrival counter per (expert, N-tile)), each region 128-B aligned; dense
    plans keep one scratch region of the dbias sums and counters. The dbias region is what
    a launch leaves zero (``zeroed_region``)."""
    from cudnn_ext.engines.sm90 import Sm90Plan
    from cudnn_ext.runtime.workspace import WorkspaceLayout

    knobs = Knobs.of(tile_n=128)
    for L in (1, 3, 64):
        p = _problem(weight_mode="discrete", L=L, dbias=dbias, n=96)
        plan = Sm90Plan(p, knobs, Sm90CompileKey.of(p, knobs), compiled=None)
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
    plan = Sm90Plan(dense, knobs, Sm90CompileKey.of(dense, knobs), compiled=None)
    assert plan.workspace_size == (4 * 3 * (2 * 96 + 1) if dbias else 0)
    assert plan.zeroed_region == (0 if dbias else None)
    assert plan.zeroed_region_bytes == plan.workspace_size
    assert [r.name for r in plan.workspace_requests()] == (["scratch"] if dbias else [])
    n300 = _problem(L=3, n=300)  # 3 N-tiles of 128: 3 counters per expert
    plan = Sm90Plan(n300, knobs, Sm90CompileKey.of(n300, knobs), compiled=None)
    assert plan.workspace_size == plan.zeroed_region_bytes == 4 * 3 * (2 * 300 + 3)
    wide = Knobs.of(tile_n=256, cluster_m=2, cooperative=True)  # 2 N-tiles of 256
    plan = Sm90Plan(n300, wide, Sm90CompileKey.of(n300, wide), compiled=None)
    assert plan.zeroed_region_bytes == 4 * 3 * (2 * 300 + 2)


def _compile_checked(key, capfd, max_spill=0):
    """Compile ``key`` for sm_90a with ptxas's report and hold the kernel to it: no WGMMA
    performance warning (C7519 "wgmma.mma_async instructions are serialized" made the
    no-dbias kernel 1.6x slower on the H200; C7517 "wait_group is injected") and no
    register spills beyond ``max_spill`` bytes, in every kernel of the launch."""
    import re

    from cudnn_ext.kernels.sm90.launch import compile_kernel

    capfd.readouterr()
    compiled = compile_kernel(key.kernel_config(), tvm_ffi=key.tvm_ffi, remarks=True)
    out = "\n".join(capfd.readouterr())
    assert "ptxas info" in out and "Used" in out, "ptxas printed no report: nothing was checked"
    wgmma = [ln for ln in out.splitlines() if "wgmma" in ln.lower()]
    assert not wgmma, "ptxas WGMMA performance warning:\n" + "\n".join(wgmma)
    spills = re.findall(r"(\d+) bytes spill stores", out)
    assert spills and max(int(s) for s in spills) <= max_spill, f"register spills: {spills} B"
    return compiled


def _variants():
    # every (tile_n, cluster_m, act, dbias) with bf16 C/D (at tile 128 with 64-row C ring
    # entries, c_split 2, at any K for dense weights), plus each C/D dtype pair once
    out = [(t, cl, a, db, torch.bfloat16, torch.bfloat16, 200)
           for t in TILE_NS for cl in CLUSTER_MS for a in ("dswiglu", "dgeglu")
           for db in (True, False)]
    dts = (torch.bfloat16, torch.float16, torch.float32)
    out += [(128, 2, "dgeglu", True, c, d, 200) for c in dts for d in dts
            if (c, d) != (torch.bfloat16, torch.bfloat16)]
    return out + [(128, 2, "dswiglu", True, torch.bfloat16, torch.bfloat16, 7168)]  # dsv3's K


def _c_split_expected(tile_n, c, d):
    """Where the engine offers 64-row C ring entries to dense weights
    (Sm90DgluEngine._c_split_applies): an independent restatement of the measured rule, so
    a change to either shows (per-expert weights: test_c_split_is_offered_where_it_was_measured)."""
    return tile_n == 128 and c == d != torch.float32


_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _vid(v):
    t, cl, a, db, c, d, k = v
    return f"t{t}-cl{cl}-{a}-dbias{int(db)}-C{_DT[c]}-D{_DT[d]}-K{k}"


def _engine_knobs(p, tile_n, cluster_m):
    """The engine's ping-pong knobs for (tile_n, cluster_m) in 1-CTA-wide clusters."""
    found = [kn for kn in Sm90DgluEngine().knob_space(p)
             if (kn.get("tile_n"), kn.get("cluster_m"), kn.get("cluster_n", 1)) == (tile_n, cluster_m, 1)
             and not kn.get("cooperative", False)]
    assert len(found) == 1, found
    return found[0]


@needs_dsl
@pytest.mark.parametrize("tile_n,cluster_m,act,dbias,c,d,k", _variants(),
                         ids=[_vid(v) for v in _variants()])
def test_every_variant_compiles_for_sm90a(tile_n, cluster_m, act, dbias, c, d, k, capfd):
    p = _problem(act=act, c=c, d=d, dbias=dbias, k=k)
    knobs = _engine_knobs(p, tile_n, cluster_m)
    assert knobs == Knobs.of(tile_n=tile_n, stages=0, raster_group_m=RASTER_GROUP_M[cluster_m],
                             scheduler="static_persistent", cluster_m=cluster_m,
                             **({"c_split": 2} if _c_split_expected(tile_n, c, d) else {}))
    # fp32 C (twice the gate/up registers) spills a few bytes in the epilogue of a partial
    # last N-tile (N = 96 here: 20-32 B at tile 128); the bf16 C/D kernels, the ones the
    # benchmarks run, spill nothing
    bf16 = c == d == torch.bfloat16
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd, 0 if bf16 else 32) is not None


def test_c_split_is_offered_where_it_was_measured():
    """64-row C ring entries (c_split 2): 16-bit C and D of one type, ping-pong tile 128 in
    1x1 and 2x1 clusters, dense weights at any K, discrete weights at K <= 2048; not for
    tile 64, 2x2 clusters, discrete weights at K > 2048, fp32 C or D, or D of another type
    than C."""
    eng = Sm90DgluEngine()

    def split(p):
        return {(kn.get("tile_n"), kn.get("cluster_m"), kn.get("cluster_n", 1)): kn.get("c_split", 1)
                for kn in eng.knob_space(p) if not kn.get("cooperative", False)}

    dense = {(64, 1, 1): 1, (128, 1, 1): 2, (64, 2, 1): 1, (128, 2, 1): 2, (64, 2, 2): 1,
             (128, 2, 2): 1}
    assert split(_problem(k=2048)) == dense
    assert split(_problem(k=7168)) == dense
    assert split(_problem(k=2048, weight_mode="discrete", b_major="n")) == {
        (64, 1, 1): 1, (128, 1, 1): 2, (64, 2, 1): 1, (128, 2, 1): 2}
    assert set(split(_problem(k=2056, weight_mode="discrete")).values()) == {1}
    assert split(_problem(k=200, c=torch.float16, d=torch.float16))[(128, 2, 1)] == 2
    for c, d in ((torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                 (torch.bfloat16, torch.float16)):
        assert set(split(_problem(k=200, c=c, d=d)).values()) == {1}


#: 2x2 clusters (A and B multicast): both tiles, both activations, dbias on/off, N-major B
_CLUSTER_2X2 = [(128, "dswiglu", True, "k"), (64, "dgeglu", False, "k"), (128, "dgeglu", True, "n"),
                (64, "dswiglu", True, "n")]


@needs_dsl
@pytest.mark.parametrize("tile_n,act,dbias,b_major", _CLUSTER_2X2,
                         ids=[f"t{t}-{a}-dbias{int(d)}-{b}major" for t, a, d, b in _CLUSTER_2X2])
def test_cluster_2x2_variant_compiles_for_sm90a(tile_n, act, dbias, b_major, capfd):
    p = _problem(act=act, dbias=dbias, b_major=b_major)
    knobs = Knobs.of(tile_n=tile_n, stages=0, raster_group_m=RASTER_GROUP_M[2],
                     scheduler="static_persistent", cluster_m=2, cluster_n=2)
    assert knobs in Sm90DgluEngine().knob_space(p)
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


#: The functional path's fresh-outputs variant (zeroes dprob / D's tail, assigns dbias)
_FRESH = [(128, 2, "dswiglu", True, "dense"), (64, 1, "dgeglu", False, "dense"), (128, 1, "dgeglu", True, "discrete")]


@needs_dsl
@pytest.mark.parametrize("tile_n,cluster_m,act,dbias,mode", _FRESH,
                         ids=[f"t{t}-cl{c}-{a}-dbias{int(d)}-{m}" for t, c, a, d, m in _FRESH])
def test_fresh_outputs_variant_compiles_for_sm90a(tile_n, cluster_m, act, dbias, mode, capfd):
    p = _problem(act=act, dbias=dbias, weight_mode=mode)
    knobs = _engine_knobs(p, tile_n, cluster_m)  # tile 128: 64-row C entries (K 200)
    assert knobs.get("c_split", 1) == (2 if tile_n == 128 else 1)
    key = dataclasses.replace(Sm90CompileKey.of(p, knobs), init_outputs=True)
    assert key != Sm90CompileKey.of(p, knobs)
    assert _compile_checked(key, capfd) is not None


@needs_dsl
@pytest.mark.parametrize("coop", [False, True])
def test_zeroed_workspace_variant_compiles_for_sm90a(coop, capfd):
    """The contract launch without its zeroing kernel (a scratch kept zero: the torch replay),
    for ping-pong and for the cooperative kernel the engine picks at deep K."""
    from cudnn_ext.engines.sm90 import cooperative_knobs

    p = _problem(n=512, k=7168, m=32768) if coop else _problem()
    knobs = cooperative_knobs(p) if coop else _engine_knobs(p, 128, 2)
    assert knobs in Sm90DgluEngine().knob_space(p)
    key = dataclasses.replace(Sm90CompileKey.of(p, knobs), ws_zeroed=True)
    assert key != Sm90CompileKey.of(p, knobs)
    assert _compile_checked(key, capfd) is not None


@needs_dsl
@pytest.mark.parametrize("dbias,coop,arrivals", [(True, False, 32), (False, False, 1),
                                                 (True, True, 1)])
def test_c_full_barrier_arrivals(dbias, coop, arrivals):
    """With the ping-pong dbias hand-off every lane of a C producer warp arrives on the C
    full barrier (lane 0 with the TMA bytes), each after its own reads of the dbias slice
    that the math warps write once the phase completes: compute-sanitizer racecheck reported
    4 write-after-read hazards with one elected arrival and 0 with 32 (H200, session 14,
    benchmarks/results/session14/race2/). Elsewhere the slice does not exist: one arrival."""
    from cudnn_ext.kernels.sm90.dglu_kernel import GroupedDgluSm90

    knobs = Knobs.of(tile_n=256 if coop else 128, cluster_m=2, cooperative=coop)
    kernel = GroupedDgluSm90(Sm90CompileKey.of(_problem(dbias=dbias), knobs).kernel_config())
    assert kernel.dbias_via_producer() == (dbias and not coop)
    assert kernel.c_full_arrivals() == arrivals


def test_build_compiles_unless_deferred(monkeypatch):
    """build() compiles the contract variant (class API/graph users expect build = compile);
    under defer_compile (the functional torch path) nothing compiles until an execute picks
    its variant."""
    from cudnn_ext.engines import sm90
    from cudnn_ext.engines.base import defer_compile

    compiled = []
    monkeypatch.setattr(sm90, "compile_cached", lambda key: compiled.append(key) or object())
    eng, p, knobs = Sm90DgluEngine(), _problem(), Knobs.of(tile_n=128)
    eng.build(p, knobs)
    assert [k.init_outputs for k in compiled] == [False]
    with defer_compile():
        plan = eng.build(p, knobs)
    assert len(compiled) == 1
    plan._fn(True)
    assert [k.init_outputs for k in compiled] == [False, True]


def _cpu_pack(m, n, k, L, dbias=True):
    """A variant pack of zero CPU tensors (the launch tests only read their addresses)."""
    t = lambda *shape, dt=torch.float32: torch.zeros(*shape, dtype=dt)  # noqa: E731
    return {"a": t(m, k, dt=torch.bfloat16), "b": t(n, k, L, dt=torch.bfloat16),
            "c": t(m, 2 * n, dt=torch.bfloat16), "d_row": t(m, 2 * n, dt=torch.bfloat16),
            "padded_offsets": t(L, dt=torch.int32), "alpha": t(L), "beta": t(L), "prob": t(m),
            "dprob": t(m), "dbias": t(L, 2 * n, dt=torch.bfloat16) if dbias else None}


@pytest.mark.parametrize("fresh", [False, True])
def test_launch_passes_addresses_in_the_kernels_argument_order(monkeypatch, fresh):
    """The plan's launch (no GPU: a recording stand-in for the compiled function, CPU tensors):
    the 13 addresses in ``launch._ptr_specs`` order, then M, L, resident CTAs, the activation
    constants and the stream handle; the fresh-outputs variant is a separate compiled function."""
    import types

    from cudnn_ext.engines import sm90

    calls = []

    def fake_compile(key):
        return lambda *args: calls.append((key.init_outputs, args))

    monkeypatch.setattr(sm90, "compile_cached", fake_compile)
    monkeypatch.setitem(sm90.Sm90Plan._resident, (-1, 1), 132)  # CPU tensors: device index -1
    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, act="dgeglu"), device_type="cpu")
    p = dataclasses.replace(p, act=ActConfig(act_func="dgeglu", geglu_alpha=1.5, clamp_max=6.0,
                                             clamp_min=-5.0, linear_offset=0.25))
    plan = Sm90DgluEngine().build(p, Knobs.of(tile_n=128))
    if not plan.key.tvm_ffi:
        pytest.skip("apache-tvm-ffi is not installed: the launch packs DSL pointer objects")
    pack = _cpu_pack(m, n, k, L)
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8)
    (plan.execute_fresh if fresh else plan.execute)(pack, ws, types.SimpleNamespace(cuda_stream=77))
    (init, args), = calls
    ptr = {name: v.data_ptr() for name, v in pack.items()}
    assert init is fresh
    assert args[:13] == (ptr["a"], ptr["b"], ptr["c"], ptr["d_row"], ptr["padded_offsets"],
                         ptr["alpha"], ptr["beta"], ptr["prob"], ptr["dprob"], ws.data_ptr(),
                         ptr["a"], ptr["a"], ptr["dbias"])
    assert args[13:] == (m, L, 132, 1.5, 6.0, -5.0, 0.25, 77)


def test_discrete_launch_passes_the_table_and_workspace_regions(monkeypatch):
    """Discrete weights: B's slot holds A's address (never loaded), the pointer table and the
    descriptor region follow, the dbias sums sit after the descriptors."""
    import types

    from cudnn_ext.engines import sm90

    calls = []
    monkeypatch.setattr(sm90, "compile_cached", lambda key: (lambda *args: calls.append(args)))
    monkeypatch.setitem(sm90.Sm90Plan._resident, (-1, 1), 132)
    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, weight_mode="discrete"), device_type="cpu")
    plan = Sm90DgluEngine().build(p, Knobs.of(tile_n=128))
    if not plan.key.tvm_ffi:
        pytest.skip("apache-tvm-ffi is not installed: the launch packs DSL pointer objects")
    pack = _cpu_pack(m, n, k, L)
    del pack["b"]
    pack["b_ptrs"] = torch.zeros(L, dtype=torch.int64)
    ws = torch.empty(plan.workspace_size + 128, dtype=torch.uint8)
    ws = ws[(-ws.data_ptr()) % 128:][:plan.workspace_size]  # 128-B aligned descriptors
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    (args,) = calls
    ptr = {name: v.data_ptr() for name, v in pack.items()}
    assert args[:13] == (ptr["a"], ptr["a"], ptr["c"], ptr["d_row"], ptr["padded_offsets"],
                         ptr["alpha"], ptr["beta"], ptr["prob"], ptr["dprob"],
                         ws.data_ptr() + 128 * L, ptr["b_ptrs"], ws.data_ptr(), ptr["dbias"])
    with pytest.raises(ValueError, match="128-byte aligned"):
        plan.execute(pack, ws[4:], types.SimpleNamespace(cuda_stream=77))


@pytest.mark.parametrize("dbias", [True, False])
def test_trace_launch_passes_its_region_in_the_descriptor_slot(monkeypatch, dbias):
    """The trace knob (dense weights): the workspace holds [trace][dbias sums], the kernel's
    descriptor slot gets the trace region, the dbias slot the sums after it, and the region
    launches keep zero (``zeroed_region``) starts after the trace."""
    import types

    from cudnn_ext.engines import sm90

    calls = []
    monkeypatch.setattr(sm90, "compile_cached", lambda key: (lambda *args: calls.append(args)))
    monkeypatch.setitem(sm90.Sm90Plan._resident, (-1, 1), 132)
    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, dbias=dbias), device_type="cpu")
    plan = Sm90DgluEngine().build(p, Knobs.of(tile_n=128, trace=8))
    if not plan.key.tvm_ffi:
        pytest.skip("apache-tvm-ffi is not installed: the launch packs DSL pointer objects")
    trace_bytes = 8 * 4 * 9 * 2 * (sm90.TRACE_MAX_CTAS + 1)  # and the grid's header row
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
    region = ws[:trace_bytes].view(torch.int64).view(sm90.TRACE_MAX_CTAS + 1, 2, 9, 4)
    region.zero_()
    with pytest.raises(ValueError, match="holds no launch"):
        plan.read_trace(ws)
    region[sm90.TRACE_MAX_CTAS, 0, 0, 0] = 132
    region[131, 1, 2, 3] = 7
    stamps = plan.read_trace(ws)
    assert stamps.shape == (132, 2, 9, 4) and stamps.dtype == torch.int64
    assert stamps[131, 1, 2, 3] == 7


def test_trace_knob_rules():
    """Dense weights only, a bounded tile count, and only on a plan built with it; each
    refused before anything compiles."""
    eng = Sm90DgluEngine()
    with pytest.raises(NotImplementedError, match="trace: dense weights only"):
        eng.build(_problem(weight_mode="discrete"), Knobs.of(tile_n=128, trace=4))
    with pytest.raises(ValueError, match=r"trace: .* in \[0, 4096\], got -1"):
        eng.build(_problem(), Knobs.of(tile_n=128, trace=-1))
    plan = sm90_plan_without_compile(_problem(), Knobs.of(tile_n=128))
    with pytest.raises(ValueError, match="built without the trace knob"):
        plan.read_trace(torch.empty(0, dtype=torch.uint8))


def sm90_plan_without_compile(problem, knobs):
    from cudnn_ext.engines.sm90 import Sm90Plan

    return Sm90Plan(problem, knobs, Sm90CompileKey.of(problem, knobs))


@needs_dsl
def test_engine_restates_the_kernels_constants():
    """The engine sizes workspace regions without importing the DSL: its copies of the
    kernel's constants must agree."""
    from cudnn_ext.engines import sm90
    from cudnn_ext.kernels.sm90 import dglu_kernel

    assert (sm90.TRACE_MAX_CTAS, sm90.TRACE_MAX_TILES, sm90.DESC_BYTES) == (
        dglu_kernel.TRACE_MAX_CTAS, dglu_kernel.TRACE_MAX_TILES, dglu_kernel.DESC_BYTES)
    assert sm90.SPLIT_MAX == dglu_kernel.SPLIT_MAX


@needs_dsl
@pytest.mark.parametrize("coop", [False, True])
def test_trace_variant_compiles_for_sm90a(coop, capfd):
    p = _problem(n=768, k=2048)
    knobs = Knobs.of(tile_n=256 if coop else 128, cluster_m=2, cooperative=coop, trace=64,
                     raster_group_m=RASTER_GROUP_M[2], scheduler="static_persistent",
                     **({} if coop else {"c_split": 2}))
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


@pytest.mark.parametrize("dbias", [True, False])
def test_address_launcher_passes_what_execute_passes(monkeypatch, dbias):
    """The replay's launch on raw addresses hands the compiled function exactly the
    arguments ``execute`` does; with ``zeroed_workspace`` it is the ws_zeroed variant (only
    when there is a dbias region to keep zero)."""
    import types

    from cudnn_ext.engines import sm90

    calls = []
    monkeypatch.setattr(sm90, "compile_cached",
                        lambda key: (lambda *args: calls.append((key, args))))
    monkeypatch.setitem(sm90.Sm90Plan._resident, (-1, 1), 132)
    monkeypatch.setattr(sm90, "current_stream_handle", lambda idx: 77)
    L, n, k, m = 4, 96, 200, 1024
    p = dataclasses.replace(_problem(n=n, k=k, m=m, L=L, dbias=dbias), device_type="cpu")
    plan = Sm90DgluEngine().build(p, Knobs.of(tile_n=128))
    if not plan.key.tvm_ffi:
        pytest.skip("apache-tvm-ffi is not installed: the launch packs DSL pointer objects")
    pack = _cpu_pack(m, n, k, L, dbias)
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8)
    plan.execute(pack, ws, types.SimpleNamespace(cuda_stream=77))
    addr = lambda name: pack[name].data_ptr() if pack[name] is not None else 0  # noqa: E731
    args = (addr("a"), addr("b"), addr("c"), addr("padded_offsets"), addr("alpha"), addr("beta"),
            addr("prob"), addr("d_row"), addr("dprob"), addr("dbias"), ws.data_ptr() if dbias else 0, m)
    plan.address_launcher(False, -1)(*args)
    plan.address_launcher(False, -1, zeroed_workspace=True)(*args)
    (k0, a0), (k1, a1), (k2, a2) = calls
    assert a1 == a0 and a2 == a0
    assert (k0.ws_zeroed, k1.ws_zeroed, k2.ws_zeroed) == (False, False, dbias)


def test_cluster_shapes_per_weight_mode():
    """Discrete weights get 2x1 clusters (the CTA pair shares one expert, hence one
    device-built descriptor) but not 2x2."""
    eng = Sm90DgluEngine()
    assert {k.get("cluster_m") for k in eng.knob_space(_problem())} == set(CLUSTER_MS)
    assert {k.get("cluster_m") for k in eng.knob_space(_problem(weight_mode="discrete"))} == {1, 2}
    assert {k.get("cluster_n", 1) for k in eng.knob_space(_problem(weight_mode="discrete"))} == {1}
    assert {k.get("cluster_n", 1) for k in eng.knob_space(_problem())} == {1, 2}
    # the chosen dense schedules run in 2x1 clusters: ping-pong 128 x 128 (mixtral-like with
    # dbias, qwen3-like without) and cooperative 128 x 256 (dsv3-like with dbias: deep K;
    # qwen3-like without dbias, C and D of different 16-bit types)
    for kw, tile_n in ((dict(m=16384, n=14336, k=4096), 128), (dict(m=32768, n=2048, k=7168), 256),
                       (dict(m=16384, n=768, k=2048, dbias=False), 128),
                       (dict(m=16384, n=768, k=2048, dbias=False, d=torch.float16), 256)):
        best = min(eng.knob_space(_problem(**kw)), key=lambda k: eng.cost(_problem(**kw), k))
        assert (best.get("tile_n"), best.get("cluster_m"), best.get("cluster_n", 1)) == (
            tile_n, 2, 1), (kw, best)


#: Discrete B (b_ptrs): per-expert TMA descriptors built on the device by a helper kernel,
#: alone and in 2x1 clusters (multicast half-box descriptors)
_DISCRETE = [("k", 128, "dswiglu", True, 1), ("n", 128, "dgeglu", True, 1),
             ("n", 64, "dswiglu", False, 1), ("k", 128, "dgeglu", True, 2), ("n", 64, "dswiglu", True, 2)]

#: Dense N-major B ((N, K, L) with strides (1, N, N*K)): both cluster sizes.
_DENSE_N = [(128, 2, "dswiglu", True), (64, 1, "dgeglu", False)]


@needs_dsl
@pytest.mark.parametrize("tile_n,cluster_m,act,dbias", _DENSE_N,
                         ids=[f"t{t}-cl{c}-{a}-dbias{int(d)}" for t, c, a, d in _DENSE_N])
def test_dense_n_major_variant_compiles_for_sm90a(tile_n, cluster_m, act, dbias, capfd):
    p = _problem(act=act, dbias=dbias, b_major="n")
    knobs = _engine_knobs(p, tile_n, cluster_m)  # tile 128 at K 200: 64-row C entries
    assert knobs.get("c_split", 1) == (2 if tile_n == 128 else 1)
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


@needs_dsl
@pytest.mark.parametrize("b_major,tile_n,act,dbias,cluster_m", _DISCRETE,
                         ids=[f"{b}major-t{t}-{a}-dbias{int(d)}-cl{c}" for b, t, a, d, c in _DISCRETE])
def test_discrete_variant_compiles_for_sm90a(b_major, tile_n, act, dbias, cluster_m, capfd):
    # tile 128 at K 2056: 128-row C entries, the engine's choice for per-expert weights past
    # K 2048 (64-row ones below it: test_c_half_with_discrete_weights_compiles_for_sm90a)
    p = _problem(act=act, dbias=dbias, weight_mode="discrete", b_major=b_major,
                 k=2056 if tile_n == 128 else 200)
    assert Sm90DgluEngine().check_support(p) == []
    knobs = Knobs.of(tile_n=tile_n, stages=0, raster_group_m=RASTER_GROUP_M[cluster_m],
                     scheduler="static_persistent", cluster_m=cluster_m)
    assert knobs in Sm90DgluEngine().knob_space(p)
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


@needs_dsl
def test_kernel_refuses_unsupported_cluster_shapes():
    import cutlass

    from cudnn_ext.kernels.sm90.dglu_kernel import GroupedDgluSm90, Sm90KernelConfig

    cfg = Sm90KernelConfig(n=64, k=64, ab_dtype=cutlass.BFloat16, c_dtype=cutlass.BFloat16,
                           d_dtype=cutlass.BFloat16, act_func="dswiglu", generate_dbias=False,
                           weight_mode="discrete", cluster_m=2)
    GroupedDgluSm90(cfg)  # 2x1 with discrete B: accepted
    with pytest.raises(ValueError, match="cluster_n must be 1 with discrete B"):
        GroupedDgluSm90(dataclasses.replace(cfg, cluster_n=2))
    with pytest.raises(ValueError, match="cluster_m"):
        GroupedDgluSm90(dataclasses.replace(cfg, weight_mode="dense", cluster_m=4))
    with pytest.raises(ValueError, match="cluster_n"):
        GroupedDgluSm90(dataclasses.replace(cfg, weight_mode="dense", cluster_m=1, cluster_n=2))


@needs_dsl
def test_kernel_tile_n_limit_depends_on_the_schedule():
    """A warpgroup's accumulator is at most 128 fp32 registers per thread: ping-pong 128-row
    tiles stop at 128 columns, cooperative (64 rows per warpgroup) at 256."""
    import cutlass

    from cudnn_ext.kernels.sm90.dglu_kernel import GroupedDgluSm90, Sm90KernelConfig

    cfg = Sm90KernelConfig(n=512, k=64, ab_dtype=cutlass.BFloat16, c_dtype=cutlass.BFloat16,
                           d_dtype=cutlass.BFloat16, act_func="dswiglu", generate_dbias=True,
                           tile_n=256)
    with pytest.raises(ValueError, match=r"tile_n must be a multiple of 32 in \[32, 128\]"):
        GroupedDgluSm90(cfg)
    GroupedDgluSm90(dataclasses.replace(cfg, cooperative=True))  # accepted
    # a configuration that leaves room for one A/B stage would deadlock: refused by name
    with pytest.raises(ValueError, match=r"ab_stages: 1 .*at least 2"):
        GroupedDgluSm90(dataclasses.replace(cfg, cooperative=True, c_dtype=cutlass.Float32,
                                            d_dtype=cutlass.Float32, c_stages=5))
    with pytest.raises(ValueError, match=r"ab_stages: 1 .*at least 2"):
        GroupedDgluSm90(dataclasses.replace(cfg, tile_n=128, ab_stages=1))
    with pytest.raises(ValueError, match=r"\[32, 256\].*got 288"):
        GroupedDgluSm90(dataclasses.replace(cfg, cooperative=True, tile_n=288))


@needs_dsl
def test_pingpong_keeps_six_ab_stages_with_and_without_dbias():
    """Shared memory budget (227 KiB): ping-pong 128 x 128 with one C stage per warpgroup
    keeps 6 A/B stages of 32 KiB with dbias too: its dbias sums are one 64-column slice per
    C stage (2 KiB, summed by the C producer warps), and the mbarriers get a 1 KiB margin;
    the cooperative 128 x 256 schedule keeps 4 stages of 48 KiB next to its 2 KiB dbias slot.
    (The sum below is the buffers' arithmetic; the GPU runs launch the real layout.)"""
    import cutlass

    from cudnn_ext.kernels.sm90.dglu_kernel import SMEM_CAPACITY, Sm90KernelConfig

    cfg = Sm90KernelConfig(n=768, k=2048, ab_dtype=cutlass.BFloat16, c_dtype=cutlass.BFloat16,
                           d_dtype=cutlass.BFloat16, act_func="dswiglu", generate_dbias=True,
                           c_stages=1)
    assert cfg.dbias_smem_shape() == (64, 4, 2)
    for db in (True, False):
        c = dataclasses.replace(cfg, generate_dbias=db)
        assert c.stages() == 6
        used = 6 * 32768 + 2 * 16384 + 4 * c.dbias_smem_floats()
        assert SMEM_CAPACITY - used >= 512  # room for the mbarriers (< 200 B here)
    assert dataclasses.replace(cfg, c_stages=2).stages() == 4
    coop = dataclasses.replace(cfg, cooperative=True, tile_n=256, c_stages=2)
    assert coop.dbias_smem_shape() == (64, 8) and coop.stages() == 4


@needs_dsl
def test_pingpong_dbias_refuses_more_c_stages_than_blocks_per_tile():
    """The C producer warp hands back a stage's dbias sums knowing only the current and the
    previous tile, so with dbias a warpgroup may hold at most a tile's worth of C blocks."""
    import cutlass

    from cudnn_ext.kernels.sm90.dglu_kernel import GroupedDgluSm90, Sm90KernelConfig

    cfg = Sm90KernelConfig(n=256, k=64, ab_dtype=cutlass.BFloat16, c_dtype=cutlass.BFloat16,
                           d_dtype=cutlass.BFloat16, act_func="dswiglu", generate_dbias=True,
                           tile_n=64, c_stages=2)
    GroupedDgluSm90(cfg)  # 2 blocks of a 64-column tile: accepted
    with pytest.raises(ValueError, match=r"c_stages must be at most tile_n / 32 = 2 .*got 3"):
        GroupedDgluSm90(dataclasses.replace(cfg, c_stages=3))
    GroupedDgluSm90(dataclasses.replace(cfg, c_stages=3, generate_dbias=False))  # no sums


@needs_dsl
def test_explicit_ab_stages_that_do_not_fit_are_refused():
    """An explicit A/B stage count bypasses the fit: the deep-K cooperative knobs (3 A/B
    stages, 4 C stages per warpgroup) fit with 16-bit C, where the engine offers them, and
    are refused with fp32 C (280 KB against 227) before anything compiles."""
    import cutlass

    from cudnn_ext.engines.sm90 import COOPERATIVE_DEEP_KNOBS
    from cudnn_ext.kernels.sm90.dglu_kernel import GroupedDgluSm90

    p = _problem(n=512, k=7168, m=32768)
    cfg = Sm90CompileKey.of(p, COOPERATIVE_DEEP_KNOBS).kernel_config()
    assert (cfg.ab_stages, cfg.c_stages, cfg.stages_that_fit()) == (3, 4, 3)
    GroupedDgluSm90(cfg)
    wide_c = dataclasses.replace(cfg, c_dtype=cutlass.Float32)
    assert wide_c.stages_that_fit() == 2
    with pytest.raises(ValueError, match=r"ab_stages: 3 .*do not fit .*at most 2 do"):
        GroupedDgluSm90(wide_c)


#: Ping-pong with dbias and 2 C blocks per warpgroup: the configurations of the GPU cases
#: (tests/gpu/sm90_cases.c_stage_cases), explicit knobs only
_TWO_C = [(128, 2, "dgeglu", torch.bfloat16), (64, 1, "dswiglu", torch.bfloat16),
          (64, 2, "dgeglu", torch.float32)]


@needs_dsl
@pytest.mark.parametrize("tile_n,cluster_m,act,d", _TWO_C,
                         ids=[f"t{t}-cl{c}-{a}-D{_DT[d]}" for t, c, a, d in _TWO_C])
def test_pingpong_two_c_stages_with_dbias_compiles_for_sm90a(tile_n, cluster_m, act, d, capfd):
    p = _problem(act=act, d=d, n=352, k=200)
    knobs = Knobs.of(tile_n=tile_n, c_stages=2, stages=0, cluster_m=cluster_m,
                     raster_group_m=RASTER_GROUP_M[cluster_m], scheduler="static_persistent")
    key = Sm90CompileKey.of(p, knobs)
    assert key.c_stages == 2 and key.kernel_config().dbias_smem_shape() == (64, 4, 4)
    assert _compile_checked(key, capfd, 0 if d == torch.bfloat16 else 32) is not None


#: The cooperative schedule (both math warpgroups on one 128-row tile) in configurations the
#: heuristics never pick (N 96, not a multiple of 256; fp32 D): explicit knobs only
_COOP = [(256, 2, "dswiglu", True, torch.bfloat16), (128, 1, "dgeglu", False, torch.float32)]


@needs_dsl
@pytest.mark.parametrize("tile_n,cluster_m,act,dbias,d", _COOP,
                         ids=[f"t{t}-cl{c}-{a}-dbias{int(db)}-D{_DT[d]}" for t, c, a, db, d in _COOP])
def test_cooperative_variant_compiles_for_sm90a(tile_n, cluster_m, act, dbias, d, capfd):
    p = _problem(act=act, dbias=dbias, d=d)
    knobs = Knobs.of(tile_n=tile_n, cluster_m=cluster_m, raster_group_m=RASTER_GROUP_M[cluster_m],
                     cooperative=True)
    assert not any(kn.get("cooperative", False) for kn in Sm90DgluEngine().knob_space(p))
    key = Sm90CompileKey.of(p, knobs)
    assert key.cooperative and key != dataclasses.replace(key, cooperative=False)
    assert _compile_checked(key, capfd) is not None


#: The split last round (knob split_last) on the deep-K cooperative form and elsewhere: dsv3's
#: shape with dbias, fp16 C and D without dbias at tile 128 and a 1-CTA cluster, dGeGLU with
#: fp32 C and D (the epilogue's scalar shared-memory path), per-expert N-major weights
_SPLIT = [("dswiglu", torch.bfloat16, torch.bfloat16, True, 256, 2, "dense", 3),
          ("dgeglu", torch.float16, torch.float16, False, 128, 1, "dense", 4),
          ("dgeglu", torch.float32, torch.float32, True, 128, 1, "dense", 2),
          ("dswiglu", torch.bfloat16, torch.bfloat16, True, 256, 2, "discrete", 3)]


@needs_dsl
@pytest.mark.parametrize("act,c,d,dbias,tile_n,cluster_m,wm,split", _SPLIT,
                         ids=[f"{a}-C{_DT[c]}-D{_DT[d]}-dbias{int(db)}-t{t}-cl{cm}-{w}-x{x}"
                              for a, c, d, db, t, cm, w, x in _SPLIT])
def test_split_last_variant_compiles_for_sm90a(act, c, d, dbias, tile_n, cluster_m, wm, split,
                                               capfd):
    from cudnn_ext.engines.sm90 import COOPERATIVE_DEEP_KNOBS

    p = _problem(act=act, c=c, d=d, dbias=dbias, n=2048, k=7168, m=32768, weight_mode=wm,
                 b_major="n" if wm == "discrete" else "k")
    base = COOPERATIVE_DEEP_KNOBS.as_dict() if tile_n == 256 else dict(
        tile_n=tile_n, cooperative=True, raster_group_m=RASTER_GROUP_M[cluster_m])
    knobs = Knobs.of(**{**base, "cluster_m": cluster_m, "split_last": split})
    key = Sm90CompileKey.of(p, knobs)
    assert key.split_last == split and key != dataclasses.replace(key, split_last=1)
    assert _compile_checked(key, capfd) is not None


def test_split_last_knob_rules():
    """split_last: 1..4, cooperative only; refused by name before anything compiles."""
    from cudnn_ext.engines.sm90 import Sm90Plan

    p = _problem(n=512, k=1024)
    for bad in (Knobs.of(tile_n=128, split_last=2),
                Knobs.of(tile_n=256, cooperative=True, split_last=5),
                Knobs.of(tile_n=256, cooperative=True, split_last=0),
                Knobs.of(tile_n=64, cooperative=True, split_last=2, c_stages=3)):
        with pytest.raises(ValueError, match="split_last"):
            Sm90Plan(p, bad, Sm90CompileKey.of(p, bad), compiled=None)


@pytest.mark.parametrize("dbias", [True, False])
def test_split_last_workspace(dbias):
    """The scratch region: the dbias sums and counters, the split's int32 flags (one per
    slot and CTA of the cluster; both kept zero by launches: ``zeroed_region_bytes``), then
    128-byte aligned one 128 x tile_n fp32 partial sum per slot and CTA."""
    from cudnn_ext.engines.sm90 import Sm90Plan
    from cudnn_ext.kernels.sm90.dglu_kernel import SPLIT_SLOTS

    p = _problem(n=512, k=1024, L=3, dbias=dbias)
    for cl in (1, 2):
        knobs = Knobs.of(tile_n=256, cluster_m=cl, cooperative=True, split_last=3)
        plan = Sm90Plan(p, knobs, Sm90CompileKey.of(p, knobs), compiled=None)
        db = 3 * (2 * 512 + 2) if dbias else 0
        zero = db + SPLIT_SLOTS * cl
        assert plan.zeroed_region == 0 and plan.zeroed_region_bytes == 4 * zero
        assert plan.workspace_size == 4 * (-(-zero // 32) * 32 + SPLIT_SLOTS * cl * 128 * 256)
        off = Knobs.of(tile_n=256, cluster_m=cl, cooperative=True)
        plain = Sm90Plan(p, off, Sm90CompileKey.of(p, off), compiled=None)
        assert plain.workspace_size == 4 * db
    disc = _problem(n=512, k=1024, L=3, dbias=dbias, weight_mode="discrete")
    knobs = Knobs.of(tile_n=256, cluster_m=2, cooperative=True, split_last=2)
    plan = Sm90Plan(disc, knobs, Sm90CompileKey.of(disc, knobs), compiled=None)
    reqs = plan.workspace_requests()
    assert [r.name for r in reqs] == ["b_descriptors", "split_partials"]
    assert plan.zeroed_region == 128 * 3 and plan.zeroed_region_bytes == 4 * (
        (3 * (2 * 512 + 2) if dbias else 0) + SPLIT_SLOTS * 2)


def test_cooperative_is_selected_where_it_measured_faster():
    """Heuristics: the cooperative 128 x 256 schedule is ranked first for dense and
    per-expert weights (the shallow-K case: dense only), 16-bit C and D, N % 256 == 0 and
    enough tiles, where it measured faster than ping-pong: at K >= 5120 up to N 8192 with or
    without dbias (sessions 16, 22 and 24: dsv3, K 8192, K 12288, K 6144 at N 2048-8192, K
    5120 at N 2048-4096; slower at N 12288 and 16384 and at K 4096 N 2048; per-expert
    weights alike since session 25), at K 4096-5119 up to N 1024 (the 2-stage form;
    sessions 24 and 25: skew), and without dbias at K <= 2048 for C and D of different
    16-bit types (where ping-pong cannot take 64-row C entries). Everything else keeps
    ping-pong 128 x 128 in 2x1 clusters, with 64-row C entries where they apply. At deep K the cooperative form
    has 4 C stages per warpgroup and 3 A/B stages (session 20), else 2 and 4."""
    from cudnn_ext.engines.sm90 import COOPERATIVE_DEEP_KNOBS, COOPERATIVE_KNOBS

    eng = Sm90DgluEngine()

    def best(**kw):
        p = _problem(**{"n": 768, "k": 2048, "m": 16384, "L": 32, **kw})
        return min(eng.knob_space(p), key=lambda k: eng.cost(p, k))

    mixed = dict(c=torch.bfloat16, d=torch.float16)
    dsv3 = dict(k=7168, n=2048, L=8, m=32768)
    assert best(dbias=False, **mixed) == COOPERATIVE_KNOBS
    assert best(dbias=False, act="dgeglu", c=torch.float16, d=torch.bfloat16) == COOPERATIVE_KNOBS
    assert best(dbias=False, k=1416, **mixed) == COOPERATIVE_KNOBS
    # skew's K and N (session 24's part short), dense weights, with or without dbias
    for kw in (dict(dbias=True, k=4096, n=1024), dict(dbias=False, k=4096, n=1024),
               dict(dbias=True, k=5112, n=512, m=32768), dict(dbias=True, k=4096, n=768),
               dict(dbias=True, k=4096, n=1024, b_major="n"),
               dict(dbias=False, k=4096, n=1024, **mixed),
               # per-expert weights alike (session 25's part disc)
               dict(dbias=True, weight_mode="discrete", k=4096),
               dict(dbias=True, weight_mode="discrete", k=4096, n=1024),
               dict(dbias=False, weight_mode="discrete", b_major="n", k=5112, n=1024)):
        assert best(**kw) == COOPERATIVE_KNOBS, kw
    for kw in (dict(dbias=True, **dsv3), dict(dbias=False, **dsv3),
               dict(dbias=True, **{**dsv3, "k": 8192}), dict(dbias=True, **{**dsv3, "k": 12288}),
               dict(dbias=True, act="dgeglu", **dsv3), dict(dbias=True, **mixed, **dsv3),
               dict(dbias=True, c=torch.float16, d=torch.float16, **dsv3),
               dict(dbias=True, b_major="n", **dsv3),
               # per-expert weights at deep K (session 18)
               dict(dbias=True, weight_mode="discrete", **dsv3),
               dict(dbias=False, weight_mode="discrete", b_major="n", **dsv3),
               # ... and from K 5120 (session 25's part disc)
               dict(dbias=True, weight_mode="discrete", **{**dsv3, "k": 7160}),
               dict(dbias=False, weight_mode="discrete", **{**dsv3, "k": 5120}),
               dict(dbias=True, weight_mode="discrete", **{**dsv3, "k": 5120, "n": 8192}),
               # dense from K 6144 up to N 8192 (session 22's cross2), from K 5120
               # (session 24's cross3)
               dict(dbias=True, **{**dsv3, "k": 6144}),
               dict(dbias=True, **{**dsv3, "k": 5120}),
               dict(dbias=True, **{**dsv3, "k": 6144, "n": 8192}),
               dict(dbias=True, **{**dsv3, "n": 8192})):
        assert best(**kw) == COOPERATIVE_DEEP_KNOBS, kw
    split, whole = 2, 1
    for kw, c_split in ((dict(dbias=False), split),  # qwen3
                        (dict(dbias=False, c=torch.float16, d=torch.float16), split),
                        (dict(dbias=True), split),
                        (dict(dbias=True, k=4088, n=1024), split),  # just below skew's K
                        (dict(dbias=True, k=4096, n=1280), split),  # past N 1024
                        (dict(dbias=True, k=4096, n=640), split),  # N % 256 != 0
                        (dict(dbias=True, k=4096, n=1024, m=4096), split),  # too few tiles
                        (dict(dbias=True, k=4096, n=1024, d=torch.float32), whole),
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
                        (dict(dbias=False, d=torch.float32), whole),
                        (dict(dbias=True, d=torch.float32, **dsv3), whole),
                        (dict(dbias=False, c=torch.float32), whole),
                        (dict(dbias=False, n=96, **mixed), whole),
                        (dict(dbias=False, n=640, **mixed), whole),
                        (dict(dbias=True, **{**dsv3, "n": 1920}), split),  # N % 256 != 0
                        # 64 wide tiles: too few for 132 SMs
                        (dict(dbias=False, m=4096, n=512, **mixed), whole),
                        (dict(dbias=True, **{**dsv3, "m": 4096, "n": 512}), split)):
        choice = best(**kw)
        assert not choice.get("cooperative", False), (kw, choice)
        assert choice.get("tile_n") == 128 and choice.get("cluster_m") == 2
        assert choice.get("cluster_n", 1) == 1
        assert choice.get("c_split", 1) == c_split, (kw, choice)


#: The cooperative configurations the heuristics can select: C and D of different 16-bit
#: types without dbias at K <= 2048; any 16-bit C and D, dbias or not, at deep K (K >= 5120
#: and N <= 8192) and at K 4096-5119 and N <= 1024 (per-expert weights: the test below)
_COOP_SELECTABLE = [("dswiglu", torch.bfloat16, torch.float16, "k", False, 2048),
                    ("dgeglu", torch.float16, torch.bfloat16, "k", False, 2048),
                    ("dswiglu", torch.float16, torch.bfloat16, "n", False, 2048),
                    ("dgeglu", torch.bfloat16, torch.float16, "n", False, 2048),
                    ("dswiglu", torch.bfloat16, torch.bfloat16, "k", True, 4096),
                    ("dswiglu", torch.bfloat16, torch.bfloat16, "k", True, 7168),
                    ("dgeglu", torch.bfloat16, torch.bfloat16, "n", True, 7168),
                    ("dgeglu", torch.float16, torch.float16, "k", True, 7168),
                    ("dswiglu", torch.bfloat16, torch.float16, "k", True, 7168),
                    ("dswiglu", torch.bfloat16, torch.bfloat16, "k", False, 7168)]


def _coop_case_ids(cases):
    return [f"{a}-C{_DT[c]}-D{_DT[d]}-{b}major-dbias{int(db)}-K{k}" for a, c, d, b, db, k in cases]


@needs_dsl
@pytest.mark.parametrize("act,c,d,b_major,dbias,k", _COOP_SELECTABLE,
                         ids=_coop_case_ids(_COOP_SELECTABLE))
def test_selectable_cooperative_variant_compiles_for_sm90a(act, c, d, b_major, dbias, k, capfd):
    from cudnn_ext.engines.sm90 import cooperative_knobs

    p = _problem(act=act, c=c, d=d, dbias=dbias, n=512, k=k, m=32768, b_major=b_major)
    knobs = cooperative_knobs(p)
    assert knobs in Sm90DgluEngine().knob_space(p)
    assert knobs.get("c_stages") == (4 if k >= 5120 else 2)
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


#: Per-expert weights on the cooperative forms the heuristics pick (the deep one at K >= 5120,
#: the 2-stage one at K 4096-5119 up to N 1024): both activations, K- and N-major, dbias on and
#: off, bf16, fp16 and mixed 16-bit C and D
_DISC_COOP_SELECTABLE = [("dswiglu", torch.bfloat16, torch.bfloat16, "k", True, 7168),
                         ("dswiglu", torch.bfloat16, torch.bfloat16, "n", True, 7168),
                         ("dswiglu", torch.bfloat16, torch.bfloat16, "k", False, 7168),
                         ("dgeglu", torch.float16, torch.float16, "k", True, 5120),
                         ("dswiglu", torch.bfloat16, torch.bfloat16, "k", True, 4096),
                         ("dswiglu", torch.bfloat16, torch.bfloat16, "n", True, 4096),
                         ("dswiglu", torch.bfloat16, torch.bfloat16, "n", False, 4096),
                         ("dswiglu", torch.bfloat16, torch.float16, "n", True, 4096),
                         ("dgeglu", torch.float16, torch.bfloat16, "k", False, 4096)]


@needs_dsl
@pytest.mark.parametrize("act,c,d,b_major,dbias,k", _DISC_COOP_SELECTABLE,
                         ids=_coop_case_ids(_DISC_COOP_SELECTABLE))
def test_selectable_discrete_cooperative_variant_compiles_for_sm90a(act, c, d, b_major, dbias, k,
                                                                    capfd):
    """Per-expert weights (device-built descriptors) on the cooperative kernel, which the
    heuristics pick in the deep form at K >= 5120 (K >= 7168 from session 18 to 24) and in
    the 2-stage form at K 4096-5119 up to N 1024 (since session 25)."""
    from cudnn_ext.engines.sm90 import cooperative_knobs

    p = _problem(act=act, c=c, d=d, dbias=dbias, n=512, k=k, m=32768, weight_mode="discrete",
                 b_major=b_major)
    knobs = cooperative_knobs(p)
    assert min(Sm90DgluEngine().knob_space(p), key=lambda kn: Sm90DgluEngine().cost(p, kn)) == knobs
    assert knobs.get("c_stages") == (4 if k >= 5120 else 2)
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


@needs_dsl
@pytest.mark.parametrize("dbias,k,d,wm", [(False, 2048, torch.float16, "dense"),
                                         (True, 7168, torch.bfloat16, "dense"),
                                         (True, 4096, torch.bfloat16, "discrete")])
def test_selectable_cooperative_fresh_outputs_variant_compiles_for_sm90a(dbias, k, d, wm, capfd):
    """The functional torch op runs the fresh-outputs variant of whatever the heuristics pick."""
    from cudnn_ext.engines.sm90 import cooperative_knobs

    p = _problem(dbias=dbias, n=512, k=k, m=32768, c=torch.bfloat16, d=d, weight_mode=wm)
    knobs = cooperative_knobs(p)
    assert knobs in Sm90DgluEngine().knob_space(p)
    key = dataclasses.replace(Sm90CompileKey.of(p, knobs), init_outputs=True)
    assert key.cooperative
    assert _compile_checked(key, capfd) is not None


#: Ping-pong C ring entries of 64 rows (c_split 2), in the configurations of the GPU cases (tests/gpu/sm90_cases.c_half_cases)
_C_HALF = [(128, 2, 1, "dswiglu", True, torch.bfloat16, torch.bfloat16, "k"),
           (128, 1, 1, "dgeglu", False, torch.bfloat16, torch.bfloat16, "k"),
           (128, 2, 1, "dswiglu", True, torch.bfloat16, torch.float32, "k"),
           (128, 2, 2, "dgeglu", True, torch.bfloat16, torch.bfloat16, "k"),
           (64, 2, 1, "dswiglu", True, torch.float16, torch.float16, "k"),
           (128, 2, 1, "dgeglu", True, torch.bfloat16, torch.bfloat16, "n"),
           (64, 1, 2, "dswiglu", True, torch.bfloat16, torch.bfloat16, "k"),
           (128, 2, 1, "dgeglu", True, torch.float32, torch.bfloat16, "k")]


@needs_dsl
@pytest.mark.parametrize("tile_n,cluster_m,c_stages,act,dbias,c,d,b_major", _C_HALF,
                         ids=[f"t{t}-cl{cl}-c{cs}-{a}-dbias{int(db)}-C{_DT[c]}-D{_DT[d]}-{bm}"
                              for t, cl, cs, a, db, c, d, bm in _C_HALF])
def test_c_half_variant_compiles_for_sm90a(tile_n, cluster_m, c_stages, act, dbias, c, d,
                                           b_major, capfd):
    p = _problem(act=act, dbias=dbias, c=c, d=d, n=352, k=200, b_major=b_major)
    knobs = Knobs.of(tile_n=tile_n, c_stages=c_stages, stages=0,
                     raster_group_m=RASTER_GROUP_M[cluster_m], scheduler="static_persistent",
                     cluster_m=cluster_m, c_split=2)
    key = Sm90CompileKey.of(p, knobs)
    assert key.c_split == 2 and key.kernel_config().c_rows() == 64
    assert _compile_checked(key, capfd, 0 if d == c == torch.bfloat16 or d == c == torch.float16
                            else 32) is not None


@needs_dsl
@pytest.mark.parametrize("act,dbias", [("dswiglu", True), ("dgeglu", False)])
def test_c_half_in_2x2_clusters_compiles_for_sm90a(act, dbias, capfd):
    """64-row C ring entries in 2x2 clusters (A multicast too; the GPU cases' configuration):
    a knob to time against the engine's 2x1 choice, not offered by the engine."""
    p = _problem(act=act, dbias=dbias, n=352, k=200)
    knobs = Knobs.of(tile_n=128, stages=0, raster_group_m=RASTER_GROUP_M[2],
                     scheduler="static_persistent", cluster_m=2, cluster_n=2, c_split=2)
    assert knobs not in Sm90DgluEngine().knob_space(p)
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


@needs_dsl
@pytest.mark.parametrize("b_major,cluster_m,act,dbias", [("k", 2, "dswiglu", True),
                                                         ("n", 1, "dgeglu", True),
                                                         ("n", 2, "dswiglu", False),
                                                         ("k", 1, "dgeglu", False)])
def test_c_half_with_discrete_weights_compiles_for_sm90a(b_major, cluster_m, act, dbias, capfd):
    """64-row C ring entries with per-expert weights at K <= 2048: the engine's own tile-128
    knobs, K- and N-major, alone and in 2x1 clusters."""
    p = _problem(act=act, dbias=dbias, n=352, k=200, weight_mode="discrete", b_major=b_major)
    knobs = _engine_knobs(p, 128, cluster_m)
    assert knobs.get("c_split") == 2
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


@needs_dsl
def test_c_ring_deeper_than_a_tile_compiles_for_sm90a(capfd):
    """Without dbias a warpgroup may hold more C entries than a tile has (tile 32, 2 C
    stages): the D store then finds its tile from the FIFO position (c_producer's fallback)."""
    p = _problem(act="dgeglu", dbias=False, n=352, k=200)
    knobs = Knobs.of(tile_n=32, c_stages=2, stages=0, cluster_m=2,
                     raster_group_m=RASTER_GROUP_M[2], scheduler="static_persistent")
    assert _compile_checked(Sm90CompileKey.of(p, knobs), capfd) is not None


def test_c_split_is_ping_pong_only():
    import cutlass

    from cudnn_ext.kernels.sm90.dglu_kernel import GroupedDgluSm90, Sm90KernelConfig

    cfg = Sm90KernelConfig(n=512, k=64, ab_dtype=cutlass.BFloat16, c_dtype=cutlass.BFloat16,
                           d_dtype=cutlass.BFloat16, act_func="dswiglu", generate_dbias=True,
                           tile_n=256, cooperative=True, c_split=2)
    with pytest.raises(ValueError, match="c_split must be 1, or 2 in the ping-pong schedule"):
        GroupedDgluSm90(cfg)
    with pytest.raises(ValueError, match="c_split must be 1, or 2 .*got c_split=4"):
        GroupedDgluSm90(dataclasses.replace(cfg, cooperative=False, tile_n=128, c_split=4))


@needs_dsl
def test_folder_sums_the_cooperative_dbias_slots_folded_or_not():
    """The folder warp sums the cooperative dbias slots (session 17) wherever the cooperative
    kernel has dbias, folded in the kernel or not (the JAX path): then warp 3 runs, and the
    shared slot is one block's (64 columns, 8 warps). Ping-pong keeps its C producer
    hand-back, with a folder only to fold."""
    import cutlass

    from cudnn_ext.kernels.sm90.dglu_kernel import Sm90KernelConfig

    cfg = Sm90KernelConfig(n=512, k=7168, ab_dtype=cutlass.BFloat16, c_dtype=cutlass.BFloat16,
                           d_dtype=cutlass.BFloat16, act_func="dswiglu", generate_dbias=True,
                           tile_n=256, cooperative=True)
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


_BLOCKING_BARRIER = re.compile(
    r"^\s*(?:@!?%\w+\s+)?(?:bar|barrier)(?:\.cta)?\.(?:sync|red)\S*\s+([^,;]+?)(?:,\s*([^,;]+?))?"
    r"(?:,[^;]*)?;", re.M)


def _blocking_named_barriers(ptx: str) -> dict:
    """{thread count: [barrier operand of each blocking site]} over the PTX's blocking
    named-barrier instructions that name a thread count (bar.sync, barrier.sync,
    barrier.cta.sync, bar.red and their variants; arrives do not block)."""
    sites = {}
    for bid, count in _BLOCKING_BARRIER.findall(ptx):
        if count:
            sites.setdefault(count.strip(), []).append(bid.strip())
    return sites


@needs_dsl
@pytest.mark.parametrize("mode", ["walk", "chalf", "coop"])
def test_each_partial_barrier_blocks_at_one_instruction(mode, tmp_path):
    """An aligned named barrier (``bar.sync``) lets the threads that block in one generation
    do so at one instruction only; with two, compute-sanitizer's synccheck stopped the
    kernel (session 20: the ping-pong C producer and the dbias folder warp both blocked on
    the fold barrier, each from its own code). The PTX must not block on a partial barrier
    (one with a thread count) at two places with the same thread count: the check cannot
    tell register barrier ids apart, so it holds each count to one blocking site (the
    ping-pong turn barriers: one ``bar.sync`` of 256 threads, the other side arrives)."""
    from cudnn_ext.engines.sm90 import cooperative_knobs
    from cudnn_ext.kernels.sm90.launch import compile_kernel

    if mode == "coop":
        p = _problem(n=512, k=7168, m=32768)
        knobs = cooperative_knobs(p)
    else:
        p = _problem(n=480, k=136, m=16384, L=8)
        knobs = Knobs.of(tile_n=128, cluster_m=2, **({"c_split": 2} if mode == "chalf" else {}))
    key = Sm90CompileKey.of(p, knobs)
    assert key.generate_dbias and key.cooperative == (mode == "coop")
    compile_kernel(key.kernel_config(), tvm_ffi=key.tvm_ffi, ptx_dir=str(tmp_path))
    (ptx_file,) = tmp_path.glob("*.ptx")
    ptx = ptx_file.read_text()
    sites = _blocking_named_barriers(ptx)
    assert "bar.sync" in ptx or "barrier.sync" in ptx, "no barrier found: the parse is off"
    shared = {count: ids for count, ids in sites.items() if len(ids) > 1}
    assert not shared, f"partial barriers blocked at more than one place: {shared}"


def test_blocking_barrier_parse_sees_both_sides_of_a_shared_barrier():
    """The parse on the PTX of session 20's fold (before its fix), and on arrives."""
    ptx = """
	barrier.sync 	%r3394, 64;
	@%p5 bar.sync 	%r60, 256;
	bar.arrive %r448, 256;
	barrier.cta.arrive 7, 64;
	barrier.sync 	6, 64;
	bar.sync 	0;
"""
    assert _blocking_named_barriers(ptx) == {"64": ["%r3394", "6"], "256": ["%r60"]}
