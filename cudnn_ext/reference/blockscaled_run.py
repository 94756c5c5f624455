"""The block-scaled steps of the reference engine, composed from ``reference.blockscaled``.

Owns how the reference engine reads block-scaled operands out of a canonical variant pack
(dense SFB or per-expert ``b_ptrs``/``sfb_ptrs``) and how it writes the block-scaled outputs
(amax, quantized D_row/D_col with SFD_row/SFD_col), in both forms of ``grouped_dglu``: per
expert on the host (``expert_operands``, ``finish_outputs``; CPU tensors) and per 256-row
block with no host read (``block_scaled_operands``, ``BlockScaledOutputs``). Rows past the
last offset, and the scale factors that cover only them, are left untouched, as the kernel
leaves them.
"""
from __future__ import annotations

from typing import Mapping, Tuple

import torch

from ..problem import DgluProblem
from ..quant.formats import is_fp4
from ..quant.sf_layout import ATOM_ELEMS, as_sf_6d, empty_sf, sf_k_blocks, sf_numel, sf_shape, storage_of
from .blockscaled import dequantize, dequantize_b_expert, quantize_d_col, quantize_d_row
from .memory import stacked_at, tensor_at
from .writes import keep_where


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


def _nan_quiet_absmax(x: torch.Tensor, dim=None) -> torch.Tensor:
    # docs/vendor_contract.md §2.5 calls the warp reduce NaN-propagating, but a NaN never reaches it: the
    # kernel's per-thread reduction (amax_reduction_per_thread in the vendor's block-scaled dGLU
    # kernel) is a MAX reduce from 0.0 then cute.arch.fmax, both NaN-quiet, so NaN is ignored;
    # an infinite gradient stays inf (nan_to_num's default maps +inf to the largest finite)
    a = torch.nan_to_num(x.abs(), nan=0.0, posinf=float("inf"))
    return (a.amax() if dim is None else a.amax(dim=dim)).to(torch.float32)


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


# --------------------------------------------------------------------------------------------
# the block path: every expert at once, no host read
# --------------------------------------------------------------------------------------------

def _stored_b(problem: DgluProblem, pack: Mapping, ends: torch.Tensor):
    """Every expert's B bytes as ``(L, N, K_stored)`` uint8 and its SFB bytes as ``(L, SFB
    bytes)`` uint8: views of dense B/SFB, or the discrete experts' buffers gathered from
    ``b_ptrs``/``sfb_ptrs`` (``memory.stacked_at``: on a GPU the pointers are read on the
    device; experts without rows are not read)."""
    bs = problem.block_scale
    n, num_experts = problem.n, problem.num_experts
    k_stored = problem.k // 2 if is_fp4(problem.ab_dtype) else problem.k
    if problem.weight_mode == "dense":
        b = pack["b"].view(torch.uint8).permute(2, 0, 1)
        return b, storage_of(pack["sfb"]).reshape(num_experts, -1).view(torch.uint8)
    flat = stacked_at(pack["b_ptrs"], n * k_stored, ends)
    b = flat.view(num_experts, n, k_stored) if problem.b_major == "k" else \
        flat.view(num_experts, k_stored, n).transpose(1, 2)
    sf_bytes = sf_numel(n, sf_k_blocks(problem.k, bs.sf_vec_size))
    return b, stacked_at(pack["sfb_ptrs"], sf_bytes, ends)


def block_scaled_operands(problem: DgluProblem, pack: Mapping, ends: torch.Tensor, dtype):
    """``fetch(r0, r1, experts) -> (A rows [r0, r1) as (R, K), B of each of the device tensor
    ``experts`` as (nb, N, K))``, dequantized to ``dtype`` (rows are 128-aligned: SFA slices
    along its row atoms; each expert's SFB bytes are one group of the 6-D layout)."""
    bs = problem.block_scale
    b_all, sfb_all = _stored_b(problem, pack, ends)
    kb = sf_k_blocks(problem.k, bs.sf_vec_size)
    fp4 = is_fp4(problem.ab_dtype)

    def fetch(r0: int, r1: int, experts: torch.Tensor):
        q = b_all[experts]  # (nb, N, K_stored) bytes
        q = (q if fp4 else q.view(problem.ab_dtype)).permute(1, 2, 0)  # (N, K_stored, nb): nb groups
        sfb = as_sf_6d(sfb_all[experts].view(bs.sf_dtype), mn=problem.n, k_blocks=kb,
                       groups=q.shape[2], name="sfb")
        b = dequantize(q, sfb, bs.sf_vec_size, out_dtype=dtype).permute(2, 0, 1)
        return _a_rows(problem, pack, r0, r1, dtype), b

    return fetch


