"""Block-scaled pieces of the reference engine, as pure torch functions.

Owns what the block-scaled contract adds around the BF16 math (docs/vendor_contract.md §2.2-2.6):
dequantizing A and B from their scale factors, quantizing the fp32 dGLU result to FP8 D_row /
D_col with SFD_row / SFD_col (incl. ``discrete_col_sfd``), and the per-expert amax. Must not
know the GEMM or the epilogue (``grouped_dglu`` composes them) nor validate whole problems
(``cudnn_ext.api``); each function validates only its own arguments, with ``TypeError`` /
``ValueError`` naming the argument, the value and the rule.

All functions take CPU or CUDA tensors. Values that the kernel reads from device memory
(``padded_offsets``, ``norm_const``) are read to the host here: this is the oracle, not a hot
path.

Quantized D (docs/vendor_contract.md §2.6), per 32-element block of the fp32 result ``d``::

    row (blocks along the 2N columns):  s = (amax * fl32(1/448)) * norm_const
    col (blocks of 32 rows):            s = amax * (fl32(1/448) * norm_const)
    SFD = e8m0 round-up of s (cvt.rp.satfinite);   mult = min(norm_const * rcp_ftz(SFD), FLT_MAX)
    D   = e4m3(d * mult), round-to-nearest-even, saturating at +-448

so ``d ~= D * SFD / norm_const``. The two directions associate the scale product as the
kernel does (the last fp32 bit can move a round-up across a power of two). One deliberate
difference: the vendor's column path clamps ``rcp(SFD)`` *before* multiplying by norm_const,
so for an all-zero 32-row block with ``norm_const > 1`` it computes ``0 * inf`` = NaN; we use
the row path's multiplier for both directions, which gives 0. The two agree on every block
whose scale is a normal fp32 number and whose multiplier does not overflow.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from ..quant import formats as F
from ..quant.mx import dequantize, quantize_blocks
from ..quant.sf_layout import (ATOM_ELEMS, as_sf_6d, sf_k_blocks, sf_numel, sf_shape, storage_of,
                               swizzle_sf)

__all__ = [
    "dequantize_a", "dequantize_b_expert", "quantize_d_row", "quantize_d_col",
    "sfd_col_expert_view", "amax_per_expert", "SFD_VEC_SIZE", "D_QMAX",
]

#: D_row / D_col scale blocks are always 32 elements (FP8 operands require sf_vec_size 32).
SFD_VEC_SIZE = 32
#: qmax of the kernel's output quantizer (HLP get_dtype_rcp_limits); only e4m3 D is produced.
D_QMAX = {torch.float8_e4m3fn: F.E4M3_MAX}


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------

def _require_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def _elem_format(name, t):
    if t.dtype in F.FP8_DTYPES or F.is_fp4(t.dtype):
        return
    raise TypeError(f"{name}: expected float8_e4m3fn, float8_e5m2 or packed FP4 (uint8 / "
                    f"float4_e2m1fn_x2), got {t.dtype}")


def _sf_vec(sf_vec_size):
    if sf_vec_size not in (16, 32):
        raise ValueError(f"sf_vec_size: must be 16 or 32, got {sf_vec_size!r}")


def _logical_k(t):
    return t.shape[1] * (2 if F.is_fp4(t.dtype) else 1)


def _d_matrix(name, d):
    _require_tensor(name, d)
    if not d.is_floating_point() or d.element_size() < 2:
        raise TypeError(f"{name}: expected the fp32 dGLU result (a float tensor), got {d.dtype}")
    if d.dim() == 3 and d.shape[2] == 1:
        d = d[..., 0]
    if d.dim() != 2 or d.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty (M, 2N) or (M, 2N, 1) tensor, "
                         f"got shape {tuple(d.shape)}")
    return d.to(torch.float32)


def _norm_const(norm_const, device):
    if isinstance(norm_const, torch.Tensor):
        if norm_const.numel() != 1:
            raise ValueError(f"norm_const: expected shape (1,), got {tuple(norm_const.shape)}")
        if not norm_const.is_floating_point():
            raise TypeError(f"norm_const: expected a float32 tensor, got {norm_const.dtype}")
        return norm_const.reshape(()).to(device=device, dtype=torch.float32)
    if isinstance(norm_const, bool) or not isinstance(norm_const, (int, float)):
        raise TypeError(f"norm_const: expected a float or a (1,) float32 tensor, got "
                        f"{type(norm_const).__name__}")
    return torch.full((), float(norm_const), dtype=torch.float32, device=device)


def _d_fp8(fp8_dtype):
    if fp8_dtype == torch.float8_e5m2:
        raise NotImplementedError(
            "fp8_dtype: quantized D with SFD generation supports float8_e4m3fn only; the "
            "vendor kernel's fp32->fp8 pack handles e4m3 alone (docs/vendor_contract.md §2.6), so an e5m2 "
            "D_row/D_col has no defined result")
    if fp8_dtype not in D_QMAX:
        raise TypeError(f"fp8_dtype: expected torch.float8_e4m3fn, got {fp8_dtype}")
    return D_QMAX[fp8_dtype]


def _offsets(padded_offsets, m: Optional[int]):
    """padded_offsets -> list of ints, checked: 1-D, non-decreasing, multiples of 256, last <= M."""
    if isinstance(padded_offsets, torch.Tensor):
        if padded_offsets.dim() != 1 or padded_offsets.dtype.is_floating_point \
                or padded_offsets.dtype == torch.bool:
            raise TypeError(f"padded_offsets: expected a 1-D integer tensor, got "
                            f"{padded_offsets.dtype} of shape {tuple(padded_offsets.shape)}")
        offs = [int(v) for v in padded_offsets.tolist()]
    elif isinstance(padded_offsets, (list, tuple)):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in padded_offsets):
            raise TypeError(f"padded_offsets: expected ints, got {padded_offsets!r}")
        offs = list(padded_offsets)
    else:
        raise TypeError(f"padded_offsets: expected a 1-D int tensor or a sequence of ints, got "
                        f"{type(padded_offsets).__name__}")
    if not offs:
        raise ValueError("padded_offsets: expected at least one expert, got an empty sequence")
    prev = 0
    for i, v in enumerate(offs):
        if v < prev:
            raise ValueError(f"padded_offsets: must be non-decreasing (cumulative end rows), got "
                             f"padded_offsets[{i}]={v} after {prev}")
        if v % 256:
            raise ValueError(f"padded_offsets: every offset must be a multiple of 256, got "
                             f"padded_offsets[{i}]={v}")
        prev = v
    if m is not None and offs[-1] > m:
        raise ValueError(f"padded_offsets: the last offset {offs[-1]} exceeds the {m} rows of D")
    return offs


# --------------------------------------------------------------------------------------------
# operands
# --------------------------------------------------------------------------------------------

def dequantize_a(a_q: torch.Tensor, sfa: torch.Tensor, *, sf_vec_size: int,
                 out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A as real numbers: ``A[m, k] = A_q[m, k] * SFA[m, k // sf_vec_size]`` -> ``(M, K)``.

    ``a_q``: ``(M, K)`` / ``(M, K, 1)`` fp8, or packed FP4 ``(M, K/2)`` / ``(M, K/2, 1)``
    (logical K = 2 x bytes). ``sfa``: 6-D ``(32, 4, ceil(M/128), 4, ceil(ceil(K/sf_vec)/4), 1)``
    or its flat packed buffer. Exact in float64; in float32 unless a scale is extreme.
    """
    _require_tensor("a_q", a_q)
    _elem_format("a_q", a_q)
    _sf_vec(sf_vec_size)
    if a_q.dim() == 3:
        if a_q.shape[2] != 1:
            raise ValueError(f"a_q: expected (M, K) or (M, K, 1), got {tuple(a_q.shape)}")
        a_q = a_q[..., 0]
    if a_q.dim() != 2 or a_q.numel() == 0:
        raise ValueError(f"a_q: expected a non-empty (M, K) or (M, K, 1), got {tuple(a_q.shape)}")
    sfa6 = as_sf_6d(sfa, mn=a_q.shape[0], k_blocks=sf_k_blocks(_logical_k(a_q), sf_vec_size),
                    groups=1, name="sfa")
    return dequantize(a_q, sfa6, sf_vec_size, out_dtype=out_dtype)


