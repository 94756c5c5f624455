"""A layer step captured as CUDA graphs: :class:`GraphedStep`, the opt-in that takes an eager
training step's host issue time off the MoE experts (``CudnnGroupedExperts(capture=True)``).

Owns the capture of one function's forward and backward for a static input shape (two CUDA
graphs per shape, as ``torch.cuda.make_graphed_callables`` makes them), their replay inside one
autograd node, and the rules that keep a replay's results right:

* **Static inputs.** Each call copies its input rows and the small integer input into the
  graphs' static tensors (the graphs read fixed addresses); the weights are read where they
  live (parameters keep their storage across optimizer steps; a weight with another address
  gets graphs of its own).
* **One forward in flight.** A replayed forward overwrites the tensors the previous forward
  saved for its backward, so a backward must run before the next forward of the same step
  object. A backward whose forward was overwritten raises instead of returning another
  call's gradients (gradient accumulation over microbatches is fine: forward, backward,
  forward, backward; pipeline schedules with several forwards in flight are not).
* **Outputs and gradients live in the graphs' memory.** The forward's output stays valid until
  the next forward; the weight gradients are handed to autograd as views of the static
  buffers, which ``AccumulateGrad`` takes as ``.grad`` without a copy when ``.grad`` is None.
  When a weight's ``.grad`` still is that buffer at the next backward (accumulation without
  ``zero_grad``), it is copied out first, so the replay cannot overwrite it.

The graph type is a parameter (``graph_factory``): :class:`CudaGraph` on the GPU; the CPU
tests pass one that re-runs the recorded function, which keeps every rule above testable
without a GPU.
"""
from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


class CudaGraph:
    """One CUDA graph: ``capture(fn, pool)`` runs ``fn`` under capture and returns its result
    (the graph's static outputs); ``replay()`` reruns the captured work."""

    def __init__(self):
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable, pool, device=None):
        with torch.cuda.device(device), torch.cuda.graph(self.graph, pool=pool):
            return fn()

    def replay(self) -> None:
        self.graph.replay()

    def pool(self):
        return self.graph.pool()


class _Graphs:
    """The two graphs of one static key, their static tensors and the in-flight generation."""

    def __init__(self, fn: Callable, x: Tensor, aux: Tensor, weights: Sequence[Tensor],
                 graph_factory: Callable, warmup: int):
        self.static_x = x.detach().clone().requires_grad_(x.requires_grad)
        self.static_aux = aux.detach().clone()
        self.weights = tuple(weights)
        self.addresses = tuple(w.data_ptr() for w in self.weights)  # what the graphs read
        # the gradients the backward graph takes: x's (where it needs one), then the weights'
        needs_grad = [x.requires_grad] + [w.requires_grad for w in self.weights]
        inputs = tuple(t for t, needs in zip((self.static_x, *self.weights), needs_grad) if needs)
        holder = {}

        def forward():
            holder["y"] = fn(self.static_x, self.static_aux, *self.weights)
            return holder["y"]

        def backward():
            return torch.autograd.grad(holder["y"], inputs, grad_outputs=self.static_dy)

        cuda = x.is_cuda
        if cuda and warmup:
            # lazy initializations (plans, compiled kernels, cached scalars) happen outside
            # the capture, on a side stream as make_graphed_callables does
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    y = fn(self.static_x, self.static_aux, *self.weights)
                    torch.autograd.grad(y, inputs, grad_outputs=torch.zeros_like(y))
            torch.cuda.current_stream(x.device).wait_stream(side)
        self.fwd = graph_factory()
        self.static_y = self.fwd.capture(forward, None, x.device)
        self.static_dy = torch.zeros_like(self.static_y)
        self.bwd = graph_factory()
        static_grads = iter(self.bwd.capture(backward, self.fwd.pool(), x.device))
        #: each slot's (x, then the weights') static gradient buffer, None where none is taken
        self.slot_grads = [next(static_grads) if needs else None for needs in needs_grad]
        self.generation = 0
        self.done = 0  # the generation whose backward ran last

    def check_addresses(self) -> None:
        """The graphs read the weights at their capture addresses: a weight whose storage
        moved since (freed and allocated again, as FSDP does between forward and backward)
        would be read stale."""
        moved = [i for i, (w, a) in enumerate(zip(self.weights, self.addresses)) if w.data_ptr() != a]
        if moved:
            raise RuntimeError(f"GraphedStep: weights {moved} moved since their graphs were captured (their "
                               f"storage was freed and allocated again); use capture=False for weights whose "
                               f"storage moves (FSDP)")

    def unalias(self) -> None:
        """Weights whose ``.grad`` is a static gradient buffer (a previous backward's, not
        zeroed since): copied out before the replay overwrites it."""
        for w, buf in zip(self.weights, self.slot_grads[1:]):
            g = w.grad
            if buf is not None and g is not None and g.data_ptr() == buf.data_ptr():
                w.grad = g.clone()


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, graphs: _Graphs, x: Tensor, aux: Tensor, *weights: Tensor):
        graphs.static_x.detach().copy_(x)
        graphs.static_aux.copy_(aux)
        # the backward graph's buffers share the forward's pool: a held gradient may sit in
        # memory the forward replay writes
        graphs.unalias()
        graphs.fwd.replay()
        graphs.generation += 1
        ctx.graphs, ctx.generation = graphs, graphs.generation
        return graphs.static_y.detach()

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor):
        graphs = ctx.graphs
        graphs.check_addresses()
        if ctx.generation != graphs.generation or graphs.done == ctx.generation:
            raise RuntimeError(
                "GraphedStep: this backward's forward was replayed over (another forward of the same captured "
                "step ran before this backward, or this backward ran twice); a captured step needs each "
                "forward's backward before its next forward: use capture=False for schedules with several "
                "forwards in flight")
        graphs.static_dy.copy_(dy)
        graphs.unalias()
        graphs.bwd.replay()
        graphs.done = ctx.generation
        out = [g.detach() if g is not None else None for g in graphs.slot_grads]
        if out[0] is not None:  # (the input's gradient may be kept: a copy, not the buffer)
            out[0] = out[0].clone()
        return (None, out[0], None, *out[1:])


