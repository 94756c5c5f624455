"""CPU tier: every SM90 kernel variant the engine can select compiles for sm_90a (no GPU).

What can be selected is the engine's knob space (the heuristics rank it, autotune times its
first entries) over the problem families the contract lets through (bf16 A/B; bf16, fp16 or
fp32 C and D; dSwiGLU or dGeGLU; dbias or not; dense or per-expert weights, K- or N-major),
each in the launch variants plans run (the contract; fresh outputs for the functional op; a
scratch kept zero for the replay). The knob space is small: ping-pong tiles 64 and 128 in 1x1
and 2x1 clusters (2x2 for dense weights), with 64-row C entries where they apply, and one
cooperative form (2-stage, or deep with the split last round). The compiled cases cover every
entry of it, every C/D type pair, both activations, dbias on and off, both weight modes and
both B layouts, each where it meets the code it changes (``_CASES``); combinations of knobs
the engine never offers are not compiled (the GPU tests run some of them on an H200).

Each configuration compiles once per process (``_compiled``: ptxas's report and the PTX), so
the tests that read the same kernel share one compile (the config, knob space and plans:
``test_sm90_config.py``). Skipped cleanly when the CuTe DSL is not importable.
"""
import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from cudnn_ext.engines.sm90 import Sm90DgluEngine, _activation_forms, config_for, cooperative_config
from sm90_problem import BF16, FP16, FP32, _DT, problem as _problem

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


# ---------------------------------------------------------------------- compiles
@contextlib.contextmanager
def _output():
    """Everything printed inside the block, through ``sys.stdout``/``sys.stderr`` (the DSL
    prints ptxas's report there) or to file descriptors 1 and 2: the yielded list holds it
    afterwards."""
    got = []
    text = io.StringIO()
    with tempfile.TemporaryFile(mode="w+") as out:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield got
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            out.seek(0)
            got.append(text.getvalue() + out.read())


_COMPILED = {}


def _compiled(cfg):
    """(ptxas report, PTX) of ``cfg``, compiled for sm_90a once per process."""
    if cfg not in _COMPILED:
        from cudnn_ext.kernels.sm90.build import compile_kernel

        with tempfile.TemporaryDirectory() as ptx_dir:
            with _output() as out:
                compile_kernel(cfg, remarks=True, ptx_dir=ptx_dir)
            ptx = [p.read_text() for p in Path(ptx_dir).glob("*.ptx")]
        assert len(ptx) == 1, f"expected one PTX file, got {len(ptx)}"
        _COMPILED[cfg] = (out[0], ptx[0])
    return _COMPILED[cfg]


def _check_report(cfg, max_spill=0):
    """ptxas's report of ``cfg``: no WGMMA performance warning (C7519 "wgmma.mma_async
    instructions are serialized" made the no-dbias kernel 1.6x slower on the H200; C7517
    "wait_group is injected") and no register spills beyond ``max_spill`` bytes, in every
    kernel of the launch."""
    out, _ = _compiled(cfg)
    assert "ptxas info" in out and "Used" in out, "ptxas printed no report: nothing was checked"
    wgmma = [ln for ln in out.splitlines() if "wgmma" in ln.lower()]
    assert not wgmma, "ptxas WGMMA performance warning:\n" + "\n".join(wgmma)
    spills = re.findall(r"(\d+) bytes spill stores", out)
    assert spills and max(int(s) for s in spills) <= max_spill, f"register spills: {spills} B"


