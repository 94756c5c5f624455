"""Does compute-sanitizer racecheck see mbarrier ordering of shared-memory accesses?

The ping-pong kernel's dbias sums go through shared memory from the math warps to the C
producer warp, ordered by mbarriers (each writer's arrive, the reader's wait); racecheck once
reported hazards between those writes and reads although the GPU results matched the float64
reference. This probe isolates the hand-off: warp 0 writes 32 floats to shared memory, warp 1
reads them after one of several synchronizations, and writes them out.

    PYTHONPATH=.:tests/support compute-sanitizer --tool racecheck python3 tests/support/racecheck_probe.py MODE

MODE ``bar``: a named barrier (bar.sync) over both warps, which racecheck models (expect 0
hazards); ``mbar``: every writer thread arrives on an mbarrier (count 32) and warp 1 waits
on its phase (correct by the PTX memory model: each arrive releases its thread's writes, the
wait acquires them); ``none``: no synchronization at all (a true race, which racecheck must
report, so that a clean ``mbar`` run means something).

The kernel's other direction: ``mbar1``: the writer warp syncs (bar.warp.sync) and only its
lane 0 arrives (count 1). ``war1``: warp 1 reads values set before the CTA barrier, syncs the
warp, and its lane 0 arrives (count 1); warp 0 waits and then overwrites them (write after
read: the C producer's slice reads, its one elected arrive on the full barrier, the math
warps' next writes). ``war32``: the same with every reader lane arriving (count 32). All
three are correct by the PTX memory model (the warp sync orders the lanes' accesses before
lane 0's release).

``wartx`` / ``wartx32`` copy the kernel's full barrier, whose phase a bulk copy completes
(``complete_tx``) after the producer's arrive: warp 1 reads, syncs, and its lane 0 (every
lane) arrives, lane 0 with an expected transaction of 128 bytes, and issues a 128-byte bulk
copy from global memory into a second buffer on the same mbarrier. Warp 0 waits and
overwrites. ``ring`` / ``ring1`` copy the whole hand-off over a 2- / 1-stage ring
(``RingHandOff``): 4 writer warps (the math warpgroup) wait on a stage's full barrier, write
their column sums into the stage's slice and every thread arrives on its empty barrier (count
128); a reader warp (the C producer) waits on the empty barrier, reads and adds the 4 warps'
sums, syncs the warp, and its lane 0 arrives on the full barrier with 128 expected bytes and
issues the bulk copy that completes the phase (the C reload), for 8 rounds. ``ringtma`` /
``ringtma32`` complete the phase with a tensor TMA load (``cp.async.bulk.tensor``, SASS
``UTMALDG``, as the kernel does) instead of a plain bulk copy (``UBLKCP``), lane 0 alone or
every lane arriving: the open question is whether racecheck's hazards on the kernel with one
elected arrive (none with every lane arriving, the kernel's form) come from that difference.

The script checks the values it read (``none`` may read stale values; it only reports) and
prints one line.
"""
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402

HANDOFF_MODES = ("bar", "mbar", "none", "mbar1", "war1", "war32", "wartx", "wartx32")
RING_MODES = ("ring", "ring1", "ringtma", "ringtma32")
MODES = HANDOFF_MODES + RING_MODES
RING_ROUNDS = 8


