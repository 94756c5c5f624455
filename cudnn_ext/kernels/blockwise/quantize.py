"""Values -> e4m3 with fp32 scales per block on the device: the fp8_blockwise recipe's
quantizer (``quant.blockwise.quantize_fp8_blockwise``, bit for bit).

Reads a bf16, fp16 or fp32 ``(rows, K)`` matrix per group (row stride ``ld``, group stride
``gstride``, K contiguous); writes, for each block shape of its config, the e4m3 values
``(rows, K)`` per group (contiguous, group after group) and the fp32 scales of
``quant.blockwise.scale_shape``, MN-major, group after group. ``masked``: rows at or past the
last int32 offset, and the 128x1 scales of blocks starting there, keep their bytes. No torch;
the caller owns buffers and streams.

Work split: a CTA of four warps owns one 128 x 128 tile (one 128x128 block, 128 of the 128x1
blocks, 128 rows of 1x128 blocks); each warp holds 32 rows, four columns per lane, in
registers (a warp reads 32 x 128 contiguous values row by row and stores 128 contiguous bytes
per row). A row's block is the whole warp (a butterfly reduce-scatter: each lane ends with one
row's amax and scale); a column's block is one lane of each warp (a loop over its 32 rows, then
the four warps' maxima through shared memory); the tile's block is all of it.

The scale rule is ``quant.blockwise``'s, step for step in fp32: amax as the integer max of the
magnitudes' bit patterns (non-negative fp32 orders like its bits and every NaN pattern lies
above +inf, so a NaN propagates as ``torch.amax`` does); ``amax / 448`` with the IEEE division;
the power-of-two round-up from the bit fields; the 2^-126 floor; then each value's IEEE
division by its scale and the hardware's e4m3 conversion (round to nearest even, saturating),
a NaN stored as 0x7F and a NaN scale as 0x7FC00000 (the reference's canonical NaNs).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ..sm90.mx_rule import abs_bits
from .config import LANE_COLS, TILE, BlockwiseQuantConfig

WARPS = 4
THREADS = 32 * WARPS
ROWS_PER_WARP = TILE // WARPS
_E4M3_MAX = 448.0
_INF_BITS = 0x7F800000
_NAN_BITS = 0x7FC00000
_FLOOR_BITS = 0x00800000  # 2^-126, fp32's smallest normal: the scale floor
_E4M3_NAN = 0x7F
_GMEM = cute.AddressSpace.gmem

_SRC_TYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": Float32}


@cute.jit
def block_scale(amax: Int32, pow2: cutlass.Constexpr) -> Float32:
    """The scale of a block whose largest magnitude has the bit pattern ``amax``:
    ``quant.blockwise.blockwise_scales``, line by line."""
    s = amax.bitcast(Float32) / Float32(_E4M3_MAX)
    bits = s.bitcast(Int32)
    if cutlass.const_expr(pow2):
        if amax < _INF_BITS:  # finite: round a mantissa up to the next exponent
            if bits & 0x7FFFFF != 0:
                bits = (bits & 0x7F800000) + 0x00800000
    if bits < _FLOOR_BITS:  # zero and subnormal scales (s >= 0: bits order like values)
        bits = Int32(_FLOOR_BITS)
    if amax > _INF_BITS:
        bits = Int32(_NAN_BITS)
    return bits.bitcast(Float32)


def _bitrev5_const(i: int) -> int:
    """i's five bits reversed: the lane holding row i's block after the reduce-scatter."""
    return int(f"{i:05b}"[::-1], 2)


@cute.jit
def _bitrev5(lane: Int32) -> Int32:
    """``_bitrev5_const`` of a runtime lane."""
    return (((lane & 1) << 4) | ((lane & 2) << 2) | (lane & 4) | ((lane & 8) >> 2) | ((lane & 16) >> 4))


class QuantizeBlockwise:
    """The kernel of one :class:`BlockwiseQuantConfig`: ``__call__(x, q_a, s_a, q_b, s_b,
    offsets, rows, k, ld, gstride, groups, n_offsets, stream)`` on raw pointers (``q_a``/``s_a``
    the first block shape's values and scales, ``q_b``/``s_b`` the second's; ``offsets`` read
    only when ``masked``)."""

    def __init__(self, cfg: BlockwiseQuantConfig):
        cfg.check()
        self.cfg = cfg
        self.src_type = _SRC_TYPES[cfg.src]

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, qa_ptr: cute.Pointer, sa_ptr: cute.Pointer,
                 qb_ptr: cute.Pointer, sb_ptr: cute.Pointer, offs_ptr: cute.Pointer, rows: Int32,
                 k: Int32, ld: Int32, gstride: Int32, groups: Int32, n_offs: Int32, stream):
        grid = ((k + TILE - 1) // TILE, (rows + TILE - 1) // TILE, groups)
        self.kernel(x_ptr, qa_ptr, sa_ptr, qb_ptr, sb_ptr, offs_ptr, rows, k, ld, gstride,
                    n_offs).launch(grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x_ptr: cute.Pointer, qa_ptr: cute.Pointer, sa_ptr: cute.Pointer,
               qb_ptr: cute.Pointer, sb_ptr: cute.Pointer, offs_ptr: cute.Pointer, rows: Int32,
               k: Int32, ld: Int32, gstride: Int32, n_offs: Int32):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        sx, by, g = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        col0 = sx * TILE + lane * LANE_COLS
        valid = col0 < k  # K % 4 == 0: a lane's four columns are all in or all out
        rbase = by * TILE + warp * ROWS_PER_WARP
        limit = rows  # rows below it are written
        if cutlass.const_expr(cfg.masked):
            end = cute.make_tensor(offs_ptr, cute.make_layout(n_offs))[n_offs - 1]
            limit = cutlass.min(rows, end)

        xs = cute.make_rmem_tensor((LANE_COLS, ROWS_PER_WARP), Float32)
        xs.fill(0.0)  # rows past the matrix hold zeros: a block's amax is unchanged
        if valid:
            for i in cutlass.range_constexpr(ROWS_PER_WARP):
                if rbase + i < rows:
                    self._load(x_ptr, g, rbase + i, col0, ld, gstride, xs, i)

        smem = None
        if cutlass.const_expr(not cfg.has((1, 128)) or len(cfg.blocks) > 1):
            # the four warps' column (or tile) maxima
            smem = cutlass.memory.SmemAllocator().allocate_tensor(
                Int32, cute.make_layout((TILE, WARPS)), 16)
        for idx in cutlass.range_constexpr(len(cfg.blocks)):
            q_ptr, s_ptr = (qa_ptr, sa_ptr) if idx == 0 else (qb_ptr, sb_ptr)
            block = cfg.blocks[idx]
            if cutlass.const_expr(block == (1, 128)):
                self._rows(xs, q_ptr, s_ptr, g, sx, rbase, col0, lane, valid, rows, k, limit)
            elif cutlass.const_expr(block == (128, 1)):
                self._cols(xs, smem, q_ptr, s_ptr, g, by, rbase, col0, warp, lane, valid, rows, k,
                           limit)
            else:
                self._tile(xs, smem, q_ptr, s_ptr, g, sx, by, rbase, col0, warp, lane, valid,
                           rows, k, limit)

    @cute.jit
    def _load(self, x_ptr, g, r, col0, ld, gstride, xs, i):
        """Row r's four source values from column col0 of group g, as fp32, into xs[:, i]."""
        elem = (cutlass.Int64(g) * cutlass.Int64(gstride) + cutlass.Int64(r) * cutlass.Int64(ld)
                + cutlass.Int64(col0))
        width = self.src_type.width // 8
        src = cute.make_tensor(
            cute.make_ptr(self.src_type, x_ptr.toint() + elem * width, _GMEM,
                          assumed_align=LANE_COLS * width),
            cute.make_layout(LANE_COLS))
        frag = cute.make_rmem_tensor((LANE_COLS,), self.src_type)
        cute.autovec_copy(src, frag)
        xs[None, i].store(frag.load().to(Float32))

    @cute.jit
    def _rows(self, xs, q_ptr, s_ptr, g, sx, rbase, col0, lane, valid, rows, k, limit):
        """1x128 blocks: row i's block is the warp's 128 columns. A butterfly reduce-scatter
        of the 32 rows' lane maxima (31 shuffles; each level a lane keeps half the rows and
        takes its partner's other half) leaves lane L with the amax of row bitrev5(L); it
        computes that row's scale and stores it (scales (rows, K/128) per group, MN-major:
        a warp's 32 scales are contiguous), and each row's quotients take the scale from
        its lane (one indexed shuffle per row)."""
        vals = []
        for i in cutlass.range_constexpr(ROWS_PER_WARP):
            amax = abs_bits(xs[0, i])
            for j in cutlass.range_constexpr(1, LANE_COLS):
                amax = cutlass.max(amax, abs_bits(xs[j, i]))
            vals.append(amax)
        for lvl in cutlass.range_constexpr(5):
            half = len(vals) // 2
            upper = ((lane >> lvl) & 1) == 1
            nxt = []
            for i in cutlass.range_constexpr(half):
                lo, hi = vals[i], vals[i + half]
                send = Int32(cutlass.select_(upper, lo, hi))
                keep = Int32(cutlass.select_(upper, hi, lo))
                nxt.append(cutlass.max(keep, cute.arch.shuffle_sync_bfly(send, offset=1 << lvl)))
            vals = nxt
        mine = block_scale(vals[0], self.cfg.pow2_scales)  # the scale of row bitrev5(lane)
        r = rbase + _bitrev5(lane)
        if r < limit:
            kb = (k + TILE - 1) // TILE
            off = cutlass.Int64(g) * cutlass.Int64(rows) * cutlass.Int64(kb) + cutlass.Int64(sx * rows + r)
            self._store_scale(s_ptr, off, mine)
        for i in cutlass.range_constexpr(ROWS_PER_WARP):
            s = cute.arch.shuffle_sync(mine, _bitrev5_const(i))
            r = rbase + i
            if valid and r < limit:
                # a NaN quotient only where the scale is NaN or infinite (a block holding a
                # NaN or an infinity): the scale is non-negative, so its bits say it
                self._store(q_ptr, g, r, col0, rows, k, xs[None, i].load(), s, s, s, s,
                            s.bitcast(Int32) >= _INF_BITS)

    @cute.jit
    def _cols(self, xs, smem, q_ptr, s_ptr, g, by, rbase, col0, warp, lane, valid, rows, k,
              limit):
        """128x1 blocks: column c's block is one lane of each warp; warp 0 stores the scales
        (scales (ceil(rows/128), K) per group, MN-major)."""
        for j in cutlass.range_constexpr(LANE_COLS):
            amax = abs_bits(xs[j, 0])
            for i in cutlass.range_constexpr(1, ROWS_PER_WARP):
                amax = cutlass.max(amax, abs_bits(xs[j, i]))
            smem[lane * LANE_COLS + j, warp] = amax
        cute.arch.sync_threads()
        sc = cute.make_rmem_tensor((LANE_COLS,), Float32)
        special = False  # a column block holding a NaN or an infinity
        for j in cutlass.range_constexpr(LANE_COLS):
            amax = smem[lane * LANE_COLS + j, 0]
            for w in cutlass.range_constexpr(1, WARPS):
                amax = cutlass.max(amax, smem[lane * LANE_COLS + j, w])
            sc[j] = block_scale(amax, self.cfg.pow2_scales)
            special = special | (amax >= _INF_BITS)
        cute.arch.sync_threads()  # the buffer is free for another block shape
        if valid:
            for i in cutlass.range_constexpr(ROWS_PER_WARP):
                r = rbase + i
                if r < limit:
                    self._store(q_ptr, g, r, col0, rows, k, xs[None, i].load(), sc[0], sc[1],
                                sc[2], sc[3], special)
        if warp == 0 and valid and by * TILE < limit:
            rb = (rows + TILE - 1) // TILE
            base = cutlass.Int64(g) * cutlass.Int64(rb) * cutlass.Int64(k) + cutlass.Int64(by)
            for j in cutlass.range_constexpr(LANE_COLS):
                self._store_scale(s_ptr, base + cutlass.Int64(col0 + j) * cutlass.Int64(rb), sc[j])

    @cute.jit
    def _tile(self, xs, smem, q_ptr, s_ptr, g, sx, by, rbase, col0, warp, lane, valid, rows, k,
              limit):
        """128x128 blocks: the CTA's tile; thread 0 stores the scale (scales (ceil(rows/128),
        K/128) per group, MN-major)."""
        amax = Int32(0)
        for i in cutlass.range_constexpr(ROWS_PER_WARP):
            for j in cutlass.range_constexpr(LANE_COLS):
                amax = cutlass.max(amax, abs_bits(xs[j, i]))
        for sh in cutlass.range_constexpr(5):
            amax = cutlass.max(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << sh))
        if lane == 0:
            smem[0, warp] = amax
        cute.arch.sync_threads()
        amax = smem[0, 0]
        for w in cutlass.range_constexpr(1, WARPS):
            amax = cutlass.max(amax, smem[0, w])
        s = block_scale(amax, self.cfg.pow2_scales)
        if valid:
            for i in cutlass.range_constexpr(ROWS_PER_WARP):
                r = rbase + i
                if r < limit:
                    self._store(q_ptr, g, r, col0, rows, k, xs[None, i].load(), s, s, s, s,
                                amax >= _INF_BITS)
        if warp == 0 and lane == 0 and by * TILE < limit:
            rb = (rows + TILE - 1) // TILE
            kb = (k + TILE - 1) // TILE
            off = cutlass.Int64(g) * cutlass.Int64(rb) * cutlass.Int64(kb) + cutlass.Int64(sx * rb + by)
            self._store_scale(s_ptr, off, s)

    @cute.jit
    def _store(self, q_ptr, g, r, col0, rows, k, v, s0, s1, s2, s3, special):
        """Four values, each divided by its scale, as e4m3 at (r, col0) of group g's
        contiguous (rows, K) values: one 4-byte store. ``special``: a quotient may be NaN
        (the block holds a NaN or an infinity); a NaN is stored as 0x7F."""
        d = cute.make_rmem_tensor((LANE_COLS,), Float32)
        d[0] = v[0] / s0
        d[1] = v[1] / s1
        d[2] = v[2] / s2
        d[3] = v[3] / s3
        q = cute.make_rmem_tensor((LANE_COLS,), cutlass.Float8E4M3FN)
        q.store(d.load().to(cutlass.Float8E4M3FN))
        if special:
            q8 = cute.recast_tensor(q, cutlass.Uint8)
            for j in cutlass.range_constexpr(LANE_COLS):
                if d[j] != d[j]:
                    q8[j] = cutlass.Uint8(_E4M3_NAN)
        elem = (cutlass.Int64(g) * cutlass.Int64(rows) + cutlass.Int64(r)) * cutlass.Int64(k) + cutlass.Int64(col0)
        dst = cute.make_tensor(
            cute.make_ptr(cutlass.Float8E4M3FN, q_ptr.toint() + elem, _GMEM, assumed_align=4),
            cute.make_layout(LANE_COLS))
        cute.autovec_copy(q, dst)

    @cute.jit
    def _store_scale(self, s_ptr, off, s: Float32):
        dst = cute.make_tensor(
            cute.make_ptr(Float32, s_ptr.toint() + off * 4, _GMEM, assumed_align=4),
            cute.make_layout(1))
        dst[0] = s

