"""One case per validation rule of the BF16 contract (``cudnn_ext/contract/``) and of the
class API (``cudnn_ext/api/klass.py``): the exception type, that the message names the
argument, and that a rejected call allocated nothing and left every caller tensor (dprob
included) bit-for-bit unchanged.

Rules the issue/spec asks for that the contract does not (yet) enforce, or messages that do not
name the argument the caller used, are strict xfails: they start passing when the lead fixes
the contract, and then the xfail marker must go.
"""
from __future__ import annotations

import contextlib
import math

import pytest
import torch

import cudnn_ext as cudnn

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
M, K, N, L = 256, 64, 32, 2


# --------------------------------------------------------------------------- helpers
def weights(l=L, n=N, k=K):
    return torch.randn(l, n, k).to(BF16)


def dense_b(l=L, n=N, k=K):
    return weights(l, n, k).permute(1, 2, 0)  # (N, K, L), stride (K, 1, N*K)


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """Same shape, strides, dtype and values, but the data pointer one element past a 64-B
    aligned allocation (so not 16-byte aligned)."""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    flat = torch.zeros(span + 16, dtype=t.dtype)
    v = torch.as_strided(flat, t.shape, t.stride(), 1)
    v.copy_(t)
    assert v.data_ptr() % 16
    return v


def strided_1d(t: torch.Tensor) -> torch.Tensor:
    """A (L,) view with stride 2 and the same values (16-B aligned base)."""
    buf = torch.zeros(2 * t.numel(), dtype=t.dtype)
    v = buf[::2]
    v.copy_(t)
    return v


def base_call(mode="dense"):
    """Valid wrapper keyword arguments (M=256, K=64, N=32, L=2; the second expert empty)."""
    kw = dict(
        a_tensor=torch.randn(M, K, 1).to(BF16), c_tensor=torch.randn(M, 2 * N, 1).to(BF16), sfa_tensor=None,
        padded_offsets=torch.tensor([256, 256], dtype=torch.int32), alpha_tensor=torch.rand(L) + 0.5,
        beta_tensor=torch.rand(L) + 0.5, prob_tensor=torch.rand(M, 1, 1), dprob_tensor=torch.randn(M, 1, 1),
    )
    keep = []
    if mode == "dense":
        kw["b_tensor"] = dense_b()
    else:
        keep = [w.clone() for w in weights()]
        kw.update(b_ptrs=torch.tensor([w.data_ptr() for w in keep], dtype=torch.int64), n=N, b_dtype=BF16)
    return kw, keep


def snapshot(kw):
    return {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}


def same_bits(x, y):
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    return torch.equal(x.contiguous().view(carrier), y.contiguous().view(carrier))


_ALLOCATORS = ("empty", "zeros", "ones", "full", "empty_strided", "empty_like", "zeros_like", "ones_like",
               "full_like", "rand", "randn")


@contextlib.contextmanager
def allocation_spy():
    """Records every torch factory call made inside the block (the wrapper allocates with them)."""
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        for name in _ALLOCATORS:
            orig = getattr(torch, name)

            def spy(*args, _orig=orig, _name=name, **kwargs):
                calls.append(_name)
                return _orig(*args, **kwargs)

            mp.setattr(torch, name, spy)
        yield calls


def expect_rejected(fn, kw, exc, names, *, allocation_free=True):
    """Call ``fn(**kw)``; it must raise ``exc`` (exactly that class or a subclass) naming every
    string in ``names``, allocate nothing and leave every tensor argument unchanged."""
    before = snapshot(kw)
    with allocation_spy() as calls:
        with pytest.raises(Exception) as info:
            fn(**kw)
    err = info.value
    assert isinstance(err, exc), f"expected {exc.__name__}, got {type(err).__name__}: {err}"
    assert not isinstance(err, AssertionError)
    msg = str(err)
    for name in names:
        assert name in msg, f"message does not name {name!r}: {msg}"
    if allocation_free:
        assert calls == [], f"allocated before rejecting: {calls}"
    for k, v in before.items():
        assert same_bits(kw[k], v), f"{k} was modified by a rejected call"
    return err


# --------------------------------------------------------------------------- wrapper table
# (id, mode, overrides(kw) -> dict of replaced arguments, exception, strings the message names)
def _c(**kw):
    return lambda base: kw


