"""The vendor engine (``vendor_sm100``) on CPU: where it sits in the registry, why it declines
(package missing, no CUDA, SM < 100, features the vendor refuses), and, against a fake
``cudnn`` module, the exact arguments it would hand ``cudnn.GroupedGemmDgluSm100``.

No Blackwell GPU and no nvidia-cudnn-frontend are needed (or were available): these tests
pin the mapping, not the vendor's numerics.
"""
from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

import cudnn_ext as cudnn
from cudnn_ext import contract
from cudnn_ext.engines import vendor
from cudnn_ext.engines.base import Knobs
from cudnn_ext.engines.heuristics import decline_reasons
from cudnn_ext.engines.registry import ENGINES, engine_by_name
from cudnn_ext.quant import quantize_mxfp8, quantize_nvfp4
from cudnn_ext.quant.sf_layout import empty_sf

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
M, N, K, L = 512, 64, 128, 2


def bf16_call(**cfg):
    b = torch.randn(L, N, K).bfloat16().permute(1, 2, 0)
    ops = contract.Operands(
        a=torch.randn(M, K).bfloat16(), c=torch.randn(M, 2 * N, 1).bfloat16(),
        d_row=torch.empty(M, 2 * N, 1, dtype=torch.bfloat16), padded_offsets=torch.tensor([256, 512], dtype=torch.int32),
        alpha=torch.ones(L), beta=torch.ones(L), prob=torch.rand(M, 1, 1), dprob=torch.full((M, 1, 1), 7.0), b=b,
        dbias=torch.full((L, 2 * N, 1), 3.0).bfloat16())
    return contract.normalize(ops, contract.CallConfig(**cfg))


