"""Execution plans (compiled candidates with their workspace) and the plan cache."""
from .execution import ExecutionPlan, build_first

__all__ = ["ExecutionPlan", "build_first"]
