"""Functional torch op on the qwen3 shape (dbias on): the fresh-outputs launch (torch.empty
outputs, initialized on the device by the launch) vs torch.zeros outputs + out= (what the
functional op did before). One process, CUDA events, median of 30 calls, alternating.
Timed from an idle stream (bench_dglu's launch timer) on purpose: the two paths differ in
host work (three allocations and fills), which belongs in the comparison.
Not imported by the library.

  python3 benchmarks/functional_op_alloc.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import bench_dglu as bd  # noqa: E402
import cudnn_ext.torch as ct  # noqa: E402


def main():
    L, per, K, N = bd.SHAPES["qwen3"]
    p = bd.make_inputs(bd.group_sizes("qwen3", L, per), K, N)
    b = p["b"].permute(2, 0, 1)  # (L, N, K)
    args = (p["a"], p["c"], p["padded_offsets"], p["alpha"], p["beta"], p["prob"])
    M = p["a"].shape[0]

    def fresh():
        return ct.grouped_gemm_dglu(*args, b=b, generate_dbias=True)

    def zeros_then_out():
        outs = (torch.zeros(M, 2 * N, dtype=torch.bfloat16, device="cuda"), torch.zeros(M, device="cuda"),
                torch.zeros(L, 2 * N, dtype=torch.bfloat16, device="cuda"))
        return ct.grouped_gemm_dglu(*args, b=b, generate_dbias=True, out=outs)

    r1, r2 = fresh(), zeros_then_out()
    torch.cuda.synchronize()
    print("max |diff| D", float((r1[0].float() - r2[0].float()).abs().max()),
          "dprob", float((r1[1] - r2[1]).abs().max()))
    for name, fn in (("fresh", fresh), ("zeros+out", zeros_then_out)) * 2:
        print(name, f"{bd.bench(fn, 5, 30):.4f} ms")


if __name__ == "__main__":
    main()
