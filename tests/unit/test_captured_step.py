"""``cudnn_ext.torch.captured``: a step captured as graphs, its replay and its rules, on the CPU
with a graph that re-runs the recorded function into the static outputs (what a CUDA graph's
replay does to them); the CUDA graphs themselves run in tests/gpu/test_captured_experts_gpu.py."""
from __future__ import annotations

import copy

import pytest
import torch

from cudnn_ext.torch.captured import GraphedStep, graph_step_applies


class ReplayByRerun:
    """A graph whose replay re-runs the captured function and writes its results over the
    outputs of the capture (the static outputs), as a CUDA graph's replay does."""

    captures = 0

    def capture(self, fn, pool, device=None):
        ReplayByRerun.captures += 1
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self):
        with torch.enable_grad():  # (a CUDA graph replays recorded kernels; this re-records)
            new = self.fn()
        with torch.no_grad():
            if isinstance(self.out, torch.Tensor):
                self.out.copy_(new)
            else:
                for o, n in zip(self.out, new):
                    o.copy_(n)

    def pool(self):
        return None


def layer(x, aux, w1, w2):
    """A small two-weight step whose result depends on the integer input."""
    scale = (aux.double().cumsum(0)[-1] + 1.0)
    return torch.tanh(x @ w1.t()) @ w2.t() * scale


def make(seed=0, rows=6, dim=5, hidden=7):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(hidden, dim, generator=g, dtype=torch.float64).requires_grad_()
    w2 = torch.randn(dim, hidden, generator=g, dtype=torch.float64).requires_grad_()
    return w1, w2


def inputs(step, rows=6, dim=5):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(rows, dim, generator=g, dtype=torch.float64).requires_grad_()
    aux = torch.randint(0, 5, (3,), generator=g)
    dy = torch.randn(rows, dim, generator=g, dtype=torch.float64)
    return x, aux, dy


def eager_grads(w1, w2, x, aux, dy):
    y = layer(x, aux, w1, w2)
    return (y,) + torch.autograd.grad(y, (x, w1, w2), dy)


def test_replays_give_the_eager_outputs_and_gradients_step_after_step():
    """New inputs every step (the static copies), zero_grad between steps: each step's output,
    input gradient and weight gradients equal the eager step's, bit for bit; one capture."""
    w1, w2 = make()
    step = GraphedStep(layer, graph_factory=ReplayByRerun, warmup=0)
    ReplayByRerun.captures = 0
    for i in range(4):
        x, aux, dy = inputs(i)
        y0, dx0, dw10, dw20 = eager_grads(w1, w2, x, aux, dy)
        w1.grad = w2.grad = None
        y = step(x, aux, (w1, w2))
        assert torch.equal(y, y0)
        y.backward(dy)
        assert torch.equal(x.grad, dx0) and torch.equal(w1.grad, dw10) and torch.equal(w2.grad, dw20)
    assert ReplayByRerun.captures == 2  # one forward and one backward graph


def test_gradient_accumulation_keeps_every_microbatch():
    """Forward and backward per microbatch without zeroing: the weights' .grad (a view of the
    static buffer after the first) is copied out before the next replay, so the sum is the
    eager sum."""
    w1, w2 = make(1)
    step = GraphedStep(layer, graph_factory=ReplayByRerun, warmup=0)
    want1 = torch.zeros_like(w1)
    want2 = torch.zeros_like(w2)
    for i in range(3):
        x, aux, dy = inputs(i)
        _, _, d1, d2 = eager_grads(w1, w2, x.detach().requires_grad_(), aux, dy)
        want1 += d1
        want2 += d2
    w1.grad = w2.grad = None
    for i in range(3):
        x, aux, dy = inputs(i)
        step(x, aux, (w1, w2)).backward(dy)
    assert torch.allclose(w1.grad, want1, rtol=1e-13, atol=0) and torch.allclose(w2.grad, want2, rtol=1e-13, atol=0)


def test_accumulation_without_the_copy_out_would_be_wrong(monkeypatch):
    """The copy-out is what keeps accumulation right: without it the second replay overwrites
    the first microbatch's gradient (the test above would fail)."""
    from cudnn_ext.torch import captured

    monkeypatch.setattr(captured._Graphs, "unalias", lambda self: None)
    w1, w2 = make(1)
    step = GraphedStep(layer, graph_factory=ReplayByRerun, warmup=0)
    want = torch.zeros_like(w1)
    for i in range(2):
        x, aux, dy = inputs(i)
        want += eager_grads(w1, w2, x.detach().requires_grad_(), aux, dy)[2]
    w1.grad = None
    for i in range(2):
        x, aux, dy = inputs(i)
        step(x, aux, (w1, w2)).backward(dy)
    assert not torch.allclose(w1.grad, want)


