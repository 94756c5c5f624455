"""Views of raw device or host addresses as torch tensors (for discrete ``b_ptrs``).

Owns only the address -> tensor bridge the reference engine needs to read per-expert weights
given as int64 pointers. It never writes through the views it makes.
"""
from __future__ import annotations

import ctypes

import torch

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
