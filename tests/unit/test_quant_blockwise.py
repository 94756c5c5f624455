"""quantize_fp8_blockwise / dequantize_fp8_blockwise (cudnn_ext.quant.blockwise): each line of
the scale rule against an independent per-block oracle in numpy float32, bit for bit, and a
broken variant of each line shown to move the result on the same data."""
import math

import numpy as np
import pytest
import torch

from cudnn_ext.quant import dequantize_fp8_blockwise, quantize_fp8_blockwise
from cudnn_ext.quant.blockwise import BLOCKS, SCALE_FLOOR, scale_shape

E4M3 = torch.float8_e4m3fn


def _e4m3(y: np.ndarray) -> np.ndarray:
    """fp32 -> e4m3 (round to nearest even, saturating at 448) -> the bytes."""
    return torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32)).clamp(-448, 448).to(E4M3).view(torch.uint8).numpy()


def _pow2_up(s: float) -> float:
    m, e = math.frexp(s)  # s = m 2^e, m in [0.5, 1)
    return s if m == 0.5 else math.ldexp(1.0, e)


def oracle(x: np.ndarray, block, *, pow2=False, divide=True, floor=True, pow2_down=False):
    """(q bytes, scales) of a 2-D float32 ``x`` block by block, the rule written out once
    more; ``divide``/``floor``/``pow2_down`` select broken variants of its lines."""
    br, bk = block
    rows, k = x.shape
    rb, kb = -(-rows // br), -(-k // bk)
    q = np.zeros(x.shape, np.uint8)
    scales = np.zeros((rb, kb), np.float32)
    for i in range(rb):
        for j in range(kb):
            blk = x[i * br:(i + 1) * br, j * bk:(j + 1) * bk]
            amax = np.float32(np.nan) if np.isnan(blk).any() else np.abs(blk).max()
            s = np.float32(amax) / np.float32(448.0)
            if pow2 and math.isfinite(s) and s > 0:
                s = np.float32(math.ldexp(1.0, math.frexp(s)[1] - 1) if pow2_down else _pow2_up(float(s)))
            if floor and not (s >= SCALE_FLOOR) and not np.isnan(s):
                s = np.float32(SCALE_FLOOR)
            scales[i, j] = s
            with np.errstate(divide="ignore", invalid="ignore"):
                y = blk / s if divide else blk * (np.float32(1.0) / s)
            q[i * br:(i + 1) * br, j * bk:(j + 1) * bk] = _e4m3(y.astype(np.float32))
    return q, scales


def _bytes(q: torch.Tensor) -> np.ndarray:
    return q.contiguous().view(torch.uint8).numpy()


def _hard_input(rows, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-30, 30, rows, base=2.0)[:, None]
    x[:, :7] *= 1e-3  # blocks whose amax is far above most of their values
    return x


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (1, 130)])
def test_bit_exact_against_the_oracle(block, pow2, shape):
    x = _hard_input(*shape)
    q, s = quantize_fp8_blockwise(x, block, pow2_scales=pow2)
    q_ref, s_ref = oracle(x.numpy(), block, pow2=pow2)
    assert q.dtype == E4M3 and s.dtype == torch.float32
    assert tuple(s.shape) == scale_shape(shape, block)
    assert np.array_equal(_bytes(q), q_ref)
    assert np.array_equal(s.numpy().view(np.uint32), s_ref.view(np.uint32))
    if pow2:  # every scale a power of two, so x / s is exact before the e4m3 rounding
        m = np.frexp(s.numpy())[0]
        assert np.all(m == 0.5)


def test_each_broken_line_moves_the_result():
    """Division by the scale, the floor and rounding up to a power of two each change the
    bytes of some input the test above runs (so it fails with the line broken)."""
    x = _hard_input(256, 384).numpy()
    x[:, 128:256] = 0.0  # zero blocks: the floor's own case
    x[0:128, 256:384] *= 1e-38  # subnormal-scale blocks
    base = oracle(x, (1, 128))
    assert not np.array_equal(oracle(x, (1, 128), floor=False)[1], base[1])
    assert not np.array_equal(oracle(x, (128, 128), pow2=True, pow2_down=True)[0], oracle(x, (128, 128), pow2=True)[0])
    # division against multiplication by the rounded reciprocal: ties of e4m3 rounding
    s = np.float32(np.float32(300.0) / np.float32(448.0))
    ties = np.array([1.0625, 1.1875, 2.125, 9.5, 19.0, 104.0], np.float32)  # e4m3 midpoints
    cands = (ties[:, None] * s * (1 + np.arange(-8, 9, dtype=np.float32) * 2.0 ** -23)).astype(np.float32).ravel()
    row = np.concatenate([np.float32([300.0]), cands])[None, :]
    row = np.pad(row, ((0, 0), (0, 128 - row.shape[1])))
    assert not np.array_equal(oracle(row, (1, 128), divide=False)[0], oracle(row, (1, 128))[0])
    q, _ = quantize_fp8_blockwise(torch.from_numpy(row), (1, 128))
    assert np.array_equal(_bytes(q), oracle(row, (1, 128))[0])


