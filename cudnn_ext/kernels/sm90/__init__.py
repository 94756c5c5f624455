"""Hopper (sm_90a) CuTe DSL kernels for grouped GEMM + dGLU.

Modules (each imports the CuTe DSL; only ``cudnn_ext.engines.sm90`` imports them, lazily):

* ``tile_walk``     block -> (m_tile, n_tile) rasterization, expert lookup from the offsets;
* ``epilogue_math`` per-element dSwiGLU / dGeGLU in fp32 (mirrors ``cudnn_ext.reference``);
* ``dglu_kernel``   the kernel: TMA/WGMMA mainloop, fused epilogue, dprob/dbias reductions;
* ``launch``        compile (fake pointers, works without a GPU) and launch by raw address.

This package's ``__init__`` imports nothing so that listing it stays cheap.
"""
