"""10,000 calls of the torch op in a loop hold no more memory at the end than after the first
few: nothing per call is kept (memo entries, replay slots, pooled scratch, Python objects).

CPU tier, on the reference engine's plan with small shapes. The reference math costs tens of
milliseconds a call, so after one real call (checked against the oracle) the plan's execute
and its replay launcher are replaced here by no-ops: the loop runs every host-side step of
the op (dispatcher, memo or guard, validation on a miss, output allocation, scratch, launch
call) 10,000 times in about a second. Python allocations are traced with ``tracemalloc``;
the GPU twin (tests/gpu/test_op_host_path.py) also reads ``torch.cuda.memory_allocated``.
"""
from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch

import cudnn_ext.torch  # noqa: F401  (registers the ops)
from cudnn_ext import functional as _core
from cudnn_ext.engines import reference
from cudnn_ext.runtime import guards as _guards
from cudnn_ext.plan.execution import ExecutionPlan
from cudnn_ext.runtime.memo import CALLS
from cudnn_ext.runtime.workspace import POOL

from test_torch_integration import BF, make_problem, oracle, rel_err

CALLS_N = 10_000
#: Growth allowed over 10,000 calls: 1.6 bytes a call. A leak of one small Python object per
#: call (a tuple, a tensor wrapper: >= 56 bytes) is 560 KB and fails.
MAX_GROWTH = 16_000


def _growth(fn, n=CALLS_N):
    """Bytes of Python memory still allocated after ``n`` calls, beyond what the first 200
    left (caches fill there)."""
    for _ in range(200):
        fn()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        sizes = (len(CALLS), len(POOL._d))
        for _ in range(n):
            fn()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert (len(CALLS), len(POOL._d)) == sizes  # no new memo entry or scratch per call
    return grown


@pytest.fixture
def stubbed(monkeypatch):
    """The reference plan with no-op launches (its execute, the fresh-outputs variant the SM90
    plan has, and a replay launcher); True while each one runs once is recorded."""
    ran = {"execute": 0, "replay": 0}

    def execute(self, pack, workspace=None, stream=None):
        ran["execute"] += 1

    def address_launcher(self, m, init, device_index, zeroed_workspace=False):
        def go(*args):
            ran["replay"] += 1
        return go

    monkeypatch.setattr(reference._ReferencePlan, "execute", execute)
    monkeypatch.setattr(reference._ReferencePlan, "execute_fresh", execute, raising=False)
    _core.clear_memo()
    yield ran, (lambda: monkeypatch.setattr(ExecutionPlan, "address_launcher", address_launcher))
    _core.clear_memo()


def _small():
    return make_problem(L=2, n=32, k=16, m=512, offsets=(256, 512))


def test_first_call_is_the_reference():
    """The loop's problem, once for real (the no-op launches below replace only this)."""
    _core.clear_memo()
    p = _small()
    d_row, dprob, dbias = torch.ops.cudnn_ext.grouped_gemm_dglu(
        p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], generate_dbias=True)
    ref = oracle(p, True)
    assert rel_err(d_row, ref["d_row"]) < 2e-2 and rel_err(dbias, ref["dbias"]) < 2e-2


def test_op_validated_path_does_not_grow(stubbed):
    """The path every call takes where no replay exists (another engine, a first call): 2,000
    calls (tracemalloc makes each slower; a leak of one object a call still shows)."""
    ran, _ = stubbed
    p = _small()
    op = torch.ops.cudnn_ext.grouped_gemm_dglu
    grown = _growth(lambda: op(p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"],
                               p["prob"], generate_dbias=True), n=2000)
    assert ran["execute"] == 2000 + 200
    assert grown < MAX_GROWTH, f"{grown} bytes kept by 2000 calls"


@pytest.mark.skipif(not _guards.AVAILABLE, reason="this torch has no tensor guards")
def test_replayed_calls_do_not_grow(stubbed):
    """10,000 calls, in turn the op (the training layer's path), its out= variant and the
    Python entry, each replayed after its first (validated) call."""
    ran, with_replay = stubbed
    with_replay()
    p = _small()
    outs = (torch.zeros(512, 64, dtype=BF), torch.zeros(512), torch.zeros(2, 64, dtype=BF))
    args = (p["a"], p["b"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"])
    entries = (
        lambda: torch.ops.cudnn_ext.grouped_gemm_dglu(*args, generate_dbias=True),
        lambda: torch.ops.cudnn_ext.grouped_gemm_dglu_out(*args, *outs),
        lambda: cudnn_ext.torch.grouped_gemm_dglu(p["a"], p["c"], p["offs"], p["alpha"],
                                                  p["beta"], p["prob"], b=p["b"],
                                                  generate_dbias=True),
    )
    i = [0]

    def fn():
        entries[i[0] % 3]()
        i[0] += 1

    grown = _growth(fn)
    assert ran["execute"] == 3  # each entry's first call validated, every other call replayed
    assert ran["replay"] == CALLS_N + 200 - 3
    assert grown < MAX_GROWTH, f"{grown} bytes kept by {CALLS_N} calls"
