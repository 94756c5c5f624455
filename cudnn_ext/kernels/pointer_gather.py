"""Copy the per-expert buffers named by a device pointer table into one stacked tensor.

Owns one small CuTe DSL kernel: given an int64 table of L device addresses (discrete ``b_ptrs``
or ``sfb_ptrs``), it copies ``nbytes`` from each address into row e of an ``(L, nbytes)``
uint8 tensor. The addresses are read on the device, so no pointer value reaches the host: a
gather neither syncs nor breaks a CUDA-graph capture, and a replay reads the table's new values.

An expert whose row count is zero is skipped (its row stays zero): the contract lets such an
expert's pointer be null or garbage. Row counts come from the cumulative ``ends`` (the
``padded_offsets``), read on the device too: expert e has ``ends[e] - ends[e-1]`` rows
(``ends[-1]`` taken as 0). Pointer values are not checked (device data; docs/vendor_contract.md
§3.6): an expert with rows must point at ``nbytes`` readable, 8-byte aligned bytes (the
contract asks for 16).

The kernel knows no dtype or size, so it compiles once per process (per target architecture)
and launches on the current torch stream of the table's device. The CuTe DSL is imported only
when a gather compiles, so the package imports without it.
"""
import os
from typing import Optional

import torch

from ..runtime import compile_cache
from ..runtime.streams import current_stream_handle
from .kernel_cache import KernelCache

#: Threads per CTA of the copy.
_THREADS = 256
#: 8-byte words per thread that one CTA of an expert covers before the expert gets another CTA.
_WORDS_PER_THREAD = 4
#: Most CTAs per expert (a gather is bandwidth-bound long before this many).
_MAX_CTAS = 128
#: Rows of the stacked tensor start 16 bytes apart (the destination's 8-byte stores stay aligned).
_ROW_ALIGN = 16


def _dsl():
    """Import the DSL. Its target is read once, at its import: without a GPU the DSL would
    pick sm_100a, so a CPU-only process compiles for sm_90a, as ``kernels.sm90.build`` does
    (one process compiles every kernel for one target); with a GPU it targets that GPU."""
    if not torch.cuda.is_available():
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute import runtime

    return cuda, cutlass, cute, runtime


def _gather_fn():
    """The ``@cute.jit`` host function: grid (CTAs per expert, L), one launch. (The module has
    no ``from __future__ import annotations``: the DSL evaluates these annotations, and the
    names they use exist only in this function.)"""
    cuda, cutlass, cute, _ = _dsl()
    Int32, Int64 = cutlass.Int32, cutlass.Int64
    gmem = cute.AddressSpace.gmem

    @cute.kernel
    def copy_rows(table_ptr: cute.Pointer, ends_ptr: cute.Pointer, out_ptr: cute.Pointer,
                  words: Int64, row_bytes: Int64, tail: Int32):
        """CTA (x, e): a grid-stride copy of expert e's ``words`` 8-byte words, then its
        ``tail`` (< 8) last bytes by CTA 0; nothing when expert e has no rows."""
        tidx, _, _ = cute.arch.thread_idx()
        bx, e, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        ends = cute.make_tensor(ends_ptr, cute.make_layout((e + 1,)))
        start = Int32(0)
        if e > 0:
            start = ends[e - 1]
        if ends[e] > start:  # the pointer of an expert without rows may be null: never read it
            table = cute.make_tensor(table_ptr, cute.make_layout((e + 1,)))
            src_addr = table[e]
            dst_addr = out_ptr.toint() + Int64(e) * row_bytes
            src = cute.make_tensor(cute.make_ptr(Int64, src_addr, gmem, assumed_align=8),
                                   cute.make_layout((words,)))
            dst = cute.make_tensor(cute.make_ptr(Int64, dst_addr, gmem, assumed_align=_ROW_ALIGN),
                                   cute.make_layout((words,)))
            i = Int64(bx) * _THREADS + Int64(tidx)
            step = Int64(gx) * _THREADS
            while i < words:
                dst[i] = src[i]
                i += step
            if bx == 0 and tidx < tail:
                src_b = cute.make_tensor(cute.make_ptr(cutlass.Uint8, src_addr + words * 8, gmem,
                                                       assumed_align=1), cute.make_layout((8,)))
                dst_b = cute.make_tensor(cute.make_ptr(cutlass.Uint8, dst_addr + words * 8, gmem,
                                                       assumed_align=1), cute.make_layout((8,)))
                dst_b[tidx] = src_b[tidx]

    @cute.jit
    def gather(table_ptr: cute.Pointer, ends_ptr: cute.Pointer, out_ptr: cute.Pointer,
               num_experts: Int32, words: Int64, row_bytes: Int64, tail: Int32, ctas: Int32,
               stream: cuda.CUstream):
        copy_rows(table_ptr, ends_ptr, out_ptr, words, row_bytes, tail).launch(
            grid=(ctas, num_experts, 1), block=[_THREADS, 1, 1], stream=stream)

    return gather


