"""compute-sanitizer on the small cases of the SM90 kernel, of the block-scaled path and of
the fp8_blockwise recipe (``pytest -m gpu``; skipped without a GPU or without
``compute-sanitizer`` on PATH).

racecheck watches the shared-memory hand-offs between warps: the ping-pong dbias sums that
the math warps write into a C stage's slice and the C producer warp reads, across many tiles
(``walk``, ``chalf``), in 2-CTA clusters (``cluster``, ``discretecl``) and the cooperative
schedule's per-block dbias slot, which the folder warp reads (``coop``); every lane of the C
producer arrives on the full barrier, without which racecheck reports hazards on the
ping-pong walks (tests/support/racecheck_probe.py). memcheck checks the same walks for
out-of-bounds and misaligned accesses. synccheck checks the barriers, among them the
hand-overs to the dbias folder warp on the walks and the cooperative schedule (a fold on a
named barrier blocked at two instructions stopped the kernel under synccheck). Each run
also checks the results against the float64 reference (``sanitize_sm90.py`` raises
otherwise), so a clean report of a wrong kernel fails too.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from sm90_cases import skip_unless_sm90

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUPPORT = os.path.join(ROOT, "tests", "support")


def _sanitize(tool: str, mode: str, script: str = "sanitize_sm90.py") -> str:
    skip_unless_sm90()
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not on PATH")
    # the child imports this checkout's cudnn_ext and the test helpers, as this process does
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, SUPPORT, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run(
        [exe, "--report-api-errors", "no", "--tool", tool, sys.executable,
         os.path.join(SUPPORT, script), mode],
        capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{tool} {mode}: exit {proc.returncode}\n{out[-4000:]}"
    return out


def _assert_clean(tool: str, mode: str, out: str) -> None:
    """racecheck: no hazard displayed; memcheck / synccheck: no error."""
    pattern = (r"RACECHECK SUMMARY: (\d+) hazards displayed" if tool == "racecheck"
               else r"ERROR SUMMARY: (\d+) errors?")
    summary = re.search(pattern, out)
    assert summary, f"{tool} {mode}: no summary line\n{out[-4000:]}"
    assert summary.group(1) == "0", f"{tool} {mode}:\n{out[-4000:]}"


@pytest.mark.parametrize("mode", ["walk", "chalf", "cluster", "discretecl", "coop", "coop4",
                                  "split"])
def test_racecheck_reports_no_hazard(mode):
    out = _sanitize("racecheck", mode)
    summary = re.search(
        r"RACECHECK SUMMARY: (\d+) hazards displayed \((\d+) errors, (\d+) warnings\)", out)
    assert summary, f"racecheck {mode}: no summary line\n{out[-4000:]}"
    assert summary.groups() == ("0", "0", "0"), f"racecheck {mode}:\n{out[-4000:]}"


@pytest.mark.parametrize("mode", ["coop", "coop4", "walk", "chalf", "cluster", "discretecl",
                                  "split"])
def test_synccheck_reports_no_error_on_the_folder_hand_overs(mode):
    """The hand-overs to the dbias folder warp (``HandOver``). ``coop``: per block the math
    warps wait on the slot's "empty" mbarrier, which the folder warp arrives on, and arrive
    on its "full" one, which the folder waits on. ``walk``/``chalf`` (ping-pong): per tile
    the C producer warp hands its warpgroup's sums over the same way (not one named barrier
    both block on from two instructions, which synccheck reports as divergent threads and
    stops the kernel on). ``cluster``/``discretecl``:
    the same fold in 2-CTA clusters, dense and per-expert weights."""
    _assert_clean("synccheck", mode, _sanitize("synccheck", mode))


@pytest.mark.parametrize("mode", ["walk", "chalf", "split"])
def test_memcheck_reports_no_error(mode):
    _assert_clean("memcheck", mode, _sanitize("memcheck", mode))


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
@pytest.mark.parametrize("mode", ["dense", "discrete", "reference", "mxfp8"])
def test_blockscaled_kernels_sanitize_clean(tool, mode):
    """The block-scaled path's own kernels on a small case (``sanitize_blockscaled.py``):
    the dequantizer (dense and pointer-table forms) before the sm90 kernel with amax, the
    reference engine's device pointer gather, and MXFP8's quantizing epilogue (per-expert
    SFD_col). memcheck: no out-of-bounds or misaligned access; racecheck: no shared-memory
    hazard (the amax warp reduction, the kernel's hand-offs, the D_col amax exchange)."""
    _assert_clean(tool, mode, _sanitize(tool, mode, "sanitize_blockscaled.py"))


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
@pytest.mark.parametrize("mode", ["coop", "ragged", "pp64", "stagger", "quant"])
def test_fp8_blockwise_kernels_sanitize_clean(tool, mode):
    """The fp8_blockwise recipe's kernels on small cases (``sanitize_fp8_blockwise.py``): the
    e4m3 mainloop in its cooperative form (several tiles per cluster), the ragged schedule
    with the activation output, the ping-pong 128 x 64 form, and the blockwise quantizer.
    memcheck: no out-of-bounds or misaligned access (the scale loads at the last row and
    k-tile); racecheck: no shared-memory hazard; synccheck: no barrier misuse."""
    _assert_clean(tool, mode, _sanitize(tool, mode, "sanitize_fp8_blockwise.py"))
