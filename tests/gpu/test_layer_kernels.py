"""The layer's CuTe DSL kernels on the GPU (``kernels/layer`` behind ``cudnn_ext::glu_forward``
and ``cudnn_ext::zero_rows_past``) and ``GroupedGluMLP`` running on them:

* the GLU forward against a float64 oracle on random and hard C (clamp boundaries, saturating
  and tiny values, NaN rows past the last offset, an empty expert, prob 0), into a NaN-poisoned
  h, and against the op's torch form on the same device;
* the tail zeroing with the last offset at 0, inside, at and past M, on poisoned rows;
* the row gather into a NaN-poisoned output, with out-of-range indices where not valid;
* the layer's output and every gradient against a float64 autograd layer, with NaN in the
  rows of no expert of x, prob and dy (never read), and with no host sync;
* both ops captured in a CUDA graph and replayed with new offsets."""
import pytest
import torch

from cudnn_ext.torch import layer_ops
from cudnn_ext.torch.layer_ops import glu_forward, zero_rows_past
from gpu_skips import needs_hopper_and_dsl
from oracle import glu_h, glu_mlp

pytestmark = pytest.mark.gpu

BF = torch.bfloat16




def oracle_h(c, prob, last, act, lo=0.0):
    """``oracle.glu_h`` as bf16 holds it: past bf16's largest finite value the kernel's fp32
    product or rounding overflows to inf."""
    h = glu_h(c, prob, last, act, dict(geglu_alpha=1.702, clamp_max=7.0, clamp_min=-7.0, linear_offset=lo))
    big = torch.finfo(BF).max
    return torch.where(h.abs() > big, h.sign() * float("inf"), h)


def hard_c(m, two_n):
    c = torch.randn(m, two_n, device="cuda") * 4
    c[0, :8] = torch.tensor([7.0, -7.0, 7.0625, -7.0625, 0.0, -0.0, 1e-38, -1e-38])  # clamps, tiny
    c[0, 32:40] = torch.tensor([7.0, -7.0, 7.0625, -7.0625, 3.0, -3.0, 2.0, 5.0])
    c[1, :32] = torch.tensor([80.0, -80.0, 1e4, -1e4] * 8)  # sigmoid saturates to 1 / 0
    c[2, :] = 1e30  # inf products: silu(1e30) * 1e30 overflows fp32 and bf16
    return c.to(BF)


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
@pytest.mark.parametrize("m,n,offs", [(1024, 768, (256, 256, 768)), (300, 32, (40, 40, 41)),
                                      (512, 2048, (512,)), (64, 96, (0, 0))])
