"""The Hopper engine for block-scaled operands: dequantize on the device, then the BF16 kernel.

Hopper has no block-scaled tensor-core instruction. This engine runs a block-scaled problem
as device steps on the plan's stream, with no host sync:

1. ``kernels.blockscaled`` dequantizes A (with SFA) and every expert's B (with SFB, dense or
   through the ``b_ptrs``/``sfb_ptrs`` tables) into BF16 workspace regions, in one launch. The products are
   exact in BF16 within its range (docs/blockscaled.md, "On Hopper"), in the weights' own
   element order (N-major FP8 weights stay N-major for the kernel). FP8 C is converted to
   bf16 (exact) by a torch cast;
2. the sm90 kernel (``engines.sm90``) runs the dGLU backward on them with the block-scaled
   epilogue: dGeGLU without beta, dSwiGLU and dSiTU-GLU with it, optional prob/dprob, the
   per-expert amax. The kernel reads fp32 alpha and beta; bfloat16 or float16 ones become
   fp32 temporaries that give the vendor's 16-bit roundings (``kernel_scalars``);
3. FP8 operands (MXFP8): the kernel's epilogue writes the FP8 outputs from its fp32 values,
   D_row/SFD_row and D_col/SFD_col (or the plain conversion of FP8 D without scale factors),
   bit-exact to the reference's quantizers on the same fp32 values (``kernels.sm90.quant_d``).

It owns which block-scaled problems that covers (FP4 operands, NVFP4 and MXFP4, with D
bf16/fp16/fp32; FP8 operands with FP8 D; C of any contract dtype; a single group with
runtime offsets; its decline reasons name the rest, which the reference engine runs), the
workspace layout ([the kernel's scratch][B bf16]: sizes of the problem family) and the plan.
The temporaries whose size follows the call's M (A's BF16 copy, bf16 C or dSwiGLU's 16-bit
beta * C, the single group's offsets), and the fp32 alpha and beta of 16-bit ones,
which a workspace may not hold, come from the caching allocator on the launch's stream. The
knob space and cost model are the sm90 engine's for the dequantized problem, plus the
dequantization's and the C pass's bytes.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..kernels.sm90.config import KERNEL_ACTS, Sm90Config
from ..problem import DgluProblem
from ..quant.formats import FP8_DTYPES, format_of, is_fp4
from ..reference.scalars import alpha_squared, beta_scaled_c
from ..runtime.streams import current_device_index, current_stream_handle, on_stream
from ..runtime.workspace import WorkspaceLayout, WorkspaceRequest
from .base import CompiledPlan, Engine, compile_deferred
from .sm90 import (Sm90DgluEngine, Sm90Plan, _addr, check_family, config_for, dense_problem,
                   placement_reasons)

_HALF_FLOAT = (torch.bfloat16, torch.float16, torch.float32)
#: Bytes per microsecond of the dequantization and C conversion passes and of quantized D's
#: second matrix (a guess at ~3 TB/s, not a measurement)
_DEQUANT_BYTES_PER_US = 3.0e6


def kernel_scalars(problem: DgluProblem, c: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                   offsets: torch.Tensor):
    """``(C, alpha, beta)`` for the sm90 kernel, which reads fp32 alpha and beta, squares alpha
    in fp32 and scales C by beta in fp32 (docs/vendor_contract.md §3.5 for what the vendor's
    kernel does with 16-bit ones). Torch ops on the current stream that read no device value on
    the host; the caller's tensors are read, never written.

    * C: dSwiGLU with a 16-bit beta and C (``problem.c_beta_dtype``) gets beta * C formed
      and rounded as the reference does (``reference.scalars.beta_scaled_c``), each 256-row
      block with its expert's beta (the expert found on the device from ``offsets``; blocks
      past the last offset take the last expert's, and the kernel never reads them), and beta
      becomes 1. Otherwise FP8 C is converted to bf16 (exact) and other C is passed as is.
    * alpha: a 16-bit alpha becomes ``sqrt(fp32(alpha**2 rounded to alpha's dtype))``, whose
      fp32 square is that rounded alpha**2 exactly, or one fp32 ulp from it (a relative
      2**-23; the square root of a 16-bit square is rarely an fp32 value): checked for every
      bfloat16 and float16 alpha by tests/compile/test_sm90_blockscaled_engine.py.
    * beta: a 16-bit beta the kernel still applies (dSiTU-GLU; dGeGLU reads none but the
      kernel loads it) becomes fp32, exactly, as the vendor's kernel converts it."""
    if problem.alpha_square_dtype is not None:
        alpha = torch.sqrt(alpha_squared(problem, alpha, torch.float32))
    if problem.c_beta_dtype is not None:
        m, two_n = c.shape
        starts = torch.arange(0, m, 256, dtype=offsets.dtype, device=c.device)
        experts = torch.searchsorted(offsets, starts, right=True).clamp_(max=offsets.shape[0] - 1)
        c = beta_scaled_c(problem, c.view(m // 256, 256, two_n), beta[experts][:, None, None]).view(m, two_n)
        return c, alpha, torch.ones(beta.shape, dtype=torch.float32, device=beta.device)
    if c.dtype in FP8_DTYPES:
        c = c.to(torch.bfloat16)
    return c, alpha, beta.to(torch.float32)


def _formats(problem: DgluProblem):
    """(element format, scale format) names of the dequantizer for ``problem``."""
    elem = format_of(problem.ab_dtype).name
    sf = format_of(problem.block_scale.sf_dtype).name
    return elem, sf


class Sm90BlockScaledPlan(CompiledPlan):
    """Dequantize A and B into the workspace, then the sm90 kernel's plan on them."""

    def __init__(self, problem: DgluProblem, config: Sm90Config):
        from ..kernels.blockscaled.config import DequantConfig, DequantPairConfig

        self.engine_name = Sm90BlockScaledEngine.name
        self.problem = problem
        self.config = self.knobs = config
        self._inner = Sm90Plan(dense_problem(problem), config)
        elem, sf = _formats(problem)
        vec = problem.block_scale.sf_vec_size
        b_deq = DequantConfig(elem, sf, vec, tables=problem.weight_mode == "discrete",
                              n_major=problem.b_major == "n")
        self._deq = DequantPairConfig(DequantConfig(elem, sf, vec), b_deq)  # A and B in one launch
        self._deq.check()
        self._fp8_c = problem.c_dtype in FP8_DTYPES
        #: dSwiGLU's 16-bit beta * C replaces C (``kernel_scalars``); the inner plan runs on it
        self._c_beta = problem.c_beta_dtype
        self._single = problem.block_scale.single_group_runtime_offsets
        self._layout = WorkspaceLayout.of(self.workspace_requests())
        self._b_off = self._layout.region("b_bf16").offset
        self._a_off = self._layout.region("a_bf16").offset
        self._scratch = self._layout.region("kernel_scratch")  # None: the kernel needs none
        #: the launch on raw addresses (``Sm90Plan.address_launcher``) per device, for calls
        #: whose scalars and C reach the kernel as they are
        self._fast = {}
        self._plain = (self._c_beta is None and problem.alpha_square_dtype is None and not self._fp8_c
                       and not self._single and not config.deterministic)  # (its partial sums: tensors)

    def workspace_requests(self):
        p = self.problem
        reqs = list(self._inner.workspace_requests())
        if len(reqs) == 1 and reqs[0].name == "scratch":  # the kernel's scratch, 128-B aligned
            reqs = [WorkspaceRequest("kernel_scratch", reqs[0].nbytes, 128)]
        reqs.append(WorkspaceRequest("b_bf16", 2 * p.num_experts * p.n * p.k, 128))
        # A's BF16 copy for up to the built M rows: a call with more rows allocates it
        reqs.append(WorkspaceRequest("a_bf16", 2 * p.m * p.k, 128))
        return reqs

    @property
    def workspace_size(self) -> int:
        return self._layout.size

    def kernel_digests(self):
        # the GEMM's and the dequantizer pair's entries
        from ..runtime import compile_cache

        own = [compile_cache.digest_for("dequant_pair", self._deq)]
        return list(dict.fromkeys([*self._inner.kernel_digests(), *(d for d in own if d)]))

    def warmup(self) -> None:
        from ..kernels.blockscaled.launch import dequant_pair_cached

        self._inner.warmup()
        dequant_pair_cached(self._deq)

    def execute(self, pack, workspace=None, stream=None) -> None:
        p = self.problem
        m, num_experts = pack["c"].shape[0], pack["padded_offsets"].shape[0]
        if workspace is None or workspace.numel() < self.workspace_size:
            got = None if workspace is None else workspace.numel()
            raise ValueError(f"workspace: this plan needs {self.workspace_size} bytes, got {got}")
        if num_experts != p.num_experts:
            raise ValueError(f"padded_offsets: this plan was built for L = {p.num_experts} "
                             f"experts, got L = {num_experts}")
        if m == 0 or num_experts == 0:
            return
        c = pack["c"]
        dev = c.get_device()
        if (self._plain and stream is None and m <= p.m and dev == current_device_index()
                and pack["alpha"].dtype == torch.float32 and pack["beta"].dtype == torch.float32):
            return self._execute_addresses(pack, workspace.data_ptr(), m, num_experts, dev)
        handle = current_stream_handle(dev) if stream is None else stream.cuda_stream
        # every temporary is allocated, and every torch op queued, on the launch stream: the
        # allocator reuses a block only after that stream's work on it
        with on_stream(stream):
            a16 = (workspace[self._a_off:self._a_off + 2 * m * p.k].view(torch.bfloat16).view(m, p.k) if m <= p.m
                   else torch.empty((m, p.k), dtype=torch.bfloat16, device=c.device))
            # a single group ends at M; the offsets' value is never read (a fill, no copy)
            offsets = (torch.full((1,), m, dtype=torch.int32, device=c.device) if self._single
                       else pack["padded_offsets"])
            c16, alpha, beta = kernel_scalars(p, c, pack["alpha"], pack["beta"], offsets)
        # (N, K, L) in the weights' own element order: K-major (L, N, K) or N-major (L, K, N)
        b16 = workspace[self._b_off:self._b_off + 2 * num_experts * p.n * p.k].view(torch.bfloat16)
        b16 = (b16.view(num_experts, p.n, p.k).permute(1, 2, 0) if p.b_major == "k"
               else b16.view(num_experts, p.k, p.n).permute(2, 1, 0))
        self._dequantize(pack, a16.data_ptr(), b16.data_ptr(), m, num_experts, handle, offsets.data_ptr())
        # (D and, with scales, D_col, SFD_row, SFD_col and norm_const: the pack's own)
        inner = dict(pack, a=a16, b=b16, b_ptrs=None, sfa=None, sfb=None, sfb_ptrs=None, c=c16,
                     padded_offsets=offsets, alpha=alpha, beta=beta)
        region = self._scratch
        scratch = (workspace[region.offset:region.offset + region.nbytes]
                   if region is not None else None)
        self._inner.execute(inner, scratch, stream)

    def _execute_addresses(self, pack, ws: int, m: int, num_experts: int, dev: int) -> None:
        """``execute`` on raw addresses, for a call on the current stream of the current
        device whose fp32 alpha/beta and C the kernel reads as they are: the temporaries are
        workspace regions and the GEMM goes through the inner plan's address launcher, so
        the call creates no tensor (a tensor op costs 10-20 us of host time on a slow host)."""
        p = self.problem
        go = self._fast.get(dev)
        if go is None:
            go = self._fast[dev] = self._inner.address_launcher(False, dev)
        handle = current_stream_handle(dev)
        a16, b16 = ws + self._a_off, ws + self._b_off
        offsets = pack["padded_offsets"].data_ptr()
        self._dequantize(pack, a16, b16, m, num_experts, handle, offsets)
        region = self._scratch
        go(a16, b16, pack["c"].data_ptr(), offsets, pack["alpha"].data_ptr(), pack["beta"].data_ptr(),
           _addr(pack, "prob"), pack["d_row"].data_ptr(), _addr(pack, "dprob"),
           _addr(pack, "dbias") if p.generate_dbias else 0,
           ws + region.offset if region is not None else 0, m,
           _addr(pack, "activation") if self.config.generate_activation else 0,
           _addr(pack, "amax") if self.config.generate_amax else 0, mx=self._inner._mx_addrs(pack))

    def _dequantize(self, pack, a16: int, b16: int, m: int, num_experts: int, handle: int, offsets: int) -> None:
        """A into its BF16 copy at ``a16``, every expert's B into theirs at ``b16``: one
        launch (its host issue is a large part of a small call's)."""
        from ..kernels.blockscaled.launch import launch_dequant_pair

        p = self.problem
        a = (pack["a"].data_ptr(), pack["sfa"].data_ptr(), a16)
        if p.weight_mode == "discrete":
            b = (pack["b_ptrs"].data_ptr(), pack["sfb_ptrs"].data_ptr(), b16)
            launch_dequant_pair(self._deq, a, b, m, p.n, p.k, num_experts, handle, offsets=offsets)
        else:
            b = (pack["b"].data_ptr(), pack["sfb"].data_ptr(), b16)
            launch_dequant_pair(self._deq, a, b, m, p.n, p.k, num_experts, handle)


class Sm90BlockScaledEngine(Engine):
    name = "sm90_blockscaled"
    engine_id = 20110
    numerical_notes = (
        "operands dequantized to bf16 on the device (exact within bf16's range), then the "
        "sm90_cutedsl kernel: fp32 WGMMA accumulation, fast sigmoid, dprob/dbias/amax via "
        "atomics (order-nondeterministic sums; amax is exact), or with deterministic=True the "
        "kernel's fixed-order partial sums; FP8 D quantized by the kernel's epilogue from its "
        "fp32 values by the reference's block rule (bit-exact on equal fp32 values).")

    def __init__(self):
        self._sm90 = Sm90DgluEngine()

    def available(self) -> Optional[str]:
        return self._sm90.available()

    def check_support(self, problem: DgluProblem) -> list:
        if not problem.is_block_scaled:
            return ["not block-scaled (BF16 operands run on sm90_cutedsl)"]
        bs = problem.block_scale
        why = []
        fp8 = problem.ab_dtype in FP8_DTYPES
        if not fp8 and not is_fp4(problem.ab_dtype):
            why.append(f"A/B dtype {problem.ab_dtype} is not block-scaled FP8 or FP4")
        if fp8 and problem.d_dtype not in FP8_DTYPES:
            why.append(f"D dtype {problem.d_dtype} with FP8 operands: the kernel writes FP8 D")
        if not fp8 and problem.d_dtype not in _HALF_FLOAT:
            why.append(f"D dtype {problem.d_dtype} with FP4 operands is not supported on sm90 "
                       f"(bf16, fp16, fp32)")
        if bs.generate_sfd and problem.d_dtype != torch.float8_e4m3fn:
            why.append(f"quantized D (SFD) in {problem.d_dtype}: the kernel writes e4m3 only")
        if problem.c_dtype not in _HALF_FLOAT + FP8_DTYPES:
            why.append(f"C dtype {problem.c_dtype} is not supported on sm90 "
                       f"(bf16, fp16, fp32, FP8)")
        if problem.act.act_func not in KERNEL_ACTS:
            why.append(f"act_func {problem.act.act_func!r} is not implemented on sm90")
        if bs.single_group_runtime_offsets and problem.num_experts != 1:
            why.append(f"use_single_group_runtime_offsets needs one expert, got "
                       f"L={problem.num_experts}")
        if problem.k % 32:
            why.append(f"needs K % 32 == 0 (whole dequantization chunks), got K={problem.k}")
        if problem.n % 32:
            why.append(f"needs N % 32 == 0, got N={problem.n}")
        if problem.m_aligned != 256:  # (the contract refuses it for block-scaled operands)
            why.append(f"m_aligned {problem.m_aligned}: block-scaled operands need 256 (beta * C is "
                       f"formed per 256-row block and the kernel walks 256-row slabs)")
        return why + placement_reasons(problem)

    def knob_space(self, problem: DgluProblem):
        """The sm90 engine's configurations for the dequantized problem, with the
        block-scaled epilogue's fields (amax, quantized D's scales) set: those whose A/B
        stages still fit beside the quantized D's shared memory."""
        if not problem.is_block_scaled:
            return []
        family = config_for(problem)
        fields = {f: getattr(family, f) for f in ("generate_amax", "d_scales", "discrete_col_sfd")}
        space = []
        for cfg in self._sm90.knob_space(dense_problem(problem)):
            cfg = dataclasses.replace(cfg, **fields)
            try:
                cfg.check()
            except ValueError:
                continue
            space.append(cfg)
        return space

    def cost(self, problem: DgluProblem, knobs: Sm90Config) -> float:
        """The sm90 kernel's cost on the dequantized problem (bf16 C where C is FP8) plus the
        passes around it at ~3 TB/s: the dequantization (read the packed operands, write
        bf16), FP8 C's conversion or dSwiGLU's 16-bit beta * C (read C, write 2 bytes per
        element), and quantized D's second matrix (D_col, with the scales)."""
        per = 0.5 if is_fp4(problem.ab_dtype) else 1.0
        m = max(problem.m, 256)
        elems = m * problem.k + problem.num_experts * problem.n * problem.k
        nbytes = elems * (per + 2.0)
        cd = m * 2 * problem.n
        if problem.c_dtype in FP8_DTYPES or problem.c_beta_dtype is not None:
            # FP8 C's conversion, dSwiGLU's 16-bit beta * C: read C, write 2 bytes
            nbytes += cd * (torch.empty((), dtype=problem.c_dtype).element_size() + 2.0)
        if problem.d_dtype in FP8_DTYPES and problem.block_scale.generate_sfd:
            nbytes += cd
        return self._sm90.cost(dense_problem(problem), knobs) + nbytes / _DEQUANT_BYTES_PER_US

    def knobs_from_dict(self, values: dict) -> Sm90Config:
        return Sm90Config.from_dict(values)

    def build(self, problem: DgluProblem, knobs: Sm90Config) -> CompiledPlan:
        check_family(self.name, problem, knobs)
        plan = Sm90BlockScaledPlan(problem, knobs)
        if not compile_deferred():
            plan.warmup()
        return plan
