"""PyTorch integration: the custom ops (opcheck, torch.compile, hot path) and GroupedGluMLP.

CPU tests run the reference engine; ``gpu`` tests run whatever engine the plan picks on CUDA.
Reproduce a failure with the seed printed by pytest (``torch.manual_seed(<seed>)``).
"""
from __future__ import annotations

import pytest
import torch

import cudnn_ext.torch as ct
from cudnn_ext import contract
from cudnn_ext.reference import reference_outputs
from cudnn_ext import functional as _core
from cudnn_ext.runtime.memo import CALLS
from cudnn_ext.torch.mlp import GroupedGluMLP
from oracle import glu_mlp

BF = torch.bfloat16
#: tolerance policy: bf16 outputs vs a float64 oracle, relative to the output's max magnitude
BF16_REL = 2e-2


def rel_err(got, ref) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    scale = ref.abs().max().clamp_min(1e-30)
    return float((got - ref).abs().max() / scale)


def make_problem(L=3, n=64, k=32, m=1024, offsets=(256, 256, 768), device="cpu"):
    """Inputs with an empty expert (1) and rows past the last offset (768..1023)."""
    g = dict(device=device)
    return dict(
        a=torch.randn(m, k, **g).to(BF), b=torch.randn(L, n, k, **g).to(BF),
        c=(2 * torch.randn(m, 2 * n, **g)).to(BF), offs=torch.tensor(offsets, dtype=torch.int32, **g),
        alpha=torch.rand(L, **g) + 0.5, beta=torch.rand(L, **g) + 0.5, prob=torch.rand(m, **g),
    )


def oracle(p, generate_dbias, act_func="dswiglu", **act):
    """float64 reference outputs of the same call, through the public contract."""
    cfg = contract.CallConfig(act_func=act_func, **act)
    ops = contract.Operands(a=p["a"], c=p["c"], padded_offsets=p["offs"], alpha=p["alpha"], beta=p["beta"],
                            prob=p["prob"], dprob=torch.zeros_like(p["prob"]), b=p["b"].permute(1, 2, 0))
    problem, pack = contract.normalize(ops, cfg, generate_dbias=generate_dbias)
    return reference_outputs(problem, pack)


def call(p, **kw):
    return ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], b=p["b"], **kw)


# --------------------------------------------------------------------------- the op
@pytest.mark.parametrize("act_func,act", [("dswiglu", {}), ("dgeglu", {}),
                                          ("dgeglu", dict(geglu_alpha=1.0, linear_offset=0.0,
                                                          glu_clamp_max=2.0, glu_clamp_min=-2.0))])
def test_op_matches_reference(act_func, act):
    p = make_problem()
    d_row, dprob, dbias = call(p, act_func=act_func, generate_dbias=True, **act)
    ref = oracle(p, True, act_func, **act)
    end = int(p["offs"][-1])
    assert d_row.shape == (1024, 128) and d_row.dtype == BF
    assert rel_err(d_row[:end], ref["d_row"][:end]) < BF16_REL
    assert rel_err(dprob, ref["dprob"]) < 1e-5
    assert rel_err(dbias, ref["dbias"]) < BF16_REL
    # functional outputs: rows past the last offset are zero, dprob/dbias only this call's sums
    assert not d_row[end:].any() and not dprob[end:].any()
    assert not dbias[1].any()  # the empty expert


def test_op_without_dbias_and_d_dtype():
    p = make_problem()
    d_row, dprob, dbias = call(p, d_dtype=torch.float32)
    assert dbias is None and d_row.dtype == torch.float32
    ref = oracle(p, False)
    assert rel_err(d_row[:768], ref["d_row"][:768]) < 1e-5


