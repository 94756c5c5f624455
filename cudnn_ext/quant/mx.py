"""Block-scaled quantization: MXFP8 and NVFP4 tensors with scale factors in the kernel layout.

Owns the public helpers users need to feed and read the block-scaled contract
(:func:`quantize_mxfp8`, :func:`quantize_nvfp4`, :func:`dequantize`) and the one block
quantization rule they share with the reference's D_row/D_col quantizers
(:func:`quantize_blocks`). Must not know about the dGLU operation.

Shapes. A quantized operand is ``(rows, K)`` (A, one expert's B) or ``(rows, K, L)`` (dense B:
``(N, K, L)``, k-major per group, as the kernel takes it). Blocks of ``sf_vec_size``
consecutive K elements share one scale; the scale matrix ``(rows, ceil(K/sf_vec_size), L)`` is
returned in the 6-D layout of :mod:`cudnn_ext.quant.sf_layout`. FP4 values are packed two per
byte along K (logical K = 2 x bytes), low nibble first.

The block rule (the kernel's D quantizer, docs/vendor_contract.md §2.6, with ``norm_const = 1`` for the
input helpers), all in fp32::

    amax  = max |x| over the block          (NaN-propagating; zero padding past K)
    s     = (amax * fl32(1/qmax)) * norm_const    qmax = 448 e4m3, 57344 e5m2, 6 e2m1
    SF    = e8m0: round s UP to a power of two (cvt.rp.satfinite) -> the block never saturates
            e4m3: round s to nearest even, saturate at 448      -> NVFP4 blocks may saturate
    mult  = min(norm_const * rcp_ftz(SF), FLT_MAX)
    q     = element_format(x * mult)        round-to-nearest-even, saturating at +-qmax

Edge cases, all following from those lines (tests pin each): a zero block gets the smallest
scale (e8m0 ``2**-127``, e4m3 0) and zero values; a block holding NaN gets a NaN scale, so it
dequantizes to NaN everywhere (FP4 has no NaN code: its values are stored as 0); a block
holding +-inf gets the largest e8m0 scale ``2**127``, whose flushed reciprocal is 0, so the
infinity becomes NaN and the block's finite values 0 (with e4m3 scales: scale 448, the infinity
saturates to +-6). A block whose scale is ``2**-127`` (e8m0 code 0, an fp32 subnormal that the
kernel's ``rcp.approx.ftz`` flushes) or 0 gets the multiplier ``FLT_MAX`` (about ``2**128``)
instead of ``2**127``: its values (all below about ``448 * 2**-127``) come back doubled, or
saturated; an all-zero block stays zero.
"""
from __future__ import annotations

from typing import Tuple, Union

import torch

from . import formats as F
from .sf_layout import as_sf_6d, sf_k_blocks, swizzle_sf, unswizzle_sf

__all__ = ["quantize_mxfp8", "quantize_nvfp4", "dequantize", "quantize_blocks", "elem_qmax"]


def elem_qmax(elem_dtype: torch.dtype) -> float:
    """The ``qmax`` of the block rule for an element format (448, 57344 or 6)."""
    return F.max_finite(elem_dtype)


