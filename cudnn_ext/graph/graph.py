"""``Graph``: declare a grouped_matmul_dglu graph, then validate -> plan -> build -> execute.

Owns the declaration (tensor descriptors by uid, the node, graph-level data types and target
device), the pipeline state machine in the cuDNN frontend's order (``validate``,
``build_operation_graph``, one-shot ``create_execution_plans``, ``check_support``,
``build_plans``, ``get_workspace_size``, ``execute``), and the graph's serial form
(:class:`GraphSpec`). Input rules are the contract's (``translate``); ranking, building,
workspace and binding are the plan layer's (``cudnn_ext.plan``): this module holds no engine
or kernel knowledge and names no engine.
"""
from __future__ import annotations

import itertools
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

import torch

from ..contract.rules import check_call_offsets, offsets_checked_every_call
from ..engines import heuristics as heur
from ..engines.registry import ENGINES, engine_by_id, engine_by_name
from ..plan.execution import PlanSet
from ..runtime.streams import as_torch_stream, launch_stream, on_stream
from ..runtime.workspace import check_workspace
from . import serialize
from .nodes import (INPUT_PORTS, M_PORTS, OUTPUT_PORTS, PORT_ALIGN, SF_PORTS, GroupedMatmulDgluAttrs, Node,
                    infer_outputs)
from .spec import GraphSpec
from .translate import node_problem, sf_geometry
from .types import BuildPlanPolicy, DataType, TensorDesc, data_type_or_none, row_major_strides
from .variant_pack import SlotSpec, VariantPackBinder


class DgluOutputs(NamedTuple):
    """Output descriptors of a ``grouped_matmul_dglu`` node (None where not generated).

    The BF16 outputs come first (``d_row, dprob, dbias, activation = outs[:4]``); the
    block-scaled ones follow."""

    d_row: TensorDesc
    dprob: Optional[TensorDesc]
    dbias: Optional[TensorDesc]
    activation: Optional[TensorDesc]
    d_col: Optional[TensorDesc] = None
    amax: Optional[TensorDesc] = None
    sfd_row: Optional[TensorDesc] = None
    sfd_col: Optional[TensorDesc] = None


_graph_ids = itertools.count()


def _device_or_none(device) -> Optional[torch.device]:
    """The graph's device argument as a torch.device; a bad one raises a ValueError naming it."""
    if device is None or isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: expected a torch.device or a device string such as 'cuda:0', "
                         f"got {device!r}") from err


