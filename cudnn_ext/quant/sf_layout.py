"""The 6-D scale-factor layout of the block-scaled MMA (SFA, SFB, SFD_row, SFD_col).

Owns: the index map, allocation in the kernel layout, conversion to and from a plain
``(rows, k_blocks[, L])`` matrix, and acceptance of the flat packed-buffer form. Must not know
about number formats beyond treating scale factors as bytes.

The layout (docs/vendor_contract.md §2.2). For a scale-factor matrix with ``mn`` rows (M for SFA/SFD_row,
N for SFB, 2N for SFD_col), ``k_blocks`` scale columns (``ceil(K / sf_vec_size)``; for SFD_col
the 32-row blocks of D) and ``L`` groups::

    RMN = ceil(mn / 128)        RK = ceil(k_blocks / 4)
    logical shape  (32, 4, RMN, 4, RK, L)
    element strides (16, 4, RK*512, 1, 512, RMN*RK*512)
    index(m, kb, l) = (m % 32, (m // 32) % 4, m // 128, kb % 4, kb // 4, l)

i.e. 512-byte atoms of 128 rows x 4 k-blocks; inside an atom, row ``m`` sits at byte
``(m % 32) * 16 + ((m // 32) % 4) * 4`` and k-block ``kb % 4`` is the innermost byte. The
storage is a contiguous ``(L, RMN, RK, 32, 4, 4)`` buffer; the 6-D tensor is its
``permute(3, 4, 1, 5, 2, 0)`` view (how the vendor allocates it, backend_utils).

Two forms are accepted wherever a scale-factor tensor comes in (:func:`as_sf_6d`):

* the 6-D logical view with exactly the shape above and the packed layout's strides (the
  view of a storage buffer, as :func:`swizzle_sf` and :func:`empty_sf` return), or
* a **C-contiguous** buffer of any shape holding exactly ``512 * RMN * RK * L`` elements, read
  as the packed bytes in storage order (the vendor's "flat"/canonical form). As in the vendor,
  contiguity decides: a contiguous tensor is always read as packed bytes, even when it has the
  6-D logical shape. (The 6-D view of a storage buffer is itself contiguous only when
  ``RMN == RK == L == 1``, and then both readings address the same bytes.) Build 6-D tensors
  with :func:`swizzle_sf` or :func:`empty_sf` and this never matters.

Padding entries (rows ``>= mn`` up to ``128 * RMN``, k-blocks ``>= k_blocks`` up to
``4 * RK``) are never read by a correct consumer for data, but a GEMM multiplies them with
zero-filled operand padding, so they must not be NaN. :func:`swizzle_sf` writes byte 0 there
(e8m0 ``2**-127``, e4m3 ``0.0``), which is what quantizing the zero padding gives.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

ATOM_ROWS = 128
ATOM_KBLOCKS = 4
ATOM_ELEMS = 512
#: storage (L, RMN, RK, 32, 4, 4) -> logical (32, 4, RMN, 4, RK, L)
_TO_LOGICAL = (3, 4, 1, 5, 2, 0)
#: logical -> storage
_TO_STORAGE = (5, 2, 4, 0, 1, 3)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_pos_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def sf_k_blocks(k: int, sf_vec_size: int) -> int:
    """Number of scale columns for a reduction extent ``k``: ``ceil(k / sf_vec_size)``."""
    _check_pos_int("k", k)
    if sf_vec_size not in (16, 32):
        raise ValueError(f"sf_vec_size: must be 16 or 32, got {sf_vec_size!r}")
    return _ceil_div(k, sf_vec_size)


def sf_shape(mn: int, k_blocks: int, groups: int = 1) -> Tuple[int, int, int, int, int, int]:
    """Logical 6-D shape ``(32, 4, ceil(mn/128), 4, ceil(k_blocks/4), groups)``."""
    _check_pos_int("mn", mn)
    _check_pos_int("k_blocks", k_blocks)
    _check_pos_int("groups", groups)
    return (32, 4, _ceil_div(mn, ATOM_ROWS), 4, _ceil_div(k_blocks, ATOM_KBLOCKS), groups)


def sf_numel(mn: int, k_blocks: int, groups: int = 1) -> int:
    """Elements (= bytes) of a scale-factor buffer: ``512 * RMN * RK * groups``."""
    return math.prod(sf_shape(mn, k_blocks, groups))


def sf_index(m, kb, l=0):
    """6-D logical index of scale factor (row ``m``, k-block ``kb``, group ``l``).

    Works elementwise on ints or integer tensors: ``(m%32, (m//32)%4, m//128, kb%4, kb//4, l)``.
    """
    return (m % 32, (m // 32) % 4, m // 128, kb % 4, kb // 4, l)


def sf_offset(m, kb, l=0, *, mn: int, k_blocks: int):
    """Element offset of scale factor ``(m, kb, l)`` in the packed storage buffer.

    ``l*RMN*RK*512 + (m//128)*RK*512 + (kb//4)*512 + (m%32)*16 + ((m//32)%4)*4 + kb%4``.
    """
    _, _, rmn, _, rk, _ = sf_shape(mn, k_blocks)
    return (l * rmn * rk * ATOM_ELEMS + (m // 128) * rk * ATOM_ELEMS + (kb // 4) * ATOM_ELEMS
            + (m % 32) * 16 + ((m // 32) % 4) * 4 + kb % 4)


def empty_sf(mn: int, k_blocks: int, groups: int = 1, *, dtype: torch.dtype,
             device=None, fill: Optional[int] = 0) -> torch.Tensor:
    """Allocate a scale-factor tensor in the kernel layout: the 6-D view of a contiguous
    ``(L, RMN, RK, 32, 4, 4)`` buffer. ``fill`` is a raw byte value (``None``: uninitialized)."""
    shape = sf_shape(mn, k_blocks, groups)
    storage_shape = tuple(shape[i] for i in _TO_STORAGE)
    if fill is None:  # one allocation with the view's strides (no view ops: host time per call)
        storage_strides = [1] * 6
        for d in range(4, -1, -1):
            storage_strides[d] = storage_strides[d + 1] * storage_shape[d + 1]
        return torch.empty_strided(shape, tuple(storage_strides[i] for i in _TO_LOGICAL), dtype=dtype,
                                   device=device)
    buf = torch.full(storage_shape, int(fill), dtype=torch.uint8, device=device)
    return buf.view(dtype).permute(_TO_LOGICAL)


def swizzle_sf(plain: torch.Tensor, *, fill: int = 0) -> torch.Tensor:
    """Plain ``(rows, k_blocks)`` or ``(rows, k_blocks, L)`` scale factors -> 6-D kernel layout.

    ``plain[m, kb, l]`` lands at :func:`sf_index` ``(m, kb, l)``. Padding entries get the raw
    byte ``fill`` (default 0). Any 1-byte dtype is accepted; the result keeps it. The result is
    a view of freshly allocated contiguous storage (``storage_of(result)`` is the flat form).
    """
    if not isinstance(plain, torch.Tensor):
        raise TypeError(f"plain: expected a torch.Tensor, got {type(plain).__name__}")
    if plain.dim() not in (2, 3):
        raise ValueError(f"plain: expected shape (rows, k_blocks) or (rows, k_blocks, L), "
                         f"got {tuple(plain.shape)}")
    if plain.element_size() != 1:
        raise TypeError(f"plain: scale factors are 1-byte values, got dtype {plain.dtype}")
    p = plain if plain.dim() == 3 else plain.unsqueeze(-1)
    rows, kbs, groups = p.shape
    _, _, rmn, _, rk, _ = sf_shape(rows, kbs, groups)
    padded = torch.full((rmn * ATOM_ROWS, rk * ATOM_KBLOCKS, groups), int(fill),
                        dtype=torch.uint8, device=plain.device)
    padded[:rows, :kbs] = p.view(torch.uint8)
    # rows m = atom*128 + sub*32 + lane ; k-blocks kb = kq*4 + kr
    v = padded.view(rmn, 4, 32, rk, 4, groups)           # (atom, sub, lane, kq, kr, l)
    storage = v.permute(5, 0, 3, 2, 1, 4).contiguous()    # (l, atom, kq, lane, sub, kr)
    return storage.view(plain.dtype).permute(_TO_LOGICAL)


def unswizzle_sf(sf: torch.Tensor, rows: Optional[int] = None,
                 k_blocks: Optional[int] = None) -> torch.Tensor:
    """6-D kernel-layout scale factors -> plain ``(rows, k_blocks, L)`` (always 3-D).

    Without ``rows``/``k_blocks`` the full padded extent ``(128*RMN, 4*RK, L)`` is returned.
    A flat/contiguous buffer needs ``rows`` and ``k_blocks`` to be interpreted (see
    :func:`as_sf_6d`); its group count is inferred from its size.
    """
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"sf: expected a torch.Tensor, got {type(sf).__name__}")
    if sf.dim() == 6 and tuple(sf.shape[:2]) == (32, 4) and sf.shape[3] == 4:
        if sf.is_contiguous():   # packed storage that carries the logical shape (vendor rule)
            storage_shape = tuple(sf.shape[i] for i in _TO_STORAGE)
            view = sf.reshape(storage_shape).permute(_TO_LOGICAL)
        else:
            view = sf
    else:
        if rows is None or k_blocks is None:
            raise ValueError(f"sf: a buffer of shape {tuple(sf.shape)} is not a 6-D "
                             f"(32, 4, RMN, 4, RK, L) layout; pass rows= and k_blocks= to read it "
                             f"as a flat packed buffer")
        if not sf.is_contiguous():
            raise ValueError(f"sf: a flat scale-factor buffer must be C-contiguous, got shape "
                             f"{tuple(sf.shape)} with strides {tuple(sf.stride())}")
        per_group = sf_numel(rows, k_blocks)
        if sf.numel() == 0 or sf.numel() % per_group:
            raise ValueError(f"sf: a flat buffer for rows={rows}, k_blocks={k_blocks} must hold a "
                             f"multiple of {per_group} elements, got {sf.numel()}")
        view = as_sf_6d(sf, mn=rows, k_blocks=k_blocks, groups=sf.numel() // per_group)
    _, _, rmn, _, rk, groups = view.shape
    if rows is not None and rows > rmn * ATOM_ROWS:
        raise ValueError(f"rows: {rows} exceeds the layout's {rmn * ATOM_ROWS} rows")
    if k_blocks is not None and k_blocks > rk * ATOM_KBLOCKS:
        raise ValueError(f"k_blocks: {k_blocks} exceeds the layout's {rk * ATOM_KBLOCKS} k-blocks")
    raw = view.view(torch.uint8) if view.dtype != torch.uint8 else view
    # (lane, sub, atom, kr, kq, l) -> (atom, sub, lane, kq, kr, l)
    plain = raw.permute(2, 1, 0, 4, 3, 5).reshape(rmn * ATOM_ROWS, rk * ATOM_KBLOCKS, groups)
    plain = plain[: rows if rows is not None else plain.shape[0],
                  : k_blocks if k_blocks is not None else plain.shape[1]]
    return plain.contiguous().view(sf.dtype)


def storage_of(sf6: torch.Tensor) -> torch.Tensor:
    """The ``(L, RMN, RK, 32, 4, 4)`` storage-order view of a 6-D logical scale-factor view."""
    return sf6.permute(_TO_STORAGE)


@dataclass(frozen=True)
class SfGeometry:
    """Which scale-factor matrix a tensor holds, with the token count M left symbolic.

    ``mn`` (rows of the scale matrix) and ``k`` (the extent its k-blocks cover, blocks of
    ``sf_vec_size``) are ints, or ``None`` where that extent is M: SFA and SFD_row have
    ``mn = M``, SFD_col has ``k = M`` (its k-blocks are 32-row blocks of D). Which slot has
    which geometry is the contract's table (``cudnn_ext.contract.blockscaled.sf_geometry``);
    this object only re-derives the layout for a given M, so a plan built at one M judges a
    scale-factor tensor bound at another M by the same rule (:func:`as_sf_6d`).
    """

    mn: Optional[int]
    k: Optional[int]
    sf_vec_size: int
    groups: int = 1

    def dims(self, m: int) -> Tuple[int, int, int]:
        """``(mn, k_blocks, groups)`` at token count ``m``."""
        mn = m if self.mn is None else self.mn
        k = m if self.k is None else self.k
        return mn, sf_k_blocks(k, self.sf_vec_size), self.groups

    def shape(self, m: int) -> Tuple[int, int, int, int, int, int]:
        """The 6-D logical shape at token count ``m``."""
        return sf_shape(*self.dims(m))

    def view(self, sf, m: int, name: str = "sf") -> torch.Tensor:
        """``sf`` judged at token count ``m`` (6-D view or flat packed form): its 6-D view."""
        mn, k_blocks, groups = self.dims(m)
        return as_sf_6d(sf, mn=mn, k_blocks=k_blocks, groups=groups, name=name)

    def empty(self, m: int, *, dtype: torch.dtype, device=None, fill: Optional[int] = 0) -> torch.Tensor:
        """A tensor in the kernel layout at token count ``m`` (see :func:`empty_sf`)."""
        mn, k_blocks, groups = self.dims(m)
        return empty_sf(mn, k_blocks, groups, dtype=dtype, device=device, fill=fill)


def as_sf_6d(sf, *, mn: int, k_blocks: int, groups: int = 1, name: str = "sf") -> torch.Tensor:
    """Validate a scale-factor tensor and return its 6-D logical view.

    Accepts the non-contiguous 6-D view of exact shape :func:`sf_shape` ``(mn, k_blocks,
    groups)``, or a C-contiguous buffer (any shape) of exactly :func:`sf_numel` elements, read as
    packed storage. Raises ``TypeError`` for a non-tensor or a non-scale dtype and
    ``ValueError`` (naming ``name``, the value and the rule) for a wrong shape or size.
    """
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(sf).__name__}")
    if sf.dtype not in (torch.float8_e8m0fnu, torch.float8_e4m3fn):
        raise TypeError(f"{name}: scale factors must be float8_e8m0fnu or float8_e4m3fn, "
                        f"got {sf.dtype}")
    want = sf_shape(mn, k_blocks, groups)
    storage_shape = tuple(want[i] for i in _TO_STORAGE)
    if sf.is_contiguous():
        n = math.prod(want)
        if sf.numel() != n:
            raise ValueError(
                f"{name}: a contiguous (flat) scale-factor buffer must hold exactly 512*RMN*RK*L = "
                f"{n} elements for mn={mn}, k_blocks={k_blocks}, L={groups} (logical shape {want}),"
                f" got shape {tuple(sf.shape)} ({sf.numel()} elements)")
        return sf.reshape(storage_shape).permute(_TO_LOGICAL)
    if tuple(sf.shape) != want:
        raise ValueError(f"{name}: shape mismatch: expected the 6-D layout {want} for mn={mn}, "
                         f"k_blocks={k_blocks}, L={groups}, got {tuple(sf.shape)}")
    # the view must sit on packed storage: engines read it by pointer in storage order
    packed = [1] * 6
    for i in range(4, -1, -1):
        packed[i] = packed[i + 1] * storage_shape[i + 1]
    expect = tuple(packed[j] for j in _TO_LOGICAL)
    if any(n > 1 and st != ex for n, st, ex in zip(want, sf.stride(), expect)):
        raise ValueError(f"{name}: the 6-D view must have the packed layout's strides {expect} "
                         f"(e.g. from empty_sf or swizzle_sf), got {tuple(sf.stride())}")
    return sf