#: (id, problem, the knob-space entry (tile_n, cluster_m, cluster_n, c_split; "coop" for the
#: cooperative form), launch variant). Ping-pong at N 96 (a partial N-tile; with 2x2 clusters
#: a phantom one), K 200 (a K tail; per-expert weights past K 2048 get 128-row C entries);
#: cooperative at N 512 and M 32768 (enough 128 x 256 tiles), shallow K 2048, mid K 4096 and
#: deep K 7168 (the deep form splits its last round). Each C/D type pair appears.
_P = dict(n=96, k=200)
_COOP = dict(n=512, m=32768)
_CASES = [
    ("t128-2x1-half-swiglu-dbias", _problem(**_P), (128, 2, 1, 2), None),
    ("t64-1x1-swiglu-dbias-K64", _problem(n=32, k=64), (64, 1, 1, 1), None),
    ("t128-2x1-half-geglu-nmajor", _problem(act="dgeglu", dbias=False, b_major="n", **_P),
     (128, 2, 1, 2), None),
    ("t64-2x1-geglu-dbias-Cfp32-Dfp32", _problem(act="dgeglu", c=FP32, d=FP32, **_P),
     (64, 2, 1, 1), None),
    ("t64-1x1-swiglu-nmajor-Cfp32-Dbf16", _problem(dbias=False, c=FP32, b_major="n", **_P),
     (64, 1, 1, 1), None),
    ("t128-1x1-half-geglu-dbias-Cfp16-Dfp16", _problem(act="dgeglu", c=FP16, d=FP16, **_P),
     (128, 1, 1, 2), None),
    ("t128-2x2-swiglu-dbias-nmajor-Cfp16-Dbf16", _problem(c=FP16, b_major="n", **_P),
     (128, 2, 2, 1), None),
    ("t64-2x2-geglu-Cbf16-Dfp16", _problem(act="dgeglu", dbias=False, d=FP16, **_P),
     (64, 2, 2, 1), None),
    ("t128-2x1-geglu-dbias-Cbf16-Dfp32", _problem(act="dgeglu", d=FP32, **_P),
     (128, 2, 1, 1), None),
    ("discrete-t128-2x1-swiglu-dbias-K2056",
     _problem(weight_mode="discrete", n=96, k=2056), (128, 2, 1, 1), None),
    ("discrete-t128-1x1-geglu-dbias-nmajor-K2056-Cfp16-Dfp32",
     _problem(act="dgeglu", c=FP16, d=FP32, weight_mode="discrete", b_major="n", n=96, k=2056),
     (128, 1, 1, 1), None),
    ("discrete-t64-1x1-swiglu-nmajor-Cfp32-Dfp16",
     _problem(dbias=False, c=FP32, d=FP16, weight_mode="discrete", b_major="n", **_P),
     (64, 1, 1, 1), None),
    ("discrete-t64-2x1-geglu-dbias-nmajor",
     _problem(act="dgeglu", weight_mode="discrete", b_major="n", **_P), (64, 2, 1, 1), None),
    ("discrete-t128-2x1-half-swiglu-dbias-Cfp16-Dfp16",
     _problem(c=FP16, d=FP16, weight_mode="discrete", **_P), (128, 2, 1, 2), None),
    ("coop-shallow-swiglu-Cbf16-Dfp16", _problem(dbias=False, d=FP16, k=2048, **_COOP),
     "coop", None),
    ("coop-mid-geglu-dbias-nmajor", _problem(act="dgeglu", b_major="n", k=4096, **_COOP),
     "coop", None),
    ("coop-deep-swiglu-dbias", _problem(k=7168, **_COOP), "coop", None),
    ("coop-deep-geglu-dbias-nmajor-Cfp16-Dfp16",
     _problem(act="dgeglu", c=FP16, d=FP16, b_major="n", k=7168, **_COOP), "coop", None),
    ("coop-deep-swiglu-Cbf16-Dfp16", _problem(dbias=False, d=FP16, k=7168, **_COOP),
     "coop", None),
    ("discrete-coop-deep-swiglu-dbias-nmajor",
     _problem(weight_mode="discrete", b_major="n", k=7168, **_COOP), "coop", None),
    ("discrete-coop-mid-geglu-Cfp16-Dbf16",
     _problem(act="dgeglu", dbias=False, c=FP16, weight_mode="discrete", k=4096, **_COOP),
     "coop", None),
    # the activation output and round_dgrad (bf16 C and D, as the contract has them)
    ("t128-2x1-half-geglu-dbias-act-round",
     _problem(act="dgeglu", activation=True, round_dgrad=True, **_P), (128, 2, 1, 2), None),
    ("discrete-t64-1x1-swiglu-round-Cfp32-Dfp32",
     _problem(c=FP32, d=FP32, round_dgrad=True, weight_mode="discrete", **_P), (64, 1, 1, 1),
     None),
    ("coop-deep-geglu-dbias-act", _problem(act="dgeglu", activation=True, k=7168, **_COOP),
     "coop", None),
    ("t128-2x1-half-swiglu-dbias-act", _problem(activation=True, **_P), (128, 2, 1, 2), None),
    ("coop-deep-swiglu-dbias-act", _problem(activation=True, k=7168, **_COOP), "coop", None),
    ("coop-mid-swiglu-dbias-act", _problem(activation=True, k=4096, **_COOP), "coop", None),
    ("coop-mid-geglu-dbias-act", _problem(act="dgeglu", activation=True, k=4096, **_COOP), "coop", None),
    # the activation output staged through shared memory (act_staged: the heuristics' form
    # where D leaves through shared memory)
    ("staged-t128-2x1-half-geglu-dbias-act-round",
     _problem(act="dgeglu", activation=True, round_dgrad=True, **_P), (128, 2, 1, 2), "act_staged"),
    ("staged-coop-deep-geglu-dbias-act", _problem(act="dgeglu", activation=True, k=7168, **_COOP),
     "coop", "act_staged"),
    ("staged-coop-mid-swiglu-dbias-act", _problem(activation=True, k=4096, **_COOP), "coop",
     "act_staged"),
    ("staged-ragged-coop-mid-swiglu-act", _problem(activation=True, k=4096, m_aligned=8, **_COOP),
     "coop", "act_staged"),
    ("staged-ragged-t64-1x1-geglu-act-round",
     _problem(act="dgeglu", activation=True, round_dgrad=True, m_aligned=16, **_P),
     (64, 1, 1, 1), "act_staged"),
    ("fresh-t64-2x2-geglu-act-round",
     _problem(act="dgeglu", dbias=False, activation=True, round_dgrad=True, **_P),
     (64, 2, 2, 1), "init_outputs"),
    # the functional op's fresh outputs, and the replay's scratch kept zero
    ("fresh-t128-2x1-half-swiglu-dbias", _problem(**_P), (128, 2, 1, 2), "init_outputs"),
    ("fresh-discrete-t128-1x1-geglu-dbias-nmajor-K2056-Cfp16-Dfp32",
     _problem(act="dgeglu", c=FP16, d=FP32, weight_mode="discrete", b_major="n", n=96, k=2056),
     (128, 1, 1, 1), "init_outputs"),
    ("fresh-coop-deep-swiglu-dbias", _problem(k=7168, **_COOP), "coop", "init_outputs"),
    ("zeroed-coop-deep-swiglu-dbias", _problem(k=7168, **_COOP), "coop", "ws_zeroed"),
    # the ragged schedule (offsets aligned to 8 rows): every cluster shape, the clipping D
    # store (16-bit D of C's type), register stores (fp32 D), the activation output (tile
    # 64 only), discrete weights, both cooperative forms, 64-row C entries, fresh outputs
    ("ragged-t128-2x1-half-swiglu-dbias", _problem(m_aligned=8, n=8192, k=200),
     (128, 2, 1, 2), None),
    ("ragged-t128-2x2-geglu-Cbf16-Dfp16", _problem(act="dgeglu", dbias=False, d=FP16,
                                                   m_aligned=32, n=8224, k=200),
     (128, 2, 2, 1), None),
    ("ragged-t128-1x1-half-swiglu-dbias", _problem(m_aligned=8, **_P), (128, 1, 1, 2), None),
    ("ragged-t64-1x1-geglu-dbias-Cbf16-Dfp32", _problem(act="dgeglu", d=FP32, m_aligned=8, **_P),
     (64, 1, 1, 1), None),
    ("ragged-t64-1x1-geglu-act-round",
     _problem(act="dgeglu", activation=True, round_dgrad=True, m_aligned=16, **_P),
     (64, 1, 1, 1), None),
    ("ragged-t64-1x1-swiglu-dbias-act", _problem(activation=True, m_aligned=8, **_P),
     (64, 1, 1, 1), None),
    ("ragged-discrete-t128-2x1-swiglu-dbias-nmajor-K2056",
     _problem(weight_mode="discrete", b_major="n", n=8192, k=2056, m_aligned=8),
     (128, 2, 1, 1), None),
    ("ragged-coop-mid-geglu-dbias", _problem(act="dgeglu", k=4096, m_aligned=8, **_COOP),
     "coop", None),
    ("ragged-coop-deep-swiglu-dbias", _problem(k=7168, m_aligned=128, **_COOP), "coop", None),
    ("fresh-ragged-t128-1x1-half-swiglu-dbias", _problem(m_aligned=8, **_P), (128, 1, 1, 2),
     "init_outputs"),
    ("zeroed-ragged-coop-deep-swiglu-dbias", _problem(k=7168, m_aligned=8, **_COOP), "coop",
     "ws_zeroed"),
]


