"""ExpertParallelGluMLP against the single-process layer with all experts (tests/support/ep_cases.py).

CPU: 2 and 4 forked processes on gloo, the reference engine, float64 master weights (bf16
compute inside GroupedGluMLP on both sides): every output and gradient bitwise equal. Forked
rather than spawned: the children inherit the imported torch and start in milliseconds, where a
spawned child spends seconds importing it again. GPU: the same cases over NCCL under torchrun.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ep_cases
from cudnn_ext.torch import expert_parallel
from cudnn_ext.torch.expert_parallel import ExpertParallelGluMLP
from cudnn_ext.torch.mlp import GroupedGluMLP

ROOT = pathlib.Path(__file__).resolve().parents[2]

needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


def _fork(world, tmp_path):
    mp.start_processes(ep_cases.spawned, args=(world, str(tmp_path / "store")), nprocs=world,
                       join=True, start_method="fork")


@needs_gloo
@pytest.mark.parametrize("world", [2, 4])
def test_matches_single_process_layer(world, tmp_path):
    _fork(world, tmp_path)


@needs_gloo
def test_a_broken_layout_fails_the_comparison(tmp_path, monkeypatch):
    # the cases can fail: the first and the last received row trade places in the padded layout
    # (so each runs through the other's expert); the forked ranks inherit the patch
    real = expert_parallel.route

    def broken(*args, **kwargs):
        r = real(*args, **kwargs)
        dest = r.dest.clone()
        if dest.numel() > 1:
            dest[[0, -1]] = dest[[-1, 0]]
        return dataclasses.replace(r, dest=dest)

    monkeypatch.setattr(expert_parallel, "route", broken)
    with pytest.raises(mp.ProcessRaisedException, match="y differs"):
        _fork(2, tmp_path)


@pytest.fixture
def world_of_one(tmp_path):
    """A one-rank gloo group in this process (EP = 1: every expert local)."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store1'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_equals_the_reference(world_of_one):
    for name in ep_cases.CASES:
        assert ep_cases.run_case(name) == []


def test_argument_errors(world_of_one):
    with pytest.raises(ValueError, match="num_experts: must be a positive int"):
        ExpertParallelGluMLP(0, 64, 64)
    layer = ExpertParallelGluMLP(2, 64, 64)
    x, ids, p = torch.randn(4, 64), torch.zeros(4, 2, dtype=torch.long), torch.rand(4, 2)
    with pytest.raises(ValueError, match=r"x: must be \(T, 64\)"):
        layer(torch.randn(4, 32), ids, p)
    with pytest.raises(ValueError, match=r"expert_ids: must be \(T, k\) with T = 4"):
        layer(x, ids[:3], p[:3])
    with pytest.raises(TypeError, match="expert_ids: must be an integer tensor"):
        layer(x, ids.float(), p)
    with pytest.raises(ValueError, match="probs: must have expert_ids' shape"):
        layer(x, ids, p[:, :1])
    with pytest.raises(TypeError, match="probs: must be floating point"):
        layer(x, ids, ids)
    with pytest.raises(ValueError, match=r"expert_ids: every id must lie in \[0, 2\)"):
        layer(x, ids - 1, p)
    with pytest.raises(TypeError, match="full: must be a GroupedGluMLP"):
        layer.copy_shard_from(layer)
    with pytest.raises(ValueError, match=r"full: \(experts, hidden, intermediate\) must be \(2, 64, 64\)"):
        layer.copy_shard_from(GroupedGluMLP(4, 64, 64))


def test_needs_an_initialized_process_group():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        ExpertParallelGluMLP(2, 64, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_nccl_under_torchrun():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "support")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / "support" / "ep_cases.py")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    assert "6 cases + bad id + non-member OK on 2 ranks" in done.stdout


def test_layout_follows_the_experts_alignment(world_of_one):
    """The local layout pads each expert's rows to the experts' ``m_aligned``: none with
    ``m_aligned=1`` (the received rows only put in expert order), 8 rows with ``m_aligned=8``
    (both the Hopper kernel's ragged schedule), 256 by default."""
    ids = torch.tensor([[0, 1], [1, 2], [3, 1], [0, 2], [2, 3]])  # counts 2, 3, 3, 2
    for align, ends in ((1, [2, 5, 8, 10]), (8, [8, 16, 24, 32]), (256, [256, 512, 768, 1024])):
        layer = ExpertParallelGluMLP(4, 64, 64, dtype=torch.float64, m_aligned=align)
        r = expert_parallel.route(ids, 4, align=layer.experts.m_aligned)
        assert r.padded_offsets.tolist() == ends and r.rows == ends[-1], align
