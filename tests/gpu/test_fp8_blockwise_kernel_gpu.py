"""The fp8_blockwise recipe on the Hopper kernel (engine ``sm90_fp8_blockwise``: FP8 WGMMA, one
promotion per 128-K scale block) against the float64 oracle on the dequantized operands: every
activation, bf16/fp32 D, dbias, the activation output, ragged groups, a partial N tile, scales
spread over 2^-6..2^6 per block; D and the activation output poisoned with NaN before the call
(rows past the last offset must stay NaN), no host sync; an FP8 D (D_row/D_col with their
scales) dequantized against the oracle. A misplaced scale moves D by far more than the
tolerance."""
import pytest
import torch
from fp8_blockwise_cases import BF16_D_TOL, KTOL, L, activation_close, case, reference, rel, wrapper_on

import cudnn_ext as cudnn

pytestmark = pytest.mark.gpu


def _skip():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def run(t, act="dswiglu", d_dtype=torch.float32, dbias=True, activation=False, m_aligned=256):
    on = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    m, n = t["m"], t["c"].shape[1] // 2
    d = torch.full((m, 2 * n), float("nan"), dtype=d_dtype, device="cuda")
    dprob = torch.zeros(m, device="cuda")
    db = torch.zeros(L, 2 * n, dtype=torch.bfloat16, device="cuda") if dbias else None
    act_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") if activation else None
    tensors = dict(a=on["a"], c=on["c"], d_row=d, d_col=None, sfa=on["sfa"], padded_offsets=on["offsets"],
                   alpha=on["alpha"], beta=on["beta"], prob=on["prob"], dprob=dprob, b=on["b"], sfb=on["sfb"],
                   dbias=db, activation=act_out)
    op = cudnn.GroupedGemmDglu(**{f"sample_{k}": v for k, v in tensors.items()}, act_func=act,
                               recipe="fp8_blockwise", m_aligned=m_aligned)
    assert op.check_support() and op.engine_name == "sm90_fp8_blockwise", op.engine_name
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        op.execute(**{f"{k}_tensor" if k != "padded_offsets" else k: v for k, v in tensors.items()})
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return {"d": d.cpu(), "dprob": dprob.cpu(), "dbias": None if db is None else db.cpu(),
            "activation": None if act_out is None else act_out.cpu()}


def _dbias_of(d, offsets):
    """Per expert column sums of ``d`` (float64) and of its magnitudes."""
    d = d.double()
    starts = [0] + offsets[:-1].tolist()
    sums = torch.stack([d[a:b].sum(0) for a, b in zip(starts, offsets.tolist())])
    mags = torch.stack([d[a:b].abs().sum(0) for a, b in zip(starts, offsets.tolist())])
    return sums, mags


