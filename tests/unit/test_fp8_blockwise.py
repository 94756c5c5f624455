"""The fp8_blockwise recipe (``recipe="fp8_blockwise"``) on the reference engine: e4m3 operands
with fp32 1x128 / 128x128 block scales through the wrapper, the class API and a graph, against
the float64 oracle on the dequantized operands (exact products), dense K- and N-major and
per-expert pointer weights, every activation, any-size groups; its errors; the engines that
decline it."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from fp8_blockwise_cases import E4M3, TOL, K, L, N, case, reference, rel

import cudnn_ext as cudnn
from cudnn_ext import contract
from cudnn_ext.engines.registry import engine_by_name
from cudnn_ext.errors import DtypeError
from cudnn_ext.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise

def run_wrapper(t, act="dswiglu", **kw):
    dprob = torch.zeros(t["m"])
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offsets"], alpha_tensor=t["alpha"],
        beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=dprob, generate_dbias=True,
        d_dtype=torch.float32, act_func=act, recipe="fp8_blockwise", **({"b_tensor": t["b"], "sfb_tensor": t["sfb"]}
                                                                     | kw))
    return out["d_row_tensor"][..., 0], out["dprob_tensor"], out["dbias_tensor"][..., 0]


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu", "dsituglu"])
@pytest.mark.parametrize("n_major", [False, True], ids=["k_major", "n_major"])
def test_wrapper_dense_matches_the_oracle(act, n_major):
    t = case(n_major=n_major)
    d, dprob, dbias = run_wrapper(t, act)
    ref = reference(t, act)
    end = int(t["offsets"][-1])
    assert rel(d, ref["d"], end) < TOL
    assert rel(dprob, ref["dprob"], end) < TOL
    assert ((dbias.double() - ref["dbias"]).abs() <= 1e-2 * ref["dbias"].abs() + 1e-3).all()  # bf16 dbias


def test_a_misplaced_scale_moves_d_past_the_tolerance():
    """The tolerance is tighter than the effects it guards: one A row's scale block, or one
    expert's B scales, applied elsewhere change D by orders of magnitude more."""
    t = case()
    end = int(t["offsets"][-1])
    ref = reference(t)
    moved = dict(t, sfa=t["sfa"].clone())
    moved["sfa"][0, 0], moved["sfa"][0, 1] = t["sfa"][0, 1], t["sfa"][0, 0]
    assert rel(run_wrapper(moved)[0], ref["d"], end) > 100 * TOL
    flipped = torch.empty_strided(t["sfb"].shape, t["sfb"].stride()).copy_(t["sfb"].flip(-1))  # experts' scales swapped
    moved = dict(t, sfb=flipped)
    assert rel(run_wrapper(moved)[0], ref["d"], end) > 100 * TOL


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
def test_wrapper_pointer_tables_and_any_size_groups(act):
    t = case(sizes=(100, 0, 7), extra_rows=5)
    w = [t["b"][..., e].contiguous() for e in range(L)]
    s = [t["sfb"][..., e].t().contiguous().t() for e in range(L)]  # each MN-major (Nb, Kb)
    b_ptrs = torch.tensor([x.data_ptr() for x in w], dtype=torch.int64)
    sfb_ptrs = torch.tensor([x.data_ptr() for x in s], dtype=torch.int64)
    d, dprob, _ = run_wrapper(t, act, m_aligned=1, b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs, n=N, b_dtype=E4M3,
                              b_tensor=None, sfb_tensor=None)
    ref = reference(t, act)
    end = int(t["offsets"][-1])
    assert rel(d, ref["d"], end) < TOL and rel(dprob, ref["dprob"], end) < TOL


