"""The eager hot path's guarded replay (``cudnn_ext.functional.run_fast``), on the CPU.

Only plans with an address launcher (the Hopper kernel) take it, so these tests give the
reference plan a stand-in launcher: it turns the raw addresses back into tensors of the
problem's shapes and runs the reference there. Outputs compared with the float64 oracle thus
show that every address went to its slot (alpha != beta, fresh data each call) and that the
replay honours both output contracts. GPU tests run the real launcher
(tests/gpu/test_sm90_correctness.py).
"""
from __future__ import annotations

import pytest
import torch

import cudnn_ext.torch as ct
from cudnn_ext.engines import reference
from cudnn_ext.plan.execution import ExecutionPlan
from cudnn_ext.reference.memory import tensor_at
from cudnn_ext import functional as _core
from cudnn_ext.runtime import guards as _guards
from cudnn_ext.runtime.workspace import POOL
from cudnn_ext.torch import ops

from test_torch_integration import BF, make_problem, oracle, rel_err

pytestmark = pytest.mark.skipif(not _guards.AVAILABLE, reason="this torch has no tensor guards")

#: the stand-in plans' scratch size with dbias
WS_BYTES = 256


@pytest.fixture
def launches(monkeypatch):
    """Give every plan a stand-in address launcher; yields the list of its launches."""
    seen = []

    def address_launcher(self, m, init, device_index, zeroed_workspace=False):
        self.check_m(m)
        pr = self.problem

        def go(a, b, c, offsets, alpha, beta, prob, d_row, dprob, dbias, workspace, mm):
            ws = tensor_at(workspace, WS_BYTES, torch.uint8, torch.device("cpu")) if workspace else None
            seen.append(dict(m=mm, init=init, workspace=workspace, zeroed=zeroed_workspace,
                             ws_was_zero=ws is not None and not ws.any()))
            if ws is not None and not zeroed_workspace:
                ws.fill_(7)  # scratch of unknown content: the plain launch owes it nothing
            L, n, k, dev = pr.num_experts, pr.n, pr.k, torch.device("cpu")
            at = lambda addr, shape, dt: tensor_at(addr, int(torch.Size(shape).numel()), dt, dev).view(shape)
            pack = dict(a=at(a, (mm, k), pr.ab_dtype), c=at(c, (mm, 2 * n), pr.c_dtype),
                        padded_offsets=at(offsets, (L,), torch.int32), alpha=at(alpha, (L,), torch.float32),
                        beta=at(beta, (L,), torch.float32), prob=at(prob, (mm,), torch.float32),
                        d_row=at(d_row, (mm, 2 * n), pr.d_dtype), dprob=at(dprob, (mm,), torch.float32),
                        dbias=at(dbias, (L, 2 * n), torch.bfloat16) if dbias else None)
            if pr.weight_mode == "dense":  # (N, K, L) view of the caller's contiguous (L, N, K)
                pack["b"] = at(b, (L, n, k), pr.ab_dtype).permute(1, 2, 0)
            else:
                pack["b_ptrs"] = at(b, (L,), torch.int64)
            if init:  # the fresh-outputs variant: initializes its outputs itself
                for slot in ("d_row", "dprob", "dbias"):
                    if pack[slot] is not None:
                        pack[slot].zero_()
            self.compiled.execute(pack, None, None)

        return go

    def execute_fresh(self, pack, workspace=None, stream=None):  # as the kernel's variant
        for slot in ("d_row", "dprob", "dbias"):
            if pack.get(slot) is not None:
                pack[slot].zero_()
        self.execute(pack, workspace, stream)

    monkeypatch.setattr(ExecutionPlan, "address_launcher", address_launcher)
    # with dbias the stand-in plan has a scratch whose bytes it keeps zero (like the kernel's
    # dbias region), so replays take the zero-kept scratch and its variant
    monkeypatch.setattr(ExecutionPlan, "workspace_size",
                        property(lambda self: WS_BYTES if self.problem.generate_dbias else 0))
    monkeypatch.setattr(ExecutionPlan, "zeroed_region",
                        property(lambda self: 0 if self.problem.generate_dbias else None))
    monkeypatch.setattr(reference._ReferencePlan, "execute_fresh", execute_fresh, raising=False)
    _core.clear_memo()
    yield seen
    _core.clear_memo()


