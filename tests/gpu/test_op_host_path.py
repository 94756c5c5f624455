"""The torch op's hot path on the device (``pytest -m gpu``; skipped without an sm_90 GPU):
10,000 calls of ``torch.ops.cudnn_ext.grouped_gemm_dglu`` (the training layer's op) and of
``GroupedGluMLP``'s backward call hold no more Python memory (``tracemalloc``) and no more
device memory (``torch.cuda.memory_allocated``) at the end than after the first calls, and the
last call's results are right. The CPU twin is tests/bindings/test_op_memory.py; host time
per call is ``benchmarks/bench_host_overhead.py``'s (printed here too, with ``-s``)."""
import gc
import time
import tracemalloc

import pytest
import torch

import cudnn_ext.torch as ct
from cudnn_ext import contract
from cudnn_ext.reference import reference_outputs

pytestmark = pytest.mark.gpu
CALLS_N = 10_000
MAX_GROWTH = 16_000  # bytes over 10,000 calls (one leaked object a call is >= 560 KB)


def _sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _rel(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize("entry", ["custom_op", "mlp_call"])
def test_10k_calls_no_growth(entry):
    _sm90()
    L, N, K, M = 4, 128, 128, 1024
    g = dict(device="cuda")
    a = torch.randn(M, K, **g).to(torch.bfloat16)
    b = torch.randn(L, N, K, **g).to(torch.bfloat16)
    c = (2 * torch.randn(M, 2 * N, **g)).to(torch.bfloat16)
    offs = torch.tensor([256, 512, 768, 1024], dtype=torch.int32, **g)
    alpha, beta = torch.rand(L, **g) + 0.5, torch.rand(L, **g) + 0.5
    prob = torch.rand(M, **g)
    if entry == "custom_op":
        fn = lambda: torch.ops.cudnn_ext.grouped_gemm_dglu(  # noqa: E731
            a, b, c, offs, alpha, beta, prob, generate_dbias=True)
    else:  # what GroupedGluMLP's backward calls (N-major weights, every argument given)
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
        fn = lambda: ct.grouped_gemm_dglu(  # noqa: E731
            a, c, offs, alpha, beta, prob, b=b, act_func="dswiglu", linear_offset=None,
            geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, generate_dbias=True,
            d_dtype=torch.bfloat16)
    for _ in range(200):
        out = fn()
    del out
    torch.cuda.synchronize()
    gc.collect()
    dev_before = torch.cuda.memory_allocated()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(CALLS_N):
        out = fn()
    torch.cuda.synchronize()
    del out
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    dev_after = torch.cuda.memory_allocated()
    # host time without tracemalloc, batches of 50 like the benchmark
    per = []
    for _ in range(40):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(50):
            fn()
        per.append((time.perf_counter_ns() - t0) / 50 / 1e3)
    torch.cuda.synchronize()
    print(f"\n{entry}: {sorted(per)[len(per) // 2]:.1f} us median, {min(per):.1f} us best per "
          f"call; Python memory +{grown} B, device memory {dev_before} -> {dev_after} B")
    assert grown < MAX_GROWTH
    assert dev_after == dev_before
    d_row, dprob, dbias = fn()
    ops = contract.Operands(a=a, c=c, padded_offsets=offs, alpha=alpha, beta=beta, prob=prob,
                            dprob=torch.zeros_like(prob), b=b.permute(1, 2, 0))
    problem, pack = contract.normalize(ops, contract.CallConfig(), generate_dbias=True)
    ref = reference_outputs(problem, pack)
    assert _rel(d_row, ref["d_row"]) < 2e-2 and _rel(dprob, ref["dprob"]) < 1e-2
    assert _rel(dbias, ref["dbias"]) < 2e-2
