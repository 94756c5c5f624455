"""GPU cases for contract values that an engine accepts and no other GPU test runs on it
(docs/test_coverage.md lists every axis value per engine with the test that runs it;
tests/unit/test_gpu_coverage.py keeps the table and the case lists in step).

* BF16 operands on the reference engine on CUDA (fp16/fp32 C, fp16 D, dSwiGLU, dense N-major
  weights, round_dgrad_to_input_dtype, m_aligned 1 and 16-128, the float64 knob): its device path
  (each m_aligned-row block's expert found on the device) against the same plan on a CPU copy
  of the operands (the host walk of the experts' ranges).
* The block-scaled cross (tests/support/blockscaled_cross.py) on the reference engine on CUDA,
  which has N-major MXFP8 weights, dense and per-expert.
* Block-scaled values on ``sm90_blockscaled`` and on the reference engine on CUDA, against the
  float64 oracle of the dequantized operands: FP4 with e8m0 scales over 16 elements, FP4 stored
  as ``float4_e2m1fn_x2``, fp32 C, prob without dprob and dprob without prob, amax with fp32 D,
  deterministic without dprob; deterministic dprob on the reference (``sm90_blockscaled``
  declines it); and ``sm90_blockscaled`` pinned to the kernel schedules its other cases'
  heuristics never pick (1x1 and 2x2 clusters, tile 64, the cooperative 128 x 256 form and
  its deep form), each with a block-scaled epilogue (amax, p = 1, dGeGLU without beta,
  dSiTU-GLU).
"""
import dataclasses
import zlib
from dataclasses import dataclass

import pytest
import torch

from cudnn_ext import contract
from cudnn_ext.engines.base import Knobs
from cudnn_ext.engines.reference import ReferenceEngine
from cudnn_ext.quant import dequantize, quantize_nvfp4

import blockscaled_cross as X
from gpu_skips import needs_cuda_and_dsl
from oracle import oracle
from sm90_cases import Case, make_pack, rel_err, skip_unless_sm90

pytestmark = pytest.mark.gpu

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
E4M3, E8M0, FLOAT4 = torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2


def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


# ------------------------------------------------------------ BF16 on the reference engine
#: BF16 problems with values the reference engine runs on CUDA in no other GPU test
REF_BF16_CASES = [
    Case([256, 0, 512], 64, 128, "dswiglu", FP16, FP16),
    Case([256, 0, 512], 96, 200, "dgeglu", FP32, BF16, dbias=False, b_major="n"),
    Case([512, 0, 768], 160, 256, "dswiglu", FP32, FP32, round_dgrad=True),
    Case([16, 48, 0, 144], 64, 128, "dswiglu", m_aligned=16),
    Case([32, 96, 224, 0], 64, 128, "dgeglu", FP16, FP16, m_aligned=32),
    Case([64, 192, 0, 320], 64, 128, "dswiglu", dbias=False, m_aligned=64),
    Case([128, 384, 0, 640, 128], 96, 136, "dgeglu", b_major="n", m_aligned=128),
    Case([1, 0, 129, 3, 257, 0, 500, 1], 64, 128, "dswiglu", FP32, BF16, extra_rows=5, m_aligned=1),
]
#: the device against the CPU, both float32 plans: the GEMM sums in another order, so a 16-bit
#: output may land one rounding step apart (rel_err's per-element term: 2^-8 / 4); a row block
#: given the wrong expert, or a skipped one, is off by O(1)
TWIN_TOL = 4e-3


def reference_twin(case, device, compute="float32"):
    """The reference engine's plan on ``make_pack(case, device)`` and on a CPU copy of it (the
    same operands, the same poisoned or accumulated outputs). Returns (rows, pack, CPU pack).
    Dense weights only: a CPU copy of a pointer table would still name device memory."""
    assert case.weight_mode == "dense", case.label()
    problem, pack = make_pack(case, device=device)
    host = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in pack.items()}
    if pack["b"] is not None:
        assert host["b"].stride() == pack["b"].stride()  # N-major weights stay N-major
    for p in (pack, host):
        dev = p["c"].device
        plan = ReferenceEngine().build(dataclasses.replace(problem, device_type=dev.type,
                                                           device_index=dev.index),
                                       Knobs.of(compute=compute))
        plan.execute(p)
    return sum(case.groups), pack, host