@pytest.mark.parametrize("b_major", ["k", "n"])
def test_discrete_matches_dense(b_major):
    p = make_problem()
    if b_major == "k":
        weights = [p["b"][e].contiguous() for e in range(3)]
    else:  # each expert stored (K, N) row-major: an N-major (N, K) matrix
        weights = [p["b"][e].t().contiguous() for e in range(3)]
    ptrs = ct.expert_pointers(weights)
    got = ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], b_ptrs=ptrs, n=64,
                               b_major=b_major, generate_dbias=True)
    want = call(p, generate_dbias=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_op_rejects_bad_input_with_named_errors():
    p = make_problem()
    with pytest.raises(ValueError, match="a: M"):
        ct.grouped_gemm_dglu(p["a"][:1000], p["c"][:1000], p["offs"], p["alpha"], p["beta"], p["prob"][:1000],
                             b=p["b"])
    with pytest.raises(TypeError, match="c: dtype"):
        ct.grouped_gemm_dglu(p["a"], p["c"].to(torch.int32), p["offs"], p["alpha"], p["beta"], p["prob"], b=p["b"])
    with pytest.raises(ValueError, match="b/b_ptrs"):
        ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"])
    # the op's own names and b's shape as passed, (L, N, K), not the contract's (N, K, L) view
    with pytest.raises(ValueError, match=r"^b: K must equal a's K = 32, got shape \(3, 64, 40\)$"):
        ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"],
                             b=torch.zeros(3, 64, 40, dtype=BF))
    with pytest.raises(TypeError, match=r"^alpha: dtype must be one of \{float32\}, got float64"):
        ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"].double(), p["beta"], p["prob"], b=p["b"])
    with pytest.raises(TypeError, match="generate_dbias: expected a bool, got int"):
        ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], b=p["b"],
                             generate_dbias=1)
    with pytest.raises(ValueError, match="b_major: dense weights"):
        ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], b=p["b"], b_major="n")
    with pytest.raises(ValueError, match="n: discrete"):
        ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"],
                             b_ptrs=torch.zeros(3, dtype=torch.int64))
    misaligned = torch.empty(1024 * 32 + 1, dtype=BF)[1:].view(1024, 32)
    misaligned.copy_(p["a"])
    call(p)  # warm the memo for this metadata: alignment is still checked on the hot path
    with pytest.raises(ValueError, match="a: data pointer"):
        ct.grouped_gemm_dglu(misaligned, p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], b=p["b"])
    # and on the out= hot path, for a caller's output: named, nothing written
    d_row, dprob = torch.zeros(1024, 128, dtype=BF), torch.zeros(1024)
    call(p, out=(d_row, dprob, None))  # warm the memo for this metadata
    off_dprob = torch.zeros(1024 + 1)[1:]
    with pytest.raises(ValueError, match=r"out\[1\] \(dprob\): data pointer"):
        call(p, out=(d_row, off_dprob, None))
    assert not off_dprob.any()


@pytest.mark.parametrize("what,err,match", [
    ("offsets_int64", TypeError, "padded_offsets: must be int32"),
    ("offsets_short", ValueError, r"padded_offsets: expected \(2,\)"),
    ("prob_short", ValueError, r"prob: expected \(M,\) = \(512,\)"),
    ("prob_int", TypeError, "prob: must be a floating-point"),
    ("x_hidden", ValueError, r"x: expected \(M, hidden=64\)"),
])
def test_layer_rejects_bad_input_by_its_own_argument_names(what, err, match):
    """GroupedGluMLP names its own arguments (not the fused op's, not torch's "Offsets have to
    be int32") before anything runs."""
    layer = GroupedGluMLP(2, 64, 64)
    x, prob, offs = torch.randn(512, 64, dtype=BF), torch.rand(512), torch.tensor([256, 512], dtype=torch.int32)
    bad = {"offsets_int64": dict(offs=offs.long()), "offsets_short": dict(offs=offs[:1]),
           "prob_short": dict(prob=prob[:511]), "prob_int": dict(prob=torch.ones(512, dtype=torch.int32)),
           "x_hidden": dict(x=torch.randn(512, 32, dtype=BF))}[what]
    args = dict(dict(x=x, prob=prob, offs=offs), **bad)
    with pytest.raises(err, match=match):
        layer(args["x"], args["prob"], args["offs"])


def test_layer_takes_the_vendors_prob_shape():
    """prob (M, 1) or (M, 1, 1), the vendor's shape, is the same as (M,)."""
    layer = GroupedGluMLP(2, 64, 64)
    x, prob, offs = torch.randn(512, 64, dtype=BF), torch.rand(512), torch.tensor([256, 512], dtype=torch.int32)
    want = layer(x, prob, offs)
    for shape in ((512, 1), (512, 1, 1)):
        torch.testing.assert_close(layer(x, prob.view(shape), offs), want, rtol=0, atol=0)


def test_hot_path_does_not_revalidate(monkeypatch):
    p = make_problem()
    call(p, generate_dbias=True)  # builds the memo entry and the plan

    def boom(*a, **k):
        raise AssertionError("contract.normalize ran on the hot path")

    monkeypatch.setattr(contract, "normalize", boom)
    monkeypatch.setattr(_core, "graph_for_call", boom)
    p2 = make_problem()  # same metadata, new data
    call(p2, generate_dbias=True)


