"""The variant pack: binding a caller's tensors to a built plan's declared slots.

Owns the per-call step between ``Graph.execute(variant_pack, ...)`` and an engine: resolving
keys (a descriptor, its name or its uid), checking each bound tensor against its declaration
(dtype, rank, shape, strides of every dim longer than 1, device, 16-B pointer alignment; the
token count M may differ from the declared one when the plan allows it, and must then be the
same on every M-carrying slot and a multiple of the node's ``m_aligned``), and producing the
canonical pack engines read (``cudnn_ext.problem.SLOTS`` names, trailing unit dims dropped).
Metadata only: it never allocates device memory and never reads tensor data.

Scale-factor slots (``sfa``, ``sfb``, ``sfd_row``, ``sfd_col``) carry their geometry
(:class:`cudnn_ext.quant.sf_layout.SfGeometry`, the contract's table) instead of a fixed
shape: once M is known from the M-carrying slots, the expected 6-D layout is re-derived at
that M and the tensor is judged by the contract's own rule (``as_sf_6d``: the 6-D view, or a
contiguous buffer of exactly the packed size), so a flat packed buffer binds too. The
canonical pack holds their 6-D view.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch

from ..quant.sf_layout import SfGeometry
from .types import TensorDesc

#: Rank each slot has in the canonical pack engines receive (``cudnn_ext.problem.SLOTS``).
CANONICAL_RANK = {"a": 2, "b": 3, "b_ptrs": 1, "c": 2, "d_row": 2, "padded_offsets": 1, "alpha": 1,
                  "beta": 1, "prob": 1, "dprob": 1, "dbias": 2, "activation": 2, "d_col": 2, "amax": 2,
                  "sfb_ptrs": 1, "norm_const": 1}


def _fmt(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


@dataclass(frozen=True)
class SlotSpec:
    """What one slot was declared as."""

    slot: str
    uid: int
    name: str
    dtype: torch.dtype
    dim: Tuple[int, ...]
    stride: Tuple[int, ...]
    m_leading: bool  # dim 0 is the token count M
    align: int = 16
    #: scale-factor slots: the layout's geometry with M symbolic (shape judged at the bound M)
    sf: Optional[SfGeometry] = None

    def label(self) -> str:
        return f"tensor {self.name!r} (uid {self.uid}, port {self.slot})"


class VariantPackBinder:
    """Binds ``{descriptor | name | uid: tensor}`` to the canonical slot pack of one plan."""

    def __init__(self, specs: Sequence[SlotSpec], device: torch.device, *, dynamic_m: bool, owner: Any = None,
                 m_aligned: int = 256):
        # one descriptor may feed several input ports (alpha and beta from one tensor): the
        # tensor bound to its uid fills every slot of that uid (self._order); specs keys a
        # uid's first slot, for lookups and messages
        self.specs: Dict[int, SlotSpec] = {}
        for s in specs:
            self.specs.setdefault(s.uid, s)
        self.device = device
        self.dynamic_m = dynamic_m
        self.owner = owner
        self.m_aligned = m_aligned  # the validated problem's: a bound M is a multiple of it
        self._by_name: Dict[str, list] = {}
        for s in specs:
            uids = self._by_name.setdefault(s.name, [])
            if s.uid not in uids:  # a shared descriptor is one name, one uid
                uids.append(s.uid)
        # binding order, fixed by the specs: M-carrying slots first (they set M), then the rest
        self._order = [s for s in specs if s.m_leading] + [s for s in specs if not s.m_leading]

    # ------------------------------------------------------------------ keys
    def resolve(self, key) -> SlotSpec:
        if isinstance(key, TensorDesc):
            g = key.graph
            if self.owner is not None and g is not None and g is not self.owner:
                raise ValueError(f"variant pack: tensor {key.name!r} (uid {key.uid}) belongs to another graph")
            uid = key.uid
        elif isinstance(key, bool):
            raise TypeError(f"variant pack: keys are descriptors, names or uids, got {key!r}")
        elif isinstance(key, int):
            uid = key
        elif isinstance(key, str):
            uids = self._by_name.get(key)
            if not uids:
                raise KeyError(f"variant pack: no tensor named {key!r}; declared: {sorted(self._by_name)}")
            if len(uids) > 1:
                raise KeyError(f"variant pack: the name {key!r} is ambiguous (uids {uids}); key by uid or descriptor")
            uid = uids[0]
        else:
            raise TypeError(f"variant pack: keys are descriptors, names or uids, got {type(key).__name__}")
        spec = self.specs.get(uid)
        if spec is None:
            raise KeyError(f"variant pack: no bound tensor has uid {uid}; bound uids: "
                           f"{ {s.uid: s.name for s in self.specs.values()} }")
        return spec

    # ------------------------------------------------------------------ binding
    def bind(self, variant_pack: Mapping) -> Dict[str, torch.Tensor]:
        if not isinstance(variant_pack, Mapping):
            raise TypeError(f"variant pack: expected a mapping of descriptor/name/uid -> tensor, got "
                            f"{type(variant_pack).__name__}")
        by_uid: Dict[int, torch.Tensor] = {}
        for key, t in variant_pack.items():
            spec = self.resolve(key)
            if spec.uid in by_uid and by_uid[spec.uid] is not t:
                raise ValueError(f"variant pack: {spec.label()} is bound twice to different tensors")
            by_uid[spec.uid] = t
        missing = [s for s in self.specs.values() if s.uid not in by_uid]
        if missing:
            raise ValueError("variant pack: missing a tensor for " + ", ".join(s.label() for s in missing))
        m: Optional[int] = None
        m_from = None
        pack: Dict[str, torch.Tensor] = {}
        for spec in self._order:
            t = by_uid[spec.uid]
            if spec.sf is not None:
                pack[spec.slot] = self._check_sf(spec, t, m)  # M-carrying slots bind first
                continue
            self._check(spec, t)
            if spec.m_leading:
                if m is None:
                    m, m_from = t.shape[0], spec
                    self._check_m(spec, m)
                elif t.shape[0] != m:
                    raise ValueError(f"variant pack: {spec.label()} has M = {t.shape[0]} rows but "
                                     f"{m_from.label()} has M = {m}; every M-carrying tensor needs the same M")
            while t.dim() > CANONICAL_RANK[spec.slot]:
                t = t.squeeze(-1)
            pack[spec.slot] = t
        return pack

    def _check_sf(self, spec: SlotSpec, t, m: int) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"variant pack: {spec.label()}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != spec.dtype:
            raise TypeError(f"variant pack: {spec.label()}: dtype must be {_fmt(spec.dtype)} as declared, "
                            f"got {_fmt(t.dtype)}")
        view = spec.sf.view(t, m, name=f"variant pack: {spec.label()}")
        self._check_place(spec, t)
        return view

    def _check_place(self, spec: SlotSpec, t: torch.Tensor) -> None:
        dev = self.device
        if t.device.type != dev.type or (dev.index is not None and t.device.index != dev.index):
            raise ValueError(f"variant pack: {spec.label()}: must be on {dev} (the plan's device), got {t.device}")
        if t.numel() and t.data_ptr() % spec.align:
            raise ValueError(f"variant pack: {spec.label()}: data pointer must be {spec.align}-byte aligned, "
                             f"got address 0x{t.data_ptr():x}")

    def _check_m(self, spec: SlotSpec, m: int) -> None:
        if not self.dynamic_m and m != spec.dim[0]:
            raise ValueError(f"variant pack: {spec.label()} has M = {m} rows, declared {spec.dim[0]}; this graph "
                             "was built with dynamic_m=False")
        if m % self.m_aligned:
            raise ValueError(f"variant pack: {spec.label()}: M (rows) must be a multiple of {self.m_aligned}, "
                             f"got M = {m} (m_aligned = {self.m_aligned})")

    def _check(self, spec: SlotSpec, t) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"variant pack: {spec.label()}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != spec.dtype:
            raise TypeError(f"variant pack: {spec.label()}: dtype must be {_fmt(spec.dtype)} as declared, "
                            f"got {_fmt(t.dtype)}")
        shape = tuple(t.shape)
        if len(shape) != len(spec.dim):
            raise ValueError(f"variant pack: {spec.label()}: shape must be {spec.dim} as declared "
                             f"(rank {len(spec.dim)}), got {shape}")
        lo = 1 if spec.m_leading else 0
        if shape[lo:] != spec.dim[lo:]:
            want = ("(M,) + " + str(spec.dim[1:])) if spec.m_leading else str(spec.dim)
            raise ValueError(f"variant pack: {spec.label()}: shape must be {want} as declared, got {shape}")
        for i, (size, st) in enumerate(zip(shape, t.stride())):
            if size > 1 and st != spec.stride[i]:
                raise ValueError(f"variant pack: {spec.label()}: stride must be {spec.stride} as declared "
                                 f"(dims of extent > 1 must match), got {tuple(t.stride())}")
        self._check_place(spec, t)
