"""The Hopper engine of the ``fp8_blockwise`` recipe: e4m3 A and B through FP8 WGMMA.

The sm90 kernel with e4m3 operands (``Sm90Config.blockwise``): each 128-K k-tile is one scale
block, whose WGMMA partial sums are promoted into the fp32 accumulator with A's per-row and
B's per-128x128-block fp32 scales once the k-tile retired (DeepSeek-V3's recipe), then the
dGLU epilogue as for BF16 operands. It owns which recipe problems that covers (dense K-major
weights; D bf16, fp16 or fp32; every activation, prob, dprob, dbias, the activation output;
aligned or ragged groups; an FP8 D quantized from the kernel's fp32 D by the device quantizer)
and its knob space (the cooperative 128 x 128 tile, both math warpgroups promoting in turn
while the other's WGMMAs run); its decline reasons name the rest (pointer-table or N-major
weights), which the reference engine runs.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .. import activations
from ..kernels.blockwise.config import BlockwiseQuantConfig
from ..kernels.blockwise.launch import launch_quantize, quantize_cached
from ..kernels.sm90.config import BLOCKWISE_TILE_K, KERNEL_ACTS, Sm90Config
from ..problem import DgluProblem
from ..reference.fp8_blockwise import quantize_d
from ..runtime.streams import current_stream_handle, on_stream
from .base import CompiledPlan, Engine, compile_deferred
from .sm90 import (RASTER_GROUP_M, Sm90DgluEngine, Sm90Plan, _ragged_unclustered,
                   check_family, config_for, placement_reasons)

_CD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def kernel_problem(problem: DgluProblem) -> DgluProblem:
    """The problem the kernel runs: an FP8 D is written as fp32 D first (then quantized)."""
    if problem.d_dtype == torch.float8_e4m3fn:
        return dataclasses.replace(problem, d_dtype=torch.float32)
    return problem


#: FP8 D: one pass over the kernel's fp32 D writes D_row/SFD_row (1x128) and D_col/SFD_col
#: (128x1), rows past the last offset untouched (``reference.fp8_blockwise.quantize_d``'s rule)
_D_QUANTIZER = BlockwiseQuantConfig("fp32", ((1, 128), (128, 1)), masked=True)


def _quantizer_takes(pack) -> bool:
    """Whether the device quantizer writes the pack's FP8 D: D_row and D_col dense (the
    contract also admits padded rows) and 2N a multiple of 4 (always: N % 32 == 0)."""
    return all(pack[s].stride() == (pack[s].shape[1], 1) for s in ("d_row", "d_col"))


class Sm90Fp8BlockwisePlan(Sm90Plan):
    """The sm90 plan of an e4m3 config: the launch also passes the recipe's ``sfa``/``sfb``;
    with an FP8 D the kernel writes an fp32 D on the launch stream, which the blockwise
    quantizer (``kernels.blockwise``) turns into D_row/SFD_row and D_col/SFD_col in one pass
    (bit for bit the reference engine's ``quantize_d`` on the same fp32 values, which runs
    where D's rows are padded)."""

    def __init__(self, problem: DgluProblem, config: Sm90Config, compiled=None):
        super().__init__(kernel_problem(problem), config, compiled)
        self.problem = problem
        self.engine_name = Sm90Fp8BlockwiseEngine.name
        self._fp8_d = problem.d_dtype == torch.float8_e4m3fn

    def kernel_digests(self):
        # the GEMM's entries and (FP8 D) the D quantizer's
        from ..runtime import compile_cache

        own = compile_cache.digest_for("quantize_fp8_blockwise", _D_QUANTIZER) if self._fp8_d else None
        return list(dict.fromkeys([*super().kernel_digests(), *([own] if own else [])]))

    def warmup(self) -> None:
        super().warmup()
        if self._fp8_d:
            quantize_cached(_D_QUANTIZER)

    def execute(self, pack, workspace=None, stream=None) -> None:
        if not self._fp8_d:
            return super().execute(pack, workspace, stream)
        c = pack["c"]
        if c.shape[0] == 0 or pack["padded_offsets"].shape[0] == 0:
            return None
        with on_stream(stream):
            d32 = torch.empty(pack["d_row"].shape, dtype=torch.float32, device=c.device)
            super().execute(dict(pack, d_row=d32), workspace, stream)
            if _quantizer_takes(pack):
                offsets = pack["padded_offsets"]
                m, two_n = d32.shape
                handle = current_stream_handle(c.get_device()) if stream is None else stream.cuda_stream
                launch_quantize(_D_QUANTIZER, d32.data_ptr(), pack["d_row"].data_ptr(), pack["sfd_row"].data_ptr(),
                                m, two_n, two_n, 0, 1, handle,
                                q_b=pack["d_col"].data_ptr(), s_b=pack["sfd_col"].data_ptr(),
                                offsets=offsets.data_ptr(), n_offsets=offsets.shape[0])
            else:
                quantize_d(d32, pack)
        return None

    def execute_fresh(self, pack, workspace=None, stream=None) -> None:
        if self._fp8_d:  # (quantize_d writes every row of the FP8 outputs it owns)
            raise NotImplementedError("execute_fresh: an FP8 D goes through execute")
        return super().execute_fresh(pack, workspace, stream)


class Sm90Fp8BlockwiseEngine(Engine):
    name = "sm90_fp8_blockwise"
    engine_id = 20120
    numerical_notes = (
        "FP8 WGMMA per 128-K scale block, its partial sums promoted into fp32 with sfa x sfb "
        "(fp32) once per block; epilogue as sm90_cutedsl (dprob/dbias via fp32 atomics, or in a "
        "fixed order with deterministic=True).")

    def __init__(self):
        self._sm90 = Sm90DgluEngine()

    def available(self) -> Optional[str]:
        return self._sm90.available()

    def check_support(self, problem: DgluProblem) -> list:
        if problem.recipe != activations.FP8_BLOCKWISE:
            return [f"not the fp8_blockwise recipe (recipe {problem.recipe!r})"]
        why = []
        if problem.ab_dtype != torch.float8_e4m3fn:
            why.append(f"A/B dtype {problem.ab_dtype}: the recipe's is float8_e4m3fn")
        if problem.weight_mode != "dense":
            why.append(f"weight_mode {problem.weight_mode!r}: the kernel reads dense B and its sfb (the reference "
                       f"engine runs pointer tables)")
        if problem.b_major != "k":
            why.append(f"b_major {problem.b_major!r}: FP8 WGMMA reads K-major B only")
        if problem.d_dtype not in _CD_DTYPES + (torch.float8_e4m3fn,):
            why.append(f"D dtype {problem.d_dtype} is not supported (bf16, fp16, fp32, float8_e4m3fn)")
        if problem.c_dtype not in _CD_DTYPES:
            why.append(f"C dtype {problem.c_dtype} is not supported (bf16, fp16, fp32)")
        if problem.act.act_func not in KERNEL_ACTS:
            why.append(f"act_func {problem.act.act_func!r} is not implemented on sm90")
        if problem.n % 32 or problem.k % BLOCKWISE_TILE_K:
            why.append(f"needs N % 32 == 0 and K % {BLOCKWISE_TILE_K} == 0, got N={problem.n}, K={problem.k}")
        return why + placement_reasons(problem)

    def knob_space(self, problem: DgluProblem):
        """The cooperative 128 x 128 tile (a warpgroup's 64 rows keep a k-tile's partial
        sums beside the accumulator), in 2x1 clusters with B multicast (1x1 where the
        ragged schedule leaves clusters out), C ring 2 stages per warpgroup."""
        cm = 1 if _ragged_unclustered(problem) else 2
        return [config_for(kernel_problem(problem), tile_n=128, c_stages=2, cluster_m=cm,
                           raster_group_m=RASTER_GROUP_M[cm], cooperative=True)]

    def cost(self, problem: DgluProblem, knobs: Sm90Config) -> float:
        """The sm90 kernel's cost model for the same problem in BF16: the e4m3 form measured
        0.84-1.05x the BF16 kernel's time (docs/performance.md)."""
        bf16 = dataclasses.replace(kernel_problem(problem), ab_dtype=torch.bfloat16, recipe=None)
        return self._sm90.cost(bf16, knobs)

    def knobs_from_dict(self, values: dict) -> Sm90Config:
        return Sm90Config.from_dict(values)

    def build(self, problem: DgluProblem, knobs: Sm90Config) -> CompiledPlan:
        check_family(self.name, kernel_problem(problem), knobs)
        plan = Sm90Fp8BlockwisePlan(problem, knobs)
        if not compile_deferred():
            plan.warmup()
        return plan
