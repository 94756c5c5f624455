"""The Hopper (sm_90a) grouped GEMM + dGLU backward kernel: :class:`GroupedDgluSm90`.

Owns the jit entry (TMA descriptors, shared-memory layouts, the launch of the helper kernels
and of the main one), the schedule of tiles onto clusters, CTAs and warpgroups, and the
composition of the warp roles; the roles live in the mixins (``mainloop``, ``epilogue``,
``dbias``, ``stream_k``, ``host_kernels``). It knows nothing about engines, knob policy or
torch: ``cudnn_ext.engines.sm90`` picks the :class:`~.config.Sm90Config` and launches the
compiled kernel on raw device pointers (``launch``).
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.tensor_utils import LayoutEnum

from .config import (BLOCKWISE_TILE_K, C_BLOCK_COLS, MATH_WARPGROUPS, NUM_THREADS, SPLIT_BARRIER,
                     STAGGER_BARRIER, TILE_M, Sm90Config)
from .dbias import DbiasHandBack, DbiasMixin, HandOver
from .epilogue import BlockStore, DgluEpilogueMixin, EpilogueParams
from .host_kernels import HostKernelsMixin
from .mainloop import MainloopMixin
from .quant_d import MxOutputs, QuantDMixin
from .stream_k import StreamKMixin
from .tile_walk import expert_of_row, grouped_raster, ragged_tile

#: The ragged D descriptor's row extent (``_ragged_rows``): any expert's rows fit below it.
RAGGED_BIG = 1 << 30
#: The ragged D descriptor's extra dimensions' extent: any coordinate used there fits below it.
RAGGED_EXTENT = (1 << 31) - 1

#: The CuTe DSL element type of each of the config's dtype names.
DSL_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32,
              "e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2}


class GroupedDgluSm90(MainloopMixin, DgluEpilogueMixin, QuantDMixin, DbiasMixin, StreamKMixin,
                      HostKernelsMixin):
    """Grouped GEMM + dGLU for one :class:`Sm90Config`. ``__call__`` is the jit entry.

    A persistent, warp-specialized kernel: 3 warpgroups per CTA, one CTA per SM, optionally in
    clusters of cluster_m x cluster_n CTAs (rank = m + cluster_m * n). The schedule walks units
    u = cluster id, + #clusters, ... of the (offs[L-1] / (128 cluster_m)) x
    ceil(N / (tile_n cluster_n)) grid (``tile_walk``; ``ragged_m``: each expert's own units,
    from a table a helper kernel builds, ``tile_rows``); CTA rank r computes tile r of a unit,
    128 rows x tile_n accumulator columns. Ping-pong: math warpgroup w takes the CTA's tiles
    w, w + 2, ..., the two mainloops alternating so that one's epilogue runs under the other's
    MMAs. ``cooperative``: both take every tile, 64 rows each (tile_n up to 256), and with
    ``split_last`` the last round is spread along K (``stream_k``).

    Warp roles (``kernel`` dispatches on the warp index):

    ===========  ============================================  ===================  ===========
    warps        role                                          method               module
    ===========  ============================================  ===================  ===========
    0            A/B TMA producer (multicast in a cluster)     ``producer``         mainloop
    1, 2         C TMA producer of math warpgroup 0 / 1: C     ``c_producer``       epilogue
                 loads, D stores, ping-pong dbias hand-back
    3            dbias folder: cooperative dbias slots, the    ``dbias_folder``     dbias
                 fold into the caller's bf16 dbias
    4-7, 8-11    math warpgroups 0 / 1: WGMMA mainloop, then   ``mma_mainloop``     mainloop
                 the dGLU epilogue (cooperative split last     ``epilogue``         epilogue
                 round: partial sums handed over first)        ``_split_hand_over`` stream_k
    ===========  ============================================  ===================  ===========

    Pipelines and hand-overs:

    ====================  ============================================  =======================
    what                  producer -> consumer                          mechanism
    ====================  ============================================  =======================
    A/B ring              warp 0 -> the math warpgroup(s) of every CTA  PipelineTmaAsync,
    (ab_stages)           of the cluster that shares the k-tile         ``ab_pipe``
    C ring (c_ring x      warp 1 + w -> math warpgroup w, a private     PipelineTmaAsync,
    c_split per wg)       in-order FIFO half each; D blocks go back     ``c_pipe``
    ping-pong turn        one math warpgroup's mainloop -> the other's  named barriers 2, 3
    dbias slot / fold     math warps (cooperative) or C producer warps  ``HandOver`` mbarrier
                          (ping-pong) -> folder warp 3                  pairs, ``hand_mbar``
    split hand-over       the 256 math threads around one part          named barrier 4
    split partial sums    non-final parts -> the unit's final part      workspace slots, flag
    ====================  ============================================  =======================

    Before the main kernel, on the same stream (``host_kernels``): the zeroing of the
    workspace's dbias region (or, ``init_outputs``, the fresh-outputs prologue) and, with
    discrete weights, the per-expert B descriptors.

    Runtime sizes (M, L, the offsets, the SM count) are kernel arguments. TMA zero-fills the K
    and N tails, so K need not be a multiple of 64 nor N of tile_n; since N % 32 == 0 a
    32-column block is entirely in or out, and the stores and dbias of blocks past N are
    skipped.
    """

    def __init__(self, cfg: Sm90Config):
        cfg.check()
        self.cfg = cfg
        self.ab_dtype = DSL_DTYPES[cfg.ab_dtype]
        self.c_dtype = DSL_DTYPES[cfg.c_dtype]
        self.d_dtype = DSL_DTYPES[cfg.d_dtype]
        self.tile_n = cfg.tile_n
        self.ab_stages = cfg.stages()
        self.tile_k = cfg.tile_k()
        self.tile_shape_mnk = (TILE_M, cfg.tile_n, self.tile_k)
        self.num_n_tiles = cfg.num_n_tiles()
        self.k_tile_cnt = (cfg.k + self.tile_k - 1) // self.tile_k
        self.nblk = cfg.tile_n // 32  # C blocks per tile
        self.c_split = cfg.c_split
        self.c_rows = cfg.c_rows()
        # C ring entries per warpgroup, and per tile (block j, row half h = entry j*c_split + h)
        self.c_stages = cfg.c_ring() * self.c_split
        self.nent = self.nblk * self.c_split
        self.coop = cfg.cooperative
        self.wg_rows = cfg.wg_rows()
        self.halves = self.wg_rows // 64  # 64-row WGMMA halves per warpgroup tile
        # 128*40 + 256*232 = 64512 <= 65536 registers per SM (one CTA per SM)
        self.producer_regs = 40
        self.math_regs = 232

    # ------------------------------------------------------------------ host side (jit)
    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        c_ptr: cute.Pointer,
        d_ptr: cute.Pointer,
        offs_ptr: cute.Pointer,
        alpha_ptr: cute.Pointer,
        beta_ptr: cute.Pointer,
        prob_ptr: cute.Pointer,
        dprob_ptr: cute.Pointer,
        dbias_ws_ptr: cute.Pointer,
        b_ptrs_ptr: cute.Pointer,
        b_desc_ptr: cute.Pointer,
        dbias_ptr: cute.Pointer,
        act_ptr: cute.Pointer,
        amax_ptr: cute.Pointer,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        partials_ptr: cute.Pointer,
        d_col_ptr: cute.Pointer,
        sfd_row_ptr: cute.Pointer,
        sfd_col_ptr: cute.Pointer,
        norm_const_ptr: cute.Pointer,
        m: Int32,
        num_experts: Int32,
        sm_count: Int32,
        geglu_alpha: Float32,
        clamp_max: Float32,
        clamp_min: Float32,
        linear_offset: Float32,
        stream: cuda.CUstream,
    ):
        cfg = self.cfg
        n, k = cfg.n, cfg.k
        mA = cute.make_tensor(a_ptr, cute.make_layout((m, k), stride=(k, 1)))
        if cutlass.const_expr(cfg.discrete()):
            # Template of one expert's B: the host encodes a descriptor from it (at A's
            # address: never used for a load), the kernel only takes its TMA atom type and
            # partitioning; every B load goes through the expert's device-built descriptor.
            mB = cute.make_tensor(
                a_ptr,
                cute.make_layout((n, k, 1), stride=self._b_stride()))
        else:
            # (N, K, L): K-major strides (K, 1, N*K) or N-major (1, N, N*K)
            b_stride = (k, 1, n * k) if cfg.b_major == "k" else (1, n, n * k)
            mB = cute.make_tensor(
                b_ptr, cute.make_layout((n, k, num_experts), stride=b_stride))
        mC = cute.make_tensor(c_ptr, cute.make_layout((m, 2 * n), stride=(2 * n, 1)))
        mD = cute.make_tensor(d_ptr, cute.make_layout((m, 2 * n), stride=(2 * n, 1)))
        mOffs = cute.make_tensor(offs_ptr, cute.make_layout((num_experts,)))
        mAlpha = cute.make_tensor(alpha_ptr, cute.make_layout((num_experts,)))
        mBeta = cute.make_tensor(beta_ptr, cute.make_layout((num_experts,)))
        mProb = cute.make_tensor(prob_ptr, cute.make_layout((m,)))
        mDprob = cute.make_tensor(dprob_ptr, cute.make_layout((m,)))
        # (deterministic) dprob's (N-tile, row) partials, and the tiles' dbias column sums
        # (without them: a 1-element placeholder at A's address, never written)
        mPartials = cute.make_tensor(partials_ptr, cute.make_layout((1,)))
        if cutlass.const_expr(cfg.deterministic):
            mDprob = cute.make_tensor(dprob_ptr, cute.make_layout((self.num_n_tiles * m,)))
            if cutlass.const_expr(cfg.generate_dbias):
                mPartials = cute.make_tensor(partials_ptr, cute.make_layout(
                    (cfg.partial_tiles(m, num_experts) * 2 * n,)))
        # the activation output (M, N), flat (without it: A's address, never written)
        mAct = cute.make_tensor(act_ptr, cute.make_layout((m * n,)))
        # per expert (max |dgate|, max |dup|) (without it: A's address, never written)
        mAmax = cute.make_tensor(amax_ptr, cute.make_layout((num_experts * 2,)))
        mDbias = cute.make_tensor(
            dbias_ws_ptr, cute.make_layout((num_experts, 2 * n), stride=(2 * n, 1)))
        # (blockwise) the recipe's fp32 scales, MN-major: A's (M, K/128), B's (ceil(N/128),
        # K/128, L) (without them: 1-element placeholders at A's address, never read)
        mSFA = cute.make_tensor(sfa_ptr, cute.make_layout((1,)))
        mSFB = cute.make_tensor(sfb_ptr, cute.make_layout((1,)))
        if cutlass.const_expr(cfg.blockwise()):
            kb = k // BLOCKWISE_TILE_K
            nb = (n + BLOCKWISE_TILE_K - 1) // BLOCKWISE_TILE_K
            mSFA = cute.make_tensor(sfa_ptr, cute.make_layout((m, kb), stride=(1, m)))
            mSFB = cute.make_tensor(sfb_ptr, cute.make_layout((nb, kb, num_experts),
                                                              stride=(1, nb, nb * kb)))

        # (d_scales) D_col (M, 2N) beside D_row (mD), the e8m0 scale bytes of both (the
        # scale-factor layout: quant.sf_layout) and norm_const (1,) (without them:
        # placeholders at D's address, never touched)
        mDcol = cute.make_tensor(d_col_ptr, cute.make_layout((1,)))
        if cutlass.const_expr(cfg.d_scales):
            mDcol = cute.make_tensor(d_col_ptr, cute.make_layout((m, 2 * n), stride=(2 * n, 1)))
        mNc = cute.make_tensor(norm_const_ptr, cute.make_layout((1,)))

        a_layout = LayoutEnum.ROW_MAJOR  # (M, K) K-major
        # (N, K) K-major, or N-major (discrete "n": WGMMA reads B MN-major from smem)
        b_layout = (LayoutEnum.COL_MAJOR if cfg.b_major == "n"
                    else LayoutEnum.ROW_MAJOR)
        # cooperative: the two math warpgroups tile M (64 rows each) of one 128-row tile
        # Two copies: the kernel sets scale-d = 0 on one ("overwrite", a tile's first k-block)
        # and 1 on the other ("accumulate"), once, outside its loops (a field set inside the
        # persistent loop does not dominate its later uses: invalid IR).
        tiled_mma, tiled_mma_first = (sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype, self.ab_dtype,
            a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
            Float32, (MATH_WARPGROUPS if self.coop else 1, 1, 1), tiler_mn=(64, self.tile_n))
            for _ in range(2))
        a_smem_staged = sm90_utils.make_smem_layout_a(
            a_layout, self.tile_shape_mnk, self.ab_dtype, self.ab_stages)
        b_smem_staged = sm90_utils.make_smem_layout_b(
            b_layout, self.tile_shape_mnk, self.ab_dtype, self.ab_stages)

        # C blocks (wg_rows x 64: a warpgroup's rows of one gate/up block pair; row-major,
        # 128B-swizzled: conflict-free reads of the WGMMA fragment's row pattern),
        # MATH_WARPGROUPS x c_stages of them
        c_layout = LayoutEnum.ROW_MAJOR
        c_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(c_layout, self.c_dtype, C_BLOCK_COLS), self.c_dtype)
        c_box = (self.c_rows, C_BLOCK_COLS)
        c_smem_staged = cute.tile_to_shape(
            c_atom, (*c_box, MATH_WARPGROUPS * self.c_stages), order=(0, 1, 2))
        c_smem = cute.slice_(c_smem_staged, (None, None, 0))
        tma_atom_c, tma_c = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mC, c_smem, c_box)
        # D blocks go out from the C block's shared memory (same box and layout)
        tma_atom_d, tma_d = tma_atom_c, tma_c  # placeholders: unused without d_via_smem
        if cutlass.const_expr(cfg.d_via_smem()):
            mD_store = mD
            if cutlass.const_expr(cfg.ragged_m):
                mD_store = self._ragged_rows_tensor(mD)
            tma_atom_d, tma_d = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mD_store, c_smem, c_box)
        # (act_staged) the activation's blocks, c_rows x 32 bf16 beside each C ring entry,
        # 64B-swizzled: the epilogue's 4-byte pair writes (8 rows x 16 B per warp) fall in
        # distinct banks; TMA-stored like D (placeholders otherwise: unused)
        act_smem_staged, tma_atom_act, tma_act = c_smem_staged, tma_atom_c, tma_c
        if cutlass.const_expr(cfg.act_staged):
            act_box = (self.c_rows, cfg.act_cols())
            act_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
                sm90_utils.get_smem_layout_atom(c_layout, cutlass.BFloat16, cfg.act_cols()),
                cutlass.BFloat16)
            act_smem_staged = cute.tile_to_shape(
                act_atom, (*act_box, MATH_WARPGROUPS * self.c_stages), order=(0, 1, 2))
            mAct_store = cute.make_tensor(act_ptr, cute.make_layout((m, n), stride=(n, 1)))
            if cutlass.const_expr(cfg.ragged_m):
                mAct_store = self._ragged_rows_tensor(mAct_store)
            tma_atom_act, tma_act = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mAct_store,
                cute.slice_(act_smem_staged, (None, None, 0)), act_box)

        a_smem = cute.slice_(a_smem_staged, (None, None, 0))
        b_smem = cute.slice_(b_smem_staged, (None, None, 0))
        cm, cn = cfg.cluster_m, cfg.cluster_n
        a_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cn > 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
            a_op, mA, a_smem, (TILE_M, self.tile_k), num_multicast=cn)
        b_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cm > 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        tma_atom_b, tma_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
            b_op, mB, b_smem, (self.tile_n, self.tile_k), num_multicast=cm)
        cl = cfg.cluster_size()

        self.shared_storage = self._shared_storage(a_smem_staged, b_smem_staged, c_smem_staged,
                                                   act_smem_staged)

        # Upper bound of the tile count from M alone (the true count needs offs[L-1], which
        # only the device reads); surplus CTAs find no tile and exit. ``sm_count`` is how
        # many CTAs can be resident at once (for clusters: max active clusters x cl).
        max_units = (m // (TILE_M * cm)) * cfg.num_n_units()
        if cutlass.const_expr(cfg.ragged_m):
            # each expert's last unit may be partial: at most one more unit per expert
            max_units = (m // (TILE_M * cm) + num_experts) * cfg.num_n_units()
        grid = (cutlass.min(max_units, sm_count // cl) * cl, 1, 1)
        fold = cfg.fold_in_kernel()
        total = num_experts * 2 * n
        # the workspace region launches leave zero: (dbias) fp32 sums (L, 2N), then (fold)
        # one int32 arrival counter per (expert, N-tile), then (split) the last round's int32
        # flags; zero is the same bit pattern for all
        ws_total = cfg.dbias_ws_elems(num_experts) + cfg.split_flags()
        # (with neither, nothing to zero: a 1-element placeholder, never read)
        mWs = cute.make_tensor(dbias_ws_ptr, cute.make_layout(
            (ws_total if cfg.ws_dbias_sums() or cfg.split() else 1,)))
        mCount = cute.make_tensor(cute.recast_ptr(dbias_ws_ptr + total, dtype=Int32),
                                  cute.make_layout((num_experts * self.num_n_tiles,)))
        mDb = cute.make_tensor(dbias_ptr, cute.make_layout((total,)))
        # (ragged_m) the cumulative M-tile counts per expert, after the scratch's other regions
        # (without ragged_m: a 1-element placeholder over the offsets, never read)
        mTable = cute.make_tensor(offs_ptr, cute.make_layout((1,)))
        if cutlass.const_expr(cfg.ragged_m):
            mTable = cute.make_tensor(
                cute.recast_ptr(dbias_ws_ptr + cfg.ragged_table_offset(num_experts), dtype=Int32),
                cute.make_layout((num_experts,)))
            # same stream, before the main kernel: every CTA reads the complete table
            self.ragged_table(mOffs, mTable, num_experts, m).launch(
                grid=(1, 1, 1), block=[32, 1, 1], stream=stream)
        if cutlass.const_expr(cfg.init_outputs):
            # dprob (M), D's tail rows, dbias and its workspace: a grid-stride pass each
            mDflat = cute.make_tensor(d_ptr, cute.make_layout((m * 2 * n,)))
            init_grid = (cutlass.min((m + 255) // 256 + 1, 4 * sm_count), 1, 1)
            self.init_outputs(mWs, mDprob, mDflat, mDb, mAct, mOffs, num_experts).launch(
                grid=init_grid, block=[256, 1, 1], stream=stream)
        elif cutlass.const_expr((fold or cfg.split()) and not cfg.ws_zeroed):
            zero_grid = (cutlass.min((ws_total + 255) // 256, 4 * sm_count), 1, 1)
            self.dbias_zero(mWs).launch(grid=zero_grid, block=[256, 1, 1], stream=stream)
        if cutlass.const_expr(cfg.discrete()):
            # Same stream, before the main kernel: stream order makes the descriptors
            # complete before any CTA of the main kernel reads them.
            # (with a 2-CTA cluster, the descriptors have the multicast half-box of the
            # template, and both CTAs of a pair use their shared expert's descriptor)
            self.build_b_descriptors(b_ptrs_ptr, b_desc_ptr, b_smem).launch(
                grid=(num_experts, 1, 1), block=[32, 1, 1], stream=stream)
        self.kernel(
            tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_c, tma_c, tma_atom_d, tma_d,
            tma_atom_act, tma_act, mC, mD, mAct, mAmax, mOffs, mTable, mAlpha,
            mBeta, mProb, mDprob, mDbias, mCount, mDb, mSFA, mSFB, mPartials, mDcol, sfd_row_ptr,
            sfd_col_ptr, mNc, b_desc_ptr, num_experts,
            geglu_alpha,
            clamp_max, clamp_min, linear_offset, tiled_mma, tiled_mma_first, a_smem_staged,
            b_smem_staged, c_smem_staged, act_smem_staged,
        ).launch(grid=grid, block=[NUM_THREADS, 1, 1], cluster=(cl, 1, 1), min_blocks_per_mp=1,
                 stream=stream)

    def _shared_storage(self, a_smem_staged, b_smem_staged, c_smem_staged, act_smem_staged):
        """The kernel's shared-memory struct: the 1024-B aligned buffers first (barriers in
        front of them would cost up to 1 KB of padding: Sm90Config.stages counts on it); the
        staged activation blocks only with ``act_staged``."""
        cfg = self.cfg
        mem, align = cute.struct.MemRange, cute.struct.Align
        fields = dict(sA=align[mem[self.ab_dtype, cute.cosize(a_smem_staged)], 1024],
                      sB=align[mem[self.ab_dtype, cute.cosize(b_smem_staged)], 1024],
                      sC=align[mem[self.c_dtype, cute.cosize(c_smem_staged)], 1024])
        if cfg.act_staged:
            fields["sAct"] = align[mem[cutlass.BFloat16, cute.cosize(act_smem_staged)], 1024]
        fields.update(
            ab_mbar=mem[cutlass.Int64, self.ab_stages * 2],
            c_mbar=mem[cutlass.Int64, MATH_WARPGROUPS * self.c_stages * 2],
            # HandOver pairs: the cooperative dbias slot's, or the ping-pong fold's (one per
            # C producer warp)
            hand_mbar=mem[cutlass.Int64, 2 * MATH_WARPGROUPS],
            sDb=align[mem[Float32, cfg.dbias_smem_floats()], 16],
            # (d_scales) the D_col warp pairs' amax exchange (a 1-word placeholder otherwise)
            sMx=align[mem[Int32, max(cfg.mx_exchange_ints(), 1)], 16])
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def block_store(self, tma_atom, mT_tma, smem, cols: int) -> BlockStore:
        """An output stored through shared memory, block by block, by the C producer warp:
        its TMA atom and tensor, the staged shared-memory blocks and their partitions
        (``ragged_m``: the rank-4 clipping view, partitioned per tile: _store_d_block)."""
        view = self._ragged_rows(mT_tma, 0, 0) if self.cfg.ragged_m else mT_tma
        s, g = self.block_partition(tma_atom, view, smem, cols)
        return BlockStore(tma_atom, s, g, mT_tma, smem, cols)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        mC_tma: cute.Tensor,
        tma_atom_d: cute.CopyAtom,
        mD_tma: cute.Tensor,
        tma_atom_act: cute.CopyAtom,
        mAct_tma: cute.Tensor,
        mC: cute.Tensor,
        mD: cute.Tensor,
        mAct: cute.Tensor,
        mAmax: cute.Tensor,
        mOffs: cute.Tensor,
        mTable: cute.Tensor,
        mAlpha: cute.Tensor,
        mBeta: cute.Tensor,
        mProb: cute.Tensor,
        mDprob: cute.Tensor,
        mDbias: cute.Tensor,
        mCount: cute.Tensor,
        mDbOut: cute.Tensor,
        mSFA: cute.Tensor,
        mSFB: cute.Tensor,
        mPartials: cute.Tensor,
        mDcol: cute.Tensor,
        sfd_row_ptr: cute.Pointer,
        sfd_col_ptr: cute.Pointer,
        mNc: cute.Tensor,
        b_desc_ptr: cute.Pointer,
        num_experts: Int32,
        geglu_alpha: Float32,
        clamp_max: Float32,
        clamp_min: Float32,
        linear_offset: Float32,
        tiled_mma: cute.TiledMma,
        tiled_mma_first: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout,
        b_smem_staged: cute.ComposedLayout,
        c_smem_staged: cute.ComposedLayout,
        act_smem_staged: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nblocks, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warp_group = cute.arch.make_warp_uniform(tidx // 128)

        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_atom_a)
            if cutlass.const_expr(not self.cfg.discrete()):
                cute.nvgpu.cpasync.prefetch_descriptor(tma_atom_b)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_atom_c)

        # Schedule units: cluster_m M-tiles x cluster_n N-tiles (one tile per CTA of a
        # cluster; rank = m + cluster_m * n). Only M-tiles that hold rows are scheduled
        # (offs[L-1] is a multiple of 256, so of 128 * cluster_m; ragged_m: the table's
        # count, every expert's tiles).
        cm, cn = self.cfg.cluster_m, self.cfg.cluster_n
        cl = cm * cn
        rank = Int32(0)
        if cutlass.const_expr(cl > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        unit0 = bid // cl
        nunits = nblocks // cl
        valid_m_units = mOffs[num_experts - 1] // (TILE_M * cm)
        if cutlass.const_expr(self.cfg.ragged_m):
            valid_m_units = mTable[num_experts - 1]
        num_units = valid_m_units * self.cfg.num_n_units()
        walk = (nunits, num_units, valid_m_units, rank, (mOffs, mTable, num_experts, mC.shape[0]))
        split = None
        if cutlass.const_expr(self.cfg.split()):
            split = self.split_walk(num_units, nunits, unit0, rank, mDbias, num_experts)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sC = storage.sC.get_tensor(c_smem_staged.outer, swizzle=c_smem_staged.inner)
        sDb = storage.sDb.get_tensor(cute.make_layout(self.cfg.dbias_smem_shape()))
        sAct = None  # (act_staged) the activation blocks beside the C ring's entries
        if cutlass.const_expr(self.cfg.act_staged):
            sAct = storage.sAct.get_tensor(act_smem_staged.outer, swizzle=act_smem_staged.inner)
        mx = None  # (d_scales) the quantizing epilogue's operands
        if cutlass.const_expr(self.cfg.d_scales):
            # the exchange: (warpgroup, warp, buffer, block column)
            sMx = storage.sMx.get_tensor(cute.make_layout(self.cfg.mx_exchange_shape()))
            mx = MxOutputs(mDcol, sfd_row_ptr, sfd_col_ptr, mNc, sMx, mOffs)

        a_smem = cute.slice_(a_smem_staged, (None, None, 0))
        b_smem = cute.slice_(b_smem_staged, (None, None, 0))
        tx_bytes = cute.size_in_bytes(self.ab_dtype, a_smem) + cute.size_in_bytes(
            self.ab_dtype, b_smem)
        ab_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # each stage is consumed by one math warpgroup (ping-pong) or both (cooperative)
            # of every CTA of the cluster: one release per warp and CTA (lane r of each warp
            # arrives on CTA r's barrier) (cm + cn - 1 CTAs: itself, its M peer, its N peer;
            # create() picks the lanes)
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread,
                4 * (MATH_WARPGROUPS if self.coop else 1) * (cm + cn - 1)),
            tx_count=tx_bytes,
            # (v, m, n, k) cluster layout; with cl > 1 create() also syncs the cluster so no
            # remote arrive can reach a barrier before it is initialized
            cta_layout_vmnk=cute.make_layout((1, cm, cn, 1)),
        )
        # the (full, empty) mbarrier pairs of the cooperative dbias slot or of the ping-pong
        # fold (see HandOver); the C ring's create() below fences mbarrier inits and syncs
        # the CTA
        hand_mbar = storage.hand_mbar.data_ptr()
        if cutlass.const_expr(self.cfg.coop_dbias_slots()):
            if tidx == 0:
                HandOver.init(hand_mbar, 128 * MATH_WARPGROUPS)
        elif cutlass.const_expr(self.dbias_via_producer() and self.cfg.fold_in_kernel()):
            if tidx == 0:
                for w in cutlass.range_constexpr(MATH_WARPGROUPS):
                    HandOver.init(self.fold_mbar(hand_mbar, w), 32)
        # One ring of 2*c_stages C blocks; math warpgroup w owns stages
        # [w*c_stages, (w+1)*c_stages) and its own producer warp (1 + w), so each half is a
        # private in-order FIFO (see c_state).
        c_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.c_mbar.data_ptr(),
            num_stages=MATH_WARPGROUPS * self.c_stages,
            # ping-pong dbias: every lane of the C producer warp arrives (one with the
            # expected bytes), each after its own reads of the stage's dbias slice; else the
            # elected lane alone (see c_producer)
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.c_full_arrivals()),
            # released by each of the warpgroup's 4 warps (lane 0) once it has read the block
            # or, when D goes out through the block's shared memory, written its D values
            # over it (the C producer warp then TMA-stores the block before reloading it);
            # by every thread when the block's dbias sums go to the C producer warp through
            # shared memory (each thread's arrive releases its own writes: see epilogue)
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, 128 if self.dbias_via_producer() else 4),
            tx_count=cute.size_in_bytes(self.c_dtype,
                                        cute.slice_(c_smem_staged, (None, None, 0))),
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            # (the default, spelled out: this create() fences every mbarrier init above,
            # the HandOver pairs' included, and syncs the CTA before any is used)
            defer_sync=False,
        )

        # (bN, bK, RestN, RestK, L) tiled global view of B
        gB = cute.local_tile(mB, (self.tile_n, self.tile_k), (None, None, None))
        # with a cluster each CTA loads its 1/cn slice of the A tile (multicast to the CTAs
        # of its row: a_partition) and its 1/cm slice of the B tile (to the CTAs of its column)
        rank_m = rank % cm
        tAsA, tAgA = self.a_partition(tma_atom_a, mA, sA, rank)
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_atom_b, rank_m, cute.make_layout(cm), cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2))
        tCsC_tma, tCgC_tma = self.block_partition(tma_atom_c, mC_tma, sC)

        d_store = None  # the outputs that leave through shared memory, block by block
        if cutlass.const_expr(self.cfg.d_via_smem()):
            d_store = (self.block_store(tma_atom_d, mD_tma, sC, C_BLOCK_COLS),)
            if cutlass.const_expr(self.cfg.act_staged):
                d_store = d_store + (self.block_store(tma_atom_act, mAct_tma, sAct,
                                                      self.cfg.act_cols()),)

        if warp_group == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(ab_pipe, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB,
                              (mA, sA), unit0, walk, b_desc_ptr, split)
            if (warp_idx == 1) | (warp_idx == 2):
                dbias = None
                if cutlass.const_expr(self.dbias_via_producer()):
                    # ping-pong: this warp adds its warpgroup's dbias column sums and
                    # tells the folder warp when a tile's are in the workspace
                    dbias = DbiasHandBack(sDb, mDbias, self.fold_mbar(hand_mbar, warp_idx - 1),
                                          mPartials)
                self.c_producer(c_pipe, tma_atom_c, tCgC_tma, tCsC_tma, (mC_tma, sC),
                                warp_idx - 1, unit0, walk, d_store, dbias, split)
            if cutlass.const_expr(self.cfg.has_folder()):
                if warp_idx == 3:
                    self.dbias_folder(mDbias, mCount, mDbOut, unit0, walk, valid_m_units * cm,
                                      tidx, sDb, hand_mbar, split, mPartials)
        else:
            cute.arch.setmaxregister_increase(self.math_regs)
            wg = warp_group - 1
            # cooperative: one tiled MMA over both warpgroups (256 threads), each its 64 rows
            thr_mma = tiled_mma.get_slice(tidx - 128 if self.coop else tidx % 128)
            tCsA = thr_mma.partition_A(sA)
            tCsB = thr_mma.partition_B(sB)
            tCrA = tiled_mma.make_fragment_A(tCsA)
            tCrB = tiled_mma.make_fragment_B(tCsB)
            tCcC = thr_mma.partition_C(cute.make_identity_tensor((TILE_M, self.tile_n)))
            acc = cute.make_rmem_tensor(tCcC.shape, Float32)
            part = None  # (blockwise) one k-tile's partial sums, promoted into acc
            if cutlass.const_expr(self.cfg.blockwise()):
                part = cute.make_rmem_tensor(tCcC.shape, Float32)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
            tiled_mma_first.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
            mmas = (tiled_mma_first, tiled_mma)

            # Ping-pong order: warpgroup w may start the mainloop of its unit u only after
            # the other warpgroup finished the mainloop of unit u - nunits. Besides keeping
            # the tensor cores to one warpgroup at a time, this is what makes the mbarrier
            # parity waits sound: when we first wait on ring position p, every position < p
            # has been consumed, so p's stage is at most one phase ahead of its barrier.
            # (Cooperative: both warpgroups wait on every position in order; the producer
            # refills a stage only once both released it.)
            mine_done = pipeline.NamedBarrier(barrier_id=2 + wg, num_threads=256)
            other_done = pipeline.NamedBarrier(barrier_id=3 - wg, num_threads=256)
            unit = unit0 + self.first_unit_offset(wg, nunits)
            # the debug build's stamps (trace.py; None here) and the tiles run so far
            tr = self._trace_begin(b_desc_ptr, tidx, bid, nblocks, wg)
            tcount = Int32(0)

            epi = EpilogueParams(mD, mAct, sAct, mAmax, mAlpha, mBeta, mProb, mDprob,
                                 geglu_alpha, clamp_max, clamp_min, linear_offset, mx)
            pos = Int32(0) if self.coop else wg * self.k_tile_cnt  # first k-tile's ring position
            cpos = Int32(0)  # position in this warpgroup's private C FIFO
            kslot = Int32(0)  # (cooperative dbias) blocks handed over so far
            if cutlass.const_expr(split is None):
                while unit < num_units:
                    m_tile, n_tile = self.tile_of(unit, walk)
                    expert, row0, row_end = self.tile_rows(m_tile, walk)
                    self._stamp(tr, 0, tcount, wg, bid)
                    scales = None  # (blockwise) the promotion's operands
                    if cutlass.const_expr(self.cfg.blockwise()):
                        scales = (part, mSFA, mSFB, self._thread_rows(tCcC, row0), n_tile, expert)
                    if cutlass.const_expr(self.coop):
                        self._stamp(tr, 1, tcount, wg, bid)
                        if cutlass.const_expr(scales is not None):
                            stagger = None
                            if cutlass.const_expr(self.cfg.wg_stagger):
                                stagger = (wg, pipeline.NamedBarrier(barrier_id=STAGGER_BARRIER,
                                                                     num_threads=256))
                            self.mma_mainloop_blockwise(ab_pipe, mmas, tCrA, tCrB, acc, pos, scales,
                                                        mine_done, False, stagger)
                        else:
                            self.mma_mainloop(ab_pipe, mmas, tCrA, tCrB, acc, pos, mine_done,
                                              False)
                    else:
                        if unit >= nunits:  # a previous unit (the other warpgroup's) exists
                            other_done.arrive_and_wait()
                        self._stamp(tr, 1, tcount, wg, bid)
                        if cutlass.const_expr(scales is not None):
                            self.mma_mainloop_blockwise(ab_pipe, mmas, tCrA, tCrB, acc, pos, scales,
                                                        mine_done, unit + nunits < num_units)
                        else:
                            self.mma_mainloop(ab_pipe, mmas, tCrA, tCrB, acc, pos, mine_done,
                                              unit + nunits < num_units)
                    self._stamp(tr, 2, tcount, wg, bid)
                    self.epilogue(acc, tCcC, c_pipe, sC, wg, cpos, epi, (row0, row_end), n_tile,
                                  expert, tidx, sDb, hand_mbar, kslot)
                    self._stamp(tr, 3, tcount, wg, bid)
                    if cutlass.const_expr(self.cfg.coop_dbias_slots()):
                        kslot += self._valid_blocks(n_tile * self.tile_n)
                    tcount += 1
                    cpos += self.nent
                    unit += self.unit_step(nunits)
                    pos += self.unit_step(1) * self.k_tile_cnt
            else:
                split_bar = pipeline.NamedBarrier(barrier_id=SPLIT_BARRIER, num_threads=256)
                # (cooperative) whole units, then the pieces of the split last round
                i = Int32(0)
                while i < split.items:
                    unit, _, kcnt, final, handed, r, first, count = self.split_item(
                        i, unit0, nunits, split)
                    m_tile, n_tile = self.tile_of(unit, walk)
                    expert, row0, row_end = self.tile_rows(m_tile, walk)
                    self._stamp(tr, 0, tcount, wg, bid)
                    self._stamp(tr, 1, tcount, wg, bid)
                    self.mma_mainloop(ab_pipe, mmas, tCrA, tCrB, acc, pos, mine_done, False,
                                      kcnt)
                    self._stamp(tr, 2, tcount, wg, bid)
                    if handed:  # a part of a split unit
                        self._split_hand_over(acc, split, unit0, r, first, count, final, tidx,
                                              split_bar)
                    if final:
                        self.epilogue(acc, tCcC, c_pipe, sC, wg, cpos, epi, (row0, row_end),
                                      n_tile, expert, tidx, sDb, hand_mbar, kslot)
                        if cutlass.const_expr(self.cfg.coop_dbias_slots()):
                            kslot += self._valid_blocks(n_tile * self.tile_n)
                        cpos += self.nent
                    self._stamp(tr, 3, tcount, wg, bid)
                    tcount += 1
                    pos += kcnt
                    i += 1
            self._trace_end(tr, wg, bid)

    # ------------------------------------------------------------------ schedule
    def first_unit_offset(self, wg, nunits):
        """Ping-pong: warpgroup w starts at the CTA's unit w; cooperative: both at unit 0."""
        return 0 if self.coop else wg * nunits

    def unit_step(self, nunits):
        """Units between a warpgroup's consecutive tiles (every CTA tile when cooperative)."""
        return nunits if self.coop else MATH_WARPGROUPS * nunits

    def c_row_block(self, m_tile, w, h=0):
        """Row-block coordinate (in c_rows units) of warpgroup w's C/D rows of M-tile m_tile
        (ping-pong with c_split 2: of their row half h)."""
        return m_tile * MATH_WARPGROUPS + w if self.coop else m_tile * self.c_split + h

    @cute.jit
    def tile_of(self, unit, walk):
        """(m_tile, n_tile) of this CTA in schedule unit ``unit``: the unit's cluster_m x
        cluster_n tiles (grouped raster over units), the CTA's rank picking one."""
        _, _, valid_m_units, rank, _ = walk
        cm, cn = self.cfg.cluster_m, self.cfg.cluster_n
        m_unit, n_unit = grouped_raster(unit, valid_m_units, self.cfg.num_n_units(),
                                        self.cfg.raster_group())
        return m_unit * cm + rank % cm, n_unit * cn + rank // cm

    def tile_rows(self, m_tile, walk):
        """(expert, first row, end row) of M-tile ``m_tile``: its 128 rows lie inside one
        expert with 256-aligned offsets (end = first + 128); ``ragged_m``: the ragged
        schedule's tile (``tile_walk.ragged_tile``), whose rows from ``end`` on are masked."""
        mOffs, mTable, num_experts, m_rows = walk[4]
        if cutlass.const_expr(self.cfg.ragged_m):
            return ragged_tile(mTable, mOffs, num_experts, m_rows, m_tile, self.cfg.cluster_m)
        row0 = m_tile * TILE_M
        return expert_of_row(mOffs, num_experts, row0), row0, row0 + TILE_M

    # ------------------------------------------------------------------ ragged rows (TMA)
    @staticmethod
    def _ragged_rows_tensor(mT):
        """``mT`` (rows, cols), row-major, as the rank-4 tensor a clipping TMA store goes
        through (``ragged_m``): (RAGGED_BIG, cols, E, E) with strides (s, 1, W, s),
        s = the row stride, W = 2^64 / RAGGED_BIG - s elements. At (RAGGED_BIG - len + r, c,
        RAGGED_BIG, row0 + len) the address is base + (row0 + r) s + c + RAGGED_BIG (s + W)
        = base + (row0 + r) s + c modulo 2^64 (RAGGED_BIG (s + W) = 2^64 elements), while the
        first coordinate leaves the tensor exactly where r reaches len: TMA clips the box
        there. The base address is the tensor's own (``_ragged_rows`` picks the
        coordinates)."""
        s = mT.layout.stride[0]
        # (the extra extents dynamic: static ones overflow the layout's size arithmetic)
        return cute.make_tensor(mT.iterator, cute.make_layout(
            (RAGGED_BIG, mT.layout.shape[1], Int32(RAGGED_EXTENT), Int32(RAGGED_EXTENT)),
            stride=(s, 1, (1 << 64) // RAGGED_BIG - s, s)))

    @staticmethod
    def _ragged_rows(mT_tma, row0, length):
        """The rank-2 coordinate view of a ``_ragged_rows_tensor`` TMA tensor whose row r is
        global row row0 + r and whose rows from ``length`` on are out of bounds."""
        view = mT_tma[(None, None, RAGGED_BIG, row0 + length)]
        return cute.domain_offset((RAGGED_BIG - length, None), view)


    # ------------------------------------------------------------------ diagnostic hooks
    # No-ops in the production kernel (no IR); the debug build (trace.TracedGroupedDgluSm90)
    # records per-tile clock stamps through them.
    def _trace_begin(self, b_desc_ptr, tidx, bid, nblocks, wg):
        return None

    def _stamp(self, tr, j, t, wg, bid):
        pass

    def _trace_end(self, tr, wg, bid):
        pass
