"""SM90 kernel vs the float64 reference on the GPU (``pytest -m gpu``; skipped without CUDA).

Every case draws fresh random data, poisons D with NaN, starts dprob/dbias from random
values (they are accumulated into), and checks: every row of the experts' padded ranges is
written, rows past the last offset are untouched, D/dprob/dbias are within the named
tolerances of ``sm90_cases.TOL``. Reproduce one case with
``python -m pytest tests/gpu/test_sm90_correctness.py -m gpu -k <label>``.
"""
import dataclasses

import pytest
import torch

from sm90_cases import (ROUND_EFFECT, ROUND_TOL, TOL, Case, activation_cases, any_size_cases, c_half_cases, c_stage_cases, capture_execute,
                        cluster_2x2_cases, cluster_cases, cooperative_cases, dense_n_major_cases,
                        make_pack, ragged_cases, rel_err, round_dgrad_cases, run_and_check,
                        skip_unless_sm90,
                        situglu_cases, split_cases, split_unspread_case, standard_cases)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", standard_cases(), ids=lambda c: c.label())
def test_sm90_matches_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", cluster_cases(), ids=lambda c: c.label())
def test_sm90_cluster_matches_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", cluster_2x2_cases(), ids=lambda c: c.label())
def test_sm90_cluster_2x2_matches_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", cooperative_cases(), ids=lambda c: c.label())
def test_sm90_cooperative_matches_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


