"""CPU tier: the layer's elementwise ops (``cudnn_ext.torch.layer_ops``) in their torch form,
against a float64 oracle, through ``torch.ops`` (opcheck) and their argument rules. The CuTe
DSL kernels behind them on Hopper: tests/compile/test_layer_kernels_compile.py (PTX) and
tests/gpu/test_layer_kernels.py (results)."""
import pytest
import torch

from cudnn_ext.torch import layer_ops
from cudnn_ext.torch.layer_ops import glu_act, glu_forward, zero_rows_past
from oracle import glu_h


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
def test_glu_forward_matches_float64(act):
    m, n = 96, 96
    c = (torch.randn(m, 2 * n) * 3).to(torch.bfloat16)
    c[5, :8] = torch.tensor([7.0, -7.0, 7.0078125, -7.0078125, 0.0, 30.0, -30.0, 1e-30])  # clamps, tails
    c[70:] = float("nan")  # rows past the last offset: never read
    prob = torch.rand(m)
    offs = torch.tensor([32, 32, 64], dtype=torch.int32)  # an empty expert, 32 rows of no expert
    kw = dict(act_func=act, geglu_alpha=1.702, clamp_max=7.0, clamp_min=-7.0,
              linear_offset=1.0 if act == "dgeglu" else 0.0)
    h = glu_forward(c, prob, offs, **kw)
    ref = glu_h(c, prob, 64, act, kw)
    assert h.dtype == torch.bfloat16 and h.shape == (m, n)
    assert torch.equal(h[64:], torch.zeros_like(h[64:]))
    torch.testing.assert_close(h.double(), ref, rtol=2 ** -8, atol=1e-6)


def test_glu_act_is_the_strided_gate_up_split():
    c = torch.randn(4, 128, dtype=torch.float64)
    got = glu_act(c, "dswiglu", geglu_alpha=1.0, clamp_max=7.0, clamp_min=-7.0, linear_offset=0.0)
    g = torch.cat([c[:, 0:32], c[:, 64:96]], 1)
    u = torch.cat([c[:, 32:64], c[:, 96:128]], 1)
    torch.testing.assert_close(got, (g * torch.sigmoid(g) * u).float())


@pytest.mark.parametrize("last", [0, 17, 40])
def test_zero_rows_past_zeroes_only_the_tail(last):
    x = torch.randn(40, 24, dtype=torch.bfloat16)
    before = x.clone()
    offs = torch.tensor([min(last, 5), last], dtype=torch.int32)
    out = zero_rows_past(x, offs)
    assert out is x
    assert torch.equal(x[:last], before[:last])
    assert torch.equal(x[last:], torch.zeros_like(x[last:]))


def test_ops_pass_opcheck():
    c = torch.randn(64, 128).to(torch.bfloat16)
    prob = torch.rand(64)
    offs = torch.tensor([32, 48], dtype=torch.int32)
    torch.library.opcheck(torch.ops.cudnn_ext.glu_forward.default, (c, prob, offs),
                          dict(act_func="dgeglu", linear_offset=1.0))
    torch.library.opcheck(torch.ops.cudnn_ext.zero_rows_past.default, (torch.randn(64, 8), offs))


def test_ops_compile_as_opaque_nodes():
    c = torch.randn(64, 128).to(torch.bfloat16)
    prob = torch.rand(64)
    offs = torch.tensor([32, 48], dtype=torch.int32)

    def f(c, prob, offs):
        h = glu_forward(c, prob, offs)
        return zero_rows_past(h * 2, offs)

    got = torch.compile(f, backend="aot_eager", fullgraph=True)(c, prob, offs)
    torch.testing.assert_close(got, f(c, prob, offs))


@pytest.mark.parametrize("args,match", [
    (dict(c=torch.zeros(4, 96, dtype=torch.bfloat16)), r"c: must be a bf16 \(M, 2N\) matrix .* 64, got"),
    (dict(c=torch.zeros(4, 128)), r"c: must be a bf16 .*torch.float32"),
    (dict(prob=torch.zeros(5)), r"prob: must be fp32 \(4,\), got torch.float32 \(5,\)"),
    (dict(prob=torch.zeros(4, dtype=torch.float64)), r"prob: must be fp32 \(4,\), got torch.float64"),
    (dict(offs=torch.zeros(2, dtype=torch.int64)), r"padded_offsets: must be a non-empty 1-D int32"),
    (dict(offs=torch.zeros(0, dtype=torch.int32)), r"padded_offsets: must be a non-empty"),
    (dict(act_func="swiglu"), r"act_func: must be one of \('dswiglu', 'dgeglu'\), got 'swiglu'"),
])
def test_glu_forward_refuses_bad_arguments(args, match):
    kw = dict(c=torch.zeros(4, 128, dtype=torch.bfloat16), prob=torch.zeros(4),
              offs=torch.tensor([4], dtype=torch.int32), act_func="dswiglu")
    kw.update(args)
    with pytest.raises(ValueError, match=match):
        glu_forward(kw["c"], kw["prob"], kw["offs"], act_func=kw["act_func"])


def test_zero_rows_past_refuses_bad_offsets_and_leaves_x():
    x = torch.randn(8, 4)
    before = x.clone()
    with pytest.raises(ValueError, match="padded_offsets: must be a non-empty 1-D int32"):
        zero_rows_past(x, torch.tensor([[4]], dtype=torch.int32))
    assert torch.equal(x, before)


def test_kernel_path_only_on_hopper_cuda():
    # CPU tensors never reach the sm_90a kernels
    assert not layer_ops._kernel_ok(torch.zeros(4, 8))


def test_gather_rows_selects_valid_rows_and_zeroes_the_rest():
    x = torch.randn(10, 24)
    idx = torch.tensor([3, 0, 9, 9, 2, 5], dtype=torch.int64)
    valid = torch.tensor([True, True, False, True, False, True])
    out = layer_ops.gather_rows(x, idx, valid)
    for i in range(6):
        assert torch.equal(out[i], x[idx[i]] if valid[i] else torch.zeros(24))
    torch.library.opcheck(torch.ops.cudnn_ext.gather_rows.default, (x, idx, valid))


@pytest.mark.parametrize("args,match", [
    (dict(x=torch.zeros(4)), r"x: must be a 2-D matrix of rows, got shape \(4,\)"),
    (dict(idx=torch.zeros(3, dtype=torch.int32)), r"idx: must be a 1-D int64 tensor, got torch.int32"),
    (dict(valid=torch.ones(2, dtype=torch.bool)), r"valid: must be a bool tensor of idx's shape \(3,\)"),
    (dict(valid=torch.ones(3, dtype=torch.uint8)), r"valid: must be a bool tensor .* got torch.uint8"),
])
def test_gather_rows_refuses_bad_arguments(args, match):
    kw = dict(x=torch.zeros(4, 8), idx=torch.zeros(3, dtype=torch.int64), valid=torch.ones(3, dtype=torch.bool))
    kw.update(args)
    with pytest.raises(ValueError, match=match):
        layer_ops.gather_rows(kw["x"], kw["idx"], kw["valid"])


def test_backward_unit_scales_are_two_tensors_made_once():
    from cudnn_ext.torch import mlp

    a1, b1 = mlp._unit_scales(3, torch.device("cpu"))
    a2, b2 = mlp._unit_scales(3, torch.device("cpu"))
    assert a1 is a2 and b1 is b2 and a1 is not b1  # the replay guard needs two distinct tensors
    assert torch.equal(a1, torch.ones(3)) and torch.equal(b1, torch.ones(3))
    assert mlp._unit_scales(4, torch.device("cpu"))[0].shape == (4,)
