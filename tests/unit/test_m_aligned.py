"""``m_aligned`` below 256 (BF16 operands): the contract's rule, the reference engine against
the float64 oracle with groups of any size (1), 8 and 64 rows, the graph attribute and its plan serialization,
the plan memo, and the engines that decline it. CPU only, small shapes (M <= 1024).

Each comparison names its seed and sizes (``Inputs.ctx``); rerun one case with
``pytest tests/unit/test_m_aligned.py -k <id>``.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext import contract
from cudnn_ext.engines.registry import engine_by_name
from cudnn_ext.errors import NoEngineError
from cudnn_ext.graph import serialize as serdes
from cudnn_ext.reference import grouped_dglu

from test_blockscaled_api import _ok_mxfp8, _ok_nvfp4
from test_contract import base_call, expect_rejected
from test_graph import build_graph, make_case
from test_reference import ACTS, BF16, FP32, TOL, check, make_inputs, same_bits, seed_of

CHOICES = (1, 8, 16, 32, 64, 128, 256)


def poison(inp, end):
    """NaN in A and C on every row past the last offset: rows of no expert, whose values must
    reach no output of a real expert (D rows, dprob, dbias)."""
    inp.a[end:] = float("nan")
    inp.c[end:] = float("nan")


# --------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("align", CHOICES)
def test_bf16_takes_every_choice_and_the_problem_carries_it(align):
    # M = 3 * align rows: an expert of align rows, an empty one, one of align rows, align past the end
    inp = make_inputs(seed_of("choice", align), [align, 0, align], n=32, k=64, extra=align)
    out = cudnn.grouped_gemm_dglu_wrapper(
        inp.a, inp.c, None, inp.offsets, inp.alpha, inp.beta, inp.prob, torch.zeros(inp.m, 1, 1),
        b_tensor=inp.b, generate_dbias=True, d_dtype=FP32, m_aligned=align)
    ref = inp.oracle()
    ctx = inp.ctx(m_aligned=align)
    check("d_row", out["d_row_tensor"][:inp.end, :, 0], ref["d"][:inp.end], TOL["d"][FP32], ctx)
    check("dprob", out["dprob_tensor"].view(-1), ref["dprob"], TOL["dprob"], ctx)
    check("dbias", out["dbias_tensor"][..., 0], ref["dbias"], TOL["dbias"], ctx)
    ops = contract.Operands(a=inp.a, c=inp.c, padded_offsets=inp.offsets, alpha=inp.alpha, beta=inp.beta,
                            prob=inp.prob, dprob=torch.zeros(inp.m), b=inp.b)
    problem, _ = contract.normalize(ops, contract.CallConfig(m_aligned=align))
    assert problem.m_aligned == align and type(problem.m_aligned) is int


def test_numpy_int_is_taken_as_an_int():
    kw, _ = base_call()
    ops = contract.Operands(a=kw["a_tensor"], c=kw["c_tensor"], padded_offsets=kw["padded_offsets"],
                            alpha=kw["alpha_tensor"], beta=kw["beta_tensor"], prob=kw["prob_tensor"],
                            dprob=kw["dprob_tensor"], b=kw["b_tensor"])
    problem, _ = contract.normalize(ops, contract.CallConfig(m_aligned=np.int64(16)))
    assert problem.m_aligned == 16 and type(problem.m_aligned) is int


@pytest.mark.parametrize("value,exc", [(0, ValueError), (4, ValueError), (24, ValueError), (512, ValueError),
                                       (-8, ValueError), (True, TypeError), (8.0, TypeError), (None, TypeError),
                                       ("8", TypeError)],
                         ids=["0", "4", "24", "512", "-8", "True", "8.0", "None", "str"])
def test_other_values_are_refused_naming_the_rule(value, exc):
    kw, _ = base_call()
    err = expect_rejected(cudnn.grouped_gemm_dglu_wrapper, dict(kw, m_aligned=value), exc,
                          ["m_aligned", repr(value), "[1, 8, 16, 32, 64, 128, 256]"])
    assert type(err) is exc


@pytest.mark.parametrize("base", [_ok_mxfp8, _ok_nvfp4], ids=["mxfp8", "nvfp4"])
@pytest.mark.parametrize("value", [8, 128])
def test_block_scaled_operands_keep_256(base, value):
    """The rule is the family's: a valid m_aligned that block-scaled operands do not take."""
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, dict(base(), m_aligned=value), ValueError,
                    ["m_aligned", f"got {value}", "block-scaled", "m_aligned = 256"])


