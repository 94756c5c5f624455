"""The torch ops and ``GroupedGluMLP`` with ``m_aligned`` below 256, on CPU (the reference
engine) against the float64 oracles: functional and out= forms, dense and per-expert weights,
the dispatcher (opcheck, fake kernels on meta tensors) and the argument's rules. Reproduce a
failure with the seed pytest prints (``torch.manual_seed(<seed>)``)."""
import pytest
import torch

import cudnn_ext.torch as ct
from cudnn_ext.torch.mlp import GroupedGluMLP, pad_expert_rows
from oracle import glu_mlp, oracle

BF = torch.bfloat16
#: bf16 D vs the float64 oracle, relative to the largest element (8 bits of mantissa, then sums)
BF16_REL = 1e-2


def rel_err(got, ref) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def problem(offsets, extra, *, n=32, k=64):
    """Inputs whose rows past the last offset (``extra`` of them) carry NaN in A and C."""
    L, end = len(offsets), offsets[-1]
    m = end + extra
    p = dict(a=torch.randn(m, k).to(BF), b=(torch.randn(L, n, k) / k ** 0.5).to(BF),
             c=(2 * torch.randn(m, 2 * n)).to(BF), offs=torch.tensor(offsets, dtype=torch.int32),
             alpha=torch.rand(L) + 0.5, beta=torch.rand(L) + 0.5, prob=torch.rand(m))
    p["a"][end:] = float("nan")
    p["c"][end:] = float("nan")
    return p


def expected(p):
    return oracle(p["a"], [p["b"][e] for e in range(p["b"].shape[0])], p["c"], p["offs"], p["alpha"],
                  p["beta"], p["prob"])


def args(p):
    return p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"]


#: an expert of exactly 8 rows, empty experts first and in the middle, 16 rows of no expert
OFFS = [0, 8, 8, 32, 40]
#: groups of any size (m_aligned 1): a 1-row expert, empty ones, 5 rows of no expert (M odd)
OFFS_ANY = [0, 1, 1, 24, 38]
ALIGNED = [(8, OFFS, 16), (1, OFFS_ANY, 5)]


@pytest.mark.parametrize("align,offs,extra", ALIGNED, ids=["a8", "a1"])
@pytest.mark.parametrize("weights", ["dense", "discrete"])
def test_functional_op_matches_the_oracle(weights, align, offs, extra):
    p = problem(offs, extra)
    keep = [p["b"][e].contiguous() for e in range(len(offs))]  # alive while the op may read them
    kw = dict(b=p["b"]) if weights == "dense" else dict(b_ptrs=ct.expert_pointers(keep), n=32)
    d, dprob, dbias = ct.grouped_gemm_dglu(*args(p), generate_dbias=True, m_aligned=align, **kw)
    ref = expected(p)
    end = offs[-1]
    assert rel_err(d[:end], ref["d"][:end]) < BF16_REL
    assert not d[end:].any() and not dprob[end:].any()  # fresh outputs: rows of no expert are 0
    assert rel_err(dprob, ref["dprob"]) < 1e-4
    assert rel_err(dbias, ref["dbias"]) < BF16_REL
    assert not dbias[[0, 2]].any()  # empty experts


@pytest.mark.parametrize("align,offs,extra", ALIGNED, ids=["a8", "a1"])
def test_out_variant_leaves_rows_of_no_expert_and_accumulates(align, offs, extra):
    p = problem(offs, extra)
    m, end = p["a"].shape[0], offs[-1]
    d_row = torch.full((m, 64), float("nan"), dtype=BF)
    dprob0, dbias0 = torch.randn(m), torch.randn(len(offs), 64).to(BF)
    dprob, dbias = dprob0.clone(), dbias0.clone()
    ct.grouped_gemm_dglu(*args(p), b=p["b"], generate_dbias=True, m_aligned=align, out=(d_row, dprob, dbias))
    ref = oracle(p["a"], [p["b"][e] for e in range(len(offs))], p["c"], p["offs"], p["alpha"], p["beta"],
                 p["prob"], dprob_init=dprob0, dbias_init=dbias0)
    assert d_row[end:].isnan().all() and torch.equal(dprob[end:], dprob0[end:])
    assert rel_err(d_row[:end], ref["d"][:end]) < BF16_REL
    assert rel_err(dprob, ref["dprob"]) < 1e-4 and rel_err(dbias, ref["dbias"]) < BF16_REL


