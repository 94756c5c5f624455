"""Launch the layer's kernels: the GLU forward (``glu.GluForward``), the tail zeroing
(``tail.ZeroTail``) and the row gather (``gather.RowGather``).

Owns their argument conventions (GLU: C, prob, offsets, h, then M, N, the group count and the
stream; tail: the matrix, offsets, then M, the row's 16-byte units, the group count and the
stream; gather: x, idx, valid, out, then the output rows, the row's 16-byte units and the
stream), the checks a launch makes on its sizes and addresses, and a per-process cache keyed
by config over the disk cache. Imports no DSL: a kernel is compiled (``build``, which
imports it) only when the disk cache misses, and with the TVM-FFI convention a warm process
launches without the DSL; the DSL's own convention goes through ``build``. No torch.
"""
from __future__ import annotations

import os

from ..kernel_cache import TVM_FFI, KernelCache
from .config import VEC, GluConfig

#: The kernels' source (part of the disk cache's key): this package, the epilogue math the GLU
#: shares with the SM90 kernel and the compile call
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (_HERE, os.path.join(_HERE, "..", "sm90", "epilogue_math.py"), os.path.join(_HERE, "..", "placeholders.py"))
#: the tail and gather kernels have no config: one key each
_TAIL_KEY = "zero_tail"
_GATHER_KEY = "gather_rows"

# (the DSL side, ``build``, is imported on a disk-cache miss or for the DSL's convention)
_kernels = KernelCache(SOURCES, f"{__package__}.build")
_compiled = _kernels.compiled  # (kind, config) -> compiled kernel


def zero_tail_cached():
    """The compiled tail zeroing (``kernel_cache.KernelCache``): it has no config."""
    return _kernels.get("zero_tail", _TAIL_KEY, "compile_zero_tail")


def launch_glu(cfg: GluConfig, c: int, prob: int, offsets: int, h: int, m: int, n: int,
               groups: int, stream_handle: int) -> None:
    """``h = prob * act(gate, up)`` of the bf16 (m, 2n) C at ``c`` into the bf16 (m, n) ``h``
    (rows at or past the last of the ``groups`` int32 offsets get 0), on ``stream_handle``."""
    if n % VEC or n <= 0 or m < 0:
        raise ValueError(f"n: must be a positive multiple of {VEC}, got n={n}, m={m}")
    if c % 16 or h % 16:
        raise ValueError(f"c, h: must be 16-byte aligned, got {c:#x}, {h:#x}")
    if m == 0:
        return
    fn = _kernels.get("glu_forward", cfg, "compile_glu")
    if TVM_FFI:
        fn(c, prob, offsets, h, m, n, groups, stream_handle)
    else:
        _kernels.build().call_dsl("glu_forward", fn, (c, prob, offsets, h), (m, n, groups), stream_handle)


def launch_zero_tail(x: int, offsets: int, m: int, row_bytes: int, groups: int,
                     stream_handle: int) -> None:
    """Zero rows [min(offsets[groups-1], m), m) of the (m, row_bytes) row-major matrix at
    ``x``, on ``stream_handle``; the offset is read on the device."""
    if row_bytes % 16 or row_bytes <= 0:
        raise ValueError(f"row_bytes: must be a positive multiple of 16, got {row_bytes}")
    if x % 16:
        raise ValueError(f"x: must be 16-byte aligned, got {x:#x}")
    if m == 0:
        return
    fn = zero_tail_cached()
    if TVM_FFI:
        fn(x, offsets, m, row_bytes // 16, groups, stream_handle)
    else:
        _kernels.build().call_dsl("zero_tail", fn, (x, offsets), (m, row_bytes // 16, groups),
                          stream_handle)


def launch_gather(x: int, idx: int, valid: int, out: int, rows_out: int, row_bytes: int,
                  stream_handle: int) -> None:
    """``out[i] = x[idx[i]]`` where the byte ``valid[i]`` is nonzero, else 0, for the
    ``rows_out`` rows of ``row_bytes`` bytes of ``out``, on ``stream_handle``."""
    if row_bytes % 16 or row_bytes <= 0:
        raise ValueError(f"row_bytes: must be a positive multiple of 16, got {row_bytes}")
    if x % 16 or out % 16:
        raise ValueError(f"x, out: must be 16-byte aligned, got {x:#x}, {out:#x}")
    if rows_out == 0:
        return
    fn = _kernels.get("gather_rows", _GATHER_KEY, "compile_gather")
    if TVM_FFI:
        fn(x, idx, valid, out, rows_out, row_bytes // 16, stream_handle)
    else:
        _kernels.build().call_dsl("gather_rows", fn, (x, idx, valid, out), (rows_out, row_bytes // 16),
                          stream_handle)
