"""The ``fp8_blockwise`` recipe as a PyTorch op: ``torch.ops.cudnn_ext.grouped_gemm_dglu_fp8_blockwise``
and its Python entry point :func:`grouped_gemm_dglu_fp8_blockwise`.

Owns the op's schema, its fake (meta) kernel and its body, which is the wrapper's call with
``recipe="fp8_blockwise"`` (the contract, the memo and the engines are the wrapper's). Like the
other ops it is functional: fresh ``(d_row (M, 2N), dprob (M,) fp32, dbias)`` outputs, ``dbias``
``(L, 2N)`` bf16 with ``generate_dbias`` and ``(0, 2N)`` otherwise. Operands: e4m3 ``a`` (M, K)
with fp32 ``sfa`` (M, K/128) and e4m3 ``b`` (L, N, K) with fp32 ``sfb`` (L, N/128, K/128), each
scale matrix MN-major; for ``(L, N, K)`` weights ``w``::

    b, sfb = quantize_fp8_blockwise(w.permute(1, 2, 0), (128, 128))   # (N, K, L) and (N/128, K/128, L)
    b, sfb = b.permute(2, 0, 1), sfb.permute(2, 0, 1)                 # the op's (L, N, K), (L, N/128, K/128)

D is bf16, fp16 or fp32 (an FP8 D with its scales goes through the wrapper, the class API or a
graph).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import contract
from ..api.wrapper import grouped_gemm_dglu_wrapper
from .ops import _LIB

_lib = torch.library.Library(_LIB, "FRAGMENT")
_lib.define(
    "grouped_gemm_dglu_fp8_blockwise(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor c, Tensor padded_offsets, "
    "Tensor alpha, Tensor beta, Tensor prob, str act_func='dswiglu', float? linear_offset=None, "
    "float geglu_alpha=1.702, float glu_clamp_max=7.0, float glu_clamp_min=-7.0, float situ_beta1=4.0, "
    "float situ_beta2=25.0, bool generate_dbias=False, ScalarType? d_dtype=None, int m_aligned=256) "
    "-> (Tensor, Tensor, Tensor)")

_D_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _weights(b: Tensor, sfb: Tensor) -> Tuple[Tensor, Tensor]:
    """The op's (L, N, K) weights and (L, N/128, K/128) scales as the contract's (N, K, L) and
    (N/128, K/128, L) views."""
    if b.dim() != 3:
        raise ValueError(f"b: shape must be (L, N, K), got {tuple(b.shape)}")
    if sfb.dim() != 3:
        raise ValueError(f"sfb: shape must be (L, ceil(N/128), K/128), got {tuple(sfb.shape)}")
    return b.permute(1, 2, 0), sfb.permute(1, 2, 0)


def _check_d_dtype(d_dtype) -> torch.dtype:
    d_dtype = torch.bfloat16 if d_dtype is None else d_dtype
    if d_dtype not in _D_DTYPES:
        raise ValueError(f"d_dtype: the op returns a bfloat16, float16 or float32 D, got {d_dtype} (an FP8 D with "
                         "its scales: grouped_gemm_dglu_wrapper(..., recipe='fp8_blockwise'))")
    return d_dtype


def _kwargs(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, situ_beta1, situ_beta2,
            m_aligned) -> dict:
    return dict(act_func=act_func, linear_offset=linear_offset, geglu_alpha=geglu_alpha, glu_clamp_max=glu_clamp_max,
                glu_clamp_min=glu_clamp_min, situ_beta1=situ_beta1, situ_beta2=situ_beta2, m_aligned=m_aligned)


def _empty_dbias(c: Tensor) -> Tensor:
    return c.new_empty((0, c.shape[1]), dtype=torch.bfloat16)


@torch.library.impl(_lib, "grouped_gemm_dglu_fp8_blockwise", "CompositeExplicitAutograd")
def _impl(a, sfa, b, sfb, c, padded_offsets, alpha, beta, prob, act_func="dswiglu", linear_offset=None,
          geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, situ_beta1=4.0, situ_beta2=25.0,
          generate_dbias=False, d_dtype=None, m_aligned=256):
    d_dtype = _check_d_dtype(d_dtype)
    b3, sfb3 = _weights(b, sfb)
    dprob = torch.zeros(c.shape[0], dtype=torch.float32, device=c.device)
    out = grouped_gemm_dglu_wrapper(
        a_tensor=a, c_tensor=c, sfa_tensor=sfa, padded_offsets=padded_offsets, alpha_tensor=alpha, beta_tensor=beta,
        prob_tensor=prob, dprob_tensor=dprob, b_tensor=b3, sfb_tensor=sfb3, generate_dbias=generate_dbias,
        d_dtype=d_dtype, recipe="fp8_blockwise",
        **_kwargs(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, situ_beta1, situ_beta2,
                  m_aligned))
    dbias = out["dbias_tensor"]
    return (out["d_row_tensor"][..., 0], dprob,
            dbias[..., 0] if dbias is not None else _empty_dbias(c))


@torch.library.register_fake(f"{_LIB}::grouped_gemm_dglu_fp8_blockwise", lib=_lib)
def _fake(a, sfa, b, sfb, c, padded_offsets, alpha, beta, prob, act_func="dswiglu", linear_offset=None,
          geglu_alpha=1.702, glu_clamp_max=7.0, glu_clamp_min=-7.0, situ_beta1=4.0, situ_beta2=25.0,
          generate_dbias=False, d_dtype=None, m_aligned=256):
    """The contract on the metadata (no data pointers: fake tensors have none), then the
    outputs' shapes; an invalid call fails while torch.compile traces it."""
    d_dtype = _check_d_dtype(d_dtype)
    b3, sfb3 = _weights(b, sfb)
    ops = contract.Operands(a=a, c=c, sfa=sfa, padded_offsets=padded_offsets, alpha=alpha, beta=beta, prob=prob,
                            dprob=c.new_empty((c.shape[0],), dtype=torch.float32), b=b3, sfb=sfb3)
    cfg = contract.CallConfig(recipe="fp8_blockwise", **_kwargs(act_func, linear_offset, geglu_alpha, glu_clamp_max,
                                                               glu_clamp_min, situ_beta1, situ_beta2, m_aligned))
    problem, _ = contract.normalize(ops, cfg, d_dtype=d_dtype, generate_dbias=generate_dbias, pointers=False)
    m, two_n = c.shape[0], c.shape[1]
    return (c.new_empty((m, two_n), dtype=d_dtype), c.new_empty((m,), dtype=torch.float32),
            c.new_empty((problem.num_experts if problem.generate_dbias else 0, two_n), dtype=torch.bfloat16))


