"""Which output tiles a CTA owns, and which expert each belongs to (SM90 kernel).

Owns the persistent static schedule (tile t -> (m_tile, n_tile)) and the expert lookup from
``padded_offsets``. No memory traffic besides reading the offsets, no host policy.

Why a tile never straddles two experts: every offset is a multiple of 256 and a tile is 128
rows, so [row0, row0+128) lies inside one expert's range (vendor_facts 1.9). Only the
``offs[L-1] / 128`` M-tiles that hold rows are scheduled, so rows past the last offset cost
nothing and are never touched; empty experts own no rows and therefore no tiles.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def grouped_raster(tile: Int32, num_m_tiles: Int32, num_n_tiles: cutlass.Constexpr,
                   group_m: cutlass.Constexpr):
    """Map a linear tile index to (m_tile, n_tile), walking ``group_m`` M-tiles at a time.

    Inside a group the M index runs fastest, so the tiles in flight at once share a few
    128-row slabs of A (read from DRAM once, then from L2) and sweep B's N-tiles together
    (each B tile comes from DRAM about once per group instead of once per M-tile).
    """
    tiles_per_group = group_m * num_n_tiles
    gid = tile // tiles_per_group
    first_m = gid * group_m
    gsize = cutlass.min(num_m_tiles - first_m, group_m)
    local = tile - gid * tiles_per_group
    m_tile = first_m + local % gsize
    n_tile = local // gsize
    return m_tile, n_tile


@cute.jit
def expert_of_row(offs: cute.Tensor, num_experts: Int32, row0: Int32) -> Int32:
    """Index e of the expert whose rows [offs[e-1], offs[e]) contain ``row0``.

    Binary search for the first end strictly greater than ``row0`` (offsets are
    non-decreasing; empty experts have equal neighbours and are skipped). Only called with
    row0 < offs[L-1], so the result is < L.
    """
    lo = Int32(0)
    hi = num_experts
    while lo < hi:
        mid = (lo + hi) // 2
        if offs[mid] <= row0:
            lo = mid + Int32(1)
        else:
            hi = mid
    return lo


class ScheduleOps(NamedTuple):
    """What the split schedule's integer arithmetic needs besides +, -, *, //, comparisons,
    & and |: ``select(cond, x, y)`` and ``max(x, y)``. With ``dsl_ops()`` the functions
    below trace into the kernel (DSL Int32 values; no branches), with ``PY_OPS`` they
    evaluate on Python ints: the tests check the very formulas the kernel runs."""

    select: Callable
    max: Callable


PY_OPS = ScheduleOps(lambda c, x, y: x if c else y, max)


def dsl_ops() -> ScheduleOps:
    return ScheduleOps(lambda c, x, y: Int32(cutlass.select_(c, Int32(x), Int32(y))),
                       lambda x, y: cutlass.max(Int32(x), Int32(y)))


def last_round_split(num_units, nclusters, max_split: int, max_slots: int, ops: ScheduleOps):
    """How the persistent static schedule's last, partial round is split along K.

    Units u < full = (num_units // nclusters) * nclusters run whole, cluster c taking
    c, c + nclusters, ...: every cluster the same number. The rem = num_units - full units
    left would keep rem clusters busy for a whole tile while the others idle (dsv3 on the
    H200: 1,024 units over 66 clusters leave 34, so 64 of 132 CTAs end a tile early).
    Splitting each of them into s K-parts makes rem * s pieces, spread over the clusters
    (``split_share``), so the busiest cluster runs ceil(rem * s / nclusters) pieces of 1/s
    tile instead of one tile. s is the one in [1, max_split] with the fewest such tile
    fractions (the smallest on ties), among those whose non-final pieces, rem * (s - 1),
    fit the ``max_slots`` partial-sum slots.

    Returns (full, rem, s); s == 1 when rem == 0 or no split helps."""
    full = (num_units // nclusters) * nclusters
    rem = num_units - full
    s = 1
    busiest = 1  # ceil(rem * s / nclusters) for the s kept (1 while rem <= nclusters)
    for c in range(2, max_split + 1):
        pieces = (rem * c + nclusters - 1) // nclusters
        # pieces / c < busiest / s, in integers
        better = (rem > 0) & (rem * (c - 1) <= max_slots) & (pieces * s < busiest * c)
        s = ops.select(better, c, s)
        busiest = ops.select(better, pieces, busiest)
    return full, rem, s


def split_share(cluster, nclusters, num_units, full, rem, s, ops: ScheduleOps):
    """One cluster's share of the rem * s last-round pieces, right-aligned over the
    clusters: it runs a = rem * s // nclusters of them, one more if it is among the last b
    = rem * s % nclusters, non-final ones first; the last rem clusters end with the final
    part of last-round unit ``final_r`` = cluster - (nclusters - rem); the non-final pieces,
    numbered in (cluster, order) sequence from ``first_nf``, go s - 1 at a time to units
    0, 1, ... (``split_piece``). So a final part waits only on clusters of lower index, at
    no later place in their order than its own (the counts grow with the index, and on
    each prefix of clusters there are enough non-final pieces: a counting argument, checked
    by the tests), and non-final parts never wait: no cycle, no chain of waits, and no wait
    on a cluster that starts after it if clusters start in index order.

    Returns (pieces, has_final, final_r, first_nf, tail_start, epi_end): the last two bound
    the one last-round unit whose epilogue the cluster runs (empty, at num_units, if none)."""
    total = rem * s
    a = total // nclusters
    b = total - a * nclusters
    pieces = a + ops.select(cluster >= nclusters - b, 1, 0)
    has_final = cluster >= nclusters - rem
    final_r = cluster - (nclusters - rem)
    first_nf = (cluster * a + ops.max(cluster - (nclusters - b), 0)
                - ops.max(cluster - (nclusters - rem), 0))
    tail_start = ops.select(has_final, full + final_r, num_units)
    epi_end = ops.select(has_final, full + final_r + 1, num_units)
    return pieces, has_final, final_r, first_nf, tail_start, epi_end


def split_piece(j, pieces, has_final, final_r, first_nf, s, ops: ScheduleOps):
    """Piece j of a cluster's share (``split_share``): (last-round unit r, K-part, final,
    slot n). The last piece of a cluster with a final part is part s - 1 of unit final_r;
    the others are non-final piece n = first_nf + j, part n % (s - 1) of unit n // (s - 1),
    whose partial sums go to slot n (= r * (s - 1) + part)."""
    fin = has_final & (j == pieces - 1)
    n = ops.max(first_nf + j, 0)
    s1 = ops.max(s - 1, 1)
    r_nf = n // s1
    r = ops.select(fin, final_r, r_nf)
    part = ops.select(fin, s - 1, n - r_nf * s1)
    return r, part, fin, n


def next_epilogue_unit(unit, step, full, tail_start, ops: ScheduleOps):
    """The unit after ``unit`` in a cluster's walk of the units whose epilogue it runs:
    whole units ``step`` apart, then its last-round unit ``tail_start``."""
    whole = unit < full
    nxt = unit + ops.select(whole, step, 1)
    return ops.select(whole & (nxt >= full), tail_start, nxt)