WRAPPER_CASES = [
    # --- required tensors and Python types
    ("a-none", "dense", _c(a_tensor=None), ValueError, ["a_tensor"]),
    ("c-none", "dense", _c(c_tensor=None), ValueError, ["c_tensor"]),
    ("c-not-a-tensor", "dense", _c(c_tensor=[1.0, 2.0]), TypeError, ["c_tensor", "list"]),
    ("offsets-none", "dense", _c(padded_offsets=None), ValueError, ["padded_offsets"]),
    ("alpha-none", "dense", _c(alpha_tensor=None), ValueError, ["alpha_tensor"]),
    ("beta-none", "dense", _c(beta_tensor=None), ValueError, ["beta_tensor"]),
    ("prob-none", "dense", _c(prob_tensor=None), ValueError, ["prob_tensor"]),
    ("dprob-none", "dense", _c(dprob_tensor=None), ValueError, ["dprob_tensor"]),
    ("generate-dbias-not-bool", "dense", _c(generate_dbias=1), TypeError, ["generate_dbias"]),
    # --- dtypes
    ("a-fp16-mixed-family", "dense", lambda b: dict(a_tensor=b["a_tensor"].to(FP16)), TypeError,
     ["a_tensor", "float16"]),
    ("b-fp16-mixed-family", "dense", lambda b: dict(b_tensor=b["b_tensor"].to(FP16)), TypeError,
     ["b_tensor", "float16"]),
    ("ab-fp32-unsupported-pair", "dense",
     lambda b: dict(a_tensor=b["a_tensor"].float(), b_tensor=b["b_tensor"].float()), TypeError, ["a_tensor"]),
    ("c-fp64", "dense", lambda b: dict(c_tensor=b["c_tensor"].double()), TypeError, ["c_tensor", "float64"]),
    ("c-int32", "dense", lambda b: dict(c_tensor=b["c_tensor"].int()), TypeError, ["c_tensor"]),
    ("d-dtype-fp64", "dense", _c(d_dtype=torch.float64), TypeError, ["d_dtype", "float64"]),
    ("d-dtype-fp8", "dense", _c(d_dtype=torch.float8_e4m3fn), TypeError, ["d_dtype"]),
    ("offsets-int64", "dense", lambda b: dict(padded_offsets=b["padded_offsets"].long()), TypeError,
     ["padded_offsets", "int64"]),
    ("alpha-fp64", "dense", lambda b: dict(alpha_tensor=b["alpha_tensor"].double()), TypeError, ["alpha_tensor"]),
    ("beta-fp16", "dense", lambda b: dict(beta_tensor=b["beta_tensor"].half()), TypeError, ["beta_tensor"]),
    # block-scaled operands also take 16-bit alpha and beta; BF16 operands do not (the BF16 kernel's rule)
    ("alpha-bf16", "dense", lambda b: dict(alpha_tensor=b["alpha_tensor"].to(BF16)), TypeError,
     ["alpha_tensor", "got bfloat16", "BF16 operands take float32 alpha and beta"]),
    ("beta-bf16-discrete", "discrete", lambda b: dict(beta_tensor=b["beta_tensor"].to(BF16)), TypeError,
     ["beta_tensor", "got bfloat16", "BF16 operands take float32 alpha and beta"]),
    ("prob-bf16", "dense", lambda b: dict(prob_tensor=b["prob_tensor"].to(BF16)), TypeError, ["prob_tensor"]),
    ("dprob-fp64", "dense", lambda b: dict(dprob_tensor=b["dprob_tensor"].double()), TypeError, ["dprob_tensor"]),
    ("b-ptrs-int32", "discrete", lambda b: dict(b_ptrs=b["b_ptrs"].int()), TypeError, ["b_ptrs", "int32"]),
    ("activation-fp32", "dense", _c(act_func="dgeglu", activation_tensor=torch.zeros(M, N, 1)), TypeError,
     ["activation_tensor"]),
    # --- shapes
    ("a-rank-1", "dense", _c(a_tensor=torch.zeros(M * K, dtype=BF16)), ValueError, ["a_tensor"]),
    ("a-trailing-dim-2", "dense", _c(a_tensor=torch.zeros(M, K, 2, dtype=BF16)), ValueError, ["a_tensor"]),
    ("m-not-multiple-of-256", "dense",
     _c(a_tensor=torch.zeros(384, K, 1, dtype=BF16), c_tensor=torch.zeros(384, 2 * N, 1, dtype=BF16),
        prob_tensor=torch.zeros(384, 1, 1), dprob_tensor=torch.zeros(384, 1, 1)),
     ValueError, ["a_tensor", "256", "384"]),
    ("k-not-multiple-of-8", "dense",
     _c(a_tensor=torch.zeros(M, 60, 1, dtype=BF16), b_tensor=dense_b(k=60)), ValueError, ["a_tensor", "60"]),
    ("b-rank-2", "dense", lambda b: dict(b_tensor=b["b_tensor"][:, :, 0]), ValueError, ["b_tensor"]),
    ("b-k-mismatch", "dense", _c(b_tensor=dense_b(k=2 * K)), ValueError, ["b_tensor", str(K)]),
    ("n-not-multiple-of-32-discrete", "discrete", _c(n=48, c_tensor=torch.zeros(M, 96, 1, dtype=BF16)),
     ValueError, ["n", "32", "48"]),
    ("experts-0-discrete", "discrete",
     _c(b_ptrs=torch.zeros(0, dtype=torch.int64), padded_offsets=torch.zeros(0, dtype=torch.int32),
        alpha_tensor=torch.ones(0), beta_tensor=torch.ones(0)), ValueError, ["[1, 1024]", "0"]),
    ("experts-1025-discrete", "discrete",
     _c(b_ptrs=torch.zeros(1025, dtype=torch.int64), padded_offsets=torch.zeros(1025, dtype=torch.int32),
        alpha_tensor=torch.ones(1025), beta_tensor=torch.ones(1025)), ValueError, ["[1, 1024]", "1025"]),
    ("c-shape-wrong-width", "dense", _c(c_tensor=torch.zeros(M, 4 * N, 1, dtype=BF16)), ValueError,
     ["c_tensor", str(4 * N)]),
    ("c-shape-wrong-rows", "dense", _c(c_tensor=torch.zeros(2 * M, 2 * N, 1, dtype=BF16)), ValueError, ["c_tensor"]),
    ("c-trailing-dim-2", "dense", _c(c_tensor=torch.zeros(M, 2 * N, 2, dtype=BF16)), ValueError, ["c_tensor"]),
    ("offsets-length", "dense", _c(padded_offsets=torch.tensor([256, 256, 256], dtype=torch.int32)), ValueError,
     ["padded_offsets"]),
    ("offsets-2d", "dense", _c(padded_offsets=torch.tensor([[256], [256]], dtype=torch.int32)), ValueError,
     ["padded_offsets"]),
    ("alpha-length", "dense", _c(alpha_tensor=torch.ones(L + 1)), ValueError, ["alpha_tensor"]),
    ("beta-2d", "dense", _c(beta_tensor=torch.ones(L, 2)), ValueError, ["beta_tensor"]),
    ("prob-rows", "dense", _c(prob_tensor=torch.ones(2 * M, 1, 1)), ValueError, ["prob_tensor"]),
    ("prob-width-2", "dense", _c(prob_tensor=torch.ones(M, 2, 1)), ValueError, ["prob_tensor"]),
    ("dprob-rows", "dense", _c(dprob_tensor=torch.zeros(M // 2, 1, 1)), ValueError, ["dprob_tensor"]),
    ("b-ptrs-2d", "discrete", lambda b: dict(b_ptrs=b["b_ptrs"].view(1, L).expand(2, L).contiguous()),
     ValueError, ["b_ptrs"]),
    ("b-ptrs-length-vs-offsets", "discrete", lambda b: dict(b_ptrs=torch.cat([b["b_ptrs"], b["b_ptrs"][:1]])),
     ValueError, ["padded_offsets"]),
    ("activation-shape", "dense", _c(act_func="dgeglu", activation_tensor=torch.zeros(M, 2 * N, 1, dtype=BF16)),
     ValueError, ["activation_tensor"]),
    ("activation-with-fp32-d", "dense", _c(activation_tensor=torch.zeros(M, N, 1, dtype=BF16), d_dtype=torch.float32),
     ValueError, ["activation_tensor", "dswiglu"]),
    ("activation-with-fp32-c", "dense",
     lambda b: dict(act_func="dgeglu", c_tensor=b["c_tensor"].float(),
                    activation_tensor=torch.zeros(M, N, 1, dtype=BF16)), ValueError, ["activation_tensor"]),
    ("activation-with-fp16-d", "dense",
     _c(act_func="dgeglu", d_dtype=FP16, activation_tensor=torch.zeros(M, N, 1, dtype=BF16)), ValueError,
     ["activation_tensor"]),
    # --- strides / majorness
    ("a-not-k-major", "dense", _c(a_tensor=torch.zeros(K, M, dtype=BF16).t()), ValueError, ["a_tensor", "stride"]),
    ("a-padded-rows", "dense", _c(a_tensor=torch.zeros(M, 2 * K, dtype=BF16)[:, :K]), ValueError, ["a_tensor"]),
    ("c-not-n-major", "dense", _c(c_tensor=torch.zeros(2 * N, M, dtype=BF16).t()), ValueError,
     ["c_tensor", "stride"]),
    ("b-contiguous-nkl", "dense", _c(b_tensor=torch.zeros(N, K, L, dtype=BF16)), ValueError,
     ["b_tensor", "stride"]),
    ("b-expert-stride-padded", "dense", _c(b_tensor=torch.zeros(L, N + 32, K, dtype=BF16)[:, :N].permute(1, 2, 0)),
     ValueError, ["b_tensor", "stride"]),
    ("dprob-not-contiguous", "dense", _c(dprob_tensor=torch.zeros(M, 2)[:, :1].unsqueeze(-1)), ValueError,
     ["dprob_tensor", "stride"]),
    # prob too: the kernels read it by pointer as M consecutive floats (a top-k column, a
    # broadcast scalar)
    ("prob-topk-column", "dense", _c(prob_tensor=torch.rand(M, 2)[:, 1:].unsqueeze(-1)), ValueError,
     ["prob_tensor", "stride"]),
    ("prob-expanded", "dense", _c(prob_tensor=torch.ones(1, 1, 1).expand(M, 1, 1)), ValueError,
     ["prob_tensor", "stride"]),
    ("b-ptrs-not-contiguous", "discrete",
     lambda b: dict(b_ptrs=torch.stack([b["b_ptrs"], b["b_ptrs"]], 1)[:, 0]), ValueError, ["b_ptrs"]),
    # --- 16-byte alignment (a storage-offset view)
    *[(f"misaligned-{arg}", "dense", (lambda arg: lambda b: {arg: misaligned(b[arg])})(arg), ValueError,
       [arg, "aligned"])
      for arg in ("a_tensor", "c_tensor", "b_tensor", "padded_offsets", "alpha_tensor", "beta_tensor",
                  "prob_tensor", "dprob_tensor")],
    ("misaligned-activation_tensor", "dense",
     _c(act_func="dgeglu", activation_tensor=misaligned(torch.zeros(M, N, 1, dtype=BF16))), ValueError,
     ["activation_tensor", "aligned"]),
    # --- devices (meta stands in for a second device on a CPU-only machine)
    ("offsets-other-device", "dense", _c(padded_offsets=torch.empty(L, dtype=torch.int32, device="meta")),
     ValueError, ["padded_offsets", "device"]),
    ("c-other-device", "dense", _c(c_tensor=torch.empty(M, 2 * N, 1, dtype=BF16, device="meta")), ValueError,
     ["c_tensor", "device"]),
    ("prob-other-device", "dense", _c(prob_tensor=torch.empty(M, 1, 1, device="meta")), ValueError,
     ["prob_tensor", "device"]),
    ("b-other-device", "dense", _c(b_tensor=torch.empty(L, N, K, dtype=BF16, device="meta").permute(1, 2, 0)),
     ValueError, ["b_tensor", "device"]),
    ("b-ptrs-other-device", "discrete", _c(b_ptrs=torch.empty(L, dtype=torch.int64, device="meta")), ValueError,
     ["b_ptrs", "device"]),
    # --- dense vs discrete, n / b_dtype
    ("dense-and-discrete", "dense", _c(b_ptrs=torch.zeros(L, dtype=torch.int64)), ValueError,
     ["b_tensor", "b_ptrs"]),
    ("neither-dense-nor-discrete", "dense", _c(b_tensor=None), ValueError, ["b_tensor", "b_ptrs"]),
    ("dense-with-n", "dense", _c(n=N), ValueError, ["n"]),
    ("dense-with-b-dtype", "dense", _c(b_dtype=BF16), ValueError, ["b_dtype"]),
    ("discrete-without-n", "discrete", _c(n=None), ValueError, ["n", "b_dtype"]),
    ("discrete-without-b-dtype", "discrete", _c(b_dtype=None), ValueError, ["b_dtype"]),
    ("discrete-n-float", "discrete", _c(n=32.0), TypeError, ["n", "float"]),
    ("discrete-b-dtype-string", "discrete", _c(b_dtype="bfloat16"), TypeError, ["b_dtype"]),
    # --- configuration
    ("b-major-x", "discrete", _c(b_major="x"), ValueError, ["b_major", "'x'"]),
    ("cd-major-m", "dense", _c(cd_major="m"), ValueError, ["cd_major"]),
    ("acc-dtype-fp16", "dense", _c(acc_dtype=FP16), TypeError, ["acc_dtype"]),
    # m_aligned takes 8 .. 256 (powers of two) with BF16 operands (tests/unit/test_m_aligned.py)
    ("m-aligned-24", "dense", _c(m_aligned=24), ValueError, ["m_aligned", "24", "[1, 8, 16, 32, 64, 128, 256]"]),
    ("m-aligned-512", "dense", _c(m_aligned=512), ValueError, ["m_aligned", "512"]),
    ("m-aligned-float", "dense", _c(m_aligned=8.0), TypeError, ["m_aligned", "8.0"]),
    ("mma-tiler-m-64", "dense", _c(mma_tiler_mn=(64, 256)), ValueError, ["mma_tiler_mn"]),
    ("mma-tiler-n-48", "dense", _c(mma_tiler_mn=(256, 48)), ValueError, ["mma_tiler_mn"]),
    ("mma-tiler-scalar", "dense", _c(mma_tiler_mn=256), ValueError, ["mma_tiler_mn"]),
    ("mma-tiler-none-n", "dense", _c(mma_tiler_mn=(256, None)), ValueError, ["mma_tiler_mn", "None"]),
    ("mma-tiler-float", "dense", _c(mma_tiler_mn=(128.0, 64)), ValueError, ["mma_tiler_mn", "128.0"]),
    ("cluster-scalar", "dense", _c(cluster_shape_mn=2), ValueError, ["cluster_shape_mn", "got 2"]),
    ("cluster-not-power-of-2", "dense", _c(cluster_shape_mn=(3, 1)), ValueError, ["cluster_shape_mn"]),
    ("cluster-odd-m-for-2cta", "dense", _c(cluster_shape_mn=(1, 1)), ValueError, ["cluster_shape_mn"]),
    ("cluster-too-big", "dense", _c(cluster_shape_mn=(4, 8)), ValueError, ["cluster_shape_mn"]),
    ("vector-f32-not-bool", "dense", _c(vector_f32=1), TypeError, ["vector_f32"]),
    ("dynamic-sched-not-bool", "dense", _c(use_dynamic_sched="yes"), TypeError, ["use_dynamic_sched"]),
    ("round-dgrad-not-bool", "dense", _c(round_dgrad_to_input_dtype=None), TypeError,
     ["round_dgrad_to_input_dtype"]),
    ("epilogue-op-unknown", "dense", _c(epilogue_op="gelu"), ValueError, ["epilogue_op", "gelu"]),
    # --- block-scale controls on the BF16 path
    ("epilogue-op-relu", "dense", _c(epilogue_op="relu"), ValueError, ["epilogue_op", "relu"]),
    ("epilogue-op-srelu", "dense", _c(epilogue_op="srelu"), ValueError, ["epilogue_op", "srelu"]),
    ("sfa-tensor", "dense", _c(sfa_tensor=torch.zeros(32, 4, 2, 4, 1, 1, dtype=torch.float8_e8m0fnu)), ValueError,
     ["sfa_tensor"]),
    ("sfb-tensor", "dense", _c(sfb_tensor=torch.zeros(32, 4, 1, 4, 1, L, dtype=torch.float8_e8m0fnu)), ValueError,
     ["sfb_tensor"]),
    ("sfb-ptrs", "discrete", _c(sfb_ptrs=torch.zeros(L, dtype=torch.int64)), ValueError, ["sfb_ptrs"]),
    ("norm-const-tensor", "dense", _c(norm_const_tensor=torch.ones(1)), ValueError, ["norm_const_tensor"]),
    ("sf-vec-size-32", "dense", _c(sf_vec_size=32), ValueError, ["sf_vec_size", "32"]),
    ("sf-fp8-override", "dense", _c(sf_fp8_dtype_override="float8_e4m3fn"), ValueError, ["sf_fp8_dtype_override"]),
    ("discrete-col-sfd", "dense", _c(discrete_col_sfd=True), ValueError, ["discrete_col_sfd"]),
    ("single-group-runtime-offsets", "dense", _c(use_single_group_runtime_offsets=True), ValueError,
     ["use_single_group_runtime_offsets"]),
    # --- activation function and its constants
    ("act-func-unknown", "dense", _c(act_func="dgelu"), ValueError, ["act_func", "dgelu"]),
    ("act-func-dsituglu-bf16", "dense", _c(act_func="dsituglu"), ValueError, ["act_func", "dsituglu"]),
    ("geglu-alpha-zero", "dense", _c(act_func="dgeglu", geglu_alpha=0.0), ValueError, ["geglu_alpha"]),
    ("geglu-alpha-negative", "dense", _c(act_func="dgeglu", geglu_alpha=-1.702), ValueError, ["geglu_alpha"]),
    ("geglu-alpha-nan", "dense", _c(act_func="dgeglu", geglu_alpha=math.nan), ValueError, ["geglu_alpha"]),
    ("geglu-alpha-string", "dense", _c(act_func="dgeglu", geglu_alpha="1.702"), TypeError, ["geglu_alpha"]),
    ("clamp-max-inf", "dense", _c(act_func="dgeglu", glu_clamp_max=math.inf), ValueError, ["glu_clamp_max"]),
    ("clamp-max-nan", "dense", _c(act_func="dgeglu", glu_clamp_max=math.nan), ValueError, ["glu_clamp_max"]),
    ("clamp-min-minus-inf", "dense", _c(act_func="dgeglu", glu_clamp_min=-math.inf), ValueError, ["glu_clamp_min"]),
    ("clamp-min-equals-max", "dense", _c(act_func="dgeglu", glu_clamp_min=5.0, glu_clamp_max=5.0), ValueError,
     ["glu_clamp_min", "glu_clamp_max"]),
    ("clamp-min-above-max", "dense", _c(act_func="dgeglu", glu_clamp_min=7.0, glu_clamp_max=-7.0), ValueError,
     ["glu_clamp_min", "glu_clamp_max"]),
    ("linear-offset-nan", "dense", _c(act_func="dgeglu", linear_offset=math.nan), ValueError, ["linear_offset"]),
    ("linear-offset-inf", "dense", _c(act_func="dgeglu", linear_offset=-math.inf), ValueError, ["linear_offset"]),
    ("situ-beta1-zero", "dense", _c(situ_beta1=0.0), ValueError, ["situ_beta1"]),
    ("situ-beta2-nan", "dense", _c(situ_beta2=math.nan), ValueError, ["situ_beta2"]),
]


@pytest.mark.parametrize("case_id,mode,override,exc,names", WRAPPER_CASES, ids=[c[0] for c in WRAPPER_CASES])
def test_wrapper_rejects(case_id, mode, override, exc, names):
    kw, keep = base_call(mode)
    kw.update(override(kw))
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, kw, exc, names)


@pytest.mark.parametrize("mode", ["dense", "discrete"])
def test_base_call_is_valid(mode):
    """The table's baseline is accepted (so each case fails for its one reason only)."""
    kw, keep = base_call(mode)
    out = cudnn.grouped_gemm_dglu_wrapper(**kw)
    assert out["d_row_tensor"].shape == (M, 2 * N, 1)
    # and the accepted no-op values of the rejected knobs
    for extra in (dict(epilogue_op="identity"), dict(epilogue_op=None), dict(sf_vec_size=16),
                  dict(acc_dtype=FP32), dict(cluster_shape_mn=(2, 1)), dict(mma_tiler_mn=(128, 64)),
                  dict(m_aligned=128), dict(m_aligned=8),
                  dict(act_func="dgeglu", glu_clamp_min=-1.0, glu_clamp_max=1.0, geglu_alpha=0.5)):
        cudnn.grouped_gemm_dglu_wrapper(**{**kw, **extra})


# --------------------------------------------------------------------------- offset values
# Values are a device-data contract (the vendor checks them only in a debug mode); the reference
# engine reads them anyway and rejects bad ones, after the wrapper allocated D but before it
# writes any caller buffer.
@pytest.mark.parametrize("values,names", [
    ([256, 0], ["padded_offsets", "non-decreasing"]),
    ([128, 256], ["padded_offsets", "multiple of 256", "128"]),
    ([256, 512], ["padded_offsets", "512", "M = 256"]),
    ([-256, 256], ["padded_offsets"]),
], ids=["decreasing", "not-256-aligned", "past-M", "negative"])
def test_offset_values_rejected_without_touching_caller_buffers(values, names):
    kw, _ = base_call()
    kw["padded_offsets"] = torch.tensor(values, dtype=torch.int32)
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, kw, ValueError, names, allocation_free=False)


# --------------------------------------------------------------------------- contract gaps
GAP_CASES = [
    pytest.param("dense", lambda b: dict(b_tensor=dense_b(n=48), c_tensor=torch.zeros(M, 96, 1, dtype=BF16)),
                 ValueError, ["b_tensor", "32", "48"], id="n-not-multiple-of-32-dense-names-b_tensor"),
    pytest.param("dense", lambda b: dict(b_tensor=dense_b(l=1025), padded_offsets=torch.zeros(1025, dtype=torch.int32),
                                         alpha_tensor=torch.ones(1025), beta_tensor=torch.ones(1025)),
                 ValueError, ["b_tensor", "[1, 1024]"], id="experts-1025-dense-names-b_tensor"),
    pytest.param("dense", lambda b: dict(b_tensor=dense_b(l=0), padded_offsets=torch.zeros(0, dtype=torch.int32),
                                         alpha_tensor=torch.ones(0), beta_tensor=torch.ones(0)),
                 ValueError, ["[1, 1024]"], id="experts-0-dense-states-the-rule"),
    pytest.param("discrete", _c(b_dtype=FP16), TypeError, ["b_dtype", "float16"], id="discrete-b-dtype-fp16-names-b_dtype"),
    *[pytest.param("dense", (lambda arg: lambda b: {arg: strided_1d(b[arg])})(arg), ValueError, [arg, "stride"],
                   id=f"{arg}-stride-not-1")
      for arg in ("padded_offsets", "alpha_tensor", "beta_tensor")],
]


@pytest.mark.parametrize("mode,override,exc,names", GAP_CASES)
def test_wrapper_contract_gaps(mode, override, exc, names):
    kw, keep = base_call(mode)
    kw.update(override(kw))
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, kw, exc, names)


