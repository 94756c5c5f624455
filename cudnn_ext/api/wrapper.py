"""``grouped_gemm_dglu_wrapper``: the one-call entry point, vendor keyword-compatible.

Owns output/workspace allocation for the one-call form and the ``TupleDict`` return. It
validates through ``contract`` (before allocating), then runs the call as a ``Graph``: the
memoized graph of the call's family (``cudnn_ext.graph.from_call``; a new M reuses its built
plan) binds the canonical views by slot name and executes its plan. BF16 and block-scaled
(FP8/FP4) calls take this one path.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from ..graph.from_call import graph_for_call
from ..problem import DgluProblem
from .. import contract
from ..contract import blockscaled as contract_blockscaled
from ..contract import fp8_blockwise
from ..runtime import memo
from . import call_memo
from ..runtime.streams import launch_stream, on_stream
from .tupledict import TupleDict

RESULT_KEYS = ("d_row_tensor", "d_col_tensor", "dprob_tensor", "dbias_tensor", "amax_tensor",
               "sfd_row_tensor", "sfd_col_tensor")


def grouped_gemm_dglu_wrapper(
    a_tensor, c_tensor, sfa_tensor, padded_offsets, alpha_tensor, beta_tensor, prob_tensor, dprob_tensor,
    b_tensor=None, sfb_tensor=None, generate_dbias: bool = False, b_ptrs=None, sfb_ptrs=None,
    n: Optional[int] = None, b_dtype: Optional[torch.dtype] = None, b_major: str = "k", norm_const_tensor=None,
    acc_dtype: Optional[torch.dtype] = None, d_dtype: Optional[torch.dtype] = None, cd_major: str = "n",
    mma_tiler_mn: Tuple[int, int] = (256, 256), cluster_shape_mn: Optional[Tuple[int, int]] = None,
    sf_vec_size: int = 16, sf_fp8_dtype_override: Optional[str] = None, vector_f32: bool = False,
    m_aligned: int = 256, discrete_col_sfd: bool = False, act_func: str = "dswiglu",
    linear_offset: Optional[float] = None, geglu_alpha: float = 1.702, glu_clamp_max: float = 7.0,
    glu_clamp_min: float = -7.0, situ_beta1: float = 4.0, situ_beta2: float = 25.0, epilogue_op=None,
    use_dynamic_sched: bool = False, use_single_group_runtime_offsets: bool = False, current_stream=None,
    round_dgrad_to_input_dtype: bool = False, activation_tensor=None, deterministic: bool = False,
    *, engine: Optional[str] = None, recipe: Optional[str] = None,
) -> TupleDict:
    """Grouped GEMM + dGLU backward in one call (see docs/api.md).

    Allocates D (``torch.empty``: rows past ``padded_offsets[-1]`` are unspecified), dbias
    (zeros) when ``generate_dbias``, and the workspace; accumulates into the caller's
    ``dprob_tensor`` (zero it first) and returns it as is. ``engine`` pins an engine by name.
    ``recipe="fp8_blockwise"`` (cudnn_ext's, docs/blockscaled.md): e4m3 A and B with fp32
    ``sfa_tensor`` per 1x128 block and ``sfb_tensor``/``sfb_ptrs`` per 128x128 block; with
    ``d_dtype=torch.float8_e4m3fn`` it also returns D_col and both fp32 scale tensors.
    ``c_tensor`` (M, 2N) and D hold gate and up in the vendor's interleave (in every 64
    columns, 32 gate then 32 up); a ``[gate | up]`` C gives a wrong D that no check can see:
    convert it with ``cudnn_ext.halves_to_interleaved``.
    """
    if type(a_tensor).__module__.split(".")[0] in ("jax", "jaxlib"):  # JAX arrays: DLPack views
        call = dict(locals())
        from .jax_arrays import wrapper_from_jax

        return wrapper_from_jax(grouped_gemm_dglu_wrapper, call)
    ops = contract.Operands(
        a=a_tensor, c=c_tensor, sfa=sfa_tensor, padded_offsets=padded_offsets, alpha=alpha_tensor,
        beta=beta_tensor, prob=prob_tensor, dprob=dprob_tensor, b=b_tensor, sfb=sfb_tensor, b_ptrs=b_ptrs,
        sfb_ptrs=sfb_ptrs, norm_const=norm_const_tensor, activation=activation_tensor,
    )
    scalars = (generate_dbias, n, b_dtype, b_major, acc_dtype, d_dtype, cd_major, mma_tiler_mn, cluster_shape_mn,
               sf_vec_size, sf_fp8_dtype_override, vector_f32, m_aligned, discrete_col_sfd, act_func, linear_offset,
               geglu_alpha, glu_clamp_max, glu_clamp_min, situ_beta1, situ_beta2, epilogue_op, use_dynamic_sched,
               use_single_group_runtime_offsets, round_dgrad_to_input_dtype, deterministic, engine, recipe)
    key = memo.call_key(tuple(vars(ops).values()), scalars)
    hit = call_memo.lookup(key, ops)
    if hit is not None:  # same metadata as a validated call: same problem, same built graph
        problem, graph, pack = hit  # (under CUDNN_EXT_CHECK_OFFSETS, execute_pack checks the offsets)
    else:
        if not isinstance(generate_dbias, bool):
            raise TypeError(f"generate_dbias: expected a bool, got {type(generate_dbias).__name__}")
        cfg = contract.CallConfig.of(locals())
        problem, pack = contract.normalize(ops, cfg, n=n, b_dtype=b_dtype, d_dtype=d_dtype,
                                           generate_dbias=generate_dbias)
        graph = graph_for_call(problem, pack, engine=engine)  # decline reasons surface before any allocation
        # the device check of the offsets' values: once per call signature (a few launches)
        first = call_memo.remember(key, ops, problem, graph, pack)
        contract.check_call_offsets(problem, pack, first=first)
    plan = graph.execution_plan
    device = pack["c"].device
    stream = launch_stream(current_stream, device)
    m, two_n = pack["c"].shape
    with on_stream(stream):
        result = {k: None for k in RESULT_KEYS}
        d_row = torch.empty((m, two_n, 1), dtype=problem.d_dtype, device=device)
        pack["d_row"] = d_row[..., 0]
        result["d_row_tensor"] = d_row
        if problem.generate_dbias:
            dbias = torch.zeros((problem.num_experts, two_n, 1), dtype=torch.bfloat16, device=device)
            pack["dbias"] = dbias[..., 0]
            result["dbias_tensor"] = dbias
        if problem.is_block_scaled:
            _allocate_block_scaled_outputs(problem, pack, result)
        elif problem.recipe is not None and problem.d_dtype == fp8_blockwise.FP8_BLOCKWISE_DTYPE:
            _allocate_blockwise_outputs(problem, pack, result)
        ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device=device) if plan.workspace_size else None
    graph.execute_pack(pack, ws, stream)
    result["dprob_tensor"] = dprob_tensor
    if activation_tensor is not None:
        result["activation_tensor"] = activation_tensor
    return TupleDict(result)


def _allocate_blockwise_outputs(problem: DgluProblem, pack: Dict[str, Any], result: Dict[str, Any]) -> None:
    """An FP8 D's other outputs under recipe='fp8_blockwise': D_col and the fp32 scales of
    both (MN-major, as the quantizer returns them)."""
    m, two_n = pack["c"].shape
    dev = pack["c"].device
    d_col = torch.empty((m, two_n, 1), dtype=problem.d_dtype, device=dev)
    sfd_row = fp8_blockwise.problem_scale_geometry(problem, "sfd_row").empty(m, device=dev)
    sfd_col = fp8_blockwise.problem_scale_geometry(problem, "sfd_col").empty(m, device=dev)
    pack.update(d_col=d_col[..., 0], sfd_row=sfd_row, sfd_col=sfd_col)
    result.update(d_col_tensor=d_col, sfd_row_tensor=sfd_row, sfd_col_tensor=sfd_col)


def _allocate_block_scaled_outputs(problem: DgluProblem, pack: Dict[str, Any], result: Dict[str, Any]) -> None:
    """The wrapper's outputs beyond D_row/dbias: D_col + SFD (quantized), amax (-inf)."""
    m, two_n = pack["c"].shape
    dev = pack["c"].device
    bs = problem.block_scale
    if bs.generate_sfd:
        d_col = torch.empty((m, two_n, 1), dtype=problem.d_dtype, device=dev)
        sfd_row = contract_blockscaled.problem_sf_geometry(problem, "sfd_row").empty(m, dtype=contract_blockscaled.E8M0, device=dev, fill=None)
        sfd_col = contract_blockscaled.problem_sf_geometry(problem, "sfd_col").empty(m, dtype=contract_blockscaled.E8M0, device=dev, fill=None)
        pack.update(d_col=d_col[..., 0], sfd_row=sfd_row, sfd_col=sfd_col)
        result.update(d_col_tensor=d_col, sfd_row_tensor=sfd_row, sfd_col_tensor=sfd_col)
    if bs.generate_amax:
        amax = torch.full((problem.num_experts, 2, 1), float("-inf"), dtype=torch.float32, device=dev)
        pack["amax"] = amax[..., 0]
        result["amax_tensor"] = amax
