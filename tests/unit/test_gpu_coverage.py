"""docs/test_coverage.md against the GPU tests' case lists, on the CPU.

Every cell of the coverage tables that names a GPU test (``file.py::test[id]``, in tests/gpu/)
must name a parametrization that exists and runs that axis value on that engine: the case
lists are read from the test functions' ``parametrize`` marks (the modules import without a
GPU), so removing or changing a case fails here. A ``declined:`` cell must quote a reason the
engine's ``check_support`` gives for that value; ``—`` marks a value that is not the engine's.
The rows must list every value the contract defines for their axis.
"""
import functools
import importlib.util
import pathlib
import re

import torch

from cudnn_ext.contract import CD_DTYPES, M_ALIGNED_CHOICES, SCALAR_DTYPES, blockscaled as BSC
from cudnn_ext.engines.heuristics import ranked_knobs
from cudnn_ext.engines.reference import ReferenceEngine
from cudnn_ext.engines.sm90 import COOPERATIVE_DEEP_KNOBS, COOPERATIVE_KNOBS, Sm90DgluEngine, config_for
from cudnn_ext.engines.sm90_blockscaled import Sm90BlockScaledEngine
from cudnn_ext.activations import names as act_names
from cudnn_ext.problem import ActConfig, BlockScaleConfig, DgluProblem
from sm90_cases import Case

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "test_coverage.md"
#: the tables (the page's "## " headings) and the engine columns
AB, BF, BS, KN = "A/B operands", "BF16 operands", "Block-scaled operands", "Kernel configuration"
SM90, SMBS, REF = "sm90_cutedsl", "sm90_blockscaled", "reference (CUDA)"
ENGINES = {SM90: Sm90DgluEngine(), SMBS: Sm90BlockScaledEngine(), REF: ReferenceEngine()}
BF16, FP16, FP32, E4M3, E5M2, E8M0, U8 = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn,
                                          torch.float8_e5m2, torch.float8_e8m0fnu, torch.uint8)
DT = {BF16: "bf16", FP16: "fp16", FP32: "fp32", E4M3: "e4m3", E5M2: "e5m2"}
FLOAT4 = "FP4 as float4_e2m1fn_x2"
#: the A/B rows: (element dtype, sf_vec_size, scale dtype) of each block-scaled format
FORMATS = {"MXFP8 e4m3": (E4M3, 32, E8M0), "MXFP8 e5m2": (E5M2, 32, E8M0), "NVFP4": (U8, 16, E4M3),
           "MXFP4": (U8, 32, E8M0), "FP4 e8m0, sf_vec 16": (U8, 16, E8M0),
           FLOAT4: (torch.float4_e2m1fn_x2, 16, E4M3)}
_FMT_NAMES = {"mxfp8-e4m3": "MXFP8 e4m3", "mxfp8-e5m2": "MXFP8 e5m2", "nvfp4": "NVFP4", "mxfp4": "MXFP4",
              "e4m3": "MXFP8 e4m3", "e5m2": "MXFP8 e5m2", "fp4-e8m0-16": "FP4 e8m0, sf_vec 16"}
#: every reference call in the GPU tests runs the heuristics' reference plan
REF_PLAN = {(KN, "compute", "float32", REF)}


# ----------------------------------------------------------------- parametrizations, as pytest names them
@functools.lru_cache(maxsize=None)
def _module(stem):  # a private name: pytest's own import of the GPU module stays untouched
    spec = importlib.util.spec_from_file_location(f"_coverage_{stem}", ROOT / "tests" / "gpu" / f"{stem}.py")
    spec.loader.exec_module(mod := importlib.util.module_from_spec(spec))
    return mod


def _idval(value, name, i, fn):
    shown = fn(value) if callable(fn) else None
    if shown is not None:
        return str(shown)
    return str(value) if value is None or isinstance(value, (str, int, float, bool)) else f"{name}{i}"


