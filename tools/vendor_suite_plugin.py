"""pytest plugin behind tools/vendor_suite.py: the vendor's dGLU tests with ``import cudnn`` = cudnn_ext.

Loaded with ``-p vendor_suite_plugin`` (the runner puts tools/ on PYTHONPATH). It

1. puts a module named ``cudnn`` into ``sys.modules`` before any test is imported. Its names are
   cudnn_ext's public names, plus the few placeholders of :data:`PLACEHOLDERS`: vendor names
   outside this operation that the vendor's helper modules evaluate at import time; calling one
   raises :class:`OutsideSurface`. The module is not a package, so a test that imports a
   vendor-private module (``cudnn.gemm.cutedsl...``) gets the ImportError it would get without
   the vendor's package, and fails or skips as the test itself decides;
2. with ``--vendor-device cpu`` maps the tests' CUDA requests onto the CPU, so the reference
   engine serves them (:class:`CudaOnCpu`);
3. reports ``--vendor-capability`` (default 10.0) from ``torch.cuda.get_device_capability`` to
   code in the tests folder only: the vendor's tests skip below SM100, the vendor kernel's
   floor, while cudnn_ext serves the operation on every GPU. cudnn_ext, torch and every other
   caller see the real value;
4. records every outcome and writes the JSON summary to ``--vendor-out``.

The vendor's assertions, tolerances and reference helpers run unchanged.
"""
from __future__ import annotations

import importlib.machinery
import json
import os
import pathlib
import platform
import sys
import time
import types
from typing import Dict, List, Optional

import pytest
import torch
from torch.overrides import TorchFunctionMode

import cudnn_ext

_CUDNN_EXT_DIR = os.path.dirname(cudnn_ext.__file__) + os.sep
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HERE = os.path.abspath(__file__)


class OutsideSurface(RuntimeError):
    """A vendor name cudnn_ext does not implement was called (only its import was provided).

    Deliberately not a ValueError or NotImplementedError: the vendor's tests turn those into
    skips ("Unsupported testcase"), and a call of a missing name must show as a failure."""


def _placeholder_decorator_factory(name: str):
    def factory(*_args, **_kwargs):
        def decorate(fn):
            def call(*_a, **_k):
                raise OutsideSurface(f"cudnn.{name} (decorating {fn.__name__}) is outside cudnn_ext's surface")
            call.__name__ = getattr(fn, "__name__", name)
            return call
        return decorate
    return factory


#: Vendor names outside the dGLU operation that helper modules use at import time, as
#: decorators of their own graph-API tests (test_low_precision_matmul.py, imported for its FP4
#: converters): ``@cudnn.jit(...)`` and ``@cudnn.graph_cache(...)``.
PLACEHOLDERS = {
    "jit": _placeholder_decorator_factory("jit"),
    "graph_cache": _placeholder_decorator_factory("graph_cache"),
}


class CudnnShim(types.ModuleType):
    """``cudnn`` as the vendor's tests see it: cudnn_ext's names, then :data:`PLACEHOLDERS`."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(cudnn_ext, name)
        except AttributeError:
            pass
        if name in PLACEHOLDERS:
            return PLACEHOLDERS[name]
        raise AttributeError(f"module 'cudnn' (cudnn_ext) has no attribute {name!r}")

    def __dir__(self):
        return sorted(set(dir(cudnn_ext)) | set(PLACEHOLDERS))


def install_shim() -> CudnnShim:
    shim = CudnnShim("cudnn", "cudnn_ext under the vendor's module name (tools/vendor_suite_plugin.py)")
    shim.__file__ = cudnn_ext.__file__
    shim.__version__ = cudnn_ext.__version__
    shim.__all__ = list(cudnn_ext.__all__)
    shim.__spec__ = importlib.machinery.ModuleSpec("cudnn", None, origin=cudnn_ext.__file__)
    sys.modules["cudnn"] = shim
    return shim


# --------------------------------------------------------------------------- who is asking


def _caller_file(skip_torch: bool = False) -> str:
    """File of the nearest frame outside this plugin (and outside torch when ``skip_torch``)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _HERE and not (skip_torch and name.startswith(_TORCH_DIR)):
            return name
        frame = frame.f_back
    return ""


