// Epilogue building blocks: where each accumulator register of a consumer warpgroup lies in C,
// bias addition, and stores of a warpgroup's 64 x kWN fragment to a row-major matrix (any base
// pointer: the local C, or a peer's buffer for the fused ReduceScatter).
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/ptx/cvt.cuh"

namespace rawflux {

// What the kernel tells an epilogue about the fragment it hands over.
struct TileCoord {
  i32 tile_m, tile_n;  // CTA tile (tile_m may be >= tiles_m for the idle CTA of a cluster)
  i32 row0, col0;      // C coordinates of this warpgroup's fragment origin (64 x kWN)
  u32 tid;             // thread index inside the consumer warpgroup (0..127)
  u32 consumer;        // consumer warpgroup index (0..kConsumers-1)
  u32 scratch;         // shared-window address of the epilogue's scratch (Epilogue::scratch_bytes), 1024-aligned
};

// Accumulator fragment layout of wgmma m64nNk16 with fp32 accumulators (see ptx/wgmma.cuh).
struct Frag {
  // Row (0..63) of register `reg` in thread `tid` of the warpgroup.
  static RAWFLUX_DEVICE i32 row(u32 tid, int reg) { return 16 * (i32)(tid / 32) + (i32)((tid % 32) / 4) + 8 * ((reg % 4) / 2); }
  // Column (0..N-1) of register `reg`.
  static RAWFLUX_DEVICE i32 col(u32 tid, int reg) { return 8 * (reg / 4) + 2 * (i32)(tid % 4) + (reg % 2); }
};

namespace epi {

// Bias kinds (LocalStore::Params::bias_kind).
enum : i32 { kBiasNone = 0, kBiasIn16 = 1, kBiasF32 = 2 };

// acc[.., col] += bias[col] for the columns this thread holds (col < n only).
template <bool kInF16, int kRegs>
RAWFLUX_DEVICE void add_bias(float (&acc)[kRegs], const void* bias, i32 bias_kind, i32 col0, i32 n, u32 tid) {
  const i32 cbase = col0 + 2 * (i32)(tid % 4);
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j) {
    const i32 col = cbase + 8 * j;
    if (col < n) {
      float b0, b1;
      if (bias_kind == kBiasF32) {
        const float* bp = static_cast<const float*>(bias) + col;
        b0 = bp[0];
        b1 = bp[1];
      } else {
        const u32 v = *reinterpret_cast<const u32*>(static_cast<const u16*>(bias) + col);
        ptx::unpack2<kInF16>(v, b0, b1);
      }
      acc[4 * j + 0] += b0;
      acc[4 * j + 1] += b1;
      acc[4 * j + 2] += b0;
      acc[4 * j + 3] += b1;
    }
  }
}

RAWFLUX_DEVICE void st_v4(void* ptr, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
RAWFLUX_DEVICE void st_v2f(void* ptr, float a, float b) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(ptr), "f"(a), "f"(b) : "memory");
}
RAWFLUX_DEVICE void st_u32(void* ptr, u32 a) { asm volatile("st.global.b32 [%0], %1;\n" ::"l"(ptr), "r"(a) : "memory"); }

// 4x4 transpose of 32-bit words across the 4 lanes of a quad (lanes sharing tid/4): lane q holds
// v[j] = M[q][j] on entry and M[j][q] on exit. Turns the wgmma layout (each lane 2 columns of 4
// n8 blocks) into one whole n8 block (8 columns, 16 bytes) per lane: full 32-byte sectors.
RAWFLUX_DEVICE void quad_transpose(u32 (&v)[4], u32 q) {
  const bool hi2 = (q & 2) != 0;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const u32 send = hi2 ? v[j] : v[j + 2];
    const u32 recv = __shfl_xor_sync(0xffffffffu, send, 2);
    if (hi2) v[j] = recv; else v[j + 2] = recv;
  }
  const bool hi1 = (q & 1) != 0;
