"""CPU tier: the persistent compile cache (``cudnn_ext.runtime.compile_cache``) with real kernels
compiled for sm_90a on the CPU, across real processes.

- a second process loads what the first compiled instead of compiling (timed and printed, for
  the small gather and for one SM90 kernel: ``-s`` shows the numbers);
- a TVM-FFI kernel (the layer's tail zeroing) is linked into a shared library when compiled,
  and a second process gets it without importing the CuTe DSL; a damaged library is linked
  again with a warning, a missing one linked on load; without a C compiler the kernel loads
  through the DSL, after one warning;
- two processes asking for the same kernel at once compile it once, and both get it;
- a corrupted object, a truncated header and a header of another DSL version under the right
  name are each detected and rebuilt (with a warning);
- a key with another DSL version misses (compiles beside the old entry);
- an entry carried out of one cache (``entry_of``) installs into another and is then loaded;
  a stale one is refused.

Every test points CUDNN_EXT_CACHE_DIR at its own empty folder."""
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from cudnn_ext.runtime import shared_library

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")
needs_linking = pytest.mark.skipif(
    importlib.util.find_spec("tvm_ffi") is None or shared_library.compiler() is None,
    reason="needs apache-tvm-ffi (the TVM-FFI convention) and a C compiler (cc, gcc or $CC)")
ROOT = pathlib.Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "support" / "compile_cache_child.py"


def _env(cache: pathlib.Path, **extra):
    env = dict(os.environ, CUDNN_EXT_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), **extra)
    env.pop("CUDNN_EXT_CACHE_DISABLE", None)
    return env


def _child(cache, kind, *extra, env=None):
    out = subprocess.run([sys.executable, str(CHILD), kind, *extra],
                         env=_env(cache, **(env or {})), cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _outcomes(result):
    return [e[1] for e in result["events"]]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder for this test (and this process)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("CUDNN_EXT_CACHE_DIR", str(d))
    monkeypatch.delenv("CUDNN_EXT_CACHE_DISABLE", raising=False)
    return d


def _gather_build():
    """A compile function of the small gather kernel (bypassing its per-process lru_cache)."""
    from cudnn_ext.kernels import pointer_gather

    _, cutlass, cute, runtime = pointer_gather._dsl()

    def build():
        ptrs = [runtime.make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=al)
                for dt, al in pointer_gather._ptr_specs(cutlass)]
        scalars = [cutlass.Int32(1), cutlass.Int64(1), cutlass.Int64(16), cutlass.Int32(0),
                   cutlass.Int32(1)]
        return cute.compile(pointer_gather._gather_fn(), *ptrs, *scalars,
                            runtime.make_fake_stream(), options="--gpu-arch sm_90a")

    return build, (pointer_gather.__file__,)


def _get(build, sources, kind="gather_t"):
    from cudnn_ext.runtime import compile_cache

    n = len(compile_cache.events)
    fn = compile_cache.load_or_compile(kind, "cfg", build, sources=sources, arch="sm_90a",
                                       tvm_ffi=False)
    assert fn is not None and callable(fn)
    return compile_cache.events[n][1]


@needs_dsl
@pytest.mark.parametrize("kind", ["gather", "sm90"])
def test_second_process_loads_instead_of_compiling(cache, kind):
    first = _child(cache, kind)
    second = _child(cache, kind)
    assert _outcomes(first) == ["compiled"] and _outcomes(second) == ["hit"]
    assert first["callable"] and second["callable"]
    print(f"\n{kind}: first process compiles in {first['seconds']:.3f} s, the second loads "
          f"from the disk cache in {second['seconds']:.3f} s")
    assert second["seconds"] < first["seconds"]
    headers = [p for p in cache.glob("*.json") if not p.name.endswith(".so.json")]
    assert len(list(cache.glob("*.o"))) == 1 and len(headers) == 1


@needs_dsl
@needs_linking
def test_warm_process_gets_a_tvm_ffi_kernel_without_the_dsl(cache):
    first = _child(cache, "zero_tail")
    assert _outcomes(first) == ["compiled"] and first["cutlass"]
    assert len(list(cache.glob("zero_tail-*.so"))) == 1  # linked by the compiling process
    second = _child(cache, "zero_tail")
    assert _outcomes(second) == ["hit"] and second["callable"] and not second["warnings"]
    assert not second["cutlass"], "the warm lookup imported the CuTe DSL"
    print(f"\nzero_tail: compiled and linked in {first['seconds']:.3f} s; a fresh process gets "
          f"it without the DSL in {second['seconds']:.3f} s (apache-tvm-ffi's import included)")