@pytest.mark.parametrize("generate_dbias", [False, True])
def test_opcheck_dense(generate_dbias):
    p = make_problem(L=2, n=32, k=16, m=512, offsets=(256, 512))
    torch.library.opcheck(torch.ops.cudnn_ext.grouped_gemm_dglu.default,
                          (p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"]),
                          dict(generate_dbias=generate_dbias, act_func="dgeglu"))


def test_opcheck_discrete():
    p = make_problem(L=2, n=32, k=16, m=512, offsets=(0, 512))
    weights = [p["b"][e].contiguous() for e in range(2)]
    ptrs = ct.expert_pointers(weights)
    torch.library.opcheck(torch.ops.cudnn_ext.grouped_gemm_dglu_discrete.default,
                          (p["a"], ptrs, 32, p["c"], p["offs"], p["alpha"], p["beta"], p["prob"]),
                          dict(generate_dbias=True))


def test_compile_fullgraph_one_graph():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    p = make_problem()

    def step(a, b, c, offs, alpha, beta, prob, grad_prob):
        d_row, dprob, dbias = ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b, generate_dbias=True)
        return d_row.float() * 2, grad_prob + dprob, dbias.float().sum(0)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    args = (p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], torch.ones(1024))
    for got, want in zip(compiled(*args), step(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert counter.frame_count == 1
    op = torch.ops.cudnn_ext.grouped_gemm_dglu
    assert any(n.target in (op, op.default) for n in counter.graphs[0].graph.nodes)


@pytest.mark.parametrize("form", ["functional", "out", "discrete"])
def test_compile_dynamic_sizes_one_graph(form):
    """Valid calls under dynamic sizes: the fake kernels' contract check and the scalar checks
    before dispatch trace into one graph (no graph break on symbolic sizes or floats), and a
    second M reuses it; dgeglu's floats and a bool-free signature as a user writes them."""
    from torch._dynamo.testing import CompileCounterWithBackend

    kw = dict(act_func="dgeglu", geglu_alpha=1.5, glu_clamp_max=3.0, glu_clamp_min=-3.0)

    def step(p, outs):
        if form == "discrete":
            return ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"],
                                        b_ptrs=p["ptrs"], n=64, generate_dbias=True, **kw)
        return call(p, generate_dbias=True, out=outs, **kw) if outs else call(p, generate_dbias=True, **kw)

    counter = CompileCounterWithBackend("eager")
    torch._dynamo.reset()
    try:
        compiled = torch.compile(step, fullgraph=True, backend=counter, dynamic=True)
        for m, offsets in ((1024, (256, 256, 768)), (768, (256, 512, 768))):
            p = make_problem(m=m, offsets=offsets)
            weights = [p["b"][e].contiguous() for e in range(3)]
            p["ptrs"] = ct.expert_pointers(weights)
            outs = _outs(p, fill_d=0.0) if form == "out" else None
            want = step(p, tuple(t.clone() for t in outs) if outs else None)
            got = compiled(p, outs)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 1


# --------------------------------------------------------------------------- out= variant
def _outs(p, dbias=True, fill_d=float("nan")):
    m, two_n, L = p["c"].shape[0], p["c"].shape[1], p["b"].shape[0]
    return (torch.full((m, two_n), fill_d, dtype=BF), torch.rand(m),
            (torch.rand(L, two_n) - 0.5).to(BF) if dbias else None)


@pytest.mark.parametrize("generate_dbias", [False, True])
def test_out_variant_writes_and_accumulates_into_caller_buffers(generate_dbias):
    p = make_problem()
    ref = oracle(p, generate_dbias, "dgeglu")
    d_row, dprob, dbias = _outs(p, generate_dbias)
    dprob0, dbias0 = dprob.clone(), dbias.clone() if generate_dbias else None
    got = call(p, act_func="dgeglu", generate_dbias=generate_dbias, out=(d_row, dprob, dbias))
    assert got[0] is d_row and got[1] is dprob and got[2] is dbias
    end = int(p["offs"][-1])
    assert rel_err(d_row[:end], ref["d_row"][:end]) < BF16_REL
    assert torch.isnan(d_row[end:]).all()  # rows past the last offset: untouched (class API contract)
    assert rel_err(dprob - dprob0, ref["dprob"]) < 1e-3  # accumulated into
    if generate_dbias:
        assert rel_err(dbias.double() - dbias0.double(), ref["dbias"]) < BF16_REL
    # the same call again accumulates again; D is overwritten with the same values
    call(p, act_func="dgeglu", generate_dbias=generate_dbias, out=(d_row, dprob, dbias))
    assert rel_err(dprob - dprob0, 2 * ref["dprob"]) < 1e-3


@pytest.mark.parametrize("arg", ["prob", "c", "dprob_out"])
def test_one_meta_tensor_among_cpu_ones_is_refused(arg):
    """One meta tensor dispatches the op to its fake kernel: it must name the argument, not
    hand back uninitialized CPU outputs (or, out=, write nothing)."""
    p = make_problem()
    d_row, dprob, _ = _outs(p)
    if arg == "dprob_out":
        dprob = torch.zeros(1024, device="meta")
        with pytest.raises(ValueError, match="dprob: must be on the same device"):
            call(p, out=(d_row, dprob, None))
        assert torch.isnan(d_row).all()
        return
    p[arg] = torch.ones(p[arg].shape, dtype=p[arg].dtype, device="meta")
    with pytest.raises(ValueError, match=f"{arg}: must be on the same device"):
        call(p)


def test_out_variant_rejects_bad_outputs_with_named_errors():
    p = make_problem()
    d_row, dprob, dbias = _outs(p)
    with pytest.raises(TypeError, match="out: must be a tuple"):
        call(p, out=[d_row, dprob])
    with pytest.raises(ValueError, match=r"out\[2\] \(dbias\): must be a tensor exactly when generate_dbias"):
        call(p, out=(d_row, dprob, dbias))
    with pytest.raises(ValueError, match=r"out\[2\] \(dbias\)"):
        call(p, generate_dbias=True, out=(d_row, dprob, None))
    with pytest.raises(ValueError, match="d_dtype: out"):
        call(p, d_dtype=torch.float32, out=(d_row, dprob, None))
    with pytest.raises(ValueError, match=r"out\[0\] \(d_row\): shape"):
        call(p, out=(d_row[:, :64], dprob, None))
    with pytest.raises(TypeError, match=r"out\[1\] \(dprob\): dtype"):
        call(p, out=(d_row, dprob.double(), None))
    with pytest.raises(ValueError, match=r"out\[2\] \(dbias\)"):
        call(p, generate_dbias=True, out=(d_row, dprob, dbias[:2]))
    assert torch.isnan(d_row).all()  # nothing was written by the refused calls


def test_opcheck_out_variants():
    p = make_problem(L=2, n=32, k=16, m=512, offsets=(256, 512))
    d_row, dprob, dbias = _outs(p, fill_d=0.0)
    torch.library.opcheck(torch.ops.cudnn_ext.grouped_gemm_dglu_out.default,
                          (p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], d_row, dprob,
                           dbias), dict(act_func="dgeglu"))
    weights = [p["b"][e].contiguous() for e in range(2)]  # kept alive: the table does not
    ptrs = ct.expert_pointers(weights)
    torch.library.opcheck(torch.ops.cudnn_ext.grouped_gemm_dglu_discrete_out.default,
                          (p["a"], ptrs, 32, p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], d_row, dprob,
                           None))


