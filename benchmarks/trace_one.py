"""The per-tile timeline of the SM90 kernel's math warpgroups in one launch (a profile, not
a benchmark: the stamps cost a few stores per tile).

    python3 benchmarks/trace_one.py qwen3 [--variant t128c1m2h2] [--no-dbias] [--ctas N] [--json OUT]
    python3 benchmarks/trace_one.py --analyse OUT.json ...   (again, from saved stamps)

Runs the engine's kernel built with ``trace`` (Sm90KernelConfig.trace: clock64 stamps per
tile at the loop top, after the ping-pong turn, after the mainloop, after the epilogue;
globaltimer/clock64 at each warpgroup's start and end) a few times, keeps the last launch's
stamps and prints, in SM cycles (ping-pong):
  * the effective mainloop of each tile but the CTA's first: from the later of its
    warpgroup's turn stamp and the previous mainloop's end in the CTA (either warpgroup) to
    its own end. The turn stamp
    alone does not show the turn wait: ptxas emits the turn barrier as
    ``BAR.SYNC.DEFER_BLOCKING`` and the clock read after it issues before the barrier
    resolves (session 15: 22-29 cycles on every shape), so the wait lands in the mainloop's
    first k-tile wait instead;
  * the gaps where no mainloop runs because the warpgroup whose turn it is is still in its
    epilogue, and the tail after the CTA's last mainloop;
  * the epilogue: steady state (another mainloop runs alongside) and the CTA's last one
    (alone);
  * the SM clock (cycles / ns) and the spread of the CTAs' end times (ns, globaltimer).

``--ctas N`` launches a persistent grid of N CTAs (a multiple of the cluster size, at most
the resident count) instead of the resident count: with fewer CTAs each tile's loads and
stores share the memory system with fewer others, so a phase that shortens is one limited
by the chip's shared bandwidth, not by its own SM. (The clock rises with fewer busy SMs,
which lengthens a bandwidth-bound phase in cycles, so a drop in cycles is the stronger sign;
an SM-bound phase keeps its cycles.)
"""
import gzip
import json
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_dglu import SHAPES, build_plan, group_sizes, make_inputs, variant_knobs  # noqa: E402

MAX_TILES = 64


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def analyse(tr, coop=False):
    """tr: (grid, 2, MAX_TILES + 1, 4) int64 on the host (the kernel's (4, T+1, 2, grid)).
    ``coop``: both warpgroups share every tile (one tile sequence; warpgroup 0's stamps)."""
    eff, gaps, tails, spans, epi_steady, epi_alone, clocks, ends_ns, ntiles = ([] for _ in range(9))
    truncated = False  # a warpgroup ran more tiles than the trace holds
    for blk in tr.tolist():
        wgs = [0] if coop else [0, 1]
        starts = [blk[w][0][1] for w in wgs if blk[w][0][1]]
        if not starts:
            continue
        for w in wgs:
            gt0, c0, gt1, c1 = blk[w][0]
            ends_ns.append(gt1)
            if gt1 > gt0:
                clocks.append((c1 - c0) / (gt1 - gt0))
        # (mainloop end, turn stamp, epilogue end) of every tile of the CTA, in mainloop order
        tiles = sorted((t[2], t[1], t[3]) for w in wgs for t in blk[w][1:] if t[3])
        ntiles.append(len(tiles))
        truncated = truncated or any(blk[w][-1][3] for w in wgs)
        if not tiles:  # a CTA of the grid with no unit to run
            continue
        prev = None
        for s2, s1, s3 in tiles:
            if prev is not None:
                gaps.append(max(0, s1 - prev))
                eff.append(s2 - max(s1, prev))
            prev = s2
        epi_steady += [s3 - s2 for s2, _, s3 in tiles[:-1]]
        epi_alone.append(tiles[-1][2] - tiles[-1][0])
        end = max(blk[w][0][3] for w in wgs)
        tails.append(end - tiles[-1][0])
        spans.append(end - min(starts))
    med = statistics.median
    t_end = max(ends_ns)
    return {
        "truncated": truncated,
        "tiles_per_cta": [min(ntiles), med(ntiles), max(ntiles)],
        "mainloop_eff": [med(eff), pct(eff, 0.1), pct(eff, 0.9)] if eff else None,
        "gap_per_cta": sum(gaps) / len(spans),
        "epilogue_steady": [med(epi_steady), pct(epi_steady, 0.9)] if epi_steady else None,
        "epilogue_alone": med(epi_alone),
        "tail": med(tails),
        "cta_span": [min(spans), med(spans), max(spans)],
        "sm_clock_ghz": [min(clocks), med(clocks), max(clocks)],
        "end_spread_ns": [t_end - pct(ends_ns, 0.5), t_end - min(ends_ns)],
    }


if __name__ == "__main__" and "--analyse" in sys.argv:
    # offline: python3 benchmarks/trace_one.py --analyse trace_qwen3.json ...
    for path in sys.argv[sys.argv.index("--analyse") + 1:]:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            d = json.load(f)
        print(path, json.dumps(analyse(torch.tensor(d["raw"]), coop="k" in d["variant"])))
    sys.exit(0)


def main():
    args = sys.argv[1:]
    name = args[0] if args and not args[0].startswith("--") else "qwen3"
    dbias = "--no-dbias" not in args
    variant = args[args.index("--variant") + 1] if "--variant" in args else "t128c1m2h2"
    from cudnn_ext.engines.base import Knobs

    knobs = Knobs.of(**dict(variant_knobs(variant).values), trace=MAX_TILES)
    if "--ctas" in args:
        from cudnn_ext.engines.sm90 import Sm90Plan, resident_ctas

        ctas = int(args[args.index("--ctas") + 1])
        cl = knobs.get("cluster_m", 1) * knobs.get("cluster_n", 1)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        torch.zeros(1, device="cuda")  # the driver query below needs a current context
        if ctas <= 0 or ctas % cl or ctas > resident_ctas(sms, cl):
            raise ValueError(f"--ctas {ctas}: must be a positive multiple of the cluster size "
                             f"{cl}, at most {resident_ctas(sms, cl)} (the resident count)")
        # the plans' persistent grid on this device (a profiling override of the cache)
        Sm90Plan._resident[(torch.cuda.current_device(), cl)] = ctas
    L, per, K, N = SHAPES[name]
    pack = make_inputs(group_sizes(name, L, per), K, N)
    if not dbias:
        pack["dbias"] = None
    plan, ws, knobs, _ = build_plan(pack, K, N, knobs=knobs, dbias=dbias)
    stream = torch.cuda.current_stream()
    for _ in range(6):  # the last launch's stamps are read
        plan.execute(pack, ws, stream)
    tr = plan.read_trace(ws)  # already cut to the launch's grid
    res = dict(shape=name, variant=variant, dbias=dbias, grid=tr.shape[0],
               **analyse(tr, coop=bool(knobs.get("cooperative", False))))
    print(json.dumps(res))
    if res["truncated"]:
        print(f"WARNING: a warpgroup ran more than {MAX_TILES} tiles; the figures cover "
              f"its first {MAX_TILES} only (tail, gaps and the alone epilogue are wrong)")
    if "--json" in args:
        out = args[args.index("--json") + 1]
        with (gzip.open if out.endswith(".gz") else open)(out, "wt") as f:
            json.dump(dict(res, raw=tr.tolist()), f)


if __name__ == "__main__":
    main()
