"""The Hopper kernel's deterministic form (``Sm90Config.deterministic``: dprob's (N-tile, row)
partials and the tiles' dbias column sums stored, then summed in a fixed order) on the GPU:
against the float64 oracle on every schedule (``run_and_check``), and bit for bit the same
dprob and dbias over 20 runs, on a side stream under a concurrent load, and across CUDA-graph
replays, with plans built through the engine on a pinned configuration; and through the public
wrapper with ``deterministic=True``: BF16, MXFP8 and NVFP4 operands on the Hopper engines (not
the reference engine), bit for bit over repeated calls and a side stream, and within the
oracle's bounds of the reference engine's result."""

import pytest
import torch
from sm90_cases import Case, make_pack, run_and_check, skip_unless_sm90

pytestmark = pytest.mark.gpu

CO = dict(cooperative=True)


def det_cases() -> list:
    """Ping-pong with 64-row C entries and 2x1 clusters, 2x2 clusters, the cooperative form
    (2 C stages, an N tail), the ragged schedule (both forms, and 2x1 clusters), discrete
    N-major weights, dGeGLU, six N-tiles; empty experts, rows past the last offset."""
    d = dict(deterministic=True)
    return [
        Case([256, 0, 768, 256], 96, 200, c_split=2, cluster_m=2, **d),
        Case([0, 512, 256], 320, 264, "dgeglu", cluster_m=2, cluster_n=2, **d),
        Case([512, 0, 768, 256], 512, 520, tile_n=256, cluster_m=2, c_stages=2, **CO, **d),
        Case([8, 0, 120, 1000, 16], 96, 200, tile_n=64, m_aligned=8, **d),
        Case([8, 0, 120, 1000, 16], 512, 520, tile_n=256, c_stages=2, m_aligned=8, **CO, **d),
        Case([8, 0, 120, 1000, 16], 320, 264, m_aligned=8, cluster_m=2, **d),  # (table x 2)
        Case([256, 0, 768, 256], 96, 200, weight_mode="discrete", b_major="n", **d),
        # six N-tiles (the last one partial): the dprob fold's unrolled loop and its remainder
        Case([512, 256, 0, 768], 704, 264, c_split=2, cluster_m=2, **d),
    ]


@pytest.mark.parametrize("case", det_cases(), ids=lambda c: c.label())
def test_deterministic_form_matches_reference(case):
    skip_unless_sm90()
    print(case.label(), run_and_check(case))


