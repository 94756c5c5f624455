"""Graph API on CPU with the reference engine: declaring, validating, building, executing.

Shapes are small (M <= 768, K = 32, N = 64, L = 3) so every test runs in milliseconds. A
failing comparison prints the seed from conftest's ``_fresh_seed`` fixture; rerun with
``pytest tests/unit/test_graph.py -k <name>`` and ``torch.manual_seed(<seed>)``.
"""
from __future__ import annotations

import pydantic
import pytest
import torch

import cudnn_ext as cudnn

M, K, N, L = 512, 32, 64, 3


def make_case(m=M, k=K, n=N, l=L, *, rank3=False, offsets=None):
    """Tensors of one valid BF16 dense call (default offsets for L=3, M=512: rows 0, 256, 256)."""
    b = (torch.randn(l, n, k) / k ** 0.5).bfloat16().permute(1, 2, 0)  # (N, K, L) K-major
    if offsets is None:
        offsets = [256 * (i + 1) * m // (256 * l) // 256 * 256 for i in range(l)]
        offsets[-1] = m
    t = dict(
        a=torch.randn(m, k).bfloat16(), b=b, c=torch.randn(m, 2 * n).bfloat16(),
        padded_offsets=torch.tensor(offsets, dtype=torch.int32), alpha=torch.rand(l) + 0.5,
        beta=torch.rand(l) + 0.5, prob=torch.rand(m),
    )
    if rank3:
        for name in ("a", "c"):
            t[name] = t[name].unsqueeze(-1)
        t["prob"] = t["prob"].view(m, 1, 1)
    return t


def build_graph(t, *, outputs=True, dynamic_m=True, **node_kw):
    """A graph declared from ``t`` with tensor_like; returns (graph, {port: descriptor})."""
    g = cudnn.Graph("test", io_data_type=torch.bfloat16, dynamic_m=dynamic_m)
    ins = {k: g.tensor_like(v, name=k.upper()) for k, v in t.items()}
    outs = g.grouped_matmul_dglu(**ins, **node_kw)
    descs = dict(ins)
    for port, d in outs._asdict().items():
        if d is not None:
            descs[port] = d.set_output(True) if outputs else d
    return g, descs


def output_buffers(t, descs, *, dtype=torch.bfloat16):
    out = {"d_row": torch.full(descs["d_row"].dim, float("nan"), dtype=descs["d_row"].dtype),
           "dprob": torch.zeros(descs["dprob"].dim)}
    if "dbias" in descs:
        out["dbias"] = torch.zeros(descs["dbias"].dim, dtype=torch.bfloat16)
    return out


def run_graph(g, descs, t, out, workspace=None):
    pack = {descs[k]: v for k, v in {**t, **out}.items()}
    g.execute(pack, workspace)
    return out


def wrapper_result(t, **kw):
    r = cudnn.grouped_gemm_dglu_wrapper(
        t["a"], t["c"], None, t["padded_offsets"], t["alpha"], t["beta"], t["prob"],
        torch.zeros(t["prob"].shape), b_tensor=t["b"], **kw)
    return r


# ----------------------------------------------------------------------------- declaring
def test_tensor_descriptors_are_frozen_pydantic_values():
    g = cudnn.Graph("g", io_data_type=torch.bfloat16)
    x = g.tensor(name="x", dim=(256, 32))
    assert isinstance(x, pydantic.BaseModel)
    assert x.stride == (32, 1) and x.data_type is cudnn.DataType.BFLOAT16 and x.dtype == torch.bfloat16
    with pytest.raises(pydantic.ValidationError):
        x.name = "y"
    y = g.tensor(name="y", dim=(4,), data_type="float32", uid=77)
    assert y.uid == 77 and y.data_type is cudnn.DataType.FLOAT
    z = g.tensor(dim=(4,), data_type=cudnn.DataType.INT32)
    assert z.uid not in (x.uid, 77) and z.name == f"tensor.{z.uid}"
    with pytest.raises(ValueError, match="uid 77 is already used by tensor 'y'"):
        g.tensor(name="w", dim=(1,), data_type=torch.float32, uid=77)
    with pytest.raises(ValueError, match="same rank"):
        g.tensor(name="bad", dim=(2, 2), stride=(1,))
    with pytest.raises(ValueError, match="data_type is required"):
        cudnn.Graph("no_io").tensor(name="q", dim=(2,))


def test_tensor_like_copies_geometry_and_device():
    g = cudnn.Graph("g")
    t = torch.empty(32, 512).t()  # (512, 32) column-major
    d = g.tensor_like(t, name="t")
    assert (d.dim, d.stride, d.dtype) == ((512, 32), (1, 512), torch.float32)
    assert g.device == torch.device("cpu")


def test_outputs_are_virtual_until_set_output_and_graph_keeps_the_truth():
    t = make_case()
    g, descs = build_graph(t, outputs=False, generate_dbias=True)
    assert descs["d_row"].is_virtual and descs["d_row"].dim == (M, 2 * N)
    assert descs["dbias"].dim == (L, 2 * N) and descs["dbias"].dtype == torch.bfloat16
    assert descs["dprob"].dtype == torch.float32
    with pytest.raises(ValueError, match=r"output 'd_row' .* is virtual.*set_output\(True\)"):
        g.validate()
    new = descs["d_row"].set_output(True)
    assert not new.is_virtual and new.uid == descs["d_row"].uid
    assert not g.tensor_by_uid(new.uid).is_virtual
    descs["dprob"].set_output(True)
    descs["dbias"].set_output(True)
    g.validate()


def test_rank3_inputs_give_vendor_shaped_outputs():
    t = make_case(rank3=True)
    g, descs = build_graph(t, generate_dbias=True)
    assert descs["d_row"].dim == (M, 2 * N, 1) and descs["dbias"].dim == (L, 2 * N, 1)
    assert descs["dprob"].dim == (M, 1, 1)
    out = run_graph(g, descs, t, output_buffers(t, descs))
    ref = wrapper_result({k: v for k, v in t.items()}, generate_dbias=True)
    assert torch.equal(out["d_row"], ref["d_row_tensor"])
    assert torch.equal(out["dbias"], ref["dbias_tensor"])


def test_node_attributes_are_a_typed_model():
    t = make_case()
    g = cudnn.Graph("g")
    ins = {k: g.tensor_like(v, name=k) for k, v in t.items()}
    with pytest.raises(pydantic.ValidationError, match="generate_dbias"):
        g.grouped_matmul_dglu(**ins, generate_dbias="yes")
    g.grouped_matmul_dglu(**ins, act_func="dgeglu", geglu_alpha=1.5)
    node = g.nodes[0]
    assert isinstance(node.attrs, cudnn.graph.GroupedMatmulDgluAttrs)
    assert node.attrs.act_func == "dgeglu" and node.attrs.geglu_alpha == 1.5
    with pytest.raises(NotImplementedError, match="one grouped_matmul_dglu node"):
        g.grouped_matmul_dglu(**ins)


def test_ports_take_descriptors_of_this_graph_only():
    t = make_case()
    g, other = cudnn.Graph("g"), cudnn.Graph("other")
    ins = {k: g.tensor_like(v, name=k) for k, v in t.items()}
    with pytest.raises(TypeError, match="pass a descriptor"):
        g.grouped_matmul_dglu(**{**ins, "a": t["a"]})
    with pytest.raises(ValueError, match="declared by another graph"):
        g.grouped_matmul_dglu(**{**ins, "c": other.tensor_like(t["c"], name="c")})


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("change, exc, words", [
    (dict(a=torch.randn(300, K).bfloat16()), ValueError, ["a_tensor: M (rows) must be a multiple of 256", "'A'"]),
    (dict(b=torch.randn(L, N, K + 8).bfloat16().permute(1, 2, 0)), ValueError, ["b_tensor: K must equal", "'B'"]),
    (dict(c=torch.randn(M, 2 * N + 64).bfloat16()), ValueError, ["c_tensor: shape must be (M, 2N)", "'C'"]),
    (dict(alpha=torch.rand(L).double()), TypeError, ["alpha_tensor: dtype must be one of {float32}"]),
    (dict(padded_offsets=torch.zeros(L + 1, dtype=torch.int32)), ValueError, ["padded_offsets: shape must be (L,)"]),
    (dict(a=torch.randn(K, M).bfloat16().t()), ValueError, ["a_tensor: must be row-major"]),
    (dict(a=torch.randn(M, K).half()), TypeError, ["mixed dtype families"]),
])
def test_validate_reports_contract_errors_with_port_and_tensor(change, exc, words):
    t = {**make_case(), **change}
    g, _ = build_graph(t)
    with pytest.raises(exc) as info:
        g.validate()
    msg = str(info.value)
    assert "grouped_matmul_dglu node" in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("node_kw, exc, words", [
    (dict(act_func="drelu"), ValueError, "act_func: must be one of"),
    (dict(act_func="dgeglu", glu_clamp_min=3.0, glu_clamp_max=1.0), ValueError, "need glu_clamp_min < glu_clamp_max"),
    (dict(geglu_alpha=-1.0), ValueError, "geglu_alpha: must be finite and > 0"),
    (dict(n=64), ValueError, "dense mode (b_tensor) forbids n"),
    (dict(b_major="m"), ValueError, "b_major: must be one of"),
])
def test_validate_reports_attribute_errors_from_the_contract(node_kw, exc, words):
    g, _ = build_graph(make_case(), **node_kw)
    with pytest.raises(exc, match=None) as info:
        g.validate()
    assert words in str(info.value)


def test_validate_rejects_both_or_neither_weights_and_unused_tensors():
    t = make_case()
    g = cudnn.Graph("g")
    ins = {k: g.tensor_like(v, name=k) for k, v in t.items()}
    ptrs = g.tensor(name="ptrs", dim=(L,), data_type=torch.int64)
    outs = g.grouped_matmul_dglu(**ins, b_ptrs=ptrs, n=N)
    for d in outs[:2]:
        d.set_output(True)
    with pytest.raises(ValueError, match="not both"):
        g.validate()
    g2 = cudnn.Graph("g2")
    ins2 = {k: g2.tensor_like(v, name=k) for k, v in t.items()}
    g2.tensor(name="stray", dim=(3,), data_type=torch.float32)
    for d in g2.grouped_matmul_dglu(**ins2)[:2]:
        d.set_output(True)
    with pytest.raises(ValueError, match="not used by any node: 'stray'"):
        g2.validate()
    with pytest.raises(ValueError, match="no node"):
        cudnn.Graph("empty").validate()


def test_compute_data_type_must_be_float32():
    t = make_case()
    g = cudnn.Graph("g", compute_data_type=torch.float16)
    ins = {k: g.tensor_like(v, name=k) for k, v in t.items()}
    for d in g.grouped_matmul_dglu(**ins)[:2]:
        d.set_output(True)
    with pytest.raises(TypeError, match="acc_dtype: must be float32"):
        g.validate()


# ----------------------------------------------------------------------------- pipeline
def test_pipeline_in_vendor_order_matches_the_wrapper():
    t = make_case()
    g, descs = build_graph(t, generate_dbias=True)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.HeurMode.A, cudnn.HeurMode.FALLBACK])
    assert g.get_execution_plan_count() >= 1
    assert g.check_support() is True
    g.build_plans(cudnn.BuildPlanPolicy.HEURISTICS_CHOICE)
    assert g.engine_name == "reference"
    assert g.get_workspace_size() == 0
    out = run_graph(g, descs, t, output_buffers(t, descs))
    ref = wrapper_result(t, generate_dbias=True)
    assert torch.equal(out["d_row"], ref["d_row_tensor"][..., 0])
    assert torch.equal(out["dprob"], ref["dprob_tensor"])
    assert torch.equal(out["dbias"], ref["dbias_tensor"][..., 0])


