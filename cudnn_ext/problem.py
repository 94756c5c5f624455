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

#: Activation functions of the backward epilogue.
ACT_FUNCS = ("dswiglu", "dgeglu", "dsituglu")

#: Default linear_offset per act_func (vendor: 1.0 for dgeglu, 0.0 otherwise).
DEFAULT_LINEAR_OFFSET = {"dswiglu": 0.0, "dgeglu": 1.0, "dsituglu": 0.0}

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


@dataclass(frozen=True)
class ActConfig:
    """Which dGLU derivative the epilogue applies, with its constants fully resolved."""

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
    #: Bit-identical dprob run to run (the vendor's ``deterministic``); engines that reduce
    #: dprob with atomics must decline it.
    deterministic: bool = False


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
    device_type: str = "cpu"
    device_index: Optional[int] = None

    @property
    def is_block_scaled(self) -> bool:
        return self.block_scale is not None

    def with_m(self, m: int) -> "DgluProblem":
        return replace(self, m=m)
