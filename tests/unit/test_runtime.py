"""The runtime's two stores: the call memo (bounded, kinds kept apart) and the workspace pool
(one buffer per device, stream and size; zero-kept buffers apart); the occupancy query's
argument rule (its driver answer: tests/gpu/test_occupancy.py)."""
from __future__ import annotations

import pytest
import torch

from cudnn_ext.runtime.memo import CallMemo
from cudnn_ext.runtime.occupancy import max_active_clusters
from cudnn_ext.runtime.workspace import WorkspacePool


def test_call_memo_evicts_the_oldest_first_and_keeps_kinds_apart():
    memo = CallMemo(3)
    memo.put(("graph", 1), "g1")
    memo.put(("op", 1), "o1")
    memo.put(("graph", 2), "g2")
    assert memo.get(("op", 1)) == "o1" and memo.get(("graph", 1)) == "g1"
    memo.put(("op", 2), "o2")  # full: ("graph", 1), the oldest, goes
    assert memo.get(("graph", 1)) is None and len(memo) == 3
    assert sorted(memo.entries("op")) == ["o1", "o2"] and memo.entries("graph") == ["g2"]
    memo.clear("op")
    assert memo.entries("op") == [] and memo.get(("graph", 2)) == "g2"
    memo.clear()
    assert len(memo) == 0


def test_call_memo_put_replaces_and_returns_the_value():
    memo = CallMemo(2)
    assert memo.put(("op", 1), "a") == "a"
    memo.put(("op", 2), "b")
    memo.put(("op", 1), "c")  # a replaced key is the newest, not evicted next
    memo.put(("op", 3), "d")
    assert memo.get(("op", 1)) == "c" and memo.get(("op", 2)) is None


def test_pool_shares_per_stream_and_size_and_keeps_zeroed_buffers_apart():
    pool = WorkspacePool(8)
    cpu = torch.device("cpu")
    a = pool.scratch(256, cpu, "s1")
    assert pool.scratch(256, cpu, "s1") is a  # a repeated call allocates nothing
    assert pool.scratch(256, cpu, "s2") is not a  # two streams never share scratch
    assert pool.scratch(512, cpu, "s1") is not a
    z = pool.zeroed(256, 128, 64, cpu, "s1")
    assert z is not a and not z.any() and pool.zeroed(256, 128, 64, cpu, "s1") is z
    assert pool.zeroed_buffers() == [z]
    pool.clear()
    assert pool.scratch(256, cpu, "s1") is not a and pool.zeroed_buffers() == []


def test_pool_is_bounded():
    pool = WorkspacePool(2)
    cpu = torch.device("cpu")
    first = pool.scratch(16, cpu, 0)
    pool.scratch(32, cpu, 0)
    pool.scratch(48, cpu, 0)  # over the bound: the pool starts again
    assert pool.scratch(16, cpu, 0) is not first


def test_pointer_gather_refuses_bad_arguments_before_any_compile():
    """The device gather of a pointer table names the argument, the value and the rule; the
    checks run before the CuTe DSL is imported (CPU tensors never reach it in the engine)."""
    import pytest

    from cudnn_ext.kernels.pointer_gather import gather_pointer_table

    table, ends = torch.zeros(3, dtype=torch.int64), torch.tensor([256, 256, 512], dtype=torch.int32)
    with pytest.raises(TypeError, match=r"table: expected a 1-D int64 tensor of addresses, got torch.int32"):
        gather_pointer_table(table.to(torch.int32), 16, ends)
    with pytest.raises(ValueError, match="nbytes: expected a positive int, got 0"):
        gather_pointer_table(table, 0, ends)
    with pytest.raises(ValueError, match=r"ends: expected an integer tensor of shape \(3,\)"):
        gather_pointer_table(table, 16, ends[:2])
    with pytest.raises(ValueError, match="table: the device gather needs a CUDA tensor, got one on cpu"):
        gather_pointer_table(table, 16, ends)


@pytest.mark.parametrize("size", [0, 33])
def test_occupancy_query_refuses_cluster_sizes_outside_1_to_32(size):
    with pytest.raises(ValueError, match="cluster_size: must be in 1..32"):
        max_active_clusters(size)
