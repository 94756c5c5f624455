"""The device dequantizer of block-scaled operands (``kernels/blockscaled``) against
``cudnn_ext.quant.dequantize`` (float64 products rounded once): random element and scale
bytes, every code included (NaN, infinities, e8m0 0 and 254, e4m3 subnormal and negative
scales), several groups, rows that leave a partial 128-row scale atom. The BF16 results
must be bit-identical (NaN where the reference has NaN); BF16 memory past the operand must
stay untouched."""
import zlib

import pytest
import torch

from cudnn_ext.quant import dequantize
from cudnn_ext.quant.sf_layout import sf_numel
from gpu_skips import needs_cuda_and_dsl

pytestmark = pytest.mark.gpu

E4M3, E5M2, E8M0 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu
# (elem, sf, sf_vec): every configuration the dequantizer takes
CONFIGS = [("e4m3", "e8m0", 32), ("e5m2", "e8m0", 32), ("e2m1", "e4m3", 16),
           ("e2m1", "e4m3", 32), ("e2m1", "e8m0", 16), ("e2m1", "e8m0", 32)]
_ELEM = {"e4m3": E4M3, "e5m2": E5M2}
_SF = {"e8m0": E8M0, "e4m3": E4M3}




@pytest.mark.parametrize("elem,sf,sf_vec", CONFIGS, ids=["-".join(map(str, c)) for c in CONFIGS])
@pytest.mark.parametrize("groups,rows,k", [(1, 256, 512), (3, 200, 384), (2, 130, 160)])
def test_device_dequant_matches_quant_dequantize(elem, sf, sf_vec, groups, rows, k):
    needs_cuda_and_dsl()
    from cudnn_ext.kernels.blockscaled.config import DequantConfig
    from cudnn_ext.kernels.blockscaled.launch import launch_dequant

    cfg = DequantConfig(elem, sf, sf_vec)
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{elem}{sf}{sf_vec}{groups}".encode()))
    nbytes = cfg.stored_bytes(k)
    q = torch.randint(0, 256, (groups, rows, nbytes), dtype=torch.uint8, device="cuda", generator=g)
    kb = k // sf_vec
    sf_bytes = torch.randint(0, 256, (sf_numel(rows, kb, groups),), dtype=torch.uint8, device="cuda",
                             generator=g)
    if sf == "e8m0":  # the extreme codes, many times over
        sf_bytes[:64] = torch.tensor([0, 1, 254, 255] * 16, dtype=torch.uint8)
    out = torch.full((groups * rows * k + 64,), float("nan"), dtype=torch.bfloat16, device="cuda")
    tail = out[groups * rows * k:].clone()
    launch_dequant(cfg, q.data_ptr(), sf_bytes.data_ptr(), out.data_ptr(), rows, k, groups,
                   torch.cuda.current_stream().cuda_stream)
    with pytest.raises(ValueError, match="needs the padded offsets"):
        launch_dequant(DequantConfig(elem, sf, sf_vec, tables=True), q.data_ptr(), 0, 0, rows, k,
                       groups, 0)
    torch.cuda.synchronize()
    got = out[:groups * rows * k].view(groups, rows, k)
    q_ref = q if elem == "e2m1" else q.view(_ELEM[elem])
    want = dequantize(q_ref.permute(1, 2, 0), sf_bytes.view(_SF[sf]), sf_vec,
                      out_dtype=torch.float64).permute(2, 0, 1).to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert torch.equal(out[groups * rows * k:].view(torch.int16), tail.view(torch.int16))