def _ptr_specs(cutlass):
    """(element type, assumed alignment) of the table, the ends and the stacked output."""
    return ((cutlass.Int64, 8), (cutlass.Int32, 4), (cutlass.Uint8, _ROW_ALIGN))


_kernels = KernelCache(name="pointer gather kernel")


def compile_gather(arch: Optional[str] = None):
    """The compiled gather (placeholder addresses and stream: no GPU needed). ``arch``: the
    target, e.g. ``"sm_90a"`` (None: the DSL's own target). Cached: one compile per target
    and process, loaded from the disk cache (``compile_cache``) when compiled before."""
    return _kernels.load(("gather", arch), lambda: _compile_gather(arch))


def _compile_gather(arch: Optional[str]):
    _, cutlass, cute, runtime = _dsl()
    if not arch:
        # the DSL's own target (CUTE_DSL_ARCH, else the GPU's), named for the cache's key
        from cutlass.cutlass_dsl import CuTeDSL

        arch = CuTeDSL._get_dsl().envar.arch

    def build():
        ptrs = [runtime.make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=al)
                for dt, al in _ptr_specs(cutlass)]
        scalars = [cutlass.Int32(1), cutlass.Int64(1), cutlass.Int64(_ROW_ALIGN),
                   cutlass.Int32(0), cutlass.Int32(1)]
        return cute.compile(_gather_fn(), *ptrs, *scalars, runtime.make_fake_stream(),
                            options=f"--gpu-arch {arch}")

    return compile_cache.load_or_compile("gather", "pointer_gather", build, sources=(__file__,), arch=arch,
                                         tvm_ffi=False)


def _check(table, nbytes, ends) -> None:
    if not isinstance(table, torch.Tensor) or table.dtype != torch.int64 or table.dim() != 1:
        raise TypeError(f"table: expected a 1-D int64 tensor of addresses, got "
                        f"{getattr(table, 'dtype', type(table).__name__)} of shape {tuple(getattr(table, 'shape', ()))}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes: expected a positive int, got {nbytes!r}")
    if not isinstance(ends, torch.Tensor) or ends.dtype.is_floating_point or tuple(ends.shape) != tuple(table.shape):
        raise ValueError(f"ends: expected an integer tensor of shape {tuple(table.shape)} (one cumulative end "
                         f"row per expert), got {getattr(ends, 'dtype', type(ends).__name__)} of shape "
                         f"{tuple(getattr(ends, 'shape', ()))}")
    if table.device.type != "cuda":
        raise ValueError(f"table: the device gather needs a CUDA tensor, got one on {table.device}")
    if ends.device != table.device:
        raise ValueError(f"ends: must be on the table's device {table.device}, got {ends.device}")


def gather_pointer_table(table: torch.Tensor, nbytes: int, ends: torch.Tensor) -> torch.Tensor:
    """``(L, nbytes)`` uint8: row e holds the ``nbytes`` at address ``table[e]`` for every
    expert e with rows (``ends[e] > ends[e-1]``), zero for the others. CUDA tensors only;
    allocates on and launches on the device's current stream, reading nothing on the host."""
    _check(table, nbytes, ends)
    num_experts = table.shape[0]
    row = -(-nbytes // _ROW_ALIGN) * _ROW_ALIGN
    out = torch.zeros((num_experts, row), dtype=torch.uint8, device=table.device)
    if num_experts == 0:
        return out[:, :nbytes]
    cuda, cutlass, cute, runtime = _dsl()
    compiled = compile_gather()
    table = table.contiguous()
    ends = ends.to(torch.int32).contiguous()
    words, tail = divmod(nbytes, 8)
    ctas = max(1, min(_MAX_CTAS, -(-words // (_THREADS * _WORDS_PER_THREAD))))
    ptrs = [runtime.make_ptr(dt, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=al)
            for (dt, al), t in zip(_ptr_specs(cutlass), (table, ends, out))]
    with torch.cuda.device(table.device):
        compiled(*ptrs, cutlass.Int32(num_experts), cutlass.Int64(words), cutlass.Int64(row),
                 cutlass.Int32(tail), cutlass.Int32(ctas),
                 cuda.CUstream(current_stream_handle(table.device.index)))
    return out[:, :nbytes]
