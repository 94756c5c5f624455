"""The call memo: skip re-validation and re-planning of a call whose operand *metadata* was
seen before. The library's one store of per-call state (``CALLS``); the compile cache and the
workspace pool are the only other caches.

Keys start with their kind, so entry points never collide:

- ``"graph"``: a call family (problem without M, engine, layouts) -> its built ``Graph``
  (``graph.from_call``; a new token count reuses the plan);
- ``"wrapper"``: the wrapper's metadata key -> (problem, graph, slot views)
  (``api.call_memo``, which knows the contract's slots); ``"seen"``: the metadata key of a
  wrapper call validated every time (not memoizable) -> True once its first call ran;
- ``"object"``: (class-API graph, execute-time metadata key) -> slot views; ``"object_last"``:
  a class-API graph -> (which slots were None, a ``guards`` guard of the tensors, slot views)
  of its last validated execute, checked before the key is built;
- ``"op"``: the functional core's key -> its validated entry; ``"replay"``: (signature, M) ->
  the guarded replays of ``functional.run_fast``.

A metadata key holds every tensor's (dtype, shape, strides, device) plus every scalar with
its type. A hit rebuilds the canonical pack with a few views and re-checks only what metadata
cannot tell (16-byte alignment of the data pointers), so a repeated call costs a dict lookup
instead of the contract and the binder. Calls whose every slot is such a view, or a view of
its argument's own bytes re-described by the contract (block-scaled scale factors as 6-D
layouts), are memoized; others take the validating path every time.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Hashable, List, Optional, Tuple

import torch

from . import caches




class CallMemo:
    """A bounded map, oldest entry evicted first. ``get`` is the dict's own (no lock, no
    reordering: it sits on the eager op's hot path); writes take a lock."""

    def __init__(self, max_entries: int):
        self._d: Dict[Hashable, Any] = {}
        self._max = max_entries
        self._lock = threading.Lock()
        self.get = self._d.get

    def put(self, key: Hashable, value):
        with self._lock:
            self._d.pop(key, None)
            while len(self._d) >= self._max:
                del self._d[next(iter(self._d))]
            self._d[key] = value
        return value

    def entries(self, kind: str) -> List[Any]:
        """The values of one kind (tests and benchmarks look inside)."""
        with self._lock:
            return [v for k, v in self._d.items() if k[0] == kind]

    def clear(self, kind: Optional[str] = None) -> None:
        with self._lock:
            if kind is None:
                self._d.clear()
            else:
                for k in [k for k in self._d if k[0] == kind]:
                    del self._d[k]

    def __len__(self) -> int:
        return len(self._d)


#: Every entry point's call state. Bounded: a miss only re-validates.
CALLS = CallMemo(4096)
caches.register("calls", CALLS.clear, lambda: len(CALLS._d))


class _Unhashable(Exception):
    pass


def tensor_meta(t):
    """What validation depends on in a tensor: (dtype, shape, strides, device); None stays None.
    The device itself, not ``get_device()``: that is -1 for CPU and ``meta`` tensors alike, and
    a meta tensor must not reuse a CPU call's validation."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise _Unhashable
    return (t.dtype, t.shape, t.stride(), t.device)


def call_key(tensors: Tuple, scalars: Tuple) -> Optional[tuple]:
    """The memo key of a call, or None when some argument cannot be keyed."""
    try:
        key = (tuple(tensor_meta(t) for t in tensors), scalars, tuple(type(s) for s in scalars))
        hash(key)
        return key
    except (_Unhashable, TypeError, RuntimeError):  # RuntimeError: no strides (sparse CSR)
        return None


def clear() -> None:
    """Forget every remembered call of every kind (the next calls validate and plan again)."""
    CALLS.clear()