def dequantize_b_expert(b_q: torch.Tensor, sfb: torch.Tensor, *, sf_vec_size: int,
                        expert: Optional[int] = None,
                        out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One expert's weight as real numbers, ``(N, K)``.

    * Dense weights: ``b_q`` is ``(N, K, L)`` (packed FP4: ``(N, K/2, L)``), ``sfb`` the 6-D
      ``(32, 4, ceil(N/128), 4, RK, L)`` layout or its flat buffer, and ``expert`` in ``[0, L)``.
    * Discrete weights (``b_ptrs`` / ``sfb_ptrs``): ``b_q`` is that expert's own ``(N, K)``
      matrix (any strides: k-major or n-major), ``sfb`` its own scale buffer (L = 1), and
      ``expert`` is ``None``.
    """
    _require_tensor("b_q", b_q)
    _elem_format("b_q", b_q)
    _sf_vec(sf_vec_size)
    if b_q.dim() == 3:
        groups = b_q.shape[2]
        if expert is None:
            raise ValueError(f"expert: dense weights of shape {tuple(b_q.shape)} need an expert "
                             f"index in [0, {groups})")
        if isinstance(expert, bool) or not isinstance(expert, int) or not 0 <= expert < groups:
            raise ValueError(f"expert: must be an int in [0, {groups}), got {expert!r}")
        kb = sf_k_blocks(_logical_k(b_q), sf_vec_size)
        sfb6 = as_sf_6d(sfb, mn=b_q.shape[0], k_blocks=kb, groups=groups, name="sfb")
        return dequantize(b_q[:, :, expert], sfb6[..., expert:expert + 1], sf_vec_size,
                          out_dtype=out_dtype)
    if b_q.dim() != 2:
        raise ValueError(f"b_q: expected dense (N, K, L) or one expert's (N, K), got "
                         f"{tuple(b_q.shape)}")
    if expert is not None:
        raise ValueError(f"expert: must be None for one expert's (N, K) weight (discrete mode), "
                         f"got {expert!r}")
    kb = sf_k_blocks(_logical_k(b_q), sf_vec_size)
    sfb6 = as_sf_6d(sfb, mn=b_q.shape[0], k_blocks=kb, groups=1, name="sfb")
    return dequantize(b_q, sfb6, sf_vec_size, out_dtype=out_dtype)


# --------------------------------------------------------------------------------------------
# quantized D
# --------------------------------------------------------------------------------------------

def quantize_d_row(d: torch.Tensor, norm_const: Union[float, torch.Tensor],
                   fp8_dtype: torch.dtype = torch.float8_e4m3fn
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row-quantize the fp32 dGLU result: 32-column blocks of each row share a scale.

    ``d``: ``(M, 2N)`` (or ``(M, 2N, 1)``), the interleaved fp32 values after prob and masks.
    Returns ``(d_row, sfd_row)``: ``d_row`` ``(M, 2N)`` contiguous fp8 and ``sfd_row``
    ``float8_e8m0fnu`` in the 6-D layout ``(32, 4, ceil(M/128), 4, ceil(ceil(2N/32)/4), 1)``
    (MN = row, k-block = column // 32); padding entries hold code 0 (the scale of zeros).
    """
    d = _d_matrix("d", d)
    qmax = _d_fp8(fp8_dtype)
    nc = _norm_const(norm_const, d.device)
    q, sf = quantize_blocks(d, fp8_dtype, torch.float8_e8m0fnu, SFD_VEC_SIZE, norm_const=nc,
                            qmax=qmax, premultiply_norm=False)
    return q.contiguous(), swizzle_sf(sf)


def quantize_d_col(d: torch.Tensor, norm_const: Union[float, torch.Tensor],
                   fp8_dtype: torch.dtype = torch.float8_e4m3fn, *,
                   padded_offsets: Union[torch.Tensor, Sequence[int], None] = None,
                   discrete_col_sfd: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Column-quantize the fp32 dGLU result: each column's 32-row blocks share a scale.

    Returns ``(d_col, sfd_col)``: ``d_col`` ``(M, 2N)`` contiguous fp8 (same storage as D_row,
    column-block scales) and ``sfd_col`` ``float8_e8m0fnu`` with shape
    ``(32, 4, ceil(2N/128), 4, ceil(ceil(M/32)/4), 1)``.

    * ``discrete_col_sfd=False``: one global layout, MN = column, k-block = ``row // 32``; the
      row blocks of all experts interleave inside each 128-column stripe.
    * ``discrete_col_sfd=True`` (needs ``padded_offsets``): the same bytes laid out **per
      expert**. Expert ``e`` with rows ``[r0, r1)`` owns the contiguous region starting at
      element ``(r0 // 128) * ceil(2N/128) * 512``, holding its own layout with MN = column and
      k-block = ``(row - r0) // 32`` (:func:`sfd_col_expert_view` reads it). Rows at or past
      ``padded_offsets[-1]`` belong to no expert (the kernel never writes them): their values
      are still quantized in ``d_col``, their scales are not stored.

    32-row blocks never straddle experts because offsets are multiples of 256, so ``d_col``
    and the scale *values* are the same in both modes; only where the scales live differs.
    """
    d = _d_matrix("d", d)
    qmax = _d_fp8(fp8_dtype)
    nc = _norm_const(norm_const, d.device)
    if not isinstance(discrete_col_sfd, bool):
        raise TypeError(f"discrete_col_sfd: expected a bool, got {discrete_col_sfd!r}")
    m, two_n = d.shape
    q_t, sf_t = quantize_blocks(d.t(), fp8_dtype, torch.float8_e8m0fnu, SFD_VEC_SIZE,
                                norm_const=nc, qmax=qmax, premultiply_norm=True)
    d_col = q_t.t().contiguous()
    # sf_t: (2N, ceil(M/32)) -- MN = column, k-block = row // 32
    if not discrete_col_sfd:
        if padded_offsets is not None:
            _offsets(padded_offsets, m)  # validated for symmetry; the global layout ignores it
        return d_col, swizzle_sf(sf_t)
    if padded_offsets is None:
        raise ValueError("padded_offsets: required when discrete_col_sfd=True (the per-expert "
                         "layout starts at each expert's row offset)")
    offs = _offsets(padded_offsets, m)
    out = swizzle_sf(torch.zeros_like(sf_t))          # zero bytes, global shape
    flat = storage_of(out).reshape(-1).view(torch.uint8)
    start = 0
    for end in offs:
        if end > start:
            region = swizzle_sf(sf_t[:, start // 32:end // 32])
            n_el = region.numel()
            base = (start // 128) * sf_shape(two_n, 1)[2] * ATOM_ELEMS
            flat[base:base + n_el] = storage_of(region).reshape(-1).view(torch.uint8)
        start = end
    return d_col, out


def sfd_col_expert_view(sfd_col: torch.Tensor, padded_offsets, expert: int,
                        two_n: int) -> torch.Tensor:
    """The 6-D view of expert ``expert``'s region of a ``discrete_col_sfd`` SFD_col tensor:
    shape ``(32, 4, ceil(2N/128), 4, tokens_e/128, 1)``, MN = column, k-block = local
    ``row // 32``. Experts with no rows have no region (``ValueError``)."""
    _require_tensor("sfd_col", sfd_col)
    offs = _offsets(padded_offsets, None)
    if isinstance(expert, bool) or not isinstance(expert, int) or not 0 <= expert < len(offs):
        raise ValueError(f"expert: must be an int in [0, {len(offs)}), got {expert!r}")
    r0 = offs[expert - 1] if expert else 0
    tokens = offs[expert] - r0
    if tokens == 0:
        raise ValueError(f"expert: expert {expert} has no rows, so it owns no SFD_col region")
    rmn = sf_shape(two_n, 1)[2]
    total = sfd_col.numel()
    flat = storage_of(sfd_col).reshape(-1) if sfd_col.dim() == 6 and not sfd_col.is_contiguous() \
        else sfd_col.reshape(-1)
    base = (r0 // 128) * rmn * ATOM_ELEMS
    n_el = sf_numel(two_n, tokens // 32)
    if base + n_el > total:
        raise ValueError(f"sfd_col: {total} elements cannot hold expert {expert}'s region "
                         f"[{base}, {base + n_el})")
    return as_sf_6d(flat[base:base + n_el].contiguous(), mn=two_n, k_blocks=tokens // 32,
                    name="sfd_col")


# --------------------------------------------------------------------------------------------
# amax
# --------------------------------------------------------------------------------------------

def amax_per_expert(dgate: torch.Tensor, dup: torch.Tensor, padded_offsets) -> torch.Tensor:
    """Per-expert ``max |d|`` of the fp32 gate and up gradients -> ``(E, 2)`` fp32.

    ``dgate``, ``dup``: ``(M, N)`` de-interleaved fp32 values (after prob and masks, before the
    D cast). Column 0 is dgate, column 1 dup. Over each expert's padded row range, as the
    kernel: padding rows count; an expert with no rows stays ``-inf`` (the wrapper's fill); an
    expert with rows is at least 0 (the kernel's reductions start at 0.0); NaN is **ignored**
    (the kernel's per-thread and per-CTA maxima are NaN-quiet ``fmax``, so a NaN never reaches
    the atomic max).
    """
    for name, t in (("dgate", dgate), ("dup", dup)):
        _require_tensor(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a float tensor, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name}: expected (M, N), got {tuple(t.shape)}")
    if dgate.shape != dup.shape:
        raise ValueError(f"dup: shape {tuple(dup.shape)} must equal dgate's {tuple(dgate.shape)}")
    offs = _offsets(padded_offsets, dgate.shape[0])
    out = torch.full((len(offs), 2), float("-inf"), dtype=torch.float32, device=dgate.device)
    start = 0
    for e, end in enumerate(offs):
        if end > start:
            for j, t in enumerate((dgate, dup)):
                a = t[start:end].to(torch.float32).abs()
                a = torch.where(torch.isnan(a), torch.zeros((), device=a.device), a)
                out[e, j] = torch.clamp(a.amax(), min=0.0)
        start = end
    return out
