"""The typed description of one grouped GEMM + dGLU problem.

Owns the frozen value objects that every layer agrees on: what the operation computes
(:class:`ActConfig`), on which operand geometry and dtypes (:class:`DgluProblem`), and the
canonical names of the tensors an engine receives (:data:`SLOTS`). It holds no tensors and
does no validation of user input (that is ``cudnn_ext.contract``); engines read it to
decide whether they support a problem and what to compile.

The token count ``m`` is recorded for heuristics but is a *runtime* size: engines must not
specialize compiled code on it (a new token count never recompiles).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch

#: Canonical variant-pack slot names, as engines receive them. Shapes (views of the caller's
#: storage, trailing unit dims removed): a (M,K); b (N,K,L); b_ptrs (L,) int64; c, d_row,
#: d_col (M,2N); padded_offsets, alpha, beta (L,); prob, dprob (M,); dbias (L,2N);
#: activation (M,N); amax (L,2); sfa/sfb/sfd_row/sfd_col in the 6-D scale-factor layout;
#: sfb_ptrs (L,) int64; norm_const (1,).
SLOTS = (
    "a", "b", "b_ptrs", "c", "d_row", "d_col", "sfa", "sfb", "sfb_ptrs",
    "padded_offsets", "alpha", "beta", "prob", "dprob", "dbias", "amax",
    "sfd_row", "sfd_col", "norm_const", "activation",
)

#: Output slots (written or accumulated by the operation); every other slot is read-only.
OUTPUT_SLOTS = ("d_row", "d_col", "dprob", "dbias", "amax", "sfd_row", "sfd_col", "activation")

#: The 16-bit float dtypes the block-scaled contract takes for alpha and beta besides float32.
HALF_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class ActConfig:
    """Which dGLU derivative the epilogue applies (an ``act_func`` of
    ``cudnn_ext.activations``), with its constants fully resolved."""

    act_func: str = "dswiglu"
    geglu_alpha: float = 1.702
    clamp_max: float = 7.0
    clamp_min: float = -7.0
    linear_offset: float = 0.0
    situ_beta1: float = 4.0
    situ_beta2: float = 25.0
    #: BF16 dGeGLU scales C by beta before the clamps; the block-scaled kernel does not
    #: (docs/vendor_contract.md §2.4). dSwiGLU and dSiTU-GLU always apply beta.
    dgeglu_applies_beta: bool = True


@dataclass(frozen=True)
class BlockScaleConfig:
    """Block-scaled (MXFP8 / NVFP4) specifics; ``None`` on a problem means the BF16 contract."""

    sf_dtype: torch.dtype
    sf_vec_size: int
    generate_sfd: bool = False
    discrete_col_sfd: bool = False
    generate_amax: bool = False
    single_group_runtime_offsets: bool = False
    #: alpha's and beta's dtypes: float32, bfloat16 or float16 (the BF16 contract takes float32
    #: only). The vendor's kernel loads them in their own dtype: see
    #: ``DgluProblem.alpha_square_dtype`` and ``DgluProblem.c_beta_dtype``.
    alpha_dtype: torch.dtype = torch.float32
    beta_dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class DgluProblem:
    """Everything an engine needs to decide support and compile; no tensors, no data."""

    n: int
    k: int
    num_experts: int
    m: int
    weight_mode: str  # "dense" | "discrete"
    b_major: str  # "k" | "n"
    ab_dtype: torch.dtype
    c_dtype: torch.dtype
    d_dtype: torch.dtype
    act: ActConfig = field(default_factory=ActConfig)
    generate_dbias: bool = False
    has_prob: bool = True
    has_dprob: bool = True
    generate_activation: bool = False
    round_dgrad_to_input_dtype: bool = False
    use_dynamic_sched: bool = False
    block_scale: Optional[BlockScaleConfig] = None
    #: Row alignment of every expert's group (and of M): each ``padded_offsets`` entry is a
    #: multiple of it, so an ``m_aligned``-row block lies in one expert. 256 is the vendor's
    #: value; BF16 problems may have 1 (any size) or 8 .. 128 (``contract.M_ALIGNED_CHOICES``),
    #: which engines whose schedule walks 256-row blocks decline.
    m_aligned: int = 256
    #: None, or a cudnn_ext recipe (``contract.RECIPES``): "fp8_blockwise" is e4m3 A and B
    #: with fp32 scales per 1x128 (``sfa``) and 128x128 (``sfb``/``sfb_ptrs``) block, and the
    #: BF16 contract's epilogue on the dequantized operands (``block_scale`` stays None)
    recipe: Optional[str] = None
    #: dprob and dbias bit-identical run to run (the vendor's ``deterministic``, which it offers
    #: for block-scaled dprob without dbias; cudnn_ext for every call): engines that reduce
    #: them with atomics decline it
    deterministic: bool = False
    device_type: str = "cpu"
    device_index: Optional[int] = None

    @property
    def is_block_scaled(self) -> bool:
        return self.block_scale is not None

    @property
    def alpha_square_dtype(self) -> Optional[torch.dtype]:
        """The 16-bit dtype alpha**2 is formed in, or None (float32 alpha: in the compute dtype).

        The block-scaled kernel squares ``alpha[e]`` in alpha's own dtype, so a bfloat16 or
        float16 alpha gives ``alpha**2`` rounded to that dtype (which then multiplies the fp32
        accumulator exactly converted): docs/vendor_contract.md §3.5."""
        if self.block_scale is None or self.block_scale.alpha_dtype not in HALF_DTYPES:
            return None
        return self.block_scale.alpha_dtype

    @property
    def c_beta_dtype(self) -> Optional[torch.dtype]:
        """The 16-bit dtype ``beta * C`` (gate and up) is formed and rounded in, or None
        (formed in the compute dtype, beta exactly converted).

        Block-scaled dSwiGLU only, with a bfloat16 or float16 beta and a C of at most 16 bits:
        the kernel multiplies C's values by the scalar ``beta[e]`` in CuTe DSL's promoted type,
        the wider of the two, float16 over bfloat16 at equal width (bfloat16 C x float16 beta
        is float16: C rounded to float16 first); FP8 C takes beta's dtype. The rest of the
        epilogue is fp32 on the rounded values. dGeGLU (no beta) and dSiTU-GLU (beta and C
        converted to fp32 first) keep None: docs/vendor_contract.md §3.5."""
        bs = self.block_scale
        if bs is None or self.act.act_func != "dswiglu" or bs.beta_dtype not in HALF_DTYPES:
            return None
        if self.c_dtype in HALF_DTYPES:
            return torch.float16 if torch.float16 in (self.c_dtype, bs.beta_dtype) else torch.bfloat16
        if self.c_dtype == torch.float32:
            return None
        return bs.beta_dtype  # FP8 C: 8 bits, beta's dtype is the wider

    def with_m(self, m: int) -> "DgluProblem":
        return replace(self, m=m)
