"""The persistent compile cache: CuTe DSL kernels compiled once per machine, not once per process.

Owns one job: given a kernel's identity and a function that compiles it, return a callable
compiled function, loading it from disk when an earlier process (or an earlier run) already
compiled the same kernel. Every compile site of the library goes through :func:`load_or_compile`
(the SM90 kernel, the block-scaled dequantizer, the layer's kernels, the
pointer-table gather); their per-process dicts sit in front of it.

What is stored: the compiled function exported as an object file (``export_to_c`` for the
TVM-FFI calling convention, ``dump_to_object`` for the DSL's own). Each entry is two files in
the cache folder:

- ``<kind>-<digest>.o``: the object file (the entry itself: what plan serialization carries);
- ``<kind>-<digest>.json``: its header: the full key (below), the digest, the object's size
  and SHA-256, written after the object.

How it is loaded: a TVM-FFI object is linked once into a shared library beside it
(``runtime.shared_library``: the C compiler driver, ``cc -shared``), which
``tvm_ffi.load_module`` opens in a few milliseconds without importing the DSL, so a process
whose kernels are all on disk never imports cutlass. Two more files:

- ``<kind>-<digest>.so``: the linked library (run-path: the DSL's and apache-tvm-ffi's
  runtime library folders);
- ``<kind>-<digest>.so.json``: its header: the digest, the SHA-256 of the object it was linked
  from, the runtime libraries, its size and SHA-256, written after the library.

The library is linked by the process that compiles the kernel, or by the first process that
loads an entry without one (an entry installed from a serialized plan, say), under the
entry's lock. Linking asks the DSL where its runtime libraries are, so that process imports
the DSL once. Without a C compiler (no ``$CC``, ``cc`` or ``gcc``), or when linking fails,
TVM-FFI entries are loaded as DSL-convention ones are: ``cutlass.cute.runtime.load_module``
links the object in memory (a few milliseconds, but it imports the DSL), after one warning.

The key is everything the object depends on: the site's kind and config (``repr``), a SHA-256
of the kernel's source files, the target architecture, the calling convention, and the
versions of the CuTe DSL, of apache-tvm-ffi (its ABI is baked into TVM-FFI objects) and of
cudnn_ext; the digest is the SHA-256 of the key. So an entry built by another DSL version,
another source, or for another arch is simply never looked up (a miss: compile and store
beside it). An entry whose header does not match its key, whose object does not match its
size or checksum, or which the DSL refuses to load is *corrupt*: it is compiled again and
replaced, with a warning. A library whose header is not its object's, whose bytes do not
match its header, or which the loader refuses is linked again from the object, with a warning.

Concurrency: several processes (eight ranks of one node) asking for the same kernel take an
exclusive ``flock`` on ``<kind>-<digest>.lock``; the first compiles and stores (and links), the
others wait and then load. Files are written to a unique temporary name in the same folder and
moved into place with ``os.replace`` (atomic on POSIX), so a reader sees a whole file or none,
even where ``flock`` is not available (then each process may compile, and the last rename wins
with identical bytes). In one process, compiles are serialized by a lock (``cute.compile`` is
not thread-safe).

Location: ``$CUDNN_EXT_CACHE_DIR``, else ``$XDG_CACHE_HOME/cudnn_ext``, else
``~/.cache/cudnn_ext``. ``CUDNN_EXT_CACHE_DISABLE=1`` turns the disk cache off (every process
compiles). A folder that cannot be created or written disables it with one warning. Clearing
the cache: delete the folder (``clear()`` does that for the current location).

Importing this module imports no DSL; the DSL is imported when a kernel is compiled, linked,
or loaded through the DSL's own loader.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata as md
import json
import os
import pathlib
import platform
import re
import shutil
import tempfile
import threading
import time
import warnings
from typing import Callable, Dict, Iterable, NamedTuple, Optional, Tuple

from ..version import __version__
from . import caches, shared_library

#: Bumped when the entry layout or the key's fields change (old entries then never match).
FORMAT = 1
#: How long a process waits for another one compiling the same kernel before compiling it
#: itself (a compile takes seconds; a holder that died releases its flock at once).
LOCK_TIMEOUT_S = 600.0

_SAFE_KIND = re.compile(r"[A-Za-z0-9_]+")
_PACKAGE = pathlib.Path(__file__).resolve().parents[1]
_UMASK = os.umask(0o022)
os.umask(_UMASK)

# cute.compile is not thread-safe, and one process compiles one kernel at a time anyway
_compile_lock = threading.RLock()
_warned: set = set()
#: digest -> (key dict, object path) of every entry this process stored or loaded
#: (``entry_of`` hands them to plan serialization)
_loaded: Dict[str, Tuple[dict, pathlib.Path]] = {}
#: (kind, repr(config)) -> digest of every kernel this process looked up with the disk cache on:
#: how a compile site's plan names the entries it runs (``digest_for``)
_site_digests: Dict[Tuple[str, str], str] = {}
#: What happened to each lookup of this process, in order: (kind, "hit" | "linked" |
#: "compiled" | "rebuilt" | "uncached", seconds); "linked": loaded after linking the entry's
#: missing shared library (which imports the DSL). Tests and the startup benchmark read it.
events: list = []


class CacheEntryError(RuntimeError):
    """An entry on disk does not hold what its key says (the caller rebuilds it)."""


def cache_dir() -> Optional[pathlib.Path]:
    """The cache folder now (read from the environment on each call, so a test or a launcher
    can point it elsewhere), or None when the disk cache is disabled."""
    if os.environ.get("CUDNN_EXT_CACHE_DISABLE", "") not in ("", "0"):
        return None
    explicit = os.environ.get("CUDNN_EXT_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "cudnn_ext"


def _warn_once(what: str, msg: str) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"cudnn_ext compile cache: {msg}", RuntimeWarning, stacklevel=3)


_source_digests: Dict[Tuple[str, ...], str] = {}


def source_digest(paths: Iterable[str]) -> str:
    """SHA-256 over the ``.py`` files of ``paths`` (files, or folders taken recursively),
    relative to the package, in sorted order: the kernel's source part of the key. Computed
    once per process per set of paths (sources do not change under a running process)."""
    paths = tuple(sorted(str(p) for p in paths))
    d = _source_digests.get(paths)
    if d is None:
        files = set()
        for p in (pathlib.Path(p).resolve() for p in paths):
            files.update(p.rglob("*.py") if p.is_dir() else (p,))
        h = hashlib.sha256()
        for f in sorted(files):
            h.update(str(f.relative_to(_PACKAGE.parent) if _PACKAGE.parent in f.parents
                         else f.name).encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
        d = _source_digests[paths] = h.hexdigest()
    return d


_versions: Dict[str, Optional[str]] = {}


def _version(dist: str) -> Optional[str]:
    if dist not in _versions:
        try:
            _versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            _versions[dist] = None
    return _versions[dist]


def dsl_version() -> Optional[str]:
    """The installed CuTe DSL's version (part of every key)."""
    return _version("nvidia-cutlass-dsl")


