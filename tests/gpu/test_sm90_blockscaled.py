"""Block-scaled (NVFP4, MXFP4) calls on the Hopper engine ``sm90_blockscaled`` (device
dequantization, then the BF16 kernel with the block-scaled epilogue), through the public
wrapper, against the float64 oracle of the dequantized operands and against the reference
engine on the same device: dense and per-expert weights, dSwiGLU and dGeGLU (which reads C
without beta here), with and without prob, amax (bf16 D), dbias with fp32 D, an empty
expert, rows past the last offset. Also: no host sync, and a CUDA-graph replay with new
values."""
import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext.quant import dequantize, quantize_nvfp4

from oracle import oracle
from sm90_cases import rel_err, skip_unless_sm90

pytestmark = pytest.mark.gpu

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
FORMATS = {"nvfp4": (16, E4M3), "mxfp4": (32, E8M0)}


def _inputs(fmt, L=4, N=96, K=256, counts=(256, 0, 768, 512), seed=0):
    torch.manual_seed(seed)
    vec, sf_dtype = FORMATS[fmt]
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    m = sum(counts) + 256
    a = torch.randn(m, K, device="cuda")
    w = torch.randn(L, N, K, device="cuda") * 0.2
    a_q, sfa = quantize_nvfp4(a, sf_vec_size=vec, sf_dtype=sf_dtype)
    experts = [quantize_nvfp4(w[g], sf_vec_size=vec, sf_dtype=sf_dtype) for g in range(L)]
    b_q, sfb = quantize_nvfp4(w.permute(1, 2, 0), sf_vec_size=vec, sf_dtype=sf_dtype)
    return dict(L=L, N=N, K=K, M=m, vec=vec, offs=offs, a_q=a_q, sfa=sfa, b_q=b_q, sfb=sfb,
                experts=experts, c=(torch.randn(m, 2 * N, device="cuda") * 2).to(torch.bfloat16),
                alpha=torch.rand(L, device="cuda") + 0.5, beta=torch.rand(L, device="cuda") + 0.5,
                prob=torch.rand(m, device="cuda"))


