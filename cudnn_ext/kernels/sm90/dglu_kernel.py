"""Hopper (sm_90a) grouped GEMM + dGLU backward kernel, CuTe DSL.

Owns the device code and its launch: TMA + WGMMA mainloop, fused dSwiGLU/dGeGLU epilogue,
dprob and dbias partial reductions. It knows nothing about engines, knobs policy or torch;
``cudnn_ext.engines.sm90`` decides the configuration and passes raw device pointers.

Anatomy (one CTA = one 128 x TILE_N accumulator tile of one expert; 3 warpgroups):

* warpgroup 0, warp 0: TMA producer. Streams (128 x 64) A and (TILE_N x 64) B k-tiles into an
  ``ab_stages``-deep shared-memory ring (``PipelineTmaAsync``: full barriers carry the TMA
  transaction bytes, empty barriers are released by the consumers).
* warpgroups 1 and 2: consumers. Each issues WGMMA 64 x TILE_N x 16 for its 64-row half of the
  tile (one wgmma group in flight behind the current one), then runs the epilogue straight
  from the accumulator registers:
  coordinates of every accumulator element come from the identity tensor partitioned like the
  accumulator; C gate/up are read from global memory at C column 64*(n//32) + n%32 (+32 for
  up), the activation derivative is computed in fp32 (``epilogue_math``), D is written in its
  dtype, dprob gets one fp32 atomic per (row, N-tile) after a quad shuffle, and dbias gets
  per-warp column sums (8-row-group shuffle) added with fp32 atomics into a workspace that the
  host rounds once to bf16.

Runtime sizes (M, L, the offsets) are kernel arguments; N, K, dtypes, tile and activation are
compile-time. Tiles at or past ``padded_offsets[L-1]`` exit at once. TMA zero-fills the K and
N tails, so K need not be a multiple of 64 nor N of TILE_N (stores are guarded by n < N).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Type

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32

from .epilogue_math import dgeglu_local, dswiglu_local
from .tile_walk import expert_of_row, grouped_raster

TILE_M = 128  # two consumer warpgroups x 64 rows; 256-aligned offsets => never straddles experts
TILE_K = 64  # 4 x WGMMA K (16) per k-tile: 128-byte rows => 128B swizzle for bf16
SMEM_CAPACITY = 232448  # sm_90 max dynamic shared memory per block (227 KB)
NUM_THREADS = 384  # 1 producer + 2 consumer warpgroups


@dataclass(frozen=True)
class Sm90KernelConfig:
    """Everything the compiled kernel is specialized on (never M, L or pointers)."""

    n: int
    k: int
    ab_dtype: Type[cutlass.Numeric]
    c_dtype: Type[cutlass.Numeric]
    d_dtype: Type[cutlass.Numeric]
    act_func: str  # "dswiglu" | "dgeglu"
    generate_dbias: bool
    tile_n: int = 128
    ab_stages: int = 0  # 0 = as many as fit
    raster_group_m: int = 8

    def stages(self) -> int:
        per_stage = (TILE_M + self.tile_n) * TILE_K * (self.ab_dtype.width // 8)
        fit = (SMEM_CAPACITY - 2048) // per_stage
        return min(fit, 8) if self.ab_stages == 0 else self.ab_stages

    def num_n_tiles(self) -> int:
        return (self.n + self.tile_n - 1) // self.tile_n


class GroupedDgluSm90:
    """Grouped GEMM + dGLU for one :class:`Sm90KernelConfig`. ``__call__`` is the jit entry."""

    def __init__(self, cfg: Sm90KernelConfig):
        if cfg.tile_n % 32 != 0 or not 32 <= cfg.tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 32 in [32, 256], got {cfg.tile_n}")
        if cfg.act_func not in ("dswiglu", "dgeglu"):
            raise ValueError(f"act_func {cfg.act_func!r} is not supported by the SM90 kernel")
        self.cfg = cfg
        self.tile_n = cfg.tile_n
        self.ab_stages = cfg.stages()
        self.tile_shape_mnk = (TILE_M, cfg.tile_n, TILE_K)
        self.num_n_tiles = cfg.num_n_tiles()
        self.k_tile_cnt = (cfg.k + TILE_K - 1) // TILE_K
        self.producer_regs = 40
        self.consumer_regs = 232
        self.num_consumer_warps = 8

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
        m: Int32,
        num_experts: Int32,
        geglu_alpha: Float32,
        clamp_max: Float32,
        clamp_min: Float32,
        linear_offset: Float32,
        stream: cuda.CUstream,
    ):
        cfg = self.cfg
        n, k = cfg.n, cfg.k
        mA = cute.make_tensor(a_ptr, cute.make_layout((m, k), stride=(k, 1)))
        mB = cute.make_tensor(
            b_ptr, cute.make_layout((n, k, num_experts), stride=(k, 1, n * k)))
        mC = cute.make_tensor(c_ptr, cute.make_layout((m, 2 * n), stride=(2 * n, 1)))
        mD = cute.make_tensor(d_ptr, cute.make_layout((m, 2 * n), stride=(2 * n, 1)))
        mOffs = cute.make_tensor(offs_ptr, cute.make_layout((num_experts,)))
        mAlpha = cute.make_tensor(alpha_ptr, cute.make_layout((num_experts,)))
        mBeta = cute.make_tensor(beta_ptr, cute.make_layout((num_experts,)))
        mProb = cute.make_tensor(prob_ptr, cute.make_layout((m,)))
        mDprob = cute.make_tensor(dprob_ptr, cute.make_layout((m,)))
        mDbias = cute.make_tensor(
            dbias_ws_ptr, cute.make_layout((num_experts, 2 * n), stride=(2 * n, 1)))

        a_layout = utils.LayoutEnum.ROW_MAJOR  # (M, K) K-major
        b_layout = utils.LayoutEnum.ROW_MAJOR  # (N, K) K-major
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            cfg.ab_dtype, cfg.ab_dtype,
            a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
            Float32, (2, 1, 1), tiler_mn=(64, self.tile_n))
        a_smem_staged = sm90_utils.make_smem_layout_a(
            a_layout, self.tile_shape_mnk, cfg.ab_dtype, self.ab_stages)
        b_smem_staged = sm90_utils.make_smem_layout_b(
            b_layout, self.tile_shape_mnk, cfg.ab_dtype, self.ab_stages)

        a_smem = cute.slice_(a_smem_staged, (None, None, 0))
        b_smem = cute.slice_(b_smem_staged, (None, None, 0))
        tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mA, a_smem, (TILE_M, TILE_K))
        tma_atom_b, tma_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mB, b_smem, (self.tile_n, TILE_K))

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[cfg.ab_dtype, cute.cosize(a_smem_staged)], 1024]
            sB: cute.struct.Align[
                cute.struct.MemRange[cfg.ab_dtype, cute.cosize(b_smem_staged)], 1024]

        self.shared_storage = SharedStorage

        num_m_tiles = m // TILE_M
        grid = (num_m_tiles * self.num_n_tiles, 1, 1)
        self.kernel(
            tma_atom_a, tma_a, tma_atom_b, tma_b, mC, mD, mOffs, mAlpha, mBeta, mProb,
            mDprob, mDbias, num_m_tiles, num_experts, geglu_alpha, clamp_max, clamp_min,
            linear_offset, tiled_mma, a_smem_staged, b_smem_staged,
        ).launch(grid=grid, block=[NUM_THREADS, 1, 1], min_blocks_per_mp=1, stream=stream)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,
        mC: cute.Tensor,
        mD: cute.Tensor,
        mOffs: cute.Tensor,
        mAlpha: cute.Tensor,
        mBeta: cute.Tensor,
        mProb: cute.Tensor,
        mDprob: cute.Tensor,
        mDbias: cute.Tensor,
        num_m_tiles: Int32,
        num_experts: Int32,
        geglu_alpha: Float32,
        clamp_max: Float32,
        clamp_min: Float32,
        linear_offset: Float32,
        tiled_mma: cute.TiledMma,
        a_smem_staged: cute.ComposedLayout,
        b_smem_staged: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        m_tile, n_tile = grouped_raster(bid, num_m_tiles, self.num_n_tiles,
                                        self.cfg.raster_group_m)
        row0 = m_tile * TILE_M
        total_rows = mOffs[num_experts - 1]
        # Whole CTA takes the same branch: tiles past the last expert do nothing.
        if row0 < total_rows:
            expert = expert_of_row(mOffs, num_experts, row0)
            self.tile_body(
                tma_atom_a, mA, tma_atom_b, mB, mC, mD, mAlpha, mBeta, mProb, mDprob,
                mDbias, geglu_alpha, clamp_max, clamp_min, linear_offset, tiled_mma,
                a_smem_staged, b_smem_staged, tidx, warp_idx, m_tile, n_tile, expert)

    @cute.jit
    def tile_body(self, tma_atom_a, mA, tma_atom_b, mB, mC, mD, mAlpha, mBeta, mProb,
                  mDprob, mDbias, geglu_alpha, clamp_max, clamp_min, linear_offset,
                  tiled_mma, a_smem_staged, b_smem_staged, tidx, warp_idx, m_tile, n_tile,
                  expert):
        if warp_idx == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_atom_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_atom_b)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)

        a_smem = cute.slice_(a_smem_staged, (None, None, 0))
        b_smem = cute.slice_(b_smem_staged, (None, None, 0))
        tx_bytes = cute.size_in_bytes(self.cfg.ab_dtype, a_smem) + cute.size_in_bytes(
            self.cfg.ab_dtype, b_smem)
        ab_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=self.ab_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # one release per consumer warp (no cluster => one signalling lane per warp)
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.num_consumer_warps),
            tx_count=tx_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

        # (bM, bK, RestK) and (bN, bK, RestK) global views of this tile
        gA = cute.local_tile(mA, (TILE_M, TILE_K), (m_tile, None))
        gB = cute.local_tile(mB[(None, None, expert)], (self.tile_n, TILE_K), (n_tile, None))
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_atom_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_atom_b, 0, cute.make_layout(1), cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2))

        warp_group = cute.arch.make_warp_uniform(tidx // 128)
        if warp_group == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(ab_pipe, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            thr_mma = tiled_mma.get_slice(tidx - 128)
            tCsA = thr_mma.partition_A(sA)
            tCsB = thr_mma.partition_B(sB)
            tCrA = tiled_mma.make_fragment_A(tCsA)
            tCrB = tiled_mma.make_fragment_B(tCsB)
            cC = cute.make_identity_tensor((TILE_M, self.tile_n))
            tCcC = thr_mma.partition_C(cC)
            acc = cute.make_rmem_tensor(tCcC.shape, Float32)
            self.mma_mainloop(ab_pipe, tiled_mma, tCrA, tCrB, acc)
            self.epilogue(acc, tCcC, mC, mD, mAlpha, mBeta, mProb, mDprob, mDbias,
                          geglu_alpha, clamp_max, clamp_min, linear_offset, m_tile, n_tile,
                          expert, tidx)

    @cute.jit
    def producer(self, ab_pipe, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB):
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                             self.ab_stages)
        for kt in range(self.k_tile_cnt):
            ab_pipe.producer_acquire(state)
            bar = ab_pipe.producer_get_barrier(state)
            cute.copy(tma_atom_a, tAgA[(None, kt)], tAsA[(None, state.index)], tma_bar_ptr=bar)
            cute.copy(tma_atom_b, tBgB[(None, kt)], tBsB[(None, state.index)], tma_bar_ptr=bar)
            ab_pipe.producer_commit(state)
            state.advance()
        # do not exit while the consumers may still arrive on our empty barriers
        ab_pipe.producer_tail(state)

    @cute.jit
    def mma_mainloop(self, ab_pipe, tiled_mma, tCrA, tCrB, acc):
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                               self.ab_stages)
        num_k_blocks = cute.size(tCrA, mode=[2])
        # first k-tile overwrites the accumulator (no zero fill needed)
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
        cute.nvgpu.warpgroup.fence()
        ab_pipe.consumer_wait(read)
        for kb in cutlass.range_constexpr(num_k_blocks):
            coord = (None, None, kb, read.index)
            cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        cute.nvgpu.warpgroup.commit_group()
        read.advance()
        # steady state: keep one wgmma group in flight, release the stage it finished with
        for kt in range(1, self.k_tile_cnt):
            ab_pipe.consumer_wait(read)
            cute.nvgpu.warpgroup.fence()
            for kb in cutlass.range_constexpr(num_k_blocks):
                coord = (None, None, kb, read.index)
                cute.gemm(tiled_mma, acc, tCrA[coord], tCrB[coord], acc)
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(1)
            ab_pipe.consumer_release(release)
            release.advance()
            read.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        ab_pipe.consumer_release(release)

    @cute.jit
    def epilogue(self, acc, tCcC, mC, mD, mAlpha, mBeta, mProb, mDprob, mDbias, geglu_alpha,
                 clamp_max, clamp_min, linear_offset, m_tile, n_tile, expert, tidx):
        """Fused dGLU epilogue from the WGMMA accumulator registers.

        WGMMA 64xN f32 fragment per thread: value v -> column pair bit v%2, row +8 when
        (v//2)%2 == 1, 8-column group v//4 (rows lane//4 and lane//4 + 8 of its warp's 16,
        columns 2*(lane%4) + {0,1} of each 8-column group). So each thread owns exactly two
        rows (slot 0/1, static per v) and TILE_N/4 columns (static per v).
        """
        cfg = self.cfg
        n_total = cfg.n
        row0 = m_tile * TILE_M
        n0 = n_tile * self.tile_n
        alpha = mAlpha[expert]
        g_scale = alpha * alpha
        beta = mBeta[expert]
        lane = tidx % 32

        nvals = cute.size(acc)
        ncols = nvals // 2
        r_local0 = tCcC[0][0]
        r_local1 = tCcC[2][0]
        p0 = mProb[row0 + r_local0]
        p1 = mProb[row0 + r_local1]
        dprob0 = Float32(0.0)
        dprob1 = Float32(0.0)
        col_gate = cute.make_rmem_tensor((ncols,), Float32)
        col_up = cute.make_rmem_tensor((ncols,), Float32)
        col_gate.fill(0.0)
        col_up.fill(0.0)

        for v in cutlass.range_constexpr(nvals):
            slot = (v // 2) % 2
            col = (v // 4) * 2 + v % 2
            coord = tCcC[v]
            row = row0 + coord[0]
            nl = coord[1]
            valid = (n0 + nl) < n_total
            gc = 2 * n0 + nl + 32 * (nl // 32)
            gate = Float32(0.0)
            up = Float32(0.0)
            if valid:
                gate = mC[row, gc].to(Float32) * beta
                up = mC[row, gc + 32].to(Float32) * beta
            p = p0 if slot == 0 else p1
            g0 = acc[v] * g_scale
            if cutlass.const_expr(cfg.act_func == "dswiglu"):
                dg_l, du_l, act = dswiglu_local(gate, up)
            else:
                dg_l, du_l, act = dgeglu_local(gate, up, geglu_alpha, clamp_max, clamp_min,
                                               linear_offset)
            gp = g0 * p
            dgate = gp * dg_l
            dup = gp * du_l
            if cutlass.const_expr(slot == 0):
                dprob0 = dprob0 + g0 * act
            else:
                dprob1 = dprob1 + g0 * act
            if cutlass.const_expr(cfg.generate_dbias):
                col_gate[col] = col_gate[col] + dgate
                col_up[col] = col_up[col] + dup
            if valid:
                mD[row, gc] = dgate.to(cfg.d_dtype)
                mD[row, gc + 32] = dup.to(cfg.d_dtype)

        # dprob: the 4 lanes of a quad hold the same two rows -> butterfly over lane bits 0-1
        for off in cutlass.range_constexpr(2):
            dprob0 = dprob0 + cute.arch.shuffle_sync_bfly(dprob0, offset=1 << off)
            dprob1 = dprob1 + cute.arch.shuffle_sync_bfly(dprob1, offset=1 << off)
        if lane % 4 == 0:
            cute.arch.atomic_add((mDprob.iterator + (row0 + r_local0)).llvm_ptr, dprob0)
            cute.arch.atomic_add((mDprob.iterator + (row0 + r_local1)).llvm_ptr, dprob1)

        if cutlass.const_expr(cfg.generate_dbias):
            # columns are shared by the 8 quads of a warp -> butterfly over lane bits 2-4
            for c in cutlass.range_constexpr(ncols):
                g = col_gate[c]
                u = col_up[c]
                for off in cutlass.range_constexpr(3):
                    g = g + cute.arch.shuffle_sync_bfly(g, offset=4 << off)
                    u = u + cute.arch.shuffle_sync_bfly(u, offset=4 << off)
                col_gate[c] = g
                col_up[c] = u
            if lane < 4:
                for c in cutlass.range_constexpr(ncols):
                    v = (c // 2) * 4 + c % 2
                    nl = tCcC[v][1]
                    if n0 + nl < n_total:
                        gc = 2 * n0 + nl + 32 * (nl // 32)
                        base = expert * (2 * n_total) + gc
                        cute.arch.atomic_add((mDbias.iterator + base).llvm_ptr, col_gate[c])
                        cute.arch.atomic_add((mDbias.iterator + (base + 32)).llvm_ptr,
                                             col_up[c])