def test_a_backward_whose_forward_was_replayed_over_raises():
    """Two forwards in flight: the later backward runs, the earlier one raises (its saved
    tensors were overwritten) instead of returning the later call's gradients; a second
    backward of one forward raises too."""
    w1, w2 = make()
    step = GraphedStep(layer, graph_factory=ReplayByRerun, warmup=0)
    xa, aux_a, dya = inputs(0)
    xb, aux_b, dyb = inputs(1)
    ya = step(xa, aux_a, (w1, w2))
    yb = step(xb, aux_b, (w1, w2))
    yb.backward(dyb)
    with pytest.raises(RuntimeError, match="forward was replayed over"):
        ya.backward(dya)
    yc = step(xa, aux_a, (w1, w2))
    yc.backward(dya, retain_graph=True)
    with pytest.raises(RuntimeError, match="ran twice"):
        yc.backward(dya)


def test_each_static_key_has_its_graphs():
    """Another row count, another weight address or a no-grad input: graphs of their own; the
    cache holds at most max_keys keys."""
    w1, w2 = make()
    step = GraphedStep(layer, graph_factory=ReplayByRerun, warmup=0, max_keys=2)
    x, aux, dy = inputs(0)
    step(x, aux, (w1, w2)).backward(dy)
    x8, aux8, dy8 = inputs(1, rows=8)
    y8 = step(x8, aux8, (w1, w2))
    y8.backward(dy8)
    assert torch.equal(x8.grad, eager_grads(w1, w2, x8.detach().requires_grad_(), aux8, dy8)[1])
    assert len(step._graphs) == 2
    w1b = w1.detach().clone().requires_grad_()
    step(x, aux, (w1b, w2)).backward(dy)
    assert len(step._graphs) == 1  # a third key: the cache was emptied first
    xn = x.detach()
    y = step(xn, aux, (w1b, w2))
    y.backward(dy)
    assert len(step._graphs) == 2


def test_graph_step_applies_names_what_keeps_a_call_eager():
    w = torch.zeros(2, 2)
    x = torch.zeros(3, 2)
    assert graph_step_applies(x, (w,)) == "not on a CUDA device"
    with torch.no_grad():
        assert graph_step_applies(x, (w,)) == "gradients are not being recorded"
    # activation checkpointing recomputes the forward inside the backward
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert "activation checkpointing" in graph_step_applies(x, (w,))

    class Sharded(torch.Tensor):  # (anything with to_local: a DTensor parameter)
        def to_local(self):
            return self

    assert "DTensor" in graph_step_applies(x, (w, torch.zeros(2).as_subclass(Sharded)))


def test_the_input_gradient_is_a_copy_that_accumulates():
    """A leaf input's .grad is not the static buffer: two backwards into the same input add
    up (the second replay would otherwise overwrite the first gradient and double it)."""
    w1, w2 = make()
    step = GraphedStep(layer, graph_factory=ReplayByRerun, warmup=0)
    x, aux, dy = inputs(0)
    _, aux_b, dy_b = inputs(1)
    want = (eager_grads(w1, w2, x.detach().requires_grad_(), aux, dy)[1]
            + eager_grads(w1, w2, x.detach().requires_grad_(), aux_b, dy_b)[1])
    step(x, aux, (w1, w2)).backward(dy)
    step(x, aux_b, (w1, w2)).backward(dy_b)
    assert torch.allclose(x.grad, want, rtol=1e-13, atol=0)


def test_a_weight_that_moved_since_the_capture_raises_at_backward():
    """The graphs read the weights at their capture addresses: storage freed and allocated
    again between forward and backward (as FSDP does) raises instead of reading stale memory."""
    w1, w2 = make()
    step = GraphedStep(layer, graph_factory=ReplayByRerun, warmup=0)
    x, aux, dy = inputs(0)
    step(x, aux, (w1, w2)).backward(dy)
    y = step(x, aux, (w1, w2))
    w1.data = w1.data.clone()  # a new address
    with pytest.raises(RuntimeError, match="moved since their graphs were captured"):
        y.backward(dy)


def test_swapped_experts_take_the_capture_setting_and_stay_eager_on_the_cpu():
    """``swap_experts(model, capture=True)`` sets it on every swapped module; a deep copy gets
    graphs of its own (none captured); on the CPU the step runs eagerly, as without it."""
    tt_moe = pytest.importorskip("torchtitan.models.common.moe")
    from cudnn_ext.integrations.torchtitan import swap_experts

    torch.manual_seed(0)
    stock = tt_moe.GroupedExperts(tt_moe.GroupedExperts.Config(dim=64, hidden_dim=64, num_experts=2))
    for p in stock.parameters():
        torch.nn.init.normal_(p, std=0.1)
    plain = swap_experts(copy.deepcopy(stock))
    ours = swap_experts(copy.deepcopy(stock), capture=True)
    assert ours.capture and not plain.capture
    twin = copy.deepcopy(ours)
    assert twin.capture and twin._graphed is not ours._graphed and twin._graphed.fn.__self__ is twin
    x = torch.randn(10, 64, requires_grad=True)
    counts = torch.tensor([4, 6])
    y0, y1 = plain(x, counts), ours(x, counts)
    assert torch.equal(y0, y1) and not ours._graphed._graphs