def _call(t, engine, mode, act, prob, d_dtype, dbias):
    kw = dict(a_tensor=t["a_q"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offs"],
              alpha_tensor=t["alpha"], beta_tensor=t["beta"], sf_vec_size=t["vec"], act_func=act,
              prob_tensor=t["prob"] if prob else None,
              dprob_tensor=torch.zeros(t["M"], device="cuda") if prob else None,
              d_dtype=d_dtype, generate_dbias=dbias, engine=engine)
    if mode == "dense":
        kw.update(b_tensor=t["b_q"], sfb_tensor=t["sfb"])
    else:
        sfbs = [sf.permute(5, 2, 4, 0, 1, 3).contiguous() for _, sf in t["experts"]]
        t["_keep"] = sfbs
        kw.update(b_ptrs=torch.tensor([0 if int(t["offs"][e]) == (int(t["offs"][e - 1]) if e else 0)
                                       else q.data_ptr() for e, (q, _) in enumerate(t["experts"])],
                                      dtype=torch.int64, device="cuda"),
                  sfb_ptrs=torch.tensor([s.data_ptr() for s in sfbs], dtype=torch.int64, device="cuda"),
                  n=t["N"], b_dtype=t["a_q"].dtype, b_major="k")
    return cudnn.grouped_gemm_dglu_wrapper(**kw)


def _oracle(t, act, prob):
    vec = t["vec"]
    a_r = dequantize(t["a_q"], t["sfa"], vec, out_dtype=torch.float64)
    ws = [dequantize(q, sf, vec, out_dtype=torch.float64) for q, sf in t["experts"]]
    beta = t["beta"] if act == "dswiglu" else torch.ones_like(t["beta"])  # dGeGLU: no beta
    p = t["prob"] if prob else torch.ones_like(t["prob"])
    cpu = lambda x: x.cpu()  # noqa: E731  (the oracle runs on the CPU)
    return oracle(cpu(a_r), [cpu(w) for w in ws], cpu(t["c"]), cpu(t["offs"]), cpu(t["alpha"]),
                  cpu(beta), cpu(p), act_func=act)


CASES = [("nvfp4", "dense", "dswiglu", True, torch.bfloat16, False),
         ("nvfp4", "discrete", "dgeglu", True, torch.bfloat16, False),
         ("mxfp4", "dense", "dgeglu", False, torch.float16, False),
         ("mxfp4", "discrete", "dswiglu", False, torch.bfloat16, False),
         ("nvfp4", "dense", "dgeglu", True, torch.float32, True),
         ("mxfp4", "discrete", "dswiglu", True, torch.float32, True)]


@pytest.mark.parametrize("fmt,mode,act,prob,d_dtype,dbias", CASES,
                         ids=["-".join(str(x).replace("torch.", "") for x in c) for c in CASES])
def test_sm90_blockscaled_matches_oracle_and_reference(fmt, mode, act, prob, d_dtype, dbias):
    skip_unless_sm90()
    t = _inputs(fmt)
    out = _call(t, "sm90_blockscaled", mode, act, prob, d_dtype, dbias)
    ref_eng = _call(t, "reference", mode, act, prob, d_dtype, dbias)
    ref = _oracle(t, act, prob)
    last = int(t["offs"][-1])
    d = out["d_row_tensor"][..., 0]
    assert not torch.isnan(d[:last]).any()
    tol = 1.5e-2 if d_dtype == torch.bfloat16 else 4e-3 if d_dtype == torch.float16 else 2e-3
    assert rel_err(d[:last], ref["d"][:last].to(d.device)) < tol
    assert rel_err(d[:last], ref_eng["d_row_tensor"][..., 0][:last]) < tol
    if prob:
        assert rel_err(out["dprob_tensor"].view(-1)[:last], ref["dprob"][:last].to(d.device)) < 2e-3
    else:
        assert out["dprob_tensor"] is None
    if dbias:
        assert rel_err(out["dbias_tensor"][..., 0], ref["dbias"].to(d.device)) < 1.5e-2
    if d_dtype != torch.float32:  # the wrapper makes amax for 16-bit D
        amax, amax_ref = out["amax_tensor"][..., 0], ref_eng["amax_tensor"][..., 0]
        assert torch.isinf(amax[1]).all() and (amax[1] < 0).all()  # the empty expert keeps -inf
        live = [0, 2, 3]
        assert torch.allclose(amax[live], amax_ref[live], rtol=1e-3), (amax, amax_ref)


def test_sm90_blockscaled_never_syncs_and_replays():
    """The Hopper engine (pinned: it is opt-in) for NVFP4: its execute runs under sync-debug
    'error' and in a CUDA graph, whose replay with new values equals an eager call."""
    skip_unless_sm90()
    t = _inputs("nvfp4")
    m, n = t["M"], t["N"]
    outs = dict(d=torch.empty(m, 2 * n, dtype=torch.bfloat16, device="cuda"),
                dprob=torch.zeros(m, device="cuda"),
                amax=torch.full((t["L"], 2), float("-inf"), device="cuda"))
    op = cudnn.GroupedGemmDglu(
        t["a_q"], t["c"], outs["d"], None, t["sfa"], t["offs"], t["alpha"], t["beta"], t["prob"],
        outs["dprob"], sample_b=t["b_q"], sample_sfb=t["sfb"], sample_amax=outs["amax"],
        sf_vec_size=16, engine="sm90_blockscaled")
    op.compile()
    assert op.engine_name == "sm90_blockscaled", op.engine_name
    kw = dict(a_tensor=t["a_q"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offs"],
              alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"],
              dprob_tensor=outs["dprob"], b_tensor=t["b_q"], sfb_tensor=t["sfb"],
              d_row_tensor=outs["d"], d_col_tensor=None, amax_tensor=outs["amax"])
    op.execute(**kw)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        op.execute(**kw)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            op.execute(**kw)
    torch.cuda.synchronize()
    new = _inputs("nvfp4", seed=1)
    for k in ("a_q", "sfa", "b_q", "sfb", "c", "alpha", "beta", "prob"):
        t[k].copy_(new[k])
    outs["dprob"].zero_()
    outs["amax"].fill_(float("-inf"))
    g.replay()
    torch.cuda.synchronize()
    got = {k: v.clone() for k, v in outs.items()}
    outs["dprob"].zero_()
    outs["amax"].fill_(float("-inf"))
    op.execute(**kw)
    torch.cuda.synchronize()
    last = int(t["offs"][-1])
    assert rel_err(got["d"][:last], outs["d"][:last]) < 1e-6
    assert rel_err(got["dprob"], outs["dprob"]) < 1e-5
    assert torch.equal(got["amax"], outs["amax"])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_sm90_blockscaled_wrapper_twice_on_the_same_outputs(fmt):
    """The vendor's wrapper tests' pattern: the same dprob zeroed and passed again, the stream
    given as a raw ``CUstream`` of the current stream, several N-tiles (N 512, K 512), every
    expert full: each call's dprob and D equal the reference engine's."""
    from cuda.bindings import driver as cuda

    skip_unless_sm90()
    t = _inputs(fmt, N=512, K=512, counts=(256, 256, 256, 256))
    dprob = torch.zeros(t["M"], 1, 1, device="cuda")
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    kw = dict(a_tensor=t["a_q"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offs"],
              alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"].view(-1, 1, 1),
              dprob_tensor=dprob, b_tensor=t["b_q"], sfb_tensor=t["sfb"], sf_vec_size=t["vec"],
              current_stream=stream)
    ref_dprob = torch.zeros_like(dprob)
    ref = cudnn.grouped_gemm_dglu_wrapper(**dict(kw, dprob_tensor=ref_dprob, engine="reference"))
    last = int(t["offs"][-1])
    for _ in range(3):
        dprob.zero_()
        out = cudnn.grouped_gemm_dglu_wrapper(**kw, engine="sm90_blockscaled")
        torch.cuda.synchronize()
        assert rel_err(dprob.view(-1)[:last], ref_dprob.view(-1)[:last]) < 2e-3
        assert rel_err(out["d_row_tensor"][:last], ref["d_row_tensor"][:last]) < 1.5e-2


# ---------------------------------------------------------------------- dSiTU-GLU
def _situ_c(t, scale):
    """C of the dSiTU-GLU cases: ``"normal"`` N(0, 2^2); ``"huge"`` magnitudes log-uniform in
    [1, 3e4] with random signs (tanh and the sigmoid saturate in fp32 from |x| ~ 9 and ~ 17,
    so most values sit on the flat tails, the rest on the way there); ``"near0"`` N(0, 1e-3^2)
    (tanh(x) ~ x: the kernel's polynomial branch, where relative accuracy is what counts)."""
    m, n = t["M"], t["N"]
    if scale == "normal":
        return t["c"]
    if scale == "near0":
        return (torch.randn(m, 2 * n, device="cuda") * 1e-3).to(torch.bfloat16)
    mag = torch.pow(10.0, torch.rand(m, 2 * n, device="cuda") * 4.5)
    sign = torch.randint(0, 2, (m, 2 * n), device="cuda") * 2 - 1
    return (mag * sign).to(torch.bfloat16)


def _situ_run(t, engine, mode, prob, d_dtype, dbias, beta1, beta2):
    """One dSiTU-GLU call through the class API on poisoned outputs: D NaN everywhere (the rows
    past the last offset must stay NaN), dprob 0 in the experts' rows (it accumulates; an
    offset there would swamp the sums of C near 0 in fp32) and 0.25 past them (kept exactly),
    dbias 0 (accumulates), amax -inf (16-bit D)."""
    m, n, L = t["M"], t["N"], t["L"]
    dprob = torch.zeros(m, device="cuda")
    dprob[int(t["offs"][-1]):] = 0.25
    o = dict(d=torch.full((m, 2 * n), float("nan"), device="cuda").to(d_dtype),
             dprob=dprob if prob else None,
             dbias=torch.zeros(L, 2 * n, dtype=torch.bfloat16, device="cuda") if dbias else None,
             amax=(torch.full((L, 2), float("-inf"), device="cuda")
                   if d_dtype != torch.float32 else None))
    ctor = dict(sample_a=t["a_q"], sample_c=t["c"], sample_d_row=o["d"], sample_d_col=None,
                sample_sfa=t["sfa"], sample_padded_offsets=t["offs"], sample_alpha=t["alpha"],
                sample_beta=t["beta"], sample_prob=t["prob"] if prob else None,
                sample_dprob=o["dprob"], sample_dbias=o["dbias"], sample_amax=o["amax"],
                sf_vec_size=t["vec"], act_func="dsituglu", situ_beta1=beta1, situ_beta2=beta2,
                engine=engine)
    if mode == "dense":
        op = cudnn.GroupedGemmDglu(**ctor, sample_b=t["b_q"], sample_sfb=t["sfb"])
        w = dict(b_tensor=t["b_q"], sfb_tensor=t["sfb"])
    else:
        op = cudnn.GroupedGemmDglu(**ctor, num_experts=L, b_shape=(n, t["K"]), b_dtype=torch.uint8)
        sfbs = [sf.permute(5, 2, 4, 0, 1, 3).contiguous() for _, sf in t["experts"]]
        t["_keep"] = sfbs
        w = dict(b_ptrs=torch.tensor([q.data_ptr() for q, _ in t["experts"]], dtype=torch.int64,
                                     device="cuda"),
                 sfb_ptrs=torch.tensor([s.data_ptr() for s in sfbs], dtype=torch.int64, device="cuda"))
    op.compile()
    assert op.engine_name == engine, op.engine_name
    op.execute(a_tensor=t["a_q"], c_tensor=t["c"], d_row_tensor=o["d"], d_col_tensor=None,
               sfa_tensor=t["sfa"], padded_offsets=t["offs"], alpha_tensor=t["alpha"],
               beta_tensor=t["beta"], prob_tensor=t["prob"] if prob else None,
               dprob_tensor=o["dprob"], dbias_tensor=o["dbias"], amax_tensor=o["amax"], **w)
    torch.cuda.synchronize()
    return o


#: (format, weights, beta1, beta2, C, prob, D, dbias). beta1 == 4 takes the kernel's shared
#: exponential for the sigmoid, the others a separate one; fp32 D (no rounding of D) shows
#: the epilogue's own accuracy. NVFP4 with fp32 D needs dbias (the vendor's restriction).
SITU_CASES = [
    ("nvfp4", "dense", 4.0, 25.0, "normal", True, torch.bfloat16, False),
    ("mxfp4", "discrete", 4.0, 25.0, "normal", True, torch.float32, False),
    ("nvfp4", "dense", 3.0, 25.0, "normal", True, torch.float32, True),
    ("mxfp4", "dense", 1.5, 2.0, "normal", False, torch.float16, False),
    ("nvfp4", "discrete", 8.0, 0.5, "normal", True, torch.bfloat16, True),
    ("nvfp4", "dense", 4.0, 25.0, "huge", True, torch.float32, True),
    ("mxfp4", "discrete", 2.5, 10.0, "huge", True, torch.bfloat16, False),
    ("mxfp4", "dense", 4.0, 25.0, "near0", True, torch.float32, False),
    ("nvfp4", "discrete", 3.0, 25.0, "near0", True, torch.float32, True),
]


@pytest.mark.parametrize("fmt,mode,beta1,beta2,scale,prob,d_dtype,dbias", SITU_CASES,
                         ids=["-".join(str(x).replace("torch.", "") for x in c) for c in SITU_CASES])
def test_sm90_blockscaled_dsituglu(fmt, mode, beta1, beta2, scale, prob, d_dtype, dbias):
    """dSiTU-GLU on the Hopper engine (beta applied to C, beta1/beta2 compiled in) against the
    float64 oracle (autograd of the forward) and the reference engine on the same outputs:
    D, dprob, dbias, amax; every output finite; the rows past the last offset untouched. With
    fp32 D the bound is 1e-4 (tanh.approx.f32's 2^-11 would miss it: docs/kernels.md)."""
    skip_unless_sm90()
    t = _inputs(fmt)
    t["c"] = _situ_c(t, scale)
    out = _situ_run(t, "sm90_blockscaled", mode, prob, d_dtype, dbias, beta1, beta2)
    ref_eng = _situ_run(t, "reference", mode, prob, d_dtype, dbias, beta1, beta2)
    vec = t["vec"]
    a_r = dequantize(t["a_q"], t["sfa"], vec, out_dtype=torch.float64)
    ws = [dequantize(q, sf, vec, out_dtype=torch.float64) for q, sf in t["experts"]]
    p = t["prob"] if prob else torch.ones_like(t["prob"])
    ref = oracle(a_r.cpu(), [w.cpu() for w in ws], t["c"].cpu(), t["offs"].cpu(), t["alpha"].cpu(),
                 t["beta"].cpu(), p.cpu(), act_func="dsituglu", situ_beta1=beta1, situ_beta2=beta2)
    last = int(t["offs"][-1])
    d = out["d"]
    assert torch.isfinite(d[:last].float()).all()
    assert torch.isnan(d[last:].float()).all()  # never touched
    tol = {torch.bfloat16: 1.5e-2, torch.float16: 4e-3, torch.float32: 1e-4}[d_dtype]
    assert rel_err(d[:last], ref["d"][:last].to(d.device)) < tol
    assert rel_err(d[:last], ref_eng["d"][:last]) < tol
    if prob:
        dprob = out["dprob"]
        assert torch.isfinite(dprob).all() and (dprob[last:] == 0.25).all()
        assert rel_err(dprob[:last], ref["dprob"][:last].to(d.device)) < 1e-4
        assert rel_err(dprob[:last], ref_eng["dprob"][:last]) < 1e-5
    if dbias:
        assert rel_err(out["dbias"], ref["dbias"].to(d.device)) < 1.5e-2
    if out["amax"] is not None:
        amax, amax_ref = out["amax"], ref_eng["amax"]
        assert torch.isinf(amax[1]).all() and (amax[1] < 0).all()  # the empty expert
        live = [0, 2, 3]
        assert torch.allclose(amax[live], amax_ref[live], rtol=1e-3), (amax, amax_ref)
