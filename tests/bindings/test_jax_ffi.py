"""JAX: ``grouped_gemm_dglu_jax`` on CUDA is an XLA FFI custom call of the SM90 kernel.

CPU tier (no GPU): ``jax.export`` for ``platforms=["cuda"]`` runs cutlass.jax's CUDA lowering
on this machine, which compiles our kernel for sm_90a through ``cute.compile`` and embeds it
in the custom call. We check the exported StableHLO: one ``CuteDSLRT_NvJaxCutlassCall`` custom
call with the expected operand/result shapes, the three zero-buffer aliases, an sm_90 cubin
inside, the fp32 -> bf16 dbias rounding after it, and no host callback. We also check which
traced calls take the FFI branch at all (dense, supported by the SM90 engine) and that the CPU
lowering of the same program is the host callback. What runs on a GPU is the ``gpu`` test
(compared with the float64 oracle), not run yet.

Env: ``CUTE_DSL_ARCH=sm_90a`` must be set before cutlass is imported (as tests/compile/test_sm90_compile.py
gets it through ``cudnn_ext.kernels.sm90.build``); ``cute.compile`` is not thread-safe, and
these tests compile in the same process as the sm90 compile tests, one at a time.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import struct

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before anything imports cutlass

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cudnn_ext.jax import grouped_gemm_dglu_jax, grouped_gemm_dglu_jax_sm100  # noqa: E402

needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="nvidia-cutlass-dsl is not installed")


@pytest.fixture(autouse=True)
def _ffi_on(monkeypatch):
    monkeypatch.delenv("CUDNN_EXT_JAX_FFI", raising=False)  # on by default (verified on an H200)

L, N, K, M = 3, 64, 40, 1024
OFFS = (256, 256, 768)  # an empty expert; rows 768.. belong to no expert
TARGET = re.compile(r"stablehlo\.custom_call @(CuteDSLRT_NvJaxCutlassCall\w*)\(")
SDS = jax.ShapeDtypeStruct


def _avals(c_dtype=jnp.bfloat16, n=N, k=K, m=M):
    return (SDS((m, k, 1), jnp.bfloat16), SDS((m, 2 * n, 1), c_dtype), SDS((L,), jnp.int32),
            SDS((L,), jnp.float32), SDS((L,), jnp.float32), SDS((m, 1, 1), jnp.float32),
            SDS((L, n, k), jnp.bfloat16))


def _fn(**kw):
    def f(a, c, offs, alpha, beta, prob, b):
        return grouped_gemm_dglu_jax(a, c, offs, alpha, beta, prob_tensor=prob, b_tensor=b, **kw)
    return f


def _uses_ffi(f, avals) -> bool:
    return "cutlass_call_inner" in str(jax.make_jaxpr(f)(*avals))


def test_jit_takes_the_engines_choice_at_deep_k():
    """Under jax.jit dbias stays in fp32 for JAX to round (fold_dbias=False); the FFI path
    picks what the engine ranks first (the same knob space and cost model), the cooperative
    kernel at deep K and on skew, with dbias too (those unfolded forms passed their GPU
    tests), and keeps the split last round off."""
    from cudnn_ext.engines.sm90 import Sm90DgluEngine, cooperative_config
    from cudnn_ext.jax.ffi import choose_config, ffi_config
    from cudnn_ext.problem import ActConfig, DgluProblem

    def problem(dbias):
        return DgluProblem(n=2048, k=7168, num_experts=8, m=32768, weight_mode="dense",
                           b_major="k", ab_dtype=torch.bfloat16, c_dtype=torch.bfloat16,
                           d_dtype=torch.bfloat16, act=ActConfig("dswiglu"),
                           generate_dbias=dbias, device_type="cuda")

    eng = Sm90DgluEngine()
    for dbias in (True, False):  # what the engine itself picks
        p = problem(dbias)
        deep = cooperative_config(p)
        assert deep.split_last == 3 and deep.c_stages == 4
        assert min(eng.knob_space(p), key=lambda kn: eng.cost(p, kn)) == deep
        assert choose_config(p) == deep
    # the engine's own config splits the last round and folds dbias; the FFI call's does not
    engine_cfg = choose_config(problem(True))
    cfg = ffi_config(engine_cfg)
    assert (engine_cfg.split_last, engine_cfg.fold_dbias) == (3, True)
    assert (cfg.split_last, cfg.fold_dbias) == (1, False)
    assert cfg == dataclasses.replace(engine_cfg, split_last=1, fold_dbias=False)
    shallow = dataclasses.replace(problem(True), k=4096)  # K 4096 at N 2048: ping-pong
    assert not choose_config(shallow).cooperative
    # skew's K and N: the engine's 2-stage cooperative form, dense or per-expert weights,
    # with or without dbias (the FFI path once filtered it out with dbias: this guards that)
    skew = dataclasses.replace(problem(True), k=4096, n=1024)
    for p in (skew, dataclasses.replace(skew, generate_dbias=False),
              dataclasses.replace(skew, weight_mode="discrete", b_major="n")):
        two_stage = cooperative_config(p)
        assert two_stage.c_stages == 2 and two_stage.split_last == 1
        assert min(eng.knob_space(p), key=lambda kn: eng.cost(p, kn)) == two_stage
        assert choose_config(p) == two_stage


@needs_dsl
def test_ffi_branch_only_where_the_sm90_kernel_applies(monkeypatch):
    assert _uses_ffi(_fn(generate_dbias=True), _avals())
    assert _uses_ffi(_fn(act_func="dgeglu", d_dtype=jnp.float32), _avals(jnp.float32))
    # what the contract refuses fails at trace time (contract.normalize on the arrays' metadata)
    with pytest.raises(ValueError, match="b_tensor: N must be a positive multiple of 32"):
        _uses_ffi(_fn(), _avals(n=48))
    with pytest.raises(ValueError, match="a_tensor: M .* multiple of 256"):
        _uses_ffi(_fn(), _avals(m=1000))
    # m_aligned 8: the SM90 kernel runs it, the FFI call (no scratch for its tile table) does not
    assert not _uses_ffi(_fn(m_aligned=8), _avals(m=1000))
    monkeypatch.setenv("CUDNN_EXT_JAX_FFI", "0")  # the switch-off
    assert not _uses_ffi(_fn(), _avals())


def _discrete_fn(**kw):
    def f(a, c, offs, alpha, beta, prob, ptrs):
        return grouped_gemm_dglu_jax(a, c, offs, alpha, beta, ptrs, n=N, prob_tensor=prob, **kw)
    return f


_DISCRETE_AVALS = _avals()[:6] + (SDS((8 * L,), jnp.uint8),)


@needs_dsl
def test_discrete_weights_use_the_ffi_call(monkeypatch):
    assert _uses_ffi(_discrete_fn(), _DISCRETE_AVALS)
    assert _uses_ffi(_discrete_fn(b_major="n", generate_dbias=True), _DISCRETE_AVALS)
    monkeypatch.setenv("CUDNN_EXT_JAX_FFI", "0")
    assert not _uses_ffi(_discrete_fn(), _DISCRETE_AVALS)  # CPU backend: the host callback


def test_discrete_on_a_gpu_backend_without_the_ffi_path_is_refused(monkeypatch):
    """The host callback cannot read device addresses: with the FFI path off (or declined) a GPU
    backend refuses b_ptrs at trace time, naming why."""
    monkeypatch.setenv("CUDNN_EXT_JAX_FFI", "0")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(NotImplementedError, match=r"b_ptrs.*CUDNN_EXT_JAX_FFI=0"):
        jax.make_jaxpr(_discrete_fn())(*_DISCRETE_AVALS)


@needs_dsl
@pytest.mark.parametrize("b_major,dbias", [("k", True), ("n", False)])
def test_export_discrete_for_cuda(b_major, dbias):
    """Discrete b_ptrs: the pointer table is an operand read on the device, and the B descriptor
    scratch ((L + 1) x 128 bytes, zeroed) is one more aliased output, dropped from the results."""
    from cutlass.jax import get_export_disabled_safety_checks

    f = jax.jit(_discrete_fn(b_major=b_major, generate_dbias=dbias))
    exp = jax.export.export(f, platforms=["cuda"],
                            disabled_checks=get_export_disabled_safety_checks())(*_DISCRETE_AVALS)
    text = exp.mlir_module()
    assert len(TARGET.findall(text)) == 1 and "callback" not in text
    call = next(ln for ln in text.splitlines() if TARGET.search(ln))
    ins = [f"{M}x{K}xbf16", f"{8 * L}xui8", f"{M}x{2 * N}xbf16", f"{L}xi32", f"{L}xf32", f"{L}xf32",
           f"{M}xf32", f"{M}x{2 * N}xbf16", f"{M}xf32"] + ([f"{L}x{2 * N}xf32"] if dbias else []) + \
        [f"{(L + 1) * 128}xui8"]
    outs = ins[7:]
    sig = ": (" + ", ".join(f"tensor<{t}>" for t in ins) + ") -> (" + ", ".join(f"tensor<{t}>" for t in outs) + ")"
    assert sig in call, call[-600:]
    aliases = re.findall(r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)", call)
    assert sorted((int(o), int(i)) for o, i in aliases) == [(j, 7 + j) for j in range(len(outs))]
    assert [tuple(a.shape) for a in exp.out_avals] == [(M, 2 * N, 1), (M, 1, 1)] + ([(L, 2 * N, 1)] if dbias else [])


@needs_dsl
def test_cpu_lowering_is_the_host_callback():
    """The same program lowered for CPU: no cutlass custom call (the CUDA branch is dropped)."""
    text = jax.jit(_fn(generate_dbias=True)).lower(*_avals()).as_text()
    assert not TARGET.search(text) and "callback" in text


@needs_dsl
def test_vmap_runs_once_per_element():
    """cutlass_call has no batching rule; the CUDA branch maps over the batch (as the callback
    does), so vmap still works, on CPU through the callback."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((2, M, K)), jnp.bfloat16)
    c = jnp.asarray(rng.standard_normal((2, M, 2 * N)), jnp.bfloat16)
    prob = jnp.asarray(rng.random((2, M)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((L, N, K)), jnp.bfloat16)
    offs, ones = jnp.array(OFFS, jnp.int32), jnp.ones(L, jnp.float32)

    def f(a, c, p):
        return grouped_gemm_dglu_jax(a, c, offs, ones, ones, prob_tensor=p, b_tensor=b, generate_dbias=True)
    assert "cutlass_call_inner" in str(jax.make_jaxpr(jax.vmap(f))(a, c, prob))
    batched = jax.jit(jax.vmap(f))(a, c, prob)
    single = jax.jit(f)(a[1], c[1], prob[1])
    for x, y in zip(batched, single):
        np.testing.assert_array_equal(np.asarray(x[1], np.float32), np.asarray(y, np.float32))


def _cubin_archs(module: bytes):
    """SM versions of the CUDA ELF images embedded in the host object ``module``."""
    out, i = [], module.find(b"\x7fELF", 1)
    while i > 0:
        if struct.unpack_from("<H", module, i + 18)[0] == 190:  # EM_CUDA
            out.append((struct.unpack_from("<I", module, i + 48)[0] >> 8) & 0xFF)
        i = module.find(b"\x7fELF", i + 1)
    return out


_EXPORTS = [("dswiglu", True, jnp.bfloat16, jnp.bfloat16), ("dgeglu", False, jnp.float32, jnp.float16)]


@needs_dsl
@pytest.mark.parametrize("act_func,dbias,c_dtype,d_dtype", _EXPORTS,
                         ids=[f"{a}-dbias{int(d)}" for a, d, _, _ in _EXPORTS])
def test_export_for_cuda_lowers_the_ffi_custom_call(act_func, dbias, c_dtype, d_dtype):
    from cutlass.jax import get_export_disabled_safety_checks
    from cutlass.jax import compile as cj_compile

    f = jax.jit(_fn(act_func=act_func, generate_dbias=dbias, d_dtype=d_dtype))
    exp = jax.export.export(f, platforms=["cuda"],
                            disabled_checks=get_export_disabled_safety_checks())(*_avals(c_dtype))
    text = exp.mlir_module()
    targets = TARGET.findall(text)
    assert targets == [f"CuteDSLRT_NvJaxCutlassCall_v{2 if jax.version.__version_info__ >= (0, 9, 1) else 1}"]
    assert "callback" not in text  # no host round trip on CUDA
    call = next(ln for ln in text.splitlines() if TARGET.search(ln))
    d_t, c_t = {jnp.bfloat16: "bf16", jnp.float16: "f16", jnp.float32: "f32"}[d_dtype], \
        {jnp.bfloat16: "bf16", jnp.float32: "f32"}[c_dtype]
    ins = [f"{M}x{K}xbf16", f"{L}x{N}x{K}xbf16", f"{M}x{2 * N}x{c_t}", f"{L}xi32", f"{L}xf32", f"{L}xf32",
           f"{M}xf32", f"{M}x{2 * N}x{d_t}", f"{M}xf32"] + ([f"{L}x{2 * N}xf32"] if dbias else [])
    outs = ins[7:]
    sig = ": (" + ", ".join(f"tensor<{t}>" for t in ins) + ") -> (" + ", ".join(f"tensor<{t}>" for t in outs) + ")"
    assert sig in call, call[-600:]
    aliases = re.findall(r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)", call)
    assert sorted((int(o), int(i)) for o, i in aliases) == [(j, 7 + j) for j in range(len(outs))]
    if dbias:  # the one rounding of the fp32 workspace, after the call
        assert re.search(rf"stablehlo\.convert %\S+ : \(tensor<{L}x{2 * N}xf32>\) -> tensor<{L}x{2 * N}xbf16>", text)
    assert [tuple(a.shape) for a in exp.out_avals] == [(M, 2 * N, 1), (M, 1, 1)] + ([(L, 2 * N, 1)] if dbias else [])
    # the module in the backend config is the host object with our kernel's cubin, for sm_90
    mods = [r.module for r in cj_compile._CUTLASS_COMPILE_CACHE.values()]
    assert mods and all(90 in _cubin_archs(mod) for mod in mods)


@needs_dsl
@pytest.mark.parametrize("weights", ["dense", "n"])
@pytest.mark.parametrize("form", ["deep", "2-stage"])
def test_export_cooperative_dbias_variant_compiles(form, weights, monkeypatch):
    """The cooperative kernel with dbias as the FFI path would build it (fold_dbias=False),
    forced, in both forms, dense or per-expert N-major weights: it compiles for sm_90a (its
    GPU test is the ``gpu`` one below)."""
    from cutlass.jax import get_export_disabled_safety_checks

    from cudnn_ext.engines.sm90 import COOPERATIVE_DEEP_KNOBS, COOPERATIVE_KNOBS, config_for
    from cudnn_ext.jax import ffi

    knobs = COOPERATIVE_DEEP_KNOBS if form == "deep" else COOPERATIVE_KNOBS
    monkeypatch.setattr(ffi, "choose_config", lambda problem: config_for(problem, **knobs))
    if weights == "dense":
        f, avals = jax.jit(_fn(generate_dbias=True)), _avals()
    else:
        f = jax.jit(_discrete_fn(b_major=weights, generate_dbias=True))
        avals = _DISCRETE_AVALS
    exp = jax.export.export(f, platforms=["cuda"],
                            disabled_checks=get_export_disabled_safety_checks())(*avals)
    assert len(TARGET.findall(exp.mlir_module())) == 1


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    den = ref.norm().item() or 1.0
    peak = ref.abs().max().item() or 1.0
    return max((x - ref).norm().item() / den, (x - ref).abs().max().item() / peak / 4)


def _check_against_oracle(act_func, j, d_row, dprob, dbias):
    from oracle import oracle

    t = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in j.items() if k != "ptrs"}
    ref = oracle(t["a"].view(M, K), list(t["b"]), t["c"].view(M, 2 * N), OFFS, t["alpha"], t["beta"],
                 t["prob"].view(M), act_func=act_func)
    rows = OFFS[-1]
    d = torch.from_numpy(np.asarray(d_row, dtype=np.float32)).view(M, 2 * N)
    assert _rel_err(d[:rows], ref["d"][:rows]) < 1.5e-2
    assert (d[rows:] == 0).all()  # rows past the last offset: the aliased zeros
    dp = torch.from_numpy(np.asarray(dprob)).view(M)
    assert _rel_err(dp, ref["dprob"]) < 2e-3 and (dp[rows:] == 0).all()
    if dbias is not None:
        db = torch.from_numpy(np.asarray(dbias, dtype=np.float32)).view(L, 2 * N)
        assert _rel_err(db, ref["dbias"]) < 1.5e-2 and (db[1] == 0).all()  # expert 1 is empty


