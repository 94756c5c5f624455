"""Does compute-sanitizer racecheck see mbarrier ordering of shared-memory accesses?

Session 10 moved the ping-pong kernel's dbias sums through shared memory from the math warps
to the C producer warp, ordered by mbarriers (each writer's arrive, the reader's wait), and
racecheck reported hazards between those writes and reads although the GPU results match
the float64 reference. This probe isolates the hand-off: warp 0 writes 32 floats to shared
memory, warp 1 reads them after one of three synchronizations, and writes them out.

    compute-sanitizer --tool racecheck python3 tests/gpu/racecheck_probe.py MODE

MODE ``bar``: a named barrier (bar.sync) over both warps, which racecheck models (expect 0
hazards); ``mbar``: every writer thread arrives on an mbarrier (count 32) and warp 1 waits
on its phase (correct by the PTX memory model: each arrive releases its thread's writes, the
wait acquires them); ``none``: no synchronization at all (a true race, which racecheck must
report, so that a clean ``mbar`` run would mean something). Session 11 ran these three:
1, 0 and 0 hazards, so racecheck does model an mbarrier every writer arrives on.

The kernel's other direction is modelled by three more modes. ``mbar1``: the writer warp
syncs (bar.warp.sync) and only its lane 0 arrives (count 1). ``war1``: warp 1 reads values
set before the CTA barrier, syncs the warp, and its lane 0 arrives (count 1); warp 0 waits and
then overwrites them (write after read: the C producer's slice reads, its one elected arrive
on the full barrier, the math warps' next writes). ``war32``: the same with every reader lane
arriving (count 32). All three are correct by the PTX memory model (the warp sync orders
the lanes' accesses before lane 0's release); a hazard in ``war1`` and none in ``war32``
would say racecheck does not carry ordering through a warp sync into an mbarrier.
Session 11: ``mbar1`` 1 hazard (124: lanes 1-31's writes), ``war1`` 0, ``war32`` 0.

Two more modes copy the kernel's full barrier exactly, whose phase a bulk copy completes
(``complete_tx``) after the producer's arrive: ``wartx``, warp 1 reads, syncs, and its lane 0
arrives with an expected transaction of 128 bytes and issues a 128-byte bulk copy from global
memory into a second buffer on the same mbarrier (count 1); ``wartx32``, every lane of warp 1
arrives (count 32; lane 0's with the expected bytes). Warp 0 waits and overwrites.

The script checks the values it read (``none`` may read stale values; it only reports) and
prints one line.
"""
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402

MODES = ("bar", "mbar", "none", "mbar1", "war1", "war32", "wartx", "wartx32")


class HandOff:
    """One CTA of 64 threads; ``mode`` picks the synchronization (compile-time)."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
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


def compile_probe(mode: str):
    """Compile for sm_90a without a GPU (fake address and stream): what the CPU test runs."""
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    ptr = make_ptr(Float32, 0, cute.AddressSpace.gmem, assumed_align=16)
    return cute.compile(HandOff(mode), ptr, make_fake_stream(), options="--gpu-arch sm_90a")


def main(mode: str) -> str:
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import make_ptr

    out = torch.full((32,), float("nan"), device="cuda")
    fn = compile_probe(mode)
    stream = torch.cuda.current_stream()
    fn(make_ptr(Float32, out.data_ptr(), cute.AddressSpace.gmem, assumed_align=16),
       cuda.CUstream(stream.cuda_stream))
    torch.cuda.synchronize()
    want = torch.arange(32, device="cuda", dtype=torch.float32) + 0.5
    ok = bool(torch.equal(out, want))
    return f"racecheck probe mode={mode}: values {'as written' if ok else 'NOT as written'}"


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "mbar"))
