"""Exact PyTorch semantics of grouped GEMM + dGLU: the oracle every engine is checked against."""
from .epilogue import dgeglu, dsituglu, dswiglu, gate_up_columns, local_derivatives
from .grouped_dglu import expert_ranges, grouped_dglu_reference, reference_outputs

__all__ = [
    "dswiglu", "dgeglu", "dsituglu", "gate_up_columns", "local_derivatives",
    "expert_ranges", "grouped_dglu_reference", "reference_outputs",
]
