"""benchmarks/trace_one.py's analysis on the CPU, on hand-made stamps whose answer is known:
the mainloops of a CTA's two warpgroups are ordered by their ends, a mainloop starts at the
later of its turn stamp and the previous mainloop's end, a gap is a turn stamp later than
that end, and the CTA's last epilogue is the one that runs alone."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import trace_one  # noqa: E402


def _trace(tiles_wg0, tiles_wg1, end=(1000, 1000)):
    """One CTA: per warpgroup a list of (loop top, turn, mainloop end, epilogue end)."""
    tr = torch.zeros(1, 2, trace_one.MAX_TILES + 1, 4, dtype=torch.int64)
    for w, tiles in enumerate((tiles_wg0, tiles_wg1)):
        tr[0, w, 0] = torch.tensor([5000, 100, 5000 + end[w] - 100, end[w]])
        for t, s in enumerate(tiles, start=1):
            tr[0, w, t] = torch.tensor(s)
    return tr


def test_ping_pong_timeline():
    # by mainloop end: wg0 [110, 300], wg1 to 500 (waits in its first k-tile until 300),
    # wg0 to 700 (turn at 411 < 500), wg1 to 850 (turn at 621 < 700): mainloops of 200,
    # 200, 150 after the first, no gap; epilogues 100, 100, 80 next to a mainloop and wg1's
    # last (850 -> 990) alone; the CTA ends at 1000
    tr = _trace([(105, 110, 300, 400), (410, 411, 700, 780)],
                [(106, 107, 500, 600), (620, 621, 850, 990)], end=(800, 1000))
    out = trace_one.analyse(tr)
    assert out["tiles_per_cta"] == [4, 4, 4]
    assert out["mainloop_eff"][0] == 200
    assert out["gap_per_cta"] == 0
    assert out["epilogue_steady"][0] == 100
    assert out["epilogue_alone"] == 140
    assert out["tail"] == 150 and out["cta_span"] == [900, 900, 900]


def test_gap_when_the_epilogue_outlasts_the_other_mainloop():
    # by mainloop end: wg0 to 200, wg1 to 400, then wg0's second tile, whose epilogue of its
    # first tile ran until 490: its turn stamp (500) comes 100 cycles after wg1's mainloop
    # ended; effective mainloops 200 (wg1) and 150 (wg0, 500 -> 650)
    tr = _trace([(101, 102, 200, 490), (495, 500, 650, 700)],
                [(103, 104, 400, 470)], end=(800, 900))
    out = trace_one.analyse(tr)
    assert out["gap_per_cta"] == 100
    assert out["mainloop_eff"][0] == 175  # the median of 200 and 150


def test_cooperative_reads_one_warpgroup():
    # both warpgroups stamp the same tiles: warpgroup 0's alone; the gap is the exposed epilogue
    tr = _trace([(101, 102, 300, 400), (401, 402, 600, 700)], [(0, 0, 0, 0)], end=(800, 800))
    out = trace_one.analyse(tr, coop=True)
    assert out["tiles_per_cta"] == [2, 2, 2]
    assert out["gap_per_cta"] == 402 - 300
    assert out["epilogue_alone"] == 100


def test_analyse_skips_ctas_without_stamps():
    tr = torch.cat([_trace([(101, 102, 300, 400)], [(103, 104, 500, 600)]),
                    torch.zeros(1, 2, trace_one.MAX_TILES + 1, 4, dtype=torch.int64)])
    assert trace_one.analyse(tr)["tiles_per_cta"] == [2, 2, 2]


def test_a_cta_without_tiles_and_a_full_trace():
    # a CTA of the grid that ran no unit is skipped; a warpgroup that filled every slot
    # marks the result truncated
    empty = _trace([], [])
    full = _trace([(10 * t, 10 * t + 1, 10 * t + 5, 10 * t + 9)
                   for t in range(1, trace_one.MAX_TILES + 1)], [])
    out = trace_one.analyse(torch.cat([_trace([(101, 102, 300, 400)], []), empty]))
    assert out["tiles_per_cta"] == [0, 0.5, 1] and not out["truncated"]
    assert trace_one.analyse(full)["truncated"]