def mxfp8_call():
    a, sfa = quantize_mxfp8(torch.randn(M, K))
    b, sfb = quantize_mxfp8(torch.randn(N, K, L))
    ops = contract.Operands(
        a=a, c=torch.randn(M, 2 * N).bfloat16(), d_row=torch.empty(M, 2 * N, 1, dtype=E4M3),
        d_col=torch.empty(M, 2 * N, 1, dtype=E4M3), sfa=sfa, sfb=sfb, b=b,
        padded_offsets=torch.tensor([256, 512], dtype=torch.int32), alpha=torch.ones(L), beta=torch.ones(L),
        prob=torch.rand(M), dprob=torch.zeros(M), sfd_row=empty_sf(M, 2 * N // 32, dtype=E8M0),
        sfd_col=empty_sf(2 * N, M // 32, dtype=E8M0), norm_const=torch.tensor([1.0]))
    return contract.normalize(ops, contract.CallConfig(sf_vec_size=32, act_func="dsituglu", situ_beta1=3.0))


def nvfp4_discrete_call():
    a, sfa = quantize_nvfp4(torch.randn(M, K))
    ops = contract.Operands(
        a=a, c=torch.randn(M, 2 * N).bfloat16(), d_row=torch.empty(M, 2 * N, dtype=torch.bfloat16), sfa=sfa,
        b_ptrs=torch.tensor([4096, 8192], dtype=torch.int64), sfb_ptrs=torch.tensor([256, 512], dtype=torch.int64),
        padded_offsets=torch.tensor([256, 512], dtype=torch.int32), alpha=torch.ones(L), beta=torch.ones(L),
        amax=torch.full((L, 2, 1), float("-inf")), dbias=torch.zeros(L, 2 * N, dtype=torch.bfloat16))
    return contract.normalize(ops, contract.CallConfig(use_dynamic_sched=True), n=N, b_dtype=torch.uint8)


class FakeVendor:
    """Records what the engine hands the vendor class; writes nothing."""

    made = []

    def __init__(self, *args, **kwargs):
        assert not args, "the engine passes keywords only"
        self.init = kwargs
        self.calls = []
        FakeVendor.made.append(self)

    def check_support(self):
        return True

    def compile(self):
        self.compiled = True

    def scratch_workspace_bytes(self):
        return 128

    def execute(self, **kwargs):
        self.calls.append(kwargs)


@pytest.fixture
def fake_cudnn(monkeypatch):
    mod = types.ModuleType("cudnn")
    mod.__version__ = "9.99-fake"
    mod.GroupedGemmDgluSm100 = FakeVendor
    FakeVendor.made = []
    monkeypatch.setitem(sys.modules, "cudnn", mod)
    return mod


def run_plan(problem, pack, knobs=Knobs.of(tile_m=256, tile_n=256)):
    plan = engine_by_name("vendor_sm100").build(problem, knobs)
    size = plan.workspace_requests()[0].nbytes
    ws = torch.empty(size + 256, dtype=torch.uint8)
    plan.execute(pack, ws)
    return plan, FakeVendor.made[-1], ws


def geometry(t):
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


# ----------------------------------------------------------------------------- registry, declines
def test_registered_after_sm90_and_before_reference():
    names = [e.name for e in ENGINES]
    assert names.index("vendor_sm100") < names.index("reference")
    if "sm90_cutedsl" in names:
        assert names.index("sm90_cutedsl") < names.index("vendor_sm100")
    assert engine_by_name("vendor_sm100").engine_id == 20200


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only decline")
def test_declines_without_package_and_cuda_in_no_engine_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # an import of 'cudnn' fails
    problem, pack = bf16_call()
    reasons = decline_reasons(problem)["vendor_sm100"]
    assert len(reasons) == 1 and "nvidia-cudnn-frontend" in reasons[0] and "no CUDA GPU" in reasons[0]
    t = {k: v for k, v in pack.items()}
    with pytest.raises(cudnn.NoEngineError) as err:
        cudnn.grouped_gemm_dglu_wrapper(t["a"], t["c"], None, t["padded_offsets"], t["alpha"], t["beta"],
                                        t["prob"], t["dprob"], b_tensor=t["b"], engine="vendor_sm100")
    msg = str(err.value)
    assert "vendor_sm100" in msg and "nvidia-cudnn-frontend is not installed" in msg and "no CUDA GPU" in msg


def test_load_vendor_reasons(monkeypatch, fake_cudnn):
    assert vendor.load_vendor()[0] is fake_cudnn
    del fake_cudnn.GroupedGemmDgluSm100
    mod, why = vendor.load_vendor()
    assert mod is None and "9.99-fake" in why and "GroupedGemmDgluSm100" in why
    monkeypatch.setitem(sys.modules, "cudnn", None)
    assert "nvidia-cudnn-frontend is not installed" in vendor.load_vendor()[1]


def test_cudnn_ext_under_the_vendors_name_is_not_the_vendor(monkeypatch):
    """``sys.modules["cudnn"] = cudnn_ext`` (the drop-in alias, as tools/vendor_suite.py sets it):
    the engine must not take our own class for the vendor's and delegate to itself."""
    alias = types.ModuleType("cudnn")
    alias.GroupedGemmDgluSm100 = cudnn.GroupedGemmDgluSm100
    monkeypatch.setitem(sys.modules, "cudnn", alias)
    mod, why = vendor.load_vendor()
    assert mod is None and "cudnn_ext under the vendor's name" in why
    problem, _ = bf16_call()
    assert any("cudnn_ext under the vendor's name" in r for r in decline_reasons(problem)["vendor_sm100"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only decline")
def test_cli_info_lists_the_vendor_reason():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-m", "cudnn_ext", "info"], capture_output=True, text=True, check=True,
                         cwd=root, env={**os.environ, "PYTHONPATH": root}).stdout
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("vendor_sm100"))
    assert "cannot run" in line and "no CUDA GPU" in line
    if "nvidia-cudnn-frontend    not installed" in out:
        assert "nvidia-cudnn-frontend is not installed" in line


@pytest.mark.parametrize("cap,words", [((9, 0), "needs SM100+ (Blackwell), found sm_90"),
                                       ((12, 0), "sm_120 is not an architecture"),
                                       ((10, 0), None)])
def test_architecture_declines(monkeypatch, fake_cudnn, cap, words):
    import dataclasses

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: cap)
    eng = engine_by_name("vendor_sm100")
    assert eng.available() is None
    problem = dataclasses.replace(bf16_call()[0], device_type="cuda", device_index=0)
    reasons = eng.check_support(problem)
    if words is None:
        assert reasons == []
    else:
        assert any(words in r for r in reasons), reasons


def test_feature_declines(monkeypatch, fake_cudnn):
    import dataclasses

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (10, 0))
    eng = engine_by_name("vendor_sm100")
    base = dataclasses.replace(bf16_call()[0], device_type="cuda", device_index=0)
    assert any("N-major dense B" in r for r in eng.check_support(dataclasses.replace(base, b_major="n")))
    geglu = dataclasses.replace(base, act=dataclasses.replace(base.act, act_func="dgeglu", geglu_alpha=1.5))
    assert any("fixed GeGLU constants" in r for r in eng.check_support(geglu))
    fp4 = dataclasses.replace(nvfp4_discrete_call()[0], device_type="cuda", device_index=0, d_dtype=torch.float16)
    assert any("float16 D" in r for r in eng.check_support(fp4))
    assert any("not cuda" in r for r in eng.check_support(bf16_call()[0]))
    rubin = (10, 7)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: rubin)
    assert any("Rubin" in r for r in eng.check_support(base))


