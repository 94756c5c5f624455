"""Problems whose every output the float64 oracle computes exactly (tests only).

The random-input tests compare bf16 outputs at a few 1e-3 of max |ref|: one bf16 ulp of an
element (2^-8 relative at most) fits inside that, so an extra or a missing rounding of dbias,
of the activation output or of dprob, a 16-bit alpha**2 rounded in the wrong 16-bit type, or
an amax that lets a NaN through could pass them. Here the operands are small integers (BF16,
or MXFP4 whose e8m0 scales keep them as they are), the GEMM is exact, and every sigmoid is
exactly 0.5 or 1 (its argument is 0, or at least 40, where the logistic rounds to 1 in fp32
and in float64), so each output is fp32-representable before its own rounding and an engine
must match the oracle (tests/support/oracle.py) bit for bit.

The builders take a device: the CPU tier (tests/unit/test_small_effects.py) runs them on the
reference engine, the GPU tier (tests/gpu/test_small_effects_gpu.py) on the Hopper engines.
"""
from __future__ import annotations

import torch

import cudnn_ext as cudnn
from cudnn_ext.quant import dequantize, quantize_nvfp4

from exact_operands import exact_values
from oracle import oracle

BF16, FP16, FP32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
E8M0 = torch.float8_e8m0fnu

#: Resolution of every D value of ``exact_case`` (alpha**2 >= 2^-2, prob a multiple of 2^-6,
#: the local derivative a multiple of 2^-2): a sum of such values is exact in fp32 while the
#: sum of their magnitudes stays below 2^(24 - 10), which ``assert_exact`` checks.
RES_BITS = 10
SIZES = (512, 0, 256)  # two 256-row blocks and four 128-row tiles in expert 0; an empty expert
N, K, EXTRA = 64, 16, 256
#: K of the MXFP4 problems: whole 32-element scale blocks
K_FP4 = 32

#: dGeGLU with geglu_alpha 64: sigmoid(64 * y1) is 1 for every gate >= 1 (and 0.5 at 0), so
#: y1 = min(gate, 7) and the bounds themselves stay exact; default clamps, linear_offset 1.
GEGLU = dict(act_func="dgeglu", geglu_alpha=64.0)
#: dSwiGLU with gates of 0 and 40: sigmoid is 0.5 and 1.
SWIGLU = dict(act_func="dswiglu")
ACTS = {"dgeglu": GEGLU, "dswiglu": SWIGLU}


def _pick(values, shape, g):
    v = torch.tensor(values, dtype=F64)
    return v[torch.randint(0, len(values), shape, generator=g)]


def _offsets(sizes) -> torch.Tensor:
    return torch.tensor(sizes).cumsum(0).to(torch.int32)


