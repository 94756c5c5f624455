"""Plan serialization: a built graph's plan as bytes, and back, without heuristics.

Owns the binary format and its compatibility checks. Layout (little-endian)::

    MAGIC (16 bytes, b"CUDNN_EXT_PLAN\\0\\0") | format version (u32) | header length (u64) | header

The header is the UTF-8 JSON of :class:`PlanHeader` (pydantic): the graph's :class:`GraphSpec`
(tensors with uids, the node and its attributes), the engine's id and name and its knobs, the
device the plan was built for (type, name, compute capability), the workspace size, and the
versions of cudnn_ext, torch and the CuTe DSL. Deserializing rebuilds the recorded (engine,
knobs) directly (the persistent compile cache makes that cheap after the first time) and
checks the workspace size is unchanged.

With ``serialize_plan(graph, include_kernels=True)`` the header also has ``kernels``: the
persistent compile-cache entries (``runtime.compile_cache``) of the kernels the plan has
compiled or loaded, each its key, size, SHA-256 and base64 object bytes. Deserializing checks
every entry (base64, size, checksum) and installs it into the local cache before the plan is
built, which then loads instead of compiling; an entry this process would not build (another
DSL version, architecture, source, ...) is skipped, and that kernel compiles as usual. Without
``include_kernels`` the header has no ``kernels`` field.

Refused with :class:`PlanFormatError` (a ``ValueError``): a wrong magic, another format
version, another cudnn_ext version, a CUDA plan on a different GPU architecture or in a
process without CUDA, an unknown engine id or a renamed engine, a corrupt kernel entry.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.metadata as md
import json
import struct
from typing import Dict, List, Optional, Tuple, Union

import torch
from pydantic import BaseModel, ConfigDict, Field

from ..version import __version__
from .spec import GraphSpec

MAGIC = b"CUDNN_EXT_PLAN\0\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<IQ")

KnobValue = Union[bool, int, float, str, None, List]


class PlanFormatError(ValueError):
    """The bytes are not a plan this library, version and device can rebuild. For a corrupt
    part of the payload, ``argument`` names it (e.g. ``kernels[0].data``), ``value`` is what
    was found (shortened) and ``rule`` the rule it breaks; otherwise they are None."""

    def __init__(self, message: str, *, argument: Optional[str] = None, value=None,
                 rule: Optional[str] = None):
        super().__init__(message)
        self.argument, self.value, self.rule = argument, value, rule


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


class KernelEntry(BaseModel):
    """One carried compile-cache entry: its key, and the object file as base64."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: Dict[str, Union[int, str, None]]
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    data: str


class PlanHeader(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int
    library_versions: Dict[str, str]
    device: DeviceInfo
    graph: GraphSpec
    plan: EngineRef
    workspace_size: int
    #: absent unless serialized with include_kernels (the default payload is unchanged)
    kernels: Optional[List[KernelEntry]] = None


def plan_header_type():
    """The pydantic model of the header."""
    return PlanHeader


def _tuplify(v):
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def _kernel_entries(plan) -> List[KernelEntry]:
    """The compile-cache entries of the kernels ``plan`` has used that are still on disk (none
    with the disk cache off: then nothing was stored)."""
    from ..runtime import compile_cache

    out = []
    for digest in plan.kernel_digests():
        got = compile_cache.entry_of(digest)
        if got is None:  # deleted since (a cleared cache): the receiver compiles that kernel
            continue
        key, data = got
        out.append(KernelEntry(key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                               data=base64.b64encode(data).decode("ascii")))
    return out


def serialize_plan(graph, include_kernels: bool = False) -> bytes:
    """The built plan of ``graph`` as bytes; with ``include_kernels`` also the compile-cache
    entries of its kernels (see the module docstring)."""
    if not isinstance(include_kernels, bool):
        raise TypeError(f"include_kernels: expected a bool, got {type(include_kernels).__name__}")
    plan = graph.execution_plan
    header = plan_header_type()(
        format=FORMAT_VERSION, library_versions=library_versions(), device=DeviceInfo.of(graph.device),
        graph=graph.spec(), plan=EngineRef(engine_id=plan.engine_id, engine_name=plan.engine_name,
                                           knobs=list(plan.knobs.as_dict().items())),
        workspace_size=plan.workspace_size,
        kernels=_kernel_entries(plan) if include_kernels else None,
    )
    body = header.model_dump_json(exclude={"kernels"} if header.kernels is None else None).encode("utf-8")
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


def _short(v: str, n: int = 40) -> str:
    return v if len(v) <= n else v[:n] + f"... ({len(v)} chars)"


def carried_kernels(header) -> List[Tuple[dict, bytes]]:
    """(key, object bytes) of each kernel entry the header carries (none without ``kernels``);
    raises :class:`PlanFormatError` naming the entry when its data is not base64 or does not
    match its size and checksum."""
    out = []
    for i, k in enumerate(header.kernels or ()):
        arg = f"kernels[{i}].data"
        try:
            data = base64.b64decode(k.data.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            raise PlanFormatError(f"deserialize_plan: {arg} is not base64 ({exc}); the payload is corrupt",
                                  argument=arg, value=_short(k.data), rule="base64 (RFC 4648)") from None
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != k.size or digest != k.sha256:
            raise PlanFormatError(
                f"deserialize_plan: {arg} decodes to {len(data)} bytes with SHA-256 {digest}, the entry "
                f"records {k.size} bytes with SHA-256 {k.sha256}; the payload is corrupt",
                argument=arg, value=digest, rule=f"size {k.size} and SHA-256 {k.sha256}")
        out.append((dict(k.key), data))
    return out


def install_kernels(entries) -> int:
    """Install carried (key, bytes) entries into the local compile cache; returns how many
    were installed. An entry this process would not build, or any entry with the disk cache
    off, is skipped (its kernel then compiles as usual)."""
    from ..runtime import compile_cache

    return sum(bool(compile_cache.install(key, data)) for key, data in entries)
