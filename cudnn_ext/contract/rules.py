"""The contract's rules: the checks both operand families share (typed errors that name the
argument, the value seen and the rule), the call's configuration (``CallConfig``, the one place
the vendor's keywords become a configuration) and its operands (``Operands``). Imports only
the leaf modules (``problem``, ``quant``)."""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

import torch

from ..errors import DtypeError
from .. import activations
from ..problem import ActConfig

BF16 = torch.bfloat16
CD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_EXPERTS = 1024
#: ``m_aligned``'s default and the vendor's only value (its page: "m_aligned must be 256"): M
#: and every ``padded_offsets`` entry are multiples of it. Block-scaled operands keep it.
M_ALIGN = 256
#: The ``m_aligned`` values BF16 operands take, a cudnn_ext extension of the vendor contract
#: (docs/vendor_contract.md §3.2): routers hand experts groups of any size (1: no alignment,
#: TorchTitan's own layout) or aligned to 8 rows, and padding every group to 256 rows computes
#: up to 255 extra rows per expert.
M_ALIGNED_CHOICES = (1, 8, 16, 32, 64, 128, 256)

#: dtypes of the block-scaled family (FP8, FP4 as packed pairs).
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
FP4_DTYPES = tuple(getattr(torch, n) for n in ("float4_e2m1fn_x2",) if hasattr(torch, n)) + (torch.uint8,)
BLOCK_SCALED_DTYPES = FP8_DTYPES + FP4_DTYPES


def _fmt_dtype(dt) -> str:
    return str(dt).replace("torch.", "")


def _dtypes(allowed) -> str:
    return "{" + ", ".join(_fmt_dtype(d) for d in allowed) + "}"


