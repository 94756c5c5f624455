"""alpha and beta as the block-scaled kernel applies them, in their own dtype.

Owns the two roundings a bfloat16 or float16 alpha/beta brings (docs/vendor_contract.md §3.5):
the vendor's block-scaled kernel loads ``alpha[e]`` and ``beta[e]`` in the tensors' dtype, so

* ``alpha**2`` is formed in alpha's dtype (``DgluProblem.alpha_square_dtype``), then multiplies
  the fp32 accumulator exactly converted;
* for dSwiGLU ``beta * C`` is formed in the promoted 16-bit type of C and beta
  (``DgluProblem.c_beta_dtype``), then the epilogue runs in fp32 on the rounded values.

float32 alpha and beta (every BF16 problem) keep the compute dtype's arithmetic. The
reference engine uses these functions for its results; the ``sm90_blockscaled`` engine for the
values it hands its fp32 kernel, so both round identically.
"""
from __future__ import annotations

import torch

from ..problem import DgluProblem


def alpha_squared(problem: DgluProblem, alpha: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each expert's ``alpha**2`` as the kernel forms it, in ``dtype``: rounded to alpha's
    16-bit dtype when it has one (one rounding of the exact product), else squared in
    ``dtype``."""
    half = problem.alpha_square_dtype
    if half is None:
        return alpha.to(dtype) ** 2
    a = alpha.to(half)
    return (a * a).to(dtype)


def beta_scaled_c(problem: DgluProblem, c: torch.Tensor, beta) -> torch.Tensor:
    """``beta * C`` in ``problem.c_beta_dtype`` (which must not be None): C's values and beta's
    converted to it (exact, except a bfloat16 value rounded to float16) and multiplied with one
    rounding, as the kernel's 16-bit multiply does. ``c``: rows of C in their stored dtype;
    ``beta``: a scalar tensor or a column broadcasting over them, holding beta's values in any
    float dtype that represents them exactly. A new tensor: ``c`` is not written."""
    half = problem.c_beta_dtype
    if half is None:
        raise ValueError("beta_scaled_c: this problem forms beta * C in its compute dtype (c_beta_dtype is None)")
    return c.to(half) * beta.to(half)
