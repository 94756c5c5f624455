"""Options whose numerical effect is small, each checked where the arithmetic is exact, on the
reference engine (the problems: tests/support/exact_cases.py; the Hopper engines run the same
checks in tests/gpu/test_small_effects_gpu.py).

Each output must match the float64 oracle bit for bit (or within fp32 noise where a constant
or a 16-bit scalar is the point), and each test also shows that its option moves at least one
output on its inputs, so a test cannot pass with the option dropped.
"""
from __future__ import annotations

import pytest
import torch

from cudnn_ext import contract
from cudnn_ext.reference.grouped_dglu import grouped_dglu_blocks

from exact_cases import (ACTS, BF16, CONSTANTS, FP16, N, SIZES, alpha_squared_case, amax_case, assert_exact,
                         bit_exact_outputs, check_alpha_squared, check_constants, constants_case, exact_case,
                         expert_rows, initial_buffers, ref_of, same, to_bf16, truncate_bf16)

CONSTANT_TOL = 2e-6


def run_blocks(t: dict, *, d_row, dprob, dbias=None, activation=None):
    """The block path (what every CUDA call of the reference engine runs), on the CPU."""
    ops = contract.Operands(a=t["a"], c=t["c"], padded_offsets=t["offsets"], alpha=t["alpha"], beta=t["beta"],
                            prob=t["prob"], dprob=dprob, b=t["b"], d_row=d_row, dbias=dbias, activation=activation)
    problem, pack = contract.normalize(ops, contract.CallConfig(**t["kw"]))
    grouped_dglu_blocks(problem, pack)


# --------------------------------------------------------------------------- every output, bit for bit
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("api,fmt", [("wrapper", "bf16"), ("class", "bf16"), ("wrapper", "mxfp4"),
                                     ("class", "mxfp4")])
def test_outputs_are_bit_exact_on_exact_inputs(act, api, fmt):
    """D (fp32 from the wrapper, bf16 from the class API), dprob accumulated into the caller's
    buffer, dbias summed in fp32 and rounded once into the caller's bf16 dbias, and dGeGLU's
    activation output (BF16 operands), all equal the oracle's exact values (rounded once to
    their storage dtype). Tolerance zero: the masks at the clamp bounds, beta,
    linear_offset, alpha**2, each rounding and each accumulation must all be right."""
    assert bit_exact_outputs(act, api, fmt=fmt) in (None, "reference")


@pytest.mark.parametrize("act", list(ACTS))
def test_block_path_is_bit_exact_on_exact_inputs(act):
    """The same on the block path (what every CUDA call of the reference engine runs)."""
    t = exact_case(act)
    m, e = t["m"], t["end"]
    dprob0, dbias0 = initial_buffers(t)
    d = torch.full((m, 2 * N), float("nan"), dtype=BF16)
    dprob, dbias = dprob0.clone(), dbias0.clone()
    activation = torch.full((m, N), float("nan"), dtype=BF16) if act == "dgeglu" else None
    run_blocks(t, d_row=d, dprob=dprob, dbias=dbias, activation=activation)
    ref = ref_of(t, dprob_init=dprob0, dbias_init=dbias0)
    assert_exact(t, ref, dbias0)
    assert same(d[:e], to_bf16(ref["d"][:e]))
    assert same(dprob, ref["dprob"].float())
    assert same(dbias, to_bf16(ref["dbias"]))
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
    assert _differs(ref_of(t, beta=torch.ones(len(SIZES)))["d"][:e], d)
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
        lo0 = ref_of(t, linear_offset=0.0, dprob_init=dprob0)
        assert _differs(lo0["d"][:e], d) and _differs(lo0["dprob"], ref["dprob"])
        assert _differs(lo0["activation"][:e], ref["activation"][:e])
        # the activation: prob * act rounded once to bf16; another rounding is one ulp off somewhere
        act_ref = ref["activation"][:e]
        assert _differs(truncate_bf16(act_ref), to_bf16(act_ref)) > 100
        assert _differs(act_ref.to(FP16).to(BF16), to_bf16(act_ref)) > 10  # rounded twice, via fp16
        assert _differs(ref_of(t, prob=torch.ones(t["m"]))["activation"][:e], act_ref)  # prob * act
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
    for ex, r0, r1 in expert_rows(t):
        from_bf16_d[ex] += to_bf16(ref["d"][r0:r1]).double().sum(0)
    assert _differs(to_bf16(from_bf16_d), want) > 10  # summed from the stored bf16 D
    for tile in (128, 256):  # bf16 partials per tile (the vendor's 128 rows) or per 256-row block
        per_tile = dbias0.double().clone()
        for ex, r0, r1 in expert_rows(t):
            for t0 in range(r0, r1, tile):
                per_tile[ex] = to_bf16(per_tile[ex] + ref["d"][t0:t0 + tile].sum(0)).double()
        assert _differs(per_tile, want) > 10, tile


