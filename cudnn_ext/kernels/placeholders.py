"""Compile pointer-argument CuTe DSL kernels for sm_90a on placeholder pointers (no GPU), and
keep them once per process.

Owns the one ``cute.compile`` call of the kernels that take raw device addresses (the
block-scaled dequantizer and D quantizer, the layer's kernels): null pointers of the
kernel's element types and alignments, sample sizes, a fake stream, and the options (TVM-FFI
calling convention, PTX dumps); and :class:`KernelCache`, their per-process cache over the
disk cache. Importing it imports the CuTe DSL.
"""
from __future__ import annotations

import importlib.util
import threading

import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_fake_stream, make_ptr

from ..runtime import compile_cache

_GMEM = cute.AddressSpace.gmem

#: The TVM-FFI calling convention converts arguments in C++ (a few microseconds per launch
#: instead of ~100 us of Python argument packing); used when apache-tvm-ffi is installed.
TVM_FFI = importlib.util.find_spec("tvm_ffi") is not None


def compile_on_placeholders(kernel, ptr_specs, sizes, tvm_ffi: bool, ptx_dir=None):
    """``cute.compile(kernel, *pointers, *sizes, stream)`` for sm_90a: ``ptr_specs`` are
    ``(element type, assumed alignment)`` pairs, ``sizes`` the Int32 arguments' sample values."""
    ptrs = [make_ptr(dt, 0, _GMEM, assumed_align=al) for dt, al in ptr_specs]
    opts = ("--gpu-arch sm_90a" + (" --enable-tvm-ffi" if tvm_ffi else "")
            + (f" --keep-ptx --dump-dir {ptx_dir}" if ptx_dir else ""))
    stream = make_fake_stream(use_tvm_ffi_env_stream=False) if tvm_ffi else make_fake_stream()
    return cute.compile(kernel, *ptrs, *(Int32(v) for v in sizes), stream, options=opts)


class KernelCache:
    """Compiled kernels keyed by ``(kind, config)``, once per process (thread-safe), each loaded
    from the disk cache (``runtime.compile_cache``) when any process compiled it before.
    ``sources``: the files and folders of the kernels' source (part of the disk cache's key)."""

    def __init__(self, sources):
        self.sources = tuple(sources)
        self.compiled = {}
        self._lock = threading.Lock()

    def get(self, kind: str, cfg, compile_fn):
        """The compiled kernel ``compile_fn(cfg)`` of ``(kind, cfg)``."""
        key = (kind, cfg)
        fn = self.compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self.compiled.get(key)
                if fn is None:
                    fn = self.compiled[key] = compile_cache.load_or_compile(
                        kind, cfg, lambda: compile_fn(cfg), sources=self.sources, arch="sm_90a",
                        tvm_ffi=TVM_FFI)
        return fn