def same_outputs(rows, got, want, tol=TWIN_TOL):
    for slot in ("d_row", "activation", "dprob", "dbias"):
        if got.get(slot) is None:
            continue
        g, w = got[slot].cpu(), want[slot]
        if slot in ("d_row", "activation"):  # rows past the last offset stay untouched
            assert torch.isnan(g[rows:].float()).all() and torch.isnan(w[rows:].float()).all(), slot
            g, w = g[:rows], w[:rows]
        assert not torch.isnan(g.float()).any(), slot
        assert rel_err(g, w) < tol, (slot, rel_err(g, w))


@pytest.mark.parametrize("case", REF_BF16_CASES, ids=lambda c: c.label())
def test_reference_bf16_on_cuda_matches_cpu(case):
    _needs_cuda()
    same_outputs(*reference_twin(case, "cuda"))


@pytest.mark.parametrize("compute", ["float64"])
def test_reference_compute_knob_on_cuda_matches_cpu(compute):
    _needs_cuda()
    same_outputs(*reference_twin(Case([256, 0, 512], 64, 128, "dgeglu", FP32, FP32), "cuda",
                                 compute), tol=1e-5)


# ------------------------------------------------- the block-scaled cross on the reference
@pytest.mark.parametrize("pt", X.points(), ids=lambda p: p.label())
def test_reference_on_cuda_on_the_cross(pt):
    needs_cuda_and_dsl()  # per-expert weights: the reference's device pointer gather
    t = X.make(pt, "cuda")
    X.check(t, X.run(t, "reference"))


# ----------------------------------------------------------- block-scaled values, FP4 operands
#: FP4 scale formats: name -> (sf_vec_size, scale dtype)
FP4 = {"nvfp4": (16, E4M3), "mxfp4": (32, E8M0), "fp4-e8m0-16": (16, E8M0)}
COUNTS, K, EXTRA = (256, 0, 512), 128, 256
#: D against the float64 oracle (sm90_cases.rel_err), as tests/gpu/test_sm90_blockscaled.py
D_TOL = {BF16: 1.5e-2, FP16: 4e-3, FP32: 2e-3}
_NAMES = {BF16: "bf16", FP16: "fp16", FP32: "fp32", torch.uint8: "u8", FLOAT4: "f4x2"}


@dataclass(frozen=True)
class Var:
    """One block-scaled call with FP4 operands. ``knobs``: (field, value) pairs of the
    ``Sm90Config`` pinned on ``sm90_blockscaled`` (``config_for``); empty: its heuristics'
    first plan."""

    fmt: str = "nvfp4"
    packed: torch.dtype = torch.uint8  # FP4 storage: uint8 or float4_e2m1fn_x2
    mode: str = "dense"  # or "discrete" (b_ptrs / sfb_ptrs)
    act: str = "dswiglu"
    c_dtype: torch.dtype = BF16
    d_dtype: torch.dtype = BF16
    prob: bool = True
    dprob: bool = True
    dbias: bool = False
    amax: bool = True
    deterministic: bool = False
    n: int = 64
    knobs: tuple = ()

    def label(self) -> str:
        flags = "".join(f"-{name}" for name in ("prob", "dprob", "dbias", "amax", "deterministic")
                        if getattr(self, name))
        pins = "".join(f"-{k}{int(v)}" for k, v in self.knobs)
        return (f"{self.fmt}-{_NAMES[self.packed]}-{self.mode}-{self.act}-C{_NAMES[self.c_dtype]}-"
                f"D{_NAMES[self.d_dtype]}-N{self.n}{flags}{pins}")


#: values each engine runs here: heuristics' plans on both engines
VARS = [
    Var(fmt="fp4-e8m0-16"),
    Var(fmt="fp4-e8m0-16", mode="discrete", act="dgeglu", d_dtype=FP32, dbias=True, amax=False),
    Var(packed=FLOAT4, mode="discrete", act="dgeglu"),
    Var(fmt="mxfp4", packed=FLOAT4, act="dsituglu", d_dtype=FP16),
    Var(c_dtype=FP32, act="dsituglu", dbias=True),
    Var(fmt="mxfp4", mode="discrete", c_dtype=FP32, d_dtype=FP32, amax=False),
    Var(act="dgeglu", dprob=False),
    Var(fmt="mxfp4", mode="discrete", act="dsituglu", prob=False, dbias=True),
    Var(fmt="mxfp4", d_dtype=FP32),  # amax with fp32 D (the class API's choice)
    Var(fmt="nvfp4", mode="discrete", d_dtype=FP32, dbias=True),
    Var(fmt="mxfp4", prob=True, dprob=False, deterministic=True),
]
#: sm90_blockscaled pinned to the schedules its heuristics pick for no other case (they pick
#: ping-pong 128 x 128 in 2x1 clusters: tests/unit/test_gpu_coverage.py)
_COOP = (("cooperative", True), ("tile_n", 256), ("c_stages", 2), ("cluster_m", 2))
_DEEP = _COOP[:2] + (("c_stages", 4), ("ab_stages", 3), ("cluster_m", 2), ("split_last", 3))
SCHEDULES = [
    Var(act="dgeglu", prob=False, dprob=False, dbias=True, knobs=(("tile_n", 64),)),
    Var(fmt="mxfp4", act="dsituglu", d_dtype=FP16, dprob=False,
        knobs=(("tile_n", 128), ("cluster_m", 2), ("cluster_n", 2))),
    Var(fmt="mxfp4", act="dgeglu", d_dtype=FP32, knobs=(("tile_n", 64), ("cluster_m", 2))),
    Var(n=256, dbias=True, knobs=_COOP),
    Var(fmt="mxfp4", act="dgeglu", n=256, prob=False, knobs=_DEEP),
]


