"""The cooperative kernel's split last round (knob split_last): the schedule functions the
kernel traces (``cudnn_ext.kernels.sm90.tile_walk``), evaluated on Python ints through
``tests/support/split_model``: on many unit, cluster and k-tile counts, every (unit, k-tile) is
computed exactly once; each unit has one final part, the one ending at the last k-tile;
every cluster runs its non-final part first, and a final part waits only on clusters of
lower index, at their first last-round item, which waits on nothing (what makes the waits
deadlock-free and free of chains); every partial-sum slot has one writer and stays within
SPLIT_SLOTS; a final part waits for, and reads, exactly its unit's non-final parts, and the
parts the kernel hands over (``handed``) are exactly those; the C producers' and folder's
walk is the math warps' final items; the round is balanced, and spread only where that
shortens the busiest cluster's last round by a quarter of a unit at least. The GPU test
checks the kernel writes the slots this model says."""
from collections import Counter

import pytest


pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl not installed (tile_walk imports it)")

from split_model import SPLIT_SLOTS, epilogue_units, items, plan


@pytest.mark.parametrize("nclusters", [1, 7, 66, 132, 133])
@pytest.mark.parametrize("k_tiles", [1, 2, 3, 4, 9, 112])
@pytest.mark.parametrize("max_split", [1, 2, 3, 4])
def test_split_schedule_promises(nclusters, k_tiles, max_split):
    n = nclusters
    counts = {0, 1, 2, 3, 5, n - 1, n, n + 1, n + 17, n + n // 2, 2 * n - 1, 2 * n + 1,
              3 * n - 1, 1024} | set(range(0, 3 * n + 2) if n < 10 else ())
    for num_units in sorted(c for c in counts if c >= 0):
        full, rem, p = plan(num_units, nclusters, k_tiles, max_split)
        s = min(max_split, k_tiles)
        assert full + rem == num_units and 0 <= rem < nclusters and full % nclusters == 0
        assert p == rem or rem < p <= min(n, rem * s, SPLIT_SLOTS)
        covered = Counter()
        finals = Counter()
        slots = {}  # slot -> (cluster, last-round position, unit): one writer each
        waits = {}  # last-round unit r -> (cluster, last-round position, first, count)
        walks = {c: items(c, num_units, nclusters, k_tiles, max_split) for c in range(n)}
        rounds = full // nclusters
        for c, its in walks.items():
            assert [it.unit for it in its[:rounds]] == list(range(c, full, nclusters))
            seen_final = False
            for pos, it in enumerate(its):
                assert it.kcnt >= 1 and 0 <= it.kb and it.kb + it.kcnt <= k_tiles
                covered.update((it.unit, kt) for kt in range(it.kb, it.kb + it.kcnt))
                if pos < rounds:
                    assert it.final and not it.handed and it.kcnt == k_tiles
                    finals[it.unit] += 1
                    continue
                assert it.unit == full + it.r
                if it.final:
                    finals[it.unit] += 1
                    assert it.kb + it.kcnt == k_tiles  # the final part holds the last k-tiles
                    first, count = it.waits
                    # a final part hands over (waits, adds slots) iff its unit has others
                    assert it.handed == (count > 0)
                    assert count > 0 or (it.kb == 0 and p == rem)
                    waits[it.r] = (c, pos - rounds, first, count)
                    seen_final = True
                else:
                    assert it.handed  # a non-final part always hands its sums over
                    assert not seen_final  # non-final parts come first in every cluster
                    assert it.slot == c < SPLIT_SLOTS and it.slot not in slots
                    slots[it.slot] = (c, pos - rounds, it.r)
            assert epilogue_units(c, num_units, nclusters, k_tiles, max_split) == [
                it.unit for it in its if it.final]
        assert covered == Counter({(u, kt): 1 for u in range(num_units)
                                   for kt in range(k_tiles)})
        assert finals == Counter({u: 1 for u in range(num_units)})
        assert sorted(waits) == list(range(rem))
        for r, (fc, fpos, first, count) in waits.items():
            # the final part reads exactly its unit's non-final parts (slots first ..
            # first + count - 1) and waits for as many counts on the unit's flag
            assert sorted(sl for sl, (_, _, ur) in slots.items() if ur == r) == list(
                range(first, first + count))
            # a unit is cut into at most s + 1 parts
            assert count <= s
            for sl in range(first, first + count):
                c, pos, _ = slots[sl]
                # it waits only on clusters of lower index, each at its first last-round
                # item, which waits on nothing (no cycle, no chain, no wait on a cluster
                # that starts after it if clusters start in index order)
                assert c < fc and pos == 0 and fpos <= 1
        # balanced: the clusters' last-round k-tiles differ by at most one; spread only
        # where the busiest cluster's last round shrinks by a quarter of a unit at least
        tail = [sum(it.kcnt for it in its[rounds:]) for its in walks.values()]
        used = tail[:p]
        assert all(t == 0 for t in tail[p:])
        assert not used or max(used) - min(used) <= 1
        if p != rem:
            assert 4 * max(used) <= 3 * k_tiles
        elif rem and s > 1 and min(n, rem * s) <= SPLIT_SLOTS:
            # not spread: spreading over min(n, rem * s) clusters would not have gained it
            assert 4 * -(-rem * k_tiles // min(n, rem * s)) > 3 * k_tiles


def test_dsv3_last_round_on_the_h200():
    """dsv3 (1,024 units of 256 x 256) over the H200's 66 clusters: 34 units left, their
    34 x 112 k-tiles spread over all 66 clusters, so the busiest cluster runs 15 whole
    tiles and 58 k-tiles instead of 16 tiles (a uniform 3-way split: 2 thirds, 75)."""
    assert plan(1024, 66, 112, 3) == (990, 34, 66)
    work = max(sum(it.kcnt for it in items(c, 1024, 66, 112, 3)) for c in range(66))
    assert work == 15 * 112 + 58
    # every unit cut into 2 or 3 parts, each final part reading 1 or 2 slots
    counts = Counter(it.waits[1] for c in range(66) for it in items(c, 1024, 66, 112, 3)
                     if it.waits is not None)
    assert set(counts) == {1, 2} and sum(counts.values()) == 34
    assert plan(1024, 66, 112, 1) == (990, 34, 34)  # off: one unit per cluster
    # 60 units left of 66 clusters: ranges of 102 k-tiles would gain under a quarter unit
    assert plan(66 + 60, 66, 112, 3) == (66, 60, 60)
