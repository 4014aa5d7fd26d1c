// Fixed-width types without <cstdint>: NVRTC compiles these kernels with no CUDA toolkit headers
// on the include path (a user machine may have only the NVRTC wheel).
#pragma once

namespace rawflux {
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef int i32;
typedef long long i64;

static_assert(sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(u64) == 8, "fixed-width types");

#define RAWFLUX_DEVICE __device__ __forceinline__

// A compile-time int as a type (an argument of a generic lambda whose body needs a constant), and
// f(Int<i>{}) for i in [kBegin, kEnd), unrolled at compile time.
template <int v>
struct Int {
  static constexpr int value = v;
};
template <int kBegin, int kEnd, class F>
RAWFLUX_DEVICE void static_for(F&& f) {
  if constexpr (kBegin < kEnd) {
    f(Int<kBegin>{});
    static_for<kBegin + 1, kEnd>(f);
  }
}

}  // namespace rawflux
