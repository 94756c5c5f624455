"""Block-scaled (MXFP8 / NVFP4) graphs on CPU with the reference engine: declaring the
scale-factor ports, validation through the block-scaled contract, binding scale factors at
another M (6-D view or flat packed form), executing against the wrapper, serializing.

Small shapes (M <= 1024, K <= 128, N <= 64, L = 3). Random data comes from conftest's
``_fresh_seed`` (printed on failure); rerun with ``pytest tests/unit/test_graph_blockscaled.py -k
<name>`` after ``torch.manual_seed(<seed>)``.
"""
from __future__ import annotations

import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext.quant import quantize_mxfp8, quantize_nvfp4
from cudnn_ext.quant.sf_layout import empty_sf, sf_k_blocks, storage_of

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
N, K, L = 64, 128, 3


def mxfp8_case(m=768, offsets=(256, 256, 512), n=N, k=K):
    """Operands of a valid MXFP8 dense call: rows past offsets[-1] stay untouched."""
    a_q, sfa = quantize_mxfp8(torch.randn(m, k))
    b_q, sfb = quantize_mxfp8((torch.randn(L, n, k) * 0.2).permute(1, 2, 0))
    return dict(a=a_q, b=b_q, sfa=sfa, sfb=sfb, c=(torch.randn(m, 2 * n) * 2).bfloat16(),
                padded_offsets=torch.tensor(offsets, dtype=torch.int32), alpha=torch.rand(L) + 0.5,
                beta=torch.rand(L) + 0.5, prob=torch.rand(m), norm_const=torch.tensor([2.0]))


def nvfp4_case(m=768, offsets=(256, 256, 512), n=32, k=64):
    a_q, sfa = quantize_nvfp4(torch.randn(m, k))
    b_q, sfb = quantize_nvfp4((torch.randn(L, n, k) * 0.2).permute(1, 2, 0))
    return dict(a=a_q, b=b_q, sfa=sfa, sfb=sfb, c=(torch.randn(m, 2 * n) * 2).bfloat16(),
                padded_offsets=torch.tensor(offsets, dtype=torch.int32), alpha=torch.rand(L) + 0.5,
                beta=torch.rand(L) + 0.5)


def declare(t, **node_kw):
    """A graph declared from ``t`` with tensor_like; returns (graph, {port: descriptor})."""
    g = cudnn.Graph("bs", io_data_type=E4M3)
    ins = {p: g.tensor_like(v, name=p.upper()) for p, v in t.items()}
    outs = g.grouped_matmul_dglu(**ins, **node_kw)
    descs = dict(ins)
    for port, d in outs._asdict().items():
        if d is not None:
            descs[port] = d.set_output(True)
    return g, descs


def outputs_for(t, descs):
    """Output buffers at the bound M (c's rows): D poisoned, accumulators at their identity."""
    m, two_n = t["c"].shape
    out = {}
    if "d_row" in descs:
        out["d_row"] = torch.full((m, two_n), float("nan")).to(descs["d_row"].dtype)
    if "d_col" in descs:
        out["d_col"] = torch.full((m, two_n), float("nan")).to(descs["d_col"].dtype)
        out["sfd_row"] = empty_sf(m, sf_k_blocks(two_n, 32), dtype=E8M0, fill=0xFF)
        out["sfd_col"] = empty_sf(two_n, sf_k_blocks(m, 32), dtype=E8M0, fill=0xFF)
    if "dprob" in descs:
        out["dprob"] = torch.zeros(m)
    if "dbias" in descs:
        out["dbias"] = torch.zeros(descs["dbias"].dim, dtype=torch.bfloat16)
    if "amax" in descs:
        out["amax"] = torch.full(descs["amax"].dim, float("-inf"))
    return out


def execute(g, descs, t, out):
    g.execute({descs[p]: v for p, v in {**t, **out}.items()})
    return out


def wrapper(t, **kw):
    return cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["padded_offsets"],
        alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t.get("prob"),
        dprob_tensor=torch.zeros(t["c"].shape[0]) if "prob" in t else None, b_tensor=t["b"],
        sfb_tensor=t["sfb"], norm_const_tensor=t.get("norm_const"), **kw)


def bits(x):
    return x.contiguous().view(torch.uint8) if x.element_size() == 1 else x


