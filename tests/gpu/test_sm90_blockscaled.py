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

from exact_cases import fp8_d_saturates
from oracle import oracle
from sm90_cases import TOL, rel_err, skip_unless_sm90

pytestmark = pytest.mark.gpu

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
FORMATS = {"nvfp4": (16, E4M3), "mxfp4": (32, E8M0)}
#: D by its dtype, dprob, dbias: the bounds of the BF16 kernel's cases (sm90_cases.TOL), which
#: the dequantized operands (exact in bf16) meet; amax (fp32 maxima of the same fp32 values)
#: between engines, well inside the 2^-9 of a maximum taken from the bf16 D
D_TOL = {torch.bfloat16: TOL["d_bf16"], torch.float16: TOL["d_fp16"], torch.float32: TOL["d_fp32"]}
AMAX_RTOL = 1e-4


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
    tol = D_TOL[d_dtype]
    assert rel_err(d[:last], ref["d"][:last].to(d.device)) < tol
    assert rel_err(d[:last], ref_eng["d_row_tensor"][..., 0][:last]) < tol
    if prob:
        assert rel_err(out["dprob_tensor"].view(-1)[:last], ref["dprob"][:last].to(d.device)) < TOL["dprob"]
    else:
        assert out["dprob_tensor"] is None
    if dbias:
        assert rel_err(out["dbias_tensor"][..., 0], ref["dbias"].to(d.device)) < TOL["dbias"]
    if d_dtype != torch.float32:  # the wrapper makes amax for 16-bit D
        amax, amax_ref = out["amax_tensor"][..., 0], ref_eng["amax_tensor"][..., 0]
        assert torch.isinf(amax[1]).all() and (amax[1] < 0).all()  # the empty expert keeps -inf
        live = [0, 2, 3]
        assert torch.allclose(amax[live], amax_ref[live], rtol=AMAX_RTOL), (amax, amax_ref)


def _never_syncs_then_captured(op, kw):
    """``op.execute(**kw)`` once eagerly, once under sync-debug 'error' (a host read of device
    data raises), then captured in a CUDA graph on a side stream, which is returned."""
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
    return g


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
    g = _never_syncs_then_captured(op, kw)
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
        assert rel_err(got_dprob.view(-1)[:last], ref_dprob.view(-1)[:last]) < TOL["dprob"]
        assert rel_err(d[:last], ref["d_row_tensor"][:last]) < D_TOL[d.dtype]


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
    tol = {**D_TOL, torch.float32: 1e-4}[d_dtype]
    assert rel_err(d[:last], ref["d"][:last].to(d.device)) < tol
    assert rel_err(d[:last], ref_eng["d"][:last]) < tol
    if prob:
        dprob = out["dprob"]
        assert torch.isfinite(dprob).all() and (dprob[last:] == 0.25).all()
        assert rel_err(dprob[:last], ref["dprob"][:last].to(d.device)) < 1e-4
        assert rel_err(dprob[:last], ref_eng["dprob"][:last]) < 1e-5
    if dbias:
        assert rel_err(out["dbias"], ref["dbias"].to(d.device)) < TOL["dbias"]
    if out["amax"] is not None:
        amax, amax_ref = out["amax"], ref_eng["amax"]
        assert torch.isinf(amax[1]).all() and (amax[1] < 0).all()  # the empty expert
        live = [0, 2, 3]
        assert torch.allclose(amax[live], amax_ref[live], rtol=AMAX_RTOL), (amax, amax_ref)


# ------------------------------------------------------------------------------------ MXFP8
# FP8 operands: the kernel's epilogue quantizes D (tests/gpu/test_quant_epilogue_gpu.py holds
# it bit-exact to the reference's quantizers on equal fp32 values). Here the whole call is compared with the reference engine on the same
# device. The two fp32 D differ in accumulation order (~1e-6 relative), so a value near an
# e4m3 rounding boundary may land one code apart, and a block whose amax lies near a power of
# two may get the neighbouring scale code: the tests allow exactly that (codes at most one
# apart, dequantized values one e4m3 step apart) and check everything else exactly: poisoned
# rows past the last offset and the scale bytes that cover only them keep their bytes.

