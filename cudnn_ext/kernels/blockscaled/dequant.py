"""Block-scaled operand -> BF16 on the device: one pass over an MXFP8 / NVFP4 / MXFP4 operand.

Owns the device form of ``cudnn_ext.quant.dequantize`` for the operands the Hopper kernel's
BF16 mainloop can take (docs/blockscaled.md): ``(G, rows, K)`` K-major elements (FP8
``e4m3``/``e5m2``, or e2m1 packed two per byte, element ``2j`` in the low nibble of byte
``j``), or FP8 elements stored N-major as ``(G, K, rows)`` (``DequantConfig.n_major``), and
their scales in the 6-D swizzled layout (512-byte atoms of 128 rows x 4 k-blocks, ``e8m0`` or
``e4m3``; blocks run along K in either storage), to a contiguous BF16 tensor in the operand's
own element order. Every product ``element x scale`` is exact in BF16 except where it leaves
BF16's range: above its largest finite value (e4m3 448 x 2^127, e2m1 6 x 2^127: inf) and below
its smallest subnormal (e5m2 2^-16 x 2^-127: rounded, to 0 at the extreme). No torch; the
caller (the block-scaled engine) owns buffers and streams.

One thread per 16 bytes of input (16 FP8 or 32 FP4 elements of one row: half a 32-element
block, or one or two FP4 blocks; N-major, 16 rows of one k, each with its own scale), with
its block scales (one byte each) and 32 or 64 bytes of BF16 out; neighbouring threads take
neighbouring chunks of a line, so a warp's loads are 512 contiguous bytes and its stores 1 or
2 KB. The N-major path has its own methods: the K-major FP4 kernel written over helpers shared
with it ran 1.6x slower on an H100 (421 against 257 us for 64 x 1024 x 4096 elements).

Decoding, all exact in fp32: FP8 elements with the hardware conversion; e2m1 from integer
fields (``2 x |v|`` is ``m`` for exponent 0, else ``(2 + m) << (e - 1)``); an e8m0 scale
``2^(c - 127)`` from its bit pattern (code 0 the subnormal 2^-127, 255 NaN); an e4m3 scale
with the hardware conversion. The multiply does not flush subnormals (``mul.rn.f32``).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ...quant.sf_layout import ATOM_ELEMS, ATOM_KBLOCKS, ATOM_ROWS
from .config import DequantConfig

THREADS = 256


_ELEM_TYPES = {"e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}


class Dequantizer:
    """The kernel of one :class:`DequantConfig`: ``__call__(q, sf, out, offs, rows, k,
    groups, stream)`` on raw pointers (``q`` bytes, ``sf`` bytes, ``out`` bf16, ``offs`` the
    int32 padded offsets, read with ``tables`` only); K must be a multiple of 32 (whole
    chunks and blocks: the engine declines other K)."""

    def __init__(self, cfg: DequantConfig):
        cfg.check()
        self.cfg = cfg

    @cute.jit
    def __call__(self, q_ptr: cute.Pointer, sf_ptr: cute.Pointer, out_ptr: cute.Pointer,
                 offs_ptr: cute.Pointer, rows: Int32, k: Int32, groups: Int32, stream):
        chunks, total = self.chunks_and_total(rows, k, groups)
        grid = ((total + THREADS - 1) // THREADS, 1, 1)
        self.kernel(q_ptr, sf_ptr, out_ptr, offs_ptr, rows, k, chunks, total).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream)

    def chunk_elems(self) -> int:
        """Logical elements of one thread's chunk: 16 bytes of input."""
        return 32 if self.cfg.fp4 else 16

    def chunks_and_total(self, rows, k, groups):
        """(chunks per line, threads) of ``groups`` x ``rows`` x ``k`` elements: a chunk runs
        along the contiguous dimension, K (K-major) or the rows (N-major)."""
        n_major = cutlass.const_expr(self.cfg.n_major)
        chunks = (rows if n_major else k) // self.chunk_elems()
        return chunks, groups * (k if n_major else rows) * chunks

    @cute.kernel
    def kernel(self, q_ptr: cute.Pointer, sf_ptr: cute.Pointer, out_ptr: cute.Pointer,
               offs_ptr: cute.Pointer, rows: Int32, k: Int32, chunks: Int32, total: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        self.thread(q_ptr, sf_ptr, out_ptr, offs_ptr, rows, k, chunks, total, bid * THREADS + tidx)

    @cute.jit
    def thread(self, q_ptr: cute.Pointer, sf_ptr: cute.Pointer, out_ptr: cute.Pointer,
               offs_ptr: cute.Pointer, rows: Int32, k: Int32, chunks: Int32, total: Int32, t: Int32):
        """Thread ``t``'s chunk of the operand (none past ``total``)."""
        if cutlass.const_expr(self.cfg.n_major):
            if t < total:
                self._n_major_thread(q_ptr, sf_ptr, out_ptr, offs_ptr, rows, k, chunks, t)
        elif t < total:
            c = t % chunks
            r = (t // chunks) % rows
            g = t // (chunks * rows)
            e0 = cutlass.Int64(c * self.chunk_elems())  # the chunk's first element in its row
            row = cutlass.Int64(g * rows + r) * cutlass.Int64(k)  # out's (and dense q's) row
            if cutlass.const_expr(self.cfg.tables):
                offs = cute.make_tensor(offs_ptr, cute.make_layout(g + 1))
                start = Int32(0)
                if g > 0:
                    start = offs[g - 1]
                if offs[g] > start:  # an expert with rows: its pointers are valid
                    q_tab = cute.make_tensor(cute.recast_ptr(q_ptr, dtype=cutlass.Int64),
                                             cute.make_layout(g + 1))
                    sf_tab = cute.make_tensor(cute.recast_ptr(sf_ptr, dtype=cutlass.Int64),
                                              cute.make_layout(g + 1))
                    self._chunk(q_tab[g], cutlass.Int64(r) * cutlass.Int64(k) + e0, sf_tab[g],
                                0, r, rows, k, c, out_ptr, row + e0)
            else:
                self._chunk(q_ptr.toint(), row + e0, sf_ptr.toint(), g, r, rows, k, c, out_ptr,
                            row + e0)

    @cute.jit
    def _chunk(self, q_base, q_elem, sf_base, g, r, rows, k, c, out_ptr: cute.Pointer, out_elem):
        """One thread's chunk: elements from logical element ``q_elem`` of the operand at
        ``q_base``, the scales of its block(s) (row r of group g of the layout at
        ``sf_base``), BF16 out at element ``out_elem`` of ``out``."""
        v = self.cfg.sf_vec
        ch = self.chunk_elems()
        rmn = (rows + ATOM_ROWS - 1) // ATOM_ROWS
        quads = (k // v + ATOM_KBLOCKS - 1) // ATOM_KBLOCKS  # k-block atoms per row (RK)
        vals = self._load(q_base, q_elem)
        res = cute.make_rmem_tensor((ch,), Float32)
        for j in cutlass.range_constexpr(max(1, ch // v)):  # the blocks the chunk covers
            kb = (c * ch) // v + j
            off = ((g * rmn * quads + (r // ATOM_ROWS) * quads + kb // ATOM_KBLOCKS) * ATOM_ELEMS
                   + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % ATOM_KBLOCKS)
            scale = self._scale(cute.make_tensor(
                cute.make_ptr(cutlass.Uint8, sf_base + cutlass.Int64(off), cute.AddressSpace.gmem,
                              assumed_align=1), cute.make_layout(1)))
            for i in cutlass.range_constexpr(min(ch, v)):
                res[j * v + i] = vals[j * v + i] * scale
        dst = cute.make_tensor(
            cute.make_ptr(cutlass.BFloat16, out_ptr.toint() + out_elem * 2,
                          cute.AddressSpace.gmem, assumed_align=32),
            cute.make_layout(ch))
        dst.store(res.load().to(cutlass.BFloat16))

    @cute.jit
    def _n_major_thread(self, q_ptr, sf_ptr, out_ptr, offs_ptr, rows, k, chunks, t):
        """Thread ``t`` of an N-major operand ``(G, K, rows)``: chunk ``c`` of k-line ``kk`` of
        group ``g`` (``ch`` consecutive rows of one k), the same element offsets in q and out."""
        c = t % chunks
        kk = (t // chunks) % k
        g = t // (chunks * k)
        elem = cutlass.Int64(kk) * cutlass.Int64(rows) + cutlass.Int64(c * self.chunk_elems())
        group0 = cutlass.Int64(g) * cutlass.Int64(rows) * cutlass.Int64(k)
        if cutlass.const_expr(self.cfg.tables):
            offs = cute.make_tensor(offs_ptr, cute.make_layout(g + 1))
            start = Int32(0)
            if g > 0:
                start = offs[g - 1]
            if offs[g] > start:  # an expert with rows: its pointers are valid
                q_tab = cute.make_tensor(cute.recast_ptr(q_ptr, dtype=cutlass.Int64), cute.make_layout(g + 1))
                sf_tab = cute.make_tensor(cute.recast_ptr(sf_ptr, dtype=cutlass.Int64), cute.make_layout(g + 1))
                self._chunk_n_major(q_tab[g], elem, sf_tab[g], 0, kk, c, rows, k, out_ptr, group0 + elem)
        else:
            self._chunk_n_major(q_ptr.toint(), group0 + elem, sf_ptr.toint(), g, kk, c, rows, k, out_ptr,
                                group0 + elem)

    @cute.jit
    def _chunk_n_major(self, q_base, q_elem, sf_base, g, kk, c, rows, k, out_ptr: cute.Pointer, out_elem):
        """One thread's N-major chunk: ``ch`` consecutive rows ``c * ch ..`` of k ``kk``, each
        times the scale of its own row's K block ``kk // sf_vec`` (group g of the layout at
        ``sf_base``), BF16 out at element ``out_elem`` of ``out``."""
        v = self.cfg.sf_vec
        ch = self.chunk_elems()
        rmn = (rows + ATOM_ROWS - 1) // ATOM_ROWS
        quads = (k // v + ATOM_KBLOCKS - 1) // ATOM_KBLOCKS
        vals = self._load(q_base, q_elem)
        res = cute.make_rmem_tensor((ch,), Float32)
        for i in cutlass.range_constexpr(ch):
            r = c * ch + i
            kb = kk // v
            off = ((g * rmn * quads + (r // ATOM_ROWS) * quads + kb // ATOM_KBLOCKS) * ATOM_ELEMS
                   + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % ATOM_KBLOCKS)
            scale = self._scale(cute.make_tensor(
                cute.make_ptr(cutlass.Uint8, sf_base + cutlass.Int64(off), cute.AddressSpace.gmem,
                              assumed_align=1), cute.make_layout(1)))
            res[i] = vals[i] * scale
        dst = cute.make_tensor(
            cute.make_ptr(cutlass.BFloat16, out_ptr.toint() + out_elem * 2,
                          cute.AddressSpace.gmem, assumed_align=32),
            cute.make_layout(ch))
        dst.store(res.load().to(cutlass.BFloat16))

    @cute.jit
    def _scale(self, sf1):
        """The scale byte ``sf1[0]`` as fp32."""
        if cutlass.const_expr(self.cfg.sf == "e4m3"):
            pair = cute.make_rmem_tensor((2,), cutlass.Uint8)
            pair[0] = sf1[0]
            pair[1] = sf1[0]
            f = pair.load().bitcast(cutlass.Float8E4M3FN).to(Float32)
            return f[0]
        else:
            # (the byte widens sign-extended: keep its 8 bits)
            return self._e8m0(Int32(sf1[0]) & 255)

    @cute.jit
    def _e8m0(self, c: Int32):
        """2^(c - 127) for code c, from its fp32 bit pattern: code 0 is the subnormal 2^-127
        (0x00400000), code 255 NaN."""
        bits = c << 23
        if c == 0:
            bits = Int32(0x00400000)
        if c == 255:
            bits = Int32(0x7FC00000)
        return bits.bitcast(Float32)

    @cute.jit
    def _load(self, q_base, elem0):
        """The chunk's 16 bytes from logical element ``elem0`` (a 64-bit offset) of the
        operand at address ``q_base``, decoded to fp32."""
        ch = self.chunk_elems()
        out = cute.make_rmem_tensor((ch,), Float32)
        if cutlass.const_expr(self.cfg.fp4):
            src = cute.make_tensor(
                cute.make_ptr(Int32, q_base + elem0 // 2, cute.AddressSpace.gmem,
                              assumed_align=16),
                cute.make_layout(4))
            w = cute.make_rmem_tensor((4,), Int32)
            cute.autovec_copy(src, w)
            for i in cutlass.range_constexpr(ch):
                out[i] = self._e2m1((w[i // 8] >> (4 * (i % 8))) & 15)
        else:
            et = _ELEM_TYPES[self.cfg.elem]
            src = cute.make_tensor(
                cute.make_ptr(et, q_base + elem0, cute.AddressSpace.gmem, assumed_align=16),
                cute.make_layout(ch))
            frag = cute.make_rmem_tensor((ch,), et)
            cute.autovec_copy(src, frag)
            out.store(frag.load().to(Float32))
        return out

    @cute.jit
    def _e2m1(self, nib: Int32):
        """An e2m1 code (s e1 e0 m) as fp32: 2|v| = m (e = 0) or (2 + m) << (e - 1)."""
        e = (nib >> 1) & 3
        m = nib & 1
        twice = m
        if e > 0:
            twice = (m + 2) << (e - 1)
        mag = Float32(twice) * Float32(0.5)
        return -mag if (nib & 8) != 0 else mag


class DequantPair:
    """Two dequantizers in one launch (:class:`DequantPairConfig`): ``__call__(qa, sfa, outa,
    qb, sfb, outb, offs, rows_a, rows_b, k, groups_b, stream)``; A is one dense K-major group
    of ``rows_a`` rows, B ``groups_b`` groups of ``rows_b`` (``offs``: B's offsets, read with
    tables only). The first blocks take A's chunks, the rest B's, each thread as the single
    dequantizer's would."""

    def __init__(self, cfg):
        cfg.check()
        self.cfg = cfg
        self.a = Dequantizer(cfg.a)
        self.b = Dequantizer(cfg.b)

    @cute.jit
    def __call__(self, qa: cute.Pointer, sfa: cute.Pointer, outa: cute.Pointer, qb: cute.Pointer,
                 sfb: cute.Pointer, outb: cute.Pointer, offs_ptr: cute.Pointer, rows_a: Int32,
                 rows_b: Int32, k: Int32, groups_b: Int32, stream):
        chunks_a, total_a = self.a.chunks_and_total(rows_a, k, Int32(1))
        chunks_b, total_b = self.b.chunks_and_total(rows_b, k, groups_b)
        blocks_a = (total_a + THREADS - 1) // THREADS
        grid = (blocks_a + (total_b + THREADS - 1) // THREADS, 1, 1)
        self.kernel(qa, sfa, outa, qb, sfb, outb, offs_ptr, rows_a, rows_b, k, chunks_a, total_a,
                    chunks_b, total_b, blocks_a).launch(grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, qa: cute.Pointer, sfa: cute.Pointer, outa: cute.Pointer, qb: cute.Pointer,
               sfb: cute.Pointer, outb: cute.Pointer, offs_ptr: cute.Pointer, rows_a: Int32,
               rows_b: Int32, k: Int32, chunks_a: Int32, total_a: Int32, chunks_b: Int32,
               total_b: Int32, blocks_a: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        if bid < blocks_a:
            self.a.thread(qa, sfa, outa, offs_ptr, rows_a, k, chunks_a, total_a, bid * THREADS + tidx)
        else:
            self.b.thread(qb, sfb, outb, offs_ptr, rows_b, k, chunks_b, total_b,
                          (bid - blocks_a) * THREADS + tidx)
