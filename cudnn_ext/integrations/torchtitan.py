"""TorchTitan's MoE layer with cudnn_ext's expert MLP: ``swap_experts(model)``.

Owns the replacement of TorchTitan's ``GroupedExperts`` (``torchtitan.models.common.moe``,
torchtitan 0.3) by :class:`CudnnGroupedExperts`, whose backward is the fused grouped GEMM +
dSwiGLU (``cudnn_ext.torch.mlp.grouped_glu_mlp``). Everything else of TorchTitan's ``MoE`` stays
as it is: the router, the token dispatcher's permutation, and its combine, which multiplies
each expert output row by its routing score (``LocalTokenDispatcher.combine``: after the
experts, in fp32). The swapped experts therefore compute the plain expert MLP, like the stock
ones, and give the fused op probability 1 on every routed row.

What the swap changes, and why:

* **Weights.** TorchTitan keeps the gate and up projections apart: ``w1_EFD`` and ``w3_EFD``
  (E, F, D). The fused op reads them as one (E, 2F, D) matrix whose rows are gate and up
  interleaved in 32-row blocks (in every 64 rows the first 32 are gate, the next 32 up:
  ``cudnn_ext.layout.gate_up_columns``, docs/vendor_contract.md §1.3). The swap converts
  them once into the parameter ``w13`` and keeps ``w2_EDF`` (E, D, F) as it is (the same
  Parameter object). Converting once, rather than keeping w1/w3 and interleaving every step,
  saves a copy of both weights per forward and of their gradients per backward (0.47 GB each
  way on the dsv3 expert shape).
* **Checkpoints.** ``state_dict()`` still holds ``w1_EFD``, ``w2_EDF`` and ``w3_EFD`` in the
  stock shapes (a post-hook splits ``w13``), and ``load_state_dict`` accepts them (a pre-hook
  interleaves them into ``w13``; a ``w13`` key is accepted as well), so a stock checkpoint
  loads into a swapped model and back. Optimizer state is keyed by parameter: swap before the
  optimizer is built.
* **Row alignment.** TorchTitan hands the experts its routed rows grouped by expert, any
  number per expert (``num_tokens_per_expert_E``). On Hopper with the CuTe DSL and on the
  CPU the fused op takes such groups as they are (``m_aligned`` 1, the kernel's ragged
  schedule, docs/kernels.md): the swapped experts pass the routed rows straight through,
  with the groups' end offsets from a cumulative sum on the device; nothing is copied. On
  other GPUs each group must start on a multiple of 256 (the vendor's engine takes 256 only;
  ``cudnn_ext.torch.mlp.fused_row_alignment``): there the rows are copied into such a layout
  and the outputs back (``cudnn_ext.torch.mlp.pad_expert_rows``), on the device and without
  a host sync, into a buffer of the static size ``rows + 255 E`` rounded down to 256
  (padding rows are zero, with probability 0). The caller sees the stock shapes either way.
* **Initialization.** ``init_states`` runs the stock module's ``w1_EFD``/``w2_EDF``/``w3_EFD``
  initializers (its ``param_init``), in the stock order, and interleaves the result, so a
  seeded swapped model starts from the same weights as a seeded stock one.

Constraints: the hidden width ``F`` (``hidden_dim``) must be a multiple of 32 (the interleave's
block), and only the stock ``GroupedExperts`` is swapped (SwiGLU, no bias); its subclasses
(gpt-oss, float8, MXFP8) are refused by name. Under tensor parallelism ``w13`` takes
``w1_EFD``'s sharding (experts on dim 0, hidden on dim 1), which keeps whole 64-row gate/up
blocks per rank only when ``F / tp`` is a multiple of 32; runs with parallelized (DTensor)
weights are untested.

Importing this module needs ``torchtitan`` (and, for its MoE module, ``triton``): the
``titan`` extra, ``pip install 'cudnn-ext[titan]'``. The rest of cudnn_ext never imports it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

try:
    from torchtitan.config import derive, override
    from torchtitan.models.common.moe import GroupedExperts
except ImportError as exc:  # the integration is optional; say what to install
    raise ImportError(
        "cudnn_ext.integrations.torchtitan needs torchtitan (and triton, which its MoE module "
        f"imports): pip install 'cudnn-ext[titan]' ({type(exc).__name__}: {exc})") from exc

from ..layout import GATE_UP_BLOCK, interleave_gate_up as _interleave, split_gate_up as _split
from ..torch.captured import GraphedStep, graph_step_applies
from ..torch.mlp import fused_row_alignment, gather_rows, glu_config, grouped_glu_mlp, pad_expert_rows


_STOCK_KEYS = ("w1_EFD", "w3_EFD")


def interleave_gate_up(w1: Tensor, w3: Tensor) -> Tensor:
    """TorchTitan's gate ``w1`` and up ``w3`` (E, F, D) as the fused op's (E, 2F, D) ``w13``."""
    _check_gate_up("w1", w1, "w3", w3)
    return _interleave(w1, w3, dim=1)


def split_gate_up(w13: Tensor):
    """The inverse of :func:`interleave_gate_up`: ``(w1, w3)``, each (E, F, D), fresh tensors."""
    if w13.dim() != 3 or w13.shape[1] % (2 * GATE_UP_BLOCK):
        raise ValueError(f"w13: must be (E, 2F, D) with F a multiple of {GATE_UP_BLOCK}, got shape "
                         f"{tuple(w13.shape)}")
    gate, up = _split(w13, dim=1)
    return gate.contiguous(), up.contiguous()


def _check_gate_up(n1: str, w1: Tensor, n3: str, w3: Tensor) -> None:
    if w1.dim() != 3:
        raise ValueError(f"{n1}: must be (E, F, D), got shape {tuple(w1.shape)}")
    if w3.shape != w1.shape:
        raise ValueError(f"{n3}: must have {n1}'s shape {tuple(w1.shape)}, got {tuple(w3.shape)}")
    if w1.shape[1] % GATE_UP_BLOCK:
        raise ValueError(f"{n1}: the hidden width F (dim 1) must be a multiple of {GATE_UP_BLOCK} "
                         f"(the gate/up interleave's block), got F={w1.shape[1]}")


def _local(t: Tensor) -> Tensor:
    """A parallelized (DTensor) parameter's local shard, as the stock module takes it."""
    return t.to_local() if hasattr(t, "to_local") else t


