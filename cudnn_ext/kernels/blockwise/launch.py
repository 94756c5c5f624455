"""Launch the blockwise FP8 quantizer (``quantize.QuantizeBlockwise``).

Owns its argument convention (source, first block's values and scales, second block's, the
int32 offsets, then rows, K, the row stride, the group stride, the group count, the offsets'
count and the stream), the checks a launch makes on its sizes and addresses, and a per-process
cache keyed by config over the disk cache. Imports no DSL: the kernel is compiled (``build``,
which imports it) only when the disk cache misses, and with the TVM-FFI convention a warm
process launches without the DSL. No torch.
"""
from __future__ import annotations

import os

from ..kernel_cache import TVM_FFI, KernelCache
from .config import LANE_COLS, BlockwiseQuantConfig

#: The kernel's source (part of the disk cache's key): this package, the block shapes it reads
#: from ``quant.blockwise``, the amax bit rule it shares with the SM90 kernel's quantizing
#: epilogue (``sm90.mx_rule``) and the compile call
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = (_HERE, os.path.join(_HERE, "..", "..", "quant", "blockwise.py"),
           os.path.join(_HERE, "..", "sm90", "mx_rule.py"), os.path.join(_HERE, "..", "placeholders.py"))
#: the kernel's sizes and strides are Int32, its offsets 64-bit
INT32_MAX = 2 ** 31 - 1
_ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

_kernels = KernelCache(SOURCES, f"{__package__}.build")


def quantize_cached(cfg: BlockwiseQuantConfig):
    """The compiled quantizer of ``cfg`` (``kernel_cache.KernelCache``)."""
    return _kernels.get("quantize_fp8_blockwise", cfg, "compile_quantize")


def launch_quantize(cfg: BlockwiseQuantConfig, x: int, q_a: int, s_a: int, rows: int, k: int,
                    ld: int, gstride: int, groups: int, stream_handle: int, *, q_b: int = 0,
                    s_b: int = 0, offsets: int = 0, n_offsets: int = 0) -> None:
    """Quantize ``groups`` matrices of ``rows`` x ``k`` source values at ``x`` (row stride
    ``ld``, group stride ``gstride``, in elements) into e4m3 values at ``q_a`` and fp32 scales
    at ``s_a`` for ``cfg.blocks[0]`` (``q_b``/``s_b`` for a second block shape), on the stream
    ``stream_handle``; with ``cfg.masked`` rows at or past the last of the ``n_offsets`` int32
    offsets at ``offsets`` keep their bytes. Addresses are device pointers; this reads none."""
    cfg.check()
    gstride = gstride if groups > 1 else 0  # one group: never read
    if rows <= 0 or k <= 0 or groups <= 0:
        raise ValueError(f"rows, k, groups: must be positive, got {rows}, {k}, {groups}")
    if k % LANE_COLS or ld % LANE_COLS or gstride % LANE_COLS:
        raise ValueError(f"k, ld, gstride: must be multiples of {LANE_COLS}, got {k}, {ld}, {gstride}")
    if ld < k or max(ld, gstride, rows, k, groups) > INT32_MAX or groups * rows * k > 2 ** 62:
        raise ValueError(f"ld, gstride, rows, k, groups: ld >= k and each within int32, got ld={ld}, "
                         f"gstride={gstride}, rows={rows}, k={k}, groups={groups}")
    align = LANE_COLS * _ELEM_BYTES[cfg.src]
    if x % align or q_a % 4 or s_a % 4:
        raise ValueError(f"x, q_a, s_a: must be {align}-, 4- and 4-byte aligned, got {x:#x}, {q_a:#x}, {s_a:#x}")
    if len(cfg.blocks) > 1 and (not q_b or not s_b or q_b % 4 or s_b % 4):
        raise ValueError(f"q_b, s_b: a second block shape needs its values and scales, 4-byte aligned, "
                         f"got {q_b:#x}, {s_b:#x}")
    if cfg.masked and (not offsets or n_offsets <= 0):
        raise ValueError(f"offsets: a masked quantizer reads the last offset, got {offsets:#x} with "
                         f"{n_offsets} offsets")
    # pointers a configuration never reads get x's address
    addrs = [a or x for a in (x, q_a, s_a, q_b, s_b, offsets)]
    sizes = (rows, k, ld, gstride, groups, max(n_offsets, 1))
    fn = quantize_cached(cfg)
    if TVM_FFI:
        fn(*addrs, *sizes, stream_handle)
    else:
        _kernels.build().call_dsl(cfg, fn, addrs, sizes, stream_handle)
