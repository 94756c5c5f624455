"""The ``fp8_blockwise`` recipe (a cudnn_ext extension, ``recipe="fp8_blockwise"``): e4m3 A and B
with fp32 scales per 1x128 block of A (``sfa``, (M, K/128)) and per 128x128 block of each
expert's B (dense ``sfb`` (ceil(N/128), K/128, L), or ``sfb_ptrs``: one (ceil(N/128), K/128)
matrix per expert), all MN-major as ``cudnn_ext.quant.quantize_fp8_blockwise`` returns them.
The epilogue and every other rule are the BF16 contract's (``contract.bf16``), with dSiTU-GLU
too; D is bf16, fp16 or fp32, or e4m3 quantized by the same recipe in both directions: D_row
with ``sfd_row`` per 1x128 block along 2N (what the next dgrad reads) and D_col with
``sfd_col`` per 128x1 block along M (what the wgrad reads), ``m_aligned`` a multiple of 128 so
that no such block spans two experts.

Owns the recipe's own rules and the table of its scale slots' geometry; allocates nothing.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

import torch

from .. import activations
from ..errors import DtypeError
from ..quant.blockwise import FP8_BLOCKWISE_DTYPE, BlockwiseScaleGeometry
from . import rules as C
from .bf16 import normalize_bf16

RECIPE = activations.FP8_BLOCKWISE
#: K runs in whole scale blocks (the kernel applies each block's scales once per 128-K step)
K_BLOCK = 128
#: scale slots of the recipe
SCALE_SLOTS = ("sfa", "sfb")
#: slots the recipe never reads or writes
_REFUSED = ("amax", "norm_const")
#: the outputs of an FP8 D besides D_row
_FP8_D_SLOTS = ("d_col", "sfd_row", "sfd_col")
#: D_col's blocks run along M: groups start on multiples of this
D_COL_ROWS = 128


def scale_geometry(slot: str, *, n: int, k: int, num_experts: int) -> BlockwiseScaleGeometry:
    """The geometry of scale slot ``slot`` (M symbolic); ``sfb_ptrs`` entries point at one
    expert's slice of the ``sfb`` geometry, an MN-major (ceil(N/128), K/128) matrix."""
    return {
        "sfa": BlockwiseScaleGeometry(None, k, (1, K_BLOCK)),
        "sfb": BlockwiseScaleGeometry(n, k, (K_BLOCK, K_BLOCK), num_experts),
        "sfd_row": BlockwiseScaleGeometry(None, 2 * n, (1, K_BLOCK)),
        "sfd_col": BlockwiseScaleGeometry(None, 2 * n, (D_COL_ROWS, 1)),
    }[slot]


def problem_scale_geometry(problem, slot: str) -> BlockwiseScaleGeometry:
    return scale_geometry(slot, n=problem.n, k=problem.k, num_experts=problem.num_experts)