def assert_written_equal(out, ref, last):
    """Equal bit for bit on the rows the operation writes (rows < last)."""
    assert torch.equal(bits(out["d_row"][:last]), bits(ref["d_row_tensor"][..., 0][:last]))
    if "d_col" in out:
        assert torch.equal(bits(out["d_col"][:last]), bits(ref["d_col_tensor"][..., 0][:last]))
        a, b = storage_of(out["sfd_row"]), storage_of(ref["sfd_row_tensor"])
        assert torch.equal(bits(a[:, : last // 128]), bits(b[:, : last // 128]))
        a, b = storage_of(out["sfd_col"]), storage_of(ref["sfd_col_tensor"])
        assert torch.equal(bits(a[:, :, : last // 128]), bits(b[:, :, : last // 128]))
    if "dprob" in out:
        assert torch.equal(out["dprob"][:last], ref["dprob_tensor"].view(-1)[:last])
    if "dbias" in out:
        assert torch.equal(out["dbias"], ref["dbias_tensor"][..., 0])
    if "amax" in out:
        assert torch.equal(out["amax"], ref["amax_tensor"][..., 0])


# ----------------------------------------------------------------------------- declaring
def test_block_scaled_ports_and_inferred_outputs():
    t = mxfp8_case()
    g, d = declare(t, sf_vec_size=32, generate_dbias=True)
    node = g.nodes[0]
    assert set(node.inputs) == {"a", "b", "sfa", "sfb", "c", "padded_offsets", "alpha", "beta", "prob",
                                "norm_const"}
    assert set(node.outputs) == {"d_row", "d_col", "sfd_row", "sfd_col", "dprob", "dbias"}
    assert d["d_row"].data_type is cudnn.DataType.FP8_E4M3 and d["d_col"].dim == (768, 2 * N)
    want = empty_sf(768, 2 * N // 32, dtype=E8M0, device="meta")
    assert d["sfd_row"].dim == tuple(want.shape) and d["sfd_row"].stride == tuple(want.stride())
    assert d["sfd_row"].data_type is cudnn.DataType.FP8_E8M0
    assert d["sfd_col"].dim == tuple(empty_sf(2 * N, 768 // 32, dtype=E8M0, device="meta").shape)
    assert g.problem.block_scale.generate_sfd and g.problem.block_scale.sf_vec_size == 32


def test_optional_prob_dprob_and_amax_outputs():
    t = nvfp4_case()
    g, d = declare(t, generate_dprob=False, generate_amax=True, d_dtype=torch.bfloat16)
    assert "dprob" not in g.nodes[0].outputs and d["amax"].dim == (L, 2)
    p = g.problem
    assert not p.has_prob and not p.has_dprob and p.block_scale.generate_amax
    assert not p.block_scale.generate_sfd and p.d_dtype == torch.bfloat16


@pytest.mark.parametrize("node_kw,change,exc,words", [
    (dict(sf_vec_size=16), None, ValueError, ["sf_vec_size", "MXFP8"]),
    (dict(sf_vec_size=32), "drop_sfa", ValueError, ["sfa_tensor", "required"]),
    (dict(sf_vec_size=32), "sfa_short", ValueError, ["sfa_tensor", "port 'sfa'", "512*RMN*RK*L"]),
    (dict(sf_vec_size=32, epilogue_op="relu"), None, NotImplementedError, ["epilogue_op"]),
    (dict(sf_vec_size=32, d_dtype=torch.bfloat16), None, TypeError, ["d_dtype", "FP8 operands"]),
])
def test_validate_runs_the_block_scaled_contract(node_kw, change, exc, words):
    t = mxfp8_case()
    if change == "drop_sfa":
        del t["sfa"]
    elif change == "sfa_short":
        t["sfa"] = torch.zeros(100, dtype=E8M0)
    g, _ = declare(t, **node_kw)
    with pytest.raises(exc) as err:
        g.validate()
    msg = str(err.value)
    assert "grouped_matmul_dglu node" in msg and all(w in msg for w in words), msg


def test_quantized_outputs_need_norm_const():
    t = mxfp8_case()
    del t["norm_const"]
    g = cudnn.Graph("bs", io_data_type=E4M3)
    ins = {p: g.tensor_like(v, name=p) for p, v in t.items()}
    d_col = g.tensor(name="d_col", dim=(768, 2 * N), data_type=E4M3)
    with pytest.raises(ValueError, match="d_col: an output tensor was given but no norm_const"):
        g.grouped_matmul_dglu(**ins, d_col=d_col, sf_vec_size=32)


# ----------------------------------------------------------------------------- executing
def test_mxfp8_graph_matches_the_wrapper_bit_for_bit():
    t = mxfp8_case()
    g, d = declare(t, sf_vec_size=32, generate_dbias=True, act_func="dgeglu")
    g.build()
    assert g.engine_name == "reference"
    out = execute(g, d, t, outputs_for(t, d))
    ref = wrapper(t, sf_vec_size=32, generate_dbias=True, act_func="dgeglu")
    assert_written_equal(out, ref, last=512)
    assert torch.isnan(out["d_row"][512:].float()).all(), "rows past the last offset must stay untouched"


@pytest.mark.parametrize("flat", [False, True], ids=["6d", "flat"])
def test_scale_factors_bind_at_another_m(flat):
    """Dynamic M: the SF layouts are re-derived from the bound M (6-D view or flat bytes)."""
    decl = mxfp8_case(m=768)
    g, d = declare(decl, sf_vec_size=32)
    g.build()
    run = mxfp8_case(m=1024, offsets=(256, 512, 768))
    run.update(b=decl["b"], sfb=decl["sfb"])
    out = outputs_for(run, d)
    if flat:  # the vendor's canonical form: the packed bytes, any contiguous shape
        run = dict(run, sfa=storage_of(run["sfa"]).reshape(-1))
        out = dict(out, sfd_row=storage_of(out["sfd_row"]).reshape(-1),
                   sfd_col=storage_of(out["sfd_col"]).reshape(8, -1))
    execute(g, d, run, out)
    ref = wrapper(run, sf_vec_size=32)
    if flat:  # compare through the 6-D views of the same bytes
        from cudnn_ext.quant.sf_layout import as_sf_6d

        out["sfd_row"] = as_sf_6d(out["sfd_row"], mn=1024, k_blocks=2 * N // 32)
        out["sfd_col"] = as_sf_6d(out["sfd_col"], mn=2 * N, k_blocks=1024 // 32)
    assert_written_equal(out, ref, last=768)


@pytest.mark.parametrize("edit,exc,words", [
    ("sfa_of_other_m", ValueError, ["port sfa", "shape mismatch", "mn=1024"]),
    ("sfa_flat_short", ValueError, ["port sfa", "512*RMN*RK*L", "mn=1024"]),
    ("sfd_col_of_other_m", ValueError, ["port sfd_col", "k_blocks=32"]),
    ("sfb_dtype", TypeError, ["port sfb", "float8_e8m0fnu as declared"]),
    ("sfa_device", ValueError, ["port sfa", "must be on cpu"]),
])
def test_scale_factor_binding_errors(edit, exc, words):
    decl = mxfp8_case(m=768)
    g, d = declare(decl, sf_vec_size=32)
    run = mxfp8_case(m=1024, offsets=(256, 512, 768))
    out = outputs_for(run, d)
    if edit == "sfa_of_other_m":
        run["sfa"] = decl["sfa"]  # laid out for M = 768
    elif edit == "sfa_flat_short":
        run["sfa"] = storage_of(decl["sfa"]).reshape(-1)
    elif edit == "sfd_col_of_other_m":
        out["sfd_col"] = empty_sf(2 * N, 768 // 32, dtype=E8M0)
    elif edit == "sfb_dtype":
        run["sfb"] = run["sfb"].view(torch.uint8).view(E4M3)
    elif edit == "sfa_device":
        run["sfa"] = run["sfa"].to("meta")
    with pytest.raises(exc) as err:
        g.bind({d[p]: v for p, v in {**run, **out}.items()})
    msg = str(err.value)
    assert msg.startswith("variant pack: tensor ")
    assert all(w in msg for w in words), msg


def test_nvfp4_without_prob_with_amax_matches_the_wrapper():
    t = nvfp4_case()
    g, d = declare(t, generate_dprob=False, generate_amax=True, d_dtype=torch.bfloat16, generate_dbias=True)
    out = execute(g, d, t, outputs_for(t, d))
    ref = wrapper(t, generate_dbias=True)  # the wrapper makes amax for bf16 D
    assert ref["dprob_tensor"] is None
    assert_written_equal(out, ref, last=512)
    assert torch.isinf(out["amax"][1]).all(), "an empty expert keeps -inf"


def test_discrete_block_scaled_graph():
    t = mxfp8_case()
    experts = [quantize_mxfp8(torch.randn(N, K) * 0.2) for _ in range(L)]
    keep = [(q.contiguous(), storage_of(sf).contiguous()) for q, sf in experts]
    t.pop("b"), t.pop("sfb")
    t["b_ptrs"] = torch.tensor([q.data_ptr() for q, _ in keep], dtype=torch.int64)
    t["sfb_ptrs"] = torch.tensor([sf.data_ptr() for _, sf in keep], dtype=torch.int64)
    g, d = declare(t, sf_vec_size=32, n=N)
    assert g.problem.weight_mode == "discrete" and g.problem.ab_dtype == E4M3
    out = execute(g, d, t, outputs_for(t, d))
    ref = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["padded_offsets"],
        alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=torch.zeros(768),
        b_ptrs=t["b_ptrs"], sfb_ptrs=t["sfb_ptrs"], n=N, b_dtype=E4M3, sf_vec_size=32,
        norm_const_tensor=t["norm_const"])
    assert_written_equal(out, ref, last=512)
    del keep


# ----------------------------------------------------------------------------- serialization
@pytest.mark.parametrize("scalars,act", [(torch.float32, "dsituglu"), (torch.bfloat16, "dswiglu"),
                                         (torch.float16, "dsituglu")])
def test_block_scaled_serialize_round_trip(scalars, act):
    t = mxfp8_case()
    t["alpha"], t["beta"] = t["alpha"].to(scalars), t["beta"].to(scalars)  # 16-bit: docs/vendor_contract.md §3.5
    g, d = declare(t, sf_vec_size=32, generate_dbias=True, act_func=act, situ_beta1=3.0)
    g.create_execution_plans()
    g.select_plan(1)  # float64 reference: knobs survive
    g.build_plans()
    out1 = execute(g, d, t, outputs_for(t, d))
    blob = g.serialize()
    g2 = cudnn.deserialize_plan(blob)
    assert g2.problem == g.problem and g2.execution_plan.knobs == g.execution_plan.knobs
    assert (g2.problem.block_scale.alpha_dtype, g2.problem.block_scale.beta_dtype) == (scalars, scalars)
    assert {x.name: x.dim for x in g2.tensors}[d["sfd_row"].name] == d["sfd_row"].dim
    out2 = outputs_for(t, d)
    g2.execute({d[p].name: v for p, v in {**t, **out2}.items()})
    for k in out1:
        assert torch.equal(bits(out1[k]), bits(out2[k])), k
    assert g2.serialize() == blob


# ----------------------------------------------------------------------------- one path
def test_block_scaled_wrapper_and_class_api_run_through_a_graph(graph_executions):
    seen = graph_executions
    t = mxfp8_case()
    wrapper(t, sf_vec_size=32)
    run = mxfp8_case(m=1024, offsets=(256, 512, 768))
    run.update(b=t["b"], sfb=t["sfb"])
    wrapper(run, sf_vec_size=32)
    assert len(seen) == 2 and seen[0] is seen[1], "a new M must reuse the memoized block-scaled graph"
    assert seen[0].problem.is_block_scaled and seen[0].problem.m == 768

    d_row, d_col = torch.empty(768, 2 * N, 1, dtype=E4M3), torch.empty(768, 2 * N, 1, dtype=E4M3)
    sfd_row = empty_sf(768, 2 * N // 32, dtype=E8M0)
    sfd_col = empty_sf(2 * N, 768 // 32, dtype=E8M0)
    dprob = torch.zeros(768)
    kw = dict(d_col=d_col, sfa=t["sfa"], padded_offsets=t["padded_offsets"], alpha=t["alpha"], beta=t["beta"],
              prob=t["prob"], dprob=dprob, sfb=t["sfb"], sfd_row=sfd_row, sfd_col=sfd_col,
              norm_const=t["norm_const"])
    op = cudnn.GroupedGemmDglu(t["a"], t["c"], d_row, sample_b=t["b"], sf_vec_size=32,
                               **{f"sample_{k}": v for k, v in kw.items()})
    assert op.check_support()
    op.execute(t["a"], t["c"], d_row, b_tensor=t["b"], **{f"{k}_tensor" if k not in ("padded_offsets",) else k: v
                                                          for k, v in kw.items()})
    assert len(seen) == 3 and seen[2] is op._graph and op._graph.problem.is_block_scaled
    ref = wrapper(t, sf_vec_size=32)
    assert torch.equal(bits(d_row[..., 0][:512]), bits(ref["d_row_tensor"][..., 0][:512]))


def test_docs_block_scaled_example_runs():
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "graph.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "mxfp8_bwd" in b]
    assert len(blocks) == 1
    scope = {}
    exec(compile(blocks[0], "docs/graph.md", "exec"), scope)
    assert scope["g"].problem.block_scale.generate_sfd and scope["bufs"]["dprob"].abs().sum() > 0
