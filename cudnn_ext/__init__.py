"""cudnn_ext: Grouped GEMM + dGLU (the MoE expert-MLP backward step) on every training GPU.

Drop-in for the vendor API: ``import cudnn_ext as cudnn`` then
``cudnn.grouped_gemm_dglu_wrapper_sm100(...)`` / ``cudnn.GroupedGemmDgluSm100(...)``.

The names below load on first use (PEP 562), so ``import cudnn_ext`` and
``python -m cudnn_ext --help`` import neither torch nor pydantic; the API imports torch and
pydantic, and CUDA, cuda-python and the CuTe DSL load only in the engines that need them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .version import __version__

#: public name -> (module, attribute). The vendor's names are aliases of ours.
_EXPORTS = {
    "GroupedGemmDglu": (".api.klass", "GroupedGemmDglu"),
    "GroupedGemmDgluSm100": (".api.klass", "GroupedGemmDglu"),
    "grouped_gemm_dglu_wrapper": (".api.wrapper", "grouped_gemm_dglu_wrapper"),
    "grouped_gemm_dglu_wrapper_sm100": (".api.wrapper", "grouped_gemm_dglu_wrapper"),
    "TupleDict": (".api.tupledict", "TupleDict"),
    "DtypeError": (".errors", "DtypeError"),
    "EngineDeclined": (".errors", "EngineDeclined"),
    "NoEngineError": (".errors", "NoEngineError"),
    "ActConfig": (".problem", "ActConfig"),
    "DgluProblem": (".problem", "DgluProblem"),
    "Graph": (".graph", "Graph"),
    "TensorDesc": (".graph", "TensorDesc"),
    "DataType": (".graph", "DataType"),
    "HeurMode": (".graph", "HeurMode"),
    "BuildPlanPolicy": (".graph", "BuildPlanPolicy"),
    "heur_mode": (".graph", "heur_mode"),
    "build_plan_policy": (".graph", "build_plan_policy"),
    "data_type": (".graph", "data_type"),
    "deserialize_plan": (".graph.graph", "deserialize_plan"),
    "PlanFormatError": (".graph.serialize", "PlanFormatError"),
    "interleave_gate_up": (".layout", "interleave_gate_up"),
    "split_gate_up": (".layout", "split_gate_up"),
    "halves_to_interleaved": (".layout", "halves_to_interleaved"),
    "interleaved_to_halves": (".layout", "interleaved_to_halves"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'cudnn_ext' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static analysers see the eager imports
    from .api.klass import GroupedGemmDglu, GroupedGemmDglu as GroupedGemmDgluSm100
    from .api.tupledict import TupleDict
    from .api.wrapper import grouped_gemm_dglu_wrapper, grouped_gemm_dglu_wrapper as grouped_gemm_dglu_wrapper_sm100
    from .errors import DtypeError, EngineDeclined, NoEngineError
    from .graph import (BuildPlanPolicy, DataType, Graph, HeurMode, TensorDesc, build_plan_policy, data_type,
                        heur_mode)
    from .graph.graph import deserialize_plan
    from .graph.serialize import PlanFormatError
    from .layout import halves_to_interleaved, interleave_gate_up, interleaved_to_halves, split_gate_up
    from .problem import ActConfig, DgluProblem
