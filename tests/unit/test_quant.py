"""Number formats, the 6-D scale-factor layout and the MXFP8 / NVFP4 helpers (CPU, fast).

Expected values are hand-computed (comments show the arithmetic) or come from an independent
route (bit patterns, enumeration of a format's grid), never from the code under test.
Reproduce a failure with: .venv/bin/python -m pytest tests/unit/test_quant.py -q -k <name>
"""
import math
import struct

import pytest
import torch

from cudnn_ext.quant import (as_sf_6d, dequantize, empty_sf, quantize_mxfp8, quantize_nvfp4,
                             sf_index, sf_offset, sf_shape, storage_of, swizzle_sf, unswizzle_sf)
from cudnn_ext.quant import formats as F

E8M0 = torch.float8_e8m0fnu
E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
NAN = float("nan")
INF = float("inf")


def f32(x: float) -> float:
    """Round a Python float to fp32 (independently of torch)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def codes(t):
    return t.view(torch.uint8).tolist()


# ------------------------------------------------------------------------------------------
# formats
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, code", [
    (1.0, 127),                       # exact power of two keeps its exponent
    (f32(1.0 + 2 ** -23), 128),       # one ulp above rounds up
    (0.75, 127),                      # 2^-1 < 0.75 <= 2^0
    (0.5, 126),
    (3.0, 129),                       # 2^1 < 3 <= 2^2
    (0.0, 0),                         # no zero in e8m0: smallest scale 2^-127
    (2.0 ** -127, 0),                 # fp32 subnormal, exactly representable
    (1.5 * 2.0 ** -127, 1),           # subnormal above 2^-127 rounds up to 2^-126
    (2.0 ** -140, 0),
    (2.0 ** -126, 1),
    (2.0 ** 127, 254),
    (1.5 * 2.0 ** 127, 254),          # would be 2^128: satfinite
    (INF, 254),                       # satfinite
    (NAN, 255),
    (-4.0, 129),                      # sign ignored
])
def test_e8m0_round_up(value, code):
    assert codes(F.encode_e8m0_roundup(torch.tensor([value])))[0] == code


def test_e8m0_decode_all_codes():
    c = torch.arange(256, dtype=torch.uint8).view(E8M0)
    v = F.decode_e8m0(c)
    assert v.dtype == torch.float32
    for i in range(255):
        assert v[i].item() == 2.0 ** (i - 127), i
    assert math.isnan(v[255].item())
    # the encoder inverts the decoder on every finite code
    assert codes(F.encode_e8m0_roundup(v[:255])) == list(range(255))


E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_decode_all_codes():
    v = F.decode_e2m1(torch.arange(16, dtype=torch.uint8)).tolist()
    assert v[:8] == E2M1_GRID
    assert v[8:] == [-x for x in E2M1_GRID]
    assert math.copysign(1.0, v[8]) == -1.0


@pytest.mark.parametrize("value, code", [
    (0.25, 0), (0.2500001, 1), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6),
    (5.0001, 7), (0.7499, 1), (6.0, 7), (7.0, 7), (1e30, 7), (INF, 7),
    (-0.0, 8), (-3.5, 14), (-INF, 15), (NAN, 0),
])
def test_e2m1_round_nearest_even_saturating(value, code):
    # ties (the midpoints of the grid) go to the even code: 0.25->0.0(c0), 0.75->1.0(c2),
    # 1.25->1.0(c2), 1.75->2.0(c4), 2.5->2.0(c4), 3.5->4.0(c6), 5.0->4.0(c6)
    assert F.encode_e2m1(torch.tensor([value])).tolist() == [code]


def test_e2m1_grid_round_trip():
    c = torch.arange(16, dtype=torch.uint8)
    assert F.encode_e2m1(F.decode_e2m1(c)).tolist() == c.tolist()


def _fp8_positive_finite(dtype):
    c = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float64)
    v = sorted({x for x in c.tolist() if math.isfinite(x) and x >= 0})
    return v


@pytest.mark.parametrize("dtype, vmax", [(E4M3, 448.0), (E5M2, 57344.0)])
def test_fp8_round_nearest_even_at_every_tie(dtype, vmax):
    grid = _fp8_positive_finite(dtype)
    assert grid[-1] == vmax
    lo, hi = torch.tensor(grid[:-1]), torch.tensor(grid[1:])
    mid = (lo + hi) / 2                                  # exact in fp32 (few mantissa bits)
    got = F.encode_fp8(mid.float(), dtype).to(torch.float64)
    lo_code = torch.tensor(grid[:-1], dtype=torch.float64).float().to(dtype).view(torch.uint8)
    expect = torch.where(lo_code.to(torch.int32) % 2 == 0, lo, hi)
    assert torch.equal(got, expect)
    # just off the tie rounds to the nearer neighbour
    assert torch.equal(F.encode_fp8(torch.nextafter(mid.float(), lo.float()), dtype).double(), lo)
    assert torch.equal(F.encode_fp8(torch.nextafter(mid.float(), hi.float()), dtype).double(), hi)


@pytest.mark.parametrize("dtype, vmax", [(E4M3, 448.0), (E5M2, 57344.0)])
def test_fp8_saturates(dtype, vmax):
    x = torch.tensor([vmax, vmax * 1.03, vmax * 4, 1e30, INF, -INF, -1e30, NAN])
    y = F.encode_fp8(x, dtype).float().tolist()
    assert y[:7] == [vmax, vmax, vmax, vmax, vmax, -vmax, -vmax]
    assert math.isnan(y[7])


def test_fp4_packing_low_nibble_first():
    c = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)    # 0.5, 1.0, -6.0, 0.0
    p = F.pack_fp4(c)
    assert p.tolist() == [[0x21, 0x0F]]                     # byte j = c[2j] | c[2j+1] << 4
    assert torch.equal(F.unpack_fp4(p), c)
    assert torch.equal(F.unpack_fp4(p.view(torch.float4_e2m1fn_x2)), c)
    # along a middle dimension
    c3 = torch.randint(0, 16, (3, 8, 2), dtype=torch.uint8)
    assert torch.equal(F.unpack_fp4(F.pack_fp4(c3, dim=1), dim=1), c3)
    with pytest.raises(ValueError, match="odd"):
        F.pack_fp4(torch.zeros(3, dtype=torch.uint8))


def test_rcp_ftz():
    q = torch.tensor([2.0 ** -127, 2.0 ** -126, 2.0 ** 126, 2.0 ** 127, 0.0, 0.75, NAN])
    r = F.rcp_ftz(q).tolist()
    assert r[0] == INF          # subnormal input flushed to 0 -> 1/0
    assert r[1] == 2.0 ** 126
    assert r[2] == 2.0 ** -126
    assert r[3] == 0.0          # 2^-127 result is subnormal: flushed
    assert r[4] == INF
    assert r[5] == f32(1 / 0.75)
    assert math.isnan(r[6])


# ------------------------------------------------------------------------------------------
# 6-D scale-factor layout
# ------------------------------------------------------------------------------------------

def test_sf_index_hand_computed():
    assert sf_index(0, 0) == (0, 0, 0, 0, 0, 0)
    assert sf_index(33, 5) == (1, 1, 0, 1, 1, 0)          # 33 = 1*32+1 ; 5 = 1*4+1
    assert sf_index(130, 2, 1) == (2, 0, 1, 2, 0, 1)      # 130 = 128+2
    assert sf_index(127, 3) == (31, 3, 0, 3, 0, 0)


@pytest.mark.parametrize("m, kb, l, offset", [
    # mn=256, k_blocks=8 -> RMN=2, RK=2; offset = l*2048 + (m//128)*1024 + (kb//4)*512
    #                                               + (m%32)*16 + ((m//32)%4)*4 + kb%4
    (0, 0, 0, 0),
    (1, 0, 0, 16),
    (32, 0, 0, 4),
    (0, 1, 0, 1),
    (0, 4, 0, 512),
    (128, 0, 0, 1024),
    (130, 5, 1, 2048 + 1024 + 512 + 32 + 0 + 1),
    (255, 7, 1, 2048 + 1024 + 512 + 31 * 16 + 3 * 4 + 3),
])
def test_sf_offset_hand_computed_and_swizzle_agrees(m, kb, l, offset):
    assert sf_offset(m, kb, l, mn=256, k_blocks=8) == offset
    plain = torch.zeros(256, 8, 2, dtype=torch.uint8)
    plain[m, kb, l] = 7
    sf = swizzle_sf(plain.view(E8M0))
    flat = storage_of(sf).reshape(-1).view(torch.uint8)
    assert flat.nonzero().flatten().tolist() == [offset]
    assert sf[sf_index(m, kb, l)].view(torch.uint8).item() == 7


def test_layout_shape_and_strides():
    sf = empty_sf(300, 9, 3, dtype=E8M0)
    # RMN = ceil(300/128) = 3, RK = ceil(9/4) = 3
    assert tuple(sf.shape) == (32, 4, 3, 4, 3, 3) == sf_shape(300, 9, 3)
    assert sf.stride() == (16, 4, 3 * 512, 1, 512, 3 * 3 * 512)
    assert storage_of(sf).is_contiguous()


@pytest.mark.parametrize("rows, kbs, groups", [(200, 5, 3), (128, 4, 1), (1, 1, 1), (256, 12, 2)])
def test_swizzle_unswizzle_round_trip(rows, kbs, groups):
    g = torch.Generator().manual_seed(rows * 31 + kbs)
    plain = torch.randint(1, 255, (rows, kbs, groups), dtype=torch.uint8, generator=g).view(E4M3)
    sf = swizzle_sf(plain)
    assert sf.dtype == E4M3
    back = unswizzle_sf(sf, rows, kbs)
    assert torch.equal(back.view(torch.uint8), plain.view(torch.uint8))
    # the full padded extent: padding bytes hold the fill (0)
    full = unswizzle_sf(sf).view(torch.uint8)
    assert full.shape[0] % 128 == 0 and full.shape[1] % 4 == 0
    assert int(full.sum()) == int(plain.view(torch.uint8).to(torch.int64).sum())
    # 2-D input means L = 1; flat storage reads back the same
    sf2 = swizzle_sf(plain[..., 0])
    assert sf2.shape[-1] == 1
    flat = storage_of(sf2).reshape(-1)
    assert torch.equal(unswizzle_sf(flat, rows, kbs)[..., 0].view(torch.uint8),
                       plain[..., 0].view(torch.uint8))


def test_swizzle_fill_value():
    sf = swizzle_sf(torch.full((3, 1), 127, dtype=torch.uint8).view(E8M0), fill=127)
    assert (storage_of(sf).view(torch.uint8) == 127).all()


def test_as_sf_6d_accepts_flat_and_6d():
    plain = torch.randint(0, 255, (130, 6, 2), dtype=torch.uint8).view(E8M0)
    sf = swizzle_sf(plain)
    assert as_sf_6d(sf, mn=130, k_blocks=6, groups=2) is sf
    for flat in (storage_of(sf).reshape(-1), storage_of(sf).reshape(2, -1).contiguous(),
                 storage_of(sf).contiguous()):
        v = as_sf_6d(flat, mn=130, k_blocks=6, groups=2)
        assert torch.equal(v.view(torch.uint8), sf.view(torch.uint8))


def test_as_sf_6d_errors():
    sf = swizzle_sf(torch.zeros(130, 6, 2, dtype=torch.uint8).view(E8M0))
    with pytest.raises(ValueError, match=r"sfb: .*exactly .*4096"):
        as_sf_6d(storage_of(sf).reshape(-1)[:-1].contiguous(), mn=130, k_blocks=6, groups=2,
                 name="sfb")
    with pytest.raises(ValueError, match=r"sfa: shape mismatch"):
        as_sf_6d(sf, mn=130, k_blocks=6, groups=3, name="sfa")
    with pytest.raises(TypeError, match="float8_e8m0fnu or float8_e4m3fn"):
        as_sf_6d(sf.view(torch.uint8), mn=130, k_blocks=6, groups=2)
    # the right 6-D shape on storage in another order (logical order packed): engines read
    # scale factors by pointer in storage order, so the view's strides must be the layout's
    logical = torch.zeros(tuple(sf.shape)[::-1], dtype=torch.uint8).view(E8M0).permute(5, 4, 3, 2, 1, 0)
    assert logical.shape == sf.shape and not logical.is_contiguous()
    with pytest.raises(ValueError, match=r"sfd_col: the 6-D view must have the packed layout's strides"):
        as_sf_6d(logical, mn=130, k_blocks=6, groups=2, name="sfd_col")
    with pytest.raises(TypeError, match="torch.Tensor"):
        as_sf_6d([1, 2], mn=1, k_blocks=1)
    with pytest.raises(ValueError, match="mn: must be >= 1"):
        sf_shape(0, 1)
    with pytest.raises(ValueError, match="rows= and k_blocks="):
        unswizzle_sf(storage_of(sf).reshape(-1))


# ------------------------------------------------------------------------------------------
# MXFP8 / NVFP4 helpers
# ------------------------------------------------------------------------------------------

def _plain_codes(sf, rows, kbs):
    return unswizzle_sf(sf, rows, kbs).view(torch.uint8)


def test_mxfp8_hand_computed_block():
    # block 0: amax 1.0 -> s = fl32(1/448) in (2^-9, 2^-8] -> SF 2^-8 (code 119) -> 1.0*256 = 256
    # block 1: amax 448 -> s = fl32(448*fl32(1/448)) = 1.0 exactly -> SF code 127, values as is
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1] = 1.0, -0.5
    x[0, 32], x[0, 33] = 448.0, 3.0
    q, sf = quantize_mxfp8(x)
    assert _plain_codes(sf, 1, 2)[0, :, 0].tolist() == [119, 127]
    assert q[0, :2].float().tolist() == [256.0, -128.0]
    assert q[0, 32:34].float().tolist() == [448.0, 3.0]
    assert torch.equal(dequantize(q, sf, 32), x)


def test_mxfp8_round_trip_error_bound():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 200, generator=g) * torch.logspace(-3, 3, 200).unsqueeze(0)
    for dtype, mant in ((E4M3, 3), (E5M2, 2)):
        q, sf = quantize_mxfp8(x, fp8_dtype=dtype)
        y = dequantize(q, sf, 32)
        # scales round up, so no value saturates; the error is half an ulp of the element
        # format relative to the value, or half the smallest subnormal step of the block
        scale = F.decode_e8m0(unswizzle_sf(sf, 256, 7)[..., 0]).repeat_interleave(32, 1)[:, :200]
        sub = scale * (2.0 ** -9 if dtype == E4M3 else 2.0 ** -16)
        bound = torch.maximum(x.abs() * 2.0 ** -(mant + 1), sub / 2)
        assert ((y - x).abs() <= bound).all(), dtype


def test_mxfp8_edge_blocks():
    x = torch.zeros(1, 160)
    x[0, 32:64] = 0.0                         # block 1: zeros
    x[0, 64], x[0, 65] = INF, 1.0             # block 2: inf
    x[0, 96], x[0, 97] = NAN, 2.0             # block 3: NaN
    x[0, 128] = 2.0 ** -140                   # block 4: a tiny subnormal
    x[0, 0] = 1.0
    q, sf = quantize_mxfp8(x)
    assert _plain_codes(sf, 1, 5)[0, :, 0].tolist() == [119, 0, 254, 255, 0]
    y = dequantize(q, sf, 32)
    assert y[0, 32:64].eq(0).all()
    # inf: the largest scale 2^127; rcp_ftz(2^127) = 0 (subnormal result flushed), so every
    # multiplied value is 0 * x: inf -> NaN, finite -> 0 (what the kernel's rcp.approx.ftz does)
    assert math.isnan(q[0, 64].float().item()) and q[0, 65].float().item() == 0.0
    assert torch.isnan(y[0, 96:128]).all()     # NaN poisons its block through the scale
    # tiny: SF code 0 (2^-127, subnormal) -> rcp_ftz = inf -> multiplier clamped to FLT_MAX;
    # 2^-140 * FLT_MAX ~ 2^-12 < half the smallest e4m3 subnormal (2^-10) -> 0
    assert y[0, 128].item() == 0.0
    # a block of 2^-120: s = 2^-120/448 < 2^-127 -> code 0, multiplier FLT_MAX ~ 2^128 instead
    # of 2^127: 2^-120 * FLT_MAX rounds to 256 -> dequantized 256 * 2^-127 = 2^-119, doubled
    t = torch.zeros(1, 32)
    t[0, 0] = 2.0 ** -120
    qt, st = quantize_mxfp8(t)
    assert qt[0, 0].float().item() == 256.0
    assert dequantize(qt, st, 32)[0, 0].item() == 2.0 ** -119


def test_nvfp4_hand_computed_and_saturation():
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([6.0, -3.0, 0.5, 1.25])       # amax 6 -> scale 1.0 (e4m3 exact)
    x[0, 16:18] = torch.tensor([7.0, 1.0])                # amax 7 -> s = 7/6 = 1.1667
    p, sf = quantize_nvfp4(x)
    assert p.dtype == torch.uint8 and tuple(p.shape) == (1, 16)
    s = F.decode_sf(unswizzle_sf(sf, 1, 2)[0, :, 0]).tolist()
    # fl32(6*fl32(1/6)) = 1.0 ; 7/6 -> e4m3 neighbours 1.125 / 1.25 -> 1.125
    assert s == [1.0, 1.125]
    y = dequantize(p, sf, 16)
    assert y[0, :4].tolist() == [6.0, -3.0, 0.5, 1.0]      # 1.25 is a tie -> 1.0 (even)
    # 7 / 1.125 = 6.22 saturates to 6 -> 6 * 1.125 = 6.75 ; 1 / 1.125 = 0.889 -> 1.0 -> 1.125
    assert y[0, 16:18].tolist() == [6.75, 1.125]
    # low nibble first: codes 6.0 -> 7, -3.0 -> 13  => byte 0 = 7 | 13 << 4
    assert p[0, 0].item() == 7 | (13 << 4)


def test_nvfp4_formats_and_shapes():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(130, 64, 3, generator=g)
    for sf_dtype, vec in ((E4M3, 16), (E8M0, 32), (E8M0, 16)):
        p, sf = quantize_nvfp4(x, sf_vec_size=vec, sf_dtype=sf_dtype,
                               packed_dtype=torch.float4_e2m1fn_x2)
        assert p.dtype == torch.float4_e2m1fn_x2 and tuple(p.shape) == (130, 32, 3)
        assert p.view(torch.uint8).stride() == (32, 1, 130 * 32)       # k-major per group
        assert tuple(sf.shape) == sf_shape(130, 64 // vec, 3) and sf.dtype == sf_dtype
        y = dequantize(p, sf, vec)
        assert y.shape == x.shape
        # e2m1 keeps one mantissa bit: a quarter of the value, or half the smallest step
        # (0.5 * scale); e4m3 scales may saturate the block max by at most 1/16
        plain = F.decode_sf(unswizzle_sf(sf, 130, 64 // vec)).repeat_interleave(vec, 1)
        bound = torch.maximum(x.abs() * 0.25, plain * 0.25) + x.abs() * 2 ** -4
        assert ((y - x).abs() <= bound).all(), (sf_dtype, vec)
        # per group = quantizing that slice on its own
        p1, sf1 = quantize_nvfp4(x[:, :, 2].contiguous(), sf_vec_size=vec, sf_dtype=sf_dtype)
        assert torch.equal(p1, p.view(torch.uint8)[:, :, 2])
        assert torch.equal(sf1[..., 0].view(torch.uint8), sf[..., 2].view(torch.uint8))


def test_nvfp4_zero_and_tiny_blocks():
    x = torch.zeros(1, 32)
    x[0, 16] = 1e-6                 # amax/6 below the smallest e4m3 subnormal: scale 0
    p, sf = quantize_nvfp4(x)
    assert F.decode_sf(unswizzle_sf(sf, 1, 2)[0, :, 0]).tolist() == [0.0, 0.0]
    assert dequantize(p, sf, 16).eq(0).all()


def test_dequantize_accepts_flat_sf():
    x = torch.randn(128, 64)
    q, sf = quantize_mxfp8(x)
    assert torch.equal(dequantize(q, storage_of(sf).reshape(-1), 32), dequantize(q, sf, 32))


def test_helper_errors():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="sf_vec_size: MXFP8 .* requires sf_vec_size=32"):
        quantize_mxfp8(x, sf_vec_size=16)
    with pytest.raises(TypeError, match="fp8_dtype"):
        quantize_mxfp8(x, fp8_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="e4m3 scale factors require sf_vec_size=16"):
        quantize_nvfp4(x, sf_vec_size=32, sf_dtype=E4M3)
    with pytest.raises(ValueError, match="K=5 must be even"):
        quantize_nvfp4(torch.randn(4, 5))
    with pytest.raises(TypeError, match="packed_dtype"):
        quantize_nvfp4(x, packed_dtype=torch.int8)
    with pytest.raises(TypeError, match="x: expected a bfloat16"):
        quantize_mxfp8(torch.zeros(4, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"x: expected shape \(rows, K\)"):
        quantize_mxfp8(torch.zeros(32))
    q, sf = quantize_mxfp8(x)
    with pytest.raises(TypeError, match="q: expected float8"):
        dequantize(q.float(), sf, 32)
    with pytest.raises(ValueError, match="sf: shape mismatch"):
        dequantize(q, swizzle_sf(torch.zeros(4, 1, 2, dtype=E8M0)), 32)     # L=2 for a 2-D q
    with pytest.raises(ValueError, match="sf: a contiguous .* exactly 512"):
        dequantize(q, torch.zeros(100, dtype=E8M0), 32)


def test_the_format_table_is_the_one_vocabulary():
    """quant.formats.FORMATS defines each format once; the dtype tuples, the kernels' format
    names and the engine's mapping are lookups there."""
    from cudnn_ext.kernels.blockscaled.config import ELEM_FORMATS, SF_FORMATS
    from cudnn_ext.quant import formats as F

    assert F.format_of(torch.float8_e4m3fn).name == "e4m3" and F.format_of(torch.uint8).name == "e2m1"
    assert F.format_of(torch.float4_e2m1fn_x2).name == "e2m1" and F.format_of(torch.float8_e8m0fnu).name == "e8m0"
    assert set(ELEM_FORMATS) == {"e4m3", "e5m2", "e2m1"} and set(SF_FORMATS) == {"e8m0", "e4m3"}
    for name, f in F.FORMATS.items():
        for dt in f.dtypes:
            assert F.format_of(dt) is f
        if F.ELEMENT in f.roles:
            assert F.max_finite(f.dtypes[0]) == f.max_finite
    assert F.FORMATS["e4m3"].max_finite == torch.finfo(torch.float8_e4m3fn).max
    assert F.FORMATS["e5m2"].max_finite == torch.finfo(torch.float8_e5m2).max
    with pytest.raises(TypeError, match="dtype: expected the storage of one of"):
        F.format_of(torch.bfloat16)
