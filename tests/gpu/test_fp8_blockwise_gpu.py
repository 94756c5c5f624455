"""recipe='fp8_blockwise' on a GPU (the reference engine's block path: sm90_cutedsl declines the
recipe): no host sync, dense and pointer-table weights, bf16 and FP8 D, against the CPU run."""
import pytest
import torch

import cudnn_ext as cudnn

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("weights", ["dense", "pointers"])
@pytest.mark.parametrize("d_dtype", [torch.float32, torch.float8_e4m3fn], ids=["fp32", "e4m3"])
def test_gpu_matches_the_cpu_without_a_sync(weights, d_dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from fp8_blockwise_cases import L, N, case

    def call(t, dev):
        on = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
        kw = dict(b_tensor=on["b"], sfb_tensor=on["sfb"])
        keep = []
        if weights == "pointers":
            w = [on["b"][..., e].contiguous() for e in range(L)]
            s = [on["sfb"][..., e].t().contiguous().t() for e in range(L)]
            keep = w + s
            kw = dict(b_ptrs=torch.tensor([x.data_ptr() for x in w], device=dev),
                      sfb_ptrs=torch.tensor([x.data_ptr() for x in s], device=dev), n=N, b_dtype=torch.float8_e4m3fn)
        dprob = torch.zeros(t["m"], device=dev)
        if dev == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            out = cudnn.grouped_gemm_dglu_wrapper(
                a_tensor=on["a"], c_tensor=on["c"], sfa_tensor=on["sfa"], padded_offsets=on["offsets"],
                alpha_tensor=on["alpha"], beta_tensor=on["beta"], prob_tensor=on["prob"], dprob_tensor=dprob,
                d_dtype=d_dtype, recipe="fp8_blockwise", **kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        del keep
        return {k: v.cpu() for k, v in out.items() if v is not None}

    t = case()
    end = int(t["offsets"][-1])
    gpu, cpu = call(t, "cuda"), call(t, "cpu")
    if d_dtype == torch.float32:
        d_g, d_c = gpu["d_row_tensor"][:end].double(), cpu["d_row_tensor"][:end].double()
        assert ((d_g - d_c).norm(dim=1) / d_c.norm(dim=1)).max() < 1e-5
    else:  # the same fp32 D up to its summation order: a scale may differ in its last bits and a
        # value by one e4m3 step (2^-3 relative; 2^-9 on the subnormal grid)
        g, c = gpu["sfd_row_tensor"][:end], cpu["sfd_row_tensor"][:end]
        assert (g - c).abs().le(c.abs() * 1e-5).all()
        g, c = gpu["d_row_tensor"][:end].float(), cpu["d_row_tensor"][:end].float()
        assert (g - c).abs().le(c.abs() * 2.0 ** -3 + 2.0 ** -8).all()
    assert torch.allclose(gpu["dprob_tensor"][:end], cpu["dprob_tensor"][:end], rtol=1e-5, atol=1e-6)
