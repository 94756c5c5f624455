"""The reference engine's math: grouped GEMM + dGLU backward, exact to the vendor contract.

Owns the semantics (docs/vendor_contract.md §1.11), computed with PyTorch on any device in float32 (the
kernels' accumulation precision) or float64 (the oracle precision used by tests). It reads a
canonical variant pack (``cudnn_ext.problem.SLOTS``) and writes only output slots:

* ``d_row`` rows of each expert's padded range are written; rows past ``padded_offsets[-1]``
  are left untouched;
* ``dprob`` and ``dbias`` are *accumulated* into (as the vendor kernels do with atomics):
  ``dprob += row sums`` in fp32, ``dbias = round_bf16(fp32(dbias) + column sums)`` once per call;
* ``activation`` (optional, dGeGLU) receives ``prob * act``.

Two forms compute the same outputs. On CUDA tensors every call takes the block path
(:func:`grouped_dglu_blocks`), which reads no device data on the host, so a call neither syncs
nor breaks a CUDA-graph capture. On CPU tensors the experts' row ranges are walked on the host
(:func:`grouped_dglu_reference`'s own loop), the form the block path is tested against.

It does not validate the call (``cudnn_ext.contract`` does) except, on CPU tensors, the
*values* of ``padded_offsets`` and of the pointer tables, which the host walk reads anyway; on
CUDA tensors they are device data and not checked, as the kernels do not check them
(docs/vendor_contract.md §3.6).
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch

from ..problem import OUTPUT_SLOTS, DgluProblem
from ..quant.formats import FP8_DTYPES, encode_fp8
from .blockscaled_run import BlockScaledOutputs, block_scaled_operands, expert_operands, finish_outputs
from .epilogue import gate_up_columns, local_derivatives
from .fp8_blockwise import dense_equivalent
from .memory import stacked_at, tensor_at
from .scalars import alpha_squared, beta_scaled_c
from .writes import keep_where


def _store(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """D's values in its storage dtype: fp8 D without scale factors saturates as the kernel's
    ``cvt.rn.satfinite`` does (a plain torch cast gives inf for e5m2, or NaN on some builds);
    other dtypes round to nearest."""
    return encode_fp8(x, dtype) if dtype in FP8_DTYPES else x.to(dtype)


def expert_ranges(offsets: torch.Tensor, m: int, m_aligned: int = 256):
    """Host list of (expert, row_start, row_end); checks the offsets' values on the way (each
    a multiple of the problem's ``m_aligned``)."""
    ends = [int(v) for v in offsets.to("cpu", torch.int64).tolist()]
    ranges, start = [], 0
    for e, end in enumerate(ends):
        if end < start:
            raise ValueError(f"padded_offsets: values must be non-decreasing, got {end} after {start} at index {e}")
        if end % m_aligned:
            raise ValueError(f"padded_offsets[{e}] must be a multiple of {m_aligned}, got {end} "
                             f"(m_aligned = {m_aligned})")
        if end > m:
            raise ValueError(f"padded_offsets[{e}] = {end} exceeds the number of rows M = {m}")
        ranges.append((e, start, end))
        start = end
    return ranges


def check_pointer_tables(problem: DgluProblem, pack: Mapping, ranges) -> None:
    """Discrete weights on CPU tensors: every expert that has rows needs a non-null, 16-byte
    aligned pointer (and scale-factor pointer). The host reads these tables anyway; checking
    them all first keeps a bad table from leaving half-written outputs. On CUDA tensors pointer
    values are device data and are not checked (reading them would sync), as the kernels do
    not check them (docs/vendor_contract.md §3.6)."""
    if problem.weight_mode != "discrete":
        return
    for slot in ("b_ptrs", "sfb_ptrs"):
        table = pack.get(slot)
        if table is None:
            continue
        values = table.to("cpu").tolist()
        for e, r0, r1 in ranges:
            if r1 > r0 and (values[e] == 0 or values[e] % 16):
                what = "null" if values[e] == 0 else f"0x{values[e]:x}, not 16-byte aligned"
                raise ValueError(f"{slot}[{e}]: expert {e} has rows [{r0}, {r1}) but its pointer is {what}")


