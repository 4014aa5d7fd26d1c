// Session 25 probe (README.md one folder up): how ptxas treats a 64 x 256 accumulator fragment
// issued as two m64n128 halves around a tile boundary. Compile only (nothing here is run); VAR:
//   0  every k block one m64n256 group, stores after wait_group 0 (clean: the baseline)
//   1  the first k block as two n128 groups, the rest n256 (C7511: mixing n128 and n256 on the
//      same accumulators serializes every wgmma)
//   2  as 1, the previous tile's second half stored between the two groups (C7517)
//   3  as 1 with the two halves in one group (C7511)
//   4  every k block in n128 halves; the first block's halves in two groups with the store
//      between them (C7517: ptxas waits for the first half before the store)
//   5  as 4 without the store (clean)
//   6  as 4 with wait_group 1 after the first half's commit (clean: a no-op wait that tells ptxas)
//   7  as 6, and the last k block in two groups with the first half stored after wait_group 1 (clean)
#include "rawflux/ptx/wgmma.cuh"
#include "rawflux/ptx/cvt.cuh"
using namespace rawflux;
#ifndef VAR
#define VAR 0
#endif
extern "C" __global__ void __launch_bounds__(384, 1) k(float* out, int n, int kind) {
  extern __shared__ __align__(1024) unsigned char sm[];
  float acc[128];
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  const u64 da = ptx::smem_desc((u32)__cvta_generic_to_shared(sm), 16, 1024);
  const u64 db = ptx::smem_desc((u32)__cvta_generic_to_shared(sm + 16384), 16, 1024);
  float(&h0)[64] = *reinterpret_cast<float(*)[64]>(&acc[0]);
  float(&h1)[64] = *reinterpret_cast<float(*)[64]>(&acc[64]);
  u32* o = reinterpret_cast<u32*>(out) + threadIdx.x * 64;
  for (int t = 0; t < n; ++t) {
#if VAR == 0
    for (int kb = 0; kb < 8 + kind; ++kb) {
      ptx::wgmma_fence();
      for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<256, false, 0>::mma(acc, da + kk * 2 + kb, db + kk * 2, (kb > 0 || kk > 0) ? 1u : 0u);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
    }
    for (int i = 0; i < 64; ++i) o[i * 384] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
#elif VAR == 3
    ptx::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h0, da + kk * 2, db + kk * 2, kk > 0 ? 1u : 0u);
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h1, da + kk * 2, db + 1024 + kk * 2, kk > 0 ? 1u : 0u);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    for (int kb = 1; kb < 8 + kind; ++kb) {
      ptx::wgmma_fence();
      for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<256, false, 0>::mma(acc, da + kk * 2 + kb, db + kk * 2, 1u);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
    }
    for (int i = 0; i < 64; ++i) o[i * 384] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
#elif VAR == 4 || VAR == 5 || VAR == 6 || VAR == 7
    ptx::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h0, da + kk * 2, db + kk * 2, kk > 0 ? 1u : 0u);
    ptx::wgmma_commit();
#if VAR == 6 || VAR == 7
    ptx::wgmma_wait<1>();
#endif
#if VAR == 4 || VAR == 6 || VAR == 7
    if (t > 0) for (int i = 32; i < 64; ++i) o[i * 384] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
#endif
    ptx::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h1, da + kk * 2, db + 1024 + kk * 2, kk > 0 ? 1u : 0u);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    for (int kb = 1; kb < 8 + kind - (VAR == 7); ++kb) {
      ptx::wgmma_fence();
      for (int kk = 0; kk < 4; ++kk) { ptx::Wgmma<128, false, 0>::mma(h0, da + kk * 2 + kb, db + kk * 2, 1u); ptx::Wgmma<128, false, 0>::mma(h1, da + kk * 2 + kb, db + 1024 + kk * 2, 1u); }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
    }
#if VAR == 7
    ptx::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h0, da + kk * 2 + 9, db + kk * 2, 1u);
    ptx::wgmma_commit();
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h1, da + kk * 2 + 9, db + 1024 + kk * 2, 1u);
    ptx::wgmma_commit();
    ptx::wgmma_wait<1>();
    for (int i = 0; i < 32; ++i) o[i * 384 + t] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
    ptx::wgmma_wait<0>();
#else
    for (int i = 0; i < (VAR == 4 || VAR == 6 ? 32 : 64); ++i) o[i * 384] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
#endif
#elif VAR == 1 || VAR == 2
    // first block split: H0, [store prev H1], H1
    ptx::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h0, da + kk * 2, db + kk * 2, kk > 0 ? 1u : 0u);
    ptx::wgmma_commit();
#if VAR == 2
    if (t > 0) for (int i = 32; i < 64; ++i) o[i * 384] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
#endif
    ptx::wgmma_fence();
    for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<128, false, 0>::mma(h1, da + kk * 2, db + 1024 + kk * 2, kk > 0 ? 1u : 0u);
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
    for (int kb = 1; kb < 8 + kind; ++kb) {
      ptx::wgmma_fence();
      for (int kk = 0; kk < 4; ++kk) ptx::Wgmma<256, false, 0>::mma(acc, da + kk * 2 + kb, db + kk * 2, 1u);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
    }
    for (int i = 0; i < (VAR == 2 ? 32 : 64); ++i) o[i * 384] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
#endif
  }
#if VAR == 2 || VAR == 4 || VAR == 6 || VAR == 7
  for (int i = 32; i < 64; ++i) o[i * 384] = ptx::pack2<false>(acc[2 * i], acc[1 + 2 * i]);
#endif
}
