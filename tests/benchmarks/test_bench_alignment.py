"""benchmarks/bench_alignment.py's group sizes (CPU): multiples of 8 (or of 1) and never of 256
except empty groups (every 8th of skew's), so the rows it times differ in their padding."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
bench_alignment = pytest.importorskip("bench_alignment")
from bench_dglu import SHAPES  # noqa: E402


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_group_sizes_are_8_aligned_and_not_256_aligned(name):
    L, rows, _, _ = SHAPES[name]
    sizes = bench_alignment.group_sizes(name, L, rows)
    assert len(sizes) == L and all(s % 8 == 0 for s in sizes)
    assert all(s % 256 for s in sizes if s)
    assert (0 in sizes) == name.startswith("skew")
    assert sizes == bench_alignment.group_sizes(name, L, rows)  # seeded


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_any_size_groups_are_not_8_or_256_aligned(name):
    L, rows, _, _ = SHAPES[name]
    sizes = bench_alignment.group_sizes(name, L, rows, gran=1)
    assert len(sizes) == L and all(s % 256 for s in sizes if s)
    assert sum(s % 8 != 0 for s in sizes if s) > len([s for s in sizes if s]) // 2
    assert (0 in sizes) == name.startswith("skew")