def parametrizations(func):
    """[(id, {argname: value})] of ``func``'s stacked parametrize marks (closest mark first in
    the id, as pytest joins them)."""
    combos = [("", {})]
    for mark in (m for m in getattr(func, "pytestmark", []) if m.name == "parametrize"):
        names = [s.strip() for s in mark.args[0].split(",")]
        ids, rows = mark.kwargs.get("ids"), []
        for i, val in enumerate(mark.args[1]):
            vals = tuple(val) if len(names) > 1 else (val,)
            ident = (str(ids[i]) if isinstance(ids, (list, tuple))
                     else "-".join(_idval(v, nm, i, ids) for v, nm in zip(vals, names)))
            rows.append((ident, dict(zip(names, vals))))
        combos = [(f"{a}-{b}" if a else b, {**p, **q}) for a, p in combos for b, q in rows]
    return combos


# ----------------------------------------------------------------- facts: (table, axis, value, engine)
def knob_facts(engine, cfg):
    forms = (("cooperative deep form", COOPERATIVE_DEEP_KNOBS), ("cooperative 2-stage form", COOPERATIVE_KNOBS))
    # (the deep form splits its last round for dSwiGLU only: split_last does not name it)
    sched = next((name for name, form in forms
                  if all(getattr(cfg, k) == v for k, v in form.items() if k != "split_last")),
                 "cooperative, other" if cfg.cooperative else "ping-pong")
    return {(KN, "schedule", sched, engine), (KN, "tile_n", str(cfg.tile_n), engine),
            (KN, "cluster", f"{cfg.cluster_m}x{cfg.cluster_n}", engine), (KN, "c_split", str(cfg.c_split), engine)}


def case_problem(case):
    """The problem ``sm90_cases.make_pack`` builds for ``case``, without its tensors."""
    return DgluProblem(n=case.n, k=case.k, num_experts=len(case.groups), m=sum(case.groups) + case.extra_rows,
                       weight_mode=case.weight_mode, b_major=case.b_major, ab_dtype=BF16, c_dtype=case.c_dtype,
                       d_dtype=case.d_dtype, act=ActConfig(act_func=case.act), generate_dbias=case.dbias,
                       generate_activation=case.activation, round_dgrad_to_input_dtype=case.round_dgrad,
                       m_aligned=case.m_aligned, device_type="cuda")


def case_facts(engine, case, cfg=None):
    """A BF16 ``sm90_cases.Case``; on sm90_cutedsl with the config ``run_and_check`` builds."""
    items = {(AB, AB, "bf16"), (BF, "C dtype", DT[case.c_dtype]), (BF, "D dtype", DT[case.d_dtype]),
             (BF, "weights", f"{case.weight_mode} {case.b_major.upper()}-major"), (BF, "activation", case.act),
             (BF, "dbias", "on" if case.dbias else "off"), (BF, "m_aligned", str(case.m_aligned))}
    items |= {(BF, axis, "on") for axis, on in (("activation output", case.activation),
                                                ("round_dgrad", case.round_dgrad)) if on}
    out = {item + (engine,) for item in items} | (REF_PLAN if engine == REF else set())
    if engine == SM90:
        if cfg is None:
            cfg = config_for(case_problem(case), **case.knobs())
        out |= knob_facts(engine, cfg)
    return out


def bs_problem(fmt, mode="dense", major="k", act="dswiglu", prob=True, dprob=True, dbias=False, c=BF16, d=BF16,
               amax=False, det=False, sfd=False, n=64):
    """The problem of an (N ``n``, K 128, L 3, M 1024) block-scaled call, as the contract makes it."""
    elem, vec, sf = FORMATS[fmt]
    return DgluProblem(
        n=n, k=128, num_experts=3, m=1024, weight_mode=mode, b_major=major, ab_dtype=elem, c_dtype=c, d_dtype=d,
        act=ActConfig(act_func=act, dgeglu_applies_beta=False), generate_dbias=dbias, has_prob=prob,
        has_dprob=dprob, device_type="cuda", deterministic=det, block_scale=BlockScaleConfig(
            sf_dtype=sf, sf_vec_size=vec, generate_sfd=sfd, generate_amax=amax))


