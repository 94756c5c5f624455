"""CPU tier: a serialized plan carrying its compiled kernels (``serialize(include_kernels=True)``),
across real processes with separate compile-cache folders.

The plan is a test engine's (tests/support/plan_kernels_child.py) that compiles the small
pointer-table gather for sm_90a at build, through the persistent compile cache, as the SM90
plan compiles its kernel: the carrying does not depend on which kernel it is.

- serialized with its kernels in cache A, deserialized in a fresh process with an empty cache B:
  the build loads (``hit``), it does not compile;
- a corrupt kernel section (a changed base64 character, a non-base64 one) raises
  ``PlanFormatError`` naming the entry;
- an entry of another DSL version is skipped; the plan compiles as usual;
- the default payload has no kernel section."""
import base64
import importlib.util
import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")
ROOT = pathlib.Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "support" / "plan_kernels_child.py"


def _child(cache, *args):
    env = dict(os.environ, CUDNN_EXT_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    env.pop("CUDNN_EXT_CACHE_DISABLE", None)
    out = subprocess.run([sys.executable, str(CHILD), *map(str, args)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _header(blob):
    n = struct.unpack_from("<Q", blob, 20)[0]
    return json.loads(blob[28:28 + n])


def _with_header(blob, head):
    body = json.dumps(head).encode()
    return blob[:16] + struct.pack("<IQ", 1, len(body)) + body


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """A plan serialized with its kernels in cache A (compiled there), and the first process's
    result."""
    d = tmp_path_factory.mktemp("plan_kernels")
    first = _child(d / "cache_a", "serialize", d / "plan.bin", "--include-kernels")
    return d, (d / "plan.bin").read_bytes(), first


@needs_dsl
def test_deserialized_plan_loads_its_kernel_instead_of_compiling(carried, tmp_path):
    _, blob, first = carried
    assert [e[1] for e in first["events"]] == ["compiled"] and len(first["digests"]) == 1
    kernels = _header(blob)["kernels"]
    assert len(kernels) == 1 and kernels[0]["key"]["kind"] == "gather"
    (tmp_path / "plan.bin").write_bytes(blob)
    second = _child(tmp_path / "cache_b", "deserialize", tmp_path / "plan.bin")
    assert [e[1] for e in second["events"]] == ["hit"]  # installed, then loaded: no compile
    assert second["digests"] == first["digests"]
    assert len(list((tmp_path / "cache_b").glob("gather-*.o"))) == 1


@needs_dsl
def test_entry_of_another_dsl_version_is_skipped_and_the_plan_compiles(carried, tmp_path):
    _, blob, first = carried
    head = _header(blob)
    head["kernels"][0]["key"]["dsl"] = "0.0.1"  # the entry of another DSL build
    (tmp_path / "plan.bin").write_bytes(_with_header(blob, head))
    second = _child(tmp_path / "cache_b", "deserialize", tmp_path / "plan.bin")
    assert [e[1] for e in second["events"]] == ["compiled"]
    assert second["digests"] == first["digests"]  # this process's own key, not the carried one


def _corrupt(blob, edit):
    head = _header(blob)
    head["kernels"][0]["data"] = edit(head["kernels"][0]["data"])
    return _with_header(blob, head)


def _flip_char(data):
    i = len(data) // 2
    return data[:i] + ("B" if data[i] != "B" else "C") + data[i + 1:]  # still base64


@needs_dsl
@pytest.mark.parametrize("edit, rule", [
    (_flip_char, "SHA-256"),
    (lambda d: d[:100] + "!" + d[101:], "base64"),
    (lambda d: d[:-3], "base64"),  # truncated mid-quantum: broken padding
])
def test_corrupt_kernel_section_is_refused(carried, edit, rule):
    import cudnn_ext

    _, blob, _ = carried
    with pytest.raises(cudnn_ext.PlanFormatError) as info:
        cudnn_ext.deserialize_plan(_corrupt(blob, edit))
    err = info.value
    assert err.argument == "kernels[0].data" and rule in err.rule and err.value
    assert "corrupt" in str(err)


@needs_dsl
def test_a_flipped_byte_in_the_raw_payload_is_refused(carried):
    """The same as the bytes on disk see it: one byte in the middle of the kernel's base64."""
    import cudnn_ext

    _, blob, _ = carried
    start = blob.index(b'"data":"') + len(b'"data":"')
    i = start + 1000
    raw = bytearray(blob)
    raw[i] = ord("A") if raw[i] != ord("A") else ord("B")
    with pytest.raises(cudnn_ext.PlanFormatError, match=r"kernels\[0\]\.data"):
        cudnn_ext.deserialize_plan(bytes(raw))


def test_kernel_entry_is_validated_by_the_model():
    import pydantic

    from cudnn_ext.graph import serialize as serdes

    good = dict(key={"kind": "gather"}, size=3, sha256="0" * 64, data=base64.b64encode(b"abc").decode())
    serdes.KernelEntry(**good)
    for bad in (dict(good, size=-1), dict(good, sha256="xyz"), dict(good, extra=1)):
        with pytest.raises(pydantic.ValidationError):
            serdes.KernelEntry(**bad)


def test_default_payload_has_no_kernel_section():
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from test_graph import build_graph, make_case

    g, _ = build_graph(make_case())
    g.build()
    blob = g.serialize()
    assert "kernels" not in _header(blob) and b"kernels" not in blob
    assert g.serialize(include_kernels=False) == blob
    # a plan that compiled nothing (the reference) carries an empty section
    assert _header(g.serialize(include_kernels=True))["kernels"] == []
    with pytest.raises(TypeError, match="include_kernels"):
        g.serialize(include_kernels="yes")


def test_install_refuses_a_kind_that_is_not_a_plain_name(tmp_path, monkeypatch):
    from cudnn_ext.runtime import compile_cache

    monkeypatch.setenv("CUDNN_EXT_CACHE_DIR", str(tmp_path / "cache"))
    key = compile_cache.make_key("../escape", "cfg", (), "sm_90a", False)
    assert not compile_cache.install(key, b"\0")
    assert not list(tmp_path.rglob("*.o"))