# --------------------------------------------------------------------------- class API
def class_samples(mode="dense", *, dbias=False, activation=False, act_func="dswiglu", m=M, k=K):
    kw, keep = base_call(mode)
    if k != K or m != M:
        kw.update(a_tensor=torch.randn(m, k, 1).to(BF16), c_tensor=torch.randn(m, 2 * N, 1).to(BF16),
                  prob_tensor=torch.rand(m, 1, 1), dprob_tensor=torch.zeros(m, 1, 1))
        if mode == "dense":
            kw["b_tensor"] = dense_b(k=k)
        else:
            keep = [w.clone() for w in weights(k=k)]
            kw["b_ptrs"] = torch.tensor([w.data_ptr() for w in keep], dtype=torch.int64)
    run = dict(a_tensor=kw["a_tensor"], c_tensor=kw["c_tensor"], d_row_tensor=torch.zeros(m, 2 * N, 1, dtype=BF16),
               d_col_tensor=None, sfa_tensor=None, padded_offsets=kw["padded_offsets"], alpha_tensor=kw["alpha_tensor"],
               beta_tensor=kw["beta_tensor"], prob_tensor=kw["prob_tensor"], dprob_tensor=kw["dprob_tensor"])
    if mode == "dense":
        run["b_tensor"] = kw["b_tensor"]
    else:
        run["b_ptrs"] = kw["b_ptrs"]
    if dbias:
        run["dbias_tensor"] = torch.zeros(L, 2 * N, 1, dtype=BF16)
    if activation:
        run["activation_tensor"] = torch.zeros(m, N, 1, dtype=BF16)
    return run, keep, act_func


