"""The cooperative kernel's split last round (knob split_last), as ``tests/gpu/split_model``
states it: on many unit, cluster and k-tile counts, every (unit, k-tile) is computed exactly
once; each unit has one final part, the one ending at the last k-tile; a final part waits
only on pieces its own cluster ran before it or on clusters of lower index (what makes the
waits deadlock-free); every partial-sum slot has one writer and stays within SPLIT_SLOTS; the C
producers' and folder's walk is the math warps' final items; and no cluster gets more work
than without the split. The GPU test checks the kernel writes the slots this model says."""
import os
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))

from split_model import SPLIT_SLOTS, epilogue_units, items, last_round_split  # noqa: E402


@pytest.mark.parametrize("nclusters", [1, 7, 66, 132])
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 9, 112])
@pytest.mark.parametrize("max_split", [1, 2, 3, 4])
def test_split_schedule_promises(nclusters, k_tiles, max_split):
    p = nclusters
    counts = {0, 1, 2, 3, 5, p - 1, p, p + 1, p + 17, p + p // 2, 2 * p - 1, 2 * p + 1,
              3 * p - 1, 1024} | set(range(0, 3 * p + 2) if p < 10 else ())
    for num_units in sorted(c for c in counts if c >= 0):
        full, rem, s = last_round_split(num_units, nclusters, min(max_split, k_tiles))
        assert full + rem == num_units and 0 <= rem < nclusters and 1 <= s <= max_split
        assert s <= k_tiles and rem * (s - 1) <= SPLIT_SLOTS and (s == 1 or rem <= SPLIT_SLOTS)
        covered = Counter()
        finals = Counter()
        slots = Counter()
        where = {}  # piece q -> (cluster, position in its items)
        walks = {c: items(c, num_units, nclusters, k_tiles, max_split) for c in range(p)}
        for c, its in walks.items():
            for pos, (unit, kb, kcnt, final, q, slot) in enumerate(its):
                assert kcnt >= 1 and 0 <= kb and kb + kcnt <= k_tiles
                covered.update((unit, kt) for kt in range(kb, kb + kcnt))
                if q is not None:
                    where[q] = (c, pos)
                if final:
                    finals[unit] += 1
                    assert kb + kcnt == k_tiles  # the final part holds the last k-tiles
                else:
                    slots[slot] += 1
                    assert 0 <= slot < rem * (s - 1) <= SPLIT_SLOTS  # its slot exists
            assert epilogue_units(c, num_units, nclusters, k_tiles, max_split) == [
                unit for unit, _, _, final, _, _ in its if final]
        assert covered == Counter({(u, kt): 1 for u in range(num_units)
                                   for kt in range(k_tiles)})
        assert finals == Counter({u: 1 for u in range(num_units)})
        assert all(n == 1 for n in slots.values())  # one writer per slot
        # a final part waits only on pieces of its own cluster run before it, or of a
        # cluster of lower index (which never waits on a higher one): no cycle, and no wait
        # on a cluster that starts after it
        for q, (c, pos) in where.items():
            if q % s == s - 1:
                for dep in range(q - (s - 1), q):
                    dc, dpos = where[dep]
                    assert dc < c or (dc == c and dpos < pos), (num_units, q, dep)
        # the busiest cluster's work never exceeds what whole units give it
        busiest = max(sum(it[2] for it in its) for its in walks.values()) if walks else 0
        assert busiest <= -(-num_units // nclusters) * k_tiles


def test_dsv3_last_round_on_the_h200():
    """dsv3 (1,024 units of 256 x 256) over the H200's 66 clusters: 34 units left, split in
    3, so the busiest cluster runs 15 whole tiles and 2 thirds instead of 16."""
    assert last_round_split(1024, 66, 3) == (990, 34, 3)
    work = max(sum(it[2] for it in items(c, 1024, 66, 112, 3)) for c in range(66))
    assert work == 15 * 112 + 37 + 38  # at most two parts (of 37, 37, 38 k-tiles)
    assert last_round_split(1024, 66, 4) == (990, 34, 3)  # 4 parts: 3 per cluster, 3/4 tile
