"""The SM90 kernel's ragged schedule (offsets of any row, or aligned to 8-128 rows,
``Sm90Config.ragged_m``):
the model the kernel's table and tile lookup follow (``tile_walk.ragged_schedule``,
``ragged_units``), on random and edge-case offsets: every row of every expert lies in exactly
one tile of its own expert, a tile starts inside its expert (a cluster pair's second tile
possibly wholly past its end, the pair one expert's), and the unit count is the running sum
the helper kernel writes. The GPU tests check the kernel against
the float64 reference on such offsets (tests/gpu/test_sm90_correctness.py)."""
import random

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl not installed (tile_walk imports it)")

from cudnn_ext.kernels.sm90.config import TILE_M, Sm90Config  # noqa: E402
from cudnn_ext.kernels.sm90.tile_walk import PY_OPS, ragged_schedule, ragged_units  # noqa: E402


def _offsets(groups):
    out, s = [], 0
    for g in groups:
        s += g
        out.append(s)
    return out


def _cases():
    rng = random.Random(7)
    yield [8]
    yield [0, 0, 8, 0]
    yield [120, 128, 136, 256, 264]
    yield [8] * 128
    yield [1]
    yield [0, 1, 0, 1, 127, 129, 255, 257, 0]
    yield [1] * 128
    for _ in range(200):
        L = rng.randint(1, 40)
        yield [8 * rng.choice([0, 1, 15, 16, 17, rng.randint(0, 300)]) for _ in range(L)]
    for _ in range(200):  # groups of any size (m_aligned 1)
        L = rng.randint(1, 40)
        yield [rng.choice([0, 1, 127, 128, 129, rng.randint(0, 2000)]) for _ in range(L)]


@pytest.mark.parametrize("cluster_m", [1, 2])
@pytest.mark.parametrize("groups", list(_cases()), ids=lambda g: f"L{len(g)}-M{sum(g)}")
def test_every_row_in_one_tile_of_its_expert(groups, cluster_m):
    offs = _offsets(groups)
    tiles = ragged_schedule(offs, cluster_m)
    # the helper kernel's table: the running sum of each expert's units
    table = _offsets([ragged_units(g, cluster_m, PY_OPS) for g in groups])
    assert len(tiles) == (table[-1] if table else 0) * cluster_m
    owner = {}
    for t, (e, row0, end) in enumerate(tiles):
        start = offs[e - 1] if e else 0
        assert end == offs[e] and row0 >= start, (t, e, row0, end)
        # only a pair's second tile may start past the end (an empty tile)
        assert row0 < end or (t % cluster_m and row0 - TILE_M < end), (t, e, row0, end)
        assert (row0 - start) % TILE_M == 0
        # the unit's expert by the table: the first e with table[e] > t // cluster_m
        assert e == next(i for i, c in enumerate(table) if c > t // cluster_m)
        assert tiles[t - t % cluster_m][0] == e  # a unit's tiles: one expert's
        for r in range(row0, min(row0 + TILE_M, end)):
            assert r not in owner, (r, owner.get(r), t)
            owner[r] = e
    want = {r: e for e, (lo, hi) in enumerate(zip([0] + offs[:-1], offs)) for r in range(lo, hi)}
    assert owner == want


@pytest.mark.parametrize("cluster_m", [1, 2])
@pytest.mark.parametrize("offs,m_rows", [([264, 520], 264), ([64, 400, 800], 136),
                                         ([0, 1024], 8), ([512], 512)])
def test_offsets_past_m_clip_at_m(offs, m_rows, cluster_m):
    """Offsets past M break the contract and only the device reads them: the table kernel
    and the tile lookup clip them at M, so no tile starts at or writes a row past M."""
    tiles = ragged_schedule(offs, cluster_m, m_rows)
    rows = set()
    for t, (e, row0, end) in enumerate(tiles):
        assert end <= m_rows and (row0 < end or t % cluster_m), (t, e, row0, end)
        rows.update(range(row0, min(row0 + TILE_M, end)))
    assert rows == set(range(m_rows))


def test_ragged_units():
    assert [ragged_units(r, 1, PY_OPS) for r in (0, 1, 8, 120, 128, 129, 136, 256, -8)] == \
        [0, 1, 1, 1, 1, 2, 2, 2, 0]
    assert [ragged_units(r, 2, PY_OPS) for r in (0, 8, 256, 264, 512, -8)] == [0, 1, 1, 2, 2, 0]


def test_ragged_config_rules_and_scratch():
    base = dict(n=768, k=2048, ab_dtype="bf16", c_dtype="bf16", d_dtype="bf16",
                act_func="dswiglu", generate_dbias=True, ragged_m=True)
    Sm90Config(**base).check()
    Sm90Config(**base, cluster_m=2, cluster_n=2).check()
    for extra in ({}, dict(cooperative=True, tile_n=256, split_last=3)):
        cfg = Sm90Config(**{**base, **extra})
        L = 13
        flat = Sm90Config(**{**base, **extra, "ragged_m": False})
        # the table follows everything else in the scratch, 128-byte aligned, L int32
        off = cfg.ragged_table_offset(L)
        assert off % 32 == 0 and off >= flat.scratch_ws_elems(L)
        assert cfg.scratch_ws_elems(L) == off + L
        assert cfg.zeroed_ws_elems(L) == flat.zeroed_ws_elems(L)
