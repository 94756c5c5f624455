"""The dGLU epilogue of the SM90 kernel and its C ring (a mixin of
:class:`~.kernel.GroupedDgluSm90`).

Interface (what another epilogue, block-scaled or a forward GLU, must provide to plug in
beside this one): ``epilogue(acc, tCcC, c_pipe, sC, wg, cpos, params, m_tile, n_tile, expert,
tidx, sDb, hand_mbar, kslot)`` runs on one math warpgroup after its mainloop.

* In: ``acc``, the warpgroup's wg_rows x tile_n fp32 accumulator (``tCcC``: each value's tile
  coordinate); the tile's C blocks, taken in order from the warpgroup's private C FIFO
  (``c_pipe`` over ``sC``, from position ``cpos``: ``c_producer`` loads them ahead); the tile
  (``m_tile``, ``n_tile``, ``expert``); the launch's :class:`EpilogueParams`.
* Out: the D block, written over its C entry in shared memory (``d_via_smem``: the C producer
  warp TMA-stores it) or straight to ``params.mD`` (FP8 D: quantized, ``quant_d``);
  (``generate_activation``) prob x the activation value at the accumulator's columns, into
  the activation block beside the C entry (``act_staged``: TMA-stored with D) or straight to
  ``params.mAct``; dprob row partials (one
  fp32 atomic per row and tile); dbias column partials into ``sDb`` (ping-pong: the entry's stage slice, for
  the C producer; cooperative: the ``HandOver`` slot numbered ``kslot``, for the folder).

Warps 1 and 2 (``c_producer``) walk the tiles of math warpgroup 0 / 1, load their C windows
block by block (gate 32 + up 32 columns) into the warpgroup's ``c_stages``-deep ring, and
before reloading a released stage TMA-store the D block written over it and (ping-pong, dbias)
add the block's column sums to the workspace.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32

from .config import C_BLOCK_COLS, MATH_WARPGROUPS
from .epilogue_math import LOG2_E, dgeglu_local, dsituglu_local, dswiglu_unscaled


class EpilogueParams(NamedTuple):
    """The epilogue's launch-wide operands: D (M, 2N), the activation output (M*N, flat;
    written with ``generate_activation`` only; ``sAct``: with ``act_staged`` its shared-memory
    blocks, one per C ring entry, else None), amax (L*2, flat; ``generate_amax``) and dprob
    (M,) out, alpha and beta (L,) and prob (M,) in, the runtime activation constants, and
    (``d_scales``) the quantized D's other outputs (``quant_d.MxOutputs``; FP8 D itself is
    ``mD``)."""

    mD: object
    mAct: object
    sAct: object
    mAmax: object
    mAlpha: object
    mBeta: object
    mProb: object
    mDprob: object
    geglu_alpha: object
    clamp_max: object
    clamp_min: object
    linear_offset: object
    mx: object = None


class BlockStore(NamedTuple):
    """An output the C producer warp TMA-stores from shared memory, one block per C ring
    entry: D (written over the entry) or, with ``act_staged``, the activation (its own block
    beside the entry). ``s``/``g``: the TMA partitions of the staged blocks ``smem`` and of
    the global tensor ``tma`` (``ragged_m``: re-partitioned per tile); blocks of c_rows x
    ``cols``, addressed by (row block, column block) like C's."""

    atom: object
    s: object
    g: object
    tma: object
    smem: object
    cols: int


