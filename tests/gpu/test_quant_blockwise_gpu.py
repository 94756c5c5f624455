"""The FP8 blockwise quantizer on a GPU: bit for bit the CPU's values and scales (the same torch
code; CUDA's fp32 division is IEEE-rounded, as the rule needs), with no host sync."""
import pytest
import torch

from cudnn_ext.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise
from cudnn_ext.quant.blockwise import BLOCKS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("pow2", [False, True])
def test_device_matches_cpu_bit_for_bit(block, pow2):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(384, 520, 2, generator=g) * torch.logspace(-40, 40, 384, base=2.0)[:, None, None]
    x[5, :128, 0] = float("nan")
    x[300, 200, 1] = float("inf")
    x[:, 256:384, 1] = 0.0
    q_cpu, s_cpu = quantize_fp8_blockwise(x, block, pow2_scales=pow2)
    x_gpu = x.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host sync inside raises
    try:
        q_gpu, s_gpu = quantize_fp8_blockwise(x_gpu, block, pow2_scales=pow2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(q_gpu.cpu().view(torch.uint8), q_cpu.view(torch.uint8))
    assert torch.equal(s_gpu.cpu().view(torch.int32), s_cpu.view(torch.int32))
    back = dequantize_fp8_blockwise(q_gpu, s_gpu, block, out_dtype=torch.float64).cpu()
    ref = dequantize_fp8_blockwise(q_cpu, s_cpu, block, out_dtype=torch.float64)
    assert torch.equal(back.isnan(), ref.isnan()) and torch.equal(back.nan_to_num(), ref.nan_to_num())
