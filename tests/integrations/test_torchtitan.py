"""TorchTitan's own MoE layer with cudnn_ext's experts (``cudnn_ext.integrations.torchtitan``).

The stock layer and the swapped one run the same router, permutation and combine; only the
experts differ. Both compute the experts with bf16 operands (the stock module casts to bf16
for ``torch._grouped_mm``; the fused op's contract is bf16), so neither matches a float64
computation to float64 precision. The float64 oracle is the stock layer whose experts compute
in float64 (``Float64Experts``: the stock module with its forward in float64, on weights and
inputs that are exact in bf16). Every output and gradient of the swapped layer must be within
``BF16_REL`` of the oracle and no further from it than ``STOCK_FACTOR`` times the stock bf16
layer's own distance: as accurate as the layer it replaces. What the swap adds beyond the
kernel (the interleave, the 8-row padding, the checkpoint keys) is checked bit for bit.

CPU tests run the reference engine; the ``gpu`` test runs the plan the heuristics pick.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

tt_moe = pytest.importorskip("torchtitan.models.common.moe", reason="needs torchtitan (pip install '.[titan]')")
from torchtitan.models.common.linear import Linear  # noqa: E402
from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher  # noqa: E402

from cudnn_ext.integrations import torchtitan as ct_titan  # noqa: E402
from cudnn_ext.reference import gate_up_columns  # noqa: E402
from cudnn_ext.runtime.memo import CALLS  # noqa: E402
from cudnn_ext.torch.mlp import GroupedGluMLP, pad_expert_rows  # noqa: E402

GroupedExperts, MoE = tt_moe.GroupedExperts, tt_moe.MoE
# the stock router asks for float32 autocast, which the CPU does not have (it computes in the
# input's dtype there): not this module's concern
pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")
#: bf16 results vs the float64 oracle, relative to the largest magnitude of the result
BF16_REL = 2e-2
#: the swapped layer's error may exceed the stock bf16 layer's by this factor at most
STOCK_FACTOR = 2.0

E, D, FF, TOP_K = 4, 64, 96, 2  # F = 96: three 32-row gate/up blocks, not a power of two
DEAD = 3  # the expert no token is routed to


class Float64Experts(GroupedExperts):
    """The stock experts computed in float64 (the oracle): per expert ``silu(x w1ᵀ) * (x w3ᵀ)``
    then ``w2``, the stock module's formula without its bf16 casts."""

    def forward(self, x_RD, num_tokens_per_expert_E):
        out, start = [], 0
        for e, n in enumerate(num_tokens_per_expert_E.tolist()):
            x = x_RD[start:start + n]
            h = F.silu(x @ self.w1_EFD[e].t()) * (x @ self.w3_EFD[e].t())
            out.append(h @ self.w2_EDF[e].t())
            start += n
        return torch.cat(out)


def moe_config(load_balance=True):
    experts = GroupedExperts.Config(dim=D, hidden_dim=FF, num_experts=E)
    return MoE.Config(
        num_experts=E,
        routed_experts=tt_moe.RoutedExperts.Config(
            inner_experts=experts, token_dispatcher=LocalTokenDispatcher.Config(num_experts=E, top_k=TOP_K)),
        router=tt_moe.TokenChoiceTopKRouter.Config(num_experts=E, gate=Linear.Config(in_features=D, out_features=E),
                                                   top_k=TOP_K, score_func="softmax"),
        load_balance_coeff=1e-3 if load_balance else None)


def stock_moe(dtype=torch.float64, device="cpu"):
    """A stock layer with bf16-exact weights and routing that is uneven with one empty expert:
    the expert bias (TorchTitan's load-balancing buffer, used for the choice only) rules out
    expert DEAD and favours expert 0."""
    m = moe_config().build()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_((torch.randn_like(p) / p.shape[-1] ** 0.5).bfloat16().float())
        m.router.gate.weight.mul_(4.0)  # sharper scores: more uneven loads
        m.expert_bias_E.copy_(torch.tensor([0.3, 0.0, 0.05, -1e3]))
    return m.to(device=device, dtype=dtype).train()


