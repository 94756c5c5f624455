"""Compile the block-scaled kernels with the CuTe DSL, and call them in the DSL's own convention.

Owns the DSL side of the dequantizer (``dequant.Dequantizer``, and ``DequantPair``: A's and
B's in one launch): its pointers' element types and alignments, compiling each for
sm_90a with placeholder pointers (no GPU needed), and the launch of a kernel compiled with the
DSL's own convention (no apache-tvm-ffi). Importing it imports the DSL; ``launch`` imports it
only to compile (a disk-cache miss) or for that convention. No torch.
"""
from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # see kernels/sm90/build.py

import cutlass  # noqa: E402

from ..kernel_cache import TVM_FFI  # noqa: E402
from ..placeholders import call_on_addresses, compile_on_placeholders  # noqa: E402
from .dequant import DequantConfig, DequantPair, Dequantizer  # noqa: E402
from .config import DequantPairConfig  # noqa: E402

#: (element bytes, scale bytes, bf16 out, offsets) and their assumed alignments: a row of K
#: elements starts 16-byte aligned (K % 128 == 0 for FP8, % 64 for FP4 at least: whole quads)
_PTRS = ((cutlass.Uint8, 16), (cutlass.Uint8, 16), (cutlass.BFloat16, 32), (cutlass.Int32, 4))
#: The pair's: A's elements, scales and bf16 out, then B's, then B's offsets
_PAIR_PTRS = _PTRS[:3] + _PTRS
_PTRS_OF = {"dequant": _PTRS, "dequant_pair": _PAIR_PTRS}


def compile_dequant(cfg: DequantConfig, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile ``cfg``'s dequantizer for sm_90a without touching a GPU."""
    return compile_on_placeholders(Dequantizer(cfg), _PTRS, (128, 128, 1), tvm_ffi, ptx_dir)


def compile_dequant_pair(cfg: DequantPairConfig, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile ``cfg``'s two dequantizers as one kernel for sm_90a without touching a GPU."""
    return compile_on_placeholders(DequantPair(cfg), _PAIR_PTRS, (128, 128, 128, 1), tvm_ffi, ptx_dir)


def call_dsl(kind: str, fn, addrs, sizes, stream_handle: int) -> None:
    """Launch ``fn``, the ``kind`` kernel compiled with the DSL's own convention, on raw
    ``addrs`` in ``launch``'s order, then the Int32 ``sizes`` and the stream."""
    call_on_addresses(fn, _PTRS_OF[kind], addrs, sizes, stream_handle)
