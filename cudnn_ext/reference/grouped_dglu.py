"""The reference engine's math: grouped GEMM + dGLU backward, exact to the vendor contract.

Owns the semantics (docs/vendor_contract.md §1.11), computed with PyTorch on any device in float32 (the
kernels' accumulation precision) or float64 (the oracle precision used by tests). It reads a
canonical variant pack (``cudnn_ext.problem.SLOTS``) and writes only output slots:

* ``d_row`` rows of each expert's padded range are written; rows past ``padded_offsets[-1]``
  are left untouched;
* ``dprob`` and ``dbias`` are *accumulated* into (as the vendor kernels do with atomics):
  ``dprob += row sums`` in fp32, ``dbias = round_bf16(fp32(dbias) + column sums)`` once per call;
* ``activation`` (optional, dGeGLU) receives ``prob * act``.

It does not validate the call (``cudnn_ext.contract`` does) except the *values* of
``padded_offsets``, which it has to read anyway.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch

from ..problem import DgluProblem
from ..quant.formats import FP8_DTYPES, encode_fp8
from .epilogue import gate_up_columns, local_derivatives
from .memory import tensor_at


def _store(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """D's values in its storage dtype: fp8 D without scale factors saturates as the kernel's
    ``cvt.rn.satfinite`` does (a plain torch cast gives inf for e5m2, or NaN on some builds);
    other dtypes round to nearest."""
    return encode_fp8(x, dtype) if dtype in FP8_DTYPES else x.to(dtype)


def expert_ranges(offsets: torch.Tensor, m: int):
    """Host list of (expert, row_start, row_end); checks the offsets' values on the way."""
    ends = [int(v) for v in offsets.to("cpu", torch.int64).tolist()]
    ranges, start = [], 0
    for e, end in enumerate(ends):
        if end < start:
            raise ValueError(f"padded_offsets: values must be non-decreasing, got {end} after {start} at index {e}")
        if end % 256:
            raise ValueError(f"padded_offsets[{e}] must be a multiple of 256, got {end}")
        if end > m:
            raise ValueError(f"padded_offsets[{e}] = {end} exceeds the number of rows M = {m}")
        ranges.append((e, start, end))
        start = end
    return ranges


def check_pointer_tables(problem: DgluProblem, pack: Mapping, ranges) -> None:
    """Discrete weights: every expert that has rows needs a non-null, 16-byte aligned pointer
    (and scale-factor pointer). Like the offsets, these are device data the reference reads
    anyway; checking them all first keeps a bad table from leaving half-written outputs."""
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
        from .blockscaled_run import expert_operands  # block-scaled dequantization lives there

        a, b = expert_operands(problem, pack, e, r0, r1, dtype)
    else:
        a = pack["a"][r0:r1].to(dtype)
        b = expert_weight(problem, pack, e).to(dtype)
    return a @ b.t()


def _epilogue(problem: DgluProblem, g0, c, beta, p, gate_cols, up_cols):
    """(dgate, dup, activation value) of rows whose GEMM result (alpha**2 included) is ``g0``:
    ``c`` their C rows, ``beta`` and ``p`` their expert's beta and their prob (scalars or
    columns that broadcast over the row)."""
    act = problem.act
    if problem.round_dgrad_to_input_dtype:
        g0 = g0.to(torch.bfloat16).to(g0.dtype)
    c = c.to(g0.dtype)
    gate, up = c[:, gate_cols], c[:, up_cols]
    if act.act_func != "dgeglu" or act.dgeglu_applies_beta:
        gate, up = beta * gate, beta * up
    dgate_l, dup_l, act_val = local_derivatives(act, gate, up)
    return g0 * p * dgate_l, g0 * p * dup_l, act_val


def grouped_dglu_reference(problem: DgluProblem, pack: Mapping, *, compute_dtype=torch.float32) -> None:
    """Run the operation on ``pack`` in ``compute_dtype``; writes/accumulates the output slots.

    BF16 operands with dense weights on a GPU take :func:`grouped_dglu_blocks`, which never
    reads device data on the host; everything else walks the experts' row ranges on the host."""
    if pack["c"].device.type == "cuda" and problem.weight_mode == "dense" and not problem.is_block_scaled:
        return grouped_dglu_blocks(problem, pack, compute_dtype=compute_dtype)
    m = pack["c"].shape[0]
    dev = pack["c"].device
    gate_cols, up_cols = gate_up_columns(problem.n, dev)
    alpha = pack["alpha"].to(compute_dtype)
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
        ranges = expert_ranges(pack["padded_offsets"], m)
    check_pointer_tables(problem, pack, ranges)  # before any output is written
    for e, r0, r1 in ranges:
        if r1 == r0:
            continue  # an empty group produces nothing
        g0 = alpha[e] ** 2 * expert_gemm(problem, pack, e, r0, r1, compute_dtype)
        p = prob[r0:r1].to(compute_dtype)[:, None] if prob is not None else 1.0
        dgate, dup, act_val = _epilogue(problem, g0, pack["c"][r0:r1], beta[e], p, gate_cols, up_cols)
        outs.append((e, r0, r1, dgate, dup))
        if dprob is not None:
            dprob[r0:r1] += (g0 * act_val).sum(1).to(dprob.dtype)
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
        from .blockscaled_run import finish_outputs  # amax, quantized D_row/D_col with SFD

        finish_outputs(problem, pack, outs, gate_cols, up_cols)