def _lib_files(cache):
    lib, = cache.glob("zero_tail-*.so")
    return lib, lib.with_suffix(".so.json")


@needs_dsl
@needs_linking
def test_damaged_or_missing_library_is_linked_again(cache):
    assert _outcomes(_child(cache, "zero_tail")) == ["compiled"]
    lib, meta = _lib_files(cache)
    good = lib.read_bytes()

    # a flipped byte: the checksum catches it
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    lib.write_bytes(bytes(bad))
    got = _child(cache, "zero_tail")
    assert _outcomes(got) == ["rebuilt"] and got["callable"]
    assert any("checksum" in w and "linking it again" in w for w in got["warnings"]), got
    assert lib.read_bytes() == good  # linking is reproducible

    # a library the loader refuses although its header matches (a truncated ELF, checksummed)
    lib.write_bytes(good[:64])
    header = json.loads(meta.read_bytes())
    header.update(size=64, sha256=hashlib.sha256(good[:64]).hexdigest())
    meta.write_text(json.dumps(header))
    got = _child(cache, "zero_tail")
    assert _outcomes(got) == ["rebuilt"] and got["callable"]
    assert any("could not open" in w for w in got["warnings"]), got
    got = _child(cache, "zero_tail")
    assert _outcomes(got) == ["hit"] and not got["cutlass"] and not got["warnings"]

    # a library of another object (its header names another object's checksum)
    header = json.loads(meta.read_bytes())
    meta.write_text(json.dumps(dict(header, object_sha256="0" * 64)))
    got = _child(cache, "zero_tail")
    assert _outcomes(got) == ["rebuilt"]
    assert any("another object" in w for w in got["warnings"]), got

    # linked by another installation whose runtime libraries are gone (the cache folder is
    # shared): linked again quietly, against this one's
    header = json.loads(meta.read_bytes())
    gone = [str(cache / "gone" / pathlib.Path(p).name) for p in header["libraries"]]
    meta.write_text(json.dumps(dict(header, libraries=gone)))
    got = _child(cache, "zero_tail")
    assert _outcomes(got) == ["linked"] and got["callable"] and not got["warnings"]
    assert json.loads(meta.read_bytes())["libraries"] == header["libraries"]

    # no library (an entry installed from a serialized plan): linked quietly on load, which
    # asks the DSL where its runtime libraries are
    lib.unlink()
    got = _child(cache, "zero_tail")
    assert _outcomes(got) == ["linked"] and got["callable"] and not got["warnings"]
    got = _child(cache, "zero_tail")
    assert _outcomes(got) == ["hit"] and not got["cutlass"]


@needs_dsl
@needs_linking
def test_without_a_c_compiler_tvm_ffi_kernels_load_through_the_dsl(cache, tmp_path):
    no_cc = {"CC": str(tmp_path / "no-such-cc")}
    first = _child(cache, "zero_tail", env=no_cc)
    assert _outcomes(first) == ["compiled"] and first["callable"]
    assert not list(cache.glob("*.so"))
    second = _child(cache, "zero_tail", env=no_cc)
    assert _outcomes(second) == ["hit"] and second["callable"] and second["cutlass"]
    assert len(second["warnings"]) == 1 and "no C compiler" in second["warnings"][0]
    # with a compiler again, the first lookup links the library
    assert _outcomes(_child(cache, "zero_tail")) == ["linked"]


@needs_dsl
def test_two_processes_compiling_at_once_compile_once(cache, tmp_path):
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(CHILD), "gather", "--wait-for", str(go)],
                              env=_env(cache), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    # both import first; once both wait, start them at once
    deadline = time.time() + 300
    while len(list(tmp_path.glob("go.ready*"))) < 2:
        assert time.time() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.02)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    outcomes = sorted(o for r in results for o in _outcomes(r))
    assert outcomes == ["compiled", "hit"], outcomes  # the second waited on the lock, then loaded
    assert all(r["callable"] for r in results)
    assert not list(cache.glob(".*.tmp"))  # no temporary file left behind


