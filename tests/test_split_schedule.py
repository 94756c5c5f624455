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


@pytest.mark.parametrize("nclusters", [1, 7, 66, 132, 133])
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 9, 112])
@pytest.mark.parametrize("max_split", [1, 2, 3, 4])
def test_split_schedule_promises(nclusters, k_tiles, max_split):
    n = nclusters
    counts = {0, 1, 2, 3, 5, n - 1, n, n + 1, n + 17, n + n // 2, 2 * n - 1, 2 * n + 1,
              3 * n - 1, 1024} | set(range(0, 3 * n + 2) if n < 10 else ())
    for num_units in sorted(c for c in counts if c >= 0):
        full, rem, p = plan(num_units, nclusters, k_tiles, max_split)
        s = min(max_split, k_tiles)
        assert full + rem == num_units and 0 <= rem < nclusters and full % nclusters == 0
        # spread over min(clusters, rem * s) clusters where the slots hold them and the
        # busiest cluster's last round shrinks by a quarter of a unit at least, else not
        want = min(n, rem * s)
        assert p == (want if want <= SPLIT_SLOTS and 4 * rem <= 3 * want else rem)
        covered = Counter()
        finals = Counter()
        slots = {}  # slot -> (cluster, last-round position, unit): one writer each
        waits = {}  # last-round unit r -> (cluster, last-round position, first, count)
        walks = {c: items(c, num_units, nclusters, k_tiles, max_split) for c in range(n)}
        for c, its in walks.items():
            whole = len(range(c, full, nclusters))
            assert whole == full // nclusters
            seen_final = False
            for pos, (unit, kb, kcnt, final, r, slot, wait) in enumerate(its):
                assert kcnt >= 1 and 0 <= kb and kb + kcnt <= k_tiles
                covered.update((unit, kt) for kt in range(kb, kb + kcnt))
                if final:
                    finals[unit] += 1
                    assert kb + kcnt == k_tiles  # the final part holds the last k-tiles
                    if r is not None:
                        waits[r] = (c, pos - whole) + wait
                        seen_final = True
                else:
                    assert not seen_final  # non-final parts come first in every cluster
                    assert slot == c < SPLIT_SLOTS and slot not in slots
                    assert unit == full + r
                    slots[slot] = (c, pos - whole, r)
            assert epilogue_units(c, num_units, nclusters, k_tiles, max_split) == [
                unit for unit, _, _, final, _, _, _ in its if final]
        assert covered == Counter({(u, kt): 1 for u in range(num_units)
                                   for kt in range(k_tiles)})
        assert finals == Counter({u: 1 for u in range(num_units)})
        assert sorted(waits) == list(range(rem))
        for r, (fc, fpos, first, count) in waits.items():
            # the final part reads exactly its unit's non-final parts (slots first ..
            # first + count - 1) and waits for as many counts on the unit's flag
            assert sorted(sl for sl, (_, _, ur) in slots.items() if ur == r) == list(
                range(first, first + count))
            # a unit is cut into at most s + 1 parts (s where the ranges align with units)
            assert count <= s
            for sl in range(first, first + count):
                c, pos, _ = slots[sl]
                # it waits only on clusters of lower index, each at its first last-round
                # item, which waits on nothing (no cycle, no chain, no wait on a cluster
                # that starts after it if clusters start in index order)
                assert c < fc and pos == 0 and fpos <= 1
        # balanced: the clusters' last-round k-tiles differ by at most one, and no cluster
        # gets more work than without the split
        tail = [sum(it[2] for it in its[full // nclusters:]) for its in walks.values()]
        used = tail[:p]
        assert all(t == 0 for t in tail[p:])
        assert not used or max(used) - min(used) <= 1
        assert not used or max(used) == -(-rem * k_tiles // p) <= k_tiles


def test_dsv3_last_round_on_the_h200():
    """dsv3 (1,024 units of 256 x 256) over the H200's 66 clusters: 34 units left, their
    34 x 112 k-tiles spread over all 66 clusters, so the busiest cluster runs 15 whole
    tiles and 58 k-tiles instead of 16 tiles (a uniform 3-way split: 2 thirds, 75)."""
    assert plan(1024, 66, 112, 3) == (990, 34, 66)
    work = max(sum(it[2] for it in items(c, 1024, 66, 112, 3)) for c in range(66))
    assert work == 15 * 112 + 58
    # every unit cut into 2 or 3 parts, each final part reading 1 or 2 slots
    counts = Counter(it[6][1] for c in range(66) for it in items(c, 1024, 66, 112, 3)
                     if it[6] is not None)
    assert set(counts) == {1, 2} and sum(counts.values()) == 34
    assert plan(1024, 66, 112, 1) == (990, 34, 34)  # off: one unit per cluster
