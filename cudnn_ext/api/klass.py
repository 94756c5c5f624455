"""``GroupedGemmDglu``: the class API (check_support -> compile -> execute), vendor-compatible.

Owns the sample-based lifecycle: samples describe the problem family (M may change per
call); ``check_support`` declares the samples as a ``Graph`` (``cudnn_ext.graph.from_call``)
and plans it, ``compile`` builds its plan; ``execute`` takes scratch from the library's pool
(``runtime.workspace.POOL``) unless the caller passes a workspace to
``execute``. Runtime tensors are checked against the compiled family (the contract's messages),
then bound and executed by the graph (one path, BF16 and block-scaled alike). Each object
owns its graph.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import re
from typing import Optional, Tuple

import torch

from ..errors import DtypeError, NoEngineError
from ..plan import ExecutionPlan
from ..runtime.workspace import POOL, check_workspace
from ..problem import DgluProblem
from .. import contract
from ..runtime import guards, memo
from . import call_memo
from ..runtime.streams import capturing, launch_stream, on_stream, stream_key


#: the contract's argument names -> the class API's sample arguments, for its error messages
_SAMPLE_OF = {name: f"sample_{slot}" for slot, name in contract.ARG_NAMES.items()
              if slot not in ("b_ptrs", "sfb_ptrs")}  # discrete samples are b_shape/num_experts
_SAMPLE_NAMES = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _SAMPLE_OF), key=len, reverse=True)) + r")\b")


class GroupedGemmDglu:
    """Grouped GEMM + dGLU backward as a reusable, compiled object (see docs/api.md).

    C (M, 2N) and D hold gate and up in the vendor's interleave (in every 64 columns, 32 gate
    then 32 up); a ``[gate | up]`` C gives a wrong D that no check can see: convert it with
    ``cudnn_ext.halves_to_interleaved``."""

    def __init__(
        self, sample_a, sample_c, sample_d_row, sample_d_col, sample_sfa, sample_padded_offsets, sample_alpha,
        sample_beta, sample_prob, sample_dprob, sample_b=None, sample_sfb=None, sample_dbias=None,
        num_experts: Optional[int] = None, b_shape: Optional[Tuple[int, ...]] = None,
        b_dtype: Optional[torch.dtype] = None, sample_sfd_row=None, sample_sfd_col=None, sample_amax=None,
        sample_norm_const=None, acc_dtype: Optional[torch.dtype] = None, mma_tiler_mn: Tuple[int, int] = (256, 256),
        cluster_shape_mn: Optional[Tuple[int, int]] = None, sf_vec_size: int = 16,
        sf_fp8_dtype_override: Optional[str] = None, vector_f32: bool = False, m_aligned: int = 256,
        discrete_col_sfd: bool = False, act_func: str = "dswiglu", b_major: str = "k", epilogue_op=None,
        use_dynamic_sched: bool = False, use_single_group_runtime_offsets: bool = False,
        linear_offset: Optional[float] = None, geglu_alpha: float = 1.702, glu_clamp_max: float = 7.0,
        glu_clamp_min: float = -7.0, situ_beta1: float = 4.0, situ_beta2: float = 25.0,
        round_dgrad_to_input_dtype: bool = False, sample_activation=None, _deterministic: bool = False,
        *, engine: Optional[str] = None, recipe: Optional[str] = None,
    ):
        self._cfg = contract.CallConfig.of(locals())
        self._samples = contract.Operands(
            a=sample_a, c=sample_c, d_row=sample_d_row, d_col=sample_d_col, sfa=sample_sfa,
            padded_offsets=sample_padded_offsets, alpha=sample_alpha, beta=sample_beta, prob=sample_prob,
            dprob=sample_dprob, b=sample_b, sfb=sample_sfb, dbias=sample_dbias, sfd_row=sample_sfd_row,
            sfd_col=sample_sfd_col, amax=sample_amax, norm_const=sample_norm_const, activation=sample_activation,
        )
        if _has_jax(vars(self._samples).values()):  # JAX samples (BF16): zero-copy torch views
            from .jax_arrays import as_torch_dtype, torch_args

            self._samples = contract.Operands(**torch_args(vars(self._samples), weights="b"))
            b_dtype = as_torch_dtype(b_dtype)
        self._discrete = dict(num_experts=num_experts, b_shape=b_shape, b_dtype=b_dtype)
        self._engine = engine
        self._problem: Optional[DgluProblem] = None
        self._sample_pack = None
        self._graph = None  # cudnn_ext.Graph of the samples

    @property
    def _plan(self) -> Optional[ExecutionPlan]:
        """The compiled plan (the graph's selected plan), None before ``compile``."""
        if self._graph is not None:
            ps = self._graph._plans
            return ps.selected if ps is not None else None
        return None

    @_plan.setter
    def _plan(self, plan: ExecutionPlan) -> None:  # tests substitute a plan: it lands in this object's graph
        self.check_support()
        self._graph._plans.built[self._graph._plans.index] = plan

    # ------------------------------------------------------------------ lifecycle
    def _describe(self) -> DgluProblem:
        if self._problem is not None:
            return self._problem
        ops = dataclasses.replace(self._samples)
        contract.require_tensor("sample_d_row", ops.d_row)  # the class API never allocates D
        n = b_dtype = None
        if ops.b is None:
            ne, shape, b_dtype = self._discrete["num_experts"], self._discrete["b_shape"], self._discrete["b_dtype"]
            if ne is None or shape is None or b_dtype is None:
                raise ValueError("num_experts/b_shape/b_dtype: discrete mode (no sample_b) requires all three, got "
                                 f"num_experts={ne!r}, b_shape={shape!r}, b_dtype={b_dtype!r}")
            if isinstance(shape, (str, bytes)) or not isinstance(shape, collections.abc.Sequence):
                raise TypeError(f"b_shape: expected a tuple (N, K) or (N, K, 1), got {shape!r}")
            shape = tuple(shape)
            if len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] != 1):
                raise ValueError(f"b_shape: must be (N, K) or (N, K, 1), got {shape}")
            if isinstance(ne, bool) or not isinstance(ne, int):
                raise TypeError(f"num_experts: expected an int, got {type(ne).__name__}")
            contract.check_expert_count("num_experts", ne)
            n = shape[0]
            a = contract.require_tensor("sample_a", ops.a)
            a_k = contract.drop_unit_dims("sample_a", a, 2, "(M, K)").shape[1]
            if a.dtype in contract.FP4_DTYPES:
                a_k *= 2  # packed pairs; b_shape is in logical elements, as the vendor takes it
            if shape[1] != a_k:
                raise ValueError(f"b_shape: K must equal sample_a's K = {a_k}, got {shape}")
            # stand-in pointer tables so the contract sees a discrete call of the right length;
            # the real ones come with each execute (the vendor takes sfb_ptrs there only)
            ops.b_ptrs = torch.zeros(ne, dtype=torch.int64, device=a.device)
            if a.dtype in contract.BLOCK_SCALED_DTYPES:
                ops.sfb_ptrs = torch.zeros(ne, dtype=torch.int64, device=a.device)
        elif any(v is not None for v in self._discrete.values()):
            raise ValueError("num_experts/b_shape/b_dtype: dense mode (sample_b) forbids them, got "
                             f"{ {k: v for k, v in self._discrete.items() if v is not None} }")
        gen_dbias = self._samples.dbias is not None
        try:
            self._problem, self._sample_pack = contract.normalize(ops, self._cfg, n=n, b_dtype=b_dtype,
                                                                  generate_dbias=gen_dbias)
        except (ValueError, TypeError) as err:
            if type(err) not in (ValueError, TypeError, DtypeError):
                raise
            # the contract names the wrapper's arguments; the caller passed sample_*
            raise type(err)(_SAMPLE_NAMES.sub(lambda mt: _SAMPLE_OF[mt.group(0)], str(err))) from None
        return self._problem

    def check_support(self) -> bool:
        """True if some engine can run the sampled problem; raises otherwise (typed errors,
        listing every engine's reason when none can)."""
        problem = self._describe()
        if self._graph is None:
            from ..graph.from_call import declare_call_graph

            graph = declare_call_graph(problem, self._sample_pack, name="GroupedGemmDglu")
            graph.create_execution_plans(engines=[self._engine] if self._engine else None)
            self._graph = graph
        return self._graph.check_support()

    def explain(self) -> str:
        """Which engine will run the sampled problem and why: the ranked plans (first is the
        choice, the rest its fallbacks) and every engine that declines, with its reasons.
        Compiles nothing."""
        self.check_support()
        from ..engines.heuristics import decline_reasons
        from ..engines.registry import ENGINES

        g = self._graph
        lines = ["ranked plans (the first that builds runs):"]
        lines += [f"  {i}: {g.get_plan_name_at_index(i)}" for i in range(g.get_execution_plan_count())]
        declined = decline_reasons(self._problem, ENGINES)
        if declined:
            lines.append("engines that decline:")
            lines += [f"  {name}: {'; '.join(why)}" for name, why in declined.items()]
        return "\n".join(lines)

    def compile(self) -> None:
        self.check_support()
        if self._plan is None:
            self._graph.build_plans()

    @property
    def engine_name(self) -> str:
        self.compile()
        return self._plan.engine_name

    def get_workspace_size(self) -> int:
        self.compile()
        return self._plan.workspace_size

    scratch_workspace_bytes = get_workspace_size

    def execute(
        self, a_tensor, c_tensor, d_row_tensor, d_col_tensor, sfa_tensor, padded_offsets, alpha_tensor,
        beta_tensor, prob_tensor, dprob_tensor, b_tensor=None, sfb_tensor=None, dbias_tensor=None, b_ptrs=None,
        sfb_ptrs=None, sfd_row_tensor=None, sfd_col_tensor=None, amax_tensor=None, norm_const_tensor=None,
        current_stream=None, activation_tensor=None, *, workspace: Optional[torch.Tensor] = None,
    ) -> None:
        """Run on the given tensors; outputs are written in place (dprob/dbias accumulate)."""
        plan = self._plan
        if plan is None:  # compiled once: a later execute does not ask the engines again
            self.compile()
            plan = self._plan
        problem = self._problem
        if d_row_tensor is None:  # types are checked with every other slot below
            raise ValueError("d_row_tensor: a tensor is required, got None (the class API never allocates D)")
        if problem.weight_mode == "dense" and b_ptrs is not None:
            raise ValueError("b_ptrs: the object was compiled for dense weights (sample_b); pass b_tensor")
        if problem.weight_mode == "discrete" and b_tensor is not None:
            raise ValueError("b_tensor: the object was compiled for discrete weights (b_shape); pass b_ptrs")
        if problem.generate_dbias and dbias_tensor is None:
            raise ValueError("dbias_tensor: required because the object was compiled with sample_dbias")
        if problem.generate_activation != (activation_tensor is not None):
            raise ValueError("activation_tensor: must be given exactly when sample_activation was given "
                             f"(compiled with{'out' if not problem.generate_activation else ''} it)")
        ops = contract.Operands(
            a=a_tensor, c=c_tensor, d_row=d_row_tensor, d_col=d_col_tensor, sfa=sfa_tensor,
            padded_offsets=padded_offsets, alpha=alpha_tensor, beta=beta_tensor, prob=prob_tensor,
            dprob=dprob_tensor, b=b_tensor, sfb=sfb_tensor, dbias=dbias_tensor, b_ptrs=b_ptrs, sfb_ptrs=sfb_ptrs,
            sfd_row=sfd_row_tensor, sfd_col=sfd_col_tensor, amax=amax_tensor, norm_const=norm_const_tensor,
            activation=activation_tensor,
        )
        if _has_jax(vars(ops).values()):  # JAX arrays: outputs are written in place through their views
            from .jax_arrays import torch_args

            ops = contract.Operands(**torch_args(vars(ops), weights="b", outputs=("d_row", "dprob", "dbias")))
        values = tuple(vars(ops).values())
        pack = self._replay(ops, values)
        if pack is None:
            pack = self._checked_pack(ops, values, problem)
        need = plan.workspace_size
        device = pack["c"].device
        stream = launch_stream(current_stream, device)
        if workspace is None and need and capturing(device.type == "cuda"):
            # inside a CUDA-graph capture: scratch from the graph's pool (streams.capturing)
            with on_stream(stream):
                workspace = torch.empty(need, dtype=torch.uint8, device=device)
        elif workspace is None and need:
            # the pool's scratch for (device, stream): executes on two streams never share it
            with on_stream(stream):
                workspace = POOL.scratch(need, device, stream_key(stream, device))
        elif workspace is not None:
            check_workspace(workspace, plan.layout, device,
                            {contract.ARG_NAMES.get(s, s): t for s, t in pack.items()})
        self._graph.execute_pack(pack, workspace, stream)

    def _checked_pack(self, ops, values, problem: DgluProblem):
        """The pack of a call that ``_replay`` did not match: rebuilt from the views of an
        earlier validation of the same metadata by this object (the call memo's ``"object"``
        key), else validated by the contract against the compiled problem; either way
        remembered for ``_replay``."""
        key = memo.call_key(values, ())
        if key is not None:
            key = ("object", self._graph, key)  # this object's graph: its validation, not another's
        views = memo.CALLS.get(key) if key is not None else None
        if views is not None:  # metadata validated before by this object: rebuild the views only
            pack = call_memo.rebuild(ops, views)
            self._remember(values, views)
            return pack
        n = b_dtype = None
        if problem.weight_mode == "discrete":
            n, b_dtype = problem.n, self._discrete["b_dtype"]
        got, pack = contract.normalize(ops, self._cfg, n=n, b_dtype=b_dtype, generate_dbias=problem.generate_dbias)
        if got.with_m(0) != problem.with_m(0):
            diffs = [f.name for f in dataclasses.fields(problem)
                     if f.name != "m" and getattr(got, f.name) != getattr(problem, f.name)]
            raise ValueError("execute: tensors do not match the compiled problem (only M may change); differing: "
                             + ", ".join(f"{d}: compiled {getattr(problem, d)!r}, got {getattr(got, d)!r}"
                                         for d in diffs))
        remembered = call_memo.views_of(ops, problem, pack) if key is not None else None
        if remembered is not None:
            memo.CALLS.put(key, remembered)
            self._remember(values, remembered)
        return pack

    def _replay(self, ops, values):
        """The pack of a call whose tensors match, in one C++ guard check
        (``runtime.guards``), the metadata of this object's last validated call (the call
        memo's ``"object_last"`` entry: the views of that validation, rebuilt on these tensors
        with alignment and overlap re-checked), else None."""
        last = memo.CALLS.get(("object_last", self._graph))
        if last is None:
            return None
        absent, guard, views = last
        if absent != tuple(v is None for v in values):
            return None
        try:
            hit = guard.check(*(v for v in values if v is not None))
        except Exception:  # a value the guard cannot take: the keyed path decides
            return None
        return call_memo.rebuild(ops, views) if hit else None

    def _remember(self, values, views) -> None:
        """Keep a guard of a validated call's tensors for ``_replay``."""
        guard = guards.make([v for v in values if v is not None])
        if guard is not None:
            memo.CALLS.put(("object_last", self._graph), (tuple(v is None for v in values), guard, views))

    def __call__(self, *args, **kwargs):
        return self.execute(*args, **kwargs)


def _has_jax(values) -> bool:
    # by module name, so that a torch-only caller never imports jax
    return any(type(v).__module__.split(".")[0] in ("jax", "jaxlib") for v in values if v is not None)


__all__ = ["GroupedGemmDglu", "NoEngineError"]
