"""Launch the partial-sums fold (``fold.FoldPartials``).

Owns its argument convention (the (P, M) fp32 row partials, the M fp32 outputs, the int32 end
offsets, the (tiles, 2N) fp32 column partials, the bf16 dbias, the int32 tile bounds, then M,
P, the offsets' count, 2N, tiles, the bounds' scale and unit, and the stream), the checks a launch makes, and a
per-process cache over the disk cache. Imports no DSL: the kernel is compiled (``build``,
which imports it) only when the disk cache misses. No torch.
"""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

from ..kernel_cache import TVM_FFI, KernelCache
from .config import THREADS, FoldConfig

#: The kernel's source (part of the disk cache's key): this package and the compile call
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (_HERE, os.path.join(_HERE, "..", "placeholders.py"))
INT32_MAX = 2 ** 31 - 1
#: the one form (``FoldConfig``)
FOLD = FoldConfig()

_kernels = KernelCache(SOURCES, f"{__package__}.build")


def fold_cached(cfg: FoldConfig = FOLD):
    """The compiled fold (``kernel_cache.KernelCache``)."""
    return _kernels.get("fold_partials", cfg, "compile_fold")


class ColumnFold(NamedTuple):
    """The columns part of a fold launch: the (tiles, 2N) fp32 slab at ``cols``, the (E, 2N)
    bf16 output at ``dbias``, and the E int32 ``bounds``: expert e's M-tiles end at
    ``ceil(bounds[e] * bound_mul / bound_div)``, clamped to [0, the whole ``unit``s of tiles
    up to the last bound, and ``tiles``] (``fold.FoldPartials``)."""

    cols: int
    dbias: int
    bounds: int
    two_n: int
    tiles: int
    bound_mul: int = 1
    bound_div: int = 1
    unit: int = 1


def launch_fold(parts: int, out: int, offsets: int, m: int, p: int, n_offsets: int,
                stream_handle: int, columns: Optional[ColumnFold] = None,
                cfg: FoldConfig = FOLD) -> None:
    """One launch on the stream ``stream_handle``: ``out[r] += sum over t < p of parts[t * m +
    r]`` in ascending t, for r below the last of the ``n_offsets`` int32 offsets at ``offsets``
    (and below ``m``; nothing with ``p`` 0), and with ``columns`` the dbias fold of its slab
    over ``n_offsets`` experts. Addresses are device pointers; this reads none."""
    cfg.check()
    col = columns or ColumnFold(0, 0, 0, 0, 0)
    if m < 0 or p < 0 or n_offsets <= 0 or (p == 0 and columns is None):
        raise ValueError(f"m, p, n_offsets: must be >= 0, >= 0, > 0 with rows or columns to fold, "
                         f"got {m}, {p}, {n_offsets} and columns={columns}")
    if p and m == 0:
        raise ValueError(f"m: must be positive with partials to fold (p={p}), got 0")
    if columns is not None and (col.two_n <= 0 or col.tiles < 0 or col.bound_mul <= 0
                                or col.bound_div <= 0 or col.unit <= 0):
        raise ValueError(f"columns: two_n, bound_mul, bound_div and unit must be positive and "
                         f"tiles >= 0, got {col}")
    # (the grid, the row and column indices and the bounds' products are int32)
    if max(m + THREADS, p, n_offsets, n_offsets * col.two_n + THREADS, col.tiles,
           col.bound_div * col.unit) > INT32_MAX:
        raise ValueError(f"m, p, n_offsets, n_offsets * two_n, tiles, bound_div * unit: must be within "
                         f"int32 (m at most {INT32_MAX - THREADS}), got {m}, {p}, {n_offsets}, "
                         f"{n_offsets * col.two_n}, {col.tiles}, {col.bound_div * col.unit}")
    named = (("offsets", offsets, 4),)
    if p:
        named += (("parts", parts, 4), ("out", out, 4))
    if columns is not None:
        named += (("columns.cols", col.cols, 4), ("columns.dbias", col.dbias, 2),
                  ("columns.bounds", col.bounds, 4))
    for name, addr, align in named:
        if not addr or addr % align:
            raise ValueError(f"{name}: must be non-null and {align}-byte aligned, got {addr:#x}")
    # (a part the launch does not fold gets the offsets' address: never read)
    addrs = (parts or offsets, out or offsets, offsets, col.cols or offsets, col.dbias or offsets,
             col.bounds or offsets)
    sizes = (m, p, n_offsets, col.two_n, col.tiles, col.bound_mul, col.bound_div, col.unit)
    fn = fold_cached(cfg)
    if TVM_FFI:
        fn(*addrs, *sizes, stream_handle)
    else:
        _kernels.build().call_dsl(cfg, fn, addrs, sizes, stream_handle)
