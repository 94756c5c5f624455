"""The reference engine: the PyTorch semantics run as an engine, on any device.

It supports every valid problem (it is the FALLBACK of the heuristics) and is the engine that
runs on CPU tensors. Its accumulation precision is float32, like the kernels'.
"""
from __future__ import annotations

import torch

from ..problem import DgluProblem
from ..reference.epilogue import LOCAL_DERIVATIVES
from ..reference.grouped_dglu import grouped_dglu_reference
from .base import CompiledPlan, Engine, Knobs


class _ReferencePlan(CompiledPlan):
    def __init__(self, problem: DgluProblem, knobs: Knobs):
        self.engine_name = ReferenceEngine.name
        self.problem = problem
        self.knobs = knobs
        self._dtype = torch.float64 if knobs.get("compute") == "float64" else torch.float32

    def execute(self, pack, workspace=None, stream=None) -> None:
        # outside autograd, like a kernel: inputs that require grad (nn.Parameter weights)
        # must neither fail the in-place output writes nor leave a graph on the caller's
        # output buffers
        with torch.no_grad():
            grouped_dglu_reference(self.problem, pack, compute_dtype=self._dtype)


class ReferenceEngine(Engine):
    name = "reference"
    engine_id = 20000
    numerical_notes = ("PyTorch ops, fp32 accumulation (float64 with knob compute=float64); "
                       "exact sigmoid; dbias accumulated in fp32 and rounded once; deterministic.")

    def check_support(self, problem: DgluProblem) -> list:
        if problem.act.act_func not in LOCAL_DERIVATIVES:
            return [f"act_func {problem.act.act_func!r} has no reference derivative"]
        return []

    def knob_space(self, problem: DgluProblem):
        return [Knobs.of(compute="float32"), Knobs.of(compute="float64")]

    def cost(self, problem: DgluProblem, knobs: Knobs) -> float:
        flops = 2.0 * max(problem.m, 1) * problem.n * problem.k
        per_us = 5e4 if problem.device_type == "cpu" else 2e7  # rough FLOP/us of eager torch
        slow = 4.0 if knobs.get("compute") == "float64" else 1.0
        # Eager torch issues tens of small ops per step of row blocks (CPU: per expert),
        # plus a gather of per-expert weights: on a GPU that fixed cost dominates small
        # problems, so a fused kernel must never rank below it just because the problem is
        # tiny; the per-expert term keeps it above the kernels as the expert count grows.
        fixed = 0.0 if problem.device_type == "cpu" else 50.0 + 100.0 * problem.num_experts
        return fixed + slow * flops / per_us

    def build(self, problem: DgluProblem, knobs: Knobs) -> CompiledPlan:
        return _ReferencePlan(problem, knobs)