from cudnn_ext.quant import formats as F  # noqa: E402
from cudnn_ext.quant import quantize_mxfp8  # noqa: E402
from cudnn_ext.quant.sf_layout import empty_sf, storage_of, unswizzle_sf  # noqa: E402
from cudnn_ext.reference.blockscaled import sfd_col_expert_view  # noqa: E402
from quant_d_cases import POISON, poisoned  # noqa: E402

E5M2 = torch.float8_e5m2
MX_ELEM = {"e4m3": E4M3, "e5m2": E5M2}


def _mx_inputs(elem, c_dtype=torch.bfloat16, N=96, K=256, counts=(256, 0, 768, 512), seed=0,
               single=False):
    torch.manual_seed(seed)
    dt = MX_ELEM[elem]
    if single:
        counts = (1024,)
    L = len(counts)
    m = sum(counts) + (0 if single else 256)  # single group: every row belongs to the group
    # single group: the offsets' value is never read, so it holds a wrong one on purpose
    offs = (torch.zeros(1, dtype=torch.int32, device="cuda") if single else
            torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).cuda())
    a = torch.randn(m, K, device="cuda")
    w = torch.randn(L, N, K, device="cuda") * 0.2
    a_q, sfa = quantize_mxfp8(a, dt)
    b_q, sfb = quantize_mxfp8(w.permute(1, 2, 0), dt)
    experts = [quantize_mxfp8(w[g], dt) for g in range(L)]
    c = torch.randn(m, 2 * N, device="cuda") * 2
    return dict(L=L, N=N, K=K, M=m, elem=dt, offs=offs, last=m if single else sum(counts),
                a_q=a_q, sfa=sfa, b_q=b_q, sfb=sfb, experts=experts,
                c=c.to(c_dtype) if c_dtype not in (E4M3, E5M2) else c.clamp(-400, 400).to(c_dtype),
                alpha=torch.rand(L, device="cuda") + 0.5, beta=torch.rand(L, device="cuda") + 0.5,
                prob=torch.rand(m, device="cuda"),
                nc=torch.full((1,), 3.7, dtype=torch.float32, device="cuda"))


def _mx_call(t, engine, mode="dense", act="dswiglu", prob=True, dbias=False, sfd=True,
             d_dtype=E4M3, discrete_col_sfd=False, single=False, amax=False):
    """One class-API call on poisoned outputs (D 0xFF bytes, SFD 0xFF bytes, dprob zeros,
    amax -inf); returns the outputs."""
    m, n, L = t["M"], t["N"], t["L"]
    outs = poisoned(m, 2 * n, d_dtype)
    if not sfd:
        outs = dict(d_row=outs["d_row"])
    if prob:
        outs["dprob"] = torch.zeros(m, device="cuda")
    if dbias:
        outs["dbias"] = torch.zeros(L, 2 * n, dtype=torch.bfloat16, device="cuda")
    if amax:
        outs["amax"] = torch.full((L, 2), float("-inf"), device="cuda")
    kw = dict(a_tensor=t["a_q"], c_tensor=t["c"], d_row_tensor=outs["d_row"],
              d_col_tensor=outs.get("d_col"), sfa_tensor=t["sfa"], padded_offsets=t["offs"],
              alpha_tensor=t["alpha"], beta_tensor=t["beta"],
              prob_tensor=t["prob"] if prob else None, dprob_tensor=outs.get("dprob"),
              dbias_tensor=outs.get("dbias"), sfd_row_tensor=outs.get("sfd_row"),
              sfd_col_tensor=outs.get("sfd_col"), amax_tensor=outs.get("amax"),
              norm_const_tensor=t["nc"] if sfd else None)
    samples = dict(sample_dbias=outs.get("dbias"), sample_sfd_row=outs.get("sfd_row"),
                   sample_sfd_col=outs.get("sfd_col"), sample_amax=outs.get("amax"),
                   sample_norm_const=t["nc"] if sfd else None)
    if mode == "dense":
        kw.update(b_tensor=t["b_q"], sfb_tensor=t["sfb"])
        samples.update(sample_b=t["b_q"], sample_sfb=t["sfb"])
    else:
        sfbs = [sf.permute(5, 2, 4, 0, 1, 3).contiguous() for _, sf in t["experts"]]
        t["_keep"] = sfbs
        ends = [t["last"]] if single else t["offs"].tolist()
        kw.update(b_ptrs=torch.tensor([0 if ends[e] == (ends[e - 1] if e else 0) else q.data_ptr()
                                       for e, (q, _) in enumerate(t["experts"])],
                                      dtype=torch.int64, device="cuda"),
                  sfb_ptrs=torch.tensor([s.data_ptr() for s in sfbs], dtype=torch.int64, device="cuda"))
        samples.update(num_experts=L, b_shape=(t["N"], t["K"]), b_dtype=t["elem"])
    op = cudnn.GroupedGemmDglu(
        t["a_q"], t["c"], outs["d_row"], outs.get("d_col"), t["sfa"], t["offs"], t["alpha"],
        t["beta"], kw["prob_tensor"], outs.get("dprob"), sf_vec_size=32, act_func=act,
        discrete_col_sfd=discrete_col_sfd, use_single_group_runtime_offsets=single,
        engine=engine, **samples)
    op.compile()
    assert op.engine_name == engine, op.engine_name
    op.execute(**kw)
    torch.cuda.synchronize()
    return outs