def test_block_scaled_default_still_runs():
    out = cudnn.grouped_gemm_dglu_wrapper(**_ok_mxfp8(), m_aligned=256)
    assert out["d_row_tensor"] is not None


def test_m_must_be_a_multiple_of_m_aligned():
    kw, _ = base_call()
    m = 40  # a multiple of 8, not of 16
    kw.update(a_tensor=torch.zeros(m, 64, 1, dtype=BF16), c_tensor=torch.zeros(m, 64, 1, dtype=BF16),
              prob_tensor=torch.zeros(m, 1, 1), dprob_tensor=torch.zeros(m, 1, 1),
              padded_offsets=torch.tensor([8, 40], dtype=torch.int32))
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, dict(kw, m_aligned=16), ValueError,
                    ["a_tensor", "multiple of 16", "M = 40", "m_aligned = 16"])
    out = cudnn.grouped_gemm_dglu_wrapper(**kw, m_aligned=8)  # and at 8 it is valid
    assert out["d_row_tensor"].shape == (m, 64, 1)


@pytest.mark.parametrize("values,align,names", [
    ([8, 20], 8, ["padded_offsets[1]", "multiple of 8", "got 20", "m_aligned = 8"]),
    ([64, 96], 64, ["padded_offsets[1]", "multiple of 64", "got 96", "m_aligned = 64"]),
    ([0, 8], 16, ["padded_offsets[1]", "multiple of 16", "got 8"]),
], ids=["8", "64", "16"])
def test_offsets_must_be_multiples_of_m_aligned(values, align, names):
    """Offset values are device data: the reference engine checks them on CPU tensors, after
    the wrapper allocated D, before any caller buffer is written (as at 256)."""
    kw, _ = base_call()
    kw.update(padded_offsets=torch.tensor(values, dtype=torch.int32), m_aligned=align)
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, kw, ValueError, names, allocation_free=False)


# --------------------------------------------------------------------------- the reference engine
#: (m_aligned, rows per expert, rows past the last offset): empty experts first, inside and
#: last; an expert of exactly m_aligned rows; neighbours of one block each
REF_CASES = [
    (1, [1, 0, 7, 300, 0, 1, 13], 5),  # 1-row experts, one of more than a 256-row unit
    (1, [0, 0, 3], 0),  # the last offset at M
    (1, [513, 1, 0], 3),
    (8, [8, 0, 24, 8, 0, 16], 16),
    (8, [0, 8, 8, 8, 0], 8),
    (64, [64, 0, 128, 64, 0], 64),
    (64, [0, 192, 64], 128),
]
REF_IDS = [f"a{a}-{'-'.join(map(str, s))}" for a, s, _ in REF_CASES]


def _contract_call(inp, align, *, dbias, act="dswiglu", activation=False, d_dtype=FP32):
    discrete = dict(n=inp.n, b_dtype=BF16) if inp.b_ptrs is not None else {}
    ops = contract.Operands(a=inp.a, c=inp.c, padded_offsets=inp.offsets, alpha=inp.alpha, beta=inp.beta,
                            prob=inp.prob, dprob=torch.zeros(inp.m), b=inp.b, b_ptrs=inp.b_ptrs,
                            d_row=torch.empty(inp.m, 2 * inp.n, dtype=d_dtype),
                            dbias=torch.zeros(len(inp.sizes), 2 * inp.n, dtype=BF16) if dbias else None,
                            activation=torch.empty(inp.m, inp.n, dtype=BF16) if activation else None)
    return contract.normalize(ops, contract.CallConfig(m_aligned=align, b_major=inp.b_major, **ACTS[act]),
                              **discrete)


def _poisoned_outputs(pack, inp):
    """Outputs filled so that any element a run leaves unwritten, or writes where it must not,
    shows: D and the activation NaN, dprob and dbias nonzero (both are accumulated into)."""
    p = dict(pack)
    p["d_row"] = torch.full_like(pack["d_row"], float("nan"))
    if p.get("activation") is not None:
        p["activation"] = torch.full_like(pack["activation"], float("nan"))
    p["dprob"] = torch.randn(inp.m)
    if p.get("dbias") is not None:
        p["dbias"] = torch.randn(pack["dbias"].shape).to(BF16)
    return p


