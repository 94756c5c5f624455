"""Expected quantized-D outputs for the GPU tests: poisoned output buffers, what the
reference's quantizers write into them for an fp32 D (rows below the last offset and the
scale bytes covering them; the rest keeps the poison), and a byte-for-byte comparison that
names the first differing byte."""
import torch

from cudnn_ext.quant.sf_layout import ATOM_ELEMS, empty_sf, sf_numel, sf_shape, storage_of
from cudnn_ext.reference.blockscaled import quantize_d_col, quantize_d_row

POISON = 0xFF  # e4m3 / e5m2 -NaN, e8m0 NaN: never a value the quantizer writes by accident


def poisoned(m, two_n, dtype=torch.float8_e4m3fn):
    """D_row and D_col (M, 2N) of ``dtype`` and SFD_row and SFD_col in the scale layout, every
    byte POISON."""
    d = lambda: torch.full((m, two_n), POISON, dtype=torch.uint8, device="cuda").view(dtype)  # noqa: E731
    return dict(d_row=d(), d_col=d(),
                sfd_row=empty_sf(m, two_n // 32, dtype=torch.float8_e8m0fnu, device="cuda", fill=POISON),
                sfd_col=empty_sf(two_n, m // 32, dtype=torch.float8_e8m0fnu, device="cuda", fill=POISON))


def expected(x, nc, ends, last, discrete):
    """What the reference engine's ``finish_outputs`` writes into poisoned outputs: rows
    below ``last``, the SFD_row row atoms and SFD_col k atoms (or per-expert regions) that
    cover them; everything else keeps the poison."""
    m, two_n = x.shape
    want = poisoned(m, two_n)
    q_row, sf_row = quantize_d_row(x, nc)
    q_col, sf_col = quantize_d_col(x, nc, padded_offsets=ends, discrete_col_sfd=discrete)
    want["d_row"][:last] = q_row[:last]
    want["d_col"][:last] = q_col[:last]
    want["sfd_row"][:, :, :last // 128] = sf_row[:, :, :last // 128]
    if not discrete:
        want["sfd_col"][:, :, :, :, :last // 128] = sf_col[:, :, :, :, :last // 128]
    else:
        dst = storage_of(want["sfd_col"]).reshape(-1)
        src = storage_of(sf_col).reshape(-1)
        rmn, start = sf_shape(two_n, 1)[2], 0
        for end in ends:
            if end > start:
                base = (start // 128) * rmn * ATOM_ELEMS
                n_el = sf_numel(two_n, (end - start) // 32)
                dst[base:base + n_el] = src[base:base + n_el]
            start = end
    return want


def assert_bytes_equal(got, want, name):
    g = storage_of(got).reshape(-1).view(torch.uint8) if got.dim() == 6 else got.view(torch.uint8)
    w = storage_of(want).reshape(-1).view(torch.uint8) if want.dim() == 6 else want.view(torch.uint8)
    bad = (g != w).nonzero()
    assert bad.numel() == 0, (f"{name}: {bad.shape[0]} bytes differ, first at {bad[:4].tolist()}: "
                              f"got {g[tuple(bad[0])].item():#x}, want {w[tuple(bad[0])].item():#x}")