@pytest.mark.parametrize("case", det_cases()[:4], ids=lambda c: c.label())
def test_dprob_and_dbias_are_bit_identical_run_to_run(case):
    """20 runs from zeroed dprob/dbias, then 5 on a side stream while large matmuls run on
    the default stream, then 5 CUDA-graph replays: every dprob and dbias bit for bit the
    first run's. (The default form, run the same way, is not required to be.)"""
    skip_unless_sm90()
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, config_for

    problem, pack = make_pack(case)
    assert problem.deterministic
    cfg = config_for(problem, **case.knobs())
    assert cfg.deterministic and cfg.split_last == 1
    plan = Sm90DgluEngine().build(problem, cfg)
    ws = torch.zeros(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")

    def once(stream=None):
        pack["dprob"].zero_()
        pack["dbias"].zero_()
        plan.execute(pack, ws, stream)
        return pack["dprob"].clone(), pack["dbias"].clone()

    first = once()
    torch.cuda.synchronize()
    runs = [once() for _ in range(20)]
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(5):
        load = big @ big  # co-resident work on the default stream
        with torch.cuda.stream(side):
            runs.append(once(side))
        del load
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.execute(pack, ws, torch.cuda.current_stream())
    for _ in range(5):
        pack["dprob"].zero_()
        pack["dbias"].zero_()
        g.replay()
        runs.append((pack["dprob"].clone(), pack["dbias"].clone()))
    torch.cuda.synchronize()
    for dprob, dbias in runs:
        assert torch.equal(dprob.view(torch.int32), first[0].view(torch.int32))
        assert torch.equal(dbias.view(torch.int16), first[1].view(torch.int16))


def _public_call(fmt, seed=0):
    """Wrapper arguments for ``fmt`` (bf16, mxfp8 with FP8 D, nvfp4 with bf16 D): 4 experts (one
    empty), N 320 (an odd count of 128-wide tiles), rows past the last offset; dbias and dprob."""
    from cudnn_ext.quant import quantize_mxfp8, quantize_nvfp4

    torch.manual_seed(seed)
    L, N, K = 4, 320, 256
    counts = (256, 0, 768, 512)
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    m = sum(counts) + 256
    a = torch.randn(m, K, device="cuda")
    w = (torch.randn(L, N, K, device="cuda") * 0.2).permute(1, 2, 0)  # (N, K, L), K-major
    kw = dict(c_tensor=(torch.randn(m, 2 * N, device="cuda") * 2).to(torch.bfloat16), padded_offsets=offs,
              alpha_tensor=torch.rand(L, device="cuda") + 0.5, beta_tensor=torch.rand(L, device="cuda") + 0.5,
              prob_tensor=torch.rand(m, device="cuda"), generate_dbias=True)
    if fmt == "bf16":
        kw.update(a_tensor=a.to(torch.bfloat16), b_tensor=w.to(torch.bfloat16), sfa_tensor=None)
    elif fmt == "mxfp8":
        (a_q, sfa), (b_q, sfb) = quantize_mxfp8(a), quantize_mxfp8(w)
        kw.update(a_tensor=a_q, sfa_tensor=sfa, b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=32,
                  norm_const_tensor=torch.ones(1, device="cuda"), d_dtype=torch.float8_e4m3fn)
    else:
        (a_q, sfa), (b_q, sfb) = quantize_nvfp4(a), quantize_nvfp4(w)
        kw.update(a_tensor=a_q, sfa_tensor=sfa, b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=16,
                  d_dtype=torch.bfloat16)
    return kw, m, int(offs[-1])


@pytest.mark.parametrize("fmt,engine", [("bf16", "sm90_cutedsl"), ("mxfp8", "sm90_blockscaled"),
                                        ("nvfp4", "sm90_blockscaled")])
def test_public_calls_are_bit_identical_and_match_the_reference(fmt, engine):
    """``grouped_gemm_dglu_wrapper(deterministic=True)`` with the Hopper engine pinned (it must
    take the call): 10 calls, then 3 on a side stream under a concurrent load, give dprob,
    dbias and D bit for bit the first call's; dprob and dbias within the kernel's bounds of
    the reference engine's (float64-accumulated) result."""
    skip_unless_sm90()
    import cudnn_ext as cudnn
    from sm90_cases import TOL, rel_err

    kw, m, end = _public_call(fmt)

    def once(**extra):
        dprob = torch.zeros(m, device="cuda")
        out = cudnn.grouped_gemm_dglu_wrapper(dprob_tensor=dprob, deterministic=True, **kw, **extra)
        return (out["d_row_tensor"][:end].view(torch.uint8).clone(), dprob.clone(),
                out["dbias_tensor"].view(torch.int16).clone())

    first = once(engine=engine)
    runs = [once(engine=engine) for _ in range(10)]
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        side.wait_stream(torch.cuda.current_stream())  # (the inputs), before the load is queued
        load = big @ big  # co-resident work on the default stream
        with torch.cuda.stream(side):
            runs.append(once(engine=engine))
        torch.cuda.current_stream().wait_stream(side)
        del load
    torch.cuda.synchronize()
    for d, dprob, dbias in runs:
        assert torch.equal(d, first[0]) and torch.equal(dprob, first[1]) and torch.equal(dbias, first[2])
    ref = once(engine="reference")
    assert rel_err(first[1][:end], ref[1][:end]) < TOL["dprob"]
    assert rel_err(first[2].view(torch.bfloat16).float(), ref[2].view(torch.bfloat16).float()) < TOL["dbias"]


def test_the_heuristics_pick_the_kernel_for_a_deterministic_call():
    """The class API with ``_deterministic`` and no engine named: the heuristics' choice is the
    Hopper kernel's engine (not the reference engine), in its fixed-order form."""
    skip_unless_sm90()
    import cudnn_ext as cudnn

    kw, m, _ = _public_call("bf16")
    L, N = kw["alpha_tensor"].shape[0], kw["c_tensor"].shape[1] // 2
    op = cudnn.GroupedGemmDglu(
        sample_a=kw["a_tensor"], sample_c=kw["c_tensor"],
        sample_d_row=torch.empty(m, 2 * N, dtype=torch.bfloat16, device="cuda"), sample_d_col=None,
        sample_sfa=None, sample_padded_offsets=kw["padded_offsets"], sample_alpha=kw["alpha_tensor"],
        sample_beta=kw["beta_tensor"], sample_prob=kw["prob_tensor"],
        sample_dprob=torch.zeros(m, device="cuda"), sample_b=kw["b_tensor"],
        sample_dbias=torch.zeros(L, 2 * N, dtype=torch.bfloat16, device="cuda"), _deterministic=True)
    op.compile()
    assert op.engine_name == "sm90_cutedsl", op.explain()
    assert op._plan.compiled.config.deterministic


@pytest.mark.parametrize("p", [1, 4, 7])
def test_dprob_fold_adds_the_partials_in_order(p):
    """``kernels.partials``' fold on its own: each row below the last offset gets exactly the
    fp32 sum of its P partials in ascending order added (bit for bit against that sum formed
    on the CPU), P across the unrolled loop's body and remainder; rows past the last offset
    (NaN-poisoned) keep their bytes."""
    skip_unless_sm90()
    from cudnn_ext.kernels.partials.launch import launch_fold

    g = torch.Generator().manual_seed(p)
    m = 1000
    # magnitudes 2^-12..2^12 apart within a row: another order of the adds rounds otherwise
    parts = torch.randn(p, m, generator=g) * torch.exp2(torch.randint(-12, 13, (p, m), generator=g).float())
    out = torch.randn(m, generator=g)
    end = 777
    out[end:] = float("nan")
    offsets = torch.tensor([300, 300, end], dtype=torch.int32)
    want = torch.zeros(m)
    for t in range(p):  # fp32 adds, one after another
        want = want + parts[t]
    want = out + want
    parts_d, out_d, offs_d = parts.cuda(), out.cuda(), offsets.cuda()
    launch_fold(parts_d.data_ptr(), out_d.data_ptr(), offs_d.data_ptr(), m, p, 3,
                torch.cuda.current_stream().cuda_stream)
    got = out_d.cpu()
    assert torch.equal(got[:end].view(torch.int32), want[:end].view(torch.int32))
    assert torch.equal(got[end:].view(torch.int32), out[end:].view(torch.int32))


@pytest.mark.parametrize("ragged", [False, True], ids=["offsets", "table"])
def test_dbias_fold_adds_each_experts_tiles_in_order(ragged):
    """``kernels.partials``' column fold on its own (no dprob rows): dbias[e, g] = bf16(dbias[e, g]
    + the fp32 sum of column g over expert e's M-tiles in ascending order), bit for bit against
    that sum formed on the CPU; experts with no tile (empty, or past the slab) keep their bits.
    Tile bounds from row offsets over 128 rows (in units of 2 tiles: none past the last whole
    unit), or from a unit table times cluster_m 2 (clamped to the slab)."""
    skip_unless_sm90()
    from cudnn_ext.kernels.partials.launch import ColumnFold, launch_fold

    g = torch.Generator().manual_seed(int(ragged))
    L, two_n, tiles = 5, 320, 13
    if ragged:  # cumulative units of 2 tiles: expert tiles [0,4) [4,4) [4,10) [10,12) [12,13)
        bounds, mul, div, ends = [2, 2, 5, 6, 7], 2, 1, [4, 4, 10, 12, 13]
    else:  # 128-row tiles: offsets 256, 256, 1000 (ceil: 8), 1280, 1400 (no whole unit past 1280)
        bounds, mul, div, ends = [256, 256, 1000, 1280, 1400], 1, 128, [2, 2, 8, 10, 10]
    cols = torch.randn(tiles, two_n, generator=g) * torch.exp2(
        torch.randint(-12, 13, (tiles, two_n), generator=g).float())
    dbias = torch.randn(L, two_n, generator=g).to(torch.bfloat16)
    dbias[1, :4] = torch.tensor([-0.0, float("nan"), float("inf"), 1.0])  # (expert 1 has no tile)
    want = dbias.clone()
    lo = 0
    for e, hi in enumerate(ends):
        s = torch.zeros(two_n)
        for t in range(lo, hi):  # fp32 adds, one after another
            s = s + cols[t]
        if hi > lo:
            want[e] = (dbias[e].float() + s).to(torch.bfloat16)
        lo = hi
    cols_d, db_d = cols.cuda(), dbias.cuda()
    bounds_d = torch.tensor(bounds, dtype=torch.int32).cuda()
    # (no rows: the bounds stand in for the offsets, which only the rows read)
    launch_fold(0, 0, bounds_d.data_ptr(), 0, 0, L, torch.cuda.current_stream().cuda_stream,
                ColumnFold(cols_d.data_ptr(), db_d.data_ptr(), bounds_d.data_ptr(), two_n, tiles, mul, div, 2))
    got = db_d.cpu()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
