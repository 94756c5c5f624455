"""JAX: the wrapper on JAX arrays (eager, DLPack) and the jit entry point (pure_callback, CPU).

Each JAX result is checked against the torch path on the same bytes (the torch path is checked
against the float64 oracle in test_torch_integration.py). Seeded: numpy default_rng(seed).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import cudnn_ext as cudnn  # noqa: E402
import cudnn_ext.torch as ct  # noqa: E402
from cudnn_ext.jax import expert_pointers, grouped_gemm_dglu_jax, grouped_gemm_dglu_jax_sm100, to_torch  # noqa: E402

L, N, K, M = 3, 64, 32, 1024
OFFS = (256, 256, 768)  # an empty expert; rows 768.. belong to no expert


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        a=jnp.asarray(rng.standard_normal((M, K, 1)), jnp.bfloat16),
        c=jnp.asarray(2 * rng.standard_normal((M, 2 * N, 1)), jnp.bfloat16),
        ws=[jnp.asarray(rng.standard_normal((N, K)), jnp.bfloat16) for _ in range(L)],
        offs=jnp.array(OFFS, jnp.int32),
        alpha=jnp.asarray(rng.random(L) + 0.5, jnp.float32),
        beta=jnp.asarray(rng.random(L) + 0.5, jnp.float32),
        prob=jnp.asarray(rng.random((M, 1, 1)), jnp.float32),
    )


def torch_expected(p, act_func, generate_dbias):
    """The torch op on the same bytes (zero-copy views)."""
    b = torch.stack([to_torch(w) for w in p["ws"]])
    return ct.grouped_gemm_dglu(to_torch(p["a"])[..., 0], to_torch(p["c"])[..., 0], to_torch(p["offs"]),
                                to_torch(p["alpha"]), to_torch(p["beta"]), to_torch(p["prob"]).view(M), b=b,
                                act_func=act_func, generate_dbias=generate_dbias)


def same(jx, t, rows=None):
    got = torch.from_numpy(np.array(jx, dtype=np.float32)).reshape(t.shape)
    want = t.float()
    if rows is not None:
        got, want = got[:rows], want[:rows]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("act_func", ["dswiglu", "dgeglu"])
def test_eager_wrapper_discrete(act_func):
    p = inputs()
    dprob = jnp.zeros((M, 1, 1), jnp.float32)
    out = cudnn.grouped_gemm_dglu_wrapper_sm100(
        a_tensor=p["a"], c_tensor=p["c"], sfa_tensor=None, padded_offsets=p["offs"], alpha_tensor=p["alpha"],
        beta_tensor=p["beta"], prob_tensor=p["prob"], dprob_tensor=dprob, b_ptrs=expert_pointers(p["ws"]), n=N,
        b_dtype=jnp.bfloat16, act_func=act_func, generate_dbias=True)
    d_row, d_col, dprob_out, dbias, amax, sfd_row, sfd_col = out
    assert isinstance(d_row, jax.Array) and d_row.shape == (M, 2 * N, 1) and d_row.dtype == jnp.bfloat16
    assert dprob_out is dprob  # accumulated in place, returned as the caller's object
    assert d_col is None and amax is None and sfd_row is None and sfd_col is None
    want = torch_expected(p, act_func, True)
    same(d_row, want[0], rows=768)
    same(dprob, want[1])
    same(dbias, want[2])


def test_eager_wrapper_dense_takes_L_N_K():
    p = inputs(1)
    dprob = jnp.zeros((M, 1, 1), jnp.float32)
    out = cudnn.grouped_gemm_dglu_wrapper(
        p["a"], p["c"], None, p["offs"], p["alpha"], p["beta"], p["prob"], dprob, b_tensor=jnp.stack(p["ws"]))
    want = torch_expected(p, "dswiglu", False)
    same(out["d_row_tensor"], want[0], rows=768)
    same(dprob, want[1])
    assert out["dbias_tensor"] is None


def test_eager_wrapper_errors():
    p = inputs()
    args = (p["a"], p["c"], None, p["offs"], p["alpha"], p["beta"], p["prob"], jnp.zeros((M, 1, 1), jnp.float32))
    with pytest.raises(ValueError, match="block-scaled"):
        cudnn.grouped_gemm_dglu_wrapper(*args, b_tensor=jnp.stack(p["ws"]), norm_const_tensor=jnp.ones(1))
    with pytest.raises(ValueError, match=r"\(L, N, K\)"):
        cudnn.grouped_gemm_dglu_wrapper(*args, b_tensor=p["ws"][0])

    @jax.jit
    def traced(a):
        return cudnn.grouped_gemm_dglu_wrapper(a, *args[1:], b_tensor=jnp.stack(p["ws"]))[0]

    with pytest.raises(TypeError, match="grouped_gemm_dglu_jax"):
        traced(p["a"])


@pytest.mark.parametrize("weights", ["discrete", "dense"])
@pytest.mark.parametrize("act_func,generate_dbias", [("dswiglu", True), ("dgeglu", False)])
def test_jit_entry_point(weights, act_func, generate_dbias):
    p = inputs(2)
    ptrs = expert_pointers(p["ws"])
    bd = jnp.stack(p["ws"])

    @jax.jit
    def step(a, c, offs, alpha, beta, prob, w):
        kw = dict(b_ptrs=w, n=N) if weights == "discrete" else dict(b_tensor=w)
        d_row, dprob, dbias = grouped_gemm_dglu_jax(a, c, offs, alpha, beta, prob_tensor=prob, act_func=act_func,
                                                    generate_dbias=generate_dbias, **kw)
        return d_row, dprob * 1.0, dbias  # dprob composes with traced code

    w = ptrs if weights == "discrete" else bd
    d_row, dprob, dbias = step(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], p["prob"], w)
    assert d_row.shape == (M, 2 * N, 1) and dprob.shape == (M, 1, 1)
    want = torch_expected(p, act_func, generate_dbias)
    same(d_row, want[0])  # rows past the last offset come back zero, like the torch op's
    same(dprob, want[1])
    if generate_dbias:
        assert dbias.shape == (L, 2 * N, 1) and dbias.dtype == jnp.bfloat16
        same(dbias, want[2])
    else:
        assert dbias is None
    # a second call with new values reuses the trace and stays correct
    p2 = inputs(3)
    p2["ws"] = p["ws"]
    d2, dp2, _ = step(p2["a"], p2["c"], p2["offs"], p2["alpha"], p2["beta"], p2["prob"], w)
    same(dp2, torch_expected(p2, act_func, generate_dbias)[1])


def test_jit_validates_at_trace_time_and_alias():
    p = inputs()
    assert grouped_gemm_dglu_jax_sm100 is grouped_gemm_dglu_jax
    with pytest.raises(ValueError, match="c_tensor: shape"):
        jax.jit(lambda a, c: grouped_gemm_dglu_jax(a, c, p["offs"], p["alpha"], p["beta"], prob_tensor=p["prob"],
                                                   b_tensor=jnp.stack(p["ws"])))(p["a"], p["c"][:, :64])
    with pytest.raises(TypeError, match="padded_offsets: dtype"):
        grouped_gemm_dglu_jax(p["a"], p["c"], p["offs"].astype(jnp.float32), p["alpha"], p["beta"],
                              prob_tensor=p["prob"], b_tensor=jnp.stack(p["ws"]))
    with pytest.raises(ValueError, match="b_ptrs/b_tensor"):
        grouped_gemm_dglu_jax(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], prob_tensor=p["prob"])



def test_class_api_accepts_jax_samples_and_arrays():
    """The vendor's class API takes JAX arrays (BF16): samples, then execute writes D, dprob and
    dbias in place through their DLPack views; results equal the torch class API's."""
    import jax.numpy as jnp

    import cudnn_ext

    L, N, K, M = 2, 32, 64, 512
    g = torch.Generator().manual_seed(7)
    a = torch.randn(M, K, generator=g).to(torch.bfloat16)
    w = (torch.randn(L, N, K, generator=g) * 0.1).to(torch.bfloat16)
    c = torch.randn(M, 2 * N, generator=g).to(torch.bfloat16)
    offs = torch.tensor([256, 512], dtype=torch.int32)
    alpha, beta, prob = torch.rand(L, generator=g) + 0.5, torch.rand(L, generator=g) + 0.5, torch.rand(M, generator=g)

    def run(x, b, d_row, dprob, dbias):
        op = cudnn_ext.GroupedGemmDglu(
            sample_a=x(a), sample_c=x(c), sample_d_row=d_row, sample_d_col=None, sample_sfa=None,
            sample_padded_offsets=x(offs), sample_alpha=x(alpha), sample_beta=x(beta), sample_prob=x(prob),
            sample_dprob=dprob, sample_dbias=dbias, sample_b=b)
        op.execute(a_tensor=x(a), c_tensor=x(c), d_row_tensor=d_row, d_col_tensor=None, sfa_tensor=None,
                   padded_offsets=x(offs), alpha_tensor=x(alpha), beta_tensor=x(beta), prob_tensor=x(prob),
                   dprob_tensor=dprob, dbias_tensor=dbias, b_tensor=b)
        return d_row, dprob, dbias

    def to_jax(t):
        return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16) if t.dtype == torch.bfloat16 else jnp.asarray(t.numpy())

    want = run(lambda t: t, w.permute(1, 2, 0), torch.empty(M, 2 * N, dtype=torch.bfloat16), torch.zeros(M),
               torch.zeros(L, 2 * N, dtype=torch.bfloat16))
    got = run(to_jax, to_jax(w), jnp.zeros((M, 2 * N), jnp.bfloat16), jnp.zeros((M,), jnp.float32),
              jnp.zeros((L, 2 * N), jnp.bfloat16))
    for x, y in zip(got, want):
        assert torch.equal(torch.from_dlpack(x).float(), y.float())


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["discrete", "dense"])
def test_eager_wrapper_on_gpu_matches_the_float64_oracle(weights):
    """The eager wrapper on JAX arrays that live on the GPU: zero-copy DLPack views into the
    plan's engine there (the SM90 kernel on an H100/H200), the caller's dprob accumulated in
    place, D and dbias as JAX arrays on the same GPU; checked against the float64 oracle."""
    if jax.default_backend() != "gpu" or not torch.cuda.is_available():
        pytest.skip("needs JAX's CUDA backend and a CUDA GPU for torch")
    from oracle import oracle

    p = inputs(4)  # jnp arrays on the default device: the GPU
    dprob = jnp.zeros((M, 1, 1), jnp.float32)
    kw = (dict(b_ptrs=expert_pointers(p["ws"]), n=N, b_dtype=jnp.bfloat16) if weights == "discrete"
          else dict(b_tensor=jnp.stack(p["ws"])))
    jax.block_until_ready(p)
    out = cudnn.grouped_gemm_dglu_wrapper(p["a"], p["c"], None, p["offs"], p["alpha"], p["beta"],
                                          p["prob"], dprob, act_func="dgeglu", generate_dbias=True, **kw)
    torch.cuda.synchronize()  # the call ran on torch's current stream
    d_row, dbias = out["d_row_tensor"], out["dbias_tensor"]
    assert out["dprob_tensor"] is dprob
    for x in (d_row, dbias):
        assert isinstance(x, jax.Array) and {d.platform for d in x.devices()} == {"gpu"}
    f32 = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in p.items() if k != "ws"}
    ref = oracle(f32["a"].view(M, K), [torch.from_numpy(np.array(w, dtype=np.float32)) for w in p["ws"]],
                 f32["c"].view(M, 2 * N), OFFS, f32["alpha"], f32["beta"], f32["prob"].view(M),
                 act_func="dgeglu")

    def rel(x, want):
        x = torch.from_numpy(np.array(x, dtype=np.float32)).double().reshape(want.shape)
        return ((x - want).norm() / want.norm()).item()

    rows = OFFS[-1]
    assert rel(np.array(d_row, dtype=np.float32)[:rows], ref["d"][:rows]) < 1.5e-2
    assert rel(dprob, ref["dprob"]) < 2e-3
    db = torch.from_numpy(np.array(dbias, dtype=np.float32)).view(L, 2 * N)
    assert rel(db, ref["dbias"]) < 1.5e-2 and (db[1] == 0).all()  # expert 1 is empty