def check(got, ref, end, activation=False, offsets=None):
    errs = {"d": rel(got["d"], ref["d"], end), "dprob": rel(got["dprob"], ref["dprob"], end)}
    print({k: f"{v:.2e}" for k, v in errs.items()})
    d_tol = BF16_D_TOL if got["d"].dtype == torch.bfloat16 else KTOL
    assert errs["d"] < d_tol and errs["dprob"] < KTOL, errs
    assert torch.isnan(got["d"][end:].float()).all()  # rows past the last offset untouched
    if got["dbias"] is not None:
        # dbias is the column sums of the kernel's own D (D itself is checked above), then one
        # bf16 rounding: against those sums, within the rounding plus D's own (a bf16 D) or
        # fp32 summation order (an fp32 D); a column or expert mixed up is far outside
        sums, mags = _dbias_of(got["d"][:end], offsets)
        slack = 2.0 ** -8 if got["d"].dtype == torch.bfloat16 else 1e-5
        assert ((got["dbias"].double() - sums).abs() <= 2.0 ** -8 * sums.abs() + slack * mags).all()
    if activation:
        assert activation_close(got["activation"][:end], ref["activation"][:end])
        assert torch.isnan(got["activation"][end:].float()).all()


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu", "dsituglu"])
@pytest.mark.parametrize("d_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_matches_the_oracle(act, d_dtype):
    _skip()
    t = case()  # N 160: a partial N tile; an empty expert
    ref = reference(t, act)
    check(run(t, act, d_dtype), ref, int(t["offsets"][-1]), offsets=t["offsets"])


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
def test_kernel_ragged_groups_and_the_activation_output(act):
    _skip()
    t = case(sizes=(136, 0, 1000), extra_rows=40, seed=1)
    ref = reference(t, act)
    check(run(t, act, torch.bfloat16, activation=True, m_aligned=8), ref, int(t["offsets"][-1]), activation=True,
          offsets=t["offsets"])


def test_kernel_wider_problem():
    _skip()
    t = case(sizes=(512, 256, 768), n=512, k=1024, seed=2)
    ref = reference(t, "dswiglu")
    check(run(t, activation=True, d_dtype=torch.bfloat16), ref, int(t["offsets"][-1]), activation=True,
          offsets=t["offsets"])


def test_a_misplaced_scale_fails_the_tolerance():
    _skip()
    t = case(seed=3)
    ref = reference(t)
    end = int(t["offsets"][-1])
    moved = dict(t, sfa=t["sfa"].clone())
    moved["sfa"][:, 0], moved["sfa"][:, 1] = t["sfa"][:, 1], t["sfa"][:, 0]  # A's first two K blocks
    assert rel(run(moved)["d"], ref["d"], end) > 10 * KTOL
    flipped = torch.empty_strided(t["sfb"].shape, t["sfb"].stride()).copy_(t["sfb"].flip(-1))  # experts swapped
    assert rel(run(dict(t, sfb=flipped))["d"], ref["d"], end) > 10 * KTOL


def test_kernel_fp8_d():
    """An e4m3 D through the wrapper: D_row (1x128 scales) and D_col (128x1 scales), each
    dequantized, within e4m3's rounding (2^-4 relative per element) of the oracle's D."""
    _skip()
    from cudnn_ext.quant import dequantize_fp8_blockwise

    t = case(sizes=(256, 0, 512), seed=4)
    ref = reference(t)
    end = int(t["offsets"][-1])
    out, _, engine = wrapper_on(t, "cuda", d_dtype=torch.float8_e4m3fn)
    assert engine == "sm90_fp8_blockwise"
    dprob = out["dprob_tensor"]
    d_row = dequantize_fp8_blockwise(out["d_row_tensor"][:end].squeeze(-1).cpu(),
                                     out["sfd_row_tensor"][:end].squeeze(-1).cpu(), (1, 128), out_dtype=torch.float64)
    d_col = dequantize_fp8_blockwise(out["d_col_tensor"][:end].squeeze(-1).cpu(),
                                     out["sfd_col_tensor"][: end // 128].squeeze(-1).cpu(), (128, 1),
                                     out_dtype=torch.float64)
    # D_col's 128-row blocks span rows of very different sizes (A's row scales differ): its
    # small rows round coarsely, so it is judged over the whole matrix, D_row row by row
    want = ref["d"][:end]
    errs = (rel(d_row, ref["d"], end), ((d_col - want).norm() / want.norm()).item(),
            rel(dprob.cpu(), ref["dprob"], end))
    print(errs)
    assert errs[0] < 2.0 ** -4 and errs[1] < 2.0 ** -4 and errs[2] < KTOL, errs


_PINNED = {"pp64": dict(tile_n=64, cluster_m=2),
           "staggered": dict(tile_n=128, c_stages=2, cluster_m=2, cooperative=True, wg_stagger=True)}


@pytest.mark.parametrize("form", sorted(_PINNED))
@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
def test_pinned_forms_match_the_oracle(act, form):
    """e4m3 configurations outside the knob space, pinned through the engine's build: the
    ping-pong 128 x 64 one (2x1 clusters; the same promotion over a warpgroup's two 64-row
    halves, the other warpgroup's epilogue under its mainloop) and the cooperative one with
    ``wg_stagger`` (the second warpgroup a k-tile behind: a missed barrier arrival hangs, a
    reordered promotion shows in D)."""
    _skip()
    from cudnn_ext import contract
    from cudnn_ext.engines.sm90 import config_for
    from cudnn_ext.engines.sm90_fp8_blockwise import Sm90Fp8BlockwiseEngine, kernel_problem

    # 32 slab pairs x 5 N-tiles of 128: 2-3 units per 2-CTA cluster (each warpgroup's barrier
    # re-armed tile after tile); 8 k-tiles, more than the 6 A/B stages (wg_stagger's rule)
    n = 640
    t = case(sizes=(4096, 0, 4096), n=n, k=1024, seed=5)
    ref = reference(t, act)
    end = int(t["offsets"][-1])
    on = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    m = t["m"]
    ops = contract.Operands(a=on["a"], c=on["c"], sfa=on["sfa"], padded_offsets=on["offsets"], alpha=on["alpha"],
                            beta=on["beta"], prob=on["prob"], dprob=torch.zeros(m, device="cuda"), b=on["b"],
                            sfb=on["sfb"], d_row=torch.full((m, 2 * n), float("nan"), device="cuda"),
                            dbias=torch.zeros(L, 2 * n, dtype=torch.bfloat16, device="cuda"))
    problem, pack = contract.normalize(ops, contract.CallConfig(act_func=act, recipe="fp8_blockwise"))
    eng = Sm90Fp8BlockwiseEngine()
    cfg = config_for(kernel_problem(problem), **_PINNED[form])
    assert cfg.blockwise() and cfg.cooperative == (form == "staggered")
    plan = eng.build(problem, cfg)
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    plan.execute(pack, ws)
    torch.cuda.synchronize()
    got = {"d": ops.d_row.cpu(), "dprob": ops.dprob.cpu(), "dbias": ops.dbias.cpu(), "activation": None}
    check(got, ref, end, offsets=t["offsets"])
