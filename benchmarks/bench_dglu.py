"""Benchmark: grouped GEMM + dGLU backward on one GPU, cudnn_ext against its peers.

Peers, side by side in one process on the same inputs:
  cudnn_ext               the fused SM90 engine (GEMM + dSwiGLU + dprob + dbias), its plan's
                          execute on a caller workspace (with dbias: a zeroing kernel, then
                          the kernel)
  cudnn_ext_op            (row impl "cudnn_ext", variant "op") the torch op's out= call, what
                          training code calls: a replay, one kernel
  cudnn_ext_discrete      (row impl "cudnn_ext", variant "discrete") the same with per-expert
                          weights (b_ptrs: one allocation per expert, K-major, device-built
                          TMA descriptors)
  cudnn_ext_act:<act>[+<feature>]  (row impl "cudnn_ext", variant "<act>" or
                          "<act>+<feature>") the engine's kernel with dswiglu, dgeglu or
                          dsituglu (its betas 4 and 25, on bf16 operands as the block-scaled
                          engine runs it); +activation stores the activation output (M, N)
                          bf16 too (the vendor's activation_tensor), +deterministic runs the
                          kernel's fixed-order dprob/dbias form (Sm90Config.deterministic,
                          built straight from the engine: its support check does not offer it)
  cudnn_ext_round_dgrad   (variant "round_dgrad") dSwiGLU with round_dgrad_to_input_dtype
  <fmt>:<impl>            block-scaled rows (format nvfp4, mxfp4 or mxfp8: A and B quantized
                          from the same values, dSwiGLU, prob, dprob, dbias; FP4 D bf16 with
                          amax, FP8 D e4m3 with SFD_row/SFD_col): impl cudnn_ext (through
                          the wrapper: FP4 on sm90_blockscaled, pinned; MXFP8 on the engine
                          the heuristics pick), composed (what a user
                          writes today: cudnn_ext.quant.dequantize of A and B to bf16, then
                          our BF16 kernel; FP8: then the public D quantizer) and reference
                          (the reference engine on the GPU), e.g. nvfp4:cudnn_ext
  fp8_blockwise:<peer>    the fp8_blockwise recipe (A e4m3 with 1x128 scales, B with 128x128
                          ones, quantized once from the same values): cudnn_ext (the
                          sm90_fp8_blockwise engine's plan execute, FP8 WGMMA, dSwiGLU, prob,
                          dprob, dbias, bf16 D; cudnn_ext:pp64 pins the ping-pong 128 x 64
                          configuration, cudnn_ext:<variant> any other, e.g.
                          cudnn_ext:t128c2m2n2k), quantize (the device quantize_fp8_blockwise of
                          A alone) or quantize_ref (the pure-torch reference of it)
  torch_grouped_mm        torch._grouped_mm alone (the GEMM only, bf16 out): the bar to beat
  torch_unfused_compiled  torch._grouped_mm + a torch.compile'd epilogue (what users write)
  torch_scaled_grouped_mm torch._scaled_grouped_mm alone with FP8 rowwise scales (e4m3 A and B,
                          one fp32 scale per row of A and per column of each expert's B, fast
                          accumulation, bf16 out): the nearest FP8 grouped GEMM on Hopper
  torch_unfused_fp8_compiled  that FP8 GEMM + the compiled epilogue (the unfused FP8 path)
  quack                   quack.gemm_interface.gemm_dgated with cu_seqlens_m (tuned=False;
                          its own gate/up layout, no dbias), if quack-kernels is importable

Prints ms (median of --reps timed runs after warm-up, CUDA events; --timer gpu, the default:
device time, each call's launch hidden behind a spin kernel; --timer launch: from an idle
stream, so the host's issue latency is in the span), TFLOP/s (2*rows*N*K) and ratios; writes
JSON rows {"shape", "impl", "ms", "tflops", ...} plus the command, device, date, the rounds
and which cudnn_ext was imported to benchmarks/results/<device>.json (or --out), replacing
that device's previous result. Not imported by the library.

Timing is round-robin (--rounds, default 5): every row of a shape is built and warmed first,
then each round times reps/rounds calls of every row, starting one row later than the round
before. Sustained load lowers the clocks, so a row timed after the others reads slower than
the same kernel timed first (1-12% on dsv3 when rows ran one after another); rotating spreads
that over all rows. --rounds 1 times the rows one after another.

  python benchmarks/bench_dglu.py [--shapes dsv3,qwen3,mixtral,skew] [--reps 50]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import time
import traceback

import torch

SHAPES = {
    # name: (L, rows per expert (mean), K, N)
    "dsv3": (8, 4096, 7168, 2048),
    "qwen3": (32, 512, 2048, 768),
    "mixtral": (8, 2048, 4096, 14336),
    "skew": (64, 512, 4096, 1024),
}
#: Shapes timed only when named in --shapes (not the four default ones): the K and N axes
#: of the schedule choice between ping-pong 128 x 128 and cooperative 128 x 256 tiles.
#: k6k is Mixtral 8x22B's expert MLP (hidden 6144, 16384 wide); k5k, k6kd, k8k and k12k are
#: dsv3 with another K; k6kn4, k6kn8, k7kn8, k7kn16, k6kn12 and k7kn12 widen N at K 6144 and
#: 7168 (where the cooperative rule's N bound holds); k4k (dsv3 at K 4096), k5kn4 and k5kn8
#: (K 5120 at N 4096, 8192); and skew's neighbours (below).
EXTRA_SHAPES = {
    "k6k": (8, 2048, 6144, 16384),
    "k5k": (8, 4096, 5120, 2048),
    "k6kd": (8, 4096, 6144, 2048),
    "k8k": (8, 4096, 8192, 2048),
    "k12k": (8, 4096, 12288, 2048),
    "k6kn4": (8, 4096, 6144, 4096),
    "k6kn8": (8, 2048, 6144, 8192),
    "k7kn8": (8, 2048, 7168, 8192),
    "k7kn16": (8, 2048, 7168, 16384),
    "k6kn12": (8, 2048, 6144, 12288),
    "k7kn12": (8, 2048, 7168, 12288),
    "k4k": (8, 4096, 4096, 2048),
    "k5kn4": (8, 4096, 5120, 4096),
    "k5kn8": (8, 2048, 5120, 8192),
    # skew's L and rows per expert, uniform groups (u) or skew's Pareto sizes (skew*)
    "u4kn1": (64, 512, 4096, 1024),
    "skewn2": (64, 512, 4096, 2048),
    "skewk2": (64, 512, 2048, 1024),
    # inside the 2-stage cooperative band, K 4608 and N 512 (skew's sizes), and below it,
    # K 3072 and K 2048 at N 512
    "skewk46": (64, 512, 4608, 1024),
    "skewn5": (64, 512, 4096, 512),
    "skewk3": (64, 512, 3072, 1024),
    "skewk3n5": (64, 512, 3072, 512),
    "skewk2n5": (64, 512, 2048, 512),
    # ... and N 768 inside the band, N 1536 past its N edge
    "skewn7": (64, 512, 4096, 768),
    "skewn15": (64, 512, 4096, 1536),
    "u4kn15": (64, 512, 4096, 1536),  # uniform groups (Qwen3-235B's K and N)
}


def group_sizes(name, L, rows, seed=0):
    if not name.startswith("skew"):
        return [rows] * L
    # Pareto(alpha=1.5) sizes with mean `rows`, every 8th expert empty, 256-aligned
    g = torch.Generator().manual_seed(seed)
    alpha = 1.5
    xm = rows * (alpha - 1) / alpha
    sizes = []
    for i in range(L):
        if i % 8 == 7:
            sizes.append(0)
            continue
        u = float(torch.rand(1, generator=g))
        x = xm / (1 - u) ** (1 / alpha)
        sizes.append(int(math.ceil(min(x, 16 * rows) / 256)) * 256)
    return sizes


def time_once(fn):
    """Milliseconds of one call, CUDA events around it, synchronized: the "launch" timer.
    The stream is idle when the first event is recorded, so the span also holds the host's
    time to issue the call (its launch latency), which differs between peers."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e)


