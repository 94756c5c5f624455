"""Which output tile a CTA owns, and which expert that tile belongs to (SM90 kernel).

Owns the mapping block index -> (m_tile, n_tile) and the expert lookup from
``padded_offsets``. No memory traffic besides reading the offsets, no host policy.

Why a tile never straddles two experts: every offset is a multiple of 256 and a CTA tile is
128 rows, so the 128-row window [row0, row0+128) lies inside one expert's range
(vendor_facts 1.9). Tiles at or past ``offs[L-1]`` do nothing.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def grouped_raster(bid: Int32, num_m_tiles: Int32, num_n_tiles: cutlass.Constexpr,
                   group_m: cutlass.Constexpr):
    """Map a linear block id to (m_tile, n_tile), walking ``group_m`` M-tiles at a time.

    Inside a group the M index runs fastest, so the CTAs resident at once share a few
    128-row slabs of A (read once from DRAM, then from L2) and sweep B's N-tiles together
    (each B tile is fetched from DRAM once per group instead of once per M-tile).
    """
    tiles_per_group = group_m * num_n_tiles
    gid = bid // tiles_per_group
    first_m = gid * group_m
    gsize = cutlass.min(num_m_tiles - first_m, group_m)
    local = bid - gid * tiles_per_group
    m_tile = first_m + local % gsize
    n_tile = local // gsize
    return m_tile, n_tile


@cute.jit
def expert_of_row(offs: cute.Tensor, num_experts: Int32, row0: Int32) -> Int32:
    """Index e of the expert whose rows [offs[e-1], offs[e]) contain ``row0``.

    Counts the ends at or before ``row0``; empty experts (offs[e] == offs[e-1]) are skipped
    naturally. Only called for row0 < offs[L-1], so the result is < L.
    """
    e = Int32(0)
    for i in range(num_experts):
        if offs[i] <= row0:
            e = e + Int32(1)
    return e
