"""The training layer's elementwise steps as torch ops: ``cudnn_ext::glu_forward``,
``cudnn_ext::zero_rows_past`` and ``cudnn_ext::gather_rows``.

Owns their schemas, fake implementations and the choice between the CuTe DSL kernels
(``kernels.layer``: one pass each, on Hopper) and the torch form (every other device; also the
statement of what the kernels compute). ``GroupedGluMLP`` calls them through the Python entry
points below, which run the op's body directly when eager (as ``ops.grouped_gemm_dglu`` does)
and through ``torch.ops`` under torch.compile, so the layer compiles with both as opaque nodes.

* ``glu_forward(c, prob, padded_offsets, ...) -> h``: ``h[r] = bf16(prob[r] * act(gate, up))``
  of the interleaved bf16 C (32-column gate/up blocks), rows at or past ``padded_offsets[-1]``
  0 whatever C holds there (``torch._grouped_mm`` leaves those rows unwritten).
* ``zero_rows_past(x, padded_offsets)``: rows of ``x`` at or past ``padded_offsets[-1]`` set
  to 0, in place (the last offset is device data: no host sync, capturable).
* ``gather_rows(x, idx, valid) -> out``: ``out[i] = x[idx[i]]`` where ``valid[i]``, else 0
  (one pass; torch's form is an index pass and a select pass). ``idx`` must lie in
  ``[0, rows of x)`` where ``valid`` holds (its other entries are never read by the kernel).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import activations
from ..runtime import caches
from ..runtime.streams import current_stream_handle
from .ops import _LIB, _direct_ok

_lib = torch.library.Library(_LIB, "FRAGMENT")
_lib.define("glu_forward(Tensor c, Tensor prob, Tensor padded_offsets, str act_func='dswiglu', "
            "float geglu_alpha=1.702, float clamp_max=7.0, float clamp_min=-7.0, "
            "float linear_offset=0.0) -> Tensor")
_lib.define("zero_rows_past(Tensor(a!) x, Tensor padded_offsets) -> ()")
_lib.define("gather_rows(Tensor x, Tensor idx, Tensor valid) -> Tensor")

#: gate/up interleave of C's columns (docs/semantics.md): 32 gate, 32 up, repeated
_BLOCK = 32


def rows_below_last(padded_offsets: Tensor, m: int) -> Tensor:
    """(m,) bool: row r lies below the last offset (it belongs to an expert)."""
    return torch.arange(m, device=padded_offsets.device) < padded_offsets[-1]


def glu_act(c: Tensor, act_func: str, *, geglu_alpha: float, clamp_max: float, clamp_min: float,
            linear_offset: float) -> Tensor:
    """(M, N) fp32 activation of the interleaved (M, 2N) pre-activation: the forward of what
    the fused backward differentiates (dSwiGLU; clamped dGeGLU with linear offset; beta 1)."""
    m, two_n = c.shape
    blocks = c.float().view(m, two_n // (2 * _BLOCK), 2, _BLOCK)  # strided views, no gathers
    gate = blocks[:, :, 0, :].reshape(m, two_n // 2)
    up = blocks[:, :, 1, :].reshape(m, two_n // 2)
    if act_func == "dswiglu":
        return F.silu(gate) * up
    y1 = torch.clamp(gate, max=clamp_max)
    return y1 * torch.sigmoid(geglu_alpha * y1) * (torch.clamp(up, min=clamp_min, max=clamp_max) + linear_offset)


def _glu_torch(c, prob, padded_offsets, act_func, geglu_alpha, clamp_max, clamp_min, linear_offset):
    act = glu_act(c, act_func, geglu_alpha=geglu_alpha, clamp_max=clamp_max, clamp_min=clamp_min,
                  linear_offset=linear_offset)
    h = (prob.float()[:, None] * act).to(torch.bfloat16)
    # select, never multiply: C's rows past the last offset may hold NaN
    return torch.where(rows_below_last(padded_offsets, c.shape[0])[:, None], h, h.new_zeros(()))


@functools.lru_cache(maxsize=None)
def device_capability(index: int):
    """``torch.cuda.get_device_capability(index)``, asked once per device (a device-properties
    query per launch otherwise)."""
    return torch.cuda.get_device_capability(index)


caches.lru("device capabilities", device_capability)


def _kernel_ok(x: Tensor, *others: Tensor) -> bool:
    """The CuTe DSL kernels (compiled for sm_90a) can run on ``x``: a CUDA Hopper tensor,
    contiguous and 16-byte aligned, with its companions contiguous on the same device."""
    if not x.is_cuda or device_capability(x.get_device()) != (9, 0):
        return False
    if not x.is_contiguous() or x.data_ptr() % 16:
        return False
    return all(t.device == x.device and t.is_contiguous() for t in others)


def _check_glu(c: Tensor, prob: Tensor, padded_offsets: Tensor, act_func: str) -> None:
    acts = activations.layer_names()  # the activations with a forward (the fused backward's names)
    if act_func not in acts:
        raise ValueError(f"act_func: must be one of {acts}, got {act_func!r}")
    if c.dim() != 2 or c.dtype != torch.bfloat16 or c.shape[1] % (2 * _BLOCK):
        raise ValueError(f"c: must be a bf16 (M, 2N) matrix with 2N a multiple of {2 * _BLOCK}, got "
                         f"{c.dtype} {tuple(c.shape)}")
    if prob.shape != (c.shape[0],) or prob.dtype != torch.float32:
        raise ValueError(f"prob: must be fp32 ({c.shape[0]},), got {prob.dtype} {tuple(prob.shape)}")
    _check_offsets(padded_offsets)


def _check_offsets(padded_offsets: Tensor) -> None:
    if padded_offsets.dim() != 1 or padded_offsets.shape[0] == 0 or padded_offsets.dtype != torch.int32:
        raise ValueError(f"padded_offsets: must be a non-empty 1-D int32 tensor, got "
                         f"{padded_offsets.dtype} {tuple(padded_offsets.shape)}")


def _glu_impl(c, prob, padded_offsets, act_func="dswiglu", geglu_alpha=1.702, clamp_max=7.0,
              clamp_min=-7.0, linear_offset=0.0):
    _check_glu(c, prob, padded_offsets, act_func)
    if not _kernel_ok(c, prob, padded_offsets):
        return _glu_torch(c, prob, padded_offsets, act_func, geglu_alpha, clamp_max, clamp_min, linear_offset)
    from ..kernels.layer.launch import launch_glu
    m, n = c.shape[0], c.shape[1] // 2
    h = torch.empty((m, n), dtype=torch.bfloat16, device=c.device)
    cfg = _glu_config(act_func, geglu_alpha, clamp_max, clamp_min, linear_offset)
    launch_glu(cfg, c.data_ptr(), prob.data_ptr(), padded_offsets.data_ptr(), h.data_ptr(), m, n,
               padded_offsets.shape[0], current_stream_handle(c.get_device()))
    return h


@functools.lru_cache(maxsize=64)
def _glu_config(act_func, geglu_alpha, clamp_max, clamp_min, linear_offset):
    from ..kernels.layer.config import GluConfig
    return GluConfig(act=act_func, geglu_alpha=float(geglu_alpha), clamp_max=float(clamp_max),
                     clamp_min=float(clamp_min), linear_offset=float(linear_offset))


caches.lru("layer GLU configs", _glu_config)


def _zero_impl(x, padded_offsets):
    _check_offsets(padded_offsets)
    if x.dim() < 1:
        raise ValueError(f"x: must have a row dimension, got shape {tuple(x.shape)}")
    m = x.shape[0]
    if m == 0:
        return
    row_bytes = x.numel() // m * x.element_size()  # (not x[0]: a view costs a dispatch)
    if not _kernel_ok(x, padded_offsets) or row_bytes % 16:
        x.masked_fill_(~rows_below_last(padded_offsets, m).view((m,) + (1,) * (x.dim() - 1)), 0)
        return
    from ..kernels.layer.launch import launch_zero_tail
    launch_zero_tail(x.data_ptr(), padded_offsets.data_ptr(), m, row_bytes, padded_offsets.shape[0],
                     current_stream_handle(x.get_device()))


def _check_gather(x, idx, valid):
    if x.dim() != 2:
        raise ValueError(f"x: must be a 2-D matrix of rows, got shape {tuple(x.shape)}")
    if idx.dim() != 1 or idx.dtype != torch.int64:
        raise ValueError(f"idx: must be a 1-D int64 tensor, got {idx.dtype} {tuple(idx.shape)}")
    if valid.shape != idx.shape or valid.dtype != torch.bool:
        raise ValueError(f"valid: must be a bool tensor of idx's shape {tuple(idx.shape)}, got "
                         f"{valid.dtype} {tuple(valid.shape)}")


def _gather_impl(x, idx, valid):
    _check_gather(x, idx, valid)
    row_bytes = x.shape[1] * x.element_size()
    if not _kernel_ok(x, idx, valid) or row_bytes % 16 or row_bytes == 0:
        return torch.where(valid[:, None], x[idx], x.new_zeros(()))
    from ..kernels.layer.launch import launch_gather
    out = torch.empty((idx.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    launch_gather(x.data_ptr(), idx.data_ptr(), valid.data_ptr(), out.data_ptr(), idx.shape[0], row_bytes,
                  current_stream_handle(x.get_device()))
    return out


_lib.impl("gather_rows", _gather_impl, "CompositeExplicitAutograd")
_lib.impl("glu_forward", _glu_impl, "CompositeExplicitAutograd")
_lib.impl("zero_rows_past", _zero_impl, "CompositeExplicitAutograd")


@torch.library.register_fake(f"{_LIB}::glu_forward", lib=_lib)
def _(c, prob, padded_offsets, act_func="dswiglu", geglu_alpha=1.702, clamp_max=7.0, clamp_min=-7.0,
      linear_offset=0.0):
    _check_glu(c, prob, padded_offsets, act_func)
    return c.new_empty((c.shape[0], c.shape[1] // 2))


@torch.library.register_fake(f"{_LIB}::gather_rows", lib=_lib)
def _(x, idx, valid):
    _check_gather(x, idx, valid)
    return x.new_empty((idx.shape[0], x.shape[1]))


@torch.library.register_fake(f"{_LIB}::zero_rows_past", lib=_lib)
def _(x, padded_offsets):
    _check_offsets(padded_offsets)


def glu_forward(c: Tensor, prob: Tensor, padded_offsets: Tensor, *, act_func: str = "dswiglu",
                geglu_alpha: float = 1.702, clamp_max: float = 7.0, clamp_min: float = -7.0,
                linear_offset: float = 0.0) -> Tensor:
    """``cudnn_ext::glu_forward`` (see the module docstring); the body directly when eager."""
    if _direct_ok((c, prob, padded_offsets)):
        return _glu_impl(c, prob, padded_offsets, act_func, geglu_alpha, clamp_max, clamp_min, linear_offset)
    return torch.ops.cudnn_ext.glu_forward(c, prob, padded_offsets, act_func, geglu_alpha, clamp_max,
                                           clamp_min, linear_offset)


def zero_rows_past(x: Tensor, padded_offsets: Tensor) -> Tensor:
    """``cudnn_ext::zero_rows_past`` on ``x`` (in place); returns ``x``."""
    if _direct_ok((x, padded_offsets)):
        _zero_impl(x, padded_offsets)
    else:
        torch.ops.cudnn_ext.zero_rows_past(x, padded_offsets)
    return x


def gather_rows(x: Tensor, idx: Tensor, valid: Tensor) -> Tensor:
    """``cudnn_ext::gather_rows`` (not differentiable; ``mlp.gather_rows`` is)."""
    if _direct_ok((x, idx, valid)):
        return _gather_impl(x, idx, valid)
    return torch.ops.cudnn_ext.gather_rows(x, idx, valid)


__all__ = ["gather_rows", "glu_act", "glu_forward", "rows_below_last", "zero_rows_past"]