def with_experts(m, cls):
    """A copy of ``m`` whose stock experts compute as ``cls`` (same parameters)."""
    m = copy.deepcopy(m)
    old = m.routed_experts.inner_experts
    new = cls.__new__(cls)
    new.__dict__.update(old.__dict__)
    m.routed_experts.inner_experts = new
    return m


def routed_counts(m, x):
    with torch.no_grad():
        _, ids, _ = m.router(x, m.expert_bias_E)
    return torch.bincount(ids.flatten(), minlength=E)


def run(m, x, dy):
    """Output and the gradients of the input, the router and the expert weights (w1, w2, w3 in
    the stock layout) of one forward + backward."""
    x = x.clone().requires_grad_()
    y = m(x)
    y.backward(dy)
    ex = m.routed_experts.inner_experts
    if isinstance(ex, ct_titan.CudnnGroupedExperts):
        w1, w3 = ct_titan.split_gate_up(ex.w13.grad)
    else:
        w1, w3 = ex.w1_EFD.grad, ex.w3_EFD.grad
    return dict(y=y.detach(), dx=x.grad, drouter=m.router.gate.weight.grad, dw1=w1, dw2=ex.w2_EDF.grad, dw3=w3)


def rel_err(got, ref) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def inputs(tokens=75, dtype=torch.float64, device="cpu"):
    # 2 x 75 tokens x top-2 = 300 routed rows: groups of uneven sizes, most not multiples of 8
    x = torch.randn(2, tokens, D).bfloat16().to(device=device, dtype=dtype)
    return x, torch.randn(2, tokens, D, dtype=dtype, device=device)


# --------------------------------------------------------------------------- the layer
@pytest.mark.parametrize("seed", [0, 1])
def test_swapped_layer_matches_stock_in_every_output_and_gradient(seed):
    torch.manual_seed(seed)
    m = stock_moe()
    x, dy = inputs()
    counts = routed_counts(m, x)
    # the case under test: uneven groups (most not multiples of 8) and one expert with
    # no token
    assert counts[DEAD] == 0 and len(set(counts.tolist())) == E and any(c % 8 for c in counts[:DEAD].tolist())
    oracle = run(with_experts(m, Float64Experts), x, dy)
    stock = run(m, x, dy)
    swapped_model = ct_titan.swap_experts(copy.deepcopy(m))
    assert type(swapped_model.routed_experts.inner_experts) is ct_titan.CudnnGroupedExperts
    ours = run(swapped_model, x, dy)
    for name, want in oracle.items():
        assert ours[name].shape == want.shape and ours[name].dtype == want.dtype, name
        e_ours, e_stock = rel_err(ours[name], want), rel_err(stock[name], want)
        assert e_ours < BF16_REL, f"{name}: {e_ours:.3g} from the float64 oracle"
        assert e_ours <= STOCK_FACTOR * e_stock + 1e-3, f"{name}: {e_ours:.3g} vs stock bf16 {e_stock:.3g}"
    # the expert no token reached gets exactly zero weight gradients, as in the stock layer
    for name in ("dw1", "dw2", "dw3"):
        assert not ours[name][DEAD].any(), name


def _swapped_and_inputs():
    stock = GroupedExperts(GroupedExperts.Config(dim=D, hidden_dim=FF, num_experts=E))
    with torch.no_grad():
        for p in stock.parameters():
            p.normal_(0.0, 0.2)
    ours = ct_titan.swap_experts(stock)
    counts = torch.tensor([37, 0, 300, 5])
    return ours, counts, torch.randn(int(counts.sum()), D).bfloat16()