def _selected(problem, entry, variant=None):
    """The knob-space entry of ``problem`` that ``entry`` names (exactly one), in ``variant``
    (a launch variant, or ``act_staged``: the entry's staged activation form, else its
    register form)."""
    space = Sm90DgluEngine().knob_space(problem)
    staged = variant == "act_staged"
    if entry == "coop":
        found = [kn for kn in space if kn.cooperative and kn.act_staged == staged]
    else:
        found = [kn for kn in space if not kn.cooperative and kn.act_staged == staged
                 and (kn.tile_n, kn.cluster_m, kn.cluster_n, kn.c_split) == entry]
    assert len(found) == 1, (entry, space)
    return dataclasses.replace(found[0], **{variant: True}) if variant and not staged else found[0]


def _max_spill(problem):
    # fp32 C (twice the gate/up registers) or D of another type spill a few bytes in the
    # ping-pong epilogue of a partial last N-tile; 16-bit C and D of one type spill nothing
    same16 = problem.c_dtype == problem.d_dtype and problem.c_dtype in (BF16, FP16)
    return 0 if same16 else 32


@needs_dsl
@pytest.mark.parametrize("problem,entry,variant", [c[1:] for c in _CASES],
                         ids=[c[0] for c in _CASES])
def test_selectable_variant_compiles_for_sm90a(problem, entry, variant):
    cfg = _selected(problem, entry, variant)
    if entry == "coop":
        coop = cooperative_config(problem)
        assert dataclasses.replace(cfg, init_outputs=False, ws_zeroed=False) in (
            _activation_forms(problem, coop) if problem.generate_activation else [coop])
        assert cfg.split_last == (3 if problem.k >= 5120 and problem.act.act_func == "dswiglu" else 1)
    assert cfg.ragged_m == (problem.m_aligned < 256)
    spill = 0 if cfg.cooperative else _max_spill(problem)
    if cfg.cooperative and cfg.stages() == 3 and cfg.generate_activation and cfg.act_func == "dgeglu":
        spill = 4  # the deep form's branch-free activation stores (measured faster: docs/performance.md)
    if cfg.ragged_m and cfg.generate_activation:
        # the masked register stores: 20-24 B (the 128-wide form: 252 B, not offered); staged,
        # dGeGLU's ragged epilogue still spills 4 B (16 B with round_dgrad; dSwiGLU none)
        spill = 16 if cfg.act_staged else 24
    _check_report(cfg, spill)