def make_key(kind: str, config, sources: Iterable[str], arch: str, tvm_ffi: bool) -> dict:
    """The full key of a kernel: what its object file depends on (see the module docstring)."""
    return {"format": FORMAT, "kind": kind, "config": repr(config),
            "sources": source_digest(sources), "arch": arch,
            "convention": "tvm_ffi" if tvm_ffi else "dsl",
            "dsl": dsl_version(), "tvm_ffi": _version("apache-tvm-ffi") if tvm_ffi else None,
            "cudnn_ext": __version__, "machine": platform.machine()}


def digest_of(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


class _Entry(NamedTuple):
    """The files of one entry (module docstring)."""

    obj: pathlib.Path
    meta: pathlib.Path
    lock: pathlib.Path
    lib: pathlib.Path
    lib_meta: pathlib.Path


def _paths(folder: pathlib.Path, kind: str, digest: str) -> _Entry:
    stem = folder / f"{kind}-{digest[:40]}"
    return _Entry(*(stem.with_suffix(s) for s in (".o", ".json", ".lock", ".so", ".so.json")))


def _symbol(kind: str, digest: str) -> str:
    """The exported function's name: unique per entry, so two loaded objects never share one."""
    return f"cudnn_ext_{kind}_{digest[:16]}"


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` under a unique name next to ``path``, then rename it into place: a reader
    sees the old file, the new one, or none, never a partial one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide entries from a shared folder
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _store(obj: pathlib.Path, meta: pathlib.Path, key: dict, digest: str, data: bytes) -> None:
    """Write an entry: the object first, the header last, so a header names only a whole
    object."""
    _atomic_write(obj, data)
    _atomic_write(meta, json.dumps({"digest": digest, "key": key, "size": len(data),
                                    "sha256": hashlib.sha256(data).hexdigest(),
                                    "created": time.time()}, sort_keys=True).encode())


def _read_header(meta: pathlib.Path) -> dict:
    try:
        header = json.loads(meta.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise CacheEntryError(f"{meta.name}: unreadable header ({e})") from None
    if not isinstance(header, dict):
        raise CacheEntryError(f"{meta.name}: unreadable header (not an object)")
    return header


def _check_bytes(path: pathlib.Path, header: dict) -> None:
    data = path.read_bytes()
    if len(data) != header.get("size") or hashlib.sha256(data).hexdigest() != header.get("sha256"):
        raise CacheEntryError(f"{path.name}: size or checksum does not match its header")


def _read_checked(e: _Entry, key: dict, digest: str) -> dict:
    """The header of the entry ``e``; raise :class:`CacheEntryError` unless the entry is whole
    and is ``key``'s; FileNotFoundError when there is none."""
    header = _read_header(e.meta)
    if header.get("digest") != digest or header.get("key") != key:
        raise CacheEntryError(f"{e.meta.name}: the header is another kernel's")
    _check_bytes(e.obj, header)
    return header


def _load_dsl(obj: pathlib.Path, kind: str, digest: str, tvm_ffi: bool):
    """The entry's function, linked in memory by the DSL's loader (imports the DSL)."""
    from cutlass.cute import runtime

    try:
        return runtime.load_module(str(obj), enable_tvm_ffi=tvm_ffi)[_symbol(kind, digest)]
    except Exception as e:  # the DSL's own errors (JIT link, missing symbol): rebuild
        raise CacheEntryError(f"{obj.name}: the DSL could not load it ({e})") from None


def _open_linked(e: _Entry, kind: str, digest: str, obj_sha: str):
    """The function of the entry's linked library, without the DSL. FileNotFoundError when
    there is none, or when a runtime library it was linked against is gone (another
    installation linked it, since removed: linked again quietly, for this one);
    :class:`CacheEntryError` when it is not the library of this object (by its header), does
    not match its header, or the loader refuses it."""
    header = _read_header(e.lib_meta)
    if header.get("digest") != digest or header.get("object_sha256") != obj_sha:
        raise CacheEntryError(f"{e.lib_meta.name}: the header is another object's")
    gone = [p for p in header.get("libraries") or () if not os.path.exists(p)]
    if gone:
        raise FileNotFoundError(f"{e.lib.name}: linked against {gone[0]}, which is gone")
    _check_bytes(e.lib, header)
    try:
        return shared_library.open_function(e.lib, _symbol(kind, digest))
    except Exception as err:  # tvm_ffi's loader errors (a damaged ELF, a missing runtime)
        raise CacheEntryError(f"{e.lib.name}: the loader could not open it ({err})") from None


def _link(e: _Entry, digest: str, obj_sha: str) -> None:
    """Link the entry's object into its library, then write the library's header (the
    caller holds the entry's lock). Raises ``shared_library.LinkError`` or OSError."""
    libraries = shared_library.runtime_libraries()
    fd, tmp = tempfile.mkstemp(dir=e.lib.parent, prefix=f".{e.lib.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shared_library.link(e.obj, pathlib.Path(tmp), libraries)
        os.chmod(tmp, 0o666 & ~_UMASK)  # the linker may keep mkstemp's 0600 (shared folders)
        with open(tmp, "rb") as f:
            data = f.read()
            os.fsync(f.fileno())
        os.replace(tmp, e.lib)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _atomic_write(e.lib_meta, json.dumps({
        "digest": digest, "object_sha256": obj_sha, "libraries": libraries,
        "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "created": time.time()},
        sort_keys=True).encode())


def _load(e: _Entry, kind: str, digest: str, obj_sha: str, tvm_ffi: bool, *, locked: bool):
    """(function, note) of the checked entry ``e``: a TVM-FFI entry through its linked
    library (linked first when missing or damaged), a DSL-convention one, or a TVM-FFI one
    that cannot be linked here, through the DSL's loader. ``note``: "linked" or "rebuilt"
    when this call linked the library (it was missing, or damaged), else None. ``locked``:
    the caller holds the entry's lock (else linking takes it)."""
    if not tvm_ffi:
        return _load_dsl(e.obj, kind, digest, tvm_ffi), None
    try:
        return _open_linked(e, kind, digest, obj_sha), None
    except FileNotFoundError:
        note = "linked"
    except CacheEntryError as err:
        # every time, like a corrupt object: a library that goes bad again is worth seeing
        warnings.warn(f"cudnn_ext compile cache: {err}; linking it again", RuntimeWarning,
                      stacklevel=4)
        note = "rebuilt"
    if shared_library.compiler() is None:
        _warn_once("link", "no C compiler (set CC, or install cc or gcc) to link TVM-FFI "
                           "kernels into shared libraries; loading them through the CuTe DSL, "
                           "which each process then imports")
        return _load_dsl(e.obj, kind, digest, tvm_ffi), None
    with contextlib.ExitStack() as held:
        if not locked:
            held.enter_context(_FileLock(e.lock, LOCK_TIMEOUT_S))
            # another process may have linked it while this one waited
            with contextlib.suppress(FileNotFoundError, CacheEntryError):
                return _open_linked(e, kind, digest, obj_sha), None
        try:
            _link(e, digest, obj_sha)
            return _open_linked(e, kind, digest, obj_sha), note
        except (shared_library.LinkError, OSError, CacheEntryError) as err:
            _warn_once("link", f"cannot link {e.obj.name} into a shared library ({err}); "
                               f"loading TVM-FFI kernels through the CuTe DSL")
    return _load_dsl(e.obj, kind, digest, tvm_ffi), None


_runtime_loaded: set = set()


def preload_runtime(tvm_ffi: bool) -> None:
    """Make the DSL's runtime libraries globally visible before an export (this cache's, or
    ``cutlass.jax.cutlass_call``'s for JAX): the export links the host code in memory, and in
    a process whose DSL target differs from the export's (a test session compiling for
    several) it otherwise fails with "Symbols not found: _cudaLibraryLoadData, ..."
    (docs/compile_cache.md, "The CuTe DSL's target and exports")."""
    if tvm_ffi in _runtime_loaded:
        return
    import ctypes

    from cutlass.cute import runtime

    for lib in runtime.find_runtime_libraries(enable_tvm_ffi=tvm_ffi):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    _runtime_loaded.add(tvm_ffi)


def _export(fn, kind: str, digest: str, tvm_ffi: bool, folder: pathlib.Path) -> bytes:
    """The object file of a freshly compiled ``fn``."""
    name = _symbol(kind, digest)
    preload_runtime(tvm_ffi)
    if not tvm_ffi:
        return fn.dump_to_object(name)
    # the TVM-FFI function exports only to a path
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".o")
    os.close(fd)
    try:
        fn.export_to_c(tmp, function_name=name)
        return pathlib.Path(tmp).read_bytes()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


class _FileLock:
    """An exclusive ``flock`` on ``path`` (released by the OS if the holder dies). Where the
    file system has none (some network mounts), it holds nothing: the atomic renames still
    keep readers safe, and each process may compile."""

    def __init__(self, path: pathlib.Path, timeout: float):
        self.path, self.timeout, self.fd = path, timeout, None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # not POSIX
            return self
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return self
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    break  # no locking here: go on without it
                if time.monotonic() > deadline:
                    _warn_once("lock-timeout", f"waited {self.timeout:.0f} s for {self.path}; "
                                               f"compiling without it")
                    break
                time.sleep(0.02)
        os.close(self.fd)
        self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def load_or_compile(kind: str, config, compile_fn: Callable[[], object], *,
                    sources: Iterable[str], arch: str, tvm_ffi: bool):
    """The compiled function of the kernel ``(kind, config)``: loaded from the disk cache when a
    whole entry with this key is there, else ``compile_fn()`` (which must return a compiled
    function of ``tvm_ffi``'s calling convention for ``arch``), stored, and loaded back, so
    every process runs the same bytes. ``sources``: the files and folders of the kernel's
    source (part of the key). With the disk cache off or unusable: ``compile_fn()``."""
    t0 = time.perf_counter()
    folder = cache_dir()
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK):
                raise PermissionError(errno.EACCES, "not writable", str(folder))
        except OSError as e:
            _warn_once("dir", f"cannot use {folder} ({e}); compiling in every process "
                              f"(set CUDNN_EXT_CACHE_DIR to a writable folder)")
            folder = None
    if folder is None:
        with _compile_lock:
            fn = compile_fn()
        events.append((kind, "uncached", time.perf_counter() - t0))
        return fn

    key = make_key(kind, config, sources, arch, tvm_ffi)
    digest = digest_of(key)
    e = _paths(folder, kind, digest)
    outcome = "hit"

    def try_load(locked: bool):
        nonlocal outcome
        try:
            header = _read_checked(e, key, digest)
            fn, note = _load(e, kind, digest, header["sha256"], tvm_ffi, locked=locked)
        except FileNotFoundError:
            return None
        except CacheEntryError as err:
            # every time: a rebuilt entry that goes bad again is worth seeing
            warnings.warn(f"cudnn_ext compile cache: {err}; rebuilding it", RuntimeWarning,
                          stacklevel=3)
            outcome = "rebuilt"
            return None
        if note is not None and outcome == "hit":
            outcome = note
        return fn

    # without the lock: the common case, a warm cache, takes no lock
    fn = try_load(locked=False)
    if fn is None:
        with _compile_lock, _FileLock(e.lock, LOCK_TIMEOUT_S):
            # another process may have stored it
            fn = try_load(locked=True) if outcome == "hit" else None
            if fn is None:
                if outcome == "hit":
                    outcome = "compiled"
                fn = _compile_store_load(compile_fn, key, kind, digest, tvm_ffi, folder, e)
    _loaded[digest] = (key, e.obj)
    _site_digests[(kind, repr(config))] = digest
    events.append((kind, outcome, time.perf_counter() - t0))
    return fn


def _compile_store_load(compile_fn, key, kind, digest, tvm_ffi, folder, e: _Entry):
    """Compile, store and load back (linking a TVM-FFI entry's library) under the entry's
    lock."""
    fn = compile_fn()
    try:
        data = _export(fn, kind, digest, tvm_ffi, folder)
    except Exception as e:  # the DSL's export failing must not fail the compile it follows
        _warn_once(f"export-{kind}", f"cannot export {kind} kernels ({e}); running them "
                                     f"uncached")
        return fn
    try:
        _store(e.obj, e.meta, key, digest, data)
    except OSError as err:  # a full or read-only disk: run what was compiled
        _warn_once("write", f"cannot store {e.obj.name} ({err})")
        return fn
    try:
        return _load(e, kind, digest, hashlib.sha256(data).hexdigest(), tvm_ffi, locked=True)[0]
    except CacheEntryError as err:
        _warn_once("reload", f"{err}; using the in-process compile")
        return fn


def digest_for(kind: str, config) -> Optional[str]:
    """The digest of the entry this process looked up for the kernel ``(kind, config)`` (the
    arguments ``load_or_compile`` got), or None when it did not, or did with the disk cache
    off. A plan lists its kernels' digests this way for ``entry_of``."""
    return _site_digests.get((kind, repr(config)))


def entry_of(digest: str) -> Optional[Tuple[dict, bytes]]:
    """(key, object bytes) of an entry this process stored or loaded, for carrying it in a
    serialized plan; None if unknown or gone from disk."""
    got = _loaded.get(digest)
    if got is None:
        return None
    key, obj = got
    try:
        return key, obj.read_bytes()
    except OSError:
        return None


def install(key: dict, data: bytes) -> bool:
    """Store an entry carried from elsewhere (a serialized plan) so that the next lookup of its
    key loads it. Only when its key is one this process would build (same DSL, sources, arch,
    versions): a stale entry is ignored and False returned. True when stored or already there."""
    if not isinstance(key, dict) or not isinstance(data, (bytes, bytearray)):
        raise TypeError("install: expected a key dict and the object bytes")
    folder = cache_dir()
    # the kind names the entry's files: a carried key must not point outside the folder
    if not _SAFE_KIND.fullmatch(str(key.get("kind", ""))):
        return False
    try:
        expected = make_key(key["kind"], None, (), key["arch"], key["convention"] == "tvm_ffi")
    except (KeyError, TypeError):
        return False
    # every field but the config and the sources, which only the compile site can name
    # (a carried entry keyed to other sources is simply never looked up)
    if folder is None or {k: v for k, v in key.items() if k not in ("config", "sources")} != \
            {k: v for k, v in expected.items() if k not in ("config", "sources")}:
        return False
    digest = digest_of(key)
    e = _paths(folder, key["kind"], digest)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _FileLock(e.lock, LOCK_TIMEOUT_S):
            try:
                _read_checked(e, key, digest)
                return True
            except (FileNotFoundError, CacheEntryError):
                pass
            # a library linked from the object replaced here is not this one's: the first
            # load links it again (without the header, quietly)
            with contextlib.suppress(FileNotFoundError):
                e.lib_meta.unlink()
            _store(e.obj, e.meta, key, digest, bytes(data))
    except OSError as err:
        _warn_once("write", f"cannot store {e.obj.name} ({err})")
        return False
    return True


def _clear_in_process() -> None:
    for d in (_loaded, _site_digests, _source_digests, _versions):
        d.clear()


# what this process has loaded from the folder and the digests of the sources it hashed
# (the loaded shared libraries stay: they are loaded once per process)
caches.register("compile cache entries", _clear_in_process,
                lambda: len(_loaded) + len(_site_digests) + len(_source_digests) + len(_versions))


def clear() -> None:
    """Delete the current cache folder (every process compiles again once)."""
    folder = cache_dir()
    if folder is not None and folder.exists():
        shutil.rmtree(folder)