def test_swapped_experts_pass_the_routed_rows_straight_through(monkeypatch):
    """Bit for bit: where the fused op takes groups of any size (here the CPU), the swapped
    experts are GroupedGluMLP (w1 = interleaved w1/w3, w2 = w2_EDF, m_aligned 1) on the routed
    rows as they come, with the counts' running sum as offsets: no row is copied (the padding
    map and its gathers are never called), outputs and gradients."""
    def refuse(*a, **k):
        raise AssertionError("the routed rows were copied")

    monkeypatch.setattr(ct_titan, "pad_expert_rows", refuse)
    monkeypatch.setattr(ct_titan, "gather_rows", refuse)
    ours, counts, x = _swapped_and_inputs()
    xo = x.clone().requires_grad_()
    y = ours(xo, counts)
    dy = torch.randn_like(y)
    y.backward(dy)

    mlp = GroupedGluMLP(E, D, FF, dtype=torch.float32, m_aligned=1)  # stock weights: float32 too
    with torch.no_grad():
        mlp.w1.copy_(ours.w13)
        mlp.w2.copy_(ours.w2_EDF)
    xp = x.clone().requires_grad_()
    yp = mlp(xp, torch.ones(x.shape[0]), torch.tensor([37, 37, 337, 342], dtype=torch.int32))
    yp.backward(dy)
    torch.testing.assert_close(y, yp, rtol=0, atol=0)
    torch.testing.assert_close(xo.grad, xp.grad, rtol=0, atol=0)
    torch.testing.assert_close(ours.w13.grad, mlp.w1.grad, rtol=0, atol=0)
    torch.testing.assert_close(ours.w2_EDF.grad, mlp.w2.grad, rtol=0, atol=0)


def test_swapped_experts_are_grouped_glu_mlp_on_aligned_groups(monkeypatch):
    """Bit for bit: where the fused op needs aligned groups (256 on GPUs other than Hopper;
    8 here, to keep the shapes small), the swapped experts are GroupedGluMLP (m_aligned 8) on
    the routed rows copied into 8-aligned groups, outputs and gradients."""
    monkeypatch.setattr(ct_titan, "fused_row_alignment", lambda device: 8)
    ours, counts, x = _swapped_and_inputs()
    xo = x.clone().requires_grad_()
    y = ours(xo, counts)
    dy = torch.randn_like(y)
    y.backward(dy)

    mlp = GroupedGluMLP(E, D, FF, dtype=torch.float32, m_aligned=8)  # stock weights: float32 too
    with torch.no_grad():
        mlp.w1.copy_(ours.w13)
        mlp.w2.copy_(ours.w2_EDF)
    starts = [0, 37, 37, 337]
    rows = [(0, 37), (40, 40), (40, 340), (344, 349)]  # each group at a multiple of 8
    m = 368  # the static bound: 342 rows + 7 x 4, rounded down to 8
    xp = torch.zeros(m, D, dtype=torch.bfloat16)
    prob = torch.zeros(m)
    dyp = torch.zeros(m, D, dtype=torch.bfloat16)
    for s, (a, b) in zip(starts, rows):
        xp[a:b], prob[a:b], dyp[a:b] = x[s:s + b - a], 1.0, dy[s:s + b - a]
    xp.requires_grad_()
    yp = mlp(xp, prob, torch.tensor([40, 40, 344, 352], dtype=torch.int32))
    yp.backward(dyp)
    want_y = torch.cat([yp[a:b] for a, b in rows])
    want_dx = torch.cat([xp.grad[a:b] for a, b in rows])
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(xo.grad, want_dx, rtol=0, atol=0)
    torch.testing.assert_close(ours.w13.grad, mlp.w1.grad, rtol=0, atol=0)
    torch.testing.assert_close(ours.w2_EDF.grad, mlp.w2.grad, rtol=0, atol=0)