def _gpu_operands():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)
    c = (3 * rng.standard_normal((M, 2 * N))).astype(np.float32)
    b = rng.standard_normal((L, N, K)).astype(np.float32) / np.sqrt(K)
    alpha, beta = (rng.random(L) + 0.5).astype(np.float32), (rng.random(L) + 0.5).astype(np.float32)
    prob = rng.random(M).astype(np.float32)
    return dict(a=jnp.asarray(a, jnp.bfloat16).reshape(M, K, 1), c=jnp.asarray(c, jnp.bfloat16).reshape(M, 2 * N, 1),
                b=jnp.asarray(b, jnp.bfloat16), offs=jnp.array(OFFS, jnp.int32), alpha=jnp.asarray(alpha),
                beta=jnp.asarray(beta), prob=jnp.asarray(prob).reshape(M, 1, 1))


def _skip_unless_jax_gpu():
    if jax.default_backend() != "gpu" or importlib.util.find_spec("cutlass") is None:
        pytest.skip("needs JAX's CUDA backend and the CuTe DSL")


@pytest.mark.gpu
@pytest.mark.parametrize("b_major,act_func,dbias", [("k", "dswiglu", True), ("n", "dgeglu", False)])
def test_ffi_discrete_on_gpu_matches_the_float64_oracle(b_major, act_func, dbias):
    """Discrete b_ptrs under jax.jit on the GPU: per-expert device arrays (K-major (N, K) or
    N-major (K, N)), their pointer table read by the kernel; run twice (the descriptor scratch
    is rebuilt each call)."""
    _skip_unless_jax_gpu()
    from cudnn_ext.jax import expert_pointers

    j = _gpu_operands()
    experts = [j["b"][e] if b_major == "k" else jnp.asarray(j["b"][e].T) for e in range(L)]
    ptrs = expert_pointers(experts)
    f = jax.jit(_discrete_fn(b_major=b_major, act_func=act_func, generate_dbias=dbias))
    args = (j["a"], j["c"], j["offs"], j["alpha"], j["beta"], j["prob"], ptrs)
    assert "CuteDSLRT_NvJaxCutlassCall" in f.lower(*args).as_text()
    for _ in range(2):
        d_row, dprob, dbias_out = jax.block_until_ready(f(*args))
        _check_against_oracle(act_func, j, d_row, dprob, dbias_out)
    assert (dbias_out is None) == (not dbias)


