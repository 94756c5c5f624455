"""FP8 with blockwise fp32 scales: DeepSeek-V3's recipe (docs/blockscaled.md, "FP8 with
blockwise scales"; a cudnn_ext extension, not a format of the vendor contract).

Owns :func:`quantize_fp8_blockwise` and :func:`dequantize_fp8_blockwise` and the one scale
rule. Must not know about the dGLU operation.

Blocks. ``(1, 128)``: one scale per row and 128 consecutive K elements (activations and
gradients: A, D_row); ``(128, 128)``: one per 128 x 128 tile (weights: each expert's B);
``(128, 1)``: one per 128 consecutive rows of one column (D_col, what the wgrad reads).
Blocks start at row 0 and column 0; a partial last block covers what is left.

Shapes. ``x`` is ``(rows, K)`` or ``(rows, K, L)`` (dense B ``(N, K, L)``, K-major per group, as
the kernels take it); the values come back in ``x``'s logical shape as ``float8_e4m3fn`` and the
scales as fp32 ``(ceil(rows/br), ceil(K/bk))`` or ``(ceil(rows/br), ceil(K/bk), L)``, stored
MN-major (stride 1 along rows, as DeepGEMM and ``torch._scaled_mm``'s blockwise scales are):
the scales a 128-row tile needs for one K block are contiguous.

The scale rule, all in fp32 (tests/unit/test_quant_blockwise.py pins each line)::

    amax = max |x| over the block               (NaN-propagating)
    s    = amax / 448                           (IEEE division, round to nearest even)
    s    = 2**ceil(log2 s)                      (pow2_scales=True only: UE8M0-style, exact scaling)
    s    = max(s, 2**-126)                      (zero and tiny blocks: a normal scale)
    q    = e4m3(x / s)                          (IEEE division; round to nearest even, saturating at 448)

A block holding NaN or +-inf gets a NaN or infinite scale and dequantizes to NaN everywhere
(``x / inf`` is 0 and ``0 * inf`` NaN): a non-finite value poisons its block, never silently
its neighbours in other blocks. Every NaN result (a scale, an element) is the positive quiet
NaN (fp32 0x7fc00000, e4m3 0x7f), whatever the device's division returned. ``dequantize_fp8_blockwise`` forms ``q * s`` in float64 (exact)
and rounds once. Pure torch, any device, no host sync; the same code is the reference of the
device quantizer.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from . import formats as F
from .mx import check_operand

__all__ = ["BLOCKS", "FP8_BLOCKWISE_DTYPE", "SCALE_FLOOR", "quantize_fp8_blockwise", "dequantize_fp8_blockwise",
           "blockwise_scales", "scale_shape", "scale_strides", "check_quantize_args", "BlockwiseScaleGeometry"]

#: The block shapes (rows, columns) of the recipe.
BLOCKS = ((1, 128), (128, 128), (128, 1))
#: The element format of every fp8_blockwise operand and output.
FP8_BLOCKWISE_DTYPE = F.FORMATS["e4m3"].dtypes[0]
#: The smallest scale: fp32's smallest normal (a zero block's scale; its reciprocal is finite).
SCALE_FLOOR = 2.0 ** -126
_QMAX = F.E4M3_MAX


def _check_block(block) -> Tuple[int, int]:
    ok = (isinstance(block, (tuple, list)) and len(block) == 2
          and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in block))
    if not ok or tuple(int(v) for v in block) not in BLOCKS:
        raise ValueError(f"block: must be one of {list(BLOCKS)}, got {block!r}")
    return tuple(int(v) for v in block)


def scale_shape(shape, block) -> Tuple[int, ...]:
    """The scales' shape for values of ``shape`` ``(rows, K[, L])`` quantized in ``block``s."""
    br, bk = _check_block(block)
    return (math.ceil(shape[0] / br), math.ceil(shape[1] / bk)) + tuple(shape[2:])


