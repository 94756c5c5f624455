"""Plans on CPU: heuristics ordering and declines (with a fake engine registered here), the
workspace layout and its checks, variant-pack binding errors, serialization round trips."""
from __future__ import annotations

import json
import struct

import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext.engines import heuristics, registry
from cudnn_ext.engines.base import CompiledPlan, Engine, Knobs
from cudnn_ext.runtime.workspace import WorkspaceRequest
from cudnn_ext.errors import EngineDeclined, NoEngineError
from cudnn_ext.graph import serialize as serdes
from cudnn_ext.runtime.workspace import WorkspaceLayout
from cudnn_ext.reference.grouped_dglu import grouped_dglu_reference
from test_graph import L, M, N, build_graph, make_case, output_buffers, run_graph, wrapper_result


class FakePlan(CompiledPlan):
    def __init__(self, engine, problem, knobs):
        self.engine_name, self.problem, self.knobs, self.engine = engine.name, problem, knobs, engine

    def workspace_requests(self):
        p = self.problem
        return [WorkspaceRequest("sched_counter", 4), WorkspaceRequest("b_descriptors", 128 * p.num_experts),
                WorkspaceRequest("dbias_partials", 4 * p.num_experts * 2 * p.n, 256)]

    def execute(self, pack, workspace=None, stream=None):
        self.engine.calls.append((self.knobs, workspace))
        grouped_dglu_reference(self.problem, pack)


class FakeEngine(Engine):
    """Cheaper than the reference by its cost model; can decline or fail to build on request."""

    name = "fake_fast"
    engine_id = 29900

    def __init__(self, reasons=(), build_error=None):
        self.reasons, self.build_error, self.calls = list(reasons), build_error, []

    def check_support(self, problem):
        return list(self.reasons)

    def knob_space(self, problem):
        return [Knobs.of(tile_n=64), Knobs.of(tile_n=128)]

    def cost(self, problem, knobs):
        return 1.0 if knobs.get("tile_n") == 128 else 2.0

    def build(self, problem, knobs):
        if self.build_error is not None:
            raise self.build_error
        return FakePlan(self, problem, knobs)


@pytest.fixture
def fake():
    holder = {}

    def install(**kw):
        eng = FakeEngine(**kw)
        registry.register_engine(eng, first=True)
        holder["eng"] = eng
        return eng

    yield install
    registry.unregister_engine(FakeEngine.name)


def planned(t=None, **node_kw):
    t = t or make_case()
    g, descs = build_graph(t, **node_kw)
    return t, g, descs


# ----------------------------------------------------------------------------- heuristics
def test_mode_a_ranks_by_cost_and_fallback_is_the_reference(fake):
    fake()
    _, g, _ = planned()
    g.create_execution_plans([cudnn.HeurMode.A, cudnn.HeurMode.FALLBACK])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    assert names[:2] == ["fake_fast[tile_n=128]", "fake_fast[tile_n=64]"]
    assert names[2] == "reference[compute=float32]" and names[3] == "reference[compute=float64]"
    assert len(names) == 4  # FALLBACK's reference plan is a duplicate of A's: first position kept
    g.build_plans()
    assert g.engine_name == "fake_fast" and g.execution_plan.knobs.get("tile_n") == 128


def test_fallback_alone_and_strings_still_work(fake):
    fake()
    _, g, _ = planned()
    g.create_execution_plans([cudnn.HeurMode.FALLBACK])
    assert [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())] == ["reference[compute=float32]"]
    problem = g.problem
    assert [c.engine.name for c in heuristics.rank(problem, ("A",))][:1] == ["fake_fast"]
    with pytest.raises(ValueError, match="heuristics mode: expected 'A', 'B' or 'FALLBACK', got 'C'"):
        heuristics.rank(problem, ("C",))


def test_mode_b_ranks_as_mode_a(fake):
    """The vendor's Python engines rank mode B as A (docs/vendor_contract.md §5.3); its tests'
    helpers name ``cudnn.heur_mode.B`` at import time."""
    fake()
    _, g, _ = planned()
    names = lambda modes: [(c.engine.name, c.knobs) for c in heuristics.rank(g.problem, modes)]
    assert cudnn.heur_mode.B == "B"
    assert names([cudnn.heur_mode.B]) == names([cudnn.heur_mode.A])
    assert names([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK]) == names(["A", "FALLBACK"])


