"""The graph API: declare tensors and a ``grouped_matmul_dglu`` node, then plan and execute.

``graph/`` owns descriptors, nodes, the builder, the variant pack's binding and plan
serialization; it has no kernel knowledge and names no engine (input rules come from
``cudnn_ext.contract``, ranked and built plans from ``cudnn_ext.plan``).
"""
from ..engines.heuristics import HeurMode
from .graph import DgluOutputs, Graph, GraphSpec
from .nodes import GroupedMatmulDgluAttrs, Node
from .types import BuildPlanPolicy, DataType, TensorDesc

#: Vendor-style lower-case aliases (``cudnn.heur_mode.A``, ``cudnn.data_type.BFLOAT16`` ...).
heur_mode = HeurMode
build_plan_policy = BuildPlanPolicy
data_type = DataType

__all__ = ["Graph", "GraphSpec", "DgluOutputs", "TensorDesc", "DataType", "HeurMode", "BuildPlanPolicy",
           "GroupedMatmulDgluAttrs", "Node", "heur_mode", "build_plan_policy", "data_type"]
