"""The Hopper engine: the CuTe DSL sm_90a kernel (``cudnn_ext.kernels.sm90``) as an Engine.

Owns the host policy for that kernel: whether it can run a problem here (decline reasons),
which configurations it offers (knobs), a rough cost model to rank them, the typed compile
key and the in-process compile cache, and turning a canonical variant pack of torch tensors
into a launch. It never imports the CuTe DSL at module import (``import cudnn_ext`` must stay
light): the kernel package is imported inside :meth:`Sm90DgluEngine.build`.

Execute does no validation (the contract layer did), no allocation, no host sync and no torch
op: one launch of the compiled function, which (with dbias) zeroes the workspace's dbias
region and runs the main kernel, whose folder warp adds the fp32 column sums into the caller's
bf16 dbias with one rounding and leaves the region zero again. The torch replay's address
launcher can skip the zeroing kernel on a scratch kept zero (``zeroed_region``).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import threading
import time
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import torch

from ..problem import DgluProblem
from ..runtime.streams import current_device_index, current_stream_handle
from ..runtime.workspace import WorkspaceLayout, WorkspaceRequest
from .base import CompiledPlan, Engine, Knobs, compile_deferred

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_AB_DTYPES = (torch.bfloat16, torch.float16)
_CD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HALF_DTYPES = (torch.bfloat16, torch.float16)
TILE_NS = (64, 128)
#: CTAs per cluster along M offered for dense weights (2 = B k-tiles multicast to a CTA pair).
CLUSTER_MS = (1, 2)
#: Cluster shapes (along M, along N) offered for dense weights: (2, 2) multicasts A too.
CLUSTER_SHAPES = tuple((cm, 1) for cm in CLUSTER_MS) + ((2, 2),)
#: M-tiles per raster group, per cluster size (the schedule sweeps N-tiles inside a group).
RASTER_GROUP_M = {1: 8, 2: 4}
#: The cooperative schedule's selectable configurations (see _cooperative_applies and
#: cooperative_knobs): 2 C stages per warpgroup (4 A/B stages) below _COOP_MIN_DEEP_K (the
#: shallow rule, and K 4096-5119 at N <= 1024) ...
COOPERATIVE_KNOBS = Knobs.of(tile_n=256, c_stages=2, stages=0, raster_group_m=RASTER_GROUP_M[2],
                             scheduler="static_persistent", cluster_m=2, cooperative=True)
#: ... and at deep K 4 C stages per warpgroup with 3 A/B stages: the exposed epilogue
#: waits less on its C ring (session 20, results/session20/coopc/, bf16 C and D with dbias,
#: one process, ms against the 2-stage form: dsv3 1.313 vs 1.318, K 8192 1.482 vs 1.491,
#: K 12288 2.174 vs 2.191; the dsv3 epilogue 12.9 k vs 13.6 k cycles per tile, the
#: mainloop 1.5% longer). 3 C stages with 3 A/B stages were no faster (1.322, 1.491, 2.183).
#: The last, partial round spread along K over up to 3 clusters per unit, stream-K
#: (split_last; session 23, results/session23/sk/, bf16 C and D with dbias, round-robin in
#: one process, ms without / with: dsv3 1.319 / 1.301, K 8192 1.492 / 1.472, K 12288
#: 2.199 / 2.155, K 7168 at N 8192 2.757 / 2.723; session 22's uniform 3-way split,
#: results/session22/split4/: 1.326 / 1.320, 1.499 / 1.493, 2.208 / 2.184, 2.759 / 2.719).
#: Its workspace: 132 slots x 2 CTAs x 128 KiB = 33 MiB more.
COOPERATIVE_DEEP_KNOBS = Knobs.of(tile_n=256, c_stages=4, stages=3,
                                  raster_group_m=RASTER_GROUP_M[2],
                                  scheduler="static_persistent", cluster_m=2, cooperative=True,
                                  split_last=3)
#: 128 x 256 tiles below which ping-pong 128 x 128 keeps the GPU busier (two waves, 132 SMs)
_COOP_MIN_TILES = 264
#: Shallow K: the cooperative schedule is offered without dbias for K <= this (where it
#: measured clearly faster than ping-pong with 128-row C entries, 3-4% on qwen3; with dbias
#: it tied there; see _cooperative_applies)
_COOP_MAX_K = 2048
#: ... and, with or without dbias, for any 16-bit C and D and for dense or per-expert
#: weights, for K >= this and N <= _COOP_MAX_DEEP_N: a deep enough mainloop hides its
#: exposed epilogue's cost under the higher clock of 128 x 256 tiles (sessions 16, 18, 22,
#: 24 and 25; see _cooperative_applies)
_COOP_MIN_DEEP_K = 5120
_COOP_MAX_DEEP_N = 8192
#: ... and, dense or per-expert weights, from K = this up to _COOP_MIN_DEEP_K at N <=
#: _COOP_MAX_MID_N (the 2-stage form; session 24, dense: 1.4-1.8% faster on skew in three
#: processes, a tie on uniform groups of skew's size and on skew's sizes at N 2048, slower
#: at N 2048 with uniform groups and at K 2048; session 25, per-expert: 2-4% faster on
#: skew; see _cooperative_applies)
_COOP_MIN_MID_K = 4096
_COOP_MAX_MID_N = 1024
#: Ping-pong 128-wide tiles use 64-row C ring entries (c_split 2) with discrete weights only
#: for K <= this (dense weights: any K): halving the C entries lets one half's D store and C
#: reload overlap the other half's math; with per-expert weights it measured slower at
#: K 4096 (mixtral) and faster at K 2048 (qwen3); see knob_space
_C_SPLIT_DISCRETE_MAX_K = 2048
_INT32_MAX = 2**31 - 1
#: Bytes of one expert's B TMA descriptor in the workspace (discrete weights), vendor_facts 4.5.
DESC_BYTES = 128
#: CTAs a trace region holds (the trace knob); the kernel module's TRACE_MAX_CTAS, restated
#: here so the engine needs no DSL import (a CPU test pins that they agree)
TRACE_MAX_CTAS = 256
#: the trace knob's bound (tiles recorded per math warpgroup), the kernel module's as well
TRACE_MAX_TILES = 4096
#: the largest split_last (knob check before anything compiles), the kernel module's SPLIT_MAX
SPLIT_MAX = 4

@dataclass(frozen=True)
class Sm90CompileKey:
    """What one compiled SM90 kernel is specialized on. Never M, L, pointers or the runtime
    activation constants (geglu alpha, clamps, linear_offset are kernel arguments)."""

    arch: str
    n: int
    k: int
    ab_dtype: str
    c_dtype: str
    d_dtype: str
    act_func: str
    generate_dbias: bool
    weight_mode: str  # "dense" | "discrete" (b_ptrs: per-expert TMA descriptors)
    b_major: str  # "k" | "n" (dense or discrete)
    tile_n: int
    ab_stages: int
    raster_group_m: int
    c_stages: int = 0
    #: CTAs per cluster along M (2: B k-tiles multicast to both CTAs; dense or discrete B)
    cluster_m: int = 1
    #: CTAs per cluster along N (2, with cluster_m 2: A k-tiles multicast too; dense B only)
    cluster_n: int = 1
    #: fresh outputs (the functional op): the launch zeroes dprob and D's tail rows itself
    #: and assigns dbias; False = the contract (accumulate, tail untouched)
    init_outputs: bool = False
    #: schedule of the math warpgroups: False = ping-pong 128 x tile_n tiles each, True =
    #: cooperative (both share each 128 x tile_n tile; tile_n up to 256)
    cooperative: bool = False
    #: ping-pong C ring entries of 128 / c_split rows (2: each C block loaded, computed,
    #: released and D-stored in two 64-row halves)
    c_split: int = 1
    #: the workspace's dbias region arrives zero (a scratch kept zero by these launches):
    #: no zeroing kernel before the main one (host convention; same device code)
    ws_zeroed: bool = False
    #: host calling convention (TVM-FFI when apache-tvm-ffi is installed); not device code
    tvm_ffi: bool = False
    #: per-tile timeline stamps (Sm90KernelConfig.trace; a diagnostic knob, never chosen by
    #: the engine): tiles per math warpgroup recorded, 0 = off
    trace: int = 0
    #: cooperative only: the last, partial round of the static schedule spread along K
    #: over up to rem x this many clusters, stream-K (Sm90KernelConfig.split_last; 1 = off)
    split_last: int = 1

    @classmethod
    def of(cls, problem: DgluProblem, knobs: Knobs) -> "Sm90CompileKey":
        return cls(
            arch="sm_90a", n=problem.n, k=problem.k,
            ab_dtype=_DTYPE_NAMES[problem.ab_dtype], c_dtype=_DTYPE_NAMES[problem.c_dtype],
            d_dtype=_DTYPE_NAMES[problem.d_dtype], act_func=problem.act.act_func,
            generate_dbias=bool(problem.generate_dbias),
            weight_mode=problem.weight_mode, b_major=problem.b_major,
            tile_n=int(knobs.get("tile_n", 128)), ab_stages=int(knobs.get("stages", 0)),
            raster_group_m=int(knobs.get("raster_group_m",
                                         RASTER_GROUP_M.get(int(knobs.get("cluster_m", 1)), 8))),
            c_stages=int(knobs.get("c_stages", 0)),
            cluster_m=int(knobs.get("cluster_m", 1)),
            cluster_n=int(knobs.get("cluster_n", 1)),
            cooperative=bool(knobs.get("cooperative", False)),
            c_split=int(knobs.get("c_split", 1)),
            tvm_ffi=importlib.util.find_spec("tvm_ffi") is not None,
            trace=int(knobs.get("trace", 0)),
            split_last=int(knobs.get("split_last", 1)),
        )

    def kernel_config(self):
        import cutlass

        from ..kernels.sm90.dglu_kernel import Sm90KernelConfig

        dt = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16, "fp32": cutlass.Float32}
        return Sm90KernelConfig(
            n=self.n, k=self.k, ab_dtype=dt[self.ab_dtype], c_dtype=dt[self.c_dtype],
            d_dtype=dt[self.d_dtype], act_func=self.act_func,
            generate_dbias=self.generate_dbias, tile_n=self.tile_n, ab_stages=self.ab_stages,
            raster_group_m=self.raster_group_m, c_stages=self.c_stages,
            weight_mode=self.weight_mode, b_major=self.b_major, cluster_m=self.cluster_m,
            cluster_n=self.cluster_n, init_outputs=self.init_outputs,
            cooperative=self.cooperative, c_split=self.c_split, ws_zeroed=self.ws_zeroed,
            trace=self.trace, split_last=self.split_last)


_compiled: Dict[Sm90CompileKey, object] = {}
_compile_seconds: Dict[Sm90CompileKey, float] = {}
_compile_lock = threading.Lock()


def compile_cached(key: Sm90CompileKey):
    """The compiled kernel for ``key``, compiling it once per process (thread-safe)."""
    fn = _compiled.get(key)
    if fn is not None:
        return fn
    with _compile_lock:
        fn = _compiled.get(key)
        if fn is None:
            from ..kernels.sm90.launch import compile_kernel

            t0 = time.perf_counter()
            fn = compile_kernel(key.kernel_config(), tvm_ffi=key.tvm_ffi)
            _compile_seconds[key] = time.perf_counter() - t0
            _compiled[key] = fn
    return fn


def compile_seconds(key: Sm90CompileKey) -> Optional[float]:
    """Wall time of the first compile of ``key`` in this process (None if not compiled)."""
    return _compile_seconds.get(key)


def resident_ctas(sms: int, cluster_size: int) -> int:
    """CTAs of a persistent launch that can be resident at once on the current device: the
    SM count, or for clusters max active clusters x cluster size (a GPC's SM count need not
    divide by the cluster size, and a cluster that cannot be co-resident would run after the
    others). Asks the driver under the current CUDA context; raises if it cannot."""
    if cluster_size == 1:
        return sms
    from cutlass.utils import HardwareInfo

    return min(sms, HardwareInfo().get_max_active_clusters(cluster_size) * cluster_size)


class Sm90Plan(CompiledPlan):
    def __init__(self, problem: DgluProblem, knobs: Knobs, key: Sm90CompileKey, compiled=None):
        self.engine_name = Sm90DgluEngine.name
        self.problem = problem
        self.knobs = knobs
        self.key = key
        # compiled functions by (init_outputs, ws_zeroed): (False, False) the contract, (True,
        # False) fresh outputs, (False, True) the contract on a scratch kept zero
        self._fns = {(False, False): compiled} if compiled is not None else {}
        self._cfg = key.kernel_config()
        # the launch helpers, bound once: a relative import inside the launch made
        # Sm90Plan.execute 10.2 us per call on this project's CPU box against 3-5 us without
        # (stand-in kernel, best of 9 x 3000 calls)
        from ..kernels.sm90 import launch as _launch_mod
        self._launch_helpers = _launch_mod
        act = problem.act
        self._consts = (float(act.geglu_alpha), float(act.clamp_max), float(act.clamp_min),
                        float(act.linear_offset))
        # The kernel's scratch region, in 4-byte elements, as the kernel's config lays it
        # out: (dbias) the fp32 column sums (L, 2N) and one int32 arrival counter per
        # (expert, N-tile), which the kernel folds itself and leaves zero
        # (Sm90KernelConfig.fold_dbias); (split_last) one int32 flag per (last-round unit,
        # CTA of the cluster), also left zero, then 128-byte aligned the partial-sum slots
        # (Sm90KernelConfig.dbias_ws_elems, split_flags, split_part_offset, split_part_floats)
        cfg, num_experts = self._cfg, problem.num_experts
        self._split = cfg.split()  # (read per launch: _kernel_addrs)
        self._zero_ws_elems = cfg.dbias_ws_elems(num_experts) + cfg.split_flags()
        self._ws_elems = (cfg.split_part_offset(num_experts) + cfg.split_part_floats()
                          if self._split else self._zero_ws_elems)
        self._discrete = problem.weight_mode == "discrete"
        if not 0 <= key.trace <= TRACE_MAX_TILES:
            raise ValueError(f"knob trace: tiles per warpgroup to record, in [0, "
                             f"{TRACE_MAX_TILES}], got {key.trace}")
        if not 1 <= key.split_last <= SPLIT_MAX or (key.split_last > 1 and not key.cooperative):
            raise ValueError(f"knob split_last: the last round's spread (clusters per unit), in [1, "
                             f"{SPLIT_MAX}] and 1 unless cooperative, got {key.split_last} "
                             f"(cooperative={key.cooperative})")
        if key.split_last > 1 and key.c_stages > key.tile_n // 32:
            raise ValueError(f"knob c_stages: at most tile_n / 32 = {key.tile_n // 32} with "
                             f"split_last, got {key.c_stages}")
        if key.trace and self._discrete:
            raise NotImplementedError("knob trace: dense weights only (with per-expert weights "
                                      "the kernel's descriptor slot holds their descriptors)")
        # Discrete: [b_descriptors: L x 128 B][dbias_partials: L x 2N fp32], each 128-B
        # aligned (WorkspaceLayout rule). Dense: the fp32 dbias partials alone at offset 0;
        # with the trace knob [trace][dbias_partials] (the trace first: the region from
        # ``zeroed_region`` on is the one launches keep zero).
        self._layout = (WorkspaceLayout.of(self.workspace_requests())
                        if self._discrete or key.trace else None)
        self._desc_off, self._dbias_off = 0, 0
        if self._layout is not None:
            first = self._layout.region("b_descriptors" if self._discrete else "trace")
            dbias = self._layout.region(self._scratch_name())
            self._desc_off = first.offset
            self._dbias_off = dbias.offset if dbias is not None else 0

    def workspace_requests(self):
        if self._discrete:
            reqs = [WorkspaceRequest("b_descriptors", DESC_BYTES * self.problem.num_experts,
                                     DESC_BYTES)]
        elif self.key.trace:
            reqs = [WorkspaceRequest("trace", self._trace_bytes(), 128)]
        else:
            return super().workspace_requests()
        if self._ws_elems:
            reqs.append(WorkspaceRequest(self._scratch_name(), 4 * self._ws_elems, 128))
        return reqs

    def _scratch_name(self) -> str:
        """The kernel's scratch region: the dbias sums and counters, and with split_last
        its flags and partial-sum slots after them."""
        return "split_partials" if self._split else "dbias_partials"

    @property
    def workspace_size(self) -> int:
        if self._layout is not None:
            return self._layout.size
        return 4 * self._ws_elems

    def _trace_bytes(self) -> int:
        # TRACE_MAX_CTAS rows of stamps and one header row (the launch's grid)
        return 8 * 4 * (self.key.trace + 1) * 2 * (TRACE_MAX_CTAS + 1)

    def read_trace(self, workspace: torch.Tensor) -> torch.Tensor:
        """The timeline of the last launch of a ``trace`` plan from its ``workspace``: an
        int64 CPU tensor (CTAs of that launch's grid, 2 math warpgroups, trace + 1, 4), laid
        out as Sm90KernelConfig.trace says; zero stamps belong to tiles the warpgroup did
        not run. Synchronizes the device."""
        if not self.key.trace:
            raise ValueError("read_trace: this plan was built without the trace knob")
        region = self._layout.view(workspace, "trace", torch.int64)
        rows = region.view(TRACE_MAX_CTAS + 1, 2, self.key.trace + 1, 4).cpu()
        grid = int(rows[TRACE_MAX_CTAS, 0, 0, 0])
        if not 0 < grid <= TRACE_MAX_CTAS:
            raise ValueError(f"read_trace: the workspace holds no launch of up to "
                             f"{TRACE_MAX_CTAS} CTAs (grid slot {grid})")
        return rows[:grid]

    #: (device index, cluster size) -> resident CTAs, shared by every plan of the process
    _resident: Dict[tuple, int] = {}

    def _resident_ctas(self, idx: int) -> int:
        """CTAs of this plan that can be resident at once on device ``idx`` (the persistent
        grid): the SM count, or for clusters max active clusters x cluster size (a GPC's SM
        count need not divide by the cluster size, so this can be below the SM count)."""
        cl = self.key.cluster_m * self.key.cluster_n
        n = self._resident.get((idx, cl))
        if n is None:
            with torch.cuda.device(idx):
                n = resident_ctas(torch.cuda.get_device_properties(idx).multi_processor_count, cl)
            self._resident[(idx, cl)] = n
        return n

    def _fn(self, init: bool, ws_zeroed: bool = False):
        fn = self._fns.get((init, ws_zeroed))
        if fn is None:
            fn = compile_cached(dataclasses.replace(self.key, init_outputs=init, ws_zeroed=ws_zeroed))
            self._fns[(init, ws_zeroed)] = fn
        return fn

    @property
    def zeroed_region(self) -> Optional[int]:
        """Offset in the workspace of the region a launch can keep zero (the dbias sums and
        counters: every launch leaves them zero), or None without dbias. A scratch whose
        bytes from here on are zero lets ``address_launcher(..., zeroed_workspace=True)``
        skip the zeroing kernel."""
        return self._dbias_off if self._zero_ws_elems else None

    @property
    def zeroed_region_bytes(self) -> int:
        """Length of that region: the fp32 sums (L, 2N) and one int32 counter per (expert,
        N-tile) with dbias, and the split last round's flags with split_last; 0 with
        neither. Past it lie the split's partial-sum slots (never needed zero) and the
        layout's padding (discrete, trace), which launches never write."""
        return 4 * self._zero_ws_elems

    def warmup(self) -> None:
        """Compile the contract variant now (what ``execute`` runs)."""
        self._fn(False)

    def execute(self, pack, workspace=None, stream=None) -> None:
        self._launch(pack, workspace, stream, False)

    def execute_fresh(self, pack, workspace=None, stream=None) -> None:
        """Like ``execute`` on *uninitialized* ``d_row``/``dprob``/``dbias``: afterwards rows of
        D at/past the last offset are 0 and dprob/dbias hold exactly this call's sums (the
        launch zeroes and assigns them on the device: no fill kernels, no host read). M and L
        must be > 0 (there is nothing to launch otherwise: the caller zero-fills)."""
        self._launch(pack, workspace, stream, True)

    def _launch(self, pack, workspace, stream, init: bool) -> None:
        a, c = pack["a"], pack["c"]
        m = c.shape[0]
        num_experts = pack["padded_offsets"].shape[0]
        dbias = pack.get("dbias") if self.problem.generate_dbias else None
        needs = dbias is not None or self._discrete or self.key.trace or self._split
        if needs and workspace is None:
            raise ValueError(f"workspace: this plan needs {self.workspace_size} bytes, got None")
        if m == 0 or num_experts == 0:
            return
        addrs = self._kernel_addrs(
            a.data_ptr(), (pack["b_ptrs"] if self._discrete else pack["b"]).data_ptr(),
            c.data_ptr(), pack["padded_offsets"].data_ptr(), pack["alpha"].data_ptr(),
            pack["beta"].data_ptr(), pack["prob"].data_ptr(), pack["d_row"].data_ptr(),
            pack["dprob"].data_ptr(), dbias.data_ptr() if dbias is not None else 0,
            workspace.data_ptr() if workspace is not None else 0)
        fn = self._fn(init)
        dev = c.get_device()
        # None: the current stream of the tensors' device (its raw handle: no Stream object)
        handle = current_stream_handle(dev) if stream is None else stream.cuda_stream
        ctas = self._resident_ctas(dev)
        if dev != current_device_index():  # tensors on another GPU: launch in its context
            with torch.cuda.device(dev):
                self._call(fn, addrs, m, num_experts, ctas, handle)
        else:
            self._call(fn, addrs, m, num_experts, ctas, handle)

    def _kernel_addrs(self, a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace):
        """The 13 kernel addresses in ``launch._ptr_specs`` order from the operands' addresses
        (``b``: the pointer table in discrete mode; ``dbias``/``workspace`` 0 when absent)."""
        if self._discrete:
            # the kernel's helper reads the table and writes the descriptors on the device
            b_addr, b_ptrs_addr, desc_addr = a, b, workspace + self._desc_off
            if desc_addr % DESC_BYTES:
                raise ValueError(f"workspace: must be {DESC_BYTES}-byte aligned for the B "
                                 f"descriptors, got address {desc_addr:#x}")
        else:
            # (table, descriptors: unused when dense; with the trace knob, its region)
            b_addr, b_ptrs_addr = b, a
            desc_addr = a
            if self.key.trace:
                desc_addr = workspace + self._desc_off
                if desc_addr % 16:
                    raise ValueError(f"workspace: must be 16-byte aligned for the trace "
                                     f"stamps, got address {desc_addr:#x}")
        # without dbias (or split_last) the sums' slot gets dprob's address and dbias A's:
        # never read. With dbias the launch zeroes the workspace's dbias region first (unless
        # kept zero) and the kernel folds it into dbias, leaving it zero; likewise the split's
        # flags, which each final part resets.
        scratch = dprob
        if dbias or self._split:
            scratch = workspace + self._dbias_off
            if self._split and scratch % 16:
                raise ValueError(f"workspace: must be 16-byte aligned for the split last "
                                 f"round's partial sums, got address {scratch:#x}")
        return (a, b_addr, c, d_row, offsets, alpha, beta, prob, dprob, scratch, b_ptrs_addr,
                desc_addr, dbias if dbias else a)

    def address_launcher(self, init: bool, device_index: int, zeroed_workspace: bool = False):
        """The launch on raw addresses for the eager hot path (``cudnn_ext.functional``), bound once
        per (plan, variant, device): ``go(a, b, c, offsets, alpha, beta, prob, d_row, dprob,
        dbias, workspace, m)``, each an address (``b`` is the pointer table in discrete mode;
        ``dbias`` and ``workspace`` 0 when absent), launching on the current stream of
        ``device_index``, which must be the current device. The caller guarantees what
        ``execute`` checks per call (operand metadata, M > 0, L > 0, the workspace when this
        plan needs one). It skips the pack and the per-call lookups of ``execute``.

        ``zeroed_workspace`` (the contract variant with dbias): the workspace's bytes from
        ``zeroed_region`` on are zero, and the launch leaves them zero: one kernel instead
        of a zeroing kernel and the main one. The caller must keep that scratch for such
        launches only."""
        fn = self._fn(init, bool(zeroed_workspace and self._zero_ws_elems and not init))
        num_experts = self.problem.num_experts
        ctas = self._resident_ctas(device_index)
        kernel_addrs, call, raw_stream = self._kernel_addrs, self._call, current_stream_handle

        def go(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace, m):
            call(fn, kernel_addrs(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace),
                 m, num_experts, ctas, raw_stream(device_index))

        return go

    def _call(self, fn, addrs, m, num_experts, ctas, handle) -> None:
        if self.key.tvm_ffi:
            self._launch_helpers.launch_tvm_ffi(fn, addrs, m, num_experts, ctas, *self._consts,
                                                handle)
        else:
            self._launch_helpers.launch(fn, self._cfg, addrs, m, num_experts, ctas,
                                        *self._consts, handle)


class Sm90DgluEngine(Engine):
    name = "sm90_cutedsl"
    engine_id = 20100
    numerical_notes = (
        "fp32 WGMMA accumulation; sigmoid via ex2.approx/rcp.approx (~1e-6 rel); dprob and "
        "dbias via fp32 atomics (order-nondeterministic); dbias summed in fp32 and rounded to "
        "bf16 once.")

    def available(self) -> Optional[str]:
        if importlib.util.find_spec("cutlass") is None:
            return "the CuTe DSL (nvidia-cutlass-dsl) is not installed"
        if not torch.cuda.is_available():
            return "no CUDA GPU in this process"
        cap = torch.cuda.get_device_capability()
        if cap != (9, 0):
            return f"needs an sm_90 (Hopper) GPU, found sm_{cap[0]}{cap[1]}"
        return None

    def check_support(self, problem: DgluProblem) -> list:
        why = []
        if problem.is_block_scaled:
            why.append("block-scaled (FP8/FP4) inputs are not implemented on sm90")
        if problem.act.act_func not in ("dswiglu", "dgeglu"):
            why.append(f"act_func {problem.act.act_func!r} is not implemented on sm90")
        if problem.act.act_func == "dgeglu" and not problem.act.dgeglu_applies_beta:
            why.append("dgeglu without beta (block-scaled semantics) is not implemented")
        if problem.ab_dtype not in _AB_DTYPES:
            why.append(f"A/B dtype {problem.ab_dtype} is not supported (bf16, fp16)")
        if problem.c_dtype not in _CD_DTYPES:
            why.append(f"C dtype {problem.c_dtype} is not supported (bf16, fp16, fp32)")
        if problem.d_dtype not in _CD_DTYPES:
            why.append(f"D dtype {problem.d_dtype} is not supported (bf16, fp16, fp32)")
        if problem.weight_mode not in ("dense", "discrete"):
            why.append(f"weight_mode {problem.weight_mode!r} is not implemented on sm90")
        if problem.b_major not in ("k", "n"):
            why.append(f"b_major {problem.b_major!r} is not supported")
        if problem.n % 32 or problem.k % 8:
            why.append(f"needs N % 32 == 0 and K % 8 == 0, got N={problem.n}, K={problem.k}")
        if problem.generate_activation:
            why.append("the activation output is not implemented on sm90")
        if problem.round_dgrad_to_input_dtype:
            why.append("round_dgrad_to_input_dtype is not implemented on sm90")
        if not (problem.has_prob and problem.has_dprob):
            why.append("the BF16 contract needs prob and dprob")
        if problem.device_type != "cuda":
            why.append(f"tensors are on {problem.device_type!r}, not cuda")
        if max(problem.m, 1) * max(2 * problem.n, problem.k) > _INT32_MAX:
            why.append("M x max(2N, K) must stay below 2^31 (32-bit epilogue indexing)")
        return why

    def knob_space(self, problem: DgluProblem):
        """tile_n x cluster shape (1x1, 2x1: B multicast, 2x2: A and B multicast); discrete
        weights get 1x1 and 2x1 (the CTA pair shares one expert, so one device-built
        descriptor serves both halves of the multicast). Raster
        groups of 4 M-tiles with clusters: side by side on the H200 (bench_dglu variants
        t128c1m2r4 vs r8, results/NVIDIA_H200-2026-11-30-raster-stages.json) qwen3 0.135 vs
        0.147 ms, mixtral 3.17 vs 3.23, skew 0.492 vs 0.499, dsv3 1.444 vs 1.435. Plus the
        cooperative 128 x 256 configuration where it applies (``_cooperative_applies``).

        Ping-pong 128-wide tiles in 1x1 and 2x1 clusters take 64-row C ring entries
        (``c_split`` 2, ``_c_split_applies``) for 16-bit C and D of one type, with dense
        weights at any K and with discrete weights at K <= _C_SPLIT_DISCRETE_MAX_K.
        Timed round-robin in one process on the H200, bench_dglu variants t128c1m2h2 vs
        t128c1m2, ms. Session 11 (results/session11-c-half/), dense, with dbias: qwen3
        (K 2048) 0.133 vs 0.138, dsv3 1.525 vs 1.525, skew 0.507 vs 0.507, mixtral 3.125 vs
        3.097; without dbias 0.116 vs 0.120, 1.502 vs 1.515, 0.483 vs 0.492, 3.088 vs 3.108.
        Session 12 (results/session12-c-split/, two processes with dbias, one without),
        dense: qwen3 0.130 / 0.129 / 0.113 vs 0.136 / 0.135 / 0.118, dsv3 1.505 / 1.533 /
        1.528 vs 1.515 / 1.570 / 1.527, mixtral 3.184 / 3.179 / 3.121 vs 3.207 / 3.186 /
        3.148, skew 0.512 / 0.515 / 0.498 vs 0.516 / 0.516 / 0.503: at K > 2048 never slower
        beyond noise (once 0.9%, mixtral in session 11) and faster on average. Discrete:
        qwen3 0.141 / 0.136 / 0.120 vs 0.144 / 0.141 / 0.123, but mixtral (K 4096) 3.181 /
        3.237 / 3.148 vs 3.142 / 3.153 / 3.148, slower with dbias in both processes, so per-
        expert weights get it only at K <= 2048. The 1x1 and 2x2 clusters (2x2 is 4-12%
        slower than 2x1 with or without it, session 12), tile 64 and C/D types other than
        bf16 were not timed with it."""
        shapes = CLUSTER_SHAPES if problem.weight_mode == "dense" else ((1, 1), (2, 1))
        space = [Knobs.of(tile_n=t, stages=0, raster_group_m=RASTER_GROUP_M[cm],
                          scheduler="static_persistent", cluster_m=cm,
                          **({"cluster_n": cn} if cn > 1 else {}),
                          **({"c_split": 2} if self._c_split_applies(problem, t, cn) else {}))
                 for cm, cn in shapes for t in TILE_NS]
        if self._cooperative_applies(problem):
            space.append(cooperative_knobs(problem))
        return space

    @staticmethod
    def _c_split_applies(problem: DgluProblem, tile_n: int, cluster_n: int) -> bool:
        # 16-bit D of C's type (D stored through shared memory, as timed): with fp32 D
        # (register stores) the split epilogue spills 48 B at a partial N-tile
        return ((problem.weight_mode == "dense" or problem.k <= _C_SPLIT_DISCRETE_MAX_K)
                and tile_n == 128 and cluster_n == 1
                and problem.c_dtype in _HALF_DTYPES and problem.d_dtype == problem.c_dtype)

    @staticmethod
    def _cooperative_applies(problem: DgluProblem) -> bool:
        """The cooperative 128 x 256 schedule (2x1 clusters; its stages:
        ``cooperative_knobs``) is offered for 16-bit C and D, N a multiple of 256 (no padded
        tile), at least _COOP_MIN_TILES such tiles, and either K >= _COOP_MIN_DEEP_K (dense
        or per-expert weights, with or without dbias, N <= _COOP_MAX_DEEP_N), or K in
        [_COOP_MIN_MID_K, _COOP_MIN_DEEP_K) at N <= _COOP_MAX_MID_N (dense or per-expert
        weights, with or without dbias), or, for dense weights, no dbias and K
        <= _COOP_MAX_K where ping-pong cannot take 64-row C entries (C and D of different
        16-bit types).
        Per-expert weights at deep K, against ping-pong in one process (session 18,
        device_session18.sh discoop, H200, dbias, ms): dsv3 1.372 vs 1.393, K 8192 1.540
        vs 1.613, K 12288 2.267 vs 2.420.

        Why so narrow: timed round-robin against ping-pong 128 x 128 (2x1 clusters) in one
        process, each row's calls spread over 10 rounds so no row gains from its place
        (bench_dglu.py --rounds 10 --reps 60, two processes on one H200, session 9,
        results/ab-session9-heuristics/), cooperative vs ping-pong, ms:
        without dbias dsv3 1.562 / 1.592 vs 1.464 / 1.484, mixtral 3.514 / 3.496 vs 3.028 /
        3.009, skew 0.517 / 0.486 vs 0.494 / 0.470, qwen3 (K 2048) 0.115 / 0.115 vs 0.119 /
        0.119; with dbias dsv3 1.669 / 1.672 vs 1.484 / 1.497, skew 0.537 / 0.555 vs 0.510 /
        0.504, mixtral 3.841 / 3.902 vs 3.115 / 3.161, qwen3 0.141 / 0.133 vs 0.143 / 0.134.
        Session 7's rule (cooperative also with dbias for K >= 4096) rested on runs that
        timed the default row first, which flattered it; K between 2048 and 4096 is not
        measured, so the bound is where the evidence ends.

        Ping-pong with 64-row C entries (``_c_split_applies``) beat it without dbias on
        qwen3, round-robin in one process on the H200: 0.1159 vs 0.1190 ms (session 11,
        results/session11-c-half/chalf_nodb.json) and 0.1135 vs 0.1166 (session 12,
        results/session12-c-split/cl2x2_nodb.json), so it is not offered where they apply.

        Under sustained load the margins change: each kernel run back to back for 3 s (2 s
        without dbias), two passes, at the H200's 700 W cap (benchmarks/sustained.py,
        results/sustained-session9/), on dsv3, mixtral and skew the cooperative kernel holds
        ~1440 MHz and ping-pong ~1280 MHz (ping-pong needs fewer cycles, cooperative less
        energy per cycle). With dbias, ping-pong vs cooperative: dsv3 1.654 / 1.678 vs 1.654 /
        1.653 ms (a tie, then 1.6% slower), qwen3 0.131 / 0.131 vs 0.130 / 0.129 (1% slower),
        skew 0.551 / 0.553 vs 0.559 / 0.560 and mixtral 3.518 / 3.520 vs 3.642 / 3.643
        (ping-pong faster); without dbias cooperative vs ping-pong: dsv3 1.588 / 1.590
        vs 1.627 / 1.635, skew 0.525 / 0.525 vs 0.534 / 0.535 (cooperative 2-3% faster).
        The benchmark's round-robin timing is the protocol the targets are stated in, so it
        decides; those 2-3% are the price without dbias in a power-capped steady state.

        Deep K (session 16): the cooperative kernel runs at a higher SM clock than
        ping-pong (per-tile trace on dsv3, K 7168: 1.63 vs 1.38 GHz; 128 x 256 tiles read
        about 2/3 of 128 x 128's L2 bytes per MMA, and the L2 traffic sets the clock), which
        pays for its exposed epilogue (~18 k cycles per tile) once the mainloop is long
        enough. Round-robin in one process on the H200 with dbias (bench_dglu.py --variants
        t256c2m2k, results/session16/kaxis/), cooperative vs ping-pong, ms: dsv3 1.372 vs
        1.405, K 8192 (k8k) 1.544 vs 1.629, K 12288 (k12k) 2.266 vs 2.457, but K 6144 (k6k,
        N 16384) 5.261 vs 4.927 and mixtral (K 4096) 3.112 vs 2.861 (results/session16/
        coop2x2/). dsv3 with dbias in earlier sessions' single processes: 1.370 vs 1.377
        (session 13), 1.351 vs 1.360 (session 15), 1.336 vs 1.354 and 1.360 vs 1.400
        (session 16); without dbias 1.320 vs 1.361 (session 13). So from K 7168 on it was
        offered with or without dbias (K 6144 since session 22, below); between 4096 and
        7168 the evidence is k6k's loss
        (N 16384: K and N both differ from dsv3) and session 17's crossover at dsv3's N
        (results/session17/crossover/, cooperative vs ping-pong, one process): with dbias
        K 5120 1.014 vs 0.997, K 6144 1.191 vs 1.189, K 7168 1.364 vs 1.377; without dbias
        0.980 vs 0.977, 1.156 vs 1.167, 1.333 vs 1.361 (k6k 5.523 vs 4.893 and 5.259 vs
        4.875). All of it was timed with bf16 C and D; fp16 and mixed 16-bit C/D follow by
        analogy, untimed.
        Timed again after the change (results/session16/coopk/, the engine's choice against
        ping-pong): with dbias dsv3 1.336 vs 1.333, k8k 1.510 vs 1.543, k12k 2.237 vs 2.293;
        without dbias 1.299 vs 1.310, 1.471 vs 1.507, 2.171 vs 2.243.

        Session 22 (results/session22/cross2/, the deep form with its last round split in
        3, t256c4m2s3kx3, against ping-pong t128c1m2h2, round-robin in one process, dbias,
        ms): at N 2048 K 5120 0.985 vs 0.991, K 6144 1.153 vs 1.182 (session 21, unsplit:
        1.128 vs 1.146); K 6144 at N 4096 2.394 vs 2.435 and at N 8192 2.384 vs 2.436; K
        7168 at N 8192 2.748 vs 2.835; but at N 16384 K 6144 5.081 vs 4.936 and K 7168
        5.778 vs 5.739 (the engine's row, the same kernel, 6.098 in that process: the
        longest shape's times moved 5.5% between rows). So dense weights take it from K 6144
        (K 5120 is a tie) up to N 8192, and neither form at N 16384 (session 17 had it 8-13%
        slower at K 6144 there). Per-expert weights kept their measured K >= 7168, now also
        bounded by N 8192; fp16 and mixed 16-bit C/D follow by analogy, untimed. The N bound
        also sends K 8192-12288 at N > 8192 to ping-pong, untimed there (both N 16384
        shapes timed went that way). The split last round (split_last 3, part of the deep
        form) was timed against the unsplit form with dense weights only (per-expert
        weights take it too: the full benchmark's dsv3 row with them, 1.327 ms).

        Session 24 (results/session24/cross3/, the same two forms, round-robin in one
        process, dbias, ms): dense at N 2048 K 5120 0.967 vs 0.976 (the third small win
        there: 0.985 vs 0.991 in session 22, 0.961 vs 0.964 unsplit in session 21); at N
        12288 K 6144 3.787 vs 3.699 and K 7168 4.348 vs 4.289, so the N bound stays at 8192.
        So dense weights take the deep form from K 5120 (below it untimed with the split
        form; session 17 had the unsplit kernel 1.7% slower at K 5120 with dbias, before the
        epilogue got shorter). Per-expert weights at N 2048, against the 64-row C entry
        ping-pong form (t128c1m2h2, which is not theirs above K 2048: the engine gives
        them 128-row entries there, _C_SPLIT_DISCRETE_MAX_K): K 5120 0.971 vs 1.003, K 6144
        1.136 vs 1.199, dsv3 (K 7168) 1.305 vs 1.406. Against their own form (t128c1m2)
        they were untimed at K 5120-7167, so they kept K >= 7168 (until session 25, below).
        The same session's part short (results/session24/short*/, dbias, round-robin in
        one process each, ms) timed the 2-stage form (t256c2m2k) against ping-pong on the
        short-K shapes, last timed in session 9: skew (K 4096, N 1024) 0.430 vs 0.438,
        0.431 vs 0.437, 0.432 vs 0.439 (three processes); skew's L and rows in uniform
        groups 0.431 vs 0.433; skew's sizes at N 2048 0.848 vs 0.849; at K 2048 0.259 vs
        0.245; K 4096 N 2048 uniform 0.802 vs 0.790; qwen3 0.110 vs 0.107 (the deep form
        there 0.118); mixtral 2.996 vs 2.837. So dense weights take the 2-stage form at K
        4096-5119 for N <= 1024 (where it won or tied). Timed at K 4096 and N 1024 only,
        with dbias; without dbias skew measured 0.437 vs 0.441 in session 13
        (results/session13/coop/coop_nodb.log), and K 4097-5119 and N 256-768 in this
        band were untimed (session 25 timed K 4608 and N 512, below). Per-expert weights
        on skew, once (results/session24/mid/): 0.434 vs 0.449 against their ping-pong
        form (128-row C entries); they kept ping-pong there (until session 25, below).
        The full benchmark after the change (same folder): skew 0.431 ms, 0.90x of
        grouped_mm's 0.386 (0.88x on ping-pong earlier that day).

        Session 25 (results/session25/disc/, per-expert weights against their own ping-pong
        form t128c1m2, the engine's choice before the change as a control row, round-robin
        in one process, dbias, ms): the deep form at N 2048 K 5120 0.975 vs 1.017, K 6144
        1.141 vs 1.213, at K 5120 N 8192 2.023 vs 2.033, dsv3 1.309 vs 1.412 (the control
        1.311); the 2-stage form on skew 0.440 vs 0.458 and on skew's L and rows in uniform
        groups 0.438 vs 0.447. So per-expert weights follow the dense rule: the deep form
        from K 5120, the 2-stage form at K 4096-5119 for N <= 1024. The band's corners
        (results/session25/gaps/, dense against t128c1m2h2 / per-expert against t128c1m2):
        K 4608 on skew's sizes 0.488 vs 0.499 / 0.491 vs 0.509, N 512 0.241 vs 0.265 /
        0.243 vs 0.265, skew without dbias 0.429 vs 0.441 / 0.432 vs 0.449; below it
        (results/session25/shallow/, dense) K 3072 N 1024 0.350 vs 0.344, K 3072 N 512
        0.196 vs 0.197, K 2048 N 512 0.147 vs 0.147, so the band starts at K 4096. At N
        768 (results/session25/edges/) 0.329 vs 0.340 dense, 0.332 vs 0.344 per-expert; at
        N 1536 skew's sizes 0.629 vs 0.643 but uniform groups 0.632 vs 0.627 (edges2/; the
        engine cannot see the groups' sizes), so the N edge stays at 1024. N 256 in the band
        (below the tile floor on skew's rows) and the shallow rule with per-expert weights
        stay untimed.

        The smallest benchmark shape has 384 wide tiles; the _COOP_MIN_TILES floor (two
        waves on 132 SMs, below which halving the tile count costs parallelism) is a guess,
        not a measurement."""
        tiles = (max(problem.m, 256) // 128) * (problem.n // 256)
        shallow = (not problem.generate_dbias and problem.k <= _COOP_MAX_K
                   and not Sm90DgluEngine._c_split_applies(problem, 128, 1))
        # dense and per-expert weights alike (sessions 24 and 25, above); neither at N
        # 12288 or 16384 (sessions 22 and 24)
        deep = problem.k >= _COOP_MIN_DEEP_K and problem.n <= _COOP_MAX_DEEP_N
        # K 4096-5119 and N <= 1024 (skew; sessions 24 and 25, above)
        mid = (_COOP_MIN_MID_K <= problem.k < _COOP_MIN_DEEP_K
               and problem.n <= _COOP_MAX_MID_N)
        return ((deep or mid or (shallow and problem.weight_mode == "dense"))
                and problem.n % 256 == 0 and tiles >= _COOP_MIN_TILES
                and problem.c_dtype in _HALF_DTYPES and problem.d_dtype in _HALF_DTYPES)

    def cost(self, problem: DgluProblem, knobs: Knobs) -> float:
        """Microseconds: WGMMA time at ~600 TFLOP/s with N padded to the tile (~680 with B
        multicast across a 2-CTA cluster: 8-17% faster on the H200 benchmark shapes; 2x2
        clusters, A multicast too, measured 2-8% slower than 2x1 on all four shapes:
        results/NVIDIA_H200-2026-11-30-cluster2x2.json, so ranked below it), plus C/D traffic
        at ~3.5 TB/s, plus a per-tile epilogue term that favours wider tiles."""
        tile_n = int(knobs.get("tile_n", 128))
        m = max(problem.m, 256)
        n_pad = -(-problem.n // tile_n) * tile_n
        shape = (int(knobs.get("cluster_m", 1)), int(knobs.get("cluster_n", 1)))
        rate = {(2, 1): 680e6, (2, 2): 660e6}.get(shape, 600e6)
        if knobs.get("cooperative", False):
            rate = 700e6  # ranked first wherever it is offered (see _cooperative_applies)
        gemm_us = 2.0 * m * n_pad * problem.k / rate
        cd_bytes = m * 2 * problem.n * (torch.empty((), dtype=problem.c_dtype).element_size()
                                         + torch.empty((), dtype=problem.d_dtype).element_size())
        tiles = (m // 128) * (n_pad // tile_n)
        return gemm_us + cd_bytes / 3.5e6 + tiles * 0.02 * (128 / tile_n)

    def build(self, problem: DgluProblem, knobs: Knobs) -> CompiledPlan:
        key = Sm90CompileKey.of(problem, knobs)
        plan = Sm90Plan(problem, knobs, key)
        if not compile_deferred():
            plan.warmup()  # build = compile, as the class API and graph users expect
        return plan


def cooperative_knobs(problem: DgluProblem) -> Knobs:
    """The cooperative configuration offered for ``problem`` where the schedule applies
    (``Sm90DgluEngine._cooperative_applies``): the deep-K form at K >= _COOP_MIN_DEEP_K
    (where it was timed; it needs 16-bit C, as the schedule does: with 4 C stages per
    warpgroup 3 A/B stages fit), else the 2-stage form."""
    # (the 2-stage form: the shallow rule, K <= _COOP_MAX_K, and the mid one, K in
    # [_COOP_MIN_MID_K, _COOP_MIN_DEEP_K))
    return COOPERATIVE_DEEP_KNOBS if problem.k >= _COOP_MIN_DEEP_K else COOPERATIVE_KNOBS


def describe_key(key: Sm90CompileKey) -> dict:
    return asdict(key)
