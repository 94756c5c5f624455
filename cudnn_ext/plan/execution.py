"""Execution plans: a ranked candidate built into a compiled plan.

Owns the walk over ranked candidates (build the first that succeeds; a decline, a missing
package or an unsupported configuration advances to the next) and
:class:`PlanSet`: the ranked list of one graph with its selection, filters and built plans
(what ``Graph.create_execution_plans``/``build_plans``/``autotune`` drive). A plan's workspace
layout is ``cudnn_ext.runtime.workspace``'s.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

from ..engines.base import CompiledPlan, Engine, Knobs
from ..engines.heuristics import rank
from ..engines.registry import Candidate
from ..errors import EngineDeclined, NoEngineError
from ..problem import DgluProblem
from ..runtime.workspace import WorkspaceLayout


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
    def engine_id(self) -> int:
        return self.candidate.engine.engine_id

    @property
    def layout(self) -> WorkspaceLayout:
        """Named regions of this plan's workspace (engine-reported sizes, 128-B aligned)."""
        lay = self.__dict__.get("_layout")
        if lay is None:
            lay = self.__dict__["_layout"] = WorkspaceLayout.of(self.compiled.workspace_requests())
        return lay

    @property
    def workspace_size(self) -> int:
        return self.layout.size

    def check_m(self, m: int) -> None:
        """Re-ask the engine at a runtime token count the plan has not run yet.

        Plans are built once per problem family with M left out, but an engine's support can
        depend on M (e.g. 32-bit indexing limits): a new M is checked once, so a plan never
        runs where its engine would have declined."""
        seen = self.__dict__.setdefault("_ok_m", set())
        if m in seen:
            return
        reasons = self.candidate.engine.check_support(self.problem.with_m(m))
        if reasons:
            raise EngineDeclined(self.engine_name, [f"at M = {m}: {r}" for r in reasons])
        if len(seen) > 4096:
            seen.clear()
        seen.add(m)

    def execute(self, pack, workspace=None, stream=None) -> None:
        self.check_m(pack["c"].shape[0])
        self.compiled.execute(pack, workspace, stream)

    def kernel_digests(self):
        """The compile-cache digests of the kernels the compiled plan has used so far."""
        # getattr: an engine's plan class need not derive from CompiledPlan
        digests = getattr(self.compiled, "kernel_digests", None)
        return list(digests()) if digests is not None else []

    @property
    def fresh_outputs(self) -> bool:
        """Whether the engine can run on uninitialized outputs (``execute_fresh``; a plan may
        say it cannot through its own ``fresh_outputs``)."""
        return hasattr(self.compiled, "execute_fresh") and getattr(self.compiled, "fresh_outputs", True)

    def execute_fresh(self, pack, workspace=None, stream=None) -> None:
        self.check_m(pack["c"].shape[0])
        self.compiled.execute_fresh(pack, workspace, stream)

    def address_launcher(self, m: int, init: bool, device_index: int, zeroed_workspace: bool = False):
        """The engine's launch on raw addresses at token count ``m`` (checked here, once), or
        None when the engine has none (see ``CompiledPlan.address_launcher``)."""
        self.check_m(m)
        return self.compiled.address_launcher(init, device_index, zeroed_workspace)

    @property
    def zeroed_region(self):
        """See ``CompiledPlan.zeroed_region``."""
        return self.compiled.zeroed_region

    @property
    def zeroed_region_bytes(self):
        """See ``CompiledPlan.zeroed_region_bytes``."""
        return self.compiled.zeroed_region_bytes

    def describe(self) -> str:
        return f"{self.engine_name}{self.knobs.as_dict()}"

    def __repr__(self) -> str:
        return f"ExecutionPlan({self.describe()}, workspace {self.layout.describe()})"


_BUILD_ERRORS = (EngineDeclined, NotImplementedError, ImportError)


def candidate_name(cand: Candidate) -> str:
    knobs = ",".join(f"{k}={v}" for k, v in cand.knobs.as_dict().items())
    return f"{cand.engine.name}[{knobs}]"