def quantize_blocks(x: torch.Tensor, elem_dtype: torch.dtype, sf_dtype: torch.dtype,
                    sf_vec_size: int, *, norm_const: Union[float, torch.Tensor] = 1.0,
                    qmax: float = None, premultiply_norm: bool = False
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize along the **last** dimension of ``x`` (``(..., K)``) in blocks of ``sf_vec_size``.

    Returns ``(values, sf)``: ``values`` of shape ``(..., K)`` (fp8 dtype, or uint8 e2m1 codes,
    *unpacked*, for an FP4 ``elem_dtype``) and plain scale factors ``(..., ceil(K/sf_vec_size))``
    in ``sf_dtype``. ``qmax`` defaults to :func:`elem_qmax`. ``premultiply_norm`` selects the
    association of the scale product: ``False`` is ``(amax * rcp_qmax) * norm_const`` (the
    kernel's row quantizer and the input helpers), ``True`` is ``amax * (rcp_qmax *
    norm_const)`` (the kernel's column quantizer); they differ only in the last fp32 bit, which
    can move an e8m0 round-up across a power of two.
    """
    if qmax is None:
        qmax = elem_qmax(elem_dtype)
    x32 = x.to(torch.float32)
    k = x32.shape[-1]
    kb = sf_k_blocks(k, sf_vec_size)
    pad = kb * sf_vec_size - k
    if pad:
        x32 = torch.nn.functional.pad(x32, (0, pad))
    blocks = x32.reshape(*x32.shape[:-1], kb, sf_vec_size)
    amax = blocks.abs().amax(dim=-1)   # torch.amax propagates NaN, as the kernel's reduction
    # scalars made on the device (a fill), never copied from the host: no sync on a GPU
    if isinstance(norm_const, torch.Tensor):
        nc = norm_const.to(device=x32.device, dtype=torch.float32).reshape(())
    else:
        nc = torch.full((), float(norm_const), dtype=torch.float32, device=x32.device)
    rcp_qmax = torch.full((), 1.0 / qmax, dtype=torch.float32, device=x32.device)
    if premultiply_norm:
        s = amax * (rcp_qmax * nc)
    else:
        s = (amax * rcp_qmax) * nc
    sf = F.encode_sf(s, sf_dtype)
    mult = torch.clamp(nc * F.rcp_ftz(F.decode_sf(sf)), max=F.FLT_MAX)  # clamp keeps NaN
    y = blocks * mult.unsqueeze(-1)
    y = y.reshape(*x32.shape[:-1], kb * sf_vec_size)[..., :k]
    if F.is_fp4(elem_dtype):
        return F.encode_e2m1(y), sf
    return F.encode_fp8(y, elem_dtype), sf


# --------------------------------------------------------------------------------------------
# public helpers
# --------------------------------------------------------------------------------------------

def check_operand(x, name="x"):
    """The quantizers' input rule: a 2-D or 3-D, non-empty tensor of a 16-bit or wider float."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.element_size() < 2:
        raise TypeError(f"{name}: expected a bfloat16/float16/float32/float64 tensor, got {x.dtype}")
    if x.dim() not in (2, 3):
        raise ValueError(f"{name}: expected shape (rows, K) or (rows, K, L), got {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")


def _to_groups(x: torch.Tensor) -> torch.Tensor:
    """(rows, K) / (rows, K, L) -> (L, rows, K) fp32."""
    x3 = x if x.dim() == 3 else x.unsqueeze(-1)
    return x3.permute(2, 0, 1).to(torch.float32)


def _from_groups(y: torch.Tensor, three_d: bool) -> torch.Tensor:
    """(L, rows, K') contiguous -> (rows, K') or (rows, K', L) k-major view of it."""
    y = y.contiguous()
    return y.permute(1, 2, 0) if three_d else y[0]


def _plain_sf(sf_g: torch.Tensor) -> torch.Tensor:
    """(L, rows, kb) -> (rows, kb, L)."""
    return sf_g.permute(1, 2, 0)


def quantize_mxfp8(x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                   sf_vec_size: int = 32) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (``(rows, K)`` or ``(rows, K, L)``) to MXFP8: fp8 values + e8m0 scales.

    Returns ``(q, sf)``: ``q`` has ``x``'s logical shape in ``fp8_dtype`` (3-D results are
    k-major per group: strides ``(K, 1, rows*K)``); ``sf`` is ``float8_e8m0fnu`` in the 6-D
    layout ``(32, 4, ceil(rows/128), 4, ceil(ceil(K/32)/4), L)``. Scales round up (no value
    saturates unless it is infinite); values round to nearest even. The FP8 operands of the
    kernel require ``sf_vec_size=32``, the only value accepted.
    """
    check_operand(x)
    if fp8_dtype not in F.FP8_DTYPES:
        raise TypeError(f"fp8_dtype: expected torch.float8_e4m3fn or torch.float8_e5m2, "
                        f"got {fp8_dtype}")
    if sf_vec_size != 32:
        raise ValueError(f"sf_vec_size: MXFP8 (FP8 operands) requires sf_vec_size=32, "
                         f"got {sf_vec_size!r}")
    q, sf = quantize_blocks(_to_groups(x), fp8_dtype, torch.float8_e8m0fnu, sf_vec_size)
    return _from_groups(q, x.dim() == 3), swizzle_sf(_plain_sf(sf))


def quantize_nvfp4(x: torch.Tensor, sf_vec_size: int = 16,
                   sf_dtype: torch.dtype = torch.float8_e4m3fn,
                   packed_dtype: torch.dtype = torch.uint8) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (``(rows, K)`` or ``(rows, K, L)``, K even) to packed FP4 + scales.

    Formats: NVFP4 (``sf_dtype=float8_e4m3fn``, ``sf_vec_size=16``, the default), MXFP4
    (``float8_e8m0fnu``, 32) and FP4 with e8m0 scales over 16 elements (accepted by the
    kernel). e4m3 scales are the round-to-nearest-even of ``amax/6``, so the largest value of a
    block may saturate at +-6; e8m0 scales round up. No per-tensor (second-level) scale is
    applied: fold one into ``x`` before and into ``alpha`` after, if wanted.

    Returns ``(packed, sf)``: ``packed`` is ``(rows, K/2[, L])`` bytes in ``packed_dtype``
    (``uint8`` or ``torch.float4_e2m1fn_x2``), element ``2j`` in the low nibble of byte ``j``;
    ``sf`` is the 6-D layout ``(32, 4, ceil(rows/128), 4, ceil(ceil(K/sf_vec_size)/4), L)``.
    """
    check_operand(x)
    if sf_dtype not in F.SF_DTYPES:
        raise TypeError(f"sf_dtype: expected torch.float8_e4m3fn or torch.float8_e8m0fnu, "
                        f"got {sf_dtype}")
    if sf_vec_size not in (16, 32):
        raise ValueError(f"sf_vec_size: must be 16 or 32, got {sf_vec_size!r}")
    if sf_dtype == torch.float8_e4m3fn and sf_vec_size != 16:
        raise ValueError(f"sf_vec_size: e4m3 scale factors require sf_vec_size=16, "
                         f"got {sf_vec_size}")
    if packed_dtype not in F.FP4_DTYPES:
        raise TypeError(f"packed_dtype: expected torch.uint8 or torch.float4_e2m1fn_x2, "
                        f"got {packed_dtype}")
    if x.shape[1] % 2:
        raise ValueError(f"x: K={x.shape[1]} must be even to pack two FP4 values per byte")
    codes, sf = quantize_blocks(_to_groups(x), torch.uint8, sf_dtype, sf_vec_size)
    packed = F.pack_fp4(codes, dim=-1)
    return _from_groups(packed, x.dim() == 3).view(packed_dtype), swizzle_sf(_plain_sf(sf))


def dequantize(q: torch.Tensor, sf: torch.Tensor, sf_vec_size: int, *,
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Block-scaled values back to real numbers: ``q[r, k, l] * SF[r, k // sf_vec_size, l]``.

    ``q``: fp8 ``(rows, K[, L])``, or packed FP4 ``(rows, K/2[, L])`` as ``uint8`` /
    ``float4_e2m1fn_x2``. ``sf``: the 6-D layout for (rows, ceil(K/sf_vec_size), L) or its flat
    packed buffer (:func:`cudnn_ext.quant.sf_layout.as_sf_6d`). The product is formed in
    float64 (exact) and rounded once to ``out_dtype`` (float32 or float64); for e8m0 scales
    near ``2**+-127`` only float64 holds every product exactly.
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    if out_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"out_dtype: expected torch.float32 or torch.float64, got {out_dtype}")
    if q.dim() not in (2, 3):
        raise ValueError(f"q: expected shape (rows, K) or (rows, K, L), got {tuple(q.shape)}")
    if sf_vec_size not in (16, 32):
        raise ValueError(f"sf_vec_size: must be 16 or 32, got {sf_vec_size!r}")
    q3 = q if q.dim() == 3 else q.unsqueeze(-1)
    if F.is_fp4(q.dtype):
        vals = F.decode_e2m1(F.unpack_fp4(q3, dim=1))
    elif q.dtype in F.FP8_DTYPES:
        vals = q3.to(torch.float32)
    else:
        raise TypeError(f"q: expected float8_e4m3fn, float8_e5m2, or packed FP4 "
                        f"(uint8 / float4_e2m1fn_x2), got {q.dtype}")
    rows, k, groups = vals.shape
    kb = sf_k_blocks(k, sf_vec_size)
    sf6 = as_sf_6d(sf, mn=rows, k_blocks=kb, groups=groups, name="sf")
    scale = F.decode_sf(unswizzle_sf(sf6, rows, kb)).to(torch.float64)   # (rows, kb, L)
    scale = scale.repeat_interleave(sf_vec_size, dim=1)[:, :k]
    out = (vals.to(torch.float64) * scale).to(out_dtype)
    return out if q.dim() == 3 else out[..., 0]