def operands(v: Var, device) -> dict:
    """``v``'s operands on ``device`` (seeded by its label) and their float64 oracle."""
    g = torch.Generator().manual_seed(zlib.crc32(v.label().encode()))
    vec, sf = FP4[v.fmt]
    L, n = len(COUNTS), v.n
    offs = torch.tensor(COUNTS, dtype=torch.int64).cumsum(0).to(torch.int32)
    last = int(offs[-1])
    m = last + EXTRA
    a = torch.randn(m, K, generator=g)
    w = torch.randn(L, n, K, generator=g) * 0.2
    c = (torch.randn(m, 2 * n, generator=g) * 2).to(BF16).to(v.c_dtype)
    alpha, beta = torch.rand(L, generator=g) + 0.5, torch.rand(L, generator=g) + 0.5
    prob = torch.rand(m, generator=g)

    def q(x):
        return quantize_nvfp4(x.to(device), sf_vec_size=vec, sf_dtype=sf, packed_dtype=v.packed)

    (a_q, sfa), (b_q, sfb) = q(a), q(w.permute(1, 2, 0))
    experts = [q(w[e]) for e in range(L)]
    a64 = dequantize(a_q, sfa, vec, out_dtype=torch.float64).cpu()
    w64 = [dequantize(x, s, vec, out_dtype=torch.float64).cpu() for x, s in experts]
    # dGeGLU reads C without beta on block-scaled operands; without prob, p = 1
    ref = oracle(a64, w64, c, offs, alpha, torch.ones(L) if v.act == "dgeglu" else beta,
                 prob if v.prob else torch.ones(m), act_func=v.act)
    t = dict(L=L, M=m, last=last, vec=vec, offs=offs.to(device), a_q=a_q, sfa=sfa, c=c.to(device),
             alpha=alpha.to(device), beta=beta.to(device), prob=prob.to(device), ref=ref)
    if v.mode == "dense":
        t["weights"] = dict(b=b_q, sfb=sfb)
    else:  # each expert its own buffers; the empty expert's pointers null (never read)
        qs = [x.contiguous() for x, _ in experts]
        sfs = [s.permute(5, 2, 4, 0, 1, 3).contiguous() for _, s in experts]
        t["keep"] = (qs, sfs)
        ptrs = lambda xs: torch.tensor([x.data_ptr() if COUNTS[e] else 0 for e, x in enumerate(xs)],  # noqa: E731
                                       dtype=torch.int64, device=device)
        t["weights"] = dict(b_ptrs=ptrs(qs), sfb_ptrs=ptrs(sfs))
    return t


def problem_and_pack(v: Var, t: dict):
    """The contract's (problem, pack, outputs) of ``v`` on ``t`` with poisoned outputs: D NaN,
    dprob 0 in the experts' rows and 0.25 past them, dbias 0, amax -inf."""
    m, n, L, dev = t["M"], v.n, t["L"], t["c"].device
    dprob = torch.zeros(m, device=dev)
    dprob[t["last"]:] = 0.25
    outs = dict(d_row=torch.full((m, 2 * n), float("nan"), device=dev).to(v.d_dtype),
                dprob=dprob if v.dprob else None,
                dbias=torch.zeros(L, 2 * n, dtype=BF16, device=dev) if v.dbias else None,
                amax=torch.full((L, 2), float("-inf"), device=dev) if v.amax else None)
    ops = contract.Operands(a=t["a_q"], c=t["c"], sfa=t["sfa"], padded_offsets=t["offs"],
                            alpha=t["alpha"], beta=t["beta"], prob=t["prob"] if v.prob else None,
                            **outs, **t["weights"])
    cfg = contract.CallConfig(act_func=v.act, sf_vec_size=t["vec"], deterministic=v.deterministic)
    discrete = dict(n=n, b_dtype=t["a_q"].dtype) if v.mode == "discrete" else {}
    problem, pack = contract.normalize(ops, cfg, **discrete)
    return problem, pack, outs


