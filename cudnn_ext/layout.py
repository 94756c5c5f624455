"""The gate/up column layout of C, D, dbias and the first projection's weights.

The fused op reads C (M, 2N) and writes D in the vendor's interleave: within every 64-column
pair the first 32 columns are gate and the next 32 are up (docs/vendor_contract.md §1.3). A
tensor laid out as plain halves, ``[gate | up]`` (what ``torch.cat([gate, up], -1)`` and most
checkpoints' fused ``gate_up_proj`` give), holds the same numbers in other columns and cannot be
told apart from values: passed as C it gives a wrong D without an error. These helpers convert
between the layouts on the tensor's device; the torch op and ``GroupedGluMLP`` also take
``gate_up_layout="halves"`` and convert for the caller.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: Columns per gate (and per up) block of the interleave.
GATE_UP_BLOCK = 32
#: The two layouts a gate/up tensor can have: the fused op's, and ``[gate | up]``.
LAYOUTS = ("interleaved", "halves")


def gate_up_columns(n: int, device=None):
    """Column indices into an interleaved tensor of width 2N of gate and up column ``n``:
    gate(n) = 64 * (n // 32) + n % 32, up(n) = gate(n) + 32."""
    idx = torch.arange(n, device=device)
    gate = 64 * (idx // GATE_UP_BLOCK) + idx % GATE_UP_BLOCK
    return gate, gate + GATE_UP_BLOCK


def _dim_of(x: Tensor, dim: int, name: str, width: str) -> int:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{name}: expected at least one dimension, got a 0-d tensor")
    d = dim % x.dim()
    size = x.shape[d] // (2 if width == "2N" else 1)
    if (width == "2N" and x.shape[d] % 2) or size % GATE_UP_BLOCK:
        raise ValueError(f"{name}: dimension {dim} must be {width} with N a multiple of {GATE_UP_BLOCK}, "
                         f"got {x.shape[d]}")
    return d


def interleave_gate_up(gate: Tensor, up: Tensor, dim: int = -1) -> Tensor:
    """The fused op's interleaved tensor from its ``gate`` and ``up`` halves, each of width N
    along ``dim`` (a multiple of 32): width 2N along ``dim``, a fresh tensor. For C pass
    (M, N) halves; for a first projection's weights (E, F, D) halves with ``dim=1``."""
    d = _dim_of(gate, dim, "gate", "N")
    if not isinstance(up, Tensor) or up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(f"up: must match gate's shape {tuple(gate.shape)} and dtype {gate.dtype}, got "
                         f"{tuple(getattr(up, 'shape', ()))} {getattr(up, 'dtype', type(up).__name__)}")
    shape = list(gate.shape)
    blocks = shape[d] // GATE_UP_BLOCK
    pair = torch.stack([gate.unflatten(d, (blocks, GATE_UP_BLOCK)), up.unflatten(d, (blocks, GATE_UP_BLOCK))],
                       dim=d + 1)  # (..., blocks, 2, 32, ...)
    return pair.flatten(d, d + 2)


def split_gate_up(x: Tensor, dim: int = -1, *, name: str = "x"):
    """The inverse of :func:`interleave_gate_up`: ``(gate, up)`` of an interleaved tensor of
    width 2N along ``dim``, each of width N (views of ``x``; errors call it ``name``)."""
    d = _dim_of(x, dim, name, "2N")
    blocks = x.shape[d] // (2 * GATE_UP_BLOCK)
    pair = x.unflatten(d, (blocks, 2, GATE_UP_BLOCK))
    return pair.select(d + 1, 0).flatten(d, d + 1), pair.select(d + 1, 1).flatten(d, d + 1)


def halves_to_interleaved(x: Tensor, dim: int = -1, *, name: str = "x") -> Tensor:
    """``[gate | up]`` along ``dim`` (width 2N) as the fused op's interleave (a fresh tensor;
    errors call it ``name``)."""
    d = _dim_of(x, dim, name, "2N")
    gate, up = x.chunk(2, dim=d)
    return interleave_gate_up(gate, up, d)


def interleaved_to_halves(x: Tensor, dim: int = -1, *, name: str = "x") -> Tensor:
    """The fused op's interleave along ``dim`` as ``[gate | up]`` (a fresh tensor; errors call
    it ``name``)."""
    d = _dim_of(x, dim, name, "2N")
    return torch.cat(split_gate_up(x, d, name=name), dim=d)


def check_layout(gate_up_layout) -> str:
    """``gate_up_layout`` checked: one of :data:`LAYOUTS`."""
    if gate_up_layout not in LAYOUTS:
        raise ValueError(f"gate_up_layout: must be one of {list(LAYOUTS)}, got {gate_up_layout!r}")
    return gate_up_layout


__all__ = ["GATE_UP_BLOCK", "LAYOUTS", "check_layout", "gate_up_columns", "halves_to_interleaved",
           "interleave_gate_up", "interleaved_to_halves", "split_gate_up"]
