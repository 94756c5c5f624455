"""fp32 dGLU result -> FP8 D on the device: the quantized outputs of FP8 (MXFP8) operands.

Owns the device form of ``reference.blockscaled.quantize_d_row`` / ``quantize_d_col`` (and of
the plain saturating conversion of FP8 D without scale factors) for the Hopper block-scaled
engine, which runs the BF16 kernel with fp32 D into a temporary and then this pass. Reads an
fp32 ``(M, 2N)`` row-major matrix; writes, for the rows below the last group end only (the
last padded offset, or M for a single group whose offsets' value is never read):

* with scale generation (e4m3 D): D_row + SFD_row (32-column blocks of each row) and D_col +
  SFD_col (32-row blocks of each column), SFD_col in the global layout or per expert
  (``discrete_col_sfd``: each expert's region found from the offsets on the device);
* without: D_row only, the plain ``cvt.rn.satfinite`` conversion to e4m3 or e5m2.

Rows at or past the last group end, and the scale bytes that cover only them, keep their
bytes, as the reference leaves them. No torch; the caller owns buffers and streams.

Work split: one warp per tile of 32 rows x 128 columns (one D_col block high, one SFD_row
k-atom wide), four columns per lane: a warp loads 512 contiguous bytes of a row per
instruction and stores 128 contiguous FP8 bytes per row, for D_row and D_col alike. A row's
32-column block is 8 lanes (amax: 3 butterfly shuffles); a column's 32-row block is one lane
(amax: a loop over the tile's rows, held in registers for the second, D_col, pass).

The block rule is ``kernels.sm90.mx_rule``'s, which the SM90 kernel's quantizing epilogue
shares: ``quant.mx.quantize_blocks`` (docs/blockscaled.md) step for step in fp32, bit-exact
with it on the same fp32 values.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ...quant.sf_layout import ATOM_ELEMS
from ..sm90.mx_rule import (INF_BITS, RCP_E4M3_MAX, abs_bits, col_code, multiplier, row_code,
                           store_fp8)
from ..sm90.tile_walk import expert_of_row
from .config import QuantizeDConfig

WARPS = 4
THREADS = 32 * WARPS
#: a warp's tile: one 32-row D_col block high, one 128-column SFD_row k-atom wide
TILE_ROWS = 32
TILE_COLS = 128
_GMEM = cute.AddressSpace.gmem

_D_TYPES = {"e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}


# ------------------------------------------------------------------------------ the block rule

@cute.jit
def amax4_bits(v) -> Int32:
    """``abs_bits`` of the largest magnitude among a lane's four values (NaN wins)."""
    amax = abs_bits(v[0])
    for j in cutlass.range_constexpr(1, 4):
        amax = cutlass.max(amax, abs_bits(v[j]))
    return amax


# ------------------------------------------------------------------------------ the kernel

