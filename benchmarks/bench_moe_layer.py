"""Benchmark: forward + backward of the MoE expert MLP and of TorchTitan's MoE layer.

Rows per shape, side by side in one process on the same inputs and weights (bf16), each one
training step's forward and backward (the output's gradient given), device time, median:

  titan_eager          TorchTitan's own GroupedExperts (torchtitan.models.common.moe): separate
                       w1/w3, three torch._grouped_mm, silu(g) * u, autograd; eager
  titan_compiled       the same module under torch.compile
  gemms_only           the nine grouped GEMMs of that step alone (3 forward: gate, up, down;
                       6 backward: dh, dw2, dx from gate and from up, dw1, dw3), torch._grouped_mm
  cudnn_ext            cudnn_ext's experts in TorchTitan (cudnn_ext.integrations.torchtitan,
                       CudnnGroupedExperts: interleaved w13, the fused dSwiGLU backward, the
                       routed rows passed through as they come on Hopper); eager
  cudnn_ext_compiled   the same module under torch.compile
  cudnn_ext_captured   the same module with ``capture=True``: each step's forward and backward
                       replayed from CUDA graphs captured for the row count (host issue: two
                       graph launches and the static input copies)
  cudnn_ext_mlp        GroupedGluMLP alone on rows already in 256-aligned groups
  titan_moe            TorchTitan's whole MoE layer (router, permutation, experts, combine
                       with the routing scores), stock experts, eager, on tokens/top_k tokens
  titan_moe_cudnn_ext  the same layer after swap_experts, eager
  titan_moe_compiled   the stock layer under torch.compile
  titan_moe_cudnn_ext_compiled  the swapped layer under the same torch.compile

The expert rows have the four benchmark shapes' expert sizes (bench_dglu.SHAPES: experts,
rows per expert, K = hidden, N = expert width); shapes ``skew8`` and ``skew1`` are skew's
Pareto sizes rounded to 8 rows and to 1 row (any count: what TorchTitan's router produces)
instead of 256. The
MoE-layer rows route ``rows * experts / top_k`` tokens with top_k 8 (a router decides the
groups, so they are near, not at, the shape's sizes).

Each row also carries the host's issue time per step: ``issue_ms`` (median over the timed
steps, each issued after a synchronize) and ``steady_issue_ms`` (ten steps issued back to back
behind a busy GPU, as a training loop issues them).

JSON rows {"shape", "impl", "ms", ...} plus command, device and date go to
benchmarks/results/moe-layer-<device>.json (or --out), replacing that device's previous
result. ``--smoke`` runs a tiny shape on the CPU (wall time; checks that every row runs).
Not imported by the library.

  python benchmarks/bench_moe_layer.py [--shapes qwen3,dsv3,mixtral,skew,skew8,skew1] [--reps 30]
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_dglu  # noqa: E402  (shapes, group sizes, the timers)

SHAPES = dict(bench_dglu.SHAPES, skew8=bench_dglu.SHAPES["skew"], skew1=bench_dglu.SHAPES["skew"])
#: skew's Pareto sizes at a finer granularity than 256 rows
_SKEW_GRANULARITY = {"skew8": 8, "skew1": 1}
SMOKE_SHAPE = (4, 40, 64, 64)  # experts, rows per expert (mean), K, N
TOP_K = 8
IMPLS = ("titan_eager", "titan_compiled", "gemms_only", "cudnn_ext", "cudnn_ext_compiled", "cudnn_ext_captured",
         "cudnn_ext_mlp",
         "titan_moe", "titan_moe_cudnn_ext", "titan_moe_compiled", "titan_moe_cudnn_ext_compiled")


def group_sizes(name, L, rows):
    gran = _SKEW_GRANULARITY.get(name)
    if gran:  # skew's Pareto(1.5) draw (same seed, same empty experts) at this granularity
        g = torch.Generator().manual_seed(0)
        xm, sizes = rows / 3, []
        for i in range(L):
            if i % 8 == 7:
                sizes.append(0)
                continue
            u = float(torch.rand(1, generator=g))
            sizes.append(int(math.ceil(min(xm / (1 - u) ** (2 / 3), 16 * rows) / gran)) * gran)
        return sizes
    return bench_dglu.group_sizes(name, L, rows)


def titan_parts():
    from torchtitan.models.common import moe as tt_moe
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
    return tt_moe, Linear, LocalTokenDispatcher


def make_experts(L, K, N, dev):
    tt_moe, _, _ = titan_parts()
    ex = tt_moe.GroupedExperts(tt_moe.GroupedExperts.Config(dim=K, hidden_dim=N, num_experts=L)).to(dev)
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return ex.to(torch.bfloat16)


def make_moe(L, K, N, dev, top_k):
    tt_moe, Linear, LocalTokenDispatcher = titan_parts()
    cfg = tt_moe.MoE.Config(
        num_experts=L,
        routed_experts=tt_moe.RoutedExperts.Config(
            inner_experts=tt_moe.GroupedExperts.Config(dim=K, hidden_dim=N, num_experts=L),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=L, top_k=top_k)),
        router=tt_moe.TokenChoiceTopKRouter.Config(num_experts=L, gate=Linear.Config(in_features=K, out_features=L),
                                                   top_k=top_k, score_func="softmax"),
        load_balance_coeff=None)
    m = cfg.build().to(dev)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return m.to(torch.bfloat16).train()


def step(module, args, dy):
    """One forward + backward, the input's gradient included (the inputs of ``args`` that
    require grad); gradients are dropped first so that none accumulates."""
    leaves = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]

    def fn():
        for p in list(module.parameters()) + leaves:
            p.grad = None
        module(*args).backward(dy)
    return fn


def gemms_only(x, w1, w2, w3, offs):
    """The nine grouped GEMMs of the stock step, on tensors of the step's shapes."""
    mm = torch._grouped_mm
    m = x.shape[0]
    g = torch.randn(m, w1.shape[1], device=x.device, dtype=x.dtype)
    dy = torch.randn(m, w2.shape[1], device=x.device, dtype=x.dtype)

    def fn():
        mm(x, w1.transpose(-2, -1), offs=offs)  # gate
        mm(x, w3.transpose(-2, -1), offs=offs)  # up
        mm(g, w2.transpose(-2, -1), offs=offs)  # down
        mm(dy, w2, offs=offs)  # dh
        mm(dy.t(), g, offs=offs)  # dw2
        mm(g, w1, offs=offs)  # dx from the gate
        mm(g, w3, offs=offs)  # dx from the up
        mm(g.t(), x, offs=offs)  # dw1
        mm(g.t(), x, offs=offs)  # dw3
    return fn