def make_op(run, mode="dense", act_func="dswiglu", **extra):
    weights_kw = (dict(sample_b=run["b_tensor"]) if mode == "dense"
                  else dict(num_experts=L, b_shape=(N, run["a_tensor"].shape[1]), b_dtype=BF16))
    kw = dict(sample_a=run["a_tensor"], sample_c=run["c_tensor"], sample_d_row=run["d_row_tensor"],
              sample_d_col=None, sample_sfa=None, sample_padded_offsets=run["padded_offsets"],
              sample_alpha=run["alpha_tensor"], sample_beta=run["beta_tensor"], sample_prob=run["prob_tensor"],
              sample_dprob=run["dprob_tensor"], sample_dbias=run.get("dbias_tensor"),
              sample_activation=run.get("activation_tensor"), act_func=act_func, **weights_kw)
    kw.update(extra)
    return cudnn.GroupedGemmDglu(**kw)


def compiled(run, mode="dense", act_func="dswiglu", **extra):
    op = make_op(run, mode, act_func, **extra)
    assert op.check_support()
    op.compile()
    return op


# (id, mode, constructor overrides, exception, names): raised by check_support()
CLASS_SUPPORT_CASES = [
    ("discrete-missing-b-shape", "discrete", dict(b_shape=None), ValueError, ["b_shape"]),
    ("discrete-missing-num-experts", "discrete", dict(num_experts=None), ValueError, ["num_experts"]),
    ("discrete-missing-b-dtype", "discrete", dict(b_dtype=None), ValueError, ["b_dtype"]),
    ("b-shape-rank-1", "discrete", dict(b_shape=(N,)), ValueError, ["b_shape"]),
    ("b-shape-scalar", "discrete", dict(b_shape=5), TypeError, ["b_shape", "5"]),
    ("b-shape-trailing-2", "discrete", dict(b_shape=(N, K, 2)), ValueError, ["b_shape"]),
    ("b-shape-k-mismatch", "discrete", dict(b_shape=(N, 2 * K)), ValueError, ["b_shape", str(K)]),
    ("b-shape-n-not-multiple-of-32", "discrete", dict(b_shape=(48, K)), ValueError, ["n", "48"]),
    ("num-experts-string", "discrete", dict(num_experts="2"), TypeError, ["num_experts"]),
    ("num-experts-bool", "discrete", dict(num_experts=True), TypeError, ["num_experts"]),
    ("num-experts-0", "discrete", dict(num_experts=0), ValueError, ["num_experts", "1024"]),
    ("num-experts-1025", "discrete", dict(num_experts=1025), ValueError, ["num_experts", "1025"]),
    ("dense-with-num-experts", "dense", dict(num_experts=L), ValueError, ["num_experts"]),
    ("dense-with-b-shape", "dense", dict(b_shape=(N, K)), ValueError, ["b_shape"]),
    ("sample-d-col", "dense", dict(sample_d_col=torch.zeros(M, 2 * N, 1, dtype=BF16)), ValueError, ["d_col"]),
    ("sample-amax", "dense", dict(sample_amax=torch.zeros(L, 2, 1)), ValueError, ["amax"]),
    ("sample-sfd-row", "dense", dict(sample_sfd_row=torch.zeros(32, 4, 2, 4, 1, 1)), ValueError, ["sfd_row"]),
    ("sample-norm-const", "dense", dict(sample_norm_const=torch.ones(1)), ValueError, ["norm_const"]),
    ("epilogue-op-relu", "dense", dict(epilogue_op="relu"), ValueError, ["epilogue_op"]),
    ("sf-vec-size-32", "dense", dict(sf_vec_size=32), ValueError, ["sf_vec_size"]),
    ("discrete-col-sfd", "dense", dict(discrete_col_sfd=True), ValueError, ["discrete_col_sfd"]),
    ("act-func-dsituglu", "dense", dict(act_func="dsituglu"), ValueError, ["act_func"]),
    ("act-func-unknown", "dense", dict(act_func="swiglu"), ValueError, ["act_func"]),
    ("dgeglu-clamps-unordered", "dense", dict(act_func="dgeglu", glu_clamp_min=1.0, glu_clamp_max=0.0), ValueError,
     ["glu_clamp_min"]),
    ("dgeglu-alpha-inf", "dense", dict(act_func="dgeglu", geglu_alpha=math.inf), ValueError, ["geglu_alpha"]),
    ("sample-dbias-fp32", "dense", dict(sample_dbias=torch.zeros(L, 2 * N, 1)), TypeError, ["sample_dbias"]),
    ("sample-dbias-shape", "dense", dict(sample_dbias=torch.zeros(L + 1, 2 * N, 1, dtype=BF16)), ValueError,
     ["sample_dbias"]),
    ("sample-dbias-not-row-major", "dense", dict(sample_dbias=torch.zeros(2 * N, L, dtype=BF16).t()), ValueError,
     ["sample_dbias"]),
    ("sample-d-row-fp64", "dense", dict(sample_d_row=torch.zeros(M, 2 * N, 1, dtype=torch.float64)), TypeError,
     ["sample_d_row"]),
    ("sample-d-row-shape", "dense", dict(sample_d_row=torch.zeros(M, N, 1, dtype=BF16)), ValueError,
     ["sample_d_row"]),
    ("sample-d-row-not-n-major", "dense", dict(sample_d_row=torch.zeros(2 * N, M, dtype=BF16).t()), ValueError,
     ["sample_d_row"]),
    ("sample-d-row-misaligned", "dense", dict(sample_d_row=misaligned(torch.zeros(M, 2 * N, 1, dtype=BF16))),
     ValueError, ["sample_d_row", "aligned"]),
]


