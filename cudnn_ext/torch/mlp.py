"""``GroupedGluMLP``: an autograd MoE expert MLP whose backward runs the fused grouped GEMM + dGLU.

Owns the layer (parameters, forward, the autograd Function) and its row layout. It computes the
dGLU backward only through the ``cudnn_ext::grouped_gemm_dglu`` op (never re-deriving it), called
through its Python entry ``ops.grouped_gemm_dglu``: eagerly that runs the op's body without the
dispatcher and replays a remembered call after one guard check (the layer's backward repeats
the same metadata every step); under torch.compile it is ``torch.ops.cudnn_ext.grouped_gemm_dglu``,
one opaque node. And
the plain grouped GEMMs through ``torch._grouped_mm`` (device offsets, no host sync) where this
torch has it, else a per-expert loop that reads the offsets on the host.

Layout (rows are tokens already permuted into expert order, as in every MoE dispatch):

* ``x`` (M, H) bf16, ``prob`` (M,) fp32 routing probability per row, ``padded_offsets`` (L,)
  int32 cumulative ends, each (and M) a multiple of the layer's ``m_aligned`` (256 by default;
  8 .. 128 take the fused op's BF16 extension, ``pad_expert_rows(..., align=m_aligned)`` makes
  such a layout): expert ``e`` owns rows ``[offs[e-1], offs[e])``; rows at
  or past ``offs[-1]`` belong to no expert (output 0, gradients 0). Padding rows inside a range
  are ordinary rows; give them ``prob = 0`` (and ``x = 0``) and they contribute nothing to
  ``y``, ``dx`` or the weight gradients.
* ``w1`` (L, 2N, H): up projection; output columns are gate/up interleaved in 32-column blocks
  (in every 64 columns the first 32 are gate, the next 32 are up). ``b1`` (L, 2N) optional.
* ``w2`` (L, H, N): down projection.

Forward per expert: ``C = x @ w1ᵀ (+ b1)`` (stored bf16, saved), ``h = prob * glu(gate, up)``,
``y = h @ w2ᵀ``. Backward: ``(dC, dprob, db1) = grouped_gemm_dglu(a=dy, b=w2ᵀ, c=C, alpha=1,
beta=1, prob)``; ``dw2 = dyᵀ h`` (h recomputed from C), ``dx = dC @ w1``, ``dw1 = dCᵀ x``.
``h`` comes from the ``cudnn_ext::glu_forward`` op and the GEMM outputs' rows of no expert are
zeroed by ``cudnn_ext::zero_rows_past`` (``layer_ops``: one CuTe DSL pass each on Hopper), so
the step is its six grouped GEMMs plus two passes over h.

The activation is differentiated at the *stored bf16* C, exactly like the fused kernel, so the
layer's own forward computes glu from the same bf16 C in fp32.
"""
from __future__ import annotations

import importlib.util
import math
from typing import Optional

import torch
from torch import Tensor, nn

from .. import activations
from ..contract.rules import M_ALIGN, check_m_aligned
from ..errors import DtypeError
from ..layout import check_layout, halves_to_interleaved
from ..runtime.streams import capturing, current_stream_handle
from . import layer_ops
from .layer_ops import glu_act, glu_forward, zero_rows_past
from .ops import _eager, grouped_gemm_dglu

_HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")


# --------------------------------------------------------------------------- grouped GEMMs
def _grouped_mm_usable(t: Tensor) -> bool:
    if not _HAS_GROUPED_MM or t.dtype != torch.bfloat16:
        return False
    if t.is_cuda:
        return layer_ops.device_capability(t.get_device())[0] >= 9
    return t.device.type == "cpu"


def _ranges(offsets: Tensor):
    """Host (start, end) per expert: a device->host read (reference-style fallback only)."""
    ends = offsets.tolist()
    return list(zip([0] + ends[:-1], ends))


