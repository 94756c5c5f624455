"""Which output tiles a CTA owns, and which expert each belongs to (SM90 kernel).

Owns the persistent static schedule (tile t -> (m_tile, n_tile)) and the expert lookup from
``padded_offsets``. No memory traffic besides reading the offsets, no host policy.

Why a tile never straddles two experts: every offset is a multiple of 256 and a tile is 128
rows, so [row0, row0+128) lies inside one expert's range (vendor_facts 1.9). Only the
``offs[L-1] / 128`` M-tiles that hold rows are scheduled, so rows past the last offset cost
nothing and are never touched; empty experts own no rows and therefore no tiles.
"""
from __future__ import annotations

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


@cute.jit
def last_round_split(num_units: Int32, nclusters: Int32, max_split: cutlass.Constexpr,
                     max_slots: cutlass.Constexpr):
    """How the persistent static schedule's last, partial round is split along K.

    Units u < full = (num_units // nclusters) * nclusters run whole, cluster c taking
    c, c + nclusters, ...: every cluster the same number. The rem = num_units - full units
    left would keep rem clusters busy for a whole tile while the others idle (dsv3 on the
    H200: 1,024 units over 66 clusters leave 34, so 64 of 132 CTAs end a tile early).
    Splitting each of them into s K-parts makes rem * s pieces, spread over the clusters
    (the kernel's ``split_walk`` says which cluster runs which), so the busiest cluster runs
    ceil(rem * s / nclusters) pieces of 1/s tile instead of one tile. s is the one in
    [1, max_split] with the fewest such tile fractions (the smallest on ties), among those
    whose non-final pieces, rem * (s - 1), fit the ``max_slots`` partial-sum slots.

    Returns (full, rem, s); s == 1 when rem == 0 or no split helps."""
    full = (num_units // nclusters) * nclusters
    rem = num_units - full
    s = Int32(1)
    busiest = Int32(1)  # ceil(rem * s / nclusters) for the s kept (1 while rem <= nclusters)
    for c in cutlass.range_constexpr(2, max_split + 1):
        pieces = (rem * c + nclusters - 1) // nclusters
        # pieces / c < busiest / s, in integers
        better = (rem > 0) & (rem * (c - 1) <= max_slots) & (pieces * s < busiest * c)
        s = cutlass.select_(better, Int32(c), s)
        busiest = cutlass.select_(better, pieces, busiest)
    return full, rem, s