class GraphedStep:
    """``fn(x, aux, *weights) -> y`` captured per static key (the shapes, dtypes and
    requires-grad of ``x`` and ``aux``, the weights' addresses and shapes) and replayed; the
    first call of a key warms up ``warmup`` times and captures (its result is a replay's).
    See the module docstring for what a caller must keep to."""

    def __init__(self, fn: Callable, *, graph_factory: Callable = CudaGraph, warmup: int = 3,
                 max_keys: int = 4):
        self.fn = fn
        self.graph_factory = graph_factory
        self.warmup = warmup
        self.max_keys = max_keys
        self._graphs: dict = {}

    def key(self, x: Tensor, aux: Tensor, weights: Sequence[Tensor]) -> tuple:
        return (tuple(x.shape), x.dtype, x.device, x.requires_grad, tuple(aux.shape), aux.dtype,
                tuple((w.data_ptr(), tuple(w.shape), w.dtype, w.requires_grad) for w in weights))

    def __call__(self, x: Tensor, aux: Tensor, weights: Sequence[Tensor]) -> Tensor:
        key = self.key(x, aux, weights)
        graphs = self._graphs.get(key)
        if graphs is None:
            if len(self._graphs) >= self.max_keys:  # (each key holds its graphs' memory)
                self._graphs.clear()
            graphs = self._graphs[key] = _Graphs(self.fn, x, aux, weights, self.graph_factory, self.warmup)
        return _Replay.apply(graphs, x, aux, *weights)

    def reset(self) -> None:
        """Drop every captured key (and its memory)."""
        self._graphs.clear()

    def __deepcopy__(self, memo):
        # a copy (of the module that owns it) captures its own graphs: CUDA graphs do not copy
        return GraphedStep(copy.deepcopy(self.fn, memo), graph_factory=self.graph_factory,
                           warmup=self.warmup, max_keys=self.max_keys)


def graph_step_applies(x: Tensor, weights: Sequence[Tensor]) -> Optional[str]:
    """Why a call cannot run captured (None when it can): no activation checkpointing, plain
    (not DTensor: parallelized or FSDP-sharded) weights, passed as the module's parameters,
    gradients being recorded, no compilation or capture already under way, CUDA tensors,
    some rows."""
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        # activation checkpointing (and save_on_cpu) hooks what the forward saves, and
        # recomputes the forward during the backward: a replay would run over the pending one
        return "saved-tensor hooks are active (activation checkpointing)"
    if any(hasattr(w, "to_local") for w in weights):
        return "parallelized or sharded (DTensor) weights"
    if not torch.is_grad_enabled():
        return "gradients are not being recorded"
    if torch.compiler.is_compiling():
        return "under torch.compile"
    if not x.is_cuda:
        return "not on a CUDA device"
    if torch.cuda.is_current_stream_capturing():
        return "inside another CUDA-graph capture"
    if x.shape[0] == 0:
        return "no rows"
    return None


__all__ = ["CudaGraph", "GraphedStep", "graph_step_applies"]