def bs_facts(engines, fmt, mode="dense", major="k", act="dswiglu", prob=True, dprob=None, dbias=False, c=BF16,
             d=BF16, amax=False, alpha=FP32, beta=FP32, single=False, dcs=False, det=False, sfd=True,
             packed=U8, n=64, knobs=None, schedule=False):
    """A block-scaled call; with ``schedule`` (an (N 64, K 128, L 3, M 1024) call) the config
    sm90_blockscaled runs: ``knobs`` pinned, else its heuristics' first."""
    dprob = prob if dprob is None else dprob
    fp8 = d in (E4M3, E5M2)
    probs = {(1, 1): "both", (0, 0): "neither", (1, 0): "prob only", (0, 1): "dprob only"}[prob, dprob]
    items = {(AB, AB, fmt), (BS, "C dtype", DT[c]), (BS, "weights", f"{mode} {major.upper()}-major"),
             (BS, "activation", act), (BS, "D dtype", f"{DT[d]} {'with' if sfd else 'without'} SFD" if fp8 else DT[d]),
             (BS, "prob / dprob", probs), (BS, "dbias", "on" if dbias else "off"), (BS, "alpha dtype", DT[alpha]),
             (BS, "beta dtype", DT[beta]),
             (BS, "amax", "off" if not amax else "on, FP8 D" if fp8 else "on, fp32 D" if d == FP32 else "on, 16-bit D")}
    items |= {(BS, axis, "on") for axis, on in (("single-group offsets", single), ("discrete_col_sfd", dcs)) if on}
    items |= {(BS, "deterministic", "on, with dprob" if dprob else "on, without dprob")} if det else set()
    items |= {(AB, AB, FLOAT4)} if packed != U8 else set()
    out = {item + (e,) for item in items for e in engines} | (REF_PLAN if REF in engines else set())
    if schedule and SMBS in engines:
        problem = bs_problem(fmt, mode, major, act, prob, dprob, dbias, c, d, amax, det, fp8 and sfd, n)
        eng = ENGINES[SMBS]
        out |= knob_facts(SMBS, config_for(problem, **knobs) if knobs else ranked_knobs(eng, problem)[0][0])
    return out


def _cross(engine, pt):
    fp8 = pt.fmt.startswith("mxfp8")
    return bs_facts({engine}, _FMT_NAMES[pt.fmt], pt.mode, pt.b_major, pt.act, pt.prob, dbias=not pt.prob,
                    d=E4M3 if fp8 else BF16, amax=not fp8, schedule=True)


def _var(engine, v):
    return bs_facts({engine}, _FMT_NAMES[v.fmt], v.mode, "k", v.act, v.prob, v.dprob, v.dbias, v.c_dtype,
                    v.d_dtype, v.amax, det=v.deterministic, packed=v.packed, n=v.n, knobs=dict(v.knobs),
                    schedule=True)


def _heuristics_case(p):
    """``test_sm90_heuristics_choice_is_correct``'s case and the config the engine picks for it."""
    kw = {key: v for key, v in p["kw"].items() if key != "k"}
    case = Case([2048, 0, 4096, 1024, 3072, 2048, 512, 8192], 512, p["kw"]["k"],
                "dgeglu" if kw.get("dbias", True) else "dswiglu", **kw)
    eng, problem = ENGINES[SM90], case_problem(case)
    return case_facts(SM90, case, min(eng.knob_space(problem), key=lambda kn: eng.cost(problem, kn)))


BOTH = {SMBS, REF}
_NO_SYNC = {"bf16-discrete": lambda: case_facts(REF, Case(
                [256, 0, 512], 96, 128, "dgeglu", dbias=False, weight_mode="discrete")),
            "mxfp8-dense-sfd": lambda: bs_facts({REF}, "MXFP8 e4m3", d=E4M3, dcs=True),
            "nvfp4-discrete-amax": lambda: bs_facts({REF}, "NVFP4", "discrete", amax=True)}
_REF_MODES = {"dense": ("dense", "k"), "k": ("discrete", "k"), "n": ("discrete", "n")}
#: the tests that run ``sm90_cases.Case`` values through ``run_and_check`` on sm90_cutedsl
_SM90_CASE_TESTS = [("test_sm90_discrete", "test_sm90_discrete_matches_reference")] + [
    ("test_sm90_correctness", t) for t in (
        "test_sm90_matches_reference", "test_sm90_cluster_matches_reference", "test_sm90_ragged_matches_reference",
        "test_sm90_any_size_groups_match_reference", "test_sm90_cluster_2x2_matches_reference",
        "test_sm90_cooperative_matches_reference", "test_sm90_split_last_matches_reference",
        "test_sm90_dense_n_major_matches_reference", "test_sm90_c_stages_with_dbias_match_reference",
        "test_sm90_c_half_matches_reference", "test_sm90_activation_output_and_round_dgrad_match_reference",
        "test_sm90_round_dgrad_rounds")]
