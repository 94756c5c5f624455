"""Output writes that leave every unselected element's bytes as they were.

Owns the one rule the reference's block path writes outputs by: it computes whole blocks of
``m_aligned`` rows (and whole scale-factor atoms), including those past the last offset, and
then keeps the old value wherever a block belongs to no expert, as the kernels never touch
those rows. The selection is a device tensor, so the write needs no host read.
"""
from __future__ import annotations

import torch

#: Integer dtypes of each element size: the select runs on the bits, so an unselected element
#: keeps its exact bytes (NaN payloads included) and 1-byte float formats need no float kernels.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def keep_where(dst: torch.Tensor, selected: torch.Tensor, new: torch.Tensor) -> None:
    """``dst := new`` where ``selected`` (a bool tensor that broadcasts to ``dst``), ``dst``'s
    own bytes elsewhere. ``new`` is converted to ``dst``'s dtype by value (``Tensor.to``): pass
    raw bytes already viewed as ``dst``'s dtype. ``dst`` is written in place."""
    bits = _BITS[dst.element_size()]
    old = dst.view(bits)
    old.copy_(torch.where(selected, new.to(dst.dtype).view(bits), old))