def expert_weight(problem: DgluProblem, pack: Mapping, e: int) -> torch.Tensor:
    """The (N, K) weight of expert ``e`` in its stored dtype (dense slice or b_ptrs view)."""
    n, k = problem.n, problem.k
    if problem.weight_mode == "dense":
        return pack["b"][:, :, e]
    ptrs = pack["b_ptrs"]
    ptr = int(ptrs[e].item())
    flat = tensor_at(ptr, n * k, problem.ab_dtype, ptrs.device)
    return flat.view(n, k) if problem.b_major == "k" else flat.view(k, n).t()


def expert_gemm(problem: DgluProblem, pack: Mapping, e: int, r0: int, r1: int, dtype) -> torch.Tensor:
    """acc = A[r0:r1] @ B_e^T in ``dtype`` (the GEMM before alpha**2)."""
    if problem.is_block_scaled:
        a, b = expert_operands(problem, pack, e, r0, r1, dtype)
    else:
        a = pack["a"][r0:r1].to(dtype)
        b = expert_weight(problem, pack, e).to(dtype)
    return a @ b.t()


def _epilogue(problem: DgluProblem, g0, c, beta, p, gate_cols, up_cols):
    """(dgate, dup, activation value, dprob's row sums) of rows whose GEMM result (alpha**2
    included) is ``g0``: ``c`` their C rows, ``beta`` and ``p`` their expert's beta and their
    prob (scalars or columns that broadcast over the row). With ``round_dgrad_to_input_dtype``
    every output, dprob's sums included, comes from g0 rounded to bf16, as the kernels form
    it. Block-scaled dSwiGLU with a 16-bit beta forms beta * C in 16 bits
    (``scalars.beta_scaled_c``)."""
    act = problem.act
    if problem.round_dgrad_to_input_dtype:
        g0 = g0.to(torch.bfloat16).to(g0.dtype)
    if problem.c_beta_dtype is not None:
        x = beta_scaled_c(problem, c, beta).to(g0.dtype)
        gate, up = x[:, gate_cols], x[:, up_cols]
    else:
        c = c.to(g0.dtype)
        gate, up = c[:, gate_cols], c[:, up_cols]
        if act.act_func != "dgeglu" or act.dgeglu_applies_beta:
            gate, up = beta * gate, beta * up
    dgate_l, dup_l, act_val = local_derivatives(act, gate, up)
    return g0 * p * dgate_l, g0 * p * dup_l, act_val, (g0 * act_val).sum(1)


def _interleaved(dgate, dup, gate_cols, up_cols) -> torch.Tensor:
    """D's rows (R, 2N) from their gate and up halves, in the 32-column interleave."""
    d = dgate.new_empty(dgate.shape[0], 2 * dgate.shape[1])
    d[:, gate_cols] = dgate
    d[:, up_cols] = dup
    return d


