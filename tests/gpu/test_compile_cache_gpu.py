"""The persistent compile cache on the device (``pytest -m gpu``; skipped without an sm_90 GPU).

- a fresh process with a warm disk cache loads its kernel instead of compiling it, reaches its
  first launch sooner than the process before it (which compiled into the same, empty cache)
  and computes the right answer; with the TVM-FFI convention and a C compiler it never imports
  the CuTe DSL (``cutlass``) on the way;
- eight processes asking for the same kernel at once (eight ranks of a node) compile it once.

Run with ``-s`` to see the times."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

from cudnn_ext.runtime import shared_library

pytestmark = pytest.mark.gpu
ROOT = pathlib.Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"


def _sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _env(cache):
    # this checkout first, then whatever the parent's path holds (the DSL may live there)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, CUDNN_EXT_CACHE_DIR=str(cache), PYTHONPATH=path)
    env.pop("CUDNN_EXT_CACHE_DISABLE", None)
    return env


def _first_launch(cache):
    out = subprocess.run([sys.executable, str(SUPPORT / "first_launch_child.py")], env=_env(cache),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_warm_cache_first_launch_under_a_second(tmp_path):
    _sm90()
    cache = tmp_path / "cache"
    cold = _first_launch(cache)
    warm = _first_launch(cache)
    print(f"\ncold: first launch {cold['first_launch_s']:.3f} s {cold['events']}"
          f"\nwarm: first launch {warm['first_launch_s']:.3f} s {warm['events']} "
          f"(compile cache {warm['split']['compile_cache_s']:.3f} s, the rest "
          f"{warm['split']['rest_s']:.3f} s; cutlass imported: {warm['cutlass_imported']}; "
          f"import torch+cudnn_ext {warm['import_s']:.3f} s, process {warm['process_s']:.3f} s)")
    assert "compiled" in [e[1] for e in cold["events"]]
    assert warm["events"] and all(e[1] == "hit" for e in warm["events"])
    if importlib.util.find_spec("tvm_ffi") is not None and shared_library.compiler() is not None:
        # the kernel comes from its linked library: nothing on the way needs the DSL
        assert not warm["cutlass_imported"], "\n".join(warm["cutlass_first_imported_from"] or [])
    for r in (cold, warm):
        assert r["err"]["d_row"] < 2e-2 and r["err"]["dprob"] < 1e-2 and r["err"]["dbias"] < 2e-2, r
    # the time itself is a measurement (docs/compile_cache.md, "Startup time"), not a test
    # condition; a hit must at least skip the compile
    assert warm["first_launch_s"] < cold["first_launch_s"]


def test_eight_processes_compile_once(tmp_path):
    _sm90()
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(SUPPORT / "compile_cache_child.py"), "sm90",
                               "--wait-for", str(go)], env=_env(cache), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    deadline = time.time() + 300
    while len(list(tmp_path.glob("go.ready*"))) < 8:
        assert time.time() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.02)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    outcomes = sorted(e[1] for r in results for e in r["events"])
    print("\n" + ", ".join(f"{e[1]} {e[2]:.2f} s" for r in results for e in r["events"]))
    assert outcomes == ["compiled"] + ["hit"] * 7, outcomes