def scale_strides(shape) -> Tuple[int, ...]:
    """The MN-major strides of scales of ``shape`` (:func:`scale_shape`): stride 1 along the
    rows' blocks, then the K blocks, then the groups."""
    return (1, shape[0]) + ((shape[0] * shape[1],) if len(shape) > 2 else ())


def blockwise_scales(amax: torch.Tensor, *, pow2_scales: bool = False) -> torch.Tensor:
    """The fp32 scales of blocks whose largest magnitudes are ``amax`` (the rule above)."""
    # a device tensor, not a Python scalar: CUDA divides by a scalar as a multiply by its
    # reciprocal (one bit off at times), by a tensor with the IEEE division the rule names
    s = amax.to(torch.float32) / torch.full((), _QMAX, dtype=torch.float32, device=amax.device)
    if pow2_scales:  # round up to a power of two; inf and NaN stay as they are
        s = torch.where(torch.isfinite(s), F.decode_e8m0(F.encode_e8m0_roundup(s)), s)
    return _canonical_nan(torch.clamp(s, min=SCALE_FLOOR))  # clamp keeps NaN


def _canonical_nan(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every NaN the positive quiet NaN: a NaN's sign and payload otherwise follow
    the hardware (an x86 CPU's inf / inf is negative, a GPU's positive), and the e4m3 cast
    keeps the sign (0xff against 0x7f)."""
    return torch.where(torch.isnan(t), torch.full((), math.nan, dtype=t.dtype, device=t.device), t)


def _groups(x: torch.Tensor) -> torch.Tensor:
    """(rows, K) / (rows, K, L) -> (L, rows, K) fp32."""
    return (x if x.dim() == 3 else x.unsqueeze(-1)).permute(2, 0, 1).to(torch.float32)


def _mn_major(s_g: torch.Tensor, three_d: bool) -> torch.Tensor:
    """(L, Rb, Kb) -> (Rb, Kb[, L]) stored with stride 1 along Rb."""
    s = s_g.transpose(1, 2).contiguous().permute(2, 1, 0)  # storage (L, Kb, Rb)
    return s if three_d else s[..., 0]


def check_quantize_args(x, block, pow2_scales) -> Tuple[int, int]:
    """The quantizer's argument rules (every implementation's): ``x`` a float tensor of
    ``(rows, K)`` or ``(rows, K, L)``, ``block`` one of :data:`BLOCKS`, ``pow2_scales`` a bool;
    returns the block."""
    check_operand(x)
    if not isinstance(pow2_scales, bool):
        raise TypeError(f"pow2_scales: expected a bool, got {type(pow2_scales).__name__}")
    return _check_block(block)


def quantize_fp8_blockwise(x: torch.Tensor, block=(1, 128), *,
                           pow2_scales: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (``(rows, K)`` or ``(rows, K, L)``, any float dtype) to e4m3 values with
    one fp32 scale per ``block`` (``(1, 128)``, ``(128, 128)`` or ``(128, 1)``).

    Returns ``(q, scales)``: ``q`` in ``x``'s logical shape (3-D results K-major per group:
    strides ``(K, 1, rows*K)``), ``scales`` of :func:`scale_shape`, MN-major. ``pow2_scales``
    rounds each scale up to a power of two (DeepGEMM's UE8M0 option: ``x / s`` is then exact
    before the e4m3 rounding). No host sync."""
    br, bk = check_quantize_args(x, block, pow2_scales)
    g = _groups(x)
    groups, rows, k = g.shape
    rb, kb = math.ceil(rows / br), math.ceil(k / bk)
    padded = torch.nn.functional.pad(g, (0, kb * bk - k, 0, rb * br - rows))  # zeros: amax unchanged
    blocks = padded.view(groups, rb, br, kb, bk)
    amax = blocks.abs().amax(dim=(2, 4))  # torch.amax propagates NaN
    s = blockwise_scales(amax, pow2_scales=pow2_scales)
    q = F.encode_fp8(_canonical_nan(blocks / s[:, :, None, :, None]), FP8_BLOCKWISE_DTYPE)
    q = q.view(groups, rb * br, kb * bk)[:, :rows, :k].contiguous()
    q = q.permute(1, 2, 0) if x.dim() == 3 else q[0]
    return q, _mn_major(s, x.dim() == 3)


