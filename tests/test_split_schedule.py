"""The cooperative kernel's split last round (knob split_last): the schedule functions the
kernel traces (``cudnn_ext.kernels.sm90.tile_walk``), evaluated on Python ints through
``tests/gpu/split_model``: on many unit, cluster and k-tile counts, every (unit, k-tile) is
computed exactly once; each unit has one final part, the one ending at the last k-tile;
every cluster runs its non-final parts first, and a final part waits only on pieces its own
cluster ran before it or on clusters of lower index, no later in their order than it is in
its own (what makes the waits deadlock-free and free of chains); every partial-sum slot has
one writer and stays within SPLIT_SLOTS; the C producers' and folder's walk is the math
warps' final items; and no cluster gets more work than without the split. The GPU test
checks the kernel writes the slots this model says."""
import os
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl not installed (tile_walk imports it)")

from split_model import SPLIT_SLOTS, epilogue_units, items, plan  # noqa: E402


@pytest.mark.parametrize("nclusters", [1, 7, 66, 132])
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 9, 112])
@pytest.mark.parametrize("max_split", [1, 2, 3, 4])
def test_split_schedule_promises(nclusters, k_tiles, max_split):
    p = nclusters
    counts = {0, 1, 2, 3, 5, p - 1, p, p + 1, p + 17, p + p // 2, 2 * p - 1, 2 * p + 1,
              3 * p - 1, 1024} | set(range(0, 3 * p + 2) if p < 10 else ())
    for num_units in sorted(c for c in counts if c >= 0):
        full, rem, s = plan(num_units, nclusters, k_tiles, max_split)
        assert full + rem == num_units and 0 <= rem < nclusters and 1 <= s <= max_split
        assert s <= k_tiles and rem * (s - 1) <= SPLIT_SLOTS and (s == 1 or rem <= SPLIT_SLOTS)
        covered = Counter()
        finals = Counter()
        slots = {}  # slot -> (cluster, position): one writer each
        final_at = {}  # last-round unit r -> (cluster, position) of its final part
        walks = {c: items(c, num_units, nclusters, k_tiles, max_split) for c in range(p)}
        for c, its in walks.items():
            seen_final = False
            for pos, (unit, kb, kcnt, final, r, slot) in enumerate(its):
                assert kcnt >= 1 and 0 <= kb and kb + kcnt <= k_tiles
                covered.update((unit, kt) for kt in range(kb, kb + kcnt))
                if final:
                    finals[unit] += 1
                    assert kb + kcnt == k_tiles  # the final part holds the last k-tiles
                    if r is not None:
                        final_at[r] = (c, pos)
                        seen_final = True
                else:
                    assert not seen_final  # non-final parts come first in every cluster
                    assert slot not in slots and 0 <= slot < rem * (s - 1) <= SPLIT_SLOTS
                    assert unit == full + r
                    # the final part (_split_hand_over) reads slots r * (s - 1) + p
                    assert slot // (s - 1) == r
                    slots[slot] = (c, pos)
            assert epilogue_units(c, num_units, nclusters, k_tiles, max_split) == [
                unit for unit, _, _, final, _, _ in its if final]
        assert covered == Counter({(u, kt): 1 for u in range(num_units)
                                   for kt in range(k_tiles)})
        assert finals == Counter({u: 1 for u in range(num_units)})
        assert len(slots) == rem * (s - 1)
        # a final part waits only on its own cluster's earlier pieces or on clusters of
        # lower index, at a position no later than its own (no cycle; no wait on a cluster
        # that starts after it; no chain of waits across clusters)
        for slot, (c, pos) in slots.items():
            fc, fpos = final_at[slot // (s - 1)]
            assert c < fc or (c == fc and pos < fpos), (num_units, slot)
            assert pos - len([u for u in range(c, full, nclusters)]) <= (
                fpos - len([u for u in range(fc, full, nclusters)]))
        # the busiest cluster runs ceil(rem * s / clusters) pieces, never more work than
        # whole units would give it
        busiest = max(sum(it[2] for it in its) for its in walks.values()) if walks else 0
        assert busiest <= -(-num_units // nclusters) * k_tiles
        tail = [len(its) - full // nclusters for its in walks.values()]
        assert not tail or max(tail) == -(-rem * s // nclusters)


def test_dsv3_last_round_on_the_h200():
    """dsv3 (1,024 units of 256 x 256) over the H200's 66 clusters: 34 units left, split in
    3, so the busiest cluster runs 15 whole tiles and 2 thirds instead of 16."""
    assert plan(1024, 66, 112, 3) == (990, 34, 3)
    work = max(sum(it[2] for it in items(c, 1024, 66, 112, 3)) for c in range(66))
    assert work == 15 * 112 + 37 + 38  # at most two parts (of 37, 37, 38 k-tiles)
    assert plan(1024, 66, 112, 4) == (990, 34, 3)  # 4 parts: 3 per cluster, 3/4 tile
