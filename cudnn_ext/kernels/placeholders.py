"""Compile a pointer-argument CuTe DSL kernel for sm_90a on placeholder pointers (no GPU).

Owns the one ``cute.compile`` call of the kernels that take raw device addresses (the
block-scaled dequantizer and D quantizer, the layer's kernels): null pointers of the
kernel's element types and alignments, sample sizes, a fake stream, and the options (TVM-FFI
calling convention, PTX dumps). Importing it imports the CuTe DSL.
"""
from __future__ import annotations

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
