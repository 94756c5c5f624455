"""The vendor-compatible user API: wrapper, class API, TupleDict, and the input contract."""
from .klass import GroupedGemmDglu
from .tupledict import TupleDict
from .wrapper import grouped_gemm_dglu_wrapper

__all__ = ["GroupedGemmDglu", "TupleDict", "grouped_gemm_dglu_wrapper"]
