"""Engines: implementations of grouped_matmul_dglu with support checks, knobs and cost models."""
from .base import CompiledPlan, Engine, Knobs
from .heuristics import decline_reasons, rank
from .registry import ENGINES, Candidate, engine_by_name

__all__ = ["CompiledPlan", "Engine", "Knobs", "ENGINES", "Candidate", "decline_reasons", "engine_by_name", "rank"]