def test_compile_fullgraph_out_variant():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    p = make_problem()

    def step(a, b, c, offs, alpha, beta, prob, d_row, dprob, dbias):
        ct.grouped_gemm_dglu(a, c, offs, alpha, beta, prob, b=b, generate_dbias=True, out=(d_row, dprob, dbias))
        return d_row.float().sum()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    base = (p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"])
    eager_outs, comp_outs = _outs(p, fill_d=0.0), None
    comp_outs = tuple(t.clone() for t in eager_outs)
    torch.testing.assert_close(compiled(*base, *comp_outs), step(*base, *eager_outs), rtol=0, atol=0)
    for got, want in zip(comp_outs, eager_outs):  # the mutation reached the caller's tensors
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert counter.frame_count == 1
    op = torch.ops.cudnn_ext.grouped_gemm_dglu_out
    assert any(n.target in (op, op.default) for n in counter.graphs[0].graph.nodes)


def test_eager_calls_skip_the_dispatcher_only_outside_modes(monkeypatch):
    """Plain eager calls run the op's body directly (same results); under a torch-function
    mode (which is how tracers see calls) the call goes through torch.ops."""
    from torch.overrides import TorchFunctionMode

    class Seen(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.funcs = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.funcs.append(func)
            return func(*args, **(kwargs or {}))

    import cudnn_ext.torch.ops as ops_module

    p = make_problem()
    direct_calls = []
    real = ops_module._dense_impl  # the dispatcher holds the registered function itself

    def counting(*args, **kw):
        direct_calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(ops_module, "_dense_impl", counting)
    direct = call(p, generate_dbias=True)
    assert len(direct_calls) == 1  # the plain eager call did not go through torch.ops
    with Seen() as mode:
        via_op = call(p, generate_dbias=True)
    assert len(direct_calls) == 1
    op = torch.ops.cudnn_ext.grouped_gemm_dglu
    assert any(f in (op, op.default) for f in mode.funcs)
    for got, want in zip(via_op, direct):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fresh_output_engines_get_uninitialized_buffers(monkeypatch):
    """An engine that initializes its outputs itself (``execute_fresh``, the SM90 kernel's
    fresh-outputs variant) gets torch.empty buffers and that entry point on functional calls;
    out= calls keep the contract (``execute``). Stand-in: the reference plan, made to zero
    the outputs first, with the buffers poisoned to show it did."""
    from cudnn_ext.engines import reference

    seen = []

    def execute_fresh(self, pack, workspace=None, stream=None):
        seen.append(bool(torch.isnan(pack["d_row"]).all()))  # uninitialized memory handed over?
        for slot in ("d_row", "dprob", "dbias"):
            if pack.get(slot) is not None:
                pack[slot].zero_()
        self.execute(pack, workspace, stream)

    real_empty = torch.empty

    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(reference._ReferencePlan, "execute_fresh", execute_fresh, raising=False)
    _core.clear_memo()
    p = make_problem()
    want = call(p, generate_dbias=True)
    assert len(seen) == 1
    monkeypatch.setattr(_core.torch, "empty", poisoned_empty)
    got = call(p, generate_dbias=True)
    assert seen[1:] == [True]  # the buffers came from torch.empty, not torch.zeros
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    ref = oracle(p, True)
    assert rel_err(got[1], ref["dprob"]) < 1e-3 and not got[0][768:].any()
    call(p, generate_dbias=True, out=_outs(p))
    assert len(seen) == 2  # out= runs the contract's execute
    _core.clear_memo()


def test_meta_tensors_and_jit_trace_take_the_op():
    p = make_problem()
    meta = {k: v.to("meta") for k, v in p.items()}
    d_row, dprob, dbias = call(meta, generate_dbias=True)  # the fake implementation answers
    assert [t.device.type for t in (d_row, dprob, dbias)] == ["meta"] * 3
    assert (d_row.shape, dprob.shape, dbias.shape) == ((1024, 128), (1024,), (3, 128))
    args = (p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], p["b"])
    traced = torch.jit.trace(lambda a, c, o, al, be, pr, b: ct.grouped_gemm_dglu(a, c, o, al, be, pr, b=b)[0], args)
    assert "cudnn_ext::grouped_gemm_dglu" in str(traced.graph)
    torch.testing.assert_close(traced(*args), call(p)[0], rtol=0, atol=0)


#: calls a real (CPU) call refuses, by name: an edit of make_problem's inputs (None: the
#: call itself differs, see _bad_call). Each must be refused with the same error when the
#: tensors are meta (the fake kernels) and when torch.compile traces the call.
_META_BAD = {
    "rows": lambda p: p.update(a=p["a"][:1000], c=p["c"][:1000], prob=p["prob"][:1000]),
    "k": lambda p: p.update(a=p["a"][:, :30].contiguous(), b=p["b"][:, :, :30].contiguous()),
    "alpha": lambda p: p.update(alpha=p["alpha"][:2]),
    "prob_strided": lambda p: p.update(prob=torch.rand(1024, 2)[:, 0]),
    "c_dtype": lambda p: p.update(c=p["c"].to(torch.int32)),
    "c_1d": lambda p: p.update(c=p["c"].reshape(-1)),
    "c_0d": lambda p: p.update(c=p["c"][0, 0]),
    "offs_dtype": lambda p: p.update(offs=p["offs"].long()),
    "act": None,  # an unknown act_func
    "geglu_alpha_bool": None,  # a bool where the schema coerces to float
    "b_major_dense": None,  # b_major with dense weights
    "d_dtype": None,  # an integer D dtype
    "d_row_shape": None,  # out= with a D of the wrong width
    "dbias_dtype": None,  # out= with an fp32 dbias
}


def _bad_call(p, case, outs=None):
    outs = outs or _outs
    if case == "act":
        return call(p, act_func="dfoo")
    if case == "geglu_alpha_bool":
        return call(p, act_func="dgeglu", geglu_alpha=True)
    if case == "b_major_dense":
        return call(p, b_major="n")
    if case == "d_dtype":
        return call(p, d_dtype=torch.int32)
    if case == "d_row_shape":
        d_row, dprob, _ = outs(p, dbias=False)
        return call(p, out=(d_row[:, :64], dprob, None))
    if case == "dbias_dtype":
        d_row, dprob, dbias = outs(p)
        return call(p, generate_dbias=True, out=(d_row, dprob, dbias.float()))
    return call(p)


def _meta_of(t):
    """A meta tensor of ``t``'s exact metadata (``.to("meta")`` may drop a view's strides)."""
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _meta_outs(p, **kw):
    return tuple(_meta_of(t) for t in _outs(p, **kw))


def _bad_problem(case):
    p = make_problem()
    if _META_BAD[case]:
        _META_BAD[case](p)
    return p


@pytest.mark.parametrize("case", sorted(_META_BAD))
def test_meta_calls_get_the_contracts_errors(case):
    """The fake kernels validate the whole contract on metadata: a call on meta tensors
    refuses what the real call refuses, with its error, instead of handing out output
    shapes."""
    p = _bad_problem(case)
    with pytest.raises((ValueError, TypeError)) as real:
        _bad_call(p, case)
    with pytest.raises(real.type) as got:
        _bad_call({k: _meta_of(v) for k, v in p.items()}, case, _meta_outs)
    assert str(got.value) == str(real.value)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", sorted(_META_BAD))
def test_compiled_calls_fail_at_trace(case, dynamic):
    """torch.compile traces the fake kernel (and the Python checks before it): a call the
    contract refuses fails while compiling, before any graph exists, with static and with
    dynamic sizes; with static sizes its error carries the real call's message (with
    dynamic ones dynamo's message names the sizes' symbols, and only in verbose mode)."""
    p = _bad_problem(case)
    with pytest.raises((ValueError, TypeError)) as real:
        _bad_call(p, case)
    compiled = []

    def backend(gm, example_inputs):  # reached only by a trace that succeeded
        compiled.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        fn = torch.compile(lambda p: _bad_call(p, case), fullgraph=True, backend=backend,
                           dynamic=dynamic)
        with pytest.raises(Exception) as got:
            fn(p)
    finally:
        torch._dynamo.reset()
    assert not compiled
    if not dynamic:
        assert str(real.value) in str(got.value)


def test_trailing_unit_dims_run():
    """The contract drops any trailing unit dims of a and c; the run reshapes them all."""
    p = make_problem()
    ref = call(p)[0]
    q = dict(p, a=p["a"][:, :, None, None], c=p["c"][:, :, None, None])
    torch.testing.assert_close(call(q)[0], ref, rtol=0, atol=0)
    meta = {k: _meta_of(v) for k, v in q.items()}
    assert call(meta)[0].shape == ref.shape


def test_meta_discrete_calls_are_validated():
    p = make_problem(L=2, n=32, k=16, m=512, offsets=(0, 512))
    ptrs = torch.zeros(2, dtype=torch.int64, device="meta")
    meta = {k: _meta_of(v) for k, v in p.items()}
    args = (meta["a"], meta["c"], meta["offs"], meta["alpha"], meta["beta"], meta["prob"])
    d_row, dprob, dbias = ct.grouped_gemm_dglu(*args, b_ptrs=ptrs, n=32, generate_dbias=True)
    assert (d_row.shape, dprob.shape, dbias.shape) == ((512, 64), (512,), (2, 64))
    with pytest.raises(ValueError, match="c: shape"):  # N from n, not from c
        ct.grouped_gemm_dglu(*args, b_ptrs=ptrs, n=64)
    with pytest.raises(TypeError, match="b_ptrs: dtype"):
        ct.grouped_gemm_dglu(*args, b_ptrs=ptrs.int(), n=32)
    with pytest.raises(ValueError, match="b_major"):
        ct.grouped_gemm_dglu(*args, b_ptrs=ptrs, n=32, b_major="m")
    with pytest.raises(TypeError, match="n: expected an int, got bool"):
        ct.grouped_gemm_dglu(*args, b_ptrs=ptrs, n=True)
    outs = (torch.empty(512, 64, dtype=BF, device="meta"), torch.empty(512, device="meta"),
            torch.empty(2, 64, device="meta"))  # an fp32 dbias
    with pytest.raises(TypeError, match=r"out\[2\] \(dbias\): dtype"):
        ct.grouped_gemm_dglu(*args, b_ptrs=ptrs, n=32, generate_dbias=True, out=outs)


def test_out_variant_bumps_version_counters():
    p = make_problem()
    d_row, dprob, dbias = _outs(p)
    before = (d_row._version, dprob._version, dbias._version)
    call(p, generate_dbias=True, out=(d_row, dprob, dbias))
    assert all(t._version > v for t, v in zip((d_row, dprob, dbias), before))


# --------------------------------------------------------------------------- GroupedGluMLP
OFFS = (256, 256, 768)  # expert 1 empty; rows 768.. belong to no expert
REAL = (200, 0, 400)  # real tokens per expert; the rest of each range is padding


def mlp_inputs(hidden, m=1024):
    x = torch.randn(m, hidden).to(BF)
    prob = torch.rand(m)
    starts = (0,) + OFFS[:-1]
    for s, e, r in zip(starts, OFFS, REAL):
        x[s + r:e] = 0
        prob[s + r:e] = 0
    x[OFFS[-1]:] = 0
    return x, prob, torch.tensor(OFFS, dtype=torch.int32)


def plain_autograd_layer(x, prob, w1, b1, w2, offs, act_func, cfg):
    """The same layer in plain float64 PyTorch: per-expert matmuls, explicit GLU."""
    return glu_mlp(x, prob, w1, b1, w2, offs, act_func, cfg)


@pytest.mark.parametrize("activation,bias", [("swiglu", True), ("geglu", False), ("geglu", True)])
def test_mlp_gradients_match_plain_autograd(activation, bias):
    L, H, N = 3, 64, 64
    mlp = GroupedGluMLP(L, H, N, activation=activation, bias=bias)
    if bias:
        with torch.no_grad():
            mlp.b1.normal_(0.0, 0.5)
    x, prob, offs = mlp_inputs(H)
    x.requires_grad_()
    prob.requires_grad_()
    y = mlp(x, prob, offs)
    dy = torch.randn_like(y)
    y.backward(dy)

    leaves = [t.detach().double().requires_grad_() for t in (x, prob, mlp.w1, mlp.w2)]
    xr, pr, w1r, w2r = leaves
    b1r = mlp.b1.detach().double().requires_grad_() if bias else None
    yr = plain_autograd_layer(xr, pr, w1r, b1r, w2r, OFFS, activation, mlp.cfg)
    yr.backward(dy.double())

    assert rel_err(y, yr) < BF16_REL
    for name, got, want in [("dx", x.grad, xr.grad), ("dprob", prob.grad, pr.grad), ("dw1", mlp.w1.grad, w1r.grad),
                            ("dw2", mlp.w2.grad, w2r.grad)] + ([("db1", mlp.b1.grad, b1r.grad)] if bias else []):
        assert got.shape == want.shape, name
        assert rel_err(got, want) < BF16_REL, f"{name}: rel err {rel_err(got, want):.3g}"
    # rows of no expert and the empty expert get exactly zero gradient
    assert not x.grad[768:].any() and not prob.grad[768:].any()
    assert not mlp.w1.grad[1].any() and not mlp.w2.grad[1].any()
    # padding rows (prob = 0) get no input gradient: dC = R * prob * ... is 0 there, bias or not
    assert not x.grad[200:256].any() and not x.grad[656:768].any()


def test_mlp_under_compile_matches_eager():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    mlp = GroupedGluMLP(3, 32, 64, bias=True)
    x, prob, offs = mlp_inputs(32)

    def loss(x, prob):
        return mlp(x, prob, offs).float().square().sum()

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend=CompileCounterWithBackend("aot_eager"))):
        xi, pi = x.clone().requires_grad_(), prob.clone().requires_grad_()
        mlp.zero_grad()
        fn(xi, pi).backward()
        grads.append([xi.grad, pi.grad, mlp.w1.grad.clone(), mlp.b1.grad.clone(), mlp.w2.grad.clone()])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_op_matches_cpu_and_captures_in_cuda_graph():
    p = make_problem()
    pc = {k: v.cuda() for k, v in p.items()}
    got = call(pc, generate_dbias=True)
    ref = oracle(p, True)
    assert rel_err(got[0][:768].cpu(), ref["d_row"][:768]) < BF16_REL
    assert rel_err(got[1].cpu(), ref["dprob"]) < 1e-3
    entry = next(iter(e for e in CALLS.entries("op") if e.problem.device_type == "cuda"))
    if entry.plan.engine_name == "reference":
        pytest.skip("the plan on this GPU is the reference engine, which reads offsets on the host")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call(pc, generate_dbias=True)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out[0], got[0], rtol=0, atol=0)
    # the out= variant, eagerly twice (the second reuses the cached per-stream scratch) and
    # captured (a graph-owned scratch); D starts NaN: rows past the last offset stay NaN
    def fresh_outs():
        return (torch.full_like(got[0], float("nan")), torch.zeros_like(got[1]), torch.zeros_like(got[2]))

    for _ in range(2):
        outs = fresh_outs()
        call(pc, generate_dbias=True, out=outs)
        torch.testing.assert_close(outs[0][:768], got[0][:768], rtol=0, atol=0)
        assert torch.isnan(outs[0][768:]).all()
        torch.testing.assert_close(outs[1], got[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outs[2].float(), got[2].float(), rtol=2e-2, atol=2e-2)
    outs2 = fresh_outs()
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        call(pc, generate_dbias=True, out=outs2)
    for t in outs2:
        t.fill_(float("nan")) if t is outs2[0] else t.zero_()
    g2.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(outs2[0][:768], got[0][:768], rtol=0, atol=0)
    assert torch.isnan(outs2[0][768:]).all()
    torch.testing.assert_close(outs2[1], got[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs2[2].float(), got[2].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_mlp_gradients_match_cpu():
    CALLS.clear("op")  # the engine check below must see this test's plans only
    torch.manual_seed(0)
    mlp = GroupedGluMLP(3, 64, 64, bias=True)
    x, prob, offs = mlp_inputs(64)
    dy = torch.randn(1024, 64).to(BF)
    res = []
    for dev in ("cpu", "cuda"):
        m = GroupedGluMLP(3, 64, 64, bias=True, device=dev)
        m.load_state_dict(mlp.state_dict())
        xi, pi = x.detach().to(dev).requires_grad_(), prob.detach().to(dev).requires_grad_()
        m(xi, pi, offs.to(dev)).backward(dy.to(dev))
        res.append([t.cpu() for t in (xi.grad, pi.grad, m.w1.grad, m.b1.grad, m.w2.grad)])
    for got, want in zip(res[1], res[0]):
        assert rel_err(got, want) < BF16_REL
    # on a Hopper GPU with the CuTe DSL the backward's fused op must be the kernel, not the
    # reference fallback (otherwise this test would not check the kernel's gradients)
    from cudnn_ext.engines.sm90 import Sm90DgluEngine

    if Sm90DgluEngine().available() is None:
        used = {e.plan.engine_name for e in CALLS.entries("op") if e.problem.device_type == "cuda"}
        assert "sm90_cutedsl" in used, used



def test_grouped_glu_mlp_with_no_rows_gives_zero_gradients():
    """A step with no rows at all (an expert-parallel rank can receive none): an empty output
    and zero weight gradients of the weights' shapes, on the CPU path of torch._grouped_mm,
    which refuses a 0-row operand."""
    from cudnn_ext.torch import GroupedGluMLP

    m = GroupedGluMLP(2, 64, 64, bias=True)
    x = torch.zeros(0, 64, dtype=torch.bfloat16, requires_grad=True)
    p = torch.zeros(0, requires_grad=True)
    y = m(x, p, torch.zeros(2, dtype=torch.int32))
    assert y.shape == (0, 64)
    y.sum().backward()
    for w in (m.w1, m.w2, m.b1):
        assert w.grad is not None and w.grad.shape == w.shape and not w.grad.any()
    assert x.grad.shape == (0, 64) and p.grad.shape == (0,)


def test_import_does_not_load_the_compiler():
    """``import cudnn_ext.torch`` leaves torch._dynamo unloaded (a second of import time); the
    constant-result mark on the row-alignment probe is the one torch's decorator sets."""
    import subprocess
    import sys

    code = "import sys, cudnn_ext.torch; print('torch._dynamo' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr
    from cudnn_ext.torch import mlp

    marked = torch.compiler.assume_constant_result(lambda: 0)
    mark = [k for k in vars(marked) if k.startswith("_dynamo")]
    assert mark == ["_dynamo_marked_constant"]
    assert getattr(mlp._cuda_row_alignment, mark[0]) is getattr(marked, mark[0])
