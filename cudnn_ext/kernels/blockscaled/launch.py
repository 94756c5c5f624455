"""Compile and launch the block-scaled dequantizer (``dequant.Dequantizer``).

Owns its jit argument convention (element bytes or their pointer table, scale bytes or
theirs, BF16 out, the int32 offsets, then rows, K, the group count and the stream), compiling with placeholder pointers (no GPU needed) and a
per-process cache keyed by the :class:`~.dequant.DequantConfig`. Importing this module
imports the CuTe DSL; callers import it lazily. No torch.
"""
from __future__ import annotations

import importlib.util
import os
import threading

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # see kernels/sm90/launch.py

import cuda.bindings.driver as cuda  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream, make_ptr  # noqa: E402

from ...runtime import compile_cache  # noqa: E402
from .dequant import DequantConfig, Dequantizer  # noqa: E402

_GMEM = cute.AddressSpace.gmem
TVM_FFI = importlib.util.find_spec("tvm_ffi") is not None
#: (element bytes, scale bytes, bf16 out) and their assumed alignments: a row of K elements
#: starts 16-byte aligned (K % 128 == 0 for FP8, % 64 for FP4 at least: whole quads)
_PTRS = ((cutlass.Uint8, 16), (cutlass.Uint8, 16), (cutlass.BFloat16, 32), (cutlass.Int32, 4))

#: The dequantizer's source (part of the disk cache's key): this package and the scale-factor
#: layout it reads
SOURCES = (os.path.dirname(os.path.abspath(__file__)),
           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "quant",
                        "sf_layout.py"))

_compiled = {}
_lock = threading.Lock()


def compile_dequant(cfg: DequantConfig, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile ``cfg``'s dequantizer for sm_90a without touching a GPU."""
    kernel = Dequantizer(cfg)
    ptrs = [make_ptr(dt, 0, _GMEM, assumed_align=al) for dt, al in _PTRS]
    opts = ("--gpu-arch sm_90a" + (" --enable-tvm-ffi" if tvm_ffi else "")
            + (f" --keep-ptx --dump-dir {ptx_dir}" if ptx_dir else ""))
    stream = make_fake_stream(use_tvm_ffi_env_stream=False) if tvm_ffi else make_fake_stream()
    return cute.compile(kernel, *ptrs, Int32(128), Int32(128), Int32(1), stream, options=opts)


def dequant_cached(cfg: DequantConfig):
    """The compiled dequantizer of ``cfg``, once per process (thread-safe): loaded from the
    disk cache (``runtime.compile_cache``) when any process compiled it before."""
    fn = _compiled.get(cfg)
    if fn is None:
        with _lock:
            fn = _compiled.get(cfg)
            if fn is None:
                fn = _compiled[cfg] = compile_cache.load_or_compile(
                    "dequant", cfg, lambda: compile_dequant(cfg), sources=SOURCES,
                    arch="sm_90a", tvm_ffi=TVM_FFI)
    return fn


def launch_dequant(cfg: DequantConfig, q: int, sf: int, out: int, rows: int, k: int,
                   groups: int, stream_handle: int, offsets: int = 0) -> None:
    """Dequantize ``groups`` x ``rows`` x ``k`` elements at address ``q`` (scales at ``sf``;
    with ``cfg.tables`` both are device pointer tables and ``offsets`` the int32 padded
    offsets) into BF16 at ``out``, on the stream ``stream_handle``."""
    if cfg.tables and not offsets:
        raise ValueError("offsets: the per-expert dequantizer needs the padded offsets, got none")
    offsets = offsets or out  # never read without tables
    fn = dequant_cached(cfg)
    if TVM_FFI:
        fn(q, sf, out, offsets, rows, k, groups, stream_handle)
        return
    ptrs = [make_ptr(dt, a, _GMEM, assumed_align=al)
            for (dt, al), a in zip(_PTRS, (q, sf, out, offsets))]
    fn(*ptrs, Int32(rows), Int32(k), Int32(groups), cuda.CUstream(stream_handle))