def test_dispatcher_path_takes_m_aligned():
    p = problem(OFFS, 16)
    torch.library.opcheck(torch.ops.cudnn_ext.grouped_gemm_dglu.default,
                          (p["a"], p["b"], *args(p)[1:]), dict(generate_dbias=True, m_aligned=8))
    d, _, _ = torch.ops.cudnn_ext.grouped_gemm_dglu(p["a"], p["b"], *args(p)[1:], m_aligned=8)
    assert rel_err(d[:OFFS[-1]], expected(p)["d"][:OFFS[-1]]) < BF16_REL
    meta = {k: v.to("meta") for k, v in p.items()}
    d, dprob, dbias = torch.ops.cudnn_ext.grouped_gemm_dglu(meta["a"], meta["b"], *args(meta)[1:],
                                                            generate_dbias=True, m_aligned=8)
    assert d.shape == (56, 64) and dprob.shape == (56,) and dbias.shape == (len(OFFS), 64)
    with pytest.raises(ValueError, match=r"a: M \(rows\) must be a multiple of 256, got M = 56"):
        torch.ops.cudnn_ext.grouped_gemm_dglu(meta["a"], meta["b"], *args(meta)[1:])  # the default, 256


@pytest.mark.parametrize("value,exc,words", [
    (24, ValueError, "m_aligned: must be one of [1, 8, 16, 32, 64, 128, 256]"),
    (8.0, TypeError, "m_aligned: expected an int"),
    (True, TypeError, "m_aligned: expected an int"),
    (32, ValueError, "M (rows) must be a multiple of 32, got M = 56"),
])
@pytest.mark.parametrize("path", ["eager", "meta"])
def test_argument_rules(value, exc, words, path):
    p = problem(OFFS, 16)
    if path == "meta":  # the dispatcher and the fake kernel
        p = {k: v.to("meta") for k, v in p.items()}
    with pytest.raises(exc) as info:
        ct.grouped_gemm_dglu(*args(p), b=p["b"], m_aligned=value)
    assert words in str(info.value), str(info.value)


def test_a_remembered_call_at_8_is_not_replayed_for_256():
    p = problem(OFFS, 16)
    ct.grouped_gemm_dglu(*args(p), b=p["b"], m_aligned=8)
    ct.grouped_gemm_dglu(*args(p), b=p["b"], m_aligned=8)
    with pytest.raises(ValueError, match="M = 56"):
        ct.grouped_gemm_dglu(*args(p), b=p["b"])


@pytest.mark.parametrize("align,ends", [(8, [8, 8, 16, 32]), (1, [5, 5, 13, 24])], ids=["a8", "a1"])
def test_mlp_with_small_groups_matches_plain_autograd(align, ends):
    """``GroupedGluMLP(m_aligned=a)`` on ``pad_expert_rows(..., align=a)``'s layout (at 1 the
    routed rows as they are): forward and every gradient against the float64 per-expert
    layer; rows of no expert get none."""
    L, H, N = 4, 64, 32
    mlp = GroupedGluMLP(L, H, N, activation="geglu", bias=True, m_aligned=align)
    with torch.no_grad():
        mlp.b1.normal_(0.0, 0.5)
    counts = torch.tensor([5, 0, 8, 11])
    offs, src, src_valid, _, _ = pad_expert_rows(counts, int(counts.sum()), align=align)
    assert offs.tolist() == ends
    m = src.shape[0]
    x = (torch.randn(m, H) * src_valid[:, None]).to(BF).requires_grad_()
    prob = (torch.rand(m) * src_valid).requires_grad_()
    y = mlp(x, prob, offs)
    dy = torch.randn_like(y)
    y.backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, prob, mlp.w1, mlp.b1, mlp.w2)]
    yr = glu_mlp(*leaves, offs.tolist(), "geglu", mlp.cfg)
    yr.backward(dy.double())
    assert rel_err(y, yr) < 2e-2
    for name, got, want in zip(("dx", "dprob", "dw1", "db1", "dw2"),
                               (x.grad, prob.grad, mlp.w1.grad, mlp.b1.grad, mlp.w2.grad),
                               (t.grad for t in leaves)):
        assert rel_err(got, want) < 2e-2, name
    assert not x.grad[ends[-1]:].any() and not prob.grad[ends[-1]:].any()
    assert not mlp.w1.grad[1].any() and not mlp.w2.grad[1].any()


def test_mlp_refuses_other_values_before_allocating():
    with pytest.raises(ValueError, match="m_aligned: must be one of"):
        GroupedGluMLP(2, 64, 32, m_aligned=12)
    with pytest.raises(TypeError, match="m_aligned: expected an int"):
        GroupedGluMLP(2, 64, 32, m_aligned=8.0)