def grouped_mm(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    """``out[r] = x[r] @ w[e(r)]ᵀ`` with w (L, N, K); rows of no expert are 0."""
    if _grouped_mm_usable(x):
        # rows past offs[-1] are not written by _grouped_mm (may hold NaN): zeroed on the device
        return zero_rows_past(torch._grouped_mm(x, w.transpose(-2, -1), offs=offsets), offsets)
    out = x.new_zeros((x.shape[0], w.shape[1]))
    for e, (r0, r1) in enumerate(_ranges(offsets)):
        if r1 > r0:
            out[r0:r1] = x[r0:r1] @ w[e].t()
    return out


def grouped_wgrad(a: Tensor, b: Tensor, offsets: Tensor) -> Tensor:
    """``out[e] = a_eᵀ @ b_e`` over each expert's rows: (L, P, Q) from a (M, P), b (M, Q)."""
    if a.shape[0] == 0:  # no rows (an expert-parallel rank can get none): _grouped_mm refuses
        return a.new_zeros((offsets.shape[0], a.shape[1], b.shape[1]))
    if _grouped_mm_usable(a):
        return torch._grouped_mm(a.t(), b, offs=offsets)
    out = a.new_zeros((offsets.shape[0], a.shape[1], b.shape[1]))
    for e, (r0, r1) in enumerate(_ranges(offsets)):
        if r1 > r0:
            out[e] = a[r0:r1].t() @ b[r0:r1]
    return out


class _RowGather(torch.autograd.Function):
    """``out[i] = x[idx[i]]`` where ``valid[i]``, else 0, for a one-to-one row map whose inverse
    is ``(inv, inv_valid)``: the gradient is the inverse gather. Autograd's own backward of
    ``x[idx]`` is a scatter-add, which sorts the indices and serializes on the duplicates
    that the padding rows' clamped indices are (8 ms a step on the H200 at qwen3's size)."""

    @staticmethod
    def forward(ctx, x, idx, valid, inv, inv_valid):
        ctx.save_for_backward(inv, inv_valid)
        return layer_ops.gather_rows(x, idx, valid)

    @staticmethod
    def backward(ctx, grad):
        inv, inv_valid = ctx.saved_tensors
        return layer_ops.gather_rows(grad.contiguous(), inv, inv_valid), None, None, None, None


def gather_rows(x: Tensor, idx: Tensor, valid: Tensor, inv: Tensor, inv_valid: Tensor) -> Tensor:
    """Rows of ``x`` moved by a one-to-one map (``pad_expert_rows``' ``src``/``dest`` pair):
    ``out[i] = x[idx[i]]`` where ``valid[i]``, else 0; ``(inv, inv_valid)`` is the inverse
    map (``x``'s row ``r`` lands at ``inv[r]`` where ``inv_valid[r]``). Differentiable; its
    backward gathers too (deterministic, no atomics)."""
    return _RowGather.apply(x, idx, valid, inv, inv_valid)


#: The smallest expert-row alignment the fused op takes (its BF16 ``m_aligned`` extension):
#: groups of any size.
MIN_ROW_ALIGN = 1


def fused_row_alignment(device: torch.device) -> int:
    """The expert-row alignment to lay groups out at for the fused op on ``device``: 1 (groups
    as they come, no copies) on the CPU and on Hopper with the CuTe DSL (the kernel's ragged
    schedule), 256 on other GPUs, where the vendor's engine takes 256 only. A compile-time
    constant under ``torch.compile`` (the device does not change between calls)."""
    if device.type != "cuda":
        return MIN_ROW_ALIGN
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_row_alignment(index)


def _cuda_row_alignment(index: int) -> int:
    hopper = layer_ops.device_capability(index) == (9, 0)
    return MIN_ROW_ALIGN if hopper and importlib.util.find_spec("cutlass") is not None else M_ALIGN


# torch.compiler.assume_constant_result sets this mark; the decorator itself imports
# torch._dynamo (a second of import time), so the mark is set directly (a test checks it is
# what the decorator sets)
_cuda_row_alignment._dynamo_marked_constant = True


def pad_expert_rows(num_rows_per_expert: Tensor, rows: int, align: int = M_ALIGN):
    """Map rows grouped by expert (``num_rows_per_expert`` (L,), any alignment) into the fused
    op's layout, each expert's group padded to a multiple of ``align`` rows; all on the device
    (no host sync, static shapes: ``torch.compile`` traces it as one graph).

    The padded row count is the static bound ``m_pad = max(align, (rows + (align-1)*L)
    rounded down to align)``, so it needs no device read; rows past the last padded offset
    belong to no expert (the layer gives them output 0 and the grouped GEMMs skip them). The
    counts' running sum is clipped at ``rows``: rows past it belong to no expert.

    Returns ``(padded_offsets (L,) int32, src (m_pad,) int64, src_valid (m_pad,) bool, dest
    (rows,) int64, dest_valid (rows,) bool)``: padded row ``p`` holds routed row ``src[p]``
    where ``src_valid[p]`` (elsewhere it is padding), and routed row ``r`` sits at padded row
    ``dest[r]`` where ``dest_valid[r]``.
    """
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0:
        raise ValueError(f"align: must be a positive int, got {align!r}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(f"rows: must be a non-negative int, got {rows!r}")
    if num_rows_per_expert.dim() != 1 or num_rows_per_expert.shape[0] == 0:
        raise ValueError(f"num_rows_per_expert: must be a non-empty 1-D tensor of row counts, got shape "
                         f"{tuple(num_rows_per_expert.shape)}")
    if num_rows_per_expert.is_floating_point() or num_rows_per_expert.is_complex():
        raise TypeError(f"num_rows_per_expert: must hold integers, got {num_rows_per_expert.dtype}")
    L = num_rows_per_expert.shape[0]
    dev = num_rows_per_expert.device
    ends = torch.cumsum(num_rows_per_expert.long(), 0).clamp(max=rows)
    counts = ends.diff(prepend=ends.new_zeros(1))  # after the clip: rows each expert really has
    starts = ends - counts
    padded = (counts + (align - 1)) // align * align
    pends = torch.cumsum(padded, 0)
    pstarts = pends - padded
    m_pad = max(align, (rows + (align - 1) * L) // align * align)
    p = torch.arange(m_pad, device=dev)
    e_p = torch.searchsorted(pends, p, right=True)  # L for rows past the last group
    e_pc = e_p.clamp(max=L - 1)
    local = p - pstarts[e_pc]
    src_valid = (e_p < L) & (local < counts[e_pc])
    src = (starts[e_pc] + local).clamp(min=0, max=max(rows - 1, 0))  # in range even where not valid
    r = torch.arange(rows, device=dev)
    e_r = torch.searchsorted(ends, r, right=True)
    e_rc = e_r.clamp(max=L - 1)
    dest_valid = e_r < L
    dest = torch.where(dest_valid, pstarts[e_rc] + (r - starts[e_rc]), 0)
    return pends.to(torch.int32), src, src_valid, dest, dest_valid


def row_experts(offsets: Tensor, m: int) -> Tensor:
    """Expert index of every row, on the device (L for rows past ``offsets[-1]``)."""
    rows = torch.arange(m, device=offsets.device, dtype=offsets.dtype)
    return torch.searchsorted(offsets, rows, right=True)


#: (L, device, stream) -> the fused op's alpha and beta (all ones), made once
_UNIT_SCALES: dict = {}
_UNIT_SCALES_MAX = 64


def _unit_scales(L: int, device: torch.device):
    """alpha = beta = 1 (L,) fp32 for the backward's fused op: two tensors, since the replay's
    guard (torch's tensor guard) never matches a call that passes one tensor twice. Eagerly
    they are made once per stream and kept (never written: the op only reads them), which
    saves two allocations and fill launches of host issue time per step; under torch.compile
    and CUDA-graph capture (where a fill is recorded, not run) they are made every time."""
    cuda = device.type == "cuda"
    if not _eager() or capturing(cuda):
        ones = torch.ones(L, dtype=torch.float32, device=device)
        return ones, torch.ones_like(ones)
    stream = current_stream_handle(device.index) if cuda else 0
    key = (L, device, stream)  # made on the stream that reads them: ordered without a sync
    pair = _UNIT_SCALES.get(key)
    if pair is None:
        if len(_UNIT_SCALES) >= _UNIT_SCALES_MAX:
            _UNIT_SCALES.clear()
        ones = torch.ones(L, dtype=torch.float32, device=device)
        pair = _UNIT_SCALES[key] = (ones, torch.ones_like(ones))
    return pair


class _GroupedGluMLPFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, prob, w1, b1, w2, offsets, cfg, m_aligned):
        c = grouped_mm(x, w1, offsets)
        if b1 is not None:
            # the bias joins in fp32 and C is rounded once, as a fused GEMM epilogue would
            m, L = x.shape[0], offsets.shape[0]
            row_e = row_experts(offsets, m)
            c = c.float() + b1[row_e.clamp(max=L - 1)].float() * (row_e < L)[:, None].float()
        c = c.to(torch.bfloat16)
        p = prob.contiguous()
        h = glu_forward(c, p, offsets, **cfg)  # rows of no expert: 0, whatever prob holds
        y = grouped_mm(h, w2, offsets)
        ctx.save_for_backward(x, p, w1, w2, offsets, c)
        ctx.cfg = cfg
        ctx.m_aligned = m_aligned
        ctx.has_bias = b1 is not None
        ctx.b1_dtype = b1.dtype if b1 is not None else None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, p, w1, w2, offsets, c = ctx.saved_tensors
        cfg = ctx.cfg
        L = offsets.shape[0]
        dy = dy.to(torch.bfloat16).contiguous()
        alpha, beta = _unit_scales(L, dy.device)
        # the fused step: dC (interleaved), dprob and db1 in one op; B_e = w2_eᵀ is (N, H),
        # N-major. Rows of no expert: dprob 0 (the op's), dC unwritten and never read below
        dc, dprob, db1 = grouped_gemm_dglu(
            dy, c, offsets, alpha, beta, p, b=w2.transpose(1, 2),
            act_func=cfg["act_func"], linear_offset=cfg["linear_offset"], geglu_alpha=cfg["geglu_alpha"],
            glu_clamp_max=cfg["clamp_max"], glu_clamp_min=cfg["clamp_min"], generate_dbias=ctx.has_bias,
            d_dtype=torch.bfloat16, m_aligned=ctx.m_aligned)
        h = glu_forward(c, p, offsets, **cfg)
        dw2 = grouped_wgrad(dy, h, offsets).to(w2.dtype)
        dx = grouped_mm(dc, w1.transpose(1, 2), offsets).to(x.dtype)
        dw1 = grouped_wgrad(dc, x.to(dc.dtype), offsets).to(w1.dtype)
        db1 = db1.to(ctx.b1_dtype) if ctx.has_bias else None
        return dx, dprob, dw1, db1, dw2, None, None, None


def glu_config(activation: str = "swiglu", *, geglu_alpha: float = 1.702, clamp_max: float = 7.0,
               clamp_min: float = -7.0, linear_offset: Optional[float] = None) -> dict:
    """The activation settings ``grouped_glu_mlp`` takes (``GroupedGluMLP.cfg``), validated."""
    known = activations.forward_names()
    if activation not in known:
        layer = [a.forward_name for a in activations.ACTIVATIONS.values() if a.forward_name]
        raise ValueError(f"activation: must be one of {layer}, got {activation!r}")
    rec = activations.activation(known[activation])
    act = rec.name
    if linear_offset is None:
        linear_offset = rec.default_linear_offset
    elif "linear_offset" not in rec.params and linear_offset != 0.0:
        raise ValueError(f"linear_offset: {rec.forward_name} has none, got {linear_offset}")
    return dict(act_func=act, geglu_alpha=float(geglu_alpha), clamp_max=float(clamp_max),
                clamp_min=float(clamp_min), linear_offset=float(linear_offset))


def grouped_glu_mlp(x: Tensor, prob: Tensor, w1: Tensor, w2: Tensor, padded_offsets: Tensor, *,
                    b1: Optional[Tensor] = None, cfg: Optional[dict] = None, m_aligned: int = M_ALIGN,
                    gate_up_layout: str = "interleaved") -> Tensor:
    """``GroupedGluMLP``'s forward as a function of its weights (same layout, same autograd).

    For layers that own their parameters under other names (framework integrations,
    ``cudnn_ext.integrations``). ``cfg`` comes from :func:`glu_config` (default: SwiGLU).
    ``m_aligned``: the row alignment of ``padded_offsets`` and M, passed to the fused op.
    ``gate_up_layout``: how ``w1``'s rows (and ``b1``) hold gate and up, see
    :class:`GroupedGluMLP`. Operands are cast to bf16, the fused op's operand contract.
    """
    bf = torch.bfloat16
    cfg = glu_config() if cfg is None else cfg
    check_m_aligned(m_aligned)  # now, not in the backward after the forward has run
    prob = _check_layer_inputs(x, prob, w1, w2, padded_offsets)
    if check_layout(gate_up_layout) == "halves":  # differentiable: the gradients come back as halves
        w1 = halves_to_interleaved(w1, dim=1, name="w1")
        b1 = None if b1 is None else halves_to_interleaved(b1, dim=1, name="b1")
    return _GroupedGluMLPFn.apply(x.to(bf), prob.float(), w1.to(bf), b1.to(bf) if b1 is not None else None,
                                  w2.to(bf), padded_offsets, cfg, m_aligned)


def _check_layer_inputs(x: Tensor, prob: Tensor, w1: Tensor, w2: Tensor, padded_offsets: Tensor) -> Tensor:
    """The layer's own arguments, checked by name before anything runs; returns prob as (M,)
    (a (M, 1) or (M, 1, 1) prob, the vendor's shape, is taken as it is)."""
    if x.dim() != 2 or x.shape[1] != w1.shape[-1]:
        raise ValueError(f"x: expected (M, hidden={w1.shape[-1]}), got {tuple(x.shape)}")
    m = x.shape[0]
    if prob.numel() != m or any(s != 1 for s in prob.shape[1:]) or prob.dim() == 0:
        raise ValueError(f"prob: expected (M,) = ({m},) (or (M, 1)), got {tuple(prob.shape)}")
    if not prob.is_floating_point():
        raise DtypeError(f"prob: must be a floating-point tensor (it is used in fp32), got {prob.dtype}")
    if padded_offsets.dtype != torch.int32:
        raise DtypeError(f"padded_offsets: must be int32 (cumulative expert ends), got {padded_offsets.dtype}")
    if padded_offsets.dim() != 1 or padded_offsets.shape[0] != w1.shape[0]:
        raise ValueError(f"padded_offsets: expected ({w1.shape[0]},), one end per expert, "
                         f"got {tuple(padded_offsets.shape)}")
    if padded_offsets.device != x.device or prob.device != x.device:
        raise ValueError(f"padded_offsets and prob must be on x's device {x.device}, got "
                         f"{padded_offsets.device} and {prob.device}")
    return prob.reshape(m)


class GroupedGluMLP(nn.Module):
    """MoE expert MLP (L experts, hidden H, intermediate N) with a fused dGLU backward.

    ``forward(x, prob, padded_offsets) -> y`` with x (M, H), prob (M,) fp32 and padded_offsets
    (L,) int32 (see the module docstring for the row layout). Parameters are cast to bf16 for
    compute (the fused op's operand contract); keep them in bf16 or fp32 master copies.

    ``activation``: ``"swiglu"`` or ``"geglu"`` (clamped GeGLU: ``geglu_alpha``, ``clamp_max``,
    ``clamp_min``, ``linear_offset``; for DeepSeek-V4 clamped SwiGLU use geglu with alpha 1,
    offset 0 and clamps ±limit). ``m_aligned``: the row alignment of the ``padded_offsets``
    (and M) the layer is given, one of 1 (groups of any size), 8, 16, 32, 64, 128, 256.

    ``w1`` (L, 2N, H) holds the gate and up rows in the fused op's interleave (32 gate rows,
    then 32 up rows, in every 64: ``cudnn_ext.layout``) by default. ``gate_up_layout="halves"``
    keeps them as ``[gate; up]`` (the usual fused ``gate_up_proj`` of a checkpoint): each
    forward interleaves a copy, and the gradients come back in the halves layout.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, *, activation: str = "swiglu",
                 bias: bool = False, geglu_alpha: float = 1.702, clamp_max: float = 7.0, clamp_min: float = -7.0,
                 linear_offset: Optional[float] = None, m_aligned: int = M_ALIGN, device=None,
                 dtype=torch.bfloat16, gate_up_layout: str = "interleaved"):
        super().__init__()
        check_m_aligned(m_aligned)
        self.gate_up_layout = check_layout(gate_up_layout)
        if intermediate <= 0 or intermediate % 32:
            raise ValueError(f"intermediate: must be a positive multiple of 32 (gate/up blocks), got {intermediate}")
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.cfg = glu_config(activation, geglu_alpha=geglu_alpha, clamp_max=clamp_max, clamp_min=clamp_min,
                              linear_offset=linear_offset)
        self.m_aligned = m_aligned
        kw = dict(device=device, dtype=dtype)
        self.w1 = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, intermediate, **kw))
        self.b1 = nn.Parameter(torch.zeros(num_experts, 2 * intermediate, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.w1.normal_(0.0, 1.0 / math.sqrt(self.hidden))
            self.w2.normal_(0.0, 1.0 / math.sqrt(self.intermediate))
            if self.b1 is not None:
                self.b1.zero_()

    def forward(self, x: Tensor, prob: Tensor, padded_offsets: Tensor) -> Tensor:
        return grouped_glu_mlp(x, prob, self.w1, self.w2, padded_offsets, b1=self.b1, cfg=self.cfg,
                               m_aligned=self.m_aligned, gate_up_layout=self.gate_up_layout)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"act={self.cfg['act_func'][1:]}, bias={self.b1 is not None}, m_aligned={self.m_aligned}"
                + (f", gate_up_layout={self.gate_up_layout}" if self.gate_up_layout != "interleaved" else ""))


__all__ = ["GroupedGluMLP", "gather_rows", "glu_act", "glu_config", "glu_forward", "grouped_glu_mlp", "grouped_mm", "grouped_wgrad",
           "pad_expert_rows", "row_experts"]