#: (file, test) -> facts of one parametrization's arguments
EXTRACT = {
    **{key: (lambda p: case_facts(SM90, p["case"])) for key in _SM90_CASE_TESTS},
    ("test_sm90_correctness", "test_sm90_heuristics_choice_is_correct"): _heuristics_case,
    ("test_sm90_blockscaled_cross", "test_sm90_blockscaled_on_the_cross"): lambda p: _cross(SMBS, p["pt"]),
    ("test_sm90_blockscaled", "test_sm90_blockscaled_matches_oracle_and_reference"): lambda p: bs_facts(
        BOTH, _FMT_NAMES[p["fmt"]], p["mode"], act=p["act"], prob=p["prob"], d=p["d_dtype"], dbias=p["dbias"],
        amax=p["d_dtype"] != FP32),
    ("test_sm90_blockscaled", "test_sm90_blockscaled_dsituglu"): lambda p: bs_facts(
        BOTH, _FMT_NAMES[p["fmt"]], p["mode"], act="dsituglu", prob=p["prob"], d=p["d_dtype"], dbias=p["dbias"],
        amax=p["d_dtype"] != FP32),
    ("test_sm90_blockscaled", "test_sm90_blockscaled_mxfp8_matches_reference_engine"): lambda p: bs_facts(
        BOTH, _FMT_NAMES[p["elem"]], p["mode"], act=p["act"], prob=p["prob"], dbias=p["dbias"], c=p["c_dtype"],
        d=E4M3, amax=True, dcs=p["dcs"]),
    ("test_sm90_blockscaled", "test_sm90_blockscaled_fp8_d_without_scales"): lambda p: bs_facts(
        BOTH, "MXFP8 e4m3", d={"e4m3": E4M3, "e5m2": E5M2}[p["d_fmt"]], sfd=False),
    ("test_sm90_blockscaled", "test_sm90_blockscaled_mxfp8_single_group"): lambda p: bs_facts(
        BOTH, "MXFP8 e4m3", p["mode"], c=E4M3, d=E4M3, amax=True, single=True, dcs=True),
    ("test_sm90_blockscaled", "test_sm90_blockscaled_16_bit_alpha_and_beta"): lambda p: bs_facts(
        BOTH, _FMT_NAMES[p["fmt"]], p["mode"], act=p["act"], c=p["c_dtype"], d=p["d_dtype"], dbias=p["dbias"],
        amax=p["d_dtype"] != FP32, alpha=p["alpha_dtype"], beta=p["beta_dtype"]),
    ("test_reference_cuda", "test_reference_on_cuda_matches_cpu"): lambda p: case_facts(REF, Case(
        [256, 0, 512], 64, 128, "dgeglu", BF16, FP32, weight_mode=_REF_MODES[p["mode"]][0],
        b_major=_REF_MODES[p["mode"]][1], m_aligned=p["m_aligned"])),
    **{("test_reference_no_sync", t): (lambda p: _NO_SYNC[p["kind"]]()) for t in (
        "test_side_stream_no_sync", "test_graph_replay_with_new_values_equals_an_eager_call")},
    ("test_coverage_holes", "test_reference_bf16_on_cuda_matches_cpu"): lambda p: case_facts(REF, p["case"]),
    ("test_coverage_holes", "test_reference_compute_knob_on_cuda_matches_cpu"): lambda p: {
        (KN, "compute", p["compute"], REF)},
    ("test_coverage_holes", "test_reference_on_cuda_on_the_cross"): lambda p: _cross(REF, p["pt"]),
    ("test_coverage_holes", "test_block_scaled_values"): lambda p: _var(
        {"sm90_blockscaled": SMBS, "reference": REF}[p["engine"]], p["v"]),
    ("test_coverage_holes", "test_sm90_blockscaled_schedules"): lambda p: _var(SMBS, p["v"]),
    ("test_coverage_holes", "test_deterministic_dprob"): lambda p: _var(
        {"sm90_blockscaled": SMBS, "reference": REF}[p["engine"]], p["v"]),
}
#: tests without parametrization: what their one call runs
FIXED = {("test_reference_cuda", "test_reference_bf16_dense_never_syncs_and_replays_in_a_cuda_graph"):
         {(BF, "activation output", "on", REF)}}


