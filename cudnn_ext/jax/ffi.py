"""The XLA FFI path of ``grouped_gemm_dglu_jax`` on CUDA: the SM90 kernel via ``cutlass.jax``.

Owns when the jitted entry point may launch the Hopper kernel as an XLA custom call, and the
call itself: the trace-time problem (built through ``cudnn_ext.contract`` from the arrays'
*metadata*, on torch ``meta`` tensors), the SM90 engine's support check and its first-ranked
configuration (its knob space and cost model, as everywhere else), and
the ``cutlass.jax.cutlass_call`` with zero-initialized ``jnp.zeros`` inputs aliased to the
``d_row`` / ``dprob`` / fp32 dbias-workspace outputs. ``dbias`` is the workspace rounded once
to bf16 (``ws.astype(bfloat16)``): the engine's semantics with a fresh zero dbias.

What the launch needs (the config's FFI form, the grid, the scratch, the kernel adapter
``kernels.sm90.jax_entry``) the SM90 engine says (``Sm90DgluEngine.xla_launch``); the adapter
and the CuTe DSL are imported only when a traced call is eligible. Dense ``b`` (L, N, K) and discrete ``b_ptrs``
(a device pointer table, read by the kernel on the device; its descriptors are built into a
zeroed scratch buffer that is one more aliased output, dropped).

What is verified is in docs/jax.md: the CUDA lowering (kernel compiled for sm_90a, custom
call with the expected operands, results and aliases) on a CPU-only machine with
``jax.export``, and the numerics under ``jax.jit`` on an H200. ``CUDNN_EXT_JAX_FFI=0`` switches
the path off (host callback only).
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Optional, Tuple

import torch

from ..runtime import caches

#: Set to "0" to never use the FFI path (always the host callback).
FFI_ENV = "CUDNN_EXT_JAX_FFI"
#: SM count assumed when no CUDA device is visible at trace time (H100/H200 SXM). The grid of
#: the persistent kernel is min(tiles, SMs); results do not depend on it.
DEFAULT_SM_COUNT = 132


def ffi_available() -> Optional[str]:
    """None if the FFI path can be traced in this process, else why not."""
    if os.environ.get(FFI_ENV, "") == "0":
        return f"{FFI_ENV}=0: the XLA FFI path is switched off"
    if importlib.util.find_spec("cutlass") is None:
        return "the CuTe DSL (nvidia-cutlass-dsl) is not installed"
    import cutlass.jax  # light: the JAX bindings load lazily

    if not cutlass.jax.is_available():
        return "cutlass.jax is not available with this JAX"
    import jax

    try:
        devs = jax.devices("cuda")
    except RuntimeError:
        devs = []  # no GPU visible (e.g. exporting for CUDA from a CPU host): the sm_90a kernel
    cc = getattr(devs[0], "compute_capability", None) if devs else None
    if cc is not None and str(cc) != "9.0":
        return f"the FFI kernel is built for sm_90a (Hopper); this GPU has compute capability {cc}"
    return None


def _engine():
    from ..engines.registry import engine_by_name

    return engine_by_name("sm90_cutedsl")


def ffi_reasons(problem) -> list:
    """Why the SM90 kernel cannot run the traced call's ``problem`` (the contract's, built at
    trace time) as an XLA FFI custom call; empty: it can (``Sm90DgluEngine.xla_reasons``)."""
    return _engine().xla_reasons(problem)


def choose_config(problem):
    """The SM90 engine's first-ranked configuration for ``problem`` (its knob space and cost
    model, ranked as heuristic mode A ranks them: ``heuristics.ranked_knobs``), an
    ``Sm90Config``. The FFI form (``ffi_config``) of every form the engine picks has run on
    the GPU (tests/bindings/test_jax_ffi.py's GPU test)."""
    from ..engines.heuristics import ranked_knobs

    return ranked_knobs(_engine(), problem)[0][0]


def ffi_config(config):
    """The compile-time config the FFI call builds from the engine's ``config``
    (``Sm90DgluEngine.xla_form``: dbias unfolded, no split last round)."""
    return _engine().xla_form(config)


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    import jax

    try:
        devs = jax.devices("cuda")
    except RuntimeError:
        return DEFAULT_SM_COUNT
    n = getattr(devs[0], "core_count", None) if devs else None
    return int(n) if n else DEFAULT_SM_COUNT


caches.lru("JAX device SM count", _sm_count)


def dglu_ffi(a2, b, c2, offs, alpha, beta, prob1, *, problem, config, sm_count: Optional[int] = None
             ) -> Tuple:
    """``(d_row (M, 2N), dprob (M,), dbias (L, 2N) bf16 or None)`` by the SM90 kernel as an XLA
    FFI custom call. Operands in canonical 2-D/1-D form: ``a2`` (M, K), ``b`` (L, N, K) or,
    for a discrete problem, the pointer table ((L,) int64 or (8L,) uint8), ``c2`` (M, 2N),
    ``prob1`` (M,). ``sm_count``: the persistent grid (default: the resident CTAs of the
    device JAX sees). Lowers for CUDA only."""
    import jax
    import jax.numpy as jnp

    m, two_n, num_experts = problem.m, 2 * problem.n, problem.num_experts
    d_np = _jnp_dtype(problem.d_dtype)
    dbias_on = bool(problem.generate_dbias)
    zeros = [jnp.zeros((m, two_n), d_np), jnp.zeros((m,), jnp.float32)]
    out_shapes = [jax.ShapeDtypeStruct((m, two_n), d_np), jax.ShapeDtypeStruct((m,), jnp.float32)]
    if dbias_on:
        zeros.append(jnp.zeros((num_experts, two_n), jnp.float32))
        out_shapes.append(jax.ShapeDtypeStruct((num_experts, two_n), jnp.float32))
    if m == 0:  # nothing to launch (an empty grid): the zeros are the answer
        outs = zeros
    else:
        from cutlass.jax import TensorSpec, cutlass_call

        from ..runtime.compile_cache import preload_runtime

        # cutlass_call exports the kernel to an object file, which fails to link in a process
        # whose DSL target is another arch unless the runtime is loaded first
        preload_runtime(tvm_ffi=False)

        launch = _engine().xla_launch(problem, config, _sm_count(), grid=sm_count)
        if launch.scratch_bytes:  # (the device-built B descriptors: a scratch output, dropped)
            zeros.append(jnp.zeros((launch.scratch_bytes,), jnp.uint8))
            out_shapes.append(jax.ShapeDtypeStruct((launch.scratch_bytes,), jnp.uint8))
        inputs = [a2, b, c2, offs, alpha, beta, prob1, *zeros]
        first = len(inputs) - len(zeros)
        spec = TensorSpec(ptr_assumed_align=launch.buffer_align)
        call = cutlass_call(
            launch.entry, output_shape_dtype=tuple(out_shapes),
            input_output_aliases={first + i: i for i in range(len(zeros))},
            input_spec=[spec] * len(inputs), output_spec=[spec] * len(out_shapes),
            compile_options="--gpu-arch sm_90a", compile_key=launch.compile_key, **launch.static_kwargs)
        outs = list(call(*inputs))
    dbias = outs[2].astype(jnp.bfloat16) if dbias_on else None  # the one rounding to bf16
    return outs[0], outs[1], dbias


def _jnp_dtype(td: torch.dtype):
    import jax.numpy as jnp

    return {torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16, torch.float32: jnp.float32}[td]
