"""``python -m cudnn_ext``: ``info`` (versions, devices, engines) and ``demo`` (an MoE backward step).

Owns the command line only; everything it runs goes through the public API.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import platform
import sys
import time


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def cmd_info(_args) -> int:
    import torch

    import cudnn_ext
    from cudnn_ext.engines import ENGINES
    from cudnn_ext.problem import ActConfig, DgluProblem

    print(f"cudnn_ext {cudnn_ext.__version__}  python {platform.python_version()}  ({platform.machine()})")
    for dist in ("torch", "pydantic", "nvidia-cutlass-dsl", "cuda-python", "nvidia-cudnn-frontend", "jax"):
        print(f"  {dist:24s} {_version(dist)}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"  cuda:{i} {p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs")
        device = "cuda"
    else:
        print("  devices: CPU only (torch.cuda.is_available() is False)")
        device = "cpu"
    probe = DgluProblem(n=1024, k=4096, num_experts=8, m=4096, weight_mode="dense", b_major="k",
                        ab_dtype=torch.bfloat16, c_dtype=torch.bfloat16, d_dtype=torch.bfloat16,
                        act=ActConfig(), device_type=device, device_index=0 if device == "cuda" else None)
    print(f"engines (for a BF16 dense dSwiGLU problem on {device}):")
    for eng in ENGINES:
        why = eng.available()
        reasons = [why] if why else eng.check_support(probe)
        status = "can run" if not reasons else "cannot run: " + "; ".join(reasons)
        print(f"  {eng.name:12s} {status}")
    return 0


def _skewed_counts(num_experts: int, mean_rows: int, gen):
    """Token counts with a heavy head and one empty expert, each padded up to 256 rows."""
    import torch

    w = torch.distributions.Pareto(1.0, 1.5).sample((num_experts,))
    counts = (w / w.sum() * mean_rows * num_experts).round().long()
    counts[num_experts // 2] = 0  # an expert that received no tokens
    padded = ((counts + 255) // 256) * 256
    return counts, padded


def cmd_demo(args) -> int:
    import torch

    import cudnn_ext as cudnn
    from cudnn_ext.reference import reference_outputs

    gen = torch.manual_seed(args.seed)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    L = args.experts
    n, k, mean_rows = (args.n or (1536 if cuda else 512)), (args.k or (4096 if cuda else 1024)), (args.rows or (2048 if cuda else 512))
    counts, padded = _skewed_counts(L, mean_rows, gen)
    offsets = torch.cumsum(padded, 0).to(device=device, dtype=torch.int32)
    m = int(offsets[-1])
    print(f"MoE expert-MLP backward (dC of the down projection): {L} experts, tokens/expert {counts.tolist()}")
    print(f"  padded to 256: M={m}, K={k} (hidden), N={n} (ffn), act=dswiglu, dbias on, device={device}")
    a = torch.randn(m, k, device=device).to(torch.bfloat16)  # dY of the down projection
    # zero the padding rows, as a real MoE pipeline does, so they contribute nothing
    valid = torch.zeros(m, dtype=torch.bool, device=device)
    start = 0
    for e in range(L):
        valid[start:start + int(counts[e])] = True
        start += int(padded[e])
    a[~valid] = 0
    b = (torch.randn(L, n, k, device=device) / k ** 0.5).to(torch.bfloat16).permute(1, 2, 0)  # W_down^T per expert
    c = torch.randn(m, 2 * n, device=device).to(torch.bfloat16)  # saved up-projection output (gate|up blocks)
    alpha = torch.ones(L, device=device)
    beta = torch.ones(L, device=device)
    prob = torch.rand(m, 1, 1, device=device)
    dprob = torch.zeros(m, 1, 1, device=device)
    kw = dict(a_tensor=a, c_tensor=c, sfa_tensor=None, padded_offsets=offsets, alpha_tensor=alpha,
              beta_tensor=beta, prob_tensor=prob, dprob_tensor=dprob, b_tensor=b, generate_dbias=True)
    out = cudnn.grouped_gemm_dglu_wrapper(**kw)  # first call: engine choice and compile
    from cudnn_ext import contract
    from cudnn_ext.graph.from_call import graph_for_call

    problem, pack = contract.normalize(contract.Operands(a=a, c=c, padded_offsets=offsets, alpha=alpha, beta=beta,
                                                         prob=prob, dprob=dprob, b=b), contract.CallConfig(),
                                       generate_dbias=True)
    plan = graph_for_call(problem, pack).execution_plan  # the plan the wrapper's calls ran (memoized)
    times = []
    for _ in range(args.iters):
        dprob.zero_()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = cudnn.grouped_gemm_dglu_wrapper(**kw)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    ms = times[len(times) // 2] * 1e3
    flops = 2.0 * m * n * k
    print(f"engine: {plan.describe()}")
    rate = flops / ms / 1e9  # TFLOP/s of GEMM work
    rate_text = f"{rate:.1f} TFLOP/s" if rate >= 1 else f"{rate * 1e3:.1f} GFLOP/s"
    print(f"time: {ms:.3f} ms median of {args.iters} wrapper calls, host overhead included ({rate_text} of GEMM work)")
    ref_pack = dict(pack)
    ref = reference_outputs(problem, ref_pack, compute_dtype=torch.float64)
    rows = slice(0, m)
    d64 = out["d_row_tensor"][..., 0].double()
    err_d = ((d64[rows] - ref["d_row"][rows]).abs().max() / ref["d_row"][rows].abs().max().clamp_min(1e-30)).item()
    err_p = ((out["dprob_tensor"].view(-1).double() - ref["dprob"]).abs().max() / ref["dprob"].abs().max().clamp_min(1e-30)).item()
    err_b = ((out["dbias_tensor"][..., 0].double() - ref["dbias"]).abs().max() / ref["dbias"].abs().max().clamp_min(1e-30)).item()
    print(f"max error vs float64 reference (relative to max |ref|): D {err_d:.2e}, dprob {err_p:.2e}, dbias {err_b:.2e}")
    ok = err_d < 2e-2 and err_p < 1e-2 and err_b < 2e-2
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


def _at_least(lo: int):
    """An argparse type: an int no smaller than ``lo`` (a usage error names the option)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {value}")
        return value
    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cudnn_ext",
        description="cudnn_ext's command line: 'info' prints the versions, devices and engines that "
                    "can run here; 'demo' runs an MoE backward step and checks it against the reference.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions, devices and which engines can run here")
    demo = sub.add_parser("demo", help="a realistic MoE backward step on the best engine available")
    demo.add_argument("--experts", type=_at_least(1), default=8, help="number of experts (default 8)")
    demo.add_argument("--n", type=_at_least(32), default=None, help="ffn width N (default 1536 on GPU, 512 on CPU)")
    demo.add_argument("--k", type=_at_least(8), default=None, help="hidden size K (default 4096 on GPU, 1024 on CPU)")
    demo.add_argument("--rows", type=_at_least(1), default=None, help="mean tokens per expert")
    demo.add_argument("--iters", type=_at_least(1), default=5, help="timed runs (default 5)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    args = parser.parse_args(argv)
    return {"info": cmd_info, "demo": cmd_demo}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