def call(p, **kw):
    return ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], b=p["b"], **kw)


def _no_validation(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("validation ran on the fast path")

    monkeypatch.setattr(ops, "run", boom)  # the validated path
    monkeypatch.setattr(_core, "_entry", boom)


def _check(p, got, generate_dbias, end=768):
    ref = oracle(p, generate_dbias)
    assert rel_err(got[0][:end], ref["d_row"][:end]) < 2e-2
    assert rel_err(got[1], ref["dprob"]) < 1e-3
    if generate_dbias:
        assert rel_err(got[2], ref["dbias"]) < 2e-2


@pytest.mark.parametrize("generate_dbias", [False, True])
def test_functional_calls_replay_after_one_validated_call(launches, monkeypatch, generate_dbias):
    call(make_problem(), generate_dbias=generate_dbias)
    assert launches == []  # the first call validates and runs the plan's execute
    _no_validation(monkeypatch)
    poison = torch.empty

    def poisoned_empty(*a, **k):  # fresh outputs are uninitialized: show unwritten elements
        t = poison(*a, **k)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(_core.torch, "empty", poisoned_empty)
    for _ in range(2):  # fresh data, same metadata: replayed, nothing validated again
        p = make_problem()
        p["beta"] = p["alpha"] + 1.0  # alpha != beta: swapped slots would show
        got = call(p, generate_dbias=generate_dbias)
        _check(p, got, generate_dbias)
        assert not got[0][768:].any() and (got[2] is None) == (not generate_dbias)
    assert [x["init"] for x in launches] == [True, True]


def test_out_calls_replay_and_keep_the_contract(launches, monkeypatch):
    p = make_problem()
    outs = (torch.zeros(1024, 128, dtype=BF), torch.zeros(1024), torch.zeros(3, 128, dtype=BF))
    call(p, generate_dbias=True, out=outs)
    _no_validation(monkeypatch)
    p = make_problem()
    d_row = torch.full((1024, 128), 5.0, dtype=BF)  # rows past the last offset: untouched
    dprob, dbias = torch.full((1024,), 2.0), torch.full((3, 128), 1.0, dtype=BF)
    before = d_row._version
    got = call(p, generate_dbias=True, out=(d_row, dprob, dbias))
    assert got[0] is d_row and d_row._version > before  # version bumped like the op's
    assert len(launches) == 1 and launches[0]["init"] is False
    # the contract launch with dbias on the zero-kept scratch: its variant, found zero
    assert launches[0]["zeroed"] and launches[0]["ws_was_zero"]
    assert len(POOL.zeroed_buffers()) == 1
    ref = oracle(p, True)
    assert rel_err(d_row[:768], ref["d_row"][:768]) < 2e-2 and (d_row[768:] == 5).all()
    assert rel_err(dprob - 2.0, ref["dprob"]) < 1e-3  # accumulated into
    assert rel_err(dbias.double() - 1.0, ref["dbias"]) < 2e-2
    call(p, generate_dbias=True, out=(d_row, dprob, dbias))
    assert launches[1]["zeroed"] and launches[1]["ws_was_zero"]
    _core.clear_memo()  # forgets the zero-kept scratch too
    assert not POOL.zeroed_buffers()


def test_discrete_weights_replay(launches, monkeypatch):
    p = make_problem()
    weights = [p["b"][e].contiguous() for e in range(3)]
    ptrs = ct.expert_pointers(weights)
    run = lambda q: ct.grouped_gemm_dglu(q["a"], q["c"], q["offs"], q["alpha"], q["beta"], q["prob"],
                                         b_ptrs=ptrs, n=64, generate_dbias=True)
    run(p)
    _no_validation(monkeypatch)
    q = make_problem()
    q["b"] = p["b"]
    got = run(q)
    assert len(launches) == 1
    _check(q, got, True)


def test_other_metadata_and_modes_take_the_validated_path(launches):
    from torch.overrides import TorchFunctionMode

    p = make_problem()
    call(p)
    call(p)
    assert len(launches) == 1
    q = make_problem(m=1280, offsets=(256, 512, 1024))  # another M: validated, then replayed
    call(q)
    assert len(launches) == 1
    _check(q, call(q), False, end=1024)
    assert len(launches) == 2
    call(p)  # both metadata stay remembered
    assert len(launches) == 3
    variants = {
        "strides": dict(b=p["b"].transpose(1, 2).contiguous().transpose(1, 2)),  # N-major weights
        "dtype": dict(c=p["c"].to(torch.float16)),
        "requires_grad": dict(prob=p["prob"].clone().requires_grad_()),
    }
    for what, change in variants.items():
        got = call({**p, **change})
        assert len(launches) == 3, what
        _check({**p, **change}, got, False)
    call(p, act_func="dgeglu")  # another signature
    assert len(launches) == 3
    class PassThrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with PassThrough():
        call(p)
    assert len(launches) == 3
    _core.clear_memo()
    call(p)
    assert len(launches) == 3


def test_token_counts_changing_every_step_all_replay(launches):
    """MoE token counts change from step to step: each M seen keeps its replay (slots are
    keyed by M), so returning to an earlier M is not a validated call again."""
    ms = [1024 + 256 * i for i in range(10)]
    problems = [make_problem(m=m) for m in ms]
    for p in problems:
        call(p)
    assert launches == []
    for p in problems:
        _check(p, call(p), False)
    assert [x["m"] for x in launches] == ms


def _misaligned(t, elems=1):
    """A copy of ``t`` with the same metadata at an address ``elems`` elements past 16 B."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype)
    out = buf[elems:].view(t.shape)
    out.copy_(t)
    return out


@pytest.mark.parametrize("slot,name", [("a", "a"), ("b", "b"), ("c", "c"), ("offs", "padded_offsets"),
                                       ("alpha", "alpha"), ("beta", "beta"), ("prob", "prob")])
def test_misaligned_pointers_are_named_on_the_fast_path(launches, slot, name):
    p = make_problem()
    call(p)
    call(p)
    n0 = len(launches)
    assert n0 == 1
    with pytest.raises(ValueError, match=f"{name}: data pointer"):
        call({**p, slot: _misaligned(p[slot])})
    assert len(launches) == n0


def test_misaligned_outputs_and_pointer_table_are_named_on_the_fast_path(launches):
    p = make_problem()
    outs = lambda: (torch.zeros(1024, 128, dtype=BF), torch.zeros(1024), None)  # noqa: E731
    call(p, out=outs())
    call(p, out=outs())
    n0 = len(launches)
    dprob = _misaligned(torch.zeros(1024))
    with pytest.raises(ValueError, match=r"out\[1\] \(dprob\): data pointer"):
        call(p, out=(torch.zeros(1024, 128, dtype=BF), dprob, None))
    assert not dprob.any() and len(launches) == n0
    weights = [p["b"][e].contiguous() for e in range(3)]
    ptrs = ct.expert_pointers(weights)
    run = lambda t: ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"],  # noqa: E731
                                         b_ptrs=t, n=64)
    run(ptrs)
    run(ptrs)
    n0 = len(launches)
    raw = torch.empty(3 * 8 + 16, dtype=torch.uint8)  # an int64 table 4 bytes past 16-B
    start = (-raw.data_ptr()) % 16 + 4
    bad = tensor_at(raw.data_ptr() + start, 3, torch.int64, torch.device("cpu"))
    bad.copy_(ptrs)
    with pytest.raises(ValueError, match="b_ptrs: data pointer must be 8-byte aligned"):
        run(bad)
    assert len(launches) == n0


def test_typed_arguments_do_not_replay_a_different_call(launches):
    """Scalars that compare equal across types (64 == 64.0) are different calls: validation
    tells them apart, so the replay must too."""
    p = make_problem()
    weights = [p["b"][e].contiguous() for e in range(3)]
    ptrs = ct.expert_pointers(weights)
    run = lambda **kw: ct.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"],  # noqa: E731
                                            b_ptrs=ptrs, **kw)
    run(n=64)
    run(n=64)
    assert len(launches) == 1
    with pytest.raises(TypeError, match="n: expected an int"):
        run(n=64.0)
    assert len(launches) == 1
    call(p, act_func="dgeglu", glu_clamp_max=1.0)  # validated (a new signature)
    call(p, act_func="dgeglu", glu_clamp_max=1.0)  # replayed
    assert len(launches) == 2
    with pytest.raises(TypeError, match="glu_clamp_max: expected a float, got bool"):
        call(p, act_func="dgeglu", glu_clamp_max=True)
    _core.clear_memo()  # the validated path's memo must tell them apart as well
    call(p, act_func="dgeglu", glu_clamp_max=1.0)
    with pytest.raises(TypeError, match="glu_clamp_max: expected a float, got bool"):
        call(p, act_func="dgeglu", glu_clamp_max=True)
    call(p, act_func="dgeglu", glu_clamp_max=1.0)  # and a rejected True does not poison 1.0


def test_parameter_weights_take_the_replay(launches):
    """Expert weights are usually nn.Parameters: plain tensors for the op (no torch-function
    dispatch), so they run the body directly and replay."""
    p = make_problem()
    p["b"] = torch.nn.Parameter(p["b"], requires_grad=False)
    call(p)
    _check(p, call(p), False)
    assert len(launches) == 1


def test_without_guards_calls_stay_on_the_validated_path(launches, monkeypatch):
    monkeypatch.setattr(_guards, "AVAILABLE", False)
    p = make_problem()
    call(p)
    _check(p, call(p), False)
    assert launches == []


def test_guard_matches_exactly_the_metadata():
    x, y = torch.zeros(4, 8), torch.zeros(3, dtype=torch.int32)
    g = _guards.make((x, y))
    assert g.check(torch.ones(4, 8), torch.ones(3, dtype=torch.int32))
    for other in ((x.t().contiguous().t(), y), (x[:, :7], y), (x.double(), y), (x, y.long()), (x, y[:2]),
                  (x.to("meta"), y)):
        assert not g.check(*other)


# --------------------------------------------------------------------------- on the GPU
def _sm90_or_skip():
    from cudnn_ext.engines.sm90 import Sm90DgluEngine

    why = Sm90DgluEngine().available()
    if why is not None:
        pytest.skip(f"the Hopper kernel is not available here: {why}")


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["dense_k", "dense_n", "discrete"])
@pytest.mark.parametrize("generate_dbias", [False, True], ids=["nodbias", "dbias"])
@pytest.mark.parametrize("with_out", [False, True], ids=["functional", "out"])
def test_gpu_fast_path_replays_match_the_oracle(monkeypatch, weights, generate_dbias, with_out):
    """The real kernel through the replayed path: after one validated call, calls with the
    same metadata and fresh data (alpha != beta) take ``run_fast``; outputs are NaN-poisoned
    (functional: torch.empty filled with NaN; out=: D NaN, dprob/dbias start at 1 and must be
    accumulated into) and compared with the float64 oracle."""
    _sm90_or_skip()
    _core.clear_memo()
    hits = []
    real_fast = ops.run_fast

    def counting(*a, **k):
        res = real_fast(*a, **k)
        hits.append(res is not None)
        return res

    monkeypatch.setattr(ops, "run_fast", counting)
    real_empty = torch.empty

    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(_core.torch, "empty", poisoned_empty)
    keep = []
    for i in range(3):
        p = make_problem(k=40)  # K not a multiple of the K tile
        p["beta"] = p["alpha"] + 0.5
        if weights == "dense_n":
            p["b"] = p["b"].transpose(1, 2).contiguous().transpose(1, 2)
        pc = {k: v.cuda() for k, v in p.items()}
        kw = dict(generate_dbias=generate_dbias)
        if weights == "discrete":
            ws = [pc["b"][e].contiguous() for e in range(3)]
            keep.append(ws)
            kw.update(b_ptrs=ct.expert_pointers(ws), n=64)
        else:
            kw.update(b=pc["b"])
        if with_out:
            outs = (torch.full((1024, 128), float("nan"), dtype=BF, device="cuda"),
                    torch.ones(1024, device="cuda"),
                    torch.ones(3, 128, dtype=BF, device="cuda") if generate_dbias else None)
            kw["out"] = outs
        got = ct.grouped_gemm_dglu(pc["a"], pc["c"], pc["offs"], pc["alpha"], pc["beta"], pc["prob"], **kw)
        torch.cuda.synchronize()
        ref = oracle(p, generate_dbias)
        d_row, dprob, dbias = (t.cpu() if t is not None else None for t in got)
        assert rel_err(d_row[:768], ref["d_row"][:768]) < 2e-2, i
        if with_out:
            assert torch.isnan(d_row[768:]).all(), i  # the contract: untouched
            dprob = dprob - 1.0
            dbias = dbias.double() - 1.0 if generate_dbias else None
        else:
            assert not d_row[768:].any(), i  # fresh outputs: zero
        assert rel_err(dprob, ref["dprob"]) < 1e-3, i
        if generate_dbias:
            assert rel_err(dbias, ref["dbias"]) < 2e-2, i
    assert hits == [False, True, True], hits
    _core.clear_memo()


@pytest.mark.gpu
def test_gpu_zero_kept_scratch_is_shared_and_survives_bad_offsets():
    """out= calls with dbias replay as one kernel on a scratch that every launch leaves zero
    (the fold zeroes the sums and counters it consumed). Two plans of the same scratch size
    and layout (same L and N, different K) alternate on it, and a call whose offsets break
    the 256-row rule (device data: not checked on the host, results undefined) must still
    leave it zero for the calls after it. Each result is checked against the oracle."""
    _sm90_or_skip()
    _core.clear_memo()

    def run(p, bad_offs=None):
        pc = {k: v.cuda() for k, v in p.items()}
        offs = pc["offs"] if bad_offs is None else torch.tensor(bad_offs, dtype=torch.int32, device="cuda")
        outs = (torch.full((1024, 128), float("nan"), dtype=BF, device="cuda"),
                torch.zeros(1024, device="cuda"), torch.zeros(3, 128, dtype=BF, device="cuda"))
        ct.grouped_gemm_dglu(pc["a"], pc["c"], offs, pc["alpha"], pc["beta"], pc["prob"], b=pc["b"],
                             generate_dbias=True, out=outs)
        return [t.cpu() for t in outs]

    for step in range(3):
        for k in (32, 48):
            p = make_problem(k=k)
            got = run(p)
            ref = oracle(p, True)
            assert rel_err(got[0][:768], ref["d_row"][:768]) < 2e-2, (step, k)
            assert rel_err(got[1], ref["dprob"]) < 1e-3, (step, k)
            assert rel_err(got[2], ref["dbias"]) < 2e-2, (step, k)
        if step == 0:
            run(make_problem(k=32), bad_offs=(200, 300, 700))  # breaks the contract
    assert len(POOL.zeroed_buffers()) == 1  # both plans used the one zero-kept scratch
    ws = POOL.zeroed_buffers()[0]
    torch.cuda.synchronize()
    assert not ws.any()  # and it is zero at rest
    _core.clear_memo()


# --------------------------------------------------------------------------- through the dispatcher
def op_call(p, **kw):
    return torch.ops.cudnn_ext.grouped_gemm_dglu(p["a"], p["b"], p["c"], p["offs"], p["alpha"],
                                                 p["beta"], p["prob"], **kw)


@pytest.mark.parametrize("generate_dbias", [False, True])
def test_dispatcher_op_replays_after_one_validated_call(launches, monkeypatch, generate_dbias):
    """``torch.ops.cudnn_ext.grouped_gemm_dglu`` (what compiled graphs and direct op users
    call) replays too: its body tries the guard before the validated path."""
    op_call(make_problem(), generate_dbias=generate_dbias)
    assert launches == []
    _no_validation(monkeypatch)
    for _ in range(2):
        p = make_problem()
        p["beta"] = p["alpha"] + 1.0
        got = op_call(p, generate_dbias=generate_dbias)
        _check(p, got, generate_dbias)
        assert got[2].shape == ((3, 128) if generate_dbias else (0, 128))  # the schema's dbias
    assert [x["init"] for x in launches] == [True, True]


def test_dispatcher_op_replay_keeps_the_checks(launches):
    """A replayed signature still refuses what it must: other metadata or a misaligned
    pointer take the validated path and its typed error; other scalars are another
    signature (validated)."""
    p = make_problem()
    op_call(p)
    op_call(p)
    assert len(launches) == 1
    bad = dict(p, a=p["a"].float())  # another dtype: no guard matches, the contract names it
    with pytest.raises(TypeError, match="a/b: mixed dtype"):
        op_call(bad)
    raw = torch.empty(1024 * 32 * 2 + 2, dtype=torch.uint8)
    off = (16 - raw.data_ptr() % 16) % 16 + 2  # 2 bytes past a 16-byte boundary
    shifted = raw[off:off + 1024 * 32 * 2].view(BF).view(1024, 32)
    shifted.copy_(p["a"])
    with pytest.raises(ValueError, match="a: data pointer"):
        op_call(dict(p, a=shifted))
    with pytest.raises(ValueError, match="act_func"):
        op_call(p, act_func="relu")
    assert len(launches) == 1


def test_dispatcher_out_op_replays(launches, monkeypatch):
    p = make_problem()
    op = torch.ops.cudnn_ext.grouped_gemm_dglu_out
    outs = (torch.zeros(1024, 128, dtype=BF), torch.zeros(1024), torch.zeros(3, 128, dtype=BF))
    op(p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], *outs)
    _no_validation(monkeypatch)
    p = make_problem()
    outs = (torch.zeros(1024, 128, dtype=BF), torch.zeros(1024), torch.zeros(3, 128, dtype=BF))
    before = outs[0]._version
    op(p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], *outs)
    assert outs[0]._version > before
    _check(p, outs, True)
    assert len(launches) == 1 and launches[0]["init"] is False


def test_mlp_backward_takes_the_replay(launches, monkeypatch):
    """GroupedGluMLP's backward calls the op through its Python entry: from the second step
    on, the fused call is a replay (no validation, no dispatcher)."""
    from cudnn_ext.torch import GroupedGluMLP

    mlp = GroupedGluMLP(3, 32, 64)
    x = torch.randn(1024, 32, dtype=BF)
    offs = torch.tensor([256, 256, 768], dtype=torch.int32)
    prob = torch.rand(1024)
    mlp(x, prob, offs).float().sum().backward()
    assert launches == []
    _no_validation(monkeypatch)
    monkeypatch.setattr(torch.ops.cudnn_ext, "grouped_gemm_dglu", None)  # no dispatcher call
    mlp(x, prob, offs).float().sum().backward()
    assert len(launches) == 1
