"""The fixed-order folds of per-tile partials into their outputs (CuTe DSL, sm_90a).

The deterministic form of the sm90 kernel stores each (N-tile, row) dprob partial into a
(P, M) fp32 slab, and each M-tile's dbias column sums into a (tiles, 2N) fp32 slab, instead of
adding them with atomics. One launch folds both, so the sums do not depend on which CTA
finished first:

* rows (the first CTAs): a thread per row adds the row's P partials in ascending order to
  the row's fp32 output; at each step the CTA's threads read one slab row's contiguous values.
* columns (the CTAs after them): a thread per (expert, column) adds the column's values of
  the expert's M-tiles, in ascending tile order, then rounds once into the bf16 output.

In both, a thread's loads are independent of each other (only the adds are chained), so an
unrolled loop keeps several in flight.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .config import THREADS, FoldConfig


class FoldPartials:
    """The kernel of :class:`FoldConfig`: ``__call__(parts, out, offsets, cols, dbias, bounds,
    m, p, n_offsets, two_n, tiles, bound_mul, bound_div, unit, stream)`` on raw pointers.

    Rows (none with ``p`` 0): ``parts`` the (P, M) slab (row stride M), ``out`` M values,
    ``offsets`` the int32 end offsets (only the last is read: rows at or past it are left).
    Columns (none with ``two_n`` 0): ``cols`` the (tiles, 2N) slab, ``dbias`` the (E, 2N)
    bf16 output for E = ``n_offsets`` experts; expert e's M-tiles are ``[b(e-1), b(e))`` with
    ``b(e) = ceil(bounds[e] * bound_mul / bound_div)`` clamped to ``[0, last]``, ``b(-1) = 0``
    (row offsets over a tile height, or a table of tile units times a cluster size), ``last``
    the whole ``unit``s of tiles up to the last bound (the schedule runs no other), at most
    ``tiles``; an expert without tiles keeps its bits."""

    def __init__(self, cfg: FoldConfig):
        cfg.check()
        self.cfg = cfg

    @cute.jit
    def __call__(self, parts_ptr: cute.Pointer, out_ptr: cute.Pointer, offs_ptr: cute.Pointer,
                 cols_ptr: cute.Pointer, dbias_ptr: cute.Pointer, bounds_ptr: cute.Pointer,
                 m: Int32, p: Int32, n_offs: Int32, two_n: Int32, tiles: Int32,
                 bound_mul: Int32, bound_div: Int32, unit: Int32, stream):
        row_ctas = (m + THREADS - 1) // THREADS * cutlass.min(p, 1)
        col_ctas = (n_offs * two_n + THREADS - 1) // THREADS
        self.kernel(parts_ptr, out_ptr, offs_ptr, cols_ptr, dbias_ptr, bounds_ptr, m, p, n_offs,
                    two_n, tiles, bound_mul, bound_div, unit, row_ctas).launch(
            grid=(row_ctas + col_ctas, 1, 1), block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, parts_ptr: cute.Pointer, out_ptr: cute.Pointer, offs_ptr: cute.Pointer,
               cols_ptr: cute.Pointer, dbias_ptr: cute.Pointer, bounds_ptr: cute.Pointer,
               m: Int32, p: Int32, n_offs: Int32, two_n: Int32, tiles: Int32, bound_mul: Int32,
               bound_div: Int32, unit: Int32, row_ctas: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        if bx < row_ctas:
            self._fold_row(parts_ptr, out_ptr, offs_ptr, bx * THREADS + tidx, m, p, n_offs)
        else:
            self._fold_column(cols_ptr, dbias_ptr, bounds_ptr, (bx - row_ctas) * THREADS + tidx,
                              n_offs, two_n, tiles, bound_mul, bound_div, unit)

    @cute.jit
    def _fold_row(self, parts_ptr, out_ptr, offs_ptr, r, m, p, n_offs):
        end = cute.make_tensor(offs_ptr, cute.make_layout(n_offs))[n_offs - 1]
        if r < cutlass.min(m, end):
            parts = cute.make_tensor(parts_ptr, cute.make_layout(Int64(p) * Int64(m)))
            out = cute.make_tensor(out_ptr, cute.make_layout(m))
            s = Float32(0.0)
            for t in cutlass.range(p, unroll=4):
                s = s + parts[Int64(t) * Int64(m) + Int64(r)]
            out[r] = out[r] + s

    @cute.jit
    def _tile_bound(self, bounds, e, last, bound_mul, bound_div):
        b = (bounds[e] * bound_mul + bound_div - 1) // bound_div
        return cutlass.min(cutlass.max(b, Int32(0)), last)

    @cute.jit
    def _fold_column(self, cols_ptr, dbias_ptr, bounds_ptr, i, n_offs, two_n, tiles, bound_mul,
                     bound_div, unit):
        if i < n_offs * two_n:
            e = i // two_n
            g = i - e * two_n
            bounds = cute.make_tensor(bounds_ptr, cute.make_layout(n_offs))
            # the tiles the schedule runs: whole units up to the last bound, within the slab
            last = cutlass.min(bounds[n_offs - 1] * bound_mul // (bound_div * unit) * unit, tiles)
            lo = Int32(0)
            if e > 0:
                lo = self._tile_bound(bounds, e - 1, last, bound_mul, bound_div)
            hi = self._tile_bound(bounds, e, last, bound_mul, bound_div)
            cols = cute.make_tensor(cols_ptr, cute.make_layout(Int64(tiles) * Int64(two_n)))
            dbias = cute.make_tensor(dbias_ptr, cute.make_layout(n_offs * two_n))
            if hi > lo:  # (an expert without tiles keeps its bits, -0.0 and NaN payloads included)
                s = Float32(0.0)
                for t in cutlass.range(lo, hi, unroll=4):
                    s = s + cols[Int64(t) * Int64(two_n) + Int64(g)]
                dbias[i] = (dbias[i].to(Float32) + s).to(dbias.element_type)
