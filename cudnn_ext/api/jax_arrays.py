"""The vendor-compatible wrapper on JAX arrays, eagerly: DLPack views in, DLPack views out.

Owns the JAX <-> torch bridge of the eager call: which JAX arguments the wrapper accepts (BF16
operands; discrete weights as an int64 or packed-uint8 pointer table; dense weights in JAX's
natural ``(L, N, K)`` form), their zero-copy torch views, and the JAX views of the results.
The computation is the torch wrapper's (``cudnn_ext.api.wrapper``), unchanged.

Semantics follow the vendor's eager JAX path: the caller's zero-initialized ``dprob_tensor``
is accumulated *in place* through its DLPack view (JAX arrays are immutable to JAX programs, so
treat it as a buffer you own: make it fresh, e.g. ``jnp.zeros``, and do not share it), and is
returned as the same object. ``d_row`` / ``dbias`` are new JAX arrays that view the torch
outputs. Calls are eager on the torch current stream (the legacy default stream unless the
caller set another): ``block_until_ready`` the inputs, and keep the weights behind ``b_ptrs``
alive until the work is done.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np
import torch

_BLOCK_SCALED_ERROR = ("JAX arrays: the block-scaled backend (FP8/FP4 operands with MMA-interleaved scale "
                       "factors) is not expressible as JAX arrays; only the BF16 backend accepts them")


def is_jax_array(x) -> bool:
    """True for a concrete or traced JAX array (not for JAX dtypes such as ``jnp.bfloat16``)."""
    import jax

    return isinstance(x, jax.Array)


def _is_tracer(x) -> bool:
    import jax

    return isinstance(x, jax.core.Tracer)


def to_torch(x) -> torch.Tensor:
    """Zero-copy torch view of a JAX array (same device and memory)."""
    if _is_tracer(x):
        raise TypeError("JAX arrays: the eager wrapper cannot run on traced values (inside jax.jit / vmap / grad); "
                        "use cudnn_ext.jax.grouped_gemm_dglu_jax there")
    return torch.from_dlpack(x)


def to_jax(t: torch.Tensor):
    import jax

    return jax.dlpack.from_dlpack(t.contiguous() if not t.is_contiguous() else t)


#: the CuTe DSL's numeric types the vendor's JAX entry takes for dtypes (``cutlass.BFloat16``),
#: by class name (no DSL import)
_CUTLASS_DTYPES = {"BFloat16": torch.bfloat16, "Float16": torch.float16, "Float32": torch.float32,
                   "Float8E4M3FN": torch.float8_e4m3fn, "Float8E5M2": torch.float8_e5m2}


def as_torch_dtype(dt):
    """torch dtype from a torch, numpy/ml_dtypes or jnp dtype (or its name), or a CuTe DSL
    numeric type (``cutlass.BFloat16``, the vendor's JAX defaults); None stays None."""
    if dt is None or isinstance(dt, torch.dtype):
        return dt
    if isinstance(dt, type) and dt.__module__.split(".")[0] == "cutlass" and dt.__name__ in _CUTLASS_DTYPES:
        return _CUTLASS_DTYPES[dt.__name__]
    try:
        name = np.dtype(dt).name  # numpy, ml_dtypes (jnp.bfloat16) and their names
    except TypeError:
        name = str(dt)
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise TypeError(f"dtype: cannot map {dt!r} to a torch dtype")
    return getattr(torch, name)


def pointer_table(b_ptrs) -> torch.Tensor:
    """int64 (L,) torch view of a JAX pointer table: int64 (x64 mode) or packed little-endian uint8 (8L,)."""
    t = to_torch(b_ptrs)
    if t.dtype == torch.uint8:
        if t.dim() != 1 or t.numel() % 8:
            raise ValueError(f"b_ptrs: a uint8 pointer table must be 1-D with 8 bytes per pointer, got shape "
                             f"{tuple(t.shape)}")
        return t.view(torch.int64)
    return t


def expert_pointers(weights: Sequence[Any]):
    """The pointer table of per-expert JAX weight arrays, as a JAX uint8 array (8 bytes each).

    Works without x64 mode. The table does not keep the weights alive: the caller must.
    """
    import jax
    import jax.numpy as jnp

    weights = list(weights)
    if not weights:
        raise ValueError("weights: need at least one expert weight, got an empty list")
    for w in weights:
        jax.block_until_ready(w)
    ptrs = np.array([w.unsafe_buffer_pointer() for w in weights], dtype="<i8").view(np.uint8)
    return jax.device_put(jnp.asarray(ptrs), next(iter(weights[0].devices())))


def torch_args(kwargs: Dict[str, Any], *, outputs=(), weights="b_tensor") -> Dict[str, Any]:
    """The keyword arguments with every JAX array replaced by its zero-copy torch view.

    Dense weights (``weights``) come in JAX's (L, N, K) form and become the vendor's (N, K, L)
    view; a JAX pointer table becomes int64; dtypes become torch dtypes. ``outputs`` name the
    arrays written in place: their views must share the JAX buffer (not be copies).
    """
    kw = dict(kwargs)
    for name, v in kw.items():
        if name in (weights, "b_ptrs", "current_stream"):
            continue
        if v is not None and is_jax_array(v):
            kw[name] = to_torch(v)
    b = kw.get(weights)
    if b is not None and is_jax_array(b):
        if b.ndim != 3:
            raise ValueError(f"{weights}: with JAX arrays dense weights are (L, N, K) row-major (JAX has no strides; "
                             f"the vendor's (N, K, L) K-major layout is its permutation), got shape {tuple(b.shape)}")
        kw[weights] = to_torch(b).permute(1, 2, 0)
    if kw.get("b_ptrs") is not None and is_jax_array(kw["b_ptrs"]):
        kw["b_ptrs"] = pointer_table(kw["b_ptrs"])
    for name in ("b_dtype", "d_dtype"):
        if name in kw:
            kw[name] = as_torch_dtype(kw[name])
    for name in outputs:
        src, view = kwargs.get(name), kw.get(name)
        if is_jax_array(src) and view.numel() and view.data_ptr() != src.unsafe_buffer_pointer():
            raise ValueError(f"{name}: its DLPack view is a copy, so it cannot be written in place; pass a fresh "
                             "jnp array of the declared shape")
    return kw


def wrapper_from_jax(wrapper, kwargs: Dict[str, Any]):
    """Run ``wrapper`` (the torch wrapper) on a call whose tensors are JAX arrays."""
    kw = dict(kwargs)
    a = kw["a_tensor"]
    if _is_tracer(a):
        to_torch(a)  # raises the clear "use grouped_gemm_dglu_jax" error
    if any(kw.get(k) is not None for k in ("sfa_tensor", "sfb_tensor", "sfb_ptrs", "norm_const_tensor")) \
            or as_torch_dtype(a.dtype) != torch.bfloat16:
        raise ValueError(_BLOCK_SCALED_ERROR)
    if kw.get("activation_tensor") is not None:
        raise ValueError("activation_tensor: not supported with JAX arrays (torch tensors only, as in the vendor API)")
    kw = torch_args(kw, outputs=("dprob_tensor",))
    dprob_jax = kwargs["dprob_tensor"]
    out = wrapper(**kw)
    result = {}
    for key, v in out.items():
        if key == "dprob_tensor":
            result[key] = dprob_jax  # accumulated in place, returned as the caller's object
        else:
            result[key] = to_jax(v) if isinstance(v, torch.Tensor) else v
    return type(out)(result)
