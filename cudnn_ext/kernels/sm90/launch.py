"""The SM90 kernel's compiled function and its launch, without the CuTe DSL.

Owns the kernel's jit argument convention (22 pointers, then M, L, the resident CTAs, the four
activation constants and the stream; the pointers' types: ``build._ptr_specs``), the compiled
function of a config through the disk cache (``compile_kernel_cached``) and the launch of a
TVM-FFI one on raw addresses. Imports no DSL: the kernel is compiled (``build``, which imports
it) only when the disk cache misses, so a process whose kernel is on disk launches it without
the DSL. A kernel compiled with the DSL's own convention launches through ``build.launch``.
The engine (``engines.sm90``) imports this module when it builds a plan. No torch, no policy.
"""
from __future__ import annotations

import os

from ...runtime import compile_cache
from ..kernel_cache import TVM_FFI
from .config import Sm90Config

#: The kernel's source (part of the disk cache's key): every file of this package and the
#: scale-factor layout whose atom the quantizing epilogue writes.
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (_HERE, os.path.join(_HERE, "..", "..", "quant", "sf_layout.py"))


def compile_kernel_cached(cfg: Sm90Config, tvm_ffi: bool = TVM_FFI):
    """``build.compile_kernel(cfg)`` through the persistent compile cache (loaded from disk
    when another process compiled the same kernel from the same source and DSL; the DSL is
    imported only to compile)."""

    def compile_fn():
        from .build import compile_kernel

        return compile_kernel(cfg, tvm_ffi)

    return compile_cache.load_or_compile("sm90", cfg, compile_fn, sources=SOURCES,
                                         arch="sm_90a", tvm_ffi=tvm_ffi)


def launch_tvm_ffi(compiled, addrs, m: int, num_experts: int, sm_count: int,
                   geglu_alpha: float, clamp_max: float, clamp_min: float,
                   linear_offset: float, stream_handle: int) -> None:
    """Launch a kernel compiled with ``tvm_ffi=True``: plain ints/floats, converted in C++."""
    compiled(*addrs, m, num_experts, sm_count, geglu_alpha, clamp_max, clamp_min,
             linear_offset, stream_handle)


def bind_tvm_ffi(compiled, num_experts: int, sm_count: int, geglu_alpha: float,
                 clamp_max: float, clamp_min: float, linear_offset: float):
    """``launch_tvm_ffi`` with the scalars a plan fixes bound: ``call(addrs, m,
    stream_handle)`` (the eager hot path's launch: one Python frame less per call)."""
    tail = (num_experts, sm_count, geglu_alpha, clamp_max, clamp_min, linear_offset)

    def call(addrs, m: int, stream_handle: int) -> None:
        compiled(*addrs, m, *tail, stream_handle)

    return call
