"""Stream normalization: whatever the caller passed as ``current_stream`` -> a torch stream."""
from __future__ import annotations

import contextlib

import torch


#: raw handles of the legacy default stream: the null stream (0, torch's default stream, what
#: ``torch.cuda.current_stream().cuda_stream`` is there) and ``cudaStreamLegacy`` (1)
_NULL_HANDLES = (0, 1)


def as_torch_stream(current_stream, device: torch.device):
    """``None`` -> the device's current stream; a torch stream as is; a raw handle (int,
    ``cuda.CUstream``) -> ``torch.cuda.ExternalStream``, the null handle -> the default stream.
    CPU devices have no stream (None)."""
    if device.type != "cuda":
        return None
    if current_stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(current_stream, torch.cuda.Stream):
        return current_stream
    handle = current_stream if isinstance(current_stream, int) else int(current_stream)
    if handle in _NULL_HANDLES:
        # torch.cuda.ExternalStream(0) is not the null stream: torch reads a zero pointer as
        # "none given" and hands out a fresh pool stream, unordered with the default stream
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(handle, device=device)


_raw_current = getattr(torch._C, "_cuda_getCurrentRawStream", None)
#: torch.cuda.is_current_stream_capturing's C function, without its Python layer (the eager
#: op asks it every call)
_raw_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                         lambda: torch.cuda.is_current_stream_capturing())
#: the current CUDA device's index without torch.cuda's Python layers (-1 on CPU-only torch)
current_device_index = getattr(torch._C, "_cuda_getDevice", lambda: -1)


def launch_stream(current_stream, device: torch.device):
    """Like :func:`as_torch_stream`, but None when the work can go to the current stream as
    is: no stream given and the tensors on the current device (then engines launch on the
    current stream's raw handle and no stream context is entered; a Stream object plus a
    context cost several microseconds per call on a slow host). Otherwise the torch stream."""
    if current_stream is None and device.type == "cuda" and device.index == current_device_index():
        return None
    return as_torch_stream(current_stream, device)


def stream_key(stream, device: torch.device):
    """A hashable identity of the stream work goes to (None: the current stream's handle)."""
    if stream is not None:
        return stream.cuda_stream
    return current_stream_handle(device.index) if device.type == "cuda" else None


def current_stream_handle(device_index: int) -> int:
    """Raw handle of ``device_index``'s current torch stream, without building a Stream object:
    ``torch.cuda.current_stream`` costs about 5.4 us of host time per call on the H200's host
    against 0.1 us for this (measured with ``benchmarks/bench_host_overhead.py``), and the eager
    op pays it on every call. Needs CUDA initialized (true once a CUDA tensor exists)."""
    if _raw_current is not None:
        return _raw_current(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def capturing(is_cuda: bool) -> bool:
    """Whether work for a CUDA device (``is_cuda``) is being captured into a CUDA graph.
    Scratch taken then must be a fresh allocation from the graph's pool, owned by that
    graph: a cached buffer would be shared by its replays with eager calls and with other
    graphs (graphs captured on torch's shared default capture stream too). The one rule for
    the class API's and the torch op's workspaces. Takes a flag, not a device: callers on
    the hot path have it already (``torch.device.type`` costs ~0.25 us per lookup on this
    project's CPU box, against ~0.03 us for an int compare), and CPU-only torch raises on
    the capture query, so it is asked only for CUDA."""
    return is_cuda and _raw_capturing()


def on_stream(stream):
    """Context under which allocations and fills are ordered on ``stream``."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
