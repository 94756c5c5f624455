"""One small fp8_blockwise case on the device, for compute-sanitizer runs:

    PYTHONPATH=.:tests/support compute-sanitizer --tool memcheck python3 tests/support/sanitize_fp8_blockwise.py MODE

MODE: ``coop`` (the engine's cooperative 128 x 128 e4m3 form in 2x1 clusters on enough tiles
that every cluster walks several: the promotion's scale loads at the last k-tile and row,
an empty expert, rows past the last offset), ``ragged`` (groups of any row count: the ragged
schedule, whose tiles run past their expert's end, with the activation output), ``pp64`` (the
ping-pong 128 x 64 form: the hand-over between the math warpgroups), ``stagger`` (the
cooperative form with ``wg_stagger`` and no dbias, whose hand-over would otherwise order the
warpgroups: the named barrier the second warpgroup waits on, tile after tile), ``quant`` (the blockwise
quantizer kernel: 1x128 and 128x128 blocks with ragged edges). Each run compares with the
float64 oracle (``quant``: with the reference quantizer, bit for bit) and exits non-zero on a
mismatch, so a clean report of a wrong result fails.
"""
import sys

import torch
from fp8_blockwise_cases import BF16_D_TOL, KTOL, L, activation_close, case, reference, rel


def _kernel(mode: str) -> str:
    from cudnn_ext import contract
    from cudnn_ext.engines.sm90 import config_for
    from cudnn_ext.engines.sm90_fp8_blockwise import Sm90Fp8BlockwiseEngine, kernel_problem

    act = "dgeglu" if mode == "ragged" else "dswiglu"
    if mode == "ragged":
        t = case(sizes=(136, 0, 1000), extra_rows=40, seed=1)
    else:  # 32 slab pairs (8192 rows) x 5 N-tiles of 128 (N 640): 2-3 units per 2-CTA cluster
        t = case(sizes=(4096, 0, 4096), n=640, k=768, seed=5)
    on = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    m, n = t["m"], t["c"].shape[1] // 2
    act_out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") if mode == "ragged" else None
    ops = contract.Operands(a=on["a"], c=on["c"], sfa=on["sfa"], padded_offsets=on["offsets"], alpha=on["alpha"],
                            beta=on["beta"], prob=on["prob"], dprob=torch.zeros(m, device="cuda"), b=on["b"],
                            sfb=on["sfb"], d_row=torch.full((m, 2 * n), float("nan"), device="cuda",
                                                            dtype=torch.bfloat16),
                            dbias=None if mode == "stagger" else torch.zeros(L, 2 * n, dtype=torch.bfloat16,
                                                                               device="cuda"),
                            activation=act_out)
    problem, pack = contract.normalize(ops, contract.CallConfig(act_func=act, recipe="fp8_blockwise",
                                                                m_aligned=8 if mode == "ragged" else 256),
                                       generate_dbias=mode != "stagger")
    eng = Sm90Fp8BlockwiseEngine()
    if mode == "pp64":
        cfg = config_for(kernel_problem(problem), tile_n=64, cluster_m=2)
    elif mode == "stagger":
        cfg = config_for(kernel_problem(problem), tile_n=128, c_stages=2, cluster_m=2, cooperative=True,
                         wg_stagger=True)
    else:
        (cfg,) = eng.knob_space(problem)
    plan = eng.build(problem, cfg)
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    plan.execute(pack, ws)
    torch.cuda.synchronize()
    ref = reference(t, act)
    end = int(t["offsets"][-1])
    errs = {"d": rel(ops.d_row.cpu(), ref["d"], end), "dprob": rel(ops.dprob.cpu(), ref["dprob"], end)}
    if errs["d"] > BF16_D_TOL or errs["dprob"] > KTOL or not torch.isnan(ops.d_row[end:].float()).all():
        raise SystemExit(f"{mode}: wrong result {errs} (or rows past {end} written)")
    if act_out is not None and not activation_close(act_out[:end].cpu(), ref["activation"][:end]):
        raise SystemExit(f"{mode}: wrong activation output")
    return f"{mode} ({cfg.tile_n}, cooperative={cfg.cooperative}, ragged={cfg.ragged_m}): {errs}"


def _quant() -> str:
    from cudnn_ext.quant import quantize_fp8_blockwise as ref_quantize
    from cudnn_ext.torch import quant_ops

    g = torch.Generator().manual_seed(3)
    out = []
    for shape, block in (((200, 392), (1, 128)), ((264, 392, 3), (128, 128))):
        x = torch.randn(*shape, generator=g) * 4
        if len(shape) == 3:  # weights as the op takes them: (L, N, K) storage viewed (N, K, L)
            x = x.permute(2, 0, 1).contiguous().permute(1, 2, 0)
        if quant_ops.kernel_geometry(x.cuda()) is None:
            raise SystemExit(f"quant {shape}: the op would not run the kernel")
        q, s = quant_ops.quantize_fp8_blockwise(x.cuda(), block)
        rq, rs = ref_quantize(x, block)
        if not (torch.equal(q.cpu().view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s.cpu(), rs)):
            raise SystemExit(f"quant {shape} {block}: differs from the reference quantizer")
        out.append(f"{shape} {block} ok")
    return "; ".join(out)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "coop"
    print(_quant() if mode == "quant" else _kernel(mode))
