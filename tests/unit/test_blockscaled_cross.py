"""The block-scaled cross (tests/support/blockscaled_cross.py) on the reference engine, on the
CPU: every format, major-ness, weight mode, activation and prob/dbias choice against the
float64 oracle of the dequantized operands. The same points run on ``sm90_blockscaled`` in
tests/gpu/test_sm90_blockscaled_cross.py."""
import pytest

import blockscaled_cross as X


@pytest.mark.parametrize("pt", X.points(), ids=lambda p: p.label())
def test_reference_engine_on_the_block_scaled_cross(pt):
    t = X.make(pt, "cpu")
    X.check(t, X.run(t, "reference"))


def test_the_cross_covers_every_axis():
    pts = X.points()
    assert {p.fmt for p in pts} == set(X.FORMATS)
    assert {(p.fmt, p.b_major) for p in pts if p.b_major == "n"} == {("mxfp8-e4m3", "n"), ("mxfp8-e5m2", "n")}
    assert {p.mode for p in pts} == {"dense", "discrete"} and {p.act for p in pts} == set(X.ACTS)
    assert len(pts) == 2 * 2 * 2 * 3 * 2 + 2 * 1 * 2 * 3 * 2
