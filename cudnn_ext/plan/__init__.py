"""Execution plans (compiled candidates with their workspace) and the plan cache."""
from .execution import ExecutionPlan

__all__ = ["ExecutionPlan"]
