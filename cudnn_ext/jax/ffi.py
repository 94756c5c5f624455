"""The XLA FFI path of ``grouped_gemm_dglu_jax`` on CUDA: the SM90 kernel via ``cutlass.jax``.

Owns when the jitted entry point may launch the Hopper kernel as an XLA custom call, and the
call itself: the trace-time problem (built through ``cudnn_ext.contract`` from the arrays'
*metadata*, on torch ``meta`` tensors), the SM90 engine's support check and its first-ranked
configuration (its knob space and cost model, as everywhere else), and
the ``cutlass.jax.cutlass_call`` with zero-initialized ``jnp.zeros`` inputs aliased to the
``d_row`` / ``dprob`` / fp32 dbias-workspace outputs. ``dbias`` is the workspace rounded once
to bf16 (``ws.astype(bfloat16)``): the engine's semantics with a fresh zero dbias.

The kernel adapter is ``cudnn_ext.kernels.sm90.jax_entry``; this module imports it (and the
CuTe DSL) only when a traced call is eligible. Dense ``b`` (L, N, K) and discrete ``b_ptrs``
(a device pointer table, read by the kernel on the device; its descriptors are built into a
zeroed scratch buffer that is one more aliased output, dropped).

What is verified is in docs/jax.md: the CUDA lowering (kernel compiled for sm_90a, custom
call with the expected operands, results and aliases) on a CPU-only machine with
``jax.export``, and the numerics under ``jax.jit`` on an H200. ``CUDNN_EXT_JAX_FFI=0`` switches
the path off (host callback only).
"""
from __future__ import annotations

import dataclasses
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


def _meta(shape, td: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=td, device="meta")


def sm90_problem(a_shape, c_shape, c_td, b_shape, num_experts: int, d_td, act, generate_dbias: bool,
                 *, discrete_n: Optional[int] = None, b_major: str = "k"):
    """``(problem, reasons)``: the BF16 problem of a traced call, as the contract builds it,
    and the SM90 engine's decline reasons (empty: the kernel runs it). Contract errors are
    reasons too (the host-callback path reports them when it runs). Dense: ``b_shape`` is the
    JAX (L, N, K) shape; discrete: ``discrete_n`` is N, ``b_major`` the experts' layout."""
    from .. import contract
    from ..engines.sm90 import Sm90DgluEngine

    m = a_shape[0]
    ops = contract.Operands(
        a=_meta(a_shape, torch.bfloat16), c=_meta(c_shape, c_td),
        padded_offsets=_meta((num_experts,), torch.int32), alpha=_meta((num_experts,), torch.float32),
        beta=_meta((num_experts,), torch.float32), prob=_meta((m,), torch.float32),
        dprob=_meta((m,), torch.float32))
    if discrete_n is None:
        ops.b = _meta(b_shape, torch.bfloat16).permute(1, 2, 0)  # JAX (L, N, K) -> contract (N, K, L)
        weights = {}
    else:
        ops.b_ptrs = _meta((num_experts,), torch.int64)
        weights = dict(n=discrete_n, b_dtype=torch.bfloat16)
    cfg = contract.CallConfig(act_func=act.act_func, linear_offset=act.linear_offset,
                              geglu_alpha=act.geglu_alpha, glu_clamp_max=act.glu_clamp_max,
                              glu_clamp_min=act.glu_clamp_min, m_aligned=act.m_aligned, b_major=b_major)
    try:
        problem, _ = contract.normalize(ops, cfg, d_dtype=d_td, generate_dbias=generate_dbias,
                                        **weights)
    except (ValueError, TypeError, NotImplementedError) as e:
        return None, [f"contract: {e}"]
    problem = dataclasses.replace(problem, device_type="cuda", device_index=None)
    why = list(Sm90DgluEngine().check_support(problem))
    if problem.m_aligned < 256:
        # the ragged schedule's tile table needs a scratch that the FFI call does not carry
        why.append(f"m_aligned {problem.m_aligned}: the FFI call has no scratch for the ragged "
                   f"schedule's tile table (the host callback runs it)")
    return problem, why


def choose_config(problem):
    """The SM90 engine's first-ranked configuration for ``problem`` (its knob space and cost
    model, ranked as heuristic mode A ranks them: ``heuristics.ranked_knobs``), an
    ``Sm90Config``. The unfolded-dbias form (``ffi_config``) of every form the engine picks
    has run on the GPU (tests/bindings/test_jax_ffi.py's GPU test)."""
    from ..engines.heuristics import ranked_knobs
    from ..engines.sm90 import Sm90DgluEngine

    return ranked_knobs(Sm90DgluEngine(), problem)[0][0]


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


