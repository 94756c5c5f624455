"""Imports run one way: a package imports only packages of lower layers, never a sibling or
a higher one, at module level or inside a function. Parsed from the sources (nothing is
imported), so a violation names the file and line."""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "cudnn_ext"

#: Bottom to top. A unit of one layer may import units of lower layers only.
LAYERS = (
    ("version", "errors", "activations", "layout"),
    ("problem",),
    ("quant",),
    ("contract",),
    ("runtime",),
    ("kernels",),
    ("reference",),
    ("engines",),
    ("plan",),
    ("graph",),
    ("api", "functional"),
    ("torch", "jax"),
    ("integrations",),  # framework adapters; nothing of the library imports them
    ("__init__",),  # the public facade
    ("cli",),
    ("__main__",),
)
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _unit(parts) -> str:
    """The top-level unit (sub-package or module) of ``cudnn_ext`` that a dotted path names."""
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: pathlib.Path, package: pathlib.Path = PACKAGE):
    """(line, imported unit) for every import of cudnn_ext code in ``path``."""
    rel = path.relative_to(package.parent).with_suffix("").parts
    here = list(rel[:-1]) if rel[-1] != "__init__" else list(rel[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                mod = base + (node.module.split(".") if node.module else [])
            else:
                mod = (node.module or "").split(".")
            if mod[0] != "cudnn_ext":
                continue
            if len(mod) == 1:  # from cudnn_ext import contract, ...: each name is a unit
                for alias in node.names:
                    yield node.lineno, alias.name if alias.name in LAYER_OF else "__init__"
            else:
                yield node.lineno, _unit(mod)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name.split(".")
                if mod[0] == "cudnn_ext":
                    yield node.lineno, _unit(mod)


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {_unit(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in _sources()}
    assert units - set(LAYER_OF) == set(), "add the new package or module to LAYERS"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_downward(path):
    unit = _unit(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} (layer {LAYER_OF[target]}), "
           f"but {unit} is layer {LAYER_OF[unit]}"
           for line, target in _imports(path)
           if target != unit and LAYER_OF[target] >= LAYER_OF[unit]]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_hidden_upward_import(tmp_path):
    probe = tmp_path / "cudnn_ext" / "runtime" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from ..engines import heuristics\n    from cudnn_ext import graph\n")
    assert list(_imports(probe, tmp_path / "cudnn_ext")) == [(2, "engines"), (3, "graph")]


def test_runtime_is_plumbing():
    """runtime/ imports nothing of the package but ``version``: no contract, no kernels."""
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
           for path in sorted((PACKAGE / "runtime").rglob("*.py"))
           for line, target in _imports(path) if target not in ("runtime", "version")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("binding", ["jax", "torch"])
def test_bindings_ask_the_engine_not_its_modules(binding):
    """The framework bindings reach the SM90 kernel through the engine registry and its
    methods (``Sm90DgluEngine.xla_launch``), never ``engines.sm90`` or ``kernels.sm90`` (the
    engine owns what a launch needs)."""
    bad = []
    for path in sorted((PACKAGE / binding).rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module.split(".")
                if any(mod[i:i + 2] in (["engines", "sm90"], ["kernels", "sm90"]) for i in range(len(mod))):
                    bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {node.module}")
    assert not bad, "\n".join(bad)
