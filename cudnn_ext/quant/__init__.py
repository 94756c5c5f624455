"""Block-scaled number formats, the scale-factor layout, and quantize/dequantize helpers.

Public surface (see docs/blockscaled.md):

* :func:`quantize_mxfp8`, :func:`quantize_nvfp4`, :func:`dequantize` -- operands for the
  block-scaled contract and back;
* :func:`swizzle_sf`, :func:`unswizzle_sf`, :func:`sf_index`, :func:`sf_offset`,
  :func:`sf_shape`, :func:`as_sf_6d`, :func:`empty_sf` -- the 6-D scale-factor layout;
* :func:`quantize_fp8_blockwise`, :func:`dequantize_fp8_blockwise` -- FP8 with fp32 scales per
  1x128 / 128x128 / 128x1 block (DeepSeek-V3's recipe, the ``fp8_blockwise`` operands);
* :mod:`cudnn_ext.quant.formats` -- bit-exact e8m0 / e4m3 / e5m2 / e2m1 codecs.

Pure torch; runs on CPU and CUDA tensors; never syncs the host.
"""
from .blockwise import dequantize_fp8_blockwise, quantize_fp8_blockwise
from .mx import dequantize, quantize_blocks, quantize_mxfp8, quantize_nvfp4
from .sf_layout import (as_sf_6d, empty_sf, sf_index, sf_k_blocks, sf_numel, sf_offset, sf_shape,
                        storage_of, swizzle_sf, unswizzle_sf)

__all__ = [
    "quantize_mxfp8", "quantize_nvfp4", "dequantize", "quantize_blocks",
    "swizzle_sf", "unswizzle_sf", "sf_index", "sf_offset", "sf_shape", "sf_numel",
    "sf_k_blocks", "as_sf_6d", "empty_sf", "storage_of", "quantize_fp8_blockwise", "dequantize_fp8_blockwise",
]