def normalize_fp8_blockwise(ops, cfg, *, mode: str, n, b_dtype: Optional[torch.dtype], d_dtype, generate_dbias,
                            pointers: bool):
    """Validate an fp8_blockwise call; ``(problem, pack)`` as ``contract.normalize`` returns."""
    e4m3 = FP8_BLOCKWISE_DTYPE
    if ops.a.dtype != e4m3:
        raise DtypeError(f"a_tensor: recipe='fp8_blockwise' takes float8_e4m3fn A, got {C._fmt_dtype(ops.a.dtype)}")
    bd = ops.b.dtype if mode == "dense" else b_dtype
    if bd != e4m3:
        name = "b_tensor" if mode == "dense" else "b_dtype"
        raise DtypeError(f"{name}: recipe='fp8_blockwise' takes float8_e4m3fn B, got {C._fmt_dtype(bd)}")
    for slot in _REFUSED:
        if getattr(ops, slot) is not None:
            raise ValueError(f"{C.ARG_NAMES[slot]}: recipe='fp8_blockwise' has no {C.ARG_NAMES[slot]}, got a "
                             f"{type(getattr(ops, slot)).__name__}")
    if cfg.round_dgrad_to_input_dtype:
        raise ValueError("round_dgrad_to_input_dtype: recipe='fp8_blockwise' does not round the gradient to its FP8 "
                         "input dtype, got True")
    if cfg.use_single_group_runtime_offsets or cfg.discrete_col_sfd or cfg.sf_fp8_dtype_override is not None:
        raise ValueError("use_single_group_runtime_offsets/discrete_col_sfd/sf_fp8_dtype_override: block-scaled "
                         "options; recipe='fp8_blockwise' takes none of them")
    if cfg.epilogue_op not in (None, "none", "identity"):
        raise ValueError(f"epilogue_op: recipe='fp8_blockwise' takes no epilogue_op, got {cfg.epilogue_op!r}")
    if cfg.sf_vec_size != 16 or cfg.vector_f32:  # the block shapes are the recipe's; no packed-f32 form
        raise ValueError(f"sf_vec_size/vector_f32: block-scaled options; recipe='fp8_blockwise' takes neither (keep "
                         f"16 and False), got {cfg.sf_vec_size!r} and {cfg.vector_f32!r}")
    if mode == "dense" and ops.sfb_ptrs is not None:
        raise ValueError("sfb_ptrs: dense mode (b_tensor) takes sfb_tensor, not sfb_ptrs")
    if mode == "discrete" and ops.sfb is not None:
        raise ValueError("sfb_tensor: discrete mode (b_ptrs) takes sfb_ptrs, not sfb_tensor")
    sfa = C.require_tensor("sfa_tensor", ops.sfa)
    sfb = C.require_tensor("sfb_tensor", ops.sfb) if mode == "dense" else None
    sfb_ptrs = C.pointer_table("sfb_ptrs", ops.sfb_ptrs, pointers) if mode == "discrete" else None

    d_is = ops.d_row.dtype if ops.d_row is not None else d_dtype
    if d_is is not None and d_is not in C.CD_DTYPES + (e4m3,):
        raise DtypeError(f"{'d_row_tensor' if ops.d_row is not None else 'd_dtype'}: recipe='fp8_blockwise' takes a "
                         f"bfloat16, float16, float32 or float8_e4m3fn D, got {C._fmt_dtype(d_is)}")
    fp8_d = d_is == e4m3
    if fp8_d and ops.activation is not None:
        raise ValueError("activation_tensor: the activation output needs a bfloat16 D, got a float8_e4m3fn D")
    if not fp8_d:
        for slot in _FP8_D_SLOTS:
            if getattr(ops, slot) is not None:
                raise ValueError(f"{C.ARG_NAMES[slot]}: only an FP8 D (float8_e4m3fn) has {C.ARG_NAMES[slot]} under "
                                 f"recipe='fp8_blockwise'")
    inner = dataclasses.replace(ops, d_row=None, d_col=None, sfd_row=None, sfd_col=None) if fp8_d else ops
    problem, pack = normalize_bf16(inner, cfg, mode=mode, n=n, b_dtype=b_dtype,
                                   d_dtype=torch.float32 if fp8_d else d_dtype, generate_dbias=generate_dbias,
                                   pointers=pointers, family=RECIPE, ab_dtype=e4m3, k_multiple=K_BLOCK)
    m = pack["a"].shape[0]
    if fp8_d:
        problem, outs = _fp8_d(ops, problem, m)
        if pointers:
            for slot, t in outs.items():
                C.check_aligned(C.ARG_NAMES[slot], t)
        pack.update(outs)
    extra: Dict[str, Any] = {"sfa": problem_scale_geometry(problem, "sfa").view(sfa, m, "sfa_tensor")}
    if mode == "dense":
        extra["sfb"] = problem_scale_geometry(problem, "sfb").view(sfb, m, "sfb_tensor")
    else:
        if tuple(sfb_ptrs.shape) != (problem.num_experts,):
            raise ValueError(f"sfb_ptrs: shape must be (L,) = ({problem.num_experts},), got {tuple(sfb_ptrs.shape)}")
        extra["sfb_ptrs"] = sfb_ptrs
    C.check_same_device({**{C.ARG_NAMES[s]: t for s, t in extra.items()}, "a_tensor": pack["a"],
                         **{C.ARG_NAMES[s]: pack[s] for s in _FP8_D_SLOTS + ("d_row",) if fp8_d and s in pack}})
    if pointers:
        for slot, t in extra.items():
            C.check_aligned(C.ARG_NAMES[slot], t, 8 if slot == "sfb_ptrs" else 16)
    pack.update(extra)
    return problem, pack


def _fp8_d(ops, problem, m: int):
    """An e4m3 D: its rules, and (class API) the caller's D_row, D_col and their scales."""
    if problem.m_aligned % D_COL_ROWS:
        raise ValueError(f"m_aligned: an FP8 D under recipe='fp8_blockwise' needs m_aligned a multiple of "
                         f"{D_COL_ROWS} (D_col's {D_COL_ROWS}-row scale blocks stay within one expert), got "
                         f"{problem.m_aligned}")
    problem = dataclasses.replace(problem, d_dtype=FP8_BLOCKWISE_DTYPE)
    outs: Dict[str, Any] = {}
    if ops.d_row is None:  # the wrapper allocates all four
        return problem, outs
    given = [getattr(ops, slot) is not None for slot in _FP8_D_SLOTS]
    if not all(given):
        raise ValueError("d_col_tensor/sfd_row_tensor/sfd_col_tensor: an FP8 D under recipe='fp8_blockwise' comes "
                         "with all three, got " + ", ".join(C.ARG_NAMES[s] for s, g in zip(_FP8_D_SLOTS, given) if g)
                         + (" only" if any(given) else "none"))
    two_n = 2 * problem.n
    for slot in ("d_row", "d_col"):
        name = C.ARG_NAMES[slot]
        t = C.drop_unit_dims(name, C.require_tensor(name, getattr(ops, slot)), 2, "(M, 2N) or (M, 2N, 1)")
        C.check_dtype(name, t, (FP8_BLOCKWISE_DTYPE,))
        C.check_shape(name, t, (m, two_n), "(M, 2N)")
        C.check_row_major(name, t)
        outs[slot] = t
    for slot in ("sfd_row", "sfd_col"):
        outs[slot] = problem_scale_geometry(problem, slot).view(getattr(ops, slot), m, C.ARG_NAMES[slot])
    return problem, outs
