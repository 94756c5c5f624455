"""Which output tiles a CTA owns, and which expert each belongs to (SM90 kernel).

Owns the persistent static schedule (tile t -> (m_tile, n_tile)) and the expert lookup from
``padded_offsets``. No memory traffic besides reading the offsets, no host policy.

Why a tile never straddles two experts: every offset is a multiple of 256 and a tile is 128
rows, so [row0, row0+128) lies inside one expert's range (docs/vendor_contract.md §1.9).
Only the ``offs[L-1] / 128`` M-tiles that hold rows are scheduled, so rows past the last
offset cost nothing and are never touched; empty experts own no rows and therefore no tiles.

With ``ragged_m`` (offsets multiples of 8) units are numbered per expert instead: expert e owns
ceil(rows_e / (128 cluster_m)) units of cluster_m M-tiles, its first one starting at its first
row, and a table of cumulative counts (``ragged_units``, written on the device each launch)
maps unit u to its expert by the same search (``ragged_tile``). A tile's rows past its
expert's end belong to the next expert (or lie past the last offset), and the second tile of
an expert's last unit may lie wholly past it: the kernel loads such rows but masks every
output of them. Both CTAs of a cluster pair along M thus share one expert's B k-tiles.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .config import TILE_M


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


def ragged_units(rows, cluster_m: int, ops: "ScheduleOps"):
    """Units (cluster_m M-tiles) of an expert of ``rows`` rows in the ragged schedule:
    ceil(rows / (128 cluster_m)), 0 for an empty expert and for a negative count (decreasing
    offsets break the contract; the schedule must still end)."""
    unit = TILE_M * cluster_m
    return ops.max((rows + (unit - 1)) // unit, 0)


@cute.jit
def ragged_tile(mTable: cute.Tensor, mOffs: cute.Tensor, num_experts: Int32, m_rows: Int32,
                t: Int32, cluster_m: cutlass.Constexpr):
    """(expert, first row, end row) of ragged M-tile ``t`` (tile t % cluster_m of unit
    u = t // cluster_m): the expert e with table[e-1] <= u < table[e] (table[e]: units of
    experts 0..e), so rows [offs[e-1] + 128 (cluster_m (u - table[e-1]) + t % cluster_m),
    +128) clipped at min(offs[e], M) (none of them when the tile lies past it). Only called
    with u < table[L-1]. The clip at M (``m_rows``) keeps offsets past M, which break the
    contract and which the host cannot see, from steering the clipping D store past D."""
    u = t // cluster_m
    e = expert_of_row(mTable, num_experts, u)
    first_unit = Int32(0)
    start = Int32(0)
    if e > 0:
        first_unit = mTable[e - 1]
        start = mOffs[e - 1]
    return (e, start + ((u - first_unit) * cluster_m + t % cluster_m) * TILE_M,
            cutlass.min(mOffs[e], m_rows))


def ragged_schedule(offsets, cluster_m: int = 1, m_rows: int | None = None):
    """The ragged M-tiles of ``offsets`` (Python ints) as the kernel walks them: a list of
    (expert, first row, end row), tile t at index t (unit t // cluster_m); offsets are
    clipped at ``m_rows`` (M; default: no clip) as the table kernel clips them. The table
    the helper kernel writes is the running sum of ``ragged_units``; this model is what the
    CPU tests check the schedule's promises on (every row of every expert in exactly one
    tile, no tile starting in another expert, a unit's tiles one expert's)."""
    m_rows = max(offsets, default=0) if m_rows is None else m_rows
    tiles, start = [], 0
    for e, end in enumerate(offsets):
        end = min(end, m_rows)  # (start: the previous end, clipped already)
        for u in range(ragged_units(end - start, cluster_m, PY_OPS)):
            for h in range(cluster_m):
                tiles.append((e, start + (u * cluster_m + h) * TILE_M, end))
        start = end
    return tiles


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


def last_round_split(num_units, nclusters, k_tiles, max_split: int, max_slots: int,
                     ops: ScheduleOps):
    """How the persistent static schedule's last, partial round is spread over the clusters.

    Units u < full = (num_units // nclusters) * nclusters run whole, cluster c taking
    c, c + nclusters, ...: every cluster the same number. The rem = num_units - full units
    left would keep rem clusters busy for a whole tile while the others idle (dsv3 on the
    H200: 1,024 units over 66 clusters leave 34, so 64 of 132 CTAs end a tile early). Their
    rem * k_tiles k-tiles, laid end to end unit after unit, are cut into p contiguous ranges
    of equal length (to a k-tile), one per cluster 0..p-1 (``split_share``): stream-K over
    the last round. p = min(nclusters, rem * max_split), so a unit spans at most
    max_split + 1 ranges (max_split where p = rem * max_split); the caller bounds max_split
    by k_tiles, so every range holds a k-tile. Each cluster then holds at most one
    non-final part (its partial sums go to slot = its index), so p must not exceed the
    ``max_slots`` partial-sum slots. Nor is the round spread where the busiest range,
    ceil(rem * k_tiles / p) k-tiles, would be more than 3/4 of a unit (a gain under a
    quarter of a unit): a final part's hand-over (its wait and the slots it reads)
    lengthens its epilogue (measured: docs/kernels.md), and the non-final parts' stores
    cost bandwidth too. Where it is not spread, or
    where rem == 0, p = rem: one whole unit per cluster, no part handed over (the unsplit
    schedule).

    Returns (full, rem, p)."""
    full = (num_units // nclusters) * nclusters
    rem = num_units - full
    p = ops.select(rem * max_split < nclusters, rem * max_split, nclusters)
    busiest = (rem * k_tiles + p - 1) // ops.max(p, 1)
    return full, rem, ops.select((p <= max_slots) & (4 * busiest <= 3 * k_tiles), p, rem)


def split_share(cluster, num_units, full, rem, p, k_tiles, ops: ScheduleOps):
    """One cluster's range of the last round (``last_round_split``): k-tiles [lo, hi) of the
    rem * k_tiles laid end to end, lo = cluster * rem * k_tiles // p (clusters >= p have
    none). A range shorter than a unit (p > rem) lies in one unit or straddles two: then it
    is the tail of unit u0 = lo // k_tiles and the head of unit u0 + 1, and the cluster runs
    the head first (a non-final part: its sums go to slot ``cluster``) and the tail second
    (the final part of u0: it waits for the unit's other parts, adds them and runs the
    epilogue, ``split_waits``). A unit's other parts are the heads or middles of clusters of
    lower index, each its cluster's first last-round item, and a non-final part never
    waits: no cycle, no chain of waits, and no wait on a cluster that starts after it if
    clusters start in index order.

    Returns (pieces, lo, hi, u0, tail_start, epi_end): the last two bound the one
    last-round unit whose epilogue the cluster runs, its final part (empty, at num_units,
    if none)."""
    on = cluster < p
    w = rem * k_tiles
    p1 = ops.max(p, 1)
    lo = ops.select(on, cluster * w // p1, 0)
    hi = ops.select(on, (cluster + 1) * w // p1, 0)
    u0 = lo // k_tiles
    # (hi >= 1 where on: every range holds a k-tile; off it the max keeps u1 at 0)
    two = on & ((ops.max(hi, 1) - 1) // k_tiles > u0)
    pieces = ops.select(on, ops.select(two, 2, 1), 0)
    has_final = on & (two | (hi == (u0 + 1) * k_tiles))
    tail_start = ops.select(has_final, full + u0, num_units)
    epi_end = ops.select(has_final, full + u0 + 1, num_units)
    return pieces, lo, hi, u0, tail_start, epi_end


def split_piece(j, pieces, lo, hi, u0, k_tiles, ops: ScheduleOps):
    """Piece j of a cluster's range (``split_share``): (last-round unit r, first k-tile,
    end k-tile, final). With two pieces the first is the head of unit u0 + 1, the second
    the tail of u0; a single piece is final iff it ends with its unit."""
    head = (pieces == 2) & (j == 0)
    r = u0 + ops.select(head, 1, 0)
    kb = ops.select(head, 0, lo - u0 * k_tiles)
    ke = ops.select(head, hi - (u0 + 1) * k_tiles,
                    ops.select(hi - u0 * k_tiles < k_tiles, hi - u0 * k_tiles, k_tiles))
    return r, kb, ke, ke == k_tiles


def split_waits(cluster, r, rem, p, k_tiles, ops: ScheduleOps):
    """The final part of last-round unit r, run by ``cluster``: (first, count): the unit's
    non-final parts are those of clusters first .. cluster - 1 (the one holding the unit's
    first k-tile, r * k_tiles, is first = ((r * k_tiles + 1) * p - 1) // (rem * k_tiles)),
    in slots of the same numbers. count == 0: the unit is the cluster's alone. (The kernel
    evaluates this for every item, so rem may be 0 there: the max keeps it defined.)"""
    first = ((r * k_tiles + 1) * p - 1) // ops.max(rem * k_tiles, 1)
    return first, cluster - first


def split_item(i, cluster, nclusters, rounds, full, rem, p, pieces, lo, hi, u0, k_tiles,
               ops: ScheduleOps):
    """Item i of a cluster's walk, as its producer and math warps take it: (unit, first
    k-tile, end k-tile, final, handed, last-round unit r, first, count). Items below
    ``rounds`` are the whole units cluster + i * nclusters; then the cluster's last-round
    pieces (``split_piece``). ``handed``: the piece is a part of a split unit: non-final
    (ke < k_tiles: its sums go to slot ``cluster`` and it counts itself on unit r's flag),
    or final and waiting for the ``count`` parts in slots first, first + 1, ...
    (``split_waits``); a final part with count 0 holds its whole unit and hands nothing
    over."""
    tail = i >= rounds
    r, kb, ke, fin = split_piece(i - rounds, pieces, lo, hi, u0, k_tiles, ops)
    first, count = split_waits(cluster, r, rem, p, k_tiles, ops)
    unit = ops.select(tail, full + r, cluster + i * nclusters)
    kb = ops.select(tail, kb, 0)
    ke = ops.select(tail, ke, k_tiles)
    handed = tail & ((ke < k_tiles) | (count > 0))
    return unit, kb, ke, (i < rounds) | fin, handed, r, first, count


def next_epilogue_unit(unit, step, full, tail_start, ops: ScheduleOps):
    """The unit after ``unit`` in a cluster's walk of the units whose epilogue it runs:
    whole units ``step`` apart, then its last-round unit ``tail_start``."""
    whole = unit < full
    nxt = unit + ops.select(whole, step, 1)
    return ops.select(whole & (nxt >= full), tail_start, nxt)