def test_planning_is_one_shot_and_freezes_the_graph():
    g, descs = build_graph(make_case())
    g.create_execution_plans()
    with pytest.raises(RuntimeError, match="one-shot"):
        g.create_execution_plans()
    with pytest.raises(RuntimeError, match="frozen"):
        g.tensor(name="late", dim=(1,), data_type=torch.float32)
    with pytest.raises(RuntimeError, match="frozen"):
        descs["d_row"].set_output(False)


def test_execute_builds_on_demand_and_keys_by_name_or_uid():
    t = make_case()
    g, descs = build_graph(t, act_func="dgeglu")
    out = output_buffers(t, descs)
    pack = {descs[k].name: v for k, v in t.items()}
    pack.update({descs["d_row"].uid: out["d_row"], descs["dprob"].uid: out["dprob"]})
    g.execute(pack)
    ref = wrapper_result(t, act_func="dgeglu")
    assert torch.equal(out["d_row"], ref["d_row_tensor"][..., 0])


@pytest.mark.parametrize("m_run", [256, 768])
def test_dynamic_m(m_run):
    t = make_case(m=M)
    g, descs = build_graph(t)
    g.build()
    run = make_case(m=m_run, offsets=[m_run // 2 // 256 * 256, m_run // 2 // 256 * 256, m_run])
    run["b"], run["alpha"], run["beta"] = t["b"], t["alpha"], t["beta"]
    out = {"d_row": torch.empty(m_run, 2 * N, dtype=torch.bfloat16), "dprob": torch.zeros(m_run)}
    run_graph(g, descs, run, out)
    ref = wrapper_result(run)
    assert torch.equal(out["d_row"], ref["d_row_tensor"][..., 0])
    assert torch.equal(out["dprob"], ref["dprob_tensor"])


def test_static_m_rejects_another_m():
    t = make_case()
    g, descs = build_graph(t, dynamic_m=False)
    run = make_case(m=256, offsets=[0, 0, 256])
    out = {"d_row": torch.empty(256, 2 * N, dtype=torch.bfloat16), "dprob": torch.zeros(256)}
    with pytest.raises(ValueError, match="dynamic_m=False"):
        run_graph(g, descs, {**run, "b": t["b"]}, out)


def test_discrete_weights_through_b_ptrs():
    t = make_case()
    weights = [t["b"][:, :, e].contiguous() for e in range(L)]
    ptrs = torch.tensor([w.data_ptr() for w in weights], dtype=torch.int64)
    g = cudnn.Graph("discrete")
    ins = {k: g.tensor_like(v, name=k) for k, v in t.items() if k != "b"}
    ins["b_ptrs"] = g.tensor_like(ptrs, name="ptrs")
    outs = g.grouped_matmul_dglu(**ins, n=N)
    d_row, dprob = outs.d_row.set_output(True), outs.dprob.set_output(True)
    assert g.problem.weight_mode == "discrete"
    out = {"d_row": torch.empty(M, 2 * N, dtype=torch.bfloat16), "dprob": torch.zeros(M)}
    pack = {ins[k]: t[k] for k in ins if k != "b_ptrs"}
    pack.update({ins["b_ptrs"]: ptrs, d_row: out["d_row"], dprob: out["dprob"]})
    g.execute(pack)
    ref = wrapper_result(t)
    assert torch.equal(out["d_row"], ref["d_row_tensor"][..., 0])


def test_graph_device_defaults_and_problem_device():
    g, _ = build_graph(make_case())
    assert g.problem.device_type == "cpu"
    g2 = cudnn.Graph("meta-only", io_data_type=torch.bfloat16, device="cpu")
    assert g2.device == torch.device("cpu")


# ----------------------------------------------------------------------------- one path
def test_wrapper_and_class_api_run_through_a_graph(graph_executions):
    seen = graph_executions
    t = make_case()
    wrapper_result(t)
    run = make_case(m=768, offsets=[256, 512, 768])
    run.update(b=t["b"], alpha=t["alpha"], beta=t["beta"])
    wrapper_result(run)
    assert len(seen) == 2 and seen[0] is seen[1], "a new M must reuse the memoized graph"
    assert seen[0].problem.m == M and seen[0].engine_name == "reference"

    d_row, dprob = torch.empty(M, 2 * N, dtype=torch.bfloat16), torch.zeros(M)
    op = cudnn.GroupedGemmDglu(t["a"], t["c"], d_row, None, None, t["padded_offsets"], t["alpha"], t["beta"],
                               t["prob"], dprob, sample_b=t["b"])
    op.execute(t["a"], t["c"], d_row, None, None, t["padded_offsets"], t["alpha"], t["beta"], t["prob"], dprob,
               b_tensor=t["b"])
    assert len(seen) == 3 and seen[2] is op._graph and op._plan is op._graph.execution_plan
    assert torch.equal(d_row, wrapper_result(t)["d_row_tensor"][..., 0])


@pytest.mark.parametrize("act_func,dbias", [("dgeglu", True), ("dswiglu", False), ("dgeglu", False)])
def test_call_graph_declares_the_same_problem(act_func, dbias):
    """The wrapper and the class API adopt the contract's problem for the graph they declare
    (one validation per call); the declaration, validated as any graph is, gives it back."""
    from cudnn_ext import contract
    from cudnn_ext.graph.from_call import declare_call_graph

    t = make_case()
    problem, pack = contract.normalize(
        contract.Operands(a=t["a"], c=t["c"], padded_offsets=t["padded_offsets"], alpha=t["alpha"], beta=t["beta"],
                          prob=t["prob"], dprob=torch.zeros(M), b=t["b"]),
        contract.CallConfig(act_func=act_func, linear_offset=0.25 if act_func == "dgeglu" else None),
        generate_dbias=dbias)
    g = declare_call_graph(problem, pack, validate=True)
    assert g.problem == problem
    assert declare_call_graph(problem, pack).problem is problem
    assert {d.name for d in g.tensors} >= {"a", "b", "c", "d_row", "dprob"} | ({"dbias"} if dbias else set())


def test_one_descriptor_may_feed_two_input_ports():
    """alpha and beta from one tensor: the variant pack fills both ports from it."""
    t = make_case()
    t["beta"] = t["alpha"]
    g = cudnn.Graph("shared", io_data_type=torch.bfloat16)
    ins = {k: g.tensor_like(v, name=k.upper()) for k, v in t.items() if k != "beta"}
    outs = g.grouped_matmul_dglu(**ins, beta=ins["alpha"])
    descs = {**ins, **{p: d.set_output(True) for p, d in outs._asdict().items() if d is not None}}
    out = output_buffers(t, descs)
    del t["beta"]
    run_graph(g, descs, t, out)
    want = cudnn.grouped_gemm_dglu_wrapper(
        t["a"], t["c"], None, t["padded_offsets"], t["alpha"], t["alpha"].clone(), t["prob"],
        torch.zeros(t["prob"].shape), b_tensor=t["b"])
    assert torch.equal(out["d_row"], want["d_row_tensor"].view_as(out["d_row"]))
    assert torch.equal(out["dprob"], want["dprob_tensor"])


def test_declaration_errors_are_typed_and_named():
    t = make_case()
    g = cudnn.Graph("alias", io_data_type=torch.bfloat16)
    ins = {k: g.tensor_like(v, name=k.upper()) for k, v in t.items()}
    outs = g.grouped_matmul_dglu(**ins, d_row=ins["c"])  # D written over C: refused at validate
    outs.dprob.set_output(True)
    with pytest.raises(ValueError, match="output 'd_row' is tensor 'C'.*also input 'c'"):
        g.validate()
    with pytest.raises(TypeError, match="dim: expected a sequence of ints, got 5"):
        cudnn.Graph("g", io_data_type=torch.bfloat16).tensor(name="x", dim=5)
    with pytest.raises(TypeError, match="stride: expected a sequence of ints, got 5"):
        cudnn.Graph("g", io_data_type=torch.bfloat16).tensor(name="x", dim=(256, 64), stride=5)
    with pytest.raises(ValueError, match="device: expected a torch.device.*'tpu'"):
        cudnn.Graph("g", device="tpu")


def test_two_outputs_may_not_share_a_descriptor_and_shared_inputs_bind_by_name():
    t = make_case()
    g = cudnn.Graph("two-out", io_data_type=torch.bfloat16)
    ins = {k: g.tensor_like(v, name=k.upper()) for k, v in t.items()}
    d = g.tensor(name="D", dim=(M, 2 * N), data_type=torch.bfloat16)
    outs = g.grouped_matmul_dglu(**ins, d_row=d, dprob=d)
    with pytest.raises(ValueError, match="output 'dprob' is tensor 'D'.*also output 'd_row'"):
        g.validate()
    # alpha and beta from one descriptor: keyed by its name, the pack binds both ports
    t = make_case()
    t["beta"] = t["alpha"]
    g = cudnn.Graph("shared-by-name", io_data_type=torch.bfloat16)
    ins = {k: g.tensor_like(v, name=k.upper()) for k, v in t.items() if k != "beta"}
    outs = g.grouped_matmul_dglu(**ins, beta=ins["alpha"])
    for o in outs._asdict().values():
        if o is not None:
            o.set_output(True)
    del t["beta"]
    out = {"D_ROW": torch.zeros(M, 2 * N, dtype=torch.bfloat16), "DPROB": torch.zeros(M)}
    g.execute({**{k.upper(): v for k, v in t.items()}, outs.d_row: out["D_ROW"], outs.dprob: out["DPROB"]})
    assert out["DPROB"].abs().sum() > 0
