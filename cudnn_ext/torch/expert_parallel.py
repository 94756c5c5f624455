"""Expert parallelism over ``torch.distributed``: ``GroupedGluMLP``'s experts sharded over ranks.

Owns one job: route each rank's tokens to the ranks that own their experts, run the local
shard of experts (a ``GroupedGluMLP``) on them, and bring the results back. The expert math,
its fused backward and its row layout stay in ``mlp``.

With ``L`` experts over the ``EP`` ranks of a process group, group rank ``r`` owns experts
``[r * L/EP, (r+1) * L/EP)``. Per forward:

1. Every rank counts its (token, slot) pairs per expert and exchanges the counts with one
   ``all_to_all_single`` of ``EP * (L/EP + 1)`` integers (the extra column carries the number of
   out-of-range expert ids, so every rank sees a bad id on any rank and all raise together).
2. **One host read** of the sent and received counts: ``all_to_all_single`` takes its split
   sizes as Python ints (NCCL sizes each peer's send and receive from them) and the receive
   buffer and the padded local layout are tensor shapes, so the host must know them. This is
   the layer's only device-to-host synchronization; the backward reuses the sizes and syncs
   never.
3. The pairs, sorted stably by expert, are sent (rows of ``x`` and their probabilities, one
   autograd node for both) with ``all_to_all_single``; the receiver places them into local
   expert order with each expert's rows padded to a multiple of the local ``GroupedGluMLP``'s
   ``m_aligned`` (``padded_offsets``; 256 by default; on Hopper 8 with ``m_aligned=8``, or no
   padding at all with ``m_aligned=1``),
   padding rows zero with probability 0.
4. ``GroupedGluMLP`` (which multiplies each row by its probability before the down projection)
   runs the local experts; the rows go back by the reverse ``all_to_all_single`` and each
   token's ``k`` expert outputs are summed in fp32.

The backward of every exchange is the reverse exchange with the same split sizes. All index
work runs on the tensors' device without reading them on the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..contract.rules import M_ALIGN
from .mlp import GroupedGluMLP


# --------------------------------------------------------------------------- the exchange
class _Exchange(torch.autograd.Function):
    """``all_to_all_single`` of several row-split tensors with the same splits; backward sends
    the gradients back with the splits swapped.

    One node for all of them so that a rank's backward runs every reverse exchange whenever it
    runs one (a gradient a rank does not need is still sent, as zeros, because its peers wait
    for it), and so their collectives are issued in one fixed order on every rank.
    """

    @staticmethod
    def forward(ctx, send_splits: List[int], recv_splits: List[int], group, *tensors: Tensor):
        ctx.send_splits, ctx.recv_splits, ctx.group = send_splits, recv_splits, group
        ctx.shapes = [(t.shape, t.dtype, t.device) for t in tensors]
        return _all_to_all(tensors, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, *grads: Optional[Tensor]):
        rows = sum(ctx.recv_splits)
        full = [g if g is not None else torch.zeros((rows,) + tuple(shape[1:]), dtype=dtype, device=device)
                for g, (shape, dtype, device) in zip(grads, ctx.shapes)]
        return (None, None, None) + _all_to_all(full, ctx.recv_splits, ctx.send_splits, ctx.group)


def _all_to_all(tensors, send_splits: List[int], recv_splits: List[int], group) -> Tuple[Tensor, ...]:
    rows = sum(recv_splits)
    outs, works = [], []
    for t in tensors:
        t = t.contiguous()  # all_to_all_single sends the storage row-split as laid out
        out = t.new_empty((rows,) + tuple(t.shape[1:]))
        # issued together, waited together: the exchanges of one node overlap on the wire
        works.append(dist.all_to_all_single(out, t, output_split_sizes=recv_splits,
                                            input_split_sizes=send_splits, group=group, async_op=True))
        outs.append(out)
    for w in works:
        w.wait()
    return tuple(outs)


class _PairRows(torch.autograd.Function):
    """``x[order // k]``: each token's row once per routed pair, in sent order.

    Its backward sums each token's ``k`` row gradients in a fixed order in at least fp32 (the
    forward combine's rule), where ``index_select``'s own backward would add them with atomics
    on CUDA, in x's dtype (bf16) and in no fixed order.
    """

    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor, k: int):
        ctx.save_for_backward(order)
        ctx.k = k
        return x.index_select(0, order // k)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (order,) = ctx.saved_tensors
        return _sum_pairs(grad, order, ctx.k, grad.dtype), None, None


def _sum_pairs(rows: Tensor, order: Tensor, k: int, dtype: torch.dtype) -> Tensor:
    """(T, H) ``dtype`` per-token sums of ``rows`` (T * k rows in sent order), added in at least fp32."""
    pairs = rows.new_empty(rows.shape).index_copy(0, order, rows)  # back to (token, slot) order
    acc = torch.promote_types(rows.dtype, torch.float32)
    return pairs.view(-1, k, rows.shape[1]).sum(1, dtype=acc).to(dtype)


# --------------------------------------------------------------------------- routing
@dataclass(frozen=True)
class Routing:
    """Where one forward's (token, slot) pairs go and come from (built by ``route``).

    ``order``: the pairs (flattened token-major, ``T * k``) sorted stably by expert; pair
    ``order[i]`` is the ``i``-th row sent. ``send_splits[d]`` / ``recv_splits[s]``: rows sent to
    / received from group rank ``d`` / ``s`` (host ints). ``dest[i]``: the row of the padded
    local layout that received row ``i`` occupies. ``padded_offsets``: the local experts'
    cumulative ends, each a multiple of the layout's alignment (int32, on the device). ``rows``: rows of the padded layout.
    ``local_counts``: rows per local expert before padding (host ints).
    """

    order: Tensor
    send_splits: List[int]
    recv_splits: List[int]
    dest: Tensor
    padded_offsets: Tensor
    rows: int
    local_counts: List[int]


def route(expert_ids: Tensor, num_experts: int, group=None, align: int = M_ALIGN) -> Routing:
    """Exchange the per-expert pair counts over ``group`` and lay out this rank's received rows,
    each local expert's group padded to a multiple of ``align`` rows (the experts' ``m_aligned``).

    Collective: every rank of ``group`` calls it in the same step. Performs the layer's one
    host read (the counts; see the module docstring).
    """
    ep = dist.get_world_size(group)
    local = num_experts // ep
    device = expert_ids.device
    ids = expert_ids.reshape(-1).long()
    valid = (ids >= 0) & (ids < num_experts)
    # an out-of-range id is counted in bin L (not sent anywhere) and reported to every rank;
    # index_add_ rather than bincount, which reads the largest id on the host on CUDA
    binned = torch.where(valid, ids, torch.full_like(ids, num_experts))
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.index_add_(0, binned, torch.ones_like(binned))
    send = torch.cat([counts[:num_experts].view(ep, local), counts[num_experts:].expand(ep, 1)], dim=1)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send.contiguous(), group=group)

    # the one host read: split sizes are host ints for all_to_all_single, and layout sizes are shapes
    send_h, recv_h = torch.stack([send, recv]).tolist()
    bad = [row[local] for row in recv_h]
    if any(bad):
        ranks = [s for s, b in enumerate(bad) if b]
        mine = send_h[0][local]
        raise ValueError(f"expert_ids: every id must lie in [0, {num_experts}) (num_experts); group ranks "
                         f"{ranks} passed out-of-range ids ({mine} on this rank)")
    send_splits = [sum(row[:local]) for row in send_h]
    recv_splits = [sum(row[:local]) for row in recv_h]
    local_counts = [sum(recv_h[s][j] for s in range(ep)) for j in range(local)]
    rows_used = sum(-(-n // align) * align for n in local_counts)
    # a rank that receives nothing still runs its experts on one block of rows that belong to no
    # expert (all ends 0), so its backward produces zero weight gradients: an M = 0 layout is
    # not a valid grouped-GEMM problem
    rows = max(rows_used, align)

    order = torch.argsort(ids, stable=True)  # expert-major, then token-major within an expert
    # received rows arrive block by block: source rank s, then local expert j (row-major (s, j));
    # block (s, j) lands after expert j's padded start and the rows of j from ranks before s
    # (the offsets are derived on the device from the received counts: building them from the
    # host copies would be a blocking host-to-device copy, a second sync on CUDA)
    c = recv[:, :local]  # (EP, local), device
    padded = (c.sum(0) + align - 1) // align * align
    ends = torch.cumsum(padded, 0)
    pad_start = ends - padded
    flat = c.reshape(-1)
    recv_start = torch.cumsum(flat, 0) - flat
    dest_start = (pad_start[None, :] + torch.cumsum(c, 0) - c).reshape(-1)
    total = sum(recv_splits)
    block = torch.repeat_interleave(torch.arange(flat.numel(), device=device), flat, output_size=total)
    dest = dest_start[block] + torch.arange(total, device=device) - recv_start[block]
    offsets = ends.to(torch.int32)
    return Routing(order, send_splits, recv_splits, dest, offsets, rows, local_counts)


# --------------------------------------------------------------------------- the layer
class ExpertParallelGluMLP(nn.Module):
    """MoE expert layer with its ``num_experts`` experts sharded over the ranks of ``group``.

    ``forward(x, expert_ids, probs) -> y``: ``x`` (T, H) this rank's tokens (any T, 0 included;
    T may differ between ranks), ``expert_ids`` (T, k) integer expert ids in ``[0, num_experts)``
    and ``probs`` (T, k) floating routing probabilities, as a router's top-k produces them.
    ``y[t] = sum_i probs[t, i] * expert_{ids[t, i]}(x[t])`` (T, H) in ``x``'s dtype: each expert's
    output is ``GroupedGluMLP``'s (bf16 compute, probability applied before the down projection),
    the ``k`` terms summed in fp32. Gradients flow to ``x``, ``probs`` and this rank's expert
    weights.

    ``self.experts`` is this rank's ``GroupedGluMLP`` over its ``num_experts / EP`` experts
    (global experts ``self.expert_range``); the remaining keyword arguments are
    ``GroupedGluMLP``'s. Each rank initializes its shard from its own RNG state: load weights
    with ``copy_shard_from`` or a state dict for a given model.

    Every rank of ``group`` must call ``forward`` in the same step (it is collective, and so is
    the backward: run it on every rank, with the same ``requires_grad`` of ``x`` / ``probs``).
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, *, group=None, **mlp_kwargs):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ExpertParallelGluMLP needs torch.distributed initialized "
                               "(dist.init_process_group, e.g. under torchrun)")
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts <= 0:
            raise ValueError(f"num_experts: must be a positive int, got {num_experts!r}")
        if dist.get_rank(group) < 0:
            raise ValueError("group: this rank is not a member of it (every rank that calls the layer must be)")
        ep = dist.get_world_size(group)
        if num_experts % ep:
            raise ValueError(f"num_experts: must be a multiple of the group's size {ep} (each rank owns "
                             f"num_experts / {ep} experts), got {num_experts}")
        self.group = group
        self.num_experts = num_experts
        self.ep_size, self.ep_rank = ep, dist.get_rank(group)
        local = num_experts // ep
        self.expert_range = (self.ep_rank * local, (self.ep_rank + 1) * local)
        self.experts = GroupedGluMLP(local, hidden, intermediate, **mlp_kwargs)

    @torch.no_grad()
    def copy_shard_from(self, full: GroupedGluMLP) -> None:
        """Copy this rank's experts' weights out of ``full``, a ``GroupedGluMLP`` of all experts."""
        if not isinstance(full, GroupedGluMLP):
            raise TypeError(f"full: must be a GroupedGluMLP, got {type(full).__name__}")
        mine = self.experts
        if (full.num_experts, full.hidden, full.intermediate) != (self.num_experts, mine.hidden, mine.intermediate):
            raise ValueError(f"full: (experts, hidden, intermediate) must be {(self.num_experts, mine.hidden, mine.intermediate)}, "
                             f"got {(full.num_experts, full.hidden, full.intermediate)}")
        if (full.b1 is None) != (mine.b1 is None) or full.cfg != mine.cfg:
            raise ValueError("full: its activation and bias must match this layer's")
        lo, hi = self.expert_range
        mine.w1.copy_(full.w1[lo:hi])
        mine.w2.copy_(full.w2[lo:hi])
        if mine.b1 is not None:
            mine.b1.copy_(full.b1[lo:hi])

    def forward(self, x: Tensor, expert_ids: Tensor, probs: Tensor) -> Tensor:
        _check_inputs(x, expert_ids, probs, self.experts.hidden)
        t, k = expert_ids.shape
        r = route(expert_ids, self.num_experts, self.group, align=self.experts.m_aligned)
        x_send = _PairRows.apply(x, r.order, k)
        p_send = probs.reshape(-1).index_select(0, r.order)
        x_recv, p_recv = _Exchange.apply(r.send_splits, r.recv_splits, self.group, x_send, p_send)
        # padding rows: x = 0 and probability 0, so they add nothing to y or any gradient
        x_pad = x_recv.new_zeros((r.rows, x.shape[1])).index_copy(0, r.dest, x_recv)
        p_pad = p_recv.new_zeros((r.rows,)).index_copy(0, r.dest, p_recv)
        y_pad = self.experts(x_pad, p_pad, r.padded_offsets)
        (y_back,) = _Exchange.apply(r.recv_splits, r.send_splits, self.group, y_pad.index_select(0, r.dest))
        # each token's k outputs (bf16) summed in fp32
        return _sum_pairs(y_back, r.order, k, x.dtype)

    def extra_repr(self) -> str:
        lo, hi = self.expert_range
        return f"experts={self.num_experts}, ep={self.ep_size}, rank={self.ep_rank}, local=[{lo}, {hi})"


