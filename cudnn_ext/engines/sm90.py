"""The Hopper engine: the CuTe DSL sm_90a kernel (``cudnn_ext.kernels.sm90``) as an Engine.

Owns the host policy for that kernel: whether it can run a problem here (decline reasons),
which configurations it offers (its knob space: :class:`Sm90Config` values), the cost model
that ranks them, the in-process compile cache (keyed by the config) and turning a canonical
variant pack of torch tensors into a launch. It never imports the CuTe DSL itself:
``kernels.sm90.config`` and ``kernels.sm90.launch`` (imported when a plan is built) have no
DSL import, the DSL is imported when a kernel is compiled (a disk-cache miss) or launched in
the DSL's own convention, and the resident-CTA count asks the driver
(``runtime.occupancy``), so a process whose kernels are on disk launches them without it.

Execute does no validation (the contract layer did), no allocation, no host sync and no torch
op: one launch of the compiled function, which (with dbias) zeroes the workspace's dbias
region and runs the main kernel, whose folder warp adds the fp32 column sums into the caller's
bf16 dbias with one rounding and leaves the region zero again. The torch replay's address
launcher can skip the zeroing kernel on a scratch kept zero (``zeroed_region``).

Every threshold below rests on a measurement on the H200; the numbers are in docs/kernels.md
(heuristics table).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import time
from types import MappingProxyType
from typing import Dict, Optional

import torch

from .. import activations
from ..kernels.kernel_cache import KernelCache
from ..kernels.sm90.config import (DESC_BYTES, KERNEL_ACTS, SITU_DEFAULTS, TILE_M,
                                   TRACE_MAX_CTAS, Sm90Config, Sm90TraceConfig)
from ..problem import DgluProblem
from ..quant.formats import FP8_DTYPES
from ..runtime import caches, occupancy
from ..runtime.streams import current_device_index, current_stream_handle, on_stream
from ..runtime.workspace import WorkspaceLayout, WorkspaceRequest
from .base import CompiledPlan, Engine, compile_deferred

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
_AB_DTYPES = (torch.bfloat16, torch.float16)
_CD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HALF_DTYPES = (torch.bfloat16, torch.float16)
#: The config's fields a problem fixes (the rest are knobs and launch variants).
FAMILY_FIELDS = ("n", "k", "ab_dtype", "c_dtype", "d_dtype", "act_func", "generate_dbias",
                 "weight_mode", "b_major", "generate_activation", "round_dgrad", "geglu_beta",
                 "has_prob", "has_dprob", "generate_amax", "d_scales", "discrete_col_sfd",
                 "situ_beta1", "situ_beta2", "ragged_m", "deterministic")
TILE_NS = (64, 128)
#: CTAs per cluster along M offered for dense weights (2 = B k-tiles multicast to a CTA pair).
CLUSTER_MS = (1, 2)
#: Cluster shapes (along M, along N) offered for dense weights: (2, 2) multicasts A too. The
#: cost model never ranks 2x2 first, but it ranks it within autotune's default top 4: it stays.
CLUSTER_SHAPES = tuple((cm, 1) for cm in CLUSTER_MS) + ((2, 2),)
#: M-tiles per raster group, per cluster size: 4 with clusters measured faster on three of
#: the four benchmark shapes (docs/kernels.md)
RASTER_GROUP_M = {1: 8, 2: 4}
#: The cooperative 128 x 256 form below _COOP_MIN_DEEP_K: 2 C stages per warpgroup, the A/B
#: stages that fit (4)
COOPERATIVE_KNOBS = MappingProxyType(dict(tile_n=256, c_stages=2, cluster_m=2,
                                          raster_group_m=RASTER_GROUP_M[2], cooperative=True))
#: ... and at deep K: 4 C stages per warpgroup and 3 A/B stages (its exposed epilogue waits
#: less on its C ring), the last, partial round split along K over up to 3 clusters per unit
#: (stream-K; 33 MiB more workspace; dSwiGLU only: _SPLIT_ACTS): each measured faster there
#: (docs/kernels.md)
COOPERATIVE_DEEP_KNOBS = MappingProxyType(dict(tile_n=256, c_stages=4, ab_stages=3, cluster_m=2,
                                               raster_group_m=RASTER_GROUP_M[2],
                                               cooperative=True, split_last=3))
#: Activations whose deep-K form splits its last round: the split ran 11-14% slower with
#: dGeGLU and no faster with dSiTU-GLU (docs/kernels.md)
_SPLIT_ACTS = frozenset({"dswiglu"})
#: 128 x 256 tiles below which ping-pong 128 x 128 keeps the GPU busier: two waves on 132
#: SMs (a guess, not a measurement)
_COOP_MIN_TILES = 264
#: Shallow K: cooperative without dbias for K <= this where ping-pong cannot take 64-row C
#: entries (it measured faster there; with dbias it tied: docs/kernels.md)
_COOP_MAX_K = 2048
#: Deep K: cooperative from this K up to _COOP_MAX_DEEP_N, dense or per-expert weights, with
#: or without dbias (a deep mainloop hides the exposed epilogue under the higher clock of
#: 128 x 256 tiles; slower at N 12288 and 16384: docs/kernels.md)
_COOP_MIN_DEEP_K = 5120
_COOP_MAX_DEEP_N = 8192
#: Mid K: the 2-stage cooperative form from this K up to _COOP_MIN_DEEP_K at N <=
#: _COOP_MAX_MID_N (faster or tied there, slower at N 2048 and at K 3072: docs/kernels.md)
_COOP_MIN_MID_K = 4096
_COOP_MAX_MID_N = 1024
#: Ping-pong 128-wide tiles take 64-row C entries (c_split 2) with per-expert weights only up
#: to this K (slower at K 4096 with them; dense weights: any K): docs/kernels.md
_C_SPLIT_DISCRETE_MAX_K = 2048
_INT32_MAX = 2**31 - 1
#: The ragged schedule (m_aligned below 256) offers clusters along M from this N on, 1x1
#: below it: a pair's second tile is wasted at each expert's odd end, which B multicast pays
#: for only with wide experts (H200, bench_alignment --clusters: 1x1 faster on qwen3 and
#: skew, tied on dsv3, 2x1 18% faster on mixtral's N 14336; docs/kernels.md)
_RAGGED_MIN_CLUSTER_N = 8192


def config_for(problem: DgluProblem, **knobs) -> Sm90Config:
    """The :class:`Sm90Config` of ``problem``'s family with ``knobs`` (the config's other
    fields; ``raster_group_m`` defaults to the cluster's RASTER_GROUP_M). With ``trace`` the
    diagnostic :class:`Sm90TraceConfig`. A block-scaled problem's config is the kernel's
    that runs it after its operands are dequantized: bf16 A, dense B of the weights' major-ness, bf16 C for
    FP8 C; FP8 D is quantized by the kernel's epilogue (``d_scales``: D_row/D_col and their
    scale factors; ``engines.sm90_blockscaled``)."""
    knobs.setdefault("raster_group_m", RASTER_GROUP_M.get(knobs.get("cluster_m", 1), 8))
    det = bool(problem.deterministic and (problem.has_dprob or problem.generate_dbias))
    knobs.setdefault("fold_dbias", not det)  # (the deterministic plan folds its slabs itself)
    kind = Sm90TraceConfig if "trace" in knobs else Sm90Config
    amax = bool(problem.is_block_scaled and problem.block_scale.generate_amax)
    d_name, d_scales, col_sfd = _DTYPE_NAMES[problem.d_dtype], False, False
    if problem.is_block_scaled:
        bs = problem.block_scale
        d_scales = bool(problem.d_dtype in FP8_DTYPES and bs.generate_sfd)
        # a single group's per-expert SFD_col layout is the global one
        col_sfd = bool(d_scales and bs.discrete_col_sfd and not bs.single_group_runtime_offsets)
        problem = dense_problem(problem)
    act = problem.act
    # dSiTU-GLU's betas are compile-time constants; every other activation keeps the defaults
    betas = ((float(act.situ_beta1), float(act.situ_beta2)) if act.act_func == "dsituglu"
             else SITU_DEFAULTS)
    return kind(n=problem.n, k=problem.k, ab_dtype=_DTYPE_NAMES[problem.ab_dtype],
                c_dtype=_DTYPE_NAMES[problem.c_dtype], d_dtype=d_name,
                act_func=act.act_func, generate_dbias=bool(problem.generate_dbias),
                weight_mode=problem.weight_mode, b_major=problem.b_major,
                generate_activation=bool(problem.generate_activation),
                round_dgrad=bool(problem.round_dgrad_to_input_dtype),
                geglu_beta=act.act_func != "dgeglu" or act.dgeglu_applies_beta,
                has_prob=bool(problem.has_prob), has_dprob=bool(problem.has_dprob),
                generate_amax=amax, d_scales=d_scales, discrete_col_sfd=col_sfd,
                situ_beta1=betas[0], situ_beta2=betas[1],
                ragged_m=problem.m_aligned < 256,
                deterministic=det, **knobs)


def dense_problem(problem: DgluProblem) -> DgluProblem:
    """The BF16 problem the kernel runs for a block-scaled one after its operands are
    dequantized (``engines.sm90_blockscaled``): bf16 A, dense B of the weights' own major-ness
    (the dequantizer keeps their element order); bf16 C for FP8 C (the conversion is exact);
    D as it is (FP8 D: the kernel's epilogue quantizes it). Where dSwiGLU forms beta * C in 16
    bits (``problem.c_beta_dtype``), C is that product, in that dtype."""
    c = problem.c_beta_dtype or (torch.bfloat16 if problem.c_dtype in FP8_DTYPES else problem.c_dtype)
    return dataclasses.replace(problem, ab_dtype=torch.bfloat16, weight_mode="dense",
                               c_dtype=c, block_scale=None)


def cooperative_config(problem: DgluProblem) -> Sm90Config:
    """The cooperative configuration offered for ``problem`` where the schedule applies
    (``Sm90DgluEngine._cooperative_applies``): the deep form at K >= _COOP_MIN_DEEP_K (its
    3 A/B stages next to 4 C stages need 16-bit C, as the schedule does), else the 2-stage
    form (the shallow and mid rules)."""
    knobs = dict(COOPERATIVE_DEEP_KNOBS if problem.k >= _COOP_MIN_DEEP_K else COOPERATIVE_KNOBS)
    if _ragged_unclustered(problem):
        knobs.update(cluster_m=1, raster_group_m=RASTER_GROUP_M[1])
    if problem.deterministic or problem.act.act_func not in _SPLIT_ACTS:
        knobs.update(split_last=1)  # (deterministic: the split last round sums K in parts)
    return config_for(problem, **knobs)


def _activation_forms(problem: DgluProblem, config: Sm90Config) -> list:
    """``config`` (a problem with the activation output) in the forms offered: the staged
    store (``act_staged``: the activation through shared memory and TMA, as D) where 16-bit D
    of C's type leaves through shared memory, with C stages cut to what leaves the config's
    A/B stages room (dropped where even one C stage leaves too few); the register stores
    otherwise, and beside the staged form. Neither form of the ragged ping-pong epilogue at
    tile 128 (masked register stores: 252 B of spills; staged: 96-152 B), nor the staged
    dSiTU-GLU (12-16 B) or fp32 C and D (136 B) is offered: tests/compile/test_sm90_compile.py."""
    forms = []
    ragged_wide = problem.m_aligned < 256 and not config.cooperative and config.tile_n > 64
    if (config.d_via_smem() and problem.c_dtype in _HALF_DTYPES
            and problem.act.act_func != "dsituglu" and not ragged_wide):
        staged = dataclasses.replace(config, act_staged=True)
        while staged.ab_stages and staged.ab_stages > staged.stages_that_fit() and staged.c_stages > 1:
            staged = dataclasses.replace(staged, c_stages=staged.c_stages - 1)
        if not staged.ab_stages or staged.ab_stages <= staged.stages_that_fit():
            forms.append(staged)
    if not ragged_wide:
        forms.append(config)
    return forms


def _ragged_unclustered(problem: DgluProblem) -> bool:
    """The ragged schedule below _RAGGED_MIN_CLUSTER_N: 1x1 clusters only."""
    return problem.m_aligned < 256 and problem.n < _RAGGED_MIN_CLUSTER_N


def placement_reasons(problem: DgluProblem) -> list:
    """Why the kernel cannot take ``problem``'s tensors, whatever its operand family: not on
    a GPU, or too many elements for the epilogue's 32-bit indexing."""
    why = []
    if problem.device_type != "cuda":
        why.append(f"tensors are on {problem.device_type!r}, not cuda")
    if max(problem.m, 1) * max(2 * problem.n, problem.k) > _INT32_MAX:
        why.append("M x max(2N, K) must stay below 2^31 (32-bit epilogue indexing)")
    return why


def check_family(engine_name: str, problem: DgluProblem, knobs) -> None:
    """Refuse ``knobs`` that are not an :class:`Sm90Config` of ``problem``'s family (the
    fields ``config_for(problem)`` fixes), naming each field that differs."""
    if not isinstance(knobs, Sm90Config):
        raise TypeError(f"knobs: the {engine_name} engine builds an Sm90Config (see "
                        f"knob_space, config_for), got {type(knobs).__name__}")
    family = config_for(problem)
    wrong = [f"{f}={getattr(knobs, f)!r} (the problem's: {getattr(family, f)!r})"
             for f in FAMILY_FIELDS if getattr(knobs, f) != getattr(family, f)]
    if wrong:
        raise ValueError(f"knobs: the config is for another problem: {', '.join(wrong)}")


_kernels = KernelCache(name="sm90 kernels")
_compiled = _kernels.compiled  # config -> compiled kernel
_compile_seconds: Dict[Sm90Config, float] = {}
caches.register("sm90 compile times", _compile_seconds.clear, lambda: len(_compile_seconds))


def compile_cached(cfg: Sm90Config):
    """The compiled kernel for ``cfg``, once per process (thread-safe): loaded from the disk
    cache (``runtime.compile_cache``) when any process compiled it before."""
    return _kernels.load(cfg, lambda: _compile_timed(cfg))


def _compile_timed(cfg: Sm90Config):
    from ..kernels.sm90.launch import compile_kernel_cached

    t0 = time.perf_counter()
    fn = compile_kernel_cached(cfg)
    _compile_seconds[cfg] = time.perf_counter() - t0
    return fn


def compile_seconds(cfg: Sm90Config) -> Optional[float]:
    """Wall time of the first compile (or load from the disk cache) of ``cfg`` in this process
    (None if neither happened)."""
    return _compile_seconds.get(cfg)


#: The kernel operands a plan may or may not have, in ``Sm90Plan._required`` order.
_OPTIONAL_SLOTS = ("prob", "dprob", "activation", "amax")


def _addr(pack, slot: str) -> int:
    """The address of ``pack[slot]``, or 0 when the slot is empty."""
    t = pack.get(slot)
    return 0 if t is None else t.data_ptr()


class Sm90Plan(CompiledPlan):
    #: the workspace is needed even without dbias (discrete descriptors, split partials; the
    #: trace build's stamps), set per plan
    _always_needs_ws = False

    def __init__(self, problem: DgluProblem, config: Sm90Config, compiled=None):
        config.check()  # before anything compiles
        self.engine_name = Sm90DgluEngine.name
        self.problem = problem
        self.config = self.knobs = config
        # compiled functions by (init_outputs, ws_zeroed): (False, False) the contract, (True,
        # False) fresh outputs, (False, True) the contract on a scratch kept zero
        self._fns = {(False, False): compiled} if compiled is not None else {}
        # the launch helpers, bound once: a relative import inside the launch made
        # Sm90Plan.execute several microseconds per call more than without (no DSL import:
        # kernels.sm90.launch)
        from ..kernels.sm90 import launch as _launch_mod
        self._launch_helpers = _launch_mod
        self.tvm_ffi = _launch_mod.TVM_FFI
        act = problem.act
        self._consts = (float(act.geglu_alpha), float(act.clamp_max), float(act.clamp_min),
                        float(act.linear_offset))
        # The kernel's scratch region, in 4-byte elements (Sm90Config.zeroed_ws_elems,
        # scratch_ws_elems): the dbias sums and counters and the split's flags, which every
        # launch leaves zero, then (split_last) the partial-sum slots
        num_experts = problem.num_experts
        self._split = config.split()  # (read per launch: _kernel_addrs)
        self._zero_ws_elems = config.zeroed_ws_elems(num_experts)
        self._ws_elems = config.scratch_ws_elems(num_experts)
        self._discrete = problem.weight_mode == "discrete"
        self._blockwise = config.blockwise()  # (the fp8_blockwise recipe's scale operands)
        # which of _OPTIONAL_SLOTS the kernel touches (each launch checks their addresses)
        self._required = tuple(i for i, on in enumerate((
            config.has_prob, config.has_dprob, config.generate_activation, config.generate_amax))
            if on)
        # (ragged_m: the tile table lives in the scratch)
        self._ragged = config.ragged_m
        self._always_needs_ws = (self._discrete or self._split or self._ragged
                                 or self._always_needs_ws)
        # Discrete: [b_descriptors: L x 128 B][kernel scratch], each 128-B aligned
        # (WorkspaceLayout rule); the trace build: [trace][kernel scratch]. Otherwise the
        # scratch alone at offset 0.
        lead = self._leading_request()
        self._layout = WorkspaceLayout.of(self.workspace_requests()) if lead else None
        self._desc_off, self._dbias_off = 0, 0
        if self._layout is not None:
            scratch = self._layout.region(self._scratch_name())
            self._desc_off = self._layout.region(lead.name).offset
            self._dbias_off = scratch.offset if scratch is not None else 0

    def _leading_request(self) -> Optional[WorkspaceRequest]:
        """The region before the kernel's scratch: the discrete weights' descriptors."""
        if self._discrete:
            return WorkspaceRequest("b_descriptors", DESC_BYTES * self.problem.num_experts,
                                    DESC_BYTES)
        return None

    def workspace_requests(self):
        lead = self._leading_request()
        if lead is None:
            return super().workspace_requests()
        reqs = [lead]
        if self._ws_elems:
            reqs.append(WorkspaceRequest(self._scratch_name(), 4 * self._ws_elems, 128))
        return reqs

    def _scratch_name(self) -> str:
        """The kernel's scratch region: the dbias sums and counters, and with split_last
        its flags and partial-sum slots after them (ragged_m: then the tile table)."""
        return "split_partials" if self._split else "dbias_partials"

    @property
    def workspace_size(self) -> int:
        if self._layout is not None:
            return self._layout.size
        return 4 * self._ws_elems

    def _resident_ctas(self, idx: int) -> int:
        """CTAs of this plan that can be resident at once on device ``idx`` (the persistent
        grid): the SM count, or for clusters max active clusters x cluster size (a GPC's SM
        count need not divide by the cluster size, so this can be below the SM count)."""
        cl = self.config.cluster_size()
        with torch.cuda.device(idx):
            return occupancy.resident_ctas(torch.cuda.get_device_properties(idx).multi_processor_count, cl,
                                           ("cuda", idx))

    def _fn(self, init: bool, ws_zeroed: bool = False):
        fn = self._fns.get((init, ws_zeroed))
        if fn is None:
            fn = compile_cached(dataclasses.replace(self.config, init_outputs=init,
                                                    ws_zeroed=ws_zeroed))
            self._fns[(init, ws_zeroed)] = fn
        return fn

    @property
    def zeroed_region(self) -> Optional[int]:
        """Offset in the workspace of the region a launch can keep zero (the dbias sums and
        counters: every launch leaves them zero), or None without dbias (and in the
        deterministic form, which keeps no sums there). A scratch whose
        bytes from here on are zero lets ``address_launcher(..., zeroed_workspace=True)``
        skip the zeroing kernel."""
        return self._dbias_off if self._zero_ws_elems else None

    @property
    def zeroed_region_bytes(self) -> int:
        """Length of that region: the fp32 sums (L, 2N) and one int32 counter per (expert,
        N-tile) with dbias, and the split last round's flags with split_last; 0 with
        neither. Past it lie the split's partial-sum slots (never needed zero), the ragged
        schedule's unit table (rewritten by every ragged launch) and the layout's padding
        (discrete, trace), which launches never write."""
        return 4 * self._zero_ws_elems

    def kernel_digests(self):
        # the configs _fn handed compile_cached, which keys its compile_cache lookup by them
        from ..runtime import compile_cache

        cfgs = (dataclasses.replace(self.config, init_outputs=i, ws_zeroed=z) for i, z in self._fns)
        found = [compile_cache.digest_for("sm90", c) for c in cfgs]
        if self.config.deterministic:  # (the deterministic form's fold of its slabs)
            from ..kernels.partials.launch import FOLD

            found.append(compile_cache.digest_for("fold_partials", FOLD))
        return [d for d in found if d is not None]

    @property
    def fresh_outputs(self) -> bool:
        """Whether ``execute_fresh`` runs this plan: not the deterministic form, whose partial
        sums are added to outputs that hold their values."""
        return not self.config.deterministic

    def warmup(self) -> None:
        """Compile the contract variant now (what ``execute`` runs), and the fold of the slabs
        it launches in the deterministic form."""
        self._fn(False)
        if self.config.deterministic:
            from ..kernels.partials.launch import fold_cached

            fold_cached()

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
        # (the deterministic form's dbias sums go to a slab: no workspace of their own)
        needs = (dbias is not None and self._zero_ws_elems > 0) or self._always_needs_ws
        if needs and workspace is None:
            raise ValueError(f"workspace: this plan needs {self.workspace_size} bytes, got None")
        if m == 0 or num_experts == 0:
            return
        dprob_addr, partials = _addr(pack, "dprob"), 0
        slabs = None
        if self.config.deterministic:
            if init:
                raise NotImplementedError("execute_fresh: a deterministic plan runs through execute")
            slabs = self._partial_slabs(c, m, num_experts, stream)
            dprob_addr = slabs[0].data_ptr() if slabs[0] is not None else dprob_addr
            partials = slabs[1].data_ptr() if slabs[1] is not None else 0
        addrs = self._kernel_addrs(
            a.data_ptr(), (pack["b_ptrs"] if self._discrete else pack["b"]).data_ptr(),
            c.data_ptr(), pack["padded_offsets"].data_ptr(), pack["alpha"].data_ptr(),
            pack["beta"].data_ptr(), _addr(pack, "prob"), pack["d_row"].data_ptr(),
            dprob_addr, dbias.data_ptr() if dbias is not None else 0,
            workspace.data_ptr() if workspace is not None else 0,
            _addr(pack, "activation") if self.config.generate_activation else 0,
            _addr(pack, "amax") if self.config.generate_amax else 0,
            *((pack["sfa"].data_ptr(), pack["sfb"].data_ptr()) if self._blockwise else (0, 0)),
            partials, self._mx_addrs(pack))
        fn = self._fn(init)
        dev = c.get_device()
        # None: the current stream of the tensors' device (its raw handle: no Stream object)
        handle = current_stream_handle(dev) if stream is None else stream.cuda_stream
        ctas = self._resident_ctas(dev)
        if dev != current_device_index():  # tensors on another GPU: launch in its context
            with torch.cuda.device(dev):
                self._call(fn, addrs, m, num_experts, ctas, handle)
                self._fold_partials(slabs, pack, workspace, m, num_experts, handle)
        else:
            self._call(fn, addrs, m, num_experts, ctas, handle)
            self._fold_partials(slabs, pack, workspace, m, num_experts, handle)

    def _fold_partials(self, slabs, pack, workspace, m, num_experts, handle) -> None:
        """(deterministic) dprob += the N-tiles' partials below the last offset, and dbias +=
        each expert's M-tile sums (one rounding), each summed in one order: one launch of
        ``kernels.partials`` on the kernel's stream."""
        if slabs is None:
            return
        from ..kernels.partials.launch import ColumnFold, launch_fold

        rows, cols = slabs
        offsets = pack["padded_offsets"].data_ptr()
        columns = None
        if cols is not None:
            cfg = self.config
            if cfg.ragged_m:  # expert e's tiles end at table[e] units of cluster_m tiles
                bounds, mul, div = (workspace.data_ptr() + self._dbias_off
                                    + 4 * cfg.ragged_table_offset(num_experts), cfg.cluster_m, 1)
            else:  # ... at ceil(offs[e] / TILE_M)
                bounds, mul, div = offsets, 1, TILE_M
            # (the schedule runs whole units of cluster_m tiles, up to the last bound: offsets
            # that break the 256-row alignment leave the slab rows past them unwritten)
            columns = ColumnFold(cols.data_ptr(), pack["dbias"].data_ptr(), bounds, 2 * cfg.n,
                                 cfg.partial_tiles(m, num_experts), mul, div, cfg.cluster_m)
        parts, out, p = ((rows.data_ptr(), pack["dprob"].data_ptr(), rows.shape[0])
                         if rows is not None else (0, 0, 0))
        launch_fold(parts, out, offsets, m, p, num_experts, handle, columns)

    def _partial_slabs(self, c, m, num_experts, stream):
        """(deterministic) The (N-tiles, M) dprob partials and the (partial_tiles, 2N) dbias
        sums the kernel stores into, from the caching allocator on the launch stream (None
        where the problem has no dprob / dbias); every element the reductions read is
        written by the launch."""
        cfg = self.config
        with on_stream(stream):
            p = (torch.empty((cfg.num_n_tiles(), m), dtype=torch.float32, device=c.device)
                 if cfg.has_dprob else None)
            # (at least one row: a launch with no whole tile still passes an address)
            b = (torch.empty((max(cfg.partial_tiles(m, num_experts), 1), 2 * cfg.n),
                             dtype=torch.float32, device=c.device) if cfg.generate_dbias else None)
        return p, b

    def _mx_addrs(self, pack):
        """(D_col, SFD_row, SFD_col, norm_const) of the pack when the kernel quantizes D with
        scales, 0s otherwise."""
        if not self.config.d_scales:
            return (0, 0, 0, 0)
        return tuple(_addr(pack, name) for name in ("d_col", "sfd_row", "sfd_col", "norm_const"))

    def _kernel_addrs(self, a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace,
                      activation=0, amax=0, sfa=0, sfb=0, partials=0, mx=(0, 0, 0, 0)):
        """The 22 kernel addresses in ``build._ptr_specs`` order from the operands' addresses
        (``b``: the pointer table in discrete mode; ``prob``, ``dprob``, ``dbias``,
        ``workspace``, ``activation``, ``amax`` 0 when absent; ``sfa``, ``sfb``: the
        fp8_blockwise recipe's scales, 0 for other operands; ``partials``: the deterministic
        form's dbias slab, 0 otherwise; ``mx``: (D_col, SFD_row, SFD_col, norm_const) of a
        quantized D with scales, 0s otherwise)."""
        if self._discrete:
            # the kernel's helper reads the table and writes the descriptors on the device
            b_addr, b_ptrs_addr, desc_addr = a, b, workspace + self._desc_off
            if desc_addr % DESC_BYTES:
                raise ValueError(f"workspace: must be {DESC_BYTES}-byte aligned for the B "
                                 f"descriptors, got address {desc_addr:#x}")
        else:
            # (table, descriptors: unused when dense)
            b_addr, b_ptrs_addr = b, a
            desc_addr = a
        # without dbias sums in the workspace (no dbias, or the deterministic form's slab) and
        # without split_last or the ragged table, the sums' slot gets dprob's address and dbias
        # A's: never read. With them the launch zeroes the workspace's dbias region first
        # (unless kept zero) and the kernel folds it into dbias, leaving it zero; likewise the
        # split's flags, which each final part resets.
        scratch = dprob
        if (dbias and self._zero_ws_elems) or self._split or self._ragged:
            scratch = workspace + self._dbias_off
            if self._split and scratch % 16:
                raise ValueError(f"workspace: must be 16-byte aligned for the split last "
                                 f"round's partial sums, got address {scratch:#x}")
        if activation % 16 and self.config.act_staged:
            raise ValueError(f"activation: must be 16-byte aligned (this plan TMA-stores it), got "
                             f"address {activation:#x}")
        got = (prob, dprob, activation, amax)
        for i in self._required:
            if not got[i]:
                name = _OPTIONAL_SLOTS[i]
                raise ValueError(f"{name}: this plan reads or writes {name}, got none")
        # (an output or input the plan does not have gets A's address: never touched)
        if self.config.d_scales and not all(mx):
            raise ValueError("d_col, sfd_row, sfd_col, norm_const: this plan writes quantized D "
                             "with scales, got none for some")
        return (a, b_addr, c, d_row, offsets, alpha, beta, prob or a, dprob or a, scratch,
                b_ptrs_addr, desc_addr, dbias or a, activation or a, amax or a, sfa or a, sfb or a,
                partials or a, *(x or d_row for x in mx))

    def address_launcher(self, init: bool, device_index: int, zeroed_workspace: bool = False):
        """The launch on raw addresses for the eager hot path (``cudnn_ext.functional``), bound once
        per (plan, variant, device): ``go(a, b, c, offsets, alpha, beta, prob, d_row, dprob,
        dbias, workspace, m, activation=0, amax=0, mx=(0, 0, 0, 0))``, each an address (``b``
        is the pointer table in discrete mode; those of absent operands 0; ``mx``: quantized
        D's D_col, SFD_row, SFD_col and norm_const), launching
        on the current stream of ``device_index``, which must be the current device. The
        caller guarantees what ``execute`` checks per call (operand metadata, M > 0, L > 0,
        the workspace when this plan needs one). It skips the pack and the per-call lookups of ``execute``.

        ``zeroed_workspace`` (the contract variant with dbias): the workspace's bytes from
        ``zeroed_region`` on (``zeroed_region_bytes`` of them) are zero, and the launch leaves
        them zero: no zeroing kernel before the main one (the ragged schedule's table helper
        still runs). The caller must keep that scratch for such launches only."""
        if self.config.deterministic:  # execute allocates and reduces the partial sums
            return None
        fn = self._fn(init, bool(zeroed_workspace and self._zero_ws_elems and not init))
        num_experts = self.problem.num_experts
        ctas = self._resident_ctas(device_index)
        kernel_addrs, call, raw_stream = self._kernel_addrs, self._call, current_stream_handle
        if self.tvm_ffi:
            bound = self._launch_helpers.bind_tvm_ffi(fn, num_experts, ctas, *self._consts)

            def go(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace, m,
                   activation=0, amax=0, mx=(0, 0, 0, 0)):
                bound(kernel_addrs(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias,
                                   workspace, activation, amax, mx=mx), m, raw_stream(device_index))

            return go

        def go(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace, m,
               activation=0, amax=0, mx=(0, 0, 0, 0)):
            call(fn, kernel_addrs(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias,
                                  workspace, activation, amax, mx=mx),
                 m, num_experts, ctas, raw_stream(device_index))

        return go

    def _call(self, fn, addrs, m, num_experts, ctas, handle) -> None:
        if self.tvm_ffi:
            self._launch_helpers.launch_tvm_ffi(fn, addrs, m, num_experts, ctas, *self._consts,
                                                handle)
        else:  # the DSL's own convention takes DSL pointer objects: kernels.sm90.build
            from ..kernels.sm90.build import launch

            launch(fn, self.config, addrs, m, num_experts, ctas, *self._consts, handle)


class Sm90TracePlan(Sm90Plan):
    """A plan of the diagnostic trace build (an :class:`Sm90TraceConfig`, never in the knob
    space; ``kernels.sm90.trace``): the workspace starts with the stamps' region, which the
    launch passes in the kernel's descriptor slot (dense weights only), and ``read_trace``
    returns the last launch's stamps."""

    _always_needs_ws = True

    def _leading_request(self) -> Optional[WorkspaceRequest]:
        return WorkspaceRequest("trace", self.config.trace_bytes(), 128)

    def _kernel_addrs(self, a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace,
                      activation=0, amax=0, sfa=0, sfb=0, partials=0, mx=(0, 0, 0, 0)):
        addrs = super()._kernel_addrs(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias,
                                      workspace, activation, amax, sfa, sfb, partials, mx)
        desc_addr = workspace + self._desc_off
        if desc_addr % 16:
            raise ValueError(f"workspace: must be 16-byte aligned for the trace stamps, got "
                             f"address {desc_addr:#x}")
        return addrs[:11] + (desc_addr,) + addrs[12:]

    def read_trace(self, workspace: torch.Tensor) -> torch.Tensor:
        """The timeline of the last launch from its ``workspace``: an int64 CPU tensor (CTAs
        of that launch's grid, 2 math warpgroups, trace + 1, 4), laid out as
        :class:`Sm90TraceConfig` says; zero stamps belong to tiles the warpgroup did not run.
        Synchronizes the device."""
        region = self._layout.view(workspace, "trace", torch.int64)
        rows = region.view(TRACE_MAX_CTAS + 1, 2, self.config.trace + 1, 4).cpu()
        grid = int(rows[TRACE_MAX_CTAS, 0, 0, 0])
        if not 0 < grid <= TRACE_MAX_CTAS:
            raise ValueError(f"read_trace: the workspace holds no launch of up to "
                             f"{TRACE_MAX_CTAS} CTAs (grid slot {grid})")
        return rows[:grid]


@dataclasses.dataclass(frozen=True)
class XlaLaunch:
    """What an XLA FFI custom call of the SM90 kernel needs (``jax.ffi``): the compile-time
    config, the zeroed scratch output beside D, dprob and the fp32 dbias workspace (the
    device-built B descriptors of a discrete problem; 0 bytes otherwise), and the adapter's
    entry, compile key, buffer alignment and static keyword arguments (``cutlass_call``'s)."""

    config: Sm90Config
    scratch_bytes: int
    entry: object
    compile_key: str
    buffer_align: int
    static_kwargs: dict


class Sm90DgluEngine(Engine):
    name = "sm90_cutedsl"
    engine_id = 20100
    numerical_notes = (
        "fp32 WGMMA accumulation; sigmoid via ex2.approx/rcp.approx (~1e-6 rel); dprob and "
        "dbias via fp32 atomics (order-nondeterministic), or with deterministic=True stored "
        "per tile and summed in a fixed order; dbias summed in fp32 and rounded to bf16 once.")

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
        if problem.recipe is not None:
            why.append(f"recipe {problem.recipe!r} is not implemented on sm90 (the reference engine runs it)")
        act = activations.ACTIVATIONS.get(problem.act.act_func)
        if problem.act.act_func not in KERNEL_ACTS or act is None:
            why.append(f"act_func {problem.act.act_func!r} is not implemented on sm90")
        elif activations.BF16 not in act.contracts:
            why.append(f"act_func {problem.act.act_func!r} belongs to the block-scaled "
                       f"contract (sm90_blockscaled runs it)")
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
        if not (problem.has_prob and problem.has_dprob):
            why.append("the BF16 contract needs prob and dprob")
        return why + placement_reasons(problem)

    def xla_reasons(self, problem: DgluProblem) -> list:
        """Why the kernel cannot run ``problem`` (on a CUDA device) as an XLA FFI custom call
        (empty: it can): the engine's own reasons, and the ragged schedule, whose tile table
        needs a scratch the custom call does not carry."""
        why = list(self.check_support(problem))
        if problem.m_aligned < 256:
            why.append(f"m_aligned {problem.m_aligned}: the FFI call has no scratch for the ragged "
                       f"schedule's tile table (the host callback runs it)")
        if problem.deterministic and (problem.has_dprob or problem.generate_dbias):
            why.append("deterministic: the FFI call has no buffers for the fixed-order form's partial "
                       "sums (the host callback runs it)")
        return why

    @staticmethod
    def xla_form(config: Sm90Config) -> Sm90Config:
        """The config the FFI call compiles from an engine ``config``: dbias left unfolded (XLA
        owns the zeroed fp32 workspace, an aliased output; JAX rounds it) and no split last
        round (its flags and partial sums would need a scratch of their own)."""
        return dataclasses.replace(config, fold_dbias=False, split_last=1)

    def xla_launch(self, problem: DgluProblem, config: Sm90Config, sm_count: int,
                   grid: Optional[int] = None) -> XlaLaunch:
        """The FFI call of ``config`` (an engine config of ``problem``) on a device of
        ``sm_count`` SMs: the persistent grid (``grid`` CTAs if given) from the resident CTAs
        of its cluster size, or the SM count when the driver cannot be asked here. Imports
        the CuTe DSL."""
        from ..kernels.sm90 import jax_entry

        cfg = self.xla_form(config)
        if grid is None:
            try:
                grid = occupancy.resident_ctas(sm_count, cfg.cluster_size(), "xla")
            except Exception:  # no current CUDA context on this thread: a grid too large is
                grid = sm_count  # still correct, it only costs time (nothing is cached)
        act = problem.act
        scratch = (problem.num_experts + 1) * DESC_BYTES if problem.weight_mode == "discrete" else 0
        return XlaLaunch(cfg, scratch, jax_entry.dglu_ffi_entry, jax_entry.COMPILE_KEY, jax_entry.BUFFER_ALIGN,
                         jax_entry.static_kwargs(cfg, grid, act.geglu_alpha, act.clamp_max, act.clamp_min,
                                                 act.linear_offset))

    def knob_space(self, problem: DgluProblem):
        """Ping-pong tile_n x cluster shape (1x1; 2x1: B multicast; 2x2: A and B multicast,
        dense weights only: a discrete CTA pair shares one expert, hence one device-built
        descriptor), with 64-row C entries where ``_c_split_applies``; plus the cooperative
        128 x 256 form where ``_cooperative_applies``."""
        shapes = CLUSTER_SHAPES if problem.weight_mode == "dense" else ((1, 1), (2, 1))
        if _ragged_unclustered(problem):
            shapes = ((1, 1),)
        space = [config_for(problem, tile_n=t, cluster_m=cm, cluster_n=cn,
                            c_split=2 if self._c_split_applies(problem, t, cn) else 1)
                 for cm, cn in shapes for t in TILE_NS]
        if self._cooperative_applies(problem):
            space.append(cooperative_config(problem))
        if problem.generate_activation:
            space = [v for c in space for v in _activation_forms(problem, c)]
        return space

    @staticmethod
    def _c_split_applies(problem: DgluProblem, tile_n: int, cluster_n: int) -> bool:
        # 16-bit D of C's type (D stored through shared memory, as timed): with fp32 D
        # (register stores) the split epilogue spills 48 B at a partial N-tile
        # (dSiTU-GLU's activation output spills 4 B in it)
        return ((problem.weight_mode == "dense" or problem.k <= _C_SPLIT_DISCRETE_MAX_K)
                and tile_n == 128 and cluster_n == 1
                and problem.c_dtype in _HALF_DTYPES and problem.d_dtype == problem.c_dtype
                and not (problem.generate_activation and problem.act.act_func == "dsituglu"))

    @staticmethod
    def _cooperative_applies(problem: DgluProblem) -> bool:
        """The cooperative 128 x 256 schedule (2x1 clusters; its form:
        ``cooperative_config``) for 16-bit C and D, N a multiple of 256 (no padded tile), at
        least _COOP_MIN_TILES such tiles, and deep K (K >= _COOP_MIN_DEEP_K, N <=
        _COOP_MAX_DEEP_N), mid K (K in [_COOP_MIN_MID_K, _COOP_MIN_DEEP_K), N <=
        _COOP_MAX_MID_N) or, dense weights without dbias, shallow K (K <= _COOP_MAX_K where
        ping-pong cannot take 64-row C entries). Timed round-robin in one process against
        ping-pong 128 x 128 in 2x1 clusters, the benchmark's protocol; where the evidence
        ends, so does the rule (docs/kernels.md, heuristics table)."""
        tiles = (max(problem.m, 256) // 128) * (problem.n // 256)
        shallow = (not problem.generate_dbias and problem.k <= _COOP_MAX_K
                   and not Sm90DgluEngine._c_split_applies(problem, 128, 1))
        deep = problem.k >= _COOP_MIN_DEEP_K and problem.n <= _COOP_MAX_DEEP_N
        mid = (_COOP_MIN_MID_K <= problem.k < _COOP_MIN_DEEP_K
               and problem.n <= _COOP_MAX_MID_N)
        return ((deep or mid or (shallow and problem.weight_mode == "dense"))
                and problem.n % 256 == 0 and tiles >= _COOP_MIN_TILES
                and problem.c_dtype in _HALF_DTYPES and problem.d_dtype in _HALF_DTYPES)

    def cost(self, problem: DgluProblem, knobs: Sm90Config) -> float:
        """Microseconds: WGMMA time at ~600 TFLOP/s with N padded to the tile (~680 with B
        multicast across a 2-CTA cluster, 660 for 2x2, which measured slower than 2x1; 700
        for the cooperative form, ranked first wherever it is offered), plus C/D traffic at
        ~3.5 TB/s, plus a per-tile epilogue term that favours wider tiles."""
        tile_n = knobs.tile_n
        m = max(problem.m, 256)
        n_pad = -(-problem.n // tile_n) * tile_n
        shape = (knobs.cluster_m, knobs.cluster_n)
        rate = {(2, 1): 680e6, (2, 2): 660e6}.get(shape, 600e6)
        if knobs.cooperative:
            rate = 700e6
        gemm_us = 2.0 * m * n_pad * problem.k / rate
        cd_bytes = m * 2 * problem.n * (torch.empty((), dtype=problem.c_dtype).element_size()
                                         + torch.empty((), dtype=problem.d_dtype).element_size())
        tiles = (m // 128) * (n_pad // tile_n)
        # the activation output: 4-byte stores from the math warps; the staged form (TMA
        # stores, one A/B stage fewer where shared memory is short) ranks just behind its
        # register twin until a measurement says otherwise (docs/kernels.md)
        act_us = m * problem.n * 2 / 1.0e6 if problem.generate_activation else 0.0
        if knobs.act_staged:
            act_us += 0.5
        return gemm_us + cd_bytes / 3.5e6 + tiles * 0.02 * (128 / tile_n) + act_us

    def knobs_from_dict(self, values: dict) -> Sm90Config:
        return Sm90Config.from_dict(values)

    def build(self, problem: DgluProblem, knobs: Sm90Config) -> CompiledPlan:
        """The plan of ``knobs``, an :class:`Sm90Config` of ``problem``'s family (a value of
        ``knob_space(problem)``, ``config_for(problem, ...)``, or a serialized plan's)."""
        check_family(self.name, problem, knobs)
        plan = (Sm90TracePlan if isinstance(knobs, Sm90TraceConfig) else Sm90Plan)(problem, knobs)
        if not compile_deferred():
            plan.warmup()  # build = compile, as the class API and graph users expect
        return plan
