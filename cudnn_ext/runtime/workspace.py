"""Workspace layout of an execution plan, the checks on a caller's workspace buffer, and the
pool of scratch buffers the library owns for callers that pass none.

Owns how a plan's named workspace requests (``CompiledPlan.workspace_requests()``, sizes
reported by engines) are carved out of one caller-owned byte buffer, and the per-call checks on
that buffer (metadata only: no allocation, no device sync). Engines never allocate hidden
workspace; the caller allocates ``plan.workspace_size`` bytes once and passes them to every
``execute``.

Layout rule: regions are placed in request order, each at the next multiple of its
alignment (128 B unless the engine asks otherwise); the total is rounded up to 128 B and is 0
when the plan needs nothing. The same rule is used by engines to find their offsets
(``WorkspaceLayout.of(requests)``), so the layout has one definition.
"""
from __future__ import annotations

from dataclasses import dataclass
import threading
from typing import Dict, Iterable, Mapping, NamedTuple, Optional, Tuple

import torch

from . import caches


class WorkspaceRequest(NamedTuple):
    """One named region of a plan's workspace: ``nbytes`` at an ``align``-byte boundary.

    Sizes depend on the problem family only, never on the token count M (a plan's workspace
    is sized once, at build time). Standard names: ``sched_counter`` (int32 tile counter of
    the dynamic scheduler), ``b_descriptors`` (one TMA descriptor per expert for discrete
    weights), ``dbias_partials`` (fp32 L x 2N sums rounded once into the bf16 dbias),
    ``dprob_partials`` (fp32 per-slot dprob sums of a deterministic reduction).
    """

    name: str
    nbytes: int
    align: int = 128


#: Alignment of the whole buffer and of the total size (vendor: 128 B, frost/workspace.py).
BASE_ALIGN = 128