class HandOff:
    """One CTA of 64 threads; ``mode`` picks the synchronization (compile-time)."""

    def __init__(self, mode: str):
        if mode not in HANDOFF_MODES:
            raise ValueError(f"mode must be one of {HANDOFF_MODES}, got {mode!r}")
        self.mode = mode

    @cute.jit
    def __call__(self, out_ptr: cute.Pointer, stream):
        mOut = cute.make_tensor(out_ptr, cute.make_layout((32,)))

        @cute.struct
        class Shared:
            buf: cute.struct.Align[cute.struct.MemRange[Float32, 32], 128]
            land: cute.struct.Align[cute.struct.MemRange[Float32, 32], 128]  # bulk copy target
            mbar: cute.struct.MemRange[cutlass.Int64, 1]

        self.shared = Shared
        self.kernel(mOut).launch(grid=(1, 1, 1), block=[64, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mOut: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.shared)
        buf = st.buf.get_tensor(cute.make_layout((32,)))
        mbar = st.mbar.data_ptr()
        one = cutlass.const_expr(self.mode in ("mbar1", "war1", "wartx"))
        war = cutlass.const_expr(self.mode in ("war1", "war32", "wartx", "wartx32"))
        tx = cutlass.const_expr(self.mode in ("wartx", "wartx32"))
        if tidx == 0:
            cute.arch.mbarrier_init(mbar, 1 if one else 32)
        if cutlass.const_expr(war):
            if warp == 1:
                buf[lane] = Float32(lane) + Float32(0.5)  # what warp 1 must read
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(war):
            if warp == 1:
                v = buf[lane]
                if cutlass.const_expr(tx):
                    if cutlass.const_expr(one):
                        cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive_and_expect_tx(mbar, 128)
                        cute.arch.inline_ptx(
                            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                            " [{$r0}], [{$r1}], 128, [{$r2}];",
                            read_only_args=[st.land.data_ptr(), mOut.iterator, mbar])
                    elif cutlass.const_expr(not one):
                        cute.arch.mbarrier_arrive(mbar)
                elif cutlass.const_expr(one):
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(mbar)
                else:
                    cute.arch.mbarrier_arrive(mbar)
                mOut[lane] = v
            else:
                cute.arch.mbarrier_wait(mbar, Int32(0))
                buf[lane] = Float32(-1.0)
        elif warp == 0:
            buf[lane] = Float32(lane) + Float32(0.5)
            if cutlass.const_expr(self.mode == "mbar"):
                cute.arch.mbarrier_arrive(mbar)
            if cutlass.const_expr(self.mode == "mbar1"):
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(mbar)
            if cutlass.const_expr(self.mode == "bar"):
                cute.arch.barrier(barrier_id=1, number_of_threads=64)
        else:
            if cutlass.const_expr(self.mode in ("mbar", "mbar1")):
                cute.arch.mbarrier_wait(mbar, Int32(0))
            if cutlass.const_expr(self.mode == "bar"):
                cute.arch.barrier(barrier_id=1, number_of_threads=64)
            mOut[lane] = buf[lane]


class RingHandOff:
    """One CTA of 160 threads: warps 0-3 write, warp 4 reads, over ``stages`` stages.

    ``tensor``: the load that completes each full-barrier phase is a tensor TMA load (the
    kernel's ``cp.async.bulk.tensor``, SASS ``UTMALDG``) instead of a plain bulk copy
    (``UBLKCP``); ``all_lanes``: every lane of the reader warp arrives on the full barrier
    (count 32, lane 0 with the bytes), as the kernel does, instead of lane 0 alone after a
    warp sync."""

    def __init__(self, stages: int, tensor: bool = False, all_lanes: bool = False):
        self.stages = stages
        self.tensor = tensor
        self.all_lanes = all_lanes

    @cute.jit
    def __call__(self, out_ptr: cute.Pointer, stream):
        mOut = cute.make_tensor(out_ptr, cute.make_layout((32,)))
        S = self.stages
        # the tensor-TMA source: the output buffer seen as one (1, 32) fp32 tile (its values
        # are never used; only the bytes' arrival completes the phase)
        mSrc = cute.make_tensor(out_ptr, cute.make_layout((1, 32), stride=(32, 1)))
        tma_atom, tma_src = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mSrc,
            cute.make_layout((1, 32), stride=(32, 1)), (1, 32))

        @cute.struct
        class Shared:
            slices: cute.struct.Align[cute.struct.MemRange[Float32, 32 * 4 * S], 128]
            land: cute.struct.Align[cute.struct.MemRange[Float32, 32 * S], 128]
            full: cute.struct.MemRange[cutlass.Int64, S]
            empty: cute.struct.MemRange[cutlass.Int64, S]

        self.shared = Shared
        self.kernel(mOut, tma_atom, tma_src).launch(grid=(1, 1, 1), block=[160, 1, 1],
                                                     stream=stream)

    @cute.kernel
    def kernel(self, mOut: cute.Tensor, tma_atom: cute.CopyAtom, tma_src: cute.Tensor):
        S = self.stages
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tidx % 32
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.shared)
        sl = st.slices.get_tensor(cute.make_layout((32, 4, S)))
        full = st.full.data_ptr()
        empty = st.empty.data_ptr()
        land = st.land.get_tensor(cute.make_layout((1, 32, S), stride=(32, 1, 32)))
        tLs, tLg = cute.nvgpu.cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(land, 0, 2),
            cute.group_modes(cute.local_tile(tma_src, (1, 32), (None, None)), 0, 2))
        if tidx == 0:
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(full + s, 32 if self.all_lanes else 1)
                cute.arch.mbarrier_init(empty + s, 128)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if warp == 4:
            acc = Float32(0.0)
            for r in cutlass.range_constexpr(RING_ROUNDS + S):
                s = r % S
                if cutlass.const_expr(r >= S):  # hand back round r - S
                    cute.arch.mbarrier_wait(empty + s, Int32(((r - S) // S) % 2))
                    for w in cutlass.range_constexpr(4):
                        acc = acc + sl[(lane, w, s)]
                if cutlass.const_expr(r < RING_ROUNDS):  # load round r
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive_and_expect_tx(full + s, 128)
                    elif cutlass.const_expr(self.all_lanes):
                        cute.arch.mbarrier_arrive(full + s)
                    if cutlass.const_expr(self.tensor):
                        # warp-uniform issue, as in the kernel's C producer
                        cute.copy(tma_atom, tLg[(None, 0, 0)], tLs[(None, s)],
                                  tma_bar_ptr=full + s)
                    elif lane == 0:
                        cute.arch.inline_ptx(
                            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                            " [{$r0}], [{$r1}], 128, [{$r2}];",
                            read_only_args=[st.land.data_ptr() + 32 * s, mOut.iterator,
                                            full + s])
            mOut[lane] = acc
        elif warp < 4:
            for r in cutlass.range_constexpr(RING_ROUNDS):
                s = r % S
                cute.arch.mbarrier_wait(full + s, Int32((r // S) % 2))
                sl[(lane, warp, s)] = (Float32(8 * r) + Float32(warp)
                                       + Float32(lane) * Float32(0.5))
                cute.arch.mbarrier_arrive(empty + s)


def ring_expected(lane: int) -> float:
    """What the reader's lane adds up over the rounds in RingHandOff."""
    return float(sum(8 * r + w for r in range(RING_ROUNDS) for w in range(4))
                 + RING_ROUNDS * 4 * 0.5 * lane)


def compile_probe(mode: str):
    """Compile for sm_90a without a GPU (fake address and stream): what the CPU test runs."""
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    ptr = make_ptr(Float32, 0, cute.AddressSpace.gmem, assumed_align=16)
    if mode in RING_MODES:
        probe = RingHandOff(2 if mode in ("ring", "ringtma", "ringtma32") else 1,
                            tensor=mode.startswith("ringtma"), all_lanes=mode == "ringtma32")
    else:
        probe = HandOff(mode)
    return cute.compile(probe, ptr, make_fake_stream(), options="--gpu-arch sm_90a")


def main(mode: str) -> str:
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import make_ptr

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    out = torch.full((32,), float("nan"), device="cuda")
    fn = compile_probe(mode)
    stream = torch.cuda.current_stream()
    fn(make_ptr(Float32, out.data_ptr(), cute.AddressSpace.gmem, assumed_align=16),
       cuda.CUstream(stream.cuda_stream))
    torch.cuda.synchronize()
    if mode.startswith("ring"):
        want = torch.tensor([ring_expected(i) for i in range(32)], device="cuda")
    else:
        want = torch.arange(32, device="cuda", dtype=torch.float32) + 0.5
    ok = bool(torch.equal(out, want))
    return f"racecheck probe mode={mode}: values {'as written' if ok else 'NOT as written'}"


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "mbar"))
