"""Plan serialization: a built graph's plan as bytes, and back, without heuristics.

Owns the binary format and its compatibility checks. Layout (little-endian)::

    MAGIC (16 bytes, b"CUDNN_EXT_PLAN\\0\\0") | format version (u32) | header length (u64) | header

The header is the UTF-8 JSON of :class:`PlanHeader` (pydantic): the graph's :class:`GraphSpec`
(tensors with uids, the node and its attributes), the engine's id and name and its knobs, the
device the plan was built for (type, name, compute capability), the workspace size, and the
versions of cudnn_ext, torch and the CuTe DSL. No compiled binary is stored: deserializing
rebuilds the recorded (engine, knobs) directly (an engine's own compile cache makes that cheap
after the first time) and checks the workspace size is unchanged.

Refused with :class:`PlanFormatError` (a ``ValueError``): a wrong magic, another format
version, another cudnn_ext version, a CUDA plan on a different GPU architecture or in a
process without CUDA, an unknown engine id or a renamed engine.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import struct
from typing import Dict, List, Optional, Tuple, Union

import torch
from pydantic import BaseModel, ConfigDict

from ..version import __version__
from .spec import GraphSpec

MAGIC = b"CUDNN_EXT_PLAN\0\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<IQ")

KnobValue = Union[bool, int, float, str, None, List]


class PlanFormatError(ValueError):
    """The bytes are not a plan this library, version and device can rebuild."""


class DeviceInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    name: str = ""
    capability: Optional[Tuple[int, int]] = None

    @classmethod
    def of(cls, device: torch.device) -> "DeviceInfo":
        if device.type == "cuda":
            idx = device.index if device.index is not None else torch.cuda.current_device()
            return cls(type="cuda", name=torch.cuda.get_device_name(idx),
                       capability=tuple(torch.cuda.get_device_capability(idx)))
        return cls(type=device.type)

    def describe(self) -> str:
        if self.capability is None:
            return self.type
        return f"{self.type} sm_{self.capability[0]}{self.capability[1]} ({self.name})"


class EngineRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    engine_id: int
    engine_name: str
    knobs: List[Tuple[str, KnobValue]]


def library_versions() -> Dict[str, str]:
    out = {"cudnn_ext": __version__, "torch": torch.__version__}
    try:
        out["nvidia-cutlass-dsl"] = md.version("nvidia-cutlass-dsl")
    except md.PackageNotFoundError:
        pass
    return out


class PlanHeader(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int
    library_versions: Dict[str, str]
    device: DeviceInfo
    graph: GraphSpec
    plan: EngineRef
    workspace_size: int


def plan_header_type():
    """The pydantic model of the header."""
    return PlanHeader


def _tuplify(v):
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def serialize_plan(graph) -> bytes:
    plan = graph.execution_plan
    header = plan_header_type()(
        format=FORMAT_VERSION, library_versions=library_versions(), device=DeviceInfo.of(graph.device),
        graph=graph.spec(), plan=EngineRef(engine_id=plan.engine_id, engine_name=plan.engine_name,
                                           knobs=list(plan.knobs.as_dict().items())),
        workspace_size=plan.workspace_size,
    )
    body = header.model_dump_json().encode("utf-8")
    return MAGIC + _PREFIX.pack(FORMAT_VERSION, len(body)) + body


def read_header(data: bytes):
    """Parse and return the header (no compatibility checks beyond the framing)."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise TypeError(f"deserialize_plan: expected bytes, got {type(data).__name__}")
    if not data.startswith(MAGIC):
        raise PlanFormatError(f"deserialize_plan: not a cudnn_ext plan (magic {data[:16]!r}, expected {MAGIC!r})")
    if len(data) < len(MAGIC) + _PREFIX.size:
        raise PlanFormatError("deserialize_plan: truncated plan (no header length)")
    fmt, n = _PREFIX.unpack_from(data, len(MAGIC))
    if fmt != FORMAT_VERSION:
        raise PlanFormatError(f"deserialize_plan: plan format version {fmt}, this cudnn_ext reads version "
                              f"{FORMAT_VERSION}; re-create the plan with this version")
    start = len(MAGIC) + _PREFIX.size
    body = data[start:start + n]
    if len(body) != n:
        raise PlanFormatError(f"deserialize_plan: truncated plan (header of {n} bytes, {len(body)} present)")
    try:
        return plan_header_type().model_validate(json.loads(body.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanFormatError(f"deserialize_plan: malformed header: {exc}") from exc


def check_compatible(header) -> torch.device:
    """The device the plan targets here; raises :class:`PlanFormatError` if this library
    version or device cannot rebuild it."""
    theirs = header.library_versions.get("cudnn_ext")
    if theirs != __version__:
        raise PlanFormatError(f"deserialize_plan: plan was made by cudnn_ext {theirs}, this is {__version__}; "
                              "engine ids and knobs are only stable within one version: re-create the plan")
    dev = header.device
    device = torch.device(header.graph.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise PlanFormatError(f"deserialize_plan: plan was built for {dev.describe()}, but this process has "
                                  "no CUDA device")
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx >= torch.cuda.device_count():
            raise PlanFormatError(f"deserialize_plan: plan targets {device}, this process has "
                                  f"{torch.cuda.device_count()} CUDA device(s)")
        here = DeviceInfo.of(torch.device("cuda", idx))
        if here.capability != dev.capability:
            raise PlanFormatError(f"deserialize_plan: plan was built for {dev.describe()}, this device is "
                                  f"{here.describe()}; re-create the plan on this GPU")
    elif dev.type != device.type:
        raise PlanFormatError(f"deserialize_plan: inconsistent header (device {dev.type}, graph on {device})")
    return device


def recorded_knobs(header, engine):
    """The engine knobs the header recorded, loaded by the engine (its own config type)."""
    try:
        return engine.knobs_from_dict({k: _tuplify(v) for k, v in header.plan.knobs})
    except (TypeError, ValueError) as exc:
        raise PlanFormatError(f"deserialize_plan: the {engine.name} knobs do not load: {exc}") from None