def test_class_api_and_graph_serialization():
    t = case()
    m = t["m"]
    d = torch.full((m, 2 * N), float("nan"))
    dprob = torch.zeros(m)
    op = cudnn.GroupedGemmDglu(
        sample_a=t["a"], sample_c=t["c"], sample_d_row=d, sample_d_col=None, sample_sfa=t["sfa"],
        sample_padded_offsets=t["offsets"], sample_alpha=t["alpha"], sample_beta=t["beta"], sample_prob=t["prob"],
        sample_dprob=dprob, sample_b=t["b"], sample_sfb=t["sfb"], act_func="dgeglu", recipe="fp8_blockwise")
    assert op.check_support() and op.engine_name == "reference"
    op.execute(a_tensor=t["a"], c_tensor=t["c"], d_row_tensor=d, d_col_tensor=None, sfa_tensor=t["sfa"],
               padded_offsets=t["offsets"], alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"],
               dprob_tensor=dprob, b_tensor=t["b"], sfb_tensor=t["sfb"])
    ref = reference(t, "dgeglu")
    end = int(t["offsets"][-1])
    assert rel(d, ref["d"], end) < TOL and torch.isnan(d[end:]).all()  # rows past the last offset untouched
    blob = op._graph.serialize()
    g2 = cudnn.deserialize_plan(blob)
    assert g2._nodes[0].attrs.recipe == "fp8_blockwise" and g2.serialize() == blob


def test_a_graph_binds_scales_at_another_m():
    t = case()
    g = cudnn.Graph("fp8bw")
    ins = {p: g.tensor_like(t[k], name=p) for p, k in (("a", "a"), ("b", "b"), ("sfa", "sfa"), ("sfb", "sfb"),
                                                         ("c", "c"), ("padded_offsets", "offsets"),
                                                         ("alpha", "alpha"), ("beta", "beta"), ("prob", "prob"))}
    outs = g.grouped_matmul_dglu(**ins, recipe="fp8_blockwise", d_dtype=torch.float32)
    for desc in (outs.d_row, outs.dprob):
        desc.set_output(True)
    g.build([cudnn.HeurMode.A, cudnn.HeurMode.FALLBACK])
    small = case(sizes=(256, 0, 256), extra_rows=0, seed=3)  # another M: sfa is (512, 3), MN-major
    d = torch.full((small["m"], 2 * N), float("nan"))
    dprob = torch.zeros(small["m"])
    g.execute({ins["a"]: small["a"], ins["b"]: small["b"], ins["sfa"]: small["sfa"], ins["sfb"]: small["sfb"],
               ins["c"]: small["c"], ins["padded_offsets"]: small["offsets"], ins["alpha"]: small["alpha"],
               ins["beta"]: small["beta"], ins["prob"]: small["prob"], outs.d_row: d, outs.dprob: dprob},
              torch.empty(g.get_workspace_size(), dtype=torch.uint8))
    assert rel(d, reference(small)["d"], small["m"]) < TOL
    with pytest.raises(ValueError, match="MN-major"):
        g.execute({ins["a"]: small["a"], ins["b"]: small["b"], ins["sfa"]: small["sfa"].contiguous(),
                   ins["sfb"]: small["sfb"], ins["c"]: small["c"], ins["padded_offsets"]: small["offsets"],
                   ins["alpha"]: small["alpha"], ins["beta"]: small["beta"], ins["prob"]: small["prob"],
                   outs.d_row: d, outs.dprob: dprob}, torch.empty(g.get_workspace_size(), dtype=torch.uint8))


def _err(t, **kw):
    args = dict(a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offsets"],
                alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=torch.zeros(t["m"]),
                b_tensor=t["b"], sfb_tensor=t["sfb"], recipe="fp8_blockwise")
    args.update(kw)
    return cudnn.grouped_gemm_dglu_wrapper(**args)


@pytest.mark.parametrize("kw,err,match", [
    (dict(recipe="fp8"), ValueError, r"recipe: must be one of \['fp8_blockwise'\], got 'fp8'"),
    (dict(recipe=None), DtypeError, r"sfa_tensor: .*got float32; float32 scales per 1x128 block are cudnn_ext's "
                                    r"fp8_blockwise recipe: pass recipe='fp8_blockwise'"),
    (dict(norm_const_tensor=torch.ones(1)), ValueError, r"norm_const_tensor: recipe='fp8_blockwise' has no"),
    (dict(round_dgrad_to_input_dtype=True), ValueError, r"round_dgrad_to_input_dtype: recipe='fp8_blockwise'"),
    (dict(sfb_ptrs=torch.zeros(L, dtype=torch.int64)), ValueError, r"sfb_ptrs: dense mode"),
])
def test_errors_name_the_argument_and_the_rule(kw, err, match):
    with pytest.raises(err, match=match):
        _err(case(), **kw)


