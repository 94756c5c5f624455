"""Compiled pointer-argument kernels, once per process: the calling convention and the cache.

Owns the calling convention the library compiles its kernels for (``TVM_FFI``) and
:class:`KernelCache`, the per-process dict of the block-scaled and layer kernels in front of
the disk cache (``runtime.compile_cache``). It imports no DSL, so a process whose kernels are
all on disk launches them without importing cutlass: a kernel's compile function, which
imports the DSL, runs only when the disk cache misses.
"""
from __future__ import annotations

import importlib
import importlib.util
import threading

from ..runtime import caches, compile_cache

#: The TVM-FFI calling convention converts arguments in C++ (a few microseconds per launch
#: instead of ~100 us of Python argument packing), and the disk cache opens its kernels without
#: the DSL; used when apache-tvm-ffi is installed.
TVM_FFI = importlib.util.find_spec("tvm_ffi") is not None


class KernelCache:
    """Compiled kernels, once per process (thread-safe: one compile at a time, which the DSL
    needs), each loaded from the disk cache (``runtime.compile_cache``) when any process
    compiled it before; every compiled kernel of the package lives in one of these. ``get``
    keys by ``(kind, config)`` and compiles through ``build_module`` (the module that holds
    the DSL's calling convention; it imports the DSL: imported by :meth:`build` only, on a
    miss or for that convention) from ``sources`` (the files and folders of the kernels'
    source, part of the disk cache's key); ``load`` takes any key and a loader of its own.
    ``name``: the store's name in ``runtime.caches``."""

    def __init__(self, sources=(), build_module: str = None, *, name: str = None):
        self.sources = tuple(sources)
        self.build_module = build_module
        self.compiled = {}
        self._lock = threading.Lock()
        caches.register(name or f"kernels of {build_module}", self.compiled.clear, lambda: len(self.compiled))

    def load(self, key, loader):
        """The kernel under ``key``, from ``loader()`` on the first request of the process."""
        fn = self.compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self.compiled.get(key)
                if fn is None:
                    fn = self.compiled[key] = loader()
        return fn

    def build(self):
        """The build module (imported on first use)."""
        return importlib.import_module(self.build_module)

    def get(self, kind: str, cfg, compile_name: str):
        """The compiled kernel ``build().<compile_name>(cfg)`` of ``(kind, cfg)`` (compiled
        only on a disk-cache miss)."""
        return self.load((kind, cfg), lambda: compile_cache.load_or_compile(
            kind, cfg, lambda: getattr(self.build(), compile_name)(cfg), sources=self.sources, arch="sm_90a",
            tvm_ffi=TVM_FFI))
