// Global-memory accesses of the split-K fix-up: fp32 partials that bypass L1 (.cg: another CTA
// wrote them) and GPU-scope arrival counts.
#pragma once
#include "rawflux/ptx/types.cuh"

namespace rawflux {
namespace ptx {

RAWFLUX_DEVICE u32 atom_add_acq_rel_gpu(u32* p, u32 v) {
  u32 old;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

RAWFLUX_DEVICE u32 atom_add_relaxed_gpu(u32* p, u32 v) {
  u32 old;
  asm volatile("atom.add.relaxed.gpu.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

RAWFLUX_DEVICE void st_cg_v4f(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

RAWFLUX_DEVICE void ld_cg_v4f(const float* p, float& a, float& b, float& c, float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"(p) : "memory");
}

}  // namespace ptx
}  // namespace rawflux
