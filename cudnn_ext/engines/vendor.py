"""The vendor engine: delegates to NVIDIA's ``GroupedGemmDgluSm100`` (nvidia-cudnn-frontend) on
Blackwell.

Owns the mapping from our canonical variant pack (``cudnn_ext.problem.SLOTS``: trailing unit
dims dropped) to the vendor's argument shapes (``(M, K, 1)``, ``(M, 2N, 1)``, ``(M, 1, 1)``,
``(L, 2N, 1)``, ``(L, 2, 1)``; B, scale factors, offsets, alpha/beta and pointer tables as they
are), the vendor's constructor configuration read from the problem, and the reasons this
engine declines. It imports ``cudnn`` lazily and holds no kernel of its own.

Why the class API and not ``grouped_gemm_dglu_wrapper_sm100``: the wrapper allocates D, dbias,
amax, SFD and the workspace itself and returns new tensors, so delegating to it would mean an
allocation and a copy per call; the class API writes into caller-owned buffers, which is our
plan contract (``execute`` writes the bound outputs in place and owns no memory). The vendor
object needs sample *tensors* to compile, and a plan is built from a problem without tensors,
so the object is created and compiled at the plan's first ``execute`` (with that call's
tensors as samples; the vendor compiles M as a symbol divisible by 256) and reused for every
later M.

Accumulation contract: nothing the caller owns is zeroed or initialized here. ``dprob`` and
``dbias`` accumulate into the bound buffers and ``amax`` is max-accumulated, as in our
contract and as the vendor kernels do (the vendor wrapper zeroes only the buffers it
allocates itself).

Not verified on hardware: no Blackwell GPU and no nvidia-cudnn-frontend installation were
available when this engine was written. The argument mapping is pinned by CPU tests against a
fake ``cudnn`` module (tests/unit/test_vendor_engine.py); the vendor's behaviour is taken from its
documentation and docs/vendor_contract.md.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from .. import activations
from ..problem import DgluProblem
from ..runtime.workspace import WorkspaceRequest
from .base import CompiledPlan, Engine, Knobs

VENDOR_MODULE = "cudnn"
VENDOR_DIST = "nvidia-cudnn-frontend"
VENDOR_CLASS = "GroupedGemmDgluSm100"

#: Architectures the vendor kernels target (vendor page "Environment"): SM100/SM103 for every
#: path, SM107 (Rubin) for the block-scaled backend only, without dSiTU-GLU (docs/vendor_contract.md §2.8).
_BLACKWELL = {(10, 0), (10, 3)}
_RUBIN = (10, 7)
#: The BF16 backend's GeGLU constants (vendor page, "BF16 contract": "BF16 also uses the source
#: GeGLU constants"; "the BF16 backend retains its fixed alpha/clamp values").
_BF16_GEGLU = (1.702, 7.0, -7.0)
_FP4 = (torch.uint8,) + tuple(getattr(torch, n) for n in ("float4_e2m1fn_x2",) if hasattr(torch, n))


def load_vendor() -> Tuple[Optional[Any], Optional[str]]:
    """(the ``cudnn`` module, None) or (None, why it cannot be used)."""
    mod = sys.modules.get(VENDOR_MODULE)
    if mod is None:
        try:
            found = importlib.util.find_spec(VENDOR_MODULE) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return None, f"{VENDOR_DIST} is not installed (no module '{VENDOR_MODULE}')"
        try:
            mod = importlib.import_module(VENDOR_MODULE)
        except Exception as exc:  # a broken install (missing libcudnn, ABI mismatch ...)
            return None, f"importing '{VENDOR_MODULE}' ({VENDOR_DIST}) failed: {type(exc).__name__}: {exc}"
    if not hasattr(mod, VENDOR_CLASS):
        version = getattr(mod, "__version__", "unknown version")
        return None, f"the installed {VENDOR_DIST} ({version}) has no cudnn.{VENDOR_CLASS}"
    # The drop-in use, ``sys.modules["cudnn"] = cudnn_ext`` (or a module re-exporting its
    # names), puts our own class under the vendor's name: delegating to it would recurse.
    if getattr(getattr(mod, VENDOR_CLASS), "__module__", "").split(".")[0] == __name__.split(".")[0]:
        return None, (f"the module named '{VENDOR_MODULE}' is cudnn_ext under the vendor's name, "
                      f"not {VENDOR_DIST}")
    return mod, None


def _capability(problem: DgluProblem) -> Tuple[int, int]:
    idx = problem.device_index if problem.device_index is not None else torch.cuda.current_device()
    return tuple(torch.cuda.get_device_capability(idx))


# ----------------------------------------------------------------------------- argument mapping
def _unit(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """(R, C) -> (R, C, 1) and (M,) -> (M, 1, 1): the vendor's ranks, as its own wrapper
    allocates them (a contiguous trailing unit dim, stride 1; unit-dim strides do not address)."""
    if t is None:
        return None
    if t.dim() == 1:  # a view, never a copy: dprob is written through it
        return t.as_strided((t.shape[0], 1, 1), (t.stride(0), 1, 1))
    return t.unsqueeze(-1) if t.dim() == 2 else t


#: slot -> (vendor execute keyword, vendor constructor keyword, reshaped to the vendor's rank?)
_ARGS = (
    ("a", "a_tensor", "sample_a", True),
    ("c", "c_tensor", "sample_c", True),
    ("d_row", "d_row_tensor", "sample_d_row", True),
    ("d_col", "d_col_tensor", "sample_d_col", True),
    ("sfa", "sfa_tensor", "sample_sfa", False),
    ("padded_offsets", "padded_offsets", "sample_padded_offsets", False),
    ("alpha", "alpha_tensor", "sample_alpha", False),
    ("beta", "beta_tensor", "sample_beta", False),
    ("prob", "prob_tensor", "sample_prob", True),
    ("dprob", "dprob_tensor", "sample_dprob", True),
    ("b", "b_tensor", "sample_b", False),
    ("sfb", "sfb_tensor", "sample_sfb", False),
    ("dbias", "dbias_tensor", "sample_dbias", True),
    ("b_ptrs", "b_ptrs", None, False),
    ("sfb_ptrs", "sfb_ptrs", None, False),
    ("sfd_row", "sfd_row_tensor", "sample_sfd_row", False),
    ("sfd_col", "sfd_col_tensor", "sample_sfd_col", False),
    ("amax", "amax_tensor", "sample_amax", True),
    ("norm_const", "norm_const_tensor", "sample_norm_const", False),
    ("activation", "activation_tensor", "sample_activation", True),
)


def execute_kwargs(pack: Mapping[str, Any]) -> Dict[str, Any]:
    """The vendor ``execute`` tensors for a canonical pack (None where a slot is absent)."""
    out = {}
    for slot, kw, _sample, reshape in _ARGS:
        t = pack.get(slot)
        out[kw] = _unit(t) if reshape else t
    return out


def constructor_kwargs(problem: DgluProblem, knobs: Knobs, pack: Mapping[str, Any]) -> Dict[str, Any]:
    """The vendor constructor's arguments: samples (this call's tensors, vendor-shaped) and the
    configuration read from the problem and the knobs."""
    ex = execute_kwargs(pack)
    kw: Dict[str, Any] = {sample: ex[execute] for _s, execute, sample, _r in _ARGS if sample is not None}
    act, bs = problem.act, problem.block_scale
    if problem.weight_mode == "discrete":
        # b_shape in logical elements (FP4: 2 per byte), as the vendor reports A's K
        kw.update(num_experts=problem.num_experts, b_shape=(problem.n, problem.k), b_dtype=problem.ab_dtype,
                  b_major=problem.b_major)
    kw.update(
        acc_dtype=torch.float32, mma_tiler_mn=(int(knobs.get("tile_m")), int(knobs.get("tile_n"))),
        cluster_shape_mn=None, m_aligned=problem.m_aligned, vector_f32=False, epilogue_op=None, act_func=act.act_func,
        linear_offset=act.linear_offset, geglu_alpha=act.geglu_alpha, glu_clamp_max=act.clamp_max,
        glu_clamp_min=act.clamp_min, situ_beta1=act.situ_beta1, situ_beta2=act.situ_beta2,
        use_dynamic_sched=problem.use_dynamic_sched,
        round_dgrad_to_input_dtype=problem.round_dgrad_to_input_dtype,
        sf_vec_size=bs.sf_vec_size if bs is not None else 16,
        discrete_col_sfd=bs.discrete_col_sfd if bs is not None else False,
        use_single_group_runtime_offsets=bs.single_group_runtime_offsets if bs is not None else False,
    )
    return kw


def vendor_workspace_bytes(problem: DgluProblem) -> int:
    """``scratch_workspace_bytes()`` of the vendor object, from the problem (docs/vendor_contract.md §4.5):
    ``max(align_up(desc + counter, 128), 128)``; desc = one 128-B TMA descriptor per expert for
    discrete B (two, B and SFB, when block-scaled), counter = 4 B with the dynamic scheduler."""
    desc = 0
    if problem.weight_mode == "discrete":
        desc = (256 if problem.is_block_scaled else 128) * problem.num_experts
    ctr = 4 if problem.use_dynamic_sched else 0
    return max(-(-(desc + ctr) // 128) * 128, 128)


# ----------------------------------------------------------------------------- plan
_RETYPED = (ValueError, TypeError, NotImplementedError, RuntimeError)


def _vendor_check(obj) -> None:
    """The vendor's own check_support, run at the plan's first execute (it needs sample
    tensors). A refusal here means cudnn_ext's check_support accepted a problem the vendor
    does not: the error keeps the vendor's type (ValueError for shapes and strides,
    NotImplementedError for disabled combinations, RuntimeError for the device;
    docs/vendor_contract.md §3.7) and message, and says which engine refused and how to pick another."""
    how = (f"{VENDOR_CLASS}.check_support (engine {VendorSm100Engine.name}) refused a problem that "
           f"cudnn_ext's support check accepted; pass engine='reference' (or build the graph with "
           f"another engine) to run it elsewhere")
    try:
        ok = obj.check_support()
    except _RETYPED as exc:
        raise type(exc)(f"{how}. {VENDOR_DIST} said: {exc}") from exc
    if ok is False:
        raise NotImplementedError(f"{how}. {VENDOR_DIST} returned False")


class _VendorPlan(CompiledPlan):
    def __init__(self, problem: DgluProblem, knobs: Knobs, module):
        self.engine_name = VendorSm100Engine.name
        self.problem = problem
        self.knobs = knobs
        self._module = module
        self._obj = None
        self._lock = threading.Lock()
        self._ws = vendor_workspace_bytes(problem)

    def workspace_requests(self):
        return [WorkspaceRequest("vendor_scratch", self._ws)]

    def _vendor_object(self, pack):
        with self._lock:
            if self._obj is None:
                obj = getattr(self._module, VENDOR_CLASS)(**constructor_kwargs(self.problem, self.knobs, pack))
                _vendor_check(obj)
                obj.compile()
                need = int(obj.scratch_workspace_bytes())
                if need > self._ws:
                    raise RuntimeError(
                        f"{VENDOR_DIST}: {VENDOR_CLASS} needs {need} workspace bytes but the plan reserved "
                        f"{self._ws} (cudnn_ext's formula, docs/vendor_contract.md §4.5, no longer matches this vendor version)")
                self._obj = obj
            return self._obj

    def execute(self, pack, workspace=None, stream=None) -> None:
        obj = self._vendor_object(pack)  # first call: the vendor compiles, with this call's tensors as samples
        ws = workspace.narrow(0, 0, self._ws) if workspace is not None else None
        dev = pack["c"].device
        if stream is None and dev.type == "cuda":  # the tensors' device's current stream
            stream = torch.cuda.current_stream(dev)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:  # current_stream=None: the vendor launches on the current torch stream
            obj.execute(**execute_kwargs(pack), current_stream=None, workspace=ws)


# ----------------------------------------------------------------------------- engine
class VendorSm100Engine(Engine):
    name = "vendor_sm100"
    engine_id = 20200
    numerical_notes = (
        "NVIDIA's kernels (tcgen05 UMMA, fp32 accumulation in TMEM). dprob: fp32 atomics into the bound "
        "buffer (order-nondeterministic). dbias: per 128-row tile the fp32 column sums are rounded to bf16 "
        "and added with bf16 atomics into the bound buffer, so the result carries one bf16 rounding per tile "
        "(and per accumulation order) where the reference sums in fp32 and rounds once: expect ~1e-2 "
        "relative differences on long experts. Block-scaled dGeGLU clamps in C's dtype in the vector_f32 "
        "path (not used here). Not run on hardware by cudnn_ext (no Blackwell GPU was available).")

    def available(self) -> Optional[str]:
        why = []
        _mod, missing = load_vendor()
        if missing:
            why.append(missing)
        if not torch.cuda.is_available():
            why.append("no CUDA GPU in this process (the vendor kernels need sm_100+)")
        return "; ".join(why) or None

    def check_support(self, problem: DgluProblem) -> list:
        why = []
        if problem.device_type != "cuda":
            why.append(f"tensors are on {problem.device_type!r}, not cuda")
        else:
            cap = _capability(problem)
            sm = f"sm_{cap[0]}{cap[1]}"
            if cap < (10, 0):
                why.append(f"needs SM100+ (Blackwell), found {sm}")
            elif cap == _RUBIN:
                if not problem.is_block_scaled:
                    why.append(f"{sm} (Rubin) runs only the block-scaled backend")
                elif problem.act.act_func == "dsituglu":
                    why.append(f"dsituglu is not available on {sm} (Rubin)")
            elif cap not in _BLACKWELL:
                why.append(f"{sm} is not an architecture the vendor kernels target (sm_100, sm_103; sm_107 "
                           "block-scaled)")
        if problem.recipe is not None:
            why.append(f"recipe {problem.recipe!r} is cudnn_ext's, not the vendor's")
        act = activations.ACTIVATIONS.get(problem.act.act_func)
        if act is None or not act.vendor:
            why.append(f"act_func {problem.act.act_func!r} is not one of the vendor's activations")
        family = activations.BLOCK_SCALED if problem.is_block_scaled else activations.BF16
        if problem.generate_activation and (act is None or family not in act.vendor_activation_output):
            why.append(f"the activation output of {problem.act.act_func!r} with "
                       f"{'block-scaled' if problem.is_block_scaled else 'BF16'} operands is cudnn_ext's; the vendor's "
                       "is dGeGLU's with BF16 operands")
        if problem.weight_mode == "dense" and problem.b_major != "k":
            why.append("N-major dense B: the vendor documents dense B as K-major only ('B must be K-major "
                       "(dense) or K/N-major (discrete)')")
        if not problem.is_block_scaled and problem.act.act_func == "dgeglu":
            got = (problem.act.geglu_alpha, problem.act.clamp_max, problem.act.clamp_min)
            if got != _BF16_GEGLU:
                why.append("the vendor BF16 backend keeps its fixed GeGLU constants (geglu_alpha=1.702, "
                           f"glu_clamp_max=7, glu_clamp_min=-7), got {got}")
        if problem.m_aligned != 256:
            why.append(f"m_aligned {problem.m_aligned}: the vendor kernels take m_aligned 256 only (groups "
                       "aligned to fewer rows are a cudnn_ext extension, docs/vendor_contract.md §3.2)")
        if problem.deterministic:
            why.append("deterministic: not mapped to the vendor's deterministic option (which it offers for "
                       "block-scaled dprob without dbias only)")
        if problem.is_block_scaled and problem.ab_dtype in _FP4 and problem.d_dtype == torch.float16:
            why.append("FP4 operands with float16 D: the vendor supports D in {bfloat16, float32} for FP4")
        return why

    def knob_space(self, problem: DgluProblem):
        tile_ns = (256,) if problem.is_block_scaled else (256, 128)  # block-scaled: TileN must be 256
        return [Knobs.of(tile_m=tm, tile_n=tn) for tm in (256, 128) for tn in tile_ns]

    def cost(self, problem: DgluProblem, knobs: Knobs) -> float:
        """Microseconds: UMMA time at a rough fraction of B200 peak (bf16 ~1.6, fp8 ~3.2, fp4
        ~6.4 PFLOP/s) with N padded to the tile, plus C/D traffic at ~6 TB/s; 1-CTA tiles
        (tile_m 128) a little slower."""
        tile_m, tile_n = int(knobs.get("tile_m")), int(knobs.get("tile_n"))
        m = max(problem.m, 256)
        n_pad = -(-problem.n // tile_n) * tile_n
        peak = 1.6e9  # FLOP per microsecond
        if problem.is_block_scaled:
            peak *= 4 if problem.ab_dtype in _FP4 else 2
        gemm = 2.0 * m * n_pad * problem.k / peak * (1.0 if tile_m == 256 else 1.15)
        cd = m * 2 * problem.n * (torch.empty((), dtype=problem.c_dtype).element_size()
                                  + torch.empty((), dtype=problem.d_dtype).element_size())
        return gemm + cd / 6e6 + 5.0  # + launch and helper-kernel overhead

    def build(self, problem: DgluProblem, knobs: Knobs) -> CompiledPlan:
        module, why = load_vendor()
        if module is None:
            raise ImportError(why)
        return _VendorPlan(problem, knobs, module)


__all__ = ["VendorSm100Engine", "load_vendor", "execute_kwargs", "constructor_kwargs", "vendor_workspace_bytes"]
