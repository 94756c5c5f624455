"""The reference engine (and, through it, the wrapper and the class API on CPU) against the
independent float64 oracle of ``tests/support/oracle.py`` (autograd of the forward GLU).

Every comparison uses a named tolerance policy from ``TOL`` (max |got - ref| / max |ref| over
the compared region) and prints how to reproduce a failure (seed, shapes, configuration).
Shapes are small (K <= 256, N <= 128, M <= 2048): the whole file runs in seconds on a CPU.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext import contract
from cudnn_ext.reference import reference_outputs

from oracle import clamp_grad_is_inclusive, oracle

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DT = {"bf16": BF16, "fp16": FP16, "fp32": FP32}

#: Tolerance policies, relative to max |ref| of the compared region. The reference engine
#: computes in fp32 from exactly representable inputs, so its own error is ~1e-6; what remains
#: is the rounding of the stored output: bf16 2^-9, fp16 2^-12 of the largest element.
TOL = {
    "d": {BF16: 8e-3, FP16: 1.5e-3, FP32: 2e-5},
    "dprob": 2e-5,            # fp32 buffer, fp32 row sums
    "dbias": 8e-3,            # bf16 buffer, fp32 accumulation rounded once
    "activation": 8e-3,       # bf16 output
    "exact_f64": 1e-12,       # the reference engine's math run in float64 vs the oracle
    # g0 rounded to bf16 from an exact GEMM (integer operands, power-of-two alpha): the same
    # rounding in fp32 and float64, so only the fp32 epilogue's error is left
    "rounded_dgrad": 1e-5,
}

GEGLU_CUSTOM = dict(geglu_alpha=1.25, glu_clamp_max=3.5, glu_clamp_min=-2.25, linear_offset=0.375)
ACTS = {
    "dswiglu": dict(act_func="dswiglu"),
    "dgeglu": dict(act_func="dgeglu"),
    "dgeglu_custom": dict(act_func="dgeglu", **GEGLU_CUSTOM),
    "dgeglu_dsv4": dict(act_func="dgeglu", geglu_alpha=1.0, linear_offset=0.0, glu_clamp_max=10.0,
                        glu_clamp_min=-10.0),
}


def seed_of(*parts) -> int:
    """A stable seed per test case (printed on failure; rerun by this id)."""
    return zlib.crc32(repr(parts).encode())


# --------------------------------------------------------------------------- inputs
@dataclass
class Inputs:
    seed: int
    sizes: list
    n: int
    k: int
    mode: str
    a: torch.Tensor
    c: torch.Tensor
    offsets: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor
    prob: torch.Tensor
    weights: list  # logical (N, K) bf16 matrix of each expert (the oracle's view)
    b: Optional[torch.Tensor] = None
    b_ptrs: Optional[torch.Tensor] = None
    b_major: str = "k"
    keep: list = field(default_factory=list)  # per-expert storage behind b_ptrs

    @property
    def m(self):
        return self.a.shape[0]

    @property
    def end(self):
        return int(self.offsets[-1]) if len(self.sizes) else 0

    def ctx(self, **extra) -> str:
        kv = " ".join(f"{k}={v}" for k, v in extra.items())
        return (f"[reproduce: seed={self.seed} sizes={self.sizes} M={self.m} N={self.n} K={self.k} "
                f"L={len(self.sizes)} mode={self.mode} c={self.c.dtype} {kv}]")

    def weight_kwargs(self) -> dict:
        if self.b is not None:
            return dict(b_tensor=self.b)
        return dict(b_ptrs=self.b_ptrs, n=self.n, b_dtype=BF16, b_major=self.b_major)

    def oracle(self, **kw):
        return oracle(self.a[..., 0], self.weights, self.c[..., 0], self.offsets, self.alpha, self.beta,
                      self.prob, **kw)


def make_inputs(seed, sizes, *, n=64, k=128, extra=256, c_dtype=BF16, mode="dense-k", c_scale=2.5,
                zero_prob=0.1, beta_range=(0.5, 2.0), exact_gemm=False) -> Inputs:
    """Random operands. ``sizes``: padded rows per expert (multiples of 256, 0 = empty group);
    ``extra`` rows past the last offset; ``mode``: dense-k, dense-n, discrete-k, discrete-n.
    ``exact_gemm``: A and B small integers and alpha a power of two, so alpha**2 * (A @ B^T)
    is exact in fp32 (no rounding-boundary flips between fp32 and float64)."""
    g = torch.Generator().manual_seed(seed)
    L = len(sizes)
    offsets = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)
    m = int(offsets[-1]) + extra
    if exact_gemm:
        a = torch.randint(-8, 9, (m, k, 1), generator=g).to(BF16)
        w = torch.randint(-8, 9, (L, n, k), generator=g).to(BF16)
    else:
        a = torch.randn(m, k, 1, generator=g).to(BF16)
        w = (torch.randn(L, n, k, generator=g) / k ** 0.5).to(BF16)
    c = (torch.randn(m, 2 * n, 1, generator=g) * c_scale).to(c_dtype)
    alpha = torch.empty(L).uniform_(0.25, 2.0, generator=g)
    if exact_gemm:
        alpha = 2.0 ** torch.randint(-3, 1, (L,), generator=g).float()
    beta = torch.empty(L).uniform_(*beta_range, generator=g)
    prob = torch.rand(m, 1, 1, generator=g)
    prob[torch.rand(m, 1, 1, generator=g) < zero_prob] = 0.0
    inp = Inputs(seed, list(sizes), n, k, mode, a, c, offsets, alpha, beta, prob, [w[e] for e in range(L)])
    if mode == "dense-k":
        inp.b = w.permute(1, 2, 0)  # (N, K, L), stride (K, 1, N*K)
        assert inp.b.stride() == (k, 1, n * k)
    elif mode == "dense-n":
        inp.b = w.transpose(1, 2).contiguous().permute(2, 1, 0)  # (N, K, L), stride (1, N, N*K)
        assert inp.b.stride() == (1, n, n * k)
    elif mode in ("discrete-k", "discrete-n"):
        inp.b_major = mode[-1]
        # K-major: each expert stored as a contiguous (N, K); N-major: a contiguous (K, N)
        inp.keep = [w[e].clone() if inp.b_major == "k" else w[e].t().contiguous() for e in range(L)]
        inp.b_ptrs = torch.tensor([t.data_ptr() for t in inp.keep], dtype=torch.int64)
    else:
        raise ValueError(mode)
    return inp


# --------------------------------------------------------------------------- comparisons
def rel_err(got, ref) -> float:
    got, ref = got.to(torch.float64), ref.to(torch.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if ref.numel() == 0:
        return 0.0
    scale = ref.abs().max().item()
    return (got - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def check(name, got, ref, tol, ctx):
    got64 = got.to(torch.float64)
    assert torch.isfinite(got64).all(), f"{name}: non-finite values {ctx}"
    err = rel_err(got64, ref)
    assert err <= tol, f"{name}: max|err|/max|ref| = {err:.3e} > {tol:.1e} {ctx}"
    return err


def same_bits(x, y) -> bool:
    """Bitwise equality (NaN payloads included)."""
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    return torch.equal(x.contiguous().view(carrier), y.contiguous().view(carrier))


def check_all(inp, out, ref, *, d_dtype, ctx, dbias=True):
    e = inp.end
    check("d_row", out["d_row_tensor"][:e, :, 0], ref["d"][:e], TOL["d"][d_dtype], ctx)
    check("dprob", out["dprob_tensor"].view(-1), ref["dprob"], TOL["dprob"], ctx)
    if dbias:
        check("dbias", out["dbias_tensor"][..., 0], ref["dbias"], TOL["dbias"], ctx)


def run_wrapper(inp, *, d_dtype=BF16, dprob=None, **kw):
    dprob = torch.zeros(inp.m, 1, 1) if dprob is None else dprob
    return cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=inp.a, c_tensor=inp.c, sfa_tensor=None, padded_offsets=inp.offsets, alpha_tensor=inp.alpha,
        beta_tensor=inp.beta, prob_tensor=inp.prob, dprob_tensor=dprob, d_dtype=d_dtype,
        **inp.weight_kwargs(), **kw)


def make_op(inp, *, d_row, dprob, dbias=None, activation=None, **kw):
    weights = (dict(sample_b=inp.b) if inp.b is not None else
               dict(num_experts=len(inp.sizes), b_shape=(inp.n, inp.k), b_dtype=BF16, b_major=inp.b_major))
    op = cudnn.GroupedGemmDglu(
        sample_a=inp.a, sample_c=inp.c, sample_d_row=d_row, sample_d_col=None, sample_sfa=None,
        sample_padded_offsets=inp.offsets, sample_alpha=inp.alpha, sample_beta=inp.beta, sample_prob=inp.prob,
        sample_dprob=dprob, sample_dbias=dbias, sample_activation=activation, **weights, **kw)
    assert op.check_support()
    op.compile()
    return op


def execute(op, inp, *, d_row, dprob, dbias=None, activation=None):
    w = dict(b_tensor=inp.b) if inp.b is not None else dict(b_ptrs=inp.b_ptrs)
    op.execute(a_tensor=inp.a, c_tensor=inp.c, d_row_tensor=d_row, d_col_tensor=None, sfa_tensor=None,
               padded_offsets=inp.offsets, alpha_tensor=inp.alpha, beta_tensor=inp.beta, prob_tensor=inp.prob,
               dprob_tensor=dprob, dbias_tensor=dbias, activation_tensor=activation, **w)


# --------------------------------------------------------------------------- the oracle itself
def test_oracle_clamp_gradient_is_inclusive():
    # The oracle relies on torch.clamp passing the gradient at exactly the bound (the
    # contract's inclusive masks); torch.minimum would split it 0.5/0.5 at a tie.
    assert clamp_grad_is_inclusive()
    x = torch.tensor([7.0, 7.0 + 2 ** -20, -7.0, -7.0 - 2 ** -20], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(torch.clamp(x, min=-7.0, max=7.0).sum(), x)
    assert g.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_sanity_swapped_gate_up_oracle_mismatches():
    """The comparison can fail: an oracle that reads up-first instead of gate-first disagrees."""
    for act in ("dswiglu", "dgeglu"):
        inp = make_inputs(seed_of("swap", act), [256, 512], n=64, k=64)
        out = run_wrapper(inp, d_dtype=FP32, generate_dbias=True, **ACTS[act])
        good = inp.oracle(**ACTS[act])
        bad = inp.oracle(**ACTS[act], swap_gate_up=True)
        e = inp.end
        assert rel_err(out["d_row_tensor"][:e, :, 0], good["d"][:e]) <= TOL["d"][FP32]
        assert rel_err(out["d_row_tensor"][:e, :, 0], bad["d"][:e]) > 100 * TOL["d"][FP32], inp.ctx(act=act)
        # and an oracle whose dprob carried a prob factor would disagree too
        assert rel_err(out["dprob_tensor"].view(-1), good["dprob"] * inp.prob.view(-1).double()) > 100 * TOL["dprob"]


# --------------------------------------------------------------------------- exact math (float64)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("mode", ["dense-k", "discrete-n"])
def test_reference_math_in_float64_matches_oracle(act, mode):
    """reference_outputs in float64: only the formulas differ from the oracle, so ~exact."""
    inp = make_inputs(seed_of("f64", act, mode), [256, 0, 512], n=96, k=64, c_dtype=FP32, mode=mode, c_scale=4.0)
    dprob_init = torch.randn(inp.m)
    problem, pack = contract.normalize(
        contract.Operands(a=inp.a, c=inp.c, padded_offsets=inp.offsets, alpha=inp.alpha, beta=inp.beta,
                          prob=inp.prob, dprob=torch.zeros(inp.m, 1, 1), b=inp.b, b_ptrs=inp.b_ptrs),
        contract.CallConfig(b_major=inp.b_major, **ACTS[act]),
        n=inp.n if inp.b is None else None, b_dtype=BF16 if inp.b is None else None, generate_dbias=True)
    got = reference_outputs(problem, pack, compute_dtype=torch.float64, dprob_init=dprob_init)
    ref = inp.oracle(**ACTS[act], dprob_init=dprob_init)
    e, ctx = inp.end, inp.ctx(act=act)
    check("d_row", got["d_row"][:e], ref["d"][:e], TOL["exact_f64"], ctx)
    check("dprob", got["dprob"], ref["dprob"], TOL["exact_f64"], ctx)
    check("dbias", got["dbias"], ref["dbias"], TOL["exact_f64"], ctx)
    # with these magnitudes some values were clamped, so the masks were exercised
    if act.startswith("dgeglu"):
        cmax = ACTS[act].get("glu_clamp_max", 7.0)
        assert (inp.c[: e, :, 0].double().abs() * inp.beta.max() > cmax).any()


# --------------------------------------------------------------------------- wrapper, dtypes
@pytest.mark.parametrize("act", ["dswiglu", "dgeglu", "dgeglu_custom"])
@pytest.mark.parametrize("c_name", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("d_name", ["bf16", "fp16", "fp32"])
def test_wrapper_matches_oracle(act, c_name, d_name):
    c_dtype, d_dtype = DT[c_name], DT[d_name]
    seed = seed_of("wrapper", act, c_name, d_name)
    # skewed sizes, one empty group in the middle, padding rows past the last offset
    inp = make_inputs(seed, [512, 0, 256, 768], n=64, k=128, c_dtype=c_dtype)
    dprob = torch.randn(inp.m, 1, 1)  # the wrapper accumulates into the caller's buffer
    dprob0 = dprob.clone()
    out = run_wrapper(inp, d_dtype=d_dtype, dprob=dprob, generate_dbias=True, **ACTS[act])
    ref = inp.oracle(**ACTS[act], dprob_init=dprob0)
    ctx = inp.ctx(act=act, d=d_name)
    assert out["d_row_tensor"].dtype == d_dtype and out["d_row_tensor"].shape == (inp.m, 2 * inp.n, 1)
    assert out["dbias_tensor"].dtype == BF16 and out["dbias_tensor"].shape == (len(inp.sizes), 2 * inp.n, 1)
    assert out["dprob_tensor"] is dprob
    check_all(inp, out, ref, d_dtype=d_dtype, ctx=ctx)
    e = inp.end
    assert same_bits(dprob[e:], dprob0[e:]), f"dprob rows past the last offset changed {ctx}"
    assert torch.count_nonzero(out["dbias_tensor"][1]) == 0, f"empty expert's dbias is not 0 {ctx}"
    # prob = 0 rows: D is zero there but dprob (no prob factor) is not
    zero = (inp.prob.view(-1)[:e] == 0).nonzero().view(-1)
    assert zero.numel() > 0
    assert torch.count_nonzero(out["d_row_tensor"][zero]) == 0, ctx
    assert (out["dprob_tensor"].view(-1)[zero] != dprob0.view(-1)[zero]).any(), ctx


# --------------------------------------------------------------------------- weight layouts
@pytest.mark.parametrize("mode", ["dense-k", "dense-n", "discrete-k", "discrete-n"])
@pytest.mark.parametrize("act", ["dswiglu", "dgeglu_custom"])
def test_weight_modes_match_oracle(mode, act):
    inp = make_inputs(seed_of("modes", mode, act), [256, 512, 0, 256], n=128, k=256, mode=mode, extra=0)
    out = run_wrapper(inp, d_dtype=FP32, generate_dbias=True, **ACTS[act])
    check_all(inp, out, inp.oracle(**ACTS[act]), d_dtype=FP32, ctx=inp.ctx(act=act))


def test_discrete_n_major_is_not_read_as_k_major():
    """b_major matters: N-major storage declared as K-major gives a different (wrong) result."""
    inp = make_inputs(seed_of("bmajor"), [256, 256], n=64, k=64, mode="discrete-n")
    e = inp.end  # rows past the last offset are unspecified (torch.empty): compare written rows only
    right = run_wrapper(inp, d_dtype=FP32)["d_row_tensor"][:e, :, 0].clone()
    inp.b_major = "k"
    wrong = run_wrapper(inp, d_dtype=FP32)["d_row_tensor"][:e, :, 0]
    assert rel_err(wrong, right) > 0.1


# --------------------------------------------------------------------------- class API, memory
@pytest.mark.parametrize("mode", ["dense-k", "discrete-k", "discrete-n"])
@pytest.mark.parametrize("act", ["dswiglu", "dgeglu_custom"])
def test_class_api_writes_only_declared_rows_and_accumulates(mode, act):
    inp = make_inputs(seed_of("class", mode, act), [0, 512, 0, 256, 0], n=64, k=128, mode=mode, extra=512)
    L, m, two_n, e = len(inp.sizes), inp.m, 2 * inp.n, inp.end
    poison = 12345.0
    d_row = torch.full((m, two_n, 1), poison, dtype=FP16)
    dprob = torch.randn(m, 1, 1)
    dbias = torch.randn(L, two_n, 1).to(BF16)
    dprob0, dbias0 = dprob.clone(), dbias.clone()
    inputs_before = {k: v.clone() for k, v in dict(a=inp.a, c=inp.c, offsets=inp.offsets, alpha=inp.alpha,
                                                   beta=inp.beta, prob=inp.prob).items()}
    op = make_op(inp, d_row=d_row, dprob=dprob, dbias=dbias, **ACTS[act])
    assert same_bits(dprob, dprob0) and same_bits(dbias, dbias0)  # compile touches nothing
    execute(op, inp, d_row=d_row, dprob=dprob, dbias=dbias)
    ref = inp.oracle(**ACTS[act], dprob_init=dprob0, dbias_init=dbias0)
    ctx = inp.ctx(act=act)
    check("d_row", d_row[:e, :, 0], ref["d"][:e], TOL["d"][FP16], ctx)
    check("dprob", dprob.view(-1), ref["dprob"], TOL["dprob"], ctx)
    check("dbias", dbias[..., 0], ref["dbias"], TOL["dbias"], ctx)
    assert (d_row[e:] == poison).all(), f"rows past the last offset were written {ctx}"
    assert same_bits(dprob[e:], dprob0[e:]), ctx
    for g in (0, 2, 4):  # empty experts: dbias untouched
        assert same_bits(dbias[g], dbias0[g]), f"dbias of empty expert {g} changed {ctx}"
    for k, v in inputs_before.items():
        assert same_bits(getattr(inp, k), v), f"input {k} was modified {ctx}"
    for t, t0 in zip(inp.keep, [w.clone() for w in inp.keep]):
        assert same_bits(t, t0)
    # a second execute accumulates again into dprob and dbias
    execute(op, inp, d_row=d_row, dprob=dprob, dbias=dbias)
    ref2 = inp.oracle(**ACTS[act], dprob_init=ref["dprob"], dbias_init=ref["dbias"])
    check("dprob (2nd)", dprob.view(-1), ref2["dprob"], TOL["dprob"], ctx)
    check("dbias (2nd)", dbias[..., 0], ref2["dbias"], 2 * TOL["dbias"], ctx)


@pytest.mark.parametrize("sizes", [[0, 0, 256], [256, 0, 0], [0, 256, 0], [0, 0, 0], [512]],
                         ids=["first-empty", "last-empty", "both-ends-empty", "all-empty", "single-expert"])
def test_empty_groups_and_single_expert(sizes):
    inp = make_inputs(seed_of("empty", sizes), sizes, n=32, k=64, extra=256)
    m, two_n, e = inp.m, 2 * inp.n, inp.end
    d_row = torch.full((m, two_n, 1), float("nan"), dtype=BF16)
    dprob = torch.randn(m, 1, 1)
    dprob0 = dprob.clone()
    dbias = torch.zeros(len(sizes), two_n, 1, dtype=BF16)
    op = make_op(inp, d_row=d_row, dprob=dprob, dbias=dbias, act_func="dgeglu")
    execute(op, inp, d_row=d_row, dprob=dprob, dbias=dbias)
    ref = inp.oracle(act_func="dgeglu", dprob_init=dprob0)
    ctx = inp.ctx()
    if e:
        check("d_row", d_row[:e, :, 0], ref["d"][:e], TOL["d"][BF16], ctx)
    assert torch.isnan(d_row[e:]).all(), ctx
    check("dprob", dprob.view(-1), ref["dprob"], TOL["dprob"], ctx)
    assert same_bits(dprob[e:], dprob0[e:]), ctx
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.count_nonzero(dbias[g]) == 0, ctx
    if e:
        check("dbias", dbias[..., 0], ref["dbias"], TOL["dbias"], ctx)
    # the wrapper handles the same inputs
    out = run_wrapper(inp, generate_dbias=True, act_func="dgeglu")
    check_all(inp, out, inp.oracle(act_func="dgeglu"), d_dtype=BF16, ctx=ctx)


# --------------------------------------------------------------------------- hard values
BOUNDS = {
    "default": dict(act_func="dgeglu"),
    "custom": dict(act_func="dgeglu", **GEGLU_CUSTOM),
}


@pytest.mark.parametrize("bounds", list(BOUNDS))
@pytest.mark.parametrize("c_name", ["bf16", "fp16", "fp32"])
def test_values_exactly_at_the_clamp_bounds(bounds, c_name):
    """C (with beta = 1) placed exactly at the clamp bounds and one ulp beyond: inclusive masks."""
    kw = BOUNDS[bounds]
    cmax, cmin = kw.get("glu_clamp_max", 7.0), kw.get("glu_clamp_min", -7.0)
    c_dtype = DT[c_name]
    inp = make_inputs(seed_of("bounds", bounds, c_name), [256, 256], n=64, k=64, c_dtype=c_dtype, extra=0,
                      zero_prob=0.0)
    inp.beta.fill_(1.0)  # beta scaling would move the values off the bounds
    hi = torch.tensor(cmax, dtype=c_dtype)
    lo = torch.tensor(cmin, dtype=c_dtype)
    above = torch.nextafter(hi.float(), torch.tensor(float("inf"))).to(c_dtype) if c_dtype == FP32 else \
        (hi.float() * (1 + 2 ** -6)).to(c_dtype)
    below = torch.nextafter(lo.float(), torch.tensor(-float("inf"))).to(c_dtype) if c_dtype == FP32 else \
        (lo.float() * (1 + 2 ** -6)).to(c_dtype)
    assert above > hi and below < lo and hi.float().item() == cmax and lo.float().item() == cmin
    c = inp.c[..., 0]
    g = torch.Generator().manual_seed(inp.seed)
    pattern = torch.randint(0, 4, c.shape, generator=g)
    c[pattern == 0] = hi
    c[pattern == 1] = lo
    c[pattern == 2] = torch.where(torch.rand(c.shape, generator=g) < 0.5, above, below)[pattern == 2]
    out = run_wrapper(inp, d_dtype=FP32, generate_dbias=True, **kw)
    ref = inp.oracle(**kw)
    ctx = inp.ctx(bounds=bounds)
    check_all(inp, out, ref, d_dtype=FP32, ctx=ctx)
    # and explicitly: gate == cmax keeps its gradient, gate > cmax has none; up likewise on both sides
    d = out["d_row_tensor"][..., 0].view(inp.m, -1, 2, 32)
    cv = c.view(inp.m, -1, 2, 32)
    gate, up, dgate, dup = cv[:, :, 0], cv[:, :, 1], d[:, :, 0], d[:, :, 1]
    assert (dgate[gate == hi] != 0).any() and (dgate[gate > hi] == 0).all(), ctx
    assert (dgate[gate == lo] != 0).any(), ctx  # no lower clamp on the gate
    assert (dgate[gate < lo] != 0).any(), ctx
    assert (dup[up == hi] != 0).any() and (dup[up == lo] != 0).any(), ctx
    assert (dup[(up > hi) | (up < lo)] == 0).all(), ctx


@pytest.mark.parametrize("case", ["huge-bf16", "huge-fp32", "tiny-fp32", "tiny-fp16-subnormal", "zeros"])
@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
def test_huge_and_tiny_values(case, act):
    c_dtype, scale = {"huge-bf16": (BF16, 3e3), "huge-fp32": (FP32, 1e4), "tiny-fp32": (FP32, 1e-20),
                      "tiny-fp16-subnormal": (FP16, 1e-6), "zeros": (BF16, 0.0)}[case]
    inp = make_inputs(seed_of("extreme", case, act), [256, 256], n=32, k=64, c_dtype=c_dtype, c_scale=scale)
    d_dtype = FP32 if "fp32" in case else BF16
    out = run_wrapper(inp, d_dtype=d_dtype, generate_dbias=True, **ACTS[act])
    ref = inp.oracle(**ACTS[act])
    ctx = inp.ctx(case=case, act=act)
    check("d_row", out["d_row_tensor"][: inp.end, :, 0], ref["d"][: inp.end], TOL["d"][d_dtype], ctx)
    check("dprob", out["dprob_tensor"].view(-1), ref["dprob"], TOL["dprob"], ctx)
    if act == "dswiglu" and case.startswith("huge"):
        assert out["d_row_tensor"][: inp.end].abs().max() > 1e3  # the values did reach D


# --------------------------------------------------------------------------- optional outputs
def test_activation_output_matches_forward():
    inp = make_inputs(seed_of("activation"), [256, 0, 512], n=64, k=128, c_scale=4.0)
    act = torch.full((inp.m, inp.n, 1), 777.0, dtype=BF16)
    out = run_wrapper(inp, generate_dbias=True, activation_tensor=act, **ACTS["dgeglu_custom"])
    assert out["activation_tensor"] is act
    ref = inp.oracle(**ACTS["dgeglu_custom"])
    ctx = inp.ctx()
    check("activation", act[: inp.end, :, 0], ref["activation"][: inp.end], TOL["activation"], ctx)
    assert (act[inp.end:] == 777.0).all(), ctx
    check_all(inp, out, ref, d_dtype=BF16, ctx=ctx)


@pytest.mark.parametrize("mode", ["dense-k", "discrete-n"])
@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
def test_round_dgrad_to_input_dtype(act, mode):
    """D and dprob both come from g0 rounded to bf16. The GEMM is exact (``exact_gemm``), so
    the rounded oracle and the engine round the same g0 and agree to fp32 precision; the
    rounding's own effect (up to 2^-9 of each g0) is two orders of magnitude larger, so a
    dprob summed from the unrounded g0 fails (it did: 3.9e-3 off)."""
    inp = make_inputs(seed_of("round", act, mode), [512, 0, 256], n=64, k=256, mode=mode,
                      exact_gemm=True)
    out = run_wrapper(inp, d_dtype=FP32, round_dgrad_to_input_dtype=True, **ACTS[act])
    rounded = inp.oracle(**ACTS[act], round_dgrad_to_bf16=True)
    exact = inp.oracle(**ACTS[act])
    ctx = inp.ctx(act=act)
    e = inp.end
    d, dprob = out["d_row_tensor"][:e, :, 0], out["dprob_tensor"].view(-1)
    check("d_row (rounded g0)", d, rounded["d"][:e], TOL["rounded_dgrad"], ctx)
    check("dprob (rounded g0)", dprob, rounded["dprob"], TOL["rounded_dgrad"], ctx)
    # the flag did something, to D and to dprob: the unrounded oracle is far away
    assert rel_err(d, exact["d"][:e]) > 30 * TOL["rounded_dgrad"], ctx
    assert rel_err(dprob, exact["dprob"]) > 30 * TOL["rounded_dgrad"], ctx
    # the class API, and the block path (what a CUDA call runs), round the same way
    d_row, dprob = torch.full((inp.m, 2 * inp.n, 1), float("nan")), torch.zeros(inp.m, 1, 1)
    op = make_op(inp, d_row=d_row, dprob=dprob, round_dgrad_to_input_dtype=True, **ACTS[act])
    execute(op, inp, d_row=d_row, dprob=dprob)
    check("d_row (class API)", d_row[:e, :, 0], rounded["d"][:e], TOL["rounded_dgrad"], ctx)
    check("dprob (class API)", dprob.view(-1), rounded["dprob"], TOL["rounded_dgrad"], ctx)
    from cudnn_ext.reference.grouped_dglu import grouped_dglu_blocks

    ops = contract.Operands(a=inp.a, c=inp.c, padded_offsets=inp.offsets, alpha=inp.alpha,
                            beta=inp.beta, prob=inp.prob, dprob=torch.zeros(inp.m), b=inp.b,
                            b_ptrs=inp.b_ptrs, d_row=torch.full((inp.m, 2 * inp.n), float("nan")))
    discrete = dict(n=inp.n, b_dtype=BF16) if inp.b_ptrs is not None else {}
    problem, pack = contract.normalize(ops, contract.CallConfig(
        round_dgrad_to_input_dtype=True, b_major=inp.b_major, **ACTS[act]), **discrete)
    grouped_dglu_blocks(problem, pack)
    check("d_row (blocks)", pack["d_row"][:e], rounded["d"][:e], TOL["rounded_dgrad"], ctx)
    check("dprob (blocks)", pack["dprob"], rounded["dprob"], TOL["rounded_dgrad"], ctx)


def test_dprob_accumulates_across_wrapper_calls():
    inp = make_inputs(seed_of("dprob-acc"), [256, 512], n=64, k=64)
    dprob = torch.full((inp.m, 1, 1), 0.5)
    out1 = run_wrapper(inp, dprob=dprob)
    out2 = run_wrapper(inp, dprob=dprob)
    assert out1["dprob_tensor"] is dprob and out2["dprob_tensor"] is dprob
    once = inp.oracle(dprob_init=torch.full((inp.m,), 0.5))
    twice = inp.oracle(dprob_init=once["dprob"])
    check("dprob", dprob.view(-1), twice["dprob"], TOL["dprob"], inp.ctx())
    assert (dprob[inp.end:] == 0.5).all()


def test_dbias_none_and_zero_initialised_by_wrapper():
    inp = make_inputs(seed_of("dbias-wrapper"), [256, 0], n=32, k=64)
    assert run_wrapper(inp)["dbias_tensor"] is None
    out = run_wrapper(inp, generate_dbias=True)
    check("dbias", out["dbias_tensor"][..., 0], inp.oracle()["dbias"], TOL["dbias"], inp.ctx())
    assert torch.count_nonzero(out["dbias_tensor"][1]) == 0


def test_linear_offset_is_ignored_by_dswiglu():
    inp = make_inputs(seed_of("lo-swiglu"), [256], n=32, k=64, extra=0)
    plain = run_wrapper(inp, d_dtype=FP32)["d_row_tensor"].clone()
    shifted = run_wrapper(inp, d_dtype=FP32, linear_offset=3.0)["d_row_tensor"]
    assert same_bits(plain, shifted)


# --------------------------------------------------------------------------- the block path
BLOCK_CASES = [
    # (sizes, extra rows, mode, act, c/d dtype, dbias, activation, round_dgrad)
    ([256, 0, 512, 256], 256, "dense-k", "dswiglu", BF16, True, False, False),
    ([0, 768, 0], 512, "dense-n", "dgeglu_custom", BF16, True, True, False),
    ([512, 256], 0, "dense-k", "dgeglu", FP16, False, False, True),
    ([256, 256, 0, 0, 512], 256, "dense-k", "dswiglu", FP32, True, False, True),
    ([0, 0], 512, "dense-k", "dswiglu", BF16, True, False, False),  # no rows at all
    ([256, 0, 512], 256, "discrete-k", "dswiglu", BF16, True, False, False),
    ([0, 512, 0, 256], 512, "discrete-n", "dgeglu_custom", BF16, True, True, False),
    ([512, 0], 0, "discrete-k", "dgeglu", FP32, False, False, True),
]


@pytest.mark.parametrize("sizes,extra,mode,act,dt,dbias,activation,round_dgrad", BLOCK_CASES)
def test_block_path_matches_the_expert_walk(monkeypatch, sizes, extra, mode, act, dt, dbias, activation,
                                            round_dgrad):
    """The GPU form of the reference (BF16, dense or discrete weights: experts found per 256-row
    block on the device, discrete weights stacked from their pointer table, no host read)
    against the host walk over the experts' row ranges, on the CPU: the same values within fp32
    summation order, the same untouched rows, poison and all. An empty expert's pointer is null
    (never read). One gather step per block, so the step loop runs several times."""
    from cudnn_ext.reference import grouped_dglu

    monkeypatch.setattr(grouped_dglu, "_BLOCK_GATHER_BYTES", 1)
    inp = make_inputs(seed_of("block", sizes, mode, act), sizes, extra=extra, c_dtype=dt, mode=mode)
    discrete = {}
    if inp.b_ptrs is not None:
        inp.b_ptrs[torch.tensor(sizes) == 0] = 0  # the contract lets an empty expert's pointer be null
        discrete = dict(n=inp.n, b_dtype=BF16)
    kw = dict(ACTS[act])
    ops = contract.Operands(a=inp.a, c=inp.c, padded_offsets=inp.offsets, alpha=inp.alpha, beta=inp.beta,
                            prob=inp.prob, dprob=torch.zeros(inp.m), b=inp.b, b_ptrs=inp.b_ptrs,
                            d_row=torch.empty(inp.m, 2 * inp.n, dtype=dt),
                            dbias=torch.zeros(len(sizes), 2 * inp.n, dtype=BF16) if dbias else None,
                            activation=torch.empty(inp.m, inp.n, dtype=BF16) if activation else None)
    problem, pack = contract.normalize(ops, contract.CallConfig(round_dgrad_to_input_dtype=round_dgrad,
                                                                b_major=inp.b_major, **kw), **discrete)
    outs = {}
    for name, fn in (("walk", grouped_dglu.grouped_dglu_reference), ("blocks", grouped_dglu.grouped_dglu_blocks)):
        p = dict(pack)
        for slot in ("d_row", "activation"):
            if p.get(slot) is not None:
                p[slot] = torch.full_like(p[slot], float("nan"))
        p["dprob"] = torch.full_like(p["dprob"], -0.0)  # accumulated into; a -0.0 shows a stray + 0.0
        if p.get("dbias") is not None:
            p["dbias"] = torch.full_like(p["dbias"], 0.25)
        fn(problem, p)
        outs[name] = p
    e, walk, blocks = inp.end, outs["walk"], outs["blocks"]
    ctx = inp.ctx(act=act, round_dgrad=round_dgrad)
    assert same_bits(blocks["d_row"][e:], walk["d_row"][e:]), f"rows past the last offset {ctx}"
    check("d_row", blocks["d_row"][:e], walk["d_row"][:e].double(), TOL["d"][dt], ctx)
    assert same_bits(blocks["dprob"][e:], walk["dprob"][e:]), f"dprob past the last offset {ctx}"
    check("dprob", blocks["dprob"], walk["dprob"].double(), TOL["dprob"], ctx)
    if dbias:
        check("dbias", blocks["dbias"], walk["dbias"].double(), TOL["dbias"], ctx)
    if activation:
        assert same_bits(blocks["activation"][e:], walk["activation"][e:]), ctx
        check("activation", blocks["activation"][:e], walk["activation"][:e].double(), TOL["activation"], ctx)
