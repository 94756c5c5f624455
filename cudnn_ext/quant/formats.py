"""Element and scale-factor number formats of the block-scaled contract, encoded bit-exactly.

Owns: the float8 e4m3 / e5m2 element casts with saturation, the unsigned power-of-two e8m0
scale format (round-up encoding, as the kernel's ``cvt.rp.satfinite.ue8m0x2.f32``), the 4-bit
e2m1 element format (round-to-nearest-even, saturating) and its two-per-byte packing. Must not
know about layouts (``sf_layout``) or blocks (``mx``).

Every function is elementwise torch code that runs on any device and never syncs the host.

Conventions (checked in tests/unit/test_quant.py):

* e8m0 code ``c`` means ``2**(c - 127)``; ``c == 255`` is NaN; there is no zero. Code 0
  (``2**-127``) is an fp32 *subnormal*.
* e2m1 codes are ``s e1 e0 m``: magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4, 6``; there is no NaN
  and no infinity.
* FP4 packing: element ``2j`` of the packed dimension is the **low** nibble of byte ``j`` and
  element ``2j+1`` the high nibble. This is CUTLASS' sub-byte order (the kernel recasts a uint8
  buffer to ``Float4E2M1FN`` with ``recast_layout(4, 8)``) and the order of the PTX
  ``cvt.rn.f16x2.e2m1x2`` the vendor's NVFP4 dequantizer uses (low nibble -> low half). A
  ``torch.float4_e2m1fn_x2`` tensor is the same bytes under another dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Tuple

import torch

#: The roles a format plays: an operand or D element, a block scale factor.
ELEMENT, SCALE = "element", "scale"


@dataclass(frozen=True)
class NumberFormat:
    """One number format of the block-scaled contract: its name (the kernels' configs and
    error messages use it), the torch dtypes that store it (the first is its own), its bits,
    its largest finite magnitude and its roles."""

    name: str
    dtypes: Tuple[torch.dtype, ...]
    bits: int
    max_finite: float
    roles: FrozenSet[str]


#: name -> format, each defined once (the kernels' and engines' lists are lookups here)
FORMATS: Dict[str, NumberFormat] = {f.name: f for f in (
    NumberFormat("e4m3", (torch.float8_e4m3fn,), 8, 448.0, frozenset({ELEMENT, SCALE})),
    NumberFormat("e5m2", (torch.float8_e5m2,), 8, 57344.0, frozenset({ELEMENT})),
    # packed two per byte: uint8 storage, or torch's float4 dtype of the same bytes
    NumberFormat("e2m1", (torch.uint8, torch.float4_e2m1fn_x2), 4, 6.0, frozenset({ELEMENT})),
    NumberFormat("e8m0", (torch.float8_e8m0fnu,), 8, 2.0 ** 127, frozenset({SCALE})),
)}

#: Largest finite magnitude per element format.
E4M3_MAX = FORMATS["e4m3"].max_finite
E5M2_MAX = FORMATS["e5m2"].max_finite
E2M1_MAX = FORMATS["e2m1"].max_finite
#: Largest finite fp32 (the kernel clamps its quantization multiplier to it).
FLT_MAX = 3.4028234663852886e38
#: Smallest normal fp32; below it the kernel's ``rcp.approx.ftz`` flushes to zero.
FLT_MIN_NORMAL = 2.0 ** -126

FP8_DTYPES = FORMATS["e4m3"].dtypes + FORMATS["e5m2"].dtypes
SF_DTYPES = FORMATS["e8m0"].dtypes + FORMATS["e4m3"].dtypes
#: Storage dtypes of packed FP4 (two e2m1 values per byte).
FP4_DTYPES = FORMATS["e2m1"].dtypes


def names(role: str) -> Tuple[str, ...]:
    """The format names that play ``role`` (:data:`ELEMENT` or :data:`SCALE`)."""
    return tuple(n for n, f in FORMATS.items() if role in f.roles)


def format_of(dtype: torch.dtype) -> NumberFormat:
    """The format stored in ``dtype``; ``TypeError`` if none is."""
    for f in FORMATS.values():
        if dtype in f.dtypes:
            return f
    raise TypeError(f"dtype: expected the storage of one of {list(FORMATS)} "
                    f"({', '.join(str(d).replace('torch.', '') for f in FORMATS.values() for d in f.dtypes)}), "
                    f"got {dtype}")


def max_finite(dtype: torch.dtype) -> float:
    """Largest finite magnitude of an element dtype (fp8, or any FP4 storage dtype)."""
    if dtype in FP8_DTYPES or dtype in FP4_DTYPES:
        return format_of(dtype).max_finite
    raise TypeError(f"dtype: expected one of float8_e4m3fn, float8_e5m2, uint8, float4_e2m1fn_x2 "
                    f"(an element format), got {dtype}")


def is_fp4(dtype: torch.dtype) -> bool:
    """True for the storage dtypes of packed FP4 (uint8, float4_e2m1fn_x2)."""
    return dtype in FP4_DTYPES


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous().view(torch.int32)


# --------------------------------------------------------------------------------------------
# e8m0
# --------------------------------------------------------------------------------------------

def encode_e8m0_roundup(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> e8m0, rounding **up** to the next power of two, saturating (``cvt.rp.satfinite``).

    The sign is ignored (scales are magnitudes). Rules: an exact power of two keeps its
    exponent; anything in between rounds up; values at or below ``2**-127`` (including 0) give
    code 0; values above ``2**127`` and +inf saturate to code 254 (``2**127``); NaN gives 255.
    Returns a ``torch.float8_e8m0fnu`` tensor.
    """
    b = _bits(x.abs())
    exp = (b >> 23) & 0xFF
    man = b & 0x7FFFFF
    # normal: exponent field, +1 when any mantissa bit is set (round toward +inf)
    code = exp + (man != 0).to(torch.int32)
    # subnormal fp32 (exp == 0): (0, 2**-127] -> 0 ; (2**-127, 2**-126) -> 1
    sub = torch.where(man > 0x400000, 1, 0).to(torch.int32)
    code = torch.where(exp == 0, sub, code)
    code = torch.where(exp == 0xFF, torch.where(man == 0, 254, 255).to(torch.int32), code)
    # a normal with exponent 254 and a mantissa rounds up past 2**127: saturate (satfinite)
    code = torch.where((exp != 0xFF) & (code > 254), 254, code)
    return code.to(torch.uint8).view(torch.float8_e8m0fnu)