class DgluEpilogueMixin:
    """The C producer warps (``c_producer``) and the fused dGLU epilogue (``epilogue``)."""

    def c_state(self, w, p, producer: bool):
        """Pipeline state of position ``p`` of warpgroup ``w``'s private C FIFO.

        Parity waits are sound because each half of the ring has exactly one producer and
        one consumer, both walking positions in order."""
        phase = (p // self.c_stages) % 2
        if producer:
            phase = phase ^ 1  # producers start on the "already empty" phase
        return pipeline.PipelineState(MATH_WARPGROUPS * self.c_stages, p,
                                      w * self.c_stages + p % self.c_stages, phase)

    def c_full_arrivals(self) -> int:
        """Arrivals that (with the TMA bytes) complete a C stage's full barrier: with the
        dbias hand-off every lane of the C producer warp (each after its own reads of the
        slice that the math warps write again once the phase completes), else one.

        The PTX memory model is satisfied either way (the warp sync before the elected
        arrive orders the other lanes' reads), but compute-sanitizer's racecheck does not
        carry that ordering into the tensor-TMA-completed phase: with one arrival it reports
        write-after-read hazards (lanes 1-31), with every lane arriving none
        (tests/support/racecheck_probe.py)."""
        return 32 if self.dbias_via_producer() else 1

    @cute.jit
    def c_producer(self, c_pipe, tma_atom_c, tCgC, tCsC, c_src, w, unit0, walk, d_store, dbias,
                   split):
        """Warp 1 + w: TMA-loads, block by block, the C window of every tile math warpgroup
        w will process (the same walk as that warpgroup). It runs ahead into the next tile
        while the warpgroup is in its mainloop, so the first blocks are resident before the
        epilogue starts.

        A stage comes back released once the warpgroup is done with its block. Before this
        warp reloads it:
        * with ``d_store`` (D leaves through shared memory) the stage holds the D block the
          warpgroup wrote over the C block it read (and, ``act_staged``, the activation block
          beside it): this warp TMA-stores them, and waits until the stores have read them. The math warps only fence their writes and release: before,
          one of them issued each store and waited for its read, and the warpgroup met on a
          barrier per block, all on the epilogue's critical path;
        * with ``dbias`` (ping-pong) the stage's slice of ``sDb`` holds the 4 warps' column
          sums of the block: this warp adds them up and to the workspace, one atomic per
          column, and after a tile's last block tells the folder warp (``_fold_signal``). The
          math warps used to do this after each tile, on a barrier of their own.
        The last ``c_stages`` blocks are handled after the walk, and this warp waits for
        every store before it exits. Otherwise no producer tail: there is no cluster, and the
        consumers' arrives are their own shared-memory operations, complete before the CTA
        can exit.

        ``c_src``: C's TMA tensor and the C stages (``ragged_m``: a tile's C rows start at
        its own first row, so its blocks are partitioned per tile, ``_ragged_c``)."""
        nunits, num_units, _, _, _ = walk
        # (split: the units whose epilogue this CTA runs, final pieces only)
        unit = self.first_epi_unit(unit0 + self.first_unit_offset(w, nunits), split)
        p = Int32(0)
        cur = (Int32(0), Int32(0), Int32(0), Int32(0), Int32(0))
        prev = cur
        end = self.epi_end(num_units, split)
        while unit < end:
            m_tile, n_tile = self.tile_of(unit, walk)
            # (M-tile, N-tile, expert, first row, end row) of the tile being loaded and of
            # the one before: the first c_stages entries of a tile hand back the previous
            # tile's last entries (with c_stages <= nent; the expert is needed for dbias
            # only, the rows with ragged_m only)
            expert, row0, row_end = Int32(0), Int32(0), Int32(0)
            if cutlass.const_expr(dbias is not None or self.cfg.ragged_m):
                expert, row0, row_end = self.tile_rows(m_tile, walk)
            prev = cur
            cur = (m_tile, n_tile, expert, row0, row_end)
            c_tile, tCgC_t = m_tile, tCgC
            if cutlass.const_expr(self.cfg.ragged_m):
                c_tile, tCgC_t = 0, self._ragged_c(tma_atom_c, c_src, row0)
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
                          tCgC_t[(None, self.c_row_block(c_tile, w, h), n_tile * self.nblk + j)],
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
        m_tile, n_tile, expert, row0, row_end = tile
        if cutlass.const_expr(d_store is not None):
            if cutlass.const_expr(self.c_stages > self.nent):
                # two or more tiles back (no dbias): find the tile from the FIFO position
                nunits = walk[0]
                m_tile, n_tile = self.tile_of(
                    unit0 + self.first_unit_offset(w, nunits)
                    + (q // self.nent) * self.unit_step(nunits), walk)
                if cutlass.const_expr(self.cfg.ragged_m):
                    _, row0, row_end = self.tile_rows(m_tile, walk)
            self._store_d_block(d_store, st, w, e_q, m_tile, n_tile, row0, row_end)
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
                    if cutlass.const_expr(self.cfg.deterministic):
                        dbias.partials[m_tile * two_n + g] = s  # the tile's own slab row
                    else:
                        cute.arch.atomic_add((dbias.ws.iterator + (expert * two_n + g)).llvm_ptr,
                                             s)
        if cutlass.const_expr(d_store is not None):
            # by the issuing lane (the others have no bulk group); the warp sync keeps every
            # lane, hence the next load, after it
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        if cutlass.const_expr(d_store is not None or dbias is not None):
            # every lane's reads of the stage (and of its slice) before the elected lane's
            # arrive on the full barrier, after which the stage is written again (with
            # dbias every lane also arrives there itself: see c_producer)
            cute.arch.sync_warp()

    def _store_d_block(self, d_store, st, w, e_q: int, m_tile, n_tile, row0, row_end):
        """Issue the TMA stores of the entries in C stage ``st`` (D, and with ``act_staged``
        the activation): warpgroup w's entry ``e_q`` (block e_q // c_split, row half e_q %
        c_split) of tile (m_tile, n_tile); D's 64-column blocks over 2N and the activation's
        32-column blocks over N have the same block index. The caller waits for the stores'
        reads of the stage before reloading it.

        The math warps wrote it over the C entry, fenced their writes to the async proxy and
        released the stage (lane 0 of each warp after a warp sync, or with ping-pong dbias
        every thread); the acquire that got us here orders the store after them. An entry
        past 2N lies outside the tensor map: TMA writes nothing. ``ragged_m``: the tensor map
        is the clipping one (``_ragged_rows``), viewed from the tile's first row with the
        expert's end as its bound: rows from ``row_end`` on are not written."""
        row_tile = 0 if self.cfg.ragged_m else m_tile
        for out in d_store:
            g = out.g
            if cutlass.const_expr(self.cfg.ragged_m):
                _, g = self.block_partition(
                    out.atom, self._ragged_rows(out.tma, row0, row_end - row0), out.smem, out.cols)
            cute.copy(out.atom, out.s[(None, st.index)],
                      g[(None, self.c_row_block(row_tile, w, e_q % self.c_split),
                         n_tile * self.nblk + e_q // self.c_split)])
        cute.arch.cp_async_bulk_commit_group()

    def _ragged_c(self, tma_atom_c, c_src, row0):
        """(``ragged_m``) C's blocks of the 128 rows from ``row0`` on, partitioned as the
        kernel partitions the whole of C: M-tile 0 of the offset view."""
        mC, sC = c_src
        return self.block_partition(tma_atom_c, cute.domain_offset((row0, 0), mC), sC)[1]

    def block_partition(self, tma_atom, view, smem, cols=C_BLOCK_COLS):
        """(shared, global) TMA partitions of the block view ``view`` (TMA coordinates,
        tiled into c_rows x ``cols`` blocks) for the staged blocks ``smem`` (the C ring's, or
        the activation's beside them): how the C loads and the D and activation stores
        address a block (global index (row block, column block))."""
        g = cute.local_tile(view, (self.c_rows, cols), (None, None))
        return cute.nvgpu.cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2), cute.group_modes(g, 0, 2))

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
        """x0, x1 to elements offset, offset + 1 (even) of ``mT``, in ``mT``'s dtype: one
        32-bit store for 16-bit types."""
        frag = cute.make_rmem_tensor((2,), Float32)
        frag[0] = x0
        frag[1] = x1
        view = cute.make_tensor(mT.iterator + cute.assume(offset, divby=2), cute.make_layout(2))
        view.store(frag.load().to(mT.element_type))

    @cute.jit
    def _round_bf16_pair(self, x0: Float32, x1: Float32):
        """x0, x1 rounded to bf16 (nearest even) and back to fp32: ``round_dgrad`` (one
        cvt.rn.bf16x2.f32 for the pair)."""
        frag = cute.make_rmem_tensor((2,), Float32)
        frag[0] = x0
        frag[1] = x1
        r = frag.load().to(cutlass.BFloat16).to(Float32)
        return [r[0], r[1]]

    def _smem_pair(self, sCj, r, col, cols=C_BLOCK_COLS):
        """Elements (r, col), (r, col + 1) of a 16-bit block of ``cols`` columns in shared
        memory (a C block, or a staged activation block) as one 2-element tensor (col even):
        the 128B/64B swizzles permute 16-byte chunks, so the pair is contiguous and 4-byte
        aligned; the view keeps the block's swizzled iterator and adds the unswizzled offset
        r * cols + col, so one 32-bit access replaces two 16-bit ones (PTX: 256
        ld/st.shared.b16 per tile and thread become 128 b32)."""
        off = cute.assume(r * cols + col, divby=2)
        return cute.make_tensor(sCj.iterator + off, cute.make_layout(2))

    def _pairs_in_smem(self) -> bool:
        return self.c_dtype.width == 16

    @staticmethod
    def _bf16_pair(pair):
        """The two bf16 values of a 2-element shared-memory pair as fp32, exactly: a bf16 is
        the top half of its fp32, so one 32-bit load and two integer operations (low
        element: shift left 16; high: mask the low 16 bits off), where the generic
        conversion takes 1.5 instructions per value (SHF, and PRMT for the high half)."""
        bits = pair.load().bitcast(Int32)[0]
        return [(bits << 16).bitcast(Float32), (bits & Int32(-65536)).bitcast(Float32)]

    @staticmethod
    def _and(cond, keep):
        """cond and the row's ``keep`` (a Python True unless ragged_m: no extra op then)."""
        return cond if keep is True else cond & keep

    @staticmethod
    def _add_term(total, x):
        """total + x, or x itself for the first term: summing from 0.0 leaves ptxas one FADD
        per column sum and block to keep (0.0 + -0.0 is +0.0)."""
        return x if total is None else total + x

    @cute.jit
    def _load_gate_up(self, sCj, r, col):
        """fp32 gate (C column col, col + 1) and up (col + 32, col + 33) of row r."""
        if cutlass.const_expr(self.c_dtype is cutlass.BFloat16):
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
            self._smem_pair(sCj, r, col).store(frag.load().to(self.d_dtype))
        else:
            sCj[(r, col)] = x0.to(self.d_dtype)
            sCj[(r, col + 1)] = x1.to(self.d_dtype)

    @cute.jit
    def epilogue(self, acc, tCcC, c_pipe, sC, wg, cpos, params: EpilogueParams, tile_rows,
                 n_tile, expert, tidx, sDb, hand_mbar, kslot):
        """Fused dGLU epilogue from one warpgroup's wg_rows x TILE_N accumulator registers
        (ping-pong: the whole 128-row tile, two 64-row halves; cooperative: its 64 rows).

        WGMMA 64xN fp32 fragment (per 64-row half ``h``): value v -> column bit v%2, row +8
        when (v//2)%2 == 1, 8-column group v//4; a thread holds rows lane//4 (+8) of its
        warp's 16 and columns 2*(lane%4) + {0,1} of every 8-column group. Flat index over the
        halves: v + h*(TILE_N/2). So a thread owns 2 rows per half (static slot 2h + row bit) and,
        per 32-column block j, the 4 groups 4j..4j+3 (8 columns) in each half. Block j's
        gate/up C values come from shared memory (C block j of this warpgroup's rows:
        columns [0, 32) gate, [32, 64) up, loaded by TMA ahead of time).

        The interface (in: accumulator, C blocks, tile; out: D block, dprob and dbias
        partials) is the module's docstring. ``tile_rows``: the tile's first row and its
        expert's end row (``ragged_m``: rows from there on are masked out of every output).
        """
        (mD, mAct, sAct, mAmax, mAlpha, mBeta, mProb, mDprob, geglu_alpha, clamp_max, clamp_min,
         linear_offset, mx) = params
        cfg = self.cfg
        two_n = 2 * cfg.n
        row0, row_end = tile_rows
        ragged = cfg.ragged_m
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
        # round_dgrad: g0 = alpha^2 * acc is rounded to bf16 per element first, so alpha^2
        # leaves the hoisted factors (it multiplies acc before the rounding instead)
        hoisted = g_scale
        if cutlass.const_expr(cfg.round_dgrad):
            hoisted = Float32(1.0)
        dprob_scale = hoisted * c_scale * c_scale

        rows = self._thread_rows(tCcC, row0)
        # (ragged_m) which of this thread's rows are its expert's; the others are read at
        # the expert's last row (they may lie past M) and every output of them is dropped
        keep = [True] * len(rows)
        if cutlass.const_expr(ragged):
            keep = [r < row_end for r in rows]
        probs = [Float32(1.0)] * len(rows)  # without prob: p = 1
        if cutlass.const_expr(cfg.has_prob):
            probs = self._gather(mProb, rows if not ragged
                                 else [cutlass.min(r, row_end - 1) for r in rows])
        # (generate_amax) this thread's max |dgate|, max |dup| over the tile, from 0 with
        # the NaN-quiet fmax: a NaN value never reaches amax (docs/vendor_contract.md §2.5)
        amax_g = Float32(0.0)
        amax_u = Float32(0.0)
        row_scale = [hoisted * c_scale * p for p in probs]
        # (generate_activation) the stored value is p x act: dSwiGLU's act is the unscaled
        # act / beta^2, so its factor carries beta^2 (the true activation, as the reference)
        act_scale = probs
        if cutlass.const_expr(swiglu and cfg.generate_activation):
            act_scale = [p * c_scale * c_scale for p in probs]
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
                if cutlass.const_expr(cfg.act_staged):
                    sActj = sAct[(None, None, st.index)]
            valid = self._block_valid(n0, j)
            col_gate = [None] * 8  # column sums (dbias), from their first term
            col_up = [None] * 8
            for h in cutlass.range_constexpr(self.halves):
                if cutlass.const_expr(self.c_split > 1 and h % per_entry == 0):
                    # the entry's first (only) half
                    st = self.c_state(wg, cpos + j * self.c_split + h // per_entry, False)
                    c_pipe.consumer_wait(st)
                    sCj = sC[(None, None, st.index)]
                    if cutlass.const_expr(cfg.act_staged):
                        sActj = sAct[(None, None, st.index)]
                # the entry's first row inside the tile
                ent_row0 = blk_row0 + self.c_rows * (h // per_entry)
                pvals = self._pair_values(j, h)
                # (row in the tile, row in the C ring entry, column in the block) of each pair
                where = [(tCcC[v][0], tCcC[v][0] - ent_row0, tCcC[v][1] % 32) for v in pvals]
                # Every gate/up value of this half-block first, then the math and the D
                # writes: each D pair overwrites the C pair it came from and ptxas cannot
                # tell the next pair's addresses apart, so loads between the stores would
                # serialize each pair's chain (docs/kernels.md). 16-bit C only: fp32 C's
                # values take twice the registers (spills)
                loaded = None
                if cutlass.const_expr(self._pairs_in_smem()):
                    loaded = [self._load_gate_up(sCj, w[1], w[2]) for w in where]
                douts = []  # (FP8 D) every pair's (dgate, dup) values, quantized together
                for pi in cutlass.range_constexpr(len(pvals)):
                    v = pvals[pi]
                    r_loc, r_blk, c_loc = where[pi]
                    slot = 2 * h + (v // 2) % 2
                    outs = []
                    acts = []
                    if cutlass.const_expr(loaded is None):
                        gates, ups = self._load_gate_up(sCj, r_blk, c_loc)
                    else:
                        gates, ups = loaded[pi]
                    g0 = [acc[v], acc[v + 1]]
                    if cutlass.const_expr(cfg.round_dgrad):
                        g0 = self._round_bf16_pair(g0[0] * g_scale, g0[1] * g_scale)
                    for c in cutlass.range_constexpr(2):
                        if cutlass.const_expr(swiglu):
                            dg_l, du_l, act = dswiglu_unscaled(gates[c], ups[c], beta,
                                                               neg_log2e_beta)
                        elif cutlass.const_expr(cfg.act_func == "dsituglu"):
                            # (beta applied, as the block-scaled contract does; the betas
                            # are compile-time constants)
                            dg_l, du_l, act = dsituglu_local(gates[c] * beta, ups[c] * beta,
                                                             cfg.situ_beta1, cfg.situ_beta2)
                        elif cutlass.const_expr(cfg.geglu_beta):
                            dg_l, du_l, act = dgeglu_local(gates[c] * beta, ups[c] * beta,
                                                           geglu_alpha, clamp_max, clamp_min,
                                                           linear_offset)
                        else:
                            dg_l, du_l, act = dgeglu_local(gates[c], ups[c], geglu_alpha,
                                                           clamp_max, clamp_min, linear_offset)
                        r = g0[c] * row_scale[slot]
                        dg, du = r * dg_l, r * du_l
                        if cutlass.const_expr(ragged):
                            # a select, not a product: the dropped rows may hold inf or NaN
                            dg = Float32(cutlass.select_(keep[slot], dg, Float32(0.0)))
                            du = Float32(cutlass.select_(keep[slot], du, Float32(0.0)))
                        outs.append((dg, du))
                        if cutlass.const_expr(cfg.has_dprob):
                            dprob[slot] = dprob[slot] + g0[c] * act
                        if cutlass.const_expr(cfg.generate_amax):
                            dg, du = outs[c]
                            amax_g = cute.arch.fmax(amax_g, cute.arch.fmax(dg, -dg))
                            amax_u = cute.arch.fmax(amax_u, cute.arch.fmax(du, -du))
                        acts.append(act)
                        if cutlass.const_expr(cfg.generate_dbias):
                            col = ((pi // 2) * 2) + c  # group-in-block * 2 + column bit
                            col_gate[col] = self._add_term(col_gate[col], outs[c][0])
                            col_up[col] = self._add_term(col_up[col], outs[c][1])
                    if cutlass.const_expr(cfg.d_via_smem()):
                        # over the gate/up elements this thread (alone) just read
                        self._put_pair(sCj, r_blk, c_loc, outs[0][0], outs[1][0])
                        self._put_pair(sCj, r_blk, c_loc + 32, outs[0][1], outs[1][1])
                    elif cutlass.const_expr(cfg.fp8_d()):
                        douts.append(outs)  # a block's scales need all of its values
                    elif self._and(valid, keep[slot]):
                        off = (row0 + r_loc) * two_n + 2 * n0 + 64 * j + c_loc
                        self._store_pair(mD, off, outs[0][0], outs[1][0])
                        self._store_pair(mD, off + 32, outs[0][1], outs[1][1])
                    if cutlass.const_expr(cfg.act_staged):
                        # accumulator columns c_loc, c_loc + 1 of the block: the C producer
                        # stores the block (clipped at N and, ragged_m, the expert's end)
                        frag = cute.make_rmem_tensor((2,), Float32)
                        frag[0] = acts[0] * act_scale[slot]
                        frag[1] = acts[1] * act_scale[slot]
                        self._smem_pair(sActj, r_blk, c_loc, cfg.act_cols()).store(
                            frag.load().to(cutlass.BFloat16))
                    elif cutlass.const_expr(cfg.generate_activation):
                        # accumulator column n0 + 32 j + c_loc, de-interleaved. Every block
                        # inside N and every row the expert's: no branch (a branch per pair
                        # kept each store's address math to itself: 0.09 ms of skew's dGeGLU,
                        # docs/performance.md; dSiTU-GLU, not timed without, keeps it: its
                        # deep cooperative form would spill 4 B, as dGeGLU's does)
                        store = (True if (self._blocks_all_valid() and not ragged
                                          and cfg.act_func != "dsituglu")
                                 else self._and(valid, keep[slot]))
                        if store:
                            off = (row0 + r_loc) * cfg.n + n0 + 32 * j + c_loc
                            self._store_pair(mAct, off, acts[0] * act_scale[slot],
                                             acts[1] * act_scale[slot])
                if cutlass.const_expr(cfg.fp8_d()):
                    # (the warpgroup's half-blocks so far: the exchange buffer's parity)
                    use = (cpos // self.nent) * (self.nblk * self.halves) + j * self.halves + h
                    self.quant_d_half(douts, (where[0][0], where[0][2]), j, row0, n0, valid, wg,
                                      tidx, expert, mD, mx, use)
                if cutlass.const_expr(h % per_entry == per_entry - 1):  # the entry is done
                    self._release_entry(c_pipe, st, sDb, col_gate, col_up, tidx,
                                        h == self.halves - 1)
            if cutlass.const_expr(cfg.generate_dbias and self.coop):
                # (not a phantom block past column 2N: N % 32 == 0, so a block is all in or
                # all out; a phantom block's sums are neither added nor flushed, which keeps
                # racecheck quiet)
                if valid:  # (the valid blocks are a prefix: block kslot + j of the CTA)
                    self._dbias_block(col_gate, col_up, sDb, j, tidx, hand_mbar, kslot + j)

        if cutlass.const_expr(cfg.has_dprob):
            # dprob: the 4 lanes of a quad hold the same rows -> butterfly over lane bits 0-1
            for s in cutlass.range_constexpr(len(dprob)):
                x = dprob[s]
                x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
                x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
                dprob[s] = x * dprob_scale
            if lane % 4 == 0:
                for s in cutlass.range_constexpr(len(dprob)):
                    if keep[s]:
                        if cutlass.const_expr(cfg.deterministic):
                            # (N-tile, row)'s partial, stored: the plan sums the N-tiles
                            # (not the phantom N-tile of an odd cluster_n pair: the slab has
                            # no row for it, and its store would land in the next buffer)
                            if n0 < cfg.n:
                                mDprob[n_tile * mD.shape[0] + rows[s]] = dprob[s]
                        else:
                            cute.arch.atomic_add((mDprob.iterator + rows[s]).llvm_ptr, dprob[s])
        if cutlass.const_expr(cfg.generate_amax):
            self._amax_out(mAmax, expert, lane, amax_g, amax_u)

    @cute.jit
    def _amax_out(self, mAmax, expert, lane, amax_g: Float32, amax_u: Float32):
        """The warp's max of its lanes' values, into amax[expert] with one integer atomic
        max per column kind: the values are non-negative fp32, and a non-negative fp32
        compares with any fp32 (the caller's start included) as their bit patterns do as
        int32."""
        for i in cutlass.range_constexpr(5):
            amax_g = cute.arch.fmax(amax_g, cute.arch.shuffle_sync_bfly(amax_g, offset=1 << i))
            amax_u = cute.arch.fmax(amax_u, cute.arch.shuffle_sync_bfly(amax_u, offset=1 << i))
        if lane == 0:
            base = mAmax.iterator + expert * 2
            cute.arch.atomic_max(cute.recast_ptr(base, dtype=Int32).llvm_ptr,
                                 amax_g.bitcast(Int32))
            cute.arch.atomic_max(cute.recast_ptr(base + 1, dtype=Int32).llvm_ptr,
                                 amax_u.bitcast(Int32))

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
