"""The SM90 cooperative kernel's split last round (knob ``split_last``) evaluated on Python
ints, for the tests: the CPU test checks the schedule's promises on many unit and cluster
counts; the GPU test asks which partial-sum slots a launch must have written.

No formula is restated here: ``cudnn_ext.kernels.sm90.tile_walk``'s ``last_round_split``,
``split_share``, ``split_piece``, ``split_waits`` and ``next_epilogue_unit`` are the
functions the kernel
traces (with DSL values), run here with ``PY_OPS``. What this module adds is the walk
around them, as the kernel's ``split_item`` and the C producers' / folder's loops take it.
"""
from __future__ import annotations

from cudnn_ext.kernels.sm90 import launch as _launch  # noqa: F401  (CUTE_DSL_ARCH before cutlass)
from cudnn_ext.kernels.sm90.dglu_kernel import SPLIT_SLOTS
from cudnn_ext.kernels.sm90.tile_walk import (PY_OPS, last_round_split, next_epilogue_unit,
                                              split_piece, split_share, split_waits)

__all__ = ["SPLIT_SLOTS", "epilogue_units", "items", "plan"]


def plan(num_units: int, nclusters: int, k_tiles: int, max_split: int):
    """(full, rem, p), as the kernel's split_walk computes them."""
    return last_round_split(num_units, nclusters, min(max_split, k_tiles), SPLIT_SLOTS, PY_OPS)


def items(cluster: int, num_units: int, nclusters: int, k_tiles: int, max_split: int):
    """The cluster's items in order: (unit, first k-tile, k-tiles, final, last-round unit r
    or None, slot of a non-final part or None, (first, count) of a final part's waits or
    None), as the kernel's split_item."""
    full, rem, p = plan(num_units, nclusters, k_tiles, max_split)
    pieces, lo, hi, u0, _, _ = split_share(cluster, num_units, full, rem, p, k_tiles, PY_OPS)
    out = [(u, 0, k_tiles, True, None, None, None) for u in range(cluster, full, nclusters)]
    for j in range(pieces):
        r, kb, ke, fin = split_piece(j, pieces, lo, hi, u0, k_tiles, PY_OPS)
        waits = split_waits(cluster, r, rem, p, k_tiles, PY_OPS) if fin else None
        out.append((full + r, kb, ke - kb, fin, r, None if fin else cluster, waits))
    return out


def epilogue_units(cluster: int, num_units: int, nclusters: int, k_tiles: int,
                   max_split: int):
    """The units whose epilogue the cluster runs, as its C producers and folder walk them
    (first_epi_unit, next_epi_unit, epi_end)."""
    full, rem, p = plan(num_units, nclusters, k_tiles, max_split)
    *_, tail_start, end = split_share(cluster, num_units, full, rem, p, k_tiles, PY_OPS)
    unit = cluster if cluster < full else tail_start
    out = []
    while unit < end:
        out.append(unit)
        unit = next_epilogue_unit(unit, nclusters, full, tail_start, PY_OPS)
    return out
