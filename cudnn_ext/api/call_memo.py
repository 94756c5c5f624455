"""The wrapper's memoized calls: how a validated call's canonical pack is viewed out of its
operands (``views_of``), rebuilt from a later call with the same metadata (``rebuild``, which
re-checks what metadata cannot tell), and kept in the call memo under ``"wrapper"`` keys
(``runtime.memo.CALLS``, the generic store)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .. import contract
from ..runtime.memo import CALLS


def views_of(ops: contract.Operands, problem, pack: Dict[str, Any]) -> Optional[tuple]:
    """How each slot of a validated ``pack`` is viewed out of ``ops``: ((slot, unit dims dropped,
    bytes the view spans, geometry, alignment), ...), or None when some slot is not a view of its
    argument (then the call is not memoized). ``alignment``: the bytes the contract requires of
    the slot's data pointer (``contract.slot_alignment``), re-checked on every hit. ``geometry`` is None for a view that drops trailing unit
    dims, else the (shape, strides) of a re-described view of the argument's own bytes (the
    block-scaled scale factors' 6-D layout, ``norm_const``'s (1,)). The spans are fixed by the
    metadata, so a remembered call re-checks that its outputs overlap nothing from the data
    pointers alone."""
    views = []
    for slot, t in pack.items():
        src = getattr(ops, slot, None)
        if not isinstance(src, torch.Tensor) or not isinstance(t, torch.Tensor):
            return None
        drop = src.dim() - t.dim()
        v = src
        for _ in range(max(drop, 0)):
            v = v[..., 0]
        r = contract.byte_range(t)
        span = r[1] - r[0] if r is not None else 0
        align = contract.slot_alignment(problem, slot)
        if drop >= 0 and v.shape == t.shape and v.stride() == t.stride() and v.data_ptr() == t.data_ptr():
            views.append((slot, drop, span, None, align))
        elif t.dtype == src.dtype and t.data_ptr() == src.data_ptr() and t.storage_offset() == src.storage_offset():
            views.append((slot, 0, span, (tuple(t.shape), tuple(t.stride())), align))
        else:
            return None
    return tuple(views)


def rebuild(ops: contract.Operands, views: tuple) -> Dict[str, Any]:
    """The canonical pack of a call whose metadata matched a validated one; re-checks what
    metadata cannot tell: each data pointer's alignment (as the contract requires it of the
    slot), and that no output overlaps another operand."""
    pack: Dict[str, Any] = {}
    spans = []
    for slot, drop, span, geometry, align in views:
        t = getattr(ops, slot)
        p = t.data_ptr()
        if align and p % align and t.numel():
            contract.check_aligned(contract.ARG_NAMES[slot], t, align)
        if span:
            spans.append((p, p + span, slot))
        if geometry is not None:
            t = t.as_strided(*geometry)  # the same metadata as the validated call: the same view
        for _ in range(drop):
            t = t[..., 0]
        pack[slot] = t
    contract.check_spans_apart(spans)
    return pack


def lookup(key: Optional[tuple], ops: contract.Operands):
    """``(problem, graph, pack)`` for a remembered wrapper call (pack rebuilt from ``ops``),
    else None."""
    hit = CALLS.get(("wrapper", key)) if key is not None else None
    if hit is None:
        return None
    problem, graph, views = hit
    return problem, graph, rebuild(ops, views)


def remember(key: Optional[tuple], ops: contract.Operands, problem, graph, pack: Dict[str, Any]) -> bool:
    """Memoize a validated wrapper call if every slot of its pack is a unit-dim-dropping view
    of an argument. True when the call is the first of its metadata key (or has none): a call
    that is validated every time still counts as seen once remembered."""
    if key is None:
        return True
    views = views_of(ops, problem, pack)
    if views is not None:
        CALLS.put(("wrapper", key), (problem, graph, views))
        return True
    if CALLS.get(("seen", key)) is not None:
        return False
    CALLS.put(("seen", key), True)
    return True
