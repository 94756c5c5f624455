"""Options whose numerical effect is small, each checked where the arithmetic is exact.

The random-input tests compare bf16 outputs at 8e-3 of max |ref|: one bf16 ulp of an element
(2^-8 relative at most) fits inside that, so an extra or a missing rounding of dbias, of the
activation output or of dprob, a 16-bit alpha**2 rounded in the wrong 16-bit type, or an
amax that lets a NaN through could pass them. Here the operands are small integers and
dyadic fractions, the GEMM is exact, and every sigmoid is exactly 0.5 or 1 (its argument is
0, or at least 40, where the logistic rounds to 1 in fp32 and in float64), so the float64
oracle (tests/support/oracle.py) is exact and each output is fp32-representable before its
own rounding: the engine must match it bit for bit. Each test also shows that the option
moves at least one output on its inputs, so a test cannot pass with the option dropped.
"""
from __future__ import annotations

import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext import contract
from cudnn_ext.quant import dequantize, quantize_nvfp4
from cudnn_ext.reference.grouped_dglu import grouped_dglu_blocks, grouped_dglu_reference

from oracle import oracle

BF16, FP16, FP32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
E8M0 = torch.float8_e8m0fnu

#: Resolution of every D value of ``exact_case`` (alpha**2 >= 2^-2, prob a multiple of 2^-6,
#: the local derivative a multiple of 2^-2): a sum of such values is exact in fp32 while the
#: sum of their magnitudes stays below 2^(24 - 10), which ``assert_exact`` checks.
RES_BITS = 10
SIZES = (512, 0, 256)  # two 256-row blocks and four 128-row tiles in expert 0; an empty expert
N, K, EXTRA = 64, 16, 256

#: dGeGLU with geglu_alpha 64: sigmoid(64 * y1) is 1 for every gate >= 1 (and 0.5 at 0), so
#: y1 = min(gate, 7) and the bounds themselves stay exact; default clamps, linear_offset 1.
GEGLU = dict(act_func="dgeglu", geglu_alpha=64.0)
#: dSwiGLU with gates of 0 and 40: sigmoid is 0.5 and 1.
SWIGLU = dict(act_func="dswiglu")
ACTS = {"dgeglu": GEGLU, "dswiglu": SWIGLU}


def _pick(values, shape, g):
    v = torch.tensor(values, dtype=F64)
    return v[torch.randint(0, len(values), shape, generator=g)]


def exact_case(act: str, seed: int = 0) -> dict:
    """BF16 operands whose every output the float64 oracle computes exactly.

    X = beta * C holds the values the activation sees (beta a power of two per expert, so C
    = X / beta is exact in bf16). dGeGLU gates: 0, 1, 2, the clamp bound 7, and 8 past it;
    ups: both bounds, values past them, and halves in between. dSwiGLU gates: 0 and 40."""
    g = torch.Generator().manual_seed(seed)
    L = len(SIZES)
    offsets = torch.tensor(SIZES).cumsum(0).to(torch.int32)
    m = int(offsets[-1]) + EXTRA
    a = torch.randint(-1, 2, (m, K, 1), generator=g).to(BF16)
    w = torch.randint(-1, 2, (L, N, K), generator=g).to(BF16)
    alpha = torch.tensor([0.5, 1.0, 1.0])
    beta = torch.tensor([2.0, 1.0, 0.5])
    prob = torch.randint(0, 65, (m, 1, 1), generator=g).float() / 64
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
    return dict(act=act, kw=ACTS[act], a=a, w=w, b=w.permute(1, 2, 0), c=c.unsqueeze(-1), x=x,
                offsets=offsets, alpha=alpha, beta=beta, prob=prob, m=m, end=int(offsets[-1]))


def ref_of(t: dict, **kw) -> dict:
    return oracle(t["a"][..., 0], [t["w"][e] for e in range(len(SIZES))], t["c"][..., 0], t["offsets"],
                  t["alpha"], t["beta"], t["prob"], **t["kw"], **kw)