def test_no_engine_error_lists_every_engines_reason(fake):
    fake(reasons=["needs a Hopper GPU", "tile_n 128 needs N % 128"])
    _, g, _ = planned()
    with pytest.raises(NoEngineError) as info:
        g.create_execution_plans(engines=["fake_fast"])
    msg = str(info.value)
    assert "fake_fast: needs a Hopper GPU; tile_n 128 needs N % 128" in msg
    assert info.value.declines == {"fake_fast": ["needs a Hopper GPU", "tile_n 128 needs N % 128"]}
    # the graph is not left frozen by a failed plan
    g.tensor(name="ok", dim=(1,), data_type=torch.float32)


def test_declined_engine_is_skipped_and_every_decline_listed(fake):
    fake(reasons=["declines for the test"])
    _, g, _ = planned()
    g.create_execution_plans()
    assert all("fake" not in g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count()))
    reasons = heuristics.decline_reasons(g.problem, registry.ENGINES)
    assert reasons["fake_fast"] == ["declines for the test"] and "reference" not in reasons


def test_build_walks_past_a_build_time_decline_but_a_pinned_plan_raises(fake):
    fake(build_error=EngineDeclined("fake_fast", ["compiler says no"]))
    t, g, descs = planned()
    g.create_execution_plans()
    g.build_plans()
    assert g.engine_name == "reference"
    _, g2, _ = planned(t)
    g2.create_execution_plans()
    g2.select_plan(0)
    with pytest.raises(EngineDeclined, match="compiler says no"):
        g2.build_plans()


def test_a_bug_in_an_engine_is_not_a_decline(fake):
    fake(build_error=RuntimeError("engine bug"))
    _, g, _ = planned()
    with pytest.raises(RuntimeError, match="engine bug"):
        g.build()


def test_deselect_engines_and_select_plan(fake):
    fake()
    _, g, _ = planned()
    g.create_execution_plans()
    g.deselect_engines(["fake"])
    g.build_plans()
    assert g.engine_name == "reference"
    _, g2, _ = planned()
    g2.create_execution_plans()
    g2.select_plan(3)
    g2.build_plans()
    assert g2.execution_plan.knobs.get("compute") == "float64"
    with pytest.raises(IndexError, match=r"plan index: must be in \[0, 4\)"):
        g2.select_plan(9)


def test_build_all_keeps_the_selection(fake):
    fake()
    _, g, _ = planned()
    g.create_execution_plans()
    g.build_plans(cudnn.BuildPlanPolicy.ALL)
    assert g.engine_name == "fake_fast" and len(g._plans.built) == 4


def test_autotune_refuses_on_cpu_and_keeps_the_heuristic_choice():
    t, g, descs = planned()
    g.build()
    before = g.get_plan_name_at_index(g._plans.index)
    with pytest.raises(RuntimeError, match="autotune: timing candidates needs a CUDA GPU"):
        g.autotune({descs[k]: v for k, v in {**t, **output_buffers(t, descs)}.items()})
    assert g.get_plan_name_at_index(g._plans.index) == before


@pytest.mark.gpu
def test_autotune_on_gpu_selects_the_fastest():
    t = {k: v.cuda() for k, v in make_case().items()}
    g, descs = build_graph(t)
    out = {k: v.cuda() for k, v in output_buffers(t, descs).items()}
    dprob_before = out["dprob"].clone()
    times = g.autotune({descs[k]: v for k, v in {**t, **out}.items()}, top_k=2, iters=2)
    assert times and all(ms > 0 for _, ms in times)
    assert g.get_plan_name_at_index(g._plans.index) == min(times, key=lambda x: x[1])[0]
    assert torch.equal(out["dprob"], dprob_before)


# ----------------------------------------------------------------------------- workspace
def test_workspace_layout_accounting():
    lay = WorkspaceLayout.of([WorkspaceRequest("sched_counter", 4), WorkspaceRequest("b_descriptors", 128 * 3),
                              WorkspaceRequest("empty", 0), WorkspaceRequest("dbias_partials", 4 * 3 * 128, 256)])
    assert [(r.name, r.offset, r.nbytes) for r in lay.regions] == [
        ("sched_counter", 0, 4), ("b_descriptors", 128, 384), ("dbias_partials", 512, 1536)]
    assert lay.size == 2048
    assert WorkspaceLayout.of([]).size == 0
    assert WorkspaceLayout.of([("x", 1)]).size == 128
    ws = torch.zeros(lay.size, dtype=torch.uint8)
    assert lay.view(ws, "dbias_partials", torch.float32).shape == (384,)
    with pytest.raises(ValueError, match="requested twice"):
        WorkspaceLayout.of([("x", 4), ("x", 4)])


def test_default_workspace_request_from_workspace_size():
    class SizedPlan(CompiledPlan):
        workspace_size = 1000

        def execute(self, pack, workspace=None, stream=None):
            pass

    lay = WorkspaceLayout.of(SizedPlan().workspace_requests())
    assert [(r.name, r.offset, r.nbytes) for r in lay.regions] == [("scratch", 0, 1000)] and lay.size == 1024


