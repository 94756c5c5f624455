"""TorchTitan's swapped experts with ``capture=True``: their training steps replayed from CUDA
graphs give the eager steps' outputs and gradients bit for bit (the same kernels on the same
inputs), step after step with new routed rows and new expert counts (an empty expert, a
one-row expert), under gradient accumulation, and a backward whose forward was replayed over
raises. The rules themselves: tests/unit/test_captured_step.py."""
import copy

import pytest
import torch

pytestmark = pytest.mark.gpu

tt_moe = pytest.importorskip("torchtitan.models.common.moe", reason="needs torchtitan (pip install '.[titan]')")

from cudnn_ext.integrations.torchtitan import swap_experts  # noqa: E402
from cudnn_ext.torch.mlp import fused_row_alignment  # noqa: E402

E, D, F, ROWS = 6, 256, 192, 1000


def _pair():
    torch.manual_seed(0)
    stock = tt_moe.GroupedExperts(tt_moe.GroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E)).cuda()
    with torch.no_grad():
        for p in stock.parameters():
            p.normal_(0.0, D ** -0.5)
    stock = stock.to(torch.bfloat16)
    return swap_experts(copy.deepcopy(stock)), swap_experts(copy.deepcopy(stock), capture=True)


def _step(i):
    g = torch.Generator(device="cuda").manual_seed(10 + i)
    cut = torch.sort(torch.randint(0, ROWS, (E - 3,), device="cuda", generator=g)).values
    ends = torch.cat([cut, torch.tensor([cut[-1] + 1, cut[-1] + 1, ROWS], device="cuda")])  # a 1-row and an empty expert
    counts = torch.diff(ends, prepend=torch.zeros(1, dtype=ends.dtype, device="cuda"))
    x = torch.randn(ROWS, D, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(ROWS, D, device="cuda", generator=g).bfloat16()
    return x, counts, dy


def _run(module, x, counts, dy):
    y = module(x, counts)
    y.backward(dy)
    return y.detach().clone(), x.grad.clone()


@pytest.fixture(autouse=True)
def _needs_the_pass_through():
    if not torch.cuda.is_available() or fused_row_alignment(torch.device("cuda")) != 1:
        pytest.skip("the captured step runs on the routed rows passed through (Hopper with the CuTe DSL)")


def test_captured_steps_equal_the_eager_steps_bit_for_bit():
    eager, graphed = _pair()
    for i in range(4):
        x, counts, dy = _step(i)
        for m in (eager, graphed):
            m.zero_grad(set_to_none=True)
        y0, dx0 = _run(eager, x, counts, dy)
        x.grad = None
        y1, dx1 = _run(graphed, x, counts, dy)
        assert torch.equal(y1, y0) and torch.equal(dx1, dx0)
        assert torch.equal(graphed.w13.grad, eager.w13.grad) and torch.equal(graphed.w2_EDF.grad, eager.w2_EDF.grad)
        assert not graphed.w13.grad[E - 2].any()  # the empty expert
        with torch.no_grad():  # an optimizer step in place: the graphs must read the new weights
            for m in (eager, graphed):
                for p in m.parameters():
                    p.sub_(0.05 * p.grad)
    assert len(graphed._graphed._graphs) == 1


def test_gradient_accumulation_and_the_replayed_over_backward():
    eager, graphed = _pair()
    for m in (eager, graphed):
        m.zero_grad(set_to_none=True)
    for i in range(3):  # three microbatches, no zero_grad between
        x, counts, dy = _step(i)
        _run(eager, x, counts, dy)
        x.grad = None
        _run(graphed, x, counts, dy)
    assert torch.equal(graphed.w13.grad, eager.w13.grad) and torch.equal(graphed.w2_EDF.grad, eager.w2_EDF.grad)
    xa, ca, dya = _step(5)
    xb, cb, dyb = _step(6)
    ya = graphed(xa, ca)
    yb = graphed(xb, cb)
    yb.backward(dyb)
    with pytest.raises(RuntimeError, match="forward was replayed over"):
        ya.backward(dya)