def expert_rows():
    start = 0
    for e, end in enumerate(torch.tensor(SIZES).cumsum(0).tolist()):
        yield e, start, end
        start = end


def assert_exact(t: dict, ref: dict, dbias_init=None) -> None:
    """The oracle's D is a multiple of 2^-RES_BITS and every per-expert column sum of |D|
    (plus |dbias_init|) stays below 2^(24 - RES_BITS): any fp32 summation order is exact."""
    d = ref["d"][: t["end"]]
    assert torch.equal(torch.round(d * 2 ** RES_BITS), d * 2 ** RES_BITS)
    init = torch.zeros(len(SIZES), 2 * N, dtype=F64) if dbias_init is None else dbias_init.double().view(len(SIZES), -1)
    for e, r0, r1 in expert_rows():
        assert ((ref["d"][r0:r1].abs().sum(0) + init[e].abs()) < 2 ** (24 - RES_BITS)).all()
    assert (ref["dprob"].abs() < 2 ** (24 - RES_BITS)).all()


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal dtype and equal values (bit for bit but for the sign of a zero, which a product
    with a zero factor may carry either way)."""
    return got.dtype == want.dtype and torch.equal(got.double(), want.double())


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|, the measure of tests/unit/test_reference.py."""
    return ((got.double() - ref).abs().max() / ref.abs().max()).item()


def to_bf16(x64: torch.Tensor) -> torch.Tensor:
    """One round-to-nearest-even to bf16 of an fp32-representable float64 value."""
    x32 = x64.to(FP32)
    assert torch.equal(x32.double(), x64)
    return x32.to(BF16)


def truncate_bf16(x64: torch.Tensor) -> torch.Tensor:
    """bf16 by dropping the low 16 bits (round toward zero): a rounding mode off by < 1 ulp."""
    return (x64.to(FP32).view(torch.int32) & -65536).view(FP32).to(BF16)


def run_wrapper(t: dict, *, d_dtype=FP32, dprob=None, **kw):
    dprob = torch.zeros(t["m"], 1, 1) if dprob is None else dprob
    return cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=None, padded_offsets=t["offsets"], alpha_tensor=t["alpha"],
        beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=dprob, b_tensor=t["b"], d_dtype=d_dtype,
        **t["kw"], **kw)


def run_class(t: dict, *, d_row, dprob, dbias=None, activation=None):
    op = cudnn.GroupedGemmDglu(
        sample_a=t["a"], sample_c=t["c"], sample_d_row=d_row, sample_d_col=None, sample_sfa=None,
        sample_padded_offsets=t["offsets"], sample_alpha=t["alpha"], sample_beta=t["beta"], sample_prob=t["prob"],
        sample_dprob=dprob, sample_dbias=dbias, sample_activation=activation, sample_b=t["b"], **t["kw"])
    assert op.check_support()
    op.execute(a_tensor=t["a"], c_tensor=t["c"], d_row_tensor=d_row, d_col_tensor=None, sfa_tensor=None,
               padded_offsets=t["offsets"], alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"],
               dprob_tensor=dprob, dbias_tensor=dbias, activation_tensor=activation, b_tensor=t["b"])


def run_blocks(t: dict, *, d_row, dprob, dbias=None, activation=None):
    """The block path (what every CUDA call of the reference engine runs), on the CPU."""
    ops = contract.Operands(a=t["a"], c=t["c"], padded_offsets=t["offsets"], alpha=t["alpha"], beta=t["beta"],
                            prob=t["prob"], dprob=dprob, b=t["b"], d_row=d_row, dbias=dbias, activation=activation)
    problem, pack = contract.normalize(ops, contract.CallConfig(**t["kw"]))
    grouped_dglu_blocks(problem, pack)