def padded_inputs(x, sizes, dy):
    """x, prob and dy copied into 256-row aligned groups, with the padded offsets."""
    padded = [-(-s // 256) * 256 for s in sizes]
    m = max(256, sum(padded))
    xp, dyp = x.new_zeros(m, x.shape[1]), dy.new_zeros(m, dy.shape[1])
    prob = torch.zeros(m, device=x.device)
    src = dst = 0
    for s, p in zip(sizes, padded):
        xp[dst:dst + s], dyp[dst:dst + s], prob[dst:dst + s] = x[src:src + s], dy[src:src + s], 1.0
        src, dst = src + s, dst + p
    offs = torch.tensor(list(bench_dglu._cumsum(padded)), dtype=torch.int32, device=x.device)
    return xp, prob, offs, dyp


def build_rows(name, L, per, K, N, dev, impls, top_k, compile_fn=torch.compile):
    """name -> (callable, extra row fields) for one shape."""
    from cudnn_ext.integrations.torchtitan import swap_experts
    from cudnn_ext.torch.mlp import GroupedGluMLP

    sizes = group_sizes(name, L, per)
    rows = sum(sizes)
    counts = torch.tensor(sizes, device=dev)
    x = torch.randn(rows, K, device=dev, dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(rows, K, device=dev, dtype=torch.bfloat16)
    stock = make_experts(L, K, N, dev)
    ours = swap_experts(copy.deepcopy(stock))
    fns, extra = {}, dict(L=L, M=rows, K=K, N=N, sizes=sizes)
    if "titan_eager" in impls:
        fns["titan_eager"] = step(stock, (x, counts), dy)
    if "titan_compiled" in impls:
        fns["titan_compiled"] = step(compile_fn(stock), (x, counts), dy)
    if "gemms_only" in impls:
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        fns["gemms_only"] = gemms_only(x.detach(), stock.w1_EFD, stock.w2_EDF, stock.w3_EFD, offs)
    if "cudnn_ext" in impls:
        fns["cudnn_ext"] = step(ours, (x, counts), dy)
    if "cudnn_ext_compiled" in impls:
        fns["cudnn_ext_compiled"] = step(compile_fn(copy.deepcopy(ours)), (x, counts), dy)
    if "cudnn_ext_captured" in impls:
        fns["cudnn_ext_captured"] = step(swap_experts(copy.deepcopy(stock), capture=True), (x, counts), dy)
    if "cudnn_ext_mlp" in impls:
        mlp = GroupedGluMLP(L, K, N, device=dev)
        with torch.no_grad():
            mlp.w1.copy_(ours.w13)
            mlp.w2.copy_(ours.w2_EDF)
        xp, prob, offs, dyp = padded_inputs(x.detach(), sizes, dy)
        xp.requires_grad_()
        fns["cudnn_ext_mlp"] = step(mlp, (xp, prob, offs), dyp)
    if any(i.startswith("titan_moe") for i in impls):
        tokens = max(1, rows // top_k)
        moe = make_moe(L, K, N, dev, min(top_k, L))
        xt = torch.randn(1, tokens, K, device=dev, dtype=torch.bfloat16).requires_grad_()
        dyt = torch.randn_like(xt)
        if "titan_moe" in impls:
            fns["titan_moe"] = step(moe, (xt,), dyt)
        if "titan_moe_cudnn_ext" in impls:
            fns["titan_moe_cudnn_ext"] = step(swap_experts(copy.deepcopy(moe)), (xt,), dyt)
        if "titan_moe_compiled" in impls:
            fns["titan_moe_compiled"] = step(compile_fn(copy.deepcopy(moe)), (xt,), dyt)
        if "titan_moe_cudnn_ext_compiled" in impls:
            fns["titan_moe_cudnn_ext_compiled"] = step(compile_fn(swap_experts(copy.deepcopy(moe))), (xt,), dyt)
        extra["moe_tokens"] = tokens
    return fns, extra


def steady_issue_ms(fn, timer, steps=10):
    """Host issue time per step, ms, of ``steps`` steps issued back to back while the GPU is
    still busy with a spin (a training loop's steady state: no synchronize between steps)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(timer.cycles * steps)  # the timer's spin, ``steps`` times over
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    ms = (time.perf_counter() - t0) / steps * 1e3
    torch.cuda.synchronize()
    return ms


def wall_timer(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n  python")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qwen3,dsv3,mixtral,skew,skew8,skew1",
                    help=f"comma-separated, of {sorted(SHAPES)}")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma-separated rows (see above)")
    ap.add_argument("--reps", type=int, default=30, help="timed steps per row")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per row first (compiles too)")
    ap.add_argument("--rounds", type=int, default=5, help="round-robin rounds per shape")
    ap.add_argument("--top-k", type=int, default=TOP_K, help="experts per token in the MoE-layer rows")
    ap.add_argument("--busy-ms", type=float, default=20.0,
                    help="GPU spin before each timed step: longer than the step's host issue time, "
                         "so that the events bracket device time only (late_calls counts the rest)")
    ap.add_argument("--smoke", action="store_true",
                    help=f"one tiny shape {SMOKE_SHAPE} on the CPU, wall time: checks that every row runs")
    ap.add_argument("--out", default=None,
                    help="JSON path (default: benchmarks/results/moe-layer-<device>.json, replaced)")
    args = ap.parse_args(argv)
    impls = args.impls.split(",")
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        ap.error(f"--impls: unknown {unknown}; known: {list(IMPLS)}")
    if args.smoke:
        dev, dev_name, shapes = "cpu", "cpu", {"smoke": SMOKE_SHAPE}

        def compile_fn(mod):
            # on the CPU inductor's C++ codegen would take minutes: aot_eager traces the same
            # graphs (the custom op included) and runs them eagerly
            return torch.compile(mod, backend="aot_eager")
        timers = {n: wall_timer for n in impls}
        sync = lambda: None  # noqa: E731
    else:
        if not torch.cuda.is_available():
            ap.error("needs a CUDA GPU (or --smoke)")
        dev, dev_name = "cuda", torch.cuda.get_device_name()
        names = args.shapes.split(",")
        bad = [s for s in names if s not in SHAPES]
        if bad:
            ap.error(f"--shapes: unknown {bad}; known: {sorted(SHAPES)}")
        shapes = {s: SHAPES[s] for s in names}
        timers = {n: bench_dglu.DeviceTimer(busy_us=args.busy_ms * 1e3) for n in impls}
        sync, compile_fn = None, torch.compile
    rows = []
    for name, (L, per, K, N) in shapes.items():
        torch.manual_seed(0)
        try:
            fns, extra = build_rows(name, L, per, K, N, dev, impls, args.top_k, compile_fn)
        except Exception as exc:
            traceback.print_exc(limit=3)
            rows += [dict(shape=name, impl=i, ms=None, error=f"{type(exc).__name__}: {exc}"[:500]) for i in impls]
            continue
        medians, errors = bench_dglu.bench_round_robin(fns, args.warmup, args.reps, args.rounds,
                                                        timer={n: timers[n] for n in fns}, sync=sync)
        steady = {}
        if dev == "cuda":
            for impl, fn in fns.items():
                if impl not in errors:
                    steady[impl] = round(steady_issue_ms(fn, timers[impl]), 4)
        for impl in impls:
            row = dict(shape=name, impl=impl, ms=medians.get(impl), **extra)
            if impl in steady:
                row["steady_issue_ms"] = steady[impl]
            if impl in errors:
                row["error"] = errors[impl]
            t = timers.get(impl)
            if isinstance(t, bench_dglu.DeviceTimer):
                row.update(late_calls=t.late, max_issue_us=round(t.max_issue_us, 1),
                           issue_ms=round(statistics.median(t.issue_us) / 1e3, 4) if t.issue_us else None)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "sizes"}), flush=True)
        del fns
        if dev == "cuda":
            torch.cuda.empty_cache()

    print(f"\n{'shape':8s} {'impl':29s} {'ms':>9s} {'vs titan_compiled':>18s} {'issue ms':>9s} {'steady':>7s}")
    for r in rows:
        base = next((x for x in rows if x["shape"] == r["shape"] and x["impl"] == "titan_compiled"), None)
        ratio = base["ms"] / r["ms"] if base and base.get("ms") and r.get("ms") else float("nan")
        ms = f"{r['ms']:.3f}" if r.get("ms") else "ERR"
        issue = f"{r['issue_ms']:.3f}" if r.get("issue_ms") else "-"
        steady = f"{r['steady_issue_ms']:.3f}" if r.get("steady_issue_ms") else "-"
        print(f"{r['shape']:8s} {r['impl']:29s} {ms:>9s} {ratio:18.2f} {issue:>9s} {steady:>7s}")

    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"moe-layer-{dev_name.replace(' ', '_')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    command = " ".join(["python", "benchmarks/" + os.path.basename(__file__)] + list(argv if argv is not None else sys.argv[1:]))
    for r in rows:
        r.update(device=dev_name, date=date, command=command)
    with open(out, "w") as f:
        json.dump(dict(command=command, device=dev_name, date=date, torch=torch.__version__,
                       timer="wall" if args.smoke else "gpu", rounds=args.rounds, top_k=args.top_k,
                       cudnn_ext=bench_dglu.imported_cudnn_ext(), rows=rows), f, indent=1)
    print("wrote", out)
    failed = [f"{r['shape']}/{r['impl']}: {r['error']}" for r in rows if r.get("error")]
    if args.smoke and failed:  # the smoke run exists to show that every row runs
        raise SystemExit("rows that did not run:\n" + "\n".join(failed))
    return rows


if __name__ == "__main__":
    main()
