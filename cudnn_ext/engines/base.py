"""The engine interface: what every implementation of grouped_matmul_dglu provides.

Owns the protocol only (no engine, no heuristics). An engine

* ``check_support(problem)`` returns a list of reasons it declines (empty = it can run);
  it never raises for a valid problem, and it never validates user input (the contract layer
  did that before an engine is asked);
* ``knob_space(problem)`` lists the configurations it could compile for the problem;
* ``cost(problem, knobs)`` estimates the runtime in microseconds (used to rank plans);
* ``build(problem, knobs)`` returns a :class:`CompiledPlan`, compiling what it must.

A :class:`CompiledPlan` owns its compiled kernel and declares its workspace. ``execute`` takes
the canonical variant pack (``cudnn_ext.problem.SLOTS``), a workspace buffer of at least
``workspace_size`` bytes (or ``None`` when that is 0) and a stream; it allocates nothing the
caller would see and must not synchronize with the host on a GPU engine.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..problem import DgluProblem


@dataclass(frozen=True)
class Knobs:
    """A concrete configuration of one engine. ``values`` is a sorted tuple of (name, value)."""

    values: tuple = ()

    @classmethod
    def of(cls, **kw) -> "Knobs":
        return cls(tuple(sorted(kw.items())))

    def as_dict(self) -> dict:
        return dict(self.values)

    def get(self, name: str, default=None):
        return self.as_dict().get(name, default)


class CompiledPlan(abc.ABC):
    """An executable, compiled configuration for one problem family (M is runtime)."""

    engine_name: str
    knobs: Knobs
    problem: DgluProblem

    @property
    def workspace_size(self) -> int:
        return 0

    @abc.abstractmethod
    def execute(self, pack: Mapping[str, Any], workspace=None, stream=None) -> None:
        """Run on ``pack`` (slot name -> tensor or None); writes/accumulates output slots."""


class Engine(abc.ABC):
    name: str = "engine"
    engine_id: int = -1
    #: Human-readable notes surfaced by ``python -m cudnn_ext info`` and plan descriptions.
    numerical_notes: str = ""

    @abc.abstractmethod
    def check_support(self, problem: DgluProblem) -> list:
        """Reasons this engine declines ``problem``; an empty list means supported."""

    def available(self) -> Optional[str]:
        """``None`` if the engine can run in this process, else why not (missing GPU/package)."""
        return None

    def knob_space(self, problem: DgluProblem) -> Sequence[Knobs]:
        return [Knobs()]

    def cost(self, problem: DgluProblem, knobs: Knobs) -> float:
        return float("inf")

    @abc.abstractmethod
    def build(self, problem: DgluProblem, knobs: Knobs) -> CompiledPlan:
        ...
