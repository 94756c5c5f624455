"""What the layer's GLU forward is compiled on, without the CuTe DSL.

Owns :class:`GluConfig` (the compiled GLU forward's specialization, part of its disk-cache
key) and the kernel's column granularity that launches check N against, so that a launch
from a warm disk cache builds its key without importing the DSL (``launch``). The kernel
(``glu``) reads both from here.
"""
from __future__ import annotations

from dataclasses import dataclass

#: the activations whose forward glu.py implements (each keyed by its act_func)
KERNEL_ACTS = ("dswiglu", "dgeglu")
#: output columns per thread (16 bytes of bf16): N must be a multiple
VEC = 8


@dataclass(frozen=True)
class GluConfig:
    """What one compiled GLU forward is specialized on (the activation and its constants);
    M, N and the group count are runtime arguments (N a multiple of 32)."""

    act: str = "dswiglu"
    geglu_alpha: float = 1.702
    clamp_max: float = 7.0
    clamp_min: float = -7.0
    linear_offset: float = 0.0

    def check(self) -> None:
        if self.act not in KERNEL_ACTS:
            raise ValueError(f"act must be one of {KERNEL_ACTS}, got {self.act!r}")