def test_no_routed_rows_give_an_empty_output_and_zero_gradients():
    ours = ct_titan.swap_experts(GroupedExperts(GroupedExperts.Config(dim=D, hidden_dim=FF, num_experts=E)))
    x = torch.zeros(0, D, requires_grad=True)
    y = ours(x, torch.zeros(E, dtype=torch.int64))
    assert y.shape == (0, D)
    y.sum().backward()
    assert not ours.w13.grad.any() and not ours.w2_EDF.grad.any()


# --------------------------------------------------------------------------- the row layout
def test_pad_expert_rows_places_each_group_on_256_row_boundaries():
    counts = torch.tensor([300, 0, 1, 256, 7])
    rows = int(counts.sum())
    offs, src, src_valid, dest, dest_valid = pad_expert_rows(counts, rows)
    assert offs.tolist() == [512, 512, 768, 1024, 1280] and offs.dtype == torch.int32
    assert src.shape[0] % 256 == 0 and src.shape[0] >= 1280
    assert dest_valid.all()
    # every routed row lands in its own expert's range, in order, once
    ends = torch.cumsum(counts, 0)
    expert_of_row = torch.searchsorted(ends, torch.arange(rows), right=True)
    pstart = torch.cat([torch.zeros(1, dtype=torch.int64), offs[:-1].long()])
    torch.testing.assert_close(dest, pstart[expert_of_row] + torch.arange(rows) - (ends - counts)[expert_of_row],
                               rtol=0, atol=0)
    assert src_valid.sum() == rows and torch.equal(src[dest], torch.arange(rows))
    assert torch.equal(src_valid.nonzero().flatten().sort().values, dest.sort().values)


def test_pad_expert_rows_clips_counts_past_the_rows():
    offs, src, src_valid, dest, dest_valid = pad_expert_rows(torch.tensor([5, 10]), 8)
    assert offs.tolist() == [256, 512] and src_valid.sum() == 8 and dest_valid.all()


@pytest.mark.parametrize("bad, err", [(dict(align=0), ValueError), (dict(rows=-1), ValueError),
                                      (dict(counts=torch.tensor([1.0])), TypeError),
                                      (dict(counts=torch.tensor(3)), ValueError)])
def test_pad_expert_rows_rejects_bad_arguments_by_name(bad, err):
    kw = dict(counts=torch.tensor([1, 2]), rows=3, align=256) | bad
    with pytest.raises(err, match=("align" if "align" in bad else "rows" if "rows" in bad else "num_rows_per_expert")):
        pad_expert_rows(kw["counts"], kw["rows"], kw["align"])


# --------------------------------------------------------------------------- weights
def test_interleave_puts_w1_on_gate_and_w3_on_up_rows():
    w1, w3 = torch.randn(2, FF, 8), torch.randn(2, FF, 8)
    w13 = ct_titan.interleave_gate_up(w1, w3)
    gate, up = gate_up_columns(FF)
    assert torch.equal(w13[:, gate], w1) and torch.equal(w13[:, up], w3)
    assert torch.equal(w13[:, :32], w1[:, :32]) and torch.equal(w13[:, 32:64], w3[:, :32])
    assert all(torch.equal(a, b) for a, b in zip(ct_titan.split_gate_up(w13), (w1, w3)))


@pytest.mark.parametrize("w1, w3, match", [((2, 48, 8), (2, 48, 8), "multiple of 32"),
                                           ((2, 64, 8), (2, 32, 8), "w3"), ((64, 8), (64, 8), "w1")])
def test_interleave_rejects_bad_shapes_by_name(w1, w3, match):
    with pytest.raises(ValueError, match=match):
        ct_titan.interleave_gate_up(torch.zeros(w1), torch.zeros(w3))