@pytest.mark.parametrize("form", ["walk", "blocks"])
@pytest.mark.parametrize("mode", ["dense-k", "discrete-n"])
@pytest.mark.parametrize("align,sizes,extra", REF_CASES, ids=REF_IDS)
def test_reference_matches_the_oracle(monkeypatch, align, sizes, extra, mode, form):
    """Both forms of the reference engine (the CPU walk over expert ranges; the block path a
    GPU runs, here on CPU tensors, one block per gather step) against the float64 oracle. Rows
    of no expert carry NaN in A and C, outputs start poisoned: rows past the last offset must
    keep their bytes, every expert's rows and sums must use its own weights only."""
    monkeypatch.setattr(grouped_dglu, "_BLOCK_GATHER_BYTES", 1)
    # discrete: dGeGLU with the activation output, which needs bf16 C and D
    act, dt = ("dgeglu_custom", BF16) if mode == "discrete-n" else ("dswiglu", FP32)
    inp = make_inputs(seed_of("ref", align, sizes, mode), sizes, n=64, k=64, extra=extra, mode=mode, c_dtype=dt)
    end = inp.end
    poison(inp, end)
    if inp.b_ptrs is not None:
        inp.b_ptrs[torch.tensor(sizes) == 0] = 0  # an empty expert's pointer may be null: never read
    problem, pack = _contract_call(inp, align, dbias=True, act=act, activation=dt == BF16, d_dtype=dt)
    assert problem.m_aligned == align
    out = _poisoned_outputs(pack, inp)
    before = {k: v.clone() for k, v in out.items() if k in ("d_row", "dprob", "dbias", "activation") and v is not None}
    fn = grouped_dglu.grouped_dglu_reference if form == "walk" else grouped_dglu.grouped_dglu_blocks
    fn(problem, out)

    ref = inp.oracle(dprob_init=before["dprob"], dbias_init=before["dbias"], **ACTS[act])
    ctx = inp.ctx(m_aligned=align, form=form, act=act)
    assert same_bits(out["d_row"][end:], before["d_row"][end:]), f"D rows past the last offset written {ctx}"
    assert same_bits(out["dprob"][end:], before["dprob"][end:]), f"dprob past the last offset changed {ctx}"
    check("d_row", out["d_row"][:end], ref["d"][:end], TOL["d"][dt], ctx)
    check("dprob", out["dprob"], ref["dprob"], TOL["dprob"], ctx)
    check("dbias", out["dbias"], ref["dbias"], TOL["dbias"], ctx)
    empty = [e for e, s in enumerate(sizes) if s == 0]
    assert same_bits(out["dbias"][empty], before["dbias"][empty]), f"an empty expert's dbias changed {ctx}"
    if out.get("activation") is not None:
        assert same_bits(out["activation"][end:], before["activation"][end:]), ctx
        check("activation", out["activation"][:end], ref["activation"][:end], TOL["activation"], ctx)


@pytest.mark.parametrize("align,sizes,extra", [(8, [8, 16, 8], 8), (1, [3, 0, 300, 1], 2)],
                         ids=["a8", "a1"])
def test_block_path_units_start_at_each_expert(monkeypatch, align, sizes, extra):
    """Below 256 the block path multiplies units of 256 rows, each starting at its expert's
    first row (or 256 rows after its previous unit): their number is the static bound
    (M + L * 255) // 256, which needs no read of the offsets, and no unit spans two experts."""
    seen = []
    real = torch.bmm

    def spy(x, y):
        seen.append(tuple(x.shape))
        return real(x, y)

    inp = make_inputs(seed_of("units", align), sizes, n=32, k=64, extra=extra)
    problem, pack = _contract_call(inp, align, dbias=False)
    monkeypatch.setattr(torch, "bmm", spy)
    grouped_dglu.grouped_dglu_blocks(problem, _poisoned_outputs(pack, inp))
    assert seen and all(s[1] == 256 for s in seen), seen
    assert sum(s[0] for s in seen) == (inp.m + len(sizes) * 255) // 256
    row, ok, expert = grouped_dglu.unit_table(inp.offsets, inp.m)
    ends = inp.offsets.long().tolist()
    for u in range(row.shape[0]):
        e = int(expert[u])
        if e == len(sizes):
            assert not ok[u].any()  # past the experts' units
            continue
        lo, hi = (ends[e - 1] if e else 0), ends[e]
        rows = row[u][ok[u]]
        assert rows.numel() and lo <= int(rows.min()) and int(rows.max()) < hi
        assert (rows - lo) [0] % 256 == 0  # a unit starts on its expert's grid of 256 rows
    owned = torch.zeros(inp.m, dtype=torch.int64)
    owned.index_add_(0, row[ok], torch.ones(int(ok.sum()), dtype=torch.int64))
    assert owned[:inp.end].eq(1).all() and owned[inp.end:].eq(0).all()  # each expert row once


