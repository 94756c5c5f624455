"""Every in-process cache is registered with runtime.caches, and clear_caches() empties them
all: each store is filled (through its own function where that is cheap on the CPU, else by
an entry put in directly) and seen empty afterwards."""
import importlib

import pytest
import torch

from cudnn_ext.runtime import caches, clear_caches

#: every module that owns a store (importing it registers the store)
OWNERS = ("cudnn_ext.runtime.memo", "cudnn_ext.runtime.workspace", "cudnn_ext.runtime.compile_cache",
          "cudnn_ext.runtime.occupancy", "cudnn_ext.engines.sm90", "cudnn_ext.kernels.pointer_gather",
          "cudnn_ext.kernels.blockscaled.launch", "cudnn_ext.kernels.blockwise.launch",
          "cudnn_ext.kernels.layer.launch", "cudnn_ext.kernels.partials.launch", "cudnn_ext.torch.ops",
          "cudnn_ext.torch.layer_ops")


def _fill():
    from cudnn_ext.engines import sm90
    from cudnn_ext.kernels.blockscaled import launch as bs_launch
    from cudnn_ext.kernels.blockwise import launch as bw_launch
    from cudnn_ext.kernels.layer import launch as layer_launch
    from cudnn_ext.kernels.partials import launch as fold_launch
    from cudnn_ext.runtime import compile_cache, memo, occupancy, workspace
    from cudnn_ext.torch import layer_ops, ops

    memo.CALLS.put(("test",), 1)
    workspace.POOL._d[("test",)] = torch.empty(1)
    compile_cache._versions["test"] = None
    occupancy._RESIDENT[("test", 132, 2)] = 132
    sm90._compiled["test"] = object()
    bs_launch._kernels.compiled["test"] = object()
    bw_launch._kernels.compiled["test"] = object()
    layer_launch._kernels.compiled["test"] = object()
    fold_launch._kernels.compiled["test"] = object()
    ops._act("dswiglu", None, 1.702, 7.0, -7.0, 256)
    layer_ops._glu_config("dswiglu", 1.702, 7.0, -7.0, 0.0)
    from cudnn_ext.kernels import pointer_gather

    sm90._compile_seconds["test"] = 0.0
    pointer_gather._kernels.compiled[("gather", "test")] = object()
    # the device capabilities need a GPU to fill
    return {"device capabilities"}


def test_clear_caches_empties_every_registered_store():
    for name in OWNERS:
        importlib.import_module(name)
    unfilled = _fill()
    sizes = caches.sizes()
    assert {n for n, size in sizes.items() if size == 0} <= unfilled, sizes
    assert len(sizes) >= len(OWNERS)
    clear_caches()
    assert all(size == 0 for size in caches.sizes().values()), caches.sizes()


def test_a_store_registers_once():
    with pytest.raises(ValueError, match="already registered"):
        caches.register("calls", lambda: None, lambda: 0)