def _split_slots_written(case, spread=True):
    """``run_and_check``'s inspection of a split_last run: the partial-sum slots that
    ``split_model`` says this launch's grid fills (one per non-final part: its cluster's)
    were written by every CTA of the cluster, and no other (the workspace was 0xA5 before
    the launch)."""
    from split_model import SPLIT_SLOTS, items

    def check(plan, ws):
        cl = case.cluster_m * case.cluster_n
        n_units = -(-case.n // case.tile_n)
        units = (sum(case.groups) // (128 * cl)) * n_units
        # the launch's grid: resident clusters, at most the units M alone allows (the host
        # does not read the offsets)
        clusters = min(plan._resident_ctas(torch.cuda.current_device()) // cl,
                       ((sum(case.groups) + case.extra_rows) // (128 * cl)) * n_units)
        k_tiles = -(-case.k // 64)
        # a non-final part's sums go to its cluster's slot
        nf = sorted(it.slot for c in range(clusters)
                    for it in items(c, units, clusters, k_tiles, case.split_last)
                    if not it.final)
        assert bool(nf) == spread, (f"{case.label()}: {'not ' if spread else ''}spread on "
                                    f"this grid ({clusters} clusters, {units} units)")
        # the slots' place and size as the plan's kernel config lays them out; the slot
        # count is split_model's (the kernel's constant)
        cfg = plan.config
        start = plan.zeroed_region + 4 * cfg.split_part_offset(len(case.groups))
        per = 4 * 128 * case.tile_n  # one CTA's fp32 accumulators
        assert 4 * cfg.split_part_floats() == SPLIT_SLOTS * cl * per
        slots = ws[start:start + SPLIT_SLOTS * cl * per].view(SPLIT_SLOTS * cl, per)
        per_cta = (slots != 0xA5).any(dim=1).view(SPLIT_SLOTS, cl)  # (slot, CTA rank)
        written, touched = per_cta.all(dim=1), per_cta.any(dim=1)
        want = torch.zeros(SPLIT_SLOTS, dtype=torch.bool, device=written.device)
        want[nf] = True
        assert torch.equal(written, want) and torch.equal(touched, want), (
            f"{case.label()}: slots written {written.nonzero().flatten().tolist()}, the "
            f"model says {nf} ({clusters} clusters, {units} units)")
        print(f"{case.label()}: {clusters} clusters, {units} units, non-final parts in "
              f"slots {nf}")

    return check


@pytest.mark.parametrize("case", split_cases(), ids=lambda c: c.label())
def test_sm90_split_last_matches_reference(case):
    """The last round split along K: results as without it, the flags left zero
    (``run_and_check``'s zeroed-region check), the slots the model names written."""
    skip_unless_sm90()
    print(case.label(), run_and_check(case, inspect=_split_slots_written(case)))


def test_sm90_split_last_not_spread():
    """split_last on, but the last round (60 units of 66 clusters) not spread: spreading
    would shorten it by under a quarter of a unit (``tile_walk.last_round_split``), so
    every unit runs whole, no slot is written and the flags stay zero."""
    skip_unless_sm90()
    case = split_unspread_case()
    print(case.label(), run_and_check(case, inspect=_split_slots_written(case, spread=False)))


@pytest.mark.parametrize("case", split_cases()[:2], ids=lambda c: c.label())
def test_sm90_split_last_fresh_outputs(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case, fresh=True))


@pytest.mark.parametrize("case", dense_n_major_cases(), ids=lambda c: c.label())
def test_sm90_dense_n_major_matches_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


def _fresh_cases():
    std, cl = standard_cases(), cluster_cases()
    from sm90_cases import discrete_cases
    return [std[1], std[5], std[9], cl[1], cl[2], cluster_2x2_cases()[0], discrete_cases()[0],
            cooperative_cases()[2]]


@pytest.mark.parametrize("case", _fresh_cases(), ids=lambda c: c.label())
def test_sm90_fresh_outputs_variant(case):
    """The functional path's variant: outputs start as garbage (NaN D and dprob, huge
    dbias); the launch zeroes dprob and D's tail rows on the device and assigns dbias."""
    skip_unless_sm90()
    print(case.label(), run_and_check(case, fresh=True))


def test_sm90_m_is_runtime():
    """Two token counts reuse one compiled kernel (the compile cache key has no M)."""
    skip_unless_sm90()
    from cudnn_ext.engines import sm90

    run_and_check(Case([256, 512], 128, 128))
    before = len(sm90._compiled)
    run_and_check(Case([1024, 256, 0, 512], 128, 128))
    assert len(sm90._compiled) == before


_MIXED = dict(c_dtype=torch.bfloat16, d_dtype=torch.float16)
#: (label, case keywords, the expected choice: "coop" or ping-pong 128 x 128 in 2x1 clusters
#: with this c_split)
_HEURISTICS = [("nodbias-K1416", dict(dbias=False, k=1416), 2),
               ("nodbias-K1416-mixedCD", dict(dbias=False, k=1416, **_MIXED), "coop"),
               # dense at K 4096-5119 and N <= 1024: the 2-stage cooperative form
               # (the case's N is 512)
               ("dbias-K4104", dict(k=4104), "coop"),
               ("dbias-K3080", dict(k=3080), 2),
               ("dbias-K1416", dict(k=1416), 2),
               ("dbias-K1416-discrete", dict(k=1416, weight_mode="discrete"), 2),
               # ... per-expert weights too
               ("dbias-K4104-discreteN", dict(k=4104, weight_mode="discrete", b_major="n"),
                "coop"),
               # deep K: cooperative with or without dbias, dense or per-expert weights
               ("dbias-K7176", dict(k=7176), "coop"),
               ("dbias-K6152", dict(k=6152), "coop"),  # dense from K 5120
               ("dbias-K5128", dict(k=5128), "coop"),
               # per-expert weights from K 5120 too
               ("dbias-K6152-discrete", dict(k=6152, weight_mode="discrete"), "coop"),
               ("dbias-K4088-discrete", dict(k=4088, weight_mode="discrete"), 1),
               ("nodbias-K7176", dict(dbias=False, k=7176), "coop"),
               ("dbias-K7176-discrete", dict(k=7176, weight_mode="discrete"), "coop"),
               ("dbias-K7176-discreteN", dict(k=7176, weight_mode="discrete", b_major="n"),
                "coop")]


@pytest.mark.parametrize("fresh", [False, True], ids=["contract", "fresh"])
@pytest.mark.parametrize("kw,expect", [h[1:] for h in _HEURISTICS], ids=[h[0] for h in _HEURISTICS])
def test_sm90_heuristics_choice_is_correct(fresh, kw, expect):
    """What the engine itself picks (ping-pong 128 x 128 in 2x1 clusters, with 64-row C
    ring entries for 16-bit C and D of one type, with per-expert weights only at K <= 2048;
    the cooperative 128 x 256 schedule without dbias at K <= 2048 for C and D of different
    16-bit types, with or without dbias at K >= 5120 up to N 8192, and at K 4096-5119 up
    to N 1024, dense or per-expert weights), run
    as the class API (contract) and the functional op (fresh outputs) would:
    empty experts, rows past the last offset, a K tail, and enough tiles that every CTA
    walks several (accumulator overwrite, the C FIFO and the dbias sums carried across
    tiles)."""
    skip_unless_sm90()
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, cooperative_config
    from sm90_cases import make_pack

    kw = dict(kw)
    k = kw.pop("k")
    case = Case([2048, 0, 4096, 1024, 3072, 2048, 512, 8192], 512, k,
                "dgeglu" if kw.get("dbias", True) else "dswiglu", **kw)
    eng = Sm90DgluEngine()
    problem, _ = make_pack(case)
    knobs = min(eng.knob_space(problem), key=lambda kn: eng.cost(problem, kn))
    if expect == "coop":
        # the deep-K form (4 C stages, 3 A/B stages, the last round split with dSwiGLU) at K 5128-7176,
        # the 2-stage form at K 1416 and 4104
        assert knobs == cooperative_config(problem) and knobs.c_stages == (
            4 if problem.k >= 5120 else 2)
    else:
        assert not knobs.cooperative
        assert (knobs.tile_n, knobs.cluster_m, knobs.cluster_n) == (128, 2, 1)
        assert knobs.c_split == expect
    print(run_and_check(case, engine=eng, knobs=knobs, fresh=fresh))


@pytest.mark.parametrize("case", c_stage_cases(), ids=lambda c: c.label())
def test_sm90_c_stages_with_dbias_match_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", c_half_cases(), ids=lambda c: c.label())
def test_sm90_c_half_matches_reference(case):
    """Ping-pong C ring entries of 64 rows (knob c_split 2)."""
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", activation_cases(), ids=lambda c: c.label())
def test_sm90_activation_output_and_round_dgrad_match_reference(case):
    """The activation output (written at every row of the experts' ranges, rows past the
    last offset untouched) and round_dgrad_to_input_dtype, in the kernel, against the
    float64 reference."""
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", situglu_cases(), ids=lambda c: c.label())
def test_sm90_dsituglu_matches_reference(case):
    """The dSiTU-GLU epilogue (beta applied, the betas compiled in) on every schedule, against
    the float64 reference; the block-scaled engine's calls are in test_sm90_blockscaled.py."""
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


def test_sm90_activation_output_fresh_outputs_variant():
    """Fresh outputs: the activation output's rows past the last offset become 0. The case
    rounds dgrad (round_dgrad) and fresh dprob starts at zero, so its error is the roundings'
    alone: exact GEMM operands make them the float64 oracle's (with random ones an fp32 and a
    float64 accumulator straddling a bf16 boundary now and then put dprob past its bound)."""
    skip_unless_sm90()
    print(run_and_check(dataclasses.replace(activation_cases()[1], exact_gemm=True), fresh=True))


def _frobenius(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("case", round_dgrad_cases(), ids=lambda c: c.label())
def test_sm90_round_dgrad_rounds(case):
    """round_dgrad_to_input_dtype changes D and dprob by the rounding and by nothing else:
    both are within ROUND_TOL of the rounded float64 reference and further than ROUND_EFFECT
    from the unrounded one (a dprob from the unrounded g0, as the reference engine once
    formed it, fails the first check)."""

    from cudnn_ext.reference import reference_outputs

    skip_unless_sm90()
    seen = {}

    def inspect(problem, pack, ref):
        rows = int(pack["padded_offsets"][-1])
        plain = dataclasses.replace(problem, round_dgrad_to_input_dtype=False)
        unrounded = reference_outputs(plain, pack, compute_dtype=torch.float64)
        for name, got, want, other in (
                ("d", pack["d_row"][:rows], ref["d_row"][:rows], unrounded["d_row"][:rows]),
                ("dprob", pack["dprob"][:rows], ref["dprob"][:rows], unrounded["dprob"][:rows])):
            seen[name] = _frobenius(got, want)
            seen[name + "_unrounded"] = _frobenius(got, other)

    run_and_check(case, inspect_outputs=inspect)
    print(case.label(), seen)
    assert seen["d"] < ROUND_TOL and seen["dprob"] < ROUND_TOL, seen
    assert seen["d_unrounded"] > ROUND_EFFECT and seen["dprob_unrounded"] > ROUND_EFFECT, seen


@pytest.mark.parametrize("case", ragged_cases(), ids=lambda c: c.label())
def test_sm90_ragged_matches_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", ragged_cases()[:2], ids=lambda c: c.label())
def test_sm90_ragged_fresh_outputs(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case, fresh=True))


@pytest.mark.parametrize("case", any_size_cases(), ids=lambda c: c.label())
def test_sm90_any_size_groups_match_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", any_size_cases()[:2], ids=lambda c: c.label())
def test_sm90_any_size_groups_fresh_outputs(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case, fresh=True))


@pytest.mark.parametrize("align,first,second", [
    (8, [8, 0, 136, 120, 264, 0, 504, 8], [256, 8, 0, 0, 512, 120, 136, 8]),
    (1, [1, 0, 137, 119, 263, 0, 505, 9], [255, 9, 0, 0, 513, 121, 135, 1])], ids=["a8", "a1"])
def test_sm90_ragged_graph_replay_with_new_offsets(align, first, second):
    """A captured ragged launch replayed with other offsets (same M; aligned to 8 rows, or
    not at all): the tile table is rebuilt on the device, so the replay follows the new
    experts' rows."""
    skip_unless_sm90()
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for
    from cudnn_ext.reference import reference_outputs

    assert sum(first) == sum(second)
    case = Case(first, 160, 264, "dswiglu", m_aligned=align)
    problem, pack = make_pack(case)
    plan = Sm90DgluEngine().build(problem, config_for(problem, tile_n=128))
    ws = torch.full((plan.workspace_size,), 0xA5, dtype=torch.uint8, device="cuda")
    g = capture_execute(plan, pack, ws)
    offs = torch.tensor(second, device="cuda").cumsum(0).to(torch.int32)
    pack["padded_offsets"].copy_(offs)
    pack["dprob"].zero_()
    pack["dbias"].zero_()
    pack["d_row"].fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref = reference_outputs(problem, pack, compute_dtype=torch.float64,
                            dprob_init=torch.zeros_like(pack["dprob"]))
    rows = sum(second)
    assert not torch.isnan(pack["d_row"][:rows]).any()
    assert torch.isnan(pack["d_row"][rows:]).all()
    assert rel_err(pack["d_row"][:rows], ref["d_row"][:rows]) < TOL["d_bf16"]
    assert rel_err(pack["dprob"], ref["dprob"]) < TOL["dprob"]
    assert rel_err(pack["dbias"], ref["dbias"]) < TOL["dbias"]


def test_sm90_ragged_offsets_past_m_stop_at_m():
    """Offsets whose last value passes M break the contract, and only the device reads them:
    the ragged schedule clips the experts at M, so the kernel writes D's and dprob's rows
    below M as for offsets clipped there, and nothing past them."""
    skip_unless_sm90()
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for
    from cudnn_ext.reference import reference_outputs

    case = Case([8, 136, 120], 96, 200, "dswiglu", m_aligned=8, extra_rows=0)
    problem, pack = make_pack(case)
    m, two_n = pack["d_row"].shape
    plan = Sm90DgluEngine().build(problem, config_for(problem, tile_n=128))
    d_big = torch.full((m + 384, two_n), float("nan"), dtype=pack["d_row"].dtype, device="cuda")
    dprob_big = torch.full((m + 384,), 7.0, device="cuda")
    dprob_big[:m].zero_()
    pack["d_row"], pack["dprob"] = d_big[:m], dprob_big[:m]
    pack["dbias"].zero_()
    pack["padded_offsets"].copy_(torch.tensor([8, 200, m + 256], device="cuda"))
    ws = torch.full((plan.workspace_size,), 0xA5, dtype=torch.uint8, device="cuda")
    plan.execute(pack, ws, torch.cuda.current_stream())
    torch.cuda.synchronize()
    clipped = dict(pack, padded_offsets=torch.tensor([8, 200, m], dtype=torch.int32,
                                                     device="cuda"))
    ref = reference_outputs(problem, clipped, compute_dtype=torch.float64,
                            dprob_init=torch.zeros(m, device="cuda"))
    assert torch.isnan(d_big[m:]).all() and (dprob_big[m:] == 7.0).all()
    assert rel_err(pack["d_row"], ref["d_row"]) < TOL["d_bf16"]
    assert rel_err(pack["dprob"], ref["dprob"]) < TOL["dprob"]
    assert rel_err(pack["dbias"], ref["dbias"]) < TOL["dbias"]
