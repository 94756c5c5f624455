"""Can 2x2 clusters fill the whole H200? A measurement, not an engine path (session 26).

Session 13 found that 2x2 clusters (A and B multicast: grouped_mm's L2 bytes per MMA) take
fewer cycles per tile than the 2x1 default, but only 30 clusters of 4 fit on the H200 at
once: 120 of 132 SMs run, and the idle 12 cost more than the per-SM gain. This asks whether
the 12 SMs can be filled from a second launch: the problem's 256-row slabs are split in two
sub-problems that share B, P1 on 2x2 clusters (its persistent grid: every cluster of 4 that
fits) and P2 on the SMs P1 leaves (``--p2``: its variant, CTAs and an optional head start
for P1), launched at once on two streams. Rows, round-robin in one process, device time
(the bench's spin-kernel timer):

  engine      the engine's choice on the whole problem
  pp2x1       the 2x1 ping-pong kernel (t128c1m2h2) on the whole problem
  pp2x2       the 2x2 ping-pong kernel (t128c1m2n2h2) on the whole problem
  p1[x]       P1 alone (x = P2's slab count), 2x2
  p2[x:spec]  P2 alone, as --p2 says
  dual[x:spec] P1 and P2 on two streams (P1 issued first; P2's stream first spins for the
              spec's delay, if any)
  grouped_mm  torch._grouped_mm on the whole problem (the GEMM alone)

If dual runs P1 and P2 side by side its time is about max(p1, p2); if the hardware does not
co-schedule them, about their sum. The split's values are timing-only (P1 and P2 hold their
own random A, C and D; B, alpha and beta are the whole problem's).

  python benchmarks/dual_cluster.py [--shapes qwen3,skew,mixtral,dsv3] [--reps 30]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dglu import (EXTRA_SHAPES, SHAPES, DeviceTimer, bench_round_robin,  # noqa: E402
                        build_plan, group_sizes, make_inputs, run_cudnn_ext, run_grouped_mm,
                        variant_knobs)

SLAB = 256  # rows of a 2-CTA-along-M cluster unit; offsets are 256-aligned


def split_slabs(sizes, p2_slabs):
    """(sizes1, sizes2): ``p2_slabs`` 256-row slabs moved to P2, one at a time from the
    expert with the most slabs left in P1 (ties: the lower index), so P2's rows spread
    over the largest experts."""
    s1 = [s // SLAB for s in sizes]
    s2 = [0] * len(sizes)
    for _ in range(p2_slabs):
        e = max(range(len(s1)), key=lambda i: (s1[i], -i))
        if s1[e] == 0:
            break
        s1[e] -= 1
        s2[e] += 1
    return [x * SLAB for x in s1], [x * SLAB for x in s2]


def rounds(sizes1, sizes2, n_tiles, clusters1, ctas2, cluster2):
    """Static-schedule rounds of P1 (2x2 units: a slab x 2 N-tiles) and P2 (2x1 units: a
    slab x 1 N-tile; 1x1: a 128-row tile): each round is one 128 x 128 tile per CTA."""
    u1 = sum(s // SLAB for s in sizes1) * math.ceil(n_tiles / 2)
    u2 = sum(s // SLAB for s in sizes2) * n_tiles * (SLAB // 128 // cluster2)
    c2 = ctas2 // cluster2
    return math.ceil(u1 / clusters1) if u1 else 0, math.ceil(u2 / c2) if u2 else 0


def sub_pack(sizes, K, N, whole):
    pack = make_inputs(sizes, K, N)
    pack.update(b=whole["b"], alpha=whole["alpha"], beta=whole["beta"])
    return pack


def plan_fn(pack, K, N, variant, ctas=None, trace=0):
    """(fn, plan, workspace) of the SM90 plan with the variant's knobs, optionally on
    ``ctas`` CTAs and with the ``trace`` knob; ``fn(stream=None)`` executes it."""
    from cudnn_ext.engines.base import Knobs

    knobs = variant_knobs(variant)
    if trace:
        knobs = Knobs.of(**dict(knobs.values), trace=trace)
    plan, ws, _, _ = build_plan(pack, K, N, knobs)
    if ctas is not None:
        plan._resident_ctas = lambda idx: ctas  # the persistent grid: only these SMs
    return (lambda s=None: plan.execute(pack, ws, s or torch.cuda.current_stream())), plan, ws


def run_both(f1, f2, side, spin_cycles=0):
    """P1 (``f1``) on the current stream, then P2 (``f2``) on ``side`` after an optional spin
    kernel (P1's clusters placed first), both after the current stream's earlier work; the
    current stream waits for P2."""
    main_s = torch.cuda.current_stream()
    fork, join = torch.cuda.Event(), torch.cuda.Event()
    fork.record(main_s)
    f1(main_s)
    side.wait_event(fork)
    if spin_cycles:
        with torch.cuda.stream(side):
            torch.cuda._sleep(spin_cycles)
    f2(side)
    join.record(side)
    main_s.wait_event(join)


def spin_cycles(delay_us):
    return int(delay_us * 1800)  # cycles at about 1.8 GHz: only an order


def mid_split(sizes, sms):
    """P2's slabs at the middle split: the slabs' share of 12 SMs (at least one)."""
    return max(1, round(sum(sizes) // SLAB * 12 / sms))


def parse_p2(text):
    """--p2's VARIANT:CTAS:DELAY_US entries as (variant, ctas, delay_us) tuples."""
    return [(v, int(c), float(d)) for v, c, d in (x.split(":") for x in text.split(","))]


def write_json(out, argv, rows):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    command = " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))
    with open(out, "w") as f:
        json.dump(dict(command=command, device=torch.cuda.get_device_name(),
                       date=datetime.date.today().isoformat(), torch=torch.__version__,
                       rows=rows), f, indent=1)


def trace_dual(name, p2_spec):
    """One dual launch with the kernels' ``trace`` stamps: when each CTA of P1 and of P2
    starts and ends (globaltimer, us after P1's first start), so a P2 that waits for P1's
    SMs shows as P2 CTAs starting late. Returns a row."""
    L, per, K, N = SHAPES[name] if name in SHAPES else EXTRA_SHAPES[name]
    sizes = group_sizes(name, L, per)
    torch.manual_seed(0)
    whole = make_inputs(sizes, K, N)
    x = mid_split(sizes, torch.cuda.get_device_properties(0).multi_processor_count)
    s1, s2 = split_slabs(sizes, x)
    v2, ctas, delay = p2_spec
    (f1, plan1, ws1), (f2, plan2, ws2) = (
        plan_fn(sub_pack(s1, K, N, whole), K, N, "t128c1m2n2h2", trace=64),
        plan_fn(sub_pack(s2, K, N, whole), K, N, v2, ctas=ctas, trace=64))
    side = torch.cuda.Stream()
    for _ in range(3):
        torch.cuda._sleep(1_000_000)
        run_both(f1, f2, side, spin_cycles(delay))
        torch.cuda.synchronize()
    spans = []
    for plan, ws in ((plan1, ws1), (plan2, ws2)):
        tr = plan.read_trace(ws).tolist()
        spans.append([(blk[0][0][0], blk[0][0][2]) for blk in tr if blk[0][0][0]])
    t0 = min(a for a, _ in spans[0])
    row = dict(shape=name, impl="trace", p2_slabs=x, p2_variant=v2, p2_ctas=ctas, p2_delay_us=delay)
    for k, sp in zip(("p1", "p2"), spans):
        starts = sorted((a - t0) / 1e3 for a, _ in sp)
        ends = sorted((b - t0) / 1e3 for _, b in sp)
        row[k] = dict(ctas=len(sp), start_us=[round(starts[0], 1), round(starts[-1], 1)],
                      end_us=[round(ends[0], 1), round(ends[-1], 1)],
                      starts_us=[round(v, 1) for v in starts])
        print(f"{name} {k}: {len(sp)} CTAs start {starts[0]:.1f}-{starts[-1]:.1f} us, "
              f"end {ends[0]:.1f}-{ends[-1]:.1f} us", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3,skew,mixtral,dsv3")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--p2", default="t128c1m2h2:12:0",
                    help="P2 launches, comma-separated VARIANT:CTAS:DELAY_US (a spin kernel of "
                         "DELAY_US on P2's stream first, so that P1's clusters are placed "
                         "before P2's CTAs; 0: none)")
    ap.add_argument("--splits", default="auto",
                    help="P2 slab counts, comma-separated, 'mid' (the slabs' share of 12 SMs) or "
                         "'auto' (mid and its neighbours)")
    ap.add_argument("--trace", action="store_true",
                    help="instead of timing: one traced dual launch per shape at the middle "
                         "split, per --p2 spec (when each CTA of P1 and P2 ran)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    specs = parse_p2(args.p2)
    if args.trace:
        write_json(args.out, argv, [trace_dual(name, spec) for name in args.shapes.split(",")
                                    for spec in specs])
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name in args.shapes.split(","):
        L, per, K, N = SHAPES[name] if name in SHAPES else EXTRA_SHAPES[name]
        sizes = group_sizes(name, L, per)
        torch.manual_seed(0)
        whole = make_inputs(sizes, K, N)
        n_tiles = math.ceil(N / 128)
        fns, info = {}, {}
        fns["engine"], extra = run_cudnn_ext(whole, K, N)
        info["engine"] = dict(knobs=extra["knobs"])
        fns["pp2x1"] = plan_fn(whole, K, N, "t128c1m2h2")[0]
        fns["pp2x2"], p22, _ = plan_fn(whole, K, N, "t128c1m2n2h2")
        clusters1 = p22._resident_ctas(0) // 4
        slabs = sum(sizes) // SLAB
        x0 = mid_split(sizes, sms)
        if args.splits == "auto":
            cands = sorted({max(1, x) for x in (x0 - 1, x0, x0 + 1)})
        elif args.splits == "mid":
            cands = [x0]
        else:
            cands = [int(x) for x in args.splits.split(",")]
        side = torch.cuda.Stream()
        for x in cands:
            s1, s2 = split_slabs(sizes, x)
            p1, p2 = sub_pack(s1, K, N, whole), sub_pack(s2, K, N, whole)
            f1 = plan_fn(p1, K, N, "t128c1m2n2h2")[0]
            fns[f"p1[{x}]"] = f1
            info[f"p1[{x}]"] = dict(p2_slabs=x, rows1=sum(s1), rows2=sum(s2))
            for v, ctas, delay in specs:
                cl = dict(variant_knobs(v).values)["cluster_m"]
                r1, r2 = rounds(s1, s2, n_tiles, clusters1, ctas, cl)
                f2 = plan_fn(p2, K, N, v, ctas=ctas)[0]

                def dual(f1=f1, f2=f2, spin=spin_cycles(delay)):
                    run_both(f1, f2, side, spin)

                tag = f"{x}:{v}:{ctas}:{delay:g}"
                fns[f"p2[{tag}]"], fns[f"dual[{tag}]"] = f2, dual
                for k in ("p2", "dual"):
                    info[f"{k}[{tag}]"] = dict(p2_slabs=x, rows1=sum(s1), rows2=sum(s2),
                                               p2_variant=v, p2_ctas=ctas, p2_delay_us=delay,
                                               rounds1=r1, rounds2=r2)
        fns["grouped_mm"] = run_grouped_mm(whole)
        r_single = math.ceil(slabs * n_tiles / (sms // 2))
        timers = {k: DeviceTimer() for k in fns}
        med, err = bench_round_robin(fns, args.warmup, args.reps, args.rounds, timer=timers)
        for k in fns:
            row = dict(shape=name, impl=k, L=L, M=sum(sizes), K=K, N=N, ms=med.get(k),
                       error=err.get(k), clusters_2x2=clusters1, rounds_2x1_whole=r_single, **info.get(k, {}))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del fns, whole
        torch.cuda.empty_cache()
    write_json(args.out, argv, rows)
    print(f"\n{'shape':8s} {'row':34s} {'ms':>8s} {'vs pp2x1':>8s}")
    for r in rows:
        base = next(x["ms"] for x in rows if x["shape"] == r["shape"] and x["impl"] == "pp2x1")
        ms = r["ms"]
        print(f"{r['shape']:8s} {r['impl']:34s} {ms if ms is None else f'{ms:.4f}':>8} "
              f"{(base / ms) if ms and base else float('nan'):8.3f}")


if __name__ == "__main__":
    main()