def test_cases_cover_the_knob_space_and_the_families():
    """Every knob-space entry of both weight modes (each cluster shape x tile, 64-row C
    entries, both cooperative forms), every C/D type pair, both activations, dbias on and
    off, K- and N-major B, and both launch variants appear among the compiled cases."""
    entries = {(c[1].weight_mode, c[2] if c[2] != "coop" else ("coop", c[1].k >= 5120))
               for c in _CASES if c[1].m_aligned == 256}
    dense = {(t, cm, cn) for cm, cn in ((1, 1), (2, 1), (2, 2)) for t in (64, 128)}
    disc = {(t, cm, 1) for cm in (1, 2) for t in (64, 128)}
    for wm, shapes in (("dense", dense), ("discrete", disc)):
        got = {e[:3] for m, e in entries if m == wm and e[0] != "coop"}
        assert got == shapes, (wm, shapes - got)
        assert {e for m, e in entries if m == wm and e[0] == "coop"} == {("coop", False),
                                                                      ("coop", True)}
        assert {e[3] for m, e in entries if m == wm and e[0] != "coop"} == {1, 2}
    probs = [c[1] for c in _CASES]
    assert {(p.c_dtype, p.d_dtype) for p in probs} == {(c, d) for c in _DT for d in _DT}
    for attr, values in (("generate_dbias", {True, False}), ("b_major", {"k", "n"}),
                         ("generate_activation", {True, False}),
                         ("round_dgrad_to_input_dtype", {True, False})):
        assert {getattr(p, attr) for p in probs} == values
    assert {p.act.act_func for p in probs} == {"dswiglu", "dgeglu"}
    assert {c[3] for c in _CASES} == {None, "init_outputs", "ws_zeroed", "act_staged"}
    # the ragged schedule: each cluster shape, tile 64 and 128, both cooperative forms
    ragged = {(c[1].weight_mode, c[2] if c[2] != "coop" else ("coop", c[1].k >= 5120))
              for c in _CASES if c[1].m_aligned < 256}
    assert {e[1][1:3] for e in ragged if e[1][0] != "coop"} == {(1, 1), (2, 1), (2, 2)}
    assert {e[1][0] for e in ragged if e[1][0] != "coop"} == {64, 128}
    assert {e[1] for e in ragged if e[1][0] == "coop"} == {("coop", False), ("coop", True)}


