"""The split last round of the cooperative SM90 schedule, stream-K (``Sm90Config.split_last``;
a mixin of :class:`~.kernel.GroupedDgluSm90`).

The static schedule's last, partial round is spread along K over up to rem x split_last
clusters (rem: its units; ``tile_walk.last_round_split`` picks the spread at run time): each of
those clusters takes an equal range of the round's k-tiles laid end to end, so a unit comes in
up to split_last + 1 parts. A non-final part stores its fp32 accumulators in its cluster's
workspace slot and counts itself on the unit's flag; the final part (the one with the last
k-tiles: it alone loads C and runs the epilogue) waits for the others' count, adds their sums
in cluster order (deterministic) and resets the flag. Every cluster runs its non-final part
first, and a final part waits only on clusters of lower index, at their first part
(``tile_walk.split_share``): no cycle, no chain, and no wait on a cluster that is not resident
yet if clusters start in index order (the grid is at most the resident clusters anyway).
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir import ir

from .config import SPLIT_SLOTS
from .tile_walk import dsl_ops, last_round_split, next_epilogue_unit, split_share
from .tile_walk import split_item as schedule_item


class SplitWalk(NamedTuple):
    """One cluster's view of the split last round (``Sm90Config.split_last``), the
    same in every warp of the CTA: ``tile_walk.last_round_split``'s (full, rem, p); the
    cluster's items (its ``rounds`` whole units, then its ``pieces`` last-round pieces of
    k-tiles [lo, hi) of the last round, starting in its unit u0: ``split_item``); the
    last-round unit whose final part it runs, [tail_start, epi_end) (the walk of the C
    producers and the folder: ``next_epi_unit``); the workspace region's address and the
    expert count (where the flags and the partial-sum slots lie: ``_split_flag``,
    ``_split_slots``; one 64-bit value instead of two pointers live through the math loop:
    with both, a mixed-type dbias epilogue spilled 4 B) and the CTA's rank in the
    cluster."""

    full: object
    rem: object
    p: object
    rounds: object
    items: object
    pieces: object
    lo: object
    hi: object
    u0: object
    tail_start: object
    epi_end: object
    ws: object
    num_experts: object
    rank: object



class StreamKMixin:
    """The walk of a cluster through the split last round, shared by the producer, the math
    warpgroups, the C producers and the folder; the partial sums' hand-over."""

    # ------------------------------------------------------------------ split last round
    @cute.jit
    def split_walk(self, num_units, nunits, cluster, rank, mDbias, num_experts):
        """This cluster's ``SplitWalk``; the workspace regions follow the dbias region
        (``Sm90Config.split_flags``, ``split_part_offset``)."""
        ops = dsl_ops()
        full, rem, p = last_round_split(num_units, nunits, self.k_tile_cnt,
                                        min(self.cfg.split_last, self.k_tile_cnt),
                                        SPLIT_SLOTS, ops)
        # the cluster's range of the last round (tile_walk.split_share: why the final
        # parts' waits can neither cycle nor chain)
        pieces, lo, hi, u0, tail_start, epi_end = split_share(
            cluster, num_units, full, rem, p, self.k_tile_cnt, ops)
        rounds = full // nunits
        return SplitWalk(full, rem, p, rounds, rounds + pieces, pieces, lo, hi, u0, tail_start,
                         epi_end, mDbias.iterator.toint(), num_experts, rank)

    def _split_slots(self, sw):
        """The partial-sum slots (16-byte aligned: the engine checks the region's address)."""
        off = cutlass.Int64(self.cfg.split_part_offset(sw.num_experts)) * 4
        return cute.make_ptr(Float32, sw.ws + off, cute.AddressSpace.gmem, assumed_align=16)

    @cute.jit
    def split_item(self, i, cluster, nunits, sw):
        """Item i of this cluster's walk (producer and math warps): (unit, first k-tile,
        k-tiles, final, handed, last-round unit r, first, count): ``tile_walk.split_item``
        on this cluster's ``SplitWalk``."""
        unit, kb, ke, final, handed, r, first, count = schedule_item(
            i, cluster, nunits, sw.rounds, sw.full, sw.rem, sw.p, sw.pieces, sw.lo, sw.hi,
            sw.u0, self.k_tile_cnt, dsl_ops())
        return unit, kb, ke - kb, final, handed, r, first, count

    def first_epi_unit(self, unit0, split):
        """The first unit whose epilogue this CTA runs (C producers, folder)."""
        if cutlass.const_expr(split is None):
            return unit0
        return Int32(cutlass.select_(unit0 < split.full, unit0, split.tail_start))

    def next_epi_unit(self, unit, step, split):
        """The unit after ``unit`` whose epilogue this warp's walk takes: ``step`` units on,
        or (split) whole units ``step`` apart, then the cluster's one final part's unit,
        ``tail_start`` (the walk ends at ``epi_end``)."""
        if cutlass.const_expr(split is None):
            return unit + step
        return next_epilogue_unit(unit, step, split.full, split.tail_start, dsl_ops())

    def epi_end(self, num_units, split):
        """Where the C producers' and the folder's walk ends (see ``next_epi_unit``)."""
        return num_units if cutlass.const_expr(split is None) else split.epi_end

    def _split_slot_offset(self, sw, slot, i, tidx):
        """Float offset of this thread's i-th 4 accumulators in partial slot ``slot`` (this
        CTA's part of it): [slot][CTA rank][i][math thread][4], so each store or load
        instruction of a warp covers 512 contiguous bytes."""
        nv4 = self.acc_values() // 4
        return cute.assume(
            (((slot * self.cfg.cluster_size() + sw.rank) * nv4 + i) * 256 + (tidx - 128)) * 4,
            divby=4)

    def acc_values(self) -> int:
        """fp32 accumulator values per math thread (cooperative: 64 x tile_n / 128)."""
        return self.wg_rows * self.tile_n // 128

    def _split_flag(self, sw, r):
        flag = self.cfg.dbias_ws_elems(sw.num_experts) + r * self.cfg.cluster_size() + sw.rank
        return cute.make_ptr(Int32, sw.ws + cutlass.Int64(flag) * 4, cute.AddressSpace.gmem,
                             assumed_align=4).llvm_ptr

    @cute.jit
    def _split_hand_over(self, acc, sw, slot, r, first, count, final, tidx, split_bar):
        """A part of split last-round unit r, around one meeting of the 256 math threads on
        ``split_bar`` (one blocking site: threads that block in one generation of an aligned
        barrier must do so at one instruction; here every thread of both
        warpgroups takes the same branch). A non-final part stores this CTA's fp32
        accumulators in slot ``slot`` (its cluster's), each thread fences its stores at gpu
        scope, and after the meeting one thread counts the part on the unit's flag (the
        threadFenceReduction order). The final part: one thread waits until the unit's
        ``count`` others are counted (acquire loads) and resets the flag for the next
        launch (no other part of this launch touches it again); after the meeting every
        thread adds slots first, first + 1, ..., first + count - 1 in that order
        (deterministic) to ``acc``, read through L2 (.cg): another SM wrote them."""
        if final:
            if tidx == 128:
                flag = self._split_flag(sw, r)
                seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
                while seen < count:
                    seen = cute.arch.load(flag, Int32, sem="acquire", scope="gpu")
                cute.arch.store(flag, Int32(0), sem="relaxed", scope="gpu")
        else:
            for i in cutlass.range_constexpr(self.acc_values() // 4):
                frag = cute.make_rmem_tensor((4,), Float32)
                for j in cutlass.range_constexpr(4):
                    frag[j] = acc[4 * i + j]
                cute.make_tensor(self._split_slots(sw) + self._split_slot_offset(sw, slot, i,
                                                                                 tidx),
                                 cute.make_layout(4)).store(frag.load())
            cute.arch.fence_acq_rel_gpu()
        split_bar.arrive_and_wait()
        if final:
            cute.arch.fence_acq_rel_gpu()
            v4 = ir.VectorType.get([4], Float32.mlir_type)
            for q in cutlass.range(count):
                for i in cutlass.range_constexpr(self.acc_values() // 4):
                    ptr = (self._split_slots(sw)
                           + self._split_slot_offset(sw, first + q, i, tidx)).llvm_ptr
                    part = cute.TensorSSA(cute.arch.load(ptr, v4, cop="cg"), (4,), Float32)
                    for j in cutlass.range_constexpr(4):
                        acc[4 * i + j] = acc[4 * i + j] + part[j]
        else:
            if tidx == 128:
                cute.arch.red(self._split_flag(sw, r), Int32(1), op="add", dtype="s32",
                              sem="release", scope="gpu")