# ----------------------------------------------------------------------------- argument mapping
def test_bf16_dense_argument_mapping(fake_cudnn):
    problem, pack = bf16_call(act_func="dgeglu", linear_offset=0.5)
    dprob_before, dbias_before = pack["dprob"].clone(), pack["dbias"].clone()
    plan, obj, ws = run_plan(problem, pack, Knobs.of(tile_m=128, tile_n=128))
    init, call = obj.init, obj.calls[0]
    assert obj.compiled
    two_n = 2 * N
    assert geometry(init["sample_a"]) == ((M, K, 1), (K, 1, 1), torch.bfloat16)
    assert geometry(init["sample_c"]) == ((M, two_n, 1), (two_n, 1, 1), torch.bfloat16)
    assert geometry(init["sample_d_row"]) == ((M, two_n, 1), (two_n, 1, 1), torch.bfloat16)
    assert geometry(init["sample_prob"]) == ((M, 1, 1), (1, 1, 1), torch.float32)
    assert geometry(init["sample_dprob"]) == ((M, 1, 1), (1, 1, 1), torch.float32)
    assert geometry(init["sample_dbias"]) == ((L, two_n, 1), (two_n, 1, 1), torch.bfloat16)
    assert geometry(init["sample_b"]) == ((N, K, L), (K, 1, N * K), torch.bfloat16)
    assert geometry(init["sample_padded_offsets"]) == ((L,), (1,), torch.int32)
    for k in ("sample_sfa", "sample_sfb", "sample_d_col", "sample_sfd_row", "sample_sfd_col", "sample_amax",
              "sample_norm_const", "sample_activation"):
        assert init[k] is None, k
    assert "num_experts" not in init and "b_shape" not in init  # dense: the vendor derives them from B
    assert init["mma_tiler_mn"] == (128, 128) and init["acc_dtype"] == torch.float32
    assert init["act_func"] == "dgeglu" and init["linear_offset"] == 0.5 and init["geglu_alpha"] == 1.702
    assert (init["sf_vec_size"], init["discrete_col_sfd"], init["epilogue_op"]) == (16, False, None)
    assert init["m_aligned"] == 256 and init["cluster_shape_mn"] is None and init["vector_f32"] is False
    # execute: views of the caller's buffers (written in place), nothing zeroed
    assert call["d_row_tensor"].data_ptr() == pack["d_row"].data_ptr()
    assert call["dprob_tensor"].data_ptr() == pack["dprob"].data_ptr()
    assert call["b_ptrs"] is None and call["sfb_ptrs"] is None and call["current_stream"] is None
    assert call["workspace"].numel() == 128 and call["workspace"].data_ptr() == ws.data_ptr()
    assert torch.equal(pack["dprob"], dprob_before) and torch.equal(pack["dbias"], dbias_before)
    # a new M reuses the compiled vendor object
    m2 = 768
    pack2 = dict(pack, a=torch.randn(m2, K).bfloat16(), c=torch.randn(m2, two_n).bfloat16(),
                 d_row=torch.empty(m2, two_n, dtype=torch.bfloat16), prob=torch.rand(m2), dprob=torch.zeros(m2))
    plan.execute(pack2, ws)
    assert len(FakeVendor.made) == 1 and obj.calls[1]["a_tensor"].shape == (m2, K, 1)


