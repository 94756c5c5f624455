"""The suite collects without the GPU packages (the README's CPU install): tests that need
the CuTe DSL skip, none fails to import."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_suite_collects_without_the_dsl():
    r = subprocess.run([sys.executable, str(ROOT / "tests/support/collect_without_dsl.py"), "tests"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    assert " error" not in r.stdout.splitlines()[-1], tail