#: nvidia-cudnn-frontend 1.32's grouped_gemm_dglu_jax_sm100 (gemm/cutedsl/grouped/dglu/jax_api.py):
#: its positional parameters in order, then its keyword-only ones
VENDOR_POSITIONAL = ("a_tensor", "c_tensor", "padded_offsets", "alpha_tensor", "beta_tensor", "b_ptrs", "n",
                     "prob_tensor", "d_dtype", "acc_dtype", "mma_tiler_mn", "cluster_shape_mn", "vector_f32",
                     "act_func", "linear_offset", "generate_dbias", "use_dynamic_sched")
VENDOR_KEYWORD_ONLY = ("b_tensor", "sfa_tensor", "sfb_tensor", "norm_const_tensor", "discrete_col_sfd",
                       "geglu_alpha", "glu_clamp_max", "glu_clamp_min", "sf_vec_size")


def test_the_vendor_jax_name_has_the_vendors_signature():
    """Every vendor parameter, positional ones in the vendor's order and keyword-only ones by
    name; ours (b_major, m_aligned) are keyword-only after them. cutlass dtypes are taken."""
    import inspect

    params = inspect.signature(grouped_gemm_dglu_jax_sm100).parameters
    positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword_only = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert tuple(positional) == VENDOR_POSITIONAL
    assert keyword_only[:len(VENDOR_KEYWORD_ONLY)] == list(VENDOR_KEYWORD_ONLY)
    assert keyword_only[len(VENDOR_KEYWORD_ONLY):] == ["b_major", "m_aligned"]
    assert params["sf_vec_size"].default == 32 and params["discrete_col_sfd"].default is False


def test_block_scaled_keywords_are_refused_by_name():
    p = inputs()
    with pytest.raises(NotImplementedError, match="sfa_tensor: block-scaled .* not supported"):
        grouped_gemm_dglu_jax(p["a"], p["c"], p["offs"], p["alpha"], p["beta"], prob_tensor=p["prob"],
                              b_tensor=jnp.stack(p["ws"]), sfa_tensor=p["a"])


def test_cutlass_dtypes_are_taken():
    from cudnn_ext.api.jax_arrays import as_torch_dtype

    cutlass = pytest.importorskip("cutlass")
    assert as_torch_dtype(cutlass.BFloat16) is torch.bfloat16 and as_torch_dtype(cutlass.Float32) is torch.float32
