"""Every in-process cache of the package, registered by the module that owns it, and one
:func:`clear_caches` for them all.

A store registers a name, a function that empties it and one that counts its entries (so
that ``tests/unit/test_caches.py`` can fill each and see it empty). Clearing drops what the
process remembers (validated calls, replays, pooled scratch, compiled kernels, resident-CTA
counts, loaded disk-cache entries); the next calls validate, compile or load again. The disk
compile cache itself stays (``compile_cache.clear`` deletes it).
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Tuple

_lock = threading.Lock()
_STORES: Dict[str, Tuple[Callable[[], None], Callable[[], int]]] = {}


def register(name: str, clear: Callable[[], None], size: Callable[[], int]) -> None:
    """Register the store ``name`` (a new name) with its ``clear()`` and ``size()``."""
    with _lock:
        if name in _STORES:
            raise ValueError(f"cache {name!r} is already registered")
        _STORES[name] = (clear, size)


def lru(name: str, fn) -> None:
    """Register a ``functools.lru_cache``-wrapped ``fn`` as the store ``name``."""
    register(name, fn.cache_clear, lambda: fn.cache_info().currsize)


def sizes() -> Dict[str, int]:
    """Entries per registered store."""
    with _lock:
        stores = dict(_STORES)
    return {name: size() for name, (_, size) in stores.items()}


def clear_caches() -> None:
    """Empty every registered store."""
    with _lock:
        stores = list(_STORES.values())
    for clear, _ in stores:
        clear()


__all__ = ["clear_caches", "lru", "register", "sizes"]
