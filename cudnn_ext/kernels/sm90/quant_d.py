"""Quantized D from the epilogue's fp32 values (a mixin of :class:`~.kernel.GroupedDgluSm90`):
the block-scaled contract's FP8 outputs written by the kernel itself, with no fp32 D in memory.

The epilogue hands over one half-block at a time: a 64-row half of a warpgroup's rows and
one 32-column block j (gate columns 2 n0 + 64 j + [0, 32), up columns + 32), whose dgate
and dup values a thread holds for its 2 rows and 8 columns (4 WGMMA groups x a column pair):

* plain conversion (FP8 D without ``d_scales``): each pair to D's format;
* ``d_scales`` (e4m3): D_row/SFD_row: a row's 32 gate (or up) columns are one block, spread
  over the 4 lanes of a quad (amax: 8 values, 2 butterfly shuffles); lane 0 of the quad
  stores the block's SFD_row byte. D_col/SFD_col: a column's 32-row block is the rows of a
  warp pair (warps 0-1 or 2-3 of the warpgroup: 16 rows each, 8 lanes x 2 rows per column);
  amax over a thread's 2 rows, 3 shuffles across the warp, then through shared memory with
  the pair (``mx_exchange_ints``, one named barrier per pair, half-block and gate/up,
  double-buffered so a warp may run a block ahead); the even warp's lanes 0-3 store the
  columns' codes. Gate first, then up: half the temporaries at a time. Each scale byte is
  stored as soon as its code is known (fewer live registers: no spills). A block past 2N
  inside the last column atom stores no D but code 0 into the layouts' padding entries, as
  the reference's quantizer writes them.

The block rule is ``mx_rule``'s: bit-exact with the reference's quantizers on the same fp32
values (the values the kernel writes as fp32 D otherwise).
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32

from ...quant.sf_layout import ATOM_ELEMS, ATOM_ROWS
from .config import MX_PAIR_BARRIER
from .mx_rule import INF_BITS, RCP_E4M3_MAX, abs_bits, col_code, multiplier, row_code, store_fp8

_GMEM = cute.AddressSpace.gmem


def sfd_row_offset(row, kb, stripes):
    """Byte of SFD_row's code of row ``row``, 32-column block ``kb`` (along 2N): row atom
    row // 128 of ``stripes`` column atoms, byte (row % 32) * 16 + ((row // 32) % 4) * 4 +
    kb % 4 inside it (``quant.sf_layout``). Plain arithmetic: traced by the kernel, evaluated
    on ints by the CPU tests."""
    return (((row // ATOM_ROWS) * stripes + kb // 4) * ATOM_ELEMS + (row % 32) * 16
            + ((row // 32) % 4) * 4 + kb % 4)


def sfd_col_offset(col, rb, stripes, row_atoms, start=None, expert_atoms=None):
    """Byte of SFD_col's code of column ``col`` (along 2N), 32-row block ``rb`` (global):
    column atom col // 128 of ``stripes``, each ``row_atoms`` (M // 128) row atoms long, byte
    (col % 32) * 16 + ((col // 32) % 4) * 4 + rb % 4; or (``discrete_col_sfd``) inside the
    region of the expert whose rows start at ``start`` (its ``expert_atoms`` 128-row atoms),
    which begins at atom (start // 128) * stripes. Plain arithmetic, as ``sfd_row_offset``."""
    if start is None:
        atom = (col // 128) * row_atoms + rb // 4
    else:
        atom = ((start // ATOM_ROWS) * stripes + (col // 128) * expert_atoms
                + (rb * 32 - start) // ATOM_ROWS)
    return atom * ATOM_ELEMS + (col % 32) * 16 + ((col // 32) % 4) * 4 + rb % 4


class MxOutputs(NamedTuple):
    """(``d_scales``) The quantizing epilogue's operands beside D_row (``EpilogueParams.mD``):
    D_col (M, 2N), the SFD_row and SFD_col byte buffers (the scale-factor layout,
    ``quant.sf_layout``), norm_const (1,), the warp pairs' exchange (warpgroup, warp, buffer,
    block column) in shared memory, and the padded offsets (per-expert SFD_col regions)."""

    mDcol: object
    sfd_row: object
    sfd_col: object
    mNc: object
    sMx: object
    mOffs: object


class QuantDMixin:
    """``quant_d_half``: the FP8 D outputs of one half-block (see the module docstring)."""

    def _sf_stripes(self) -> int:
        """128-column atoms along 2N of SFD_row's k-blocks and of SFD_col's rows (the last one
        partly padding when 2N % 128 != 0)."""
        return (2 * self.cfg.n + 127) // 128

    @staticmethod
    def _d_col(n0, j: int, kind: int, c0_loc, group: int):
        """D's column (along 2N) of group ``group``'s first column pair in block j, gate
        (``kind`` 0) or up (1): the tile's 2 n0 + 64 j, then 32 kind + the thread's pair."""
        return 2 * n0 + 64 * j + 32 * kind + c0_loc + 8 * group

    @cute.jit
    def _fp8_pair(self, mT: cute.Tensor, row, col, x0: Float32, x1: Float32, special):
        """x0, x1 to D's FP8 format at (row, col), (row, col + 1) of the row-major (M, 2N)
        byte matrix ``mT`` (col even: one 2-byte store)."""
        frag = cute.make_rmem_tensor((2,), Float32)
        frag[0] = x0
        frag[1] = x1
        elem = cutlass.Int64(row) * cutlass.Int64(2 * self.cfg.n) + cutlass.Int64(col)
        store_fp8(mT.iterator, elem, frag.load(), special, self.d_dtype, 2)

    @cute.jit
    def quant_d_half(self, douts, first, j: cutlass.Constexpr, row0, n0, valid, wg, tidx,
                     expert, mD, mx, use):
        """D of one half-block of block ``j``: ``douts[pi]`` the ((dgate, dup), (dgate, dup)) of
        the thread's pair pi (``_pair_values`` order: group pi // 2, row bit pi % 2);
        ``first``: (row in the tile, column in the block) of pair 0 (pair pi's are 8 rows
        down for row bit 1 and 8 columns right per group: the WGMMA fragment); ``valid``:
        the block lies inside 2N (else nothing is stored; every lane still takes part in the
        shuffles and the pair's barrier); ``use``: the warpgroup's count of half-blocks so
        far (the exchange buffer's parity)."""
        r0_loc, c0_loc = first
        if cutlass.const_expr(not self.cfg.d_scales):
            if valid:
                for pi in cutlass.range_constexpr(8):
                    row = row0 + r0_loc + 8 * (pi % 2)
                    for kind in cutlass.range_constexpr(2):
                        x0 = douts[pi][0][kind]
                        x1 = douts[pi][1][kind]
                        col = self._d_col(n0, j, kind, c0_loc, pi // 2)
                        self._fp8_pair(mD, row, col, x0, x1, (x0 != x0) | (x1 != x1))
        else:
            nc = mx.mNc[0]
            # gate, then up: half the temporaries live at a time (fewer registers)
            for kind in cutlass.range_constexpr(2):
                self._mx_rows(douts, r0_loc, c0_loc, j, kind, row0, n0, valid, tidx, mD, mx, nc)
                self._mx_cols(douts, r0_loc, c0_loc, j, kind, row0, n0, valid, wg, tidx, expert,
                              mx, nc, use)

    @cute.jit
    def _mx_rows(self, douts, r0_loc, c0_loc, j: cutlass.Constexpr, kind: cutlass.Constexpr,
                 row0, n0, valid, tidx, mD, mx, nc):
        """D_row and SFD_row of the gate (``kind`` 0) or up (1) block of the thread's 2 rows."""
        lane = tidx % 32
        stripes = self._sf_stripes()
        kb = (2 * n0 + 64 * j) // 32 + kind  # the block's index along 2N
        for r in cutlass.range_constexpr(2):
            row = row0 + (r0_loc + 8 * r)
            vals = [douts[2 * i + r][c][kind] for i in range(4) for c in range(2)]
            amax = abs_bits(vals[0])
            for q in cutlass.range_constexpr(1, len(vals)):
                amax = cutlass.max(amax, abs_bits(vals[q]))
            for s in cutlass.range_constexpr(2):  # the quad's 4 lanes hold the 32 columns
                amax = cutlass.max(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << s))
            code = row_code(amax, nc)
            # (a block past 2N inside the last column atom: the layout's padding entry, code
            # 0 as the reference's quantizer writes it; N % 32 == 0, so it is a whole block)
            if (lane % 4 == 0) & (kb // 4 < stripes):
                self._byte(mx.sfd_row, sfd_row_offset(row, kb, stripes),
                           Int32(cutlass.select_(valid, code, Int32(0))))
            mult = multiplier(code, nc)
            # NaN products only where the block holds a NaN or an infinity
            special = amax >= INF_BITS
            if valid:
                for i in cutlass.range_constexpr(4):
                    pi = 2 * i + r
                    self._fp8_pair(mD, row, self._d_col(n0, j, kind, c0_loc, i),
                                   douts[pi][0][kind] * mult, douts[pi][1][kind] * mult, special)

    @cute.jit
    def _mx_cols(self, douts, r0_loc, c0_loc, j: cutlass.Constexpr, kind: cutlass.Constexpr,
                 row0, n0, valid, wg, tidx, expert, mx, nc, use):
        """D_col and SFD_col of the thread's 8 gate (``kind`` 0) or up (1) columns (4 groups
        x 2) over the warp pair's 32 rows."""
        lane = tidx % 32
        warp = (tidx // 32) % 4
        buf = use % 2
        rcp_nc = Float32(RCP_E4M3_MAX) * nc
        # each column's index in the 64-column block (gate [0, 32), up [32, 64))
        cols = [32 * kind + (c0_loc + 8 * i) + c for i in range(4) for c in range(2)]
        amax = []
        for i in cutlass.range_constexpr(4):
            for c in cutlass.range_constexpr(2):
                a = cutlass.max(abs_bits(douts[2 * i][c][kind]),
                                abs_bits(douts[2 * i + 1][c][kind]))
                for s in cutlass.range_constexpr(2, 5):  # the 8 lanes of a column
                    a = cutlass.max(a, cute.arch.shuffle_sync_bfly(a, offset=1 << s))
                amax.append(a)
        sMx = mx.sMx
        if lane < 4:
            for q in cutlass.range_constexpr(8):
                sMx[(wg, warp, buf, cols[q])] = amax[q]
        pipeline.NamedBarrier(barrier_id=MX_PAIR_BARRIER + 2 * wg + warp // 2,
                              num_threads=64).arrive_and_wait()
        codes = []
        for q in cutlass.range_constexpr(8):
            a = cutlass.max(amax[q], sMx[(wg, warp ^ 1, buf, cols[q])])
            amax[q] = a
            codes.append(col_code(a, rcp_nc))
        # (a block past 2N inside the last column atom: padding entries, code 0)
        if (warp % 2 == 0) & (lane < 4) & ((2 * n0 + 64 * j) // 128 < self._sf_stripes()):
            self._sfd_col_bytes([Int32(cutlass.select_(valid, c, Int32(0))) for c in codes], cols,
                                row0 + r0_loc, n0, j, expert, mx)
        if valid:
            for i in cutlass.range_constexpr(4):
                q = 2 * i
                m0 = multiplier(codes[q], nc)
                m1 = multiplier(codes[q + 1], nc)
                special = (amax[q] >= INF_BITS) | (amax[q + 1] >= INF_BITS)
                for r in cutlass.range_constexpr(2):
                    self._fp8_pair(mx.mDcol, row0 + (r0_loc + 8 * r), 2 * n0 + 64 * j + cols[q],
                                   douts[2 * i + r][0][kind] * m0, douts[2 * i + r][1][kind] * m1,
                                   special)

    @cute.jit
    def _byte(self, base, off, code: Int32):
        """One scale byte ``code`` at byte ``off`` of the buffer at ``base``."""
        dst = cute.make_tensor(cute.make_ptr(cutlass.Uint8, base.toint() + cutlass.Int64(off),
                                             _GMEM, assumed_align=1), cute.make_layout(1))
        dst[0] = cutlass.Uint8(code)

    @cute.jit
    def _sfd_col_bytes(self, codes, cols, row, n0, j: cutlass.Constexpr, expert, mx):
        """SFD_col's bytes of the columns ``cols`` of block j for the 32-row block of ``row``
        (``sfd_col_offset``): the global layout (M // 128 row atoms per column atom) or
        (``discrete_col_sfd``) the expert's region, as the reference lays them out."""
        rb = row // 32
        stripes = self._sf_stripes()
        start, expert_atoms = None, None
        if cutlass.const_expr(self.cfg.discrete_col_sfd):
            offs = mx.mOffs
            start = Int32(0)
            if expert > 0:
                start = offs[expert - 1]
            expert_atoms = (offs[expert] - start) // ATOM_ROWS
        for q in cutlass.range_constexpr(len(cols)):
            off = sfd_col_offset(2 * n0 + 64 * j + cols[q], rb, stripes,
                                 mx.mDcol.shape[0] // ATOM_ROWS, start, expert_atoms)
            self._byte(mx.sfd_col, off, codes[q])
