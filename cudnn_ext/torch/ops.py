"""PyTorch operators: ``torch.ops.cudnn_ext.*`` custom ops and their Python entry points.

Owns the op schemas, their fake (meta) implementations and the thin Python functions users
call. The computation is ``cudnn_ext.functional.run`` (contract-validated once, then a built
plan); nothing here knows about engines.

Design: the ops are *functional*. They take no output buffers and mutate nothing; ``d_row``,
``dprob`` and ``dbias`` come back as fresh zero-initialized-then-accumulated tensors. The
vendor's "caller-zeroed dprob, accumulated into" contract is an in-place mutation; a custom op
that mutates forces torch.compile to functionalize it (auto_functionalized + copy-backs and
clones of the mutated inputs), while a functional op is one opaque node with no aliasing to
track. Callers who want accumulation into an existing gradient add the result (``g += dprob``),
which the compiler fuses with neighbours.

Ops:

* ``cudnn_ext::grouped_gemm_dglu`` (dense weights): ``b`` is ``(L, N, K)`` per expert, rows of
  K contiguous (K-major, like ``nn.Linear.weight`` stacked) or its transpose-view of an
  ``(L, K, N)`` tensor (N-major). Internally it is the vendor's ``(N, K, L)`` view.
* ``cudnn_ext::grouped_gemm_dglu_discrete`` (per-expert pointers): ``b_ptrs`` int64 ``(L,)``
  with ``n`` and ``b_major``. The pointed-to weights are *not* op inputs: the compiler cannot
  see the dependency, so they must stay alive and unchanged while the op can run.

Both return ``(d_row (M, 2N), dprob (M,) fp32, dbias)`` where ``dbias`` is ``(L, 2N)`` bf16 when
``generate_dbias`` and an empty ``(0, 2N)`` tensor otherwise (schemas cannot return None; the
Python functions below map it to None). Every op takes ``int m_aligned=256``: M and every
``padded_offsets`` entry are multiples of it (1: any size, 8, 16, 32, 64, 128 or 256).
"""
from __future__ import annotations

import functools
import re
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import contract
from ..contract import check_same_device
from ..runtime import caches
from ..layout import check_layout, halves_to_interleaved, interleaved_to_halves
from .. import activations
from ..functional import ActArgs, run, run_fast, validate

_LIB = "cudnn_ext"


@functools.lru_cache(maxsize=256, typed=True)  # typed: a rejected True must not answer for 1.0
def _act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned=256) -> ActArgs:
    # cached: a frozen dataclass costs microseconds to build, and the hot path keys on it
    return ActArgs(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned=m_aligned)


caches.lru("torch op activation arguments", _act)


def _eager() -> bool:
    """Outside torch.compile/tracing, torch-function and dispatch modes and functorch
    transforms: nothing needs to see the op."""
    return not (torch.compiler.is_compiling() or torch._C._is_tracing()  # torch.jit.is_tracing's
                or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack()
                or torch._C._are_functorch_transforms_active())


#: Tensor types the op's body may run on directly: ``nn.Parameter`` disables torch-function
#: dispatch (``_disabled_torch_function_impl``), so for the op it is a plain tensor (expert
#: weights are usually Parameters)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _plain_tensors(tensors) -> bool:
    """Every tensor exactly a ``torch.Tensor`` or ``nn.Parameter`` (no other subclass) and
    not a meta tensor (those get the fake implementation)."""
    for t in tensors:
        if type(t) not in _PLAIN_TYPES or t.is_meta:
            return False
    return True


def _direct_ok(tensors) -> bool:
    """Whether an eager call may run the op's body without the dispatcher (same function,
    same results): only eagerly (``_eager``) on plain tensors; anything else takes
    ``torch.ops`` so that fake tensors, functionalization, vmap and modes see the op. Saves
    the dispatcher's ~20-30 us per call on a slow host (bench_host_overhead.py: python_fn vs
    custom_op). Eager calls first try ``run_fast``, whose guard only matches metadata an
    earlier direct call had (so plain tensors of the same exact type, not meta)."""
    return _eager() and _plain_tensors(tensors)


def _empty_dbias(two_n, device):
    return torch.empty((0, two_n), dtype=torch.bfloat16, device=device)


