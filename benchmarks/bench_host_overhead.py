"""Benchmark: host (CPU) overhead of one eager call with a built plan, per entry point.

After the rows with the real engine, the engine's ``execute`` body and the replay's launch
are replaced by no-ops so that only what runs on the host around them is timed: argument
handling, the memo lookup / validation or the replay's guard check, output allocation and
dispatch.

Entry points timed (per call over batches of 50 back-to-back calls after warm-up, median and
best batch, ``time.perf_counter_ns``, the device synchronized before each batch, untimed: on
CUDA the launches are asynchronous, so this is host time):
  core_run            cudnn_ext.functional.run (the shared functional path)
  custom_op           torch.ops.cudnn_ext.grouped_gemm_dglu (dispatcher + core_run)
  python_fn           cudnn_ext.torch.grouped_gemm_dglu (the user function: in eager mode it runs
                      the op's body directly, skipping the dispatcher)
  python_fn_out       the same with out=(d_row, dprob, dbias): caller's buffers, no allocation
                      (both replay remembered calls after one guard check: _core.run_fast;
                      "no replay" rows time the validated path every call takes otherwise)
  custom_op_out       torch.ops.cudnn_ext.grouped_gemm_dglu_out (what torch.compile calls)
  wrapper             cudnn_ext.grouped_gemm_dglu_wrapper (vendor-compatible; memoized after a first call)
  wrapper+<fmt>+<engine>, plan+<fmt>+<engine>
                      a block-scaled (mxfp8, nvfp4) wrapper call and a compiled class-API object's
                      execute, on the real engine (on a Hopper GPU: its launches included)
  layer_call          GroupedGluMLP's backward call (python_fn with its N-major weights and keywords)
  step_op:<op>        each other op the layer's step calls (grouped_mm, glu_forward, grouped_wgrad)
  step:GroupedGluMLP  the layer's whole eager step, forward and backward through autograd
  zeros_only          the three output allocations alone (a floor for any functional op)
  empty_only          the same with torch.empty, and empty_strided_only with torch.empty_strided
                      (what the replay allocates with: a fresh-outputs kernel initializes them)
and, for context, ``custom_op+reference`` (the real reference engine on this tiny problem).

Goal: <= 15 us for the eager call with a built plan (the vendor's wrapper: 55-68 us).
Writes JSON rows to benchmarks/results/host_overhead-<device type>.json (or --out), replacing
the previous result. Not imported by the library.

  python benchmarks/bench_host_overhead.py [--device cpu|cuda] [--reps 2000]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import cudnn_ext  # noqa: E402
import cudnn_ext.torch as ct  # noqa: E402
from cudnn_ext.plan.execution import ExecutionPlan  # noqa: E402
from cudnn_ext import functional as _core  # noqa: E402
from cudnn_ext.runtime import guards as _guards  # noqa: E402
from cudnn_ext.runtime.memo import CALLS  # noqa: E402


def timeit(fn, reps, sync, batch=50):
    """(median, best) microseconds per call over batches of ``batch`` back-to-back calls.

    The best batch is the intrinsic cost; the median shows what a busy host adds.
    """
    for _ in range(max(50, reps // 10)):
        fn()
    per_call = []
    for _ in range(max(1, reps // batch)):
        # an empty launch queue at each batch: a tiny kernel can outlast one call's host
        # work, and a full queue would make back-to-back calls time the GPU instead
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter_ns() - t0) / batch)
    sync()
    return statistics.median(per_call) / 1e3, min(per_call) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--out", default=None,
                    help="JSON path (default: benchmarks/results/host_overhead-<device type>.json)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: small fills stay on the calling thread; timing is not "
                         "hostage to a busy OpenMP pool)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    L, N, K, M = 4, 64, 64, 1024
    bf = torch.bfloat16
    a = torch.randn(M, K, device=dev).to(bf)
    b = torch.randn(L, N, K, device=dev).to(bf)
    c = torch.randn(M, 2 * N, device=dev).to(bf)
    offs = torch.tensor([256, 512, 768, 1024], dtype=torch.int32, device=dev)
    alpha = torch.ones(L, device=dev)
    beta = torch.ones(L, device=dev)
    prob = torch.rand(M, device=dev)
    op = torch.ops.cudnn_ext.grouped_gemm_dglu

    rows = []

    def record(name, fn):
        med, best = timeit(fn, args.reps, sync)
        rows.append({"entry": name, "us_median": round(med, 2), "us_best": round(best, 2)})

    # context: the real plan (whatever engine the call's graph picks here) on the tiny problem
    op(a, b, c, offs, alpha, beta, prob, generate_dbias=True)
    entry = next(e for e in CALLS.entries("op") if e.problem.device_type == dev.type)
    real_engine = entry.plan.engine_name
    record(f"custom_op+{real_engine}", lambda: op(a, b, c, offs, alpha, beta, prob, generate_dbias=True))
    op(a, b, c, offs, alpha, beta, prob, generate_dbias=False)
    nodb = next(e for e in CALLS.entries("op")
                if e.problem.device_type == dev.type and not e.problem.generate_dbias)
    record(f"custom_op+{nodb.plan.engine_name} (no dbias)",
           lambda: op(a, b, c, offs, alpha, beta, prob, generate_dbias=False))
    real_outs = (torch.zeros(M, 2 * N, dtype=bf, device=dev), torch.zeros(M, device=dev),
                 torch.zeros(L, 2 * N, dtype=bf, device=dev))
    record(f"python_fn_out+{real_engine}", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=b, generate_dbias=True, out=real_outs))
    record(f"python_fn_out+{real_engine} (no dbias)", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=b, out=(real_outs[0], real_outs[1], None)))
    record(f"python_fn+{real_engine}", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=b, generate_dbias=True))
    record(f"python_fn+{real_engine} (no dbias)", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=b))
    # block-scaled calls on the real engine (on a Hopper GPU sm90_blockscaled: its dequantization
    # and D quantization launches included): the wrapper (memoized after its first call) and a
    # compiled class-API object's execute
    from cudnn_ext.quant import quantize_mxfp8, quantize_nvfp4
    for fmt, quantize, vec in (("mxfp8", quantize_mxfp8, 32), ("nvfp4", quantize_nvfp4, 16)):
        a_q, sfa = quantize(a.float())
        b_q, sfb = quantize(b.permute(1, 2, 0).float())
        fp8 = fmt == "mxfp8"
        bs_kw = dict(a_tensor=a_q, c_tensor=c, sfa_tensor=sfa, padded_offsets=offs, alpha_tensor=alpha,
                     beta_tensor=beta, prob_tensor=prob, dprob_tensor=torch.zeros(M, device=dev), b_tensor=b_q,
                     sfb_tensor=sfb, sf_vec_size=vec, norm_const_tensor=torch.ones(1, device=dev) if fp8 else None)
        cudnn_ext.grouped_gemm_dglu_wrapper(**bs_kw)
        eng = CALLS.entries("graph")[-1].execution_plan.engine_name
        record(f"wrapper+{fmt}+{eng}", lambda kw=bs_kw: cudnn_ext.grouped_gemm_dglu_wrapper(**kw))
        d_bs = torch.empty(M, 2 * N, dtype=torch.float8_e4m3fn if fp8 else bf, device=dev)
        obj = cudnn_ext.GroupedGemmDglu(
            sample_a=a_q, sample_c=c, sample_d_row=d_bs, sample_d_col=None, sample_sfa=sfa,
            sample_padded_offsets=offs, sample_alpha=alpha, sample_beta=beta, sample_prob=prob,
            sample_dprob=bs_kw["dprob_tensor"], sample_b=b_q, sample_sfb=sfb, sf_vec_size=vec)
        obj.compile()
        record(f"plan+{fmt}+{obj.engine_name}", lambda o=obj, kw=bs_kw, d=d_bs: o.execute(
            a_tensor=kw["a_tensor"], c_tensor=kw["c_tensor"], d_row_tensor=d, d_col_tensor=None,
            sfa_tensor=kw["sfa_tensor"], padded_offsets=offs, alpha_tensor=alpha, beta_tensor=beta,
            prob_tensor=prob, dprob_tensor=kw["dprob_tensor"], b_tensor=kw["b_tensor"], sfb_tensor=kw["sfb_tensor"]))
    # GroupedGluMLP's backward call: N-major w2ᵀ view, every keyword it passes, with a bias
    wt = b.transpose(1, 2).contiguous().transpose(1, 2)
    mlp_kw = dict(act_func="dswiglu", linear_offset=0.0, geglu_alpha=1.702, glu_clamp_max=7.0,
                  glu_clamp_min=-7.0, d_dtype=bf, m_aligned=256)
    record(f"layer_call+{real_engine}", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=wt, generate_dbias=True, **mlp_kw))
    record(f"layer_call+{real_engine} (no dbias)", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=wt, generate_dbias=False, **mlp_kw))
    # every other op GroupedGluMLP's step calls (the swapped TorchTitan experts' too), on the
    # real kernels, and the whole step (forward + backward through autograd)
    from cudnn_ext.torch import layer_ops
    from cudnn_ext.torch.mlp import GroupedGluMLP, grouped_mm, grouped_wgrad
    cfg = dict(act_func="dswiglu", geglu_alpha=1.702, clamp_max=7.0, clamp_min=-7.0, linear_offset=0.0)
    w1 = torch.randn(L, 2 * N, K, device=dev).to(bf)
    record("step_op:grouped_mm", lambda: grouped_mm(a, w1, offs))
    record("step_op:glu_forward", lambda: layer_ops.glu_forward(c, prob, offs, **cfg))
    record("step_op:grouped_wgrad", lambda: grouped_wgrad(a, c, offs))
    layer = GroupedGluMLP(L, K, N, device=dev)
    x = torch.randn(M, K, device=dev).to(bf).requires_grad_()
    grad_y = torch.randn(M, K, device=dev).to(bf)
    record("step:GroupedGluMLP fwd+bwd", lambda: layer(x, prob, offs).backward(grad_y))
    # the same calls without the guarded replay (run_fast): every call keys the memo in Python
    # and runs plan.execute (the hot path before the replay existed), side by side
    _guards.AVAILABLE = False  # nothing is remembered, and nothing remembered is replayed
    saved_slots = {k: v for k, v in CALLS._d.items() if k[0] == "replay"}
    CALLS.clear("replay")
    record(f"python_fn_out+{real_engine} (no dbias, no replay)", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=b, out=(real_outs[0], real_outs[1], None)))
    record(f"python_fn+{real_engine} (no dbias, no replay)", lambda: ct.grouped_gemm_dglu(
        a, c, offs, alpha, beta, prob, b=b))
    _guards.AVAILABLE = True
    for k, v in saved_slots.items():
        CALLS.put(k, v)

    # from here on the engine's execute does nothing: every entry point keeps its own host work
    # (the wrapper its graph, the op its memo) and only the engine's body is removed
    type(entry.plan.compiled).execute = lambda self, pack, workspace=None, stream=None: None
    # ... and the replay's launch (remembered calls, and any remembered from here on)
    ExecutionPlan.address_launcher = (lambda self, m, init, device_index, zeroed_workspace=False:
                                      (lambda *args: None))
    for slots in CALLS.entries("replay"):
        for slot in slots:
            slot.launch = lambda *args: None
            if slot.launch_zeroed is not None:
                slot.launch_zeroed = lambda *args: None
    bt = b.permute(1, 2, 0)
    record("zeros_only", lambda: (torch.zeros((M, 2 * N), dtype=bf, device=dev),
                                  torch.zeros((M,), dtype=torch.float32, device=dev),
                                  torch.zeros((L, 2 * N), dtype=bf, device=dev)))
    record("empty_only", lambda: (torch.empty((M, 2 * N), dtype=bf, device=dev),
                                  torch.empty((M,), dtype=torch.float32, device=dev),
                                  torch.empty((L, 2 * N), dtype=bf, device=dev)))
    record("empty_strided_only", lambda: (
        torch.empty_strided((M, 2 * N), (2 * N, 1), dtype=bf, device=dev),
        torch.empty_strided((M,), (1,), dtype=torch.float32, device=dev),
        torch.empty_strided((L, 2 * N), (2 * N, 1), dtype=bf, device=dev)))
    record("core_run", lambda: _core.run(a, c, offs, alpha, beta, prob, b=bt, generate_dbias=True))
    record("custom_op", lambda: op(a, b, c, offs, alpha, beta, prob, generate_dbias=True))
    record("python_fn", lambda: ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b, generate_dbias=True))
    outs = real_outs  # the same caller buffers as the real-engine rows above
    record("python_fn_out", lambda: ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b, generate_dbias=True,
                                                         out=outs))
    record("python_fn_out (no dbias)", lambda: ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b,
                                                                    out=(outs[0], outs[1], None)))
    op_out = torch.ops.cudnn_ext.grouped_gemm_dglu_out
    record("custom_op_out", lambda: op_out(a, b, c, offs, alpha, beta, prob, *outs))
    dprob = torch.zeros(M, device=dev)
    record("wrapper", lambda: cudnn_ext.grouped_gemm_dglu_wrapper(
        a[..., None], c[..., None], None, offs, alpha, beta, prob[:, None, None], dprob[:, None, None],
        b_tensor=bt, generate_dbias=True))

    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({platform.processor() or platform.machine()})"
    print(f"host overhead per call, {device_name}, torch {torch.__version__}, "
          f"problem L={L} N={N} K={K} M={M}, {args.reps} reps")
    print(f"{'entry':<50}{'median us':>12}{'best us':>10}   (per call, batches of 50)")
    for r in rows:
        print(f"{r['entry']:<50}{r['us_median']:>12.2f}{r['us_best']:>10.2f}")
    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                   f"host_overhead-{dev.type}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "device": device_name, "torch": torch.__version__,
                   "date": date, "cpu_count": os.cpu_count(), "threads": args.threads,
                   "problem": {"L": L, "N": N, "K": K, "M": M}, "rows": rows}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
