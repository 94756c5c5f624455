"""Heuristics: ranking (engine, knobs) candidates for a problem, and timing them (autotune).

Owns the heuristic modes and their meaning: ``A`` orders every candidate of every engine that
supports the problem (each engine's ``knob_space``) by the engine's cost model, cheapest
first; ``B`` ranks as ``A`` does (the vendor's Python engines treat the two alike,
docs/vendor_contract.md §5.3); ``FALLBACK`` is the reference engine (it supports every valid
problem). Modes are
concatenated in the order asked, keeping the first position of a repeated (engine, knobs).
When nothing can run, :class:`NoEngineError` lists every engine's reasons.

``autotune_times`` runs given callables on the device with CUDA events and returns their
times; it refuses, with a clear message, when the work is not on a GPU (timing CPU eager
PyTorch would rank nothing useful). It knows nothing of graphs or plans.
"""
from __future__ import annotations

import enum
from typing import Callable, Iterable, List, Sequence

import torch

from ..errors import NoEngineError
from ..problem import DgluProblem
from .base import Engine, Knobs
from .reference import ReferenceEngine
from .registry import ENGINES, Candidate


class HeurMode(str, enum.Enum):
    """Heuristic modes: ``A`` ranks every supporting engine by its cost model, ``B`` the same
    way; ``FALLBACK`` is the reference engine. Members compare equal to their names
    (``HeurMode.A == "A"``)."""

    A = "A"
    B = "B"
    FALLBACK = "FALLBACK"


DEFAULT_MODES = (HeurMode.A, HeurMode.FALLBACK)
FALLBACK_KNOBS = Knobs.of(compute="float32")


def as_mode(mode) -> HeurMode:
    try:
        return HeurMode(mode.value if isinstance(mode, enum.Enum) else mode)
    except ValueError:
        raise ValueError(f"heuristics mode: expected 'A', 'B' or 'FALLBACK', got {mode!r}") from None


def decline_reasons(problem: DgluProblem, engines: Iterable[Engine] = None) -> dict:
    """{engine name: [reasons]} for every engine that cannot run ``problem`` here."""
    out = {}
    for eng in (engines if engines is not None else ENGINES):
        why = eng.available()
        reasons = [why] if why else list(eng.check_support(problem))
        if reasons:
            out[eng.name] = reasons
    return out


def ranked_knobs(engine: Engine, problem: DgluProblem) -> List[tuple]:
    """``[(knobs, cost_us)]`` of ``engine``'s knob space for ``problem``, cheapest first by its
    cost model (ties keep knob order): mode ``A`` for one engine. The JAX FFI path, which
    traces without a GPU, takes its first."""
    pairs = [(k, engine.cost(problem, k)) for k in engine.knob_space(problem)]
    pairs.sort(key=lambda kc: kc[1])
    return pairs


def rank(problem: DgluProblem, modes: Sequence = DEFAULT_MODES, engines: Iterable[Engine] = None):
    """Candidates in preference order; raises :class:`NoEngineError` if there are none. An
    engine marked ``opt_in`` takes part only when ``engines`` names it (a pinned engine)."""
    engines = list(engines if engines is not None else [e for e in ENGINES if not e.opt_in])
    modes = [as_mode(m) for m in modes]
    declined = decline_reasons(problem, engines)
    ok = [e for e in engines if e.name not in declined]
    out: List[Candidate] = []
    seen = set()
    for mode in modes:
        if mode in (HeurMode.A, HeurMode.B):
            block = [Candidate(e, k, cost, mode.value) for e in ok for k, cost in ranked_knobs(e, problem)]
            block.sort(key=lambda c: c.cost_us)  # stable: ties keep registry then knob order
        else:
            block = [Candidate(e, FALLBACK_KNOBS, e.cost(problem, FALLBACK_KNOBS), mode.value)
                     for e in ok if isinstance(e, ReferenceEngine)]
        for c in block:
            key = (c.engine.name, c.knobs)
            if key not in seen:
                seen.add(key)
                out.append(c)
    if not out:
        if not declined:
            declined = {"(heuristics)": [f"no engine offers a plan in modes {[m.value for m in modes]}"]}
        raise NoEngineError(declined)
    return out


def autotune_times(runners: Sequence[Callable[[], None]], device: torch.device, *, stream=None,
                   warmup: int = 2, iters: int = 10) -> List[float]:
    """Median milliseconds of each runner on ``device`` (CUDA events on ``stream``)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"autotune: timing candidates needs a CUDA GPU, but the work is on {device.type!r}"
            f"{'' if torch.cuda.is_available() else ' and this process has no CUDA device'}; "
            "the heuristic (cost-model) choice stays selected")
    stream = stream or torch.cuda.current_stream(device)
    times = []
    with torch.cuda.stream(stream):
        for run in runners:
            for _ in range(warmup):
                run()
            samples = []
            for _ in range(iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                run()
                end.record(stream)
                end.synchronize()  # autotune is allowed to sync; execute never does
                samples.append(start.elapsed_time(end))
            samples.sort()
            times.append(samples[len(samples) // 2])
    return times
