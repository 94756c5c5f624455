"""dbias in the SM90 kernel: the column-sum hand-overs and the folder warp (a mixin of
:class:`~.kernel.GroupedDgluSm90`).

Each math warp reduces its block's column sums across its rows (``_dbias_block``). Ping-pong:
into the block's C stage slice, which the C producer warp sums over the 4 warps and adds to the
workspace (one fp32 atomic per column) before it reloads the stage; after a tile's last block
it fences its atomics and hands the tile to warp 3. Cooperative: each of the 8 warps writes its
block sums to its row of one shared slot, and warp 3 sums the rows and adds them to the
workspace. Warp 3 (``dbias_folder``) folds the workspace into the caller's bf16 dbias once an
(expert, N-tile)'s last tile is in (one rounding), leaving the workspace zero.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .config import C_BLOCK_COLS, MATH_WARPGROUPS, TILE_M


class DbiasHandBack(NamedTuple):
    """What a ping-pong C producer warp needs to add its warpgroup's dbias column sums
    (``c_producer``): the per-stage slices, the fp32 workspace, the (full, empty) mbarriers
    on which it hands each tile's sums to the folder warp (``HandOver``), and (deterministic)
    the slab of per-tile sums it stores them into instead."""

    sDb: object
    ws: object
    fold_mbar: object
    partials: object


class HandOver:
    """A one-place hand-over to the folder warp (warp 3) on the two mbarriers at ``mbar``
    (``full``: the producing threads arrive once their part is done; ``empty``, at
    ``mbar + 1``: the folder warp's 32 threads arrive once they took it). Hand-over k
    completes phase k of each, so its waits take the parity k % 2 (the producing side
    waits for the previous hand-over's release: parity (k + 1) % 2, immediately true for
    k = 0, as a CUTLASS producer's first acquire).

    * Cooperative dbias: the slot of per-warp column sums, block by block; the 256 math
      threads arrive after their row stores; k counts the CTA's blocks (the math warps and
      the folder count them alike: ``_valid_blocks``). mbarrier phases carry the order,
      as in the A/B and C rings (a named-barrier form was reported by racecheck).
    * Ping-pong fold: C producer warp 1 + w tells the folder that math warpgroup w's sums
      of a tile are in the workspace (its 32 lanes arrive, each after fencing its own
      atomics); k counts warpgroup w's tiles. Not a named barrier that both warps block
      on from their own code: the threads that block in one generation of an aligned
      barrier (``bar.sync``) must use one instruction, or compute-sanitizer's synccheck
      stops the kernel; the producer waits only for the folder's release of its previous
      tile."""

    @staticmethod
    def init(mbar, full_arrivals):
        """One thread, before the CTA-wide sync that ends the C ring's create()."""
        cute.arch.mbarrier_init(mbar, full_arrivals)
        cute.arch.mbarrier_init(mbar + 1, 32)

    @staticmethod
    def wait_empty(mbar, k):
        cute.arch.mbarrier_wait(mbar + 1, (k + 1) % 2)

    @staticmethod
    def arrive_full(mbar):
        cute.arch.mbarrier_arrive(mbar)

    @staticmethod
    def wait_full(mbar, k):
        cute.arch.mbarrier_wait(mbar, k % 2)

    @staticmethod
    def arrive_empty(mbar):
        cute.arch.mbarrier_arrive(mbar + 1)


class DbiasMixin:
    """dbias column sums: ``_dbias_block`` (math warps), ``_fold_signal`` (ping-pong C
    producer warps) and ``dbias_folder`` (warp 3)."""

    def dbias_via_producer(self) -> bool:
        """Ping-pong with dbias: the C producer warps add the column sums (c_producer)."""
        return self.cfg.generate_dbias and not self.coop

    def fold_mbar(self, hand_mbar, w):
        """Ping-pong: the ``HandOver`` pair on which C producer warp 1 + w, which added math
        warpgroup w's sums of a tile, tells the dbias folder warp, once per tile
        (fold_in_kernel only; cooperative: the slot's pair at ``hand_mbar``)."""
        return hand_mbar + 2 * w

    def _fold_signal(self, e_q: int, dbias, q):
        """After the column sums of entry ``e_q`` at FIFO position ``q`` went out: if it
        was its tile's last entry, every lane fences its atomics (gpu scope: see
        dbias_folder) and the warp hands the tile (the warpgroup's tile q // nent) to the
        folder warp, once the folder took the one before (``HandOver``)."""
        if cutlass.const_expr(self.cfg.fold_in_kernel() and e_q == self.nent - 1):
            cute.arch.fence_acq_rel_gpu()
            k = q // self.nent
            HandOver.wait_empty(dbias.fold_mbar, k)
            HandOver.arrive_full(dbias.fold_mbar)

    @cute.jit
    def _dbias_block(self, col_gate, col_up, sDb, where, tidx, hand_mbar, k):
        """Column sums of one 32-column block over this warp's 16 rows of both halves.

        The 8 quads of a warp (lane bits 2-4) hold the same 16 columns (8 gate, 8 up) for
        different rows. A butterfly reduce-scatter sums them: at each lane bit the pair of
        lanes swaps halves of its remaining values (send one half, keep and add the other),
        so 8 + 4 + 2 = 14 shuffles leave every lane with 2 finished sums, instead of 3
        shuffles per value (48) leaving lanes 0-3 with all 16. Lane bit 2 then holds gate
        (0) or up (1), bits 3-4 the 8-column group, and every lane stores its 2 adjacent
        block columns (gate 0-31, up 32-63) to the warp's part of the slice of C stage
        ``where`` (ping-pong), or to the warp's row of the slot as the CTA's ``k``-th block
        (cooperative: ``where`` unused; see ``HandOver``)."""
        lane = tidx % 32
        vals = list(col_gate) + list(col_up)  # slot s: gate s (< 8), up s - 8
        for lvl in cutlass.range_constexpr(3):
            half = len(vals) // 2
            upper = ((lane >> (2 + lvl)) & 1) == 1
            nxt = []
            for i in cutlass.range_constexpr(half):
                lo, hi = vals[i], vals[i + half]
                send = Float32(cutlass.select_(upper, lo, hi))
                keep = Float32(cutlass.select_(upper, hi, lo))
                nxt.append(keep + cute.arch.shuffle_sync_bfly(send, offset=4 << lvl))
            vals = nxt
        # vals[i] is original slot i + 2*b4 + 4*b3 + 8*b2 (b_k = lane bit k): gate/up from b2,
        # group (slot // 2) = b4 + 2*b3, column bit i
        b2 = (lane >> 2) & 1
        b3 = (lane >> 3) & 1
        b4 = (lane >> 4) & 1
        col = 2 * (lane % 4) + 8 * (b4 + 2 * b3) + 32 * b2  # block-local C column
        if cutlass.const_expr(self.coop):
            # this warp's row of the slot, once the folder warp has read the previous
            # block's (every thread waits and then arrives itself: its arrive releases
            # its own writes to the folder)
            HandOver.wait_empty(hand_mbar, k)
            w = tidx // 32 - 4  # math warp 0-7
            for i in cutlass.range_constexpr(2):
                sDb[(col + i, w)] = vals[i]
            HandOver.arrive_full(hand_mbar)
        else:
            for i in cutlass.range_constexpr(2):
                sDb[(col + i, (tidx % 128) // 32, where)] = vals[i]

    @cute.jit
    def dbias_folder(self, mWs, mCount, mDbOut, unit0, walk, m_tiles, tidx, sDb, hand_mbar,
                     split, mPartials):
        """Warp 3 (otherwise idle): folds the fp32 dbias column sums into the caller's bf16
        dbias from inside the kernel, so that no second kernel is needed, and (cooperative,
        folded or not) sums each block's dbias slot into the workspace.

        It walks the CTA's units in order (ping-pong: unit k is math warpgroup k % 2's;
        cooperative: both warpgroups share each). Ping-pong: per tile it takes the hand-over
        of the warpgroup's C producer warp, which added the tile's sums after it handed
        back the tile's last block and fenced them (``_fold_signal``, ``HandOver``; gpu
        scope: the threadFenceReduction pattern, with the mbarrier's release and acquire
        carrying the order to this warp), and releases it at once.
        Cooperative: per block, once the 8 math warps' rows of the slot are written
        (``HandOver``), this warp sums them, hands the slot back and adds the sums to the
        workspace (``_sum_slots``); after the tile's last block it fences. Lane 0 then
        counts the arrival on (expert, N-tile) with an acq_rel atomic. The count that
        completes the expert's tiles (the scheduled 128-row M-tiles whose first row is the
        expert's, among the first ``m_tiles``: (offs[e] - offs[e-1]) / 128 with 256-aligned
        offsets, and still a count every counter reaches when offsets are not 256-aligned
        or negative; decreasing offsets can leave one short; ``ragged_m``: the expert's
        units in the table times cluster_m, (table[e] - table[e-1]) cluster_m: a tile past
        the expert's end is counted too, with nothing in it) folds the
        tile's 2*TILE_N columns: each sum read by atomic exchange with 0 (coherent at L2,
        leaves zero), dbias = bf16(fp32(dbias) + sum), then the counter reset. So every
        launch leaves the dbias region of the workspace zero (``_count_and_fold``). The
        ping-pong C producer warp only fences and hands over to this warp, and the
        cooperative math warps only write their rows and arrive (no atomic with a result in
        their loops: in the math warps that cost ptxas ~50 B of spills in the fp32-C
        epilogue). The phantom N-tile of an odd cluster_n pair is handed over but not
        counted (no columns, no counter). ``deterministic`` (cooperative only: no fold in the
        kernel): the tiles' sums go to the ``mPartials`` slab row of their M-tile instead
        of the workspace, and the plan folds the slab (``kernels.partials``)."""
        nunits, num_units, _, _, _ = walk
        lane = tidx % 32
        unit = self.first_epi_unit(unit0, split)  # (split: final pieces only)
        k = Int32(0)
        kslot = Int32(0)  # (cooperative) blocks taken so far, counted as the math warps do
        end = self.epi_end(num_units, split)
        while unit < end:
            m_tile, n_tile = self.tile_of(unit, walk)
            expert, _, _ = self.tile_rows(m_tile, walk)
            n0 = n_tile * self.tile_n
            if cutlass.const_expr(self.coop):
                self._sum_slots(sDb, mWs, expert, n0, lane, hand_mbar, kslot, m_tile, mPartials)
                kslot += self._valid_blocks(n0)
            else:
                # warpgroup k % 2's tile k // 2: its sums are in once the C producer warp
                # hands it over; released at once (the producer may go on to the next)
                mbar = self.fold_mbar(hand_mbar, k % 2)
                HandOver.wait_full(mbar, k // 2)
                HandOver.arrive_empty(mbar)
            if cutlass.const_expr(self.cfg.fold_in_kernel()):
                if cutlass.const_expr(self.coop):
                    # every lane's atomics fenced before lane 0 counts the tile
                    cute.arch.fence_acq_rel_gpu()
                    cute.arch.sync_warp()
                if n0 < self.cfg.n:
                    self._count_and_fold(walk[4], mWs, mCount, mDbOut, expert, n_tile,
                                         m_tiles, lane)
            unit = self.next_epi_unit(unit, nunits, split)
            k += 1

    @cute.jit
    def _count_and_fold(self, rows, mWs, mCount, mDbOut, expert, n_tile, m_tiles, lane):
        """Lane 0 counts a tile's arrival on (expert, N-tile); the count that completes the
        expert's tiles folds the tile's columns (see ``dbias_folder``). ``rows``: the
        offsets, the ragged table, the expert count and M."""
        mOffs, mTable, _, _ = rows
        two_n = 2 * self.cfg.n
        n0 = n_tile * self.tile_n
        counter = (mCount.iterator + (expert * self.num_n_tiles + n_tile)).llvm_ptr
        last = Int32(0)
        lo = Int32(0)
        hi = Int32(0)
        if lane == 0:
            if cutlass.const_expr(self.cfg.ragged_m):
                if expert > 0:
                    lo = mTable[expert - 1] * self.cfg.cluster_m
                hi = mTable[expert] * self.cfg.cluster_m
            else:
                if expert > 0:  # (clamped: a negative offset breaks the contract)
                    lo = cutlass.max((mOffs[expert - 1] + (TILE_M - 1)) // TILE_M, Int32(0))
                hi = cutlass.min((mOffs[expert] + (TILE_M - 1)) // TILE_M, m_tiles)
            old = cute.arch.atomic_add(counter, Int32(1), sem="acq_rel", scope="gpu")
            if old == hi - lo - 1:
                last = Int32(1)
        last = cute.arch.shuffle_sync(last, 0)
        if last == Int32(1):
            cute.arch.fence_acq_rel_gpu()
            for i in cutlass.range_constexpr((2 * self.tile_n) // 32):
                g = 2 * n0 + 32 * i + lane
                if g < two_n:
                    idx = expert * two_n + g
                    v = cute.arch.atomic_exch((mWs.iterator + idx).llvm_ptr,
                                              Float32(0.0), sem="relaxed", scope="gpu")
                    mDbOut[idx] = (mDbOut[idx].to(Float32) + v).to(mDbOut.element_type)
            if lane == 0:
                cute.arch.atomic_exch(counter, Int32(0), sem="relaxed", scope="gpu")

    def _block_valid(self, n0, j: int):
        """Whether 32-column block j of the tile starting at column n0 is inside N (N % 32 ==
        0: a block is all in or all out). The epilogue stores and sums only these blocks,
        and the folder warp takes exactly these blocks' slots."""
        return n0 + 32 * j < self.cfg.n

    def _blocks_all_valid(self) -> bool:
        """Every tile's every 32-column block lies inside N (N a multiple of tile_n, no
        phantom N-tile of an odd cluster_n pair): ``_block_valid`` is true for all."""
        return self.cfg.n % self.tile_n == 0 and self.cfg.num_n_tiles() % self.cfg.cluster_n == 0

    def _valid_blocks(self, n0):
        """How many of the tile's blocks are inside N (a prefix: ``_block_valid``), so that
        the math warps and the folder warp count the slot's hand-overs alike: none on the
        phantom N-tile of an odd cluster_n pair (n0 >= N; without the floor at 0 the count
        would go negative there and every later wait take the wrong parity)."""
        return cutlass.max(cutlass.min(Int32(self.nblk), (self.cfg.n - n0) // 32), Int32(0))

    @cute.jit
    def _sum_slots(self, sDb, mWs, expert, n0, lane, hand_mbar, kslot, m_tile, mPartials):
        """The folder warp's part of one cooperative tile's dbias: for each block the
        epilogue sums (those inside 2N, in the epilogue's order), wait for the 8 warps'
        rows of the slot, add each column's 8 values and that sum to the workspace ``mWs``
        (L, 2N) (one fp32 atomic per column; lane takes columns lane and lane + 32;
        deterministic: store them to M-tile ``m_tile``'s row of ``mPartials``), then hand the
        slot back. ``kslot``: the CTA's blocks before this tile's."""
        two_n = 2 * self.cfg.n
        for j in cutlass.range_constexpr(self.nblk):
            if self._block_valid(n0, j):
                HandOver.wait_full(hand_mbar, kslot + j)
                sums = []
                for i in cutlass.range_constexpr(2):
                    col = lane + 32 * i
                    x = sDb[(col, 0)]
                    for w in cutlass.range_constexpr(1, 4 * MATH_WARPGROUPS):
                        x = x + sDb[(col, w)]
                    sums.append(x)
                # every read of the slot is done: the math warps may write the next block
                HandOver.arrive_empty(hand_mbar)
                for i in cutlass.range_constexpr(2):
                    g = 2 * n0 + C_BLOCK_COLS * j + lane + 32 * i
                    if cutlass.const_expr(self.cfg.deterministic):
                        mPartials[m_tile * two_n + g] = sums[i]  # the tile's own slab row
                    else:
                        cute.arch.atomic_add((mWs.iterator + (expert * two_n + g)).llvm_ptr,
                                             sums[i])