def test_glu_kernel_matches_float64(act, m, n, offs):
    needs_hopper_and_dsl()
    from cudnn_ext.kernels.layer.launch import launch_glu

    c = hard_c(m, 2 * n)
    last = offs[-1]
    c[last:] = float("nan")  # rows of no expert: never read
    prob = torch.rand(m, device="cuda")
    prob[3] = 0.0
    offsets = torch.tensor(offs, dtype=torch.int32, device="cuda")
    lo = 1.0 if act == "dgeglu" else 0.0
    cfg = layer_ops._glu_config(act, 1.702, 7.0, -7.0, lo)
    h = torch.full((m, n), float("nan"), dtype=BF, device="cuda")
    launch_glu(cfg, c.data_ptr(), prob.data_ptr(), offsets.data_ptr(), h.data_ptr(), m, n, len(offs),
               torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    ref = oracle_h(c, prob, last, act, lo=lo)
    assert not torch.isnan(h).any()  # every element written (the oracle has no NaN here)
    assert torch.equal(h[last:], torch.zeros_like(h[last:]))
    # fast sigmoid (~1e-6 relative) plus one bf16 rounding
    torch.testing.assert_close(h.double(), ref, rtol=2 ** -8, atol=1e-30)
    # the op's entry gives the same bytes, and its torch form agrees to a bf16 ulp
    kw = dict(act_func=act, linear_offset=lo)
    assert torch.equal(glu_forward(c, prob, offsets, **kw), h)
    torch.testing.assert_close(layer_ops._glu_torch(c, prob, offsets, act, 1.702, 7.0, -7.0, lo).double(),
                               h.double(), rtol=2 ** -7, atol=1e-30)


@pytest.mark.parametrize("row_bytes", [16, 48, 14336])
@pytest.mark.parametrize("last", [0, 1, 129, 1000, 1003, 5000])
def test_zero_tail_kernel(row_bytes, last):
    needs_hopper_and_dsl()
    m = 1003
    x = torch.randint(1, 255, (m, row_bytes), dtype=torch.uint8, device="cuda")
    before = x.clone()
    offsets = torch.tensor([min(last, 7), last], dtype=torch.int32, device="cuda")
    zero_rows_past(x, offsets)
    torch.cuda.synchronize()
    k = min(last, m)
    assert torch.equal(x[:k], before[:k])
    assert not x[k:].any()


@pytest.mark.parametrize("dtype,width", [(torch.bfloat16, 8), (torch.bfloat16, 2048), (torch.float32, 12)])
def test_gather_kernel(dtype, width):
    needs_hopper_and_dsl()
    from cudnn_ext.kernels.layer.launch import launch_gather

    rows_in, rows_out = 777, 1030
    x = torch.randn(rows_in, width, device="cuda").to(dtype)
    idx = torch.randint(0, rows_in, (rows_out,), device="cuda")
    valid = torch.rand(rows_out, device="cuda") < 0.7
    idx[~valid] = 1 << 40  # never read where not valid
    out = torch.full((rows_out, width), float("nan"), device="cuda").to(dtype)
    launch_gather(x.data_ptr(), idx.data_ptr(), valid.data_ptr(), out.data_ptr(), rows_out,
                  width * x.element_size(), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    want = torch.where(valid[:, None], x[idx.clamp(max=rows_in - 1)], x.new_zeros(()))
    assert torch.equal(out, want)
    idx[~valid] = 0
    assert torch.equal(layer_ops.gather_rows(x, idx, valid), want)


@pytest.mark.parametrize("act,m_aligned", [("swiglu", 256), ("geglu", 256), ("swiglu", 8),
                                           ("geglu", 8)])
def test_gpu_mlp_matches_float64_without_syncs(act, m_aligned):
    """m_aligned 8: groups of 136, 0 and 864 rows, the backward's fused op on the Hopper
    kernel's ragged schedule."""
    needs_hopper_and_dsl()
    from cudnn_ext.torch import GroupedGluMLP

    L, H, N, m = 3, 256, 128, 1280
    # an empty expert; rows `last`.. belong to no expert
    offs = (256, 256, 1024) if m_aligned == 256 else (136, 136, 1000)
    last = offs[-1]
    mlp = GroupedGluMLP(L, H, N, activation=act, device="cuda", m_aligned=m_aligned)
    x = torch.randn(m, H, device="cuda").to(BF)
    prob = torch.rand(m, device="cuda")
    dy = torch.randn(m, H, device="cuda").to(BF)
    x[last:], prob[last:], dy[last:] = float("nan"), float("nan"), float("nan")
    offsets = torch.tensor(offs, dtype=torch.int32, device="cuda")
    xi, pi = x.clone().requires_grad_(), prob.clone().requires_grad_()
    mlp(xi, pi, offsets).backward(dy)  # compiles, builds and remembers the plans
    for p in (xi, pi, mlp.w1, mlp.w2):
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = mlp(xi, pi, offsets)
        y.backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    leaves = [t.detach().double().requires_grad_() for t in (x[:last], prob[:last], mlp.w1, mlp.w2)]
    xr, pr, w1r, w2r = leaves
    yr = glu_mlp(xr, pr, w1r, None, w2r, offs, act, mlp.cfg)
    yr.backward(dy[:last].double())

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()

    assert not y[last:].any() and not xi.grad[last:].any() and not pi.grad[last:].any()
    assert rel(y[:last], yr) < 2e-2
    for name, got, want in [("dx", xi.grad[:last], xr.grad), ("dprob", pi.grad[:last], pr.grad),
                            ("dw1", mlp.w1.grad, w1r.grad), ("dw2", mlp.w2.grad, w2r.grad)]:
        assert rel(got, want) < 2e-2, name
    assert not mlp.w1.grad[1].any() and not mlp.w2.grad[1].any()


def test_ops_capture_in_a_cuda_graph_and_replay_with_new_offsets():
    needs_hopper_and_dsl()
    m, n = 512, 64
    c = torch.randn(m, 2 * n, device="cuda").to(BF)
    prob = torch.rand(m, device="cuda")
    offsets = torch.tensor([256, 512], dtype=torch.int32, device="cuda")
    y = torch.ones(m, 16, dtype=BF, device="cuda")
    glu_forward(c, prob, offsets)  # compile outside the capture
    zero_rows_past(y, offsets)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        h = glu_forward(c, prob, offsets)
        zero_rows_past(y, offsets)
    offsets.copy_(torch.tensor([128, 384], dtype=torch.int32))
    y.fill_(1)
    g.replay()
    torch.cuda.synchronize()
    ref = oracle_h(c, prob, 384, "dswiglu")
    torch.testing.assert_close(h.double(), ref, rtol=2 ** -8, atol=1e-30)
    assert (y[:384] == 1).all() and not y[384:].any()
