"""The A/B side of the SM90 kernel: the TMA producer warp and the math warpgroups' WGMMA
mainloop (a mixin of :class:`~.kernel.GroupedDgluSm90`).

Warp 0 streams, for every tile of the CTA in order, the (128 x 64) A and (tile_n x 64) B
k-tiles (e4m3: 128 x 128 and tile_n x 128, one scale block each) into an ``ab_stages``-deep shared-memory ring (``PipelineTmaAsync``: full barriers
count the TMA bytes, empty barriers are released by the consuming warps); in a cluster each
CTA loads its 1/cluster_m slice of B (1/cluster_n of A) multicast to its peers. A math
warpgroup runs 64 x tile_n x 16 WGMMAs over its 64-row halves for the tile's k-tiles into
fp32 accumulator registers, one committed group per k-tile in flight.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

from .config import TILE_M


class MainloopMixin:
    """``producer`` (warp 0) and ``mma_mainloop`` (math warpgroups); reads ``cfg``,
    ``ab_stages``, ``k_tile_cnt`` and the schedule (``tile_of``, ``split_item``)."""

    @cute.jit
    def producer(self, ab_pipe, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB, a_src, unit0,
                 walk, b_desc_ptr, split):
        """``a_src``: A's TMA tensor and the A stages (``ragged_m``: each tile's A rows start
        at its own row, so its k-tiles are partitioned per tile, ``_ragged_a``)."""
        nunits, num_units, _, rank, _ = walk
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                             self.ab_stages)
        # B k-tiles go to the CTAs of this CTA's cluster column (same N-tile), A k-tiles
        # to those of its row (same M-tile); 0 = plain, non-multicast load
        cm, cn = self.cfg.cluster_m, self.cfg.cluster_n
        cluster = cute.make_layout((cm, cn, 1))
        coord = (rank % cm, rank // cm, 0)
        b_mask = 0
        if cutlass.const_expr(cm > 1):
            b_mask = cute.make_layout_image_mask(cluster, coord, mode=0)
        a_mask = 0
        if cutlass.const_expr(cn > 1):
            a_mask = cute.make_layout_image_mask(cluster, coord, mode=1)
        if cutlass.const_expr(split is None):
            unit = unit0
            while unit < num_units:
                state = self._load_unit(ab_pipe, state, tma_atom_a, tAgA, tAsA, tma_atom_b,
                                        tBgB, tBsB, a_src, walk, b_desc_ptr,
                                        a_mask, b_mask, unit, 0, self.k_tile_cnt)
                unit += nunits
        else:
            # every piece of the split last round, non-final ones first (split_item)
            i = Int32(0)
            while i < split.items:
                unit, kb, kcnt, *_ = self.split_item(i, unit0, nunits, split)
                state = self._load_unit(ab_pipe, state, tma_atom_a, tAgA, tAsA, tma_atom_b,
                                        tBgB, tBsB, a_src, walk, b_desc_ptr,
                                        a_mask, b_mask, unit, kb, kcnt)
                i += 1
        # do not exit while the math warpgroups may still arrive on our empty barriers
        ab_pipe.producer_tail(state)

    @cute.jit
    def _load_unit(self, ab_pipe, state, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB,
                   a_src, walk, b_desc_ptr, a_mask, b_mask, unit, kb, kcnt):
        """Stream k-tiles [kb, kb + kcnt) of this CTA's tile of schedule unit ``unit`` into
        the A/B ring from ``state`` on; returns the state after them."""
        m_tile, n_tile = self.tile_of(unit, walk)
        expert, row0, _ = self.tile_rows(m_tile, walk)
        a_tile = m_tile
        if cutlass.const_expr(self.cfg.ragged_m):
            # rows past the expert's end are loaded too (the next expert's, or zeros past
            # M): their accumulator rows reach no output
            tAgA = self._ragged_a(tma_atom_a, a_src, row0, walk[3])
            a_tile = 0
        # (no L2 prefetch of the tile's C window: measured slower with it, docs/kernels.md)
        # dense: the expert is B's L coordinate; discrete: its device-built descriptor
        desc, l_idx = None, expert
        if cutlass.const_expr(self.cfg.discrete()):
            # The acquire fence drops any stale copy of these 128 bytes from the
            # descriptor cache (it survives launches: CUDA graph replays and reused
            # workspaces rewrite the same addresses). A cluster pair shares the expert
            # (one 256-row slab): each CTA loads its half of the B k-tile through it,
            # multicast to both.
            desc = self._desc_ptr(b_desc_ptr, expert, cute.AddressSpace.generic)
            cute.nvgpu.cpasync.fence_tma_desc_acquire(desc)
            l_idx = 0
        for kt in range(kb, kb + kcnt):
            ab_pipe.producer_acquire(state)
            bar = ab_pipe.producer_get_barrier(state)
            cute.copy(tma_atom_a, tAgA[(None, a_tile, kt)], tAsA[(None, state.index)],
                      tma_bar_ptr=bar, mcast_mask=a_mask)
            cute.copy(tma_atom_b, tBgB[(None, n_tile, kt, l_idx)],
                      tBsB[(None, state.index)], tma_bar_ptr=bar, tma_desc_ptr=desc,
                      mcast_mask=b_mask)
            ab_pipe.producer_commit(state)
            state.advance()
        return state

    def _ragged_a(self, tma_atom_a, a_src, row0, rank):
        """(``ragged_m``) A's k-tiles of the 128 rows from ``row0`` on, partitioned as the
        kernel partitions the whole of A: M-tile 0 of the offset view (any row0: TMA takes
        element coordinates)."""
        mA, sA = a_src
        return self.a_partition(tma_atom_a, cute.domain_offset((row0, 0), mA), sA, rank)[1]

    def a_partition(self, tma_atom_a, view, sA, rank):
        """(shared, global) TMA partitions of A's view ``view`` (TMA coordinates, tiled into
        128 x 64 k-tiles: global index (M-tile, k-tile)) for the A stages ``sA``: in a cluster
        CTA rank ``rank`` loads its 1/cluster_n slice, multicast to the CTAs of its row."""
        g = cute.local_tile(view, (TILE_M, self.tile_shape_mnk[2]), (None, None))
        return cute.nvgpu.cpasync.tma_partition(
            tma_atom_a, rank // self.cfg.cluster_m, cute.make_layout(self.cfg.cluster_n),
            cute.group_modes(sA, 0, 2), cute.group_modes(g, 0, 2))

    @cute.jit
    def mma_mainloop(self, ab_pipe, mmas, tCrA, tCrB, acc, pos: Int32, mine_done,
                     signal_other, kcnt=None):
        """``kcnt`` k-tiles (None: all K) of one tile into ``acc``; consumes ring positions
        [pos, pos + kcnt).

        Then hands the tensor cores to the other warpgroup (``mine_done``, when it has a
        next tile), once its last WGMMA retired: arriving earlier measured slower
        (docs/kernels.md)."""
        stages = self.ab_stages
        read = pipeline.PipelineState(stages, pos, pos % stages, (pos // stages) % 2)
        release = read.clone()
        num_k_blocks = cute.size(tCrA, mode=[2])
        first, tiled_mma = mmas
        # No zero fill: the tile's first WGMMA overwrites the accumulator (scale-d = 0). The
        # fill's register moves, which LLVM sinks past wgmma.fence among the WGMMAs, made
        # ptxas serialize every WGMMA of the kernel (C7519, far slower) or inject a
        # wait_group (C7517).
        self._issue_k_tile(ab_pipe, read, tiled_mma, tCrA, tCrB, acc, num_k_blocks, first)
        read.advance()
        # steady state: one wgmma group in flight; release the stage the previous one used
        for kt in range(1, self.k_tile_cnt if cutlass.const_expr(kcnt is None) else kcnt):
            self._issue_k_tile(ab_pipe, read, tiled_mma, tCrA, tCrB, acc, num_k_blocks)
            cute.nvgpu.warpgroup.wait_group(1)
            ab_pipe.consumer_release(release)
            release.advance()
            read.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        ab_pipe.consumer_release(release)
        if signal_other:
            mine_done.arrive()

    @cute.jit
    def mma_mainloop_blockwise(self, ab_pipe, mmas, tCrA, tCrB, acc, pos: Int32, scales,
                               mine_done, signal_other, stagger=None):
        """(e4m3) Every k-tile of one tile, each a 128-K scale block: its WGMMAs into the
        partial-sum fragment ``part`` (the k-tile's first WGMMA overwrites it), then, once
        they retired, ``acc += part x sfa[row, kt] x sfb[n block, kt, expert]`` in fp32, as
        DeepSeek-V3's recipe promotes (cooperative: the other warpgroup's WGMMAs run
        meanwhile); consumes ring positions [pos, pos + k-tiles), then (ping-pong,
        ``signal_other``) hands the tensor cores to the other warpgroup as ``mma_mainloop``
        does. A second fragment in flight during the promotion made ptxas serialize every
        WGMMA (C7514). ``scales``: (part, mSFA, mSFB, this thread's rows (2 per 64-row
        half), n_tile, expert). ``stagger`` (cooperative ``wg_stagger``: (this warpgroup's
        index, the named barrier of both)): warpgroup 1 issues its first k-tile once
        warpgroup 0's retired, so that from then on one promotes while the other's WGMMAs
        run. The scales of k-tile kt + 1 are loaded while k-tile kt runs,
        so that the promotion never waits for a global load; rows past M (a ragged tile's
        tail) read row M - 1's scale and reach no output."""
        part, mSFA, mSFB, rows, n_tile, expert = scales
        read = pipeline.PipelineState(self.ab_stages, pos, pos % self.ab_stages,
                                      (pos // self.ab_stages) % 2)
        num_k_blocks = cute.size(tCrA, mode=[2])
        first, tiled_mma = mmas
        last_row = mSFA.shape[0] - 1
        srows = [cutlass.min(r, last_row) for r in rows]
        nb = n_tile * self.tile_n // self.tile_k  # tile_n <= 128: one B scale block row
        # accumulator value v is row 2 (v // half) + (v // 2) % 2 of the thread's rows (a
        # 64-row half holds ``half`` values: _thread_rows' order)
        half = cute.size(acc) // self.halves
        kc = self.k_tile_cnt
        acc.fill(0.0)
        cur = self._k_tile_scales(mSFA, mSFB, srows, nb, 0, expert)
        if cutlass.const_expr(stagger is not None):
            if stagger[0] == 1:
                stagger[1].arrive_and_wait()
        for kt in range(kc):
            nxt = self._k_tile_scales(mSFA, mSFB, srows, nb, cutlass.min(kt + 1, kc - 1), expert)
            self._issue_k_tile(ab_pipe, read, tiled_mma, tCrA, tCrB, part, num_k_blocks, first)
            cute.nvgpu.warpgroup.wait_group(0)
            if cutlass.const_expr(stagger is not None):
                if (stagger[0] == 0) & (kt == 0):
                    stagger[1].arrive()
            ab_pipe.consumer_release(read)
            read.advance()
            for v in cutlass.range_constexpr(cute.size(acc)):
                acc[v] = acc[v] + part[v] * cur[2 * (v // half) + (v // 2) % 2]
            cur = nxt
        if signal_other:
            mine_done.arrive()

    @cute.jit
    def _k_tile_scales(self, mSFA, mSFB, rows, nb, kt, expert):
        """sfa[row, kt] x sfb[nb, kt, expert] for each of this thread's rows (fp32, as the
        reference forms the product of the two scales)."""
        sb = mSFB[(nb, kt, expert)]
        return [mSFA[(r, kt)] * sb for r in rows]

    @cute.jit
    def _issue_k_tile(self, ab_pipe, read, tiled_mma, tCrA, tCrB, acc, num_k_blocks,
                      first=None):
        """Wait for ring stage ``read`` and issue its WGMMAs (tile K / instruction K of them) as one
        committed group into ``acc``; ``first`` (the overwriting MMA) issues k-block 0."""
        ab_pipe.consumer_wait(read)
        cute.nvgpu.warpgroup.fence()
        for kb in cutlass.range_constexpr(num_k_blocks):
            coord = (None, None, kb, read.index)
            mma = first if cutlass.const_expr(first is not None and kb == 0) else tiled_mma
            cute.gemm(mma, acc, tCrA[coord], tCrB[coord], acc)
        cute.nvgpu.warpgroup.commit_group()