def align_up(x: int, a: int) -> int:
    return -(-int(x) // a) * a


@dataclass(frozen=True)
class WorkspaceRegion:
    name: str
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class WorkspaceLayout:
    """Named regions of one workspace buffer; ``size`` is what the caller allocates."""

    regions: Tuple[WorkspaceRegion, ...] = ()
    size: int = 0

    @classmethod
    def of(cls, requests: Iterable[WorkspaceRequest]) -> "WorkspaceLayout":
        regions, cursor, seen = [], 0, set()
        for req in requests:
            name, nbytes, align = WorkspaceRequest(*req)
            if name in seen:
                raise ValueError(f"workspace: region {name!r} requested twice")
            if nbytes < 0 or align < 1 or align & (align - 1):
                raise ValueError(f"workspace: region {name!r} needs nbytes >= 0 and a power-of-two alignment, "
                                 f"got nbytes={nbytes}, align={align}")
            seen.add(name)
            if nbytes == 0:
                continue
            offset = align_up(cursor, align)
            regions.append(WorkspaceRegion(name, offset, int(nbytes)))
            cursor = offset + nbytes
        return cls(tuple(regions), align_up(cursor, BASE_ALIGN) if regions else 0)

    def region(self, name: str) -> Optional[WorkspaceRegion]:
        for r in self.regions:
            if r.name == name:
                return r
        return None

    def view(self, workspace: torch.Tensor, name: str, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """The bytes of region ``name`` in ``workspace`` viewed as ``dtype`` (a view, no copy)."""
        r = self.region(name)
        if r is None:
            raise KeyError(f"workspace: no region {name!r}; regions: {[x.name for x in self.regions]}")
        return workspace[r.offset:r.end].view(dtype)

    def describe(self) -> str:
        if not self.regions:
            return "no workspace"
        parts = [f"{r.name}@{r.offset}+{r.nbytes}" for r in self.regions]
        return f"{self.size} B: " + ", ".join(parts)


def _byte_range(t: torch.Tensor) -> Optional[Tuple[int, int]]:
    if t.numel() == 0:
        return None
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


def check_workspace(workspace: Optional[torch.Tensor], layout: WorkspaceLayout, device: torch.device,
                    operands: Mapping[str, Optional[torch.Tensor]] = ()) -> None:
    """The caller's workspace against the plan: None only if the plan needs none; else a 1-D
    contiguous uint8 tensor of >= ``layout.size`` bytes on ``device``, 128-B aligned (the
    vendor's rule, docs/vendor_contract.md §3.4), overlapping no operand (each check reads metadata only).
    The one workspace check: the graph's execute and the class API both call it."""
    need = layout.size
    if workspace is None:
        if need:
            raise ValueError(f"workspace: this plan needs {need} bytes ({layout.describe()}), got None; "
                             "allocate get_workspace_size() bytes (torch.uint8) once and pass them to every execute")
        return
    if not isinstance(workspace, torch.Tensor):
        raise TypeError(f"workspace: expected a torch.Tensor of uint8, got {type(workspace).__name__}")
    if workspace.dtype != torch.uint8:
        raise TypeError(f"workspace: dtype must be uint8, got {str(workspace.dtype).replace('torch.', '')}")
    if workspace.numel() < need:
        raise ValueError(f"workspace: needs at least {need} bytes ({layout.describe()}), got {workspace.numel()}")
    if need == 0:
        return
    if workspace.dim() != 1 or not workspace.is_contiguous():
        raise ValueError(f"workspace: must be a 1-D contiguous uint8 buffer, got shape {tuple(workspace.shape)} "
                         f"stride {tuple(workspace.stride())}")
    if workspace.device != device:
        raise ValueError(f"workspace: must be on {device}, got {workspace.device}")
    if workspace.data_ptr() % BASE_ALIGN:
        raise ValueError(f"workspace: data pointer must be {BASE_ALIGN}-byte aligned, got 0x{workspace.data_ptr():x}")
    w0, w1 = workspace.data_ptr(), workspace.data_ptr() + need
    for name, t in dict(operands).items():
        rng = _byte_range(t) if isinstance(t, torch.Tensor) else None
        if rng is not None and rng[0] < w1 and w0 < rng[1]:
            raise ValueError(f"workspace: must not overlap {name} (workspace [0x{w0:x}, 0x{w1:x}), "
                             f"{name} [0x{rng[0]:x}, 0x{rng[1]:x}))")


class WorkspacePool:
    """Scratch buffers owned by the library, reused across calls: one per (device, stream,
    size), plus buffers kept zero in a byte range. Calls on one stream share a buffer (stream
    order serializes them; sizes depend on L and N, never on M), so a repeated call allocates
    nothing; two streams never share one. Callers decide when a pooled buffer is right (not
    inside a CUDA-graph capture: a replay must not share scratch with eager calls)."""

    def __init__(self, max_entries: int):
        self._d: Dict[tuple, torch.Tensor] = {}
        self._max = max_entries
        self._lock = threading.Lock()

    def _get(self, slot: tuple, alloc) -> torch.Tensor:
        """The buffer of ``slot`` = (device, stream, nbytes, range), made by ``alloc``
        (``torch.empty`` or ``torch.zeros``) on a miss (no closure: this is the eager hot path)."""
        buf = self._d.get(slot)
        if buf is None:
            with self._lock:
                if len(self._d) >= self._max:
                    self._d.clear()
                buf = self._d[slot] = alloc(slot[2], dtype=torch.uint8, device=slot[0])
        return buf

    def scratch(self, nbytes: int, device: torch.device, stream) -> torch.Tensor:
        """A buffer of ``nbytes`` for work on ``stream`` (any hashable identity of it, e.g.
        ``streams.stream_key``); its bytes are whatever the last user left."""
        return self._get((device, stream, nbytes, None), torch.empty)

    def zeroed(self, nbytes: int, zero_from: int, zero_bytes: int, device: torch.device, stream) -> torch.Tensor:
        """A buffer whose bytes [zero_from, zero_from + zero_bytes) are zero at rest: allocated
        zeroed once, used only by launches that find and leave that range zero (plans'
        ``zeroed_region``); bytes outside it are theirs to overwrite."""
        return self._get((device, stream, nbytes, (zero_from, zero_bytes)), torch.zeros)

    def zeroed_buffers(self) -> list:
        return [b for k, b in self._d.items() if k[3] is not None]

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


#: The library's scratch for calls that pass no workspace.
POOL = WorkspacePool(64)
caches.register("workspace pool", POOL.clear, lambda: len(POOL._d))
