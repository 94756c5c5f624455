"""Compile the partial-sums fold with the CuTe DSL, and call it in the DSL's own convention.

Owns the DSL side of ``fold.FoldPartials``: its pointers' element types, compiling it for
sm_90a with placeholder pointers (no GPU needed), and the launch of a kernel compiled with the
DSL's own convention. Importing it imports the DSL; ``launch`` imports it only to compile (a
disk-cache miss) or for that convention. No torch.
"""
from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # see kernels/sm90/build.py

import cutlass  # noqa: E402

from ..kernel_cache import TVM_FFI  # noqa: E402
from ..placeholders import call_on_addresses, compile_on_placeholders  # noqa: E402
from .config import FoldConfig  # noqa: E402
from .fold import FoldPartials  # noqa: E402

#: sample sizes: M, P, offsets, 2N, tiles, bound_mul, bound_div, unit
_SIZES = (256, 2, 1, 64, 2, 1, 128, 1)


def pointer_specs(cfg: FoldConfig):
    """(parts, out, offsets, cols, dbias, bounds) in jit order with their alignments (scalar
    accesses)."""
    return ((cutlass.Float32, 4), (cutlass.Float32, 4), (cutlass.Int32, 4),
            (cutlass.Float32, 4), (cutlass.BFloat16, 2), (cutlass.Int32, 4))


def compile_fold(cfg: FoldConfig, tvm_ffi: bool = TVM_FFI, ptx_dir: str | None = None):
    """Compile ``cfg``'s fold for sm_90a without touching a GPU."""
    return compile_on_placeholders(FoldPartials(cfg), pointer_specs(cfg), _SIZES, tvm_ffi, ptx_dir)


def call_dsl(cfg: FoldConfig, fn, addrs, sizes, stream_handle: int) -> None:
    """Launch ``fn``, compiled with the DSL's own convention, on raw ``addrs`` in
    ``launch``'s order, then the Int32 ``sizes`` and the stream."""
    call_on_addresses(fn, pointer_specs(cfg), addrs, sizes, stream_handle)