def _discrete_col_sources(ends: torch.Tensor, rmn: int, rk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """For each 512-element chunk j of a ``discrete_col_sfd`` SFD_col (``rmn * rk`` chunks),
    the chunk of the global layout that holds its bytes, and whether an expert owns j.

    Chunks are the layout's atoms: 128 columns x 4 k-blocks (128 rows of D). The global layout
    puts atom (column atom a, row atom t) at chunk ``a * rk + t``; expert e, rows [r0, r1), owns
    the chunks from ``(r0 // 128) * rmn`` on, its own layout with ``rk_e = (r1 - r0) // 128``
    row atoms: atom (a, t) at ``(r0 // 128) * rmn + a * rk_e + (t - r0 // 128)``
    (docs/vendor_contract.md §2.6; ``quantize_d_col``). Inverting that per chunk, with the expert
    found by a device-side search, gives a gather that reads no offset on the host."""
    dev = ends.device
    ends = ends.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    j = torch.arange(rmn * rk, device=dev)
    owner = torch.searchsorted((ends // 128) * rmn, j, right=True)  # L: owned by no expert
    owned = owner < ends.shape[0]
    owner = owner.clamp(max=ends.shape[0] - 1)
    t0 = starts[owner] // 128
    rk_e = ((ends[owner] - starts[owner]) // 128).clamp(min=1)
    local = j - t0 * rmn
    src = (local // rk_e) * rk + t0 + local % rk_e
    # unowned chunks (and offsets that break the contract) never index out of range
    return torch.where(owned, src, 0).clamp(0, rmn * rk - 1), owned


class BlockScaledOutputs:
    """amax and quantized D_row/D_col with SFD_row/SFD_col of the block path, with no host read.

    ``add`` takes each step's 256-row blocks (``d``: interleaved values, ``dgate``/``dup`` the
    halves, in the compute dtype) and ``finish`` writes what needs every block. Blocks with
    ``valid`` False lie past the last offset: their rows, the SFD_row atoms and SFD_col row
    atoms that cover only them, keep their bytes, and their amax goes to an extra, dropped row
    (``sum_into`` holds L there). Each quantity equals ``finish_outputs``' bit for bit: the
    quantizers work per row or per 32-row block, and 256-row blocks hold whole 128-row atoms."""

    def __init__(self, problem: DgluProblem, pack: Mapping, ends: torch.Tensor, valid: torch.Tensor,
                 sum_into: torch.Tensor):
        self.problem, self.pack, self.ends = problem, pack, ends
        self.valid, self.sum_into = valid, sum_into
        amax = pack.get("amax")
        self.amax = None
        if amax is not None:
            self.amax = torch.cat([amax, torch.full((1, 2), float("-inf"), dtype=amax.dtype, device=amax.device)])
        self.quantize = problem.block_scale.generate_sfd
        if self.quantize:
            m, two_n = pack["c"].shape
            # the global SFD_col of every row (also the source of the discrete layout)
            self.sf_col = empty_sf(two_n, m // 32, dtype=torch.uint8, device=pack["c"].device)

    def add(self, b0: int, b1: int, d: torch.Tensor, dgate: torch.Tensor, dup: torch.Tensor) -> None:
        nb = b1 - b0
        if self.amax is not None:
            blocks = torch.stack([_nan_quiet_absmax(dgate.view(nb, 256, -1), dim=(1, 2)),
                                  _nan_quiet_absmax(dup.view(nb, 256, -1), dim=(1, 2))], dim=1)
            self.amax.scatter_reduce_(0, self.sum_into[b0:b1, None].expand(nb, 2), blocks, "amax")
        if not self.quantize:
            return
        pack, r0, r1 = self.pack, 256 * b0, 256 * b1
        d32 = d.to(torch.float32)
        q_row, sf_row = quantize_d_row(d32, pack["norm_const"], self.problem.d_dtype)
        q_col, sf_col = quantize_d_col(d32, pack["norm_const"], self.problem.d_dtype)
        rows = self.valid[b0:b1].repeat_interleave(256, output_size=r1 - r0)[:, None]
        keep_where(pack["d_row"][r0:r1], rows, q_row)
        keep_where(pack["d_col"][r0:r1], rows, q_col)
        # 128-row atoms: dim 2 of SFD_row (rows), dim 4 of SFD_col (32-row k-blocks, 4 per atom)
        atoms = self.valid[b0:b1].repeat_interleave(2, output_size=2 * nb)
        keep_where(pack["sfd_row"][:, :, 2 * b0:2 * b1], atoms.view(1, 1, -1, 1, 1, 1), sf_row)
        self.sf_col[:, :, :, :, 2 * b0:2 * b1] = sf_col.view(torch.uint8)

    def finish(self) -> None:
        pack = self.pack
        if self.amax is not None:
            pack["amax"].copy_(self.amax[:-1])
        if not self.quantize:
            return
        atoms = self.valid.repeat_interleave(2, output_size=2 * self.valid.shape[0])
        dst = pack["sfd_col"]
        if not self.problem.block_scale.discrete_col_sfd:
            keep_where(dst, atoms.view(1, 1, 1, 1, -1, 1), self.sf_col.view(dst.dtype))
            return
        _, _, rmn, _, rk, _ = self.sf_col.shape
        src, owned = _discrete_col_sources(self.ends, rmn, rk)
        chunks = storage_of(self.sf_col).reshape(-1, ATOM_ELEMS)[src]
        keep_where(storage_of(dst).view(-1, ATOM_ELEMS), owned[:, None], chunks.view(dst.dtype))
