"""Launch the block-scaled kernels: the dequantizer (``dequant.Dequantizer``; A's and B's in one
launch, ``dequant.DequantPair``).

Owns their argument conventions (element bytes or their pointer table, scale bytes or
theirs, BF16 out, the int32 offsets, then rows, K, the group count and the stream), the checks a launch makes on its sizes and addresses, and a
per-process cache keyed by each kernel's config over the disk cache. Imports no DSL: a kernel
is compiled (``build``, which imports it) only when the disk cache misses, and with the
TVM-FFI convention a warm process launches without the DSL; the DSL's own convention goes
through ``build``. No torch.
"""
from __future__ import annotations

import os

from ..kernel_cache import TVM_FFI, KernelCache
from .config import DequantConfig, DequantPairConfig

#: The kernels' source (part of the disk cache's key): this package, the scale-factor layout
#: they read, the expert lookup they share with the SM90 kernel and the compile call
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (_HERE, os.path.join(_HERE, "..", "..", "quant", "sf_layout.py"),
           os.path.join(_HERE, "..", "sm90", "tile_walk.py"), os.path.join(_HERE, "..", "placeholders.py"))

# (the DSL side, ``build``, is imported on a disk-cache miss or for the DSL's convention)
_kernels = KernelCache(SOURCES, f"{__package__}.build")
_compiled = _kernels.compiled  # (kind, config) -> compiled kernel


def dequant_cached(cfg: DequantConfig):
    """The compiled dequantizer of ``cfg`` (``kernel_cache.KernelCache``)."""
    return _kernels.get("dequant", cfg, "compile_dequant")


def launch_dequant(cfg: DequantConfig, q: int, sf: int, out: int, rows: int, k: int,
                   groups: int, stream_handle: int, offsets: int = 0) -> None:
    """Dequantize ``groups`` x ``rows`` x ``k`` elements at address ``q`` (scales at ``sf``;
    with ``cfg.tables`` both are device pointer tables and ``offsets`` the int32 padded
    offsets) into BF16 at ``out``, on the stream ``stream_handle``."""
    if cfg.tables and not offsets:
        raise ValueError("offsets: the per-expert dequantizer needs the padded offsets, got none")
    offsets = offsets or out  # never read without tables
    fn = dequant_cached(cfg)
    if TVM_FFI:
        fn(q, sf, out, offsets, rows, k, groups, stream_handle)
    else:
        _kernels.build().call_dsl("dequant", fn, (q, sf, out, offsets), (rows, k, groups), stream_handle)


def dequant_pair_cached(cfg: DequantPairConfig):
    """The compiled pair of dequantizers of ``cfg`` (``kernel_cache.KernelCache``)."""
    return _kernels.get("dequant_pair", cfg, "compile_dequant_pair")


def launch_dequant_pair(cfg: DequantPairConfig, a: tuple, b: tuple, rows_a: int, rows_b: int, k: int,
                        groups_b: int, stream_handle: int, offsets: int = 0) -> None:
    """Dequantize A (``a``: the addresses of its elements, scales and BF16 out; one group of
    ``rows_a`` x ``k``) and B (``b``: the same, or with ``cfg.b.tables`` the device pointer
    tables of elements and scales; ``groups_b`` x ``rows_b`` x ``k``, ``offsets`` the int32
    padded offsets) in one launch on the stream ``stream_handle``."""
    if cfg.b.tables and not offsets:
        raise ValueError("offsets: the per-expert dequantizer needs the padded offsets, got none")
    offsets = offsets or a[2]  # never read without tables
    fn = dequant_pair_cached(cfg)
    if TVM_FFI:
        fn(*a, *b, offsets, rows_a, rows_b, k, groups_b, stream_handle)
    else:
        _kernels.build().call_dsl("dequant_pair", fn, (*a, *b, offsets), (rows_a, rows_b, k, groups_b),
                                  stream_handle)