@pytest.mark.parametrize("block", BLOCKS)
def test_three_d_groups_and_strides(block):
    x = torch.randn(200, 260, 3)
    q, s = quantize_fp8_blockwise(x, block)
    assert q.shape == x.shape and q.stride() == (260, 1, 200 * 260)  # K-major per group
    assert tuple(s.shape) == scale_shape(tuple(x.shape), block)
    assert s.stride()[0] == 1  # MN-major: a tile's scales for one K block are contiguous
    for g in range(3):
        q_ref, s_ref = oracle(x[..., g].numpy(), block)
        assert np.array_equal(_bytes(q[..., g]), q_ref)
        assert np.array_equal(s[..., g].numpy(), s_ref)


@pytest.mark.parametrize("block", BLOCKS)
def test_round_trip_error_bound(block):
    x = torch.randn(256, 256, dtype=torch.float64) * 3
    q, s = quantize_fp8_blockwise(x, block)
    back = dequantize_fp8_blockwise(q, s, block, out_dtype=torch.float64)
    br, bk = block
    s_full = s.double().repeat_interleave(br, 0)[:256].repeat_interleave(bk, 1)[:, :256]
    # e4m3: 3 mantissa bits (half an ulp is 2^-4 relative), subnormal spacing 2^-9 of the scale
    bound = torch.maximum(x.abs() * 2.0 ** -4, s_full * 2.0 ** -10) * 1.0001
    assert torch.all((back - x).abs() <= bound)


def test_edge_blocks():
    x = torch.randn(4, 512)
    x[0, :128] = 0.0
    x[1, 128:256] = float("nan")
    x[2, 256:384] = float("inf")
    x[3, 384:512] = 1e-40  # subnormal fp32
    q, s = quantize_fp8_blockwise(x, (1, 128))
    back = dequantize_fp8_blockwise(q, s, (1, 128))
    assert s[0, 0] == SCALE_FLOOR and torch.all(back[0, :128] == 0)
    assert torch.isnan(back[1, 128:256]).all() and not torch.isnan(back[1, :128]).any()
    assert torch.isnan(back[2, 256:384]).all() and torch.isfinite(back[2, :256]).all()
    # a subnormal block keeps the floor scale: its values land on e4m3's subnormal grid (2^-9 s)
    assert s[3, 3] == SCALE_FLOOR
    assert torch.all((back[3, 384:512] - x[3, 384:512]).abs() <= SCALE_FLOOR * 2.0 ** -10)
    finite = torch.isfinite(back)
    assert finite.sum() == 4 * 512 - 2 * 128
    # every NaN is the positive quiet NaN (the CPU's inf / inf is negative; a GPU's is not)
    assert (q.view(torch.uint8)[torch.isnan(q.float())] == 0x7F).all()
    assert torch.isnan(q[2, 256:384].float()).all() and (q.view(torch.uint8)[2, 256:384] == 0x7F).all()
    assert (s.view(torch.int32)[torch.isnan(s)] == 0x7FC00000).all() and torch.isnan(s[1, 1])


def test_large_values_stay_finite():
    x = torch.full((1, 128), 3.0e38)
    x[0, 1] = -3.0e38
    q, s = quantize_fp8_blockwise(x, (1, 128))
    back = dequantize_fp8_blockwise(q, s, (1, 128), out_dtype=torch.float64)
    assert torch.isfinite(back).all() and torch.allclose(back, x.double(), rtol=2.0 ** -4)


@pytest.mark.parametrize("call,err,match", [
    (lambda: quantize_fp8_blockwise(torch.randn(4, 8), (1, 64)), ValueError, r"block: must be one of"),
    (lambda: quantize_fp8_blockwise(torch.randn(4, 8), (True, 128)), ValueError, r"block: must be one of"),
    (lambda: quantize_fp8_blockwise(torch.randn(4), (1, 128)), ValueError, r"x: expected shape"),
    (lambda: quantize_fp8_blockwise(torch.ones(4, 8, dtype=torch.int32)), TypeError, r"x: expected a bfloat16"),
    (lambda: quantize_fp8_blockwise(torch.randn(0, 8)), ValueError, r"x: expected a non-empty"),
    (lambda: quantize_fp8_blockwise(torch.randn(4, 8), pow2_scales=1), TypeError, r"pow2_scales: expected a bool"),
    (lambda: dequantize_fp8_blockwise(torch.zeros(4, 8, dtype=E4M3), torch.ones(4, 2)), ValueError,
     r"scales: expected float32 of shape \(4, 1\)"),
    (lambda: dequantize_fp8_blockwise(torch.zeros(4, 8), torch.ones(4, 1)), TypeError, r"q: expected float8_e4m3fn"),
])
def test_errors_name_the_argument(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_bf16_input_and_no_sync_types():
    x = torch.randn(128, 256).bfloat16()
    q, s = quantize_fp8_blockwise(x, (128, 128))
    q_ref, s_ref = oracle(x.float().numpy(), (128, 128))
    assert np.array_equal(_bytes(q), q_ref) and np.array_equal(s.numpy(), s_ref)


def test_block_and_device_rules_from_review():
    with pytest.raises(ValueError, match=r"block: must be one of"):
        quantize_fp8_blockwise(torch.randn(4, 128), (1.7, 128))
    with pytest.raises(ValueError, match=r"block: must be one of"):
        quantize_fp8_blockwise(torch.randn(4, 128), "1x128")
    q, s = quantize_fp8_blockwise(torch.randn(4, 128))
    with pytest.raises(ValueError, match=r"scales: must be on q's device"):
        dequantize_fp8_blockwise(q, s.to("meta"))