@pytest.mark.parametrize("case_id,mode,ctor,exc,names", CLASS_SUPPORT_CASES, ids=[c[0] for c in CLASS_SUPPORT_CASES])
def test_class_check_support_rejects(case_id, mode, ctor, exc, names):
    run, keep, _ = class_samples(mode)
    before = snapshot(run)
    op = make_op(run, mode, **ctor)
    with pytest.raises(exc) as info:
        op.check_support()
    for name in names:
        assert name in str(info.value), f"message does not name {name!r}: {info.value}"
    with pytest.raises(exc):  # compile() checks support too
        op.compile()
    for k, v in before.items():
        assert same_bits(run[k], v), f"{k} modified"


def _fake_workspace_plan(op, size):
    """Swap the compiled plan for one that declares a workspace (the reference engine needs
    none), recording what execute receives."""
    import dataclasses

    from cudnn_ext.engines.base import CompiledPlan

    seen = []

    class NeedsWorkspace(CompiledPlan):
        engine_name = "fake"
        workspace_size = size

        def execute(self, pack, workspace=None, stream=None):
            seen.append(workspace)

    op._plan = dataclasses.replace(op._plan, compiled=NeedsWorkspace())
    return seen


# (id, mode, sample flags, execute overrides(run) -> dict, exception, names): raised by execute()
CLASS_EXECUTE_CASES = [
    ("dense-object-given-b-ptrs", "dense", {}, lambda r: dict(b_tensor=None, b_ptrs=torch.zeros(L, dtype=torch.int64)),
     ValueError, ["b_ptrs"]),
    ("discrete-object-given-b-tensor", "discrete", {}, lambda r: dict(b_ptrs=None, b_tensor=dense_b()), ValueError,
     ["b_tensor"]),
    ("dbias-missing-when-sampled", "dense", dict(dbias=True), lambda r: dict(dbias_tensor=None), ValueError,
     ["dbias_tensor", "sample_dbias"]),
    ("dbias-given-without-sample", "dense", {}, lambda r: dict(dbias_tensor=torch.zeros(L, 2 * N, 1, dtype=BF16)),
     ValueError, ["dbias_tensor"]),
    ("activation-missing-when-sampled", "dense", dict(activation=True, act_func="dgeglu"),
     lambda r: dict(activation_tensor=None), ValueError, ["activation_tensor"]),
    ("activation-given-without-sample", "dense", dict(act_func="dgeglu"),
     lambda r: dict(activation_tensor=torch.zeros(M, N, 1, dtype=BF16)), ValueError, ["activation_tensor"]),
    ("different-k", "dense", {}, lambda r: dict(a_tensor=torch.zeros(M, 2 * K, 1, dtype=BF16), b_tensor=dense_b(k=2 * K)),
     ValueError, ["k: compiled 64", "128"]),
    ("different-n", "dense", {}, lambda r: dict(b_tensor=dense_b(n=2 * N), c_tensor=torch.zeros(M, 4 * N, 1, dtype=BF16),
                                                d_row_tensor=torch.zeros(M, 4 * N, 1, dtype=BF16)),
     ValueError, ["n: compiled 32"]),
    ("different-c-dtype", "dense", {}, lambda r: dict(c_tensor=r["c_tensor"].float()), ValueError, ["c_dtype"]),
    ("different-d-dtype", "dense", {}, lambda r: dict(d_row_tensor=r["d_row_tensor"].half()), ValueError, ["d_dtype"]),
    ("different-b-major", "dense", {}, lambda r: dict(b_tensor=weights().transpose(1, 2).contiguous().permute(2, 1, 0)),
     ValueError, ["b_major"]),
    ("d-col-tensor", "dense", {}, lambda r: dict(d_col_tensor=torch.zeros(M, 2 * N, 1, dtype=BF16)), ValueError,
     ["d_col_tensor"]),
    ("sfa-tensor", "dense", {}, lambda r: dict(sfa_tensor=torch.zeros(16, dtype=torch.uint8)), ValueError,
     ["sfa_tensor"]),
    ("amax-tensor", "dense", {}, lambda r: dict(amax_tensor=torch.zeros(L, 2, 1)), ValueError, ["amax_tensor"]),
    ("sfd-row-tensor", "dense", {}, lambda r: dict(sfd_row_tensor=torch.zeros(16, dtype=torch.uint8)), ValueError,
     ["sfd_row_tensor"]),
    ("norm-const-tensor", "dense", {}, lambda r: dict(norm_const_tensor=torch.ones(1)), ValueError,
     ["norm_const_tensor"]),
    ("m-not-multiple-of-256", "dense", {},
     lambda r: dict(a_tensor=torch.zeros(384, K, 1, dtype=BF16), c_tensor=torch.zeros(384, 2 * N, 1, dtype=BF16),
                    d_row_tensor=torch.zeros(384, 2 * N, 1, dtype=BF16), prob_tensor=torch.zeros(384, 1, 1),
                    dprob_tensor=torch.zeros(384, 1, 1)), ValueError, ["a_tensor", "256"]),
    ("misaligned-c-at-execute", "dense", {}, lambda r: dict(c_tensor=misaligned(r["c_tensor"])), ValueError,
     ["c_tensor", "aligned"]),
    ("misaligned-d-row-at-execute", "dense", {}, lambda r: dict(d_row_tensor=misaligned(r["d_row_tensor"])),
     ValueError, ["d_row_tensor", "aligned"]),
    ("dbias-fp32-at-execute", "dense", dict(dbias=True), lambda r: dict(dbias_tensor=torch.zeros(L, 2 * N, 1)),
     TypeError, ["dbias_tensor"]),
]


