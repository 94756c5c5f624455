"""The reference engine's pointer-table gather (``cudnn_ext.kernels.pointer_gather``) on the device:
every expert with rows copied bit for bit (whole 8-byte words and a tail), every expert without
rows skipped with its row zero (its pointer null or garbage: reading it would fault), no host
sync under torch.cuda.set_sync_debug_mode("error"), the current stream honoured, and a CUDA
graph that captured the gather reads the table's and the offsets' new values on replay."""
import pytest
import torch

from cudnn_ext.kernels.pointer_gather import gather_pointer_table

pytestmark = pytest.mark.gpu

GARBAGE = 0xDEAD1  # unmapped and misaligned: the kernel must never dereference it


def _buffers(nbytes, count=5, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=g) for _ in range(count)]


def _expected(bufs, ends):
    rows, start = [], 0
    for buf, end in zip(bufs, ends):
        rows.append(buf if end > start else torch.zeros_like(buf))
        start = end
    return torch.stack(rows)


@pytest.mark.parametrize("nbytes", [3, 16, 1000 * 8 + 5, 1 << 20])
def test_gather_copies_bit_for_bit_and_skips_experts_without_rows(nbytes):
    bufs = _buffers(nbytes)
    ends = [256, 256, 512, 512, 768]  # experts 1 and 3 have no rows
    table = torch.tensor([bufs[0].data_ptr(), 0, bufs[2].data_ptr(), GARBAGE, bufs[4].data_ptr()],
                         dtype=torch.int64, device="cuda")
    got = gather_pointer_table(table, nbytes, torch.tensor(ends, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert got.shape == (5, nbytes) and got.dtype == torch.uint8
    assert torch.equal(got, _expected(bufs, ends))


def test_gather_never_syncs_honours_the_stream_and_replays_new_values():
    nbytes = 4096 + 8
    bufs, other = _buffers(nbytes, seed=1), _buffers(nbytes, seed=2)
    ends_a, ends_b = [256, 256, 512, 512, 768], [0, 512, 512, 768, 1024]
    table = torch.tensor([bufs[0].data_ptr(), 0, bufs[2].data_ptr(), GARBAGE, bufs[4].data_ptr()],
                         dtype=torch.int64, device="cuda")
    table_b = torch.tensor([GARBAGE, other[1].data_ptr(), 0, other[3].data_ptr(), other[4].data_ptr()],
                           dtype=torch.int64, device="cuda")
    ends = torch.tensor(ends_a, dtype=torch.int32, device="cuda")
    new_ends = torch.tensor(ends_b, dtype=torch.int32, device="cuda")
    gather_pointer_table(table, nbytes, ends)  # warm: the first call compiles
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            got = gather_pointer_table(table, nbytes, ends)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got, _expected(bufs, ends_a))

    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        captured = gather_pointer_table(table, nbytes, ends)
    torch.cuda.current_stream().wait_stream(s)
    table.copy_(table_b)  # new pointers and row counts in the same buffers
    ends.copy_(new_ends)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, _expected(other, ends_b))
