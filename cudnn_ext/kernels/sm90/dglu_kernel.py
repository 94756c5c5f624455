"""Hopper (sm_90a) grouped GEMM + dGLU backward kernel, CuTe DSL.

Owns the device code and its launch: TMA + WGMMA mainloop, fused dSwiGLU/dGeGLU epilogue,
dprob and dbias partial reductions. It knows nothing about engines, knob policy or torch;
``cudnn_ext.engines.sm90`` picks the configuration and passes raw device pointers.

Anatomy: a persistent, warp-specialized "ping-pong" kernel, 3 warpgroups per CTA, one CTA
per SM, optionally in clusters of ``cluster_m`` = 2 CTAs along M. The schedule walks units
u = cluster id, + #clusters, ... of the (offs[L-1]/(128*cluster_m)) x ceil(N/TILE_N) grid
(``tile_walk``); a unit is one N-tile of a 128*cluster_m-row slab of one expert, and CTA
rank r of the cluster computes its 128-row tile r (128 rows x TILE_N accumulator columns).
With a cluster, B k-tiles are TMA-multicast: each CTA loads 1/cluster_m of the tile into
every CTA's shared memory. With ``cluster_n`` = 2 as well (2x2 clusters, rank = m + 2n), a
unit also spans 2 N-tiles and A k-tiles are multicast the same way along N.

* warpgroup 0, warp 0: A/B TMA producer. For every tile of the CTA, in order, streams the
  (128 x 64) A and (TILE_N x 64) B k-tiles into an ``ab_stages``-deep shared-memory ring
  (``PipelineTmaAsync``: full barriers count the TMA bytes, empty barriers are released by
  the consuming warpgroup's 4 warps).
* warpgroup 0, warps 1 and 2: C TMA producers, one per math warpgroup. Each walks the tiles
  of its math warpgroup and loads their C windows, 128 x 64 block by block (gate 32 + up 32
  columns), into that warpgroup's private ``c_stages``-deep ring, TMA-stores the D blocks
  the warpgroup writes over them, and (ping-pong, dbias) adds the warpgroup's column sums
  of each block to the workspace before it reloads the block's stage.
* warpgroups 1 and 2: math. Warpgroup w takes the CTA's tiles i = w, w+2, ...: WGMMA
  64 x TILE_N x 16 over two 64-row halves for the whole K, then the epilogue straight from
  the accumulator registers. The mainloops alternate strictly (named barriers 2 and 3), so
  one warpgroup's epilogue runs while the other's mainloop keeps the tensor cores busy.

Cooperative schedule (``cooperative``; where the engine picks it: ``engines.sm90``
``_cooperative_applies`` and docs/kernels.md): both math
warpgroups share every 128-row tile, warpgroup w owning rows 64w..64w+63 (tile_n up to
256), both consume every A/B stage, and each has a private ring of 64-row C blocks (its C
producer warp loads only its rows and stores its D half-blocks); no ping-pong
barriers. With ``split_last`` the static schedule's last, partial round is spread over the
clusters along K (stream-K: each cluster an equal range of its k-tiles, laid end to end):
non-final parts hand their fp32 accumulators to the unit's final part through workspace
slots and a flag (``_split_hand_over``; placement and why its waits cannot deadlock:
``tile_walk.split_share``), and only final parts load C and run the epilogue.

Epilogue (per 32-column block j, both 64-row halves): gate/up come from shared memory (C
block j), the activation derivative is computed in fp32 (``epilogue_math``); when D has C's
type, each thread writes its D values over the C elements it read, the warps release the
block and its C producer warp TMA-stores it before reloading the stage (otherwise 32-bit
register stores, 2 columns at a time); dprob gets one fp32 atomic per (row, tile) after a
quad shuffle; dbias: per-warp column sums (butterfly reduce-scatter) go to shared memory.
Ping-pong: into the block's C stage slice, which the C producer warp sums over the 4 warps
and adds to the workspace (one fp32 atomic per column) before it reloads the stage; after a
tile's last block it fences its atomics and tells warp 3. Cooperative: each of the 8 warps
writes its block sums to its row of one shared slot once the folder warp has released the
previous block's (an mbarrier), arrives on another and goes on; warp 3 sums the 8 rows,
releases the slot and adds the sums to the workspace (one fp32 atomic per column;
``dbias_folder``, ``HandOver``). Warp 3 folds
the workspace into the caller's bf16 dbias once an (expert, N-tile)'s last tile is in (one
rounding; see ``dbias_folder``).

Runtime sizes (M, L, the offsets, the SM count) are kernel arguments; N, K, dtypes, tile and
activation are compile-time. TMA zero-fills the K and N tails, so K need not be a multiple
of 64 nor N of TILE_N; since N % 32 == 0 a 32-column block is entirely in or out, and the
stores and dbias of blocks past N are skipped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Type

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass._mlir import ir
from cutlass.tensor_utils import LayoutEnum
from cutlass.tensor_utils.tensormap import TensorMapManager, TensorMapUpdateMode

from .epilogue_math import LOG2_E, dgeglu_local, dswiglu_unscaled
from .tile_walk import (dsl_ops, expert_of_row, grouped_raster, last_round_split,
                        next_epilogue_unit, split_share)
from .tile_walk import split_item as schedule_item


class DbiasHandBack(NamedTuple):
    """What a ping-pong C producer warp needs to add its warpgroup's dbias column sums
    (``c_producer``): the per-stage slices, the offsets and expert count (the expert of a
    tile), the fp32 workspace, and the (full, empty) mbarriers on which it hands each
    tile's sums to the folder warp (``HandOver``)."""

    sDb: object
    offs: object
    num_experts: object
    ws: object
    fold_mbar: object