class CudnnGroupedExperts(GroupedExperts):
    """TorchTitan's ``GroupedExperts`` computed by cudnn_ext: same call, same outputs.

    ``forward(x_RD, num_tokens_per_expert_E)`` as the stock module (routed rows grouped by
    expert, any count per expert; output (R, D) of ``x_RD``'s dtype). Parameters: ``w13``
    (E, 2F, D), gate/up interleaved in 32-row blocks, and the stock ``w2_EDF`` (E, D, F);
    checkpoints hold the stock ``w1_EFD``/``w2_EDF``/``w3_EFD``. Build it from a config like
    the stock module, or from a stock module with :meth:`from_stock` (what
    :func:`swap_experts` does).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        #: run each training step's forward and backward as CUDA graphs captured per routed-row
        #: count (``cudnn_ext.torch.captured``): the host issues two graph launches and three
        #: copies instead of the step's ~20 ops; each forward's backward must run before the
        #: next forward (no pipeline schedules with several microbatches in flight)
        capture: bool = False

    def __init__(self, config: Config):
        if config.hidden_dim % GATE_UP_BLOCK:
            raise ValueError(f"hidden_dim: must be a multiple of {GATE_UP_BLOCK} (the gate/up interleave's "
                             f"block), got {config.hidden_dim}")
        super().__init__(config)
        w1 = self.w1_EFD
        del self.w1_EFD, self.w3_EFD
        self.w13 = nn.Parameter(w1.new_empty((config.num_experts, 2 * config.hidden_dim, config.dim)))
        self.cfg = glu_config("swiglu")  # TorchTitan's experts: silu(x w1ᵀ) * (x w3ᵀ)
        self.capture = config.capture
        self._graphed = GraphedStep(self._routed_step)
        self.register_state_dict_post_hook(_split_on_save)
        self.register_load_state_dict_pre_hook(_merge_on_load)

    @classmethod
    def from_stock(cls, experts: GroupedExperts, capture: bool = False) -> "CudnnGroupedExperts":
        """A swapped copy of a stock ``GroupedExperts``: its w1/w3 interleaved once into ``w13``,
        its ``w2_EDF`` Parameter shared, its initializers and sharding carried over;
        ``capture``: :attr:`Config.capture`."""
        if type(experts) is not GroupedExperts:
            raise TypeError(f"experts: must be a stock torchtitan GroupedExperts (SwiGLU, no bias), got "
                            f"{type(experts).__module__}.{type(experts).__qualname__}")
        w1, w3 = experts.w1_EFD, experts.w3_EFD
        _check_gate_up("experts.w1_EFD", w1, "experts.w3_EFD", w3)
        E, F, D = w1.shape
        with torch.device("meta"):  # the constructor's placeholders; replaced below
            new = cls(cls.Config(dim=D, hidden_dim=F, num_experts=E, capture=capture))
        with torch.no_grad():
            new.w13 = nn.Parameter(interleave_gate_up(_plain(w1), _plain(w3)), requires_grad=w1.requires_grad)
        new.w2_EDF = experts.w2_EDF
        new._param_init = experts._param_init
        new._sharding_config = _sharding_for_w13(experts._sharding_config)
        new.train(experts.training)
        return new

    def forward(self, x_RD: Tensor, num_tokens_per_expert_E: Tensor) -> Tensor:
        w13, w2 = _local(self.w13), _local(self.w2_EDF)
        rows = x_RD.shape[0]
        if rows == 0:
            # no routed rows (an expert-parallel rank can get none): an empty output that still
            # reaches the weights, so that they get zero gradients like the stock module's
            return x_RD.new_zeros((0, w2.shape[1])) + 0 * (w13.sum() + w2.sum()).to(x_RD.dtype)
        align = fused_row_alignment(x_RD.device)
        if align == 1:
            x = x_RD.bfloat16()
            # (the parameters themselves: a DTensor's local shard would pass for a plain weight)
            if self.capture and self.training and graph_step_applies(x, (self.w13, self.w2_EDF)) is None:
                return self._graphed(x, num_tokens_per_expert_E, (w13, w2)).type_as(x_RD)
            return self._routed_step(x, num_tokens_per_expert_E, w13, w2).type_as(x_RD)
        offsets, src, src_valid, dest, dest_valid = pad_expert_rows(num_tokens_per_expert_E, rows,
                                                                    align=align)
        # padding rows hold 0 and probability 0: they add nothing to any output or gradient
        x_pad = gather_rows(x_RD.bfloat16(), src, src_valid, dest, dest_valid)
        y_pad = grouped_glu_mlp(x_pad, src_valid.float(), w13, w2, offsets, cfg=self.cfg,
                                m_aligned=align)
        # a select, never a multiply: rows past the last group may hold anything
        y = gather_rows(y_pad, dest, dest_valid, src, src_valid)
        return y.type_as(x_RD)

    def _routed_step(self, x: Tensor, num_tokens_per_expert_E: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
        """The experts on routed bf16 rows grouped as they come: rows past the counts' sum
        belong to no expert (output 0)."""
        rows = x.shape[0]
        offsets = torch.cumsum(num_tokens_per_expert_E, 0).clamp(max=rows).to(torch.int32)
        prob = torch.ones(rows, dtype=torch.float32, device=x.device)
        return grouped_glu_mlp(x, prob, w13, w2, offsets, cfg=self.cfg, m_aligned=1)

    def _init_self_parameters(self) -> None:
        """The stock initializers (``param_init`` keyed ``w1_EFD``, ``w2_EDF``, ``w3_EFD``), run
        in the stock parameter order on (E, F, D) tensors, then interleaved into ``w13``."""
        init = self._param_init
        if init is None or "w13" in init or not all(k in init for k in _STOCK_KEYS):
            return super()._init_self_parameters()
        if any(hasattr(p, "to_local") for p in (self.w13, self.w2_EDF)):
            raise NotImplementedError("CudnnGroupedExperts: initializing parallelized (DTensor) weights is not "
                                      "supported; initialize before parallelizing, or give param_init a 'w13' entry")
        E, twoF, D = self.w13.shape
        with torch.no_grad():
            w1 = self.w13.new_empty((E, twoF // 2, D))
            w3 = torch.empty_like(w1)
            init["w1_EFD"](w1)
            init["w2_EDF"](self.w2_EDF)
            init["w3_EFD"](w3)
            self.w13.copy_(interleave_gate_up(w1, w3))


def _plain(t: Tensor) -> Tensor:
    if hasattr(t, "to_local"):
        raise NotImplementedError("swap_experts: parallelized (DTensor) expert weights are not supported; "
                                  "swap before parallelizing the model")
    return t.detach()


def _sharding_for_w13(sharding):
    """The stock sharding with ``w13`` laid out like ``w1_EFD`` (experts dim 0, hidden dim 1)."""
    if sharding is None or "w1_EFD" not in getattr(sharding, "state_shardings", {}):
        return sharding
    state = dict(sharding.state_shardings)
    state["w13"] = state.pop("w1_EFD")
    state.pop("w3_EFD", None)
    return dataclasses.replace(sharding, state_shardings=state)


def _split_on_save(module, state_dict, prefix, local_metadata) -> None:
    # checkpoints stay in TorchTitan's layout: w13 leaves as w1_EFD and w3_EFD
    key = f"{prefix}w13"
    if key not in state_dict:
        return
    w1, w3 = split_gate_up(state_dict.pop(key).detach())
    state_dict[f"{prefix}w1_EFD"] = w1
    state_dict[f"{prefix}w3_EFD"] = w3


def _merge_on_load(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                   error_msgs) -> None:
    k1, k3, k13 = f"{prefix}w1_EFD", f"{prefix}w3_EFD", f"{prefix}w13"
    has1, has3 = k1 in state_dict, k3 in state_dict
    if not (has1 or has3):
        return  # a w13 checkpoint, or none for this module (load_state_dict reports it)
    if has1 != has3:
        if strict:
            there, missing = (k1, k3) if has1 else (k3, k1)
            raise KeyError(f"state_dict: has {there!r} but not {missing!r}; the gate (w1_EFD) and up (w3_EFD) "
                           "projections load together")
        return
    if k13 in state_dict:
        raise ValueError(f"state_dict: holds both {k13!r} and {k1!r}/{k3!r}; give one form of the weights")
    with torch.no_grad():
        state_dict[k13] = interleave_gate_up(state_dict.pop(k1), state_dict.pop(k3))


def swap_experts(model: nn.Module, capture: bool = False) -> nn.Module:
    """Replace every stock TorchTitan ``GroupedExperts`` in ``model`` by
    :class:`CudnnGroupedExperts` holding the same weights; returns ``model`` (or the
    replacement, if ``model`` is itself a ``GroupedExperts``). ``capture``: each one's
    training steps run as captured CUDA graphs (:attr:`CudnnGroupedExperts.Config.capture`).

    Swap after loading or initializing the weights (either order works: checkpoints load in
    the stock layout) and before building the optimizer and parallelizing. Raises
    ``ValueError`` if ``model`` holds no ``GroupedExperts`` and ``TypeError`` naming the module
    if it holds a subclass that is not the stock SwiGLU experts.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: must be a torch.nn.Module, got {type(model).__name__}")
    if type(model) is GroupedExperts:
        return CudnnGroupedExperts.from_stock(model, capture)
    found = []
    for name, mod in model.named_modules():
        if isinstance(mod, GroupedExperts) and not isinstance(mod, CudnnGroupedExperts):
            if type(mod) is not GroupedExperts:
                raise TypeError(f"model: {name!r} is a {type(mod).__qualname__}, a GroupedExperts subclass "
                                "cudnn_ext does not compute (only the stock SwiGLU experts, no bias)")
            found.append(name)
    if not found and not any(isinstance(m, CudnnGroupedExperts) for m in model.modules()):
        raise ValueError(f"model: holds no torchtitan GroupedExperts to swap ({type(model).__name__})")
    for name in found:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, CudnnGroupedExperts.from_stock(getattr(parent, attr), capture))
    return model


@override(target=GroupedExperts.Config, exact=True,
          description="cudnn_ext: grouped GEMM + fused dSwiGLU backward for the routed experts")
def cudnn_grouped_experts(cfg: GroupedExperts.Config) -> CudnnGroupedExperts.Config:
    """TorchTitan override factory (``--override.imports
    cudnn_ext.integrations.torchtitan.cudnn_grouped_experts``): builds
    :class:`CudnnGroupedExperts` where the model config has a stock ``GroupedExperts``; the
    stock initializers and (remapped) sharding are kept."""
    return derive(cfg, CudnnGroupedExperts.Config, sharding_config=_sharding_for_w13(cfg.sharding_config))


__all__ = ["CudnnGroupedExperts", "cudnn_grouped_experts", "interleave_gate_up", "split_gate_up",
           "swap_experts", "GATE_UP_BLOCK"]
