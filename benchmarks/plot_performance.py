"""Draw docs/performance.png from a bench_dglu.py result JSON.

    python3 benchmarks/plot_performance.py [--results benchmarks/results/NVIDIA_H200.json]
        [--out docs/performance.png]

One group of bars per shape, one bar per peer: each bar is the peer's time over
torch._grouped_mm's (the GEMM alone) on that shape, lower is better, with the time in ms on
top. Needs matplotlib (the ``bench`` extra); no GPU. Not imported by the library.
"""
import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

#: (impl, variant) of a result row -> legend label, in bar order
PEERS = [
    (("cudnn_ext", None), "cudnn_ext fused"),
    (("cudnn_ext", "discrete"), "cudnn_ext, per-expert weights"),
    (("torch_grouped_mm", None), "torch._grouped_mm, GEMM only"),
    (("quack", None), "quack gemm_dgated"),
    (("torch_unfused_compiled", None), "grouped_mm + compiled epilogue"),
]
COLORS = ["#1f5fa8", "#6b9bd1", "#7f7f7f", "#d98c2b", "#c9c9c9"]
LABELS = {"dsv3": "dsv3\nL 8, K 7168, N 2048", "qwen3": "qwen3\nL 32, K 2048, N 768",
          "mixtral": "mixtral\nL 8, K 4096, N 14336", "skew": "skew\nL 64, K 4096, N 1024"}


def table(result):
    """{shape: {(impl, variant): ms}} of the BF16 rows of the main run that have a time,
    shapes in file order (block-scaled rows and rows of other runs, which carry
    ``bf16_ms_same_run``, are not drawn)."""
    out = {}
    for r in result["rows"]:
        if r.get("ms") and r.get("format", "bf16") == "bf16" and "bf16_ms_same_run" not in r:
            out.setdefault(r["shape"], {})[(r["impl"], r.get("variant"))] = r["ms"]
    return out


def plot(result, out_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = table(result)
    shapes = list(data)
    width = 0.8 / len(PEERS)
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    for i, ((key, label), color) in enumerate(zip(PEERS, COLORS)):
        xs, ys, ms = [], [], []
        for j, s in enumerate(shapes):
            base = data[s].get(("torch_grouped_mm", None))
            if key in data[s] and base:
                xs.append(j + (i - (len(PEERS) - 1) / 2) * width)
                ys.append(data[s][key] / base)
                ms.append(data[s][key])
        bars = ax.bar(xs, ys, width, label=label, color=color, edgecolor="white", linewidth=0.5)
        for bar, t in zip(bars, ms):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.03,
                    f"{t:.3f}", ha="center", va="bottom", fontsize=6.5, rotation=90)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([LABELS.get(s, s) for s in shapes], fontsize=8)
    ax.set_ylabel("time / torch._grouped_mm's (lower is better)", fontsize=8)
    ax.set_ylim(0, max(4.3, ax.get_ylim()[1] * 1.2))
    ax.tick_params(axis="y", labelsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=7.5, frameon=False, loc="upper right", ncol=2)
    ax.set_title(f"Grouped GEMM + dSwiGLU backward with dprob and dbias, {result['device']}, "
                 f"{result['date']}\nbars labelled in ms (device time, median of round-robin "
                 f"calls): {result['command']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(HERE, "results", "NVIDIA_H200.json"),
                    help="a bench_dglu.py JSON (default: the H200's)")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "performance.png"))
    args = ap.parse_args(argv)
    with open(args.results) as f:
        result = json.load(f)
    plot(result, args.out)
    print("wrote", os.path.normpath(args.out))


if __name__ == "__main__":
    main()
