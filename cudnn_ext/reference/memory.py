"""Views of raw device or host addresses as torch tensors (for discrete ``b_ptrs``).

Owns only the address -> tensor bridge the reference engine needs to read per-expert weights
given as int64 pointers: one buffer at a known address (``tensor_at``), and every expert's
buffer of a pointer table stacked into one tensor (``stacked_at``: read on the host for CPU
tensors, gathered on the device for CUDA tensors, ``cudnn_ext.kernels.pointer_gather``). It
never writes through the addresses it reads.
"""
from __future__ import annotations

import ctypes

import torch

from ..kernels.pointer_gather import gather_pointer_table

# Integer stand-ins with the same itemsize: the CUDA array interface has no bf16/fp8 codes.
_CARRIER = {1: (torch.uint8, "|u1"), 2: (torch.int16, "<i2"), 4: (torch.int32, "<i4"), 8: (torch.int64, "<i8")}


class _CudaArray:
    def __init__(self, ptr: int, numel: int, typestr: str):
        self.__cuda_array_interface__ = {
            "shape": (numel,), "typestr": typestr, "data": (ptr, False), "version": 2, "strides": None,
        }


def tensor_at(ptr: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D read-only-by-convention view of ``numel`` elements of ``dtype`` at address ``ptr``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    carrier, typestr = _CARRIER[itemsize]
    if device.type == "cuda":
        raw = torch.as_tensor(_CudaArray(ptr, numel, typestr), device=device)
    elif device.type == "cpu":
        buf = (ctypes.c_byte * (numel * itemsize)).from_address(ptr)
        raw = torch.frombuffer(buf, dtype=carrier, count=numel)
    else:
        raise NotImplementedError(f"b_ptrs on device type {device.type!r} is not supported")
    return raw.view(dtype)


def stacked_at(table: torch.Tensor, nbytes: int, ends: torch.Tensor) -> torch.Tensor:
    """``(L, nbytes)`` uint8: row e holds the ``nbytes`` at address ``table[e]`` for every
    expert e with rows (``ends[e] > ends[e-1]``, cumulative ends as ``padded_offsets``), zero
    for the others, whose pointers are never read. CPU tables are read on the host; CUDA
    tables on the device (no host read, so no sync)."""
    if table.device.type != "cpu":
        return gather_pointer_table(table, nbytes, ends)
    out = torch.zeros((table.shape[0], nbytes), dtype=torch.uint8)
    start = 0
    for e, (ptr, end) in enumerate(zip(table.tolist(), ends.tolist())):
        if end > start:
            out[e] = tensor_at(ptr, nbytes, torch.uint8, table.device)
        start = end
    return out
