"""The contract of grouped GEMM + dGLU: every rule on user input, checked before anything is
allocated or compiled, and the canonical form engines receive.

Owns validation of the wrapper's, class API's and bindings' arguments and their translation
into a :class:`DgluProblem` plus a canonical variant pack of *views* of the caller's tensors
(so outputs are written in place). It never allocates device memory, never reads tensor *data*
(offset values are a device-data contract, checked by engines that read them anyway), and never
picks an engine. ``rules`` holds the shared checks, ``bf16`` and ``blockscaled`` the two
operand families.
"""
from __future__ import annotations

from typing import Optional

import torch

from .bf16 import normalize_bf16
from .blockscaled import normalize_block_scaled
from .fp8_blockwise import normalize_fp8_blockwise
from .rules import *  # noqa: F401,F403  the contract's public checks and types
from .rules import (ARG_NAMES, CallConfig, Operands, _weight_mode, check_bf16_config, check_common_config,
                    check_outputs_apart, check_strided, operand_family, require_tensor)


def slot_alignment(problem, slot: str) -> int:
    """The data-pointer alignment in bytes that :func:`normalize` requires of ``slot`` in
    ``problem``'s family (0: none), so that a memoized call re-checks exactly that."""
    if slot in ("b_ptrs", "sfb_ptrs"):  # pointer tables
        return 8
    if problem.is_block_scaled:
        return 16 if slot in ("a", "c", "d_row", "d_col", "b", "activation") else 0
    return 32 if slot == "activation" else 16  # the kernel's 32-byte activation stores


def normalize(ops: Operands, cfg: CallConfig, *, n: Optional[int] = None, b_dtype: Optional[torch.dtype] = None,
              d_dtype: Optional[torch.dtype] = None, generate_dbias: Optional[bool] = None,
              pointers: bool = True):
    """Validate a call and return ``(problem, pack)``.

    ``pack`` maps slot names to canonical views of the caller's tensors. ``d_row`` (and
    ``dbias`` when ``generate_dbias``) may be absent: the wrapper passes ``d_dtype`` and
    allocates them after validation. ``pointers=False`` skips the data-pointer alignment rules
    (tensors without real storage: the torch ops' fake kernels, whose fake tensors have no
    address; their real run checks it).
    """
    for slot, t in vars(ops).items():
        if t is not None and slot != "norm_const" and not isinstance(t, torch.Tensor):
            raise TypeError(f"{ARG_NAMES[slot]}: expected a torch.Tensor, got {type(t).__name__}")
        if isinstance(t, torch.Tensor):
            check_strided(ARG_NAMES[slot], t)
    a = require_tensor("a_tensor", ops.a)
    mode = _weight_mode(ops, n, b_dtype)
    bd = ops.b.dtype if mode == "dense" else b_dtype
    if cfg.recipe is not None:  # cudnn_ext's recipes name themselves; the dtypes cannot tell them apart
        check_common_config(cfg)
        problem, pack = normalize_fp8_blockwise(ops, cfg, mode=mode, n=n, b_dtype=bd, d_dtype=d_dtype,
                                                generate_dbias=generate_dbias, pointers=pointers)
        if pointers:
            check_outputs_apart(pack)
        return problem, pack
    family = operand_family(a, bd, "b_tensor" if mode == "dense" else "b_dtype")
    check_common_config(cfg)
    if family == "block_scaled":
        problem, pack = normalize_block_scaled(ops, cfg, mode=mode, n=n, b_dtype=bd, d_dtype=d_dtype,
                                               generate_dbias=generate_dbias, pointers=pointers)
    else:
        check_bf16_config(cfg, {"sfa_tensor": ops.sfa, "sfb_tensor": ops.sfb, "sfb_ptrs": ops.sfb_ptrs,
                                "d_col_tensor": ops.d_col, "sfd_row_tensor": ops.sfd_row,
                                "sfd_col_tensor": ops.sfd_col, "amax_tensor": ops.amax,
                                "norm_const_tensor": ops.norm_const})
        problem, pack = normalize_bf16(ops, cfg, mode=mode, n=n, b_dtype=b_dtype, d_dtype=d_dtype,
                                       generate_dbias=generate_dbias, pointers=pointers)
    if pointers:
        check_outputs_apart(pack)
    return problem, pack
