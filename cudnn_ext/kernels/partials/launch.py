"""Launch the partial-sums fold (``fold.FoldPartials``).

Owns its argument convention (the (P, M) fp32 partials, the M fp32 outputs, the int32 end
offsets, then M, P, the offsets' count and the stream), the checks a launch makes, and a
per-process cache over the disk cache. Imports no DSL: the kernel is compiled (``build``,
which imports it) only when the disk cache misses. No torch.
"""
from __future__ import annotations

import os

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


def launch_fold(parts: int, out: int, offsets: int, m: int, p: int, n_offsets: int,
                stream_handle: int, cfg: FoldConfig = FOLD) -> None:
    """``out[r] += sum over t < p of parts[t * m + r]`` in ascending t, for r below the last of
    the ``n_offsets`` int32 offsets at ``offsets`` (and below ``m``), on the stream
    ``stream_handle``. Addresses are device pointers; this reads none."""
    cfg.check()
    if m <= 0 or p <= 0 or n_offsets <= 0:
        raise ValueError(f"m, p, n_offsets: must be positive, got {m}, {p}, {n_offsets}")
    if max(m + THREADS, p, n_offsets) > INT32_MAX:  # (the grid and row index are int32)
        raise ValueError(f"m, p, n_offsets: must be within int32 (m at most {INT32_MAX - THREADS}), got "
                         f"{m}, {p}, {n_offsets}")
    if not parts or not out or not offsets or parts % 4 or out % 4 or offsets % 4:
        raise ValueError(f"parts, out, offsets: must be non-null and 4-byte aligned, got "
                         f"{parts:#x}, {out:#x}, {offsets:#x}")
    addrs = (parts, out, offsets)
    sizes = (m, p, n_offsets)
    fn = fold_cached(cfg)
    if TVM_FFI:
        fn(*addrs, *sizes, stream_handle)
    else:
        _kernels.build().call_dsl(cfg, fn, addrs, sizes, stream_handle)
