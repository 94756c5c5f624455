"""Block-scaled (MXFP8 / NVFP4 / MXFP4) device kernels that feed the Hopper BF16 kernel."""
