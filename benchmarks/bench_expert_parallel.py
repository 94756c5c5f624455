"""Benchmark: tokens/s of ExpertParallelGluMLP forward + backward at EP = world size against one GPU.

Launched by torchrun, one process per GPU. Two timed phases, each a step of
``layer(x, expert_ids, probs)`` then ``backward`` into ``x``, ``probs`` and the expert weights,
with the same tokens per GPU (``--tokens``) and the same random top-k routing:

  ep=1   rank 0 alone runs all ``--experts`` experts (a one-rank group: the same layer, its
         all_to_all a local copy) while the other ranks wait
  ep=W   every rank runs ``--experts / W`` experts; tokens cross GPUs both ways

``tokens_per_s`` counts every rank's tokens (W x --tokens per step at ep=W), the step time is
the slowest rank's, and ``speedup`` is ep=W's tokens/s over ep=1's (W is the ideal). Routing is
uniform over experts unless ``--skew`` puts that factor more score on the first rank's experts.

  torchrun --nproc-per-node 2 benchmarks/bench_expert_parallel.py            # GPUs, NCCL
  torchrun --nproc-per-node 2 benchmarks/bench_expert_parallel.py --smoke    # CPU, gloo, seconds

Writes JSON to benchmarks/results/expert_parallel-<device>.json (or --out), replacing the
previous result; ``--smoke`` writes only with --out. Not imported by the library.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from cudnn_ext.torch.expert_parallel import ExpertParallelGluMLP  # noqa: E402

SMOKE = dict(experts=4, hidden=64, intermediate=64, topk=2, tokens=256, warmup=1, iters=3)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--experts", type=int, default=32, help="experts in the layer (a multiple of the world size)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per rank per step")
    ap.add_argument("--skew", type=float, default=0.0, help="extra router score on the first rank's experts")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--smoke", action="store_true",
                    help=f"CPU and gloo, a tiny problem ({SMOKE}): checks the launch path in seconds")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/expert_parallel-<device>.json)")
    args = ap.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    return args


def routing(args, world, device, seed):
    """x (T, H) bf16, expert ids (T, k), probs (T, k) fp32 of one rank; same law on every rank."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(args.tokens, args.experts, generator=g)
    scores[:, : args.experts // world] += args.skew
    top, ids = scores.topk(args.topk, dim=1)
    x = torch.randn(args.tokens, args.hidden, generator=g).to(torch.bfloat16)
    return x.to(device), ids.to(device), torch.softmax(top, dim=1).to(device)


def time_steps(layer, x, ids, probs, args, sync, group):
    """Seconds per forward + backward step, the slowest rank of ``group``'s."""
    dy = torch.randn_like(x)

    def step():
        layer.zero_grad(set_to_none=True)
        xg, pg = x.detach().requires_grad_(), probs.detach().requires_grad_()
        layer(xg, ids, pg).backward(dy)

    for _ in range(args.warmup):
        step()
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    sync()
    per_step = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        per_step = per_step.cuda()
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX, group=group)
    return per_step.item()


def main(argv=None):
    args = parse(argv)
    if "RANK" not in os.environ:
        sys.exit("launch with torchrun, e.g. torchrun --nproc-per-node 2 benchmarks/bench_expert_parallel.py "
                 "[--smoke]")
    if args.smoke:
        device, backend = torch.device("cpu"), "gloo"
        sync = lambda: None  # noqa: E731
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device, backend = torch.device("cuda", torch.cuda.current_device()), "nccl"
        sync = torch.cuda.synchronize
    dist.init_process_group(backend)
    world, rank = dist.get_world_size(), dist.get_rank()
    if args.experts % world:
        sys.exit(f"--experts {args.experts} must be a multiple of the world size {world}")
    solo = dist.new_group([0])  # every rank takes part in creating it; only rank 0 uses it
    x, ids, probs = routing(args, world, device, seed=rank)
    mlp_kw = dict(device=device, dtype=torch.bfloat16)
    rows = []
    try:
        if rank == 0:
            one = ExpertParallelGluMLP(args.experts, args.hidden, args.intermediate, group=solo, **mlp_kw)
            rows.append(dict(ep=1, gpus=1, s_per_step=time_steps(one, x, ids, probs, args, sync, solo),
                             tokens_per_step=args.tokens))
            del one
        dist.barrier()
        layer = ExpertParallelGluMLP(args.experts, args.hidden, args.intermediate, **mlp_kw)
        s = time_steps(layer, x, ids, probs, args, sync, None)
        rows.append(dict(ep=world, gpus=world, s_per_step=s, tokens_per_step=world * args.tokens))
        if rank != 0:
            return
        for r in rows:
            r["ms_per_step"] = round(r.pop("s_per_step") * 1e3, 3)
            r["tokens_per_s"] = round(r["tokens_per_step"] / (r["ms_per_step"] / 1e3), 1)
        speedup = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
        device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                       else f"cpu ({platform.processor() or platform.machine()})")
        problem = {k: getattr(args, k) for k in ("experts", "hidden", "intermediate", "topk", "tokens", "skew")}
        print(f"expert parallel, {device_name} x {world}, {backend}, torch {torch.__version__}, {problem}, "
              f"{args.iters} steps after {args.warmup}")
        print(f"{'ep':>4}{'gpus':>6}{'tokens/step':>13}{'ms/step':>10}{'tokens/s':>14}")
        for r in rows:
            print(f"{r['ep']:>4}{r['gpus']:>6}{r['tokens_per_step']:>13}{r['ms_per_step']:>10.3f}{r['tokens_per_s']:>14.1f}")
        print(f"speedup ep={world} over one: {speedup:.2f}x (ideal {world}x)")
        out = args.out
        if out is None and not args.smoke:
            out = os.path.join(os.path.dirname(__file__), "results",
                               f"expert_parallel-{device_name.replace(' ', '_')}.json")
        if out:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            with open(out, "w") as f:
                json.dump({"command": "torchrun --nproc-per-node " + str(world) + " " + " ".join(sys.argv),
                           "device": device_name, "world": world, "backend": backend, "torch": torch.__version__,
                           "date": datetime.date.today().isoformat(), "problem": problem,
                           "warmup": args.warmup, "iters": args.iters, "rows": rows,
                           "speedup": round(speedup, 3)}, f, indent=1)
            print(f"wrote {out}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
