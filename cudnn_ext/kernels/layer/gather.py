"""Row gather on the device: ``out[i] = x[idx[i]]`` where ``valid[i]``, else 0, in one pass.

Owns the device form of ``cudnn_ext.torch.mlp.gather_rows`` (moving routed rows into the
fused op's expert groups and back): torch's form is an index pass and a select pass over the
whole output. Rows are any number of 16-byte units long; ``idx`` is int64, ``valid`` one
byte per row (torch's bool). No torch; the caller owns buffers and streams.

One thread per 16 bytes of an output row; neighbouring threads take neighbouring units of a
row, so a warp reads 512 contiguous bytes of one source row and writes 512 of one output row.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

THREADS = 256
_GMEM = cute.AddressSpace.gmem


class RowGather:
    """``__call__(x, idx, valid, out, rows_out, row_units, stream)`` on raw pointers (``x``,
    ``out`` 16-byte aligned, rows of ``row_units`` 16-byte units; ``idx`` int64 and ``valid``
    bytes, ``rows_out`` of each). ``idx[i]`` is read only where ``valid[i]``."""

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, idx_ptr: cute.Pointer, valid_ptr: cute.Pointer,
                 out_ptr: cute.Pointer, rows_out: Int32, row_units: Int32, stream):
        total = rows_out * row_units
        grid = ((total + THREADS - 1) // THREADS, 1, 1)
        self.kernel(x_ptr, idx_ptr, valid_ptr, out_ptr, row_units, total).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, idx_ptr: cute.Pointer, valid_ptr: cute.Pointer,
               out_ptr: cute.Pointer, row_units: Int32, total: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        t = bid * THREADS + tidx
        if t < total:
            i = t // row_units
            u = cutlass.Int64(t - i * row_units)
            vals = cute.make_rmem_tensor((4,), Int32)
            vals.fill(0)
            if cute.make_tensor(valid_ptr, cute.make_layout(i + 1))[i] != cutlass.Uint8(0):
                src_row = cute.make_tensor(idx_ptr, cute.make_layout(i + 1))[i]
                src = cute.make_tensor(
                    cute.make_ptr(Int32, x_ptr.toint() + (src_row * cutlass.Int64(row_units) + u) * 16,
                                  _GMEM, assumed_align=16),
                    cute.make_layout(4))
                cute.autovec_copy(src, vals)
            dst = cute.make_tensor(
                cute.make_ptr(Int32, out_ptr.toint() + (cutlass.Int64(i) * cutlass.Int64(row_units) + u) * 16,
                              _GMEM, assumed_align=16),
                cute.make_layout(4))
            cute.autovec_copy(vals, dst)
