"""A diagnostic build of the SM90 kernel: per-tile clock stamps (:class:`~.config.Sm90TraceConfig`).

Never an engine choice: :class:`TracedGroupedDgluSm90` fills the production kernel's trace hooks
(no-ops there). The leader thread of each math warpgroup stores int64 stamps in a workspace
region that the launch passes in the descriptor slot (unused with dense weights), laid out as
``Sm90TraceConfig`` says; a launch zeroes its CTAs' tile entries first and CTA 0 writes the
grid. Results are the kernel's; the stamps cost a few stores per tile. The engine's
``Sm90TracePlan`` builds and reads it (``read_trace``; tests/gpu/test_sm90_trace.py).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .config import MATH_WARPGROUPS, TRACE_MAX_CTAS, Sm90TraceConfig
from .kernel import GroupedDgluSm90


class TracedGroupedDgluSm90(GroupedDgluSm90):
    """The kernel of one :class:`Sm90TraceConfig` (dense weights only)."""

    def __init__(self, cfg: Sm90TraceConfig):
        super().__init__(cfg)

    @cute.jit
    def _trace_begin(self, b_desc_ptr, tidx, bid, nblocks, wg):
        """(stamps, whether this thread writes this warpgroup's row); zeroes the row's tile
        entries and stamps the warpgroup's start."""
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
        return tr

    @cute.jit
    def _stamp(self, tr, j, t, wg, bid):
        """Trace builds: clock64 as stamp j of this warpgroup's t-th tile (leader thread)."""
        if cutlass.const_expr(self.cfg.trace > 0):
            if tr[1] & (t < self.cfg.trace):
                tr[0][(j, t + 1, wg, bid)] = cute.arch.clock64()


    @cute.jit
    def _trace_end(self, tr, wg, bid):
        """The warpgroup's end: (globaltimer, clock64) in entry 0."""
        if tr[1]:
            tr[0][(2, 0, wg, bid)] = cute.arch.globaltimer()
            tr[0][(3, 0, wg, bid)] = cute.arch.clock64()
