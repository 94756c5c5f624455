"""Typed errors of cudnn_ext.

Owns the exception hierarchy only. Contract violations (the caller passed something the
operation does not accept) are plain ``ValueError``/``TypeError``, except a dtype the contract
does not accept: :class:`DtypeError`, both at once; an engine that cannot run a
valid problem *declines* with :class:`EngineDeclined` (a ``NotImplementedError``), and when no
engine can run, :class:`NoEngineError` lists every engine's reason.
"""
from __future__ import annotations


class DtypeError(TypeError, ValueError):
    """A tensor or dtype argument has a dtype the contract does not accept.

    A ``TypeError`` (the Python reading: the wrong kind of value) and a ``ValueError`` (what the
    vendor raises for every dtype rule, docs/vendor_contract.md §3.7, and what its tests catch to
    skip an unsupported case), so code written against either catches it."""


class EngineDeclined(NotImplementedError):
    """An engine cannot run this (valid) problem; ``reasons`` says why."""

    def __init__(self, engine: str, reasons):
        self.engine = engine
        self.reasons = tuple(reasons)
        super().__init__(f"engine {engine!r} declines: " + "; ".join(self.reasons))


class NoEngineError(NotImplementedError):
    """No registered engine supports the problem; the message lists each engine's reasons."""

    def __init__(self, declines):
        self.declines = dict(declines)
        lines = [f"  - {name}: {'; '.join(r)}" for name, r in self.declines.items()]
        super().__init__("no engine can run this grouped_matmul_dglu problem:\n" + "\n".join(lines))