def decode_e8m0(sf: torch.Tensor) -> torch.Tensor:
    """e8m0 (``float8_e8m0fnu``) -> exact fp32: ``2**(c-127)``, code 255 -> NaN.

    Built from bits so that code 0 yields the fp32 subnormal ``2**-127`` on every device.
    """
    c = sf.view(torch.uint8).to(torch.int32)
    bits = torch.where(c == 0, 0x00400000, c << 23)
    bits = torch.where(c == 255, 0x7FC00000, bits)
    return bits.view(torch.float32)


# --------------------------------------------------------------------------------------------
# e4m3 / e5m2
# --------------------------------------------------------------------------------------------

def encode_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 -> fp8 with round-to-nearest-even and saturation (``cvt.rn.satfinite``).

    Finite values beyond the format's range and +-inf become +-max (448 for e4m3, 57344 for
    e5m2); NaN stays NaN. The clamp is explicit so that the result does not depend on how a
    torch build treats out-of-range casts.
    """
    if dtype not in FP8_DTYPES:
        raise TypeError(f"dtype: expected float8_e4m3fn or float8_e5m2, got {dtype}")
    m = max_finite(dtype)
    return torch.clamp(x.to(torch.float32), -m, m).to(dtype)


# --------------------------------------------------------------------------------------------
# e2m1 (FP4)
# --------------------------------------------------------------------------------------------

def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> e2m1 codes (uint8 in [0, 16)), round-to-nearest-even, saturating at +-6.

    The rounding thresholds are the midpoints of the value grid; a tie goes to the even code
    (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). The sign bit
    follows ``signbit`` (so -0.0 -> code 8). NaN has no e2m1 encoding and gives code 0; the
    block quantizers make such a block's *scale* NaN, so it still dequantizes to NaN.
    """
    xf = x.to(torch.float32)
    a = xf.abs()
    code = ((a > 0.25).to(torch.int32) + (a >= 0.75).to(torch.int32) + (a > 1.25).to(torch.int32)
            + (a >= 1.75).to(torch.int32) + (a > 2.5).to(torch.int32) + (a >= 3.5).to(torch.int32)
            + (a > 5.0).to(torch.int32))
    code = code + 8 * torch.signbit(xf).to(torch.int32)
    code = torch.where(torch.isnan(xf), 0, code)
    return code.to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, low 4 bits) -> exact fp32.

    Computed from the code's fields (exponent ``e`` = bits 2..1, mantissa ``m`` = bit 0):
    ``m / 2`` when ``e == 0`` (0 or the subnormal 0.5), else ``(1 + m / 2) * 2**(e - 1)``; bit 3
    is the sign (code 8 is -0.0). Arithmetic rather than a lookup table, whose values a CUDA
    device would have to receive from the host (a sync, and no CUDA-graph capture)."""
    c = codes.to(torch.int32) & 0xF
    e = (c >> 1) & 0x3
    m = (c & 0x1).to(torch.float32)
    mag = torch.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * torch.exp2((e - 1).to(torch.float32)))
    return torch.where((c & 0x8) != 0, -mag, mag)


def pack_fp4(codes: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pack e2m1 codes two per byte along ``dim`` (even element -> low nibble). -> uint8.

    The result is contiguous in the layout of ``codes.movedim(dim, -1)`` moved back, i.e. it
    has the same dimension order as ``codes`` with ``dim`` halved.
    """
    if codes.shape[dim] % 2:
        raise ValueError(f"codes: the packed dimension {dim} has odd length {codes.shape[dim]}; "
                         f"FP4 packs two values per byte")
    c = codes.movedim(dim, -1).to(torch.uint8)
    packed = (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)
    return packed.movedim(-1, dim)


