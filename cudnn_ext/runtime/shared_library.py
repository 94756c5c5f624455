"""Link a TVM-FFI object file into a shared library, and open that library without the CuTe DSL.

Owns one job for the compile cache (``runtime.compile_cache``): turning the object file that
the DSL's ``export_to_c`` writes for a TVM-FFI function into a shared library, and opening it
again. Linking runs the C compiler driver (``$CC``, else ``cc``, else ``gcc``) with
``-shared`` against the two runtime libraries the object calls into, ``libcute_dsl_runtime.so``
(the CUDA launch helpers; the CUDA runtime is inside it) and ``libtvm_ffi.so`` (the calling
convention), and bakes their folders into the library's run-path, so the dynamic loader finds
them again in any process. Opening is ``tvm_ffi.load_module``: it needs apache-tvm-ffi, but not
the DSL, which is the point: a process whose kernels are all on disk never imports cutlass.

Linking asks the DSL where its runtime libraries are (``runtime_libraries`` imports it);
opening does not. No torch, no cache policy (which file, when to link: the compile cache).
"""
from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess
from typing import List, Optional, Sequence

#: A link takes well under a second; this only bounds a hung compiler driver.
LINK_TIMEOUT_S = 120.0


class LinkError(RuntimeError):
    """No C compiler, or the compiler could not link the object (the caller falls back to the
    DSL's own loader)."""


def compiler() -> Optional[List[str]]:
    """The C compiler driver that links, as an argument list: ``$CC`` when set (split like a
    shell command line, so ``CC="ccache gcc"`` works), else ``cc``, else ``gcc``; None when
    that program is not on the PATH."""
    explicit = os.environ.get("CC", "").strip()
    if explicit:
        words = shlex.split(explicit)
        return words if shutil.which(words[0]) else None
    for name in ("cc", "gcc"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def runtime_libraries() -> List[str]:
    """The runtime libraries a TVM-FFI object of the installed DSL needs, as paths (the DSL's
    own list, so a cu12 or cu13 build of the DSL names its own runtime). Imports the DSL."""
    from cutlass.cute import runtime

    return [str(p) for p in runtime.find_runtime_libraries(enable_tvm_ffi=True)]


def link(obj: pathlib.Path, out: pathlib.Path, libraries: Sequence[str]) -> None:
    """Link the object file ``obj`` into the shared library ``out`` against ``libraries``
    (paths), with their folders as its run-path. Raises :class:`LinkError`."""
    cc = compiler()
    if cc is None:
        raise LinkError("no C compiler to link with (set CC, or install cc or gcc)")
    folders = sorted({os.path.dirname(os.path.abspath(p)) for p in libraries})
    # --no-undefined: a symbol the runtime libraries do not define fails here, naming it,
    # instead of at every later load
    cmd = [*cc, "-shared", "-o", str(out), str(obj), *map(str, libraries),
           "-Wl,--no-undefined", *(f"-Wl,-rpath,{d}" for d in folders)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LINK_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise LinkError(f"{shlex.join(cmd)}: {e}") from None
    if done.returncode != 0:
        raise LinkError(f"{shlex.join(cmd)} exited with {done.returncode}: "
                        f"{(done.stderr or done.stdout).strip()[-2000:]}")


def open_function(path: pathlib.Path, name: str):
    """The TVM-FFI function ``name`` of the shared library at ``path`` (the function keeps the
    library loaded). Raises what ``tvm_ffi`` raises: RuntimeError for a library the loader
    refuses, AttributeError for a missing function."""
    import tvm_ffi

    return tvm_ffi.load_module(str(path))[name]