def _raw(t):
    return storage_of(t).reshape(-1).view(torch.uint8) if t.dim() == 6 else t.view(torch.uint8)


def _check_untouched(got, last):
    """Rows at/past ``last`` and the scale bytes covering only them keep the poison."""
    assert (got["d_row"][last:].view(torch.uint8) == POISON).all()
    if "d_col" in got:
        assert (got["d_col"][last:].view(torch.uint8) == POISON).all()
        assert (got["sfd_row"][:, :, last // 128:].view(torch.uint8) == POISON).all()


def _deq(q, codes):
    """FP8 values (R, K) x their e8m0 codes (R, K/32), exactly, in float64."""
    scale = F.decode_sf(codes).double().repeat_interleave(32, dim=1)
    return q.float().double() * scale


def _dequant_row(out, t):
    """D_row x SFD_row over the written rows (last, 2N): d x norm_const."""
    m, two_n, last = out["d_row"].shape[0], 2 * t["N"], t["last"]
    return _deq(out["d_row"][:last], unswizzle_sf(out["sfd_row"], m, two_n // 32)[:last, :, 0])


def _dequant_col(out, t, discrete):
    """D_col x SFD_col as (2N, last): d^T x norm_const, per expert for the discrete layout."""
    d_col, sfd_col, two_n, last = out["d_col"], out["sfd_col"], 2 * t["N"], t["last"]
    if not discrete:
        codes = unswizzle_sf(sfd_col, two_n, d_col.shape[0] // 32)[:, :last // 32, 0]
        return _deq(d_col[:last].t(), codes)
    ends = [last] if t["L"] == 1 else t["offs"].tolist()
    parts, start = [], 0
    for e, end in enumerate(ends):
        if end > start:
            view = sfd_col_expert_view(sfd_col, ends, e, two_n)
            parts.append(_deq(d_col[start:end].t(), unswizzle_sf(view, two_n, (end - start) // 32)[..., 0]))
        start = end
    return torch.cat(parts, dim=1)


def _block_scale(g, r):
    """Per element, an upper bound of its block's e8m0 scale in either result: the block's
    largest dequantized magnitude over 224 (a block's largest code is at least 224: the scale
    rounds amax / 448 up by less than 2x)."""
    rows = g.shape[0]
    top = torch.maximum(g.abs(), r.abs()).view(rows, -1, 32).amax(-1, keepdim=True)
    return (top / 224).expand(-1, -1, 32).reshape(rows, -1)


#: one e4m3 step (2^-3 of the value) when both results share the scale; when the scales are
#: one code apart, each rounds by 2^-4 of its own value: 2^-4 (|g| + |r|) <= 0.133 |r|
_E4M3_STEP = 0.14


def _close_fp8(got, want, scale, step=_E4M3_STEP):
    """Dequantized FP8 values one rounding step apart: |got - want| <= step * |want| plus the
    block's subnormal step (``scale`` x 2^-9 for e4m3)."""
    bad = (got - want).abs() > step * want.abs() + scale * 2.0 ** -9 + 1e-30
    assert not bad.any(), (int(bad.sum()), got[bad][:4], want[bad][:4])


MX_CASES = [  # elem, C, mode, act, prob, dbias, discrete_col_sfd
    ("e4m3", torch.bfloat16, "dense", "dswiglu", True, False, False),
    ("e5m2", torch.bfloat16, "discrete", "dgeglu", True, False, True),
    ("e4m3", E4M3, "discrete", "dswiglu", False, True, False),
    ("e5m2", E5M2, "dense", "dgeglu", False, False, True),
    ("e4m3", E5M2, "dense", "dgeglu", True, True, False),
]


@pytest.mark.parametrize("elem,c_dtype,mode,act,prob,dbias,dcs", MX_CASES,
                         ids=["-".join(str(x).replace("torch.", "") for x in c) for c in MX_CASES])
def test_sm90_blockscaled_mxfp8_matches_reference_engine(elem, c_dtype, mode, act, prob, dbias, dcs):
    skip_unless_sm90()
    t = _mx_inputs(elem, c_dtype)
    args = dict(mode=mode, act=act, prob=prob, dbias=dbias, discrete_col_sfd=dcs, amax=True)
    got = _mx_call(t, "sm90_blockscaled", **args)
    ref = _mx_call(t, "reference", **args)
    last, nc = t["last"], t["nc"].item()
    _check_untouched(got, last)
    _check_untouched(ref, last)
    # scale codes: equal but for blocks at a power-of-two boundary, and then one apart
    for k in ("sfd_row", "sfd_col"):
        g, r = _raw(got[k]).int(), _raw(ref[k]).int()
        assert ((g - r).abs() <= 1).all(), k
        assert (g != r).float().mean() < 0.01, (k, (g != r).float().mean())
    # dequantized D (d ~= D * SFD / norm_const): one e4m3 step apart
    row_g, row_r = _dequant_row(got, t), _dequant_row(ref, t)
    _close_fp8(row_g, row_r, _block_scale(row_g, row_r))
    col_g, col_r = _dequant_col(got, t, dcs), _dequant_col(ref, t, dcs)
    _close_fp8(col_g, col_r, _block_scale(col_g, col_r))
    # and close to the fp64 oracle of the dequantized operands (D_row: e4m3's 2^-4 rounding)
    ref64 = _oracle(dict(t, vec=32, c=t["c"].float()), act, prob)
    assert rel_err(row_g / nc, ref64["d"][:last].to(row_g.device)) < 0.07
    if prob:
        assert rel_err(got["dprob"][:last], ref["dprob"][:last]) < TOL["dprob"]
    if dbias:
        assert rel_err(got["dbias"], ref["dbias"]) < TOL["dbias"]
    live = [0, 2, 3]
    assert torch.isinf(got["amax"][1]).all() and (got["amax"][1] < 0).all()
    assert torch.allclose(got["amax"][live], ref["amax"][live], rtol=AMAX_RTOL)


@pytest.mark.parametrize("d_fmt", ["e4m3", "e5m2"])
def test_sm90_blockscaled_fp8_d_without_scales(d_fmt):
    """FP8 D without SFD (class API without sfd tensors): the plain saturating conversion of
    the fp32 result, within one FP8 step of the reference engine's; rows past the last offset
    untouched."""
    skip_unless_sm90()
    d_dtype = MX_ELEM[d_fmt]
    t = _mx_inputs("e4m3", torch.bfloat16)
    got = _mx_call(t, "sm90_blockscaled", sfd=False, d_dtype=d_dtype)
    ref = _mx_call(t, "reference", sfd=False, d_dtype=d_dtype)
    last = t["last"]
    _check_untouched(got, last)
    g, r = got["d_row"][:last].double(), ref["d_row"][:last].double()
    step = 2.0 ** -3 if d_fmt == "e4m3" else 2.0 ** -2
    tiny = 2.0 ** -9 if d_fmt == "e4m3" else 2.0 ** -16
    assert not torch.isnan(g).any()
    assert ((g - r).abs() <= step * r.abs() + tiny).all()
    assert rel_err(got["dprob"][:last], ref["dprob"][:last]) < TOL["dprob"]


@pytest.mark.parametrize("d_dtype", [torch.float8_e5m2, torch.float8_e4m3fn], ids=["e5m2", "e4m3"])
def test_sm90_blockscaled_fp8_d_saturates(d_dtype):
    """FP8 D without SFD past the format's range: +-max, never inf or NaN
    (exact_cases.fp8_d_saturates; the CPU tier runs it on the reference engine)."""
    skip_unless_sm90()
    fp8_d_saturates(d_dtype, "cuda", engine="sm90_blockscaled")


@pytest.mark.parametrize("mode", ["dense", "discrete"])
def test_sm90_blockscaled_mxfp8_single_group(mode):
    """use_single_group_runtime_offsets: one expert whose rows end at M; the offsets tensor
    holds 0 (never read: reading it would leave every output poisoned)."""
    skip_unless_sm90()
    t = _mx_inputs("e4m3", E4M3, single=True)
    got = _mx_call(t, "sm90_blockscaled", mode=mode, single=True, discrete_col_sfd=True, amax=True)
    ref = _mx_call(t, "reference", mode=mode, single=True, discrete_col_sfd=True, amax=True)
    for k in ("sfd_row", "sfd_col"):
        g, r = _raw(got[k]).int(), _raw(ref[k]).int()
        assert ((g - r).abs() <= 1).all() and (g != r).float().mean() < 0.01, k
        assert (g != POISON).all(), k  # every byte of both layouts covers a row below M
    row_g, row_r = _dequant_row(got, t), _dequant_row(ref, t)
    _close_fp8(row_g, row_r, _block_scale(row_g, row_r))
    col_g, col_r = _dequant_col(got, t, True), _dequant_col(ref, t, True)
    _close_fp8(col_g, col_r, _block_scale(col_g, col_r))
    assert rel_err(got["dprob"], ref["dprob"]) < TOL["dprob"]
    assert torch.allclose(got["amax"], ref["amax"], rtol=AMAX_RTOL)


def test_sm90_blockscaled_mxfp8_never_syncs_and_replays():
    """MXFP8 with FP8 C (the conversion, fp32 D and quantizer temporaries): execute runs under
    sync-debug 'error' and in a CUDA graph, whose replay with new values equals an eager
    call byte for byte (same fp32 D: same kernel, same inputs)."""
    skip_unless_sm90()
    t = _mx_inputs("e4m3", E4M3)
    m, n = t["M"], t["N"]
    outs = dict(d_row=torch.empty(m, 2 * n, dtype=E4M3, device="cuda"),
                d_col=torch.empty(m, 2 * n, dtype=E4M3, device="cuda"),
                sfd_row=empty_sf(m, 2 * n // 32, dtype=E8M0, device="cuda"),
                sfd_col=empty_sf(2 * n, m // 32, dtype=E8M0, device="cuda"),
                dprob=torch.zeros(m, device="cuda"))
    op = cudnn.GroupedGemmDglu(
        t["a_q"], t["c"], outs["d_row"], outs["d_col"], t["sfa"], t["offs"], t["alpha"], t["beta"],
        t["prob"], outs["dprob"], sample_b=t["b_q"], sample_sfb=t["sfb"],
        sample_sfd_row=outs["sfd_row"], sample_sfd_col=outs["sfd_col"], sample_norm_const=t["nc"],
        sf_vec_size=32, discrete_col_sfd=True, engine="sm90_blockscaled")
    op.compile()
    assert op.engine_name == "sm90_blockscaled", op.engine_name
    kw = dict(a_tensor=t["a_q"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offs"],
              alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"],
              dprob_tensor=outs["dprob"], b_tensor=t["b_q"], sfb_tensor=t["sfb"],
              d_row_tensor=outs["d_row"], d_col_tensor=outs["d_col"], sfd_row_tensor=outs["sfd_row"],
              sfd_col_tensor=outs["sfd_col"], norm_const_tensor=t["nc"])
    g = _never_syncs_then_captured(op, kw)
    new = _mx_inputs("e4m3", E4M3, seed=1)
    for k in ("a_q", "sfa", "b_q", "sfb", "c", "alpha", "beta", "prob", "nc"):
        t[k].copy_(new[k])
    outs["dprob"].zero_()
    g.replay()
    torch.cuda.synchronize()
    got = {k: v.clone() for k, v in outs.items()}
    outs["dprob"].zero_()
    op.execute(**kw)
    torch.cuda.synchronize()
    last = t["last"]
    for k in ("d_row", "d_col"):
        assert torch.equal(_raw(got[k])[:last], _raw(outs[k])[:last]), k
    for k in ("sfd_row", "sfd_col"):  # the written region: below the last offset
        assert torch.equal(_raw(got[k])[:last // 128 * 512 * 2], _raw(outs[k])[:last // 128 * 512 * 2]), k
    assert rel_err(got["dprob"], outs["dprob"]) < 1e-5


# ------------------------------------------------------------------ 16-bit alpha and beta
# docs/vendor_contract.md §3.5: the block-scaled kernel loads alpha[e] and beta[e] in their own
# dtype, so a bfloat16/float16 alpha**2 is rounded to that dtype and dSwiGLU forms beta * C in
# the promoted 16-bit type. The Hopper kernel reads fp32: the engine hands it an fp32 alpha
# whose fp32 square is that rounded alpha**2 (or one ulp from it), the rounded beta * C as C
# and beta 1 (dSwiGLU), or beta in fp32 (the other activations).

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
#: alphas whose 16-bit squares round far from the exact ones (3.5e-3 relative in bfloat16,
#: 4.5e-4 in float16), so that a missing rounding shows with fp32 D; expert 1 has no rows
_HALF_ALPHAS = {BF16: [1.4921875, 0.53125, 1.0625, 0.74609375],
                FP16: [1.46875, 0.51123046875, 1.0224609375, 0.734375]}

#: (format, weights, act, C, alpha, beta, the dtype beta * C is formed in (None: fp32), D,
#: dbias). NVFP4 with fp32 D needs dbias (the vendor's restriction).
HALF_SCALAR_CASES = [
    ("nvfp4", "dense", "dswiglu", BF16, BF16, BF16, BF16, FP32, True),
    ("mxfp4", "discrete", "dswiglu", BF16, FP16, FP16, FP16, FP32, False),  # C rounded to fp16
    ("mxfp4", "dense", "dswiglu", E4M3, BF16, BF16, BF16, FP32, False),
    ("mxfp4", "dense", "dgeglu", BF16, BF16, BF16, None, FP32, False),  # no beta
    ("nvfp4", "discrete", "dsituglu", FP16, FP16, BF16, None, FP32, True),  # fp32 beta * C
    ("nvfp4", "dense", "dswiglu", BF16, BF16, BF16, BF16, BF16, False),  # amax of 16-bit D
]


@pytest.mark.parametrize("fmt,mode,act,c_dtype,alpha_dtype,beta_dtype,x_dtype,d_dtype,dbias",
                         HALF_SCALAR_CASES,
                         ids=["-".join(str(x).replace("torch.", "") for x in c)
                              for c in HALF_SCALAR_CASES])
def test_sm90_blockscaled_16_bit_alpha_and_beta(fmt, mode, act, c_dtype, alpha_dtype, beta_dtype,
                                                 x_dtype, d_dtype, dbias):
    """The Hopper engine with bfloat16/float16 alpha and beta against the reference engine on
    the same device and the float64 oracle with the kernel's 16-bit roundings: D, dprob,
    dbias, amax. With fp32 D the oracle without the roundings is 3x the bound away, so the
    check can fail; the caller's C, alpha and beta keep their bytes."""
    skip_unless_sm90()
    t = _inputs(fmt)
    t["c"] = (torch.randn(t["M"], 2 * t["N"], device="cuda") * 2).to(c_dtype)
    t["alpha"] = torch.tensor(_HALF_ALPHAS[alpha_dtype], device="cuda").to(alpha_dtype)
    t["beta"] = (torch.rand(t["L"], device="cuda") + 0.5).to(beta_dtype)
    before = {k: t[k].clone() for k in ("c", "alpha", "beta")}
    out = _call(t, "sm90_blockscaled", mode, act, True, d_dtype, dbias)
    ref_eng = _call(t, "reference", mode, act, True, d_dtype, dbias)
    torch.cuda.synchronize()
    for k, v in before.items():
        assert t[k].dtype == v.dtype and torch.equal(t[k].view(torch.uint8), v.view(torch.uint8)), k
    vec = t["vec"]
    a_r = dequantize(t["a_q"], t["sfa"], vec, out_dtype=torch.float64).cpu()
    ws = [dequantize(q, sf, vec, out_dtype=torch.float64).cpu() for q, sf in t["experts"]]
    beta = t["beta"].cpu() if act != "dgeglu" else torch.ones(t["L"])  # dGeGLU: no beta

    def ref(**rounding):
        return oracle(a_r, ws, t["c"].cpu(), t["offs"].cpu(), t["alpha"].cpu(), beta,
                      t["prob"].cpu(), act_func=act, **rounding)

    want, plain = ref(alpha_sq_dtype=alpha_dtype, x_dtype=x_dtype), ref()
    last = int(t["offs"][-1])
    d = out["d_row_tensor"][..., 0][:last]
    assert torch.isfinite(d.float()).all()
    tol = 1e-4 if d_dtype == FP32 else D_TOL[d_dtype]
    assert rel_err(d, ref_eng["d_row_tensor"][..., 0][:last]) < tol
    assert rel_err(d, want["d"][:last].to(d.device)) < tol
    if d_dtype == FP32:
        assert rel_err(want["d"][:last], plain["d"][:last]) > 3 * tol, "the case must show the roundings"
    dprob = out["dprob_tensor"].view(-1)[:last]
    assert rel_err(dprob, ref_eng["dprob_tensor"].view(-1)[:last]) < 1e-4
    # 1e-4: a float16 alpha**2 rounded another way moves dprob by 4.5e-4
    assert rel_err(dprob, want["dprob"][:last].to(d.device)) < 1e-4
    if dbias:
        assert rel_err(out["dbias_tensor"][..., 0], want["dbias"].to(d.device)) < TOL["dbias"]
    if d_dtype != FP32:
        amax, amax_ref = out["amax_tensor"][..., 0], ref_eng["amax_tensor"][..., 0]
        live = [0, 2, 3]
        assert torch.allclose(amax[live], amax_ref[live], rtol=AMAX_RTOL), (amax, amax_ref)


def test_sm90_blockscaled_16_bit_scalars_never_sync_and_replay():
    """bfloat16 alpha and beta (dSwiGLU: the 16-bit beta * C temporary, the expert of each row
    block found on the device, the fp32 alpha): execute runs under sync-debug 'error' and in a
    CUDA graph, whose replay with new alpha, beta and C values equals an eager call."""
    skip_unless_sm90()
    t = _inputs("nvfp4")
    t["alpha"], t["beta"] = t["alpha"].to(BF16), t["beta"].to(BF16)
    m, n = t["M"], t["N"]
    outs = dict(d=torch.empty(m, 2 * n, dtype=BF16, device="cuda"),
                dprob=torch.zeros(m, device="cuda"))
    op = cudnn.GroupedGemmDglu(
        t["a_q"], t["c"], outs["d"], None, t["sfa"], t["offs"], t["alpha"], t["beta"], t["prob"],
        outs["dprob"], sample_b=t["b_q"], sample_sfb=t["sfb"], sf_vec_size=16,
        engine="sm90_blockscaled")
    op.compile()
    assert op.engine_name == "sm90_blockscaled", op.engine_name
    kw = dict(a_tensor=t["a_q"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offs"],
              alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"],
              dprob_tensor=outs["dprob"], b_tensor=t["b_q"], sfb_tensor=t["sfb"],
              d_row_tensor=outs["d"], d_col_tensor=None)
    g = _never_syncs_then_captured(op, kw)
    new = _inputs("nvfp4", seed=1)
    t["c"].copy_(new["c"])
    t["alpha"].copy_(new["alpha"].to(BF16) * 1.5)
    t["beta"].copy_(new["beta"].to(BF16))
    outs["dprob"].zero_()
    g.replay()
    torch.cuda.synchronize()
    got = {k: v.clone() for k, v in outs.items()}
    outs["dprob"].zero_()
    op.execute(**kw)
    torch.cuda.synchronize()
    last = int(t["offs"][-1])
    assert rel_err(got["d"][:last], outs["d"][:last]) < 1e-6
    assert rel_err(got["dprob"], outs["dprob"]) < 1e-5