@pytest.mark.parametrize("case_id,mode,flags,override,exc,names", CLASS_EXECUTE_CASES,
                         ids=[c[0] for c in CLASS_EXECUTE_CASES])
def test_class_execute_rejects(case_id, mode, flags, override, exc, names):
    flags = dict(flags)
    act_func = flags.pop("act_func", "dswiglu")
    run, keep, _ = class_samples(mode, act_func=act_func, **flags)
    op = compiled(run, mode, act_func)
    plan = op._plan
    run.update(override(run))
    kw = {k: v for k, v in run.items()}
    expect_rejected(op.execute, kw, exc, names)
    assert op._plan is plan


def test_class_execute_workspace_rules():
    run, keep, _ = class_samples()
    op = compiled(run)
    seen = _fake_workspace_plan(op, 256)
    small = torch.empty(255, dtype=torch.uint8)
    expect_rejected(op.execute, dict(run, workspace=small), ValueError, ["workspace", "256", "255"])
    expect_rejected(op.execute, dict(run, workspace=torch.empty(64, dtype=torch.float32)), TypeError, ["workspace"])
    expect_rejected(op.execute, dict(run, workspace=torch.empty(256, dtype=torch.uint8, device="meta")), ValueError,
                    ["workspace"])
    assert seen == []
    raw = torch.empty(256 + 128, dtype=torch.uint8)  # CPU allocations are only 64-byte aligned
    ok = raw[(-raw.data_ptr()) % 128:][:256]
    op.execute(**run, workspace=ok)
    assert seen[-1] is ok
    op.execute(**run)  # without one, the object owns a large-enough workspace
    assert seen[-1] is not None and seen[-1].numel() >= 256