def test_ragged_knob_space():
    """m_aligned below 256: every configuration is ragged; below N 8192 in 1x1 clusters
    only (the cooperative form too), from N 8192 on the same shapes as at 256; with the
    activation output tile 64 only."""
    eng = Sm90DgluEngine()
    for p in (_problem(m_aligned=8), _problem(weight_mode="discrete", m_aligned=64),
              _problem(k=7168, m_aligned=8, **_COOP), _problem(n=8192, m_aligned=8),
              _problem(n=8192, k=7168, m=32768, m_aligned=8)):
        space = eng.knob_space(p)
        flat = eng.knob_space(dataclasses.replace(p, m_aligned=256))
        assert space and all(k.ragged_m for k in space)
        if p.n >= 8192:
            assert [dataclasses.replace(k, ragged_m=False) for k in space] == flat
        else:
            assert all(k.cluster_m == 1 and k.cluster_n == 1 for k in space)
            assert {(k.tile_n, k.cooperative) for k in space} == {(k.tile_n, k.cooperative)
                                                                  for k in flat}
    assert any(k.cooperative for k in eng.knob_space(_problem(k=7168, m_aligned=8, **_COOP)))
    act = eng.knob_space(_problem(act="dgeglu", activation=True, m_aligned=8))
    assert {k.tile_n for k in act} == {64}
    assert not any(k.ragged_m for k in eng.knob_space(_problem()))
    assert eng.check_support(_problem(m_aligned=8)) == []


@needs_dsl
@pytest.mark.parametrize("knobs", [dict(tile_n=128, cluster_m=2, c_split=2),
                                   dict(tile_n=256, cluster_m=2, cooperative=True)],
                         ids=["t128-2x1-half", "coop"])
def test_dsituglu_on_bf16_operands_compiles_for_sm90a(knobs):
    """dSiTU-GLU on bf16 operands with dbias and an N tail (what the GPU tier runs through the
    plan: tests/gpu/test_sm90_correctness.py), without spills."""
    _check_report(config_for(_problem(act="dsituglu", n=320, k=264), **knobs))


@needs_dsl
def test_trace_build_compiles_for_sm90a():
    """The diagnostic build (not selectable; ``Sm90TracePlan``) still
    compiles, on the ping-pong 64-row C entry form the benchmarks trace most."""
    p = _problem(n=768, k=2048)
    _check_report(config_for(p, tile_n=128, cluster_m=2, c_split=2, trace=64))


_BLOCKING_BARRIER = re.compile(
    r"^\s*(?:@!?%\w+\s+)?(?:bar|barrier)(?:\.cta)?\.(?:sync|red)\S*\s+([^,;]+?)(?:,\s*([^,;]+?))?"
    r"(?:,[^;]*)?;", re.M)


def _blocking_named_barriers(ptx: str) -> dict:
    """{thread count: [barrier operand of each blocking site]} over the PTX's blocking
    named-barrier instructions that name a thread count (bar.sync, barrier.sync,
    barrier.cta.sync, bar.red and their variants; arrives do not block)."""
    sites = {}
    for bid, count in _BLOCKING_BARRIER.findall(ptx):
        if count:
            sites.setdefault(count.strip(), []).append(bid.strip())
    return sites


@needs_dsl
@pytest.mark.parametrize("case", ["discrete-t128-2x1-swiglu-dbias-K2056",
                                  "t128-2x1-half-swiglu-dbias", "coop-deep-swiglu-dbias"])