def test_an_expert_never_uses_its_neighbours_weights():
    """Experts of 8 rows each, weights that differ by a factor per expert: D of expert e scales
    with expert e's weights only (a block straddling two experts would mix them)."""
    inp = make_inputs(seed_of("neighbours"), [8, 8, 8, 8], n=32, k=64, extra=0, c_dtype=FP32)
    inp.a[:] = 1.0
    w = torch.ones(4, 32, 64, dtype=BF16) * torch.tensor([1.0, 2.0, 4.0, 8.0]).view(4, 1, 1).to(BF16)
    inp.b = w.permute(1, 2, 0)
    inp.weights = [w[e] for e in range(4)]
    problem, pack = _contract_call(inp, 8, dbias=True)
    for fn in (grouped_dglu.grouped_dglu_reference, grouped_dglu.grouped_dglu_blocks):
        out = _poisoned_outputs(pack, inp)
        out["dbias"].zero_()
        out["dprob"].zero_()
        fn(problem, out)
        ref = inp.oracle()
        check("d_row", out["d_row"], ref["d"], TOL["d"][FP32], inp.ctx(fn=fn.__name__))
        check("dbias", out["dbias"], ref["dbias"], TOL["dbias"], inp.ctx(fn=fn.__name__))


# --------------------------------------------------------------------------- the graph
def test_graph_node_attribute_validates_and_binds_m():
    t = make_case(m=48, offsets=[8, 8, 40])
    g, descs = build_graph(t, m_aligned=8, generate_dbias=True)
    assert g.nodes[0].attrs.m_aligned == 8
    assert g.problem.m_aligned == 8
    g.build()
    out = {"d_row": torch.full(descs["d_row"].dim, float("nan"), dtype=BF16), "dprob": torch.zeros(48),
           "dbias": torch.zeros(descs["dbias"].dim, dtype=BF16)}
    g.execute({descs[k]: v for k, v in {**t, **out}.items()})
    assert out["d_row"][:40].isfinite().all() and out["d_row"][40:].isnan().all()
    # another M, a multiple of 8 and not of 256, binds; one that is not a multiple of 8 does not
    for m in (24, 44):
        t2 = make_case(m=m, offsets=[8, 8, 16])
        out2 = {"d_row": torch.zeros(m, 128, dtype=BF16), "dprob": torch.zeros(m),
                "dbias": torch.zeros(descs["dbias"].dim, dtype=BF16)}
        pack = {descs[k]: v for k, v in {**t2, **out2}.items()}
        if m == 24:
            g.execute(pack)
            assert out2["d_row"][:16].any() and not out2["d_row"][16:].any()
    with pytest.raises(ValueError) as info:
        g.execute(pack)
    for words in ("M (rows) must be a multiple of 8", "M = 44", "m_aligned = 8"):
        assert words in str(info.value), str(info.value)


def test_graph_node_attribute_types_and_values():
    t = make_case(m=48, offsets=[8, 8, 40])
    assert build_graph(t)[0].nodes[0].attrs.m_aligned == 256  # the default
    for bad in (8.0, True, "8"):
        with pytest.raises(ValueError, match="m_aligned"):  # pydantic's ValidationError is a ValueError
            build_graph(t, m_aligned=bad)
    g, _ = build_graph(t, m_aligned=24)
    with pytest.raises(ValueError, match=r"m_aligned: must be one of \[1, 8, 16, 32, 64, 128, 256\].*got 24"):
        g.validate()
    g, _ = build_graph(t)  # 256: M = 48 is refused as it always was
    with pytest.raises(ValueError, match="M = 48"):
        g.validate()


