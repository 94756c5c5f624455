"""The activation registry (cudnn_ext.activations): every list of activation names is a lookup
there. A throwaway activation that nobody implements is accepted by the contract for the
operand families it names and declined, with a reason naming it, by every engine, the
reference included; the layer has no forward for it. The registered ones match what each
place implements."""
import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext import activations, contract
from cudnn_ext.engines import ENGINES
from cudnn_ext.kernels.layer.config import KERNEL_ACTS as LAYER_KERNEL_ACTS
from cudnn_ext.problem import ActConfig, DgluProblem
from cudnn_ext.reference.epilogue import LOCAL_DERIVATIVES
from cudnn_ext.torch.mlp import glu_config


@pytest.fixture
def throwaway():
    act = activations.register(activations.Activation("dtest", frozenset({activations.BF16}), vendor=False))
    yield act
    activations.unregister("dtest")


def _problem(act_func, block_scaled=False, device="cpu"):
    return DgluProblem(n=64, k=64, num_experts=2, m=512, weight_mode="dense", b_major="k",
                       ab_dtype=torch.bfloat16, c_dtype=torch.bfloat16, d_dtype=torch.bfloat16,
                       act=ActConfig(act_func=act_func), device_type=device)


def test_the_contract_takes_a_registered_activation_where_it_is_allowed(throwaway):
    act = contract.resolve_act(contract.CallConfig(act_func="dtest"), family=activations.BF16)
    assert act.act_func == "dtest" and act.linear_offset == 0.0
    with pytest.raises(ValueError, match="act_func: 'dtest' is supported by BF16 operands only"):
        contract.resolve_act(contract.CallConfig(act_func="dtest"), family=activations.BLOCK_SCALED)
    with pytest.raises(ValueError, match=r"act_func: must be one of \['dswiglu', 'dgeglu', 'dsituglu', 'dtest'\]"):
        contract.resolve_act(contract.CallConfig(act_func="dnone"), family=activations.BF16)


def test_every_engine_declines_an_activation_it_does_not_implement(throwaway):
    device = "cpu"
    problem = _problem("dtest", device=device)
    for engine in ENGINES:
        reasons = engine.check_support(problem)
        # named, or the engine declines this problem whatever its activation (the block-scaled
        # engine takes no BF16 operands)
        assert any("dtest" in r for r in reasons) or engine.check_support(_problem("dswiglu", device=device)), \
            (engine.name, reasons)
        assert reasons, engine.name


def test_a_call_with_it_names_every_engines_reason(throwaway):
    L, N, K, M = 2, 64, 64, 512
    with pytest.raises(cudnn.NoEngineError, match="dtest"):
        cudnn.grouped_gemm_dglu_wrapper(
            a_tensor=torch.zeros(M, K, dtype=torch.bfloat16), c_tensor=torch.zeros(M, 2 * N, dtype=torch.bfloat16),
            sfa_tensor=None, padded_offsets=torch.tensor([256, 512], dtype=torch.int32),
            alpha_tensor=torch.ones(L), beta_tensor=torch.ones(L), prob_tensor=torch.ones(M),
            dprob_tensor=torch.zeros(M), b_tensor=torch.zeros(L, N, K, dtype=torch.bfloat16).permute(1, 2, 0),
            act_func="dtest")


def test_the_layer_has_no_forward_for_it(throwaway):
    with pytest.raises(ValueError, match=r"activation: must be one of \['swiglu', 'geglu'\], got 'dtest'"):
        glu_config("dtest")


def test_the_registered_activations_are_implemented_where_they_are_named():
    assert activations.names() == ("dswiglu", "dgeglu", "dsituglu")
    assert activations.names("bf16") == ("dswiglu", "dgeglu")
    assert set(LOCAL_DERIVATIVES) == set(activations.names())  # the reference, every one
    assert set(LAYER_KERNEL_ACTS) == set(activations.layer_names())  # the layer's forward kernel
    pytest.importorskip("cutlass")
    from cudnn_ext.kernels.sm90.config import KERNEL_ACTS

    assert set(KERNEL_ACTS) == set(activations.names())  # the Hopper epilogue, every one
    # the vendor's defaults and rules
    assert [activations.activation(n).default_linear_offset for n in activations.names()] == [0.0, 1.0, 0.0]
    assert activations.DGEGLU.activation_output == set(activations.CONTRACTS)  # cudnn_ext's, every contract
    assert activations.DGEGLU.vendor_activation_output == {activations.BF16}  # the vendor's
    assert activations.DGEGLU.beta_scales_c == {activations.BF16, activations.FP8_BLOCKWISE}
    assert activations.names("fp8_blockwise") == ("dswiglu", "dgeglu", "dsituglu")  # cudnn_ext's recipe
    assert glu_config("geglu")["linear_offset"] == 1.0 and glu_config("swiglu")["act_func"] == "dswiglu"