def ref_of_with(t: dict, **kw) -> dict:
    """The oracle with ``alpha``, ``beta`` or ``prob`` replaced, and other keywords."""
    args = dict(alpha=t["alpha"], beta=t["beta"], prob=t["prob"])
    args.update({k: kw.pop(k) for k in ("alpha", "beta", "prob") if k in kw})
    return oracle(t["a"][..., 0], [t["w"][e] for e in range(len(SIZES))], t["c"][..., 0], t["offsets"],
                  args["alpha"], args["beta"], args["prob"], **dict(t["kw"], **kw))


def initial_buffers(t: dict, seed: int = 1):
    """A caller's dprob and dbias holding values (multiples of 2^-3) to accumulate into."""
    g = torch.Generator().manual_seed(seed)
    dprob0 = torch.randint(-64, 65, (t["m"],), generator=g).float() / 8
    dbias0 = (torch.randint(-512, 513, (len(SIZES), 2 * N), generator=g).float() / 8).to(BF16)
    return dprob0, dbias0


# --------------------------------------------------------------------------- every output, bit for bit
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("api", ["wrapper", "class", "blocks"])
def test_outputs_are_bit_exact_on_exact_inputs(act, api):
    """D (fp32 from the wrapper, bf16 from the class API and the block path), dprob accumulated
    into the caller's buffer, dbias summed in fp32 and rounded once into the caller's bf16
    dbias, and dGeGLU's activation output, all equal the oracle's exact values (rounded once to
    their storage dtype). Tolerance zero: the masks at the clamp bounds, beta, linear_offset,
    alpha**2, each rounding and each accumulation must all be right."""
    t = exact_case(act)
    m, e = t["m"], t["end"]
    dprob0, dbias0 = initial_buffers(t)
    nan = float("nan")
    if api == "wrapper":  # the wrapper's dbias starts at zero
        dprob = dprob0.clone().view(m, 1, 1)
        out = run_wrapper(t, d_dtype=FP32, dprob=dprob, generate_dbias=True)
        d, dbias, activation, init = out["d_row_tensor"][..., 0], out["dbias_tensor"][..., 0], None, None
    else:
        d = torch.full((m, 2 * N), nan, dtype=BF16)
        dprob, dbias = dprob0.clone(), dbias0.clone()
        activation = torch.full((m, N), nan, dtype=BF16) if act == "dgeglu" else None
        init = dbias0
        if api == "class":
            run_class(t, d_row=d.unsqueeze(-1), dprob=dprob.view(m, 1, 1), dbias=dbias.unsqueeze(-1),
                      activation=None if activation is None else activation.unsqueeze(-1))
        else:
            run_blocks(t, d_row=d, dprob=dprob, dbias=dbias, activation=activation)
    ref = ref_of(t, dprob_init=dprob0, dbias_init=init)
    assert_exact(t, ref, init)
    want_d = ref["d"][:e].float() if d.dtype == FP32 else to_bf16(ref["d"][:e])
    assert same(d[:e], want_d), f"D differs in {(d[:e].double() != want_d.double()).sum()} elements"
    assert same(dprob.view(-1), ref["dprob"].float())  # rows past the last offset: dprob0 untouched
    assert same(dbias.view(len(SIZES), -1), to_bf16(ref["dbias"]))
    if activation is not None:
        assert same(activation[:e], to_bf16(ref["activation"][:e]))
        assert torch.isnan(activation[e:]).all()


def _differs(model: torch.Tensor, want: torch.Tensor) -> int:
    return int((model.double() != want.double()).sum())