@pytest.mark.parametrize("align", [8, 64])
def test_plan_serialization_round_trips_m_aligned(align):
    m = 5 * align
    t = make_case(m=m, offsets=[align, align, 4 * align])
    g, descs = build_graph(t, m_aligned=align, generate_dbias=True)
    g.build()
    blob = g.serialize()
    header = serdes.read_header(blob)
    assert header.graph.nodes[0].attrs.m_aligned == align
    g2 = cudnn.deserialize_plan(blob)
    assert g2.problem == g.problem and g2.problem.m_aligned == align
    assert g2.serialize() == blob
    outs = []
    for graph in (g, g2):
        out = {"d_row": torch.full(descs["d_row"].dim, float("nan"), dtype=BF16), "dprob": torch.zeros(m),
               "dbias": torch.zeros(descs["dbias"].dim, dtype=BF16)}
        graph.execute({descs[k].name: v for k, v in {**t, **out}.items()})
        outs.append(out)
    for k in outs[0]:
        assert same_bits(outs[0][k], outs[1][k]), k


def test_plans_for_8_and_256_are_not_confused(graph_executions):
    """The call memo keys on m_aligned: the same tensors under 8 and under 256 are two problems,
    two graphs; and a call at 256 on an M that only 8 divides is refused, not replayed."""
    inp = make_inputs(seed_of("memo"), [256, 0, 256], n=32, k=64, extra=256)

    def call(**kw):
        return cudnn.grouped_gemm_dglu_wrapper(inp.a, inp.c, None, inp.offsets, inp.alpha, inp.beta, inp.prob,
                                               torch.zeros(inp.m, 1, 1), b_tensor=inp.b, **kw)

    call(m_aligned=8)
    call()
    call(m_aligned=8)
    assert [g.problem.m_aligned for g in graph_executions] == [8, 256, 8]
    assert graph_executions[0] is graph_executions[2] and graph_executions[0] is not graph_executions[1]
    small = make_inputs(seed_of("memo-small"), [8, 0, 16], n=32, k=64, extra=8)
    kw = dict(b_tensor=small.b)
    cudnn.grouped_gemm_dglu_wrapper(small.a, small.c, None, small.offsets, small.alpha, small.beta, small.prob,
                                    torch.zeros(small.m, 1, 1), m_aligned=8, **kw)
    with pytest.raises(ValueError, match="M = 32"):
        cudnn.grouped_gemm_dglu_wrapper(small.a, small.c, None, small.offsets, small.alpha, small.beta,
                                        small.prob, torch.zeros(small.m, 1, 1), **kw)


def test_class_api_takes_m_aligned_and_checks_runtime_m():
    inp = make_inputs(seed_of("class"), [8, 0, 16], n=32, k=64, extra=8)
    d_row, dprob = torch.full((inp.m, 64, 1), float("nan"), dtype=BF16), torch.zeros(inp.m, 1, 1)
    op = cudnn.GroupedGemmDglu(
        sample_a=inp.a, sample_c=inp.c, sample_d_row=d_row, sample_d_col=None, sample_sfa=None,
        sample_padded_offsets=inp.offsets, sample_alpha=inp.alpha, sample_beta=inp.beta, sample_prob=inp.prob,
        sample_dprob=dprob, sample_b=inp.b, m_aligned=8)
    assert op.check_support()
    op.execute(inp.a, inp.c, d_row, None, None, inp.offsets, inp.alpha, inp.beta, inp.prob, dprob, b_tensor=inp.b)
    ref = inp.oracle()
    check("d_row", d_row[:inp.end, :, 0], ref["d"][:inp.end], TOL["d"][BF16], inp.ctx())
    assert d_row[inp.end:].isnan().all()
    m = 12  # not a multiple of 8
    with pytest.raises(ValueError, match="M = 12"):
        op.execute(inp.a[:m], inp.c[:m], d_row[:m], None, None, inp.offsets.clamp(max=8), inp.alpha, inp.beta,
                   inp.prob[:m], dprob[:m], b_tensor=inp.b)


# --------------------------------------------------------------------------- engines
def _bf16_problem(align, device_type="cuda"):
    inp = make_inputs(seed_of("engines"), [align, align], n=64, k=64, extra=0)
    problem, _ = _contract_call(inp, align, dbias=True)
    return dataclasses.replace(problem, device_type=device_type, device_index=0)