def _int_tuple(name: str, what: str, value) -> tuple:
    """``dim``/``stride`` as a tuple; anything but a sequence raises a TypeError naming it (the
    elements are checked by the descriptor)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"tensor {name!r}: {what}: expected a sequence of ints, got {value!r}")
    return tuple(value)


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class Graph:
    """A cuDNN-style operation graph holding one ``grouped_matmul_dglu`` node.

    ``io_data_type`` is the default data type of declared tensors (and of ``d_row``);
    ``compute_data_type`` is the accumulation type (float32). ``device`` is where the graph
    will run (default: the device of the first ``tensor_like`` tensor, else CUDA when
    available, else CPU). With ``dynamic_m`` (the default) the token count M of the bound
    tensors may differ from the declared one on every execute.
    """

    def __init__(self, name: str = "graph", io_data_type=None, compute_data_type=DataType.FLOAT, *,
                 intermediate_data_type=None, device=None, dynamic_m: bool = True):
        self.name = str(name)
        self.io_data_type = data_type_or_none(io_data_type)
        self.compute_data_type = DataType.of(compute_data_type) if compute_data_type is not None else DataType.FLOAT
        self.intermediate_data_type = data_type_or_none(intermediate_data_type)  # accepted for vendor parity
        self.device: Optional[torch.device] = _device_or_none(device)
        self.dynamic_m = bool(dynamic_m)
        self._tensors: Dict[int, TensorDesc] = {}
        self._nodes: List[Node] = []
        self._next_uid = 1
        self._frozen = False
        self._problem = None
        self._binder = None
        self._plans = None  # cudnn_ext.plan.execution.PlanSet
        self._id = next(_graph_ids)

    # ================================================================== declaration
    def _ensure_mutable(self, what: str) -> None:
        if self._frozen:
            raise RuntimeError(f"{what}: the graph is frozen after create_execution_plans(); build a new graph")

    def _new_uid(self) -> int:
        while self._next_uid in self._tensors:
            self._next_uid += 1
        uid = self._next_uid
        self._next_uid += 1
        return uid

    def _add(self, desc: TensorDesc) -> TensorDesc:
        desc._bind_owner(self)
        self._tensors[desc.uid] = desc
        self._invalidate()
        return desc

    def _invalidate(self) -> None:
        self._problem = None
        self._binder = None

    def tensor(self, name: str = "", dim: Sequence[int] = None, stride: Optional[Sequence[int]] = None,
               data_type=None, is_virtual: bool = False, uid: Optional[int] = None) -> TensorDesc:
        """Declare a tensor. ``stride`` defaults to row-major; ``data_type`` to the graph's io type;
        ``uid`` is assigned when omitted (a user uid must be unique)."""
        self._ensure_mutable("tensor")
        if dim is None:
            raise ValueError(f"tensor {name!r}: dim is required")
        dim = _int_tuple(name, "dim", dim)
        if stride is not None:
            stride = _int_tuple(name, "stride", stride)
        if data_type is None:
            if self.io_data_type is None:
                raise ValueError(f"tensor {name!r}: data_type is required (the graph has no io_data_type)")
            data_type = self.io_data_type
        if uid is not None:
            if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
                raise TypeError(f"tensor {name!r}: uid must be an int >= 0, got {uid!r}")
            if uid in self._tensors:
                raise ValueError(f"tensor {name!r}: uid {uid} is already used by tensor {self._tensors[uid].name!r}")
        else:
            uid = self._new_uid()
        desc = TensorDesc(name=name or f"tensor.{uid}", dim=dim,
                          stride=tuple(stride) if stride is not None else row_major_strides(dim),
                          data_type=data_type, is_virtual=bool(is_virtual), uid=uid)
        return self._add(desc)

    def tensor_like(self, t: torch.Tensor, name: str = "", uid: Optional[int] = None) -> TensorDesc:
        """A descriptor with ``t``'s shape, strides and dtype (no data is kept). The first
        tensor's device becomes the graph's device when none was given."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor_like: expected a torch.Tensor, got {type(t).__name__}")
        if self.device is None and t.device.type != "meta":
            self.device = t.device
        return self.tensor(name=name, dim=tuple(t.shape), stride=tuple(t.stride()), data_type=t.dtype, uid=uid)

    def _set_virtual(self, uid: int, virtual: bool) -> TensorDesc:
        self._ensure_mutable("set_output")
        desc = self._tensors[uid].model_copy(update={"is_virtual": virtual})
        return self._add(desc)

    def _own(self, port: str, desc) -> Optional[TensorDesc]:
        if desc is None:
            return None
        if isinstance(desc, torch.Tensor):
            raise TypeError(f"{port}: pass a descriptor (g.tensor(...) or g.tensor_like(t)), got a torch.Tensor")
        if not isinstance(desc, TensorDesc):
            raise TypeError(f"{port}: expected a TensorDesc, got {type(desc).__name__}")
        if desc.graph is not self or desc.uid not in self._tensors:
            raise ValueError(f"{port}: tensor {desc.name!r} (uid {desc.uid}) was declared by another graph")
        return self._tensors[desc.uid]

    def grouped_matmul_dglu(
        self, a, c, padded_offsets, alpha, beta, prob=None, b=None, b_ptrs=None, *, sfa=None, sfb=None,
        sfb_ptrs=None, norm_const=None, act_func: str = "dswiglu", generate_dbias: bool = False,
        geglu_alpha: float = 1.702, glu_clamp_max: float = 7.0, glu_clamp_min: float = -7.0,
        linear_offset: Optional[float] = None, situ_beta1: float = 4.0, situ_beta2: float = 25.0,
        n: Optional[int] = None, b_dtype=None, b_major: str = "k", d_dtype=None, use_dynamic_sched: bool = False,
        round_dgrad_to_input_dtype: bool = False, generate_activation: bool = False, generate_dprob: bool = True,
        generate_amax: bool = False, sf_vec_size: int = 16, discrete_col_sfd: bool = False,
        use_single_group_runtime_offsets: bool = False, epilogue_op: Optional[str] = None,
        deterministic: bool = False, m_aligned: int = 256, recipe: Optional[str] = None,
        d_row=None, dprob=None, dbias=None, activation=None, d_col=None, amax=None, sfd_row=None, sfd_col=None,
        name: Optional[str] = None,
    ) -> DgluOutputs:
        """Add the grouped GEMM + dGLU backward node; returns its output descriptors (virtual
        until marked with ``set_output(True)``). ``b`` (dense ``(N, K, L)``) or ``b_ptrs``
        (per-expert pointers, with ``n``) gives the weights. Block-scaled (FP8/FP4) operands
        add ``sfa`` and ``sfb`` (dense) or ``sfb_ptrs`` (discrete) scale factors; ``norm_const``
        asks for a quantized D (outputs ``d_col``, ``sfd_row``, ``sfd_col``) and
        ``generate_amax`` for per-expert ``amax``. ``m_aligned``: every ``padded_offsets`` entry
        and M are multiples of it (256; BF16 operands also 1 (any size), 8, 16, 32, 64 or 128,
        which engines built around 256-row blocks decline). ``recipe="fp8_blockwise"``: e4m3
        ``a``/``b`` with fp32 ``sfa`` (1x128 blocks) and ``sfb``/``sfb_ptrs`` (128x128), cudnn_ext's
        recipe (docs/blockscaled.md). Pre-declared outputs may be passed
        (``d_row=``, ``dprob=`` ...). ``dprob`` and ``dbias`` are accumulated into (bind
        zeros), ``amax`` max-accumulated (bind ``-inf``). Input rules are checked by
        ``validate()``."""
        self._ensure_mutable("grouped_matmul_dglu")
        if self._nodes:
            raise NotImplementedError("grouped_matmul_dglu: a graph holds one grouped_matmul_dglu node")
        attrs = GroupedMatmulDgluAttrs(
            act_func=act_func, generate_dbias=generate_dbias, generate_activation=generate_activation,
            geglu_alpha=geglu_alpha, glu_clamp_max=glu_clamp_max, glu_clamp_min=glu_clamp_min,
            linear_offset=linear_offset, situ_beta1=situ_beta1, situ_beta2=situ_beta2, n=n, b_dtype=b_dtype,
            b_major=b_major, d_dtype=d_dtype, use_dynamic_sched=use_dynamic_sched,
            round_dgrad_to_input_dtype=round_dgrad_to_input_dtype, generate_dprob=generate_dprob,
            generate_amax=generate_amax, sf_vec_size=sf_vec_size, discrete_col_sfd=discrete_col_sfd,
            use_single_group_runtime_offsets=use_single_group_runtime_offsets, epilogue_op=epilogue_op,
            deterministic=deterministic, m_aligned=m_aligned, recipe=recipe,
        )
        given = dict(a=a, b=b, b_ptrs=b_ptrs, sfa=sfa, sfb=sfb, sfb_ptrs=sfb_ptrs, c=c, padded_offsets=padded_offsets,
                     alpha=alpha, beta=beta, prob=prob, norm_const=norm_const)
        inputs = {p: self._own(p, given[p]) for p in INPUT_PORTS if given[p] is not None}
        node_name = name or f"grouped_matmul_dglu.{len(self._nodes)}"
        d_dt = attrs.d_dtype or self.io_data_type or DataType.BFLOAT16
        inferred = infer_outputs(inputs, attrs, d_dt)
        user_out = dict(d_row=d_row, dprob=dprob, dbias=dbias, activation=activation, d_col=d_col, amax=amax,
                        sfd_row=sfd_row, sfd_col=sfd_col)
        outputs: Dict[str, TensorDesc] = {}
        for port in OUTPUT_PORTS:
            mine = self._own(port, user_out[port])
            if port not in inferred:
                if mine is not None:
                    why = {"dbias": "generate_dbias=False", "activation": "generate_activation=False",
                           "dprob": "generate_dprob=False", "amax": "generate_amax=False"}.get(
                        port, "no norm_const was given (a quantized D needs it)")
                    raise ValueError(f"{port}: an output tensor was given but {why}")
                continue
            if mine is None:
                dim, dt, stride = inferred[port]
                mine = self.tensor(name=f"{node_name}::{port}", dim=dim, stride=stride, data_type=dt,
                                   is_virtual=True)
            outputs[port] = mine
        self._nodes.append(Node(name=node_name, inputs={p: d.uid for p, d in inputs.items()},
                                outputs={p: d.uid for p, d in outputs.items()}, attrs=attrs))
        self._invalidate()
        return DgluOutputs(**{p: outputs.get(p) for p in DgluOutputs._fields})

    # ================================================================== queries
    @property
    def tensors(self) -> List[TensorDesc]:
        return list(self._tensors.values())

    @property
    def nodes(self) -> List[Node]:
        return list(self._nodes)

    def tensor_by_uid(self, uid: int) -> TensorDesc:
        return self._tensors[uid]

    @property
    def problem(self):
        """The validated :class:`cudnn_ext.DgluProblem` (M = the declared token count)."""
        self.validate()
        return self._problem

    def _node_ports(self, node: Node) -> Dict[str, TensorDesc]:
        return {p: self._tensors[u] for p, u in node.ports().items()}

    # ================================================================== pipeline
    def validate(self) -> "Graph":
        """Check the declaration: one node, outputs marked, every tensor used, and the node's
        tensors and attributes against the input contract. Idempotent."""
        return self._validate(None)

    def _validate(self, problem) -> "Graph":
        """``validate``; with ``problem`` (a graph declared from a call the contract has just
        normalized, ``from_call``) the structure is checked and the problem adopted, so a call
        is validated once (tests/unit/test_graph.py pins that the declaration round-trips)."""
        if self._problem is not None:
            return self
        if not self._nodes:
            raise ValueError(f"graph {self.name!r}: no node; add one with grouped_matmul_dglu(...)")
        node = self._nodes[0]
        ports = self._node_ports(node)
        for port, uid in node.outputs.items():
            if self._tensors[uid].is_virtual:
                raise ValueError(f"{node.op} node {node.name!r}: output {port!r} (tensor {self._tensors[uid].name!r}, "
                                 f"uid {uid}) is virtual; nothing consumes it, so mark it with set_output(True)")
        for port, uid in node.inputs.items():
            if self._tensors[uid].is_virtual:
                raise ValueError(f"{node.op} node {node.name!r}: input {port!r} (tensor {self._tensors[uid].name!r}) "
                                 "is virtual, but no node produces it")
        taken = {uid: f"input {port!r}" for port, uid in node.inputs.items()}
        for port, uid in node.outputs.items():
            if uid in taken:
                raise ValueError(f"{node.op} node {node.name!r}: output {port!r} is tensor "
                                 f"{self._tensors[uid].name!r} (uid {uid}), also {taken[uid]}; "
                                 "outputs need tensors of their own (no in-place D over C, no two "
                                 "outputs in one buffer)")
            taken[uid] = f"output {port!r}"
        used = set(node.ports().values())
        unused = [d for d in self._tensors.values() if d.uid not in used]
        if unused:
            raise ValueError(f"graph {self.name!r}: tensors not used by any node: "
                             + ", ".join(f"{d.name!r} (uid {d.uid})" for d in unused))
        if self.device is None:
            self.device = _default_device()
        if problem is not None:
            self._problem = problem
            return self
        acc = self.compute_data_type.torch if self.compute_data_type is not None else None
        self._problem = node_problem(node, ports, acc_dtype=acc, device=self.device)
        return self

    def build_operation_graph(self) -> "Graph":
        """Fix the slot layout the plan binds at execute (validates first if needed)."""
        self.validate()
        if self._binder is None:

            node = self._nodes[0]
            specs = []
            for port, desc in self._node_ports(node).items():
                specs.append(SlotSpec(slot=port, uid=desc.uid, name=desc.name, dtype=desc.dtype, dim=desc.dim,
                                      stride=desc.stride, m_leading=port in M_PORTS,
                                      align=PORT_ALIGN.get(port, 16),
                                      sf=sf_geometry(self._problem, port) if port in SF_PORTS else None))
            specs.sort(key=lambda s: (not s.m_leading, s.uid))
            self._binder = VariantPackBinder(specs, self.device, dynamic_m=self.dynamic_m, owner=self,
                                             m_aligned=self._problem.m_aligned)
        return self

    def create_execution_plans(self, heuristics: Optional[Sequence] = None, *, engines=None) -> "Graph":
        """Rank the plans (one-shot). ``heuristics``: modes, default ``[HeurMode.A, HeurMode.FALLBACK]``;
        ``engines``: restrict to these engine names. Raises ``NoEngineError`` with every reason."""
        if self._plans is not None:
            raise RuntimeError("create_execution_plans() was already called on this graph; planning is one-shot: "
                               "build a new graph to re-plan, or use select_plan() to switch plans")
        self.build_operation_graph()

        # (opt-in engines only when named)
        pool = ([engine_by_name(e) for e in engines] if engines is not None
                else [e for e in ENGINES if not e.opt_in])
        self._frozen = True
        try:
            self._plans = PlanSet.ranked(self._problem, heuristics if heuristics is not None else heur.DEFAULT_MODES, pool)
        except Exception:
            self._frozen = False
            raise
        return self

    def _install_plans(self, plans) -> None:
        """Use an already-made plan set (deserialization: no heuristics)."""
        if self._plans is not None:
            raise RuntimeError("the graph already has execution plans")
        self.build_operation_graph()
        self._frozen = True
        self._plans = plans

    def _plan_set(self):
        if self._plans is None:
            raise RuntimeError("no execution plans yet: call create_execution_plans() (or build()) first")
        return self._plans

    def get_execution_plan_count(self) -> int:
        return len(self._plan_set())

    def get_plan_name_at_index(self, index: int) -> str:
        return self._plan_set().name_at(self._plan_set()._check_index(index))

    def select_plan(self, index: int) -> "Graph":
        """Pin plan ``index`` strictly (its decline raises instead of walking on)."""
        self._plan_set().select(index)
        return self

    def deselect_engines(self, names: Sequence[str]) -> "Graph":
        """Bar plans whose engine name contains any of ``names`` from build_plans()."""
        if isinstance(names, str):
            names = [names]
        self._plan_set().deselect(list(names))
        return self

    def check_support(self) -> bool:
        """True when the selected plan's engine supports the graph; raises ``EngineDeclined`` otherwise."""
        self._plan_set().check_support()
        return True

    def build_plans(self, policy=BuildPlanPolicy.HEURISTICS_CHOICE) -> "Graph":
        """Build the selected plan (the first that builds, walking on declines), or every plan
        with ``BuildPlanPolicy.ALL``."""
        policy = BuildPlanPolicy(policy.value if isinstance(policy, BuildPlanPolicy) else policy)
        if self._plans is None:
            self.create_execution_plans()
        self._plans.build(all_=policy is BuildPlanPolicy.ALL)
        return self

    def build(self, heuristics: Optional[Sequence] = None) -> "Graph":
        """validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans."""
        self.validate()
        self.build_operation_graph()
        if self._plans is None:
            self.create_execution_plans(heuristics)
        self.check_support()
        return self.build_plans()

    @property
    def execution_plan(self):
        """The selected, built :class:`cudnn_ext.plan.ExecutionPlan` (builds it if needed)."""
        ps = self._plans
        if ps is None or ps.selected is None:
            self.build_plans()
            ps = self._plans
        return ps.selected

    @property
    def engine_name(self) -> str:
        return self.execution_plan.engine_name

    def get_workspace_size(self) -> int:
        """Bytes of workspace ``execute`` needs (the selected plan's layout; 0 = pass None)."""
        return self.execution_plan.workspace_size

    def bind(self, variant_pack: Mapping) -> Dict[str, torch.Tensor]:
        """The canonical slot pack for ``variant_pack`` (what execute hands the engine)."""
        self.build_operation_graph()
        return self._binder.bind(variant_pack)

    def execute(self, variant_pack: Mapping, workspace: Optional[torch.Tensor] = None, stream=None) -> None:
        """Run the selected plan on ``variant_pack`` ({descriptor | name | uid: tensor}), with a
        caller-owned ``workspace`` of ``get_workspace_size()`` bytes (None when that is 0)
        on ``stream`` (None: the current stream). Outputs are written in place; ``dprob``
        and ``dbias`` accumulate."""

        plan = self.execution_plan
        pack = self._binder.bind(variant_pack)
        check_workspace(workspace, plan.layout, pack["c"].device, pack)
        self.execute_pack(pack, workspace, launch_stream(stream, pack["c"].device))

    def execute_pack(self, pack: Mapping[str, torch.Tensor], workspace: Optional[torch.Tensor], stream) -> None:
        """Run the selected plan on a canonical slot pack (what ``bind`` returns, or what the
        contract returns for the wrapper and the class API), with a checked workspace, on
        ``stream`` (a torch stream). The one execute path of every entry point."""
        if offsets_checked_every_call():
            check_call_offsets(self.execution_plan.problem, pack, first=False)
        with on_stream(stream):
            self.execution_plan.execute(pack, workspace, stream)

    def autotune(self, variant_pack: Mapping, *, top_k: int = 4, warmup: int = 2, iters: int = 10,
                 stream=None) -> List[tuple]:
        """Time the top ``top_k`` plans on the device with the given tensors, select the fastest
        and return ``[(plan name, milliseconds)]`` in plan order. GPU only: on CPU it raises
        ``RuntimeError`` and the heuristic choice stays. Accumulated outputs (dprob, dbias, amax) are
        restored afterwards; d_row holds the last timed plan's result."""

        if self._plans is None:
            self.create_execution_plans()
        pack = self.bind(variant_pack)
        device = pack["c"].device
        heur.autotune_times([], device)  # refuses off-GPU before building anything
        ps = self._plans
        ps.build(all_=True, limit=top_k)
        built = sorted(i for i in ps.built if i < max(top_k, 1) and not ps.barred(i))
        stream = as_torch_stream(stream, device)
        saved = {k: pack[k].clone() for k in ("dprob", "dbias", "amax") if k in pack}
        workspaces = {i: torch.empty(ps.built[i].workspace_size, dtype=torch.uint8, device=device)
                      if ps.built[i].workspace_size else None for i in built}
        runners = [lambda i=i: ps.built[i].execute(pack, workspaces[i], stream) for i in built]
        try:
            times = heur.autotune_times(runners, device, stream=stream, warmup=warmup, iters=iters)
        finally:
            for k, v in saved.items():
                pack[k].copy_(v)
        best = built[min(range(len(built)), key=times.__getitem__)]
        ps.index = best
        return [(ps.name_at(i), t) for i, t in zip(built, times)]

    # ================================================================== serial form
    def spec(self) -> GraphSpec:
        self.validate()
        return GraphSpec(name=self.name, io_data_type=self.io_data_type, compute_data_type=self.compute_data_type,
                         device=str(self.device), dynamic_m=self.dynamic_m, tensors=list(self._tensors.values()),
                         nodes=list(self._nodes))

    @classmethod
    def from_spec(cls, spec: GraphSpec, *, device=None) -> "Graph":
        g = cls(spec.name, spec.io_data_type, spec.compute_data_type,
                device=device if device is not None else spec.device, dynamic_m=spec.dynamic_m)
        for t in spec.tensors:
            g._add(t.model_copy())
        g._next_uid = max(g._tensors, default=0) + 1
        g._nodes = list(spec.nodes)
        return g

    def serialize(self, include_kernels: bool = False) -> bytes:
        """The built plan as bytes (see ``cudnn_ext.graph.serialize``); ``cudnn_ext.deserialize_plan``
        rebuilds it without heuristics. ``include_kernels``: also carry the compile-cache entries
        of the plan's kernels, so the deserializing process loads them instead of compiling."""
        return serialize.serialize_plan(self, include_kernels=include_kernels)

    def __repr__(self) -> str:
        state = ("built " + self._plans.selected.describe()) if self._plans is not None and self._plans.selected \
            else ("planned" if self._plans is not None else ("validated" if self._problem is not None else "declared"))
        return f"Graph({self.name!r}, {len(self._tensors)} tensors, {len(self._nodes)} node(s), {state})"

