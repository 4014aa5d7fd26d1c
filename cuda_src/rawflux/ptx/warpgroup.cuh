// Warpgroup register reallocation (sm_90): the producer gives registers back, the consumers take
// them, within the launch's per-thread budget.
#pragma once
#include "rawflux/ptx/types.cuh"

namespace rawflux {
namespace ptx {

template <u32 kRegs>
RAWFLUX_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <u32 kRegs>
RAWFLUX_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace ptx
}  // namespace rawflux
