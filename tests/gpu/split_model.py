"""What the SM90 cooperative kernel's split last round (knob ``split_last``) does, in plain
Python, for the tests: the CPU test checks the schedule's promises on many unit and cluster
counts; the GPU test asks it which partial-sum slots a launch must have written.

It restates ``cudnn_ext.kernels.sm90.tile_walk.last_round_split`` and the kernel's
``split_item`` / ``next_epi_unit`` walks (device code, which plain Python cannot run): a
change to either side that the other does not follow fails the GPU test's slot check.
"""
from __future__ import annotations

SPLIT_SLOTS = 132


def last_round_split(num_units: int, nclusters: int, max_split: int, slots: int = SPLIT_SLOTS):
    """(full, rem, s), as tile_walk.last_round_split."""
    full = num_units // nclusters * nclusters
    rem = num_units - full
    s, busiest = 1, 1
    for c in range(2, max_split + 1):
        pieces = -(-rem * c // nclusters)
        if rem > 0 and rem * (c - 1) <= slots and pieces * s < busiest * c:
            s, busiest = c, pieces
    return full, rem, s


def items(cluster: int, num_units: int, nclusters: int, k_tiles: int, max_split: int):
    """The cluster's items in order: (unit, first k-tile, k-tiles, final, piece q or None)."""
    full, rem, s = last_round_split(num_units, nclusters, min(max_split, k_tiles))
    out = [(u, 0, k_tiles, True, None) for u in range(cluster, full, nclusters)]
    for q in range(cluster, rem * s, nclusters):
        part, r = divmod(q, rem)
        kb, ke = part * k_tiles // s, (part + 1) * k_tiles // s
        out.append((full + r, kb, ke - kb, part == s - 1, q))
    return out


def epilogue_units(cluster: int, num_units: int, nclusters: int, k_tiles: int,
                   max_split: int):
    """The units whose epilogue the cluster runs, as its C producers and folder walk them
    (first_epi_unit / next_epi_unit)."""
    full, rem, s = last_round_split(num_units, nclusters, min(max_split, k_tiles))
    lo = rem * (s - 1)
    q0 = cluster + nclusters * (-(-max(lo - cluster, 0) // nclusters))
    tail_start = full + q0 - lo
    unit = cluster if cluster < full else tail_start
    out = []
    while unit < num_units:
        out.append(unit)
        nxt = unit + nclusters
        unit = tail_start if unit < full <= nxt else nxt
    return out
