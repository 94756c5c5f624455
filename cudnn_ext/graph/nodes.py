"""Nodes of the graph: the ``grouped_matmul_dglu`` node, its attributes and its ports.

Owns the node's pydantic attribute model, which ports it has (inputs and outputs, named by
the canonical slot names of ``cudnn_ext.problem.SLOTS``) and the inference of its outputs'
descriptors. The *rules* an attribute value or a tensor must satisfy are not here: they live
once, in ``cudnn_ext.contract``, and ``cudnn_ext.graph.translate`` runs them on the node.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, field_validator

from ..contract.blockscaled import sf_geometry
from ..contract.fp8_blockwise import scale_geometry as fp8_scale_geometry
from .types import DataType, TensorDesc, row_major_strides

OP_NAME = "grouped_matmul_dglu"

#: Input ports, in the order the contract reads them. ``b`` and ``b_ptrs`` are exclusive.
#: Block-scaled (FP8/FP4) graphs add ``sfa`` and ``sfb`` (dense) or ``sfb_ptrs`` (discrete),
#: and ``norm_const`` when D is quantized; ``prob`` is optional there.
INPUT_PORTS = ("a", "b", "b_ptrs", "sfa", "sfb", "sfb_ptrs", "c", "padded_offsets", "alpha", "beta", "prob",
               "norm_const")
#: Output ports. ``dprob`` (and ``dbias``) are accumulated into: bind zeroed buffers; ``amax``
#: is max-accumulated: bind ``-inf``. ``d_col``, ``sfd_row``, ``sfd_col`` exist when
#: ``norm_const`` is given (quantized D), ``amax`` with ``generate_amax``.
OUTPUT_PORTS = ("d_row", "dprob", "dbias", "activation", "d_col", "amax", "sfd_row", "sfd_col")
#: Ports whose leading dim is the token count M (a runtime size when the graph allows it).
M_PORTS = ("a", "c", "d_row", "d_col", "prob", "dprob", "activation")
#: Scale-factor ports: 6-D layout (or its flat packed form); M, where it matters, lives inside
#: the layout (``sfa``/``sfd_row`` rows, ``sfd_col`` k-blocks), never in a leading dim.
SF_PORTS = ("sfa", "sfb", "sfd_row", "sfd_col")
#: Pointer alignment the binder requires per port (bytes); 16 for every other port.
PORT_ALIGN = {"b_ptrs": 8, "sfb_ptrs": 8, "norm_const": 4, "amax": 4}

Number = StrictFloat | StrictInt


class GroupedMatmulDgluAttrs(BaseModel):
    """Scalar attributes of a ``grouped_matmul_dglu`` node (the vendor's keyword names).

    Types are checked here; value rules (finite, positive, ordered clamps, known act_func,
    required/forbidden ``n`` ...) are the contract's and run at ``Graph.validate()``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    act_func: str = "dswiglu"
    generate_dbias: StrictBool = False
    generate_activation: StrictBool = False
    geglu_alpha: Number = 1.702
    glu_clamp_max: Number = 7.0
    glu_clamp_min: Number = -7.0
    linear_offset: Optional[Number] = None
    situ_beta1: Number = 4.0
    situ_beta2: Number = 25.0
    #: Discrete weights (``b_ptrs``) only: N and the weights' dtype (default: ``a``'s dtype).
    n: Optional[StrictInt] = None
    b_dtype: Optional[DataType] = None
    b_major: str = "k"
    #: D's dtype when the node creates ``d_row`` (default: the graph's io type, else bf16).
    d_dtype: Optional[DataType] = None
    use_dynamic_sched: StrictBool = False
    round_dgrad_to_input_dtype: StrictBool = False
    #: False: no ``dprob`` output (block-scaled only; the BF16 contract requires dprob).
    generate_dprob: StrictBool = True
    #: Block-scaled: per-expert ``amax`` (L, 2) of D's gate/up values (vendor: for bf16/fp16 D).
    generate_amax: StrictBool = False
    #: Block-scaled: elements per scale factor (16 or 32; MXFP8 needs 32, e4m3 scales 16).
    sf_vec_size: StrictInt = 16
    discrete_col_sfd: StrictBool = False
    use_single_group_runtime_offsets: StrictBool = False
    #: None/"identity"; "relu"/"srelu" are refused by the contract (no dGLU kernel applies them).
    epilogue_op: Optional[str] = None
    #: Bit-identical dprob and dbias run to run (engines reducing with atomics decline it).
    deterministic: StrictBool = False
    #: Row alignment of every expert's group and of M (``padded_offsets`` entries are multiples
    #: of it): 256 (the vendor's), or 1 (any size), 8, 16, 32, 64, 128 with BF16 operands.
    m_aligned: StrictInt = 256
    #: None, or a cudnn_ext recipe: "fp8_blockwise" (e4m3 ``a``/``b`` with fp32 ``sfa`` per 1x128
    #: and ``sfb``/``sfb_ptrs`` per 128x128 block; the contract checks the name)
    recipe: Optional[str] = None

    @field_validator("b_dtype", "d_dtype", mode="before")
    @classmethod
    def _dtype(cls, v):
        return None if v is None else DataType.of(v)


class Node(BaseModel):
    """One operation: ``inputs``/``outputs`` map port names to tensor uids."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    op: str = OP_NAME
    inputs: Dict[str, int]
    outputs: Dict[str, int]
    attrs: GroupedMatmulDgluAttrs

    def ports(self) -> Dict[str, int]:
        return {**self.inputs, **self.outputs}


def _dim(desc: Optional[TensorDesc], i: int, default: int = 0) -> int:
    return desc.dim[i] if desc is not None and len(desc.dim) > i else default


def infer_outputs(inputs: Dict[str, TensorDesc], attrs: GroupedMatmulDgluAttrs,
                  d_dtype: DataType) -> Dict[str, Tuple[Tuple[int, ...], DataType, Tuple[int, ...]]]:
    """Shapes and dtypes of the outputs the node creates, from its inputs.

    Outputs keep the rank of their model input (``d_row`` like ``c``, ``dprob`` like
    ``prob``; a rank-3 ``c`` gives the vendor's ``(L, 2N, 1)`` dbias and ``(L, 2, 1)`` amax).
    Scale factors of a quantized D are declared in the 6-D layout at the declared M
    (``(dim, dtype, stride)`` entries). Inference is lenient on malformed inputs:
    ``validate()`` then reports the input, not a derived output.
    """
    c, prob, offs = inputs.get("c"), inputs.get("prob"), inputs.get("padded_offsets")
    m, two_n = _dim(c, 0), _dim(c, 1)
    unit = (1,) if c is not None and len(c.dim) == 3 else ()
    out = {"d_row": ((m, two_n) + unit, d_dtype)}
    if attrs.generate_dprob:
        out["dprob"] = (prob.dim if prob is not None else (m,), DataType.FLOAT)
    if attrs.generate_dbias:
        out["dbias"] = ((_dim(offs, 0), two_n) + unit, DataType.BFLOAT16)
    if attrs.generate_activation:
        out["activation"] = ((m, two_n // 2) + unit, DataType.BFLOAT16)
    if attrs.generate_amax:
        out["amax"] = ((_dim(offs, 0), 2) + unit, DataType.FLOAT)
    if "norm_const" in inputs:  # quantized D: column-scaled copy and both scale-factor tensors
        out["d_col"] = ((m, two_n) + unit, d_dtype)
        for port in ("sfd_row", "sfd_col"):  # declared at the declared M; the binder re-derives at the bound M
            geo = sf_geometry(port, n=max(two_n // 2, 1), k=1, num_experts=1, sf_vec_size=32)
            sf = geo.empty(max(m, 1), dtype=DataType.FP8_E8M0.torch, device="meta")
            out[port] = (tuple(sf.shape), DataType.FP8_E8M0, tuple(sf.stride()))
    if attrs.recipe is not None and d_dtype == DataType.FP8_E4M3:  # fp8_blockwise: D_col, fp32 scales of both
        out["d_col"] = ((m, two_n) + unit, d_dtype)
        for port in ("sfd_row", "sfd_col"):  # MN-major at the declared M; the binder re-derives at the bound M
            sf = fp8_scale_geometry(port, n=max(two_n // 2, 1), k=1, num_experts=1).empty(max(m, 1), device="meta")
            out[port] = (tuple(sf.shape), DataType.FLOAT, tuple(sf.stride()))
    return {k: v[:2] + (v[2] if len(v) > 2 else row_major_strides(v[0]),) for k, v in out.items()}


__all__ = ["GroupedMatmulDgluAttrs", "Node", "INPUT_PORTS", "OUTPUT_PORTS", "M_PORTS", "SF_PORTS", "PORT_ALIGN", "OP_NAME",
           "infer_outputs", "row_major_strides"]
