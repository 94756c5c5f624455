"""``grouped_gemm_dglu_jax`` (alias ``grouped_gemm_dglu_jax_sm100``): the ``jax.jit`` entry point.

Owns the traced call: the one contract (``contract.normalize``, the wrapper's rules) applied
at trace time to meta tensors of the arrays' shapes and dtypes (values of ``padded_offsets``
cannot be checked then), the output signature, and the host callback that runs the operation. The computation is ``cudnn_ext.functional.run`` (contract + built plan),
the same functional path as the torch custom op, on host copies of the operands.

On CUDA, for problems the SM90 engine supports (dense weights or discrete ``b_ptrs``), the call
lowers to an XLA FFI custom call of the Hopper kernel (``ffi.dglu_ffi``:
``cutlass.jax.cutlass_call`` with zero-initialized ``jnp.zeros`` inputs aliased to the
outputs), chosen per platform with ``jax.lax.platform_dependent``. Everywhere else it is a
``jax.pure_callback``: XLA calls back into Python with host numpy arrays, the reference engine
(CPU) computes, and the results come back as fresh XLA buffers (on a GPU backend:
device->host->device copies). The callback reads discrete ``b_ptrs`` on the host, so under a
GPU backend without the FFI path they would be device addresses: refused there. See
docs/jax.md for what ran where.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import numpy as np
import torch

from ..api.jax_arrays import as_torch_dtype

_F32 = np.float32


def _np_dtype(td: torch.dtype):
    import jax.numpy as jnp

    return {torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16, torch.float32: jnp.float32}[td]


def _host_tensor(x: np.ndarray) -> torch.Tensor:
    """torch CPU tensor of a numpy array (bf16 via its 16-bit pattern; callback inputs are read-only)."""
    x = np.ascontiguousarray(x)
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


def _host_array(t: torch.Tensor, np_dtype) -> np.ndarray:
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np_dtype)
    return t.numpy()


def _meta(name: str, x, shape=None, dtype=None) -> torch.Tensor:
    """A meta tensor with the shape and dtype of the JAX array (or abstract value) ``x``: what
    the contract checks at trace time (``shape``/``dtype``: another view of the same bytes)."""
    try:
        td = as_torch_dtype(x.dtype) if dtype is None else dtype
    except (TypeError, ValueError, AttributeError):
        raise TypeError(f"{name}: expected a JAX array, got {type(x).__name__}") from None
    return torch.empty(tuple(x.shape) if shape is None else shape, dtype=td, device="meta")


def _validated(a_tensor, c_tensor, padded_offsets, alpha_tensor, beta_tensor, b_ptrs, n, prob_tensor, d_td,
               acc_dtype, vector_f32, act_func, linear_offset, generate_dbias, b_tensor, b_major, geglu_alpha,
               glu_clamp_max, glu_clamp_min, m_aligned):
    """The call's ``(problem, (M, K))`` from the one contract (``contract.normalize``, the
    wrapper's rules with the vendor's argument names) applied to meta tensors of the traced
    arrays, plus this door's own limits: BF16 operands, a prob. Values (the offsets) are not
    known at trace time and are not checked here."""
    from .. import contract

    if prob_tensor is None:
        raise ValueError("prob_tensor: required for the BF16 contract, got None")
    a = _meta("a_tensor", a_tensor)
    if a.dtype != torch.bfloat16:
        raise TypeError(f"a_tensor: dtype must be bfloat16 (the JAX entry takes BF16 operands), got "
                        f"{str(a.dtype).replace('torch.', '')}")
    if b_tensor is not None:
        b = _meta("b_tensor", b_tensor)
        if b.dim() != 3:
            raise ValueError(f"b_tensor: shape must be (L, N, K), got {tuple(b.shape)}")
        weights = dict(b=b.permute(1, 2, 0))  # the contract's (N, K, L) view
        extra = {}
    else:
        name = np.dtype(b_ptrs.dtype).name
        if name == "uint8" and len(b_ptrs.shape) == 1 and b_ptrs.shape[0] % 8 == 0:
            table = _meta("b_ptrs", b_ptrs, (b_ptrs.shape[0] // 8,), torch.int64)
        elif name == "int64" and len(b_ptrs.shape) == 1:
            table = _meta("b_ptrs", b_ptrs)
        else:
            raise TypeError(f"b_ptrs: must be (L,) int64 or (8L,) uint8, got {tuple(b_ptrs.shape)} {name}")
        weights = dict(b_ptrs=table)
        extra = dict(n=n, b_dtype=torch.bfloat16)
    m = a.shape[0] if a.dim() else 0
    ops = contract.Operands(a=a, c=_meta("c_tensor", c_tensor), padded_offsets=_meta("padded_offsets", padded_offsets),
                            alpha=_meta("alpha_tensor", alpha_tensor), beta=_meta("beta_tensor", beta_tensor),
                            prob=_meta("prob_tensor", prob_tensor),
                            dprob=torch.empty(m, dtype=torch.float32, device="meta"), **weights)
    cfg = contract.CallConfig(act_func=act_func, linear_offset=linear_offset, geglu_alpha=geglu_alpha,
                              glu_clamp_max=glu_clamp_max, glu_clamp_min=glu_clamp_min, b_major=b_major,
                              acc_dtype=as_torch_dtype(acc_dtype), vector_f32=vector_f32, m_aligned=m_aligned)
    problem, pack = contract.normalize(ops, cfg, d_dtype=d_td, generate_dbias=generate_dbias, pointers=False, **extra)
    return problem, tuple(pack["a"].shape)


def grouped_gemm_dglu_jax(
    a_tensor: Any, c_tensor: Any, padded_offsets: Any, alpha_tensor: Any, beta_tensor: Any, b_ptrs: Any = None,
    n: Optional[int] = None, prob_tensor: Any = None, d_dtype: Any = "bfloat16", acc_dtype: Any = "float32",
    mma_tiler_mn: Tuple[int, int] = (256, 256), cluster_shape_mn: Optional[Tuple[int, int]] = None,
    vector_f32: bool = False, act_func: str = "dswiglu", linear_offset: Optional[float] = None,
    generate_dbias: bool = False, use_dynamic_sched: bool = False, *, b_tensor: Any = None,
    sfa_tensor: Any = None, sfb_tensor: Any = None, norm_const_tensor: Any = None, discrete_col_sfd: bool = False,
    geglu_alpha: float = 1.702, glu_clamp_max: float = 7.0, glu_clamp_min: float = -7.0, sf_vec_size: int = 32,
    b_major: str = "k", m_aligned: int = 256,
):
    """Grouped GEMM + dGLU backward for traced JAX programs (works eagerly too).

    Operands (BF16 contract): ``a_tensor`` (M, K[, 1]) bf16, ``c_tensor`` (M, 2N[, 1])
    bf16/fp16/fp32, ``padded_offsets`` (L,) int32, ``alpha_tensor``/``beta_tensor`` (L,) fp32,
    ``prob_tensor`` (M[, 1, 1]) fp32; weights either ``b_ptrs`` (L,) int64 or (8L,) packed uint8
    per-expert addresses of (N, K) bf16 matrices with ``n`` (discrete, as the vendor's), or
    ``b_tensor`` (L, N, K) bf16 (dense). M and every offset are multiples of ``m_aligned``
    (1, 8, 16, 32, 64, 128 or the vendor's 256; below 256 the CUDA lowering is the host callback:
    the FFI call carries no scratch for the SM90 kernel's ragged tile table). Kernel-shape knobs (tiler, cluster, vector_f32, dynamic
    scheduling) are accepted for vendor compatibility and ignored. The signature is the vendor's
    (nvidia-cudnn-frontend 1.32's ``grouped_gemm_dglu_jax_sm100``; ``cutlass`` numeric types for
    the dtypes too); its block-scaled (MXFP8) keywords raise ``NotImplementedError``.
    ``b_major`` and ``m_aligned`` are ours.

    Returns ``(d_row (M, 2N, 1), dprob (M, 1, 1) fp32, dbias (L, 2N, 1) bf16 or None)``: new
    arrays, zero-initialized then accumulated (rows at/past ``padded_offsets[-1]`` are zero).
    Under tracing the offsets' *values* are not validated at trace time (the host engine
    rejects bad values when it runs; the CUDA FFI path trusts them), and the weights behind ``b_ptrs`` must stay alive and
    unmoved across every execution of the traced computation.
    """
    import jax
    import jax.numpy as jnp

    given = [name for name, v in (("sfa_tensor", sfa_tensor), ("sfb_tensor", sfb_tensor),
                                  ("norm_const_tensor", norm_const_tensor)) if v is not None]
    if given or discrete_col_sfd:
        raise NotImplementedError(
            f"{', '.join(given) or 'discrete_col_sfd'}: block-scaled (MXFP8) operands are not supported by "
            "cudnn_ext's JAX entry, which takes BF16 operands (the vendor's signature is kept so that its "
            "calls with BF16 operands run as they are)")
    if (b_ptrs is None) == (b_tensor is None):
        raise ValueError("b_ptrs/b_tensor: provide exactly one: b_ptrs (discrete, with n) or b_tensor (dense (L, N, K))")
    if b_tensor is not None and n is not None:
        raise ValueError(f"n: dense weights (b_tensor) forbid n, got {n!r}")
    if b_ptrs is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise ValueError(f"n: discrete weights (b_ptrs) require an int n, got {n!r}")
    d_td = as_torch_dtype(d_dtype)
    problem, a_shape = _validated(a_tensor, c_tensor, padded_offsets, alpha_tensor, beta_tensor, b_ptrs, n,
                                  prob_tensor, d_td, acc_dtype, vector_f32, act_func, linear_offset,
                                  generate_dbias, b_tensor, b_major, geglu_alpha, glu_clamp_max, glu_clamp_min,
                                  m_aligned)
    m, k = a_shape
    n, num_experts = problem.n, problem.num_experts
    two_n = 2 * n

    from ..functional import ActArgs, run  # the shared functional path (imports torch only)

    act = ActArgs(act_func, linear_offset, geglu_alpha, glu_clamp_max, glu_clamp_min, m_aligned=m_aligned)
    d_np = _np_dtype(d_td)
    out_shapes = [jax.ShapeDtypeStruct((m, two_n, 1), d_np), jax.ShapeDtypeStruct((m, 1, 1), jnp.float32)]
    if generate_dbias:
        out_shapes.append(jax.ShapeDtypeStruct((num_experts, two_n, 1), jnp.bfloat16))
    dense = b_tensor is not None

    def host(a, c, b, offs, alpha, beta, prob):
        a_t, c_t = _host_tensor(a).view(m, k), _host_tensor(c).view(m, two_n)
        b_t = _host_tensor(b)
        kw = dict(b=b_t.permute(1, 2, 0)) if dense else dict(
            b_ptrs=b_t.view(torch.int64) if b_t.dtype == torch.uint8 else b_t, n=n, b_major=b_major)
        d_row, dprob, dbias = run(a_t, c_t, _host_tensor(offs), _host_tensor(alpha), _host_tensor(beta),
                                  _host_tensor(prob).view(m), act=act, generate_dbias=generate_dbias,
                                  d_dtype=d_td, **kw)
        outs = [_host_array(d_row.view(m, two_n, 1), d_np), dprob.view(m, 1, 1).numpy()]
        if generate_dbias:
            outs.append(_host_array(dbias.view(num_experts, two_n, 1), jnp.bfloat16))
        return tuple(outs)

    weights = b_tensor if dense else b_ptrs

    def callback(a, c, w, offs, alpha, beta, prob):
        # vmap_method="sequential": a batched call runs the operation once per batch element
        return tuple(jax.pure_callback(host, tuple(out_shapes), a, c, w, offs, alpha, beta, prob,
                                       vmap_method="sequential"))

    operands = (a_tensor, c_tensor, weights, padded_offsets, alpha_tensor, beta_tensor, prob_tensor)
    ffi_problem = _ffi_problem(problem)
    if ffi_problem is None and not dense and jax.default_backend() != "cpu":
        from .ffi import ffi_available

        why = ffi_available() or "the SM90 engine or the contract declines this problem"
        raise NotImplementedError(
            "b_ptrs under grouped_gemm_dglu_jax on a GPU backend: the host callback would read device "
            f"addresses, and the XLA FFI custom call of the SM90 kernel cannot run it here ({why}). Use "
            "b_tensor, or the eager wrapper with JAX arrays.")
    if ffi_problem is None:
        res = callback(*operands)
    else:
        from .ffi import choose_config, dglu_ffi

        config = choose_config(ffi_problem)

        def on_cuda(a, c, w, offs, alpha, beta, prob):
            d_row, dprob, dbias = dglu_ffi(a.reshape(m, k), w, c.reshape(m, two_n), offs, alpha, beta,
                                           prob.reshape(m), problem=ffi_problem, config=config)
            outs = (d_row.reshape(m, two_n, 1), dprob.reshape(m, 1, 1))
            return outs + ((dbias.reshape(num_experts, two_n, 1),) if generate_dbias else ())

        # lowered per platform: the XLA FFI custom call on CUDA, the host callback elsewhere
        res = jax.lax.platform_dependent(*operands, cuda=_sequential_vmap(on_cuda), default=callback)
    return res[0], res[1], (res[2] if generate_dbias else None)


def _sequential_vmap(fn):
    """``fn`` under ``vmap`` runs once per batch element (``lax.map``), like the host callback's
    ``vmap_method="sequential"``: cutlass_call has no batching rule, and ``platform_dependent``
    batches every branch, the CPU lowering included."""
    import jax

    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def _rule(axis_size, in_batched, *args):
        batched = [x for x, b in zip(args, in_batched) if b]

        def one(xs):
            it = iter(xs)
            return fn(*[next(it) if b else x for x, b in zip(args, in_batched)])

        out = jax.lax.map(one, batched)
        return out, jax.tree.map(lambda _: True, out)

    return wrapped


def _ffi_problem(problem):
    """``problem`` (the contract's, built on meta tensors) on a CUDA device when the CUDA
    lowering may use the FFI custom call, else None (the CuTe DSL or cutlass.jax missing,
    switched off, or the SM90 engine declines it)."""
    from .ffi import ffi_available, ffi_reasons

    if ffi_available() is not None:
        return None
    problem = dataclasses.replace(problem, device_type="cuda", device_index=None)
    return None if ffi_reasons(problem) else problem


#: The vendor's name.
grouped_gemm_dglu_jax_sm100 = grouped_gemm_dglu_jax
