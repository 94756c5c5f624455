"""Execution plans: a ranked candidate built into a compiled plan, plus a process-wide cache.

Owns the walk over ranked candidates (build the first that succeeds; a decline, a missing
package or an unsupported configuration advances to the next) and the in-process cache of
built plans keyed by the problem *without* its token count (a new M never rebuilds).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from ..engines.base import CompiledPlan, Knobs
from ..engines.registry import Candidate, rank
from ..errors import EngineDeclined, NoEngineError
from ..problem import DgluProblem


@dataclasses.dataclass
class ExecutionPlan:
    """A compiled plan bound to the problem family it was built for."""

    problem: DgluProblem
    candidate: Candidate
    compiled: CompiledPlan

    @property
    def engine_name(self) -> str:
        return self.candidate.engine.name

    @property
    def knobs(self) -> Knobs:
        return self.candidate.knobs

    @property
    def workspace_size(self) -> int:
        return int(self.compiled.workspace_size)

    def execute(self, pack, workspace=None, stream=None) -> None:
        self.compiled.execute(pack, workspace, stream)

    def describe(self) -> str:
        return f"{self.engine_name}{dict(self.knobs.values)}"


_BUILD_ERRORS = (EngineDeclined, NotImplementedError, ImportError)


def build_first(problem: DgluProblem, candidates: Sequence[Candidate]) -> ExecutionPlan:
    """Build the first candidate that builds; collect every failure if none does."""
    failures: Dict[str, List[str]] = {}
    for cand in candidates:
        try:
            return ExecutionPlan(problem, cand, cand.engine.build(problem, cand.knobs))
        except _BUILD_ERRORS as exc:
            failures.setdefault(cand.engine.name, []).append(f"{dict(cand.knobs.values)}: {exc}")
    raise NoEngineError(failures)


_cache: Dict[Tuple, ExecutionPlan] = {}
_lock = threading.Lock()


def cache_key(problem: DgluProblem, modes: Sequence[str], engine: Optional[str]) -> Tuple:
    return (problem.with_m(0), tuple(modes), engine)


def plan_for(problem: DgluProblem, *, modes: Sequence[str] = ("A", "FALLBACK"), engine: Optional[str] = None) -> ExecutionPlan:
    """The cached plan for ``problem`` (any M), ranking and building it on first use.

    ``engine`` pins an engine by name (its candidates only; its decline reasons otherwise).
    """
    key = cache_key(problem, modes, engine)
    plan = _cache.get(key)
    if plan is not None:
        return plan
    with _lock:
        plan = _cache.get(key)
        if plan is None:
            from ..engines.registry import ENGINES, engine_by_name

            engines = [engine_by_name(engine)] if engine is not None else ENGINES
            plan = build_first(problem, rank(problem, modes, engines))
            _cache[key] = plan
    return plan


def clear_cache() -> None:
    with _lock:
        _cache.clear()
