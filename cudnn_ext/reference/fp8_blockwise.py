"""The reference engine's reading of ``fp8_blockwise`` operands (``recipe="fp8_blockwise"``).

The recipe's result is the BF16 contract's operation on the dequantized operands (A's 1x128
and B's 128x128 blocks each times its fp32 scale: ``cudnn_ext.quant.dequantize_fp8_blockwise``),
so this module turns such a problem and pack into the dense problem the rest of the reference
runs: A and every expert's B dequantized in float64 (exact) and held in the compute dtype, the
per-expert pointer tables gathered with no host read on a GPU (``memory.stacked_at``; experts
without rows are not read). Output slots stay the caller's tensors, except an FP8 D: the
dense problem writes fp32 D into a staging buffer, which ``finish`` quantizes by the recipe's
rule (``quant.blockwise``) into D_row/SFD_row (1x128 blocks along 2N) and D_col/SFD_col
(128x1 blocks along M) for the rows below the last offset, found on the device (no host
read): every other row, and the scale blocks of no such row, keep their bytes.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Mapping, Tuple

import torch

from ..problem import DgluProblem
from ..quant.blockwise import FP8_BLOCKWISE_DTYPE, dequantize_fp8_blockwise, quantize_fp8_blockwise, scale_shape
from .memory import stacked_at
from .writes import keep_where

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


#: Rows of A dequantized at once (their float64 products, 8 bytes each, then the compute dtype)
_A_ROWS = 8192


def _dequantized_rows(a_q: torch.Tensor, sfa: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A's (M, K) values in ``dtype``, each product formed in float64 and rounded once, in slabs
    of ``_A_ROWS`` rows (sizes only: no device read)."""
    a = torch.empty(a_q.shape, dtype=dtype, device=a_q.device)
    for r0 in range(0, a_q.shape[0], _A_ROWS):
        r1 = min(a_q.shape[0], r0 + _A_ROWS)
        a[r0:r1] = dequantize_fp8_blockwise(a_q[r0:r1], sfa[r0:r1], _A_BLOCK, out_dtype=torch.float64)
    return a


def dense_equivalent(problem: DgluProblem, pack: Mapping, dtype: torch.dtype) -> Tuple[DgluProblem, Dict, Callable]:
    """``(problem, pack, finish)``: the BF16-contract problem with the dequantized operands in
    ``dtype`` (dense, K-major B) and its pack, whose output slots are the caller's own tensors
    (an FP8 D's are staged), and ``finish()``, to call after that problem has run."""
    a = _dequantized_rows(pack["a"], pack["sfa"], dtype)
    if problem.weight_mode == "dense":
        b_q, sfb = pack["b"], pack["sfb"]
    else:
        b_q, sfb = _discrete_b(problem, pack)
    # one expert at a time: the float64 products of one expert, not of all, at once
    b = torch.empty(b_q.shape[2], b_q.shape[0], b_q.shape[1], dtype=dtype, device=b_q.device)  # (L, N, K)
    for e in range(b_q.shape[2]):
        b[e] = dequantize_fp8_blockwise(b_q[..., e], sfb[..., e], _B_BLOCK, out_dtype=torch.float64)
    fp8_d = problem.d_dtype == FP8_BLOCKWISE_DTYPE
    dense = dataclasses.replace(problem, recipe=None, ab_dtype=dtype, weight_mode="dense", b_major="k",
                                d_dtype=torch.float32 if fp8_d else problem.d_dtype)
    out = {s: t for s, t in pack.items() if s not in ("sfa", "sfb", "sfb_ptrs", "b_ptrs", "d_col", "sfd_row", "sfd_col")}
    out.update(a=a, b=b.permute(1, 2, 0))
    if not fp8_d:
        return dense, out, lambda: None
    out["d_row"] = torch.zeros(pack["d_row"].shape, dtype=torch.float32, device=a.device)
    return dense, out, lambda: quantize_d(out["d_row"], pack)


def quantize_d(d32: torch.Tensor, pack: Mapping) -> None:
    """D_row/SFD_row and D_col/SFD_col of the staged fp32 D, rows below the last offset only
    (torch ops on the current stream, no host read; the Hopper engine applies it to its
    kernel's fp32 D too)."""
    m = d32.shape[0]
    if m == 0:
        return
    offsets = pack["padded_offsets"]
    end = offsets[-1:].to(torch.int64) if offsets.numel() else torch.zeros(1, dtype=torch.int64, device=d32.device)
    rows = torch.arange(m, device=d32.device) < end  # device mask: no host read
    q_row, s_row = quantize_fp8_blockwise(d32, _A_BLOCK)
    q_col, s_col = quantize_fp8_blockwise(d32, (128, 1))
    keep_where(pack["d_row"], rows[:, None], q_row)
    keep_where(pack["d_col"], rows[:, None], q_col)
    keep_where(pack["sfd_row"], rows[:, None], s_row)
    blocks = rows[::128]  # a 128-row block lies below the end or wholly past it (m_aligned % 128 == 0)
    keep_where(pack["sfd_col"], blocks[:, None], s_col)