def test_plan_workspace_is_checked_and_passed_to_the_engine(fake):
    eng = fake()
    t, g, descs = planned(generate_dbias=True)
    g.build()
    need = 2048 + 128 * 0  # counter@0, 3 descriptors@128, dbias partials (3 x 128 fp32)@512 (256-aligned)
    assert g.get_workspace_size() == need
    assert [r.name for r in g.execution_plan.layout.regions] == ["sched_counter", "b_descriptors", "dbias_partials"]
    pack = {descs[k]: v for k, v in {**t, **output_buffers(t, descs)}.items()}
    with pytest.raises(ValueError, match=r"workspace: this plan needs 2048 bytes .*got None"):
        g.execute(pack)
    with pytest.raises(ValueError, match="workspace: needs at least 2048 bytes"):
        g.execute(pack, torch.empty(100, dtype=torch.uint8))
    with pytest.raises(TypeError, match="workspace: dtype must be uint8"):
        g.execute(pack, torch.empty(2048, dtype=torch.float32))
    alias = _aligned_bytes(4096)
    overlapping = dict(pack)
    overlapping[descs["dprob"]] = alias[:M * 4].view(torch.float32).zero_()
    with pytest.raises(ValueError, match="workspace: must not overlap dprob"):
        g.execute(overlapping, alias)
    ws = _aligned_bytes(need)
    g.execute(pack, ws)
    assert eng.calls[-1][1] is ws


def _aligned_bytes(n):
    """A 128-byte aligned uint8 buffer (the workspace rule; CPU allocations are only 64-B aligned)."""
    raw = torch.empty(n + 128, dtype=torch.uint8)
    return raw[(-raw.data_ptr()) % 128:][:n]


# ----------------------------------------------------------------------------- variant pack
def _pack(t, descs, **replace):
    out = output_buffers(t, descs)
    pack = {descs[k]: v for k, v in {**t, **out}.items()}
    for k, v in replace.items():
        pack[descs[k]] = v
    return pack


@pytest.mark.parametrize("edit, exc, words", [
    (lambda t, d, p: p.pop(d["c"]), ValueError, "variant pack: missing a tensor for tensor 'C' (uid 3, port c)"),
    (lambda t, d, p: p.update({d["alpha"]: torch.rand(L + 1)}), ValueError,
     "tensor 'ALPHA' (uid 5, port alpha): shape must be (3,) as declared, got (4,)"),
    (lambda t, d, p: p.update({d["c"]: torch.randn(M, 2 * N).half()}), TypeError,
     "tensor 'C' (uid 3, port c): dtype must be bfloat16 as declared, got float16"),
    (lambda t, d, p: p.update({d["c"]: torch.randn(2 * N, M).bfloat16().t()}), ValueError,
     "stride must be (128, 1) as declared"),
    (lambda t, d, p: p.update({d["c"]: torch.randn(M, 2 * N + 2).bfloat16()}), ValueError,
     "shape must be (M,) + (128,) as declared"),
    (lambda t, d, p: p.update({d["prob"]: torch.rand(M + 256)}), ValueError,
     "has M = 768 rows but tensor 'A' (uid 1, port a) has M = 512"),
    (lambda t, d, p: p.update({d["a"]: torch.randn(300, 32).bfloat16()}), ValueError,
     "M (rows) must be a multiple of 256, got M = 300"),
    (lambda t, d, p: p.update({d["a"]: "not a tensor"}), TypeError, "expected a torch.Tensor, got str"),
    (lambda t, d, p: p.update({"NOPE": t["a"]}), KeyError, "no tensor named 'NOPE'"),
    (lambda t, d, p: p.update({999: t["a"]}), KeyError, "no bound tensor has uid 999"),
    (lambda t, d, p: p.update({"A": torch.randn(M, 32).bfloat16()}), ValueError, "bound twice"),
    (lambda t, d, p: p.update({d["a"]: torch.randn(M * 32 + 1).bfloat16()[1:].view(M, 32)}), ValueError,
     "data pointer must be 16-byte aligned"),
])
def test_variant_pack_binding_errors(edit, exc, words):
    t, g, descs = planned()
    g.build()
    pack = _pack(t, descs)
    edit(t, descs, pack)
    with pytest.raises(exc) as info:
        g.execute(pack)
    assert words in str(info.value), str(info.value)


def test_variant_pack_rejects_a_descriptor_of_another_graph():
    t, g, descs = planned()
    _, other = build_graph(t)
    pack = _pack(t, descs)
    pack[other["a"]] = pack.pop(descs["a"])
    with pytest.raises(ValueError, match="belongs to another graph"):
        g.execute(pack)


