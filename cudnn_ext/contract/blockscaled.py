"""The block-scaled (MXFP8 / NVFP4) contract: the rules of the page's dtype table and its
"Additional Type Constraints", docs/vendor_contract.md §2 and 3.5, checked before anything is allocated.

Owns validation of block-scaled calls and the table of scale-factor geometries per slot; it
allocates nothing (the wrapper allocates outputs). Shares the small checks of ``contract``.
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from .. import activations
from ..activations import activation
from ..errors import DtypeError
from ..problem import BlockScaleConfig, DgluProblem
from ..quant.sf_layout import SfGeometry
from . import rules as C

E8M0 = getattr(torch, "float8_e8m0fnu", None)
E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
SF_DTYPES = tuple(d for d in (E8M0, E4M3) if d is not None)
FP8 = (E4M3, E5M2)
C_DTYPES = (torch.float32, torch.float16, torch.bfloat16, E4M3, E5M2)


#: The scale-factor slots, and the one table of which matrix each holds (docs/vendor_contract.md §2.2, 2.6):
#: SFA covers A's M rows x K (one group), SFB each expert's N rows x K, SFD_row D's M rows x
#: 2N columns in 32-column blocks, SFD_col D's 2N columns x M rows in 32-row blocks.
SF_SLOTS = ("sfa", "sfb", "sfd_row", "sfd_col")


def sf_geometry(slot: str, *, n: int, k: int, num_experts: int, sf_vec_size: int) -> SfGeometry:
    """The geometry of scale-factor slot ``slot`` (M left symbolic: ``None``)."""
    return {
        "sfa": SfGeometry(mn=None, k=k, sf_vec_size=sf_vec_size),
        "sfb": SfGeometry(mn=n, k=k, sf_vec_size=sf_vec_size, groups=num_experts),
        "sfd_row": SfGeometry(mn=None, k=2 * n, sf_vec_size=32),
        "sfd_col": SfGeometry(mn=2 * n, k=None, sf_vec_size=32),
    }[slot]


def problem_sf_geometry(problem: DgluProblem, slot: str) -> SfGeometry:
    return sf_geometry(slot, n=problem.n, k=problem.k, num_experts=problem.num_experts,
                       sf_vec_size=problem.block_scale.sf_vec_size)


def _check_sf(slot: str, t, geometry: SfGeometry, m: int, sf_dtype) -> torch.Tensor:
    """Dtype rule here; shape rule (6-D view or flat packed buffer) in ``quant.sf_layout``."""
    name = C.ARG_NAMES[slot]
    t = C.require_tensor(name, t)
    if t.dtype != sf_dtype:
        raise DtypeError(f"{name}: scale factors must all share one dtype ({C._fmt_dtype(sf_dtype)}, the dtype of "
                         f"sfa_tensor), got {C._fmt_dtype(t.dtype)}")
    return geometry.view(t, m, name)


def _check_scalars_with_vector_f32(cfg, act_func: str, alpha, beta) -> None:
    """A 16-bit alpha (dSwiGLU, dGeGLU) or beta (dSwiGLU) with ``vector_f32``: the vendor's
    packed-f32x2 epilogue builds fp32 pairs from the loaded scalars and does not compile for
    16-bit ones (docs/vendor_contract.md §3.5); dSiTU-GLU converts both to fp32 first."""
    if not cfg.vector_f32:
        return
    f32_only = activation(act_func).packed_f32_scalars
    for name, t in (("alpha_tensor", alpha), ("beta_tensor", beta)):
        if t.dtype != torch.float32 and name in f32_only:
            raise DtypeError(f"{name}: {C._fmt_dtype(t.dtype)} with vector_f32=True and act_func={act_func!r} is not "
                             "supported (the packed-f32x2 epilogue takes float32 alpha and beta); pass float32 "
                             "or vector_f32=False")


def normalize_block_scaled(ops, cfg, *, mode: str, n, b_dtype, d_dtype, generate_dbias,
                           pointers: bool = True):
    a = ops.a
    fp4 = a.dtype in C.FP4_DTYPES
    act = C.resolve_act(cfg, family=activations.BLOCK_SCALED)
    if cfg.epilogue_op in ("relu", "srelu"):
        raise NotImplementedError(f"epilogue_op: {cfg.epilogue_op!r} is not applied by any dGLU kernel (the vendor's "
                                  "accept it and silently ignore it); cudnn_ext refuses it rather than ignore it")
    if cfg.m_aligned != C.M_ALIGN:
        # D_col's scale factors cover 32-row blocks within 128-row atoms, and the block-scaled
        # engines walk 256-row blocks: an expert boundary inside one would mix two experts' rows
        raise ValueError(f"m_aligned: block-scaled (FP8/FP4) operands require m_aligned = {C.M_ALIGN}; "
                         f"values below {C.M_ALIGN} are for BF16 operands only, got {cfg.m_aligned!r}")
    if cfg.round_dgrad_to_input_dtype:
        raise ValueError("round_dgrad_to_input_dtype: round_dgrad_to_input_dtype is supported only by the BF16 "
                         "kernel, got True with block-scaled operands")
    if cfg.sf_fp8_dtype_override is not None:
        raise NotImplementedError(f"sf_fp8_dtype_override: {cfg.sf_fp8_dtype_override!r} exists only on Rubin "
                                  "(sm_107), which no engine here targets")
    if cfg.sf_vec_size not in (16, 32):
        raise ValueError(f"sf_vec_size: must be 16 or 32, got {cfg.sf_vec_size!r}")
    sfa = C.require_tensor("sfa_tensor", ops.sfa)
    sf_dtype = sfa.dtype
    if sf_dtype not in SF_DTYPES:
        hint = ("; float32 scales per 1x128 block are cudnn_ext's fp8_blockwise recipe: pass "
                "recipe='fp8_blockwise'" if sf_dtype == torch.float32 else "")
        raise DtypeError(f"sfa_tensor: scale-factor dtype must be one of {C._dtypes(SF_DTYPES)}, got "
                         f"{C._fmt_dtype(sf_dtype)}{hint}")
    if sf_dtype == E4M3 and cfg.sf_vec_size != 16:
        raise ValueError(f"sf_vec_size: float8_e4m3fn scale factors require sf_vec_size=16, got {cfg.sf_vec_size}")
    if not fp4 and cfg.sf_vec_size != 32:
        raise ValueError(f"sf_vec_size: FP8 operands require sf_vec_size=32 (MXFP8), got {cfg.sf_vec_size}")

    a2 = C.drop_unit_dims("a_tensor", a, 2, "(M, K) or (M, K, 1)")
    C.check_row_major("a_tensor", a2)
    m, k_phys = a2.shape
    k = 2 * k_phys if fp4 else k_phys

    def geometry(slot):
        return sf_geometry(slot, n=n, k=k, num_experts=num_experts, sf_vec_size=cfg.sf_vec_size)

    if m % C.M_ALIGN:
        raise ValueError(f"a_tensor: M (rows) must be a multiple of {C.M_ALIGN}, got M = {m} (m_aligned = {C.M_ALIGN})")
    if k <= 0 or k % 32:
        raise ValueError(f"a_tensor: logical K must be a positive multiple of 32 (16-byte rows), got K = {k}")

    pack: Dict[str, Any] = {"a": a2}
    if mode == "dense":
        b = ops.b
        b_major = C.dense_b_major(b, k_phys, allow_n_major=not fp4, rule=" (FP4 must be K-major)" if fp4 else "")
        n, _, num_experts = b.shape
        pack["b"] = b
        sfb = C.require_tensor("sfb_tensor", ops.sfb)
        if ops.sfb_ptrs is not None:
            raise ValueError("sfb_ptrs: dense mode (b_tensor) takes sfb_tensor, not sfb_ptrs")
        pack["sfb"] = _check_sf("sfb", sfb, geometry("sfb"), m, sf_dtype)
    else:
        bp = C.pointer_table("b_ptrs", ops.b_ptrs, pointers)
        num_experts = bp.shape[0]
        if b_dtype != a.dtype and not (fp4 and b_dtype in C.FP4_DTYPES):
            raise DtypeError(f"b_dtype: must match a_tensor's dtype {C._fmt_dtype(a.dtype)}, "
                             f"got {C._fmt_dtype(b_dtype)}")
        if fp4 and cfg.b_major != "k":
            raise ValueError(f"b_major: FP4 weights must be K-major ('k'), got {cfg.b_major!r}")
        b_major = cfg.b_major
        sp = C.pointer_table("sfb_ptrs", ops.sfb_ptrs, pointers)
        if tuple(sp.shape) != (num_experts,):
            raise ValueError(f"sfb_ptrs: shape must be (L,) = ({num_experts},), got {tuple(sp.shape)}")
        if ops.sfb is not None:
            raise ValueError("sfb_tensor: discrete mode (b_ptrs) takes sfb_ptrs, not sfb_tensor")
        pack["b_ptrs"], pack["sfb_ptrs"] = bp, sp
    C.check_n("b_tensor" if mode == "dense" else "n", n)
    C.check_expert_count("b_tensor" if mode == "dense" else "b_ptrs", num_experts)
    if cfg.use_single_group_runtime_offsets and num_experts != 1:
        raise ValueError(f"use_single_group_runtime_offsets: requires exactly one expert, got L = {num_experts}")
    two_n = 2 * n
    pack["sfa"] = _check_sf("sfa", sfa, geometry("sfa"), m, sf_dtype)

    c = C.drop_unit_dims("c_tensor", C.require_tensor("c_tensor", ops.c), 2, "(M, 2N) or (M, 2N, 1)")
    C.check_dtype("c_tensor", c, C_DTYPES)
    C.check_shape("c_tensor", c, (m, two_n), "(M, 2N)")
    C.check_row_major("c_tensor", c)
    if c.dtype in FP8 and cfg.vector_f32:
        raise ValueError("vector_f32: FP8 c_tensor is not supported with vector_f32=True")
    pack["c"] = c

    d_allowed = (torch.bfloat16, torch.float16, torch.float32) if fp4 else FP8
    if ops.d_row is not None:
        d = C.drop_unit_dims("d_row_tensor", ops.d_row, 2, "(M, 2N) or (M, 2N, 1)")
        C.check_shape("d_row_tensor", d, (m, two_n), "(M, 2N)")
        C.check_row_major("d_row_tensor", d)
        d_dtype = d.dtype
        pack["d_row"] = d
    elif d_dtype is None:
        d_dtype = torch.bfloat16 if fp4 else E4M3
    if d_dtype not in d_allowed:
        raise DtypeError(f"d_dtype: {'FP4' if fp4 else 'FP8'} operands require D in {C._dtypes(d_allowed)}, got "
                         f"{C._fmt_dtype(d_dtype)}")

    # quantized outputs: generated iff FP8 operands, e8m0 scales and FP8 D (docs/vendor_contract.md §2.6)
    sfd_given = [ops.sfd_row is not None, ops.sfd_col is not None, ops.norm_const is not None]
    wrapper_call = ops.d_row is None
    can_sfd = (not fp4) and sf_dtype == E8M0 and d_dtype in FP8
    if wrapper_call:
        generate_sfd = can_sfd
        if generate_sfd and ops.norm_const is None:
            raise ValueError("norm_const_tensor: required for FP8 operands with e8m0 scales (it scales the quantized "
                             "D_row/D_col outputs), got None")
    else:
        if any(sfd_given) and not all(sfd_given):
            raise ValueError("sfd_row_tensor/sfd_col_tensor/norm_const_tensor: must be all None or all given")
        generate_sfd = all(sfd_given)
        if generate_sfd and not can_sfd:
            raise ValueError("sfd_row_tensor: quantized outputs need FP8 operands, e8m0 scale factors and FP8 D, got "
                             f"{C._fmt_dtype(a.dtype)} operands, {C._fmt_dtype(sf_dtype)} scales, D {C._fmt_dtype(d_dtype)}")
    if generate_sfd and d_dtype == E5M2:
        raise NotImplementedError("d_dtype: float8_e5m2 D with scale-factor generation is not supported (the vendor "
                                  "kernel packs e4m3 only); use float8_e4m3fn")
    if cfg.discrete_col_sfd and not generate_sfd:
        raise ValueError("discrete_col_sfd: needs quantized outputs (FP8 operands, e8m0 scales, FP8 D with SFD), "
                         "which this call does not generate")
    if ops.norm_const is not None:
        nc = C.require_tensor("norm_const_tensor", ops.norm_const)
        C.check_dtype("norm_const_tensor", nc, (torch.float32,))
        C.check_shape("norm_const_tensor", nc.reshape(-1) if nc.dim() == 0 else nc, (1,), "(1,)")
        if generate_sfd:  # otherwise nothing reads it (vendor: ignored), so no slot binds it
            pack["norm_const"] = nc.reshape(1)
    if not wrapper_call and generate_sfd:
        dcol = C.drop_unit_dims("d_col_tensor", C.require_tensor("d_col_tensor", ops.d_col), 2, "(M, 2N)")
        if dcol.dtype != d_dtype:
            raise DtypeError(f"d_col_tensor: must have D_row's dtype {C._fmt_dtype(d_dtype)}, "
                             f"got {C._fmt_dtype(dcol.dtype)}")
        C.check_shape("d_col_tensor", dcol, (m, two_n), "(M, 2N)")
        C.check_row_major("d_col_tensor", dcol)
        pack["d_col"] = dcol
        pack["sfd_row"] = _check_sf("sfd_row", ops.sfd_row, geometry("sfd_row"), m, E8M0)
        pack["sfd_col"] = _check_sf("sfd_col", ops.sfd_col, geometry("sfd_col"), m, E8M0)

    if ops.activation is not None:  # cudnn_ext's extension: the vendor has none with block-scaled operands
        if d_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError("activation_tensor: activation output is supported only by the BF16 kernel in the "
                             "vendor's contract; cudnn_ext stores it with block-scaled operands and a 16-bit D, got "
                             f"D {C._fmt_dtype(d_dtype)}")
        pack["activation"] = C.activation_view(ops, m, n)

    # amax: wrapper generates it for bf16/fp16 D; class API iff a sample is given
    generate_amax = (d_dtype in (torch.bfloat16, torch.float16)) if wrapper_call else ops.amax is not None
    if ops.amax is not None:
        am = C.drop_unit_dims("amax_tensor", ops.amax, 2, "(L, 2) or (L, 2, 1)")
        C.check_dtype("amax_tensor", am, (torch.float32,))
        C.check_shape("amax_tensor", am, (num_experts, 2), "(L, 2)")
        C.check_row_major("amax_tensor", am)
        pack["amax"] = am

    pack.update(C.per_expert_vectors(ops, num_experts, "block_scaled"))
    _check_scalars_with_vector_f32(cfg, act.act_func, pack["alpha"], pack["beta"])
    pack.update(C.prob_vectors(ops, m, required=False))  # optional here: p = 1, no dprob
    db = C.dbias_view(ops, num_experts, two_n, generate_dbias)
    if db is not None:
        pack["dbias"] = db
        generate_dbias = True
    generate_dbias = bool(generate_dbias)
    if fp4 and cfg.sf_vec_size == 16 and d_dtype == torch.float32 and not generate_dbias:
        raise NotImplementedError("d_dtype: FP4 operands with sf_vec_size=16 and float32 D are supported only with "
                                  "dbias generation (vendor kernel restriction)")

    device = C.check_same_device({C.ARG_NAMES[s]: t for s, t in pack.items()})
    for slot in ("a", "c", "d_row", "d_col", "b"):
        if pointers and slot in pack:
            C.check_aligned(C.ARG_NAMES[slot], pack[slot])
    if pointers and "activation" in pack:
        C.check_aligned("activation_tensor", pack["activation"])
    problem = DgluProblem(
        n=n, k=k, num_experts=num_experts, m=m, weight_mode=mode, b_major=b_major, ab_dtype=a.dtype,
        c_dtype=c.dtype, d_dtype=d_dtype, act=act, generate_dbias=generate_dbias,
        has_prob="prob" in pack, has_dprob="dprob" in pack, use_dynamic_sched=cfg.use_dynamic_sched,
        generate_activation="activation" in pack, deterministic=cfg.deterministic,
        block_scale=BlockScaleConfig(sf_dtype=sf_dtype, sf_vec_size=cfg.sf_vec_size, generate_sfd=generate_sfd,
                                     discrete_col_sfd=cfg.discrete_col_sfd, generate_amax=generate_amax,
                                     single_group_runtime_offsets=cfg.use_single_group_runtime_offsets,
                                     alpha_dtype=pack["alpha"].dtype,
                                     beta_dtype=pack["beta"].dtype),
        device_type=device.type, device_index=device.index,
    )
    return problem, pack
