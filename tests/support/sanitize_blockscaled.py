"""One small block-scaled case on the device, for compute-sanitizer runs:

    PYTHONPATH=.:tests/support compute-sanitizer --tool memcheck python3 tests/support/sanitize_blockscaled.py MODE

MODE: ``dense`` (NVFP4 A and dense B through the dequantizer, then the sm90 kernel with prob,
dprob and amax), ``discrete`` (MXFP4 per-expert ``b_ptrs``/``sfb_ptrs``: the dequantizer's
pointer-table form, which skips the expert without rows), ``reference`` (the reference
engine on the GPU with per-expert pointers: the CuTe DSL pointer gather of
``kernels.pointer_gather``), ``mxfp8`` (MXFP8 operands: the dequantizer's FP8 form, then the
kernel's quantizing epilogue writing D_row/SFD_row and D_col/SFD_col with the per-expert
``discrete_col_sfd`` layout: its warp pairs' shared-memory exchange). Each run compares with the reference engine's result on the
same device and exits non-zero on a mismatch, so a clean report of a wrong result fails.
"""
import sys

import torch

import cudnn_ext as cudnn
from cudnn_ext.quant import dequantize, quantize_mxfp8, quantize_nvfp4

from sm90_cases import rel_err

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu


def _case(vec, sf_dtype, counts=(256, 0, 512), n=96, k=256):
    torch.manual_seed(0)
    m = sum(counts) + 256  # rows past the last offset
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    a_q, sfa = quantize_nvfp4(torch.randn(m, k, device="cuda"), sf_vec_size=vec, sf_dtype=sf_dtype)
    w = torch.randn(len(counts), n, k, device="cuda") * 0.2
    b_q, sfb = quantize_nvfp4(w.permute(1, 2, 0), sf_vec_size=vec, sf_dtype=sf_dtype)
    experts = [quantize_nvfp4(w[g], sf_vec_size=vec, sf_dtype=sf_dtype) for g in range(len(counts))]
    sfbs = [sf.permute(5, 2, 4, 0, 1, 3).contiguous() for _, sf in experts]
    kw = dict(a_tensor=a_q, c_tensor=(torch.randn(m, 2 * n, device="cuda") * 2).to(torch.bfloat16),
              sfa_tensor=sfa, padded_offsets=offs, alpha_tensor=torch.rand(len(counts), device="cuda") + 0.5,
              beta_tensor=torch.rand(len(counts), device="cuda") + 0.5,
              prob_tensor=torch.rand(m, device="cuda"), sf_vec_size=vec)
    dense = dict(b_tensor=b_q, sfb_tensor=sfb)
    ptrs = [0 if c == 0 else q.data_ptr() for c, (q, _) in zip(counts, experts)]
    discrete = dict(b_ptrs=torch.tensor(ptrs, dtype=torch.int64, device="cuda"),
                    sfb_ptrs=torch.tensor([s.data_ptr() for s in sfbs], dtype=torch.int64, device="cuda"),
                    n=n, b_dtype=a_q.dtype, b_major="k")
    return kw, dense, discrete, (experts, sfbs), int(offs[-1])


def _mxfp8(engine):
    """One MXFP8 wrapper call (SFD generated, per-expert SFD_col) on a small case: the
    dequantized D_row over the written rows, dprob."""
    torch.manual_seed(0)
    counts, n, k = (256, 0, 512), 96, 256
    m = sum(counts) + 256
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    a_q, sfa = quantize_mxfp8(torch.randn(m, k, device="cuda"))
    b_q, sfb = quantize_mxfp8((torch.randn(len(counts), n, k, device="cuda") * 0.2).permute(1, 2, 0))
    dprob = torch.zeros(m, device="cuda")
    out = cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=(torch.randn(m, 2 * n, device="cuda") * 2).to(torch.bfloat16),
        sfa_tensor=sfa, padded_offsets=offs, alpha_tensor=torch.rand(3, device="cuda") + 0.5,
        beta_tensor=torch.rand(3, device="cuda") + 0.5, prob_tensor=torch.rand(m, device="cuda"),
        dprob_tensor=dprob, b_tensor=b_q, sfb_tensor=sfb, sf_vec_size=32,
        norm_const_tensor=torch.ones(1, device="cuda"), discrete_col_sfd=True, engine=engine)
    torch.cuda.synchronize()
    last = sum(counts)
    d = dequantize(out["d_row_tensor"][..., 0], out["sfd_row_tensor"], 32)[:last]
    return d, dprob[:last]


def _run(kw, weights, engine):
    dprob = torch.zeros(kw["c_tensor"].shape[0], device="cuda")
    out = cudnn.grouped_gemm_dglu_wrapper(**kw, **weights, dprob_tensor=dprob, engine=engine)
    torch.cuda.synchronize()
    return out


def main(mode: str) -> str:
    if mode == "mxfp8":
        (d, dprob), (d_ref, dprob_ref) = _mxfp8("sm90_blockscaled"), _mxfp8("reference")
        errs = {"d": rel_err(d, d_ref), "dprob": rel_err(dprob, dprob_ref)}
        if errs["d"] > 6e-2 or errs["dprob"] > 2e-3:  # D: e4m3 codes (3 mantissa bits)
            raise SystemExit(f"{mode}: relative errors against the reference engine {errs}")
        return f"{mode}: ok {errs}"
    if mode == "dense":
        kw, dense, _, _keep, last = _case(16, E4M3)
        weights, engine = dense, "sm90_blockscaled"
    elif mode == "discrete":
        kw, _, discrete, _keep, last = _case(32, E8M0)
        weights, engine = discrete, "sm90_blockscaled"
    elif mode == "reference":
        kw, _, discrete, _keep, last = _case(32, E8M0)
        weights, engine = discrete, "reference"
    else:
        raise SystemExit(f"mode: expected dense, discrete, reference or mxfp8, got {mode!r}")
    got = _run(kw, weights, engine)
    ref = _run(kw, weights, "reference")
    errs = {"d": rel_err(got["d_row_tensor"][:last], ref["d_row_tensor"][:last]),
            "dprob": rel_err(got["dprob_tensor"].view(-1)[:last], ref["dprob_tensor"].view(-1)[:last])}
    amax, amax_ref = got["amax_tensor"], ref["amax_tensor"]
    if not torch.allclose(amax, amax_ref, rtol=1e-3):
        raise SystemExit(f"{mode}: amax {amax.view(-1).tolist()} != reference {amax_ref.view(-1).tolist()}")
    if errs["d"] > 1.5e-2 or errs["dprob"] > 2e-3:
        raise SystemExit(f"{mode}: relative errors against the reference engine {errs}")
    return f"{mode}: ok {errs}"


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "dense"))