def test_operand_and_scale_errors():
    t = case()
    with pytest.raises(DtypeError, match=r"a_tensor: recipe='fp8_blockwise' takes float8_e4m3fn A, got bfloat16"):
        _err(t, a_tensor=torch.zeros(t["m"], K, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"sfa_tensor: scales must be MN-major"):
        _err(t, sfa_tensor=t["sfa"].contiguous())
    with pytest.raises(ValueError, match=r"sfa_tensor: expected shape \(1024, 3\)"):
        _err(t, sfa_tensor=t["sfa"][:, :2])
    with pytest.raises(TypeError, match=r"sfb_tensor: fp8_blockwise scales must be float32"):
        _err(t, sfb_tensor=t["sfb"].double())
    short = case(k=256)
    with pytest.raises(ValueError, match=r"a_tensor: K must be a positive multiple of 128"):
        _err(short, a_tensor=short["a"][:, :200].contiguous(),
             sfa_tensor=quantize_fp8_blockwise(torch.ones(short["m"], 200))[1])
    with pytest.raises(ValueError, match=r"act_func: 'dsituglu' is supported by the block-scaled contract .* and "
                                          r"the fp8_blockwise recipe only, got it with BF16 operands"):
        cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=torch.zeros(256, 64, dtype=torch.bfloat16), c_tensor=torch.zeros(256, 64, dtype=torch.bfloat16),
            sfa_tensor=None, padded_offsets=torch.tensor([256], dtype=torch.int32), alpha_tensor=torch.ones(1),
            beta_tensor=torch.ones(1), prob_tensor=torch.ones(256), dprob_tensor=torch.zeros(256),
            b_tensor=torch.zeros(32, 64, 1, dtype=torch.bfloat16), act_func="dsituglu")


def test_the_hopper_and_vendor_engines_decline_with_a_reason():
    t = case()
    ops = contract.Operands(a=t["a"], c=t["c"], sfa=t["sfa"], padded_offsets=t["offsets"], alpha=t["alpha"],
                            beta=t["beta"], prob=t["prob"], dprob=torch.zeros(t["m"]), b=t["b"], sfb=t["sfb"])
    problem, _ = contract.normalize(ops, contract.CallConfig(recipe="fp8_blockwise"))
    assert problem.recipe == "fp8_blockwise" and not problem.is_block_scaled and problem.ab_dtype == E4M3
    assert any("recipe 'fp8_blockwise' is not implemented on sm90" in r
               for r in engine_by_name("sm90_cutedsl").check_support(problem))
    assert any("recipe 'fp8_blockwise' is cudnn_ext's" in r for r in engine_by_name("vendor_sm100").check_support(problem))
    assert engine_by_name("sm90_blockscaled").check_support(problem)
    assert engine_by_name("reference").check_support(problem) == []
    # the recipe's own Hopper engine: dense K-major B with a 16/32-bit or e4m3 D on a GPU
    fp8 = engine_by_name("sm90_fp8_blockwise")
    assert fp8.check_support(dataclasses.replace(problem, device_type="cuda")) == []
    assert fp8.check_support(dataclasses.replace(problem, device_type="cuda", d_dtype=E4M3, m_aligned=128)) == []
    assert fp8.check_support(dataclasses.replace(problem, device_type="cuda", deterministic=True)) == []
    for change, reason in ((dict(weight_mode="discrete"), "weight_mode 'discrete'"),
                           (dict(b_major="n"), "K-major B only"), (dict(d_dtype=torch.float64), "D dtype"),
                           (dict(k=200), "K % 128 == 0"),
                           ({}, "not cuda")):
        why = fp8.check_support(dataclasses.replace(problem, **{"device_type": "cuda", **change} if change else {}))
        assert any(reason in r for r in why), (change, why)
    assert fp8.check_support(dataclasses.replace(problem, recipe=None)) == ["not the fp8_blockwise recipe (recipe None)"]