@needs_dsl
def test_corrupt_entries_are_rebuilt(cache):
    build, sources = _gather_build()
    assert _get(build, sources) == "compiled"
    obj, = cache.glob("gather_t-*.o")
    meta, = cache.glob("gather_t-*.json")
    good_obj, good_meta = obj.read_bytes(), meta.read_bytes()

    # a flipped byte in the object
    bad = bytearray(good_obj)
    bad[len(bad) // 2] ^= 0xFF
    obj.write_bytes(bytes(bad))
    with pytest.warns(RuntimeWarning, match="checksum"):
        assert _get(build, sources) == "rebuilt"
    assert obj.read_bytes() == good_obj  # builds are bit-reproducible
    assert _get(build, sources) == "hit"

    # a truncated header
    meta.write_bytes(good_meta[:20])
    with pytest.warns(RuntimeWarning, match="unreadable header"):
        assert _get(build, sources) == "rebuilt"
    assert _get(build, sources) == "hit"

    # a header of another DSL version under this key's file name
    header = json.loads(meta.read_bytes())
    header["key"]["dsl"] = "0.0.1"
    meta.write_text(json.dumps(header))
    with pytest.warns(RuntimeWarning, match="another kernel"):
        assert _get(build, sources) == "rebuilt"
    assert json.loads(meta.read_bytes())["key"]["dsl"] != "0.0.1"

    # an object the DSL cannot load although its header matches (a truncated ELF, checksummed)
    obj.write_bytes(good_obj[:64])
    header = json.loads(meta.read_bytes())
    header.update(size=64, sha256=hashlib.sha256(good_obj[:64]).hexdigest())
    meta.write_text(json.dumps(header))
    with pytest.warns(RuntimeWarning, match="could not load"):
        assert _get(build, sources) == "rebuilt"
    assert _get(build, sources) == "hit"


@needs_dsl
def test_another_dsl_version_misses(cache, monkeypatch):
    from cudnn_ext.runtime import compile_cache

    build, sources = _gather_build()
    assert _get(build, sources) == "compiled"
    assert _get(build, sources) == "hit"
    monkeypatch.setitem(compile_cache._versions, "nvidia-cutlass-dsl", "9.9.9")
    assert _get(build, sources) == "compiled"  # not the 4.8.1 entry: a new one beside it
    assert len(list(cache.glob("gather_t-*.o"))) == 2
    keys = sorted(json.loads(m.read_bytes())["key"]["dsl"] for m in cache.glob("*.json"))
    assert keys == sorted([importlib.metadata.version("nvidia-cutlass-dsl"), "9.9.9"])


@needs_dsl
def test_another_source_misses(cache, tmp_path):
    build, _ = _gather_build()
    src = tmp_path / "kernel_src.py"
    src.write_text("# version 1\n")
    from cudnn_ext.runtime import compile_cache

    assert _get(build, (str(src),)) == "compiled"
    compile_cache._source_digests.clear()  # a new process would hash the edited file
    src.write_text("# version 2\n")
    assert _get(build, (str(src),)) == "compiled"


@needs_dsl
def test_carried_entry_installs_into_another_cache(cache, tmp_path, monkeypatch):
    from cudnn_ext.runtime import compile_cache

    build, sources = _gather_build()
    assert _get(build, sources) == "compiled"
    digest = json.loads(next(cache.glob("*.json")).read_bytes())["digest"]
    key, data = compile_cache.entry_of(digest)

    other = tmp_path / "other"
    monkeypatch.setenv("CUDNN_EXT_CACHE_DIR", str(other))
    assert compile_cache.install(key, data)
    assert _get(lambda: pytest.fail("compiled although the entry was installed"),
                sources) == "hit"

    stale = dict(key, dsl="0.0.1")
    monkeypatch.setenv("CUDNN_EXT_CACHE_DIR", str(tmp_path / "third"))
    assert not compile_cache.install(stale, data)
    with pytest.raises(TypeError):
        compile_cache.install("not a key", data)


@needs_dsl
def test_disabled_and_unwritable(cache, monkeypatch, tmp_path):
    from cudnn_ext.runtime import compile_cache

    build, sources = _gather_build()
    monkeypatch.setenv("CUDNN_EXT_CACHE_DISABLE", "1")
    assert _get(build, sources) == "uncached"
    assert not cache.exists()
    monkeypatch.delenv("CUDNN_EXT_CACHE_DISABLE")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("CUDNN_EXT_CACHE_DIR", str(blocker / "cache"))  # under a file: unusable
    monkeypatch.setattr(compile_cache, "_warned", set())
    with pytest.warns(RuntimeWarning, match="CUDNN_EXT_CACHE_DIR"):
        assert _get(build, sources) == "uncached"
