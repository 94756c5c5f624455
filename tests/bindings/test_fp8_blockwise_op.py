"""torch.ops.cudnn_ext.grouped_gemm_dglu_fp8_blockwise: the recipe as a functional op, equal to
the wrapper's call, through opcheck, fake tensors and torch.compile; its own argument rules."""
import pytest
import torch
from fp8_blockwise_cases import L, N, case, reference, rel

import cudnn_ext
from cudnn_ext.torch import grouped_gemm_dglu_fp8_blockwise


def _op_args(t):
    return (t["a"], t["sfa"], t["b"].permute(2, 0, 1), t["sfb"].permute(2, 0, 1), t["c"], t["offsets"], t["alpha"],
            t["beta"], t["prob"])


@pytest.mark.parametrize("act", ["dswiglu", "dgeglu", "dsituglu"])
def test_op_equals_the_wrapper_and_the_oracle(act):
    t = case()
    d, dprob, dbias = grouped_gemm_dglu_fp8_blockwise(*_op_args(t), act_func=act, generate_dbias=True,
                                                      d_dtype=torch.float32)
    w_dprob = torch.zeros(t["m"])
    w = cudnn_ext.grouped_gemm_dglu_wrapper(
        a_tensor=t["a"], c_tensor=t["c"], sfa_tensor=t["sfa"], padded_offsets=t["offsets"], alpha_tensor=t["alpha"],
        beta_tensor=t["beta"], prob_tensor=t["prob"], dprob_tensor=w_dprob, b_tensor=t["b"], sfb_tensor=t["sfb"],
        generate_dbias=True, d_dtype=torch.float32, act_func=act, recipe="fp8_blockwise")
    end = int(t["offsets"][-1])
    assert torch.equal(d[:end], w["d_row_tensor"][:end, :, 0]) and torch.equal(dprob, w_dprob)
    assert torch.equal(dbias, w["dbias_tensor"][..., 0]) and dbias.shape == (L, 2 * N)
    assert rel(d, reference(t, act)["d"], end) < 2e-5
    _, _, none = grouped_gemm_dglu_fp8_blockwise(*_op_args(t))
    assert none is None


def test_opcheck_fake_and_compile():
    t = case(sizes=(256, 0, 256), extra_rows=0)
    args = _op_args(t)
    # (opcheck's schema test compares the inputs after the call with float ops that torch's CPU
    # build lacks for float8_e4m3fn; the fake-tensor and registration tests run)
    torch.library.opcheck(torch.ops.cudnn_ext.grouped_gemm_dglu_fp8_blockwise.default, args,
                          {"generate_dbias": True, "act_func": "dgeglu"},
                          test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"))
    row_major_sfa = t["sfa"].contiguous()
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = [mode.from_tensor(x) for x in args]
        d, dprob, dbias = torch.ops.cudnn_ext.grouped_gemm_dglu_fp8_blockwise(*fake, generate_dbias=True)
        assert d.shape == (t["m"], 2 * N) and d.dtype == torch.bfloat16 and dbias.shape == (L, 2 * N)
        with pytest.raises(ValueError, match=r"sfa_tensor: scales must be MN-major"):
            torch.ops.cudnn_ext.grouped_gemm_dglu_fp8_blockwise(fake[0], mode.from_tensor(row_major_sfa),
                                                                *fake[2:])
    eager = grouped_gemm_dglu_fp8_blockwise(*args, generate_dbias=True)
    compiled = torch.compile(lambda *xs: grouped_gemm_dglu_fp8_blockwise(*xs, generate_dbias=True), fullgraph=True)
    got = compiled(*args)
    assert all(torch.equal(x, y) for x, y in zip(got, eager))


def test_op_argument_rules():
    t = case()
    args = _op_args(t)
    with pytest.raises(ValueError, match=r"d_dtype: the op returns a bfloat16, float16 or float32 D"):
        grouped_gemm_dglu_fp8_blockwise(*args, d_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"b: shape must be \(L, N, K\)"):
        grouped_gemm_dglu_fp8_blockwise(args[0], args[1], args[2][0], *args[3:])