def dequantize_fp8_blockwise(q: torch.Tensor, scales: torch.Tensor, block=(1, 128), *,
                             out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q[r, k(, l)] * scales[r // br, k // bk(, l)]``, formed in float64 (exact) and rounded
    once to ``out_dtype`` (float32 or float64). ``scales`` may have any strides."""
    if not isinstance(q, torch.Tensor) or not isinstance(scales, torch.Tensor):
        raise TypeError(f"q, scales: expected torch.Tensors, got {type(q).__name__}, {type(scales).__name__}")
    if q.dtype != FP8_BLOCKWISE_DTYPE:
        raise TypeError(f"q: expected float8_e4m3fn, got {q.dtype}")
    if q.dim() not in (2, 3):
        raise ValueError(f"q: expected shape (rows, K) or (rows, K, L), got {tuple(q.shape)}")
    if out_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"out_dtype: expected torch.float32 or torch.float64, got {out_dtype}")
    if scales.device != q.device:
        raise ValueError(f"scales: must be on q's device {q.device}, got {scales.device}")
    br, bk = _check_block(block)
    want = scale_shape(tuple(q.shape), (br, bk))
    if tuple(scales.shape) != want or scales.dtype != torch.float32:
        raise ValueError(f"scales: expected float32 of shape {want} for q {tuple(q.shape)} in {br}x{bk} blocks, "
                         f"got {scales.dtype} {tuple(scales.shape)}")
    rows, k = q.shape[0], q.shape[1]
    s = scales.to(torch.float64).repeat_interleave(br, dim=0)[:rows].repeat_interleave(bk, dim=1)[:, :k]
    return (q.to(torch.float64) * s).to(out_dtype)


@dataclass(frozen=True)
class BlockwiseScaleGeometry:
    """Which blockwise scale matrix a tensor holds, with the token count M left symbolic
    (``rows=None``): the fp32 scales of ``rows x k`` values in ``block``s, one matrix per group
    (``groups``; 0: a 2-D matrix), stored MN-major as :func:`quantize_fp8_blockwise` returns
    them. The contract's table says which slot has which; this object re-derives the shape at
    a given M, so a plan built at one M judges scales bound at another by the same rule."""

    rows: Optional[int]
    k: int
    block: Tuple[int, int]
    groups: int = 0

    def shape(self, m: int) -> Tuple[int, ...]:
        rows = m if self.rows is None else self.rows
        return scale_shape((rows, self.k) + ((self.groups,) if self.groups else ()), self.block)

    def strides(self, m: int) -> Tuple[int, ...]:
        return scale_strides(self.shape(m))

    def view(self, t, m: int, name: str = "scales") -> torch.Tensor:
        """``t`` judged at token count ``m``: fp32, the shape of :meth:`shape`, MN-major."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name}: fp8_blockwise scales must be float32, got {t.dtype}")
        want = self.shape(m)
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: expected shape {want} (one fp32 scale per {self.block[0]}x{self.block[1]} "
                             f"block), got {tuple(t.shape)}")
        strides = self.strides(m)
        if any(n > 1 and st != ex for n, st, ex in zip(want, t.stride(), strides)):
            raise ValueError(f"{name}: scales must be MN-major (strides {strides}, as quantize_fp8_blockwise "
                             f"returns them), got {tuple(t.stride())}")
        return t

    def empty(self, m: int, *, dtype: torch.dtype = torch.float32, device=None, fill=None) -> torch.Tensor:
        """An MN-major tensor of this geometry at token count ``m`` (``fill``: a value, or None)."""
        shape = self.shape(m)
        t = torch.empty_strided(shape, self.strides(m), dtype=dtype, device=device)
        return t if fill is None else t.fill_(fill)
