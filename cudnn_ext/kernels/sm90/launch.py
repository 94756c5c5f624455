"""Compile and launch helpers for the SM90 kernel, in terms of raw addresses.

Owns the jit argument convention of :class:`GroupedDgluSm90` (pointer placeholders for
compilation, pointer/scalar packing for a launch). Importing this module imports the CuTe
DSL; the engine imports it lazily. No torch, no policy.
"""
from __future__ import annotations

import os

# The DSL reads its target once at import; on a machine without a GPU it would otherwise
# default to sm_100a (../shared/gpu/COMPILE_ON_CPU.md). This kernel is sm_90a only.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cuda.bindings.driver as cuda  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream, make_ptr  # noqa: E402

from .dglu_kernel import GroupedDgluSm90, Sm90KernelConfig  # noqa: E402

_GMEM = cute.AddressSpace.gmem

#: Pointer element types in argument order, with their assumed alignment in bytes. A, B, C, D
#: rows are 16-byte aligned (K % 8 == 0, 2N % 32 == 0); the small vectors only 4-byte. The
#: last two are the discrete-B pointer table (int64, L entries) and the descriptor workspace
#: (L x 128 B, 128-B aligned; the kernel assumes that alignment where it forms descriptor
#: pointers). A dense launch passes A's address for both (never read). Last: the caller's
#: bf16 dbias (L, 2N), into which the kernel folds the fp32 workspace (any address without
#: dbias: never read).
def _ptr_specs(cfg: Sm90KernelConfig):
    return (
        (cfg.ab_dtype, 16), (cfg.ab_dtype, 16), (cfg.c_dtype, 16), (cfg.d_dtype, 16),
        (Int32, 4), (Float32, 4), (Float32, 4), (Float32, 4), (Float32, 4), (Float32, 4),
        (cutlass.Int64, 8), (cutlass.Int64, 16), (cutlass.BFloat16, 2),
    )


def tvm_ffi_available() -> bool:
    """The TVM-FFI calling convention converts arguments in C++ (a few microseconds per
    launch instead of ~100 us of Python argument packing); used when apache-tvm-ffi is
    installed."""
    import importlib.util

    return importlib.util.find_spec("tvm_ffi") is not None


def compile_kernel(cfg: Sm90KernelConfig, tvm_ffi: bool = False, remarks: bool = False,
                   ptx_dir: str | None = None):
    """Compile for sm_90a without touching a GPU (fake addresses, fake stream).

    ``remarks``: print ptxas's report (registers, spills, and its WGMMA performance warnings
    such as C7519 "wgmma.mma_async instructions are serialized") to stderr; the CPU compile
    tests read it. ``ptx_dir``: also write the PTX there (an existing folder; the compile
    tests read it)."""
    kernel = GroupedDgluSm90(cfg)
    ptrs = [make_ptr(dt, 0, _GMEM, assumed_align=al) for dt, al in _ptr_specs(cfg)]
    scalars = [Int32(256), Int32(1), Int32(132), Float32(1.702), Float32(7.0), Float32(-7.0),
               Float32(0.0)]
    opts = ("--gpu-arch sm_90a" + (" --enable-tvm-ffi" if tvm_ffi else "")
            + (" remarks{ptx}" if remarks else "")
            + (f" --keep-ptx --dump-dir {ptx_dir}" if ptx_dir else ""))
    stream = make_fake_stream(use_tvm_ffi_env_stream=False) if tvm_ffi else make_fake_stream()
    return cute.compile(kernel, *ptrs, *scalars, stream, options=opts)


def launch(compiled, cfg: Sm90KernelConfig, addrs, m: int, num_experts: int, sm_count: int,
           geglu_alpha: float, clamp_max: float, clamp_min: float, linear_offset: float,
           stream_handle: int) -> None:
    """Launch ``compiled`` (pointer convention) on the 13 device addresses ``addrs``."""
    ptrs = [make_ptr(dt, a, _GMEM, assumed_align=al)
            for (dt, al), a in zip(_ptr_specs(cfg), addrs)]
    compiled(*ptrs, Int32(m), Int32(num_experts), Int32(sm_count), Float32(geglu_alpha), Float32(clamp_max),
             Float32(clamp_min), Float32(linear_offset), cuda.CUstream(stream_handle))


def launch_tvm_ffi(compiled, addrs, m: int, num_experts: int, sm_count: int,
                   geglu_alpha: float, clamp_max: float, clamp_min: float,
                   linear_offset: float, stream_handle: int) -> None:
    """Launch a kernel compiled with ``tvm_ffi=True``: plain ints/floats, converted in C++."""
    compiled(*addrs, m, num_experts, sm_count, geglu_alpha, clamp_max, clamp_min,
             linear_offset, stream_handle)