def test_sm90_runs_m_aligned_below_256_on_the_ragged_schedule():
    from cudnn_ext.engines.sm90 import config_for

    eng = engine_by_name("sm90_cutedsl")
    for align in CHOICES:
        problem = _bf16_problem(align)
        assert eng.check_support(problem) == []  # a CUDA problem it runs
        assert config_for(problem).ragged_m == (align < 256)
        assert all(k.ragged_m == (align < 256) for k in eng.knob_space(problem))


def test_sm90_blockscaled_declines_m_aligned_below_256():
    kw = _ok_mxfp8()
    ops = contract.Operands(a=kw["a_tensor"], c=kw["c_tensor"], sfa=kw["sfa_tensor"],
                            padded_offsets=kw["padded_offsets"], alpha=kw["alpha_tensor"], beta=kw["beta_tensor"],
                            prob=kw["prob_tensor"], dprob=kw["dprob_tensor"], b=kw["b_tensor"], sfb=kw["sfb_tensor"],
                            norm_const=kw["norm_const_tensor"])
    problem, _ = contract.normalize(ops, contract.CallConfig(sf_vec_size=32))
    eng = engine_by_name("sm90_blockscaled")
    base = dataclasses.replace(problem, device_type="cuda", device_index=0)
    assert not any("m_aligned" in r for r in eng.check_support(base))
    why = eng.check_support(dataclasses.replace(base, m_aligned=64))
    assert any("m_aligned 64" in r and "256" in r for r in why), why


def test_vendor_declines_m_aligned_below_256(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (10, 0))
    eng = engine_by_name("vendor_sm100")
    assert eng.check_support(_bf16_problem(256)) == []
    why = eng.check_support(_bf16_problem(16))
    assert any("m_aligned 16" in r and "256 only" in r for r in why), why


def test_reference_runs_every_choice():
    eng = engine_by_name("reference")
    for align in CHOICES:
        assert eng.check_support(_bf16_problem(align)) == []


def test_pinned_engine_reports_only_its_other_reasons(monkeypatch):
    """Pinned to the SM90 engine with CPU tensors: its reason is the device, never m_aligned."""
    monkeypatch.setattr(type(engine_by_name("sm90_cutedsl")), "available", lambda self: None)
    inp = make_inputs(seed_of("pinned"), [8, 8], n=32, k=64, extra=0)
    with pytest.raises(NoEngineError, match="not cuda") as err:
        cudnn.grouped_gemm_dglu_wrapper(inp.a, inp.c, None, inp.offsets, inp.alpha, inp.beta, inp.prob,
                                        torch.zeros(inp.m, 1, 1), b_tensor=inp.b, m_aligned=8,
                                        engine="sm90_cutedsl")
    assert "m_aligned" not in str(err.value)

@pytest.mark.parametrize("seed", range(6))
def test_any_size_block_path_matches_the_walk_on_random_groups(seed):
    """Random groups of any size (1-row and empty experts, experts of more than one 256-row
    unit, rows past the last offset): the block path (what a CUDA call runs) equals the CPU
    walk to fp32 summation order, and leaves every row of no expert untouched."""
    import random

    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 2, 255, 256, 257, rng.randint(0, 600)]) for _ in range(rng.randint(1, 9))]
    inp = make_inputs(seed_of("any", seed), sizes, n=32, k=64, extra=rng.randint(0, 7), c_dtype=FP32)
    poison(inp, inp.end)
    problem, pack = _contract_call(inp, 1, dbias=True)
    outs = {}
    for name, fn in (("walk", grouped_dglu.grouped_dglu_reference), ("units", grouped_dglu.grouped_dglu_blocks)):
        out = _poisoned_outputs(pack, inp)
        out["dprob"], out["dbias"] = pack["dprob"].clone(), pack["dbias"].clone()
        fn(problem, out)
        outs[name] = out
    walk, units, e = outs["walk"], outs["units"], inp.end
    ctx = inp.ctx(m_aligned=1)
    assert same_bits(units["d_row"][e:], walk["d_row"][e:]), ctx
    check("d_row", units["d_row"][:e], walk["d_row"][:e].double(), TOL["d"][FP32], ctx)
    check("dprob", units["dprob"], walk["dprob"].double(), TOL["dprob"], ctx)
    check("dbias", units["dbias"], walk["dbias"].double(), TOL["dbias"], ctx)