class PlanSet:
    """The ranked candidates of one problem, which one is selected, and the built plans.

    ``build(all_=False)`` walks from the selected index and keeps the first that builds (a
    decline advances the walk; any other exception is a bug and propagates); ``select(i)`` pins
    an index strictly (its decline raises); ``deselect(names)`` bars engines by name substring.
    """

    def __init__(self, problem: DgluProblem, candidates: Sequence[Candidate]):
        self.problem = problem
        self.candidates: List[Candidate] = list(candidates)
        self.index = 0
        self.pinned = False
        self.barred_names: List[str] = []
        self.built: Dict[int, ExecutionPlan] = {}
        self.failures: Dict[int, str] = {}

    @classmethod
    def ranked(cls, problem: DgluProblem, modes: Sequence, engines: Optional[Sequence[Engine]] = None) -> "PlanSet":
        return cls(problem, rank(problem, modes, engines))

    @classmethod
    def pinned_to(cls, problem: DgluProblem, engine: Engine, knobs: Knobs) -> "PlanSet":
        """One candidate, no heuristics: what a deserialized plan rebuilds."""
        why = engine.available()
        reasons = [why] if why else list(engine.check_support(problem))
        if reasons:
            raise EngineDeclined(engine.name, reasons)
        ps = cls(problem, [Candidate(engine, knobs, engine.cost(problem, knobs), "PINNED")])
        ps.pinned = True
        return ps

    def __len__(self) -> int:
        return len(self.candidates)

    def name_at(self, i: int) -> str:
        return candidate_name(self.candidates[i])

    def _check_index(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.candidates):
            raise IndexError(f"plan index: must be in [0, {len(self.candidates)}), got {i!r}")
        return i

    def select(self, i: int) -> None:
        self.index = self._check_index(i)
        self.pinned = True

    def deselect(self, names: Sequence[str]) -> None:
        self.barred_names.extend(names)

    def barred(self, i: int) -> bool:
        return any(n in self.candidates[i].engine.name for n in self.barred_names)

    def check_support(self) -> None:
        """The selected candidate's engine re-affirms support (raises :class:`EngineDeclined`)."""
        eng = self.candidates[self.index].engine
        why = eng.available()
        reasons = [why] if why else list(eng.check_support(self.problem))
        if reasons:
            raise EngineDeclined(eng.name, reasons)

    def _build_at(self, i: int) -> ExecutionPlan:
        plan = self.built.get(i)
        if plan is None:
            cand = self.candidates[i]
            plan = self.built[i] = ExecutionPlan(self.problem, cand, cand.engine.build(self.problem, cand.knobs))
        return plan

    def build(self, all_: bool = False, limit: Optional[int] = None) -> ExecutionPlan:
        """Build the selected plan, walking on declines unless pinned; with ``all_`` build every
        entry (the first ``limit``) and keep the selection if it built. Returns the selected plan."""
        if self.pinned and self.barred(self.index):
            raise ValueError(f"plan {self.index} ({self.name_at(self.index)}) is pinned by select_plan() but "
                             f"excluded by deselect_engines({self.barred_names}); drop one of the two")
        stop = len(self.candidates) if limit is None else min(len(self.candidates), max(limit, self.index + 1))
        if all_:
            order = range(stop)
        elif self.pinned:
            order = [self.index]
        else:
            order = range(self.index, len(self.candidates))
        chosen = None
        for i in order:
            if self.barred(i):
                continue
            try:
                self._build_at(i)
            except _BUILD_ERRORS as exc:
                self.failures[i] = f"{type(exc).__name__}: {exc}"
                if self.pinned and i == self.index:
                    raise
                continue
            if not all_:
                chosen = i
                break
        if all_:
            ok = [i for i in self.built if not self.barred(i)]
            chosen = self.index if self.index in ok else (min((i for i in ok if i > self.index), default=None)
                                                          if not self.pinned else None)
        if chosen is None:
            lines: Dict[str, List[str]] = {}
            for i, c in enumerate(self.candidates):
                why = self.failures.get(i) or ("deselected" if self.barred(i) else "not tried")
                lines.setdefault(c.engine.name, []).append(f"{c.knobs.as_dict()}: {why}")
            raise NoEngineError(lines)
        self.index = chosen
        return self.built[chosen]

    @property
    def selected(self) -> Optional[ExecutionPlan]:
        return self.built.get(self.index)