def _check_inputs(x: Tensor, expert_ids: Tensor, probs: Tensor, hidden: int) -> None:
    for name, t in (("x", x), ("expert_ids", expert_ids), ("probs", probs)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"x: must be (T, {hidden}) (tokens, hidden), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x: must be floating point, got {x.dtype}")
    if expert_ids.dim() != 2 or expert_ids.shape[0] != x.shape[0] or expert_ids.shape[1] < 1:
        raise ValueError(f"expert_ids: must be (T, k) with T = {x.shape[0]} (x's rows) and k >= 1, "
                         f"got {tuple(expert_ids.shape)}")
    if expert_ids.is_floating_point() or expert_ids.is_complex() or expert_ids.dtype == torch.bool:
        raise TypeError(f"expert_ids: must be an integer tensor, got {expert_ids.dtype}")
    if probs.shape != expert_ids.shape:
        raise ValueError(f"probs: must have expert_ids' shape {tuple(expert_ids.shape)}, got {tuple(probs.shape)}")
    if not probs.is_floating_point():
        raise TypeError(f"probs: must be floating point, got {probs.dtype}")
    for name, t in (("expert_ids", expert_ids), ("probs", probs)):
        if t.device != x.device:
            raise ValueError(f"{name}: must be on x's device {x.device}, got {t.device}")


__all__ = ["ExpertParallelGluMLP"]