@pytest.mark.parametrize("act", list(ACTS))
def test_each_option_moves_the_exact_outputs(act):
    """The zero-tolerance test above can fail for every option here: on its inputs each
    option, dropped or done another way, changes at least one output. On dbias and the
    activation the change is one bf16 ulp in tens of elements (2e-3 to 5e-3 of max |ref|),
    which the 8e-3 tolerance of the random-input tests lets through."""
    t = exact_case(act)
    e = t["end"]
    dprob0, dbias0 = initial_buffers(t)
    ref = ref_of(t, dprob_init=dprob0, dbias_init=dbias0)
    d = ref["d"][:e]
    # beta scales C before the activation (BF16 dGeGLU included)
    assert _differs(ref_of_with(t, beta=torch.ones(len(SIZES)))["d"][:e], d)
    if act == "dgeglu":
        x = t["x"][:e].view(e, -1, 2, 32)
        dv = d.view(e, -1, 2, 32)
        gate, up, dgate, dup = x[:, :, 0], x[:, :, 1], dv[:, :, 0], dv[:, :, 1]
        # the masks keep the gradient at the bounds (and drop it past them): an exclusive mask
        # zeroes these nonzero values
        assert (dgate[gate == 7.0] != 0).sum() > 50 and (dgate[gate > 7.0] == 0).all()
        assert (dup[up == 7.0] != 0).sum() > 50 and (dup[up == -7.0] != 0).sum() > 50
        assert (dup[(up > 7.0) | (up < -7.0)] == 0).all()
        # linear_offset (default 1 for dGeGLU) enters dgate, dprob and the activation
        lo0 = ref_of_with(t, linear_offset=0.0, dprob_init=dprob0)
        assert _differs(lo0["d"][:e], d) and _differs(lo0["dprob"], ref["dprob"])
        assert _differs(lo0["activation"][:e], ref["activation"][:e])
        # the activation: prob * act rounded once to bf16; another rounding is one ulp off somewhere
        act_ref = ref["activation"][:e]
        assert _differs(truncate_bf16(act_ref), to_bf16(act_ref)) > 100
        assert _differs(act_ref.to(FP16).to(BF16), to_bf16(act_ref)) > 10  # rounded twice, via fp16
        assert _differs(ref_of_with(t, prob=torch.ones(t["m"]))["activation"][:e], act_ref)  # prob * act
    # dprob: fp32 row sums added to the caller's buffer (no prob factor)
    rows = ref["dprob"] - dprob0.double()
    assert _differs(dprob0.double() + rows.to(BF16).double(), ref["dprob"]) > 10  # rows rounded to bf16
    assert _differs(rows, ref["dprob"]) > 100  # dprob overwritten
    # dbias = bf16(fp32(dbias0) + column sums of the fp32 D), rounded once per call
    want = to_bf16(ref["dbias"])
    sums = ref["dbias"] - dbias0.double()
    assert _differs(to_bf16(dbias0.double() + to_bf16(sums).double()), want) > 10  # sums rounded first
    assert _differs(truncate_bf16(ref["dbias"]), want) > 10  # another rounding mode
    from_bf16_d = dbias0.double().clone()
    for ex, r0, r1 in expert_rows():
        from_bf16_d[ex] += to_bf16(ref["d"][r0:r1]).double().sum(0)
    assert _differs(to_bf16(from_bf16_d), want) > 10  # summed from the stored bf16 D
    for tile in (128, 256):  # bf16 partials per tile (the vendor's 128 rows) or per 256-row block
        per_tile = dbias0.double().clone()
        for ex, r0, r1 in expert_rows():
            for t0 in range(r0, r1, tile):
                per_tile[ex] = to_bf16(per_tile[ex] + ref["d"][t0:t0 + tile].sum(0)).double()
        assert _differs(per_tile, want) > 10, tile


# --------------------------------------------------------------------------- 16-bit alpha
#: Per non-empty expert (the middle one is empty), alphas whose square rounds differently in
#: bfloat16, in float16 and not at all: 3.5e-3 (bfloat16) and 4.5e-4 (float16) of alpha**2
#: apart, against fp32 noise of at most 1e-7 here.
HALF_ALPHAS = {BF16: [1.4921875, 1.0, 0.74609375], FP16: [1.0224609375, 1.0, 1.4560546875]}
ALPHA_TOL = 2e-6