def grouped_gemm_dglu_fp8_blockwise(
    a: Tensor, sfa: Tensor, b: Tensor, sfb: Tensor, c: Tensor, padded_offsets: Tensor, alpha: Tensor,
    beta: Tensor, prob: Tensor, *, act_func: str = "dswiglu", linear_offset: Optional[float] = None,
    geglu_alpha: float = 1.702, glu_clamp_max: float = 7.0, glu_clamp_min: float = -7.0, situ_beta1: float = 4.0,
    situ_beta2: float = 25.0, generate_dbias: bool = False, d_dtype: Optional[torch.dtype] = None,
    m_aligned: int = 256,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``(d_row, dprob, dbias or None)`` of the fp8_blockwise recipe (module docstring) through
    ``torch.ops.cudnn_ext.grouped_gemm_dglu_fp8_blockwise`` (eager, torch.compile, fake tensors)."""
    d, dprob, dbias = torch.ops.cudnn_ext.grouped_gemm_dglu_fp8_blockwise(
        a, sfa, b, sfb, c, padded_offsets, alpha, beta, prob, act_func=act_func, linear_offset=linear_offset,
        geglu_alpha=geglu_alpha, glu_clamp_max=glu_clamp_max, glu_clamp_min=glu_clamp_min, situ_beta1=situ_beta1,
        situ_beta2=situ_beta2, generate_dbias=generate_dbias, d_dtype=d_dtype, m_aligned=m_aligned)
    return d, dprob, (dbias if generate_dbias else None)
