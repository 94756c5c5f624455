"""recipe='fp8_blockwise' with pointer-table weights on a GPU (the reference engine's block path:
the Hopper engine takes dense weights, tests/gpu/test_fp8_blockwise_kernel_gpu.py): no host
sync, fp32 and FP8 D, against the CPU run and the float64 oracle."""
import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("d_dtype", [torch.float32, torch.float8_e4m3fn], ids=["fp32", "e4m3"])
def test_gpu_matches_the_cpu_without_a_sync(d_dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from fp8_blockwise_cases import TOL, L, N, case, reference, rel, wrapper_on

    def call(t, dev):
        on = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
        w = [on["b"][..., e].contiguous() for e in range(L)]
        s = [on["sfb"][..., e].t().contiguous().t() for e in range(L)]
        out, _, engine = wrapper_on(
            t, dev, b_ptrs=torch.tensor([x.data_ptr() for x in w], device=dev),
            sfb_ptrs=torch.tensor([x.data_ptr() for x in s], device=dev), n=N, b_dtype=torch.float8_e4m3fn,
            d_dtype=d_dtype)
        assert dev == "cpu" or engine == "reference"
        del w, s
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
    # dprob sums 2N terms that cancel: judged against the oracle, as a vector
    ref = reference(t)
    assert rel(gpu["dprob_tensor"], ref["dprob"], end) < TOL and rel(cpu["dprob_tensor"], ref["dprob"], end) < TOL
