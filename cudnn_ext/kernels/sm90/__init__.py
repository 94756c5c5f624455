"""Hopper (sm_90a) CuTe DSL kernels for grouped GEMM + dGLU.

Modules (all but ``config`` and ``launch`` import the CuTe DSL; ``cudnn_ext.engines.sm90`` and
``cudnn_ext.jax.ffi`` import them lazily):

* ``config``        :class:`~.config.Sm90Config`, the one compile-time configuration (no DSL);
* ``kernel``        the kernel class: jit entry, shared-memory layouts, schedule, warp roles;
* ``mainloop``      A/B TMA producer and the WGMMA mainloop;
* ``epilogue``      the fused dGLU epilogue and its C ring (C loads, D stores);
* ``dbias``         dbias column sums: hand-overs and the folder warp;
* ``stream_k``      the cooperative schedule's split last round;
* ``host_kernels``  helper kernels: workspace zeroing, fresh-outputs prologue, B descriptors,
                    the ragged schedule's unit table;
* ``tile_walk``     block -> (m_tile, n_tile) rasterization, expert lookup (256-aligned and
                    ragged), the split's walk;
* ``epilogue_math`` per-element dSwiGLU / dGeGLU in fp32 (mirrors ``cudnn_ext.reference``);
* ``launch``        the compiled function through the disk cache, the TVM-FFI launch by raw
                    address (no DSL: a warm process launches without it);
* ``build``         compile (fake pointers, works without a GPU) and the DSL-convention launch;
* ``jax_entry``     the kernel as a ``cutlass.jax.cutlass_call`` target (XLA FFI);
* ``trace``         a diagnostic build with per-tile clock stamps (never an engine choice).

This package's ``__init__`` imports nothing so that listing it stays cheap.
"""
