"""Streams and CUDA graphs as the vendor's tests use them: ``execute(..., current_stream=...)``
on a side stream ordered by events, no host sync inside ``execute``
(``torch.cuda.set_sync_debug_mode("error")``), and the whole call captured in a CUDA graph and
replayed with new input values. Each gives what a plain eager call on the default stream gives,
bit for bit. BF16 on whatever engine the plan picks (the Hopper kernel on an H200), dense and
per-expert weights."""
import pytest
import torch

import cudnn_ext

pytestmark = pytest.mark.gpu

L, N, K = 3, 64, 128
COUNTS = (256, 0, 512)


def _case(mode, generate_dbias):
    g = torch.Generator(device="cuda").manual_seed(7)
    offs = torch.tensor(COUNTS, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    m = int(sum(COUNTS)) + 256
    t = dict(a=torch.randn(m, K, device="cuda", generator=g).bfloat16(),
             c=(2 * torch.randn(m, 2 * N, device="cuda", generator=g)).bfloat16(),
             alpha=torch.rand(L, device="cuda", generator=g) + 0.5, beta=torch.rand(L, device="cuda", generator=g) + 0.5,
             prob=torch.rand(m, device="cuda", generator=g), offs=offs)
    w = (0.1 * torch.randn(L, N, K, device="cuda", generator=g)).bfloat16()
    samples = dict(d_row=torch.empty(m, 2 * N, dtype=torch.bfloat16, device="cuda"),
                   dprob=torch.zeros(m, device="cuda"),
                   dbias=torch.zeros(L, 2 * N, dtype=torch.bfloat16, device="cuda") if generate_dbias else None)
    if mode == "dense":
        weights, ctor = dict(b_tensor=w.permute(1, 2, 0)), dict(sample_b=w.permute(1, 2, 0))
        keep = None
    else:
        keep = [w[e].contiguous() for e in range(L)]
        weights = dict(b_ptrs=torch.tensor([x.data_ptr() for x in keep], dtype=torch.int64, device="cuda"))
        ctor = dict(num_experts=L, b_shape=(N, K), b_dtype=torch.bfloat16)
    op = cudnn_ext.GroupedGemmDglu(t["a"], t["c"], samples["d_row"], None, None, t["offs"], t["alpha"], t["beta"],
                                   t["prob"], samples["dprob"], sample_dbias=samples["dbias"], **ctor)
    op.compile()
    return t, weights, keep, op


def _outputs(t, generate_dbias):
    m = t["a"].shape[0]
    return dict(d_row=torch.full((m, 2 * N), float("nan"), dtype=torch.bfloat16, device="cuda"),
                dprob=torch.zeros(m, device="cuda"),
                dbias=torch.zeros(L, 2 * N, dtype=torch.bfloat16, device="cuda") if generate_dbias else None)


def _execute(op, t, weights, out, **kw):
    op.execute(t["a"], t["c"], out["d_row"], None, None, t["offs"], t["alpha"], t["beta"], t["prob"], out["dprob"],
               dbias_tensor=out["dbias"], **weights, **kw)


def _same(got, want, last):
    assert torch.equal(got["d_row"][:last], want["d_row"][:last])
    assert torch.equal(got["dprob"], want["dprob"])
    if want["dbias"] is not None:
        assert torch.equal(got["dbias"], want["dbias"])


@pytest.mark.parametrize("mode", ["dense", "discrete"])
@pytest.mark.parametrize("generate_dbias", [False, True])
def test_side_stream_no_sync_and_graph_replay(mode, generate_dbias):
    t, weights, keep, op = _case(mode, generate_dbias)
    last = int(sum(COUNTS))
    want = _outputs(t, generate_dbias)
    _execute(op, t, weights, want)  # the default stream, eagerly
    torch.cuda.synchronize()

    # a side stream ordered by events, with the sync-debug mode refusing any host sync
    side, got = torch.cuda.Stream(), _outputs(t, generate_dbias)
    ready, done = torch.cuda.Event(), torch.cuda.Event()
    ready.record()
    side.wait_event(ready)
    torch.cuda.set_sync_debug_mode("error")
    try:
        _execute(op, t, weights, got, current_stream=side)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    done.record(side)
    torch.cuda.current_stream().wait_event(done)
    torch.cuda.synchronize()
    _same(got, want, last)

    # the whole call in a CUDA graph, replayed after new input values land in the same buffers
    graph, cap = torch.cuda.CUDAGraph(), _outputs(t, generate_dbias)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        _execute(op, t, weights, cap)
    torch.cuda.current_stream().wait_stream(s)
    t["c"].copy_(2 * torch.randn_like(t["c"], dtype=torch.float32).bfloat16())
    for v in cap.values():
        if v is not None:
            v.zero_()  # dprob and dbias accumulate
    graph.replay()
    want2 = _outputs(t, generate_dbias)
    _execute(op, t, weights, want2)
    torch.cuda.synchronize()
    _same(cap, want2, last)


def test_null_stream_handle_is_the_default_stream():
    """``current_stream=cuda.CUstream(torch.cuda.current_stream().cuda_stream)`` on the default
    stream is the null handle: the call's work must go to the default stream itself (ordered
    with the caller's zeroing of dprob), never to a pool stream."""
    from cuda.bindings import driver as cuda

    from cudnn_ext.runtime.streams import as_torch_stream, launch_stream

    dev = torch.device("cuda", torch.cuda.current_device())
    default = torch.cuda.default_stream(dev)
    for handle in (0, cuda.CUstream(0), cuda.CUstream(torch.cuda.default_stream().cuda_stream)):
        s = launch_stream(handle, dev)
        assert s.cuda_stream == 0 and s == default, (handle, s)
    side = torch.cuda.Stream()
    assert as_torch_stream(cuda.CUstream(side.cuda_stream), dev).cuda_stream == side.cuda_stream
