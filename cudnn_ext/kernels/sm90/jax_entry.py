"""The SM90 kernel as a ``cutlass.jax.cutlass_call`` target (an XLA FFI custom call).

Owns the adapter between the CuTe DSL's JAX calling convention and the kernel's pointer entry
(:meth:`GroupedDgluSm90.__call__`): ``cutlass_call`` hands a ``@cute.jit`` function XLA's
stream and one ``cute.Tensor`` per FFI buffer (inputs, then the outputs that are not aliased
to an input); this adapter takes each tensor's data pointer (its iterator), reads the runtime
M and expert count from the tensors' dynamic shapes, and inlines the kernel's host entry with
the :class:`~.config.Sm90Config` the engine's knob space yields (``cudnn_ext.jax.ffi`` sets
``fold_dbias=False`` and ``split_last=1``), through the launcher's ``make_kernel``, with the
launcher's pointer order. Nothing here knows about JAX arrays or policy.

Buffer convention (``cudnn_ext.jax.ffi`` builds it; every output is aliased to a zeroed input,
so the kernel accumulates into XLA-owned zero buffers and the call has no un-aliased outputs):

    a (M, K) ab, b, c (M, 2N), offs (L,) int32, alpha (L,) f32, beta (L,) f32, prob (M,) f32,
    d_row (M, 2N) [zeros], dprob (M,) f32 [zeros], then the scratch buffers:
    dbias_ws (L, 2N) f32 [zeros, only with generate_dbias],
    b_desc (L*128 + 128,) uint8 [only discrete: the per-expert TMA descriptors the kernel's
    helper builds on the device; the adapter rounds its address up to 128 bytes]

``b`` is the dense (L, N, K) weight tensor, or for discrete weights the device pointer table:
(L,) int64 or (8L,) uint8 (the same little-endian bytes), read by the kernel on the device.

Static keyword arguments (compile-time; part of cutlass_call's cache key): ``cfg`` (the
:class:`~.config.Sm90Config`), ``sm_count`` (grid size of the persistent kernel: correctness does
not depend on it) and the four activation constants (runtime kernel arguments, fixed per
traced call here).

Importing this module imports the CuTe DSL (``build`` sets ``CUTE_DSL_ARCH=sm_90a`` first).
"""
from __future__ import annotations

from .build import make_kernel  # (first: it sets CUTE_DSL_ARCH before cutlass is imported)

import cuda.bindings.driver as cuda  # noqa: E402

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32, Int32  # noqa: E402

from .config import DESC_BYTES, Sm90Config  # noqa: E402

#: Byte alignment the adapter assumes for every buffer's data pointer: XLA guarantees 16 for
#: entry parameters (more for its own allocations); the kernel needs 16 for its TMA operands.
BUFFER_ALIGN = 16

#: Stable part of the cutlass_call compile key (bump when the adapter's code changes).
COMPILE_KEY = "cudnn_ext.sm90.dglu_ffi.v3"


@cute.jit
def dglu_ffi_entry(
    stream: cuda.CUstream,
    a: cute.Tensor,
    b: cute.Tensor,
    c: cute.Tensor,
    offs: cute.Tensor,
    alpha: cute.Tensor,
    beta: cute.Tensor,
    prob: cute.Tensor,
    d_row: cute.Tensor,
    dprob: cute.Tensor,
    *scratch: cute.Tensor,
    cfg: cutlass.Constexpr,
    sm_count: cutlass.Constexpr,
    geglu_alpha: cutlass.Constexpr,
    clamp_max: cutlass.Constexpr,
    clamp_min: cutlass.Constexpr,
    linear_offset: cutlass.Constexpr,
):
    want = int(cfg.generate_dbias) + int(cfg.discrete())
    if cutlass.const_expr(len(scratch) != want):
        raise ValueError(f"dglu_ffi_entry: expected {want} scratch buffers (dbias workspace when "
                         f"generate_dbias, descriptor buffer when discrete), got {len(scratch)}")
    kernel = make_kernel(cfg)
    m = Int32(c.shape[0])
    num_experts = Int32(offs.shape[0])
    dprob_ptr = dprob.iterator
    # without dbias the kernel never touches the workspace pointer: pass dprob's (as the engine)
    ws_ptr = scratch[0].iterator if cutlass.const_expr(cfg.generate_dbias) else dprob_ptr
    if cutlass.const_expr(cfg.discrete()):
        # the pointer table (any dtype: its bytes are L little-endian int64 addresses)
        b_ptrs = cute.recast_ptr(b.iterator, dtype=cutlass.Int64)
        raw = scratch[-1].iterator.toint()
        aligned = (raw + (DESC_BYTES - 1)) // DESC_BYTES * DESC_BYTES
        b_desc = cute.make_ptr(cutlass.Int64, aligned, cute.AddressSpace.gmem,
                               assumed_align=DESC_BYTES)
        b_data = a.iterator  # the discrete kernel loads B through the descriptors only
    else:
        # the discrete-only pointer table / descriptor workspace: never read by the dense kernel
        b_ptrs = b_desc = cute.recast_ptr(a.iterator, dtype=cutlass.Int64)
        b_data = b.iterator
    if cutlass.const_expr(cfg.generate_activation):
        raise ValueError("dglu_ffi_entry: the activation output is not offered through JAX")
    if cutlass.const_expr(cfg.generate_dbias and cfg.fold_dbias):
        raise ValueError("dglu_ffi_entry: needs fold_dbias=False (XLA zeroes the workspace, JAX rounds it)")
    # the bf16 dbias the kernel would fold into: never read with fold_dbias=False; the same
    # placeholder for the activation output (not offered through JAX: never written)
    no_dbias = cute.recast_ptr(a.iterator, dtype=cutlass.BFloat16)
    kernel(a.iterator, b_data, c.iterator, d_row.iterator, offs.iterator, alpha.iterator,
           beta.iterator, prob.iterator, dprob_ptr, ws_ptr, b_ptrs, b_desc, no_dbias,
           no_dbias, cute.recast_ptr(a.iterator, dtype=Float32),
           cute.recast_ptr(a.iterator, dtype=Float32), cute.recast_ptr(a.iterator, dtype=Float32),
           cute.recast_ptr(a.iterator, dtype=Float32),
           # (quantized D's other outputs: not offered through JAX, never touched)
           d_row.iterator, cute.recast_ptr(a.iterator, dtype=cutlass.Uint8),
           cute.recast_ptr(a.iterator, dtype=cutlass.Uint8), cute.recast_ptr(a.iterator, dtype=Float32),
           m, num_experts, Int32(sm_count), Float32(geglu_alpha), Float32(clamp_max),
           Float32(clamp_min), Float32(linear_offset), stream)


def static_kwargs(cfg: Sm90Config, sm_count: int, geglu_alpha: float, clamp_max: float,
                  clamp_min: float, linear_offset: float) -> dict:
    """The compile-time keyword arguments of :func:`dglu_ffi_entry` (plain, hashable values)."""
    return dict(cfg=cfg, sm_count=int(sm_count), geglu_alpha=float(geglu_alpha),
                clamp_max=float(clamp_max), clamp_min=float(clamp_min),
                linear_offset=float(linear_offset))
