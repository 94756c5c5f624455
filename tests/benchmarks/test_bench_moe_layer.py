"""benchmarks/bench_moe_layer.py's --smoke run: every row builds and runs on the CPU, and the
result file has the documented form. Times on the CPU mean nothing and are not checked."""
import json

import pytest

pytest.importorskip("torchtitan.models.common.moe", reason="needs torchtitan (pip install '.[titan]')")

import bench_moe_layer  # noqa: E402


@pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")
def test_smoke_run_times_every_row(tmp_path):
    out = tmp_path / "moe-layer-cpu.json"
    bench_moe_layer.main(["--smoke", "--reps", "1", "--warmup", "1", "--rounds", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and "bench_moe_layer.py --smoke" in doc["command"]
    rows = doc["rows"]
    assert [r["impl"] for r in rows] == list(bench_moe_layer.IMPLS)
    for r in rows:
        assert r["shape"] == "smoke" and r["ms"] > 0 and "error" not in r, r


def test_skew8_groups_are_8_aligned_and_not_all_256_aligned():
    L, per, _, _ = bench_moe_layer.SHAPES["skew8"]
    sizes = bench_moe_layer.group_sizes("skew8", L, per)
    assert len(sizes) == L and all(s % 8 == 0 for s in sizes)
    assert sizes[7] == 0 and any(s % 256 for s in sizes)


def test_skew1_groups_are_skews_draw_at_any_row_count():
    """skew1: the same Pareto draw as skew8 (same empty experts, sizes within 8 rows of
    skew8's), at any row count: most groups are not multiples of 8."""
    L, per, _, _ = bench_moe_layer.SHAPES["skew1"]
    sizes = bench_moe_layer.group_sizes("skew1", L, per)
    eights = bench_moe_layer.group_sizes("skew8", L, per)
    assert len(sizes) == L and sizes[7] == 0
    assert all(0 <= e - s < 8 for s, e in zip(sizes, eights))
    assert sum(s % 8 != 0 for s in sizes) > L // 2
