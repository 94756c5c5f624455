"""The engine interface: what every implementation of grouped_matmul_dglu provides.

Owns the protocol only (no engine, no heuristics). An engine

* ``check_support(problem)`` returns a list of reasons it declines (empty = it can run);
  it never raises for a valid problem, and it never validates user input (the contract layer
  did that before an engine is asked);
* ``knob_space(problem)`` lists the configurations it could compile for the problem;
* ``cost(problem, knobs)`` estimates the runtime in microseconds (used to rank plans);
* ``build(problem, knobs)`` returns a :class:`CompiledPlan`, compiling what it must;
* ``knobs_from_dict(values)`` turns a serialized plan's ``knobs.as_dict()`` back into knobs.

Knobs are hashable values with ``as_dict()``: the generic :class:`Knobs` (the reference and
vendor engines), or an engine's own frozen config type (the sm90 engine's ``Sm90Config``,
which is also its compile key and what its kernel reads).

A :class:`CompiledPlan` owns its compiled kernel and declares its workspace, either as one
size (``workspace_size``) or as named regions (``workspace_requests()``: the plan's layout,
carved by ``cudnn_ext.runtime.workspace``; see docs/graph.md). ``execute`` takes
the canonical variant pack (``cudnn_ext.problem.SLOTS``), a workspace buffer of at least
``workspace_size`` bytes (or ``None`` when that is 0) and a stream; it allocates nothing the
caller would see and must not synchronize with the host on a GPU engine.
"""
from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..problem import DgluProblem
from ..runtime.workspace import WorkspaceRequest


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


_deferred = threading.local()


class defer_compile:
    """Within this context engines may build plans without compiling their kernels; the first
    execute compiles what it runs. For callers that run a variant other than the one a plan
    would compile at build time (the functional torch path runs ``execute_fresh``)."""

    def __enter__(self):
        self._prev = getattr(_deferred, "on", False)
        _deferred.on = True

    def __exit__(self, *exc):
        _deferred.on = self._prev


def compile_deferred() -> bool:
    return getattr(_deferred, "on", False)


class CompiledPlan(abc.ABC):
    """An executable, compiled configuration for one problem family (M is runtime)."""

    engine_name: str
    knobs: Knobs
    problem: DgluProblem

    @property
    def workspace_size(self) -> int:
        return 0

    def workspace_requests(self) -> Sequence[WorkspaceRequest]:
        """The regions this plan needs, in layout order. The default is one ``scratch``
        region of ``workspace_size`` bytes at offset 0 (what a plan that only overrides
        ``workspace_size`` expects); a plan that overrides this reads its regions' offsets
        from ``cudnn_ext.runtime.workspace.WorkspaceLayout.of(self.workspace_requests())``."""
        size = int(self.workspace_size)
        return [WorkspaceRequest("scratch", size)] if size else []

    @abc.abstractmethod
    def execute(self, pack: Mapping[str, Any], workspace=None, stream=None) -> None:
        """Run on ``pack`` (slot name -> tensor or None); writes/accumulates output slots.

        ``stream``: a torch stream, or None for the current stream of the tensors' device
        (GPU engines read its raw handle: building a Stream object costs microseconds)."""

    def kernel_digests(self) -> Sequence[str]:
        """Digests of the persistent compile-cache entries (``runtime.compile_cache``) of the
        kernels this plan has compiled or loaded so far: what ``serialize(include_kernels=True)``
        carries. The default, for plans that compile nothing, is none."""
        return ()

    def address_launcher(self, init: bool, device_index: int, zeroed_workspace: bool = False):
        """An optional fast launch on raw addresses for callers that have already validated
        the operands' metadata (the eager torch hot path), or None (the default: callers use
        ``execute``). See ``Sm90Plan.address_launcher`` for the calling convention."""
        return None

    #: Workspace offset from which a launch leaves the bytes zero (so a scratch kept for such
    #: launches needs no zeroing), or None: see ``Sm90Plan.zeroed_region``.
    zeroed_region = None
    #: Length in bytes of that region (0 without one): ``Sm90Plan.zeroed_region_bytes``.
    zeroed_region_bytes = 0


class Engine(abc.ABC):
    name: str = "engine"
    engine_id: int = -1
    #: Human-readable notes surfaced by ``python -m cudnn_ext info`` and plan descriptions.
    numerical_notes: str = ""
    #: The heuristics rank this engine only when the caller pins it by name.
    opt_in: bool = False

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

    def knobs_from_dict(self, values: Mapping[str, Any]) -> Knobs:
        """The knobs whose ``as_dict()`` is ``values`` (plan deserialization)."""
        return Knobs.of(**values)

    @abc.abstractmethod
    def build(self, problem: DgluProblem, knobs: Knobs) -> CompiledPlan:
        ...