def run_plan(engine, v: Var, t: dict) -> dict:
    """``engine``'s plan (sm90_blockscaled: pinned ``v.knobs`` or the heuristics' first; the
    reference: float32) on ``v``'s call; returns the outputs."""
    from cudnn_ext.engines.heuristics import ranked_knobs
    from cudnn_ext.engines.sm90 import config_for

    problem, pack, outs = problem_and_pack(v, t)
    assert engine.check_support(problem) == [], engine.check_support(problem)
    if isinstance(engine, ReferenceEngine):
        knobs = Knobs.of(compute="float32")
    else:
        knobs = config_for(problem, **dict(v.knobs)) if v.knobs else ranked_knobs(engine, problem)[0][0]
    plan = engine.build(problem, knobs)
    size = plan.workspace_size
    ws = torch.empty(size, dtype=torch.uint8, device=t["c"].device) if size else None
    plan.execute(pack, ws)
    if t["c"].device.type == "cuda":
        torch.cuda.synchronize()
    return outs


def check(v: Var, t: dict, o: dict) -> None:
    """``o`` against the oracle; rows past the last offset and the empty expert untouched."""
    last, ref, n = t["last"], t["ref"], v.n
    d = o["d_row"].cpu()
    assert torch.isnan(d[last:].float()).all(), "D past the last offset"
    assert rel_err(d[:last], ref["d"][:last]) < D_TOL[v.d_dtype], ("D", rel_err(d[:last], ref["d"][:last]))
    if v.dprob:
        dprob = o["dprob"].cpu()
        assert (dprob[last:] == 0.25).all(), "dprob past the last offset"
        assert rel_err(dprob[:last], ref["dprob"][:last]) < 2e-3, ("dprob", rel_err(dprob[:last], ref["dprob"][:last]))
    if v.dbias:
        assert rel_err(o["dbias"].cpu(), ref["dbias"]) < 1.5e-2, ("dbias", rel_err(o["dbias"].cpu(), ref["dbias"]))
    if v.amax:  # max |dgate|, max |dup| of the fp32 D over each expert's rows; -inf without rows
        amax, start = o["amax"].cpu(), 0
        for e, end in enumerate(t["offs"].tolist()):
            if end == start:
                assert torch.isinf(amax[e]).all() and (amax[e] < 0).all(), "the empty expert's amax"
            else:
                want = ref["d"][start:end].view(end - start, n // 32, 2, 32).abs().amax(dim=(0, 1, 3))
                assert torch.allclose(amax[e].double(), want, rtol=2e-3), (e, amax[e], want)
            start = end


@pytest.mark.parametrize("v", VARS, ids=lambda v: v.label())
@pytest.mark.parametrize("engine", ["sm90_blockscaled", "reference"])
def test_block_scaled_values(engine, v):
    from cudnn_ext.engines.registry import engine_by_name

    if engine == "reference":
        needs_cuda_and_dsl()
    else:
        skip_unless_sm90()
    t = operands(v, "cuda")
    check(v, t, run_plan(engine_by_name(engine), v, t))


@pytest.mark.parametrize("v", SCHEDULES, ids=lambda v: v.label())
def test_sm90_blockscaled_schedules(v):
    from cudnn_ext.engines.registry import engine_by_name

    skip_unless_sm90()
    t = operands(v, "cuda")
    check(v, t, run_plan(engine_by_name("sm90_blockscaled"), v, t))


@pytest.mark.parametrize("v", [Var(deterministic=True, act="dsituglu", mode="discrete")],
                         ids=lambda v: v.label())
@pytest.mark.parametrize("engine", ["sm90_blockscaled", "reference"])
def test_deterministic_dprob(engine, v):
    """Deterministic dprob on both engines (sm90_blockscaled: the kernel's fixed-order form):
    the oracle's values, and the same bytes on a second call."""
    from cudnn_ext.engines.registry import engine_by_name

    if engine == "reference":
        needs_cuda_and_dsl()
    else:
        skip_unless_sm90()
    t = operands(v, "cuda")
    first = run_plan(engine_by_name(engine), v, t)  # (each run writes fresh outputs)
    check(v, t, first)
    again = run_plan(engine_by_name(engine), v, t)
    assert torch.equal(first["dprob"].view(torch.int32), again["dprob"].view(torch.int32))
