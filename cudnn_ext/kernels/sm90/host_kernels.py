"""The SM90 kernel's helper kernels, launched before the main one on the same stream (a mixin of
:class:`~.kernel.GroupedDgluSm90`): the zeroing of the workspace's dbias region, the
fresh-outputs prologue (``init_outputs``), the per-expert B TMA descriptors of discrete
weights, built on the device from the pointer table (no host read of pointers), and the ragged
schedule's tile table (``ragged_m``), built on the device from the offsets.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.tensor_utils.tensormap import TensorMapManager, TensorMapUpdateMode

from .config import DESC_BYTES
from .tile_walk import dsl_ops, ragged_units


@cute.jit
def _zero_from(mT: cute.Tensor, start: Int32, step: Int32):
    """Grid-stride fill of the flat tensor ``mT`` with zeros: elements start, start + step,
    ... (each thread passes its own start; step = the grid's thread count)."""
    i = start
    while i < cute.size(mT):
        mT[i] = mT.element_type(0)
        i += step



class HostKernelsMixin:
    """``dbias_zero``, ``init_outputs`` and ``build_b_descriptors`` (each a ``cute.kernel``),
    and ``_desc_ptr``, the descriptor slot of an expert (also read by the A/B producer)."""

    def _b_stride(self):
        """(N, K, L=1) strides of one discrete expert, in elements."""
        n, k = self.cfg.n, self.cfg.k
        return (k, 1, 0) if self.cfg.b_major == "k" else (1, n, 0)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def dbias_zero(self, mWs: cute.Tensor):
        """Grid-stride: the workspace's dbias region (fp32 sums, arrival counters) := 0
        before the main kernel adds to it (whatever it held: caller-provided scratch)."""
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nblocks, _, _ = cute.arch.grid_dim()
        _zero_from(mWs, bid * 256 + tidx, nblocks * 256)

    @cute.kernel
    def init_outputs(self, mWs: cute.Tensor, mDprob: cute.Tensor, mDflat: cute.Tensor,
                     mDb: cute.Tensor, mAct: cute.Tensor, mOffs: cute.Tensor, num_experts: Int32):
        """Grid-stride, before the main kernel (fresh outputs): dprob := 0, D rows (and the
        activation output's) at/past offs[L-1] := 0 (the main kernel writes every row before
        it), and with dbias the bf16 dbias and the workspace's dbias region := 0 (the
        kernel's fold then adds to zero; empty experts stay zero)."""
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nblocks, _, _ = cute.arch.grid_dim()
        step = nblocks * 256
        _zero_from(mDprob, bid * 256 + tidx, step)
        _zero_from(mDflat, mOffs[num_experts - 1] * (2 * self.cfg.n) + bid * 256 + tidx, step)
        if cutlass.const_expr(self.cfg.generate_activation):
            _zero_from(mAct, mOffs[num_experts - 1] * self.cfg.n + bid * 256 + tidx, step)
        if cutlass.const_expr(self.cfg.generate_dbias or self.cfg.split()):
            _zero_from(mWs, bid * 256 + tidx, step)
        if cutlass.const_expr(self.cfg.generate_dbias):
            _zero_from(mDb, bid * 256 + tidx, step)

    @cute.kernel
    def ragged_table(self, mOffs: cute.Tensor, mTable: cute.Tensor, num_experts: Int32,
                     m_rows: Int32):
        """One warp: table[e] = units of experts 0..e in the ragged schedule (the running
        sum of ``tile_walk.ragged_units``), 32 experts per step: each lane counts its
        expert's tiles, a shuffle scan sums them, and lane 31's total carries over. No host
        read of the offsets, so a CUDA graph replay with new offsets gets a new table."""
        lane, _, _ = cute.arch.thread_idx()
        ops = dsl_ops()
        carry = Int32(0)
        base = Int32(0)
        while base < num_experts:
            e = base + lane
            count = Int32(0)
            if e < num_experts:
                start = Int32(0)
                if e > 0:
                    start = cutlass.min(mOffs[e - 1], m_rows)
                # (clipped at M: offsets past it break the contract; no tile may start there)
                count = ragged_units(cutlass.min(mOffs[e], m_rows) - start, self.cfg.cluster_m,
                                     ops)
            for d in cutlass.range_constexpr(5):
                up = cute.arch.shuffle_sync_up(count, offset=1 << d)
                if lane >= (1 << d):
                    count = count + up
            if e < num_experts:
                mTable[e] = carry + count
            carry = carry + cute.arch.shuffle_sync(count, 31)
            base += 32

    @cute.kernel
    def build_b_descriptors(self, b_ptrs_ptr: cute.Pointer, b_desc_ptr: cute.Pointer,
                            b_smem: cute.ComposedLayout):
        """Grid = L, one warp: block e encodes expert e's B TMA descriptor (the same box,
        swizzle and shape as the template, at the address read from the device pointer
        table) and writes it to b_desc_ptr + e * DESC_BYTES."""
        e, _, _ = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            table = cute.make_tensor(
                cute.make_ptr(cutlass.Int64, b_ptrs_ptr.toint(), cute.AddressSpace.gmem,
                              assumed_align=8),
                cute.make_layout((e + 1,)))
            base = cute.make_ptr(self.ab_dtype, table[e], cute.AddressSpace.gmem,
                                 assumed_align=16)
            mBe = cute.make_tensor(
                base, cute.make_layout((self.cfg.n, self.cfg.k, 1), stride=self._b_stride()))
            cm = self.cfg.cluster_m
            op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cm > 1
                  else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
            atom, _ = cute.nvgpu.cpasync.make_tiled_tma_atom(
                op, mBe, b_smem, (self.tile_n, self.tile_k), num_multicast=cm)
            # The DSL's device-side encoding of this rank-2 map writes only the first 64
            # bytes (PTX: 4 x st.global.v2.b64); zero the rest so every byte of the 128-B
            # slot is defined whatever the workspace held before.
            words = cute.make_tensor(
                cute.make_ptr(cutlass.Int64, b_desc_ptr.toint() + cutlass.Int64(e) * DESC_BYTES,
                              cute.AddressSpace.gmem, assumed_align=DESC_BYTES),
                cute.make_layout((DESC_BYTES // 8,)))
            for w in cutlass.range_constexpr(DESC_BYTES // 16, DESC_BYTES // 8):
                words[w] = cutlass.Int64(0)
            cute.nvgpu.cpasync.copy_tensormap(atom, self._desc_ptr(b_desc_ptr, e,
                                                                   cute.AddressSpace.gmem))
            # make the generic-proxy writes visible to the tensormap proxy (gpu scope)
            cute.nvgpu.cpasync.fence_tma_desc_release()

    def _desc_ptr(self, b_desc_ptr, expert, space):
        """Expert ``expert``'s descriptor in the workspace as a TMA-descriptor pointer."""
        addr = b_desc_ptr.toint() + cutlass.Int64(expert) * DESC_BYTES
        raw = cute.make_ptr(cutlass.Int64, addr, cute.AddressSpace.gmem,
                            assumed_align=DESC_BYTES)
        mgr = TensorMapManager(TensorMapUpdateMode.GMEM, DESC_BYTES)
        return mgr.get_tensormap_ptr(raw, space)