# --------------------------------------------------------------------------- 16-bit alpha
@pytest.mark.parametrize("alpha_dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_alpha_squared_is_rounded_in_alphas_own_16_bit_type(alpha_dtype):
    """Block-scaled operands take a 16-bit alpha, and the kernel squares it in alpha's own
    dtype (docs/vendor_contract.md §3.5). MXFP4 operands of the e2m1 grid with unit scales
    (an exact GEMM), gates of 0 and 40 and dyadic ups keep everything else exact to fp32
    noise, so D and dprob must match the oracle with that one rounding, and neither the
    unrounded square nor the square rounded in the other 16-bit type (or alpha converted to it)."""
    check_alpha_squared(*alpha_squared_case(alpha_dtype))


# --------------------------------------------------------------------------- amax
@pytest.mark.parametrize("path", ["wrapper", "class", "walk", "blocks"])
def test_amax_is_exact_nan_quiet_and_per_half(path):
    """amax is max |d| of the fp32 values before the cast, per expert and per half (dgate,
    dup), NaN-quiet (reference/blockscaled_run.py: the kernel's per-thread maximum is a
    NaN-quiet fmax, so a NaN never reaches the atomic max), and an expert without rows keeps
    the -inf it was given. Every |d| is exact in fp32, so amax must equal the oracle's maximum
    exactly: the max of the bf16 D (2^-9 relative off) or of the halves swapped would show."""
    amax, want = amax_case(path, inf=False)
    assert torch.equal(amax.double(), want), (amax, want)
    if path == "wrapper":  # computed maxima in every finite slot: the cast would move them
        assert not torch.equal(want[0].float().to(BF16).double(), want[0])
        assert want[0, 0] != want[0, 1] and want[2, 0] != want[2, 1]
    else:  # the caller's larger values stay, the smaller are replaced
        assert want[0, 0] == 1e6 and want[2, 1] == 1e6 and want[0, 1] > 0.5 and want[2, 0] > 0.25


@pytest.mark.parametrize("path", ["wrapper", "class", "walk", "blocks"])
def test_amax_of_an_infinite_gradient_is_inf(path):
    """An infinite gradient makes amax inf, as the kernel's fmax and atomic max on the float's
    bits do; a NaN-quiet maximum built on torch.nan_to_num's defaults would report FLT_MAX."""
    amax, want = amax_case(path, inf=True)
    assert want[2, 0] == float("inf")
    assert torch.equal(amax.double(), want), (amax, want)


# --------------------------------------------------------------------------- activation constants
@pytest.mark.parametrize("act", list(CONSTANTS))
def test_activation_constants_keep_fp32_precision(act):
    """geglu_alpha, the clamps, linear_offset and the dSiTU-GLU betas reach the epilogue as the
    fp32 values the caller gave: every other test uses constants bf16 holds exactly, where a
    constant rounded to 16 bits would change nothing. BF16 dGeGLU (the block-scaled kernel's
    vectorized dGeGLU may clamp in C's dtype, docs/vendor_contract.md §2.4, so it is not pinned
    here) and block-scaled dSiTU-GLU on an exact GEMM: D and dprob within fp32 noise of the
    oracle (about 5e-7 here), while each constant rounded to bf16 moves D by 2e-4 to 1.2 of
    max |D| (the clamps most: some C sit at 6.90625, past 6.9 but not past its rounding)."""
    check_constants(act, *constants_case(act), tol=CONSTANT_TOL, effect=50)
