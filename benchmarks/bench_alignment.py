"""Benchmark: expert groups of any size or aligned to 8 rows against the same groups padded
to 256 rows.

Routers hand experts groups of any size (TorchTitan's bf16 dispatcher) or aligned to 8 rows;
the vendor's contract pads every group to 256. For each of the four benchmark shapes
(bench_dglu.SHAPES: experts, mean rows per expert, K, N) the group sizes are multiples of the
granularity (8, or 1 for the ``*1`` rows) and not of 256 (uniform shapes: the mean times a
factor in [0.5, 1.5]; skew: its Pareto draw, every 8th expert empty). Rows, side by side in
one process on the same values, the SM90 engine's choice of configuration, its plan's execute:

  aligned8    m_aligned=8: the 8-row groups as they are (the ragged schedule)
  padded256   the same groups, each padded with rows up to a multiple of 256 (m_aligned=256)
  aligned1    m_aligned=1: groups of any size as they are (the ragged schedule)
  padded256_1 the same any-size groups padded to multiples of 256
  aligned8_cm1, aligned8_cm2
              (--clusters) aligned8's configuration with 1 or 2 CTAs per cluster along M:
              the evidence of the engine's cluster rule for the ragged schedule

Device time (bench_dglu's "gpu" timer: each call issued behind a spin kernel), median of
--reps calls, round-robin (--rounds). Writes JSON rows {"shape", "impl", "ms", "rows",
"tflops" (2 x the real rows x N x K), "knobs"} with the command, device and date to
benchmarks/results/alignment-<device>.json (or --out), replacing the previous one.

  python benchmarks/bench_alignment.py [--shapes dsv3,qwen3,mixtral,skew] [--reps 30]
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dglu  # noqa: E402
from cudnn_ext.engines.sm90 import RASTER_GROUP_M  # noqa: E402

IMPLS = ("aligned8", "padded256", "aligned1", "padded256_1")
CLUSTER_IMPLS = ("aligned8_cm1", "aligned8_cm2")


def group_sizes(name, L, rows, seed=0, gran=8):
    """Multiples of ``gran``, not of 256 (empty groups allowed): see the module docstring."""
    g = torch.Generator().manual_seed(seed)
    sizes = []
    for i in range(L):
        u = float(torch.rand(1, generator=g))
        if name.startswith("skew"):
            if i % 8 == 7:
                sizes.append(0)
                continue
            x = min(rows / 3 / (1 - u) ** (2 / 3), 16 * rows)  # Pareto(1.5), mean `rows`
        else:
            x = rows * (0.5 + u)
        size = max(gran, int(math.ceil(x / gran)) * gran)
        sizes.append(size + gran if size % 256 == 0 else size)
    return sizes


def padded_pack(pack, sizes):
    """The same rows, each group padded with zero rows (probability 0) to a multiple of 256."""
    padded = [-(-s // 256) * 256 for s in sizes]
    src, dst = [], []
    s0 = d0 = 0
    for s, p in zip(sizes, padded):
        src.append(torch.arange(s0, s0 + s))
        dst.append(torch.arange(d0, d0 + s))
        s0, d0 = s0 + s, d0 + p
    src, dst = torch.cat(src).cuda(), torch.cat(dst).cuda()
    M = d0
    out = {}
    for key in ("a", "c", "d_row"):
        t = pack[key]
        z = torch.zeros((M,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        z[dst] = t[src]
        out[key] = z
    for key in ("prob", "dprob"):
        z = torch.zeros(M, device="cuda")
        z[dst] = pack[key][src]
        out[key] = z
    out.update(b=pack["b"], alpha=pack["alpha"], beta=pack["beta"], dbias=pack["dbias"].clone(),
               padded_offsets=torch.tensor(list(bench_dglu._cumsum(padded)), dtype=torch.int32,
                                           device="cuda"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(bench_dglu.SHAPES))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--clusters", action="store_true",
                    help="also time aligned8's configuration in 1x1 and 2x1 clusters")
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s not in bench_dglu.SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; known: {sorted(bench_dglu.SHAPES)}")
    dev_name = torch.cuda.get_device_name()
    rows = []
    for name in args.shapes.split(","):
        L, per, K, N = bench_dglu.SHAPES[name]
        sizes, sizes1 = group_sizes(name, L, per), group_sizes(name, L, per, gran=1)
        torch.manual_seed(0)
        pack = bench_dglu.make_inputs(sizes, K, N)
        pack1 = bench_dglu.make_inputs(sizes1, K, N)
        packs = {"aligned8": (pack, 8, sizes), "padded256": (padded_pack(pack, sizes), 256, sizes),
                 "aligned1": (pack1, 1, sizes1), "padded256_1": (padded_pack(pack1, sizes1), 256, sizes1)}
        if args.clusters:
            packs.update(aligned8_cm1=(pack, 8, sizes), aligned8_cm2=(pack, 8, sizes))
        fns, shape_rows = {}, {}
        for impl, (p, align, real) in packs.items():
            knobs = None
            if impl.startswith("aligned8_cm"):
                cm = int(impl[-1])
                knobs = dataclasses.replace(shape_rows["aligned8"]["config"], cluster_m=cm,
                                            cluster_n=1, raster_group_m=RASTER_GROUP_M[cm])
            plan, ws, knobs, _ = bench_dglu.build_plan(p, K, N, knobs=knobs, m_aligned=align)
            stream = torch.cuda.current_stream()
            fns[impl] = (lambda plan=plan, p=p, ws=ws: plan.execute(p, ws, stream))
            shape_rows[impl] = dict(shape=name, impl=impl, L=L, rows=int(p["a"].shape[0]),
                                    real_rows=sum(real), K=K, N=N, m_aligned=align,
                                    knobs=knobs.as_dict(), config=plan.config)
        timers = {impl: bench_dglu.DeviceTimer() for impl in fns}
        medians, errors = bench_dglu.bench_round_robin(fns, args.warmup, args.reps, args.rounds,
                                                       timer=timers)
        for impl, row in shape_rows.items():
            del row["config"]
            if impl in medians:
                row.update(ms=medians[impl], late_calls=timers[impl].late,
                           tflops=2.0 * row["real_rows"] * N * K / medians[impl] / 1e9)
            else:
                row.update(ms=None, error=errors.get(impl))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del fns, packs, pack, pack1
        torch.cuda.empty_cache()
    print(f"\n{'shape':8s} {'aligned8 ms':>12s} {'padded256 ms':>13s} {'ratio':>6s}"
          f" {'aligned1 ms':>12s} {'padded256 ms':>13s} {'ratio':>6s}"
          + ("  cm1 ms  cm2 ms" if args.clusters else ""))
    for name in args.shapes.split(","):
        got = {r["impl"]: r for r in rows if r["shape"] == name}
        ms = [got[i].get("ms") or float("nan") for i in IMPLS]
        extra = "".join(f" {got[i].get('ms') or float('nan'):7.3f}" for i in CLUSTER_IMPLS if i in got)
        print(f"{name:8s} {ms[0]:12.3f} {ms[1]:13.3f} {ms[0] / ms[1]:6.3f} {ms[2]:12.3f} {ms[3]:13.3f} "
              f"{ms[2] / ms[3]:6.3f} {extra}")
    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"alignment-{dev_name.replace(' ', '_')}.json")
    command = " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))
    with open(out, "w") as f:
        json.dump(dict(command=command, device=dev_name, date=date, torch=torch.__version__,
                       timer="gpu", rounds=args.rounds, rows=rows), f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
