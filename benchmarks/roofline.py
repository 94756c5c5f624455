"""Lower bounds for the benchmark shapes: DRAM bytes and FLOPs of the fused op and of the
GEMM alone, and the times they imply at a device's peak rates.

    python3 benchmarks/roofline.py [--results benchmarks/results/NVIDIA_H200.json]
        [--bw 4.8e12] [--flops 989e12]

Why: the targets compare the fused op with torch._grouped_mm, which moves fewer bytes (it
writes an (M, N) output; the fused op reads C and writes D, both (M, 2N)). This says how much
of each shape's time is physically required, so a gap to the GEMM is read against what the
extra bytes cost. Peaks default to the H200's data-sheet figures (HBM3e 4.8 TB/s, dense BF16
989 TFLOP/s); nothing here is measured. Every byte is counted once (each operand read or
written exactly once from DRAM: the best case), experts with no rows read no weights.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dglu import SHAPES, group_sizes  # noqa: E402


def traffic(sizes, K, N, ab_bytes=2, c_bytes=2, d_bytes=2, dbias=True):
    """DRAM bytes (each tensor once) of the fused op and of the GEMM alone, and the FLOPs."""
    M, experts = sum(sizes), sum(1 for s in sizes if s > 0)
    a, b = M * K * ab_bytes, experts * N * K * ab_bytes
    fused = {"a": a, "b": b, "c": M * 2 * N * c_bytes, "d": M * 2 * N * d_bytes,
             "prob_dprob": 2 * M * 4, "dbias": experts * 2 * N * 2 if dbias else 0}
    gemm = {"a": a, "b": b, "out": M * N * ab_bytes}
    return {"fused_bytes": sum(fused.values()), "gemm_bytes": sum(gemm.values()),
            "flops": 2 * M * N * K, "fused": fused, "gemm": gemm}


def floors_us(t, bw, flops):
    """Microseconds the bytes need at ``bw`` B/s and the FLOPs at ``flops`` FLOP/s."""
    return {"fused_mem_us": t["fused_bytes"] / bw * 1e6, "gemm_mem_us": t["gemm_bytes"] / bw * 1e6,
            "compute_us": t["flops"] / flops * 1e6}


def measured(path):
    """{(shape, impl): ms} of the default rows (no variant) of a bench_dglu JSON."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {(r["shape"], r["impl"]): r["ms"] for r in rows if not r.get("variant") and "ms" in r}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=None, help="a bench_dglu JSON to set against the floors")
    ap.add_argument("--bw", type=float, default=4.8e12, help="DRAM bytes per second")
    ap.add_argument("--flops", type=float, default=989e12, help="dense BF16 FLOP per second")
    args = ap.parse_args(argv)
    got = measured(args.results) if args.results else {}
    print(f"{'shape':8s} {'GFLOP':>7s} {'fused MB':>9s} {'gemm MB':>8s} {'compute us':>10s} "
          f"{'fused mem us':>12s} {'gemm mem us':>11s} {'ours us':>8s} {'gemm us':>8s}")
    for name, (L, per, K, N) in SHAPES.items():
        t = traffic(group_sizes(name, L, per), K, N)
        f = floors_us(t, args.bw, args.flops)
        ours, gemm = got.get((name, "cudnn_ext")), got.get((name, "torch_grouped_mm"))
        print(f"{name:8s} {t['flops'] / 1e9:7.1f} {t['fused_bytes'] / 1e6:9.0f} "
              f"{t['gemm_bytes'] / 1e6:8.0f} {f['compute_us']:10.1f} {f['fused_mem_us']:12.1f} "
              f"{f['gemm_mem_us']:11.1f} "
              + (f"{ours * 1e3:8.1f}" if ours else f"{'-':>8s}") + " "
              + (f"{gemm * 1e3:8.1f}" if gemm else f"{'-':>8s}"))


if __name__ == "__main__":
    main()
