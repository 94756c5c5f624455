"""Launch the block-scaled kernels: the dequantizer (``dequant.Dequantizer``; A's and B's in one
launch, ``dequant.DequantPair``) and the D quantizer (``quantize_d.QuantizeD``).

Owns their argument conventions (dequantizer: element bytes or their pointer table, scale
bytes or theirs, BF16 out, the int32 offsets, then rows, K, the group count and the stream;
quantizer: fp32 D, D_row, D_col, SFD_row, SFD_col, the int32 offsets, norm_const, then M, 2N,
the group count and the stream), the checks a launch makes on its sizes and addresses, and a
per-process cache keyed by each kernel's config over the disk cache. Imports no DSL: a kernel
is compiled (``build``, which imports it) only when the disk cache misses, and with the
TVM-FFI convention a warm process launches without the DSL; the DSL's own convention goes
through ``build``. No torch.
"""
from __future__ import annotations

import os

from ..kernel_cache import TVM_FFI, KernelCache
from .config import DequantConfig, DequantPairConfig, QuantizeDConfig

#: The kernels' source (part of the disk cache's key): this package, the scale-factor layout
#: they read, the expert lookup and the block rule the D quantizer shares with the SM90
#: kernel, and the compile call
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (_HERE, os.path.join(_HERE, "..", "..", "quant", "sf_layout.py"),
           os.path.join(_HERE, "..", "sm90", "tile_walk.py"), os.path.join(_HERE, "..", "sm90", "mx_rule.py"),
           os.path.join(_HERE, "..", "placeholders.py"))

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


def quantize_d_cached(cfg: QuantizeDConfig):
    """The compiled D quantizer of ``cfg`` (``kernel_cache.KernelCache``)."""
    return _kernels.get("quantize_d", cfg, "compile_quantize_d")


def launch_quantize_d(cfg: QuantizeDConfig, x: int, d_row: int, m: int, two_n: int, groups: int,
                      stream_handle: int, *, d_col: int = 0, sfd_row: int = 0, sfd_col: int = 0,
                      offsets: int = 0, norm_const: int = 0) -> None:
    """Quantize the fp32 ``(m, two_n)`` row-major matrix at ``x`` into FP8 D at ``d_row``
    (with ``cfg.scales`` also D_col at ``d_col`` and the e8m0 SFD_row / SFD_col at
    ``sfd_row`` / ``sfd_col``, scaled by the fp32 at ``norm_const``), rows below the last of
    the ``groups`` int32 offsets at ``offsets`` (M with ``cfg.single_group``), on the stream
    ``stream_handle``. Addresses are device pointers; this reads none of them."""
    if m % 256 or m <= 0:
        raise ValueError(f"m: must be a positive multiple of 256 (whole 256-row groups), got {m}")
    if two_n % 64 or two_n <= 0:
        raise ValueError(f"two_n: must be a positive multiple of 64 (N % 32 == 0), got {two_n}")
    if groups <= 0:
        raise ValueError(f"groups: must be >= 1, got {groups}")
    if x % 16 or d_row % 16:
        raise ValueError(f"x, d_row: must be 16-byte aligned, got {x:#x}, {d_row:#x}")
    if not cfg.single_group and not offsets:
        raise ValueError("offsets: the quantizer reads the last padded offset, got none")
    if cfg.scales:
        named = dict(d_col=d_col, sfd_row=sfd_row, sfd_col=sfd_col, norm_const=norm_const)
        missing = [k for k, v in named.items() if not v]
        if missing:
            raise ValueError(f"{', '.join(missing)}: scale generation writes D_col, SFD_row and "
                             f"SFD_col scaled by norm_const, got none for these")
        if d_col % 16 or sfd_row % 4:
            raise ValueError(f"d_col, sfd_row: must be 16- and 4-byte aligned, got {d_col:#x}, "
                             f"{sfd_row:#x}")
    # pointers a configuration never reads get x's address
    addrs = [a or x for a in (x, d_row, d_col, sfd_row, sfd_col, offsets, norm_const)]
    fn = quantize_d_cached(cfg)
    if TVM_FFI:
        fn(*addrs, m, two_n, groups, stream_handle)
    else:
        _kernels.build().call_dsl("quantize_d", fn, addrs, (m, two_n, groups), stream_handle)
