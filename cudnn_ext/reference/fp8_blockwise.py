"""The reference engine's reading of ``fp8_blockwise`` operands (``recipe="fp8_blockwise"``).

The recipe's result is the BF16 contract's operation on the dequantized operands (A's 1x128
and B's 128x128 blocks each times its fp32 scale: ``cudnn_ext.quant.dequantize_fp8_blockwise``),
so this module turns such a problem and pack into the dense problem the rest of the reference
runs: A and every expert's B dequantized in float64 (exact) and held in the compute dtype, the
per-expert pointer tables gathered with no host read on a GPU (``memory.stacked_at``; experts
without rows are not read). Output slots stay the caller's tensors.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Tuple

import torch

from ..problem import DgluProblem
from ..quant.blockwise import FP8_BLOCKWISE_DTYPE, dequantize_fp8_blockwise, scale_shape
from .memory import stacked_at

_A_BLOCK, _B_BLOCK = (1, 128), (128, 128)


def _discrete_b(problem: DgluProblem, pack: Mapping) -> Tuple[torch.Tensor, torch.Tensor]:
    """Every expert's e4m3 (N, K, L) weight and its (Nb, Kb, L) scales, from the pointer tables."""
    n, k, num_experts = problem.n, problem.k, problem.num_experts
    ends = pack["padded_offsets"]
    flat = stacked_at(pack["b_ptrs"], n * k, ends).view(FP8_BLOCKWISE_DTYPE)  # (L, N*K)
    b = (flat.reshape(num_experts, n, k) if problem.b_major == "k"
         else flat.reshape(num_experts, k, n).transpose(1, 2)).permute(1, 2, 0)
    nb, kb = scale_shape((n, k), _B_BLOCK)
    # each expert's scales are MN-major: (Kb, Nb) in storage
    sf = stacked_at(pack["sfb_ptrs"], nb * kb * 4, ends).view(torch.float32).reshape(num_experts, kb, nb)
    return b, sf.permute(2, 1, 0)


def dense_equivalent(problem: DgluProblem, pack: Mapping, dtype: torch.dtype) -> Tuple[DgluProblem, Dict]:
    """``(problem, pack)`` of the BF16-contract problem with the dequantized operands in
    ``dtype`` (dense, K-major B); every output slot is the caller's own tensor."""
    a = dequantize_fp8_blockwise(pack["a"], pack["sfa"], _A_BLOCK, out_dtype=torch.float64).to(dtype)
    if problem.weight_mode == "dense":
        b_q, sfb = pack["b"], pack["sfb"]
    else:
        b_q, sfb = _discrete_b(problem, pack)
    b = dequantize_fp8_blockwise(b_q, sfb, _B_BLOCK, out_dtype=torch.float64).to(dtype)
    dense = dataclasses.replace(problem, recipe=None, ab_dtype=dtype, weight_mode="dense", b_major="k")
    out = {s: t for s, t in pack.items() if s not in ("sfa", "sfb", "sfb_ptrs", "b_ptrs")}
    out.update(a=a, b=b.permute(2, 0, 1).contiguous().permute(1, 2, 0))
    return dense, out
