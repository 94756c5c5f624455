"""EXPERIMENT (exp/coop-fold): the cooperative kernel with the folder warp flushing the
dbias sums (knob fold_flush) against the float64 reference: cooperative cases with dbias
(N < tile, empty experts, signed beta, N tails, L = 128, fp16, N-major B, 2x2 clusters, a
many-tile walk), the contract and the fresh-outputs variants, D poisoned as in every case."""
import pytest

from cudnn_ext.engines.base import Knobs
from cudnn_ext.engines.sm90 import RASTER_GROUP_M

from sm90_cases import cooperative_cases, run_and_check, skip_unless_sm90


def _knobs(case):
    return Knobs.of(tile_n=case.tile_n, cluster_m=case.cluster_m, cluster_n=case.cluster_n,
                    raster_group_m=case.raster_group_m or RASTER_GROUP_M[case.cluster_m],
                    cooperative=True, fold_flush=True,
                    **({"c_stages": case.c_stages} if case.c_stages else {}))


CASES = [c for i, c in enumerate(cooperative_cases()) if i in (0, 1, 2, 3, 4, 7, 9, 10, 12)]


@pytest.mark.gpu
@pytest.mark.parametrize("fresh", [False, True], ids=["contract", "fresh"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label())
def test_fold_flush_matches_reference(case, fresh):
    skip_unless_sm90()
    assert case.dbias and case.cooperative
    print(case.label(), run_and_check(case, knobs=_knobs(case), fresh=fresh))
