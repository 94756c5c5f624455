"""Descriptor -> problem: a ``grouped_matmul_dglu`` node through the one input contract.

Owns the translation of a node (its attribute model and its ports' descriptors) into the
``(CallConfig, Operands)`` the contract takes, so that a graph and a wrapper call are judged
by the same rules with the same messages. Descriptors become storage-less ``meta`` tensors
with the declared geometry: the contract reads only metadata (shape, stride, dtype, device,
pointer alignment, which is 0 on ``meta``), so every rule applies unchanged and no rule text is
repeated here; scale-factor ports (6-D layout or flat packed form) go through the block-scaled
contract the same way. A graph always declares ``d_row``, so it is judged like the class API
(quantized D iff ``sfd_row``/``sfd_col``/``norm_const`` are all present, amax iff declared).
The problem's device is then set to the graph's target device.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch

from .. import contract
from ..contract.blockscaled import problem_sf_geometry
from ..contract.fp8_blockwise import problem_scale_geometry
from ..quant.sf_layout import SfGeometry
from ..problem import DgluProblem
from .nodes import GroupedMatmulDgluAttrs, Node
from .types import TensorDesc


def call_config(attrs: GroupedMatmulDgluAttrs, acc_dtype: Optional[torch.dtype]) -> contract.CallConfig:
    return contract.CallConfig(
        act_func=attrs.act_func, linear_offset=attrs.linear_offset, geglu_alpha=attrs.geglu_alpha,
        glu_clamp_max=attrs.glu_clamp_max, glu_clamp_min=attrs.glu_clamp_min, situ_beta1=attrs.situ_beta1,
        situ_beta2=attrs.situ_beta2, b_major=attrs.b_major, acc_dtype=acc_dtype,
        use_dynamic_sched=attrs.use_dynamic_sched, round_dgrad_to_input_dtype=attrs.round_dgrad_to_input_dtype,
        sf_vec_size=attrs.sf_vec_size, discrete_col_sfd=attrs.discrete_col_sfd, epilogue_op=attrs.epilogue_op,
        use_single_group_runtime_offsets=attrs.use_single_group_runtime_offsets,
        deterministic=attrs.deterministic, m_aligned=attrs.m_aligned, recipe=attrs.recipe,
    )


def sf_geometry(problem: DgluProblem, port: str) -> SfGeometry:
    """The scale-factor geometry of ``port`` for a validated block-scaled or fp8_blockwise
    ``problem`` (the contract's tables), which the binder re-derives at the bound M."""
    if problem.recipe is not None:
        return problem_scale_geometry(problem, port)
    return problem_sf_geometry(problem, port)


def _context(node: Node, ports: Dict[str, TensorDesc], message: str) -> str:
    """Say which port and declared tensor a contract message (named by wrapper argument) is about."""
    head = message.split(":", 1)[0]
    names = head.split("/")
    where = []
    for slot, arg in contract.ARG_NAMES.items():
        if arg in names and slot in ports:
            d = ports[slot]
            where.append(f"port {slot!r} is tensor {d.name!r} (uid {d.uid})")
    suffix = f" [{'; '.join(where)}]" if where else ""
    return f"{node.op} node {node.name!r}: {message}{suffix}"


def node_problem(node: Node, ports: Dict[str, TensorDesc], *, acc_dtype: Optional[torch.dtype],
                 device: torch.device) -> DgluProblem:
    """Validate ``node`` with the contract and return its :class:`DgluProblem` on ``device``.

    Raises the contract's ``ValueError``/``TypeError``/``NotImplementedError`` with the node,
    the port and the declared tensor added to the message.
    """
    attrs = node.attrs
    metas = {slot: d.meta() for slot, d in ports.items()}
    ops = contract.Operands(**metas)
    a = ports.get("a")
    if "b_ptrs" in ports and "b" not in ports:
        b_dtype = attrs.b_dtype.torch if attrs.b_dtype is not None else (a.dtype if a is not None else None)
    else:
        b_dtype = attrs.b_dtype.torch if attrs.b_dtype is not None else None
    try:
        problem, _ = contract.normalize(ops, call_config(attrs, acc_dtype), n=attrs.n, b_dtype=b_dtype,
                                        generate_dbias=attrs.generate_dbias)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise type(exc)(_context(node, ports, str(exc))) from exc
    return dataclasses.replace(problem, device_type=device.type, device_index=device.index)
