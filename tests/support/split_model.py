"""The SM90 cooperative kernel's split last round (knob ``split_last``) evaluated on Python
ints, for the tests: the CPU test checks the schedule's promises on many unit and cluster
counts; the GPU test asks which partial-sum slots a launch must have written.

No formula is restated here: ``cudnn_ext.kernels.sm90.tile_walk``'s ``last_round_split``,
``split_share``, ``split_item`` (with ``split_piece`` and ``split_waits``) and
``next_epilogue_unit`` are the functions the kernel traces (with DSL values), run here with
``PY_OPS``. What this module adds is the walk around them, as the kernel's loops take it.
"""
from __future__ import annotations

from cudnn_ext.kernels.sm90 import build as _build  # noqa: F401  (CUTE_DSL_ARCH before cutlass)
from cudnn_ext.kernels.sm90.config import SPLIT_SLOTS
from typing import NamedTuple, Optional, Tuple

from cudnn_ext.kernels.sm90.tile_walk import (PY_OPS, last_round_split, next_epilogue_unit,
                                              split_item, split_share)

__all__ = ["SPLIT_SLOTS", "Item", "epilogue_units", "items", "plan"]


class Item(NamedTuple):
    """One item of a cluster's walk, as the kernel's split_item gives it."""

    unit: int
    kb: int  # first k-tile
    kcnt: int  # k-tiles
    final: bool  # holds the unit's last k-tiles: loads C, runs the epilogue
    handed: bool  # runs _split_hand_over (a part of a split unit)
    r: Optional[int]  # last-round unit (None for whole-round units)
    slot: Optional[int]  # a handed non-final part's slot (the kernel passes its cluster)
    waits: Optional[Tuple[int, int]]  # a last-round final part's (first, count)


def plan(num_units: int, nclusters: int, k_tiles: int, max_split: int):
    """(full, rem, p), as the kernel's split_walk computes them."""
    return last_round_split(num_units, nclusters, k_tiles, min(max_split, k_tiles),
                            SPLIT_SLOTS, PY_OPS)


def items(cluster: int, num_units: int, nclusters: int, k_tiles: int, max_split: int):
    """The cluster's items in order (``Item``), as the kernel's split_walk and split_item."""
    full, rem, p = plan(num_units, nclusters, k_tiles, max_split)
    pieces, lo, hi, u0, _, _ = split_share(cluster, num_units, full, rem, p, k_tiles, PY_OPS)
    rounds = full // nclusters
    out = []
    for i in range(rounds + pieces):
        unit, kb, ke, final, handed, r, first, count = split_item(
            i, cluster, nclusters, rounds, full, rem, p, pieces, lo, hi, u0, k_tiles, PY_OPS)
        tail = i >= rounds
        out.append(Item(unit, kb, ke - kb, bool(final), bool(handed), r if tail else None,
                        cluster if handed and not final else None,
                        (first, count) if tail and final else None))
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