def _resident_ctas(cluster_size: int) -> int:
    """The persistent grid: the SM count, or for clusters max active clusters x cluster size
    (a GPC's SM count need not divide by it; a cluster that cannot be co-resident would run
    after the others and double the time of its tiles). Falls back to the SM count when the
    driver query cannot run here (no current CUDA context on this thread)."""
    from ..runtime.occupancy import resident_ctas

    sms = _sm_count()
    try:
        return resident_ctas(sms, cluster_size, "jax")
    except Exception:  # not cached: a later trace may have a context; a grid too
        return sms     # large is still correct, it only costs time


def ffi_config(config):
    """The compile-time config the FFI call builds from the engine's ``config``: dbias left
    unfolded (XLA owns the zeroed fp32 workspace, an aliased output; JAX rounds it) and no
    split last round (its flags and partial sums would need a scratch of their own)."""
    return dataclasses.replace(config, fold_dbias=False, split_last=1)


def dglu_ffi(a2, b, c2, offs, alpha, beta, prob1, *, problem, config, sm_count: Optional[int] = None
             ) -> Tuple:
    """``(d_row (M, 2N), dprob (M,), dbias (L, 2N) bf16 or None)`` by the SM90 kernel as an XLA
    FFI custom call. Operands in canonical 2-D/1-D form: ``a2`` (M, K), ``b`` (L, N, K) or,
    for a discrete problem, the pointer table ((L,) int64 or (8L,) uint8), ``c2`` (M, 2N),
    ``prob1`` (M,). Lowers for CUDA only."""
    import jax
    import jax.numpy as jnp

    from ..kernels.sm90.config import DESC_BYTES

    m, two_n, num_experts = problem.m, 2 * problem.n, problem.num_experts
    d_np = _jnp_dtype(problem.d_dtype)
    dbias_on = bool(problem.generate_dbias)
    zeros = [jnp.zeros((m, two_n), d_np), jnp.zeros((m,), jnp.float32)]
    out_shapes = [jax.ShapeDtypeStruct((m, two_n), d_np), jax.ShapeDtypeStruct((m,), jnp.float32)]
    if dbias_on:
        zeros.append(jnp.zeros((num_experts, two_n), jnp.float32))
        out_shapes.append(jax.ShapeDtypeStruct((num_experts, two_n), jnp.float32))
    if problem.weight_mode == "discrete":
        # the device-built B descriptors (a scratch output, dropped): DESC_BYTES per expert
        # plus DESC_BYTES for the adapter to round the address up to a DESC_BYTES boundary
        nbytes = (num_experts + 1) * DESC_BYTES
        zeros.append(jnp.zeros((nbytes,), jnp.uint8))
        out_shapes.append(jax.ShapeDtypeStruct((nbytes,), jnp.uint8))
    if m == 0:  # nothing to launch (an empty grid): the zeros are the answer
        outs = zeros
    else:
        from cutlass.jax import TensorSpec, cutlass_call

        from ..kernels.sm90 import jax_entry
        from ..runtime.compile_cache import preload_runtime

        # cutlass_call exports the kernel to an object file, which fails to link in a process
        # whose DSL target is another arch unless the runtime is loaded first
        preload_runtime(tvm_ffi=False)

        cfg = ffi_config(config)
        act = problem.act
        kw = jax_entry.static_kwargs(cfg, sm_count or _resident_ctas(cfg.cluster_size()),
                                     act.geglu_alpha, act.clamp_max, act.clamp_min,
                                     act.linear_offset)
        inputs = [a2, b, c2, offs, alpha, beta, prob1, *zeros]
        first = len(inputs) - len(zeros)
        spec = TensorSpec(ptr_assumed_align=jax_entry.BUFFER_ALIGN)
        call = cutlass_call(
            jax_entry.dglu_ffi_entry, output_shape_dtype=tuple(out_shapes),
            input_output_aliases={first + i: i for i in range(len(zeros))},
            input_spec=[spec] * len(inputs), output_spec=[spec] * len(out_shapes),
            compile_options="--gpu-arch sm_90a", compile_key=jax_entry.COMPILE_KEY, **kw)
        outs = list(call(*inputs))
    dbias = outs[2].astype(jnp.bfloat16) if dbias_on else None  # the one rounding to bf16
    return outs[0], outs[1], dbias


def _jnp_dtype(td: torch.dtype):
    import jax.numpy as jnp

    return {torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16, torch.float32: jnp.float32}[td]
