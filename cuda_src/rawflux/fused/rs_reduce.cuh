// GEMM-ReduceScatter's reduction: the owner sums the W partials of its rows as they arrive.
//
// Runs on a side stream beside the GEMM with a small grid (R CTAs; the GEMM takes the other
// SMs), so both are resident whatever order they start in, and it only ever waits on flags
// (bounded waits): the GEMMs it waits for never wait on anything, so no launch order can deadlock.
//
// Per call (epoch = this call's barrier epoch, read from device memory):
//   1. every CTA compares every rank's call record (fused/ag_meta.cuh: m, n, k, dtype, tile ...,
//      published before the call's barrier) with this rank's: a rank that called with another
//      shape fails the call with a record naming it (kStateCallMismatch) instead of a garbage sum.
//   2. work units = the GEMM tiles that hold this rank's rows, clipped to them; for each, threads
//      0..W-1 wait (acquire) for source q's flag of that tile, the CTA joins, then every thread
//      sums its 8-column chunks over q = 0, 1, ..., W-1 in fp32 -- a FIXED order, so the result
//      has the same bits whatever order the tiles arrived in -- adds the bias once, rounds once
//      and stores to out.
// Units are walked column-major over the owner's tile rows: the order in which the GEMM's grouped
// raster produces them, so the first units are the first ready.
#pragma once
#include "rawflux/comm/wait.cuh"
#include "rawflux/fused/ag_meta.cuh"
#include "rawflux/fused/rs_layout.cuh"
#include "rawflux/gemm/epilogue/fragment.cuh"
#include "rawflux/ptx/cvt.cuh"

namespace rawflux {

enum : int { kRsReduceThreads = 512, kRsReducePairs = 4 };

struct RsReduceParams {
  u64 parts;        // this rank's partial buffer: W slots of (m_loc, n)
  u64 flags;        // this rank's flag buffer (u32, rs_layout.cuh)
  u64 meta_peers;   // const u64[world]: every rank's call-metadata buffer (fused/ag_meta.cuh)
  u64 ctrl;         // const GroupCtrl*: rank, world, epoch, bounded-wait context
  u64 out;          // (m_loc, n) row-major output, row stride n
  u64 bias;         // (n,) bias or 0
  i32 m, n, m_loc;
  i32 bm, bn;       // the GEMM's tile: the flags' granularity
  i32 tiles_n;      // ceil(n / bn)
  i32 tiles_cap;    // flags per source slot
  i32 bias_kind;    // epi::kBiasNone / kBiasIn16 (the output's 16-bit type) / kBiasF32
};

namespace rs {

RAWFLUX_DEVICE void ld_cg_v4_f32(u64 addr, float& a, float& b, float& c, float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"(addr) : "memory");
}
RAWFLUX_DEVICE void ld_cg_v4_u32(u64 addr, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(addr) : "memory");
}

// 8 fp32 values -> out[col..col+8) of type kOut (16-byte stores; out and n are 16-byte aligned).
template <int kOut>
RAWFLUX_DEVICE void store8(void* out, const float (&v)[8]) {
  if constexpr (kOut == kTypeF32) {
    float* o = static_cast<float*>(out);
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(o), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]) : "memory");
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(o + 4), "f"(v[4]), "f"(v[5]), "f"(v[6]), "f"(v[7]) : "memory");
  } else {
    constexpr bool kF16 = kOut == kTypeF16;
    epi::st_v4(out, ptx::pack2<kF16>(v[0], v[1]), ptx::pack2<kF16>(v[2], v[3]), ptx::pack2<kF16>(v[4], v[5]),
               ptx::pack2<kF16>(v[6], v[7]));
  }
}

// The next work unit of this call: the counter holds (epoch << 32) | next. Every claim but the
// first of a call is one atomicAdd: a CAS loop here (every CTA of the tail launch contending for
// one word, one winner per round trip) serialized the tail reduction at ~0.26 us a unit,
// measured on two H200s, 2026-11-29. An add that returns another (older) epoch's tag handed out
// nothing (the older count is garbage from then on): the CTA installs this call's tag with unit 0
// taken by a CAS, or, if another CTA installed it first, adds again. Relaxed: the counter only
// hands out indices, the flags carry all the ordering.
RAWFLUX_DEVICE i32 claim_unit(u64* counter, u32 epoch) {
  unsigned long long* c = reinterpret_cast<unsigned long long*>(counter);
  const u64 tag = (u64)epoch << 32;
  while (true) {
    const u64 prev = atomicAdd(c, 1ull);
    if ((prev >> 32) == (u64)epoch) return (i32)(u32)prev;
    const u64 cur = *reinterpret_cast<volatile u64*>(counter);
    if ((cur >> 32) == (u64)epoch) continue;  // installed meanwhile: add again
    if (atomicCAS(c, cur, tag | 1ull) == cur) return 0;
  }
}

