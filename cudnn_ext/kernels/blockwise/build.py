"""Compile the blockwise FP8 quantizer with the CuTe DSL, and call it in the DSL's own convention.

Owns the DSL side of ``quantize.QuantizeBlockwise``: its pointers' element types and
alignments per source type, compiling it for sm_90a with placeholder pointers (no GPU
needed), and the launch of a kernel compiled with the DSL's own convention (no apache-tvm-ffi).
Importing it imports the DSL; ``launch`` imports it only to compile (a disk-cache miss) or for
that convention. No torch.
"""
from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # see kernels/sm90/build.py

import cutlass  # noqa: E402

from ..kernel_cache import TVM_FFI  # noqa: E402
from ..placeholders import call_on_addresses, compile_on_placeholders  # noqa: E402
from .config import LANE_COLS, BlockwiseQuantConfig  # noqa: E402
from .quantize import _SRC_TYPES, QuantizeBlockwise  # noqa: E402

#: sample sizes: rows, K, ld, gstride, groups, offsets
_SIZES = (256, 256, 256, 65536, 1, 1)


def pointer_specs(cfg: BlockwiseQuantConfig):
    """(x, q_a, s_a, q_b, s_b, offsets) in jit order with their assumed alignments: a lane's
    four source values and four e4m3 bytes are one aligned access each."""
    src = _SRC_TYPES[cfg.src]
    return ((src, LANE_COLS * src.width // 8), (cutlass.Float8E4M3FN, 4), (cutlass.Float32, 4),
            (cutlass.Float8E4M3FN, 4), (cutlass.Float32, 4), (cutlass.Int32, 4))


def compile_quantize(cfg: BlockwiseQuantConfig, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile ``cfg``'s quantizer for sm_90a without touching a GPU."""
    return compile_on_placeholders(QuantizeBlockwise(cfg), pointer_specs(cfg), _SIZES, tvm_ffi, ptx_dir)


def call_dsl(cfg: BlockwiseQuantConfig, fn, addrs, sizes, stream_handle: int) -> None:
    """Launch ``fn``, compiled with the DSL's own convention, on raw ``addrs`` in
    ``launch``'s order, then the Int32 ``sizes`` and the stream."""
    call_on_addresses(fn, pointer_specs(cfg), addrs, sizes, stream_handle)
