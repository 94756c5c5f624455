"""What the blockwise FP8 quantizer is compiled on, without the CuTe DSL.

Owns :class:`BlockwiseQuantConfig` (the compiled quantizer's specialization, part of its
disk-cache key) and its validity rules, so that a launch from a warm disk cache builds its key
without importing the DSL (``launch``). The kernel (``quantize``) reads it from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ...quant.blockwise import BLOCKS

#: the element types the quantizer reads (the DSL's names: ``build`` maps them)
SOURCE_DTYPES = ("bf16", "fp16", "fp32")
#: the block pairs one launch may write: one block shape, or D's two (1x128 along the row for
#: the next dgrad, 128x1 along the column for the wgrad) from one read of the source
BLOCK_SETS = tuple((b,) for b in BLOCKS) + (((1, 128), (128, 1)),)
#: a CTA's tile: 128 rows (four warps of 32) by 128 columns, one 128 x 128 block
TILE = 128
#: columns per lane: K must be a multiple (each lane reads and writes whole 4-column runs)
LANE_COLS = 4


@dataclass(frozen=True)
class BlockwiseQuantConfig:
    """One compiled quantizer: the source element type, the blocks it writes (each with its
    own e4m3 values and fp32 scales), the scale rule's power-of-two option, and whether rows
    at or past the last of the int32 offsets keep their bytes (``masked``: FP8 D, whose rows
    past the groups belong to no expert). Rows, K, the strides and the group count are
    runtime arguments."""

    src: str = "bf16"
    blocks: Tuple[Tuple[int, int], ...] = ((1, 128),)
    pow2_scales: bool = False
    masked: bool = False

    def check(self) -> None:
        if self.src not in SOURCE_DTYPES:
            raise ValueError(f"src must be one of {SOURCE_DTYPES}, got {self.src!r}")
        if tuple(self.blocks) not in BLOCK_SETS:
            raise ValueError(f"blocks must be one of {BLOCK_SETS}, got {self.blocks!r}")

    def has(self, block) -> bool:
        return tuple(block) in self.blocks