def grouped_dglu_reference(problem: DgluProblem, pack: Mapping, *, compute_dtype=torch.float32) -> None:
    """Run the operation on ``pack`` in ``compute_dtype``; writes/accumulates the output slots.

    CUDA tensors take :func:`grouped_dglu_blocks`, which never reads device data on the host;
    CPU tensors walk the experts' row ranges on the host."""
    if problem.recipe is not None:  # fp8_blockwise: the BF16 contract on the dequantized operands
        dense, dense_pack, finish = dense_equivalent(problem, pack, compute_dtype)
        grouped_dglu_reference(dense, dense_pack, compute_dtype=compute_dtype)
        finish()
        return
    if pack["c"].device.type == "cuda":
        return grouped_dglu_blocks(problem, pack, compute_dtype=compute_dtype)
    m = pack["c"].shape[0]
    dev = pack["c"].device
    gate_cols, up_cols = gate_up_columns(problem.n, dev)
    alpha2 = alpha_squared(problem, pack["alpha"], compute_dtype)
    beta = pack["beta"].to(compute_dtype)
    prob = pack.get("prob")
    dprob, dbias, activation = pack.get("dprob"), pack.get("dbias"), pack.get("activation")
    d_row = pack["d_row"]
    dbias_acc = None
    if dbias is not None:
        dbias_acc = dbias.to(compute_dtype)
    outs = []
    if problem.is_block_scaled and problem.block_scale.single_group_runtime_offsets:
        ranges = [(0, 0, m)]  # the kernel takes the single group's end from A's row count
    else:
        ranges = expert_ranges(pack["padded_offsets"], m, problem.m_aligned)
    check_pointer_tables(problem, pack, ranges)  # before any output is written
    for e, r0, r1 in ranges:
        if r1 == r0:
            continue  # an empty group produces nothing
        g0 = alpha2[e] * expert_gemm(problem, pack, e, r0, r1, compute_dtype)
        p = prob[r0:r1].to(compute_dtype)[:, None] if prob is not None else 1.0
        dgate, dup, act_val, dprob_rows = _epilogue(problem, g0, pack["c"][r0:r1], beta[e], p,
                                                    gate_cols, up_cols)
        outs.append((e, r0, r1, dgate, dup))
        if dprob is not None:
            dprob[r0:r1] += dprob_rows.to(dprob.dtype)
        if dbias_acc is not None:
            dbias_acc[e, gate_cols] += dgate.sum(0)
            dbias_acc[e, up_cols] += dup.sum(0)
        if activation is not None:
            activation[r0:r1] = (p * act_val).to(activation.dtype)
        if not problem.is_block_scaled or not problem.block_scale.generate_sfd:
            d_row[r0:r1, gate_cols] = _store(dgate, d_row.dtype)
            d_row[r0:r1, up_cols] = _store(dup, d_row.dtype)
    if dbias_acc is not None:
        dbias.copy_(dbias_acc.to(dbias.dtype))
    if problem.is_block_scaled:
        finish_outputs(problem, pack, outs, gate_cols, up_cols)  # amax, quantized D_row/D_col with SFD


#: Bytes of gathered weights one step of ``grouped_dglu_blocks`` may hold.
_BLOCK_GATHER_BYTES = 256 << 20


def group_ends(problem: DgluProblem, pack: Mapping, m: int) -> torch.Tensor:
    """Each group's cumulative end row, a device tensor: ``padded_offsets``, or in single-group
    mode one group of all M rows (the offsets' value is never read, docs/vendor_contract.md §2.8)."""
    if problem.is_block_scaled and problem.block_scale.single_group_runtime_offsets:
        return torch.full((1,), m, dtype=torch.int32, device=pack["c"].device)
    return pack["padded_offsets"]


def _bf16_weights(problem: DgluProblem, pack: Mapping, ends: torch.Tensor) -> torch.Tensor:
    """Every expert's (N, K) weight as one (L, N, K) tensor: the dense B, or the discrete
    experts' buffers gathered from ``b_ptrs`` (``memory.stacked_at``: no host read on a GPU)."""
    if problem.weight_mode == "dense":
        return pack["b"].permute(2, 0, 1)
    n, k, num_experts = problem.n, problem.k, problem.num_experts
    itemsize = torch.empty((), dtype=problem.ab_dtype).element_size()
    flat = stacked_at(pack["b_ptrs"], n * k * itemsize, ends).view(problem.ab_dtype)
    return flat.view(num_experts, n, k) if problem.b_major == "k" else flat.view(num_experts, k, n).transpose(1, 2)


def _operands(problem: DgluProblem, pack: Mapping, ends: torch.Tensor, dtype):
    """``fetch(r0, r1, experts) -> (A rows [r0, r1) as (R, K), B of each expert as (nb, N, K))``
    in ``dtype``: block-scaled operands dequantized, BF16 ones converted."""
    if problem.is_block_scaled:
        return block_scaled_operands(problem, pack, ends, dtype)
    weights = _bf16_weights(problem, pack, ends)
    return lambda r0, r1, experts: (pack["a"][r0:r1].to(dtype), weights[experts].to(dtype))


#: Rows of one unit of the ragged block path (``grouped_dglu_units``): each expert's rows are
#: cut into units of this many from its first row on, one weight gather each.
_UNIT_ROWS = 256


