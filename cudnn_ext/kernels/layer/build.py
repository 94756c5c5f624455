"""Compile the layer's kernels with the CuTe DSL, and call them in the DSL's own convention.

Owns the DSL side of the GLU forward (``glu.GluForward``), the tail zeroing
(``tail.ZeroTail``) and the row gather (``gather.RowGather``): their pointers' element types
and alignments, compiling each for sm_90a with placeholder pointers (no GPU needed), and the
launch of a kernel compiled with the DSL's own convention (no apache-tvm-ffi). Importing it
imports the DSL; ``launch`` imports it only to compile (a disk-cache miss) or for that
convention. No torch.
"""
from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # see kernels/sm90/build.py

import cutlass  # noqa: E402

from ..kernel_cache import TVM_FFI  # noqa: E402
from ..placeholders import call_on_addresses, compile_on_placeholders  # noqa: E402
from .gather import RowGather  # noqa: E402
from .glu import GluConfig, GluForward  # noqa: E402
from .tail import ZeroTail  # noqa: E402

#: (C, prob, offsets, h) and (matrix, offsets): element types and assumed alignments
_GLU_PTRS = ((cutlass.BFloat16, 16), (cutlass.Float32, 4), (cutlass.Int32, 4), (cutlass.BFloat16, 16))
_TAIL_PTRS = ((cutlass.Int32, 16), (cutlass.Int32, 4))
#: (x, idx, valid, out)
_GATHER_PTRS = ((cutlass.Int32, 16), (cutlass.Int64, 8), (cutlass.Uint8, 1), (cutlass.Int32, 16))
_PTRS = {"glu_forward": _GLU_PTRS, "zero_tail": _TAIL_PTRS, "gather_rows": _GATHER_PTRS}


def compile_glu(cfg: GluConfig, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile ``cfg``'s GLU forward for sm_90a without touching a GPU."""
    return compile_on_placeholders(GluForward(cfg), _GLU_PTRS, (256, 64, 1), tvm_ffi, ptx_dir)


def compile_zero_tail(_key=None, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile the tail zeroing for sm_90a without touching a GPU."""
    return compile_on_placeholders(ZeroTail(), _TAIL_PTRS, (256, 8, 1), tvm_ffi, ptx_dir)


def compile_gather(_key=None, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile the row gather for sm_90a without touching a GPU."""
    return compile_on_placeholders(RowGather(), _GATHER_PTRS, (256, 8), tvm_ffi, ptx_dir)


def call_dsl(kind: str, fn, addrs, sizes, stream_handle: int) -> None:
    """Launch ``fn``, the ``kind`` kernel compiled with the DSL's own convention, on raw
    ``addrs`` in ``launch``'s order, then the Int32 ``sizes`` and the stream."""
    call_on_addresses(fn, _PTRS[kind], addrs, sizes, stream_handle)