def test_fp8_d_is_the_recipe_applied_to_the_fp32_d():
    """An e4m3 D: D_row/SFD_row (1x128 along 2N) and D_col/SFD_col (128x1 along M) are, bit for
    bit, quantize_fp8_blockwise of the fp32 D the same call gives, below the last offset."""
    t = case()
    end = int(t["offsets"][-1])
    d32, _, _ = run_wrapper(t)
    dprob = torch.zeros(t["m"])
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offsets"], alpha_tensor=t["alpha"],
        beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=dprob, b_tensor=t["b"], sfb_tensor=t["sfb"],
        generate_dbias=True, d_dtype=E4M3, recipe="fp8_blockwise")
    q_row, s_row = quantize_fp8_blockwise(d32[:end], (1, 128))
    q_col, s_col = quantize_fp8_blockwise(d32[:end], (128, 1))
    assert torch.equal(out["d_row_tensor"][:end, :, 0].view(torch.uint8), q_row.view(torch.uint8))
    assert torch.equal(out["d_col_tensor"][:end, :, 0].view(torch.uint8), q_col.view(torch.uint8))
    assert torch.equal(out["sfd_row_tensor"][:end], s_row) and torch.equal(out["sfd_col_tensor"][:end // 128], s_col)
    assert out["sfd_row_tensor"].stride() == (1, t["m"]) and out["sfd_col_tensor"].stride()[0] == 1


def _class_fp8_d(t, **outs):
    op = cudnn.GroupedGemmDglu(
        sample_a=t["a"], sample_c=t["c"], sample_d_row=outs["d_row"], sample_d_col=outs.get("d_col"),
        sample_sfa=t["sfa"], sample_padded_offsets=t["offsets"], sample_alpha=t["alpha"], sample_beta=t["beta"],
        sample_prob=t["prob"], sample_dprob=outs["dprob"], sample_b=t["b"], sample_sfb=t["sfb"],
        sample_sfd_row=outs.get("sfd_row"), sample_sfd_col=outs.get("sfd_col"), recipe="fp8_blockwise")
    op.execute(a_tensor=t["a"], c_tensor=t["c"], d_row_tensor=outs["d_row"], d_col_tensor=outs.get("d_col"),
               sfa_tensor=t["sfa"], padded_offsets=t["offsets"], alpha_tensor=t["alpha"], beta_tensor=t["beta"],
               prob_tensor=t["prob"], dprob_tensor=outs["dprob"], b_tensor=t["b"], sfb_tensor=t["sfb"],
               sfd_row_tensor=outs.get("sfd_row"), sfd_col_tensor=outs.get("sfd_col"))
    return op


def test_fp8_d_class_api_leaves_rows_past_the_end_untouched_and_serializes():
    from cudnn_ext.contract.fp8_blockwise import scale_geometry

    t = case()
    m, end = t["m"], int(t["offsets"][-1])
    poison = lambda shape, dtype: torch.full(shape, 0x7F, dtype=torch.uint8).view(dtype)  # noqa: E731
    outs = dict(d_row=poison((m, 2 * N), E4M3), d_col=poison((m, 2 * N), E4M3), dprob=torch.zeros(m),
                sfd_row=scale_geometry("sfd_row", n=N, k=K, num_experts=L).empty(m, fill=-1.0),
                sfd_col=scale_geometry("sfd_col", n=N, k=K, num_experts=L).empty(m, fill=-1.0))
    op = _class_fp8_d(t, **outs)
    ref = reference(t)
    got = dequantize_fp8_blockwise(outs["d_row"][:end], outs["sfd_row"][:end], (1, 128), out_dtype=torch.float64)
    assert rel(got, ref["d"], end) < 2.0 ** -4  # e4m3's own rounding
    assert (outs["d_row"][end:].view(torch.uint8) == 0x7F).all() and (outs["d_col"][end:].view(torch.uint8) == 0x7F).all()
    assert (outs["sfd_row"][end:] == -1).all() and (outs["sfd_col"][end // 128:] == -1).all()
    assert (outs["sfd_row"][:end] > 0).all() and (outs["sfd_col"][:end // 128] > 0).all()
    blob = op._graph.serialize()
    assert cudnn.deserialize_plan(blob).serialize() == blob


def test_fp8_d_errors():
    t = case()
    m = t["m"]
    with pytest.raises(ValueError, match=r"m_aligned: an FP8 D under recipe='fp8_blockwise' needs m_aligned a multiple "
                                         r"of 128"):
        _err(t, d_dtype=E4M3, m_aligned=8)
    d = torch.empty(m, 2 * N, dtype=E4M3)
    with pytest.raises(ValueError, match=r"sample_d_col/sample_sfd_row/sample_sfd_col: .* got sample_d_col only"):
        _class_fp8_d(t, d_row=d, d_col=torch.empty(m, 2 * N, dtype=E4M3), dprob=torch.zeros(m))
    with pytest.raises(ValueError, match=r"sample_d_col: only an FP8 D"):
        _class_fp8_d(t, d_row=torch.empty(m, 2 * N), d_col=torch.empty(m, 2 * N, dtype=E4M3), dprob=torch.zeros(m))


def test_more_argument_rules():
    """Found in review: an FP8 D's outputs on another device, an activation output with an FP8
    D, an FP8 D of the other format, block-scaled options the recipe does not take."""
    from cudnn_ext.contract.fp8_blockwise import scale_geometry

    t = case()
    m = t["m"]
    outs = dict(d_row=torch.empty(m, 2 * N, dtype=E4M3, device="meta"), d_col=torch.empty(m, 2 * N, dtype=E4M3),
                dprob=torch.zeros(m), sfd_row=scale_geometry("sfd_row", n=N, k=K, num_experts=L).empty(m),
                sfd_col=scale_geometry("sfd_col", n=N, k=K, num_experts=L).empty(m, device="meta"))
    with pytest.raises(ValueError, match=r"must be on the same device"):
        _class_fp8_d(t, **outs)
    with pytest.raises(ValueError, match=r"activation_tensor: the activation output needs a bfloat16 D, got a "
                                         r"float8_e4m3fn D"):
        _err(t, d_dtype=E4M3, act_func="dgeglu", activation_tensor=torch.empty(m, N, dtype=torch.bfloat16))
    with pytest.raises(DtypeError, match=r"d_dtype: recipe='fp8_blockwise' takes a bfloat16, float16, float32 or "
                                         r"float8_e4m3fn D, got float8_e5m2"):
        _err(t, d_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match=r"sf_vec_size/vector_f32: block-scaled options"):
        _err(t, sf_vec_size=32)


def test_the_reference_dequantizes_in_slabs(monkeypatch):
    """A in slabs of rows and B one expert at a time: the same D as all at once (slabs of 100
    rows, not a multiple of anything, against the default that holds all 1024)."""
    from cudnn_ext.reference import fp8_blockwise as ref_fp8

    t = case()
    end = int(t["offsets"][-1])  # (the wrapper's D rows past the last offset are unspecified)
    whole = run_wrapper(t)[0][:end].clone()
    monkeypatch.setattr(ref_fp8, "_A_ROWS", 100)
    assert torch.equal(run_wrapper(t)[0][:end], whole)


@pytest.mark.parametrize("shape", [dict(m=32768, n=2048, k=7168, num_experts=8), dict(m=512, n=64, k=128, num_experts=1)],
                         ids=["dsv3", "tiny"])
def test_the_heuristics_rank_the_hopper_kernel_above_the_reference(shape, monkeypatch):
    """On a Hopper GPU the recipe runs on sm90_fp8_blockwise, from the largest problem to a
    one-expert tiny one (the ranking itself: the engine made available here)."""
    from cudnn_ext.engines.heuristics import rank
    from cudnn_ext.problem import ActConfig, DgluProblem

    p = DgluProblem(weight_mode="dense", b_major="k", ab_dtype=E4M3, c_dtype=torch.bfloat16, d_dtype=torch.bfloat16,
                    act=ActConfig("dswiglu"), generate_dbias=True, recipe="fp8_blockwise", device_type="cuda", **shape)
    engines = [engine_by_name("reference"), engine_by_name("sm90_fp8_blockwise")]
    monkeypatch.setattr(engines[1], "available", lambda: None)
    assert rank(p, engines=engines)[0].engine.name == "sm90_fp8_blockwise"
