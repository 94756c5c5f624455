"""The activation functions of the dGLU backward, each defined once.

One frozen :class:`Activation` record per function: its ``act_func`` name (the vendor's), the
operand contracts that take it, its default ``linear_offset``, whether beta scales C before
it, which activation constants it reads, which contracts offer its activation output (ours
and the vendor's), and the forward name and layer support of ``GroupedGluMLP``. Every list of names in
the package is a lookup here; the functions themselves live where they run (the reference's
local derivatives, the kernels' epilogues, the layer's forward), each keyed by ``name``, and
``tests/unit/test_activations.py`` registers a throwaway activation to check that the
contract, the reference and every engine agree on one that nobody implements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

#: The operand contracts: BF16 operands, block-scaled ones (``DgluProblem.is_block_scaled``), and
#: cudnn_ext's FP8 operands with blockwise fp32 scales (``DgluProblem.recipe``), whose epilogue is
#: the BF16 contract's (beta scales C for every activation).
BF16, BLOCK_SCALED, FP8_BLOCKWISE = "bf16", "block_scaled", "fp8_blockwise"
CONTRACTS = (BF16, BLOCK_SCALED, FP8_BLOCKWISE)


@dataclass(frozen=True)
class Activation:
    #: the vendor's ``act_func`` value
    name: str
    #: the operand contracts that take it (the vendor's: dSiTU-GLU is block-scaled only)
    contracts: FrozenSet[str]
    #: ``linear_offset`` when the call gives none (the vendor's defaults)
    default_linear_offset: float = 0.0
    #: the activation constants it reads (the others are ignored)
    params: Tuple[str, ...] = ()
    #: the contracts whose activation output (``activation_tensor``, prob x the activation value)
    #: cudnn_ext offers for it: every activation's, a cudnn_ext extension of the vendor's
    activation_output: FrozenSet[str] = frozenset(CONTRACTS)
    #: the contracts whose activation output the vendor documents (dGeGLU with BF16 operands)
    vendor_activation_output: FrozenSet[str] = frozenset()
    #: the contracts where beta scales C before the activation (block-scaled dGeGLU reads C
    #: as it is: docs/vendor_contract.md §2.4)
    beta_scales_c: FrozenSet[str] = frozenset(CONTRACTS)
    #: the scalars (``alpha_tensor``, ``beta_tensor``) the vendor's packed-f32x2 epilogue
    #: (``vector_f32``) takes in float32 only for this activation (docs/vendor_contract.md §3.5)
    packed_f32_scalars: Tuple[str, ...] = ()
    #: the forward's name in ``GroupedGluMLP`` (``glu_config``), or None: no layer forward
    forward_name: Optional[str] = None
    #: one of the vendor's own functions (its engine can be asked for it); False for ours
    vendor: bool = True


#: name -> record, in the vendor's order
ACTIVATIONS: Dict[str, Activation] = {}


def register(act: Activation) -> Activation:
    """Add ``act`` (a new name) to :data:`ACTIVATIONS`; returns it."""
    if act.name in ACTIVATIONS:
        raise ValueError(f"activation {act.name!r} is already registered")
    unknown = set(act.contracts) - set(CONTRACTS)
    if unknown:
        raise ValueError(f"contracts: unknown {sorted(unknown)}")
    ACTIVATIONS[act.name] = act
    return act


def unregister(name: str) -> None:
    """Remove ``name`` from :data:`ACTIVATIONS` (tests register throwaway ones)."""
    del ACTIVATIONS[name]


def names(contract: Optional[str] = None) -> Tuple[str, ...]:
    """The registered ``act_func`` names (those ``contract`` takes, if given)."""
    return tuple(n for n, a in ACTIVATIONS.items() if contract is None or contract in a.contracts)


def activation(name: str) -> Activation:
    """The record of ``name``; ``ValueError`` naming ``act_func`` if there is none."""
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"act_func: must be one of {list(ACTIVATIONS)}, got {name!r}") from None


def layer_names() -> Tuple[str, ...]:
    """The ``act_func`` names ``GroupedGluMLP`` has a forward for."""
    return tuple(a.name for a in ACTIVATIONS.values() if a.forward_name)


def forward_names() -> Dict[str, str]:
    """``GroupedGluMLP``'s activation names (and the ``act_func`` names themselves) -> act_func."""
    out = {a.forward_name: a.name for a in ACTIVATIONS.values() if a.forward_name}
    out.update({a.name: a.name for a in ACTIVATIONS.values() if a.forward_name})
    return out


_GEGLU_PARAMS = ("geglu_alpha", "glu_clamp_max", "glu_clamp_min", "linear_offset")

DSWIGLU = register(Activation("dswiglu", frozenset(CONTRACTS),
                              packed_f32_scalars=("alpha_tensor", "beta_tensor"), forward_name="swiglu"))
DGEGLU = register(Activation("dgeglu", frozenset(CONTRACTS), default_linear_offset=1.0,
                             params=_GEGLU_PARAMS, vendor_activation_output=frozenset({BF16}),
                             beta_scales_c=frozenset({BF16, FP8_BLOCKWISE}),
                             packed_f32_scalars=("alpha_tensor",), forward_name="geglu"))
DSITUGLU = register(Activation("dsituglu", frozenset({BLOCK_SCALED, FP8_BLOCKWISE}), params=("situ_beta1", "situ_beta2")))

__all__ = ["Activation", "ACTIVATIONS", "BF16", "BLOCK_SCALED", "CONTRACTS", "FP8_BLOCKWISE", "DGEGLU", "DSITUGLU", "DSWIGLU", "activation",
           "forward_names", "layer_names", "names", "register", "unregister"]