@pytest.mark.gpu
@pytest.mark.parametrize("act_func", ["dswiglu", "dgeglu"])
def test_ffi_on_gpu_matches_the_float64_oracle(act_func):
    """The dense FFI path under jax.jit on the GPU (first passed on an H200, 2026-11-30)."""
    _skip_unless_jax_gpu()
    j = _gpu_operands()
    f = jax.jit(_fn(act_func=act_func, generate_dbias=True))
    args = (j["a"], j["c"], j["offs"], j["alpha"], j["beta"], j["prob"], j["b"])
    assert "CuteDSLRT_NvJaxCutlassCall" in f.lower(*args).as_text()
    d_row, dprob, dbias = jax.block_until_ready(f(*args))
    assert grouped_gemm_dglu_jax_sm100 is grouped_gemm_dglu_jax
    _check_against_oracle(act_func, j, d_row, dprob, dbias)


#: (act_func, weights): dense B, or per-expert arrays K-major ("k") or N-major ("n")
_COOP_JAX = [("dswiglu", "dense"), ("dgeglu", "dense"), ("dswiglu", "k"), ("dgeglu", "n")]


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["deep", "2-stage"])
@pytest.mark.parametrize("act_func,weights", _COOP_JAX, ids=[f"{a}-{w}" for a, w in _COOP_JAX])
def test_ffi_cooperative_dbias_on_gpu_matches_the_float64_oracle(act_func, weights, form,
                                                                 monkeypatch):
    """The cooperative kernel with dbias under jax.jit (fold_dbias=False: the folder warp
    adds the sums to the workspace without folding them, JAX rounds them), in both forms
    ``choose_config`` can pick: the deep one and the 2-stage one (both passed on an H200),
    dense or per-expert weights, forced here on the small operands (N < tile: the tile's
    columns past N are phantoms)."""
    _skip_unless_jax_gpu()
    from cudnn_ext.engines.sm90 import COOPERATIVE_DEEP_KNOBS, COOPERATIVE_KNOBS, config_for
    from cudnn_ext.jax import expert_pointers, ffi

    knobs = COOPERATIVE_DEEP_KNOBS if form == "deep" else COOPERATIVE_KNOBS
    monkeypatch.setattr(ffi, "choose_config", lambda problem: config_for(problem, **knobs))
    j = _gpu_operands()
    args = (j["a"], j["c"], j["offs"], j["alpha"], j["beta"], j["prob"])
    if weights == "dense":
        f = jax.jit(_fn(act_func=act_func, generate_dbias=True))
        args += (j["b"],)
    else:
        experts = [j["b"][e] if weights == "k" else jnp.asarray(j["b"][e].T) for e in range(L)]
        f = jax.jit(_discrete_fn(b_major=weights, act_func=act_func, generate_dbias=True))
        args += (expert_pointers(experts),)
    assert "CuteDSLRT_NvJaxCutlassCall" in f.lower(*args).as_text()
    d_row, dprob, dbias = jax.block_until_ready(f(*args))
    _check_against_oracle(act_func, j, d_row, dprob, dbias)
