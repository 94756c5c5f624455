"""What the block-scaled kernels are compiled on, without the CuTe DSL.

Owns :class:`DequantConfig` and :class:`DequantPairConfig` (each compiled kernel's
specialization, part of its disk-cache key) and their validity rules, so that the engine
builds its plans and a launch from a warm disk cache builds its keys without importing the DSL
(``launch``). The kernels (``dequant``) read them from here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...quant import formats

#: the formats the dequantizer reads (elements, scales; ``quant.formats`` names them)
ELEM_FORMATS = formats.names(formats.ELEMENT)
SF_FORMATS = formats.names(formats.SCALE)


@dataclass(frozen=True)
class DequantConfig:
    """What one compiled dequantizer is specialized on: the element and scale formats and the
    block size (``sf_vec``: 32 for MXFP8/MXFP4, 16 or 32 for NVFP4). Rows, K and the group
    count are runtime arguments."""

    elem: str
    sf: str
    sf_vec: int
    #: per-expert buffers (discrete weights): ``q`` and ``sf`` are device tables of L
    #: addresses, one (rows, K) operand and its one-group scales each; experts without rows
    #: (from the offsets, on the device) are skipped, their pointers never read
    tables: bool = False
    #: FP8 elements stored N-major, ``(G, K, rows)`` (a ``b_major="n"`` weight): the BF16 out
    #: keeps that order, and each element takes the scale of its own row's K block
    n_major: bool = False

    def check(self) -> None:
        if self.elem not in ELEM_FORMATS:
            raise ValueError(f"elem must be one of {ELEM_FORMATS}, got {self.elem!r}")
        if self.sf not in SF_FORMATS:
            raise ValueError(f"sf must be one of {SF_FORMATS}, got {self.sf!r}")
        if self.sf_vec not in (16, 32):
            raise ValueError(f"sf_vec must be 16 or 32, got {self.sf_vec}")
        if self.elem != "e2m1" and (self.sf, self.sf_vec) != ("e8m0", 32):
            raise ValueError(f"FP8 elements take e8m0 scales over 32 elements, got "
                             f"{self.sf} over {self.sf_vec}")
        if self.n_major and self.fp4:
            raise ValueError("n_major: FP4 elements are K-major only (two per byte along K)")

    @property
    def fp4(self) -> bool:
        return self.elem == "e2m1"

    def stored_bytes(self, k: int) -> int:
        """Bytes of one row of K logical elements."""
        return k // 2 if self.fp4 else k


@dataclass(frozen=True)
class DequantPairConfig:
    """Two dequantizers in one launch (an engine's A and B: one launch where two would each
    cost their host issue): A dense K-major, one group; B any :class:`DequantConfig` of the
    same formats."""

    a: DequantConfig
    b: DequantConfig

    def check(self) -> None:
        self.a.check()
        self.b.check()
        if self.a.tables or self.a.n_major:
            raise ValueError(f"a: dense K-major (one group), got tables={self.a.tables}, "
                             f"n_major={self.a.n_major}")
        if (self.a.elem, self.a.sf, self.a.sf_vec) != (self.b.elem, self.b.sf, self.b.sf_vec):
            raise ValueError(f"a and b: one format, got {self.a} and {self.b}")