def test_stock_state_dict_loads_into_the_swapped_model_and_back():
    m = stock_moe(dtype=torch.float32)
    sd = m.state_dict()
    fresh = ct_titan.swap_experts(moe_config().build())
    fresh.load_state_dict(sd)  # strict: the stock keys are exactly the swapped model's
    back = fresh.state_dict()
    assert set(back) == set(sd)
    for k in sd:
        assert back[k].shape == sd[k].shape and torch.equal(back[k], sd[k]), k
    stock_again = moe_config().build()
    stock_again.load_state_dict(back)
    for (k, a), (_, b) in zip(sorted(stock_again.state_dict().items()), sorted(sd.items())):
        assert torch.equal(a, b), k
    x, dy = inputs(dtype=torch.float32)
    torch.testing.assert_close(fresh(x), ct_titan.swap_experts(copy.deepcopy(m))(x), rtol=0, atol=0)


def test_load_rejects_half_a_gate_up_pair():
    m = ct_titan.swap_experts(moe_config().build())
    sd = moe_config().build().state_dict()
    del sd["routed_experts.inner_experts.w3_EFD"]
    with pytest.raises(KeyError, match="w3_EFD"):
        m.load_state_dict(sd)


def test_swap_keeps_w2_and_refuses_what_it_cannot_compute():
    m = moe_config().build()
    w2 = m.routed_experts.inner_experts.w2_EDF
    assert ct_titan.swap_experts(m).routed_experts.inner_experts.w2_EDF is w2
    with pytest.raises(ValueError, match="no torchtitan GroupedExperts"):
        ct_titan.swap_experts(torch.nn.Linear(2, 2))

    class Variant(GroupedExperts):
        pass

    v = moe_config().build()
    v.routed_experts.inner_experts.__class__ = Variant
    with pytest.raises(TypeError, match="routed_experts.inner_experts"):
        ct_titan.swap_experts(v)
    with pytest.raises(ValueError, match="multiple of 32"):
        ct_titan.swap_experts(GroupedExperts(GroupedExperts.Config(dim=D, hidden_dim=48, num_experts=E)))


def test_init_states_gives_the_stock_initial_weights():
    cfg = moe_config()
    inits = dict(w1_EFD=lambda t: torch.nn.init.normal_(t, std=0.02),
                 w2_EDF=lambda t: torch.nn.init.normal_(t, std=0.01),
                 w3_EFD=lambda t: torch.nn.init.uniform_(t, -0.1, 0.1))
    cfg.routed_experts.inner_experts.param_init = inits
    stock, ours = cfg.build(), ct_titan.swap_experts(cfg.build())
    for m in (stock, ours):
        torch.manual_seed(7)
        m.init_states()
    ex, so = stock.routed_experts.inner_experts, ours.routed_experts.inner_experts
    assert torch.equal(so.w13, ct_titan.interleave_gate_up(ex.w1_EFD, ex.w3_EFD))
    assert torch.equal(so.w2_EDF, ex.w2_EDF)


def test_override_factory_builds_the_swapped_experts_from_the_config():
    cfg = moe_config()
    cfg.routed_experts.inner_experts = ct_titan.cudnn_grouped_experts(cfg.routed_experts.inner_experts)
    m = cfg.build()
    assert type(m.routed_experts.inner_experts) is ct_titan.CudnnGroupedExperts
    assert m.routed_experts.inner_experts.w13.shape == (E, 2 * FF, D)


