"""What the SM90 cooperative kernel's split last round (knob ``split_last``) does, in plain
Python, for the tests: the CPU test checks the schedule's promises on many unit and cluster
counts; the GPU test asks it which partial-sum slots a launch must have written.

It restates ``cudnn_ext.kernels.sm90.tile_walk.last_round_split`` and the kernel's
``split_walk`` / ``split_item`` / ``next_epi_unit`` walks (device code, which plain Python
cannot run): a change to either side that the other does not follow fails the GPU test's
slot check.
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


def _walk(cluster, num_units, nclusters, k_tiles, max_split):
    """(full, s, pieces, has_final, final_r, first_nf), as the kernel's split_walk."""
    full, rem, s = last_round_split(num_units, nclusters, min(max_split, k_tiles))
    total = rem * s
    a, b = divmod(total, nclusters)
    pieces = a + (cluster >= nclusters - b)
    has_final = cluster >= nclusters - rem
    first_nf = (cluster * a + max(cluster - (nclusters - b), 0)
                - max(cluster - (nclusters - rem), 0))
    return full, s, pieces, has_final, cluster - (nclusters - rem), first_nf


def items(cluster: int, num_units: int, nclusters: int, k_tiles: int, max_split: int):
    """The cluster's items in order: (unit, first k-tile, k-tiles, final, last-round unit r
    or None, slot of a non-final part or None), as the kernel's split_item."""
    full, s, pieces, has_final, final_r, first_nf = _walk(cluster, num_units, nclusters,
                                                          k_tiles, max_split)
    out = [(u, 0, k_tiles, True, None, None) for u in range(cluster, full, nclusters)]
    for j in range(pieces):
        if has_final and j == pieces - 1:
            r, part, slot = final_r, s - 1, None
        else:
            slot = first_nf + j
            r, part = divmod(slot, s - 1)
        kb, ke = part * k_tiles // s, (part + 1) * k_tiles // s
        out.append((full + r, kb, ke - kb, slot is None, r, slot))
    return out


def epilogue_units(cluster: int, num_units: int, nclusters: int, k_tiles: int,
                   max_split: int):
    """The units whose epilogue the cluster runs, as its C producers and folder walk them
    (first_epi_unit / next_epi_unit / epi_end)."""
    full, s, pieces, has_final, final_r, _ = _walk(cluster, num_units, nclusters, k_tiles,
                                                   max_split)
    tail_start = full + final_r if has_final else num_units
    end = tail_start + 1 if has_final else num_units
    unit = cluster if cluster < full else tail_start
    out = []
    while unit < end:
        out.append(unit)
        whole = unit < full
        nxt = unit + (nclusters if whole else 1)
        unit = tail_start if whole and nxt >= full else nxt
    return out