@pytest.mark.parametrize("elem,sf,sf_vec", [CONFIGS[0], CONFIGS[2]], ids=["mxfp8", "nvfp4"])
def test_device_dequant_from_pointer_tables(elem, sf, sf_vec):
    """Per-expert operands (discrete weights): each expert's elements and scales at its own
    address; an expert without rows has null pointers, which are not read, and its output
    rows keep their bytes."""
    needs_cuda_and_dsl()
    from cudnn_ext.kernels.blockscaled.config import DequantConfig
    from cudnn_ext.kernels.blockscaled.launch import launch_dequant

    cfg = DequantConfig(elem, sf, sf_vec, tables=True)
    rows, k, groups = 200, 256, 3
    offs = torch.tensor([256, 256, 768], dtype=torch.int32, device="cuda")  # expert 1: no rows
    kb = k // sf_vec
    qs = [torch.randint(0, 256, (rows, cfg.stored_bytes(k)), dtype=torch.uint8, device="cuda")
          for _ in range(groups)]
    sfs = [torch.randint(100, 150, (sf_numel(rows, kb),), dtype=torch.uint8, device="cuda")
           for _ in range(groups)]
    q_tab = torch.tensor([0 if e == 1 else qs[e].data_ptr() for e in range(groups)],
                         dtype=torch.int64, device="cuda")
    sf_tab = torch.tensor([0 if e == 1 else sfs[e].data_ptr() for e in range(groups)],
                          dtype=torch.int64, device="cuda")
    out = torch.full((groups, rows, k), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch_dequant(cfg, q_tab.data_ptr(), sf_tab.data_ptr(), out.data_ptr(), rows, k, groups,
                   torch.cuda.current_stream().cuda_stream, offsets=offs.data_ptr())
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all()
    for e in (0, 2):
        q_ref = qs[e] if elem == "e2m1" else qs[e].view(_ELEM[elem])
        want = dequantize(q_ref, sfs[e].view(_SF[sf]), sf_vec, out_dtype=torch.float64).to(torch.bfloat16)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(out[e]), nan)
        assert torch.equal(out[e][~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("tables", [False, True], ids=["dense", "tables"])
@pytest.mark.parametrize("groups,rows,k", [(1, 256, 512), (3, 208, 384), (2, 96, 160)])
def test_device_dequant_n_major(elem, tables, groups, rows, k):
    """FP8 weights stored N-major, (G, K, rows): the BF16 out keeps that order, and every
    element takes the scale of its own row's K block; bit-identical to ``dequantize`` of the
    same values K-major. With tables, each group is its own buffer; a group without rows
    (offsets) is never read."""
    needs_cuda_and_dsl()
    from cudnn_ext.kernels.blockscaled.config import DequantConfig
    from cudnn_ext.kernels.blockscaled.launch import launch_dequant

    cfg = DequantConfig(elem, "e8m0", 32, tables=tables, n_major=True)
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"n{elem}{tables}{groups}".encode()))
    q = torch.randint(0, 256, (groups, k, rows), dtype=torch.uint8, device="cuda", generator=g)
    sf_bytes = torch.randint(0, 256, (sf_numel(rows, k // 32, groups),), dtype=torch.uint8,
                             device="cuda", generator=g)
    sf_bytes[:64] = torch.tensor([0, 1, 254, 255] * 16, dtype=torch.uint8)
    total = groups * rows * k
    out = torch.full((total + 64,), float("nan"), dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    if tables:
        per = sf_bytes.numel() // groups
        sf_parts = [sf_bytes[e * per:(e + 1) * per].clone() for e in range(groups)]
        q_parts = [q[e].clone() for e in range(groups)]
        q_tab = torch.tensor([t.data_ptr() for t in q_parts], dtype=torch.int64, device="cuda")
        sf_tab = torch.tensor([t.data_ptr() for t in sf_parts], dtype=torch.int64, device="cuda")
        offs = torch.arange(1, groups + 1, dtype=torch.int32, device="cuda") * 256
        launch_dequant(cfg, q_tab.data_ptr(), sf_tab.data_ptr(), out.data_ptr(), rows, k, groups,
                       stream, offsets=offs.data_ptr())
    else:
        launch_dequant(cfg, q.data_ptr(), sf_bytes.data_ptr(), out.data_ptr(), rows, k, groups, stream)
    torch.cuda.synchronize()
    got = out[:total].view(groups, k, rows)
    # the reference on the K-major (rows, K, G) view of the same values
    want = dequantize(q.view(_ELEM[elem]).permute(2, 1, 0), sf_bytes.view(E8M0), 32,
                      out_dtype=torch.float64).permute(2, 1, 0).to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert torch.isnan(out[total:]).all()


@pytest.mark.parametrize("elem,sf,sf_vec,n_major,tables", [CONFIGS[0] + (False, False), CONFIGS[0] + (True, False),
                                                            CONFIGS[2] + (False, False), CONFIGS[0] + (False, True),
                                                            CONFIGS[2] + (False, True)],
                         ids=["mxfp8", "mxfp8-n", "nvfp4", "mxfp8-tables", "nvfp4-tables"])
def test_device_dequant_pair_matches_the_two_launches(elem, sf, sf_vec, n_major, tables):
    """The engine's one launch for A and B (``DequantPair``) writes exactly what the two
    single launches write (random bytes, every code), and nothing past either operand; B
    through pointer tables (per-expert weights) with an expert without rows, whose null
    pointers are not read."""
    needs_cuda_and_dsl()
    from cudnn_ext.kernels.blockscaled.config import DequantConfig, DequantPairConfig
    from cudnn_ext.kernels.blockscaled.launch import launch_dequant, launch_dequant_pair

    a_cfg = DequantConfig(elem, sf, sf_vec)
    b_cfg = DequantConfig(elem, sf, sf_vec, n_major=n_major, tables=tables)
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"pair{elem}{n_major}".encode()))
    rows_a, rows_b, k, groups = 200, 160, 384, 3
    stream = torch.cuda.current_stream().cuda_stream

    def operand(rows, grp):
        q = torch.randint(0, 256, (grp, rows, a_cfg.stored_bytes(k)), dtype=torch.uint8, device="cuda",
                          generator=g)
        s = torch.randint(0, 256, (sf_numel(rows, k // sf_vec, grp),), dtype=torch.uint8, device="cuda",
                          generator=g)
        return q, s

    (qa, sa), (qb, sb) = operand(rows_a, 1), operand(rows_b, groups)
    outs = [torch.full((n + 64,), float("nan"), dtype=torch.bfloat16, device="cuda")
            for n in (rows_a * k, groups * rows_b * k) * 2]
    b_q, b_sf, offsets = qb.data_ptr(), sb.data_ptr(), 0
    if tables:  # each expert's (rows_b, K) operand and its one-group scales; expert 1 has no rows
        per = [operand(rows_b, 1) for _ in range(groups)]
        q_tab = torch.tensor([0 if e == 1 else q.data_ptr() for e, (q, _) in enumerate(per)], device="cuda")
        sf_tab = torch.tensor([0 if e == 1 else s.data_ptr() for e, (_, s) in enumerate(per)], device="cuda")
        offs = torch.tensor([rows_b, rows_b, 2 * rows_b], dtype=torch.int32, device="cuda")
        b_q, b_sf, offsets = q_tab.data_ptr(), sf_tab.data_ptr(), offs.data_ptr()  # (the tensors stay alive)
    launch_dequant(a_cfg, qa.data_ptr(), sa.data_ptr(), outs[0].data_ptr(), rows_a, k, 1, stream)
    launch_dequant(b_cfg, b_q, b_sf, outs[1].data_ptr(), rows_b, k, groups, stream, offsets=offsets)
    launch_dequant_pair(DequantPairConfig(a_cfg, b_cfg), (qa.data_ptr(), sa.data_ptr(), outs[2].data_ptr()),
                        (b_q, b_sf, outs[3].data_ptr()), rows_a, rows_b, k, groups, stream, offsets=offsets)
    torch.cuda.synchronize()
    for single, pair in ((outs[0], outs[2]), (outs[1], outs[3])):
        assert torch.equal(single.view(torch.int16), pair.view(torch.int16))  # NaNs and the tail included