class DeviceTimer:
    """The "gpu" timer: milliseconds of one call on the device, host launch latency hidden.

    A spin kernel (``torch.cuda._sleep``) keeps the stream busy for ``busy_us`` before the
    first event, so the host issues the call while the GPU still spins and the events
    bracket only the call's own kernels and the gaps between them (what an asynchronous
    training step sees; triton's do_bench hides the launch the same way behind its cache
    flush). Counts the calls whose host issue time exceeded the spin (``late``): for those
    the span still holds part of the launch latency, and the row reports it."""

    def __init__(self, busy_us=1000.0):
        self.busy_us = busy_us
        self.cycles = None
        self.late = 0
        self.max_issue_us = 0.0
        self.issue_us = []  # host issue time of every timed call

    def _calibrate(self):
        # cycles per microsecond of the spin kernel at the clocks of the moment, measured once
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe = 1_000_000
        torch.cuda._sleep(probe // 10)  # warm the spin kernel
        s.record()
        torch.cuda._sleep(probe)
        e.record()
        torch.cuda.synchronize()
        self.cycles = int(probe / (s.elapsed_time(e) * 1e3) * self.busy_us)

    def __call__(self, fn):
        if self.cycles is None:
            self._calibrate()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(self.cycles)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        issue_us = (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize()
        self.max_issue_us = max(self.max_issue_us, issue_us)
        self.issue_us.append(issue_us)
        # with a margin: the calibration is approximate and the spin starts a few µs after
        # it is enqueued
        if issue_us > 0.8 * self.busy_us:
            self.late += 1
        return s.elapsed_time(e)


TIMERS = {"gpu": DeviceTimer, "launch": lambda: time_once}


def bench(fn, warmup, reps):
    """Median ms of one callable over ``reps`` timed calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(time_once(fn) for _ in range(reps))


def round_robin_order(names, rounds):
    """The order of ``names`` in each of ``rounds`` rounds: rotated by one per round."""
    n = len(names)
    return [names[r % n:] + names[:r % n] for r in range(rounds)] if n else []


def bench_round_robin(fns, warmup, reps, rounds, timer=time_once, sync=None):
    """Median ms of each callable in ``fns`` (name -> fn): ``warmup`` calls each, then
    ``rounds`` rounds of ceil(reps / rounds) timed calls of every entry in rotated order.
    ``timer`` times one call, or maps each name to its own timer.
    Returns (medians, errors): an entry that raises is dropped and its error reported."""
    timer_of = timer.get if isinstance(timer, dict) else (lambda _name: timer)
    sync = sync or torch.cuda.synchronize
    rounds = max(rounds, 1)
    errors = {}
    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            sync()
        except Exception as exc:  # a peer that cannot run is recorded, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
    live = [n for n in fns if n not in errors]
    per_round = max(1, -(-reps // rounds))
    times = {n: [] for n in live}
    for order in round_robin_order(live, rounds):
        for name in order:
            if name in errors:
                continue
            try:
                for _ in range(per_round):
                    times[name].append(timer_of(name)(fns[name]))
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"[:500]
    return {n: statistics.median(t) for n, t in times.items() if n not in errors}, errors


def make_inputs(sizes, K, N, dev="cuda"):
    L = len(sizes)
    M = sum(sizes)
    offs = torch.tensor(list(_cumsum(sizes)), dtype=torch.int32, device=dev)
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    b = (torch.randn(L, N, K, device=dev, dtype=torch.bfloat16) / math.sqrt(K)).permute(1, 2, 0)
    c = torch.randn(M, 2 * N, device=dev, dtype=torch.bfloat16)
    pack = dict(
        a=a, b=b, c=c, d_row=torch.empty(M, 2 * N, device=dev, dtype=torch.bfloat16),
        padded_offsets=offs, alpha=torch.rand(L, device=dev) + 0.5,
        beta=torch.rand(L, device=dev) + 0.5, prob=torch.rand(M, device=dev),
        dprob=torch.zeros(M, device=dev), dbias=torch.zeros(L, 2 * N, device=dev, dtype=torch.bfloat16),
    )
    return pack


def _cumsum(xs):
    s = 0
    for x in xs:
        s += x
        yield s


def run_cudnn_ext_discrete(pack, K, N, dbias=True, knobs=None):
    """The engine on per-expert weight allocations (the same values as the dense B)."""
    b = pack["b"]  # (N, K, L) view of (L, N, K)
    weights = [b[:, :, e].contiguous() for e in range(b.shape[2])]
    dpack = dict(pack, b=None, b_ptrs=torch.tensor([w.data_ptr() for w in weights],
                                                    dtype=torch.int64, device="cuda"))
    dpack["_keep"] = weights  # the table does not own the experts' memory
    fn, extra = run_cudnn_ext(dpack, K, N, knobs=knobs, dbias=dbias, weight_mode="discrete")
    return fn, extra


def build_plan(pack, K, N, knobs=None, dbias=True, weight_mode="dense", act="dswiglu",
               round_dgrad=False, d_dtype=torch.bfloat16, m_aligned=256, deterministic=False):
    """(plan, workspace, knobs, build seconds) of the SM90 engine for the pack's problem
    (``knobs`` None: the engine's choice; a ``Knobs`` of config fields: that config). The
    activation output is generated when the pack holds one."""
    from cudnn_ext.engines.base import Knobs
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for
    from cudnn_ext.problem import ActConfig, DgluProblem

    L = pack["alpha"].shape[0]
    M = pack["a"].shape[0]
    eng = Sm90DgluEngine()
    problem = DgluProblem(n=N, k=K, num_experts=L, m=M, weight_mode=weight_mode, b_major="k",
                          ab_dtype=torch.bfloat16, c_dtype=torch.bfloat16,
                          d_dtype=d_dtype, act=ActConfig(act),
                          generate_dbias=dbias, device_type="cuda", device_index=0,
                          generate_activation=pack.get("activation") is not None,
                          round_dgrad_to_input_dtype=round_dgrad, m_aligned=m_aligned,
                          deterministic=deterministic)
    if knobs is None:
        knobs = min(eng.knob_space(problem), key=lambda k: eng.cost(problem, k))
    config = config_for(problem, **knobs.as_dict()) if isinstance(knobs, Knobs) else knobs
    t0 = time.perf_counter()
    plan = eng.build(problem, config)
    build_s = time.perf_counter() - t0
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    return plan, ws, knobs, build_s


def run_cudnn_ext(pack, K, N, knobs=None, dbias=True, weight_mode="dense", act="dswiglu",
                  round_dgrad=False, deterministic=False):
    from cudnn_ext.engines.sm90 import compile_seconds
    from cudnn_ext.runtime import compile_cache

    seen = len(compile_cache.events)
    plan, ws, knobs, build_s = build_plan(pack, K, N, knobs, dbias, weight_mode, act,
                                          round_dgrad, deterministic=deterministic)
    stream = torch.cuda.current_stream()
    # first_compile_s is a load, not a compile, when the persistent cache had the kernel:
    # the row says which ("hit" or "compiled"; none when this process had it already)
    return (lambda: plan.execute(pack, ws, stream)), dict(
        knobs=knobs.as_dict(), first_compile_s=compile_seconds(plan.config) or build_s,
        compile_cache=[e[1] for e in compile_cache.events[seen:]])


def run_cudnn_ext_op(pack, dbias=True):
    """The torch op's ``out=`` call, the user-facing path with the lowest host overhead:
    after its first call a replay, and with dbias one kernel on a scratch kept zero (the
    plan rows above launch the workspace's zeroing kernel first). Writes the pack's outputs
    (dprob and dbias are accumulated into, as in the plan rows)."""
    from cudnn_ext.torch import grouped_gemm_dglu

    b = pack["b"].permute(2, 0, 1)  # (L, N, K) contiguous
    out = (pack["d_row"], pack["dprob"], pack["dbias"] if dbias else None)
    args = (pack["a"], pack["c"], pack["padded_offsets"], pack["alpha"], pack["beta"],
            pack["prob"])
    return (lambda: grouped_gemm_dglu(*args, b=b, generate_dbias=dbias, out=out)), {}


def variant_knobs(v):
    """Knobs of a variant string t<tile_n>c<c_stages>[m<cluster_m>][n<cluster_n>][s<ab_stages>]
    [r<raster_group_m>][h<c_split>][k[x<split_last>]][a][g] (k: the cooperative schedule; h: C
    ring entries of 128 / c_split rows; x: its last round split along K in up to that many
    parts; a: the activation output staged through shared memory, ``act_staged``; g: (e4m3)
    ``wg_stagger``), e.g. 't128c1m2', 't256c2m2k', 't128c1m2h2', 't256c4m2s3kx3', 't256c2m2ka',
    't128c2m2kg'."""
    from cudnn_ext.engines.base import Knobs
    from cudnn_ext.engines.sm90 import RASTER_GROUP_M

    mt = re.fullmatch(r"t(\d+)c(\d+)(?:m(\d+))?(?:n(\d+))?(?:s(\d+))?(?:r(\d+))?(?:h(\d+))?"
                      r"(k?)(?:x(\d+))?(a?)(g?)", v)
    if not mt or (mt[9] and not mt[8]):
        raise ValueError(f"variant {v!r}: expected t<tile_n>c<c_stages>[m<cluster_m>]"
                         "[n<cluster_n>][s<ab_stages>][r<raster_group_m>][h<c_split>]"
                         "[k[x<split_last>]][a][g]")
    cl = int(mt[3] or 1)
    return Knobs.of(tile_n=int(mt[1]), c_stages=int(mt[2]), cluster_m=cl,
                    cluster_n=int(mt[4] or 1), ab_stages=int(mt[5] or 0),
                    raster_group_m=int(mt[6] or RASTER_GROUP_M[cl]), cooperative=bool(mt[8]),
                    **({"c_split": int(mt[7])} if mt[7] else {}),
                    **({"split_last": int(mt[9])} if mt[9] else {}),
                    **({"act_staged": True} if mt[10] else {}),
                    **({"wg_stagger": True} if mt[11] else {}))


def run_grouped_mm(pack):
    a, offs = pack["a"], pack["padded_offsets"]
    bt = pack["b"].permute(2, 1, 0)  # (L, K, N), K contiguous
    return lambda: torch._grouped_mm(a, bt, offs=offs)


def fp8_rowwise(pack):
    """A and B quantized to e4m3 with one fp32 scale per row of A and per (expert, column) of
    B (amax / 448), laid out as torch._scaled_grouped_mm takes them: A (M, K) row-major, B
    (L, K, N) with K contiguous, scales (M,) and (L, N)."""
    a = pack["a"].float()
    sa = (a.abs().amax(1).clamp(min=1e-12) / 448.0)
    a8 = (a / sa[:, None]).to(torch.float8_e4m3fn)
    b = pack["b"].permute(2, 0, 1).float()  # (L, N, K)
    sb = (b.abs().amax(2).clamp(min=1e-12) / 448.0)
    b8 = (b / sb[:, :, None]).to(torch.float8_e4m3fn).transpose(1, 2)  # (L, K, N), K contiguous
    return a8, b8, sa, sb


def run_scaled_grouped_mm(pack):
    a8, b8, sa, sb = fp8_rowwise(pack)
    offs = pack["padded_offsets"]
    return lambda: torch._scaled_grouped_mm(a8, b8, sa, sb, offs=offs, out_dtype=torch.bfloat16,
                                            use_fast_accum=True)


def make_unfused(pack, N, fp8=False):
    a, offs, c = pack["a"], pack["padded_offsets"], pack["c"]
    bt = pack["b"].permute(2, 1, 0)
    gemm = (run_scaled_grouped_mm(pack) if fp8 else lambda: torch._grouped_mm(a, bt, offs=offs))
    L = offs.shape[0]
    M = a.shape[0]
    eid = torch.searchsorted(offs, torch.arange(M, device="cuda", dtype=torch.int32), right=True)
    eid = eid.clamp_(max=L - 1)

    @torch.compile(dynamic=False)
    def epilogue(acc, c, alpha, beta, prob, eid):
        g0 = acc.float() * (alpha[eid] ** 2)[:, None]
        cv = c.float().view(M, N // 32, 2, 32) * beta[eid][:, None, None, None]
        gate, up = cv[:, :, 0, :].reshape(M, N), cv[:, :, 1, :].reshape(M, N)
        s = torch.sigmoid(gate)
        p = prob[:, None]
        dgate = g0 * p * up * s * (1 + gate * (1 - s))
        dup = g0 * p * gate * s
        dprob_term = (g0 * up * gate * s).sum(1)
        d = torch.stack([dgate.view(M, N // 32, 32), dup.view(M, N // 32, 32)], 2).view(M, 2 * N)
        dbias = torch.zeros(L, 2 * N, device=acc.device).index_add_(0, eid, d)
        return d.to(torch.bfloat16), dprob_term, dbias

    def fn():
        acc = gemm()
        d, dp, db = epilogue(acc, c, pack["alpha"], pack["beta"], pack["prob"], eid)
        pack["dprob"].add_(dp)
        return d, db

    return fn


def make_quack(pack, N):
    import quack.gemm_runtime.identity as ident

    orig = ident.semantic_value_key
    if not getattr(orig, "_cudnn_ext_shim", False):
        def shim(value, seen):  # quack 0.6.5 vs DSL 4.8.1: opaque key for unkeyable objects
            try:
                return orig(value, seen)
            except TypeError:
                return ("opaque-shim",)
        shim._cudnn_ext_shim = True
        ident.semantic_value_key = shim
        try:
            import quack.operand_transform.frontend as fe
            fe._semantic_value_key = shim
        except Exception:
            pass
    from quack.gemm_interface import gemm_dgated

    a, offs, c = pack["a"], pack["padded_offsets"], pack["c"]
    bt = pack["b"].permute(2, 1, 0)  # (L, K, N)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), offs])
    dx = torch.empty_like(c)
    post = torch.empty(c.shape[0], N, dtype=c.dtype, device="cuda")
    prob = pack["prob"]

    def fn():
        return gemm_dgated(a, bt, c, activation="swiglu", dx_out=dx, postact_out=post,
                           colvec_scale=prob, colvec_reduce=True, cu_seqlens_m=cu,
                           tuned=False)

    return fn


def host_overhead_us(n_calls=2000, dbias=True):
    """Wall time per call of back-to-back executes on a tiny problem (launch-bound)."""
    pack = make_inputs([256], 64, 32)
    if not dbias:
        pack["dbias"] = None
    fn, _ = run_cudnn_ext(pack, 64, 32, dbias=dbias)
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n_calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n_calls * 1e6


def build_impl(impl, pack, K, N, dbias, args, row):
    """(fn, extra) for one --impls entry; sets the row's impl/variant names."""
    extra = {}
    if impl == "cudnn_ext":
        knobs = None
        if args.tile_n:
            from cudnn_ext.engines.base import Knobs
            knobs = Knobs.of(tile_n=args.tile_n, raster_group_m=8)
        fn, extra = run_cudnn_ext(pack, K, N, knobs, dbias=dbias)
    elif impl.startswith("cudnn_ext:"):
        v = impl.split(":", 1)[1]
        fn, extra = run_cudnn_ext(pack, K, N, variant_knobs(v), dbias=dbias)
        row.update(impl="cudnn_ext", variant=v)
    elif impl.startswith("cudnn_ext_discrete:"):
        v = impl.split(":", 1)[1]
        fn, extra = run_cudnn_ext_discrete(pack, K, N, dbias=dbias, knobs=variant_knobs(v))
        row.update(impl="cudnn_ext", variant=f"discrete:{v}")
    elif impl == "cudnn_ext_discrete":
        fn, extra = run_cudnn_ext_discrete(pack, K, N, dbias=dbias)
        row.update(impl="cudnn_ext", variant="discrete")  # one impl name, told apart by variant
    elif impl == "cudnn_ext_op":
        fn, extra = run_cudnn_ext_op(pack, dbias=dbias)
        row.update(impl="cudnn_ext", variant="op")  # one impl name, told apart by variant
    elif impl.startswith("cudnn_ext_act:"):
        v = impl.split(":", 1)[1]
        spec, _, config = v.partition(":")
        act, _, feature = spec.partition("+")
        if act not in ("dswiglu", "dgeglu", "dsituglu") or feature not in ("", "activation", "deterministic"):
            raise SystemExit(f"--impls {impl}: expected cudnn_ext_act:<dswiglu|dgeglu|dsituglu>"
                             f"[+activation|+deterministic][:<variant>]")
        feat = pack
        if feature == "activation":
            M = pack["a"].shape[0]
            feat = dict(pack, activation=torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
        fn, extra = run_cudnn_ext(feat, K, N, variant_knobs(config) if config else None, dbias=dbias,
                                  act=act, deterministic=feature == "deterministic")
        row.update(impl="cudnn_ext", variant=v)
    elif impl == "cudnn_ext_round_dgrad":
        fn, extra = run_cudnn_ext(pack, K, N, dbias=dbias, round_dgrad=True)
        row.update(impl="cudnn_ext", variant="round_dgrad")
    elif impl.startswith("fp8_blockwise:"):
        peer = impl.split(":", 1)[1]
        fn, extra = make_fp8_blockwise(pack, K, N, peer, dbias)
        impl_name, _, variant = peer.partition(":")
        row.update(impl=impl_name, format="fp8_blockwise", **({"variant": variant} if variant else {}))
    elif ":" in impl and impl.split(":", 1)[0] in BLOCK_FORMATS:
        fmt, peer = impl.split(":", 1)
        fn, extra = make_blockscaled(pack, K, N, fmt, peer, dbias)
        row.update(impl=peer, format=fmt)
    elif impl == "torch_grouped_mm":
        fn = run_grouped_mm(pack)
    elif impl == "torch_unfused_compiled":
        fn = make_unfused(pack, N)
    elif impl == "torch_scaled_grouped_mm":
        fn = run_scaled_grouped_mm(pack)
        row.update(format="fp8_rowwise")
    elif impl == "torch_unfused_fp8_compiled":
        fn = make_unfused(pack, N, fp8=True)
        row.update(format="fp8_rowwise")
    elif impl == "quack":
        fn = make_quack(pack, N)
    else:
        raise ValueError(impl)
    return fn, extra


#: block-scaled formats of the <fmt>:<impl> rows: (quantizer, its keyword arguments, sf_vec)
BLOCK_FORMATS = {
    "nvfp4": ("nvfp4", dict(sf_vec_size=16, sf_dtype=torch.float8_e4m3fn), 16),
    "mxfp4": ("nvfp4", dict(sf_vec_size=32, sf_dtype=torch.float8_e8m0fnu), 32),
    "mxfp8": ("mxfp8", dict(fp8_dtype=torch.float8_e4m3fn), 32),
}


def make_fp8_blockwise(pack, K, N, peer, dbias):
    """(fn, extra) of one fp8_blockwise row: the pack's A quantized per 1x128 block and B per
    128x128 block (``cudnn_ext.torch.quantize_fp8_blockwise``, once), then ``cudnn_ext``: the
    sm90_fp8_blockwise engine's plan execute (dSwiGLU, prob, dprob, dbias; bf16 D; its knob
    space's configuration, with ``cudnn_ext:pp64`` the ping-pong 128 x 64 one, with
    ``cudnn_ext:<variant>`` that variant's (``variant_knobs``)), or
    ``quantize``: quantizing A alone on the device kernel, what quantizing dY on the fly costs
    (``quantize_ref``: the same through the pure-torch reference)."""
    from cudnn_ext.engines.sm90 import config_for
    from cudnn_ext.engines.sm90_fp8_blockwise import Sm90Fp8BlockwiseEngine, kernel_problem
    from cudnn_ext.problem import ActConfig, DgluProblem
    from cudnn_ext.quant import quantize_fp8_blockwise as reference_quantize
    from cudnn_ext.torch import quantize_fp8_blockwise

    if peer in ("quantize", "quantize_ref"):
        fn = quantize_fp8_blockwise if peer == "quantize" else reference_quantize
        return (lambda: fn(pack["a"], (1, 128))), {}
    if peer != "cudnn_ext" and not peer.startswith("cudnn_ext:"):
        raise SystemExit(f"fp8_blockwise:{peer}: the fp8_blockwise peers are cudnn_ext, cudnn_ext:pp64, "
                         f"cudnn_ext:<variant>, quantize and quantize_ref")
    a_q, sfa = quantize_fp8_blockwise(pack["a"], (1, 128))
    b_q, sfb = quantize_fp8_blockwise(pack["b"], (128, 128))  # (N, K, L), K-major per expert
    L, M = pack["alpha"].shape[0], pack["a"].shape[0]
    problem = DgluProblem(n=N, k=K, num_experts=L, m=M, weight_mode="dense", b_major="k",
                          ab_dtype=torch.float8_e4m3fn, c_dtype=torch.bfloat16, d_dtype=torch.bfloat16,
                          act=ActConfig("dswiglu"), generate_dbias=dbias, device_type="cuda", device_index=0,
                          recipe="fp8_blockwise")
    eng = Sm90Fp8BlockwiseEngine()
    (knobs,) = eng.knob_space(problem)
    if peer == "cudnn_ext:pp64":
        knobs = config_for(kernel_problem(problem), tile_n=64, cluster_m=2)
    elif peer.startswith("cudnn_ext:"):
        knobs = config_for(kernel_problem(problem), **variant_knobs(peer.split(":", 1)[1]).as_dict())
    t0 = time.perf_counter()
    plan = eng.build(problem, knobs)
    build_s = time.perf_counter() - t0
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    fp8_pack = dict(pack, a=a_q, b=b_q, sfa=sfa, sfb=sfb)
    stream = torch.cuda.current_stream()
    return (lambda: plan.execute(fp8_pack, ws, stream)), dict(knobs=knobs.as_dict(), first_compile_s=build_s)


def make_blockscaled(pack, K, N, fmt, peer, dbias):
    """(fn, extra) of one block-scaled row: the pack's A and B quantized to ``fmt``."""
    import cudnn_ext
    from cudnn_ext import quant

    kind, qkw, vec = BLOCK_FORMATS[fmt]
    quantize = quant.quantize_nvfp4 if kind == "nvfp4" else quant.quantize_mxfp8
    a_q, sfa = quantize(pack["a"].float(), **qkw)
    b_q, sfb = quantize(pack["b"].float(), **qkw)  # (N, K, L)
    fp8 = kind == "mxfp8"
    M = pack["a"].shape[0]
    nc = torch.ones(1, device="cuda")
    common = dict(a_tensor=a_q, c_tensor=pack["c"], sfa_tensor=sfa,
                  padded_offsets=pack["padded_offsets"], alpha_tensor=pack["alpha"],
                  beta_tensor=pack["beta"], prob_tensor=pack["prob"], dprob_tensor=pack["dprob"],
                  b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=vec, generate_dbias=dbias,
                  norm_const_tensor=nc if fp8 else None)
    if peer in ("cudnn_ext", "reference"):
        ours = "sm90_blockscaled"  # pinned: the row measures the Hopper engine itself
        call = dict(common, engine=ours if peer == "cudnn_ext" else "reference")
        fn = lambda: cudnn_ext.grouped_gemm_dglu_wrapper(**call)  # noqa: E731
        from cudnn_ext.engines.sm90 import _compiled  # first compile of the new variants
        before = set(_compiled)
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        extra = dict(first_compile_s=round(time.perf_counter() - t0, 3),
                     new_kernel_configs=len(set(_compiled) - before))
        if peer == "cudnn_ext":  # the engine the wrapper's (newest) built graph runs
            from cudnn_ext.runtime.memo import CALLS
            extra["engine"] = CALLS.entries("graph")[-1].execution_plan.engine_name
        del out
        return fn, extra
    if peer != "composed":
        raise ValueError(f"{fmt}:{peer}: the block-scaled peers are cudnn_ext, composed, reference")
    # FP8: fp32 D, then the public block quantizer along rows (D_row + SFD_row)
    d_dtype = torch.float32 if fp8 else torch.bfloat16
    plan, ws, _, _ = build_plan(pack, K, N, dbias=dbias, d_dtype=d_dtype)
    stream = torch.cuda.current_stream()
    d = torch.empty(M, 2 * N, device="cuda", dtype=d_dtype)

    def fn():
        a16 = quant.dequantize(a_q, sfa, vec).to(torch.bfloat16)
        b16 = quant.dequantize(b_q, sfb, vec).to(torch.bfloat16)
        plan.execute(dict(pack, a=a16, b=b16, d_row=d), ws, stream)
        if fp8:
            quant.quantize_mxfp8(d)

    return fn, {}


def _print_block_scaled_ratios(rows):
    """Per shape and block-scaled format: our time over our BF16 kernel's (the plan row),
    and the composed path's and the reference engine's times over ours."""
    def ms(shape, impl, fmt):
        r = next((x for x in rows if x["shape"] == shape and x["impl"] == impl
                  and x.get("format") == fmt and not x.get("variant") and x.get("ms")), None)
        return r["ms"] if r else None

    fmts = sorted({r["format"] for r in rows if r.get("format", "bf16") != "bf16"})
    if not fmts:
        return
    print(f"\n{'shape':9s} {'format':7s} {'x bf16':>7s} {'composed/us':>12s} {'reference/us':>13s}")
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for fmt in fmts:
            ours, bf16 = ms(shape, "cudnn_ext", fmt), ms(shape, "cudnn_ext", "bf16")
            comp, ref = ms(shape, "composed", fmt), ms(shape, "reference", fmt)
            cell = lambda x, y: f"{x / y:.2f}" if x and y else "-"  # noqa: E731
            print(f"{shape:9s} {fmt:7s} {cell(ours, bf16):>7s} {cell(comp, ours):>12s} "
                  f"{cell(ref, ours):>13s}")


def imported_cudnn_ext():
    """Where the imported cudnn_ext lives (an A/B puts an older copy first on PYTHONPATH)."""
    try:
        import cudnn_ext
        return os.path.dirname(os.path.abspath(cudnn_ext.__file__))
    except Exception as exc:
        return f"not importable: {type(exc).__name__}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n  python")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help=f"comma-separated, of {sorted(SHAPES)} and the extra shapes "
                         f"{sorted(EXTRA_SHAPES)}")
    ap.add_argument("--impls", default="cudnn_ext,cudnn_ext_op,cudnn_ext_discrete,cudnn_ext_act:dgeglu,"
                    "cudnn_ext_act:dgeglu+activation,cudnn_ext_round_dgrad,nvfp4:cudnn_ext,nvfp4:composed,"
                    "mxfp4:cudnn_ext,torch_grouped_mm,torch_unfused_compiled,quack",
                    help="comma-separated peers (see above)")
    ap.add_argument("--reps", type=int, default=50, help="timed calls per row")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls per row first")
    ap.add_argument("--tile-n", type=int, default=0, help="pin the cudnn_ext tile_n knob")
    ap.add_argument("--variants", default="",
                    help="extra cudnn_ext knob sets, e.g. 't128c1,t128c1m2' (tile_n, c_stages, "
                         "optional m<cluster_m>, n<cluster_n>, s<ab_stages>, r<raster_group_m>, "
                         "and a trailing k for the cooperative schedule, e.g. 't256c2m2k')")
    ap.add_argument("--discrete-variants", default="",
                    help="knob sets for the discrete-weights engine (same syntax), e.g. 't128c1,t128c1m2'")
    ap.add_argument("--rounds", type=int, default=5,
                    help="round-robin rounds per shape (1: time the rows one after another)")
    ap.add_argument("--no-dbias", action="store_true", help="run the cudnn_ext rows without dbias")
    ap.add_argument("--timer", choices=sorted(TIMERS), default="gpu",
                    help="gpu: device time of a call, its launch hidden behind a spin kernel "
                         "(default); launch: from an idle stream, the host's issue latency "
                         "included")
    ap.add_argument("--out", default=None,
                    help="JSON path (default: benchmarks/results/<device>.json, replaced)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES and s not in EXTRA_SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; known: {sorted(SHAPES) + sorted(EXTRA_SHAPES)}")
    dbias = not args.no_dbias

    dev_name = torch.cuda.get_device_name()
    rows = []
    impls = args.impls.split(",")
    impls += [f"cudnn_ext:{v}" for v in args.variants.split(",") if v]
    impls += [f"cudnn_ext_discrete:{v}" for v in args.discrete_variants.split(",") if v]
    for name in args.shapes.split(","):
        L, per, K, N = SHAPES[name] if name in SHAPES else EXTRA_SHAPES[name]
        sizes = group_sizes(name, L, per)
        total = sum(sizes)
        flops = 2.0 * total * N * K
        torch.manual_seed(0)
        pack = make_inputs(sizes, K, N)
        shape_rows, fns = [], {}
        for pos, impl in enumerate(impls):  # rows keyed by position: an impl may repeat
            row = dict(shape=name, impl=impl, format="bf16", L=L, M=total, K=K, N=N)
            if impl.startswith("cudnn_ext"):
                row["dbias"] = dbias
            try:
                fn, extra = build_impl(impl, pack, K, N, dbias, args, row)
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                extra["first_call_s"] = round(time.perf_counter() - t0, 3)
                row.update(**extra)
                fns[pos] = fn
            except Exception as exc:  # a peer that cannot run is recorded, not fatal
                row.update(ms=None, tflops=None, error=f"{type(exc).__name__}: {exc}"[:500])
                traceback.print_exc(limit=3)
            shape_rows.append(row)
        timers = {pos: TIMERS[args.timer]() for pos in fns}
        medians, errors = bench_round_robin(fns, args.warmup, args.reps, args.rounds,
                                            timer=timers)
        for pos, row in enumerate(shape_rows):
            if pos in medians:
                # (a quantizer row does no GEMM: no TFLOP/s)
                row.update(ms=medians[pos], tflops=None if row.get("impl") == "quantize"
                           else flops / medians[pos] / 1e9)
                if isinstance(timers[pos], DeviceTimer):  # launches the spin did not hide
                    row.update(late_calls=timers[pos].late,
                               max_issue_us=round(timers[pos].max_issue_us, 1))
            elif pos in errors:
                row.update(ms=None, tflops=None, error=errors[pos])
            rows.append(row)
            print(json.dumps(row), flush=True)
        del fns
        del pack
        torch.cuda.empty_cache()

    overhead = None
    if "cudnn_ext" in impls:
        try:
            overhead = host_overhead_us()
            print(f"host overhead without dbias: {host_overhead_us(dbias=False):.1f} us")
        except Exception as exc:
            print("host overhead failed:", exc)

    print(f"\n{'shape':9s} {'impl':24s} {'ms':>9s} {'TFLOP/s':>8s} {'vs mm':>6s}")
    for r in rows:
        base = next((x for x in rows if x["shape"] == r["shape"] and x["impl"] == "torch_grouped_mm"), None)
        ratio = (base["ms"] / r["ms"]) if base and base.get("ms") and r.get("ms") else float("nan")
        ms = f"{r['ms']:.3f}" if r.get("ms") else "ERR"
        tf = f"{r['tflops']:.0f}" if r.get("tflops") else "-"
        name = r["impl"] + (f"[{r['variant']}]" if r.get("variant") else "")
        print(f"{r['shape']:9s} {name:24s} {ms:>9s} {tf:>8s} {ratio:6.2f}")
    _print_block_scaled_ratios(rows)
    print(f"timer: {args.timer}")
    if overhead is not None:
        print(f"host overhead per execute (tiny problem, back-to-back): {overhead:.1f} us")

    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                   f"{dev_name.replace(' ', '_')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    command = " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))
    for r in rows:
        r.update(device=dev_name, date=date, command=command, timer=args.timer)
    with open(out, "w") as f:
        json.dump(dict(command=command, device=dev_name, date=date, torch=torch.__version__,
                       rounds=args.rounds, timer=args.timer, cudnn_ext=imported_cudnn_ext(),
                       host_overhead_us=overhead, rows=rows), f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
