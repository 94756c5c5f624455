"""PyTorch bindings: custom ops (``torch.ops.cudnn_ext.*``) and the autograd MoE expert MLP.

Owns nothing but re-exports; see ``ops`` (functional custom ops; ``blockwise_ops`` the
fp8_blockwise recipe's, ``quant_ops`` its quantizer), ``mlp``
(``GroupedGluMLP``) and ``expert_parallel`` (its experts sharded over ``torch.distributed``
ranks). Importing it registers the ops with ``torch.library``. It never imports jax, cutlass
or cuda-python.
"""
from ..functional import clear_memo
from .expert_parallel import ExpertParallelGluMLP
from .mlp import GroupedGluMLP
from .blockwise_ops import grouped_gemm_dglu_fp8_blockwise
from .ops import expert_pointers, grouped_gemm_dglu
from .quant_ops import quantize_fp8_blockwise

__all__ = ["GroupedGluMLP", "ExpertParallelGluMLP", "grouped_gemm_dglu", "grouped_gemm_dglu_fp8_blockwise",
           "expert_pointers", "quantize_fp8_blockwise", "clear_memo"]
