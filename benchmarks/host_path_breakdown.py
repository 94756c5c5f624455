"""Breakdown of the eager host path with the SM90 kernel (GPU only): what one out= call costs and
what its pieces cost alone, on a tiny problem, median/best of batches of 50 back-to-back calls, each
batch starting from an empty launch queue (synchronized, untimed).

    python3 benchmarks/host_path_breakdown.py

Rows: a trivial torch op, torch.zeros, torch.cuda.current_stream vs the raw handle, the out=
call, ExecutionPlan.execute / Sm90Plan.execute with an explicit stream, the compiled kernel's
call with prebuilt arguments, then the guarded replay's pieces (``_core.run_fast``, the mode
check, the version bump), the functional call and the validated path the replay skips.
Prints only; not imported by the library.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import cudnn_ext.torch as ct  # noqa: E402
from cudnn_ext.kernels.sm90.launch import launch_tvm_ffi  # noqa: E402
from cudnn_ext.torch import _core  # noqa: E402

torch.set_num_threads(1)
dev = torch.device("cuda")


def T(name, fn, n=3000):
    for _ in range(300):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(n // 50):  # batches of 50 from an empty launch queue: host time, not GPU time
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        for _ in range(50):
            fn()
        res.append((time.perf_counter_ns() - t) / 50 / 1e3)
    torch.cuda.synchronize()
    print(f"{name:44s} median {statistics.median(res):7.2f} best {min(res):7.2f} us")
L, N, K, M = 4, 64, 64, 1024; bf = torch.bfloat16
a = torch.randn(M, K, device=dev).to(bf); b = torch.randn(L, N, K, device=dev).to(bf)
c = torch.randn(M, 2 * N, device=dev).to(bf)
offs = torch.tensor([256, 512, 768, 1024], dtype=torch.int32, device=dev)
alpha = torch.ones(L, device=dev); beta = torch.ones(L, device=dev); prob = torch.rand(M, device=dev)
outs = (torch.zeros(M, 2 * N, dtype=bf, device=dev), torch.zeros(M, device=dev), None)
ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b, out=outs)
e = next(iter(_core._memo.values()))
plan = e.plan; cp = plan.compiled
print("engine", plan.engine_name, cp.key.tvm_ffi)
x = torch.zeros(16, device=dev)
T("torch x.add_(1) (one tiny launch)", lambda: x.add_(1))
T("torch.zeros(16) cuda", lambda: torch.zeros(16, device=dev))
T("torch.cuda.current_stream(dev)", lambda: torch.cuda.current_stream(dev))
T("_cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0))
T("python_fn out= (no dbias)", lambda: ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b, out=outs))
bt = b.permute(1, 2, 0)
pack = {"a": a, "b": bt, "c": c, "padded_offsets": offs, "alpha": alpha, "beta": beta, "prob": prob,
        "dprob": outs[1], "d_row": outs[0], "dbias": None}
s = torch.cuda.current_stream()
T("ExecutionPlan.execute(pack, None, stream)", lambda: plan.execute(pack, None, s))
T("Sm90Plan.execute(pack, None, stream)", lambda: cp.execute(pack, None, s))
fn = cp._fn(False)
addrs = (a.data_ptr(), bt.data_ptr(), c.data_ptr(), outs[0].data_ptr(), offs.data_ptr(), alpha.data_ptr(),
         beta.data_ptr(), prob.data_ptr(), outs[1].data_ptr(), outs[1].data_ptr(), a.data_ptr(), a.data_ptr(),
         a.data_ptr())
nres = cp._resident_ctas(a.get_device())
h = s.cuda_stream
T("compiled TVM-FFI call, prebuilt args", lambda: launch_tvm_ffi(fn, addrs, M, L, nres, *cp._consts, h))
T("compiled call, fn(*args) direct", lambda: fn(*addrs, M, L, nres, 1.702, 7.0, -7.0, 0.0, h))
# the guarded replay (cudnn_ext.torch._core.run_fast) that the calls above take
from cudnn_ext.torch import ops  # noqa: E402

seen = []  # the replay's arguments exactly as the op builds them (signature, tensors, outputs)
ops.run_fast = lambda *args: seen.append(args) or _core.run_fast(*args)
ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b, out=outs)
ops.run_fast = _core.run_fast
replay_args = seen[0]
assert _core.run_fast(*replay_args) is not None, "the out= call was not replayed"
T("_core.run_fast(out=, no dbias)", lambda: _core.run_fast(*replay_args))
T("ops._eager()", ops._eager)
T("ops._mutated (2 tensors)", lambda: ops._mutated(outs))
T("python_fn functional (no dbias)", lambda: ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b))
T("_core.run out=, validated path (no replay)",
  lambda: _core.run(a, c, offs, alpha, beta, prob, b=bt, out=outs))