def unpack_fp4(packed: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: uint8 / float4_e2m1fn_x2 bytes -> codes, ``dim`` doubled."""
    if packed.dtype not in FP4_DTYPES:
        raise TypeError(f"packed: expected uint8 or float4_e2m1fn_x2 storage, got {packed.dtype}")
    p = packed.view(torch.uint8).movedim(dim, -1)
    out = torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)
    return out.movedim(-1, dim)


# --------------------------------------------------------------------------------------------
# scale factors, by dtype
# --------------------------------------------------------------------------------------------

def decode_sf(sf: torch.Tensor) -> torch.Tensor:
    """Scale factors (``float8_e8m0fnu`` or ``float8_e4m3fn``) -> exact fp32."""
    if sf.dtype == torch.float8_e8m0fnu:
        return decode_e8m0(sf)
    if sf.dtype == torch.float8_e4m3fn:
        return sf.to(torch.float32)
    raise TypeError(f"sf: scale factors must be float8_e8m0fnu or float8_e4m3fn, got {sf.dtype}")


def encode_sf(s: torch.Tensor, sf_dtype: torch.dtype) -> torch.Tensor:
    """fp32 block scales -> scale-factor dtype.

    e8m0 rounds **up** (so a block never saturates through its scale); e4m3 rounds to nearest
    even and saturates at 448 (so NVFP4 blocks can saturate at +-6, as in the standard recipe).
    """
    if sf_dtype == torch.float8_e8m0fnu:
        return encode_e8m0_roundup(s)
    if sf_dtype == torch.float8_e4m3fn:
        return encode_fp8(s, sf_dtype)
    raise TypeError(f"sf_dtype: expected float8_e8m0fnu or float8_e4m3fn, got {sf_dtype}")


def rcp_ftz(q: torch.Tensor) -> torch.Tensor:
    """fp32 reciprocal with flush-to-zero of subnormal inputs and results (``rcp.approx.ftz``).

    Exact for the powers of two an e8m0 scale holds; correctly rounded otherwise (the hardware
    approximation is within 1 ulp). Consequences the quantizers rely on: a scale of ``2**-127``
    (a subnormal) has reciprocal +inf, a scale of ``2**127`` has reciprocal 0, a scale of 0 has
    +inf, NaN stays NaN.
    """
    q = q.to(torch.float32)
    zero = torch.zeros((), dtype=torch.float32, device=q.device)
    q = torch.where(q.abs() < FLT_MIN_NORMAL, zero, q)
    r = torch.reciprocal(q)
    return torch.where(r.abs() < FLT_MIN_NORMAL, zero, r)
