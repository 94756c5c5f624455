"""The reference engine on CUDA tensors: dense and discrete (b_ptrs, K- and N-major) weights read
through device addresses give the same results as the same call on the CPU (issue 2: "on CPU and
CUDA tensors alike"). The reference engine is pinned, whatever else this GPU could run."""
import pytest
import torch

import cudnn_ext

pytestmark = pytest.mark.gpu

L, N, K = 3, 64, 128
COUNTS = (256, 0, 512)  # an empty expert


def _inputs(device):
    g = torch.Generator().manual_seed(1234)
    offs = torch.tensor(COUNTS, dtype=torch.int32).cumsum(0).to(torch.int32)
    m = int(offs[-1]) + 256  # rows past the last offset
    t = dict(a=torch.randn(m, K, generator=g), c=torch.randn(m, 2 * N, generator=g) * 2,
             w=torch.randn(L, N, K, generator=g) * 0.1, alpha=torch.rand(L, generator=g) + 0.5,
             beta=torch.rand(L, generator=g) + 0.5, prob=torch.rand(m, generator=g))
    out = {k: v.to(device) for k, v in t.items()}
    for k in ("a", "c", "w"):
        out[k] = out[k].to(torch.bfloat16)
    out["offs"] = offs.to(device)
    return out


def _call(t, mode):
    kw = dict(a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=None, padded_offsets=t["offs"], alpha_tensor=t["alpha"],
              beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=torch.zeros_like(t["prob"]),
              act_func="dgeglu", generate_dbias=True, d_dtype=torch.float32, engine="reference")
    keep = None
    if mode == "dense":
        kw["b_tensor"] = t["w"].permute(1, 2, 0)
    else:
        keep = [t["w"][e].contiguous() if mode == "k" else t["w"][e].t().contiguous() for e in range(L)]
        kw.update(b_ptrs=torch.tensor([x.data_ptr() for x in keep], dtype=torch.int64, device=t["a"].device),
                  n=N, b_dtype=torch.bfloat16, b_major=mode)
    out = cudnn_ext.grouped_gemm_dglu_wrapper(**kw)
    last = int(t["offs"][-1])
    return out["d_row_tensor"][:last].cpu(), out["dprob_tensor"].cpu(), out["dbias_tensor"].cpu(), keep


@pytest.mark.parametrize("mode", ["dense", "k", "n"])
def test_reference_on_cuda_matches_cpu(mode):
    d_gpu, p_gpu, b_gpu, _ = _call(_inputs("cuda"), mode)
    d_cpu, p_cpu, b_cpu, _ = _call(_inputs("cpu"), mode)
    scale = d_cpu.abs().max()
    assert ((d_gpu - d_cpu).abs().max() / scale) < 1e-4, mode
    assert torch.allclose(p_gpu, p_cpu, rtol=1e-4, atol=1e-4 * p_cpu.abs().max().item())
    assert ((b_gpu.float() - b_cpu.float()).abs().max() / b_cpu.float().abs().max()) < 1e-2