def test_the_library_imports_without_the_integration():
    import subprocess
    import sys

    code = "import sys, cudnn_ext, cudnn_ext.torch; print(any('torchtitan' in m for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_swapped_layer_in_bf16_matches_stock_in_float32():
    """On the device: the swapped experts in bf16 (weights and compute; the fused op runs the
    kernel on Hopper) inside the stock layer in float32, against the stock layer in float32.
    The router stays float32 in both, so both route every token alike."""
    CALLS.clear("op")
    torch.manual_seed(0)
    m = stock_moe(dtype=torch.float32, device="cuda")
    x, dy = inputs(tokens=700, dtype=torch.float32, device="cuda")
    assert routed_counts(m, x)[DEAD] == 0
    stock = run(m, x, dy)
    ours_model = ct_titan.swap_experts(copy.deepcopy(m))
    ours_model.routed_experts.inner_experts.to(torch.bfloat16)
    ours = run(ours_model, x, dy)
    for name, want in stock.items():
        assert ours[name].shape == want.shape, name
        # looser than the CPU test: the stock layer's own bf16 experts are the reference here
        assert rel_err(ours[name], want) < 3e-2, f"{name}: {rel_err(ours[name], want):.3g} from stock float32"
    for name in ("dw1", "dw2", "dw3"):
        assert not ours[name][DEAD].any(), name
    from cudnn_ext.engines.sm90 import Sm90DgluEngine

    if Sm90DgluEngine().available() is None:  # on Hopper the fused op must be the kernel
        used = {e.plan.engine_name for e in CALLS.entries("op") if e.problem.device_type == "cuda"}
        assert "sm90_cutedsl" in used, used


def test_gather_rows_gradients_equal_the_plain_indexing_path():
    """``gather_rows`` (both directions of the padding map) gives the values and gradients of
    ``torch.where(valid, x[idx], 0)``, whose own backward is a scatter-add: uneven groups,
    an empty expert, rows of no expert, float64."""
    from cudnn_ext.torch.mlp import gather_rows, pad_expert_rows

    torch.manual_seed(3)
    counts = torch.tensor([5, 0, 300, 17])
    rows = 330  # past the counts' sum (322): the last 8 rows belong to no expert
    offs, src, src_valid, dest, dest_valid = pad_expert_rows(counts, rows)
    x = torch.randn(rows, 6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(src.shape[0], 6, dtype=torch.float64)
    ours = gather_rows(x, src, src_valid, dest, dest_valid)
    plain = torch.where(src_valid[:, None], x[src], x.new_zeros(()))
    assert torch.equal(ours, plain)
    (gx,) = torch.autograd.grad(ours, x, g)
    (gx_plain,) = torch.autograd.grad(plain, x, g)
    assert torch.equal(gx, gx_plain)
    y = torch.randn(src.shape[0], 6, dtype=torch.float64, requires_grad=True)
    gy_out = torch.randn(rows, 6, dtype=torch.float64)
    back = gather_rows(y, dest, dest_valid, src, src_valid)
    back_plain = torch.where(dest_valid[:, None], y[dest], y.new_zeros(()))
    assert torch.equal(back, back_plain)
    assert torch.equal(torch.autograd.grad(back, y, gy_out)[0], torch.autograd.grad(back_plain, y, gy_out)[0])
    assert not dest_valid.all()  # rows of no expert (their gradient is 0)


def test_row_alignment_follows_the_device(monkeypatch):
    """Groups of any size (no copies) on the CPU and on Hopper with the CuTe DSL (the
    kernel's ragged schedule), 256 on other GPUs (the vendor's engine takes 256 only) and on
    Hopper without the DSL; a constant under torch.compile."""
    import importlib.util

    from cudnn_ext.torch import layer_ops, mlp

    assert mlp.fused_row_alignment(torch.device("cpu")) == 1
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, real=importlib.util.find_spec: (
        object() if name == "cutlass" else real(name, *a)))
    for cap, want in (((9, 0), 1), ((10, 0), 256), ((10, 3), 256), ((8, 0), 256), ((12, 0), 256)):
        monkeypatch.setattr(layer_ops, "device_capability", lambda index, cap=cap: cap)
        assert mlp._cuda_row_alignment(0) == want, cap
        f = torch.compile(lambda x: x + mlp._cuda_row_alignment(0), fullgraph=True, backend="eager")
        assert f(torch.zeros(2)).tolist() == [want, want], cap
        torch._dynamo.reset()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, real=importlib.util.find_spec: (
        None if name == "cutlass" else real(name, *a)))
    monkeypatch.setattr(layer_ops, "device_capability", lambda index: (9, 0))
    assert mlp._cuda_row_alignment(0) == 256
