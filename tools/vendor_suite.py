"""Runs NVIDIA cudnn-frontend's own dGLU tests against cudnn_ext (``import cudnn`` = cudnn_ext).

The vendor's tests are not part of this repository: ``extract`` copies them, with the helper
modules they import, from a cudnn-frontend git directory into a folder (by default the
git-ignored ``.vendor-tests/``); ``run`` runs pytest on the dGLU tests of such a folder, or of a
cudnn-frontend checkout, through tools/vendor_suite_plugin.py, writes a JSON summary and prints
the failures grouped by their first error line; ``summarize`` prints that table again from a
JSON file (for instance one brought back from a GPU machine).

  python tools/vendor_suite.py extract --git-dir /path/cudnn-frontend/.git [--rev v1.32.0] [--to .vendor-tests]
  python tools/vendor_suite.py run --tests .vendor-tests --out vendor-suite.json [-k expr] [-- pytest args]
  python tools/vendor_suite.py summarize vendor-suite.json

``run`` options: ``--device cpu|cuda`` (default: cuda when torch sees a GPU; cpu keeps the
tests' CUDA tensors on the CPU, where the reference engine serves them), ``--capability``
(what ``torch.cuda.get_device_capability`` answers the tests; default 10.0, the floor of the
vendor's kernels, which the tests check; ``native`` for the real one), ``--level L0`` (the
vendor's default selection, ``-m L0``; default: every level). Not imported by the library.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import List, Optional

TOOLS = pathlib.Path(__file__).resolve().parent
REPO = TOOLS.parent
sys.path.insert(0, str(TOOLS))

from vendor_suite_extract import MANIFEST, extract, is_dglu_test  # noqa: E402


class SuiteError(RuntimeError):
    """The tests folder does not hold what ``run`` needs."""


def tests_root(folder: pathlib.Path) -> pathlib.Path:
    """The folder that plays ``test/python``: ``folder`` itself (an extracted copy) or its
    ``test/python`` (a cudnn-frontend checkout)."""
    folder = pathlib.Path(folder).resolve()
    for cand in (folder, folder / "test" / "python"):
        if (cand / MANIFEST).exists() or (cand / "test_utils.py").exists():
            return cand
    raise SuiteError(f"{folder} is neither a folder written by 'extract' nor a cudnn-frontend checkout "
                     "(no MANIFEST.json, test_utils.py or test/python/test_utils.py)")


def dglu_tests(root: pathlib.Path) -> List[pathlib.Path]:
    found = sorted(p for p in root.rglob("test_*.py") if is_dglu_test(p.name))
    if not found:
        raise SuiteError(f"no dGLU test under {root}")
    return found


def pytest_command(root: pathlib.Path, out: pathlib.Path, args) -> List[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "vendor_suite_plugin",
           # the vendor's conftest files set up its own GPU infrastructure and import its C++ module
           "--noconftest", "-o", "addopts=", "-p", "no:cacheprovider", "--rootdir", str(root),
           "-q", "--tb=line", "-rN", "--vendor-tests-root", str(root), "--vendor-out", str(out),
           "--vendor-capability", args.capability]
    if args.device:
        cmd += ["--vendor-device", args.device]
    if args.level:
        cmd += ["-m", args.level]
    if args.k:
        cmd += ["-k", args.k]
    return cmd + [str(p) for p in dglu_tests(root)] + list(args.pytest_args)


def run(args) -> int:
    root = tests_root(pathlib.Path(args.tests))
    out = pathlib.Path(args.out).resolve()
    env = dict(os.environ)
    # tools/ for the plugin, the repo for cudnn_ext, the tests' root for their top-level helpers
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TOOLS), str(REPO), str(root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = pytest_command(root, out, args)
    print("+", " ".join(cmd[:3]), "...", f"({len(dglu_tests(root))} test files under {root})", flush=True)
    rc = subprocess.run(cmd, cwd=root, env=env).returncode
    if not out.exists():
        print(f"pytest exited {rc} without writing {out}", file=sys.stderr)
        return rc or 1
    print_summary(json.loads(out.read_text()))
    return 0 if rc in (0, 1) else rc  # 1: some tests failed, which is what the summary is for


def _cause(message: str) -> str:
    """A failure's first line with the numbers taken out, so variants of one cause group."""
    return re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?(e[-+]?\d+)?", "#", message)[:140]


def print_summary(summary: dict, width: int = 140) -> None:
    counts = summary["counts"]
    manifest = summary.get("vendor_manifest") or {}
    print(f"\nvendor suite: {counts['total']} tests, {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped, {counts['errors']} errors ({summary['duration_s']} s, "
          f"device {summary['device']}, capability reported {summary['capability_reported']}, "
          f"vendor {manifest.get('cudnn_frontend_version')} @ {str(manifest.get('commit'))[:12]})")
    causes = collections.Counter(_cause(f["error"]) for f in summary["failures"])
    if causes:
        print("\nfailures and errors by cause:")
        for cause, n in causes.most_common():
            print(f"{n:6d}  {cause}"[:width])
    if summary.get("skip_reasons"):
        print("\nskips by reason:")
        skips = collections.Counter()
        for reason, n in summary["skip_reasons"].items():
            skips[_cause(reason)] += n
        for reason, n in skips.most_common():
            print(f"{n:6d}  {reason}"[:width])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("extract", help="copy the dGLU tests and their helpers out of a cudnn-frontend git")
    p.add_argument("--git-dir", required=True, help="a cudnn-frontend .git (or bare) directory")
    p.add_argument("--rev", default="HEAD", help="tag, branch or commit (default HEAD)")
    p.add_argument("--to", default=str(REPO / ".vendor-tests"), help="target folder (default .vendor-tests)")
    p = sub.add_parser("run", help="run the dGLU tests of a folder against cudnn_ext")
    p.add_argument("--tests", default=str(REPO / ".vendor-tests"),
                   help="a folder written by 'extract' or a cudnn-frontend checkout")
    p.add_argument("--out", default="vendor-suite.json", help="JSON summary (default vendor-suite.json)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--capability", default="10.0")
    p.add_argument("--level", default=None, help="a vendor test level, e.g. L0 (default: all)")
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -n 8)")
    p = sub.add_parser("summarize", help="print the tables of a JSON summary")
    p.add_argument("json")
    args = parser.parse_args(argv)
    if args.cmd == "extract":
        manifest = extract(pathlib.Path(args.git_dir), args.rev, pathlib.Path(args.to))
        print(f"{len(manifest['files'])} files of {manifest['commit'][:12]} ({manifest['commit_date']}, "
              f"cudnn-frontend {manifest['cudnn_frontend_version']}) -> {args.to}")
        for test in manifest["tests"]:
            print("  test:", test)
        return 0
    if args.cmd == "run":
        return run(args)
    print_summary(json.loads(pathlib.Path(args.json).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
