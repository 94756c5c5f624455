"""The reference engine on CUDA tensors reads no device data on the host, on every path: per-expert
BF16 weights, MXFP8 with quantized outputs (``discrete_col_sfd``: SFD_col regions placed by the
offsets), and NVFP4 per-expert weights with amax. For each, as the vendor's tests use the op: an
execute on a side stream (``current_stream=``, ordered by events) under
``torch.cuda.set_sync_debug_mode("error")`` equals the default-stream call; and the call captured
in a CUDA graph, replayed after new values (new offsets and new weight pointers too, same shapes)
land in its inputs, equals a fresh eager call on those values. Bit for bit, every output
(untouched rows included): the operands' GEMM is exact in fp32 (tests/support/exact_operands.py),
so no summation order enters. The engine is pinned to "reference". The first call compiles the
pointer gather, so each test warms up before it refuses syncs."""
import pytest
import torch

import cudnn_ext
from cudnn_ext.quant import empty_sf, storage_of

from exact_operands import FORMATS, exact_values

pytestmark = pytest.mark.gpu

L, N, K, M = 3, 96, 128, 1024  # 2N = 192: SFD_col has two column atoms
COUNTS, NEW_COUNTS = (256, 0, 512), (512, 256, 0)  # an empty expert; rows past the last offset
KINDS = ("bf16-discrete", "mxfp8-dense-sfd", "nvfp4-discrete-amax")
_FMT = {"mxfp8-dense-sfd": "mxfp8_e4m3", "nvfp4-discrete-amax": "nvfp4"}


def _inputs(kind, seed, counts):
    """Input tensors on the GPU; per-expert weights as their own buffers (``experts``) and a
    pointer table naming them (an expert without rows gets a null pointer)."""
    g = torch.Generator().manual_seed(seed)
    t = dict(c=(2 * torch.randn(M, 2 * N, generator=g)).to(torch.bfloat16), alpha=torch.rand(L, generator=g) + 0.5,
             beta=torch.rand(L, generator=g) + 0.5, prob=torch.rand(M, generator=g),
             offs=torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32))
    if kind == "bf16-discrete":
        t["a"] = exact_values((M, K), False, 32, g).to(torch.bfloat16)  # bf16 holds them exactly
        w = exact_values((L, N, K), False, 32, g).to(torch.bfloat16)
        experts = [(w[e].contiguous(), None) for e in range(L)]
    else:
        quantize, vec, fp4 = FORMATS[_FMT[kind]]
        t["a"], t["sfa"] = quantize(exact_values((M, K), fp4, vec, g))
        w = exact_values((L, N, K), fp4, vec, g)
        if kind.startswith("mxfp8"):
            t["b"], t["sfb"] = quantize(w.permute(1, 2, 0))
            t["norm_const"] = torch.tensor([0.75])
            experts = None
        else:
            experts = [(q.contiguous(), storage_of(sf).contiguous()) for q, sf in (quantize(w[e]) for e in range(L))]
    t = {k: v.cuda() for k, v in t.items()}
    if experts is not None:
        t["experts"] = [(q.cuda(), sf.cuda() if sf is not None else None) for q, sf in experts]
        live = [size > 0 for size in counts]
        t["b_ptrs"] = torch.tensor([q.data_ptr() if ok else 0 for (q, _), ok in zip(t["experts"], live)],
                                   dtype=torch.int64, device="cuda")
        if kind != "bf16-discrete":
            t["sfb_ptrs"] = torch.tensor([sf.data_ptr() if ok else 0 for (_, sf), ok in zip(t["experts"], live)],
                                         dtype=torch.int64, device="cuda")
    return t


