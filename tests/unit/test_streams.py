"""``runtime.streams``: a raw stream handle from the caller -> the torch stream work goes to."""
import pytest
import torch

from cudnn_ext.runtime import streams


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's stream constructors replaced by recorders (no GPU needed)."""
    made = []
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: ("default", device))

    def external(handle, device=None):
        made.append(handle)
        return ("external", handle)

    monkeypatch.setattr(torch.cuda, "ExternalStream", external)
    return made


@pytest.mark.parametrize("handle", [0, 1])
def test_null_handles_are_the_default_stream(fake_cuda, handle):
    """torch.cuda.ExternalStream(0) would be a fresh pool stream, not the null stream: the
    vendor's tests pass ``cuda.CUstream(torch.cuda.current_stream().cuda_stream)``, which is
    0 on the default stream, and their work must stay ordered with it."""
    dev = torch.device("cuda", 0)
    assert streams.as_torch_stream(handle, dev) == ("default", dev)
    assert fake_cuda == []


def test_null_custream_is_the_default_stream(fake_cuda):
    cuda = pytest.importorskip("cuda.bindings.driver")
    dev = torch.device("cuda", 0)
    assert streams.as_torch_stream(cuda.CUstream(0), dev) == ("default", dev)


def test_other_handles_are_external_streams(fake_cuda):
    dev = torch.device("cuda", 0)
    assert streams.as_torch_stream(0x7F00_1234, dev) == ("external", 0x7F00_1234)
    assert streams.as_torch_stream(2, dev) == ("external", 2)  # cudaStreamPerThread
    assert fake_cuda == [0x7F00_1234, 2]
