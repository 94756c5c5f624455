"""The cooperative kernel's split last round (knob split_last), as ``tests/gpu/split_model``
states it: on many unit, cluster and k-tile counts, every (unit, k-tile) is computed exactly
once; each unit has one final part, the one ending at the last k-tile; every cluster runs
its non-final parts before any final one (what makes the final parts' waits deadlock-free
with all CTAs resident); the partial-sum slots and flags stay within SPLIT_SLOTS; the C
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
        assert s <= k_tiles and rem * (s - 1) <= SPLIT_SLOTS
        covered = Counter()
        finals = Counter()
        busiest = 0.0
        for c in range(nclusters):
            its = items(c, num_units, nclusters, k_tiles, max_split)
            for unit, kb, kcnt, final, q in its:
                assert kcnt >= 1 and 0 <= kb and kb + kcnt <= k_tiles
                covered.update((unit, kt) for kt in range(kb, kb + kcnt))
                if final:
                    finals[unit] += 1
                    assert kb + kcnt == k_tiles  # the final part holds the last k-tiles
                else:
                    assert q < rem * (s - 1) <= SPLIT_SLOTS  # its slot exists
            kinds = [final for *_, final, q in its if q is not None]
            assert kinds == sorted(kinds)  # non-final parts (False) first
            assert epilogue_units(c, num_units, nclusters, k_tiles, max_split) == [
                unit for unit, _, _, final, _ in its if final]
            busiest = max(busiest, sum(kcnt for _, _, kcnt, _, _ in its) / k_tiles)
        assert covered == Counter({(u, kt): 1 for u in range(num_units)
                                   for kt in range(k_tiles)})
        assert finals == Counter({u: 1 for u in range(num_units)})
        assert all(r < SPLIT_SLOTS for r in range(rem)) or s == 1
        # never more work for the busiest cluster than whole units give it
        assert busiest <= -(-num_units // nclusters) + 1e-9


def test_dsv3_last_round_on_the_h200():
    """dsv3 (1,024 units of 256 x 256) over the H200's 66 clusters: 34 units left, split in
    3, so the busiest cluster runs 15 whole tiles and 2 thirds instead of 16."""
    assert last_round_split(1024, 66, 3) == (990, 34, 3)
    work = max(sum(kcnt for *_, kcnt, _, _ in items(c, 1024, 66, 112, 3)) for c in range(66))
    assert work == 15 * 112 + 2 * 37 + 1  # parts of 37, 37, 38 k-tiles
    assert last_round_split(1024, 66, 4) == (990, 34, 3)  # 4 parts: 3 per cluster, 3/4 tile