def test_unit_dim_strides_do_not_matter():
    t = make_case(rank3=True)
    g, descs = build_graph(t)
    run = dict(t)
    run["a"] = t["a"][..., 0].clone().unsqueeze(-1).as_strided(t["a"].shape, (32, 1, 7))  # any stride on the unit dim
    out = output_buffers(t, descs)
    run_graph(g, descs, run, out)
    assert torch.equal(out["d_row"][..., 0], wrapper_result(t)["d_row_tensor"][..., 0])


# ----------------------------------------------------------------------------- serialization
def test_serialize_deserialize_execute_round_trip():
    t, g, descs = planned(generate_dbias=True, act_func="dgeglu", linear_offset=0.5)
    g.create_execution_plans()
    g.select_plan(1)  # the float64 reference: knobs must survive the trip
    g.build_plans()
    out1 = run_graph(g, descs, t, output_buffers(t, descs))
    blob = g.serialize()
    assert blob.startswith(serdes.MAGIC) and isinstance(blob, bytes)
    g2 = cudnn.deserialize_plan(blob)
    assert g2.engine_name == "reference" and g2.execution_plan.knobs == g.execution_plan.knobs
    assert g2.problem == g.problem
    out2 = output_buffers(t, descs)
    g2.execute({descs[k].name: v for k, v in {**t, **out2}.items()})
    for k in out1:
        assert torch.equal(out1[k], out2[k]), k
    assert g2.serialize() == blob


def test_header_is_pydantic_json_with_graph_engine_device_and_versions():
    _, g, _ = planned()
    g.build()
    header = serdes.read_header(g.serialize())
    assert header.format == serdes.FORMAT_VERSION
    assert header.plan.engine_name == "reference" and header.plan.engine_id == 20000
    assert header.plan.knobs == [("compute", "float32")]
    assert header.device.type == "cpu"
    assert header.library_versions["cudnn_ext"] == cudnn.__version__ and "torch" in header.library_versions
    assert [t.name for t in header.graph.tensors][:2] == ["A", "B"]
    assert header.graph.nodes[0].attrs.act_func == "dswiglu"


def _rewrite(blob, edit):
    n = struct.unpack_from("<Q", blob, 20)[0]
    head = json.loads(blob[28:28 + n])
    edit(head)
    body = json.dumps(head).encode()
    return blob[:16] + struct.pack("<IQ", 1, len(body)) + body


@pytest.mark.parametrize("edit, words", [
    (lambda b: b"NOT_A_PLAN" + b, "not a cudnn_ext plan"),
    (lambda b: b[:16] + struct.pack("<I", 99) + b[20:], "plan format version 99, this cudnn_ext reads version 1"),
    (lambda b: b[:40], "truncated plan"),
    (lambda b: _rewrite(b, lambda h: h["library_versions"].update(cudnn_ext="0.0.1")),
     "plan was made by cudnn_ext 0.0.1"),
    # an architecture no machine has, so the refusal is the same on CPU-only and GPU hosts
    (lambda b: _rewrite(b, lambda h: h.update(device={"type": "cuda", "name": "Fake GPU", "capability": [1, 0]},
                                              graph={**h["graph"], "device": "cuda"})),
     "plan was built for cuda sm_10 (Fake GPU)"),
    (lambda b: _rewrite(b, lambda h: h["plan"].update(engine_id=12345)), "unknown engine id 12345"),
    (lambda b: _rewrite(b, lambda h: h["plan"].update(engine_name="renamed")), "recorded 'renamed'"),
])
def test_deserialize_refuses_mismatches_clearly(edit, words):
    _, g, _ = planned()
    g.build()
    with pytest.raises(cudnn.PlanFormatError) as info:
        cudnn.deserialize_plan(edit(g.serialize()))
    assert words in str(info.value), str(info.value)


def test_deserialize_does_not_run_heuristics(fake, monkeypatch):
    _, g, _ = planned()
    g.build()
    blob = g.serialize()
    fake()  # now a cheaper engine exists; the plan must still be the recorded one

    def boom(*a, **k):
        raise AssertionError("heuristics ran")

    monkeypatch.setattr(heuristics, "rank", boom)
    assert cudnn.deserialize_plan(blob).engine_name == "reference"


def test_serialized_fake_engine_plan_declines_on_rebuild(fake):
    eng = fake()
    _, g, _ = planned()
    g.build()
    blob = g.serialize()
    eng.reasons.append("this machine lost its GPU")
    with pytest.raises(EngineDeclined, match="this machine lost its GPU"):
        cudnn.deserialize_plan(blob)
