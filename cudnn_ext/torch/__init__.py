"""PyTorch bindings: custom ops (``torch.ops.cudnn_ext.*``) and the autograd MoE expert MLP.

Owns nothing but re-exports; see ``ops`` (functional custom ops) and ``mlp``
(``GroupedGluMLP``). Importing it registers the ops with ``torch.library``. It never imports
jax, cutlass or cuda-python.
"""
from ..functional import clear_memo
from .mlp import GroupedGluMLP
from .ops import expert_pointers, grouped_gemm_dglu

__all__ = ["GroupedGluMLP", "grouped_gemm_dglu", "expert_pointers", "clear_memo"]
