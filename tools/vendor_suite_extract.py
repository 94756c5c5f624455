"""Copies the vendor's dGLU tests, and the helper modules they import, out of a cudnn-frontend git.

The tests live under ``test/python/`` of NVIDIA's cudnn-frontend repository; their layout has
moved between releases (``fe_api/``, ``fe_api/grouped_gemm/``, ``gemm/cutedsl/``), so nothing
here names a folder: the dGLU tests are found by file name (:data:`DGLU_TEST`) and their helpers
by following imports, transitively, to files of the same tree. Only ``test/python/pytest.ini``
is added (the marker declarations); conftest files are left out on purpose, the runner does
not load them (they set up the vendor's own GPU infrastructure).

The written folder mirrors ``test/python/`` and carries ``MANIFEST.json``: the git directory,
the commit, the ``cudnn.__version__`` of that commit and every file with its blob id, so a
result can be tied to the exact vendor sources. Nothing here imports the vendor's code.
"""
from __future__ import annotations

import ast
import json
import pathlib
import posixpath
import re
import subprocess
from typing import Dict, Iterable, List, Set

TEST_ROOT = "test/python"
#: The dGLU tests: ``test_grouped_gemm_dglu*.py`` (class, wrapper, activation, workspace, JAX,
#: BF16 training) and ``test_grouped_dgeglu*.py`` (autograd); helpers end in ``_utils.py``.
DGLU_TEST = re.compile(r"^test_grouped_(gemm_dglu|dgeglu)\w*\.py$")
HELPER_SUFFIX = "_utils.py"
VERSION_FILE = "python/cudnn/__init__.py"
MANIFEST = "MANIFEST.json"


class ExtractError(RuntimeError):
    """The git directory, the revision or the tree does not hold what extraction needs."""


def _git(git_dir: pathlib.Path, *args: str) -> str:
    done = subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ExtractError(f"git {' '.join(args)} in {git_dir}: {done.stderr.strip()}")
    return done.stdout


def is_dglu_test(path: str) -> bool:
    name = posixpath.basename(path)
    return bool(DGLU_TEST.match(name)) and not name.endswith(HELPER_SUFFIX)


def imported_modules(source: str) -> Set[str]:
    """Dotted names a module imports (module level and inside functions), plus ``X.Y`` for every
    ``from X import Y`` since Y may be a submodule. Relative imports keep their leading dots."""
    names: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.add(base)
            names.update(f"{base}.{alias.name}" if node.module else base + alias.name for alias in node.names)
    return names


def _candidates(name: str, importer: str, search_dirs: Iterable[str]) -> List[str]:
    """Tree paths (relative to ``test/python``) where ``name`` could live for ``importer``."""
    if name.startswith("."):
        level = len(name) - len(name.lstrip("."))
        base = posixpath.dirname(importer)
        for _ in range(level - 1):
            base = posixpath.dirname(base)
        dirs, name = [base], name.lstrip(".")
    else:
        # pytest's default import mode puts each test file's folder on sys.path; the runner
        # adds the tree's root, and a helper imported by its bare name sits next to its importer.
        dirs = ["", posixpath.dirname(importer), *search_dirs]
    rel = name.replace(".", "/")
    out = []
    for d in dirs:
        stem = posixpath.join(d, rel) if d else rel
        out += [f"{stem}.py", f"{stem}/__init__.py"]
    return out


def closure(tree: Dict[str, str], tests: List[str]) -> List[str]:
    """``tests`` and every file of ``tree`` (path -> source) they import, transitively."""
    search_dirs = sorted({posixpath.dirname(t) for t in tests})
    keep, todo = set(), list(tests)
    while todo:
        path = todo.pop()
        if path in keep:
            continue
        keep.add(path)
        for name in imported_modules(tree[path]):
            for cand in _candidates(name, path, search_dirs):
                if cand in tree and cand not in keep:
                    todo.append(cand)
    # the packages on the way to a kept file, where the tree has them
    for path in list(keep):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            init = "/".join(parts[:i] + ["__init__.py"])
            if init in tree:
                keep.add(init)
    return sorted(keep)


def extract(git_dir: pathlib.Path, rev: str, dest: pathlib.Path) -> dict:
    """Write the dGLU tests of ``rev`` and their helpers to ``dest``; return the manifest."""
    git_dir = pathlib.Path(git_dir).resolve()
    commit = _git(git_dir, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    listing = _git(git_dir, "ls-tree", "-r", commit, "--", f"{TEST_ROOT}/").splitlines()
    blobs = {}
    for line in listing:
        meta, path = line.split("\t", 1)
        if path.endswith(".py"):
            blobs[path[len(TEST_ROOT) + 1:]] = meta.split()[2]
    tests = sorted(p for p in blobs if is_dglu_test(p))
    if not tests:
        raise ExtractError(f"{commit[:12]} has no dGLU test under {TEST_ROOT}/ (looked for {DGLU_TEST.pattern})")
    sources = {p: _git(git_dir, "cat-file", "blob", b) for p, b in blobs.items()}
    files = closure(sources, tests)

    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for rel in files:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(sources[rel])
    try:
        (dest / "pytest.ini").write_text(_git(git_dir, "show", f"{commit}:{TEST_ROOT}/pytest.ini"))
    except ExtractError:
        pass  # older trees declare no markers; the runner registers the ones it sees
    try:
        init = _git(git_dir, "show", f"{commit}:{VERSION_FILE}")
        found = re.search(r'^__version__\s*=\s*["\']([^"\']+)', init, re.M)
        version = found.group(1) if found else None
    except ExtractError:
        version = None
    manifest = {
        "source": str(git_dir), "rev": rev, "commit": commit,
        "commit_date": _git(git_dir, "show", "-s", "--format=%cI", commit).strip(),
        "cudnn_frontend_version": version, "tests": tests,
        "files": {rel: blobs[rel] for rel in files},
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
