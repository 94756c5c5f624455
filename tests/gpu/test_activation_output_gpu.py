"""The activation output cudnn_ext adds (dSwiGLU with BF16 operands; dSiTU-GLU and dGeGLU with
block-scaled ones) through the wrapper on a GPU: the heuristics' engine (the Hopper kernels)
runs with no host sync and matches the reference engine's CPU run."""
import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext.quant import quantize_nvfp4

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
L, N, K, M = 2, 64, 64, 512


def _call(dev, act, block_scaled):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(M, K, generator=g)
    w = torch.randn(L, N, K, generator=g) / 4
    c = (torch.randn(M, 2 * N, generator=g) * 2).to(BF16)
    kw = dict(padded_offsets=torch.tensor([256, 512], dtype=torch.int32), alpha_tensor=torch.rand(L, generator=g) + 0.5,
              beta_tensor=torch.ones(L), prob_tensor=torch.rand(M, generator=g), c_tensor=c)
    if block_scaled:
        a_q, sfa = quantize_nvfp4(a)
        b_q, sfb = quantize_nvfp4(w.permute(1, 2, 0))
        kw.update(a_tensor=a_q, sfa_tensor=sfa, b_tensor=b_q, sfb_tensor=sfb, d_dtype=BF16)
    else:
        kw.update(a_tensor=a.to(BF16), sfa_tensor=None, b_tensor=w.to(BF16).permute(1, 2, 0))
    kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    act_out = torch.full((M, N), float("nan"), dtype=BF16, device=dev)
    dprob = torch.zeros(M, device=dev)
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        out = cudnn.grouped_gemm_dglu_wrapper(dprob_tensor=dprob, activation_tensor=act_out, act_func=act, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return act_out.cpu(), out["d_row_tensor"].cpu(), dprob.cpu()


@pytest.mark.parametrize("act,block_scaled", [("dswiglu", False), ("dsituglu", True), ("dgeglu", True)])
def test_the_gpu_matches_the_cpu(act, block_scaled):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpu, cpu = _call("cuda", act, block_scaled), _call("cpu", act, block_scaled)
    for g, c in zip(gpu, cpu):
        assert torch.allclose(g.float(), c.float(), rtol=2 ** -7, atol=1e-5)
