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
    """The Hopper engine (pinned) for NVFP4: its execute runs under sync-debug
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
    """The vendor's wrapper tests' pattern: the same dprob zeroed and passed again with no sync
    in between, the stream given as a raw ``CUstream`` of the current (default, null) stream,
    several N-tiles (N 512, K 512), every expert full: each call's dprob and D equal the
    reference engine's."""
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
    outs = []
    for _ in range(3):  # no sync between the calls: the zeroing must stay ordered with them
        dprob.zero_()
        out = cudnn.grouped_gemm_dglu_wrapper(**kw, engine="sm90_blockscaled")
        outs.append((dprob.clone(), out["d_row_tensor"]))
    torch.cuda.synchronize()
    for got_dprob, d in outs:
        assert rel_err(got_dprob.view(-1)[:last], ref_dprob.view(-1)[:last]) < 2e-3
        assert rel_err(d[:last], ref["d_row_tensor"][:last]) < 1.5e-2
