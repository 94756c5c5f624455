"""JAX bindings: the wrapper on JAX arrays (eager, via DLPack) and a ``jax.jit`` entry point.

Owns the JAX side only: the eager wrapper on JAX arrays (``cudnn_ext.api.jax_arrays``
converts them to torch views, zero-copy DLPack, and back; the wrapper dispatches there); ``jit`` exposes ``grouped_gemm_dglu_jax`` (alias
``grouped_gemm_dglu_jax_sm100``) for traced programs. Importing ``cudnn_ext`` never imports
this package (nor jax); importing this package imports jax.

What runs where (see docs/jax.md): the eager wrapper runs whatever engine the plan picks for
the arrays' device (the GPU kernel on a GPU); the jitted entry point lowers, on CUDA, to an XLA FFI custom call of
the SM90 kernel (``ffi``, through ``cutlass.jax``; dense or per-expert weights the SM90
engine supports) and otherwise to a ``jax.pure_callback`` that runs the reference engine on
the host. The CUDA lowering is checked on a CPU (``jax.export``) and run against the float64
oracle on an H200 (the ``gpu`` tests in tests/bindings/test_jax_ffi.py).
"""
from ..api.jax_arrays import expert_pointers, to_torch, wrapper_from_jax
from .jit import grouped_gemm_dglu_jax, grouped_gemm_dglu_jax_sm100

__all__ = ["grouped_gemm_dglu_jax", "grouped_gemm_dglu_jax_sm100", "expert_pointers", "to_torch",
           "wrapper_from_jax"]