class _Reported:
    """``torch.cuda.get_device_capability`` that answers ``capability`` to the tests folder."""

    def __init__(self, real, capability, tests_root: str):
        self.real, self.capability, self.tests_root = real, capability, tests_root

    def __call__(self, *args, **kwargs):
        if self.capability is not None and _caller_file().startswith(self.tests_root):
            return self.capability
        return self.real(*args, **kwargs)


# --------------------------------------------------------------------------- CUDA on the CPU


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


class CudaOnCpu(TorchFunctionMode):
    """Tensors the tests ask to put on ``cuda`` stay on the CPU.

    Rewrites ``device=`` arguments, ``Tensor.cuda()`` and ``Tensor.to("cuda")`` when the
    request comes from outside cudnn_ext; a CUDA request from cudnn_ext itself is left alone
    (and fails, as it would on any machine without a GPU), so a product bug is not hidden."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        wants_cuda = (func is torch.Tensor.cuda or _is_cuda(kwargs.get("device"))
                      or (func is torch.Tensor.to and any(_is_cuda(a) for a in args[1:])))
        if wants_cuda and not _caller_file(skip_torch=True).startswith(_CUDNN_EXT_DIR):
            if func is torch.Tensor.cuda:
                return args[0]
            if "device" in kwargs:
                kwargs = dict(kwargs, device="cpu")
            if func is torch.Tensor.to:
                args = tuple("cpu" if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def _generator_on_cpu(tests_root: str):
    """``torch.Generator`` whose ``device="cuda"`` becomes the CPU when a test asks.

    A class (not a function) so that ``isinstance(g, torch.Generator)`` keeps working in torch."""
    real = torch.Generator

    class _Meta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

        def __call__(cls, device="cpu"):
            if _is_cuda(device) and _caller_file().startswith(tests_root):
                device = "cpu"
            return real(device)

    return _Meta("Generator", (), {"__doc__": real.__doc__})


class _CpuStream:
    """What the tests read from ``torch.cuda.current_stream()``: a null stream handle."""

    cuda_stream = 0
    device = torch.device("cpu")

    def synchronize(self):
        return None

    def wait_stream(self, _other):
        return None

    def query(self):
        return True


def _tests_only(real, fake, tests_root: str):
    def call(*args, **kwargs):
        if _caller_file().startswith(tests_root):
            return fake(*args, **kwargs)
        return real(*args, **kwargs)
    return call


# --------------------------------------------------------------------------- pytest hooks


def pytest_addoption(parser):
    group = parser.getgroup("vendor_suite", "the vendor's dGLU tests against cudnn_ext")
    group.addoption("--vendor-tests-root", default=None, help="folder of the vendor's tests (test/python)")
    group.addoption("--vendor-out", default=None, help="write the JSON summary here")
    group.addoption("--vendor-device", choices=("cpu", "cuda"), default=None,
                    help="cpu: the tests' CUDA tensors stay on the CPU (default without a GPU)")
    group.addoption("--vendor-capability", default="10.0",
                    help="capability reported to the tests (major.minor), or 'native'")


class _State:
    def __init__(self):
        self.outcomes: Dict[str, str] = {}
        self.failures: List[dict] = []
        self.skips: Dict[str, int] = {}
        self.skipped: List[dict] = []
        self.started = time.time()
        self.mode: Optional[CudaOnCpu] = None
        self.device = "cuda"
        self.capability = None
        self.root = ""


_STATE = _State()
install_shim()  # before collection imports any test module


def _parse_capability(text: str):
    if text == "native":
        return None
    major, _, minor = text.partition(".")
    return (int(major), int(minor or 0))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    for level in ("L0", "L1", "L2", "L3", "L4"):
        config.addinivalue_line("markers", f"{level}: the vendor's test level")
    root = config.getoption("--vendor-tests-root") or str(config.rootpath)
    _STATE.root = os.path.abspath(root) + os.sep
    device = config.getoption("--vendor-device") or ("cuda" if torch.cuda.is_available() else "cpu")
    _STATE.device = device
    _STATE.capability = _parse_capability(config.getoption("--vendor-capability"))
    cuda = torch.cuda
    cuda.get_device_capability = _Reported(cuda.get_device_capability, _STATE.capability, _STATE.root)
    if device == "cpu":
        cuda.current_stream = _tests_only(cuda.current_stream, lambda *a, **k: _CpuStream(), _STATE.root)
        cuda.default_stream = _tests_only(cuda.default_stream, lambda *a, **k: _CpuStream(), _STATE.root)
        cuda.synchronize = _tests_only(cuda.synchronize, lambda *a, **k: None, _STATE.root)
        torch.Generator = _generator_on_cpu(_STATE.root)
        _STATE.mode = CudaOnCpu()
        _STATE.mode.__enter__()


def pytest_unconfigure(config):
    if _STATE.mode is not None:
        _STATE.mode.__exit__(None, None, None)
        _STATE.mode = None


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        message = f"{call.excinfo.typename}: {first_line(call.excinfo.value)}"
        report.user_properties.append(("vendor_error", message))


def _error_of(report) -> str:
    for key, value in getattr(report, "user_properties", ()):
        if key == "vendor_error":
            return value
    text = getattr(report, "longreprtext", "") or str(report.longrepr or "")
    errors = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    return (errors[0] if errors else first_line(text))[:300]


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return first_line(reason.removeprefix("Skipped: "))


def pytest_runtest_logreport(report):
    nodeid, seen = report.nodeid, _STATE.outcomes.get(report.nodeid)
    if hasattr(report, "wasxfail"):
        _STATE.outcomes[nodeid] = "xfailed" if report.skipped else "xpassed"
        return
    if report.skipped:
        if seen is None:
            _STATE.outcomes[nodeid] = "skipped"
            reason = _skip_reason(report)
            _STATE.skips[reason] = _STATE.skips.get(reason, 0) + 1
            _STATE.skipped.append({"nodeid": nodeid, "reason": reason})
        return
    if report.failed:
        kind = "failed" if report.when == "call" else "errors"
        if seen in (None, "passed"):
            _STATE.outcomes[nodeid] = kind
            _STATE.failures.append({"nodeid": nodeid, "outcome": kind, "when": report.when, "error": _error_of(report)})
        return
    if report.when == "call":
        _STATE.outcomes[nodeid] = "passed"


def pytest_collectreport(report):
    if report.failed:
        _STATE.outcomes[report.nodeid] = "errors"
        _STATE.failures.append({"nodeid": report.nodeid, "outcome": "errors", "when": "collect",
                                "error": _error_of(report)})


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    out = config.getoption("--vendor-out")
    if out is None or hasattr(config, "workerinput"):  # an xdist worker: the controller writes
        return
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "xfailed", "xpassed")}
    for outcome in _STATE.outcomes.values():
        counts[outcome] += 1
    counts["total"] = sum(counts.values())
    manifest = pathlib.Path(_STATE.root, "MANIFEST.json")
    summary = {
        "counts": counts,
        "duration_s": round(time.time() - _STATE.started, 1),
        "exit_status": int(exitstatus),
        "device": _STATE.device,
        "capability_reported": None if _STATE.capability is None else "%d.%d" % _STATE.capability,
        "tests_root": _STATE.root.rstrip(os.sep),
        "vendor_manifest": ({k: v for k, v in json.loads(manifest.read_text()).items() if k != "files"}
                            if manifest.exists() else None),
        "cudnn_ext": {"version": cudnn_ext.__version__, "file": cudnn_ext.__file__},
        "torch": torch.__version__, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if _STATE.device == "cuda" and torch.cuda.is_available() else None,
        "args": list(config.invocation_params.args),
        "failures": _STATE.failures,
        "skip_reasons": dict(sorted(_STATE.skips.items(), key=lambda kv: -kv[1])),
        "skipped": _STATE.skipped,
    }
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(out).write_text(json.dumps(summary, indent=2) + "\n")
