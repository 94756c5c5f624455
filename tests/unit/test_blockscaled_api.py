"""Block-scaled (MXFP8 / NVFP4) calls through the public API vs an independent composition:
dequantize with the public helpers -> float64 BF16-path oracle (autograd of the forward) ->
quantize D with the public rule. Plus one bad-input test per block-scaled rule."""
import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext.quant import dequantize, quantize_mxfp8, quantize_nvfp4
from cudnn_ext.quant.sf_layout import unswizzle_sf
from cudnn_ext.reference.blockscaled import quantize_d_row

from exact_cases import fp8_d_saturates
from oracle import oracle

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
TOL = {"d": 2e-2, "dprob": 1e-4, "dbias": 1e-2, "amax": 1e-4}  # relative to max |ref|


def _rel(got, ref):
    ok = torch.isfinite(ref)
    return ((got.double()[ok] - ref[ok]).abs().max() / ref[ok].abs().max().clamp_min(1e-30)).item()


def _problem(L=3, N=64, K=128, counts=(256, 0, 512), seed=None):
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    m = int(offs[-1]) + 256  # one block of rows past the last expert: must stay untouched
    return dict(
        L=L, N=N, K=K, M=m, offs=offs,
        a=torch.randn(m, K), b=torch.randn(L, N, K) * 0.2,
        c=(torch.randn(m, 2 * N) * 2).to(torch.bfloat16),
        alpha=torch.rand(L) + 0.5, beta=torch.rand(L) + 0.5, prob=torch.rand(m),
    )


def _dense_b(q3):  # (N, K, L) k-major per group, as the helpers return it
    assert q3.stride(1) == 1
    return q3


