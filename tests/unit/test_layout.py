"""The gate/up layout helpers (cudnn_ext.layout) and the ``gate_up_layout="halves"`` keyword of
the torch op and GroupedGluMLP: C (or w1) given as ``[gate | up]`` halves gives the same
results as the interleaved call, while the same halves passed as interleaved give a wrong D
(the silent error the keyword exists for)."""
import pytest
import torch

import cudnn_ext
import cudnn_ext.torch as ct
from cudnn_ext.layout import gate_up_columns
from cudnn_ext.torch.mlp import GroupedGluMLP

BF = torch.bfloat16


def test_interleave_places_gate_and_up_where_the_kernel_reads_them():
    gate, up = torch.randn(5, 96), torch.randn(5, 96)
    x = cudnn_ext.interleave_gate_up(gate, up)
    g_cols, u_cols = gate_up_columns(96)
    assert torch.equal(x[:, g_cols], gate) and torch.equal(x[:, u_cols], up)
    assert torch.equal(x[:, :32], gate[:, :32]) and torch.equal(x[:, 32:64], up[:, :32])
    g2, u2 = cudnn_ext.split_gate_up(x)
    assert torch.equal(g2, gate) and torch.equal(u2, up)
    halves = torch.cat([gate, up], dim=1)
    assert torch.equal(cudnn_ext.halves_to_interleaved(halves), x)
    assert torch.equal(cudnn_ext.interleaved_to_halves(x), halves)


def test_weights_interleave_along_dim_1():
    w1, w3 = torch.randn(3, 64, 16), torch.randn(3, 64, 16)
    w13 = cudnn_ext.interleave_gate_up(w1, w3, dim=1)
    g_cols, u_cols = gate_up_columns(64)
    assert w13.shape == (3, 128, 16)
    assert torch.equal(w13[:, g_cols], w1) and torch.equal(w13[:, u_cols], w3)
    assert torch.equal(cudnn_ext.halves_to_interleaved(torch.cat([w1, w3], 1), dim=1), w13)


@pytest.mark.parametrize("call,match", [
    (lambda: cudnn_ext.interleave_gate_up(torch.zeros(2, 48), torch.zeros(2, 48)), "gate: dimension -1 must be N"),
    (lambda: cudnn_ext.interleave_gate_up(torch.zeros(2, 64), torch.zeros(2, 32)), "up: must match gate's shape"),
    (lambda: cudnn_ext.split_gate_up(torch.zeros(2, 96)), "x: dimension -1 must be 2N"),
    (lambda: cudnn_ext.halves_to_interleaved(torch.zeros(2, 96), name="c"), "c: dimension -1 must be 2N"),
])
def test_layout_helpers_reject_widths_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _op_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    L, n, k, m = 2, 64, 32, 512
    return dict(a=torch.randn(m, k, generator=g).to(BF), b=(torch.randn(L, n, k, generator=g) / 6).to(BF),
                c=(2 * torch.randn(m, 2 * n, generator=g)).to(BF), offs=torch.tensor([256, 512], dtype=torch.int32),
                alpha=torch.rand(L, generator=g) + 0.5, beta=torch.rand(L, generator=g) + 0.5,
                prob=torch.rand(m, generator=g))


def _op(p, c, **kw):
    return ct.grouped_gemm_dglu(p["a"], c, p["offs"], p["alpha"], p["beta"], p["prob"], b=p["b"],
                                generate_dbias=True, **kw)


def test_op_takes_c_as_halves():
    p = _op_problem()
    halves = cudnn_ext.interleaved_to_halves(p["c"])
    d, dprob, dbias = _op(p, p["c"])
    d_h, dprob_h, dbias_h = _op(p, halves, gate_up_layout="halves")
    assert torch.equal(d_h, cudnn_ext.interleaved_to_halves(d))
    assert torch.equal(dprob_h, dprob)
    assert torch.equal(dbias_h, cudnn_ext.interleaved_to_halves(dbias))
    # the same halves read as the interleave: a wrong D, with no error
    wrong, _, _ = _op(p, halves)
    err = (cudnn_ext.halves_to_interleaved(wrong).float() - d.float()).norm() / d.float().norm()
    assert err > 0.5


def test_op_refuses_halves_with_out_and_unknown_layouts():
    p = _op_problem()
    out = (torch.zeros(512, 128, dtype=BF), torch.zeros(512), torch.zeros(2, 128, dtype=BF))
    with pytest.raises(ValueError, match="gate_up_layout: 'halves' is not supported with out="):
        _op(p, p["c"], gate_up_layout="halves", out=out)
    with pytest.raises(ValueError, match=r"gate_up_layout: must be one of \['interleaved', 'halves'\], got 'split'"):
        _op(p, p["c"], gate_up_layout="split")


@pytest.mark.parametrize("bias", [False, True])
def test_layer_keeps_w1_as_halves(bias):
    """A layer whose w1 (and b1) hold [gate; up] gives the interleaved layer's output, and its
    gradients are the interleaved layer's in the halves layout."""
    torch.manual_seed(0)
    ref = GroupedGluMLP(2, 64, 64, bias=bias, dtype=torch.float32)
    halves = GroupedGluMLP(2, 64, 64, bias=bias, dtype=torch.float32, gate_up_layout="halves")
    with torch.no_grad():
        halves.w1.copy_(cudnn_ext.interleaved_to_halves(ref.w1, dim=1))
        halves.w2.copy_(ref.w2)
        if bias:
            ref.b1.normal_()
            halves.b1.copy_(cudnn_ext.interleaved_to_halves(ref.b1, dim=1))
    x, prob = torch.randn(512, 64), torch.rand(512)
    offs = torch.tensor([256, 512], dtype=torch.int32)
    y_ref, y = ref(x, prob, offs), halves(x, prob, offs)
    assert torch.equal(y, y_ref)
    g = torch.randn_like(y)
    y_ref.backward(g)
    y.backward(g)
    assert torch.equal(halves.w1.grad, cudnn_ext.interleaved_to_halves(ref.w1.grad, dim=1))
    assert torch.equal(halves.w2.grad, ref.w2.grad)
    if bias:
        assert torch.equal(halves.b1.grad, cudnn_ext.interleaved_to_halves(ref.b1.grad, dim=1))
    assert "gate_up_layout=halves" in repr(halves)