#: Bytes of gathered weights one step of ``grouped_dglu_blocks`` may hold.
_BLOCK_GATHER_BYTES = 256 << 20


def grouped_dglu_blocks(problem: DgluProblem, pack: Mapping, *, compute_dtype=torch.float32) -> None:
    """:func:`grouped_dglu_reference` for BF16 operands and dense weights, without a host
    read of device data, so that a GPU call needs no sync and can be captured in a CUDA graph
    (tests/gpu/test_reference_cuda.py checks both on the device). Offsets are 256-aligned, so
    every 256-row block lies in one expert: each block's expert comes from a device-side
    search of the offsets, its weights from a gather, and blocks past the last offset keep
    their outputs' bytes (written back unchanged) and add nothing. The offsets' values are
    not checked (device data; docs/vendor_contract.md §3.6)."""
    a, c, b = pack["a"], pack["c"], pack["b"]
    m, two_n = c.shape
    dev, n, k, num_experts = c.device, problem.n, problem.k, problem.num_experts
    gate_cols, up_cols = gate_up_columns(n, dev)
    nblk = m // 256
    starts = torch.arange(0, m, 256, dtype=pack["padded_offsets"].dtype, device=dev)
    blk_e = torch.searchsorted(pack["padded_offsets"], starts, right=True)  # L past the last offset
    valid = blk_e < num_experts
    e_idx = blk_e.clamp(max=num_experts - 1)
    alpha2 = pack["alpha"].to(compute_dtype)[e_idx] ** 2
    beta = pack["beta"].to(compute_dtype)[e_idx]
    prob, dprob, dbias = pack.get("prob"), pack.get("dprob"), pack.get("dbias")
    activation, d_row = pack.get("activation"), pack["d_row"]
    dbias_acc = None
    if dbias is not None:  # row L takes the sums of blocks past the last offset, and is dropped
        dbias_acc = torch.zeros(num_experts + 1, two_n, dtype=compute_dtype, device=dev)
        dbias_acc[:num_experts] = dbias.to(compute_dtype)
    sum_into = torch.where(valid, blk_e, num_experts)
    weights = b.permute(2, 0, 1)  # (L, N, K)
    step = max(1, _BLOCK_GATHER_BYTES // max(1, n * k * torch.empty((), dtype=compute_dtype).element_size()))
    for b0 in range(0, nblk, step):
        b1 = min(nblk, b0 + step)
        rows = slice(256 * b0, 256 * b1)
        ok = valid[b0:b1].repeat_interleave(256, output_size=256 * (b1 - b0))[:, None]
        acc = torch.bmm(a[rows].to(compute_dtype).view(b1 - b0, 256, k),
                        weights[e_idx[b0:b1]].to(compute_dtype).transpose(1, 2))
        g0 = (alpha2[b0:b1, None, None] * acc).reshape(-1, n)
        p = prob[rows].to(compute_dtype)[:, None] if prob is not None else 1.0
        beta_rows = beta[b0:b1].repeat_interleave(256, output_size=256 * (b1 - b0))[:, None]
        dgate, dup, act_val = _epilogue(problem, g0, c[rows], beta_rows, p, gate_cols, up_cols)
        if dprob is not None:
            dprob[rows] = torch.where(ok[:, 0], dprob[rows] + (g0 * act_val).sum(1).to(dprob.dtype), dprob[rows])
        if dbias_acc is not None:
            sums = torch.empty(b1 - b0, two_n, dtype=compute_dtype, device=dev)
            sums[:, gate_cols] = dgate.view(b1 - b0, 256, n).sum(1)
            sums[:, up_cols] = dup.view(b1 - b0, 256, n).sum(1)
            dbias_acc.index_add_(0, sum_into[b0:b1], sums)
        if activation is not None:
            activation[rows] = torch.where(ok, (p * act_val).to(activation.dtype), activation[rows])
        d = torch.empty(b1 - b0, 256, two_n, dtype=d_row.dtype, device=dev).view(-1, two_n)
        d[:, gate_cols] = _store(dgate, d_row.dtype)
        d[:, up_cols] = _store(dup, d_row.dtype)
        d_row[rows] = torch.where(ok, d, d_row[rows])
    if dbias_acc is not None:
        dbias.copy_(dbias_acc[:num_experts].to(dbias.dtype))


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
    grouped_dglu_reference(problem, fresh, compute_dtype=compute_dtype)
    return {k: fresh[k] for k in ("d_row", "dprob", "dbias", "activation")}