def unit_table(ends: torch.Tensor, m: int, rows: int = _UNIT_ROWS):
    """The ragged block path's schedule, on the device (no host read): every expert's rows,
    clipped at M, cut into units of ``rows`` rows from its own first row on. The unit count
    is bounded by ``(M + L (rows - 1)) // rows`` without reading the offsets; units past the
    experts' own are invalid.

    Returns ``(row, ok, expert)``: ``row`` (U, rows) int64 each unit's row indices (clamped
    into [0, M)), ``ok`` (U, rows) whether that row is its expert's, ``expert`` (U,) the
    unit's expert (L for an invalid unit)."""
    num_experts = ends.shape[0]
    units = max(1, (m + num_experts * (rows - 1)) // rows)
    ends = ends.to(torch.int64).clamp(min=0, max=m)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    counts = (ends - starts).clamp(min=0)  # offsets that decrease (a contract break) count 0
    per = (counts + rows - 1) // rows
    last = torch.cumsum(per, 0)  # units of experts 0..e
    u = torch.arange(units, device=ends.device)
    expert = torch.searchsorted(last, u, right=True)  # L past the experts' units
    e = expert.clamp(max=num_experts - 1)
    first = starts[e] + (u - (last[e] - per[e])) * rows
    row = first[:, None] + torch.arange(rows, device=ends.device)
    ok = (expert < num_experts)[:, None] & (row < ends[e][:, None])
    return row.clamp(0, max(m - 1, 0)), ok, expert


def grouped_dglu_units(problem: DgluProblem, pack: Mapping, *, compute_dtype=torch.float32) -> None:
    """The block path for BF16 problems whose offsets need not be multiples of 256
    (``m_aligned`` below 256, 1 included): the experts' rows in units of ``_UNIT_ROWS`` from
    each expert's first row (:func:`unit_table`), one weight gather per unit, no host read.
    Each unit's results land in staging buffers with one extra sink row that takes the rows
    past its expert's end; the caller's outputs then take the rows some expert owns and keep
    every other row's bytes, as the kernels do. dbias adds one unit at a time (deterministic
    sums)."""
    c, d_row = pack["c"], pack["d_row"]
    m, two_n = c.shape
    if m == 0:
        return
    dev, n, k, num_experts = c.device, problem.n, problem.k, problem.num_experts
    gate_cols, up_cols = gate_up_columns(n, dev)
    ends = pack["padded_offsets"]
    if dev.type == "cpu":
        check_pointer_tables(problem, pack, expert_ranges(ends, m, problem.m_aligned))
    row, ok, expert = unit_table(ends, m)
    e_idx = expert.clamp(max=num_experts - 1)
    sink = torch.where(ok, row, m)  # each owned row once; every other row to row M
    weights = _bf16_weights(problem, pack, ends)
    alpha2 = alpha_squared(problem, pack["alpha"], compute_dtype)[e_idx]
    beta = pack["beta"].to(compute_dtype)[e_idx]
    prob, dprob, dbias = pack.get("prob"), pack.get("dprob"), pack.get("dbias")
    activation = pack.get("activation")
    staged_d = torch.zeros(m + 1, two_n, dtype=compute_dtype, device=dev)
    staged_p = torch.zeros(m + 1, dtype=compute_dtype, device=dev) if dprob is not None else None
    staged_a = (torch.zeros(m + 1, n, dtype=compute_dtype, device=dev) if activation is not None
                else None)
    dbias_acc = None
    if dbias is not None:
        dbias_acc = torch.zeros(num_experts + 1, two_n, dtype=compute_dtype, device=dev)
        dbias_acc[:num_experts] = dbias.to(compute_dtype)
    rows = row.shape[1]
    itemsize = torch.empty((), dtype=compute_dtype).element_size()
    step = max(1, _BLOCK_GATHER_BYTES // max(1, n * k * itemsize))
    for u0 in range(0, row.shape[0], step):
        u1 = min(row.shape[0], u0 + step)
        idx, keep, to = row[u0:u1].reshape(-1), ok[u0:u1].reshape(-1, 1), sink[u0:u1].reshape(-1)
        acc = torch.bmm(pack["a"][idx].to(compute_dtype).view(u1 - u0, rows, k),
                        weights[e_idx[u0:u1]].to(compute_dtype).transpose(1, 2))
        g0 = (alpha2[u0:u1, None, None] * acc).reshape(-1, n)
        p = prob[idx].to(compute_dtype)[:, None] if prob is not None else 1.0
        beta_rows = beta[u0:u1].repeat_interleave(rows, output_size=idx.shape[0])[:, None]
        dgate, dup, act_val, dprob_rows = _epilogue(problem, g0, c[idx], beta_rows, p, gate_cols,
                                                    up_cols)
        d = _interleaved(dgate, dup, gate_cols, up_cols)
        staged_d.index_copy_(0, to, d)
        if staged_p is not None:
            staged_p.index_copy_(0, to, dprob_rows)
        if staged_a is not None:
            staged_a.index_copy_(0, to, p * act_val)
        if dbias_acc is not None:
            # rows past an expert's end may hold inf or NaN: selected out, not multiplied
            sums = torch.where(keep, d, 0.0).view(u1 - u0, rows, two_n).sum(1)
            for i in range(u0, u1):  # one unit per add: no two adds race (deterministic sums)
                dbias_acc.index_add_(0, expert[i:i + 1], sums[i - u0:i - u0 + 1])
    owned = torch.zeros(m + 1, dtype=torch.bool, device=dev).index_fill_(0, sink.reshape(-1), True)[:m]
    keep_where(d_row, owned[:, None], _store(staged_d[:m], d_row.dtype))
    if staged_p is not None:
        keep_where(dprob, owned, dprob + staged_p[:m].to(dprob.dtype))
    if staged_a is not None:
        keep_where(activation, owned[:, None], staged_a[:m])
    if dbias_acc is not None:
        dbias.copy_(dbias_acc[:num_experts].to(dbias.dtype))


def grouped_dglu_blocks(problem: DgluProblem, pack: Mapping, *, compute_dtype=torch.float32) -> None:
    """:func:`grouped_dglu_reference` without a host read of device data, for every operand
    family and weight mode, so that a GPU call needs no sync and can be captured in a CUDA
    graph (tests/gpu/test_reference_cuda.py and test_reference_no_sync.py check both on the
    device; on the CPU, tests/unit/test_blockscaled_reference.py runs it on meta tensors).

    Offsets are multiples of ``problem.m_aligned``, so every block of that many rows lies in
    one expert (256 rows for block-scaled problems, whose ``BlockScaledOutputs`` works per
    256-row block): each block's expert comes from a device-side search of the offsets, its
    (dequantized) weights from a gather (discrete weights first stacked from their pointer
    tables on the device; one copy per block, so smaller blocks gather more), and blocks past
    the last offset keep their outputs' bytes (written back unchanged) and add nothing: their
    per-expert sums (dbias, amax) go to an extra row that is dropped. Block-scaled outputs are
    :class:`~.blockscaled_run.BlockScaledOutputs`. On CUDA tensors the offsets' and pointers'
    values are not checked (device data; docs/vendor_contract.md §3.6); on CPU tensors, where
    host reads are free, they are, before anything is written. BF16 problems with offsets
    that need not be multiples of 256 take :func:`grouped_dglu_units`."""
    if problem.m_aligned < 256:
        return grouped_dglu_units(problem, pack, compute_dtype=compute_dtype)
    c, d_row = pack["c"], pack["d_row"]
    m, two_n = c.shape
    if m == 0:
        return
    dev, n, k, num_experts = c.device, problem.n, problem.k, problem.num_experts
    gate_cols, up_cols = gate_up_columns(n, dev)
    rows = problem.m_aligned  # block height: M is a multiple of it (contract)
    nblk = m // rows
    ends = group_ends(problem, pack, m)
    if dev.type == "cpu":
        check_pointer_tables(problem, pack, expert_ranges(ends, m, rows))
    starts = torch.arange(0, m, rows, dtype=ends.dtype, device=dev)
    blk_e = torch.searchsorted(ends, starts, right=True)  # L past the last offset
    valid = blk_e < num_experts
    e_idx = blk_e.clamp(max=num_experts - 1)
    sum_into = torch.where(valid, blk_e, num_experts)  # per-expert sums: row L is dropped
    fetch = _operands(problem, pack, ends, compute_dtype)
    alpha2 = alpha_squared(problem, pack["alpha"], compute_dtype)[e_idx]
    beta = pack["beta"].to(compute_dtype)[e_idx]
    prob, dprob, dbias = pack.get("prob"), pack.get("dprob"), pack.get("dbias")
    activation = pack.get("activation")
    dbias_acc = None
    if dbias is not None:
        dbias_acc = torch.zeros(num_experts + 1, two_n, dtype=compute_dtype, device=dev)
        dbias_acc[:num_experts] = dbias.to(compute_dtype)
    scaled = BlockScaledOutputs(problem, pack, ends, valid, sum_into) if problem.is_block_scaled else None
    quantized_d = scaled is not None and problem.block_scale.generate_sfd
    # block-scaled dequantization forms its products in float64
    itemsize = 8 if problem.is_block_scaled else torch.empty((), dtype=compute_dtype).element_size()
    step = max(1, _BLOCK_GATHER_BYTES // max(1, n * k * itemsize))
    for b0 in range(0, nblk, step):
        b1 = min(nblk, b0 + step)
        r0, r1 = rows * b0, rows * b1
        ok = valid[b0:b1].repeat_interleave(rows, output_size=r1 - r0)[:, None]
        a_rows, w = fetch(r0, r1, e_idx[b0:b1])
        acc = torch.bmm(a_rows.view(b1 - b0, rows, k), w.transpose(1, 2))
        g0 = (alpha2[b0:b1, None, None] * acc).reshape(-1, n)
        p = prob[r0:r1].to(compute_dtype)[:, None] if prob is not None else 1.0
        beta_rows = beta[b0:b1].repeat_interleave(rows, output_size=r1 - r0)[:, None]
        dgate, dup, act_val, dprob_rows = _epilogue(problem, g0, c[r0:r1], beta_rows, p, gate_cols,
                                                    up_cols)
        if dprob is not None:
            keep_where(dprob[r0:r1], ok[:, 0], dprob[r0:r1] + dprob_rows.to(dprob.dtype))
        if dbias_acc is not None:
            sums = torch.empty(b1 - b0, two_n, dtype=compute_dtype, device=dev)
            sums[:, gate_cols] = dgate.view(b1 - b0, rows, n).sum(1)
            sums[:, up_cols] = dup.view(b1 - b0, rows, n).sum(1)
            for i in range(b0, b1):  # one block per add: no two adds race, so the sums are deterministic
                dbias_acc.index_add_(0, sum_into[i:i + 1], sums[i - b0:i - b0 + 1])
        if activation is not None:
            keep_where(activation[r0:r1], ok, p * act_val)
        d = _interleaved(dgate, dup, gate_cols, up_cols)
        if scaled is not None:
            scaled.add(b0, b1, d, dgate, dup)
        if not quantized_d:
            keep_where(d_row[r0:r1], ok, _store(d, d_row.dtype))
    if dbias_acc is not None:
        dbias.copy_(dbias_acc[:num_experts].to(dbias.dtype))
    if scaled is not None:
        scaled.finish()


#: The outputs ``reference_outputs`` returns.
_ORACLE_SLOTS = ("d_row", "dprob", "dbias", "activation")


def reference_outputs(problem: DgluProblem, pack: Mapping, *, compute_dtype=torch.float64,
                      dprob_init: Optional[torch.Tensor] = None) -> dict:
    """Fresh outputs of the operation (float64 by default), without touching ``pack``'s outputs.

    Returns ``d_row`` in ``compute_dtype`` (rows past the last offset are NaN), ``dprob``
    (zero-initialised unless ``dprob_init``), ``dbias`` (compute dtype, zero-initialised) and
    ``activation`` when the problem generates one. This is the oracle form used by tests.
    """
    m, two_n = pack["c"].shape
    dev = pack["c"].device
    fresh = dict(pack)
    fresh["d_row"] = torch.full((m, two_n), float("nan"), dtype=compute_dtype, device=dev)
    fresh["dprob"] = (dprob_init.to(compute_dtype).clone() if dprob_init is not None
                      else torch.zeros(m, dtype=compute_dtype, device=dev))
    fresh["dbias"] = (torch.zeros(problem.num_experts, two_n, dtype=compute_dtype, device=dev)
                      if problem.generate_dbias else None)
    fresh["activation"] = (torch.zeros(m, problem.n, dtype=compute_dtype, device=dev)
                           if problem.generate_activation else None)
    for slot in set(OUTPUT_SLOTS) - set(_ORACLE_SLOTS):  # written too (block-scaled): on copies
        if pack.get(slot) is not None:
            fresh[slot] = pack[slot].clone()
    grouped_dglu_reference(problem, fresh, compute_dtype=compute_dtype)
    return {k: fresh[k] for k in _ORACLE_SLOTS}
