"""cudnn_ext: Grouped GEMM + dGLU (the MoE expert-MLP backward step) on every training GPU.

``import cudnn_ext`` imports torch and pydantic only: CUDA, cuda-python and the CuTe DSL are
imported lazily by the engines that need them.

Drop-in for the vendor API: ``import cudnn_ext as cudnn`` then
``cudnn.grouped_gemm_dglu_wrapper_sm100(...)`` / ``cudnn.GroupedGemmDgluSm100(...)``.
"""
from .api import GroupedGemmDglu, TupleDict, grouped_gemm_dglu_wrapper
from .errors import EngineDeclined, NoEngineError
from .graph import (BuildPlanPolicy, DataType, Graph, HeurMode, TensorDesc, build_plan_policy, data_type,
                    heur_mode)
from .plan.serialize import PlanFormatError, deserialize_plan
from .problem import ActConfig, DgluProblem

__version__ = "0.1.0"

#: Vendor names, kept as aliases so cuDNN frontend code runs unchanged.
GroupedGemmDgluSm100 = GroupedGemmDglu
grouped_gemm_dglu_wrapper_sm100 = grouped_gemm_dglu_wrapper

__all__ = [
    "GroupedGemmDglu", "GroupedGemmDgluSm100", "TupleDict", "grouped_gemm_dglu_wrapper",
    "grouped_gemm_dglu_wrapper_sm100", "EngineDeclined", "NoEngineError", "ActConfig", "DgluProblem",
    "Graph", "TensorDesc", "DataType", "HeurMode", "BuildPlanPolicy", "heur_mode", "build_plan_policy",
    "data_type", "deserialize_plan", "PlanFormatError", "__version__",
]
