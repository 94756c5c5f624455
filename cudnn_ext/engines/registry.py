"""The engine registry and plan ranking.

Owns which engines exist (a static, ordered table; engines import their heavy dependencies
lazily) and the ranking of (engine, knobs) candidates for a problem: heuristic mode ``"A"``
orders every supported candidate by its engine's cost model; ``"FALLBACK"`` is the reference
engine alone. It knows nothing of graphs or of the user-facing API.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Sequence

from ..errors import NoEngineError
from ..problem import DgluProblem
from .base import Engine, Knobs
from .reference import ReferenceEngine


def _all_engines() -> List[Engine]:
    engines: List[Engine] = []
    try:  # the Hopper kernel engine (issue 3); absent until it lands
        from .sm90 import Sm90DgluEngine

        engines.append(Sm90DgluEngine())
    except ImportError:
        pass
    engines.append(ReferenceEngine())
    return engines


ENGINES: List[Engine] = _all_engines()


def engine_by_name(name: str) -> Engine:
    for eng in ENGINES:
        if eng.name == name:
            return eng
    raise ValueError(f"engine: unknown engine {name!r}; known: {[e.name for e in ENGINES]}")


@dataclass(frozen=True)
class Candidate:
    engine: Engine
    knobs: Knobs
    cost_us: float
    mode: str


def decline_reasons(problem: DgluProblem, engines: Iterable[Engine] = None) -> dict:
    """{engine name: [reasons]} for every engine that cannot run ``problem`` here."""
    out = {}
    for eng in engines if engines is not None else ENGINES:
        why = eng.available()
        reasons = [why] if why else list(eng.check_support(problem))
        if reasons:
            out[eng.name] = reasons
    return out


def rank(problem: DgluProblem, modes: Sequence[str] = ("A", "FALLBACK"),
         engines: Iterable[Engine] = None) -> List[Candidate]:
    """Candidates in preference order; raises :class:`NoEngineError` if there are none."""
    engines = list(engines if engines is not None else ENGINES)
    declined = decline_reasons(problem, engines)
    ok = [e for e in engines if e.name not in declined]
    out: List[Candidate] = []
    seen = set()
    for mode in modes:
        if mode == "A":
            block = [Candidate(e, k, e.cost(problem, k), mode) for e in ok for k in e.knob_space(problem)]
            block.sort(key=lambda c: c.cost_us)
        elif mode == "FALLBACK":
            block = [Candidate(e, Knobs.of(compute="float32"), e.cost(problem, Knobs.of(compute="float32")), mode)
                     for e in ok if isinstance(e, ReferenceEngine)]
        else:
            raise ValueError(f"heuristics mode: expected 'A' or 'FALLBACK', got {mode!r}")
        for c in block:
            key = (c.engine.name, c.knobs)
            if key not in seen:
                seen.add(key)
                out.append(c)
    if not out:
        raise NoEngineError(declined or {"(none)": ["no engine accepted the problem"]})
    return out