def _outputs(kind):
    """Fresh outputs, the same bytes every time: untouched elements compare too."""
    d_dtype = torch.bfloat16 if kind.startswith("bf16") or kind.startswith("nvfp4") else torch.float8_e4m3fn
    o = dict(d_row=torch.zeros(M, 2 * N, dtype=d_dtype, device="cuda"), dprob=torch.zeros(M, device="cuda"))
    if kind.startswith("mxfp8"):
        o.update(d_col=torch.zeros(M, 2 * N, dtype=torch.float8_e4m3fn, device="cuda"),
                 sfd_row=empty_sf(M, 2 * N // 32, dtype=torch.float8_e8m0fnu, device="cuda", fill=0x55),
                 sfd_col=empty_sf(2 * N, M // 32, dtype=torch.float8_e8m0fnu, device="cuda", fill=0x55))
    if kind.startswith("nvfp4"):
        o["amax"] = torch.full((L, 2), float("-inf"), device="cuda")
    return o


def _op(kind, t, o):
    samples = dict(sample_a=t["a"], sample_c=t["c"], sample_d_row=o["d_row"], sample_d_col=o.get("d_col"),
                   sample_sfa=t.get("sfa"), sample_padded_offsets=t["offs"], sample_alpha=t["alpha"],
                   sample_beta=t["beta"], sample_prob=t["prob"], sample_dprob=o["dprob"],
                   sample_sfd_row=o.get("sfd_row"), sample_sfd_col=o.get("sfd_col"), sample_amax=o.get("amax"),
                   sample_norm_const=t.get("norm_const"), engine="reference")
    if kind == "bf16-discrete":
        op = cudnn_ext.GroupedGemmDglu(**samples, num_experts=L, b_shape=(N, K), b_dtype=torch.bfloat16,
                                       act_func="dgeglu")
    elif kind.startswith("mxfp8"):
        op = cudnn_ext.GroupedGemmDglu(**samples, sample_b=t["b"], sample_sfb=t["sfb"], sf_vec_size=32,
                                       discrete_col_sfd=True)
    else:
        op = cudnn_ext.GroupedGemmDglu(**samples, num_experts=L, b_shape=(N, K), b_dtype=torch.uint8,
                                       sf_vec_size=16)
    op.compile()
    assert op.engine_name == "reference"
    return op


def _execute(op, t, o, **kw):
    w = (dict(b_tensor=t["b"], sfb_tensor=t["sfb"]) if "b" in t
         else dict(b_ptrs=t["b_ptrs"], sfb_ptrs=t.get("sfb_ptrs")))
    op.execute(a_tensor=t["a"], c_tensor=t["c"], d_row_tensor=o["d_row"], d_col_tensor=o.get("d_col"),
               sfa_tensor=t.get("sfa"), padded_offsets=t["offs"], alpha_tensor=t["alpha"], beta_tensor=t["beta"],
               prob_tensor=t["prob"], dprob_tensor=o["dprob"], sfd_row_tensor=o.get("sfd_row"),
               sfd_col_tensor=o.get("sfd_col"), amax_tensor=o.get("amax"), norm_const_tensor=t.get("norm_const"),
               **w, **kw)


def _bits(x):
    """``x``'s elements as integers of its size: a view of ``x`` (any strides), so it can be written."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def _same(got, want):
    return all(torch.equal(_bits(got[k]), _bits(want[k])) for k in want)


def _refill(o, kind):
    for k, v in _outputs(kind).items():
        _bits(o[k]).copy_(_bits(v))


def _new_values(t, kind):
    """Copy new input values (new offsets, new weights behind new pointers) into ``t``'s tensors;
    returns what must stay alive (the new per-expert buffers)."""
    new = _inputs(kind, 1, NEW_COUNTS)
    for k, v in new.items():
        if k != "experts":
            _bits(t[k]).copy_(_bits(v))
    return new


@pytest.mark.parametrize("kind", KINDS)
def test_side_stream_no_sync(kind):
    t = _inputs(kind, 0, COUNTS)
    want = _outputs(kind)
    op = _op(kind, t, want)
    _execute(op, t, want)  # the default stream, eagerly (also compiles the gather)
    torch.cuda.synchronize()
    side, got = torch.cuda.Stream(), _outputs(kind)
    ready, done = torch.cuda.Event(), torch.cuda.Event()
    ready.record()
    side.wait_event(ready)
    torch.cuda.set_sync_debug_mode("error")
    try:
        _execute(op, t, got, current_stream=side)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    done.record(side)
    torch.cuda.current_stream().wait_event(done)
    torch.cuda.synchronize()
    assert _same(got, want), kind


@pytest.mark.parametrize("kind", KINDS)
def test_graph_replay_with_new_values_equals_an_eager_call(kind):
    t = _inputs(kind, 0, COUNTS)
    first = _outputs(kind)
    op = _op(kind, t, first)
    _execute(op, t, first)  # warm: the memo, the allocator, the gather's compile
    torch.cuda.synchronize()
    graph, cap = torch.cuda.CUDAGraph(), _outputs(kind)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        _execute(op, t, cap)
    torch.cuda.current_stream().wait_stream(s)
    keep = _new_values(t, kind)
    _refill(cap, kind)  # dprob and amax accumulate; the rest compares untouched bytes too
    graph.replay()
    want = _outputs(kind)
    _execute(op, t, want)
    torch.cuda.synchronize()
    assert _same(cap, want), kind
    assert not torch.equal(_bits(want["d_row"]), _bits(first["d_row"])), "the new values must change D"
    del keep
