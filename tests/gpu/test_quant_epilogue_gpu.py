"""The kernel's quantizing epilogue (``kernels/sm90/quant_d.py``) against the reference's
quantizers on the same fp32 values, bit for bit: each case runs the kernel twice on the same
operands, once with FP8 D (the epilogue quantizes) and once with fp32 D (the same kernel
writes the values it would quantize), and the reference quantizes the fp32 D
(``quantize_d_row`` / ``quantize_d_col``, global and per-expert SFD_col; the plain saturating
conversion). Hard values come from the rows' prob: a NaN row, an overflowing row (inf),
subnormal and zero rows; 2N = 192 leaves half an SFD_row k-atom and half an SFD_col column
atom of padding (code 0); an expert without rows; rows past the last offset and scale bytes
that cover only them keep their poison."""
import dataclasses

import pytest
import torch

from cudnn_ext.engines.sm90 import Sm90Plan, config_for
from cudnn_ext.quant import formats as F
from gpu_skips import needs_cuda_and_dsl
from sm90_problem import problem as _problem
from quant_d_cases import POISON, assert_bytes_equal, expected, poisoned

pytestmark = pytest.mark.gpu

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _operands(n, k, m, ends, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    L = len(ends)
    prob = torch.rand(m, device="cuda", generator=g)
    # planted rows (inside the first expert with rows): NaN, overflow to inf, tiny, zero
    prob[5], prob[40], prob[70], prob[100] = float("nan"), 3.0e38, 1.0e-38, 0.0
    return dict(a=(torch.randn(m, k, device="cuda", generator=g) * 0.5).bfloat16(),
                # (N, K, L) over K-major (L, N, K) memory, as the kernel reads dense B
                b=(torch.randn(L, n, k, device="cuda", generator=g) * 0.1).bfloat16().permute(1, 2, 0),
                c=(torch.randn(m, 2 * n, device="cuda", generator=g) * 2).bfloat16(),
                padded_offsets=torch.tensor(ends, dtype=torch.int32, device="cuda"),
                alpha=torch.rand(L, device="cuda", generator=g) + 0.5,
                beta=torch.rand(L, device="cuda", generator=g) + 0.5,
                prob=prob, dprob=torch.zeros(m, device="cuda"))


def _run(problem, cfg, pack):
    plan = Sm90Plan(problem, cfg)
    ws = torch.zeros(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    plan.execute(pack, ws)
    torch.cuda.synchronize()


def _twin(act, n, tile_n, ends, d, scales, discrete, nc, seed=0):
    """(FP8 outputs of the quantizing kernel, fp32 D of its fp32-D twin, norm_const)."""
    m, k = 1024, 192
    p8 = _problem(act=act, n=n, k=k, m=m, L=len(ends), d=d, dbias=False)
    cfg = dataclasses.replace(config_for(p8, tile_n=tile_n), d_scales=scales,
                              discrete_col_sfd=discrete)
    ops = _operands(n, k, m, ends, seed)
    ncs = torch.full((1,), nc, dtype=torch.float32, device="cuda")
    outs = poisoned(m, 2 * n, d)
    _run(p8, cfg, dict(ops, **outs, norm_const=ncs))
    p32 = dataclasses.replace(p8, d_dtype=torch.float32)
    d32 = torch.full((m, 2 * n), float("nan"), device="cuda")
    _run(p32, dataclasses.replace(cfg, d_dtype="fp32", d_scales=False, discrete_col_sfd=False),
         dict(ops, d_row=d32, dprob=torch.zeros(m, device="cuda")))
    return outs, d32, ncs


CASES = [  # (act, N, tile_n, offsets, discrete_col_sfd, norm_const)
    ("dswiglu", 96, 128, [256, 256, 768], False, 3.7),
    ("dgeglu", 96, 64, [256, 256, 768], True, 1.0),
    ("dswiglu", 128, 128, [512, 768, 768], True, 1.0 / 1024),
    ("dgeglu", 64, 64, [1024], False, 3.7),
]


@pytest.mark.parametrize("act,n,tile_n,ends,discrete,nc", CASES,
                         ids=[f"{c[0]}-N{c[1]}-t{c[2]}-{'discrete' if c[4] else 'global'}" for c in CASES])
def test_epilogue_quantizes_like_the_reference_bit_for_bit(act, n, tile_n, ends, discrete, nc):
    needs_cuda_and_dsl()
    outs, d32, ncs = _twin(act, n, tile_n, ends, E4M3, True, discrete, nc)
    last = ends[-1]
    assert torch.isnan(d32[5]).all() and torch.isinf(d32[40]).any()  # the planted rows
    want = expected(d32, ncs, ends, last, discrete)
    for key in ("d_row", "d_col", "sfd_row", "sfd_col"):
        assert_bytes_equal(outs[key], want[key], key)


@pytest.mark.parametrize("d", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_plain_conversion_matches_the_reference(d):
    """FP8 D without scales: the saturating conversion of each value, a NaN as its sign and
    0x7F; D_col and the scale buffers untouched."""
    needs_cuda_and_dsl()
    ends = [256, 768]
    outs, d32, _ = _twin("dswiglu", 96, 128, ends, d, False, False, 1.0)
    last = ends[-1]
    want = torch.full(d32.shape, POISON, dtype=torch.uint8, device="cuda")
    enc = F.encode_fp8(d32[:last], d).view(torch.uint8).clone()
    nan = torch.isnan(d32[:last])
    enc[nan] = ((d32[:last].view(torch.int32) >> 24) & 0x80).to(torch.uint8)[nan] | 0x7F
    want[:last] = enc
    assert_bytes_equal(outs["d_row"], want, "d_row")
    fresh = poisoned(*d32.shape, d)
    for key in ("d_col", "sfd_row", "sfd_col"):
        assert_bytes_equal(outs[key], fresh[key], key)