#pragma unroll
  for (int j = 0; j < 4; j += 2) {
    const u32 send = hi1 ? v[j] : v[j + 1];
    const u32 recv = __shfl_xor_sync(0xffffffffu, send, 1);
    if (hi1) v[j] = recv; else v[j + 1] = recv;
  }
}

// 16-bit output of a fragment's two rows (pa: row a, pb: row a + 8; ok_a / ok_b false skips it), one
// whole n8 block (16 bytes) per lane after the quad transpose; columns >= n skipped (n % 8 == 0).
// Shared by store_fragment and GEMM-ReduceScatter's 16-bit partials. Every lane calls it (shuffles).
template <bool kF16, int kRegs>
RAWFLUX_DEVICE void store_rows_16(u16* pa, u16* pb, bool ok_a, bool ok_b, const float (&acc)[kRegs], i32 col0, i32 n, u32 q) {
  constexpr int kBlocks = kRegs / 4;  // n8 blocks
  constexpr int kQuads = kBlocks / 4;
#pragma unroll
  for (int g = 0; g < kQuads; ++g) {
    u32 va[4], vb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 4 * (4 * g + i);
      va[i] = ptx::pack2<kF16>(acc[r + 0], acc[r + 1]);
      vb[i] = ptx::pack2<kF16>(acc[r + 2], acc[r + 3]);
    }
    quad_transpose(va, q);
    quad_transpose(vb, q);
    const i32 col = col0 + 8 * (4 * g + (i32)q);
    if (col < n) {
      if (ok_a) st_v4(pa + col, va[0], va[1], va[2], va[3]);
      if (ok_b) st_v4(pb + col, vb[0], vb[1], vb[2], vb[3]);
    }
  }
#pragma unroll
  for (int j = kQuads * 4; j < kBlocks; ++j) {  // leftover n8 blocks (kWN % 32 == 16)
    const i32 col = col0 + 8 * j + 2 * (i32)q;
    if (col < n) {
      if (ok_a) st_u32(pa + col, ptx::pack2<kF16>(acc[4 * j + 0], acc[4 * j + 1]));
      if (ok_b) st_u32(pb + col, ptx::pack2<kF16>(acc[4 * j + 2], acc[4 * j + 3]));
    }
  }
}

// Stores a 64 x (kRegs*2) fragment at C[row0.., col0..] (row stride ldc elements), rows >= m and
// columns >= n skipped (n is a multiple of 8, so a 16-byte chunk is all in or all out).
// kOut: kTypeBF16 / kTypeF16 / kTypeF32. Every lane of the warp must call it (shuffles).
template <int kOut, int kRegs>
RAWFLUX_DEVICE void store_fragment(void* c, i64 ldc, const float (&acc)[kRegs], i32 row0, i32 col0, i32 m, i32 n, u32 tid) {
  const u32 q = tid % 4;
  const i32 ra = row0 + 16 * (i32)(tid / 32) + (i32)((tid % 32) / 4);
  const i32 rb = ra + 8;
  const bool ok_a = ra < m, ok_b = rb < m;
  if constexpr (kOut == kTypeF32) {
    float* pa = static_cast<float*>(c) + (i64)ra * ldc;
    float* pb = static_cast<float*>(c) + (i64)rb * ldc;
#pragma unroll
    for (int j = 0; j < kRegs / 4; ++j) {
      const i32 col = col0 + 8 * j + 2 * (i32)q;
      if (col < n) {
        if (ok_a) st_v2f(pa + col, acc[4 * j + 0], acc[4 * j + 1]);
        if (ok_b) st_v2f(pb + col, acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
  } else {
    u16* pa = static_cast<u16*>(c) + (i64)ra * ldc;
    u16* pb = static_cast<u16*>(c) + (i64)rb * ldc;
    store_rows_16<kOut == kTypeF16>(pa, pb, ok_a, ok_b, acc, col0, n, q);
  }
}

}  // namespace epi
}  // namespace rawflux
