"""The activation output (prob x the activation value, bf16 (M, N)) for every activation: the
vendor's is dGeGLU's with BF16 operands; cudnn_ext's covers dSwiGLU, dGeGLU and dSiTU-GLU with
BF16 operands, block-scaled operands with a 16-bit D and the fp8_blockwise recipe. The
reference engine against the float64 oracle; the Hopper engines take every one (their GPU
tests: tests/gpu/test_sm90_correctness.py), the vendor's declines what it does not store, with
a reason."""
import pytest
import torch
from fp8_blockwise_cases import case as fp8_case
from oracle import oracle

import cudnn_ext as cudnn
from cudnn_ext import contract
from cudnn_ext.engines.registry import engine_by_name
from cudnn_ext.quant import dequantize, quantize_nvfp4

BF16 = torch.bfloat16
L, N, K = 2, 64, 64
OFFS = (256, 512)


def _operands(g):
    a = torch.randn(512, K, generator=g)
    w = torch.randn(L, N, K, generator=g) / 4
    c = (torch.randn(512, 2 * N, generator=g) * 2).to(BF16)
    return a, w, c, torch.rand(L, generator=g) + 0.5, torch.rand(512, generator=g)


def _check(act_out, ref, end):
    got, want = act_out[:end].double(), ref["activation"][:end]
    assert ((got - want).abs() <= 2.0 ** -8 * want.abs() + 1e-6).all()  # one bf16 rounding
    assert (want.abs() > 0).float().mean() > 0.5  # (a check that sees values)


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu"])
def test_bf16_operands(act):
    g = torch.Generator().manual_seed(0)
    a, w, c, alpha, prob = _operands(g)
    beta = torch.rand(L, generator=g) + 0.5
    act_out = torch.full((512, N), float("nan"), dtype=BF16)
    cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a.to(BF16), c_tensor=c, sfa_tensor=None, padded_offsets=torch.tensor(OFFS, dtype=torch.int32),
        alpha_tensor=alpha, beta_tensor=beta, prob_tensor=prob, dprob_tensor=torch.zeros(512),
        b_tensor=w.to(BF16).permute(1, 2, 0), act_func=act, activation_tensor=act_out)
    ref = oracle(a.to(BF16), [w[e].to(BF16) for e in range(L)], c, OFFS, alpha, beta, prob, act_func=act)
    _check(act_out, ref, OFFS[-1])


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu", "dsituglu"])
def test_block_scaled_operands_with_a_16_bit_d(act):
    """NVFP4 operands, bf16 D; beta 1 (block-scaled dGeGLU reads C without beta)."""
    g = torch.Generator().manual_seed(1)
    a, w, c, alpha, prob = _operands(g)
    a_q, sfa = quantize_nvfp4(a)
    b_q, sfb = quantize_nvfp4(w.permute(1, 2, 0))
    act_out = torch.full((512, N), float("nan"), dtype=BF16)
    beta = torch.ones(L)
    cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=a_q, c_tensor=c, sfa_tensor=sfa, padded_offsets=torch.tensor(OFFS, dtype=torch.int32),
        alpha_tensor=alpha, beta_tensor=beta, prob_tensor=prob, dprob_tensor=torch.zeros(512), b_tensor=b_q,
        sfb_tensor=sfb, act_func=act, activation_tensor=act_out, d_dtype=BF16)
    a64 = dequantize(a_q, sfa, 16, out_dtype=torch.float64)
    b64 = dequantize(b_q, sfb, 16, out_dtype=torch.float64)
    ref = oracle(a64, [b64[..., e] for e in range(L)], c, OFFS, alpha, beta, prob, act_func=act)
    _check(act_out, ref, OFFS[-1])
    with pytest.raises(ValueError, match=r"activation_tensor: activation output is supported only by the BF16 "
                                         r"kernel in the vendor's contract; .* got D float32"):
        cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=a_q, c_tensor=c, sfa_tensor=sfa, padded_offsets=torch.tensor(OFFS, dtype=torch.int32),
            alpha_tensor=alpha, beta_tensor=beta, prob_tensor=prob, dprob_tensor=torch.zeros(512), b_tensor=b_q,
            sfb_tensor=sfb, act_func=act, activation_tensor=act_out, d_dtype=torch.float32)


def test_fp8_blockwise_recipe_dsituglu():
    t = fp8_case()
    act_out = torch.full((t["m"], t["c"].shape[1] // 2), float("nan"), dtype=BF16)
    cudnn.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offsets"], alpha_tensor=t["alpha"],
        beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=torch.zeros(t["m"]), b_tensor=t["b"],
        sfb_tensor=t["sfb"], act_func="dsituglu", activation_tensor=act_out, recipe="fp8_blockwise")
    from fp8_blockwise_cases import reference

    end = int(t["offsets"][-1])
    _check(act_out, reference(t, "dsituglu"), end)
    assert torch.isnan(act_out[end:].float()).all()  # rows past the last offset untouched


def test_the_hopper_engines_take_it_and_the_vendor_declines_with_a_reason():
    g = torch.Generator().manual_seed(2)
    a, w, c, alpha, prob = _operands(g)
    ops = contract.Operands(a=a.to(BF16), c=c, padded_offsets=torch.tensor(OFFS, dtype=torch.int32), alpha=alpha,
                            beta=alpha, prob=prob, dprob=torch.zeros(512), b=w.to(BF16).permute(1, 2, 0),
                            activation=torch.empty(512, N, dtype=BF16))
    problem, _ = contract.normalize(ops, contract.CallConfig(act_func="dswiglu"))
    assert problem.generate_activation
    assert not any("activation" in r for r in engine_by_name("sm90_cutedsl").check_support(problem))
    assert any("the vendor's is dGeGLU's with BF16 operands" in r
               for r in engine_by_name("vendor_sm100").check_support(problem))
    a_q, sfa = quantize_nvfp4(a)
    b_q, sfb = quantize_nvfp4(w.permute(1, 2, 0))
    bs = contract.Operands(a=a_q, c=c, sfa=sfa, padded_offsets=ops.padded_offsets, alpha=alpha, beta=alpha,
                           prob=prob, dprob=torch.zeros(512), b=b_q, sfb=sfb, d_row=torch.empty(512, 2 * N, dtype=BF16),
                           activation=torch.empty(512, N, dtype=BF16))
    problem, _ = contract.normalize(bs, contract.CallConfig(act_func="dgeglu"))
    assert not any("activation" in r for r in engine_by_name("sm90_blockscaled").check_support(problem))
