"""deterministic=True (cudnn_ext takes it for every call; the vendor for block-scaled dprob
without dbias): the reference engine gives bit-identical D, dprob and dbias run to run, the Hopper
kernel's engines (BF16, fp8_blockwise and block-scaled operands) take it in the kernel's
fixed-order form, and the vendor's engine, which sums with atomics, declines it with a reason
(docs/semantics.md, "Determinism")."""
import dataclasses

import pytest
import torch
from fp8_blockwise_cases import case as fp8_case

import cudnn_ext as cudnn
from cudnn_ext import contract
from cudnn_ext.engines.registry import engine_by_name
from cudnn_ext.quant import quantize_mxfp8

BF16 = torch.bfloat16
L, N, K, M = 3, 64, 128, 768
OFFS = (256, 256, 768)


def _bf16_call(g):
    return dict(a_tensor=torch.randn(M, K, generator=g).to(BF16), c_tensor=torch.randn(M, 2 * N, generator=g).to(BF16),
                sfa_tensor=None, padded_offsets=torch.tensor(OFFS, dtype=torch.int32), alpha_tensor=torch.ones(L),
                beta_tensor=torch.ones(L), prob_tensor=torch.rand(M, generator=g),
                b_tensor=torch.randn(L, N, K, generator=g).to(BF16).permute(1, 2, 0), generate_dbias=True)


def _mxfp8_call(g):
    a_q, sfa = quantize_mxfp8(torch.randn(M, K, generator=g))
    b_q, sfb = quantize_mxfp8(torch.randn(N, K, L, generator=g))
    return dict(a_tensor=a_q, c_tensor=torch.randn(M, 2 * N, generator=g).to(BF16), sfa_tensor=sfa,
                padded_offsets=torch.tensor(OFFS, dtype=torch.int32), alpha_tensor=torch.ones(L),
                beta_tensor=torch.ones(L), prob_tensor=torch.rand(M, generator=g), b_tensor=b_q, sfb_tensor=sfb,
                sf_vec_size=32, norm_const_tensor=torch.ones(1), generate_dbias=True)


def _fp8_blockwise_call(g):
    t = fp8_case()
    return dict(a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offsets"],
                alpha_tensor=t["alpha"], beta_tensor=t["beta"], prob_tensor=t["prob"], b_tensor=t["b"],
                sfb_tensor=t["sfb"], generate_dbias=True, recipe="fp8_blockwise")


@pytest.mark.parametrize("make", [_bf16_call, _mxfp8_call, _fp8_blockwise_call], ids=["bf16", "mxfp8", "fp8_blockwise"])
def test_bit_identical_run_to_run(make):
    kw = make(torch.Generator().manual_seed(0))
    end = int(kw["padded_offsets"][-1])  # (D's rows past the last offset are unspecified)
    outs = []
    for _ in range(20):
        dprob = torch.zeros(kw["prob_tensor"].shape[0])
        out = cudnn.grouped_gemm_dglu_wrapper(dprob_tensor=dprob, deterministic=True, **kw)
        outs.append((out["d_row_tensor"][:end].view(torch.uint8).clone(), dprob.clone(), out["dbias_tensor"].clone()))
    for d, p, b in outs[1:]:
        assert torch.equal(d, outs[0][0]) and torch.equal(p, outs[0][1]) and torch.equal(b, outs[0][2])


def test_the_hopper_kernel_takes_it_and_the_vendor_engine_declines_it():
    """The sm90 kernel has a fixed-order form (``Sm90Config.deterministic``): its engines (BF16,
    fp8_blockwise, block-scaled on dequantized operands) take the problem and pin that form
    with split_last 1, and a block-scaled plan in that form launches through its tensor path
    (the partial sums are tensors); the vendor's engine, which sums with atomics, declines it."""
    from cudnn_ext.engines.sm90 import Sm90DgluEngine

    kw = _bf16_call(torch.Generator().manual_seed(1))
    ops = contract.Operands(a=kw["a_tensor"], c=kw["c_tensor"], padded_offsets=kw["padded_offsets"],
                            alpha=kw["alpha_tensor"], beta=kw["beta_tensor"], prob=kw["prob_tensor"],
                            dprob=torch.zeros(M), b=kw["b_tensor"])
    problem, _ = contract.normalize(ops, contract.CallConfig(deterministic=True), generate_dbias=True)
    assert problem.deterministic  # (a CPU problem: the engines' other reasons are about the device)
    assert not any("deterministic" in r for r in engine_by_name("sm90_cutedsl").check_support(problem))
    eng = Sm90DgluEngine()
    for cfg in eng.knob_space(problem):
        assert cfg.deterministic and cfg.split_last == 1
    plan = eng.build(problem, eng.knob_space(problem)[0])
    assert plan.address_launcher(False, 0) is None  # execute reduces the partial sums
    # and adds them to outputs that hold their values: no fresh-outputs call, no FFI call
    from cudnn_ext.engines.registry import Candidate
    from cudnn_ext.plan.execution import ExecutionPlan

    assert not ExecutionPlan(problem, Candidate(eng, plan.config, 0.0, "heuristic"), plan).fresh_outputs
    default = eng.build(dataclasses.replace(problem, deterministic=False),
                        eng.knob_space(dataclasses.replace(problem, deterministic=False))[0])
    assert ExecutionPlan(problem, Candidate(eng, default.config, 0.0, "heuristic"), default).fresh_outputs
    assert any("deterministic: the FFI call" in r
               for r in eng.xla_reasons(dataclasses.replace(problem, device_type="cuda")))
    fp8 = _fp8_blockwise_call(torch.Generator().manual_seed(3))
    ops8 = contract.Operands(a=fp8["a_tensor"], c=fp8["c_tensor"], sfa=fp8["sfa_tensor"],
                             padded_offsets=fp8["padded_offsets"], alpha=fp8["alpha_tensor"],
                             beta=fp8["beta_tensor"], prob=fp8["prob_tensor"],
                             dprob=torch.zeros(fp8["prob_tensor"].shape[0]), b=fp8["b_tensor"], sfb=fp8["sfb_tensor"])
    p8, _ = contract.normalize(ops8, contract.CallConfig(deterministic=True, recipe="fp8_blockwise"),
                               generate_dbias=True)
    assert not any("deterministic" in r for r in engine_by_name("sm90_fp8_blockwise").check_support(p8))
    (cfg8,) = engine_by_name("sm90_fp8_blockwise").knob_space(p8)
    assert cfg8.deterministic and cfg8.split_last == 1
    assert any("deterministic: not mapped" in r for r in engine_by_name("vendor_sm100").check_support(problem))
    assert engine_by_name("reference").check_support(problem) == []
    bs = _mxfp8_call(torch.Generator().manual_seed(2))
    ops = contract.Operands(a=bs["a_tensor"], c=bs["c_tensor"], sfa=bs["sfa_tensor"], padded_offsets=bs["padded_offsets"],
                            alpha=bs["alpha_tensor"], beta=bs["beta_tensor"], prob=bs["prob_tensor"],
                            dprob=torch.zeros(M), b=bs["b_tensor"], sfb=bs["sfb_tensor"], norm_const=bs["norm_const_tensor"])
    problem, _ = contract.normalize(ops, contract.CallConfig(sf_vec_size=32, deterministic=True), generate_dbias=True)
    bse = engine_by_name("sm90_blockscaled")
    assert not any("deterministic" in r for r in bse.check_support(problem))
    space = bse.knob_space(problem)
    assert space and all(cfg.deterministic and cfg.split_last == 1 for cfg in space)
    assert not bse.build(problem, space[0])._plain