# --------------------------------------------------------------------------- small checks
def require_tensor(name: str, t: Any) -> torch.Tensor:
    if t is None:
        raise ValueError(f"{name}: a tensor is required, got None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def check_strided(name: str, t: torch.Tensor) -> None:
    """Sparse and mkldnn tensors have no data pointer a kernel could read."""
    if t.layout != torch.strided:
        raise TypeError(f"{name}: must be a dense (strided) tensor, got layout {t.layout}")


def check_dtype(name: str, t: torch.Tensor, allowed) -> None:
    if t.dtype not in allowed:
        raise DtypeError(f"{name}: dtype must be one of {_dtypes(allowed)}, got {_fmt_dtype(t.dtype)}")


def drop_unit_dims(name: str, t: torch.Tensor, rank: int, shape_rule: str) -> torch.Tensor:
    """View ``t`` as rank ``rank`` by removing trailing unit dims (``(M,K,1)`` -> ``(M,K)``)."""
    while t.dim() > rank and t.shape[-1] == 1:
        t = t[..., 0]
    if t.dim() != rank:
        raise ValueError(f"{name}: shape must be {shape_rule}, got {tuple(t.shape)}")
    return t


def check_shape(name: str, t: torch.Tensor, expected: Tuple[int, ...], rule: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: shape must be {rule} = {tuple(expected)}, got {tuple(t.shape)}")


def check_row_major(name: str, t: torch.Tensor) -> None:
    """Innermost dim contiguous and rows packed: stride (cols, 1) for a 2-D view."""
    if t.numel() == 0:
        return
    rows, cols = t.shape[-2], t.shape[-1]
    if t.stride(-1) != 1 or (rows > 1 and t.stride(-2) != cols):
        raise ValueError(f"{name}: must be row-major with stride ({cols}, 1) along its last two dims "
                         f"(the contiguous dim last), got stride {tuple(t.stride())}")


def check_contiguous_1d(name: str, t: torch.Tensor) -> None:
    if t.numel() > 1 and t.stride(0) != 1:
        raise ValueError(f"{name}: must be contiguous (stride 1), got stride {tuple(t.stride())}")


def check_aligned(name: str, t: torch.Tensor, nbytes: int = 16) -> None:
    if t.numel() and t.data_ptr() % nbytes:
        raise ValueError(f"{name}: data pointer must be {nbytes}-byte aligned, got address 0x{t.data_ptr():x}")


#: The slots a call writes; every other slot is read.
OUTPUT_SLOTS = frozenset({"d_row", "d_col", "dprob", "dbias", "activation", "sfd_row", "sfd_col", "amax"})


def byte_range(t: torch.Tensor) -> Optional[Tuple[int, int]]:
    """[first byte, one past the last byte) that ``t``'s elements can touch; None if empty."""
    if t.numel() == 0:
        return None
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


def check_outputs_apart(pack: Dict[str, Any]) -> None:
    """No output shares a byte with another operand, input or output: the kernels read inputs
    while they write outputs, in no order a caller can rely on (docs/vendor_contract.md §3.4,
    where the vendor refuses it for the activation output). Metadata only."""
    check_spans_apart([r + (slot,) for slot, t in pack.items()  # meta tensors (declarations) have no bytes
                       if isinstance(t, torch.Tensor) and not t.is_meta and (r := byte_range(t)) is not None])


def check_spans_apart(spans) -> None:
    """``check_outputs_apart`` on (first byte, end, slot) spans (a remembered call's, whose
    lengths its metadata fixed)."""
    spans = sorted(spans)
    for i, (b0, e0, s0) in enumerate(spans):
        for b1, e1, s1 in spans[i + 1:]:
            if b1 >= e0:  # sorted by first byte: no later span reaches back into this one
                break
            if s0 in OUTPUT_SLOTS or s1 in OUTPUT_SLOTS:
                (ob, oe, out), (xb, xe, other) = ((b0, e0, s0), (b1, e1, s1)) if s0 in OUTPUT_SLOTS \
                    else ((b1, e1, s1), (b0, e0, s0))
                what = "activation output" if out == "activation" else "an output"
                raise ValueError(f"{ARG_NAMES[out]}: {what} must not overlap {ARG_NAMES[other]} "
                                 f"({ARG_NAMES[out]} [0x{ob:x}, 0x{oe:x}), {ARG_NAMES[other]} [0x{xb:x}, 0x{xe:x}))")


def check_same_device(tensors: Dict[str, Optional[torch.Tensor]]) -> torch.device:
    ref_name, ref = None, None
    for name, t in tensors.items():
        if t is None:
            continue
        if ref is None:
            ref_name, ref = name, t.device
        elif t.device != ref:
            raise ValueError(f"{name}: must be on the same device as {ref_name} ({ref}), got {t.device}")
    return ref


def check_d_dtype(d_dtype) -> None:
    """D's dtype when the caller gives a dtype instead of a D tensor (BF16 contract)."""
    if d_dtype not in CD_DTYPES:
        raise DtypeError(f"d_dtype: must be one of {_dtypes(CD_DTYPES)}, got "
                         f"{_fmt_dtype(d_dtype) if isinstance(d_dtype, torch.dtype) else d_dtype!r}")


def check_float_type(name: str, v) -> None:
    """A Python number for a float argument (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(v).__name__}")


def check_finite(name: str, v, *, positive: bool = False) -> float:
    check_float_type(name, v)
    v = float(v)
    if not math.isfinite(v) or (positive and v <= 0):
        rule = "finite and > 0" if positive else "finite"
        raise ValueError(f"{name}: must be {rule}, got {v}")
    return v


def check_expert_count(name: str, num_experts: int) -> None:
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"{name}: expert count L must be in [1, {MAX_EXPERTS}], got L = {num_experts}")


def check_n(name: str, n: int) -> None:
    if n <= 0 or n % 32:
        raise ValueError(f"{name}: N must be a positive multiple of 32 (32-column gate/up blocks), got N = {n}")


#: alpha's and beta's dtypes per operand family (docs/vendor_contract.md §3.3, §3.5): the BF16
#: kernel checks fp32; the block-scaled one checks their shape only and loads them in their own
#: dtype, which cudnn_ext bounds to the float types it defines the results of.
SCALAR_DTYPES = {"bf16": (torch.float32,), "block_scaled": (torch.float32, torch.bfloat16, torch.float16)}
_SCALAR_RULES = {
    "bf16": "BF16 operands take float32 alpha and beta, the BF16 kernel's rule; block-scaled operands "
            "also take bfloat16 and float16",
    "block_scaled": "block-scaled operands take float32, bfloat16 or float16 alpha and beta",
}


def per_expert_vectors(ops, num_experts: int, family: str = "bf16") -> Dict[str, torch.Tensor]:
    """padded_offsets (int32) and alpha/beta (``SCALAR_DTYPES[family]``): (L,), packed
    (stride 1): kernels index them."""
    out = {}
    for slot, allowed in (("padded_offsets", (torch.int32,)), ("alpha", SCALAR_DTYPES[family]),
                          ("beta", SCALAR_DTYPES[family])):
        name = ARG_NAMES[slot]
        t = require_tensor(name, getattr(ops, slot))
        if t.dtype not in allowed:
            rule = "" if slot == "padded_offsets" else f" ({_SCALAR_RULES[family]})"
            raise DtypeError(f"{name}: dtype must be one of {_dtypes(allowed)}, got {_fmt_dtype(t.dtype)}{rule}")
        check_shape(name, t, (num_experts,), "(L,)")
        check_contiguous_1d(name, t)
        out[slot] = t
    return out


def dense_b_major(b: torch.Tensor, k_stored: int, *, allow_n_major: bool = True, rule: str = "") -> str:
    """Dense B (N, K, L): 'k' for stride (K, 1, N*K), 'n' for (1, N, N*K); the expert stride
    must be N*K either way (kernels address expert e at e*N*K)."""
    if b.dim() != 3:
        raise ValueError(f"b_tensor: shape must be (N, K, L), got {tuple(b.shape)}")
    n, kb, num_experts = b.shape
    check_expert_count("b_tensor", num_experts)
    if kb != k_stored:
        hint = ""
        if b.shape[2] == k_stored:  # the torch habit of stacking experts first
            hint = ("; dense weights are (N, K, L), one (N, K) matrix per expert along the last dim: "
                    "an (L, N, K) stack w is passed as w.permute(1, 2, 0)")
        raise ValueError(f"b_tensor: K must equal a_tensor's K = {k_stored}, got shape {tuple(b.shape)}{hint}")
    packed = num_experts == 1 or b.stride(2) == n * kb
    if b.numel() and packed and b.stride(1) == 1 and (n == 1 or b.stride(0) == kb):
        return "k"
    if allow_n_major and b.numel() and packed and b.stride(0) == 1 and (kb == 1 or b.stride(1) == n):
        return "n"
    allowed = f"K-major ({kb}, 1, {n * kb})" + (f" or N-major (1, {n}, {n * kb})" if allow_n_major else "")
    raise ValueError(f"b_tensor: stride must be {allowed}{rule} for shape {tuple(b.shape)}, got {tuple(b.stride())}")


def pointer_table(name: str, t, pointers: bool = True) -> torch.Tensor:
    """A per-expert pointer table: (L,) int64, contiguous, 8-byte aligned (``pointers``: its
    address checked, see ``normalize``)."""
    t = require_tensor(name, t)
    check_dtype(name, t, (torch.int64,))
    if t.dim() != 1:
        raise ValueError(f"{name}: shape must be (L,), got {tuple(t.shape)}")
    check_contiguous_1d(name, t)
    if pointers:
        check_aligned(name, t, 8)
    return t


def activation_view(ops, m: int, n: int) -> torch.Tensor:
    """The caller's activation output: (M, N) or (M, N, 1) bf16, row-major; its (M, N) view."""
    av = drop_unit_dims("activation_tensor", ops.activation, 2, "(M, N) or (M, N, 1)")
    check_dtype("activation_tensor", av, (BF16,))
    check_shape("activation_tensor", av, (m, n), "(M, N)")
    check_row_major("activation_tensor", av)
    return av


def prob_vectors(ops, m: int, *, required: bool) -> Dict[str, torch.Tensor]:
    """prob and dprob: fp32 (M,) or (M, 1, 1); dprob packed (it is accumulated into)."""
    out = {}
    for slot in ("prob", "dprob"):
        t = getattr(ops, slot)
        if t is None and not required:
            continue
        name = ARG_NAMES[slot]
        t = require_tensor(name, t)
        check_dtype(name, t, (torch.float32,))
        v = drop_unit_dims(name, t, 1, "(M,) or (M, 1, 1)")
        check_shape(name, v, (m,), "(M,)")
        # both contiguous: the kernels read prob by raw pointer as M consecutive floats (a
        # column of a top-k routing matrix, prob[:, k], needs .contiguous() first)
        check_contiguous_1d(name, v)
        out[slot] = v
    return out


def dbias_view(ops, num_experts: int, two_n: int, generate_dbias: Optional[bool]) -> Optional[torch.Tensor]:
    """The caller's dbias (L, 2N[, 1]) bf16 row-major, or None; refused when dbias is not generated."""
    if ops.dbias is None:
        return None
    if generate_dbias is False:
        raise ValueError("dbias_tensor: must be omitted when dbias is not generated "
                         "(the plan was built without sample_dbias / generate_dbias=False)")
    db = drop_unit_dims("dbias_tensor", ops.dbias, 2, "(L, 2N) or (L, 2N, 1)")
    check_dtype("dbias_tensor", db, (BF16,))
    check_shape("dbias_tensor", db, (num_experts, two_n), "(L, 2N)")
    check_row_major("dbias_tensor", db)
    return db


def check_m_aligned(v) -> int:
    """``m_aligned`` as an int: one of ``M_ALIGNED_CHOICES`` (the family's rule, block-scaled
    operands keeping ``M_ALIGN``, is checked by the family)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"m_aligned: expected an int, one of {list(M_ALIGNED_CHOICES)}, got "
                        f"{type(v).__name__} {v!r}")
    if v not in M_ALIGNED_CHOICES:
        raise ValueError(f"m_aligned: must be one of {list(M_ALIGNED_CHOICES)} (M and every padded_offsets "
                         f"entry are multiples of it), got {v!r}")
    return int(v)


def check_choice(name: str, v, choices) -> None:
    if v not in choices:
        raise ValueError(f"{name}: must be one of {list(choices)}, got {v!r}")


# --------------------------------------------------------------------------- scalar config
@dataclass(frozen=True)
class CallConfig:
    """The scalar (non-tensor) arguments of a call, as the vendor names them."""

    act_func: str = "dswiglu"
    linear_offset: Optional[float] = None
    geglu_alpha: float = 1.702
    glu_clamp_max: float = 7.0
    glu_clamp_min: float = -7.0
    situ_beta1: float = 4.0
    situ_beta2: float = 25.0
    b_major: str = "k"
    acc_dtype: Optional[torch.dtype] = None
    cd_major: str = "n"
    mma_tiler_mn: Tuple[int, int] = (256, 256)
    cluster_shape_mn: Optional[Tuple[int, int]] = None
    sf_vec_size: int = 16
    sf_fp8_dtype_override: Optional[str] = None
    vector_f32: bool = False
    m_aligned: int = 256
    discrete_col_sfd: bool = False
    epilogue_op: Optional[str] = None
    use_dynamic_sched: bool = False
    use_single_group_runtime_offsets: bool = False
    round_dgrad_to_input_dtype: bool = False
    deterministic: bool = False
    #: None (the vendor's operand families), or a cudnn_ext recipe of :data:`RECIPES`
    recipe: Optional[str] = None

    @classmethod
    def of(cls, kwargs: Dict[str, Any]) -> "CallConfig":
        """The configuration in a call's vendor keywords (``kwargs`` may hold the tensors and
        other arguments too: only this type's fields are read, ``_deterministic`` being the
        class API's spelling of ``deterministic``). The one place vendor keywords become a
        configuration."""
        if "_deterministic" in kwargs:
            kwargs = {**kwargs, "deterministic": kwargs["_deterministic"]}
        return cls(**{f.name: kwargs[f.name] for f in fields(cls) if f.name in kwargs})

    def __hash__(self) -> int:
        # Computed once per instance: the torch op's memo key holds this config and is hashed
        # on every eager call; the generated hash rebuilds a 22-field tuple each time (about
        # 1.5 us of host time per call). Equality stays the generated field-wise one.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        # never carry the cached hash across processes: str hashes are salted per process
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state


def resolve_act(cfg: CallConfig, *, family: str) -> ActConfig:
    """The call's activation, checked against its operand contract ``family`` (an
    ``activations.CONTRACTS`` name)."""
    rec = activations.activation(cfg.act_func)
    if family not in rec.contracts:
        where = {activations.BF16: "BF16 operands", activations.BLOCK_SCALED: "the block-scaled contract (FP8/FP4 operands)",
                 activations.FP8_BLOCKWISE: "the fp8_blockwise recipe"}
        got = {activations.BF16: "BF16 operands", activations.BLOCK_SCALED: "block-scaled operands",
               activations.FP8_BLOCKWISE: "the fp8_blockwise recipe"}[family]
        raise ValueError(f"act_func: {cfg.act_func!r} is supported by "
                         f"{' and '.join(where[c] for c in activations.CONTRACTS if c in rec.contracts)} only, got it "
                         f"with {got}")
    lo = rec.default_linear_offset if cfg.linear_offset is None else check_finite("linear_offset", cfg.linear_offset)
    alpha = check_finite("geglu_alpha", cfg.geglu_alpha, positive=True)
    cmax = check_finite("glu_clamp_max", cfg.glu_clamp_max)
    cmin = check_finite("glu_clamp_min", cfg.glu_clamp_min)
    if not cmin < cmax:
        raise ValueError(f"glu_clamp_min/glu_clamp_max: need glu_clamp_min < glu_clamp_max, got {cmin} and {cmax}")
    b1 = check_finite("situ_beta1", cfg.situ_beta1, positive=True)
    b2 = check_finite("situ_beta2", cfg.situ_beta2, positive=True)
    return ActConfig(act_func=cfg.act_func, geglu_alpha=alpha, clamp_max=cmax, clamp_min=cmin,
                     linear_offset=lo, situ_beta1=b1, situ_beta2=b2,
                     dgeglu_applies_beta=family in activations.DGEGLU.beta_scales_c)


#: cudnn_ext's operand recipes beyond the vendor contract (``recipe=``): FP8 e4m3 operands with
#: fp32 scales per 1x128 (A) and 128x128 (B) block, DeepSeek-V3's (``cudnn_ext.quant.blockwise``)
RECIPES = ("fp8_blockwise",)


def check_common_config(cfg: CallConfig) -> None:
    if cfg.recipe is not None:
        check_choice("recipe", cfg.recipe, RECIPES)
    check_choice("b_major", cfg.b_major, ("k", "n"))
    check_choice("cd_major", cfg.cd_major, ("n",))
    if cfg.acc_dtype not in (None, torch.float32):
        raise DtypeError(f"acc_dtype: must be float32 (or None), got {cfg.acc_dtype}")
    check_m_aligned(cfg.m_aligned)
    tile = tuple(cfg.mma_tiler_mn) if isinstance(cfg.mma_tiler_mn, (tuple, list)) else None
    if (tile is None or len(tile) != 2 or any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in tile)
            or tile[0] not in (128, 256) or tile[1] % 32 or not 32 <= tile[1] <= 256):
        raise ValueError("mma_tiler_mn: must be (TileM, TileN) with TileM in {128, 256} and TileN a multiple "
                         f"of 32 in [32, 256], got {cfg.mma_tiler_mn!r}")
    if cfg.cluster_shape_mn is not None:
        cl = tuple(cfg.cluster_shape_mn) if isinstance(cfg.cluster_shape_mn, (tuple, list)) else ()
        bad = any(isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1 or x & (x - 1)
                  for x in cl)
        if len(cl) != 2 or bad or cl[0] * cl[1] > 16 or (tile[0] == 256 and cl[0] % 2):
            raise ValueError("cluster_shape_mn: must be two powers of two with product <= 16 (cluster M even "
                             f"when TileM is 256), got {cfg.cluster_shape_mn!r}")
    for flag in ("vector_f32", "discrete_col_sfd", "use_dynamic_sched", "use_single_group_runtime_offsets",
                 "round_dgrad_to_input_dtype", "deterministic"):
        if not isinstance(getattr(cfg, flag), bool):
            raise TypeError(f"{flag}: expected a bool, got {type(getattr(cfg, flag)).__name__}")
    if cfg.epilogue_op not in (None, "none", "identity", "relu", "srelu"):
        raise ValueError(f"epilogue_op: must be None, 'identity', 'relu' or 'srelu', got {cfg.epilogue_op!r}")


def check_bf16_config(cfg: CallConfig, scale_controls: Dict[str, Any]) -> None:
    """Rules only the BF16 contract has: no scale controls, no block-scaled-only options."""
    for name, value in scale_controls.items():
        if value is not None:
            raise ValueError(f"{name}: BF16 operands forbid block-scale control {name}, got a "
                             f"{type(value).__name__} (pass None)")
    if cfg.sf_vec_size != 16:
        raise ValueError(f"sf_vec_size: BF16 operands forbid block-scale control sf_vec_size; keep 16, got {cfg.sf_vec_size!r}")
    if cfg.sf_fp8_dtype_override is not None:
        raise ValueError(f"sf_fp8_dtype_override: BF16 operands forbid it, got {cfg.sf_fp8_dtype_override!r}")
    if cfg.discrete_col_sfd:
        raise ValueError("discrete_col_sfd: BF16 operands forbid block-scale control discrete_col_sfd, got True")
    if cfg.epilogue_op not in (None, "none", "identity"):
        raise ValueError(f"epilogue_op: BF16 operands forbid a non-identity epilogue_op, got {cfg.epilogue_op!r}")
    if cfg.use_single_group_runtime_offsets:
        raise ValueError("use_single_group_runtime_offsets: use_single_group_runtime_offsets is supported only by "
                         "the block-scaled kernel, got True with BF16 operands")


def operand_family(a: torch.Tensor, b_dtype: torch.dtype, b_name: str = "b_tensor") -> str:
    """'bf16' or 'block_scaled'; raises on mixed or unsupported pairs (before anything else).

    ``b_name`` is the argument that carried B's dtype: ``b_tensor`` (dense) or ``b_dtype``
    (discrete)."""
    ad = a.dtype
    if (ad == BF16) != (b_dtype == BF16):
        raise DtypeError(f"a_tensor/{b_name}: mixed dtype families: a dtype {_fmt_dtype(ad)}, b dtype "
                         f"{_fmt_dtype(b_dtype)}; both must be bfloat16 or both the same FP8/FP4 dtype")
    if ad == BF16:
        return "bf16"
    fp4 = set(FP4_DTYPES)
    if ad in BLOCK_SCALED_DTYPES and (ad == b_dtype or (ad in fp4 and b_dtype in fp4)):
        return "block_scaled"
    raise DtypeError(f"a_tensor/{b_name}: unsupported dtype pair ({_fmt_dtype(ad)}, {_fmt_dtype(b_dtype)}); "
                     f"supported: (bfloat16, bfloat16) or matching {_dtypes(BLOCK_SCALED_DTYPES)}")


# --------------------------------------------------------------------------- tensors (BF16)
@dataclass
class Operands:
    """The call's tensors by canonical slot name (``None`` where absent)."""

    a: Any = None
    c: Any = None
    d_row: Any = None
    d_col: Any = None
    sfa: Any = None
    padded_offsets: Any = None
    alpha: Any = None
    beta: Any = None
    prob: Any = None
    dprob: Any = None
    b: Any = None
    sfb: Any = None
    dbias: Any = None
    b_ptrs: Any = None
    sfb_ptrs: Any = None
    sfd_row: Any = None
    sfd_col: Any = None
    amax: Any = None
    norm_const: Any = None
    activation: Any = None


#: User-facing argument names of each slot (the wrapper's names), for error messages.
ARG_NAMES = {
    "a": "a_tensor", "c": "c_tensor", "d_row": "d_row_tensor", "d_col": "d_col_tensor", "sfa": "sfa_tensor",
    "padded_offsets": "padded_offsets", "alpha": "alpha_tensor", "beta": "beta_tensor", "prob": "prob_tensor",
    "dprob": "dprob_tensor", "b": "b_tensor", "sfb": "sfb_tensor", "dbias": "dbias_tensor", "b_ptrs": "b_ptrs",
    "sfb_ptrs": "sfb_ptrs", "sfd_row": "sfd_row_tensor", "sfd_col": "sfd_col_tensor", "amax": "amax_tensor",
    "norm_const": "norm_const_tensor", "activation": "activation_tensor",
}


def _weight_mode(ops: Operands, n, b_dtype):
    if ops.b is not None and ops.b_ptrs is not None:
        raise ValueError("b_tensor/b_ptrs: provide either b_tensor (dense) or b_ptrs (discrete), not both")
    if ops.b is None and ops.b_ptrs is None:
        raise ValueError("b_tensor/b_ptrs: provide either b_tensor (dense weights) or b_ptrs (per-expert pointers), got neither")
    if ops.b is not None:
        if n is not None or b_dtype is not None:
            raise ValueError(f"n/b_dtype: dense mode (b_tensor) forbids n and b_dtype, got n={n!r}, b_dtype={b_dtype!r}")
        return "dense"
    if n is None or b_dtype is None:
        raise ValueError(f"n/b_dtype: discrete mode (b_ptrs) requires n and b_dtype, got n={n!r}, b_dtype={b_dtype!r}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n: expected an int, got {type(n).__name__}")
    if not isinstance(b_dtype, torch.dtype):
        raise TypeError(f"b_dtype: expected a torch.dtype, got {type(b_dtype).__name__}")
    return "discrete"


__all__ = [
    'BF16', 'CD_DTYPES', 'MAX_EXPERTS', 'M_ALIGN', 'M_ALIGNED_CHOICES', 'FP8_DTYPES', 'FP4_DTYPES',
    'BLOCK_SCALED_DTYPES', 'require_tensor', 'check_strided', 'check_dtype', 'drop_unit_dims',
    'check_shape', 'check_row_major', 'check_contiguous_1d', 'check_aligned', 'OUTPUT_SLOTS', 'byte_range',
    'check_outputs_apart', 'check_spans_apart', 'check_same_device',
    'check_d_dtype', 'check_float_type', 'check_finite', 'check_expert_count', 'check_n',
    'SCALAR_DTYPES', 'per_expert_vectors', 'dense_b_major', 'pointer_table', 'activation_view', 'prob_vectors',
    'dbias_view',
    'check_m_aligned', 'check_choice', 'CallConfig', 'resolve_act', 'check_common_config', 'check_bf16_config',
    'operand_family', 'Operands', 'ARG_NAMES', 'RECIPES', 'CHECK_OFFSETS_ENV', 'offsets_checked_every_call',
    'check_offsets_on_device', 'check_call_offsets'
]


#: ``CUDNN_EXT_CHECK_OFFSETS=1``: check ``padded_offsets``' values on the device at every call
#: (by default only the first call of each call signature of the wrapper and the torch op is).
#: Read once, when cudnn_ext is imported (the hot path reads no environment).
CHECK_OFFSETS_ENV = "CUDNN_EXT_CHECK_OFFSETS"
_EVERY_CALL = os.environ.get(CHECK_OFFSETS_ENV, "0") not in ("", "0")


def offsets_checked_every_call() -> bool:
    return _EVERY_CALL


def check_offsets_on_device(offsets: torch.Tensor, m: int, m_aligned: int) -> None:
    """The value rules of ``padded_offsets`` (non-negative, non-decreasing, multiples of
    ``m_aligned``, the last at most M) without a host sync: a few small kernels and
    ``torch._assert_async``, which raises at the next synchronization. On a GPU a failed check
    is a device-side assert, after which the process's CUDA context is lost (as after any);
    the kernel itself would have read and written out of bounds. On the CPU it raises at once."""
    if offsets.numel() == 0:
        return
    ok = (offsets[0] >= 0) & (offsets[-1] <= m)
    if offsets.numel() > 1:
        ok = ok & (offsets[1:] >= offsets[:-1]).all()
    if m_aligned > 1:
        ok = ok & (offsets.remainder(m_aligned) == 0).all()
    torch._assert_async(ok, f"padded_offsets: must be non-negative, non-decreasing, multiples of "
                            f"m_aligned={m_aligned} and at most M={m}")


def check_call_offsets(problem, pack: Dict[str, Any], first: bool) -> None:
    """``check_offsets_on_device`` for a CUDA call: on its first (validated) call, or on every
    call under ``CUDNN_EXT_CHECK_OFFSETS=1``. Not for one group with runtime offsets (the
    tensor is not read)."""
    offsets = pack.get("padded_offsets")
    if offsets is None or offsets.device.type != "cuda" or not (first or offsets_checked_every_call()):
        return
    bs = problem.block_scale
    if bs is not None and bs.single_group_runtime_offsets:
        return
    check_offsets_on_device(offsets, pack["c"].shape[0], problem.m_aligned)