def test_each_partial_barrier_blocks_at_one_instruction(case):
    """An aligned named barrier (``bar.sync``) lets the threads that block in one generation
    do so at one instruction only; with two, compute-sanitizer's synccheck stopped the kernel
    (the ping-pong C producer and the dbias folder warp once both blocked on the fold barrier,
    each from its own code). The PTX must not block on a partial barrier (one with a thread
    count) at two places with the same thread count: the check cannot tell register barrier
    ids apart, so it holds each count to one blocking site (the ping-pong turn barriers: one
    ``bar.sync`` of 256 threads, the other side arrives). Ping-pong with 128- and 64-row C
    entries and the cooperative deep form, all with dbias (the compiled cases' PTX)."""
    (problem, entry, variant), = [c[1:] for c in _CASES if c[0] == case]
    cfg = _selected(problem, entry, variant)
    assert cfg.generate_dbias
    _, ptx = _compiled(cfg)
    sites = _blocking_named_barriers(ptx)
    assert "bar.sync" in ptx or "barrier.sync" in ptx, "no barrier found: the parse is off"
    shared = {count: ids for count, ids in sites.items() if len(ids) > 1}
    assert not shared, f"partial barriers blocked at more than one place: {shared}"


def test_blocking_barrier_parse_sees_both_sides_of_a_shared_barrier():
    """The parse on the PTX of a fold that blocked at two places (before its fix), and on
    arrives."""
    ptx = """
	barrier.sync 	%r3394, 64;
	@%p5 bar.sync 	%r60, 256;
	bar.arrive %r448, 256;
	barrier.cta.arrive 7, 64;
	barrier.sync 	6, 64;
	bar.sync 	0;
"""
    assert _blocking_named_barriers(ptx) == {"64": ["%r3394", "6"], "256": ["%r60"]}


#: The fp8_blockwise engine's configurations (one per problem: cooperative 128 x 128, 2x1
#: clusters, or 1x1 where the ragged schedule leaves clusters out): every activation, dbias on
#: and off, the activation output, C/D types, an N tail, aligned and ragged groups.
def _fp8(act="dswiglu", c=BF16, d=BF16, dbias=True, n=160, k=384, activation=False, m_aligned=256):
    import torch
    from cudnn_ext.problem import ActConfig, DgluProblem

    return DgluProblem(n=n, k=k, num_experts=4, m=4096, weight_mode="dense", b_major="k",
                       ab_dtype=torch.float8_e4m3fn, c_dtype=c, d_dtype=d,
                       act=ActConfig(act_func=act), generate_dbias=dbias, device_type="cuda",
                       generate_activation=activation, m_aligned=m_aligned, recipe="fp8_blockwise")


_FP8_CASES = [
    ("swiglu-dbias", _fp8()),
    ("geglu-act-Dfp32", _fp8(act="dgeglu", d=FP32, dbias=False)),
    ("situglu-dbias-act", _fp8(act="dsituglu", activation=True)),
    ("swiglu-Cfp32-Dfp16", _fp8(c=FP32, d=FP16)),
    ("ragged-swiglu-dbias-act", _fp8(activation=True, m_aligned=8)),
    ("ragged-wide-geglu-dbias", _fp8(act="dgeglu", n=8192, k=2048, m_aligned=8)),
]


@needs_dsl
@pytest.mark.parametrize("problem", [c[1] for c in _FP8_CASES], ids=[c[0] for c in _FP8_CASES])
def test_fp8_blockwise_kernels_compile_for_sm90a(problem):
    """FP8 WGMMA (e4m3 x e4m3, K 32) with the per-k-tile promotion: no spills (16-bit C and D
    of one type; the register-store forms as the BF16 kernel allows), no WGMMA warning."""
    from cudnn_ext.engines.sm90_fp8_blockwise import Sm90Fp8BlockwiseEngine

    eng = Sm90Fp8BlockwiseEngine()
    assert eng.check_support(problem) == []
    (cfg,) = eng.knob_space(problem)
    assert cfg.blockwise() and cfg.cooperative and cfg.tile_n == 128
    _check_report(cfg, 0 if problem.c_dtype == problem.d_dtype else 32)
    _, ptx = _compiled(cfg)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3", ptx)


@needs_dsl
@pytest.mark.parametrize("act", ["dswiglu", "dsituglu"])
def test_fp8_blockwise_ping_pong_form_compiles_for_sm90a(act):
    """The ping-pong 128 x 64 form of the e4m3 mainloop (a config the GPU tier pins; not in
    the engine's knob space until measured): no spills, no WGMMA warning."""
    from cudnn_ext.engines.sm90_fp8_blockwise import kernel_problem

    cfg = config_for(kernel_problem(_fp8(act=act, n=2048, k=7168)), tile_n=64, cluster_m=2)
    assert cfg.blockwise() and not cfg.cooperative
    _check_report(cfg)
    _, ptx = _compiled(cfg)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e4m3", ptx)