def test_class_execute_workspace_misaligned():
    run, keep, _ = class_samples()
    op = compiled(run)
    _fake_workspace_plan(op, 256)
    ws = torch.empty(512, dtype=torch.uint8)[16:16 + 256]
    expect_rejected(op.execute, dict(run, workspace=ws), ValueError, ["workspace", "aligned"])


def test_class_execute_requires_d_row():
    run, keep, _ = class_samples()
    op = compiled(run)
    expect_rejected(op.execute, dict(run, d_row_tensor=None), ValueError, ["d_row_tensor"])


def test_class_check_support_requires_sample_d_row():
    run, keep, _ = class_samples()
    op = make_op(run, sample_d_row=None)
    with pytest.raises(ValueError, match="d_row"):
        op.check_support()


def test_class_execute_accepts_other_m_and_keeps_plan():
    run, keep, _ = class_samples(dbias=True)
    op = compiled(run)
    plan = op._plan
    big, keep2, _ = class_samples(dbias=True, m=3 * M)
    big["padded_offsets"] = torch.tensor([256, 768], dtype=torch.int32)
    op.execute(**big)
    assert op._plan is plan


def test_memo_tells_meta_from_cpu():
    """The wrapper's validation memo keys on the device, not ``get_device()`` (-1 for CPU and
    meta alike): a meta tensor after a good CPU call is still refused, naming the argument."""
    kw, keep = base_call()
    cudnn.grouped_gemm_dglu_wrapper(**kw)
    kw2, keep2 = base_call()
    kw2["prob_tensor"] = torch.rand(M, 1, 1, device="meta")
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, kw2, ValueError, ["prob_tensor", "meta"])


def test_inputs_that_require_grad_leave_no_graph():
    """nn.Parameter weights (and a prob that requires grad) run like any other input: outputs
    equal the plain call's, and the caller's dprob gains no autograd history."""
    kw, keep = base_call()
    want = cudnn.grouped_gemm_dglu_wrapper(**{**kw, "dprob_tensor": kw["dprob_tensor"].clone()})
    dprob = kw["dprob_tensor"].clone()
    got = cudnn.grouped_gemm_dglu_wrapper(**{**kw, "b_tensor": torch.nn.Parameter(kw["b_tensor"]),
                                             "prob_tensor": kw["prob_tensor"].clone().requires_grad_(),
                                             "dprob_tensor": dprob})
    assert dprob.grad_fn is None and not dprob.requires_grad
    for name in ("d_row_tensor", "dprob_tensor"):
        assert got[name].grad_fn is None and torch.equal(got[name], want[name]), name


def test_sparse_tensor_is_refused_by_name():
    """A sparse tensor has no data pointer for a kernel: a TypeError naming the argument (the
    table's snapshot helper cannot clone sparse tensors, so this case stands alone)."""
    kw, keep = base_call()
    kw["prob_tensor"] = kw["prob_tensor"].view(M).to_sparse()
    with pytest.raises(TypeError, match="prob_tensor: must be a dense .*sparse"):
        cudnn.grouped_gemm_dglu_wrapper(**kw)


def test_numpy_integers_are_ints_for_tile_and_cluster_shapes():
    np = pytest.importorskip("numpy")
    kw, keep = base_call()
    kw.update(mma_tiler_mn=(np.int64(256), np.int64(128)), cluster_shape_mn=(np.int32(2), np.int32(1)))
    cudnn.grouped_gemm_dglu_wrapper(**kw)  # accepted like (256, 128) and (2, 1)


def test_weights_stacked_experts_first_get_the_layout_in_the_error():
    """An (L, N, K) weight stack (torch's habit) is refused before anything is allocated, and
    the message says the wrapper wants (N, K, L) and how to pass the stack."""
    kw, keep = base_call()
    kw["b_tensor"] = weights()  # (L, N, K)
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, kw, ValueError,
                    ["b_tensor", "(N, K, L)", "w.permute(1, 2, 0)", str((L, N, K))])