def _fp4_exact_operands(g):
    """MXFP4 operands (e8m0 scales over 32) of exact values, their float64 dequantized forms,
    and a C of dSwiGLU gates 0 and 40 (sigmoid exactly 0.5 and 1) and dyadic ups:
    ``(offsets, M, a_q, sfa, b_q, sfb, a_r, b_r, c)``."""
    from exact_operands import exact_values

    L, k, vec = len(SIZES), 64, 32
    offsets = torch.tensor(SIZES).cumsum(0).to(torch.int32)
    m = int(offsets[-1]) + EXTRA
    a_q, sfa = quantize_nvfp4(exact_values((m, k), True, vec, g), sf_vec_size=vec, sf_dtype=E8M0)
    b_q, sfb = quantize_nvfp4(exact_values((N, k, L), True, vec, g), sf_vec_size=vec, sf_dtype=E8M0)
    a_r = dequantize(a_q, sfa, vec, out_dtype=F64)
    b_r = dequantize(b_q, sfb, vec, out_dtype=F64)
    gate = _pick([0.0, 40.0], (m, N // 32, 32), g)
    up = _pick([-3.5, -1.5, -0.5, 0.5, 1.0, 2.5], (m, N // 32, 32), g)
    c = torch.stack([gate, up], dim=2).reshape(m, 2 * N).to(BF16)
    return offsets, m, a_q, sfa, b_q, sfb, a_r, b_r, c


@pytest.mark.parametrize("alpha_dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_alpha_squared_is_rounded_in_alphas_own_16_bit_type(alpha_dtype):
    """Block-scaled operands take a 16-bit alpha, and the kernel squares it in alpha's own
    dtype (docs/vendor_contract.md §3.5). MXFP4 operands of the e2m1 grid with unit scales
    (an exact GEMM), gates of 0 and 40 and dyadic ups keep everything else exact to fp32
    noise, so D and dprob must match the oracle with that one rounding, and neither the
    unrounded square nor the square rounded in the other 16-bit type (or alpha converted to it)."""
    g = torch.Generator().manual_seed(7)
    L, vec = len(SIZES), 32
    offsets, m, a_q, sfa, b_q, sfb, a_r, b_r, c = _fp4_exact_operands(g)
    alpha = torch.tensor(HALF_ALPHAS[alpha_dtype]).to(alpha_dtype)
    beta = torch.ones(L)
    prob = torch.randint(0, 17, (m,), generator=g).float() / 16
    dprob = torch.zeros(m)
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=c, sfa_tensor=sfa, padded_offsets=offsets, alpha_tensor=alpha, beta_tensor=beta,
        prob_tensor=prob, dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=vec, d_dtype=FP32,
        engine="reference")
    d = out["d_row_tensor"][..., 0]

    def ref(alpha_values, sq_dtype):
        return oracle(a_r, [b_r[:, :, e] for e in range(L)], c, offsets, alpha_values, beta, prob,
                      alpha_sq_dtype=sq_dtype)

    other = FP16 if alpha_dtype == BF16 else BF16
    want = ref(alpha, alpha_dtype)
    wrong = {"exact square": ref(alpha, None), "square rounded in the other type": ref(alpha, other),
             "alpha converted to the other type": ref(alpha.to(other), other)}
    for e, r0, r1 in expert_rows():
        if r1 == r0:
            continue
        assert rel_err(d[r0:r1], want["d"][r0:r1]) <= ALPHA_TOL, e
        assert rel_err(dprob[r0:r1], want["dprob"][r0:r1]) <= ALPHA_TOL, e
        for name, r in wrong.items():
            assert rel_err(r["d"][r0:r1].float(), want["d"][r0:r1]) > 100 * ALPHA_TOL, (e, name)


# --------------------------------------------------------------------------- amax
def _amax_case(path: str, *, inf: bool):
    """(amax from the engine, the exact expected amax) of FP4 operands on an exact GEMM, bf16
    D. One C gate is NaN in expert 0 (its row's dgate and dup there are NaN); with ``inf`` one
    C up is +inf in expert 2, where the GEMM is nonzero (an infinite dgate, not 0 * inf).
    ``path``: the wrapper (amax allocated at -inf), or the host walk or the block path on a
    caller's amax holding values above and below the computed ones (the kernel's atomic max
    keeps the larger)."""
    g = torch.Generator().manual_seed(11)
    L, vec = len(SIZES), 32
    offsets, m, a_q, sfa, b_q, sfb, a_r, b_r, c = _fp4_exact_operands(g)
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
    for e, r0, r1 in expert_rows():
        if r1 > r0:
            want[e, 0] = max(want[e, 0], d_abs[r0:r1, gate_col].max())
            want[e, 1] = max(want[e, 1], d_abs[r0:r1, gate_col + 32].max())
    if path == "wrapper":
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a_q, c_tensor=c, sfa_tensor=sfa, padded_offsets=offsets, alpha_tensor=alpha,
            beta_tensor=beta, prob_tensor=prob, dprob_tensor=torch.zeros(m), b_tensor=b_q, sfb_tensor=sfb,
            sf_vec_size=vec, d_dtype=BF16, engine="reference")
        return out["amax_tensor"].view(L, 2), want
    amax = amax0.clone()
    ops = contract.Operands(a=a_q, sfa=sfa, c=c, padded_offsets=offsets, alpha=alpha, beta=beta, prob=prob,
                            b=b_q, sfb=sfb, d_row=torch.empty(m, 2 * N, dtype=BF16), amax=amax)
    problem, pack = contract.normalize(ops, contract.CallConfig(sf_vec_size=vec))
    (grouped_dglu_blocks if path == "blocks" else grouped_dglu_reference)(problem, pack)
    return amax, want


@pytest.mark.parametrize("path", ["wrapper", "walk", "blocks"])
def test_amax_is_exact_nan_quiet_and_per_half(path):
    """amax is max |d| of the fp32 values before the cast, per expert and per half (dgate,
    dup), NaN-quiet (reference/blockscaled_run.py: the kernel's per-thread maximum is a
    NaN-quiet fmax, so a NaN never reaches the atomic max), and an expert without rows keeps
    the -inf it was given. Every |d| is exact in fp32, so amax must equal the oracle's maximum
    exactly: the max of the bf16 D (2^-9 relative off) or of the halves swapped would show."""
    amax, want = _amax_case(path, inf=False)
    assert torch.equal(amax.double(), want), (amax, want)
    if path == "wrapper":  # computed maxima in every finite slot: the cast would move them
        assert not torch.equal(want[0].float().to(BF16).double(), want[0])
        assert want[0, 0] != want[0, 1] and want[2, 0] != want[2, 1]
    else:  # the caller's larger values stay, the smaller are replaced
        assert want[0, 0] == 1e6 and want[2, 1] == 1e6 and want[0, 1] > 0.5 and want[2, 0] > 0.25


@pytest.mark.parametrize("path", ["wrapper", "walk", "blocks"])
def test_amax_of_an_infinite_gradient_is_inf(path):
    """An infinite gradient makes amax inf, as the kernel's fmax and atomic max on the float's
    bits do; a NaN-quiet maximum built on torch.nan_to_num's defaults would report FLT_MAX."""
    amax, want = _amax_case(path, inf=True)
    assert want[2, 0] == float("inf")
    assert torch.equal(amax.double(), want), (amax, want)


# --------------------------------------------------------------------------- activation constants
#: Constants that bf16 does not represent (1.702 -> 1.703125, 6.9 -> 6.90625, -6.3 -> -6.3125,
#: 1.7 -> 1.703125, 3.3 -> 3.296875, 20.1 -> 20.125): the kernels take them as fp32.
CONSTANTS = {
    "dgeglu": dict(act_func="dgeglu", geglu_alpha=1.702, glu_clamp_max=6.9, glu_clamp_min=-6.3, linear_offset=1.7),
    "dsituglu": dict(act_func="dsituglu", situ_beta1=3.3, situ_beta2=20.1),
}
CONSTANT_TOL = 2e-6


@pytest.mark.parametrize("act", list(CONSTANTS))
def test_activation_constants_keep_fp32_precision(act):
    """geglu_alpha, the clamps, linear_offset and the dSiTU-GLU betas reach the epilogue as the
    fp32 values the caller gave: every other test uses constants bf16 holds exactly, where a
    constant rounded to 16 bits would change nothing. BF16 dGeGLU (the block-scaled kernel's
    vectorized dGeGLU may clamp in C's dtype, docs/vendor_contract.md §2.4, so it is not pinned
    here) and block-scaled dSiTU-GLU on an exact GEMM: D and dprob within fp32 noise of the
    oracle (about 5e-7 here), while each constant rounded to bf16 moves D by 2e-4 to 1.2 of
    max |D| (the clamps most: some C sit at 6.90625, past 6.9 but not past its rounding)."""
    from exact_operands import exact_values

    kw = CONSTANTS[act]
    g = torch.Generator().manual_seed(3)
    L = len(SIZES)
    offsets = torch.tensor(SIZES).cumsum(0).to(torch.int32)
    m = int(offsets[-1]) + EXTRA
    c = (torch.randn(m, 2 * N, generator=g) * 4).to(BF16)
    prob = torch.rand(m, generator=g)
    dprob = torch.zeros(m)
    if act == "dgeglu":
        a = torch.randint(-2, 3, (m, K), generator=g).to(BF16)
        w = torch.randint(-2, 3, (L, N, K), generator=g).to(BF16)
        alpha, beta = torch.tensor([0.5, 1.0, 1.0]), torch.tensor([1.0, 1.0, 2.0])
        c[::7, ::5] = 6.90625  # above 6.9, at its bf16 rounding: a gradient only if the bound were rounded
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a, c_tensor=c, sfa_tensor=None, padded_offsets=offsets, alpha_tensor=alpha, beta_tensor=beta,
            prob_tensor=prob, dprob_tensor=dprob, b_tensor=w.permute(1, 2, 0), d_dtype=FP32, **kw)
        a64, ws = a.double(), [w[e].double() for e in range(L)]
    else:
        vec = 32
        a_q, sfa = quantize_nvfp4(exact_values((m, 64), True, vec, g), sf_vec_size=vec, sf_dtype=E8M0)
        b_q, sfb = quantize_nvfp4(exact_values((N, 64, L), True, vec, g), sf_vec_size=vec, sf_dtype=E8M0)
        alpha, beta = torch.tensor([0.25, 1.0, 0.125]), torch.tensor([1.0, 1.0, 0.5])
        out = cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a_q, c_tensor=c, sfa_tensor=sfa, padded_offsets=offsets, alpha_tensor=alpha, beta_tensor=beta,
            prob_tensor=prob, dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=vec, d_dtype=FP32,
            engine="reference", **kw)
        a64 = dequantize(a_q, sfa, vec, out_dtype=F64)
        b64 = dequantize(b_q, sfb, vec, out_dtype=F64)
        ws = [b64[:, :, e] for e in range(L)]
    end = int(offsets[-1])
    d = out["d_row_tensor"][..., 0][:end]

    def ref(**consts):
        return oracle(a64, ws, c, offsets, alpha, beta, prob, **dict(kw, **consts))

    want = ref()
    assert rel_err(d, want["d"][:end]) <= CONSTANT_TOL
    assert rel_err(dprob[:end], want["dprob"][:end]) <= CONSTANT_TOL
    for name, value in kw.items():
        if name != "act_func":
            rounded = float(torch.tensor(value).to(BF16))
            assert rounded != value
            assert rel_err(ref(**{name: rounded})["d"][:end], want["d"][:end]) > 50 * CONSTANT_TOL, name