class QuantizeD:
    """The kernel of one :class:`QuantizeDConfig`: ``__call__(x, d_row, d_col, sfd_row,
    sfd_col, offsets, norm_const, m, two_n, groups, stream)`` on raw pointers (``x`` the fp32
    (M, 2N) matrix, 16-byte aligned; ``d_row``/``d_col`` (M, 2N) FP8 bytes, ``sfd_row``
    4-byte aligned; ``offsets`` the L int32 padded offsets, ``norm_const`` one fp32: both read
    on the device, neither with ``single_group`` and plain conversion). Without ``scales`` only
    ``x``, ``d_row`` and (unless ``single_group``) ``offsets`` are touched."""

    def __init__(self, cfg: QuantizeDConfig):
        cfg.check()
        self.cfg = cfg
        self.d_type = _D_TYPES[cfg.d]

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, d_row_ptr: cute.Pointer, d_col_ptr: cute.Pointer,
                 sfd_row_ptr: cute.Pointer, sfd_col_ptr: cute.Pointer, offs_ptr: cute.Pointer,
                 nc_ptr: cute.Pointer, m: Int32, two_n: Int32, groups: Int32, stream):
        stripes = (two_n + TILE_COLS - 1) // TILE_COLS
        tasks = (m // TILE_ROWS) * stripes
        grid = ((tasks + WARPS - 1) // WARPS, 1, 1)
        self.kernel(x_ptr, d_row_ptr, d_col_ptr, sfd_row_ptr, sfd_col_ptr, offs_ptr, nc_ptr, m,
                    two_n, groups, stripes, tasks).launch(grid=grid, block=[THREADS, 1, 1],
                                                           stream=stream)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, d_row_ptr: cute.Pointer, d_col_ptr: cute.Pointer,
               sfd_row_ptr: cute.Pointer, sfd_col_ptr: cute.Pointer, offs_ptr: cute.Pointer,
               nc_ptr: cute.Pointer, m: Int32, two_n: Int32, groups: Int32, stripes: Int32,
               tasks: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        task = bid * WARPS + tidx // 32
        if task < tasks:  # warp-uniform: every lane of a warp shares its task
            stripe = task % stripes
            r0 = (task // stripes) * TILE_ROWS
            offs = cute.make_tensor(offs_ptr, cute.make_layout(groups))
            if cutlass.const_expr(self.cfg.single_group):
                last = m
            else:
                last = offs[groups - 1]
            if r0 < last:  # rows past the last group end keep their bytes
                self._tile(x_ptr, d_row_ptr, d_col_ptr, sfd_row_ptr, sfd_col_ptr, offs, nc_ptr,
                           m, two_n, groups, stripes, stripe, r0, tidx % 32)

    @cute.jit
    def _tile(self, x_ptr, d_row_ptr, d_col_ptr, sfd_row_ptr, sfd_col_ptr, offs, nc_ptr, m,
              two_n, groups, stripes, stripe, r0, lane):
        """One warp's 32 x 128 tile at row r0, column stripe ``stripe``."""
        col0 = stripe * TILE_COLS + lane * 4
        # 2N is a multiple of 64: a 32-column block is all in or all out. Lanes past 2N hold
        # zeros, so their scale codes are 0: the byte of the layout's padding entries
        valid = col0 < two_n
        xs = cute.make_rmem_tensor((4, TILE_ROWS), Float32)
        xs.fill(0.0)
        if valid:
            for i in cutlass.range_constexpr(TILE_ROWS):
                src = cute.make_tensor(
                    cute.make_ptr(Float32, x_ptr.toint() + self._elem(r0 + i, col0, two_n) * 4,
                                  _GMEM, assumed_align=16), cute.make_layout(4))
                cute.autovec_copy(src, xs[None, i])
        if cutlass.const_expr(not self.cfg.scales):
            for i in cutlass.range_constexpr(TILE_ROWS):
                v = xs[None, i].load()
                amax = amax4_bits(v)
                if valid:
                    store_fp8(d_row_ptr, self._elem(r0 + i, col0, two_n), v, amax > INF_BITS,
                              self.d_type, 4)
        else:
            nc = cute.make_tensor(nc_ptr, cute.make_layout(1))[0]
            self._rows(xs, d_row_ptr, sfd_row_ptr, nc, two_n, stripes, stripe, r0, col0, lane,
                       valid)
            self._cols(xs, d_col_ptr, sfd_col_ptr, offs, nc, m, two_n, groups, stripes, stripe,
                       r0, col0, lane, valid)

    @cute.jit
    def _rows(self, xs, d_row_ptr, sfd_row_ptr, nc, two_n, stripes, stripe, r0, col0, lane,
              valid):
        """D_row and SFD_row of the tile: row i's block of lane group g (8 lanes, 32
        columns) is k-block 4 * stripe + g; the four codes of row i form one 4-byte word of
        SFD_row, which lane i stores."""
        word = Int32(0)
        for i in cutlass.range_constexpr(TILE_ROWS):
            v = xs[None, i].load()
            amax = amax4_bits(v)
            for k in cutlass.range_constexpr(3):  # the 8 lanes of the block
                amax = cutlass.max(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << k))
            code = row_code(amax, nc)
            if valid:
                # NaN products only where the block holds a NaN or an infinity
                store_fp8(d_row_ptr, self._elem(r0 + i, col0, two_n), v * multiplier(code, nc),
                          amax >= INF_BITS, self.d_type, 4)
            w = code << (8 * (lane // 8))
            w = w | cute.arch.shuffle_sync_bfly(w, offset=8)
            w = w | cute.arch.shuffle_sync_bfly(w, offset=16)
            if lane == i:
                word = w
        # row r = r0 + lane: atom r // 128, k-atom stripe, byte (r % 32) * 16 + ((r // 32) % 4) * 4
        r = r0 + lane
        off = ((r // 128) * stripes + stripe) * ATOM_ELEMS + lane * 16 + ((r // 32) % 4) * 4
        dst = cute.make_tensor(
            cute.make_ptr(Int32, sfd_row_ptr.toint() + cutlass.Int64(off), _GMEM, assumed_align=4),
            cute.make_layout(1))
        dst[0] = word

    @cute.jit
    def _cols(self, xs, d_col_ptr, sfd_col_ptr, offs, nc, m, two_n, groups, stripes, stripe,
              r0, col0, lane, valid):
        """D_col and SFD_col of the tile: column col0 + j's block is rows [r0, r0 + 32),
        k-block r0 // 32 of SFD_col (global), or (r0 - start) // 32 of its expert's region."""
        rcp_nc = Float32(RCP_E4M3_MAX) * nc
        mults = cute.make_rmem_tensor((4,), Float32)
        codes = cute.make_rmem_tensor((4,), Int32)
        special = False  # a column block with a NaN or an infinity
        for j in cutlass.range_constexpr(4):
            amax = abs_bits(xs[j, 0])
            for i in cutlass.range_constexpr(1, TILE_ROWS):
                amax = cutlass.max(amax, abs_bits(xs[j, i]))
            codes[j] = col_code(amax, rcp_nc)
            mults[j] = multiplier(codes[j], nc)
            special = special | (amax >= INF_BITS)
        if valid:
            mv = mults.load()
            for i in cutlass.range_constexpr(TILE_ROWS):
                store_fp8(d_col_ptr, self._elem(r0 + i, col0, two_n), xs[None, i].load() * mv,
                          special, self.d_type, 4)
        # the block's byte: column c at (c % 32) * 16 + ((c // 32) % 4) * 4 of its atom,
        # k-block r0 // 32 at byte (r0 // 32) % 4; c // 128 == stripe
        base = Int32(0)
        if cutlass.const_expr(self.cfg.discrete_col_sfd and not self.cfg.single_group):
            e = expert_of_row(offs, groups, r0)  # r0 lies below the last offset: e < L
            start = Int32(0)
            if e > 0:
                start = offs[e - 1]
            rk_e = (offs[e] - start) // 128  # the expert's 128-row atoms
            base = ((start // 128) * stripes + stripe * rk_e + (r0 - start) // 128) * ATOM_ELEMS
        else:
            # the global layout (and a single group's region, which is all of it): M // 128
            # row atoms per column atom
            base = (stripe * (m // 128) + r0 // 128) * ATOM_ELEMS
        for j in cutlass.range_constexpr(4):
            c = lane * 4 + j
            off = base + (c % 32) * 16 + (lane // 8) * 4 + (r0 // 32) % 4
            dst = cute.make_tensor(
                cute.make_ptr(cutlass.Uint8, sfd_col_ptr.toint() + cutlass.Int64(off), _GMEM,
                              assumed_align=1), cute.make_layout(1))
            dst[0] = cutlass.Uint8(codes[j])

    @cute.jit
    def _elem(self, r, c, two_n):
        """The element offset of (r, c) in a row-major (M, 2N) matrix, in 64 bits."""
        return cutlass.Int64(r) * cutlass.Int64(two_n) + cutlass.Int64(c)
