// Conversions between fp32 and the 16-bit float formats by inline PTX (no cuda_bf16.h / cuda_fp16.h:
// NVRTC here runs without the CUDA toolkit headers).
#pragma once
#include "rawflux/ptx/types.cuh"

namespace rawflux {
namespace ptx {

// Two fp32 -> packed bf16x2, round to nearest even; `lo` lands in the low half (lower address).
RAWFLUX_DEVICE u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

RAWFLUX_DEVICE u32 pack_f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

RAWFLUX_DEVICE float bf16_to_f32(u16 x) { return __uint_as_float(((u32)x) << 16); }

RAWFLUX_DEVICE float f16_to_f32(u16 x) {
  float f;
  asm("{\n.reg .f16 h;\nmov.b16 h, %1;\ncvt.f32.f16 %0, h;\n}" : "=f"(f) : "h"(x));
  return f;
}

// Packed pair (low half = first element) of 16-bit floats -> two fp32.
template <bool kF16>
RAWFLUX_DEVICE void unpack2(u32 v, float& lo, float& hi) {
  if constexpr (kF16) {
    lo = f16_to_f32((u16)(v & 0xFFFF));
    hi = f16_to_f32((u16)(v >> 16));
  } else {
    lo = __uint_as_float(v << 16);
    hi = __uint_as_float(v & 0xFFFF0000u);
  }
}

template <bool kF16>
RAWFLUX_DEVICE u32 pack2(float lo, float hi) {
  if constexpr (kF16) {
    return pack_f16x2(lo, hi);
  } else {
    return pack_bf16x2(lo, hi);
  }
}

}  // namespace ptx
}  // namespace rawflux
