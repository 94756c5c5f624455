"""Block-scaled operands whose GEMM is exact in fp32 (tests only).

The block path of the reference engine sums a GEMM in another order than the host walk (per
256-row block, all experts at once) and a GPU may pick another GEMM algorithm for a replay than
for an eager call. On these operands every order gives the same bits, so the quantized outputs
and their scale factors can be compared bit for bit: FP8, multiples of 1/8 in [-1, 1] (at most
3 significant bits, so they survive e4m3 and e5m2; products are multiples of 1/64 and a sum
of K <= 256 of them needs 14 bits); FP4, values of the e2m1 grid with a 6 leading every scale
block (so every block's scale is 1 and the values are stored as they are).
"""
import torch

from cudnn_ext.quant import quantize_mxfp8, quantize_nvfp4

E4M3, E5M2, E8M0 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu

#: name: (quantize(x) -> (q, sf), sf_vec_size, FP4)
FORMATS = {
    "mxfp8_e4m3": (lambda x: quantize_mxfp8(x, E4M3), 32, False),
    "mxfp8_e5m2": (lambda x: quantize_mxfp8(x, E5M2), 32, False),
    "nvfp4": (lambda x: quantize_nvfp4(x), 16, True),
    "fp4_e8m0_16": (lambda x: quantize_nvfp4(x, sf_vec_size=16, sf_dtype=E8M0), 16, True),
    "mxfp4": (lambda x: quantize_nvfp4(x, sf_vec_size=32, sf_dtype=E8M0), 32, True),
}

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def exact_values(shape, fp4: bool, sf_vec_size: int, generator: torch.Generator) -> torch.Tensor:
    """fp32 values of ``shape`` (blocks along the last dimension) as the module docstring says."""
    if not fp4:
        return torch.randint(-8, 9, shape, generator=generator).float() / 8
    x = torch.tensor(_E2M1)[torch.randint(0, 16, shape, generator=generator)]
    x[..., ::sf_vec_size] = 6.0
    return x