# --------------------------------------------------------------------------- registration
# Registered with torch.library.Library (define + one CompositeExplicitAutograd kernel +
# register_fake) rather than the @custom_op decorator: same schema, same opcheck and compile
# behaviour, but the eager call skips custom_op's Python layers (autograd wrapper, redispatch,
# aliasing check, dynamo-disable), about 20 us per call on a slow host (bench_host_overhead.py).
_lib = torch.library.Library(_LIB, "FRAGMENT")
_ACT_ARGS = ("str act_func='dswiglu', float? linear_offset=None, float geglu_alpha=1.702, "
             "float glu_clamp_max=7.0, float glu_clamp_min=-7.0, bool generate_dbias=False, "
             "ScalarType? d_dtype=None, int m_aligned=256")
_lib.define("grouped_gemm_dglu(Tensor a, Tensor b, Tensor c, Tensor padded_offsets, Tensor alpha, Tensor beta, "
            f"Tensor prob, {_ACT_ARGS}) -> (Tensor, Tensor, Tensor)")
_lib.define("grouped_gemm_dglu_discrete(Tensor a, Tensor b_ptrs, int n, Tensor c, Tensor padded_offsets, "
            f"Tensor alpha, Tensor beta, Tensor prob, str b_major='k', {_ACT_ARGS}) -> (Tensor, Tensor, Tensor)")


_CONTRACT_NAME = re.compile(r"\b(a|b|c|alpha|beta|prob|d_row|dprob|dbias)_tensor\b")
_OUT_NAME = {"d_row": "out[0] (d_row)", "dprob": "out[1] (dprob)", "dbias": "out[2] (dbias)"}


def _op_words(exc: Exception, b=None) -> None:
    """A contract error put in the op's own words, in place: its argument names (``a``, not the
    wrapper's ``a_tensor``; ``out[1] (dprob)`` for an output) and dense ``b``'s shape as the
    caller passed it, (L, N, K), not the contract's (N, K, L) view. The op bodies, real and
    fake, call it where the contract raises (so a compiled call's error, which dynamo wraps
    from the fake kernel, reads the same), in ``except`` clauses: free until something raises."""
    if len(exc.args) != 1 or not isinstance(exc.args[0], str):  # (built otherwise: as it is)
        return
    msg = _CONTRACT_NAME.sub(lambda m: _OUT_NAME.get(m.group(1), m.group(1)), exc.args[0])
    if isinstance(b, Tensor) and b.dim() == 3:
        msg = msg.replace(str(tuple(b.permute(1, 2, 0).shape)), str(tuple(b.shape)))
    if msg != exc.args[0]:
        exc.args = (msg,)


