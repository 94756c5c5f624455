"""A fresh process's seconds to hold a compiled kernel from a warm disk cache, by how it loads.

What this isolates: the part of a fresh process's first launch that the persistent compile
cache (``cudnn_ext.runtime.compile_cache``) owns, after ``import torch, cudnn_ext`` (not
counted) and without launching anything, so it runs on a machine without a GPU. It compiles
one kernel into an empty cache folder, then times fresh processes asking for it:

  linked        the TVM-FFI kernel opened from its linked shared library
                (``tvm_ffi.load_module``): no CuTe DSL import
  dsl_loader    the same entry without its library and without a C compiler (``CC`` set to
                a missing program): the DSL's loader, which imports the DSL
  import_tvm_ffi     ``import tvm_ffi`` alone (part of ``linked``)
  import_cute        ``import cutlass.cute`` alone (part of ``dsl_loader``)

Each row is the median (and min) of ``--reps`` fresh processes, seconds, with whether
``cutlass`` was imported. Prints a table and writes JSON to
``benchmarks/results/warm-start-<device>.json`` (the GPU's name, or ``cpu``). Not imported by
the library.

  python benchmarks/warm_start.py [--kernel zero_tail|sm90] [--reps 5]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: One fresh process: import torch and cudnn_ext (not timed), then time the lookup.
_LOOKUP = r"""
import json, sys, time
import torch
import cudnn_ext
from cudnn_ext.runtime import compile_cache

def sm90_config():
    from cudnn_ext.engines.sm90 import config_for
    from cudnn_ext.problem import ActConfig, DgluProblem
    p = DgluProblem(n=256, k=512, num_experts=4, m=1024, weight_mode="dense", b_major="k",
                    ab_dtype=torch.bfloat16, c_dtype=torch.bfloat16, d_dtype=torch.bfloat16,
                    act=ActConfig(act_func="dswiglu"), generate_dbias=True, device_type="cuda")
    return config_for(p, tile_n=128, cluster_m=2)

kernel = sys.argv[1]
if kernel == "sm90":
    from cudnn_ext.engines import sm90
    cfg = sm90_config()
    get = lambda: sm90.compile_cached(cfg)
else:
    from cudnn_ext.kernels.layer.launch import zero_tail_cached as get
t0 = time.perf_counter()
fn = get()
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "events": compile_cache.events,
                  "cutlass": "cutlass" in sys.modules, "callable": callable(fn)}))
"""

#: One fresh process: import torch (not timed), then time one import.
_IMPORT = r"""
import json, sys, time
import torch
t0 = time.perf_counter()
__import__(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t0, "cutlass": "cutlass" in sys.modules}))
"""


def _run(code, args, env):
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env(cache, **extra):
    env = dict(os.environ, CUDNN_EXT_CACHE_DIR=str(cache), **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env.pop("CUDNN_EXT_CACHE_DISABLE", None)
    env.setdefault("CUTE_DSL_ARCH", "sm_90a")  # a CPU-only process compiles for Hopper
    return env


def _row(name, results):
    secs = [r["seconds"] for r in results]
    return {"row": name, "median_s": statistics.median(secs), "min_s": min(secs),
            "cutlass_imported": any(r["cutlass"] for r in results),
            "outcomes": sorted({e[1] for r in results for e in r.get("events", [])})}


def _device():
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name().replace(" ", "_")
    except ImportError:
        pass
    return "cpu"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", choices=("zero_tail", "sm90"), default="zero_tail",
                    help="the layer's tail zeroing (compiles in seconds) or one SM90 config")
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per row")
    ap.add_argument("--out", default=None, help="JSON path (default: results/warm-start-<device>.json)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cache, bare = pathlib.Path(tmp) / "cache", pathlib.Path(tmp) / "bare"
        compiled = _run(_LOOKUP, [args.kernel], _env(cache))
        if [e[1] for e in compiled["events"]] != ["compiled"]:
            raise SystemExit(f"expected one compile into the empty cache, got {compiled['events']}")
        if not list(cache.glob("*.so")):
            raise SystemExit("no linked library was stored (no C compiler, or apache-tvm-ffi "
                             "missing): the linked row cannot run")
        # the same entry without its library, in a process that cannot link one
        shutil.copytree(cache, bare, ignore=shutil.ignore_patterns("*.so", "*.so.json"))
        no_cc = str(pathlib.Path(tmp) / "no-such-cc")
        rows = [
            _row("linked", [_run(_LOOKUP, [args.kernel], _env(cache)) for _ in range(args.reps)]),
            _row("dsl_loader", [_run(_LOOKUP, [args.kernel], _env(bare, CC=no_cc))
                                for _ in range(args.reps)]),
            _row("import_tvm_ffi", [_run(_IMPORT, ["tvm_ffi"], _env(cache)) for _ in range(args.reps)]),
            _row("import_cute", [_run(_IMPORT, ["cutlass.cute"], _env(cache))
                                 for _ in range(args.reps)]),
        ]
    print(f"{'row':<16}{'median s':>10}{'min s':>10}  cutlass  outcomes")
    for r in rows:
        print(f"{r['row']:<16}{r['median_s']:>10.3f}{r['min_s']:>10.3f}  "
              f"{str(r['cutlass_imported']):<7}  {','.join(r['outcomes'])}")
    device = _device()
    out = (pathlib.Path(args.out) if args.out
           else ROOT / "benchmarks" / "results" / f"warm-start-{device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": " ".join(["python3", "benchmarks/warm_start.py", *sys.argv[1:]]),
        "device": device, "date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
        "kernel": args.kernel, "reps": args.reps, "compile_s": compiled["seconds"], "rows": rows},
        indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
