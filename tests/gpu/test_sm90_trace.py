"""The diagnostic trace build (Sm90TraceConfig, kernels/sm90/trace.py) on the GPU: the traced
kernel's results still match the float64 reference, and its stamps describe the launch: every tile the schedule
has is recorded exactly once, each tile's four stamps are in order and follow the
warpgroup's previous tile, and a second launch overwrites the first's stamps."""
import pytest
import torch
from sm90_cases import Case, make_pack, run_and_check, skip_unless_sm90

from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for

pytestmark = pytest.mark.gpu

CASES = [
    # ping-pong in 2-CTA clusters with 64-row C entries (the default shape of the knobs)
    (Case([2048, 256, 0, 4096, 1024, 512, 256, 2048], 768, 1416, "dswiglu", tile_n=128,
          cluster_m=2, c_split=2), False),
    # cooperative, an empty expert, an N tail
    (Case([0, 512, 256], 320, 264, "dgeglu", tile_n=256, cluster_m=2, cooperative=True), True),
]


def _knobs(case, trace):
    """The config fields of the case's trace build (``config_for``)."""
    return dict(tile_n=case.tile_n, cluster_m=case.cluster_m, cooperative=case.cooperative,
                c_split=case.c_split, trace=trace)


@pytest.mark.parametrize("case,coop", CASES, ids=lambda c: c.label() if isinstance(c, Case) else "")
def test_traced_kernel_matches_reference(case, coop):
    skip_unless_sm90()
    print(case.label(), run_and_check(case, knobs=_knobs(case, 64)))


@pytest.mark.parametrize("case,coop", CASES, ids=lambda c: c.label() if isinstance(c, Case) else "")
def test_trace_records_every_tile_in_order(case, coop):
    skip_unless_sm90()
    problem, pack = make_pack(case)
    plan = Sm90DgluEngine().build(problem, config_for(problem, **_knobs(case, 64)))
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream()
    plan.execute(pack, ws, stream)
    first = plan.read_trace(ws)
    plan.execute(pack, ws, stream)
    tr = plan.read_trace(ws)
    assert tr.shape[1:] == (2, 65, 4)
    m_tiles = sum(case.groups) // 128
    n_tiles = -(-case.n // case.tile_n)
    recorded = 0
    for blk in tr.tolist():
        for w in range(2):
            gt0, c0, gt1, c1 = blk[w][0]
            assert 0 < gt0 <= gt1 and 0 < c0 <= c1, (gt0, gt1, c0, c1)
            prev = c0
            tiles = [t for t in blk[w][1:] if t[3]]
            assert all(not any(t) for t in blk[w][1 + len(tiles):]), "stamps after the last tile"
            for s in tiles:
                assert prev <= s[0] <= s[1] <= s[2] <= s[3] <= c1, (prev, s, c1)
                prev = s[3]
            recorded += len(tiles)
    # ping-pong: each warpgroup its own tiles; cooperative: both stamp every CTA tile
    assert recorded == m_tiles * n_tiles * (2 if coop else 1)
    assert (tr[:, :, 0, :] != first[:, :, 0, :]).all(), "the second launch left stamps as they were"
