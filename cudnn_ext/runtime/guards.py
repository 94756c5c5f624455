"""Metadata guards for the eager hot path: "are these tensors laid out exactly like those?".

Owns one question, answered in C++: torch's own tensor-match guard (the check
``torch.compile`` runs before reusing a compiled graph: dispatch keys, dtype, device, sizes,
strides and ``requires_grad`` of every tensor in one call). Reading those fields from Python
costs about 1 us per tensor on this project's CPU box (``.shape``, ``.stride()``, ``.dtype``,
``.get_device()``: 0.30, 0.30, 0.17, 0.16 us each; 10 tensors, the largest part of the eager
call's host time), while one check of 9 tensors costs 1.06 us (both timed there on
2026-11-30 with a ``perf_counter_ns`` loop, torch 2.13 CPU; the replay's end-to-end effect is
in ``benchmarks/bench_host_overhead.py``).

``TensorGuards`` is a torch-internal class whose constructor has changed between releases, so
it is probed once: when it is missing or behaves unexpectedly :func:`make` returns None and
callers keep their Python-keyed path (same results, more host time). A guard never replaces
validation: it only says that a call's metadata equals that of an earlier call which was
validated. It includes each tensor's exact Python type (a subclass does not match); data
pointers are not part of it (callers check alignment themselves).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

try:  # torch-internal; absent or different in some releases
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:  # pragma: no cover - depends on the torch build
    _TensorGuards = None


def _build(tensors: Sequence[torch.Tensor]):
    return _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                         dynamic_dims_strides=[list(t.stride()) for t in tensors])


class _Subclass(torch.Tensor):
    pass


def _probe() -> bool:
    """Whether the guard works as this module relies on: it accepts its own tensors and rejects
    a different size, stride, dtype or requires_grad."""
    if _TensorGuards is None:
        return False
    try:
        x = torch.zeros(4, 8)
        g = _build((x,))
        return (bool(g.check(x)) and not g.check(torch.zeros(4, 9)) and not g.check(x.t())
                and not g.check(x.to(torch.float64)) and not g.check(x.as_subclass(_Subclass))
                and not g.check(torch.zeros(4, 8, requires_grad=True)))
    except Exception:
        return False


AVAILABLE = _probe()


def make(tensors: Sequence[torch.Tensor]) -> Optional[object]:
    """A guard matching exactly ``tensors``' metadata (``guard.check(*same_arity_tensors)`` ->
    bool), or None when torch offers none."""
    if not AVAILABLE:
        return None
    try:
        g = _build(tensors)
        return g if g.check(*tensors) else None
    except Exception:
        return None
