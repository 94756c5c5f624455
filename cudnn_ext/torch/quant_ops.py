"""The fp8_blockwise recipe's quantizer as a PyTorch op: ``torch.ops.cudnn_ext.quantize_fp8_blockwise``
and its Python entry point :func:`quantize_fp8_blockwise`.

Owns the choice of implementation, which never changes a bit of the result: the device
kernel (``kernels.blockwise``: one pass over the source, no host sync) for a bf16, fp16 or
fp32 source on an sm_90 GPU with K contiguous and K, the row and group strides multiples of 4,
else the reference (``cudnn_ext.quant.quantize_fp8_blockwise``, pure torch on any device, the
rule's definition). Also the op's fake (meta) kernel, so the quantizer traces under
torch.compile. Arguments and results are the reference's.
"""
from __future__ import annotations

import contextlib
from typing import Tuple

import torch
from torch import Tensor

from ..kernels.blockwise.config import LANE_COLS, BlockwiseQuantConfig
from ..kernels.blockwise.launch import INT32_MAX, launch_quantize
from ..quant.blockwise import FP8_BLOCKWISE_DTYPE, check_quantize_args, scale_shape, scale_strides
from ..quant.blockwise import quantize_fp8_blockwise as reference_quantize
from ..runtime.streams import current_device_index, current_stream_handle
from .ops import _LIB

_lib = torch.library.Library(_LIB, "FRAGMENT")
_lib.define("quantize_fp8_blockwise(Tensor x, int[] block=[1, 128], bool pow2_scales=False) -> (Tensor, Tensor)")

#: the source dtypes the kernel reads, by its config's name
_SOURCES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
#: the GPUs the kernel is compiled for (sm_90a)
_KERNEL_MAJOR = 9


def kernel_geometry(x: Tensor):
    """``(ld, gstride)`` when the device kernel takes ``x`` (element strides of its rows and
    groups), else None: a bf16/fp16/fp32 CUDA tensor on an sm_90 GPU, K contiguous, K and
    the strides multiples of 4, a 4-element-aligned address, sizes within int32."""
    if not x.is_cuda or x.dtype not in _SOURCES:
        return None
    if torch.cuda.get_device_capability(x.device)[0] != _KERNEL_MAJOR:
        return None
    rows, k = x.shape[0], x.shape[1]
    if k > 1 and x.stride(1) != 1:
        return None
    ld = x.stride(0) if rows > 1 else k
    gstride = x.stride(2) if x.dim() == 3 and x.shape[2] > 1 else 0
    if k % LANE_COLS or ld % LANE_COLS or gstride % LANE_COLS or ld < k:
        return None
    if x.data_ptr() % (LANE_COLS * x.element_size()) or max(rows, k, ld, gstride) > INT32_MAX:
        return None
    return ld, gstride


def _outputs(x: Tensor, block) -> Tuple[Tensor, Tensor]:
    """Fresh e4m3 values in x's logical shape (K-major per group) and MN-major fp32 scales."""
    rows, k = x.shape[0], x.shape[1]
    groups = x.shape[2] if x.dim() == 3 else 1
    q = torch.empty((groups, rows, k), dtype=FP8_BLOCKWISE_DTYPE, device=x.device)
    q = q.permute(1, 2, 0) if x.dim() == 3 else q[0]
    shape = scale_shape(tuple(x.shape), block)
    return q, torch.empty_strided(shape, scale_strides(shape), dtype=torch.float32, device=x.device)


@torch.library.impl(_lib, "quantize_fp8_blockwise", "CompositeExplicitAutograd")
def _impl(x, block=(1, 128), pow2_scales=False):
    block = check_quantize_args(x, tuple(block), pow2_scales)
    geometry = kernel_geometry(x)
    if geometry is None:
        return reference_quantize(x, block, pow2_scales=pow2_scales)
    q, s = _outputs(x, block)
    ld, gstride = geometry
    cfg = BlockwiseQuantConfig(_SOURCES[x.dtype], (block,), pow2_scales)
    index = x.device.index
    guard = torch.cuda.device(index) if index != current_device_index() else contextlib.nullcontext()
    with guard:
        launch_quantize(cfg, x.data_ptr(), q.data_ptr(), s.data_ptr(), x.shape[0], x.shape[1], ld, gstride,
                        x.shape[2] if x.dim() == 3 else 1, current_stream_handle(index))
    return q, s


@torch.library.register_fake(f"{_LIB}::quantize_fp8_blockwise", lib=_lib)
def _fake(x, block=(1, 128), pow2_scales=False):
    block = check_quantize_args(x, tuple(block), pow2_scales)
    return _outputs(x, block)


def quantize_fp8_blockwise(x: Tensor, block=(1, 128), *, pow2_scales: bool = False) -> Tuple[Tensor, Tensor]:
    """``(q, scales)`` of ``cudnn_ext.quant.quantize_fp8_blockwise`` bit for bit, through
    ``torch.ops.cudnn_ext.quantize_fp8_blockwise`` (the device kernel where it applies; eager,
    torch.compile, fake tensors)."""
    block = check_quantize_args(x, block, pow2_scales)
    return torch.ops.cudnn_ext.quantize_fp8_blockwise(x, list(block), pow2_scales)