def test_mxfp8_quantized_argument_mapping(fake_cudnn):
    problem, pack = mxfp8_call()
    _plan, obj, _ws = run_plan(problem, pack)
    init, call = obj.init, obj.calls[0]
    two_n = 2 * N
    assert geometry(init["sample_d_col"]) == ((M, two_n, 1), (two_n, 1, 1), E4M3)
    for slot in ("sfa", "sfb", "sfd_row", "sfd_col"):  # the 6-D views, as the contract returned them
        assert init[f"sample_{slot}"] is pack[slot] and call[f"{slot}_tensor"] is pack[slot]
        assert init[f"sample_{slot}"].dim() == 6
    assert init["sample_norm_const"] is pack["norm_const"] and tuple(pack["norm_const"].shape) == (1,)
    assert init["sample_b"].dtype == E4M3 and init["sample_amax"] is None
    assert init["sf_vec_size"] == 32 and init["act_func"] == "dsituglu" and init["situ_beta1"] == 3.0
    assert init["mma_tiler_mn"] == (256, 256)
    kn = engine_by_name("vendor_sm100").knob_space(problem)
    assert {k.get("tile_n") for k in kn} == {256}, "block-scaled TileN must be 256"


def test_nvfp4_discrete_argument_mapping(fake_cudnn):
    problem, pack = nvfp4_discrete_call()
    plan, obj, _ws = run_plan(problem, pack)
    init, call = obj.init, obj.calls[0]
    assert init["num_experts"] == L and init["b_shape"] == (N, K) and init["b_dtype"] == torch.uint8
    assert init["b_major"] == "k" and init["use_dynamic_sched"] is True
    assert "sample_b_ptrs" not in init and call["b_ptrs"] is pack["b_ptrs"] and call["sfb_ptrs"] is pack["sfb_ptrs"]
    assert geometry(init["sample_a"]) == ((M, K // 2, 1), (K // 2, 1, 1), torch.uint8)  # stored bytes
    assert geometry(init["sample_amax"]) == ((L, 2, 1), (2, 1, 1), torch.float32)
    assert init["sample_prob"] is None and init["sample_dprob"] is None
    # two 128-B descriptors per expert (B and SFB) + the dynamic scheduler's counter
    assert plan.workspace_requests()[0].nbytes == 512 + 128 == vendor.vendor_workspace_bytes(problem)
    assert call["workspace"].numel() == 640


def test_workspace_too_small_for_the_vendor_is_a_clear_error(fake_cudnn, monkeypatch):
    monkeypatch.setattr(FakeVendor, "scratch_workspace_bytes", lambda self: 4096)
    problem, pack = bf16_call()
    with pytest.raises(RuntimeError, match="needs 4096 workspace bytes but the plan reserved 128"):
        run_plan(problem, pack)


def test_build_without_the_package_is_an_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)
    with pytest.raises(ImportError, match="nvidia-cudnn-frontend"):
        engine_by_name("vendor_sm100").build(bf16_call()[0], Knobs.of(tile_m=256, tile_n=256))


@pytest.mark.parametrize("exc", [ValueError, NotImplementedError, RuntimeError])
def test_vendor_refusal_at_first_execute_keeps_its_type_and_names_the_engine(fake_cudnn, monkeypatch,
                                                                            exc):
    def refuse(self):
        raise exc("tile shape not supported for this K")
    monkeypatch.setattr(FakeVendor, "check_support", refuse)
    problem, pack = bf16_call()
    d_before = pack["d_row"].clone()
    with pytest.raises(exc, match=r"(?s)GroupedGemmDgluSm100.check_support \(engine vendor_sm100\) "
                                  r"refused.*engine='reference'.*tile shape not supported for this K"):
        run_plan(problem, pack)
    assert not FakeVendor.made[-1].calls, "nothing may launch after a refusal"
    assert torch.equal(pack["d_row"].view(torch.int16), d_before.view(torch.int16))  # untouched bits


def test_vendor_check_support_returning_false_is_not_implemented(fake_cudnn, monkeypatch):
    monkeypatch.setattr(FakeVendor, "check_support", lambda self: False)
    problem, pack = bf16_call()
    with pytest.raises(NotImplementedError, match="returned False"):
        run_plan(problem, pack)
