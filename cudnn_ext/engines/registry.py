"""The engine registry.

Owns which engines exist (a static, ordered table; engines import their heavy dependencies
lazily; ``register_engine`` adds one at run time, e.g. a test's fake engine) and their lookup
by name or id. Ranking lives in ``cudnn_ext.engines.heuristics``, which imports this module.
It knows nothing of graphs or of the user-facing API.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from .base import Engine, Knobs
from .reference import ReferenceEngine


def _all_engines() -> List[Engine]:
    engines: List[Engine] = []
    try:  # the Hopper kernel engine
        from .sm90 import Sm90DgluEngine

        engines.append(Sm90DgluEngine())
        from .sm90_blockscaled import Sm90BlockScaledEngine

        engines.append(Sm90BlockScaledEngine())
        from .sm90_fp8_blockwise import Sm90Fp8BlockwiseEngine

        engines.append(Sm90Fp8BlockwiseEngine())
    except ImportError:
        pass
    from .vendor import VendorSm100Engine  # imports nvidia-cudnn-frontend lazily

    engines.append(VendorSm100Engine())
    engines.append(ReferenceEngine())
    return engines


ENGINES: List[Engine] = _all_engines()


def register_engine(engine: Engine, *, first: bool = False) -> Engine:
    """Add ``engine`` to the registry (tests, out-of-tree engines); names and ids must be new."""
    for eng in ENGINES:
        if eng.name == engine.name or eng.engine_id == engine.engine_id:
            raise ValueError(f"engine: {engine.name!r} (id {engine.engine_id}) clashes with registered "
                             f"{eng.name!r} (id {eng.engine_id})")
    ENGINES.insert(0 if first else len(ENGINES), engine)
    return engine


def unregister_engine(name: str) -> None:
    ENGINES[:] = [e for e in ENGINES if e.name != name]


def engine_by_id(engine_id: int) -> Engine:
    for eng in ENGINES:
        if eng.engine_id == engine_id:
            return eng
    raise ValueError(f"engine: unknown engine id {engine_id}; known: "
                     f"{ {e.engine_id: e.name for e in ENGINES} }")


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

