"""Functional execution of grouped GEMM + dGLU with memoized validation and a built plan.

Owns the one helper every framework binding runs (the torch custom op and the JAX callback):
validate a call's *metadata* once through ``cudnn_ext.contract.normalize``, get its plan
from the call's graph (``graph.from_call.graph_for_call``), then, on every later call with the
same metadata, allocate fresh zero-initialized outputs and execute the plan. It owns no math, no engine choice and no
user-facing argument names (those belong to ``api`` and to the bindings).

Validated path with a built plan (``run``): one dict lookup keyed on dtypes, shapes and
strides, a 16-byte alignment check on data pointers, the outputs (``torch.empty`` for engines
that initialize them, else ``torch.zeros``; none with ``out=``) and ``plan.execute``. Replay
(``run_fast``): after a validated call whose plan offers an address launcher, later calls
with the same signature and metadata (one C++ guard check, ``runtime.guards``) skip the key, the
pack and ``execute``. Neither reads tensor *data*, so neither synchronizes with the host;
whether the *engine* does is the engine's property (the reference engine reads the offsets
on the host for CPU tensors only; a GPU engine must not).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .. import contract
from ..runtime.memo import CALLS
from ..runtime.memo import tensor_meta as _meta
from ..runtime.workspace import POOL
from ..runtime.streams import capturing, current_device_index, current_stream_handle
from ..engines.base import defer_compile
from ..graph.from_call import graph_for_call
from ..plan import ExecutionPlan
from ..problem import DgluProblem
from ..runtime import guards as _guards

_empty_strided = torch.empty_strided


#: The activation configuration of a call: the contract's own (hashable, frozen) scalar config,
#: whose leading fields are act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min
#: (and which carries the call's m_aligned).
ActArgs = contract.CallConfig


@dataclass
class _Entry:
    problem: DgluProblem
    plan: ExecutionPlan
    b_major: str
    ws_size: int = 0  # plan.workspace_size, read once
    #: functional calls run ``execute_fresh`` on uninitialized outputs (no fill kernels)
    fresh: bool = False


def validate(a, c, b, b_ptrs, n, b_major, offsets, alpha, beta, prob, act: ActArgs,
             generate_dbias: bool, d_dtype, out=None, pointers: bool = True):
    """The contract's rules on one call's metadata (``contract.normalize``): ``(problem,
    pack)``. ``b`` is the vendor's (N, K, L) view; ``out`` the caller's outputs, validated
    like the class API's; ``pointers=False`` for tensors without addresses (the ops' fake
    kernels)."""
    cfg = dataclasses.replace(act, b_major=b_major)
    if out is not None:
        d_row, dprob, dbias = out
        ops = contract.Operands(a=a, c=c, padded_offsets=offsets, alpha=alpha, beta=beta, prob=prob,
                                d_row=d_row, dprob=dprob, dbias=dbias, b=b, b_ptrs=b_ptrs)
    else:
        # a stand-in dprob of the contract's shape: only its metadata is validated (a 0-d c
        # gets one too; the contract names c)
        m = c.shape[0] if c.dim() else 0
        ops = contract.Operands(a=a, c=c, padded_offsets=offsets, alpha=alpha, beta=beta, prob=prob,
                                dprob=torch.empty(m, dtype=torch.float32, device=c.device),
                                b=b, b_ptrs=b_ptrs)
    discrete = b_ptrs is not None
    return contract.normalize(ops, cfg, n=n if discrete else None,
                              b_dtype=torch.bfloat16 if discrete else None, d_dtype=d_dtype,
                              generate_dbias=generate_dbias, pointers=pointers)


def _entry(key, a, c, b, b_ptrs, n, b_major, offsets, alpha, beta, prob, act: ActArgs,
           generate_dbias: bool, d_dtype, engine, out=None) -> _Entry:
    e = CALLS.get(key)
    if e is not None:
        return e
    problem, pack = validate(a, c, b, b_ptrs, n, b_major, offsets, alpha, beta, prob, act,
                             generate_dbias, d_dtype, out)
    # the same graph (and built plan) the wrapper and class API use for this call family
    with defer_compile():  # the functional path compiles only the variant it runs
        plan = graph_for_call(problem, pack, engine=engine).execution_plan
    return CALLS.put(key, _Entry(problem, plan, problem.b_major, int(plan.workspace_size),
                                 fresh=out is None and plan.fresh_outputs))


def _misalignment(a, w, dense, c, offsets, alpha, beta, prob) -> int:
    """The inputs' addresses OR-ed for the contract's alignment rule: nonzero under ``& 15``
    when one is off (16 bytes; the pointer table of discrete weights ``w`` needs only 8)."""
    return a | c | offsets | alpha | beta | prob | (w if dense else w & 7)


def _scalar_types(act: ActArgs) -> Tuple[type, ...]:
    """The types of the config's numbers, cached on the (frozen) config: 1.0 and True (or
    m_aligned 8 and 8.0) compare equal, but validation tells them apart, so the memo key must too."""
    t = act.__dict__.get("_types")
    if t is None:
        t = tuple(type(getattr(act, f)) for f in ("linear_offset", "geglu_alpha", "glu_clamp_max",
                                                  "glu_clamp_min", "m_aligned"))
        object.__setattr__(act, "_types", t)
    return t


def run(a: torch.Tensor, c: torch.Tensor, offsets: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
        prob: torch.Tensor, *, b: Optional[torch.Tensor] = None, b_ptrs: Optional[torch.Tensor] = None,
        n: Optional[int] = None, b_major: str = "k", act: ActArgs = ActArgs(), generate_dbias: bool = False,
        d_dtype: torch.dtype = torch.bfloat16, engine: Optional[str] = None, stream=None, out=None,
        fast=None):
    """Run the operation; returns ``(d_row (M, 2N), dprob (M,), dbias (L, 2N) | None)``.

    ``b`` is the vendor's dense ``(N, K, L)`` tensor (K- or N-major) or ``b_ptrs`` the discrete
    pointer table with ``n``/``b_major``. Without ``out`` all outputs are freshly zero-initialized:
    ``d_row`` rows at or past ``padded_offsets[-1]`` are zero, ``dprob``/``dbias`` hold exactly
    this call's accumulation. With ``out=(d_row, dprob, dbias)`` (``dbias`` None unless
    ``generate_dbias``) nothing is allocated and the class API's contract applies: ``d_row`` rows
    past the last offset are untouched, ``dprob``/``dbias`` are accumulated into. ``a``, ``c``,
    ``prob`` may carry the vendor's trailing unit dims.

    ``fast=(sig, tensors)`` (eager bindings only, see ``run_fast``): after this call succeeds,
    remember it so that later calls with the same signature and metadata take ``run_fast``.
    """
    w = b if b is not None else b_ptrs  # exactly one is given (the bindings check)
    # the api's metadata key (runtime.memo.tensor_meta per tensor), written out flat: this is
    # the hot path's largest cost (bench_host_overhead.py). get_device() (-1 for CPU and meta
    # alike) is enough here, unlike in tensor_meta: a call with a meta tensor dispatches to
    # the op's fake kernel and never reaches this function
    try:
        key = ("op", a.dtype, a.shape, a.stride(), a.get_device(), c.dtype, c.shape, c.stride(), c.get_device(),
               b is None, w.dtype, w.shape, w.stride(), w.get_device(), n, b_major,
               offsets.dtype, offsets.shape, offsets.stride(), offsets.get_device(),
               alpha.dtype, alpha.shape, alpha.stride(), alpha.get_device(),
               beta.dtype, beta.shape, beta.stride(), beta.get_device(),
               prob.dtype, prob.shape, prob.stride(), prob.get_device(), act, generate_dbias, engine,
               type(n), _scalar_types(act), type(generate_dbias))
    except RuntimeError:  # a tensor without strides (sparse CSR/CSC): name it
        for name, t in (("a_tensor", a), ("b_tensor/b_ptrs", w), ("c_tensor", c), ("padded_offsets", offsets),
                        ("alpha_tensor", alpha), ("beta_tensor", beta), ("prob_tensor", prob)):
            contract.check_strided(name, t)
        raise
    if out is None:
        key += (d_dtype,)
    else:
        key += (_meta(out[0]), _meta(out[1]), _meta(out[2]))
    e = CALLS.get(key)
    first = e is None
    if first:
        e = _entry(key, a, c, b, b_ptrs, n, b_major, offsets, alpha, beta, prob, act, generate_dbias, d_dtype,
                   engine, out)
    # data pointers are not in the key: the contract's 16-byte rule is re-checked here, on
    # all pointers OR-ed together (the per-tensor loop, which names the culprit, only when
    # one is off)
    ptrs = _misalignment(a.data_ptr(), w.data_ptr(), b is not None, c.data_ptr(), offsets.data_ptr(),
                         alpha.data_ptr(), beta.data_ptr(), prob.data_ptr())
    if out is not None:
        ptrs |= out[0].data_ptr() | out[1].data_ptr() | (out[2].data_ptr() if out[2] is not None else 0)
    if ptrs & 15:
        named = (("a_tensor", a), ("c_tensor", c), ("prob_tensor", prob), ("alpha_tensor", alpha),
                 ("beta_tensor", beta), ("padded_offsets", offsets))
        if b is not None:
            named += (("b_tensor", b),)
        elif b_ptrs.numel():
            contract.check_aligned("b_ptrs", b_ptrs, 8)
        if out is not None:
            named += (("d_row_tensor", out[0]), ("dprob_tensor", out[1]), ("dbias_tensor", out[2]))
        for name, t in named:
            if t is not None and t.data_ptr() & 15 and t.numel():
                contract.check_aligned(name, t)
    problem = e.problem
    m, two_n = c.shape[0], c.shape[1]
    dev = c.device
    fresh = False
    if out is not None:
        d_row, dprob, dbias = out
        d_row = d_row.view(m, two_n) if d_row.dim() != 2 else d_row
        dprob = dprob.view(m) if dprob.dim() != 1 else dprob
        if dbias is not None and dbias.dim() != 2:
            dbias = dbias.view(problem.num_experts, two_n)
    else:
        # fresh-output engines initialize everything themselves (D's tail rows, dprob, dbias)
        # on the device; otherwise zero-fill here. M = 0 or L = 0 launches nothing: zeros.
        fresh = e.fresh and m > 0 and problem.num_experts > 0
        alloc = torch.empty if fresh else torch.zeros
        d_row = alloc((m, two_n), dtype=problem.d_dtype, device=dev)
        dprob = alloc((m,), dtype=torch.float32, device=dev)
        dbias = (alloc((problem.num_experts, two_n), dtype=torch.bfloat16, device=dev)
                 if generate_dbias else None)
    pack = {
        # (the contract drops any trailing unit dims: (M, K, 1), (M, K, 1, 1), ...)
        "a": a.view(a.shape[0], a.shape[1]) if a.dim() != 2 else a,
        "c": c.view(m, two_n) if c.dim() != 2 else c,
        "padded_offsets": offsets, "alpha": alpha, "beta": beta,
        "prob": prob.view(m) if prob.dim() != 1 else prob,
        "dprob": dprob, "d_row": d_row, "dbias": dbias,
    }
    if b is not None:
        pack["b"] = b
    else:
        pack["b_ptrs"] = b_ptrs
    plan = e.plan
    contract.check_call_offsets(problem, pack, first)
    # stream None stays None: engines launch on the device's current stream (no Stream object)
    ws = _workspace(e.ws_size, dev, stream) if e.ws_size else None
    if fresh:  # only ever set without out=
        plan.execute_fresh(pack, ws, stream)
    else:
        plan.execute(pack, ws, stream)
    if (fast is not None and stream is None and m > 0 and problem.num_experts > 0
            and (out is not None or fresh)
            and not capturing(dev.type == "cuda")):
        try:  # an optimization: never let it fail a call whose kernel already ran
            _remember(fast, e, dev, m, two_n, fresh, d_dtype if out is None else None, generate_dbias)
        except Exception:
            pass
    return d_row, dprob, dbias


# --------------------------------------------------------------------------- guarded fast path
@dataclass
class _Fast:
    """One call metadata the fast path replays: its guard, the plan's address launcher and
    what the outputs need (fixed by the guard: M, 2N, L, dtypes)."""

    guard: object
    launch: object
    device_index: int  # -1: not CUDA (no current-device rule)
    device: torch.device
    m: int
    two_n: int
    num_experts: int
    d_dtype: Optional[torch.dtype]  # functional calls: D's dtype (None: caller's outputs)
    generate_dbias: bool
    ws_size: int
    dense: bool
    m_aligned: int
    #: the launch on a scratch kept zero in [zero_from, zero_from + zero_bytes) (one kernel
    #: instead of a zeroing kernel + the kernel; the contract with dbias), used outside
    #: graph capture; built on the first replay that can use it (another compiled variant)
    launch_zeroed: object = None
    zero_from: Optional[int] = None
    zero_bytes: int = 0
    plan: object = None


#: The call memo's ``("replay", call signature (the non-tensor arguments, see ``ops``), M)``
#: entries hold recent _Fast slots, newest first. M is in the key because MoE token counts
#: change from step to step: every M seen keeps its slot and a lookup checks the guards of
#: that M's few layouts only (each check ~1 us)
_FAST_PER_SIG = 4


def _remember(fast, e: _Entry, dev, m, two_n, fresh, d_dtype, generate_dbias) -> None:
    """After a successful validated call: keep a guard of its tensors so that the next call
    with the same metadata (``run_fast``) skips the Python-side key, the pack and ``execute``.
    Only where the plan offers an address launcher (the Hopper kernel) and torch a guard."""
    if not _guards.AVAILABLE:
        return
    sig, ts = fast
    idx = dev.index if dev.type == "cuda" else -1
    if idx >= 0 and idx != current_device_index():
        return
    launch = e.plan.address_launcher(m, fresh, idx)
    if launch is None:
        return
    guard = _guards.make(ts)
    if guard is None:
        return
    slot = _Fast(guard, launch, idx, dev, m, two_n, e.problem.num_experts, d_dtype,
                 generate_dbias, e.ws_size, e.problem.weight_mode != "discrete", e.problem.m_aligned)
    if not fresh and e.plan.zeroed_region is not None:
        slot.zero_from, slot.plan = e.plan.zeroed_region, e.plan
        slot.zero_bytes = e.plan.zeroed_region_bytes
    key = ("replay", sig, m)
    CALLS.put(key, (slot,) + (CALLS.get(key) or ())[:_FAST_PER_SIG - 1])


def run_fast(sig, ts, out=None):
    """The eager hot path: ``(d_row, dprob, dbias | None)`` when an earlier validated call had
    exactly this signature and these tensors' metadata (one C++ guard check), else None (the
    caller takes ``run``, which validates and may remember this call).

    ``ts``: ``(a, w, c, offsets, alpha, beta, prob)`` as the caller passed them (``w`` the
    dense weights or the pointer table), then for ``out=`` calls ``d_row, dprob`` and ``dbias``
    when given; plain ``torch.Tensor``s only (the caller checks). Alignment is checked on every
    call; a misaligned pointer returns None so that ``run`` raises the named error."""
    try:
        slots = CALLS.get(("replay", sig, ts[2].shape[0]))  # keyed by M too: one slot per key, typically
    except IndexError:  # a 0-d c: the validated path names it
        return None
    if slots is None:
        return None
    for s in slots:
        if s.guard.check(*ts):
            break
    else:
        return None
    if s.device_index >= 0 and s.device_index != current_device_index():
        return None
    a, w, c, offsets, alpha, beta, prob = ts[:7]
    pa, pw, pc = a.data_ptr(), w.data_ptr(), c.data_ptr()
    po, pal, pbe, ppr = offsets.data_ptr(), alpha.data_ptr(), beta.data_ptr(), prob.data_ptr()
    bad = _misalignment(pa, pw, s.dense, pc, po, pal, pbe, ppr)
    if out is None:
        if bad & 15:
            return None
        # empty_strided: a third less host time than torch.empty with a shape on the H200's
        # host (13.0 against 19.3 us for the three, bench_host_overhead's *_only rows)
        dev = s.device
        d_row = _empty_strided((s.m, s.two_n), (s.two_n, 1), dtype=s.d_dtype, device=dev)
        dprob = _empty_strided((s.m,), (1,), dtype=torch.float32, device=dev)
        dbias = (_empty_strided((s.num_experts, s.two_n), (s.two_n, 1), dtype=torch.bfloat16,
                                device=dev) if s.generate_dbias else None)
    else:
        d_row, dprob, dbias = out
    pd, pdp = d_row.data_ptr(), dprob.data_ptr()
    pdb = dbias.data_ptr() if dbias is not None else 0
    if (bad | pd | pdp | pdb) & 15:
        return None
    launch, ws = s.launch, None
    if s.ws_size:
        cuda = s.device_index >= 0
        # (a graph's scratch is its own, from its pool: replays must not share it with eager
        # calls, and the zeroing kernel runs in the graph)
        pooled = not capturing(cuda)
        if pooled and s.zero_from is not None:
            # scratch whose plan's zeroed_region is zero at rest (POOL.zeroed): launches that
            # find and leave it zero, one kernel; offsets that break the contract can leave it
            # dirty (clear_memo drops it)
            if s.launch_zeroed is None:
                s.launch_zeroed = s.plan.address_launcher(s.m, False, s.device_index,
                                                          zeroed_workspace=True)
            launch = s.launch_zeroed
            ws = POOL.zeroed(s.ws_size, s.zero_from, s.zero_bytes, s.device,
                             current_stream_handle(s.device_index) if cuda else 0)
        elif pooled and cuda:
            ws = POOL.scratch(s.ws_size, s.device, current_stream_handle(s.device_index))
        else:  # capturing, or on the CPU: a fresh buffer, as _workspace gives
            ws = torch.empty(s.ws_size, dtype=torch.uint8, device=s.device)
    if s.device_index >= 0 and contract.offsets_checked_every_call():
        contract.check_offsets_on_device(offsets, s.m, s.m_aligned)
    # ws stays referenced until the launch is queued (a fresh scratch is freed after it,
    # stream-ordered)
    launch(pa, pw, pc, po, pal, pbe, ppr, pd, pdp, pdb, ws.data_ptr() if ws is not None else 0, s.m)
    return d_row, dprob, dbias


def _workspace(nbytes: int, dev, stream):
    """The plan's scratch for this call: on the current CUDA stream, the pool's buffer for
    (device, stream, size), so the hot path allocates nothing; inside a CUDA-graph capture,
    on a stream other than the current one, or on the CPU, a fresh buffer
    (``streams.capturing``: a replay must not share scratch with eager calls or other graphs)."""
    cuda = dev.type == "cuda"
    if not cuda or stream is not None or capturing(cuda):
        return torch.empty(nbytes, dtype=torch.uint8, device=dev)
    return POOL.scratch(nbytes, dev, current_stream_handle(dev.index))



def clear_memo() -> None:
    """Forget every validated call, replay and pooled scratch (the next calls validate
    again)."""
    CALLS.clear()
    POOL.clear()