def deserialize_plan(data: bytes):
    """Rebuild the graph and its plan from ``serialize()`` bytes; returns a built
    :class:`cudnn_ext.Graph` ready for ``execute``. No heuristics run: the recorded engine
    and knobs are built directly (its decline is an error, not a fallback)."""
    header = serialize.read_header(data)
    kernels = serialize.carried_kernels(header)  # a corrupt payload is refused before anything is built
    device = serialize.check_compatible(header)
    ref = header.plan
    try:
        engine = engine_by_id(ref.engine_id)
    except ValueError as exc:
        raise serialize.PlanFormatError(f"deserialize_plan: {exc}") from None
    if engine.name != ref.engine_name:
        raise serialize.PlanFormatError(f"deserialize_plan: engine id {ref.engine_id} is {engine.name!r} here, "
                                        f"but the plan recorded {ref.engine_name!r}")
    # before the build below, which then loads these kernels instead of compiling them
    serialize.install_kernels(kernels)
    g = Graph.from_spec(header.graph, device=device)
    g.build_operation_graph()
    g._install_plans(PlanSet.pinned_to(g.problem, engine, serialize.recorded_knobs(header, engine)))
    plan = g.execution_plan
    if plan.workspace_size != header.workspace_size:
        raise serialize.PlanFormatError(f"deserialize_plan: the rebuilt plan needs {plan.workspace_size} workspace "
                                        f"bytes, the serialized one {header.workspace_size}; the engine changed: "
                                        "re-create the plan")
    return g