@needs_dsl
def test_fp8_blockwise_staggered_form_compiles_for_sm90a():
    """The cooperative e4m3 mainloop with ``wg_stagger`` (a config the GPU tier pins; not in
    the knob space until measured): no spills, no WGMMA warning, and the named barrier the
    second warpgroup waits on before its first k-tile (bar 2 of 256 threads) is in the PTX,
    where the plain form has none."""
    from cudnn_ext.engines.sm90_fp8_blockwise import kernel_problem

    base = dict(tile_n=128, c_stages=2, cluster_m=2, cooperative=True)
    cfg = config_for(kernel_problem(_fp8(n=2048, k=7168)), wg_stagger=True, **base)
    _check_report(cfg)
    _, ptx = _compiled(cfg)
    _, plain = _compiled(config_for(kernel_problem(_fp8(n=2048, k=7168)), **base))
    bar = re.compile(r"bar(?:rier)?\.(?:sync|arrive)(?:\.aligned)?\s+2,\s*256")
    assert bar.search(ptx) and not bar.search(plain)


def test_fp8_blockwise_stagger_needs_as_many_k_tiles_as_stages():
    """With fewer k-tiles than A/B stages warpgroup 0 could arrive for the next tile before
    warpgroup 1 waited for this one (a lost barrier phase, a hang): refused."""
    from cudnn_ext.engines.sm90_fp8_blockwise import kernel_problem

    base = dict(tile_n=128, c_stages=2, cluster_m=2, cooperative=True, wg_stagger=True)
    with pytest.raises(ValueError, match="at least as many k-tiles as A/B stages"):
        config_for(kernel_problem(_fp8(n=2048, k=512)), **base).check()
    config_for(kernel_problem(_fp8(n=2048, k=512)), ab_stages=4, **base).check()
    config_for(kernel_problem(_fp8(n=2048, k=768)), **base).check()
    with pytest.raises(ValueError, match="e4m3 operands in the cooperative schedule"):
        config_for(kernel_problem(_fp8(n=2048, k=1024)), tile_n=64, cluster_m=2, wg_stagger=True).check()


#: The deterministic form (``Sm90Config.deterministic``) on each schedule that stores its
#: partials differently: ping-pong (the C producer warp's dbias store) with 64-row C entries,
#: cooperative (the folder warp's), both ragged, dGeGLU without dbias (dprob alone).
_DET = [
    ("t128-2x1-half-swiglu-dbias", _problem(**_P), dict(tile_n=128, cluster_m=2, c_split=2)),
    ("t64-1x1-geglu", _problem(act="dgeglu", dbias=False, **_P), dict(tile_n=64, cluster_m=1)),
    ("t64-2x1-swiglu-dbias", _problem(**_P), dict(tile_n=64, cluster_m=2)),
    ("coop-deep-swiglu-dbias", _problem(k=7168, **_COOP), None),
    ("ragged-coop-swiglu-dbias", _problem(k=7168, m_aligned=8, **_COOP), None),
    ("ragged-t128-swiglu-dbias", _problem(m_aligned=8, **_P), dict(tile_n=128, cluster_m=1)),
]


@needs_dsl
@pytest.mark.parametrize("problem,knobs", [c[1:] for c in _DET], ids=[c[0] for c in _DET])
def test_deterministic_form_compiles_without_accumulating_atomics(problem, knobs):
    """No spills, no WGMMA warning, and no global atomic at all: nothing is summed in an
    order the hardware picks, and no arrival is counted (the plan folds the slabs afterwards,
    ``kernels.partials``: no fold, counter or workspace sums in the kernel)."""
    problem = dataclasses.replace(problem, deterministic=True)
    cfg = cooperative_config(problem) if knobs is None else config_for(problem, **knobs)
    assert cfg.deterministic and cfg.split_last == 1
    _check_report(cfg, 0 if cfg.cooperative else _max_spill(problem))
    _, ptx = _compiled(cfg)
    atomics = [ln.strip() for ln in ptx.splitlines() if re.search(r"\b(atom|red)(\.[a-z]+)*\.global", ln)]
    assert not atomics, atomics[:3]
    assert not cfg.fold_in_kernel() and cfg.dbias_ws_elems(8) == 0
