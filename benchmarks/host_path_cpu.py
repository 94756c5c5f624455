"""Host cost of the torch op path on the CPU, with the engine's launch replaced by a no-op.

What this isolates: the Python and dispatcher work around the kernel launch of an eager call
(argument handling, the memo or the replay's guard, output allocation, the plan's bookkeeping),
on a machine without a GPU. The reference engine's plan stands in for the Hopper plan, made to
look like it where it matters for the host path: it runs on uninitialized outputs
(``execute_fresh``, as the SM90 plan does) and offers an address launcher (so remembered calls
replay), both no-ops. Absolute numbers are this CPU's; the device's own measurement is
``benchmarks/bench_host_overhead.py`` on the H200 (real launches). Not imported by the library.

Rows (median and best of batches of 50 calls, microseconds per call):
  custom_op           torch.ops.cudnn_ext.grouped_gemm_dglu (the dispatcher, then the op's body)
  custom_op_mlp_args  the same with every argument GroupedGluMLP's backward passes (N-major B)
  python_fn           cudnn_ext.torch.grouped_gemm_dglu (eager: the body without the dispatcher)
  python_fn_mlp_args  the same with GroupedGluMLP's arguments (what its backward calls)
  empty3             the three output allocations alone (a floor)

  python benchmarks/host_path_cpu.py [--reps 4000] [--profile ROW]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from cudnn_ext.plan.execution import ExecutionPlan  # noqa: E402
from cudnn_ext.runtime.memo import CALLS  # noqa: E402


def timeit(fn, reps, batch=50):
    for _ in range(max(200, reps // 10)):
        fn()
    per = []
    for _ in range(max(1, reps // batch)):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        per.append((time.perf_counter_ns() - t0) / batch / 1e3)
    return statistics.median(per), min(per)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--profile", default=None, help="cProfile one row (its name)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import cudnn_ext.torch as ct

    L, N, K, M = 4, 64, 64, 1024
    bf = torch.bfloat16
    a, b = torch.randn(M, K).to(bf), torch.randn(L, N, K).to(bf)
    c = torch.randn(M, 2 * N).to(bf)
    offs = torch.tensor([256, 512, 768, 1024], dtype=torch.int32)
    alpha, beta, prob = torch.ones(L), torch.ones(L), torch.rand(M)
    op = torch.ops.cudnn_ext.grouped_gemm_dglu

    # the reference plan, made to look like the Hopper plan on the host path, with no-op launches
    op(a, b, c, offs, alpha, beta, prob, generate_dbias=True)  # builds the reference plan
    plan_cls = type(next(iter(CALLS.entries("op"))).plan.compiled)
    plan_cls.execute = lambda self, pack, workspace=None, stream=None: None
    plan_cls.execute_fresh = lambda self, pack, workspace=None, stream=None: None
    ExecutionPlan.address_launcher = (lambda self, m, init, device_index, zeroed_workspace=False:
                                      (lambda *args: None))
    CALLS.clear()  # entries made before the stubs would not use them

    wt = b.transpose(1, 2).contiguous().transpose(1, 2)  # the MLP passes w2ᵀ, an N-major view
    mlp_kw = dict(act_func="dswiglu", linear_offset=None, geglu_alpha=1.702, glu_clamp_max=7.0,
                  glu_clamp_min=-7.0, generate_dbias=True, d_dtype=bf)
    rows = {
        "custom_op": lambda: op(a, b, c, offs, alpha, beta, prob, generate_dbias=True),
        "custom_op_mlp_args": lambda: op(a, wt, c, offs, alpha, beta, prob, **mlp_kw),
        "python_fn": lambda: ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b,
                                                  generate_dbias=True),
        "python_fn_mlp_args": lambda: ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=wt,
                                                           **mlp_kw),
        "empty3": lambda: (torch.empty((M, 2 * N), dtype=bf), torch.empty((M,)),
                           torch.empty((L, 2 * N), dtype=bf)),
    }
    print(f"host cost per call, CPU, launch stubbed, torch {torch.__version__}, "
          f"L={L} N={N} K={K} M={M}")
    for name, fn in rows.items():
        med, best = timeit(fn, args.reps)
        print(f"{name:<20}{med:>10.2f} us median{best:>10.2f} us best")
    if args.profile:
        fn = rows[args.profile]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.reps * 5):
            fn()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
