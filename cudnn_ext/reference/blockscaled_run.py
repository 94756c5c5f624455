"""The block-scaled steps of the reference engine, composed from ``reference.blockscaled``.

Owns how the reference engine reads block-scaled operands out of a canonical variant pack
(dense SFB or per-expert ``b_ptrs``/``sfb_ptrs``) and how it writes the block-scaled outputs
(amax, quantized D_row/D_col with SFD_row/SFD_col). Rows past the last offset, and the scale
factors that cover only them, are left untouched, as the kernel leaves them.
"""
from __future__ import annotations

from typing import Mapping

import torch

from ..problem import DgluProblem
from ..quant.sf_layout import ATOM_ELEMS, sf_k_blocks, sf_numel, sf_shape, storage_of
from .blockscaled import dequantize, dequantize_b_expert, quantize_d_col, quantize_d_row
from .memory import tensor_at


def _a_rows(problem: DgluProblem, pack: Mapping, r0: int, r1: int, dtype) -> torch.Tensor:
    """Dequantized A rows [r0, r1): rows are 128-aligned, so SFA slices along its row atoms."""
    bs = problem.block_scale
    sfa = pack["sfa"]  # 6-D view (contract)
    return dequantize(pack["a"][r0:r1], sfa[:, :, r0 // 128: -(-r1 // 128)], bs.sf_vec_size, out_dtype=dtype)


def _b_expert(problem: DgluProblem, pack: Mapping, e: int, dtype) -> torch.Tensor:
    bs = problem.block_scale
    if problem.weight_mode == "dense":
        return dequantize_b_expert(pack["b"], pack["sfb"], sf_vec_size=bs.sf_vec_size, expert=e, out_dtype=dtype)
    n, k = problem.n, problem.k
    fp4 = problem.ab_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2)
    k_stored = k // 2 if fp4 else k
    dev = pack["b_ptrs"].device
    flat = tensor_at(int(pack["b_ptrs"][e].item()), n * k_stored, problem.ab_dtype, dev)
    b = flat.view(n, k_stored) if problem.b_major == "k" else flat.view(k_stored, n).t()
    sf_n = sf_numel(n, sf_k_blocks(k, bs.sf_vec_size))
    sfb = tensor_at(int(pack["sfb_ptrs"][e].item()), sf_n, bs.sf_dtype, dev)
    return dequantize_b_expert(b, sfb, sf_vec_size=bs.sf_vec_size, out_dtype=dtype)


def expert_operands(problem: DgluProblem, pack: Mapping, e: int, r0: int, r1: int, dtype):
    """(A rows, B_e) dequantized to ``dtype``; the caller forms A @ B_e^T."""
    return _a_rows(problem, pack, r0, r1, dtype), _b_expert(problem, pack, e, dtype)


def _nan_quiet_absmax(x: torch.Tensor) -> torch.Tensor:
    # docs/vendor_contract.md §2.5 calls the warp reduce NaN-propagating, but a NaN never reaches it: the
    # kernel's per-thread reduction (amax_reduction_per_thread in the vendor's block-scaled dGLU
    # kernel) is a MAX reduce from 0.0 then cute.arch.fmax, both NaN-quiet, so NaN is ignored
    return torch.nan_to_num(x.abs(), nan=0.0).amax().to(torch.float32)


def finish_outputs(problem: DgluProblem, pack: Mapping, outs, gate_cols, up_cols) -> None:
    """amax and quantized D_row/D_col + SFD for the experts in ``outs`` = [(e, r0, r1, dgate, dup)]."""
    bs = problem.block_scale
    amax = pack.get("amax")
    if amax is not None:
        for e, _r0, _r1, dgate, dup in outs:
            amax[e, 0] = torch.maximum(amax[e, 0], _nan_quiet_absmax(dgate))
            amax[e, 1] = torch.maximum(amax[e, 1], _nan_quiet_absmax(dup))
    if not bs.generate_sfd or not outs:
        return
    m, two_n = pack["c"].shape
    last = max(r1 for _e, _r0, r1, _g, _u in outs)
    d = torch.zeros(m, two_n, dtype=torch.float32, device=pack["c"].device)
    for _e, r0, r1, dgate, dup in outs:
        d[r0:r1, gate_cols] = dgate.to(torch.float32)
        d[r0:r1, up_cols] = dup.to(torch.float32)
    nc = pack["norm_const"]
    q_row, sf_row = quantize_d_row(d, nc, problem.d_dtype)
    # single-group mode: the kernel never reads the offsets' value (docs/vendor_contract.md §2.8), so
    # neither does the per-expert SFD_col layout: its one group ends at A's row count
    offsets = [m] if bs.single_group_runtime_offsets else pack["padded_offsets"]
    q_col, sf_col = quantize_d_col(d, nc, problem.d_dtype, padded_offsets=offsets,
                                   discrete_col_sfd=bs.discrete_col_sfd)
    pack["d_row"][:last] = q_row[:last]
    pack["d_col"][:last] = q_col[:last]
    # SFD_row: row atoms (dim 2) below last // 128 cover written rows only
    pack["sfd_row"][:, :, : last // 128] = sf_row[:, :, : last // 128]
    if not bs.discrete_col_sfd:
        # SFD_col: k-blocks are 32-row blocks; k atoms (dim 4) below last // 128 cover written rows
        pack["sfd_col"][:, :, :, :, : last // 128] = sf_col[:, :, :, :, : last // 128]
        return
    # per-expert regions of the discrete layout: copy exactly the bytes each expert owns
    dst = storage_of(pack["sfd_col"]).reshape(-1)
    src = storage_of(sf_col).reshape(-1)
    rmn = sf_shape(two_n, 1)[2]
    for _e, r0, r1, _g, _u in outs:
        base = (r0 // 128) * rmn * ATOM_ELEMS
        n_el = sf_numel(two_n, (r1 - r0) // 32)
        dst[base:base + n_el] = src[base:base + n_el]
