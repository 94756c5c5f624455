"""Compile pointer-argument CuTe DSL kernels for sm_90a on placeholder pointers (no GPU), and
call them in the DSL's own calling convention.

Owns the one ``cute.compile`` call of the kernels that take raw device addresses (the
block-scaled dequantizer, the blockwise quantizer, the layer's kernels): null pointers of the
kernel's element types and alignments, sample sizes, a fake stream, and the options (TVM-FFI
calling convention, PTX dumps); and the DSL-convention launch of such a kernel on raw
addresses (without apache-tvm-ffi). Importing it imports the CuTe DSL: only the compile
modules (``build``) import it; launches of TVM-FFI kernels never do (``kernel_cache``).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_fake_stream, make_ptr

_GMEM = cute.AddressSpace.gmem


def compile_on_placeholders(kernel, ptr_specs, sizes, tvm_ffi: bool, ptx_dir=None):
    """``cute.compile(kernel, *pointers, *sizes, stream)`` for sm_90a: ``ptr_specs`` are
    ``(element type, assumed alignment)`` pairs, ``sizes`` the Int32 arguments' sample values."""
    ptrs = [make_ptr(dt, 0, _GMEM, assumed_align=al) for dt, al in ptr_specs]
    opts = ("--gpu-arch sm_90a" + (" --enable-tvm-ffi" if tvm_ffi else "")
            + (f" --keep-ptx --dump-dir {ptx_dir}" if ptx_dir else ""))
    stream = make_fake_stream(use_tvm_ffi_env_stream=False) if tvm_ffi else make_fake_stream()
    return cute.compile(kernel, *ptrs, *(Int32(v) for v in sizes), stream, options=opts)


def call_on_addresses(fn, ptr_specs, addrs, sizes, stream_handle: int) -> None:
    """Launch ``fn``, compiled with the DSL's own convention by ``compile_on_placeholders``,
    on the device addresses ``addrs`` (typed by ``ptr_specs``), the Int32 ``sizes`` and the
    raw stream ``stream_handle``."""
    ptrs = [make_ptr(dt, a, _GMEM, assumed_align=al) for (dt, al), a in zip(ptr_specs, addrs)]
    fn(*ptrs, *(Int32(v) for v in sizes), cuda.CUstream(stream_handle))
