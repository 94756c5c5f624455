"""The fixed-order fold of per-tile partials into an output vector (CuTe DSL, sm_90a).

The deterministic form of the sm90 kernel stores each (N-tile, row) dprob partial into a
(P, M) fp32 slab instead of adding it with an atomic; this kernel adds each row's P partials,
in ascending order, to the row's output, so the sum does not depend on which CTA finished
first. One thread per row: at each step the CTA's threads read one slab row's contiguous
values (coalesced), and a row's P loads are independent of each other.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .config import THREADS, FoldConfig

_GMEM = cute.AddressSpace.gmem


class FoldPartials:
    """The kernel of :class:`FoldConfig`: ``__call__(parts, out, offsets, m, p, n_offsets,
    stream)`` on raw pointers: ``parts`` the (P, M) slab (row stride M), ``out`` M values,
    ``offsets`` the int32 end offsets (only the last is read)."""

    def __init__(self, cfg: FoldConfig):
        cfg.check()
        self.cfg = cfg

    @cute.jit
    def __call__(self, parts_ptr: cute.Pointer, out_ptr: cute.Pointer, offs_ptr: cute.Pointer,
                 m: Int32, p: Int32, n_offs: Int32, stream):
        grid = ((m + THREADS - 1) // THREADS, 1, 1)
        self.kernel(parts_ptr, out_ptr, offs_ptr, m, p, n_offs).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, parts_ptr: cute.Pointer, out_ptr: cute.Pointer, offs_ptr: cute.Pointer,
               m: Int32, p: Int32, n_offs: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        r = bx * THREADS + tidx
        end = cute.make_tensor(offs_ptr, cute.make_layout(n_offs))[n_offs - 1]
        if r < cutlass.min(m, end):
            parts = cute.make_tensor(parts_ptr, cute.make_layout(cutlass.Int64(p) * cutlass.Int64(m)))
            out = cute.make_tensor(out_ptr, cute.make_layout(m))
            s = Float32(0.0)
            for t in cutlass.range(p, unroll=4):
                s = s + parts[cutlass.Int64(t) * cutlass.Int64(m) + cutlass.Int64(r)]
            out[r] = out[r] + s
