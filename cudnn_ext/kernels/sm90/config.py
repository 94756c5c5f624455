"""The one configuration of the Hopper kernel: :class:`Sm90Config`, a frozen value with no DSL
import.

Owns what a compiled kernel is specialized on, what follows from it (shared-memory stages that
fit, C ring geometry, workspace sizes) and the rule of which configurations are valid
(:meth:`Sm90Config.check`). The sm90 engine's knob space yields these values, its compile cache
keys on them, its plans size their workspace from them, and the kernel reads them; a test pins
the fields (tests/compile/test_sm90_compile.py). Never runtime sizes: M, L (the expert count), the
offsets, pointers and the activation constants are kernel arguments.

Imports nothing but the standard library, so the engine, serialized plans and the JAX adapter
can build and compare configurations without the CuTe DSL.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


TILE_M = 128  # one math warpgroup x two 64-row WGMMA halves; 256-aligned offsets => one expert
TILE_K = 64  # 4 x WGMMA K (16) per k-tile: 128-byte rows => 128B swizzle for 16-bit types
#: e4m3 operands (the fp8_blockwise recipe): one k-tile is one 128-K scale block (4 x WGMMA
#: K 32; 128-byte rows as well), whose fp32 partial sums are promoted once per k-tile
BLOCKWISE_TILE_K = 128
SMEM_CAPACITY = 232448  # sm_90 max dynamic shared memory per block (227 KB)
NUM_THREADS = 384  # 1 producer + 2 math warpgroups
MATH_WARPGROUPS = 2
DESC_BYTES = 128  # one TMA descriptor (CUtensorMap) per expert (docs/vendor_contract.md §4.5)
C_BLOCK_COLS = 64  # one C block = the gate (32) + up (32) columns of 32 accumulator columns
# Partial-sum slots of the split last round (``split_last``): one per cluster (a cluster
# runs at most one non-final part, into the slot of its index), so the last round is spread
# over at most this many clusters (last_round_split). 132 = the H200's SMs: any grid of
# resident clusters there; a slot holds one 128 x tile_n fp32 accumulator per CTA of the
# cluster (34.6 MB in all at tile 256, 2 CTAs).
SPLIT_SLOTS = 132
SPLIT_MAX = 4  # the largest split_last
SPLIT_BARRIER = 4  # named barrier of the 256 math threads around a partial's hand-over
STAGGER_BARRIER = 2  # (wg_stagger) the ping-pong hand-over's first barrier, idle when cooperative

#: Element dtypes by name (the kernel maps them to CuTe DSL types), with their widths in bits.
DTYPE_BITS = {"bf16": 16, "fp16": 16, "fp32": 32, "e4m3": 8, "e5m2": 8}
#: A/B element types; e4m3 is the fp8_blockwise recipe's (fp32 scales per 1x128 block of A
#: and 128x128 block of B, applied per k-tile)
AB_DTYPES = ("bf16", "fp16", "e4m3")
#: D element types; the FP8 ones are the block-scaled contract's quantized D (``fp8_d``)
D_DTYPES = ("bf16", "fp16", "fp32", "e4m3", "e5m2")
#: (``d_scales``) the named barriers of the warp pairs that share a D_col block's 32 rows:
#: MX_PAIR_BARRIER + 2 x math warpgroup + pair (4 of them)
MX_PAIR_BARRIER = 5
#: the activations whose derivative epilogue.py implements (each keyed by its act_func)
KERNEL_ACTS = ("dswiglu", "dgeglu", "dsituglu")
#: dSiTU-GLU's beta1, beta2 in the config of every other activation (one compile key each)
SITU_DEFAULTS = (4.0, 25.0)


@dataclass(frozen=True)
class Sm90Config:
    """Everything one compiled SM90 kernel is specialized on.

    Problem family (from the problem; the engine fills them): ``n``, ``k``, the A/B, C and D
    element types (``"bf16"``, ``"fp16"``, ``"fp32"``), ``act_func``, ``generate_dbias``,
    ``weight_mode`` (``"dense"``: one (N, K, L) tensor; ``"discrete"``: a device table of L
    per-expert (N, K) base addresses, loaded through per-expert TMA descriptors a helper kernel
    builds on the device) and ``b_major`` (``"k"``: K-major; ``"n"``: N-major);
    ``generate_activation`` (the epilogue also stores prob x the activation value,
    (M, N) bf16, de-interleaved) and ``round_dgrad`` (the vendor's
    ``round_dgrad_to_input_dtype``: alpha^2 x acc rounded to bf16 before the epilogue math);
    the block-scaled contract's epilogue (its operands dequantized to bf16 first):
    ``geglu_beta`` (False: dGeGLU takes C without beta), ``has_prob`` / ``has_dprob``
    (False: p = 1 / no dprob sums) and ``generate_amax`` (per expert max |dgate|, max |dup|,
    NaN-quiet, into an fp32 (L, 2) output with one atomic max per warp and tile), and
    quantized D: FP8 ``d_dtype`` (``"e4m3"``, ``"e5m2"``) written from the epilogue's fp32
    values, by the plain saturating conversion or (``d_scales``, e4m3) as D_row/SFD_row (the
    e8m0 scale of each 32-column block of a row along 2N) and D_col/SFD_col (of each 32-row
    block of a column; ``discrete_col_sfd``: SFD_col in per-expert regions) by the MX block
    rule (``mx_rule``), with the device's norm_const;
    ``situ_beta1`` / ``situ_beta2``: dSiTU-GLU's betas, compile-time constants as in the
    vendor's kernel (SITU_DEFAULTS with the other activations). dSiTU-GLU is the block-scaled
    contract's only; the kernel applies beta to C for it.

    Knobs (what the engine's knob space and autotune choose between):

    * ``tile_n``: accumulator columns of a 128-row tile (ping-pong up to 128: 160/192 spill
      next to the epilogue; cooperative up to 256);
    * ``ab_stages``: A/B shared-memory stages, 0 = as many as fit (``stages``);
    * ``c_stages``: C blocks in flight per math warpgroup, 0 = 1 (the mainloop wants the
      shared memory more: docs/kernels.md);
    * ``c_split``: ping-pong C ring entries of 128 / c_split rows (2: a block is loaded,
      computed, released and D-stored in two 64-row halves, so one half's store and reload
      overlap the other half's math);
    * ``cluster_m`` / ``cluster_n``: CTAs per cluster along M (2: B k-tiles multicast to the
      pair sharing an N-tile) and N (2, with cluster_m 2, dense B only: A multicast too);
    * ``raster_group_m``: M-tiles per raster group (the schedule sweeps N-tiles inside one);
    * ``cooperative``: both math warpgroups share every 128-row tile, 64 rows each (fewer
      shared-memory bytes per MMA at tile 256, but an epilogue the MMAs do not hide); else
      ping-pong, each warpgroup whole tiles, their mainloops alternating;
    * ``split_last``: cooperative only, the static schedule's last, partial round spread along
      K over up to rem x split_last clusters, stream-K (1 = off; ``stream_k``);
    * ``act_staged``: (``generate_activation``, D of C's type) the activation output leaves
      as D does: written into a shared-memory block beside each C ring entry and TMA-stored
      by the C producer warp, instead of 4-byte register stores from the math warps (costs
      the shared memory of half a C ring: ``act_bytes``);
    * ``wg_stagger``: (e4m3, cooperative) the second math warpgroup starts each tile's
      mainloop once the first retired its first k-tile, so that one warpgroup's promotion
      runs under the other's WGMMAs instead of both draining at once (at least as many
      k-tiles as A/B stages).

    Launch variants (same main kernel, another prologue or host convention):

    * ``init_outputs``: fresh outputs (the functional op): a prologue kernel zeroes dprob, D's
      rows at/past offs[L-1] and dbias; else the contract (accumulate, tail untouched);
    * ``ws_zeroed``: the workspace's dbias region arrives zero (a scratch only these launches
      use, each leaving it zero): no zeroing kernel before the main one;
    * ``fold_dbias``: the kernel folds the fp32 column sums into the caller's bf16 dbias
      (arrival counters; every launch leaves the region zero); False leaves the fp32 sums as
      the result (the JAX FFI path: XLA hands zeroed buffers and JAX rounds).
    * ``deterministic``: dprob and dbias summed in a fixed order: the epilogue stores each
      (N-tile, row) dprob partial into an (N-tiles, M) slab at the dprob address, which the
      plan sums over N-tiles afterwards; each tile's dbias column sums go to a (partial_tiles,
      2N) slab (the last kernel argument) instead of the workspace atomics, which the plan
      sums over each expert's M-tiles in ascending order (``kernels.partials``, one launch for
      both; ``fold_dbias`` False: the kernel has no fold). No atomics reach either output.

    Row schedule:

    * ``ragged_m``: expert offsets of any row (``m_aligned`` below 256, 1 included). Each
      expert gets ceil(rows / (128 cluster_m)) units of its own, starting at its first row,
      so a tile may run past its expert's end: those rows are loaded but reach no output (D
      leaves through a descriptor that clips at the expert's end, the register stores and
      dprob atomics are predicated, dbias and amax terms are zeroed by select). A cluster
      pair along M shares one expert (its B k-tiles), its second tile possibly wholly past
      the expert's end. A helper kernel writes the per-expert cumulative unit counts into
      the scratch region (``ragged_table_offset``).
    """

    n: int
    k: int
    ab_dtype: str
    c_dtype: str
    d_dtype: str
    act_func: str
    generate_dbias: bool
    weight_mode: str = "dense"
    b_major: str = "k"
    generate_activation: bool = False
    round_dgrad: bool = False
    geglu_beta: bool = True
    has_prob: bool = True
    has_dprob: bool = True
    generate_amax: bool = False
    d_scales: bool = False
    discrete_col_sfd: bool = False
    situ_beta1: float = SITU_DEFAULTS[0]
    situ_beta2: float = SITU_DEFAULTS[1]
    tile_n: int = 128
    ab_stages: int = 0
    c_stages: int = 0
    c_split: int = 1
    cluster_m: int = 1
    cluster_n: int = 1
    raster_group_m: int = 8
    cooperative: bool = False
    split_last: int = 1
    act_staged: bool = False
    wg_stagger: bool = False
    init_outputs: bool = False
    ws_zeroed: bool = False
    fold_dbias: bool = True
    ragged_m: bool = False
    deterministic: bool = False

    # ------------------------------------------------------------------ (de)serialization
    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Sm90Config":
        """The config of ``as_dict()`` (a serialized plan's knobs); unknown or missing
        fields are refused by name."""
        kind = Sm90TraceConfig if "trace" in values else cls
        names = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"Sm90Config: unknown fields {unknown}")
        try:
            return kind(**values)
        except TypeError as exc:
            raise ValueError(f"Sm90Config: {exc}") from None

    # ------------------------------------------------------------------ validity
    def check(self) -> None:
        """Raise ValueError naming the field if the kernel cannot be built for this config
        (the engine calls it before anything compiles; the kernel again)."""
        if self.tile_n % 32 != 0 or not 32 <= self.tile_n <= self.max_tile_n():
            raise ValueError(f"tile_n must be a multiple of 32 in [32, {self.max_tile_n()}] "
                             f"(cooperative={self.cooperative}), got {self.tile_n}")
        if self.act_func not in KERNEL_ACTS:
            raise ValueError(f"act_func {self.act_func!r} is not supported by the SM90 kernel")
        for name in ("ab_dtype", "c_dtype", "d_dtype"):
            allowed = {"ab_dtype": AB_DTYPES, "d_dtype": D_DTYPES}.get(name, ("bf16", "fp16", "fp32"))
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.weight_mode not in ("dense", "discrete") or self.b_major not in ("k", "n"):
            raise ValueError(f"weight_mode/b_major {self.weight_mode!r}/{self.b_major!r} unsupported")
        betas = (self.situ_beta1, self.situ_beta2)
        if self.act_func == "dsituglu":
            if not all(isinstance(b, (int, float)) and not isinstance(b, bool)
                       and math.isfinite(b) and b > 0 for b in betas):
                raise ValueError(f"situ_beta1/situ_beta2 must be finite and positive, got "
                                 f"{betas}")
        elif betas != SITU_DEFAULTS:
            # (so that one kernel has one key)
            raise ValueError(f"situ_beta1/situ_beta2 are dSiTU-GLU's: they must stay "
                             f"{SITU_DEFAULTS} with act_func {self.act_func!r}, got {betas}")
        if self.cluster_m not in (1, 2):
            raise ValueError(f"cluster_m must be 1 or 2, got {self.cluster_m}")
        if self.discrete() and self.cluster_n != 1:
            raise ValueError(f"cluster_n must be 1 with discrete B, got {self.cluster_n}")
        if self.deterministic and (self.split() or self.init_outputs or self.fold_in_kernel()):
            raise ValueError(f"deterministic needs split_last 1, no init_outputs and no in-kernel "
                             f"dbias fold (the plan folds the slabs), got split_last="
                             f"{self.split_last}, init_outputs={self.init_outputs}, "
                             f"fold_dbias={self.fold_dbias}")
        if self.init_outputs and self.generate_dbias and not self.fold_dbias:
            raise ValueError("init_outputs with dbias needs fold_dbias (the fold writes dbias)")
        if self.cluster_n not in (1, 2) or (self.cluster_n == 2 and self.cluster_m != 2):
            raise ValueError(f"cluster_n must be 1, or 2 with cluster_m == 2, got "
                             f"cluster_n={self.cluster_n}, cluster_m={self.cluster_m}")
        if not 1 <= self.split_last <= SPLIT_MAX or (self.split() and not self.cooperative):
            raise ValueError(f"split_last must be in [1, {SPLIT_MAX}], and 1 unless cooperative, "
                             f"got split_last={self.split_last}, cooperative={self.cooperative}")
        if self.split() and self.c_ring() > self.tile_n // 32:
            # the C producer's hand-backs take a stage's tile from the previous unit it walked
            # (c_producer), not from its FIFO position, which a split last round breaks
            raise ValueError(f"c_stages must be at most tile_n / 32 = {self.tile_n // 32} with "
                             f"split_last, got {self.c_ring()}")
        stages = self.stages()
        if stages < 2:
            # one stage would deadlock the mainloop (it waits for the next k-tile before it
            # releases the current one)
            raise ValueError(
                f"ab_stages: {stages} A/B shared-memory stage(s) with {self.smem_users()}; "
                f"the kernel needs at least 2 (fewer C stages or a narrower tile leave room "
                f"for them)")
        if self.ab_stages > self.stages_that_fit():
            # an explicit count bypasses the fit (the deep-K cooperative form asks for 3,
            # which fit with 16-bit C only)
            raise ValueError(
                f"ab_stages: {self.ab_stages} A/B shared-memory stages do not fit with "
                f"{self.smem_users()}: at most {self.stages_that_fit()} do")
        if self.blockwise():
            self._check_blockwise()
        if self.wg_stagger and not (self.blockwise() and self.cooperative):
            raise ValueError(f"wg_stagger needs e4m3 operands in the cooperative schedule, got "
                             f"ab_dtype={self.ab_dtype!r}, cooperative={self.cooperative}")
        if self.wg_stagger and self.k // BLOCKWISE_TILE_K < stages:
            # warpgroup 0 reaches tile t + 1's arrival only once a stage of tile t's ring
            # positions was released by both, so warpgroup 1 is past tile t's wait: each
            # arrival meets its own wait only with at least as many k-tiles as stages
            raise ValueError(f"wg_stagger needs at least as many k-tiles as A/B stages, got "
                             f"{self.k // BLOCKWISE_TILE_K} k-tiles (K={self.k}), {stages} stages")
        self._check_fp8_d()
        if self.c_split not in (1, 2) or (self.c_split == 2 and self.cooperative):
            raise ValueError(f"c_split must be 1, or 2 in the ping-pong schedule, got "
                             f"c_split={self.c_split}, cooperative={self.cooperative}")
        if self.act_staged and not (self.generate_activation and self.d_via_smem()):
            raise ValueError(f"act_staged needs generate_activation and D of C's type (D through "
                             f"shared memory), got generate_activation={self.generate_activation}, "
                             f"c_dtype={self.c_dtype!r}, d_dtype={self.d_dtype!r}")
        if self.generate_dbias and not self.cooperative and self.c_ring() > self.tile_n // 32:
            # the C producer hands back a stage's dbias sums knowing only the current and
            # the previous tile (see c_producer)
            raise ValueError(f"c_stages must be at most tile_n / 32 = {self.tile_n // 32} with "
                             f"dbias in the ping-pong schedule, got {self.c_ring()}")

    def _check_blockwise(self) -> None:
        """e4m3 operands: a warpgroup's tile of at most 64 accumulator registers per thread
        (the k-tile's partial sums take as many beside them): cooperative tile_n <= 128 or
        ping-pong tile_n <= 64; dense K-major B (FP8 WGMMA reads K-major operands only),
        whole scale blocks along K, one part per tile."""
        why = []
        if self.wg_rows() * self.tile_n > 64 * 128:
            why.append(f"at most 64 accumulator registers per thread: cooperative tile_n <= 128 or "
                       f"ping-pong tile_n <= 64 (cooperative={self.cooperative}, tile_n={self.tile_n})")
        if self.weight_mode != "dense" or self.b_major != "k":
            why.append(f"dense K-major B (weight_mode={self.weight_mode!r}, b_major={self.b_major!r})")
        if self.k % BLOCKWISE_TILE_K:
            why.append(f"K a multiple of {BLOCKWISE_TILE_K} (K={self.k})")
        if self.split() or self.round_dgrad:
            why.append(f"split_last 1 and no round_dgrad (split_last={self.split_last}, "
                       f"round_dgrad={self.round_dgrad})")
        if why:
            raise ValueError("ab_dtype 'e4m3' needs " + "; ".join(why))

    def _check_fp8_d(self) -> None:
        """Quantized D: 16-bit operands on 256-aligned experts (a D_col block's 32 rows lie
        in one tile, of one expert); scales with e4m3 D only, per-expert SFD_col with
        scales only."""
        why = []
        if self.fp8_d() and (self.blockwise() or self.ragged_m):
            why.append(f"16-bit operands and 256-aligned offsets (ab_dtype={self.ab_dtype!r}, "
                       f"ragged_m={self.ragged_m})")
        if self.d_scales and self.d_dtype != "e4m3":
            why.append(f"d_scales with e4m3 D (d_dtype={self.d_dtype!r})")
        if self.discrete_col_sfd and not self.d_scales:
            why.append("discrete_col_sfd with d_scales")
        if why:
            raise ValueError("quantized D needs " + "; ".join(why))

    # ------------------------------------------------------------------ derived
    def fp8_d(self) -> bool:
        """D is FP8: the epilogue quantizes its fp32 values (``d_scales``: the MX rule)."""
        return DTYPE_BITS[self.d_dtype] == 8

    @staticmethod
    def mx_exchange_shape() -> tuple:
        """(``d_scales``) The shared memory through which the two warps of a D_col block
        exchange its columns' amax, in int32 words: (math warpgroup, warp, buffer (one block's
        while the pair may still read the previous one), block column)."""
        return (MATH_WARPGROUPS, 4, 2, C_BLOCK_COLS)

    def mx_exchange_ints(self) -> int:
        """int32 words of ``mx_exchange_shape`` (0 without ``d_scales``)."""
        return math.prod(self.mx_exchange_shape()) if self.d_scales else 0

    def partial_tiles(self, m, num_experts):
        """(deterministic) Rows of the dbias partials slab: every M-tile index the schedule
        can give a tile of M rows (ragged_m: each expert's last unit may be partial)."""
        extra = num_experts if self.ragged_m else 0
        return (m // (TILE_M * self.cluster_m) + extra) * self.cluster_m

    def blockwise(self) -> bool:
        """e4m3 A and B with the fp8_blockwise recipe's fp32 scales."""
        return self.ab_dtype == "e4m3"

    def tile_k(self) -> int:
        return BLOCKWISE_TILE_K if self.blockwise() else TILE_K

    def wg_rows(self) -> int:
        """Rows of a tile one math warpgroup owns (and of its C/D blocks)."""
        return TILE_M // MATH_WARPGROUPS if self.cooperative else TILE_M

    def max_tile_n(self) -> int:
        # the accumulator is wg_rows x tile_n fp32 over 128 threads: 128 registers at most
        return 256 if self.cooperative else 128

    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    def num_n_tiles(self) -> int:
        return (self.n + self.tile_n - 1) // self.tile_n

    def num_n_units(self) -> int:
        """Schedule units along N: pairs of N-tiles with cluster_n == 2 (an odd last tile
        is paired with an out-of-bounds one: TMA zero-fills its loads and drops its stores)."""
        return (self.num_n_tiles() + self.cluster_n - 1) // self.cluster_n

    def raster_group(self) -> int:
        """Raster group size in schedule units (cluster_m M-tiles each)."""
        return max(1, self.raster_group_m // self.cluster_m)

    def discrete(self) -> bool:
        return self.weight_mode == "discrete"

    def d_via_smem(self) -> bool:
        """D leaves through shared memory with TMA stores when it has C's type: a D block is
        written over the C block it was computed from (same shape, same swizzled layout;
        each thread overwrites exactly the elements it read) and stored whole by TMA, instead
        of 32-bit register stores (measured faster: docs/kernels.md)."""
        return self.d_dtype == self.c_dtype

    def c_ring(self) -> int:
        return self.c_stages if self.c_stages else 1

    def c_rows(self) -> int:
        """Rows of one C ring entry (a warpgroup's rows, or half of them with c_split 2)."""
        return self.wg_rows() // self.c_split

    def c_block_bytes(self) -> int:
        """Bytes of one C block (c_split ring entries)."""
        return self.wg_rows() * C_BLOCK_COLS * DTYPE_BITS[self.c_dtype] // 8

    def act_cols(self) -> int:
        """Columns of one staged activation block: the 32 accumulator columns of a C block."""
        return C_BLOCK_COLS // 2

    def act_bytes(self) -> int:
        """(``act_staged``) Shared-memory bytes of the staged activation blocks: one bf16
        block of wg_rows x 32 beside each C block (0 without it)."""
        if not self.act_staged:
            return 0
        return MATH_WARPGROUPS * self.c_ring() * self.wg_rows() * self.act_cols() * 2

    def dbias_smem_shape(self) -> tuple:
        """Shape of the fp32 partial column sums in shared memory (dbias only), so that a
        tile costs one global atomic per column instead of one per warp and column.
        Ping-pong: one slice per C stage, (C_BLOCK_COLS columns, 4 warps, C stages): each
        warp puts its block's column sums in the slice of the block's stage before it
        releases the stage, and the warpgroup's C producer warp sums the 4 warps and adds
        them to the workspace before it reloads the stage (2 KB with one C stage per
        warpgroup: what lets a sixth A/B stage fit). Cooperative: one block's slot, (64 block
        columns, 8 warps), which each warp writes its row of without atomics and the folder
        warp sums, block by block (2 KB; per-warp slices of the whole tile, 16 KB, would cost
        an A/B stage). Without dbias a 1-element placeholder."""
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
        return (f"tile_n={self.tile_n}, c_stages={self.c_ring()}, C {self.c_dtype}, "
                f"dbias={self.generate_dbias}, cooperative={self.cooperative}"
                + (", act_staged=True" if self.act_staged else "")
                + (", d_scales=True" if self.d_scales else ""))

    def stages_that_fit(self) -> int:
        per_stage = (TILE_M + self.tile_n) * self.tile_k() * DTYPE_BITS[self.ab_dtype] // 8
        c_bytes = MATH_WARPGROUPS * self.c_ring() * self.c_block_bytes()
        # Besides the buffers and the dbias sums: the mbarriers (at most ~400 B; they follow
        # the 1024-B aligned buffers, so no padding), in a 1 KB margin. Ping-pong 128 x 128
        # with one C stage then keeps 6 A/B stages, exactly: 6 x 32 KiB + 32 KiB of C + 2 KiB
        # of dbias slices + 1 KiB = 227 KiB, about 830 B to spare after the mbarriers. A
        # 128 x 256 cooperative stage (48 KB) keeps 4 next to its 2 KB of dbias sums.
        fixed = (1024 + c_bytes + self.act_bytes()
                 + 4 * (self.dbias_smem_floats() + self.mx_exchange_ints()))
        return (SMEM_CAPACITY - fixed) // per_stage

    def ws_dbias_sums(self) -> bool:
        """The kernel adds dbias column sums into the workspace (not the deterministic form,
        whose sums go to its slab)."""
        return self.generate_dbias and not self.deterministic

    def fold_in_kernel(self) -> bool:
        """dbias is folded by the kernel (arrival counters in the workspace)."""
        return self.generate_dbias and self.fold_dbias

    def coop_dbias_slots(self) -> bool:
        """Cooperative with dbias (folded in the kernel or not): the math warps hand each
        block's per-warp column sums to the folder warp through a shared slot, and the
        folder sums them and adds them to the workspace (``dbias_folder``)."""
        return self.cooperative and self.generate_dbias

    def has_folder(self) -> bool:
        """Warp 3 runs ``dbias_folder``: it folds dbias in the kernel, or (cooperative) it
        sums the blocks' dbias slots."""
        return self.fold_in_kernel() or self.coop_dbias_slots()

    def split(self) -> bool:
        """The last round is split along K (``split_last``)."""
        return self.split_last > 1

    # ------------------------------------------------------------------ workspace
    def dbias_ws_elems(self, num_experts):
        """4-byte elements of the workspace's dbias region: the fp32 sums (L, 2N), then
        (folded in the kernel) one int32 arrival counter per (expert, N-tile); none in the
        deterministic form (its sums go to the slab)."""
        sums = num_experts * 2 * self.n if self.ws_dbias_sums() else 0
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

    def zeroed_ws_elems(self, num_experts) -> int:
        """4-byte elements at the start of the kernel's scratch region that every launch
        leaves zero: the dbias sums and counters, then the split's flags."""
        return self.dbias_ws_elems(num_experts) + self.split_flags()

    def ragged_table_offset(self, num_experts) -> int:
        """4-byte element offset of the ragged schedule's table (``ragged_m``): L int32
        cumulative M-tile counts, written by a helper kernel each launch, after the zeroed
        part and the split's slots, 128-byte aligned."""
        if self.split():
            end = self.split_part_offset(num_experts) + self.split_part_floats()
        else:
            end = self.zeroed_ws_elems(num_experts)
        return (end + 31) // 32 * 32

    def scratch_ws_elems(self, num_experts) -> int:
        """4-byte elements of the kernel's whole scratch region: the zeroed part, then (split)
        the partial-sum slots, then (ragged_m) the tile table, each 128-byte aligned."""
        if self.ragged_m:
            return self.ragged_table_offset(num_experts) + num_experts
        if self.split():
            return self.split_part_offset(num_experts) + self.split_part_floats()
        return self.zeroed_ws_elems(num_experts)


# ---------------------------------------------------------------------- diagnostics
TRACE_MAX_CTAS = 256  # CTAs a trace region holds (a launch's grid is at most the SM count)
TRACE_MAX_TILES = 4096  # the trace bound: tiles recorded per math warpgroup


@dataclass(frozen=True)
class Sm90TraceConfig(Sm90Config):
    """A diagnostic build (never an engine choice; ``kernels.sm90.trace``): ``trace`` > 0 tiles
    per math warpgroup get clock64 stamps at the loop top, after the ping-pong turn, after
    the mainloop and after the epilogue, stored in a workspace region the launch passes in
    the (dense-only) descriptor slot, laid out (4, trace + 1, 2, TRACE_MAX_CTAS + 1)
    column-major: entry 0 of a (CTA, warpgroup) = (globaltimer, clock64) at its start and
    end, entry 1 + t its t-th tile; slot (0, 0, 0, TRACE_MAX_CTAS) holds the launch's grid.
    Read with ``engines.sm90.Sm90TracePlan.read_trace``."""

    trace: int = 64

    def check(self) -> None:
        super().check()
        if not 0 < self.trace <= TRACE_MAX_TILES or self.discrete():
            raise ValueError(f"trace must be in [1, {TRACE_MAX_TILES}] with dense weights (the "
                             f"descriptor slot holds the stamps), got trace={self.trace}, "
                             f"weight_mode={self.weight_mode!r}")

    def trace_bytes(self) -> int:
        # TRACE_MAX_CTAS rows of stamps and one header row (the launch's grid)
        return 8 * 4 * (self.trace + 1) * 2 * (TRACE_MAX_CTAS + 1)