def _in_op_words(fn):
    """``fn`` (a fake kernel, whose second argument is ``b`` or ``b_ptrs``) with its contract
    errors in the op's words (``_op_words``)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as exc:
            _op_words(exc, args[1] if len(args) > 1 else kwargs.get("b"))
            raise
    return call


def _vendor_b(b: Tensor) -> Tensor:
    """The op's dense (L, N, K) weights as the contract's (N, K, L) view."""
    if b.dim() != 3:
        raise ValueError(f"b: shape must be (L, N, K), got {tuple(b.shape)}")
    return b.permute(1, 2, 0)


# The op bodies below run either from the dispatcher (``torch.ops.cudnn_ext.*``: eager calls,
# compiled graphs at run time, modes) with ``fast=None``, or from the Python entry points with
# ``fast=(sig, tensors)``. From the dispatcher they first try the guarded replay themselves
# (``functional.run_fast``: one C++ metadata check instead of the memo key, the pack and the
# plan's execute) and remember validated calls for it, under signatures of their own (a leading
# tag: the dispatcher has already coerced the scalars to the schema's types, so the Python
# entry points' signatures, which carry the caller's types, never mix with these). Only for
# plain tensors: a subclass that reaches a body keeps the validated path.
_OP_DENSE, _OP_DISCRETE, _OP_DENSE_OUT, _OP_DISCRETE_OUT = ("op", 0), ("op", 1), ("op", 2), ("op", 3)


def _replayed(sig, ts, c, generate_dbias):
    """The replay of a dispatcher call (the op's outputs, dbias empty when not generated), or
    None when there is none (then ``fast`` for ``run`` to remember it, see above)."""
    res = run_fast(sig, ts)
    if res is None:
        return None
    return res[0], res[1], (res[2] if generate_dbias else _empty_dbias(c.shape[1], c.device))


def _dense_impl(a: Tensor, b: Tensor, c: Tensor, padded_offsets: Tensor, alpha: Tensor, beta: Tensor,
                prob: Tensor, act_func: str = "dswiglu", linear_offset: Optional[float] = None,
                geglu_alpha: float = 1.702, glu_clamp_max: float = 7.0, glu_clamp_min: float = -7.0,
                generate_dbias: bool = False, d_dtype: Optional[torch.dtype] = None, m_aligned: int = 256,
                fast=None):
    if fast is None:
        ts = (a, b, c, padded_offsets, alpha, beta, prob)
        if _plain_tensors(ts):
            sig = (_OP_DENSE, act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min,
                   generate_dbias, d_dtype, m_aligned)
            res = _replayed(sig, ts, c, generate_dbias)
            if res is not None:
                return res
            fast = (sig, ts)
    try:
        d_row, dprob, dbias = run(a, c, padded_offsets, alpha, beta, prob, b=_vendor_b(b),
                                  act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min,
                                           m_aligned),
                                  generate_dbias=generate_dbias, d_dtype=d_dtype or torch.bfloat16, fast=fast)
    except (ValueError, TypeError) as exc:
        _op_words(exc, b)
        raise
    return d_row, dprob, (dbias if dbias is not None else _empty_dbias(c.shape[1], c.device))


def _discrete_impl(a: Tensor, b_ptrs: Tensor, n: int, c: Tensor, padded_offsets: Tensor, alpha: Tensor,
                   beta: Tensor, prob: Tensor, b_major: str = "k", act_func: str = "dswiglu",
                   linear_offset: Optional[float] = None, geglu_alpha: float = 1.702, glu_clamp_max: float = 7.0,
                   glu_clamp_min: float = -7.0, generate_dbias: bool = False,
                   d_dtype: Optional[torch.dtype] = None, m_aligned: int = 256, fast=None):
    if fast is None:
        ts = (a, b_ptrs, c, padded_offsets, alpha, beta, prob)
        if _plain_tensors(ts):
            sig = (_OP_DISCRETE, n, b_major, act_func, linear_offset, geglu_alpha, glu_clamp_max,
                   glu_clamp_min, generate_dbias, d_dtype, m_aligned)
            res = _replayed(sig, ts, c, generate_dbias)
            if res is not None:
                return res
            fast = (sig, ts)
    try:
        d_row, dprob, dbias = run(a, c, padded_offsets, alpha, beta, prob, b_ptrs=b_ptrs, n=n, b_major=b_major,
                                  act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min,
                                           m_aligned),
                                  generate_dbias=generate_dbias, d_dtype=d_dtype or torch.bfloat16, fast=fast)
    except (ValueError, TypeError) as exc:
        _op_words(exc)
        raise
    return d_row, dprob, (dbias if dbias is not None else _empty_dbias(c.shape[1], c.device))


_lib.impl("grouped_gemm_dglu", _dense_impl, "CompositeExplicitAutograd")
_lib.impl("grouped_gemm_dglu_discrete", _discrete_impl, "CompositeExplicitAutograd")

# Out-variants: the caller's buffers, the class API's contract (d_row rows past the last offset
# untouched, dprob/dbias accumulated into). No allocation on the hot path; torch.compile
# functionalizes the mutation.
_OUTS = "Tensor(a!) d_row, Tensor(b!) dprob, Tensor(c!)? dbias"
_OUT_ACT = ("str act_func='dswiglu', float? linear_offset=None, float geglu_alpha=1.702, "
            "float glu_clamp_max=7.0, float glu_clamp_min=-7.0, int m_aligned=256")
_lib.define("grouped_gemm_dglu_out(Tensor a, Tensor b, Tensor c, Tensor padded_offsets, Tensor alpha, "
            f"Tensor beta, Tensor prob, {_OUTS}, {_OUT_ACT}) -> ()")
_lib.define("grouped_gemm_dglu_discrete_out(Tensor a, Tensor b_ptrs, int n, Tensor c, Tensor padded_offsets, "
            f"Tensor alpha, Tensor beta, Tensor prob, {_OUTS}, str b_major='k', {_OUT_ACT}) -> ()")


def _dense_out_impl(a, b, c, padded_offsets, alpha, beta, prob, d_row, dprob, dbias=None,
                    act_func="dswiglu", linear_offset=None, geglu_alpha=1.702, glu_clamp_max=7.0,
                    glu_clamp_min=-7.0, m_aligned=256, fast=None) -> None:
    outs = (d_row, dprob, dbias)
    if fast is None:
        ts = (a, b, c, padded_offsets, alpha, beta, prob, d_row, dprob) + _given(dbias)
        if _plain_tensors(ts):
            sig = (_OP_DENSE_OUT, act_func, linear_offset, geglu_alpha, glu_clamp_max,
                   glu_clamp_min, dbias is not None, m_aligned)
            if run_fast(sig, ts, outs) is not None:
                _mutated(outs)
                return
            fast = (sig, ts)
    try:
        run(a, c, padded_offsets, alpha, beta, prob, b=_vendor_b(b),
            act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned),
            generate_dbias=dbias is not None, out=(d_row, dprob, dbias), fast=fast)
    except (ValueError, TypeError) as exc:
        _op_words(exc, b)
        raise
    _mutated((d_row, dprob, dbias))


def _given(t) -> tuple:
    return () if t is None else (t,)


def _mutated(tensors) -> None:
    """A kernel wrote ``tensors`` (None entries skipped) behind autograd's back: bump their
    version counters so that a backward which saved one of them notices (what
    ``@custom_op(mutates_args=...)`` does)."""
    torch.autograd.graph.increment_version([t for t in tensors if t is not None])


def _discrete_out_impl(a, b_ptrs, n, c, padded_offsets, alpha, beta, prob, d_row, dprob, dbias=None,
                       b_major="k", act_func="dswiglu", linear_offset=None, geglu_alpha=1.702,
                       glu_clamp_max=7.0, glu_clamp_min=-7.0, m_aligned=256, fast=None) -> None:
    outs = (d_row, dprob, dbias)
    if fast is None:
        ts = (a, b_ptrs, c, padded_offsets, alpha, beta, prob, d_row, dprob) + _given(dbias)
        if _plain_tensors(ts):
            sig = (_OP_DISCRETE_OUT, n, b_major, act_func, linear_offset, geglu_alpha,
                   glu_clamp_max, glu_clamp_min, dbias is not None, m_aligned)
            if run_fast(sig, ts, outs) is not None:
                _mutated(outs)
                return
            fast = (sig, ts)
    try:
        run(a, c, padded_offsets, alpha, beta, prob, b_ptrs=b_ptrs, n=n, b_major=b_major,
            act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned),
            generate_dbias=dbias is not None, out=(d_row, dprob, dbias), fast=fast)
    except (ValueError, TypeError) as exc:
        _op_words(exc)
        raise
    _mutated((d_row, dprob, dbias))


_lib.impl("grouped_gemm_dglu_out", _dense_out_impl, "CompositeExplicitAutograd")
_lib.impl("grouped_gemm_dglu_discrete_out", _discrete_out_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{_LIB}::grouped_gemm_dglu_out", lib=_lib)
@_in_op_words
def _(a, b, c, padded_offsets, alpha, beta, prob, d_row, dprob, dbias=None, act_func="dswiglu",
      linear_offset=None, geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, m_aligned=256):
    _fake_check(a, c, padded_offsets, alpha, beta, prob, b=b, generate_dbias=dbias is not None,
                act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned),
                out=(d_row, dprob, dbias))


@torch.library.register_fake(f"{_LIB}::grouped_gemm_dglu_discrete_out", lib=_lib)
@_in_op_words
def _(a, b_ptrs, n, c, padded_offsets, alpha, beta, prob, d_row, dprob, dbias=None, b_major="k",
      act_func="dswiglu", linear_offset=None, geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0,
      m_aligned=256):
    _fake_check(a, c, padded_offsets, alpha, beta, prob, b_ptrs=b_ptrs, n=n, b_major=b_major,
                generate_dbias=dbias is not None,
                act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned),
                out=(d_row, dprob, dbias))


@torch.library.register_fake(f"{_LIB}::grouped_gemm_dglu", lib=_lib)
@_in_op_words
def _(a, b, c, padded_offsets, alpha, beta, prob, act_func="dswiglu", linear_offset=None, geglu_alpha=1.702,
      glu_clamp_max=7.0, glu_clamp_min=-7.0, generate_dbias=False, d_dtype=None, m_aligned=256):
    problem = _fake_check(a, c, padded_offsets, alpha, beta, prob, b=b, generate_dbias=generate_dbias,
                          act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned),
                          d_dtype=d_dtype)
    return _fake_outputs(c, problem)


@torch.library.register_fake(f"{_LIB}::grouped_gemm_dglu_discrete", lib=_lib)
@_in_op_words
def _(a, b_ptrs, n, c, padded_offsets, alpha, beta, prob, b_major="k", act_func="dswiglu", linear_offset=None,
      geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, generate_dbias=False, d_dtype=None,
      m_aligned=256):
    problem = _fake_check(a, c, padded_offsets, alpha, beta, prob, b_ptrs=b_ptrs, n=n, b_major=b_major,
                          generate_dbias=generate_dbias,
                          act=_act(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned),
                          d_dtype=d_dtype)
    return _fake_outputs(c, problem)


def _fake_check(a, c, padded_offsets, alpha, beta, prob, *, b=None, b_ptrs=None, n=None, b_major="k",
                generate_dbias, act: ActArgs, d_dtype=None, out=None):
    """The fake (meta) kernels' checks before they hand out output shapes; returns the call's
    ``DgluProblem``. One device for every tensor first (one meta tensor among real ones
    dispatches here, and the outputs would be uninitialized memory on the real device), then
    the whole contract on the metadata (``functional.validate``, what the real kernels run), so an
    invalid call fails on meta tensors and while torch.compile traces it, not only when it
    runs. Not the data-pointer alignment: meta and fake tensors have no real address (the
    real run checks it). With symbolic sizes the size rules add guards that only invalid
    inputs fail (M % m_aligned == 0, K % 8 == 0, ...)."""
    ts = dict(a=a, b=b, b_ptrs=b_ptrs, c=c, padded_offsets=padded_offsets, alpha=alpha, beta=beta,
              prob=prob)
    if out is not None:
        ts.update(d_row=out[0], dprob=out[1], dbias=out[2])
    check_same_device(ts)
    problem, _ = validate(a, c, _vendor_b(b) if b is not None else None, b_ptrs, n, b_major,
                          padded_offsets, alpha, beta, prob, act, generate_dbias,
                          d_dtype or torch.bfloat16, out, pointers=False)
    return problem


def _fake_outputs(c, problem):
    m, two_n = c.shape[0], c.shape[1]  # (symbolic sizes stay the tensors')
    d_row = c.new_empty((m, two_n), dtype=problem.d_dtype)
    dprob = c.new_empty((m,), dtype=torch.float32)
    dbias = c.new_empty((problem.num_experts if problem.generate_dbias else 0, two_n),
                        dtype=torch.bfloat16)
    return d_row, dprob, dbias


# --------------------------------------------------------------------------- Python API
def grouped_gemm_dglu(
    a: Tensor, c: Tensor, padded_offsets: Tensor, alpha: Tensor, beta: Tensor, prob: Tensor, *,
    b: Optional[Tensor] = None, b_ptrs: Optional[Tensor] = None, n: Optional[int] = None, b_major: str = "k",
    act_func: str = "dswiglu", linear_offset: Optional[float] = None, geglu_alpha: float = 1.702,
    glu_clamp_max: float = 7.0, glu_clamp_min: float = -7.0, generate_dbias: bool = False,
    d_dtype: Optional[torch.dtype] = None, out: Optional[Tuple[Tensor, Tensor, Optional[Tensor]]] = None,
    m_aligned: int = 256, gate_up_layout: str = "interleaved",
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Grouped GEMM + dGLU backward as a functional, ``torch.compile``-able op.

    ``a`` (M, K) bf16 (the upstream gradient), ``c`` (M, 2N) the saved forward pre-activation
    (gate/up interleaved in 32-column blocks), ``padded_offsets`` (L,) int32 cumulative ends,
    each a multiple of ``m_aligned`` (as M is: 1, 8, 16, 32, 64, 128 or the vendor's 256, the
    default), ``alpha``/``beta`` (L,) fp32, ``prob`` (M,) fp32. Weights: dense ``b`` (L, N, K)
    bf16, or discrete ``b_ptrs`` (L,) int64 with ``n`` (and ``b_major``).

    Returns ``(d_row (M, 2N), dprob (M,), dbias (L, 2N) bf16 or None)``, all freshly
    zero-initialized (rows at/past ``padded_offsets[-1]`` are zero).

    ``out=(d_row, dprob, dbias)``: write into the caller's tensors instead (no allocation; the
    lowest host overhead): ``d_row`` (M, 2N) of D's dtype (``d_dtype`` is taken from it),
    ``dprob`` (M,) fp32 and ``dbias`` (L, 2N) bf16 are validated like the class API's outputs;
    rows of ``d_row`` at/past the last offset are left untouched and ``dprob``/``dbias`` are
    *accumulated into* (zero them for plain results). ``dbias`` must be given exactly when
    ``generate_dbias``. Returns ``out``.

    ``gate_up_layout="halves"``: ``c`` is ``[gate | up]`` (gate columns 0..N-1, up N..2N-1)
    and ``d_row``/``dbias`` come back the same way; the op converts on the device (a copy of C
    in and of D out: ``cudnn_ext.layout``). Not with ``out=``: pass interleaved tensors there.
    A halves C passed as interleaved gives a wrong D that no check can see.
    """
    if gate_up_layout != "interleaved":
        check_layout(gate_up_layout)
        if out is not None:
            raise ValueError("gate_up_layout: 'halves' is not supported with out= (the outputs are written "
                             "in place in the fused op's interleave); pass interleaved tensors "
                             "(cudnn_ext.halves_to_interleaved) or drop out=")
        d_row, dprob, dbias = grouped_gemm_dglu(
            a, halves_to_interleaved(c, name="c"), padded_offsets, alpha, beta, prob, b=b, b_ptrs=b_ptrs, n=n,
            b_major=b_major, act_func=act_func, linear_offset=linear_offset, geglu_alpha=geglu_alpha,
            glu_clamp_max=glu_clamp_max, glu_clamp_min=glu_clamp_min, generate_dbias=generate_dbias,
            d_dtype=d_dtype, m_aligned=m_aligned)
        return (interleaved_to_halves(d_row), dprob,
                None if dbias is None else interleaved_to_halves(dbias))
    if (b is None) == (b_ptrs is None):
        raise ValueError("b/b_ptrs: provide exactly one of b (dense (L, N, K) weights) or b_ptrs (per-expert pointers)")
    if b is not None and n is not None:
        raise ValueError(f"n: dense weights (b) forbid n, got n={n!r}")
    if b_ptrs is not None and n is None:
        raise ValueError("n: discrete weights (b_ptrs) require n, got None")
    if not isinstance(generate_dbias, bool):  # the schema's type: the op refuses 1 or "yes"
        raise TypeError(f"generate_dbias: expected a bool, got {type(generate_dbias).__name__}")
    if b is not None and b_major != "k":  # dense b is (L, N, K): its layout says K-major
        raise ValueError(f"b_major: dense weights (b, (L, N, K)) are K-major; b_major applies to "
                         f"b_ptrs only, got {b_major!r}")
    # every non-tensor argument, with the numbers' types (64 == 64.0 == True-ish values compare
    # equal but validation tells them apart): with the tensors' metadata it identifies a
    # validated call
    sig = (b is None, n, b_major, act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min,
           generate_dbias, d_dtype, out is None, m_aligned, type(n), type(linear_offset), type(geglu_alpha),
           type(glu_clamp_max), type(glu_clamp_min), type(generate_dbias), type(m_aligned))
    w = b if b is not None else b_ptrs
    if out is not None:
        # replay first (a guard hit implies every check of _call_out passed on an earlier call
        # with this signature; the arity must match that call's: dbias given iff requested)
        if type(out) is tuple and len(out) == 3 and (out[2] is not None) == generate_dbias and _eager():
            ts = (a, w, c, padded_offsets, alpha, beta, prob, out[0], out[1]) + (out[2:] if generate_dbias else ())
            if run_fast(sig, ts, out) is not None:
                _mutated(out)
                return out
    else:
        ts = (a, w, c, padded_offsets, alpha, beta, prob)
        res = run_fast(sig, ts) if _eager() else None
        if res is not None:
            return res
    # the validated path (a first call, or one the replay does not cover)
    act = dict(act_func=act_func, linear_offset=linear_offset, geglu_alpha=geglu_alpha,
               glu_clamp_max=glu_clamp_max, glu_clamp_min=glu_clamp_min, m_aligned=m_aligned)
    if out is not None:
        return _call_out(a, c, padded_offsets, alpha, beta, prob, b, b_ptrs, n, b_major, out,
                         generate_dbias, d_dtype, act, sig)
    direct = _direct_ok(ts)
    common = dict(act, generate_dbias=generate_dbias, d_dtype=d_dtype)
    if direct:
        common["fast"] = (sig, ts)
    else:
        _check_scalars(n, b_major, act, d_dtype)
    if b is not None:
        fn = _dense_impl if direct else torch.ops.cudnn_ext.grouped_gemm_dglu
        d_row, dprob, dbias = fn(a, b, c, padded_offsets, alpha, beta, prob, **common)
    else:
        fn = _discrete_impl if direct else torch.ops.cudnn_ext.grouped_gemm_dglu_discrete
        d_row, dprob, dbias = fn(a, b_ptrs, n, c, padded_offsets, alpha, beta, prob, b_major=b_major,
                                 **common)
    return d_row, dprob, (dbias if generate_dbias else None)


def _call_out(a, c, padded_offsets, alpha, beta, prob, b, b_ptrs, n, b_major, out, generate_dbias, d_dtype,
              act, sig):
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise TypeError(f"out: must be a tuple (d_row, dprob, dbias), got {type(out).__name__}"
                        + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    d_row, dprob, dbias = out
    for name, t in (("out[0] (d_row)", d_row), ("out[1] (dprob)", dprob)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: must be a tensor, got {type(t).__name__}")
    if (dbias is not None) != bool(generate_dbias):
        raise ValueError(f"out[2] (dbias): must be a tensor exactly when generate_dbias=True, got "
                         f"{type(dbias).__name__} with generate_dbias={generate_dbias}")
    if d_dtype is not None and d_dtype != d_row.dtype:
        raise ValueError(f"d_dtype: out[0] (d_row) is {d_row.dtype}, got d_dtype={d_dtype}")
    w = b if b is not None else b_ptrs
    outs = (d_row, dprob, dbias)
    ts = (a, w, c, padded_offsets, alpha, beta, prob, d_row, dprob) + ((dbias,) if dbias is not None else ())
    direct = _direct_ok(ts)
    if direct:
        act = dict(act, fast=(sig, ts))
    else:
        _check_scalars(n, b_major, act, None)
    if b is not None:
        fn = _dense_out_impl if direct else torch.ops.cudnn_ext.grouped_gemm_dglu_out
        fn(a, b, c, padded_offsets, alpha, beta, prob, d_row, dprob, dbias, **act)
    else:
        fn = _discrete_out_impl if direct else torch.ops.cudnn_ext.grouped_gemm_dglu_discrete_out
        fn(a, b_ptrs, n, c, padded_offsets, alpha, beta, prob, d_row, dprob, dbias, b_major=b_major, **act)
    return outs


def _check_scalars(n, b_major, act: dict, d_dtype) -> None:
    """The contract's type rules on the non-tensor arguments of a call that goes through the
    dispatcher (torch.compile, meta tensors, modes): the op's schema would coerce them first
    (True to 1.0 for a float, to 1 for an int) or refuse them with its own message, so the
    kernels, fake or real, would not see what the caller gave. Their values are the
    kernels' to check (the schema keeps them; torch.compile may trace the floats as
    symbols, which value checks here would break on). A direct eager call passes the
    arguments as given and the contract checks them there."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise TypeError(f"n: expected an int, got {type(n).__name__}")
    contract.check_choice("b_major", b_major, ("k", "n"))
    contract.check_choice("act_func", act["act_func"], activations.names())
    for name in ("geglu_alpha", "glu_clamp_max", "glu_clamp_min"):
        contract.check_float_type(name, act[name])
    if act["linear_offset"] is not None:  # None: the activation's default
        contract.check_float_type("linear_offset", act["linear_offset"])
    m = act["m_aligned"]
    if isinstance(m, bool) or not isinstance(m, int):  # the schema would make True 1
        raise TypeError(f"m_aligned: expected an int, got {type(m).__name__} {m!r}")
    if d_dtype is not None:
        contract.check_d_dtype(d_dtype)


def expert_pointers(weights) -> Tensor:
    """The int64 pointer table of a list of per-expert (N, K) tensors (same device as them).

    The table does not keep the weights alive: the caller must.
    """
    weights = list(weights)
    if not weights:
        raise ValueError("weights: need at least one expert weight, got an empty list")
    ptrs = torch.tensor([w.data_ptr() for w in weights], dtype=torch.int64)
    return ptrs.to(weights[0].device, non_blocking=True)


__all__ = ["grouped_gemm_dglu", "expert_pointers"]
