"""What the partial-sums kernel is compiled on, without the CuTe DSL.

Owns :class:`FoldConfig` (the compiled kernel's specialization, part of its disk-cache key),
so that a launch from a warm disk cache builds its key without importing the DSL (``launch``).
"""
from __future__ import annotations

from dataclasses import dataclass

#: rows per CTA: one thread per row
THREADS = 256


@dataclass(frozen=True)
class FoldConfig:
    """One compiled fold: ``out[r] += parts[0, r] + parts[1, r] + ... + parts[P-1, r]`` (fp32,
    summed in that order) for every row r below the last of the int32 offsets; rows at or past
    it keep their bytes. The row count M, the part count P and the offsets' count are runtime
    arguments; there is one form (the key names the kernel and its element types)."""

    parts: str = "fp32"
    out: str = "fp32"

    def check(self) -> None:
        if (self.parts, self.out) != ("fp32", "fp32"):
            raise ValueError(f"parts, out: the fold sums fp32 partials into fp32, got {self.parts!r}, {self.out!r}")
