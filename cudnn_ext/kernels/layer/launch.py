"""Compile and launch the layer's kernels: the GLU forward (``glu.GluForward``), the tail
zeroing (``tail.ZeroTail``) and the row gather (``gather.RowGather``).

Owns their jit argument conventions (GLU: C, prob, offsets, h, then M, N, the group count and
the stream; tail: the matrix, offsets, then M, the row's 16-byte units, the group count and the
stream; gather: x, idx, valid, out, then the output rows, the row's 16-byte units and the
stream), compiling for sm_90a with placeholder pointers (no GPU needed) through the disk cache,
and a per-process cache keyed by config. Importing this module imports the CuTe DSL; callers
import it lazily. No torch.
"""
from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # see kernels/sm90/launch.py

import cuda.bindings.driver as cuda  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32  # noqa: E402
from cutlass.cute.runtime import make_ptr  # noqa: E402

from ..placeholders import TVM_FFI, KernelCache, compile_on_placeholders  # noqa: E402
from .gather import RowGather  # noqa: E402
from .glu import VEC, GluConfig, GluForward  # noqa: E402
from .tail import ZeroTail  # noqa: E402

_GMEM = cute.AddressSpace.gmem
#: (C, prob, offsets, h) and (matrix, offsets): element types and assumed alignments
_GLU_PTRS = ((cutlass.BFloat16, 16), (cutlass.Float32, 4), (cutlass.Int32, 4), (cutlass.BFloat16, 16))
_TAIL_PTRS = ((cutlass.Int32, 16), (cutlass.Int32, 4))
#: (x, idx, valid, out)
_GATHER_PTRS = ((cutlass.Int32, 16), (cutlass.Int64, 8), (cutlass.Uint8, 1), (cutlass.Int32, 16))

#: The kernels' source (part of the disk cache's key): this package, the epilogue math the GLU
#: shares with the SM90 kernel and the compile call
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (_HERE, os.path.join(_HERE, "..", "sm90", "epilogue_math.py"), os.path.join(_HERE, "..", "placeholders.py"))
#: the tail and gather kernels have no config: one key each
_TAIL_KEY = "zero_tail"
_GATHER_KEY = "gather_rows"

_kernels = KernelCache(SOURCES)
_compiled = _kernels.compiled  # (kind, config) -> compiled kernel


def compile_glu(cfg: GluConfig, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile ``cfg``'s GLU forward for sm_90a without touching a GPU."""
    return compile_on_placeholders(GluForward(cfg), _GLU_PTRS, (256, 64, 1), tvm_ffi, ptx_dir)


def compile_zero_tail(_key=None, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile the tail zeroing for sm_90a without touching a GPU."""
    return compile_on_placeholders(ZeroTail(), _TAIL_PTRS, (256, 8, 1), tvm_ffi, ptx_dir)


def compile_gather(_key=None, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile the row gather for sm_90a without touching a GPU."""
    return compile_on_placeholders(RowGather(), _GATHER_PTRS, (256, 8), tvm_ffi, ptx_dir)


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
    fn = _kernels.get("glu_forward", cfg, compile_glu)
    if TVM_FFI:
        fn(c, prob, offsets, h, m, n, groups, stream_handle)
        return
    ptrs = [make_ptr(dt, a, _GMEM, assumed_align=al) for (dt, al), a in zip(_GLU_PTRS, (c, prob, offsets, h))]
    fn(*ptrs, Int32(m), Int32(n), Int32(groups), cuda.CUstream(stream_handle))


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
    fn = _kernels.get("zero_tail", _TAIL_KEY, compile_zero_tail)
    if TVM_FFI:
        fn(x, offsets, m, row_bytes // 16, groups, stream_handle)
        return
    ptrs = [make_ptr(dt, a, _GMEM, assumed_align=al) for (dt, al), a in zip(_TAIL_PTRS, (x, offsets))]
    fn(*ptrs, Int32(m), Int32(row_bytes // 16), Int32(groups), cuda.CUstream(stream_handle))


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
    fn = _kernels.get("gather_rows", _GATHER_KEY, compile_gather)
    if TVM_FFI:
        fn(x, idx, valid, out, rows_out, row_bytes // 16, stream_handle)
        return
    ptrs = [make_ptr(dt, a, _GMEM, assumed_align=al) for (dt, al), a in zip(_GATHER_PTRS, (x, idx, valid, out))]
    fn(*ptrs, Int32(rows_out), Int32(row_bytes // 16), cuda.CUstream(stream_handle))