def test_mxfp8_dense_dswiglu_matches_composition():
    p = _problem()
    a_q, sfa = quantize_mxfp8(p["a"])
    b_q, sfb = quantize_mxfp8(p["b"].permute(1, 2, 0))
    nc = torch.tensor([2.0])
    dprob = torch.zeros(p["M"], 1, 1)
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
        beta_tensor=p["beta"], prob_tensor=p["prob"].view(-1, 1, 1), dprob_tensor=dprob, b_tensor=_dense_b(b_q),
        sfb_tensor=sfb, sf_vec_size=32, norm_const_tensor=nc, generate_dbias=True)
    a_r = dequantize(a_q, sfa, 32, out_dtype=torch.float64)
    b_r = dequantize(b_q, sfb, 32, out_dtype=torch.float64)
    ref = oracle(a_r, [b_r[:, :, g] for g in range(p["L"])], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"])
    last = int(p["offs"][-1])
    d_row = out["d_row_tensor"][..., 0]
    sfd_row = unswizzle_sf(out["sfd_row_tensor"], p["M"], 2 * p["N"] // 32)[..., 0]
    # dequantize D_row with its own scales: d ~= D * SFD / norm_const
    deq = d_row[:last].double() * sfd_row[:last].double().repeat_interleave(32, 1) / 2.0
    assert _rel(deq, ref["d"][:last]) < TOL["d"] * 4  # fp8 has 3 mantissa bits
    # the scales are the public rule applied to the oracle's D (a few may round across 2^k)
    _, sf_ref = quantize_d_row(ref["d"][:last].float(), nc)
    same = (unswizzle_sf(sf_ref, last, 2 * p["N"] // 32)[..., 0].view(torch.uint8)
            == sfd_row[:last].view(torch.uint8)).float().mean()
    assert same > 0.98, f"only {same:.3f} of SFD_row codes match the composition"
    assert _rel(out["dprob_tensor"].view(-1)[:last], ref["dprob"][:last]) < TOL["dprob"]
    assert _rel(out["dbias_tensor"][..., 0], ref["dbias"]) < TOL["dbias"]
    # D_col: same values, column-block scales
    sfd_col = unswizzle_sf(out["sfd_col_tensor"], 2 * p["N"], p["M"] // 32)[..., 0]  # (2N, M/32)
    d_col = out["d_col_tensor"][..., 0][:last].double()
    deq_c = d_col * sfd_col[:, : last // 32].double().t().repeat_interleave(32, 0) / 2.0
    assert _rel(deq_c, ref["d"][:last]) < TOL["d"] * 4
    assert dprob.view(-1)[last:].eq(0).all()  # rows past the last offset untouched


@pytest.mark.parametrize("sf", ["nvfp4", "mxfp4"])
def test_fp4_dense_dgeglu_ignores_beta_and_reports_amax(sf):
    p = _problem(N=32, K=64)
    if sf == "nvfp4":
        a_q, sfa = quantize_nvfp4(p["a"])
        b_q, sfb = quantize_nvfp4(p["b"].permute(1, 2, 0))
        vec = 16
    else:
        a_q, sfa = quantize_nvfp4(p["a"], sf_vec_size=32, sf_dtype=E8M0)
        b_q, sfb = quantize_nvfp4(p["b"].permute(1, 2, 0), sf_vec_size=32, sf_dtype=E8M0)
        vec = 32
    dprob = torch.zeros(p["M"])
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
        beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb,
        sf_vec_size=vec, act_func="dgeglu", geglu_alpha=1.0, glu_clamp_max=3.0, glu_clamp_min=-3.0,
        linear_offset=0.5, d_dtype=torch.float32, generate_dbias=True)
    a_r = dequantize(a_q, sfa, vec, out_dtype=torch.float64)
    b_r = dequantize(b_q, sfb, vec, out_dtype=torch.float64)
    ones = torch.ones(p["L"])  # block-scaled dGeGLU reads C without beta
    ref = oracle(a_r, [b_r[:, :, g] for g in range(p["L"])], p["c"], p["offs"], p["alpha"], ones, p["prob"],
                 act_func="dgeglu", geglu_alpha=1.0, glu_clamp_max=3.0, glu_clamp_min=-3.0, linear_offset=0.5)
    last = int(p["offs"][-1])
    assert _rel(out["d_row_tensor"][..., 0][:last], ref["d"][:last]) < 1e-5
    assert _rel(dprob[:last], ref["dprob"][:last]) < TOL["dprob"]
    assert out["amax_tensor"] is None  # fp32 D: no amax (the wrapper makes one for bf16/fp16 D only)


def test_nvfp4_amax_per_expert_and_optional_prob():
    p = _problem(N=32, K=64)
    a_q, sfa = quantize_nvfp4(p["a"])
    b_q, sfb = quantize_nvfp4(p["b"].permute(1, 2, 0))
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
        beta_tensor=p["beta"], prob_tensor=None, dprob_tensor=None, b_tensor=b_q, sfb_tensor=sfb)
    a_r = dequantize(a_q, sfa, 16, out_dtype=torch.float64)
    b_r = dequantize(b_q, sfb, 16, out_dtype=torch.float64)
    ref = oracle(a_r, [b_r[:, :, g] for g in range(p["L"])], p["c"], p["offs"], p["alpha"], p["beta"],
                 torch.ones(p["M"]))  # no prob: p = 1
    amax = out["amax_tensor"][..., 0]
    start = 0
    for g, end in enumerate(p["offs"].tolist()):
        if end == start:
            assert torch.isinf(amax[g]).all() and (amax[g] < 0).all()  # an empty expert keeps -inf
        else:
            d = ref["d"][start:end].view(end - start, -1, 2, 32)
            want = torch.stack([d[:, :, 0].abs().max(), d[:, :, 1].abs().max()])
            assert torch.allclose(amax[g].double(), want, rtol=1e-5), (g, amax[g], want)
        start = end
    assert out["dprob_tensor"] is None


def test_mxfp8_discrete_n_major_weights():
    p = _problem(N=64, K=128)
    a_q, sfa = quantize_mxfp8(p["a"])
    experts = [quantize_mxfp8(p["b"][g]) for g in range(p["L"])]  # (N, K) k-major each
    # N-major storage: a (K, N) row-major buffer holding B^T
    n_major = [q.t().contiguous() for q, _ in experts]
    sfbs = [sf.contiguous() if sf.is_contiguous() else sf.permute(5, 2, 4, 0, 1, 3).contiguous() for _, sf in experts]
    b_ptrs = torch.tensor([t.data_ptr() for t in n_major], dtype=torch.int64)
    sfb_ptrs = torch.tensor([t.data_ptr() for t in sfbs], dtype=torch.int64)
    nc = torch.tensor([1.0])
    dprob = torch.zeros(p["M"])
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
        beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=dprob, b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs,
        n=p["N"], b_dtype=E4M3, b_major="n", sf_vec_size=32, norm_const_tensor=nc)
    a_r = dequantize(a_q, sfa, 32, out_dtype=torch.float64)
    ws = [dequantize(q, sf, 32, out_dtype=torch.float64) for q, sf in experts]
    ref = oracle(a_r, ws, p["c"], p["offs"], p["alpha"], p["beta"], p["prob"])
    last = int(p["offs"][-1])
    assert _rel(dprob[:last], ref["dprob"][:last]) < TOL["dprob"]
    sfd = unswizzle_sf(out["sfd_row_tensor"], p["M"], 2 * p["N"] // 32)[..., 0]
    deq = out["d_row_tensor"][..., 0][:last].double() * sfd[:last].double().repeat_interleave(32, 1)
    assert _rel(deq, ref["d"][:last]) < TOL["d"] * 4


def test_dsituglu_against_autograd_of_forward():
    p = _problem(N=32, K=64)
    a_q, sfa = quantize_mxfp8(p["a"])
    b_q, sfb = quantize_mxfp8(p["b"].permute(1, 2, 0))
    b1, b2 = 3.0, 20.0
    d_row = torch.full((p["M"], 2 * p["N"], 1), float("nan")).to(E4M3)
    d_col = torch.empty_like(d_row)
    from cudnn_ext.quant.sf_layout import empty_sf
    sfd_row = empty_sf(p["M"], 2 * p["N"] // 32, dtype=E8M0)
    sfd_col = empty_sf(2 * p["N"], p["M"] // 32, dtype=E8M0)
    dprob = torch.zeros(p["M"], 1, 1)
    op = cudnn.GroupedGemmDglu(
        sample_a=a_q, sample_c=p["c"], sample_d_row=d_row, sample_d_col=d_col, sample_sfa=sfa,
        sample_padded_offsets=p["offs"], sample_alpha=p["alpha"], sample_beta=p["beta"],
        sample_prob=p["prob"].view(-1, 1, 1), sample_dprob=dprob, sample_b=b_q, sample_sfb=sfb,
        sample_sfd_row=sfd_row, sample_sfd_col=sfd_col, sample_norm_const=torch.tensor([1.0]),
        act_func="dsituglu", situ_beta1=b1, situ_beta2=b2, sf_vec_size=32)
    assert op.check_support()
    op.execute(a_tensor=a_q, c_tensor=p["c"], d_row_tensor=d_row, d_col_tensor=d_col, sfa_tensor=sfa,
               padded_offsets=p["offs"], alpha_tensor=p["alpha"], beta_tensor=p["beta"],
               prob_tensor=p["prob"].view(-1, 1, 1), dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb,
               sfd_row_tensor=sfd_row, sfd_col_tensor=sfd_col, norm_const_tensor=torch.tensor([1.0]))
    # independent: autograd of out = prob * T_g(gate) * T_u(up) with X = beta * C
    a_r = dequantize(a_q, sfa, 32, out_dtype=torch.float64)
    b_r = dequantize(b_q, sfb, 32, out_dtype=torch.float64)
    last = int(p["offs"][-1])
    ref_dprob = torch.zeros(p["M"], dtype=torch.float64)
    start = 0
    for g, end in enumerate(p["offs"].tolist()):
        if end > start:
            r = float(p["alpha"][g]) ** 2 * a_r[start:end] @ b_r[:, :, g].t()
            x = (float(p["beta"][g]) * p["c"][start:end].double()).requires_grad_(True)
            pr = p["prob"][start:end].double().requires_grad_(True)
            blocks = x.view(end - start, -1, 2, 32)
            gate, up = blocks[:, :, 0].reshape(end - start, -1), blocks[:, :, 1].reshape(end - start, -1)
            fwd = pr[:, None] * (b1 * torch.tanh(gate / b1) * torch.sigmoid(gate)) * (b2 * torch.tanh(up / b2))
            _, dp = torch.autograd.grad(fwd, (x, pr), grad_outputs=r)
            ref_dprob[start:end] = dp
        start = end
    assert _rel(dprob.view(-1)[:last], ref_dprob[:last]) < TOL["dprob"]


# ------------------------------------------------------------------ bad input, one per rule
def _ok(quantize, **extra):
    """Valid wrapper arguments for a small problem with A and B quantized by ``quantize``."""
    p = _problem(L=2, N=32, K=64, counts=(256, 256))
    a_q, sfa = quantize(p["a"])
    b_q, sfb = quantize(p["b"].permute(1, 2, 0))
    return dict(a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
                beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=torch.zeros(p["M"]), b_tensor=b_q,
                sfb_tensor=sfb, **extra)


def _ok_mxfp8():
    return _ok(quantize_mxfp8, sf_vec_size=32, norm_const_tensor=torch.tensor([1.0]))


def _ok_nvfp4():
    return _ok(quantize_nvfp4, sf_vec_size=16)


BAD = [
    ("fp8 needs sf_vec 32", _ok_mxfp8, dict(sf_vec_size=16), ValueError, "sf_vec_size"),
    ("e4m3 SF needs vec 16", _ok_nvfp4, dict(sf_vec_size=32), ValueError, "sf_vec_size"),
    ("sf_vec 8", _ok_nvfp4, dict(sf_vec_size=8), ValueError, "sf_vec_size"),
    ("missing sfa", _ok_mxfp8, dict(sfa_tensor=None), ValueError, "sfa_tensor"),
    ("sfb dtype differs", _ok_mxfp8, "sfb_e4m3", TypeError, "sfb_tensor"),
    ("sfa wrong shape", _ok_mxfp8, "sfa_short", ValueError, "sfa"),
    ("fp8 D required for fp8", _ok_mxfp8, dict(d_dtype=torch.bfloat16), TypeError, "d_dtype"),
    ("fp4 D not fp8", _ok_nvfp4, dict(d_dtype=E4M3), TypeError, "d_dtype"),
    ("e5m2 D with SFD", _ok_mxfp8, dict(d_dtype=torch.float8_e5m2), NotImplementedError, "d_dtype"),
    ("norm_const required", _ok_mxfp8, dict(norm_const_tensor=None), ValueError, "norm_const_tensor"),
    ("relu epilogue", _ok_mxfp8, dict(epilogue_op="relu"), NotImplementedError, "epilogue_op"),
    ("unknown epilogue", _ok_mxfp8, dict(epilogue_op="gelu"), ValueError, "epilogue_op"),
    ("fp8 C with vector_f32", _ok_mxfp8, "c_fp8_vec", ValueError, "vector_f32"),
    ("round_dgrad is bf16 only", _ok_mxfp8, dict(round_dgrad_to_input_dtype=True), ValueError, "round_dgrad"),
    ("single group needs L=1", _ok_mxfp8, dict(use_single_group_runtime_offsets=True), ValueError,
     "use_single_group_runtime_offsets"),
    ("discrete_col_sfd without SFD", _ok_nvfp4, dict(discrete_col_sfd=True), ValueError, "discrete_col_sfd"),
    ("rubin override", _ok_nvfp4, dict(sf_fp8_dtype_override="e5m3"), NotImplementedError, "sf_fp8_dtype_override"),
    ("fp4 vec16 fp32 D w/o dbias", _ok_nvfp4, dict(d_dtype=torch.float32), NotImplementedError, "d_dtype"),
    ("mixed families", _ok_mxfp8, "b_bf16", TypeError, "mixed dtype families"),
    ("unsupported pair", _ok_mxfp8, "b_e5m2", TypeError, "unsupported dtype pair"),
    ("fp4 dense must be K-major", _ok_nvfp4, "b_nmajor", ValueError, "b_tensor"),
    ("dsituglu constants", _ok_mxfp8, dict(act_func="dsituglu", situ_beta1=0.0), ValueError, "situ_beta1"),
    # alpha and beta: float32, bfloat16 or float16 (docs/vendor_contract.md §3.5)
    ("alpha fp64", _ok_mxfp8, "alpha_fp64", TypeError, "alpha_tensor: dtype must be one of {float32, bfloat16, "
     "float16}, got float64"),
    ("beta int32", _ok_nvfp4, "beta_int32", TypeError, "beta_tensor: dtype must be one of {float32, bfloat16, "
     "float16}, got int32"),
    ("bf16 alpha with vector_f32", _ok_nvfp4, "alpha_bf16_vec", TypeError,
     "alpha_tensor: bfloat16 with vector_f32=True and act_func='dswiglu'"),
    ("fp16 beta with vector_f32", _ok_nvfp4, "beta_fp16_vec", TypeError,
     "beta_tensor: float16 with vector_f32=True and act_func='dswiglu'"),
    ("bf16 alpha with vector_f32 dgeglu", _ok_nvfp4, "alpha_bf16_vec_geglu", TypeError,
     "alpha_tensor: bfloat16 with vector_f32=True and act_func='dgeglu'"),
]


@pytest.mark.parametrize("name,base,change,exc,needle", BAD, ids=[b[0] for b in BAD])
def test_block_scaled_rules(name, base, change, exc, needle):
    kw = base()
    if change == "sfb_e4m3":
        kw["sfb_tensor"] = kw["sfb_tensor"].view(torch.uint8).view(E4M3)
    elif change == "sfa_short":
        kw["sfa_tensor"] = torch.zeros(100, dtype=E8M0)
    elif change == "c_fp8_vec":
        kw["c_tensor"] = kw["c_tensor"].to(E4M3)
        kw["vector_f32"] = True
    elif change == "b_bf16":
        kw["b_tensor"] = kw["b_tensor"].to(torch.bfloat16)
    elif change == "b_e5m2":
        kw["b_tensor"] = kw["b_tensor"].view(torch.uint8).view(torch.float8_e5m2)
    elif change == "b_nmajor":
        b = kw["b_tensor"]
        kw["b_tensor"] = b.permute(2, 1, 0).contiguous().permute(2, 1, 0)  # (N,K,L) with N innermost
    elif change == "alpha_fp64":
        kw["alpha_tensor"] = kw["alpha_tensor"].double()
    elif change == "beta_int32":
        kw["beta_tensor"] = kw["beta_tensor"].int()
    elif change == "alpha_bf16_vec":
        kw.update(alpha_tensor=kw["alpha_tensor"].bfloat16(), vector_f32=True)
    elif change == "beta_fp16_vec":
        kw.update(beta_tensor=kw["beta_tensor"].half(), vector_f32=True)
    elif change == "alpha_bf16_vec_geglu":
        kw.update(alpha_tensor=kw["alpha_tensor"].bfloat16(), vector_f32=True, act_func="dgeglu")
    else:
        kw.update(change)
    dprob_before = kw["dprob_tensor"].clone() if kw.get("dprob_tensor") is not None else None
    with pytest.raises(exc) as err:
        cudnn.grouped_gemm_dglu_wrapper(**kw)
    assert needle in str(err.value), str(err.value)
    if dprob_before is not None:
        assert torch.equal(kw["dprob_tensor"], dprob_before)


def test_block_scaled_dense_b_must_pack_its_experts():
    kw = _ok_mxfp8()
    b = kw["b_tensor"]  # (N, K, L) K-major
    u8 = b.view(torch.uint8).permute(2, 0, 1)  # (L, N, K)
    spread = torch.stack([u8, u8], 1).reshape(2 * u8.shape[0], *u8.shape[1:]).permute(1, 2, 0)[:, :, ::2]
    kw["b_tensor"] = spread.view(E4M3)  # same values, expert stride 2*N*K
    with pytest.raises(ValueError, match="b_tensor: stride"):
        cudnn.grouped_gemm_dglu_wrapper(**kw)


@pytest.mark.parametrize("table", ["b_ptrs", "sfb_ptrs"])
def test_block_scaled_pointer_tables_follow_the_bf16_rules(table):
    p = _problem(L=2, N=32, K=64, counts=(256, 256))
    a_q, sfa = quantize_mxfp8(p["a"])
    experts = [quantize_mxfp8(p["b"][g]) for g in range(2)]
    qs = [q.contiguous() for q, _ in experts]
    sfs = [sf.permute(5, 2, 4, 0, 1, 3).contiguous() for _, sf in experts]
    tables = {"b_ptrs": torch.tensor([t.data_ptr() for t in qs]),
              "sfb_ptrs": torch.tensor([t.data_ptr() for t in sfs])}
    strided = torch.zeros(4, dtype=torch.int64)
    strided[::2] = tables[table]
    tables[table] = strided[::2]  # stride (2,)
    with pytest.raises(ValueError, match=f"{table}: must be contiguous"):
        cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
            beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=torch.zeros(p["M"]), n=32, b_dtype=E4M3,
            sf_vec_size=32, norm_const_tensor=torch.tensor([1.0]), **tables)


def test_deterministic_is_carried_not_dropped(monkeypatch):
    """deterministic=True reaches the problem (so engines that reduce dprob with atomics can
    decline it) and two runs give bit-identical dprob."""
    from cudnn_ext.engines.vendor import VendorSm100Engine

    kw = _ok_mxfp8()
    kw["deterministic"] = True
    outs = []
    for _ in range(2):
        kw["dprob_tensor"] = torch.zeros_like(kw["dprob_tensor"])
        outs.append(cudnn.grouped_gemm_dglu_wrapper(**kw)["dprob_tensor"].clone())
    assert torch.equal(outs[0], outs[1])
    from cudnn_ext import contract
    ops = contract.Operands(a=kw["a_tensor"], c=kw["c_tensor"], sfa=kw["sfa_tensor"], padded_offsets=kw["padded_offsets"],
                            alpha=kw["alpha_tensor"], beta=kw["beta_tensor"], prob=kw["prob_tensor"],
                            dprob=kw["dprob_tensor"], b=kw["b_tensor"], sfb=kw["sfb_tensor"],
                            norm_const=kw["norm_const_tensor"])
    problem, _ = contract.normalize(ops, contract.CallConfig(sf_vec_size=32, deterministic=True))
    assert problem.deterministic
    import dataclasses
    as_cuda = dataclasses.replace(problem, device_type="cuda", device_index=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # pretend a B200: only the reason matters
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (10, 0))
    assert any("deterministic" in r for r in VendorSm100Engine().check_support(as_cuda))


@pytest.mark.parametrize("discrete_col_sfd", [False, True])
def test_single_group_never_reads_the_offsets_value(discrete_col_sfd):
    """use_single_group_runtime_offsets: the group ends at A's row count and the offsets'
    value is never read (docs/vendor_contract.md §2.8), by the GEMM or by the per-expert SFD_col layout:
    every output equals the run whose offset is M itself."""
    p = _problem(L=1, N=64, K=128, counts=(256,))
    m = p["M"]
    a_q, sfa = quantize_mxfp8(p["a"])
    b_q, sfb = quantize_mxfp8(p["b"].permute(1, 2, 0))

    def run(value):
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=torch.tensor([value], dtype=torch.int32),
            alpha_tensor=p["alpha"], beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=torch.zeros(m),
            b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=32, norm_const_tensor=torch.tensor([1.0]),
            use_single_group_runtime_offsets=True, discrete_col_sfd=discrete_col_sfd)
        return {k: v.view(torch.uint8) if v.dtype.itemsize == 1 else v for k, v in out.items() if v is not None}

    want = run(m)
    assert want["sfd_col_tensor"].sum() > 0  # the scales were written
    for value in (0, 100, 2 * m):  # not 256-aligned, below M, past M: all ignored
        got = run(value)
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), (value, k)


@pytest.mark.parametrize("d_dtype", [torch.float8_e5m2, E4M3])
def test_fp8_d_without_scale_factors_saturates(d_dtype):
    """FP8 D without SFD (the class API with no SFD outputs): values past the format's range
    saturate to +-max, as the kernel's cvt.rn.satfinite does, never inf or NaN
    (tests/gpu/test_sm90_blockscaled.py runs the same on the Hopper engine)."""
    fp8_d_saturates(d_dtype, "cpu")


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_discrete_class_api_takes_what_the_vendors_class_takes(fmt):
    """Per-expert block-scaled weights through the class API as the vendor's class takes them:
    b_shape in logical elements (K, not FP4's packed K / 2), no pointer tables at
    check_support, b_ptrs and sfb_ptrs at execute. Every output equals the wrapper's, bit for
    bit (MXFP8: quantized D_row/D_col and their scale factors; NVFP4: bf16 D and amax)."""
    p = _problem(L=3, N=64, K=128, counts=(256, 0, 512))
    quantize, vec, extra = ((quantize_mxfp8, 32, dict(norm_const_tensor=torch.tensor([1.0]))) if fmt == "mxfp8"
                            else (quantize_nvfp4, 16, {}))
    a_q, sfa = quantize(p["a"])
    experts = [quantize(p["b"][g]) for g in range(p["L"])]  # (N, K) k-major each
    keep = [(q.contiguous(), sf.contiguous()) for q, sf in experts]
    b_ptrs = torch.tensor([q.data_ptr() for q, _ in keep], dtype=torch.int64)
    sfb_ptrs = torch.tensor([sf.data_ptr() for _, sf in keep], dtype=torch.int64)
    b_dtype = keep[0][0].dtype
    common = dict(a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
                  beta_tensor=p["beta"], prob_tensor=p["prob"], b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs, **extra)
    want = cudnn.grouped_gemm_dglu_wrapper(**common, dprob_tensor=torch.zeros(p["M"]), n=p["N"], b_dtype=b_dtype,
                                           sf_vec_size=vec)
    outs = {k: torch.full_like(v, float("nan")) if v.is_floating_point() and v.element_size() > 1
            else torch.zeros_like(v)
            for k, v in want.items() if v is not None and k != "dprob_tensor"}
    if "amax_tensor" in outs:
        outs["amax_tensor"].fill_(float("-inf"))
    outs["dprob_tensor"] = torch.zeros(p["M"])
    samples = dict(sample_a=a_q, sample_c=p["c"], sample_sfa=sfa, sample_padded_offsets=p["offs"],
                   sample_alpha=p["alpha"], sample_beta=p["beta"], sample_prob=p["prob"], sample_d_col=None,
                   sample_norm_const=extra.get("norm_const_tensor"))
    samples.update({"sample_" + k[:-len("_tensor")]: v for k, v in outs.items()})
    op = cudnn.GroupedGemmDglu(**samples, num_experts=p["L"], b_shape=(p["N"], p["K"]), b_dtype=b_dtype,
                               sf_vec_size=vec)
    assert op.check_support()
    with pytest.raises(ValueError, match=f"b_shape: K must equal sample_a's K = {p['K']}"):
        cudnn.GroupedGemmDglu(**samples, num_experts=p["L"], b_shape=(p["N"], p["K"] // 2), b_dtype=b_dtype,
                              sf_vec_size=vec).check_support()
    op.execute(**common, **dict(dict(d_col_tensor=None), **outs))
    last, m, two_n = int(p["offs"][-1]), p["M"], 2 * p["N"]

    def written(k, t):  # the rows the call defines (rows past the last offset are unspecified)
        if k == "sfd_row_tensor":
            return unswizzle_sf(t, m, two_n // 32)[..., 0][:last]
        if k == "sfd_col_tensor":
            return unswizzle_sf(t, two_n, m // 32)[..., 0][:, :last // 32]
        return t[:last] if k in ("d_row_tensor", "d_col_tensor", "dprob_tensor") else t

    for k, v in outs.items():
        got, ref = written(k, v), written(k, want[k].view(v.shape))
        assert torch.equal(got.contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8)), k


# ------------------------------------------------------------------ 16-bit alpha and beta
# docs/vendor_contract.md §3.5: with block-scaled operands the kernel loads alpha[e] and
# beta[e] in their own dtype; alpha**2 is formed in alpha's dtype, and dSwiGLU forms beta * C
# in the promoted 16-bit type of C and beta. BF16 operands keep float32 alpha and beta.

HALF = (torch.bfloat16, torch.float16)
#: alphas whose 16-bit squares round far from the exact ones (3.5e-3 relative in bfloat16,
#: 4.5e-4 in float16), so a missing rounding shows
ALPHAS = {torch.bfloat16: [1.4921875, 1.0625, 0.74609375], torch.float16: [1.46875, 1.0224609375, 0.734375],
          torch.float32: [1.4921875, 1.0625, 0.74609375]}


@pytest.mark.parametrize("alpha_dtype", HALF + (torch.float32,), ids=str)
@pytest.mark.parametrize("beta_dtype", HALF + (torch.float32,), ids=str)
def test_block_scaled_takes_16_bit_alpha_and_beta(alpha_dtype, beta_dtype):
    """bfloat16 and float16 alpha and beta (any mix with float32) pass the block-scaled
    contract, which records their dtypes in the problem; the caller's tensors stay as they
    were."""
    from cudnn_ext import contract

    kw = _ok_mxfp8()
    kw.update(alpha_tensor=kw["alpha_tensor"].to(alpha_dtype), beta_tensor=kw["beta_tensor"].to(beta_dtype))
    before = {k: kw[k].clone() for k in ("alpha_tensor", "beta_tensor", "c_tensor")}
    out = cudnn.grouped_gemm_dglu_wrapper(**kw)
    assert torch.isfinite(out["dprob_tensor"]).all()
    for k, v in before.items():
        assert kw[k].dtype == v.dtype and torch.equal(kw[k], v), k
    ops = contract.Operands(a=kw["a_tensor"], c=kw["c_tensor"], sfa=kw["sfa_tensor"],
                            padded_offsets=kw["padded_offsets"], alpha=kw["alpha_tensor"],
                            beta=kw["beta_tensor"], prob=kw["prob_tensor"], dprob=kw["dprob_tensor"],
                            b=kw["b_tensor"], sfb=kw["sfb_tensor"], norm_const=kw["norm_const_tensor"])
    problem, _ = contract.normalize(ops, contract.CallConfig(sf_vec_size=32))
    assert (problem.block_scale.alpha_dtype, problem.block_scale.beta_dtype) == (alpha_dtype, beta_dtype)


@pytest.mark.parametrize("slot,dtype", [("alpha_tensor", torch.bfloat16), ("beta_tensor", torch.bfloat16),
                                        ("alpha_tensor", torch.float16), ("beta_tensor", torch.float16)])
@pytest.mark.parametrize("api", ["wrapper", "class"])
def test_bf16_operands_refuse_16_bit_alpha_and_beta(slot, dtype, api):
    """The BF16 contract keeps the BF16 kernel's rule: float32 alpha and beta. The error is a
    DtypeError (a TypeError and a ValueError) naming the argument, the dtype seen and the
    rule; nothing is written."""
    from cudnn_ext.errors import DtypeError

    p = _problem(L=2, N=32, K=64, counts=(256, 256))
    dprob = torch.zeros(p["M"])
    kw = dict(a_tensor=p["a"].bfloat16(), c_tensor=p["c"], sfa_tensor=None, padded_offsets=p["offs"],
              alpha_tensor=p["alpha"], beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=dprob,
              b_tensor=p["b"].bfloat16().permute(1, 2, 0))
    kw[slot] = kw[slot].to(dtype)
    name = str(dtype).replace("torch.", "")
    with pytest.raises(DtypeError) as err:
        if api == "wrapper":
            cudnn.grouped_gemm_dglu_wrapper(**kw)
        else:
            cudnn.GroupedGemmDglu(
                sample_a=kw["a_tensor"], sample_c=kw["c_tensor"],
                sample_d_row=torch.empty(p["M"], 64, dtype=torch.bfloat16),
                sample_d_col=None, sample_sfa=None, sample_padded_offsets=kw["padded_offsets"],
                sample_alpha=kw["alpha_tensor"], sample_beta=kw["beta_tensor"], sample_prob=kw["prob_tensor"],
                sample_dprob=dprob, sample_b=kw["b_tensor"]).check_support()
    msg = str(err.value)
    arg = slot if api == "wrapper" else "sample_" + slot[:-len("_tensor")]  # the class names its samples
    assert msg.startswith(f"{arg}: dtype must be one of {{float32}}, got {name}"), msg
    assert "BF16 operands take float32 alpha and beta" in msg, msg
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError)
    assert dprob.eq(0).all()


def test_vector_f32_takes_16_bit_scalars_where_the_vendor_converts_them():
    """vector_f32=True refuses a 16-bit alpha for dSwiGLU and dGeGLU and a 16-bit beta for
    dSwiGLU (the packed-f32x2 epilogue); dSiTU-GLU converts both to fp32 first, and dGeGLU
    reads no beta: those pass."""
    kw = dict(_ok_nvfp4(), vector_f32=True)
    half = dict(alpha_tensor=kw["alpha_tensor"].bfloat16(), beta_tensor=kw["beta_tensor"].half())
    assert cudnn.grouped_gemm_dglu_wrapper(**dict(kw, **half, act_func="dsituglu"))["d_row_tensor"] is not None
    assert cudnn.grouped_gemm_dglu_wrapper(**dict(kw, beta_tensor=half["beta_tensor"],
                                                   act_func="dgeglu"))["d_row_tensor"] is not None
    assert cudnn.grouped_gemm_dglu_wrapper(**dict(kw, **half, vector_f32=False))["d_row_tensor"] is not None


def _mxfp4_operands(p):
    a_q, sfa = quantize_nvfp4(p["a"], sf_vec_size=32, sf_dtype=E8M0)
    b_q, sfb = quantize_nvfp4(p["b"].permute(1, 2, 0), sf_vec_size=32, sf_dtype=E8M0)
    return a_q, sfa, b_q, sfb


#: (act_func, C dtype, alpha dtype, beta dtype, the dtype beta * C is formed in (None: fp32))
HALF_CASES = [
    ("dswiglu", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.bfloat16),
    ("dswiglu", torch.bfloat16, torch.float16, torch.float16, torch.float16),  # C rounded to fp16 first
    ("dswiglu", torch.float16, torch.float32, torch.bfloat16, torch.float16),  # beta rounded to fp16
    ("dswiglu", E4M3, torch.bfloat16, torch.bfloat16, torch.bfloat16),
    ("dswiglu", torch.float8_e5m2, torch.float32, torch.float16, torch.float16),
    ("dswiglu", torch.float32, torch.bfloat16, torch.bfloat16, None),  # fp32 C: an fp32 product
    ("dgeglu", torch.bfloat16, torch.bfloat16, torch.bfloat16, None),  # block-scaled dGeGLU reads no beta
    ("dsituglu", torch.bfloat16, torch.float16, torch.bfloat16, None),  # beta converted to fp32 first
]


@pytest.mark.parametrize("act,c_dtype,alpha_dtype,beta_dtype,x_dtype", HALF_CASES,
                         ids=["-".join(str(x).replace("torch.", "") for x in c) for c in HALF_CASES])
def test_reference_rounds_16_bit_alpha_and_beta_like_the_kernel(act, c_dtype, alpha_dtype, beta_dtype, x_dtype):
    """The reference engine with 16-bit alpha/beta (MXFP4 operands, fp32 D) against the
    float64 oracle that forms alpha**2 in alpha's dtype and, for dSwiGLU with a 16-bit C,
    beta * C in the promoted 16-bit type (docs/vendor_contract.md §3.5): D and dprob within
    fp32 noise. The oracle without those roundings is far off, so the check can fail."""
    p = _problem(N=64, K=128)
    p["alpha"] = torch.tensor(ALPHAS[alpha_dtype]).to(alpha_dtype)
    p["beta"] = (torch.rand(p["L"]) + 0.5).to(beta_dtype)
    if beta_dtype in HALF:
        # the lowest significand bit set: beta * C then rounds in 16 bits for most C (betas of
        # few bits could make every product exact, and the last check could not see it)
        p["beta"] = (p["beta"].view(torch.int16) | 1).view(beta_dtype)
    p["c"] = (torch.randn(p["M"], 2 * p["N"]) * 2).to(c_dtype)
    a_q, sfa, b_q, sfb = _mxfp4_operands(p)
    dprob = torch.zeros(p["M"])
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=p["c"], sfa_tensor=sfa, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
        beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb,
        sf_vec_size=32, act_func=act, d_dtype=torch.float32, engine="reference")
    a_r = dequantize(a_q, sfa, 32, out_dtype=torch.float64)
    b_r = dequantize(b_q, sfb, 32, out_dtype=torch.float64)
    ws = [b_r[:, :, g] for g in range(p["L"])]
    beta = p["beta"] if act != "dgeglu" else torch.ones(p["L"])

    def ref(**rounding):
        return oracle(a_r, ws, p["c"], p["offs"], p["alpha"], beta, p["prob"], act_func=act, **rounding)

    half_alpha = alpha_dtype if alpha_dtype in HALF else None
    want, plain = ref(alpha_sq_dtype=half_alpha, x_dtype=x_dtype), ref()
    last = int(p["offs"][-1])
    d = out["d_row_tensor"][..., 0][:last]
    assert _rel(d, want["d"][:last]) < 1e-5
    assert _rel(dprob[:last], want["dprob"][:last]) < 1e-5
    if half_alpha is not None or x_dtype is not None:
        assert _rel(d, plain["d"][:last]) > 2e-5, "the case must show the 16-bit roundings"
