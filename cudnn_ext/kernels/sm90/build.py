"""Compile the SM90 kernel with the CuTe DSL, and launch it in the DSL's own convention.

Owns the DSL side of the one host entry of :class:`~.kernel.GroupedDgluSm90`: the kernel class
of a config (``make_kernel``: the debug build for a :class:`~.config.Sm90TraceConfig`), its
jit pointers' element types and alignments, compiling with placeholder pointers (no GPU
needed), and the launch of a kernel compiled with the DSL's own convention (no
apache-tvm-ffi). The argument order is ``launch``'s. The JAX FFI adapter (``jax_entry``)
inlines ``make_kernel(cfg)`` in its ``cutlass_call`` target with the same pointer order.
Importing this module imports the CuTe DSL; ``launch`` imports it only to compile (a
disk-cache miss) or for the DSL's convention. No torch, no policy.
"""
from __future__ import annotations

import os

# The DSL reads its target once at import; on a machine without a GPU it would otherwise
# default to sm_100a (docs/compile_cache.md, "The CuTe DSL's target and exports"). This kernel is sm_90a only.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cuda.bindings.driver as cuda  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream, make_ptr  # noqa: E402

from ..kernel_cache import TVM_FFI  # noqa: E402
from .config import Sm90Config, Sm90TraceConfig  # noqa: E402
from .kernel import DSL_DTYPES, GroupedDgluSm90  # noqa: E402

_GMEM = cute.AddressSpace.gmem


def make_kernel(cfg: Sm90Config) -> GroupedDgluSm90:
    """The kernel object of ``cfg`` (its constructor checks the config)."""
    if isinstance(cfg, Sm90TraceConfig):
        from .trace import TracedGroupedDgluSm90

        return TracedGroupedDgluSm90(cfg)
    return GroupedDgluSm90(cfg)


#: Pointer element types in argument order, with their assumed alignment in bytes. A, B, C, D
#: rows are 16-byte aligned (K % 8 == 0, 2N % 32 == 0); the small vectors only 4-byte. The
#: last two are the discrete-B pointer table (int64, L entries) and the descriptor workspace
#: (L x 128 B, 128-B aligned; the kernel assumes that alignment where it forms descriptor
#: pointers). A dense launch passes A's address for both (never read). Then the caller's
#: bf16 dbias (L, 2N), into which the kernel folds the fp32 workspace (any address without
#: dbias: never read), the bf16 activation output (M, N; 16-byte aligned with ``act_staged``:
#: its TMA stores) and the fp32 amax (L, 2) (any address without them), then the
#: fp8_blockwise recipe's fp32 scales of A and B (e4m3 operands only; any address
#: otherwise), (deterministic with dbias) the fp32 slab of the tiles' dbias sums, and
#: (``d_scales``) D_col, the SFD_row and SFD_col bytes and the fp32 norm_const (any address
#: otherwise).
def _ptr_specs(cfg: Sm90Config):
    ab, c, d = (DSL_DTYPES[cfg.ab_dtype], DSL_DTYPES[cfg.c_dtype], DSL_DTYPES[cfg.d_dtype])
    return (
        (ab, 16), (ab, 16), (c, 16), (d, 16),
        (Int32, 4), (Float32, 4), (Float32, 4), (Float32, 4), (Float32, 4), (Float32, 4),
        (cutlass.Int64, 8), (cutlass.Int64, 16), (cutlass.BFloat16, 2),
        (cutlass.BFloat16, 16 if cfg.act_staged else 4),
        (Float32, 4), (Float32, 4), (Float32, 4), (Float32, 4),
        (d, 16), (cutlass.Uint8, 4), (cutlass.Uint8, 1), (Float32, 4),
    )


def compile_kernel(cfg: Sm90Config, tvm_ffi: bool = TVM_FFI, remarks: bool = False,
                   ptx_dir: str | None = None):
    """Compile for sm_90a without touching a GPU (fake addresses, fake stream).

    ``remarks``: print ptxas's report (registers, spills, and its WGMMA performance warnings
    such as C7519 "wgmma.mma_async instructions are serialized") to stderr; the CPU compile
    tests read it. ``ptx_dir``: also write the PTX there (an existing folder)."""
    kernel = make_kernel(cfg)
    ptrs = [make_ptr(dt, 0, _GMEM, assumed_align=al) for dt, al in _ptr_specs(cfg)]
    scalars = [Int32(256), Int32(1), Int32(132), Float32(1.702), Float32(7.0), Float32(-7.0),
               Float32(0.0)]
    opts = ("--gpu-arch sm_90a" + (" --enable-tvm-ffi" if tvm_ffi else "")
            + (" remarks{ptx}" if remarks else "")
            + (f" --keep-ptx --dump-dir {ptx_dir}" if ptx_dir else ""))
    stream = make_fake_stream(use_tvm_ffi_env_stream=False) if tvm_ffi else make_fake_stream()
    return cute.compile(kernel, *ptrs, *scalars, stream, options=opts)


def launch(compiled, cfg: Sm90Config, addrs, m: int, num_experts: int, sm_count: int,
           geglu_alpha: float, clamp_max: float, clamp_min: float, linear_offset: float,
           stream_handle: int) -> None:
    """Launch ``compiled`` (the DSL's convention) on the 22 device addresses ``addrs``."""
    ptrs = [make_ptr(dt, a, _GMEM, assumed_align=al)
            for (dt, al), a in zip(_ptr_specs(cfg), addrs)]
    compiled(*ptrs, Int32(m), Int32(num_experts), Int32(sm_count), Float32(geglu_alpha), Float32(clamp_max),
             Float32(clamp_min), Float32(linear_offset), cuda.CUstream(stream_handle))

