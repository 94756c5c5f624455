"""The BF16 family of the contract: A/B bf16, C and D bf16/fp16/fp32; validation and the
canonical pack (views of the caller's tensors)."""
from __future__ import annotations

from typing import Any, Dict

from .. import activations
from ..errors import DtypeError
from ..problem import DgluProblem
from .rules import (ARG_NAMES, BF16, activation_view, CD_DTYPES, CallConfig, Operands, _fmt_dtype, check_aligned, check_d_dtype,
                    check_dtype, check_expert_count, check_n, check_row_major, check_same_device,
                    check_shape, dbias_view, dense_b_major, drop_unit_dims, per_expert_vectors,
                    pointer_table, prob_vectors, require_tensor, resolve_act)


def normalize_bf16(ops: Operands, cfg: CallConfig, *, mode: str, n, b_dtype, d_dtype, generate_dbias,
                   pointers: bool, family: str = activations.BF16, ab_dtype=BF16, k_multiple: int = 8):
    """Validate a BF16 call; ``(problem, pack)`` as :func:`cudnn_ext.contract.normalize` returns.
    ``family``/``ab_dtype``/``k_multiple``: the rules of a recipe with the BF16 contract's
    epilogue on other operands (``contract.fp8_blockwise``, which checks its scales itself)."""
    a = ops.a  # a tensor: normalize checked it
    act = resolve_act(cfg, family=family)

    # A: (M, K) or (M, K, 1), K-major, bf16
    a2 = drop_unit_dims("a_tensor", a, 2, "(M, K) or (M, K, 1)")
    m, k = a2.shape
    check_row_major("a_tensor", a2)
    align = int(cfg.m_aligned)  # one of M_ALIGNED_CHOICES: check_common_config ran
    if m % align:
        raise ValueError(f"a_tensor: M (rows) must be a multiple of {align}, got M = {m} (m_aligned = {align})")
    if k <= 0 or k % k_multiple:
        why = "16-byte rows of bf16" if ab_dtype == BF16 else "whole 128-element scale blocks"
        raise ValueError(f"a_tensor: K must be a positive multiple of {k_multiple} ({why}), got K = {k}")

    # B: dense (N, K, L) K- or N-major, or discrete pointers
    if mode == "dense":
        b = require_tensor("b_tensor", ops.b)
        check_dtype("b_tensor", b, (ab_dtype,))
        b_major = dense_b_major(b, k)
        n, _, num_experts = b.shape
    else:
        bp = pointer_table("b_ptrs", ops.b_ptrs, pointers)
        if b_dtype != ab_dtype:
            raise DtypeError(f"b_dtype: must be {_fmt_dtype(ab_dtype)} with {_fmt_dtype(ab_dtype)} a_tensor, "
                             f"got {_fmt_dtype(b_dtype)}")
        num_experts = bp.shape[0]
        check_expert_count("b_ptrs", num_experts)
        b_major = cfg.b_major
    check_n("b_tensor" if mode == "dense" else "n", n)
    two_n = 2 * n

    c = drop_unit_dims("c_tensor", require_tensor("c_tensor", ops.c), 2, "(M, 2N) or (M, 2N, 1)")
    check_dtype("c_tensor", c, CD_DTYPES)
    check_shape("c_tensor", c, (m, two_n), "(M, 2N)")
    check_row_major("c_tensor", c)

    pack: Dict[str, Any] = {"a": a2, "c": c}
    if ops.d_row is not None:
        d = drop_unit_dims("d_row_tensor", ops.d_row, 2, "(M, 2N) or (M, 2N, 1)")
        check_dtype("d_row_tensor", d, CD_DTYPES)
        check_shape("d_row_tensor", d, (m, two_n), "(M, 2N)")
        check_row_major("d_row_tensor", d)
        pack["d_row"] = d
        d_dtype = d.dtype
    else:
        d_dtype = BF16 if d_dtype is None else d_dtype
        check_d_dtype(d_dtype)

    pack.update(per_expert_vectors(ops, num_experts, "bf16"))

    pack.update(prob_vectors(ops, m, required=True))  # the BF16 contract requires both
    db = dbias_view(ops, num_experts, two_n, generate_dbias)
    if db is not None:
        pack["dbias"] = db
        generate_dbias = True

    if ops.activation is not None:
        if family not in activations.activation(act.act_func).activation_output or c.dtype != BF16 \
                or d_dtype != BF16:
            # (the vendor's phrase first: code matching it keeps matching; cudnn_ext's rule is wider)
            raise ValueError("activation_tensor: activation output requires BF16 C/D and dgeglu in the vendor's "
                             "contract; cudnn_ext stores it for every activation with bfloat16 C and D, got "
                             f"act_func={act.act_func!r}, C {_fmt_dtype(c.dtype)}, D {_fmt_dtype(d_dtype)}")
        pack["activation"] = activation_view(ops, m, n)

    device = check_same_device({ARG_NAMES[s]: pack.get(s) for s in pack} | {"b_tensor": ops.b, "b_ptrs": ops.b_ptrs})
    if pointers:
        for slot, t in pack.items():
            check_aligned(ARG_NAMES[slot], t)
        if "activation" in pack and pack["activation"].data_ptr() % 32:  # the kernel's 32-byte stores
            raise ValueError(f"activation_tensor: activation output must be 32-byte aligned, got data pointer "
                             f"0x{pack['activation'].data_ptr():x}")
        if mode == "dense":
            check_aligned("b_tensor", ops.b)
    if mode == "dense":
        pack["b"] = ops.b
    else:
        pack["b_ptrs"] = ops.b_ptrs

    problem = DgluProblem(
        n=n, k=k, num_experts=num_experts, m=m, weight_mode=mode, b_major=b_major,
        ab_dtype=ab_dtype, c_dtype=c.dtype, d_dtype=d_dtype, act=act, generate_dbias=bool(generate_dbias),
        has_prob=True, has_dprob=True, generate_activation="activation" in pack,
        round_dgrad_to_input_dtype=cfg.round_dgrad_to_input_dtype, use_dynamic_sched=cfg.use_dynamic_sched,
        m_aligned=align, recipe=None if family == activations.BF16 else family, deterministic=cfg.deterministic,
        device_type=device.type,
        device_index=device.index,
    )
    return problem, pack
