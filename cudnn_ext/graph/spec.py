"""``GraphSpec``: everything that defines a graph (descriptors and nodes, no plan, no data), the
graph's serial form; pydantic at the boundary."""
from __future__ import annotations

from typing import List, Optional

from pydantic import BaseModel, ConfigDict

from .nodes import Node
from .types import DataType, TensorDesc


class GraphSpec(BaseModel):
    """Everything that defines a graph (no plan, no tensors' data): its serial form."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    io_data_type: Optional[DataType] = None
    compute_data_type: DataType = DataType.FLOAT
    device: str
    dynamic_m: bool = True
    tensors: List[TensorDesc]
    nodes: List[Node]