template <bool kInF16>
RAWFLUX_DEVICE void add_bias8(float (&acc)[8], u64 bias, i32 bias_kind, i32 col) {
  if (bias_kind == epi::kBiasF32) {
    float b[8];
    ld_cg_v4_f32(bias + 4ull * (u64)col, b[0], b[1], b[2], b[3]);
    ld_cg_v4_f32(bias + 4ull * (u64)col + 16, b[4], b[5], b[6], b[7]);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += b[e];
  } else if (bias_kind == epi::kBiasIn16) {
    u32 w[4];
    ld_cg_v4_u32(bias + 2ull * (u64)col, w[0], w[1], w[2], w[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float lo, hi;
      ptx::unpack2<kInF16>(w[i], lo, hi);
      acc[2 * i] += lo;
      acc[2 * i + 1] += hi;
    }
  }
}

// 8 consecutive partial elements at byte address addr as raw 32-bit words (fp32: 8 words; 16-bit:
// 4 words, two elements each), left packed while the load is in flight; raw_to_f32 unpacks them.
template <int kPart>
constexpr int kRawWords = kPart == kRsPartF32 ? 8 : 4;
template <int kPart>
RAWFLUX_DEVICE void load_raw(u64 addr, u32 (&w)[kRawWords<kPart>]) {
  ld_cg_v4_u32(addr, w[0], w[1], w[2], w[3]);
  if constexpr (kPart == kRsPartF32) ld_cg_v4_u32(addr + 16, w[4], w[5], w[6], w[7]);
}
template <int kPart>
RAWFLUX_DEVICE void raw_to_f32(const u32 (&w)[kRawWords<kPart>], float (&v)[8]) {
  if constexpr (kPart == kRsPartF32) {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = __uint_as_float(w[e]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) ptx::unpack2<kPart == kRsPartF16>(w[i], v[2 * i], v[2 * i + 1]);
  }
}

// Sums a unit's 8-column chunks idx = tid, tid + nthreads, ... (of `chunks`, chunks_per_row to a
// row) over the W sources and stores them: kChunks chunks per thread per step, the loads of kSrc
// sources of each issued together before the first sum, so that a thread keeps more loads in
// flight (two H200s, 2026-11-29: the tail 0.266-0.273 ms against 0.276-0.284 with one chunk at a
// time; most of the tail was the unit counter, see claim_unit). Every element is still summed over
// q = 0, 1, ..., W-1 in that order, so the bits do not depend on kChunks or kSrc.
template <int kPart, int kOut, int kChunks, int kSrc>
RAWFLUX_DEVICE void reduce_chunks(const RsReduceParams& p, i32 world, i64 slot_elems, i32 row0, i32 c0, i32 chunks_per_row,
                                  i32 chunks, i32 tid, i32 nthreads) {
  constexpr u64 kBytes = kPart == kRsPartF32 ? 4 : 2;
  constexpr u64 kOutBytes = kOut == kTypeF32 ? 4 : 2;
  for (i32 base = tid; base < chunks; base += nthreads * kChunks) {
    // Element offset of chunk j in a slot: (row0 + rr[j]) * n + col[j] (kept as two 32-bit values:
    // registers are what limits the loads in flight).
    i32 rr[kChunks], col[kChunks];
    bool ok[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const i32 idx = base + j * nthreads;
      ok[j] = idx < chunks;
      rr[j] = idx / chunks_per_row;
      col[j] = c0 + 8 * (idx - rr[j] * chunks_per_row);
    }
    auto off = [&](int j) { return (i64)(row0 + rr[j]) * p.n + col[j]; };
    float acc[kChunks][8];
#pragma unroll 1
    for (i32 s0 = 0; s0 < world; s0 += kSrc) {
      u32 w[kChunks][kSrc][kRawWords<kPart>];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
#pragma unroll
        for (int i = 0; i < kSrc; ++i) {
          if (ok[j] && s0 + i < world) load_raw<kPart>(p.parts + (u64)((i64)(s0 + i) * slot_elems + off(j)) * kBytes, w[j][i]);
        }
      }
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
#pragma unroll
        for (int i = 0; i < kSrc; ++i) {
          if (ok[j] && s0 + i < world) {
            float v[8];
            raw_to_f32<kPart>(w[j][i], v);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[j][e] = (s0 + i == 0) ? v[e] : acc[j][e] + v[e];
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (ok[j]) {
        if (p.bias_kind != epi::kBiasNone) add_bias8<kOut == kTypeF16>(acc[j], p.bias, p.bias_kind, col[j]);
        store8<kOut>(reinterpret_cast<void*>(p.out + (u64)off(j) * kOutBytes), acc[j]);
      }
    }
  }
}

}  // namespace rs

// kPart: partial element type (kRsPart*); kOut: output type (kTypeBF16 / kTypeF16 / kTypeF32);
// a 16-bit bias has the output's type (f32 output: only an f32 bias).
template <int kPart, int kOut>
__global__ void __launch_bounds__(kRsReduceThreads) rs_reduce_kernel(const RsReduceParams p) {
  const GroupCtrl* g = reinterpret_cast<const GroupCtrl*>(p.ctrl);
  const i32 tid = (i32)threadIdx.x;
  const i32 rank = g->rank;
  const i32 world = g->world;
  const u32* flags = reinterpret_cast<const u32*>(p.flags);

  // 1. Every rank made this call with the same record (m, n, k, dtype, tile ...; published before
  //    the call's barrier): otherwise the record names the rank that differs and the group aborts.
  if (!meta_check_cta(g, reinterpret_cast<const u64*>(p.meta_peers), kOpGemmRs)) return;
  // The epoch word is written only by this rank's barrier kernel, before this kernel in stream order.
  const u32 epoch = *epoch_word(g);
  const WaitCtx ctx = make_wait_ctx(g, kOpGemmRs, epoch);

  // 2. Reduce this rank's rows, tile by tile; units are claimed in order from a shared counter,
  //    so the R CTAs beside the GEMM and the full-grid launch after it split the work.
  __shared__ i32 s_unit;
  const i32 row_lo = rank * p.m_loc;
  const i32 row_hi = row_lo + p.m_loc;
  const i32 tm0 = row_lo / p.bm;
  const i32 nrows = (row_hi - 1) / p.bm - tm0 + 1;
  const i32 units = nrows * p.tiles_n;
  const i64 slot_elems = (i64)p.m_loc * p.n;
  u64* counter = reinterpret_cast<u64*>(p.flags);
  while (true) {
    if (tid == 0) s_unit = rs::claim_unit(counter, epoch);
    __syncthreads();
    const i32 u = s_unit;
    if (u >= units) break;
    const i32 tn = u / nrows;
    const i32 tm = tm0 + (u - tn * nrows);
    int ok = 1;
    for (i32 q = tid; q < world; q += (i32)blockDim.x) {
      // wait_flag_geq acquires (sys): source q's partial of this tile is visible after it returns
      const i64 f = rs_flag_index(q, p.tiles_cap, tm, p.tiles_n, tn);
      if (!wait_flag_geq(flags + f, epoch, ctx, q, (int)(tm * p.tiles_n + tn))) ok = 0;
    }
    if (!__syncthreads_and(ok)) return;  // joins the waiters: their acquires order every thread's loads below
    const i32 r0 = max(tm * p.bm, row_lo);
    const i32 r1 = min(tm * p.bm + p.bm, row_hi);
    const i32 c0 = tn * p.bn;
    const i32 chunks_per_row = (min(p.n, c0 + p.bn) - c0) / 8;
    const i32 chunks = (r1 - r0) * chunks_per_row;
    const i32 row0 = r0 - row_lo;  // local row of the output
    // kRsReducePairs (chunk, source) loads in flight per thread: with W <= 2 two chunks of both
    // sources, else one chunk of up to kRsReducePairs sources (128 registers a thread at 512 threads).
    if (world <= 2) {
      rs::reduce_chunks<kPart, kOut, kRsReducePairs / 2, 2>(p, world, slot_elems, row0, c0, chunks_per_row, chunks, tid, (i32)blockDim.x);
    } else {
      rs::reduce_chunks<kPart, kOut, 1, kRsReducePairs>(p, world, slot_elems, row0, c0, chunks_per_row, chunks, tid, (i32)blockDim.x);
    }
  }
}

}  // namespace rawflux