def exact_case(act: str, seed: int = 0, *, sizes=SIZES, fmt: str = "bf16", device="cpu") -> dict:
    """Operands on ``device`` whose every output the float64 oracle computes exactly.

    ``fmt``: "bf16" (A and B in {-1, 0, 1}, K = 16) or "mxfp4" (the same values quantized
    with e8m0 scales over 32, K = 32). X = beta * C holds the values the activation sees
    (beta a power of two per expert, so C = X / beta is exact in bf16; 1 for block-scaled
    dGeGLU, which reads C without beta). dGeGLU gates: 0, 1, 2, the clamp bound 7, and 8 past
    it; ups: both bounds, values past them, and halves in between. dSwiGLU gates: 0 and 40."""
    g = torch.Generator().manual_seed(seed)
    L = len(sizes)
    k = K if fmt == "bf16" else K_FP4
    offsets = _offsets(sizes)
    m = int(offsets[-1]) + EXTRA
    a = torch.randint(-1, 2, (m, k), generator=g).to(BF16)
    w = torch.randint(-1, 2, (L, N, k), generator=g).to(BF16)
    alpha = torch.tensor([0.5, 1.0, 1.0, 0.5, 1.0][:L])
    beta = torch.tensor([2.0, 1.0, 0.5, 1.0, 2.0][:L])
    if fmt != "bf16" and act == "dgeglu":
        beta = torch.ones(L)
    prob = torch.randint(0, 65, (m,), generator=g).float() / 64
    if act == "dgeglu":
        gate = _pick([0.0, 1.0, 2.0, 7.0, 8.0], (m, N // 32, 32), g)
        up = _pick([-8.0, -7.0, -3.5, -1.5, -0.5, 0.0, 0.5, 2.5, 4.0, 7.0, 7.5], (m, N // 32, 32), g)
    else:
        gate = _pick([0.0, 40.0], (m, N // 32, 32), g)
        up = _pick([-3.5, -2.0, -1.5, -0.5, 0.5, 1.0, 2.5, 3.0], (m, N // 32, 32), g)
    x = torch.stack([gate, up], dim=2).reshape(m, 2 * N)  # 32 gate columns, then 32 up columns
    row_beta = torch.ones(m, dtype=F64)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        row_beta[start:end] = float(beta[e])
        start = end
    c = (x / row_beta[:, None]).to(BF16)
    assert torch.equal(c.double() * row_beta[:, None], x)
    on = lambda v: v.to(device)  # noqa: E731
    t = dict(act=act, kw=ACTS[act], fmt=fmt, sizes=tuple(sizes), k=k, x=x, m=m, end=int(offsets[-1]),
             a64=a.double(), w64=[w[e].double() for e in range(L)], c64=c, alpha64=alpha, beta64=beta,
             prob64=prob, offsets=on(offsets), alpha=on(alpha), beta=on(beta), prob=on(prob).view(m, 1, 1),
             c=on(c).unsqueeze(-1))
    if fmt == "bf16":
        t.update(a=on(a).unsqueeze(-1), b=on(w).permute(1, 2, 0), sf={})
    else:
        a_q, sfa = quantize_nvfp4(on(a.float()), sf_vec_size=32, sf_dtype=E8M0)
        b_q, sfb = quantize_nvfp4(on(w.float()).permute(1, 2, 0), sf_vec_size=32, sf_dtype=E8M0)
        assert torch.equal(dequantize(a_q, sfa, 32, out_dtype=F64).cpu(), a.double())
        t.update(a=a_q, b=b_q, sf=dict(sfa_tensor=sfa, sfb_tensor=sfb), vec=32)
    return t


def expert_rows(t: dict):
    """(expert, first row, end row) of each expert of ``t``."""
    start = 0
    for e, end in enumerate(_offsets(t["sizes"]).tolist()):
        yield e, start, end
        start = end


def ref_of(t: dict, **kw) -> dict:
    """The oracle of ``t``; ``alpha``, ``beta`` or ``prob`` replace the case's, other keywords
    go to the oracle."""
    args = dict(alpha=t["alpha64"], beta=t["beta64"], prob=t["prob64"])
    args.update({k: kw.pop(k) for k in ("alpha", "beta", "prob") if k in kw})
    return oracle(t["a64"], t["w64"], t["c64"], _offsets(t["sizes"]), args["alpha"], args["beta"],
                  args["prob"], **dict(t["kw"], **kw))


def assert_exact(t: dict, ref: dict, dbias_init=None) -> None:
    """The oracle's D is a multiple of 2^-RES_BITS and every per-expert column sum of |D|
    (plus |dbias_init|) stays below 2^(24 - RES_BITS): any fp32 summation order is exact."""
    L = len(t["sizes"])
    d = ref["d"][: t["end"]]
    assert torch.equal(torch.round(d * 2 ** RES_BITS), d * 2 ** RES_BITS)
    init = torch.zeros(L, 2 * N, dtype=F64) if dbias_init is None else dbias_init.double().view(L, -1)
    for e, r0, r1 in expert_rows(t):
        assert ((ref["d"][r0:r1].abs().sum(0) + init[e].abs()) < 2 ** (24 - RES_BITS)).all()
    assert (ref["dprob"].abs() < 2 ** (24 - RES_BITS)).all()


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal dtype and equal values (bit for bit but for the sign of a zero, which a product
    with a zero factor may carry either way)."""
    got = got.cpu()
    return got.dtype == want.dtype and torch.equal(got.double(), want.double())


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|, the measure of tests/unit/test_reference.py."""
    return ((got.cpu().double() - ref).abs().max() / ref.abs().max()).item()


def to_bf16(x64: torch.Tensor) -> torch.Tensor:
    """One round-to-nearest-even to bf16 of an fp32-representable float64 value."""
    x32 = x64.to(FP32)
    assert torch.equal(x32.double(), x64)
    return x32.to(BF16)


def truncate_bf16(x64: torch.Tensor) -> torch.Tensor:
    """bf16 by dropping the low 16 bits (round toward zero): a rounding mode off by < 1 ulp."""
    return (x64.to(FP32).view(torch.int32) & -65536).view(FP32).to(BF16)


def initial_buffers(t: dict, seed: int = 1):
    """A caller's dprob and dbias holding values (multiples of 2^-3) to accumulate into (CPU)."""
    g = torch.Generator().manual_seed(seed)
    dprob0 = torch.randint(-64, 65, (t["m"],), generator=g).float() / 8
    dbias0 = (torch.randint(-512, 513, (len(t["sizes"]), 2 * N), generator=g).float() / 8).to(BF16)
    return dprob0, dbias0


def run_wrapper(t: dict, *, d_dtype=FP32, dprob=None, **kw):
    dprob = torch.zeros(t["m"], 1, 1, device=t["c"].device) if dprob is None else dprob
    extra = dict(t["sf"], sf_vec_size=t["vec"]) if t["sf"] else {}
    return cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=extra.pop("sfa_tensor", None), padded_offsets=t["offsets"],
        alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=dprob, b_tensor=t["b"],
        d_dtype=d_dtype, **extra, **t["kw"], **kw)


def run_class(t: dict, *, d_row, dprob, dbias=None, activation=None, amax=None, engine=None, **kw) -> str:
    """One class-API call of ``t`` on the caller's outputs (``kw``: more of the class's
    keywords); returns the engine's name."""
    sfa, sfb = t["sf"].get("sfa_tensor"), t["sf"].get("sfb_tensor")
    extra = dict(kw, sf_vec_size=t["vec"]) if t["sf"] else dict(kw)
    if engine:
        extra["engine"] = engine
    op = cudnn.GroupedGemmDglu(
        sample_a=t["a"], sample_c=t["c"], sample_d_row=d_row, sample_d_col=None, sample_sfa=sfa,
        sample_padded_offsets=t["offsets"], sample_alpha=t["alpha"], sample_beta=t["beta"], sample_prob=t["prob"],
        sample_dprob=dprob, sample_dbias=dbias, sample_activation=activation, sample_amax=amax, sample_b=t["b"],
        sample_sfb=sfb, **extra, **t["kw"])
    assert op.check_support()
    op.execute(a_tensor=t["a"], c_tensor=t["c"], d_row_tensor=d_row, d_col_tensor=None, sfa_tensor=sfa,
               padded_offsets=t["offsets"], alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"],
               dprob_tensor=dprob, dbias_tensor=dbias, activation_tensor=activation, amax_tensor=amax,
               b_tensor=t["b"], sfb_tensor=sfb)
    return op.engine_name


def bit_exact_outputs(act: str, api: str, *, fmt: str = "bf16", sizes=SIZES, device="cpu", engine=None,
                      **call_kw):
    """Runs ``exact_case`` through ``api`` ("wrapper": fp32 D, dbias from zero; "class": bf16 D
    into the caller's dprob and dbias, and dGeGLU's activation output for BF16 operands) and
    asserts every output equals the oracle's exact value rounded once to its storage dtype.
    ``call_kw`` (e.g. ``m_aligned``) goes to the call. Returns the engine's name (class API)
    or None."""
    t = exact_case(act, sizes=sizes, fmt=fmt, device=device)
    m, e, L = t["m"], t["end"], len(sizes)
    dprob0, dbias0 = initial_buffers(t)
    nan = float("nan")
    name = None
    if api == "wrapper":  # the wrapper's dbias starts at zero
        dprob = dprob0.clone().view(m, 1, 1).to(device)
        out = run_wrapper(t, d_dtype=FP32, dprob=dprob, generate_dbias=True, **call_kw)
        d, dbias, activation, init = out["d_row_tensor"][..., 0], out["dbias_tensor"][..., 0], None, None
    else:
        d = torch.full((m, 2 * N), nan, dtype=BF16, device=device)
        dprob, dbias = dprob0.clone().to(device), dbias0.clone().to(device)
        activation = (torch.full((m, N), nan, dtype=BF16, device=device)
                      if act == "dgeglu" and fmt == "bf16" else None)
        init = dbias0
        name = run_class(t, d_row=d.unsqueeze(-1), dprob=dprob.view(m, 1, 1), dbias=dbias.unsqueeze(-1),
                         activation=None if activation is None else activation.unsqueeze(-1), engine=engine,
                         **call_kw)
    if device != "cpu":
        torch.cuda.synchronize()
    ref = ref_of(t, dprob_init=dprob0, dbias_init=init)
    assert_exact(t, ref, init)
    want_d = ref["d"][:e].float() if d.dtype == FP32 else to_bf16(ref["d"][:e])
    assert same(d[:e], want_d), f"D differs in {(d[:e].cpu().double() != want_d.double()).sum()} elements"
    assert same(dprob.view(-1), ref["dprob"].float())  # rows past the last offset: dprob0 untouched
    assert same(dbias.view(L, -1), to_bf16(ref["dbias"]))
    if activation is not None:
        assert same(activation[:e], to_bf16(ref["activation"][:e]))
        assert torch.isnan(activation[e:]).all()
    return name


# --------------------------------------------------------------------------- 16-bit alpha
#: Per non-empty expert (the middle one is empty), alphas whose square rounds differently in
#: bfloat16, in float16 and not at all: 3.5e-3 (bfloat16) and 4.5e-4 (float16) of alpha**2
#: apart, against fp32 noise of at most 1e-7 here.
HALF_ALPHAS = {BF16: [1.4921875, 1.0, 0.74609375], FP16: [1.0224609375, 1.0, 1.4560546875]}
ALPHA_TOL = 2e-6


def fp4_exact_operands(g, device="cpu"):
    """MXFP4 operands (e8m0 scales over 32) of exact values on ``device``, their float64
    dequantized forms (CPU), and a C of dSwiGLU gates 0 and 40 (sigmoid exactly 0.5 and 1) and
    dyadic ups: ``(offsets, M, a_q, sfa, b_q, sfb, a_r, b_r, c)``."""
    L, k, vec = len(SIZES), 64, 32
    offsets = _offsets(SIZES)
    m = int(offsets[-1]) + EXTRA
    a_q, sfa = quantize_nvfp4(exact_values((m, k), True, vec, g).to(device), sf_vec_size=vec, sf_dtype=E8M0)
    b_q, sfb = quantize_nvfp4(exact_values((N, k, L), True, vec, g).to(device), sf_vec_size=vec, sf_dtype=E8M0)
    a_r = dequantize(a_q, sfa, vec, out_dtype=F64).cpu()
    b_r = dequantize(b_q, sfb, vec, out_dtype=F64).cpu()
    gate = _pick([0.0, 40.0], (m, N // 32, 32), g)
    up = _pick([-3.5, -1.5, -0.5, 0.5, 1.0, 2.5], (m, N // 32, 32), g)
    c = torch.stack([gate, up], dim=2).reshape(m, 2 * N).to(BF16)
    return offsets, m, a_q, sfa, b_q, sfb, a_r, b_r, c


def alpha_squared_case(alpha_dtype, device="cpu", engine="reference"):
    """D and dprob of MXFP4 operands (an exact GEMM) with a 16-bit alpha, and the oracle with
    alpha**2 rounded in ``alpha_dtype`` and three wrong rules: ``(d, dprob, want, wrong)``."""
    g = torch.Generator().manual_seed(7)
    L, vec = len(SIZES), 32
    offsets, m, a_q, sfa, b_q, sfb, a_r, b_r, c = fp4_exact_operands(g, device)
    alpha = torch.tensor(HALF_ALPHAS[alpha_dtype]).to(alpha_dtype)
    beta = torch.ones(L)
    prob = torch.randint(0, 17, (m,), generator=g).float() / 16
    dprob = torch.zeros(m, device=device)
    on = lambda v: v.to(device)  # noqa: E731
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=on(c), sfa_tensor=sfa, padded_offsets=on(offsets), alpha_tensor=on(alpha),
        beta_tensor=on(beta), prob_tensor=on(prob), dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb,
        sf_vec_size=vec, d_dtype=FP32, engine=engine)
    d = out["d_row_tensor"][..., 0].cpu()

    def ref(alpha_values, sq_dtype):
        return oracle(a_r, [b_r[:, :, e] for e in range(L)], c, offsets, alpha_values, beta, prob,
                      alpha_sq_dtype=sq_dtype)

    other = FP16 if alpha_dtype == BF16 else BF16
    wrong = {"exact square": ref(alpha, None), "square rounded in the other type": ref(alpha, other),
             "alpha converted to the other type": ref(alpha.to(other), other)}
    return d, dprob.cpu(), ref(alpha, alpha_dtype), wrong


def check_alpha_squared(d, dprob, want, wrong) -> None:
    """``alpha_squared_case``'s outputs match the oracle with alpha**2 rounded in alpha's type
    within ALPHA_TOL per expert with rows, and every wrong rule is 100x that away."""
    for e, r0, r1 in expert_rows(dict(sizes=SIZES)):
        if r1 == r0:
            continue
        assert rel_err(d[r0:r1], want["d"][r0:r1]) <= ALPHA_TOL, e
        assert rel_err(dprob[r0:r1], want["dprob"][r0:r1]) <= ALPHA_TOL, e
        for name, r in wrong.items():
            assert rel_err(r["d"][r0:r1].float(), want["d"][r0:r1]) > 100 * ALPHA_TOL, (e, name)


# --------------------------------------------------------------------------- amax
def amax_case(path: str, *, inf: bool, device="cpu", engine="reference"):
    """(amax from the engine, the exact expected amax) of FP4 operands on an exact GEMM, bf16
    D. One C gate is NaN in expert 0 (its row's dgate and dup there are NaN); with ``inf`` one
    C up is +inf in expert 2, where the GEMM is nonzero (an infinite dgate, not 0 * inf).
    ``path``: "wrapper" (amax allocated at -inf), or "class", "walk" (the reference engine's
    host walk) and "blocks" (its block path) on a caller's amax holding values above and below
    the computed ones (the kernel's atomic max keeps the larger)."""
    from cudnn_ext import contract
    from cudnn_ext.reference.grouped_dglu import grouped_dglu_blocks, grouped_dglu_reference

    g = torch.Generator().manual_seed(11)
    L, vec = len(SIZES), 32
    offsets, m, a_q, sfa, b_q, sfb, a_r, b_r, c = fp4_exact_operands(g, device)
    end = int(offsets[-1])
    alpha, beta = torch.tensor([0.5, 1.0, 2.0]), torch.ones(L)
    prob = torch.randint(1, 17, (m,), generator=g).float() / 16
    d_abs = oracle(a_r, [b_r[:, :, e] for e in range(L)], c, offsets, alpha, beta, prob)["d"][:end].abs()
    assert torch.equal(d_abs.float().double(), d_abs)  # every |d| exact in fp32
    cols = torch.arange(N)
    gate_col = 64 * (cols // 32) + cols % 32
    r_nan, n_nan = 5, 3
    c[r_nan, gate_col[n_nan]] = float("nan")
    d_abs[r_nan, gate_col[n_nan]] = d_abs[r_nan, gate_col[n_nan] + 32] = -1.0  # ignored by the max
    if inf:
        r_inf = 600
        n_inf = next(n for n in range(N) if d_abs[r_inf, gate_col[n]] != 0)
        c[r_inf, gate_col[n_inf] + 32] = float("inf")
        d_abs[r_inf, gate_col[n_inf]] = float("inf")
    amax0 = torch.tensor([[1e6, 0.5], [float("-inf"), 7.0], [0.25, 1e6]])
    want = torch.full((L, 2), float("-inf"), dtype=F64) if path == "wrapper" else amax0.double()
    for e, r0, r1 in expert_rows(dict(sizes=SIZES)):
        if r1 > r0:
            want[e, 0] = max(want[e, 0], d_abs[r0:r1, gate_col].max())
            want[e, 1] = max(want[e, 1], d_abs[r0:r1, gate_col + 32].max())
    on = lambda v: v.to(device)  # noqa: E731
    args = dict(c=on(c), offsets=on(offsets), alpha=on(alpha), beta=on(beta), prob=on(prob))
    if path == "wrapper":
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a_q, c_tensor=args["c"], sfa_tensor=sfa, padded_offsets=args["offsets"],
            alpha_tensor=args["alpha"], beta_tensor=args["beta"], prob_tensor=args["prob"],
            dprob_tensor=torch.zeros(m, device=device), b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=vec,
            d_dtype=BF16, engine=engine)
        return out["amax_tensor"].view(L, 2).cpu(), want
    amax = on(amax0.clone())
    d_row = torch.empty(m, 2 * N, dtype=BF16, device=device)
    if path == "class":
        t = dict(a=a_q, c=args["c"], offsets=args["offsets"], alpha=args["alpha"], beta=args["beta"],
                 prob=args["prob"], b=b_q, sf=dict(sfa_tensor=sfa, sfb_tensor=sfb), vec=vec, kw={})
        run_class(t, d_row=d_row, dprob=None, amax=amax, engine=engine)
        if device != "cpu":
            torch.cuda.synchronize()
        return amax.cpu(), want
    ops = contract.Operands(a=a_q, sfa=sfa, c=args["c"], padded_offsets=args["offsets"], alpha=args["alpha"],
                            beta=args["beta"], prob=args["prob"], b=b_q, sfb=sfb, d_row=d_row, amax=amax)
    problem, pack = contract.normalize(ops, contract.CallConfig(sf_vec_size=vec))
    (grouped_dglu_blocks if path == "blocks" else grouped_dglu_reference)(problem, pack)
    return amax, want


# --------------------------------------------------------------------------- activation constants
#: Constants that bf16 does not represent (1.702 -> 1.703125, 6.9 -> 6.90625, -6.3 -> -6.3125,
#: 1.7 -> 1.703125, 3.3 -> 3.296875, 20.1 -> 20.125): the kernels take them as fp32.
CONSTANTS = {
    "dgeglu": dict(act_func="dgeglu", geglu_alpha=1.702, glu_clamp_max=6.9, glu_clamp_min=-6.3, linear_offset=1.7),
    "dsituglu": dict(act_func="dsituglu", situ_beta1=3.3, situ_beta2=20.1),
}


def constants_case(act: str, device="cpu", engine="reference"):
    """D and dprob (fp32, rows below the last offset) of an exact GEMM with the activation
    constants of ``CONSTANTS[act]`` (BF16 dGeGLU; block-scaled dSiTU-GLU on ``engine``), and
    ``ref(**constants)``, the oracle with constants replaced: ``(d, dprob, ref)``."""
    kw = CONSTANTS[act]
    g = torch.Generator().manual_seed(3)
    L = len(SIZES)
    offsets = _offsets(SIZES)
    m = int(offsets[-1]) + EXTRA
    c = (torch.randn(m, 2 * N, generator=g) * 4).to(BF16)
    prob = torch.rand(m, generator=g)
    dprob = torch.zeros(m, device=device)
    on = lambda v: v.to(device)  # noqa: E731
    if act == "dgeglu":
        a = torch.randint(-2, 3, (m, K), generator=g).to(BF16)
        w = torch.randint(-2, 3, (L, N, K), generator=g).to(BF16)
        alpha, beta = torch.tensor([0.5, 1.0, 1.0]), torch.tensor([1.0, 1.0, 2.0])
        c[::7, ::5] = 6.90625  # above 6.9, at its bf16 rounding: a gradient only if the bound were rounded
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=on(a), c_tensor=on(c), sfa_tensor=None, padded_offsets=on(offsets), alpha_tensor=on(alpha),
            beta_tensor=on(beta), prob_tensor=on(prob), dprob_tensor=dprob, b_tensor=on(w).permute(1, 2, 0),
            d_dtype=FP32, **kw)
        a64, ws = a.double(), [w[e].double() for e in range(L)]
    else:
        vec = 32
        a_q, sfa = quantize_nvfp4(on(exact_values((m, 64), True, vec, g)), sf_vec_size=vec, sf_dtype=E8M0)
        b_q, sfb = quantize_nvfp4(on(exact_values((N, 64, L), True, vec, g)), sf_vec_size=vec, sf_dtype=E8M0)
        alpha, beta = torch.tensor([0.25, 1.0, 0.125]), torch.tensor([1.0, 1.0, 0.5])
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a_q, c_tensor=on(c), sfa_tensor=sfa, padded_offsets=on(offsets), alpha_tensor=on(alpha),
            beta_tensor=on(beta), prob_tensor=on(prob), dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb,
            sf_vec_size=vec, d_dtype=FP32, engine=engine, **kw)
        a64 = dequantize(a_q, sfa, vec, out_dtype=F64).cpu()
        b64 = dequantize(b_q, sfb, vec, out_dtype=F64).cpu()
        ws = [b64[:, :, e] for e in range(L)]
    end = int(offsets[-1])

    def ref(**consts):
        return oracle(a64, ws, c, offsets, alpha, beta, prob, **dict(kw, **consts))

    return out["d_row_tensor"][..., 0][:end].cpu(), dprob[:end].cpu(), ref


def check_constants(act: str, d, dprob, ref, tol: float, effect: float) -> None:
    """``constants_case``'s D and dprob within ``tol`` of the oracle, while each constant
    rounded to bf16 moves D by more than ``effect`` x ``tol``."""
    want = ref()
    end = d.shape[0]
    assert rel_err(d, want["d"][:end]) <= tol
    assert rel_err(dprob, want["dprob"][:end]) <= tol
    for name, value in CONSTANTS[act].items():
        if name != "act_func":
            rounded = float(torch.tensor(value).to(BF16))
            assert rounded != value
            assert rel_err(ref(**{name: rounded})["d"][:end], want["d"][:end]) > effect * tol, name


# --------------------------------------------------------------------------- FP8 D saturation
def fp8_d_saturates(d_dtype, device="cpu", engine=None) -> None:
    """FP8 D without SFD (the class API with no SFD outputs) on MXFP8 operands scaled so that
    D passes the format's range: those values saturate to +-max, as the kernel's
    cvt.rn.satfinite does, never inf or NaN; the rest are within FP8's step of the oracle."""
    from cudnn_ext.quant import quantize_mxfp8

    m, n, k = 256, 32, 64
    g = torch.Generator().manual_seed(11)
    a_q, sfa = quantize_mxfp8((torch.randn(m, k, generator=g) * 8).to(device))
    b_q, sfb = quantize_mxfp8((torch.randn(n, k, 1, generator=g) * 8).to(device))
    c = (torch.randn(m, 2 * n, generator=g) * 3).to(BF16)
    offs, alpha, beta = torch.tensor([m], dtype=torch.int32), torch.full((1,), 4.0), torch.ones(1)
    prob = torch.ones(m, 1, 1)
    on = lambda v: v.to(device)  # noqa: E731
    d_row = torch.full((m, 2 * n, 1), float("nan"), device=device).to(d_dtype)
    d_col, dprob = torch.empty_like(d_row), torch.zeros(m, 1, 1, device=device)
    extra = dict(engine=engine) if engine else {}
    op = cudnn.GroupedGemmDglu(sample_a=a_q, sample_c=on(c), sample_d_row=d_row, sample_d_col=d_col,
                               sample_sfa=sfa, sample_padded_offsets=on(offs), sample_alpha=on(alpha),
                               sample_beta=on(beta), sample_prob=on(prob), sample_dprob=dprob, sample_b=b_q,
                               sample_sfb=sfb, sf_vec_size=32, **extra)
    assert op.check_support()
    op.execute(a_tensor=a_q, c_tensor=on(c), d_row_tensor=d_row, d_col_tensor=d_col, sfa_tensor=sfa,
               padded_offsets=on(offs), alpha_tensor=on(alpha), beta_tensor=on(beta), prob_tensor=on(prob),
               dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb)
    ref = oracle(dequantize(a_q, sfa, 32, out_dtype=F64).cpu(),
                 [dequantize(b_q, sfb, 32, out_dtype=F64)[:, :, 0].cpu()], c, offs, alpha, beta, prob.view(m))["d"]
    top = torch.finfo(d_dtype).max
    d = d_row[..., 0].cpu().double()
    assert torch.isfinite(d).all()
    over = ref.abs() > 1.01 * top
    assert over.sum() > 50, "the case must push values past the format's range"
    assert torch.equal(d[over], torch.sign(ref[over]) * top)
    inside = ref.abs() < top / 2
    assert ((d[inside] - ref[inside]).abs() <= 0.13 * ref[inside].abs() + 1e-3).all()  # 2-3 mantissa bits
