"""tools/vendor_suite.py on synthetic vendor-like trees: extraction follows imports whatever the
layout, and a run reports every outcome with ``import cudnn`` resolving to cudnn_ext.

Nothing of the vendor is used here; the trees below are written by the tests."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import vendor_suite
import vendor_suite_extract as extract
import vendor_suite_plugin as plugin

ROOT = pathlib.Path(__file__).resolve().parents[2]


def write(root: pathlib.Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def git(repo: pathlib.Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def test_dglu_test_names():
    assert extract.is_dglu_test("test_grouped_gemm_dglu.py")
    assert extract.is_dglu_test("test_grouped_gemm_dglu_workspace.py")
    assert extract.is_dglu_test("test_grouped_dgeglu_autograd.py")
    assert not extract.is_dglu_test("test_grouped_gemm_dglu_bf16_utils.py")  # a helper
    assert not extract.is_dglu_test("test_grouped_gemm_dswiglu.py")  # another operation


def test_extract_follows_imports_in_a_nested_layout(tmp_path):
    repo = tmp_path / "fe"
    write(repo, {
        "python/cudnn/__init__.py": '__version__ = "9.8.7"\n',
        "test/python/pytest.ini": "[pytest]\nmarkers =\n    L0: level\n",
        "test/python/conftest.py": "import cudnn\n",
        "test/python/test_utils.py": "import torch\n",
        "test/python/test_unrelated.py": "def test_x(): pass\n",
        "test/python/gemm/cutedsl/test_grouped_gemm_dglu.py": """\
            import pytest
            from test_utils import *
            from gemm.cutedsl.test_grouped_gemm_dglu_bf16_utils import make
            def test_private():
                from cudnn.gemm.cutedsl.grouped.dglu import api
            """,
        "test/python/gemm/cutedsl/test_grouped_gemm_dglu_bf16_utils.py": "from sibling_utils import f\n",
        "test/python/gemm/cutedsl/sibling_utils.py": "from .. import pkg_helper\n",
        "test/python/gemm/__init__.py": "",
        "test/python/gemm/pkg_helper.py": "",
        "test/python/gemm/cutedsl/test_grouped_gemm_swiglu_utils.py": "",  # not imported
    })
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tree")
    dest = tmp_path / "out"
    manifest = extract.extract(repo / ".git", "HEAD", dest)
    assert manifest["tests"] == ["gemm/cutedsl/test_grouped_gemm_dglu.py"]
    assert manifest["cudnn_frontend_version"] == "9.8.7"
    assert sorted(manifest["files"]) == [
        "gemm/__init__.py", "gemm/cutedsl/sibling_utils.py", "gemm/cutedsl/test_grouped_gemm_dglu.py",
        "gemm/cutedsl/test_grouped_gemm_dglu_bf16_utils.py", "gemm/pkg_helper.py", "test_utils.py"]
    assert (dest / "pytest.ini").exists() and not (dest / "conftest.py").exists()
    assert json.loads((dest / extract.MANIFEST).read_text())["commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert vendor_suite.tests_root(dest) == dest.resolve()
    assert vendor_suite.tests_root(repo) == (repo / "test" / "python").resolve()
    with pytest.raises(extract.ExtractError, match="no dGLU test"):
        git(repo, "rm", "-q", "test/python/gemm/cutedsl/test_grouped_gemm_dglu.py")
        git(repo, "commit", "-q", "-m", "none")
        extract.extract(repo / ".git", "HEAD", tmp_path / "empty")


SUITE = {
    "test_utils.py": "",
    "fe_api/test_grouped_gemm_dglu.py": """\
        import pytest
        import torch
        import cudnn
        import cudnn_ext
        from test_utils import *

        def test_wrapper_on_tensors_the_test_puts_on_cuda():
            assert cudnn.grouped_gemm_dglu_wrapper_sm100 is cudnn_ext.grouped_gemm_dglu_wrapper
            assert torch.cuda.get_device_capability() == (10, 0)
            L, N, K, M = 2, 64, 64, 512
            out = cudnn.grouped_gemm_dglu_wrapper_sm100(
                a_tensor=torch.randn(M, K, device="cuda").bfloat16(),
                c_tensor=torch.randn(M, 2 * N).bfloat16().cuda(),
                sfa_tensor=None,
                padded_offsets=torch.tensor([256, 512], dtype=torch.int32).cuda(),
                alpha_tensor=torch.ones(L, device="cuda"), beta_tensor=torch.ones(L, device="cuda"),
                prob_tensor=torch.rand(M, 1, 1).to("cuda"), dprob_tensor=torch.zeros(M, 1, 1, device="cuda"),
                b_tensor=torch.randn(L, N, K, device="cuda").bfloat16().permute(1, 2, 0),
                current_stream=torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            assert out["d_row_tensor"].shape == (M, 2 * N, 1)

        def test_private_module():
            try:
                from cudnn.gemm.cutedsl.grouped.dglu import api
            except ImportError:
                pytest.skip("cudnn optional dependencies not installed")

        def test_a_wrong_number():
            assert 1 == 2, "numbers differ"

        def test_a_placeholder_called():
            cudnn.jit(heur_modes=[cudnn.heur_mode.A, cudnn.heur_mode.B])(lambda: 0)()
        """,
}


def test_run_reports_every_outcome(tmp_path):
    write(tmp_path / "tests", SUITE)
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "vendor_suite.py"), "run", "--tests",
                           str(tmp_path / "tests"), "--out", str(out), "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(out.read_text())
    assert {k: summary["counts"][k] for k in ("passed", "failed", "skipped", "errors")} == {
        "passed": 1, "failed": 2, "skipped": 1, "errors": 0}
    errors = {f["nodeid"].split("::")[1]: f["error"] for f in summary["failures"]}
    assert errors["test_a_wrong_number"].startswith("AssertionError: numbers differ")
    assert "OutsideSurface: cudnn.jit (decorating <lambda>) is outside cudnn_ext's surface" == \
        errors["test_a_placeholder_called"]
    assert summary["skip_reasons"] == {"cudnn optional dependencies not installed": 1}
    assert summary["capability_reported"] == "10.0" and summary["device"] == "cpu"
    assert "failures and errors by cause:" in done.stdout and "numbers differ" in done.stdout


def _run_as(filename: str, expr: str, **names):
    """Evaluate ``expr`` in a frame whose code lives in ``filename`` (who is asking, to the plugin)."""
    return eval(compile(expr, filename, "eval"), {"torch": torch, **names})


def test_capability_is_reported_to_the_tests_folder_only(tmp_path):
    reported = plugin._Reported(lambda *a: (9, 0), (10, 0), str(tmp_path) + os.sep)
    assert _run_as(str(tmp_path / "fe_api" / "t.py"), "cap()", cap=reported) == (10, 0)
    assert reported() == (9, 0)  # this file, like cudnn_ext or torch, sees the real one
    assert _run_as(plugin._CUDNN_EXT_DIR + "engines/vendor.py", "cap()", cap=reported) == (9, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA request from cudnn_ext succeeds on a GPU")
def test_cuda_requests_from_cudnn_ext_are_not_rewritten():
    with plugin.CudaOnCpu():
        moved = _run_as("/elsewhere/t.py", 'torch.ones(2, device="cuda").cuda().to("cuda")')
        assert moved.device.type == "cpu"
        with pytest.raises((AssertionError, RuntimeError)):
            _run_as(plugin._CUDNN_EXT_DIR + "x.py", 'torch.ones(2, device="cuda")')
