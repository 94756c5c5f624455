"""The GLU forward on the device: ``h = prob * glu(gate, up)`` from the interleaved bf16 C.

Owns the device form of ``cudnn_ext.torch.mlp.glu_forward`` (times the row's probability,
rounded to bf16 once) for ``GroupedGluMLP``'s forward and its backward's recompute of ``h``.
Reads C ``(M, 2N)`` bf16 row-major (gate and up in alternating 32-column blocks), ``prob``
``(M,)`` fp32 and the int32 padded offsets; writes ``h`` ``(M, N)`` bf16: rows below the last
offset get ``fl_bf16(prob[r] * act(c_gate, c_up))``, rows at or past it get 0 (they belong to
no expert). No torch; the caller owns buffers and streams.

The activation is the ``act`` value of the SM90 epilogue's functions
(``kernels.sm90.epilogue_math``: the same fast sigmoid), in fp32, so the forward and the fused
backward evaluate one function.

One thread per 8 output columns of a row: 16 bytes of gate, 16 of up, 16 of h; neighbouring
threads take neighbouring columns, so a warp reads a row's 1 KB of C in two instructions.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ..sm90.epilogue_math import LOG2_E, dgeglu_local, dswiglu_unscaled
from .config import VEC, GluConfig

THREADS = 256
#: gate/up interleave: in every 2 * BLOCK columns of C the first BLOCK are gate
BLOCK = 32
_GMEM = cute.AddressSpace.gmem


class GluForward:
    """The kernel of one :class:`GluConfig`: ``__call__(c, prob, offs, h, m, n, groups,
    stream)`` on raw pointers (``c``, ``h`` bf16, 16-byte aligned; ``prob`` fp32; ``offs``
    the int32 offsets, of which only the last is read)."""

    def __init__(self, cfg: GluConfig):
        cfg.check()
        self.cfg = cfg

    @cute.jit
    def __call__(self, c_ptr: cute.Pointer, prob_ptr: cute.Pointer, offs_ptr: cute.Pointer,
                 h_ptr: cute.Pointer, m: Int32, n: Int32, groups: Int32, stream):
        chunks = n // VEC
        total = m * chunks
        grid = ((total + THREADS - 1) // THREADS, 1, 1)
        self.kernel(c_ptr, prob_ptr, offs_ptr, h_ptr, n, groups, chunks, total).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, c_ptr: cute.Pointer, prob_ptr: cute.Pointer, offs_ptr: cute.Pointer,
               h_ptr: cute.Pointer, n: Int32, groups: Int32, chunks: Int32, total: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        t = bid * THREADS + tidx
        if t < total:
            r = t // chunks
            j0 = (t - r * chunks) * VEC  # the chunk's first output column
            last = cute.make_tensor(offs_ptr, cute.make_layout(groups))[groups - 1]
            res = cute.make_rmem_tensor((VEC,), Float32)
            res.fill(0.0)
            if r < last:
                # output column j reads gate column (j // 32) * 64 + j % 32, up 32 further
                gcol = cutlass.Int64(r) * cutlass.Int64(2 * n) + cutlass.Int64(
                    (j0 // BLOCK) * 2 * BLOCK + j0 % BLOCK)
                gate = self._load(c_ptr, gcol)
                up = self._load(c_ptr, gcol + BLOCK)
                p = cute.make_tensor(prob_ptr, cute.make_layout(r + 1))[r]
                for i in cutlass.range_constexpr(VEC):
                    res[i] = p * self._act(gate[i], up[i])
            dst = cute.make_tensor(
                cute.make_ptr(cutlass.BFloat16,
                              h_ptr.toint() + (cutlass.Int64(r) * cutlass.Int64(n) + cutlass.Int64(j0)) * 2,
                              _GMEM, assumed_align=16),
                cute.make_layout(VEC))
            dst.store(res.load().to(cutlass.BFloat16))

    @cute.jit
    def _load(self, c_ptr: cute.Pointer, elem):
        """Eight bf16 of C from element ``elem`` (a 64-bit offset), as fp32."""
        src = cute.make_tensor(
            cute.make_ptr(cutlass.BFloat16, c_ptr.toint() + elem * 2, _GMEM, assumed_align=16),
            cute.make_layout(VEC))
        frag = cute.make_rmem_tensor((VEC,), cutlass.BFloat16)
        cute.autovec_copy(src, frag)
        out = cute.make_rmem_tensor((VEC,), Float32)
        out.store(frag.load().to(Float32))
        return out

    @cute.jit
    def _act(self, gate: Float32, up: Float32) -> Float32:
        cfg = self.cfg
        if cutlass.const_expr(cfg.act == "dswiglu"):
            _, _, act = dswiglu_unscaled(gate, up, Float32(1.0), Float32(-LOG2_E))
        else:
            _, _, act = dgeglu_local(gate, up, Float32(cfg.geglu_alpha), Float32(cfg.clamp_max),
                                     Float32(cfg.clamp_min), Float32(cfg.linear_offset))
        return act
