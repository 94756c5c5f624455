"""The device form of the MX block rule (``quant.mx.quantize_blocks``, docs/blockscaled.md) that
turns fp32 dGLU values into FP8 D and its e8m0 scale factors, step for step in fp32 without
flushing: amax as the integer max of the magnitudes' bit patterns, the e8m0 round-up and the
flushing reciprocal from bit fields, the multiplier clamped to FLT_MAX with NaN kept, the
hardware's saturating conversion with a NaN stored as torch stores it.

Used by the kernel's quantizing epilogue (``quant_d``), bit-exact with the reference on the
same fp32 values; the blockwise quantizer (``kernels.blockwise``) shares ``abs_bits``. Device
functions only; no kernel, no host code.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

#: fl32(1/448): the row and column scale products' constant (torch rounds 1/448 the same way)
RCP_E4M3_MAX = 1.0 / 448.0
INF_BITS = 0x7F800000
_FLT_MAX_BITS = 0x7F7FFFFF
_GMEM = cute.AddressSpace.gmem


@cute.jit
def abs_bits(x: Float32) -> Int32:
    """|x| as its fp32 bit pattern: integer order is magnitude order, NaN above +inf."""
    return x.bitcast(Int32) & 0x7FFFFFFF


@cute.jit
def e8m0_roundup(s: Float32) -> Int32:
    """``formats.encode_e8m0_roundup`` (``cvt.rp.satfinite.ue8m0``) from s's bit fields: the
    exponent, +1 for any mantissa bit; fp32 subnormals (0, 2^-127] -> 0, above -> 1; +-inf
    and results past 2^127 -> 254; NaN -> 255. The sign is ignored."""
    b = abs_bits(s)
    exp = b >> 23
    man = b & 0x7FFFFF
    code = exp
    if man != 0:
        code = exp + 1
    if exp == 0:
        code = Int32(0)
        if man > 0x400000:
            code = Int32(1)
    if exp == 255:
        code = Int32(254)
        if man != 0:
            code = Int32(255)
    elif code > 254:
        code = Int32(254)
    return code


@cute.jit
def multiplier(code: Int32, nc: Float32) -> Float32:
    """``min(nc * rcp_ftz(2^(code - 127)), FLT_MAX)``, NaN kept. The reciprocal of a power
    of two is exact: 2^(127 - code) for codes 1..253; code 0 (the subnormal 2^-127) flushes
    to 0, so +inf; code 254's 2^-127 result flushes to 0; 255 is NaN."""
    bits = (254 - code) << 23
    if code == 0:
        bits = Int32(INF_BITS)
    if code == 254:
        bits = Int32(0)
    if code == 255:
        bits = Int32(0x7FFFFFFF)
    mult = nc * bits.bitcast(Float32)
    flt_max = Int32(_FLT_MAX_BITS).bitcast(Float32)
    if mult > flt_max:  # false for NaN: NaN stays, as torch.clamp keeps it
        mult = flt_max
    return mult


@cute.jit
def row_code(amax_bits: Int32, nc: Float32) -> Int32:
    """SFD_row's code of a block: ``(amax * fl32(1/448)) * nc`` rounded up."""
    return e8m0_roundup((amax_bits.bitcast(Float32) * Float32(RCP_E4M3_MAX)) * nc)


@cute.jit
def col_code(amax_bits: Int32, rcp_nc: Float32) -> Int32:
    """SFD_col's code of a block: ``amax * (fl32(1/448) * nc)`` (``rcp_nc``) rounded up."""
    return e8m0_roundup(amax_bits.bitcast(Float32) * rcp_nc)


@cute.jit
def store_fp8(base_ptr, elem, vals, special, d_type: cutlass.Constexpr, width: cutlass.Constexpr):
    """``width`` fp32 values ``vals`` (a tensor value) to FP8 ``d_type`` at element ``elem``
    of the byte matrix at ``base_ptr`` (``width``-byte aligned there), one store. The
    conversion is the hardware's (round to nearest even, saturating); ``special``: some
    value may be NaN, which is stored as its sign and 0x7F (torch's encoding; the
    hardware's NaN is not documented to keep the sign)."""
    q = cute.make_rmem_tensor((width,), d_type)
    q.store(vals.to(d_type))
    if special:
        q8 = cute.recast_tensor(q, cutlass.Uint8)
        for j in cutlass.range_constexpr(width):
            if vals[j] != vals[j]:
                q8[j] = cutlass.Uint8(((vals[j].bitcast(Int32) >> 24) & 0x80) | 0x7F)
    dst = cute.make_tensor(
        cute.make_ptr(d_type, base_ptr.toint() + elem, _GMEM, assumed_align=width),
        cute.make_layout(width))
    cute.autovec_copy(q, dst)