@functools.lru_cache(maxsize=None)
def inventory():
    """{node id: facts} of every parametrization EXTRACT and FIXED name."""
    inv = {}
    for (stem, name), facts in FIXED.items():
        assert callable(getattr(_module(stem), name, None)), f"{stem}.py::{name} is gone"
        inv[f"{stem}.py::{name}"] = facts
    for (stem, name), extract in EXTRACT.items():
        cases = parametrizations(getattr(_module(stem), name))
        assert cases and len({i for i, _ in cases}) == len(cases), f"{stem}.py::{name}: no or repeated ids"
        inv.update({f"{stem}.py::{name}[{i}]": extract(p) for i, p in cases})
    return inv


# ----------------------------------------------------------------- the document
def doc_cells():
    """(table, axis, value, engine column, cell) of every coverage table row."""
    table, header = None, None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            table, header = line[3:].strip(), None
        elif not line.startswith("|"):
            header = None
        elif header is None:
            header = [c.strip() for c in line.strip().strip("|").split("|")]
        elif not set(line) <= set("|-: "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for column, cell in zip(header[2:], cells[2:]):
                yield table, cells[0], cells[1], column, cell


REF_CELL = re.compile(r"`(\w+)\.py::(\w+)(\[[^\]`]+\])?`")


def test_every_covering_cell_names_a_case_that_runs_its_value():
    inv, cells = inventory(), list(doc_cells())
    assert cells and len(inv) > 300, f"{DOC}: {len(cells)} table cells; {len(inv)} GPU parametrizations read"
    for table, axis, value, column, cell in cells:
        refs = REF_CELL.findall(cell)
        if refs:
            for stem, name, ident in refs:
                node = f"{stem}.py::{name}{ident}"
                assert node in inv, f"{table} / {axis} = {value} / {column}: no parametrization {node}"
                assert (table, axis, value, column) in inv[node], f"{node} does not run {axis} = {value} on {column}"
        else:
            assert cell == "—" or cell.startswith("declined: “"), f"{table} / {axis} = {value} / {column}: {cell!r}"


def _problem(value):
    """A problem with A/B operands ``value`` or, for the deterministic rows, that option."""
    if value == "bf16":
        return case_problem(Case([256, 256], 64, 128))
    fmt = value if value in FORMATS else "NVFP4"
    return bs_problem(fmt, d=E4M3 if FORMATS[fmt][0] in (E4M3, E5M2) else BF16, det=value == "on, with dprob")


def test_declined_cells_quote_the_engines_reason():
    for table, axis, value, column, cell in doc_cells():
        if cell.startswith("declined: “"):
            quote = re.match(r"declined: “([^”]+)”", cell).group(1)
            reasons = ENGINES[column].check_support(_problem(value))
            assert any(quote in r for r in reasons), f"{column} on {axis} = {value}: {reasons}"


def test_the_rows_list_every_contract_value():
    rows = {}
    for table, axis, value, _, _ in doc_cells():
        rows.setdefault((table, axis), set()).add(value)
    half, cd = {DT[d] for d in SCALAR_DTYPES["block_scaled"]}, {DT[d] for d in CD_DTYPES}
    want = {(AB, AB): {"bf16", *FORMATS}, (BF, "m_aligned"): {str(a) for a in M_ALIGNED_CHOICES},
            (BF, "C dtype"): cd, (BF, "D dtype"): cd, (BF, "activation"): set(act_names("bf16")),
            (BS, "C dtype"): {DT[d] for d in BSC.C_DTYPES}, (BS, "activation"): set(act_names("block_scaled")),
            (BS, "alpha dtype"): half, (BS, "beta dtype"): half,
            (BS, "weights"): {"dense K-major", "dense N-major", "discrete K-major", "discrete N-major"}}
    for key, values in want.items():
        assert rows.get(key) == values, (key, rows.get(key))
