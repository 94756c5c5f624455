"""Zero the rows of a row-major matrix at or past the last padded offset (device side).

Owns one job for ``GroupedGluMLP``: ``torch._grouped_mm`` leaves the rows past its last
offset unwritten, and the layer's contract gives those rows (which belong to no expert) 0.
The last offset is device data, so the host cannot slice the tail: a fixed grid reads it and
strides over the tail's 16-byte units only, so a matrix with no tail costs one small launch
instead of a pass over all of it. No torch; the caller owns buffers and streams.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

THREADS = 256
#: CTAs of the fixed grid: enough to fill an H200's 132 SMs with 8 CTAs each
CTAS = 1056
_GMEM = cute.AddressSpace.gmem


class ZeroTail:
    """``__call__(x, offs, m, row_units, groups, stream)``: zero rows [offs[groups-1], m) of
    the matrix at ``x`` (16-byte aligned) whose rows are ``row_units`` 16-byte units long."""

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, offs_ptr: cute.Pointer, m: Int32, row_units: Int32,
                 groups: Int32, stream):
        self.kernel(x_ptr, offs_ptr, m, row_units, groups).launch(
            grid=(CTAS, 1, 1), block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, offs_ptr: cute.Pointer, m: Int32, row_units: Int32,
               groups: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        last = cute.make_tensor(offs_ptr, cute.make_layout(groups))[groups - 1]
        last = cutlass.max(cutlass.min(last, m), Int32(0))
        end = cutlass.Int64(m) * cutlass.Int64(row_units)
        u = cutlass.Int64(last) * cutlass.Int64(row_units) + cutlass.Int64(bid * THREADS + tidx)
        zeros = cute.make_rmem_tensor((4,), Int32)
        zeros.fill(0)
        while u < end:
            dst = cute.make_tensor(
                cute.make_ptr(Int32, x_ptr.toint() + u * 16, _GMEM, assumed_align=16),
                cute.make_layout(4))
            cute.autovec_copy(zeros, dst)
            u = u + cutlass.Int64(CTAS * THREADS)
