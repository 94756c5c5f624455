"""The graph of one validated call: how the wrapper and the class API run through ``Graph``.

Owns the declaration of a graph from a call the contract has already normalized (a
:class:`DgluProblem` plus its canonical pack of views): one tensor per slot, named by the slot,
with the pack's geometry (outputs not yet allocated are declared from the problem), and the
node's attributes read back from the problem. ``graph_for_call`` memoizes built graphs in the
call memo (``runtime.memo.CALLS``) by the problem family and the operands' layout with M left out, so a wrapper call with a new token
count reuses the built plan. BF16 and block-scaled (FP8/FP4) calls alike: scale-factor slots
are declared like any other, and their layout (which carries M inside the 6-D form) is left
out of the memo key because the binder re-derives it at the bound M.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch

from ..problem import DgluProblem
from ..runtime.memo import CALLS
from .graph import Graph
from .nodes import INPUT_PORTS, M_PORTS, OUTPUT_PORTS, SF_PORTS


def _signature(pack: Mapping[str, torch.Tensor]) -> tuple:
    """Layout of the pack as the binder will judge it: M wildcarded, strides of unit dims ignored."""
    sig = []
    for slot in sorted(pack):
        t = pack[slot]
        if slot in SF_PORTS:  # geometry follows from the problem and M; 6-D and flat forms both bind
            sig.append((slot, t.dtype))
            continue
        shape = tuple(t.shape)
        if slot in M_PORTS:
            shape = (None,) + shape[1:]
        strides = tuple(st if size > 1 else None for size, st in zip(t.shape, t.stride()))
        sig.append((slot, t.dtype, shape, strides))
    return tuple(sig)


def declare_call_graph(problem: DgluProblem, pack: Mapping[str, torch.Tensor], *, name: str = "call",
                       validate: bool = False) -> Graph:
    """A graph equivalent to the call (problem, pack); validated (``problem`` adopted, or with
    ``validate`` derived from the declaration as for any graph), not planned.

    Outputs the wrapper allocates after planning (``d_row``, ``dbias``; block-scaled
    ``d_col``/``sfd_row``/``sfd_col``/``amax``) are declared from the problem, with the
    geometry the wrapper gives them."""
    device = pack["c"].device
    g = Graph(name, device=device)
    ins = {p: g.tensor_like(pack[p], name=p) for p in INPUT_PORTS if pack.get(p) is not None}
    m, two_n = pack["c"].shape
    outs = {}
    for port in OUTPUT_PORTS:
        t = pack.get(port)
        if t is not None:
            outs[port] = g.tensor_like(t, name=port)
    if "d_row" not in outs:
        outs["d_row"] = g.tensor(name="d_row", dim=(m, two_n), data_type=problem.d_dtype)
    if "dbias" not in outs and problem.generate_dbias:
        outs["dbias"] = g.tensor(name="dbias", dim=(problem.num_experts, two_n), data_type=torch.bfloat16)
    bs = problem.block_scale
    block = {}
    if bs is not None:
        from .translate import sf_geometry

        if bs.generate_sfd:
            if "d_col" not in outs:
                outs["d_col"] = g.tensor(name="d_col", dim=(m, two_n), data_type=problem.d_dtype)
            for port in ("sfd_row", "sfd_col"):
                if port not in outs:
                    meta = sf_geometry(problem, port).empty(m, dtype=torch.float8_e8m0fnu, device="meta")
                    outs[port] = g.tensor_like(meta, name=port)
        if bs.generate_amax and "amax" not in outs:
            outs["amax"] = g.tensor(name="amax", dim=(problem.num_experts, 2), data_type=torch.float32)
        block = dict(generate_amax=bs.generate_amax, sf_vec_size=bs.sf_vec_size,
                     discrete_col_sfd=bs.discrete_col_sfd,
                     use_single_group_runtime_offsets=bs.single_group_runtime_offsets)
    if problem.recipe is not None and problem.d_dtype == torch.float8_e4m3fn:  # fp8_blockwise FP8 D
        from .translate import sf_geometry

        if "d_col" not in outs:
            outs["d_col"] = g.tensor(name="d_col", dim=(m, two_n), data_type=problem.d_dtype)
        for port in ("sfd_row", "sfd_col"):
            if port not in outs:
                outs[port] = g.tensor_like(sf_geometry(problem, port).empty(m, device="meta"), name=port)
    act = problem.act
    discrete = problem.weight_mode == "discrete"
    g.grouped_matmul_dglu(
        **ins, **outs, act_func=act.act_func, generate_dbias=problem.generate_dbias,
        generate_activation=problem.generate_activation, generate_dprob=problem.has_dprob,
        geglu_alpha=act.geglu_alpha,
        glu_clamp_max=act.clamp_max, glu_clamp_min=act.clamp_min, linear_offset=act.linear_offset,
        situ_beta1=act.situ_beta1, situ_beta2=act.situ_beta2, n=problem.n if discrete else None,
        b_dtype=problem.ab_dtype if discrete else None, b_major=problem.b_major if discrete else "k",
        d_dtype=problem.d_dtype, use_dynamic_sched=problem.use_dynamic_sched,
        round_dgrad_to_input_dtype=problem.round_dgrad_to_input_dtype, m_aligned=problem.m_aligned,
        recipe=problem.recipe, deterministic=problem.deterministic, name="dglu", **block,
    )
    for d in outs.values():
        d.set_output(True)
    return g.validate() if validate else g._validate(problem)  # the contract validated the call


def graph_for_call(problem: DgluProblem, pack: Mapping[str, torch.Tensor], *, engine: Optional[str] = None) -> Graph:
    """The built graph for a call's family (memoized; any M). ``engine`` pins an engine by name.
    Raises ``NoEngineError`` (every engine's reasons) when nothing can run it."""
    key = ("graph", problem.with_m(0), engine, _signature(pack))
    g = CALLS.get(key)
    if g is not None:
        return g
    g = declare_call_graph(problem, pack)
    g.create_execution_plans(engines=[engine] if engine is not None else None)
    g.check_support()
    g.build_plans()
    return CALLS.put(key, g)


def clear_memo() -> None:
    CALLS.clear("graph")
