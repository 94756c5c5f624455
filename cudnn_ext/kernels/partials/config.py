"""What the partial-sums kernel is compiled on, without the CuTe DSL.

Owns :class:`FoldConfig` (the compiled kernel's specialization, part of its disk-cache key),
so that a launch from a warm disk cache builds its key without importing the DSL (``launch``).
"""
from __future__ import annotations

from dataclasses import dataclass

#: rows (or columns) per CTA: one thread each
THREADS = 256


@dataclass(frozen=True)
class FoldConfig:
    """One compiled fold (``fold.FoldPartials``): ``out[r] += parts[0, r] + ... + parts[P-1, r]``
    (fp32, summed in that order) for every row r below the last of the int32 offsets, rows at
    or past it keeping their bytes; and ``dbias[e, g] = round(dbias[e, g] + (cols[lo_e, g] +
    ... + cols[hi_e - 1, g]))`` over expert e's M-tiles, the sum in fp32 in ascending tile
    order, rounded once to ``dbias``'s type. Sizes and bounds are runtime arguments; there is
    one form (the key names the kernel and its element types)."""

    parts: str = "fp32"
    out: str = "fp32"
    dbias: str = "bf16"

    def check(self) -> None:
        if (self.parts, self.out, self.dbias) != ("fp32", "fp32", "bf16"):
            raise ValueError(f"parts, out, dbias: the fold sums fp32 partials into fp32 rows and "
                             f"bf16 columns, got {self.parts!r}, {self.out!r}, {self.dbias!r}")
