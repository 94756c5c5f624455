"""The reference engine on CUDA tensors: dense and discrete (b_ptrs, K- and N-major) weights read
through device addresses give the same results as the same call on the CPU (the engine serves
CPU and CUDA tensors alike). The reference engine is pinned, whatever else this GPU could run."""
import pytest
import torch

import cudnn_ext

pytestmark = pytest.mark.gpu

L, N, K = 3, 64, 128
COUNTS = (256, 0, 512)  # an empty expert
COUNTS_8 = (136, 0, 504)  # m_aligned 8: groups that straddle the 256-row blocks


def _inputs(device, counts=COUNTS):
    g = torch.Generator().manual_seed(1234)
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    m = int(offs[-1]) + 256  # rows past the last offset
    t = dict(a=torch.randn(m, K, generator=g), c=torch.randn(m, 2 * N, generator=g) * 2,
             w=torch.randn(L, N, K, generator=g) * 0.1, alpha=torch.rand(L, generator=g) + 0.5,
             beta=torch.rand(L, generator=g) + 0.5, prob=torch.rand(m, generator=g))
    out = {k: v.to(device) for k, v in t.items()}
    for k in ("a", "c", "w"):
        out[k] = out[k].to(torch.bfloat16)
    out["offs"] = offs.to(device)
    return out


def _call(t, mode, m_aligned=256):
    kw = dict(a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=None, padded_offsets=t["offs"], alpha_tensor=t["alpha"],
              beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=torch.zeros_like(t["prob"]),
              act_func="dgeglu", generate_dbias=True, d_dtype=torch.float32, engine="reference",
              m_aligned=m_aligned)
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


@pytest.mark.parametrize("m_aligned", [256, 8])
@pytest.mark.parametrize("mode", ["dense", "k", "n"])
def test_reference_on_cuda_matches_cpu(mode, m_aligned):
    counts = COUNTS if m_aligned == 256 else COUNTS_8
    d_gpu, p_gpu, b_gpu, _ = _call(_inputs("cuda", counts), mode, m_aligned)
    d_cpu, p_cpu, b_cpu, _ = _call(_inputs("cpu", counts), mode, m_aligned)
    scale = d_cpu.abs().max()
    assert ((d_gpu - d_cpu).abs().max() / scale) < 1e-4, mode
    assert torch.allclose(p_gpu, p_cpu, rtol=1e-4, atol=1e-4 * p_cpu.abs().max().item())
    assert ((b_gpu.float() - b_cpu.float()).abs().max() / b_cpu.float().abs().max()) < 1e-2


def _activation_call(t, dprob, d_row, activation):
    return dict(a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=None, padded_offsets=t["offs"],
                alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=dprob,
                b_tensor=t["w"].permute(1, 2, 0), d_row_tensor=d_row, d_col_tensor=None,
                activation_tensor=activation)


def test_reference_bf16_dense_never_syncs_and_replays_in_a_cuda_graph():
    """BF16 with dense weights on the reference engine (here: with the activation output, which
    the Hopper kernel declines) reads no device data on the host: execute runs under
    torch.cuda.set_sync_debug_mode("error"), is captured in a CUDA graph, and the replay with
    new input values gives what a fresh eager call gives."""
    t = _inputs("cuda")
    t["c"] = t["c"].to(torch.bfloat16)
    m = t["a"].shape[0]
    bufs = dict(dprob=torch.zeros(m, device="cuda"), d_row=torch.empty(m, 2 * N, dtype=torch.bfloat16, device="cuda"),
                activation=torch.empty(m, N, dtype=torch.bfloat16, device="cuda"))
    op = cudnn_ext.GroupedGemmDglu(
        t["a"], t["c"], bufs["d_row"], None, None, t["offs"], t["alpha"], t["beta"], t["prob"], bufs["dprob"],
        sample_b=t["w"].permute(1, 2, 0), sample_activation=bufs["activation"], act_func="dgeglu",
        engine="reference")
    op.compile()
    kw = _activation_call(t, **bufs)
    op.execute(**kw)  # warm: memo, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        op.execute(**kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        bufs["dprob"].zero_()
        with torch.cuda.graph(graph):
            op.execute(**kw)
    torch.cuda.current_stream().wait_stream(s)
    t["c"].copy_(torch.randn_like(t["c"]))  # new values, same buffers
    bufs["dprob"].zero_()
    graph.replay()
    torch.cuda.synchronize()
    want = {k: torch.zeros_like(v) if k == "dprob" else torch.empty_like(v) for k, v in bufs.items()}
    op.execute(**_activation_call(t, **want))
    last = int(t["offs"][-1])
    assert torch.equal(bufs["d_row"][:last], want["d_row"][:last])
    assert torch.equal(bufs["activation"][:last], want["activation"][:last])
    assert torch.equal(bufs["dprob"], want["dprob"])
