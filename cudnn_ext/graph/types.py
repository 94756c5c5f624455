"""Value types of the graph layer: data types, tensor descriptors, heuristic modes, policies.

Owns the pydantic boundary objects a user declares (``TensorDesc``) and the small enums the
pipeline is driven by (``DataType``, ``BuildPlanPolicy``; ``HeurMode`` is the heuristics'). Descriptors are frozen
values that hold metadata only (no storage, no device); the graph that created them keeps the
authoritative copy by uid. Nothing here knows about engines or kernels.
"""
from __future__ import annotations

import enum
import weakref
from typing import Any, Optional, Tuple

import torch
from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator, model_validator


class DataType(str, enum.Enum):
    """Element types a descriptor can declare; each maps to one torch dtype (``.torch``)."""

    BFLOAT16 = "bfloat16"
    HALF = "float16"
    FLOAT = "float32"
    DOUBLE = "float64"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    FP8_E4M3 = "float8_e4m3fn"
    FP8_E5M2 = "float8_e5m2"
    FP8_E8M0 = "float8_e8m0fnu"  # MX scale factors
    FP4_E2M1 = "float4_e2m1fn_x2"

    @property
    def torch(self) -> torch.dtype:
        dt = getattr(torch, self.value, None)
        if dt is None:  # an older torch without this dtype
            raise TypeError(f"data_type: {self.name} has no torch dtype in torch {torch.__version__}")
        return dt

    @classmethod
    def of(cls, value: Any) -> "DataType":
        """A DataType from a DataType, a torch dtype or a name (``"bfloat16"``, ``"BFLOAT16"``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, torch.dtype):
            name = str(value).replace("torch.", "")
            for member in cls:
                if member.value == name:
                    return member
            raise TypeError(f"data_type: torch dtype {name} has no DataType; known: {[m.value for m in cls]}")
        if isinstance(value, str):
            for member in cls:
                if value in (member.value, member.name, member.name.lower()):
                    return member
            raise ValueError(f"data_type: unknown name {value!r}; known: {[m.value for m in cls]}")
        raise TypeError(f"data_type: expected a DataType, torch.dtype or str, got {type(value).__name__}")


class BuildPlanPolicy(str, enum.Enum):
    """``HEURISTICS_CHOICE`` builds the first ranked plan that builds; ``ALL`` builds every
    plan (what ``autotune`` needs) and keeps the selected one."""

    HEURISTICS_CHOICE = "HEURISTICS_CHOICE"
    ALL = "ALL"


def row_major_strides(dim: Tuple[int, ...]) -> Tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(dim):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


class TensorDesc(BaseModel):
    """A declared tensor: name, shape (``dim``), ``stride`` in elements, ``data_type``, whether it
    is virtual (not bound to memory) and its ``uid`` (the identity; names are labels).

    Frozen: ``set_output(True)`` records the change in the owning graph and *returns* the
    updated descriptor; lookups by this object, its name or its uid all see the update.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    dim: Tuple[int, ...]
    stride: Tuple[int, ...]
    data_type: DataType
    is_virtual: bool = False
    uid: int

    _owner: Any = PrivateAttr(default=None)  # weakref to the Graph that declared it

    @field_validator("data_type", mode="before")
    @classmethod
    def _coerce_dtype(cls, v):
        return DataType.of(v)

    @field_validator("dim", "stride", mode="before")
    @classmethod
    def _coerce_ints(cls, v, info):
        if isinstance(v, torch.Size):
            v = tuple(v)
        if not isinstance(v, (tuple, list)):
            raise TypeError(f"{info.field_name}: expected a tuple of ints, got {type(v).__name__}")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int):
                raise TypeError(f"{info.field_name}: expected ints, got {v!r}")
        return tuple(int(x) for x in v)

    @model_validator(mode="after")
    def _check_geometry(self):
        if len(self.dim) != len(self.stride):
            raise ValueError(f"tensor {self.name!r}: dim {self.dim} and stride {self.stride} must have the same rank")
        if any(d < 0 for d in self.dim) or any(s < 0 for s in self.stride):
            raise ValueError(f"tensor {self.name!r}: dims and strides must be >= 0, got dim {self.dim}, "
                             f"stride {self.stride}")
        return self

    # ----------------------------------------------------------------- conveniences
    @property
    def dtype(self) -> torch.dtype:
        return self.data_type.torch

    @property
    def graph(self):
        return self._owner() if self._owner is not None else None

    def set_output(self, is_output: bool = True) -> "TensorDesc":
        """Mark this tensor as a graph output (non-virtual): its buffer is bound at execute."""
        graph = self.graph
        if graph is None:
            raise RuntimeError(f"tensor {self.name!r}: set_output needs the graph that declared it")
        return graph._set_virtual(self.uid, not is_output)

    def meta(self) -> torch.Tensor:
        """A storage-less ``meta`` tensor with this geometry: how the contract sees a descriptor."""
        return torch.empty_strided(self.dim, self.stride, dtype=self.dtype, device="meta")

    def _bind_owner(self, graph) -> "TensorDesc":
        self._owner = weakref.ref(graph)
        return self

    def __repr__(self) -> str:
        v = ", virtual" if self.is_virtual else ""
        return f"TensorDesc({self.name!r}, uid={self.uid}, dim={self.dim}, stride={self.stride}, {self.data_type.value}{v})"


def data_type_or_none(v: Optional[Any]) -> Optional[DataType]:
    return None if v is None else DataType.of(v)