class SplitWalk(NamedTuple):
    """One cluster's view of the split last round (``Sm90KernelConfig.split_last``), the
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


class HandOver:
    """A one-place hand-over to the folder warp (warp 3) on the two mbarriers at ``mbar``
    (``full``: the producing threads arrive once their part is done; ``empty``, at
    ``mbar + 1``: the folder warp's 32 threads arrive once they took it). Hand-over k
    completes phase k of each, so its waits take the parity k % 2 (the producing side
    waits for the previous hand-over's release: parity (k + 1) % 2, immediately true for
    k = 0, as a CUTLASS producer's first acquire).

    * Cooperative dbias: the slot of per-warp column sums, block by block; the 256 math
      threads arrive after their row stores; k counts the CTA's blocks (the math warps and
      the folder count them alike: ``_valid_blocks``). Session 17's form, two named
      barriers (bar.arrive / bar.sync), was 0.5-1.1% faster than main's shared
      compare-and-swap sums, but compute-sanitizer's racecheck reported it (session 18);
      mbarrier phases carry the order in the form the A/B and C rings use.
    * Ping-pong fold: C producer warp 1 + w tells the folder that math warpgroup w's sums
      of a tile are in the workspace (its 32 lanes arrive, each after fencing its own
      atomics); k counts warpgroup w's tiles. Until session 20 both warps blocked on a
      named barrier, each from its own code, which compute-sanitizer's synccheck reported
      ("Barrier error detected. Divergent thread(s) in block") and stopped the kernel on:
      the threads that block in one generation of an aligned barrier (``bar.sync``) must
      use one and the same instruction. A ``WARPSYNC.ALL`` right before it changed
      nothing, and the unaligned ``barrier.sync`` compiles to the same SASS here. Now the
      producer waits only for the folder's release of its previous tile."""

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


TILE_M = 128  # one math warpgroup x two 64-row WGMMA halves; 256-aligned offsets => one expert
TILE_K = 64  # 4 x WGMMA K (16) per k-tile: 128-byte rows => 128B swizzle for 16-bit types
SMEM_CAPACITY = 232448  # sm_90 max dynamic shared memory per block (227 KB)
NUM_THREADS = 384  # 1 producer + 2 math warpgroups
MATH_WARPGROUPS = 2
DESC_BYTES = 128  # one TMA descriptor (CUtensorMap) per expert in the descriptor workspace
TRACE_MAX_CTAS = 256  # CTAs a trace region holds (a launch's grid is at most the SM count)
TRACE_MAX_TILES = 4096  # the trace knob's bound: tiles recorded per math warpgroup
C_BLOCK_COLS = 64  # one C block = the gate (32) + up (32) columns of 32 accumulator columns
# Partial-sum slots of the split last round (``split_last``): one per cluster (a cluster
# runs at most one non-final part, into the slot of its index), so the last round is spread
# over at most this many clusters (last_round_split). 132 = the H200's SMs: any grid of
# resident clusters there; a slot holds one 128 x tile_n fp32 accumulator per CTA of the
# cluster (34.6 MB in all at tile 256, 2 CTAs).
SPLIT_SLOTS = 132
SPLIT_MAX = 4  # the largest split_last
SPLIT_BARRIER = 4  # named barrier of the 256 math threads around a partial's hand-over


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
    # C blocks in flight per math warpgroup (0 = default 1). Measured on the H200 (bf16 C,
    # tile 128): 1 C stage + 5 A/B stages beat 2 + 4 on all four benchmark shapes (e.g.
    # mixtral 3.11 vs 3.38 ms, skew 0.56 vs 0.60 ms): the mainloop wants the shared memory
    # more. (Then the A/B producer also L2-prefetched each tile's C window; session 14
    # measured the kernel faster without that prefetch. Measured
    # with the 4 KB margin; since session 10 one C stage leaves room for 6 A/B stages, and
    # 2 C stages for 5 without dbias: see stages().)
    c_stages: int = 0
    # Ping-pong C ring entries of 128 / c_split rows. With 2 (the engine's choice where
    # engines/sm90.Sm90DgluEngine._c_split_applies says), a 64-column C block is loaded,
    # computed, released and (D) stored in two 64-row halves, so one half's D store and C
    # reload overlap the other half's math in the same 16 KB per warpgroup (session 10's
    # profile: 40% of the epilogue's samples wait for C blocks).
    c_split: int = 1
    # B storage: "dense" = one (N, K, L) tensor, K-major ("k": strides (K, 1, N*K)) or N-major
    # ("n": strides (1, N, N*K), e.g. the transpose of an (L, K, N) weight); "discrete" = a device table of L
    # int64 base addresses, each expert an (N, K) matrix, K-major ("k": row stride K) or
    # N-major ("n": stored (K, N) row-major, row stride N). Discrete B is loaded through
    # per-expert TMA descriptors that a helper kernel (grid = L) builds on the device into
    # the descriptor workspace (DESC_BYTES per expert): no host read of pointers.
    weight_mode: str = "dense"
    b_major: str = "k"
    # With generate_dbias: the kernel folds the fp32 column sums into the caller's bf16 dbias
    # itself. Each (expert, N-tile) has an arrival counter after the sums in the workspace;
    # warp 3 (``dbias_folder``) counts each finished tile, and the count that reaches the
    # expert's tile count adds that tile's columns to dbias (one rounding) and puts the sums
    # and the counter back to zero. So every launch leaves the workspace's dbias region zero.
    # A zeroing kernel runs first unless ``ws_zeroed``. False leaves the fp32 sums as the
    # result (the JAX FFI path hands XLA zeroed buffers and rounds in JAX; no counters).
    fold_dbias: bool = True
    # The dbias region of the workspace (sums and counters) arrives zero (a cached scratch
    # that only this kernel's launches use, each leaving it zero): no zeroing kernel, so the
    # contract's launch is one kernel. Host convention only; the device code is the same.
    ws_zeroed: bool = False
    # Fresh outputs (the functional torch op): D, dprob and dbias arrive uninitialized. The
    # launch's prologue kernel zeroes dprob, the rows of D at/past offs[L-1] (no host read of
    # the offsets) and dbias, which the kernel's fold then adds to. Without it the
    # contract applies (dprob/dbias accumulated into, D's tail rows untouched).
    init_outputs: bool = False
    # CTAs per cluster along M (1 or 2; with discrete B the pair shares its expert's
    # descriptor). With 2, the two CTAs of a cluster own
    # the two 128-row halves of one 256-row slab (one expert: offsets are 256-aligned) and
    # the same N-tile, walk identical tile sequences, and each TMA-loads half of every B
    # k-tile multicast into both CTAs' shared memory: half the L2->SM traffic for B.
    cluster_m: int = 1
    # CTAs per cluster along N (1 or 2; only with cluster_m == 2): a 2x2 cluster owns a
    # 256-row slab x 2 adjacent N-tiles; A k-tiles are multicast to the CTA pair sharing
    # rows as B k-tiles are to the pair sharing columns, so each CTA pulls half its A and
    # half its B from L2 (16 KB per 64-deep k-tile instead of 24 with cluster_m alone).
    cluster_n: int = 1
    # Schedule of the two math warpgroups. False = ping-pong: each warpgroup owns whole
    # 128 x TILE_N tiles and the two alternate mainloops, so one's epilogue hides under the
    # other's MMAs. True = cooperative: both share every 128 x TILE_N tile (64 rows each,
    # TILE_N up to 256), so one B k-tile in shared memory feeds 128 rows per WGMMA read:
    # 128 x 256 moves about 20% fewer shared-memory bytes per MMA than 128 x 128 ping-pong
    # (operand reads + TMA writes), at the price of an epilogue the MMAs do not hide.
    cooperative: bool = False
    # Cooperative only: the static schedule's last, partial round spread along K over up
    # to rem x split_last clusters (rem: its units; 1 = off; ``tile_walk.last_round_split``
    # picks the spread at run time from the unit, cluster and k-tile counts): each of those
    # clusters takes an equal range of the round's k-tiles laid end to end, so a unit comes
    # in up to split_last + 1 parts. A non-final part stores its fp32 accumulators in its
    # cluster's workspace slot and counts itself on the unit's flag; the final part (the
    # one with the last k-tiles: it alone loads C and runs the epilogue) waits for the
    # others' count, adds their sums in cluster order (deterministic) and resets the flag.
    # Every cluster runs its non-final part first, and a final part waits only on clusters
    # of lower index, at their first part (``tile_walk.split_share``): no cycle, no chain,
    # and no wait on a cluster that is not resident yet if clusters start in index order
    # (the grid is at most the resident clusters anyway).
    split_last: int = 1
    # Diagnostic timeline (dense weights only; not an engine choice): trace > 0 makes the
    # leader thread of each math warpgroup store int64 stamps in a workspace region that the
    # launch passes in the descriptor slot (unused with dense weights), laid out
    # (4, trace + 1, 2, TRACE_MAX_CTAS + 1) column-major: for CTA b < TRACE_MAX_CTAS and
    # math warpgroup w, entry 0 = (globaltimer, clock64) at the warpgroup's start and at its
    # end; entry 1 + t for its t-th tile (t < trace) = clock64 at the loop top, after the
    # ping-pong turn, after the mainloop (its last WGMMA retired), after the epilogue; a
    # launch zeroes its CTAs' tile entries first. Slot (0, 0, 0, TRACE_MAX_CTAS) holds the
    # launch's grid (CTA 0 writes it), so a reader skips rows no CTA of it wrote. Results
    # are the kernel's; the stamps cost a few stores per tile. Read with
    # engines.sm90.Sm90Plan.read_trace; benchmarks/trace_one.py analyses them (session 15
    # found the ping-pong epilogue 1.7x slower next to the other mainloop than alone).
    trace: int = 0

    def wg_rows(self) -> int:
        """Rows of a tile one math warpgroup owns (and of its C/D blocks)."""
        return TILE_M // MATH_WARPGROUPS if self.cooperative else TILE_M

    def max_tile_n(self) -> int:
        # the accumulator is wg_rows x tile_n fp32 over 128 threads: 128 registers at most
        return 256 if self.cooperative else 128

    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    def num_n_units(self) -> int:
        """Schedule units along N: pairs of N-tiles with cluster_n == 2 (an odd last tile
        is paired with an out-of-bounds one: TMA zero-fills its loads and drops its stores)."""
        return (self.num_n_tiles() + self.cluster_n - 1) // self.cluster_n

    def discrete(self) -> bool:
        return self.weight_mode == "discrete"

    def d_via_smem(self) -> bool:
        """D leaves through shared memory with TMA stores when it has C's type: a D block is
        written over the C block it was computed from (same shape, same swizzled layout;
        each thread overwrites exactly the elements it read) and stored whole by TMA, instead
        of 32-bit register stores (measured: the stores cost ~8% on qwen3)."""
        return self.d_dtype is self.c_dtype

    def c_ring(self) -> int:
        return self.c_stages if self.c_stages else 1

    def c_rows(self) -> int:
        """Rows of one C ring entry (a warpgroup's rows, or half of them with c_split 2)."""
        return self.wg_rows() // self.c_split

    def c_block_bytes(self) -> int:
        """Bytes of one C block (c_split ring entries)."""
        return self.wg_rows() * C_BLOCK_COLS * self.c_dtype.width // 8

    def dbias_smem_shape(self) -> tuple:
        """Shape of the fp32 partial column sums in shared memory (dbias only), so that a
        tile costs one global atomic per column instead of one per warp and column
        (measured: dbias added ~9% on qwen3 with per-warp atomics). Ping-pong: one slice per
        C stage, (C_BLOCK_COLS columns, 4 warps, C stages): each warp puts its block's
        column sums in the slice of the block's stage before it releases the stage, and the
        warpgroup's C producer warp sums the 4 warps and adds them to the workspace before
        it reloads the stage (2 KB with one C stage per warpgroup: what lets a sixth A/B
        stage fit). Cooperative: one block's slot, (64 block columns, 8 warps), which each
        warp writes its row of without atomics and the folder warp sums, block by block (2
        KB, what the tile's 2 TILE_N shared sums took at tile 256 before session 17; all 8
        warps added into those with shared-memory compare-and-swap loops; per-warp slices of
        the whole tile, 16 KB, would cost an A/B stage). Without dbias a 1-element
        placeholder."""
        if not self.generate_dbias:
            return (1, 1, 1)
        if self.cooperative:
            return (C_BLOCK_COLS, 4 * MATH_WARPGROUPS)
        return (C_BLOCK_COLS, 4, MATH_WARPGROUPS * self.c_ring())

    def dbias_smem_floats(self) -> int:
        return math.prod(self.dbias_smem_shape())

    def stages(self) -> int:
        """A/B shared-memory stages: ``ab_stages``, or (0) as many as fit, at most 8."""
        return min(self.stages_that_fit(), 8) if self.ab_stages == 0 else self.ab_stages

    def smem_users(self) -> str:
        """What takes shared memory besides the A/B stages, for the stage errors."""
        return (f"tile_n={self.tile_n}, c_stages={self.c_ring()}, C {self.c_dtype.__name__}, "
                f"dbias={self.generate_dbias}, cooperative={self.cooperative}")

    def stages_that_fit(self) -> int:
        per_stage = (TILE_M + self.tile_n) * TILE_K * (self.ab_dtype.width // 8)
        c_bytes = MATH_WARPGROUPS * self.c_ring() * self.c_block_bytes()
        # Besides the buffers and the dbias sums: the mbarriers (at most ~400 B; they follow
        # the 1024-B aligned buffers, so no padding), in a 1 KB margin. Ping-pong 128 x 128
        # with one C stage then keeps 6 A/B stages, exactly: 6 x 32 KiB + 32 KiB of C + 2 KiB
        # of dbias slices + 1 KiB = 227 KiB, about 830 B to spare after the mbarriers. With
        # dbias it takes both the margin (4 KiB until session 10) and the per-stage slices
        # (8 KiB of per-tile slices before); without dbias the margin alone. The sixth stage
        # measured ~2% faster on the four benchmark shapes without dbias. A 128 x 256
        # cooperative stage (48 KB) keeps 4 next to its 2 KB of dbias sums.
        fixed = 1024 + c_bytes + 4 * self.dbias_smem_floats()
        return (SMEM_CAPACITY - fixed) // per_stage

    def num_n_tiles(self) -> int:
        return (self.n + self.tile_n - 1) // self.tile_n

    def fold_in_kernel(self) -> bool:
        """dbias is folded by the kernel (arrival counters in the workspace)."""
        return self.generate_dbias and self.fold_dbias

    def coop_dbias_slots(self) -> bool:
        """Cooperative with dbias (folded in the kernel or not): the math warps hand each
        block's per-warp column sums to the folder warp through a shared slot, and the
        folder sums them and adds them to the workspace (``dbias_folder``). Session 16
        (branch exp/coop-fold) moved the per-tile flush of the tile's shared sums there (the
        dsv3 epilogue 17.9 k -> 16.3 k cycles per tile); session 17 (branch
        exp/coop-dbias-slots) replaced those sums, into which all 8 warps added with
        compare-and-swap loops, by a slot of per-warp rows handed over block by block."""
        return self.cooperative and self.generate_dbias

    def has_folder(self) -> bool:
        """Warp 3 runs ``dbias_folder``: it folds dbias in the kernel, or (cooperative) it
        sums the blocks' dbias slots."""
        return self.fold_in_kernel() or self.coop_dbias_slots()

    def split(self) -> bool:
        """The last round is split along K (``split_last``)."""
        return self.split_last > 1

    def dbias_ws_elems(self, num_experts):
        """4-byte elements of the workspace's dbias region: the fp32 sums (L, 2N), then
        (folded in the kernel) one int32 arrival counter per (expert, N-tile)."""
        sums = num_experts * 2 * self.n if self.generate_dbias else 0
        return sums + (num_experts * self.num_n_tiles() if self.fold_in_kernel() else 0)

    def split_flags(self) -> int:
        """int32 arrival flags of the split last round, after the dbias region: one per
        (last-round unit, CTA of the cluster); they belong to the region launches leave
        zero."""
        return SPLIT_SLOTS * self.cluster_size() if self.split() else 0

    def split_part_offset(self, num_experts):
        """4-byte element offset of the partial-sum slots (after the region launches leave
        zero, rounded up to 128 bytes): SPLIT_SLOTS slots x cluster CTAs x TILE_M x tile_n
        fp32, which no launch needs zero."""
        zero = self.dbias_ws_elems(num_experts) + self.split_flags()
        return (zero + 31) // 32 * 32

    def split_part_floats(self) -> int:
        """fp32 elements of the partial-sum slots (0 without split_last)."""
        return SPLIT_SLOTS * self.cluster_size() * TILE_M * self.tile_n if self.split() else 0

    def raster_group(self) -> int:
        """Raster group size in schedule units (cluster_m M-tiles each)."""
        return max(1, self.raster_group_m // self.cluster_m)


@cute.jit
def _zero_from(mT: cute.Tensor, start: Int32, step: Int32):
    """Grid-stride fill of the flat tensor ``mT`` with zeros: elements start, start + step,
    ... (each thread passes its own start; step = the grid's thread count)."""
    i = start
    while i < cute.size(mT):
        mT[i] = mT.element_type(0)
        i += step


class GroupedDgluSm90:
    """Grouped GEMM + dGLU for one :class:`Sm90KernelConfig`. ``__call__`` is the jit entry."""

    def __init__(self, cfg: Sm90KernelConfig):
        # Ping-pong 160/192 compile but spill (ptxas: ~450 B with a 192-column accumulator
        # next to the epilogue's live values) and measured slower on the H200 than 128 with
        # clusters; cooperative tiles hold half the rows per warpgroup, so up to 256.
        if cfg.tile_n % 32 != 0 or not 32 <= cfg.tile_n <= cfg.max_tile_n():
            raise ValueError(f"tile_n must be a multiple of 32 in [32, {cfg.max_tile_n()}] "
                             f"(cooperative={cfg.cooperative}), got {cfg.tile_n}")
        if cfg.act_func not in ("dswiglu", "dgeglu"):
            raise ValueError(f"act_func {cfg.act_func!r} is not supported by the SM90 kernel")
        if cfg.weight_mode not in ("dense", "discrete") or cfg.b_major not in ("k", "n"):
            raise ValueError(f"weight_mode/b_major {cfg.weight_mode!r}/{cfg.b_major!r} unsupported")
        if cfg.cluster_m not in (1, 2):
            raise ValueError(f"cluster_m must be 1 or 2, got {cfg.cluster_m}")
        if cfg.discrete() and cfg.cluster_n != 1:
            raise ValueError(f"cluster_n must be 1 with discrete B, got {cfg.cluster_n}")
        if not 0 <= cfg.trace <= TRACE_MAX_TILES or (cfg.trace and cfg.discrete()):
            raise ValueError(f"trace must be in [0, {TRACE_MAX_TILES}] and 0 with discrete B "
                             f"(its slot holds the descriptors), got trace={cfg.trace}, "
                             f"weight_mode={cfg.weight_mode!r}")
        if cfg.init_outputs and cfg.generate_dbias and not cfg.fold_dbias:
            raise ValueError("init_outputs with dbias needs fold_dbias (the fold writes dbias)")
        if cfg.cluster_n not in (1, 2) or (cfg.cluster_n == 2 and cfg.cluster_m != 2):
            raise ValueError(f"cluster_n must be 1, or 2 with cluster_m == 2, got "
                             f"cluster_n={cfg.cluster_n}, cluster_m={cfg.cluster_m}")
        if not 1 <= cfg.split_last <= SPLIT_MAX or (cfg.split() and not cfg.cooperative):
            raise ValueError(f"split_last must be in [1, {SPLIT_MAX}], and 1 unless cooperative, "
                             f"got split_last={cfg.split_last}, cooperative={cfg.cooperative}")
        if cfg.split() and cfg.c_ring() > cfg.tile_n // 32:
            # the C producer's hand-backs take a stage's tile from the previous unit it walked
            # (c_producer), not from its FIFO position, which a split last round breaks
            raise ValueError(f"c_stages must be at most tile_n / 32 = {cfg.tile_n // 32} with "
                             f"split_last, got {cfg.c_ring()}")
        self.cfg = cfg
        self.tile_n = cfg.tile_n
        self.ab_stages = cfg.stages()
        if self.ab_stages < 2:
            # one stage would deadlock the mainloop (it waits for the next k-tile before it
            # releases the current one)
            raise ValueError(
                f"ab_stages: {self.ab_stages} A/B shared-memory stage(s) with "
                f"{cfg.smem_users()}; the kernel needs at least 2 (fewer C stages or a "
                f"narrower tile leave room for them)")
        if cfg.ab_stages > cfg.stages_that_fit():
            # an explicit count bypasses the fit (the engine's deep-K cooperative knobs ask
            # for 3, which fit with 16-bit C only)
            raise ValueError(
                f"ab_stages: {cfg.ab_stages} A/B shared-memory stages do not fit with "
                f"{cfg.smem_users()}: at most {cfg.stages_that_fit()} do")
        if cfg.c_split not in (1, 2) or (cfg.c_split == 2 and cfg.cooperative):
            raise ValueError(f"c_split must be 1, or 2 in the ping-pong schedule, got "
                             f"c_split={cfg.c_split}, cooperative={cfg.cooperative}")
        if cfg.generate_dbias and not cfg.cooperative and cfg.c_ring() > cfg.tile_n // 32:
            # the C producer hands back a stage's dbias sums knowing only the current and
            # the previous tile (see c_producer)
            raise ValueError(f"c_stages must be at most tile_n / 32 = {cfg.tile_n // 32} with "
                             f"dbias in the ping-pong schedule, got {cfg.c_ring()}")
        self.tile_shape_mnk = (TILE_M, cfg.tile_n, TILE_K)
        self.num_n_tiles = cfg.num_n_tiles()
        self.k_tile_cnt = (cfg.k + TILE_K - 1) // TILE_K
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
        mDbias = cute.make_tensor(
            dbias_ws_ptr, cute.make_layout((num_experts, 2 * n), stride=(2 * n, 1)))

        a_layout = LayoutEnum.ROW_MAJOR  # (M, K) K-major
        # (N, K) K-major, or N-major (discrete "n": WGMMA reads B MN-major from smem)
        b_layout = (LayoutEnum.COL_MAJOR if cfg.b_major == "n"
                    else LayoutEnum.ROW_MAJOR)
        # cooperative: the two math warpgroups tile M (64 rows each) of one 128-row tile
        # Two copies: the kernel sets scale-d = 0 on one ("overwrite", a tile's first k-block)
        # and 1 on the other ("accumulate"), once, outside its loops (a field set inside the
        # persistent loop does not dominate its later uses: invalid IR).
        tiled_mma, tiled_mma_first = (sm90_utils.make_trivial_tiled_mma(
            cfg.ab_dtype, cfg.ab_dtype,
            a_layout.sm90_mma_major_mode(), b_layout.sm90_mma_major_mode(),
            Float32, (MATH_WARPGROUPS if self.coop else 1, 1, 1), tiler_mn=(64, self.tile_n))
            for _ in range(2))
        a_smem_staged = sm90_utils.make_smem_layout_a(
            a_layout, self.tile_shape_mnk, cfg.ab_dtype, self.ab_stages)
        b_smem_staged = sm90_utils.make_smem_layout_b(
            b_layout, self.tile_shape_mnk, cfg.ab_dtype, self.ab_stages)

        # C blocks (wg_rows x 64: a warpgroup's rows of one gate/up block pair; row-major,
        # 128B-swizzled: conflict-free reads of the WGMMA fragment's row pattern),
        # MATH_WARPGROUPS x c_stages of them
        c_layout = LayoutEnum.ROW_MAJOR
        c_atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(c_layout, cfg.c_dtype, C_BLOCK_COLS), cfg.c_dtype)
        c_box = (self.c_rows, C_BLOCK_COLS)
        c_smem_staged = cute.tile_to_shape(
            c_atom, (*c_box, MATH_WARPGROUPS * self.c_stages), order=(0, 1, 2))
        c_smem = cute.slice_(c_smem_staged, (None, None, 0))
        tma_atom_c, tma_c = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mC, c_smem, c_box)
        # D blocks go out from the C block's shared memory (same box and layout)
        tma_atom_d, tma_d = tma_atom_c, tma_c  # placeholders: unused without d_via_smem
        if cutlass.const_expr(cfg.d_via_smem()):
            tma_atom_d, tma_d = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), mD, c_smem, c_box)

        a_smem = cute.slice_(a_smem_staged, (None, None, 0))
        b_smem = cute.slice_(b_smem_staged, (None, None, 0))
        cm, cn = cfg.cluster_m, cfg.cluster_n
        a_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cn > 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        tma_atom_a, tma_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
            a_op, mA, a_smem, (TILE_M, TILE_K), num_multicast=cn)
        b_op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cm > 1
                else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
        tma_atom_b, tma_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
            b_op, mB, b_smem, (self.tile_n, TILE_K), num_multicast=cm)
        cl = cfg.cluster_size()

        # the 1024-B aligned buffers first: barriers in front of them would cost up to 1 KB
        # of padding (Sm90KernelConfig.stages counts on it)
        @cute.struct
        class SharedStorage:
            sA: cute.struct.Align[
                cute.struct.MemRange[cfg.ab_dtype, cute.cosize(a_smem_staged)], 1024]
            sB: cute.struct.Align[
                cute.struct.MemRange[cfg.ab_dtype, cute.cosize(b_smem_staged)], 1024]
            sC: cute.struct.Align[
                cute.struct.MemRange[cfg.c_dtype, cute.cosize(c_smem_staged)], 1024]
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.ab_stages * 2]
            c_mbar: cute.struct.MemRange[cutlass.Int64, MATH_WARPGROUPS * self.c_stages * 2]
            # HandOver pairs: the cooperative dbias slot's, or the ping-pong fold's (one per
            # C producer warp)
            hand_mbar: cute.struct.MemRange[cutlass.Int64, 2 * MATH_WARPGROUPS]
            sDb: cute.struct.Align[
                cute.struct.MemRange[Float32, cfg.dbias_smem_floats()], 16]

        self.shared_storage = SharedStorage

        # Upper bound of the tile count from M alone (the true count needs offs[L-1], which
        # only the device reads); surplus CTAs find no tile and exit. ``sm_count`` is how
        # many CTAs can be resident at once (for clusters: max active clusters x cl).
        max_units = (m // (TILE_M * cm)) * cfg.num_n_units()
        grid = (cutlass.min(max_units, sm_count // cl) * cl, 1, 1)
        fold = cfg.fold_in_kernel()
        total = num_experts * 2 * n
        # the workspace region launches leave zero: (dbias) fp32 sums (L, 2N), then (fold)
        # one int32 arrival counter per (expert, N-tile), then (split) the last round's int32
        # flags; zero is the same bit pattern for all
        ws_total = cfg.dbias_ws_elems(num_experts) + cfg.split_flags()
        # (with neither, nothing to zero: a 1-element placeholder, never read)
        mWs = cute.make_tensor(dbias_ws_ptr, cute.make_layout(
            (ws_total if cfg.generate_dbias or cfg.split() else 1,)))
        mCount = cute.make_tensor(cute.recast_ptr(dbias_ws_ptr + total, dtype=Int32),
                                  cute.make_layout((num_experts * self.num_n_tiles,)))
        mDb = cute.make_tensor(dbias_ptr, cute.make_layout((total,)))
        if cutlass.const_expr(cfg.init_outputs):
            # dprob (M), D's tail rows, dbias and its workspace: a grid-stride pass each
            mDflat = cute.make_tensor(d_ptr, cute.make_layout((m * 2 * n,)))
            init_grid = (cutlass.min((m + 255) // 256 + 1, 4 * sm_count), 1, 1)
            self.init_outputs(mWs, mDprob, mDflat, mDb, mOffs, num_experts).launch(
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
            tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_c, tma_c, tma_atom_d, tma_d, mC, mD,
            mOffs, mAlpha,
            mBeta, mProb, mDprob, mDbias, mCount, mDb, b_desc_ptr, num_experts, geglu_alpha,
            clamp_max, clamp_min, linear_offset, tiled_mma, tiled_mma_first, a_smem_staged,
            b_smem_staged, c_smem_staged,
        ).launch(grid=grid, block=[NUM_THREADS, 1, 1], cluster=(cl, 1, 1), min_blocks_per_mp=1,
                 stream=stream)

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
                     mDb: cute.Tensor, mOffs: cute.Tensor, num_experts: Int32):
        """Grid-stride, before the main kernel (fresh outputs): dprob := 0, D rows at/past
        offs[L-1] := 0 (the main kernel writes every row before it), and with dbias the bf16
        dbias and the workspace's dbias region := 0 (the kernel's fold then adds to zero;
        empty experts stay zero)."""
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nblocks, _, _ = cute.arch.grid_dim()
        step = nblocks * 256
        _zero_from(mDprob, bid * 256 + tidx, step)
        _zero_from(mDflat, mOffs[num_experts - 1] * (2 * self.cfg.n) + bid * 256 + tidx, step)
        if cutlass.const_expr(self.cfg.generate_dbias or self.cfg.split()):
            _zero_from(mWs, bid * 256 + tidx, step)
        if cutlass.const_expr(self.cfg.generate_dbias):
            _zero_from(mDb, bid * 256 + tidx, step)

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
            base = cute.make_ptr(self.cfg.ab_dtype, table[e], cute.AddressSpace.gmem,
                                 assumed_align=16)
            mBe = cute.make_tensor(
                base, cute.make_layout((self.cfg.n, self.cfg.k, 1), stride=self._b_stride()))
            cm = self.cfg.cluster_m
            op = (cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if cm > 1
                  else cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp())
            atom, _ = cute.nvgpu.cpasync.make_tiled_tma_atom(
                op, mBe, b_smem, (self.tile_n, TILE_K), num_multicast=cm)
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
        mC: cute.Tensor,
        mD: cute.Tensor,
        mOffs: cute.Tensor,
        mAlpha: cute.Tensor,
        mBeta: cute.Tensor,
        mProb: cute.Tensor,
        mDprob: cute.Tensor,
        mDbias: cute.Tensor,
        mCount: cute.Tensor,
        mDbOut: cute.Tensor,
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
        # (offs[L-1] is a multiple of 256, so of 128 * cluster_m).
        cm, cn = self.cfg.cluster_m, self.cfg.cluster_n
        cl = cm * cn
        rank = Int32(0)
        if cutlass.const_expr(cl > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        unit0 = bid // cl
        nunits = nblocks // cl
        valid_m_units = mOffs[num_experts - 1] // (TILE_M * cm)
        num_units = valid_m_units * self.cfg.num_n_units()
        walk = (nunits, num_units, valid_m_units, rank)
        split = None
        if cutlass.const_expr(self.cfg.split()):
            split = self.split_walk(num_units, nunits, unit0, rank, mDbias, num_experts)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sA = storage.sA.get_tensor(a_smem_staged.outer, swizzle=a_smem_staged.inner)
        sB = storage.sB.get_tensor(b_smem_staged.outer, swizzle=b_smem_staged.inner)
        sC = storage.sC.get_tensor(c_smem_staged.outer, swizzle=c_smem_staged.inner)
        sDb = storage.sDb.get_tensor(cute.make_layout(self.cfg.dbias_smem_shape()))

        a_smem = cute.slice_(a_smem_staged, (None, None, 0))
        b_smem = cute.slice_(b_smem_staged, (None, None, 0))
        tx_bytes = cute.size_in_bytes(self.cfg.ab_dtype, a_smem) + cute.size_in_bytes(
            self.cfg.ab_dtype, b_smem)
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
            tx_count=cute.size_in_bytes(self.cfg.c_dtype,
                                        cute.slice_(c_smem_staged, (None, None, 0))),
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            # (the default, spelled out: this create() fences every mbarrier init above,
            # the HandOver pairs' included, and syncs the CTA before any is used)
            defer_sync=False,
        )

        # (bM, bK, RestM, RestK) and (bN, bK, RestN, RestK, L) tiled global views
        gA = cute.local_tile(mA, (TILE_M, TILE_K), (None, None))
        gB = cute.local_tile(mB, (self.tile_n, TILE_K), (None, None, None))
        # with a cluster each CTA loads its 1/cn slice of the A tile (multicast to the CTAs
        # of its row) and its 1/cm slice of the B tile (to the CTAs of its column)
        rank_m, rank_n = rank % cm, rank // cm
        tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
            tma_atom_a, rank_n, cute.make_layout(cn), cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
            tma_atom_b, rank_m, cute.make_layout(cm), cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2))
        gC = cute.local_tile(mC_tma, (self.c_rows, C_BLOCK_COLS), (None, None))
        tCsC_tma, tCgC_tma = cute.nvgpu.cpasync.tma_partition(
            tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
            cute.group_modes(gC, 0, 2))

        d_store = None
        if cutlass.const_expr(self.cfg.d_via_smem()):
            gD = cute.local_tile(mD_tma, (self.c_rows, C_BLOCK_COLS), (None, None))
            tDsD, tDgD = cute.nvgpu.cpasync.tma_partition(
                tma_atom_d, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2),
                cute.group_modes(gD, 0, 2))
            d_store = (tma_atom_d, tDsD, tDgD)

        if warp_group == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(ab_pipe, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB, mOffs,
                              num_experts, unit0, walk, b_desc_ptr, split)
            if (warp_idx == 1) | (warp_idx == 2):
                dbias = None
                if cutlass.const_expr(self.dbias_via_producer()):
                    # ping-pong: this warp adds its warpgroup's dbias column sums and
                    # tells the folder warp when a tile's are in the workspace
                    dbias = DbiasHandBack(sDb, mOffs, num_experts, mDbias,
                                          self.fold_mbar(hand_mbar, warp_idx - 1))
                self.c_producer(c_pipe, tma_atom_c, tCgC_tma, tCsC_tma, warp_idx - 1, unit0,
                                walk, d_store, dbias, split)
            if cutlass.const_expr(self.cfg.has_folder()):
                if warp_idx == 3:
                    self.dbias_folder(mOffs, num_experts, mDbias, mCount, mDbOut, unit0, walk,
                                      valid_m_units * cm, tidx, sDb, hand_mbar, split)
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
            # trace builds: (stamps, whether this thread writes this warpgroup's row)
            tr = None
            tcount = Int32(0)
            if cutlass.const_expr(self.cfg.trace > 0):
                tr = (cute.make_tensor(b_desc_ptr, cute.make_layout(
                    (4, self.cfg.trace + 1, MATH_WARPGROUPS, TRACE_MAX_CTAS + 1))),
                    (tidx % 128 == 0) & (bid < TRACE_MAX_CTAS))
                if (tidx == 128) & (bid == 0):
                    tr[0][(0, 0, 0, TRACE_MAX_CTAS)] = cutlass.Int64(nblocks)
                if tr[1]:
                    for t in cutlass.range(1, self.cfg.trace + 1):
                        for j in cutlass.range_constexpr(4):
                            tr[0][(j, t, wg, bid)] = cutlass.Int64(0)
                    tr[0][(0, 0, wg, bid)] = cute.arch.globaltimer()
                    tr[0][(1, 0, wg, bid)] = cute.arch.clock64()

            pos = Int32(0) if self.coop else wg * self.k_tile_cnt  # first k-tile's ring position
            cpos = Int32(0)  # position in this warpgroup's private C FIFO
            kslot = Int32(0)  # (cooperative dbias) blocks handed over so far
            if cutlass.const_expr(split is None):
                while unit < num_units:
                    m_tile, n_tile = self.tile_of(unit, walk)
                    expert = expert_of_row(mOffs, num_experts, m_tile * TILE_M)
                    self._stamp(tr, 0, tcount, wg, bid)
                    if cutlass.const_expr(self.coop):
                        self._stamp(tr, 1, tcount, wg, bid)
                        self.mma_mainloop(ab_pipe, mmas, tCrA, tCrB, acc, pos, mine_done,
                                          False)
                    else:
                        if unit >= nunits:  # a previous unit (the other warpgroup's) exists
                            other_done.arrive_and_wait()
                        self._stamp(tr, 1, tcount, wg, bid)
                        self.mma_mainloop(ab_pipe, mmas, tCrA, tCrB, acc, pos, mine_done,
                                          unit + nunits < num_units)
                    self._stamp(tr, 2, tcount, wg, bid)
                    self.epilogue(acc, tCcC, c_pipe, sC, wg, cpos, mD, mAlpha, mBeta, mProb,
                                  mDprob, geglu_alpha, clamp_max, clamp_min, linear_offset,
                                  m_tile, n_tile, expert, tidx, sDb, hand_mbar, kslot)
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
                    expert = expert_of_row(mOffs, num_experts, m_tile * TILE_M)
                    self._stamp(tr, 0, tcount, wg, bid)
                    self._stamp(tr, 1, tcount, wg, bid)
                    self.mma_mainloop(ab_pipe, mmas, tCrA, tCrB, acc, pos, mine_done, False,
                                      kcnt)
                    self._stamp(tr, 2, tcount, wg, bid)
                    if handed:  # a part of a split unit
                        self._split_hand_over(acc, split, unit0, r, first, count, final, tidx,
                                              split_bar)
                    if final:
                        self.epilogue(acc, tCcC, c_pipe, sC, wg, cpos, mD, mAlpha, mBeta,
                                      mProb, mDprob, geglu_alpha, clamp_max, clamp_min,
                                      linear_offset, m_tile, n_tile, expert, tidx, sDb,
                                      hand_mbar, kslot)
                        if cutlass.const_expr(self.cfg.coop_dbias_slots()):
                            kslot += self._valid_blocks(n_tile * self.tile_n)
                        cpos += self.nent
                    self._stamp(tr, 3, tcount, wg, bid)
                    tcount += 1
                    pos += kcnt
                    i += 1
            if cutlass.const_expr(self.cfg.trace > 0):
                if tr[1]:
                    tr[0][(2, 0, wg, bid)] = cute.arch.globaltimer()
                    tr[0][(3, 0, wg, bid)] = cute.arch.clock64()

    # ------------------------------------------------------------------ split last round
    @cute.jit
    def split_walk(self, num_units, nunits, cluster, rank, mDbias, num_experts):
        """This cluster's ``SplitWalk``; the workspace regions follow the dbias region
        (``Sm90KernelConfig.split_flags``, ``split_part_offset``)."""
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
        barrier must do so at one instruction, session 20; here every thread of both
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

    @cute.jit
    def _stamp(self, tr, j, t, wg, bid):
        """Trace builds: clock64 as stamp j of this warpgroup's t-th tile (leader thread)."""
        if cutlass.const_expr(self.cfg.trace > 0):
            if tr[1] & (t < self.cfg.trace):
                tr[0][(j, t + 1, wg, bid)] = cute.arch.clock64()

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
        _, _, valid_m_units, rank = walk
        cm, cn = self.cfg.cluster_m, self.cfg.cluster_n
        m_unit, n_unit = grouped_raster(unit, valid_m_units, self.cfg.num_n_units(),
                                        self.cfg.raster_group())
        return m_unit * cm + rank % cm, n_unit * cn + rank // cm

    @cute.jit
    def producer(self, ab_pipe, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB, mOffs,
                 num_experts, unit0, walk, b_desc_ptr, split):
        nunits, num_units, _, rank = walk
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
                                        tBgB, tBsB, mOffs, num_experts, walk, b_desc_ptr,
                                        a_mask, b_mask, unit, 0, self.k_tile_cnt)
                unit += nunits
        else:
            # every piece of the split last round, non-final ones first (split_item)
            i = Int32(0)
            while i < split.items:
                unit, kb, kcnt, *_ = self.split_item(i, unit0, nunits, split)
                state = self._load_unit(ab_pipe, state, tma_atom_a, tAgA, tAsA, tma_atom_b,
                                        tBgB, tBsB, mOffs, num_experts, walk, b_desc_ptr,
                                        a_mask, b_mask, unit, kb, kcnt)
                i += 1
        # do not exit while the math warpgroups may still arrive on our empty barriers
        ab_pipe.producer_tail(state)

    @cute.jit
    def _load_unit(self, ab_pipe, state, tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB,
                   mOffs, num_experts, walk, b_desc_ptr, a_mask, b_mask, unit, kb, kcnt):
        """Stream k-tiles [kb, kb + kcnt) of this CTA's tile of schedule unit ``unit`` into
        the A/B ring from ``state`` on; returns the state after them."""
        m_tile, n_tile = self.tile_of(unit, walk)
        expert = expert_of_row(mOffs, num_experts, m_tile * TILE_M)
        # (No L2 prefetch of the tile's C window here: until session 14 this warp
        # issued one, 16 prefetch.global.L2 per lane and tile; without it the kernel
        # measured 1-3.5% faster on all four benchmark shapes: docs/kernel_sessions.md.)
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
            cute.copy(tma_atom_a, tAgA[(None, m_tile, kt)], tAsA[(None, state.index)],
                      tma_bar_ptr=bar, mcast_mask=a_mask)
            cute.copy(tma_atom_b, tBgB[(None, n_tile, kt, l_idx)],
                      tBsB[(None, state.index)], tma_bar_ptr=bar, tma_desc_ptr=desc,
                      mcast_mask=b_mask)
            ab_pipe.producer_commit(state)
            state.advance()
        return state

    def c_state(self, w, p, producer: bool):
        """Pipeline state of position ``p`` of warpgroup ``w``'s private C FIFO.

        Parity waits are sound because each half of the ring has exactly one producer and
        one consumer, both walking positions in order."""
        phase = (p // self.c_stages) % 2
        if producer:
            phase = phase ^ 1  # producers start on the "already empty" phase
        return pipeline.PipelineState(MATH_WARPGROUPS * self.c_stages, p,
                                      w * self.c_stages + p % self.c_stages, phase)

    def dbias_via_producer(self) -> bool:
        """Ping-pong with dbias: the C producer warps add the column sums (c_producer)."""
        return self.cfg.generate_dbias and not self.coop

    def c_full_arrivals(self) -> int:
        """Arrivals that (with the TMA bytes) complete a C stage's full barrier: with the
        dbias hand-off every lane of the C producer warp (each after its own reads of the
        slice that the math warps write again once the phase completes), else one.

        The PTX memory model is satisfied either way (the warp sync before the elected
        arrive orders the other lanes' reads), but compute-sanitizer's racecheck does not
        carry that ordering into the tensor-TMA-completed phase: with one arrival it
        reported 4 write-after-read hazards on the walks (sessions 10-14; 124 per tile and
        read instruction, lanes 1-31; a one-warp bar.sync in place of the warp sync did not
        change that), while its probe of every lane arriving (``wartx32``) reported none."""
        return 32 if self.dbias_via_producer() else 1

    def fold_mbar(self, hand_mbar, w):
        """Ping-pong: the ``HandOver`` pair on which C producer warp 1 + w, which added math
        warpgroup w's sums of a tile, tells the dbias folder warp, once per tile
        (fold_in_kernel only; cooperative: the slot's pair at ``hand_mbar``)."""
        return hand_mbar + 2 * w

    @cute.jit
    def c_producer(self, c_pipe, tma_atom_c, tCgC, tCsC, w, unit0, walk, d_store, dbias,
                   split):
        """Warp 1 + w: TMA-loads, block by block, the C window of every tile math warpgroup
        w will process (the same walk as that warpgroup). It runs ahead into the next tile
        while the warpgroup is in its mainloop, so the first blocks are resident before the
        epilogue starts.

        A stage comes back released once the warpgroup is done with its block. Before this
        warp reloads it:
        * with ``d_store`` (D leaves through shared memory) the stage holds the D block the
          warpgroup wrote over the C block it read: this warp TMA-stores it, and waits until
          the store has read it. The math warps only fence their writes and release: before,
          one of them issued each store and waited for its read, and the warpgroup met on a
          barrier per block, all on the epilogue's critical path;
        * with ``dbias`` (ping-pong) the stage's slice of ``sDb`` holds the 4 warps' column
          sums of the block: this warp adds them up and to the workspace, one atomic per
          column, and after a tile's last block tells the folder warp (``_fold_signal``). The
          math warps used to do this after each tile, on a barrier of their own.
        The last ``c_stages`` blocks are handled after the walk, and this warp waits for
        every store before it exits. Otherwise no producer tail: there is no cluster, and the
        consumers' arrives are their own shared-memory operations, complete before the CTA
        can exit."""
        nunits, num_units, _, _ = walk
        # (split: the units whose epilogue this CTA runs, final pieces only)
        unit = self.first_epi_unit(unit0 + self.first_unit_offset(w, nunits), split)
        p = Int32(0)
        cur = (Int32(0), Int32(0), Int32(0))
        prev = cur
        end = self.epi_end(num_units, split)
        while unit < end:
            m_tile, n_tile = self.tile_of(unit, walk)
            # (M-tile, N-tile, expert) of the tile being loaded and of the one before: the
            # first c_stages entries of a tile hand back the previous tile's last entries
            # (with c_stages <= nent; the expert is needed for dbias only)
            expert = Int32(0)
            if cutlass.const_expr(dbias is not None):
                expert = expert_of_row(dbias.offs, dbias.num_experts, m_tile * TILE_M)
            prev = cur
            cur = (m_tile, n_tile, expert)
            for e in cutlass.range_constexpr(self.nent):
                j, h = e // self.c_split, e % self.c_split
                st = self.c_state(w, p + e, True)
                # producer_acquire split in two: the hand-back's shared-memory reads of the
                # dbias slice come before this warp's arrive on the stage's full barrier,
                # whose phase the math warps wait on before they write the slice again
                c_pipe.sync_object_empty.wait(st.index, st.phase)
                # the entry the stage last held: position q, entry e_q of its tile (p is a
                # multiple of nent, so e_q is known here)
                e_q = (e - self.c_stages) % self.nent
                if p + e >= self.c_stages:
                    self._hand_back(d_store, dbias, st, w, p + e - self.c_stages, e_q, unit0,
                                    walk, cur if e >= self.c_stages else prev)
                if cutlass.const_expr(self.c_full_arrivals() > 1):
                    # every lane, lane 0 with the bytes the load below brings
                    full = c_pipe.producer_get_barrier(st)
                    if cute.arch.lane_idx() == 0:
                        cute.arch.mbarrier_arrive_and_expect_tx(
                            full, c_pipe.sync_object_full.tx_count)
                    else:
                        cute.arch.mbarrier_arrive(full)
                else:
                    c_pipe.sync_object_full.arrive(st.index, c_pipe.producer_mask)
                # a block past column 2N is entirely out of bounds: TMA zero-fills it (and
                # still counts the full box bytes), the epilogue never stores it
                cute.copy(tma_atom_c,
                          tCgC[(None, self.c_row_block(m_tile, w, h), n_tile * self.nblk + j)],
                          tCsC[(None, st.index)], tma_bar_ptr=c_pipe.producer_get_barrier(st))
                c_pipe.producer_commit(st)
                if cutlass.const_expr(dbias is not None):
                    if p + e >= self.c_stages:
                        # after the load is on its way: the fence waits for the atomics
                        self._fold_signal(e_q, dbias, p + e - self.c_stages)
            p += self.nent
            unit = self.next_epi_unit(unit, self.unit_step(nunits), split)
        if cutlass.const_expr(d_store is not None or dbias is not None):
            # the last c_stages entries (with c_stages <= nent all the last tile's: ``cur``)
            for i in cutlass.range_constexpr(self.c_stages):
                if p + i >= self.c_stages:
                    st = self.c_state(w, p + i, True)
                    e_q = (i - self.c_stages) % self.nent
                    # the stage's last entry is released (its D written); no load follows
                    c_pipe.sync_object_empty.wait(st.index, st.phase)
                    self._hand_back(d_store, dbias, st, w, p + i - self.c_stages, e_q, unit0,
                                    walk, cur)
                    if cutlass.const_expr(dbias is not None):
                        self._fold_signal(e_q, dbias, p + i - self.c_stages)
            if cutlass.const_expr(d_store is not None):
                cute.arch.cp_async_bulk_wait_group(0)  # D stores complete before exit

    @cute.jit
    def _hand_back(self, d_store, dbias, st, w, q, e_q: cutlass.Constexpr, unit0, walk, tile):
        """What a released C stage owes before its reload: the entry at position ``q`` of
        warpgroup w's C FIFO, entry ``e_q`` (32-column block e_q // c_split, row half
        e_q % c_split) of its tile; ``tile`` = (M-tile, N-tile, expert) of that tile when
        c_stages <= nent (else the D store finds the tile from q). The dbias sums of a block
        come with its last row half's entry. The D store is issued first, the dbias sums go
        out while it reads the stage, then this warp waits for that read (the next load
        overwrites it)."""
        m_tile, n_tile, expert = tile
        if cutlass.const_expr(d_store is not None):
            if cutlass.const_expr(self.c_stages > self.nent):
                # two or more tiles back (no dbias): find the tile from the FIFO position
                nunits = walk[0]
                m_tile, n_tile = self.tile_of(
                    unit0 + self.first_unit_offset(w, nunits)
                    + (q // self.nent) * self.unit_step(nunits), walk)
            self._store_d_block(d_store, st, w, e_q, m_tile, n_tile)
        if cutlass.const_expr(dbias is not None and e_q % self.c_split == self.c_split - 1):
            sDb = dbias.sDb
            two_n = 2 * self.cfg.n
            lane = cute.arch.lane_idx()
            sl = st.index // self.c_split  # the block's slice
            # block-local C columns lane and lane + 32 (gate, up); past 2N: phantom columns
            for i in cutlass.range_constexpr(2):
                col = lane + 32 * i
                g = 2 * n_tile * self.tile_n + C_BLOCK_COLS * (e_q // self.c_split) + col
                s = (sDb[(col, 0, sl)] + sDb[(col, 1, sl)]
                     + sDb[(col, 2, sl)] + sDb[(col, 3, sl)])
                if g < two_n:
                    cute.arch.atomic_add((dbias.ws.iterator + (expert * two_n + g)).llvm_ptr, s)
        if cutlass.const_expr(d_store is not None):
            # by the issuing lane (the others have no bulk group); the warp sync keeps every
            # lane, hence the next load, after it
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        if cutlass.const_expr(d_store is not None or dbias is not None):
            # every lane's reads of the stage (and of its slice) before the elected lane's
            # arrive on the full barrier, after which the stage is written again (with
            # dbias every lane also arrives there itself: see c_producer)
            cute.arch.sync_warp()

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

    def _store_d_block(self, d_store, st, w, e_q: int, m_tile, n_tile):
        """Issue the TMA store of the D entry in C stage ``st``: warpgroup w's entry ``e_q``
        (block e_q // c_split, row half e_q % c_split) of tile (m_tile, n_tile). The caller
        waits for the store's read of the stage before reloading it.

        The math warps wrote it over the C entry, fenced their writes to the async proxy and
        released the stage (lane 0 of each warp after a warp sync, or with ping-pong dbias
        every thread); the acquire that got us here orders the store after them. An entry
        past 2N lies outside the tensor map: TMA writes nothing."""
        tma_atom_d, tDsD, tDgD = d_store
        cute.copy(tma_atom_d, tDsD[(None, st.index)],
                  tDgD[(None, self.c_row_block(m_tile, w, e_q % self.c_split),
                        n_tile * self.nblk + e_q // self.c_split)])
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def mma_mainloop(self, ab_pipe, mmas, tCrA, tCrB, acc, pos: Int32, mine_done,
                     signal_other, kcnt=None):
        """``kcnt`` k-tiles (None: all K) of one tile into ``acc``; consumes ring positions
        [pos, pos + kcnt).

        Then hands the tensor cores to the other warpgroup (``mine_done``, when it has a
        next tile). Arriving before the last WGMMA retires was measured slower on qwen3
        (0.159 -> 0.180 ms), so the hand-off waits for it."""
        stages = self.ab_stages
        read = pipeline.PipelineState(stages, pos, pos % stages, (pos // stages) % 2)
        release = read.clone()
        num_k_blocks = cute.size(tCrA, mode=[2])
        first, tiled_mma = mmas
        # No zero fill: the tile's first WGMMA overwrites the accumulator (scale-d = 0). The
        # fill's register moves, which LLVM sinks past wgmma.fence among the WGMMAs, made
        # ptxas serialize every WGMMA of the kernel (C7519: measured 1.6x slower on dsv3
        # without dbias) or inject a wait_group (C7517, with dbias).
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
    def _issue_k_tile(self, ab_pipe, read, tiled_mma, tCrA, tCrB, acc, num_k_blocks,
                      first=None):
        """Wait for ring stage ``read`` and issue its WGMMAs (TILE_K / 16 of them) as one
        committed group into ``acc``; ``first`` (the overwriting MMA) issues k-block 0."""
        ab_pipe.consumer_wait(read)
        cute.nvgpu.warpgroup.fence()
        for kb in cutlass.range_constexpr(num_k_blocks):
            coord = (None, None, kb, read.index)
            mma = first if cutlass.const_expr(first is not None and kb == 0) else tiled_mma
            cute.gemm(mma, acc, tCrA[coord], tCrB[coord], acc)
        cute.nvgpu.warpgroup.commit_group()

    # ------------------------------------------------------------------ epilogue
    # Plain-Python helpers: they run while tracing (their loops unroll), building lists of
    # SSA values for the jit epilogue.
    def _zeros(self, count):
        return [Float32(0.0) for _ in range(count)]

    def _thread_rows(self, tCcC, row0):
        half = self.tile_n // 2
        return [row0 + tCcC[h * half + 2 * r][0] for h in range(self.halves) for r in range(2)]

    def _gather(self, mT, idx):
        return [mT[i] for i in idx]

    def _pair_values(self, j, h):
        half = self.tile_n // 2
        return [h * half + 4 * g + 2 * r for g in range(4 * j, 4 * j + 4) for r in range(2)]

    @cute.jit
    def _store_pair(self, mT: cute.Tensor, offset: Int32, x0: Float32, x1: Float32):
        frag = cute.make_rmem_tensor((2,), Float32)
        frag[0] = x0
        frag[1] = x1
        view = cute.make_tensor(mT.iterator + cute.assume(offset, divby=2), cute.make_layout(2))
        view.store(frag.load().to(self.cfg.d_dtype))

    def _smem_pair(self, sCj, r, col):
        """Elements (r, col), (r, col + 1) of a C block in shared memory as one 2-element
        tensor (col even). 16-bit C only: the 128B swizzle permutes 16-byte chunks, so the
        pair is contiguous and 4-byte aligned; the view keeps the block's swizzled iterator
        and adds the unswizzled offset r * 64 + col, so one 32-bit access replaces two
        16-bit ones (PTX: 256 ld/st.shared.b16 per tile and thread become 128 b32)."""
        off = cute.assume(r * C_BLOCK_COLS + col, divby=2)
        return cute.make_tensor(sCj.iterator + off, cute.make_layout(2))

    def _pairs_in_smem(self) -> bool:
        return self.cfg.c_dtype.width == 16

    @staticmethod
    def _bf16_pair(pair):
        """The two bf16 values of a 2-element shared-memory pair as fp32, exactly: a bf16 is
        the top half of its fp32, so one 32-bit load and two integer operations (low
        element: shift left 16; high: mask the low 16 bits off). The generic conversion
        took 1.5 instructions per value (SHF, and PRMT for the high half) in the
        cooperative epilogue's SASS (session 19)."""
        bits = pair.load().bitcast(Int32)[0]
        return [(bits << 16).bitcast(Float32), (bits & Int32(-65536)).bitcast(Float32)]

    @staticmethod
    def _add_term(total, x):
        """total + x, or x itself for the first term: summing from 0.0 instead left ptxas
        one FADD per column sum and block to keep (0.0 + -0.0 is +0.0), 128 per thread and
        tile of the cooperative epilogue (session 19's SASS)."""
        return x if total is None else total + x

    @cute.jit
    def _load_gate_up(self, sCj, r, col):
        """fp32 gate (C column col, col + 1) and up (col + 32, col + 33) of row r."""
        if cutlass.const_expr(self.cfg.c_dtype is cutlass.BFloat16):
            return (self._bf16_pair(self._smem_pair(sCj, r, col)),
                    self._bf16_pair(self._smem_pair(sCj, r, col + 32)))
        elif cutlass.const_expr(self._pairs_in_smem()):
            g = self._smem_pair(sCj, r, col).load().to(Float32)
            u = self._smem_pair(sCj, r, col + 32).load().to(Float32)
            return [g[0], g[1]], [u[0], u[1]]
        else:
            return ([sCj[(r, col)].to(Float32), sCj[(r, col + 1)].to(Float32)],
                    [sCj[(r, col + 32)].to(Float32), sCj[(r, col + 33)].to(Float32)])

    @cute.jit
    def _put_pair(self, sCj, r, col, x0: Float32, x1: Float32):
        """D values of (r, col), (r, col + 1) written over the C block in shared memory."""
        if cutlass.const_expr(self._pairs_in_smem()):
            frag = cute.make_rmem_tensor((2,), Float32)
            frag[0] = x0
            frag[1] = x1
            self._smem_pair(sCj, r, col).store(frag.load().to(self.cfg.d_dtype))
        else:
            sCj[(r, col)] = x0.to(self.cfg.d_dtype)
            sCj[(r, col + 1)] = x1.to(self.cfg.d_dtype)

    @cute.jit
    def epilogue(self, acc, tCcC, c_pipe, sC, wg, cpos, mD, mAlpha, mBeta, mProb, mDprob,
                 geglu_alpha, clamp_max, clamp_min, linear_offset, m_tile, n_tile, expert,
                 tidx, sDb, hand_mbar, kslot):
        """Fused dGLU epilogue from one warpgroup's wg_rows x TILE_N accumulator registers
        (ping-pong: the whole 128-row tile, two 64-row halves; cooperative: its 64 rows).

        WGMMA 64xN fp32 fragment (per 64-row half ``h``): value v -> column bit v%2, row +8
        when (v//2)%2 == 1, 8-column group v//4; a thread holds rows lane//4 (+8) of its
        warp's 16 and columns 2*(lane%4) + {0,1} of every 8-column group. Flat index over the
        halves: v + h*(TILE_N/2). So a thread owns 2 rows per half (static slot 2h + row bit) and,
        per 32-column block j, the 4 groups 4j..4j+3 (8 columns) in each half. Block j's
        gate/up C values come from shared memory (C block j of this warpgroup's rows:
        columns [0, 32) gate, [32, 64) up, loaded by TMA ahead of time).
        """
        cfg = self.cfg
        two_n = 2 * cfg.n
        row0 = m_tile * TILE_M
        n0 = n_tile * self.tile_n
        alpha = mAlpha[expert]
        g_scale = alpha * alpha
        beta = mBeta[expert]
        lane = tidx % 32
        swiglu = cfg.act_func == "dswiglu"
        # Scalars hoisted out of the per-element math (see epilogue_math): dgate/dup =
        # acc * row_scale[slot] * (local derivative), row_scale = alpha^2 * p (times beta for
        # dswiglu, whose local derivatives come from the unscaled C values), and the dprob
        # row sum collects acc * act, times dprob_scale = alpha^2 (beta^2 for dswiglu) once.
        c_scale = Float32(1.0)
        neg_log2e_beta = None  # the exp2 argument's scale, dswiglu only
        if cutlass.const_expr(swiglu):
            c_scale = beta
            neg_log2e_beta = beta * Float32(-LOG2_E)
        dprob_scale = g_scale * c_scale * c_scale

        rows = self._thread_rows(tCcC, row0)
        row_scale = [g_scale * c_scale * p for p in self._gather(mProb, rows)]
        dprob = self._zeros(2 * self.halves)
        # the warpgroup's first row inside the tile: C/D blocks hold only its rows
        blk_row0 = 64 * wg if self.coop else 0
        # a ring entry holds the block's rows of per_entry halves (c_split 2: one half each)
        per_entry = self.halves // self.c_split
        for j in cutlass.range_constexpr(self.nblk):
            if cutlass.const_expr(self.c_split == 1):
                # (the wait first, as before c_split: with it after the zero fills below,
                # ptxas spilled 36 B in the fp32-C dbias epilogue)
                st = self.c_state(wg, cpos + j, False)
                c_pipe.consumer_wait(st)
                sCj = sC[(None, None, st.index)]
            valid = self._block_valid(n0, j)
            col_gate = [None] * 8  # column sums (dbias), from their first term
            col_up = [None] * 8
            for h in cutlass.range_constexpr(self.halves):
                if cutlass.const_expr(self.c_split > 1 and h % per_entry == 0):
                    # the entry's first (only) half
                    st = self.c_state(wg, cpos + j * self.c_split + h // per_entry, False)
                    c_pipe.consumer_wait(st)
                    sCj = sC[(None, None, st.index)]
                # the entry's first row inside the tile
                ent_row0 = blk_row0 + self.c_rows * (h // per_entry)
                pvals = self._pair_values(j, h)
                # (row in the tile, row in the C ring entry, column in the block) of each pair
                where = [(tCcC[v][0], tCcC[v][0] - ent_row0, tCcC[v][1] % 32) for v in pvals]
                # Every gate/up value of this half-block first, then the math and the D
                # writes: (D through shared memory) each D pair overwrites the C pair it
                # came from, and ptxas cannot tell the next pair's addresses apart from it,
                # so with loads between the stores it kept each pair's chain (load, ex2,
                # rcp, ..., store) in order (session 21's SASS), and the cooperative
                # epilogue issued about every other cycle (~3,300 instructions per thread
                # in 12.5 k cycles, 2 warps per scheduler); reordered, 10.6 k. 16-bit C
                # only: fp32 C's values take twice the registers (a dgeglu fp32-C kernel
                # spilled 140 B)
                loaded = None
                if cutlass.const_expr(self._pairs_in_smem()):
                    loaded = [self._load_gate_up(sCj, w[1], w[2]) for w in where]
                for pi in cutlass.range_constexpr(len(pvals)):
                    v = pvals[pi]
                    r_loc, r_blk, c_loc = where[pi]
                    slot = 2 * h + (v // 2) % 2
                    outs = []
                    if cutlass.const_expr(loaded is None):
                        gates, ups = self._load_gate_up(sCj, r_blk, c_loc)
                    else:
                        gates, ups = loaded[pi]
                    for c in cutlass.range_constexpr(2):
                        if cutlass.const_expr(swiglu):
                            dg_l, du_l, act = dswiglu_unscaled(gates[c], ups[c], beta,
                                                               neg_log2e_beta)
                        else:
                            dg_l, du_l, act = dgeglu_local(gates[c] * beta, ups[c] * beta,
                                                           geglu_alpha, clamp_max, clamp_min,
                                                           linear_offset)
                        r = acc[v + c] * row_scale[slot]
                        outs.append((r * dg_l, r * du_l))
                        dprob[slot] = dprob[slot] + acc[v + c] * act
                        if cutlass.const_expr(cfg.generate_dbias):
                            col = ((pi // 2) * 2) + c  # group-in-block * 2 + column bit
                            col_gate[col] = self._add_term(col_gate[col], outs[c][0])
                            col_up[col] = self._add_term(col_up[col], outs[c][1])
                    if cutlass.const_expr(cfg.d_via_smem()):
                        # over the gate/up elements this thread (alone) just read
                        self._put_pair(sCj, r_blk, c_loc, outs[0][0], outs[1][0])
                        self._put_pair(sCj, r_blk, c_loc + 32, outs[0][1], outs[1][1])
                    elif valid:
                        off = (row0 + r_loc) * two_n + 2 * n0 + 64 * j + c_loc
                        self._store_pair(mD, off, outs[0][0], outs[1][0])
                        self._store_pair(mD, off + 32, outs[0][1], outs[1][1])
                if cutlass.const_expr(h % per_entry == per_entry - 1):  # the entry is done
                    self._release_entry(c_pipe, st, sDb, col_gate, col_up, tidx,
                                        h == self.halves - 1)
            if cutlass.const_expr(cfg.generate_dbias and self.coop):
                # (not a phantom block past column 2N: N % 32 == 0, so a block is all in or
                # all out. Session 17: racecheck reported, in 2 of 3 runs, the folder's
                # zeroing of a phantom block against these adds of zeros; a phantom block's
                # sums are neither added nor flushed now)
                if valid:  # (the valid blocks are a prefix: block kslot + j of the CTA)
                    self._dbias_block(col_gate, col_up, sDb, j, tidx, hand_mbar, kslot + j)

        # dprob: the 4 lanes of a quad hold the same rows -> butterfly over lane bits 0-1
        for s in cutlass.range_constexpr(len(dprob)):
            x = dprob[s]
            x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
            x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
            dprob[s] = x * dprob_scale
        if lane % 4 == 0:
            for s in cutlass.range_constexpr(len(dprob)):
                cute.arch.atomic_add((mDprob.iterator + rows[s]).llvm_ptr, dprob[s])

    def _release_entry(self, c_pipe, st, sDb, col_gate, col_up, tidx, last_of_block: bool):
        """Hand C ring entry ``st`` back to the C producer warp once this thread is done
        with it: (ping-pong dbias, with the block's last entry) the block's column sums into
        the entry's slice, (D through shared memory) the proxy fence, then the release."""
        if cutlass.const_expr(self.dbias_via_producer() and last_of_block):
            # the C producer warp adds them to the workspace before it reloads the stage
            self._dbias_block(col_gate, col_up, sDb, st.index // self.c_split, tidx, None,
                              None)
        if cutlass.const_expr(self.cfg.d_via_smem()):
            # the D values over C are complete in this warp: visible to the TMA store that
            # the C producer warp issues once the stage is released
            cute.arch.fence_proxy("async.shared", space="cta")
        # every read of this entry is done (values are in registers): free the stage
        if cutlass.const_expr(self.dbias_via_producer()):
            # every thread arrives after its own shared-memory writes (an arrive has
            # release semantics), so the C producer warp's wait orders all of them
            # before its reads of the slice without relying on a warp sync
            c_pipe.sync_object_empty.arrive(st.index, c_pipe.consumer_mask)
        else:
            if cutlass.const_expr(self.cfg.d_via_smem()):
                cute.arch.sync_warp()  # every lane's writes before lane 0's release
            c_pipe.consumer_release(st)

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
    def dbias_folder(self, mOffs, num_experts, mWs, mCount, mDbOut, unit0, walk, m_tiles,
                     tidx, sDb, hand_mbar, split):
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
        or negative; decreasing offsets can leave one short) folds the
        tile's 2*TILE_N columns: each sum read by atomic exchange with 0 (coherent at L2,
        leaves zero), dbias = bf16(fp32(dbias) + sum), then the counter reset. So every
        launch leaves the dbias region of the workspace zero (``_count_and_fold``). The
        ping-pong C producer warp only fences and hands over to this warp, and the
        cooperative math warps only write their rows and arrive (no atomic with a result in
        their loops: in the math warps that cost ptxas ~50 B of spills in the fp32-C
        epilogue). The phantom N-tile of an odd cluster_n pair is handed over but not
        counted (no columns, no counter)."""
        nunits, num_units, _, _ = walk
        lane = tidx % 32
        unit = self.first_epi_unit(unit0, split)  # (split: final pieces only)
        k = Int32(0)
        kslot = Int32(0)  # (cooperative) blocks taken so far, counted as the math warps do
        end = self.epi_end(num_units, split)
        while unit < end:
            m_tile, n_tile = self.tile_of(unit, walk)
            expert = expert_of_row(mOffs, num_experts, m_tile * TILE_M)
            n0 = n_tile * self.tile_n
            if cutlass.const_expr(self.coop):
                self._sum_slots(sDb, mWs, expert, n0, lane, hand_mbar, kslot)
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
                    self._count_and_fold(mOffs, mWs, mCount, mDbOut, expert, n_tile, m_tiles,
                                         lane)
            unit = self.next_epi_unit(unit, nunits, split)
            k += 1

    @cute.jit
    def _count_and_fold(self, mOffs, mWs, mCount, mDbOut, expert, n_tile, m_tiles, lane):
        """Lane 0 counts a tile's arrival on (expert, N-tile); the count that completes the
        expert's tiles folds the tile's columns (see ``dbias_folder``)."""
        two_n = 2 * self.cfg.n
        n0 = n_tile * self.tile_n
        counter = (mCount.iterator + (expert * self.num_n_tiles + n_tile)).llvm_ptr
        last = Int32(0)
        if lane == 0:
            lo = Int32(0)
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

    def _valid_blocks(self, n0):
        """How many of the tile's blocks are inside N (a prefix: ``_block_valid``), so that
        the math warps and the folder warp count the slot's hand-overs alike: none on the
        phantom N-tile of an odd cluster_n pair (n0 >= N; without the floor at 0 the count
        went negative there and every later wait took the wrong parity: review, session 18)."""
        return cutlass.max(cutlass.min(Int32(self.nblk), (self.cfg.n - n0) // 32), Int32(0))

    @cute.jit
    def _sum_slots(self, sDb, mWs, expert, n0, lane, hand_mbar, kslot):
        """The folder warp's part of one cooperative tile's dbias: for each block the
        epilogue sums (those inside 2N, in the epilogue's order), wait for the 8 warps'
        rows of the slot, add each column's 8 values and that sum to the workspace ``mWs``
        (L, 2N) (one fp32 atomic per column; lane takes columns lane and lane + 32), then
        hand the slot back. ``kslot``: the CTA's blocks before this tile's."""
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
                    cute.arch.atomic_add((mWs.iterator + (expert * two_n + g)).llvm_ptr, sums[i])
