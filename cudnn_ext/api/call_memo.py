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
    bytes the view spans), ...), or None when some slot is not such a view (then the call is not
    memoized). The spans are fixed by the metadata, so a remembered call re-checks that its
    outputs overlap nothing from the data pointers alone."""
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
        r = contract.byte_range(t)
        views.append((slot, drop, r[1] - r[0] if r is not None else 0))
    return tuple(views)


def rebuild(ops: contract.Operands, views: tuple) -> Dict[str, Any]:
    """The canonical pack of a call whose metadata matched a validated one; re-checks what
    metadata cannot tell: 16-byte (pointer tables: 8-byte) alignment of every data pointer, and that
    no output overlaps another operand."""
    pack: Dict[str, Any] = {}
    spans = []
    for slot, drop, span in views:
        t = getattr(ops, slot)
        p = t.data_ptr()
        table = slot in ("b_ptrs", "sfb_ptrs")  # pointer tables: 8-byte aligned
        if p & (7 if table else 15) and t.numel():
            contract.check_aligned(contract.ARG_NAMES[slot], t, 8 if table else 16)
        if span:
            spans.append((p, p + span, slot))
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
    that is validated every time (block-scaled) still counts as seen once remembered."""
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