# --------------------------------------------------------------------------- outputs apart
def offset_view(base: torch.Tensor, nbytes: int, shape, dtype=BF16) -> torch.Tensor:
    """A view of ``shape`` (row-major) starting ``nbytes`` into ``base``'s storage."""
    flat = base.view(-1).view(torch.uint8)
    count = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return flat[nbytes:nbytes + count].view(dtype).view(shape)


def aligned_zeros(shape, dtype=BF16, extra: int = 0) -> torch.Tensor:
    """Zeros of ``shape`` whose storage starts 64-byte aligned with ``extra`` spare bytes."""
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.zeros(n + extra + 64, dtype=torch.uint8)
    return raw[(-raw.data_ptr()) % 64:][:n + extra]


def activation_16_off() -> torch.Tensor:
    """A bf16 (M, N, 1) activation whose data pointer is 16-byte but not 32-byte aligned."""
    buf = aligned_zeros((M, N, 1), extra=64)
    v = offset_view(buf, 16 if buf.data_ptr() % 32 == 0 else 0, (M, N, 1))
    assert v.data_ptr() % 16 == 0 and v.data_ptr() % 32
    return v


def over_c(kw, key="c_tensor"):
    """A bf16 (M, N, 1) view over the storage of ``kw[key]`` (same first byte)."""
    return kw[key].view(-1)[:M * N].view(M, N, 1)


OUTPUT_OVERLAP_CASES = [
    # (id, wrapper overrides(kw), names the message must carry)
    ("activation-16-byte-aligned", lambda kw: dict(act_func="dgeglu", activation_tensor=activation_16_off()),
     ["activation_tensor", "activation output must be 32-byte aligned"]),
    ("activation-over-c", lambda kw: dict(act_func="dgeglu", activation_tensor=over_c(kw)),
     ["activation_tensor", "activation output must not overlap c_tensor"]),
    ("activation-over-a", lambda kw: dict(act_func="dgeglu", activation_tensor=kw["a_tensor"].view(-1)[:M * N]
                                          .view(M, N, 1) if K >= N else None),
     ["activation output must not overlap a_tensor"]),
    ("dprob-over-prob", lambda kw: dict(dprob_tensor=kw["prob_tensor"]),
     ["dprob_tensor", "must not overlap prob_tensor"]),
    ("dprob-inside-alpha-buffer", lambda kw: _dprob_sharing_alpha(kw),
     ["dprob_tensor", "must not overlap alpha_tensor"]),
]


def _dprob_sharing_alpha(kw):
    buf = aligned_zeros((M + 64,), torch.float32)  # alpha's L floats sit on dprob's last bytes
    buf = buf.view(torch.float32)
    dprob = buf[:M].view(M, 1, 1)
    alpha = buf[M - 4:M - 4 + L]
    alpha.copy_(kw["alpha_tensor"])
    return dict(dprob_tensor=dprob, alpha_tensor=alpha)


@pytest.mark.parametrize("case_id,override,names", OUTPUT_OVERLAP_CASES, ids=[c[0] for c in OUTPUT_OVERLAP_CASES])
def test_wrapper_refuses_outputs_that_overlap_or_misalign(case_id, override, names):
    kw, keep = base_call()
    kw.update(override(kw))
    expect_rejected(cudnn.grouped_gemm_dglu_wrapper, kw, ValueError, names)


def test_class_api_refuses_an_activation_over_its_operands_at_check_support_and_execute():
    """The vendor's rules for the activation output, at check_support (named as the samples)
    and at execute: 32-byte aligned, overlapping no operand (C, D, ...)."""
    run, keep, _ = class_samples(activation=True, act_func="dgeglu")
    for bad, names in ((activation_16_off(), ["sample_activation", "activation output must be 32-byte aligned"]),
                       (over_c(run), ["sample_activation", "activation output must not overlap sample_c"]),
                       (over_c(run, "d_row_tensor"), ["activation output must not overlap sample_d_row"])):
        op = make_op(dict(run, activation_tensor=bad), act_func="dgeglu")
        with pytest.raises(ValueError) as info:
            op.check_support()
        for name in names:
            assert name in str(info.value), str(info.value)
    op = compiled(run, act_func="dgeglu")
    for bad, names in ((over_c(run), ["activation_tensor", "activation output must not overlap c_tensor"]),
                       (activation_16_off(), ["activation output must be 32-byte aligned"])):
        expect_rejected(op.execute, dict(run, activation_tensor=bad), ValueError, names)


def test_class_api_refuses_d_over_c_at_execute_also_when_remembered():
    """A call's metadata is remembered after its first validation; a later call with the same
    metadata whose D lies over C is still refused (pointers are checked every call)."""
    run, keep, _ = class_samples()
    op = compiled(run)
    op.execute(**run)
    op.execute(**run)  # remembered now
    c = run["c_tensor"]
    expect_rejected(op.execute, dict(run, d_row_tensor=c), ValueError, ["d_row_tensor", "must not overlap c_tensor"])


# --------------------------------------------------------------------------- the vendor's phrases
def test_refusals_carry_the_vendors_phrase():
    """Code that matches the vendor's message still matches ours (docs/vendor_contract.md §3)."""
    kw, keep = base_call()
    err = expect_rejected(cudnn.grouped_gemm_dglu_wrapper, dict(kw, use_single_group_runtime_offsets=True),
                          ValueError, ["use_single_group_runtime_offsets"])
    assert "use_single_group_runtime_offsets is supported only by the block-scaled kernel" in str(err)
    # (dSwiGLU's activation output is cudnn_ext's extension: refused only where C or D is not bf16)
    err = expect_rejected(cudnn.grouped_gemm_dglu_wrapper,
                          dict(kw, activation_tensor=torch.zeros(M, N, 1, dtype=BF16), d_dtype=torch.float32),
                          ValueError, ["activation_tensor"])
    assert "activation output requires BF16 C/D and dgeglu" in str(err)


@pytest.mark.parametrize("case_id", ["a-fp16-mixed-family", "ab-fp32-unsupported-pair", "c-fp64", "d-dtype-fp64", "alpha-fp64",
                                     "prob-bf16", "acc-dtype-fp16"])
def test_dtype_refusals_are_value_errors_as_the_vendors_are(case_id):
    """The vendor raises ValueError for every dtype rule (docs/vendor_contract.md §3.7) and its
    tests skip on ``except (ValueError, NotImplementedError)``; ours is a DtypeError, both a
    TypeError and a ValueError, so callers written for either catch it."""
    _, mode, override, _, names = next(c for c in WRAPPER_CASES if c[0] == case_id)
    kw, keep = base_call(mode)
    err = expect_rejected(cudnn.grouped_gemm_dglu_wrapper, dict(kw, **override(kw)), ValueError, names)
    assert isinstance(err, TypeError) and type(err) is cudnn.DtypeError
