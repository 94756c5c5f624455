"""The host hot path: skip re-validation of a call whose operand *metadata* was seen before.

Owns a small memo (the vendor keeps one too) from a call's metadata key -- every tensor's
(dtype, shape, strides, device) plus every scalar argument with its type -- to what validating
it produced: the problem, its built graph, and how each canonical slot is viewed out of the
caller's tensor (how many trailing unit dims are dropped). A hit rebuilds the canonical pack
with a few views and re-checks only what metadata cannot tell (16-byte alignment of the data
pointers), so a repeated call costs a dict lookup instead of the contract and the binder.

Only calls whose every slot is such a view are memoized (the BF16 contract); others (block-
scaled scale factors, re-described as 6-D layouts) always take the validating path.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple

import torch

from .. import contract

_MAX = 256
_memo: "OrderedDict[tuple, tuple]" = OrderedDict()
_lock = threading.Lock()


class _Unhashable(Exception):
    pass


def tensor_meta(t):
    """What validation depends on in a tensor: (dtype, shape, strides, device); None stays None.
    The device itself, not ``get_device()``: that is -1 for CPU and ``meta`` tensors alike, and
    a meta tensor must not reuse a CPU call's validation."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise _Unhashable
    return (t.dtype, t.shape, t.stride(), t.device)


def call_key(tensors: Tuple, scalars: Tuple) -> Optional[tuple]:
    """The memo key of a call, or None when some argument cannot be keyed."""
    try:
        key = (tuple(tensor_meta(t) for t in tensors), scalars, tuple(type(s) for s in scalars))
        hash(key)
        return key
    except (_Unhashable, TypeError, RuntimeError):  # RuntimeError: no strides (sparse CSR)
        return None


def views_of(ops: contract.Operands, problem, pack: Dict[str, Any]) -> Optional[tuple]:
    """How each slot of a validated ``pack`` is viewed out of ``ops``: ((slot, unit dims dropped),
    ...), or None when some slot is not such a view (then the call is not memoized)."""
    if problem.is_block_scaled:
        return None
    views = []
    for slot, t in pack.items():
        src = getattr(ops, slot, None)
        if not isinstance(src, torch.Tensor) or not isinstance(t, torch.Tensor):
            return None
        drop = src.dim() - t.dim()
        v = src
        for _ in range(max(drop, 0)):
            v = v[..., 0]
        if drop < 0 or v.shape != t.shape or v.stride() != t.stride() or v.data_ptr() != t.data_ptr():
            return None
        views.append((slot, drop))
    return tuple(views)


def rebuild(ops: contract.Operands, views: tuple) -> Dict[str, Any]:
    """The canonical pack of a call whose metadata matched a validated one; re-checks the one
    thing metadata cannot tell: 16-byte (b_ptrs: 8-byte) alignment of every data pointer."""
    pack: Dict[str, Any] = {}
    for slot, drop in views:
        t = getattr(ops, slot)
        if t.data_ptr() & (7 if slot == "b_ptrs" else 15) and t.numel():
            contract.check_aligned(contract.ARG_NAMES[slot], t, 8 if slot == "b_ptrs" else 16)
        for _ in range(drop):
            t = t[..., 0]
        pack[slot] = t
    return pack


def lookup(key: Optional[tuple], ops: contract.Operands):
    """``(problem, graph, pack)`` for a remembered call (pack rebuilt from ``ops``), else None."""
    hit = _memo.get(key) if key is not None else None
    if hit is None:
        return None
    problem, graph, views = hit
    return problem, graph, rebuild(ops, views)


def remember(key: Optional[tuple], ops: contract.Operands, problem, graph, pack: Dict[str, Any]) -> None:
    """Memoize a validated call if every slot of its pack is a unit-dim-dropping view of an argument."""
    views = views_of(ops, problem, pack) if key is not None else None
    if views is None:
        return
    with _lock:
        _memo[key] = (problem, graph, views)
        while len(_memo) > _MAX:
            _memo.popitem(last=False)


def clear() -> None:
    with _lock:
        _memo.clear()
