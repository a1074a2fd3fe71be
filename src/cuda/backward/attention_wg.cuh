// Hopper kernels of the packed varlen attention backward for head_dim 128 (docs/contract.md §B.9):
// wgmma for every product, TMA loads through an mbarrier ring, two consumer warpgroups per CTA.
// The same chains in the same order as attention.cuh's dkdv_kernel / dq_kernel (and the CPU spec):
// only the layout of the products differs (§M: one wgmma k16 = one k-block, a↔b symmetric, chained
// through the accumulator registers).
//
// dkdv_wg_kernel: one CTA of 256 threads per (sequence, kv head, 128 keys [j0, j0 + 128));
// warpgroup c owns the 64 keys kc = j0 + 64c … (their dK, dV chains stay in its registers, 128 per
// thread). Warp 0 loads K and V of the 128 keys once (TMA) and then, in-line, for the group's query
// heads e ascending and per head the 64-row query tiles i0 = j0, j0 + 64, … to the sequence end,
// Q, dO (TMA) and λ, δ (cp.async) into kKvStages ring slots. Per tile with i0 ≥ kc (the chain's
// rows start at kc: §B.9's 64·⌊j/64⌋), each warpgroup:
//   1. Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: 8 wgmma m64n64k16 each (keys × rows; A = K / V, B = Q / dO, all
//      K-major), chains over D from +0 (scale-d = 0 on k-block 0): the score bits of §A.4 step 1.
//   2. P = ls_ex2_sfu(s ⊗ σ ⊖ λ), Pb = bf16 (masked: +0); dV += Pbᵀ·dO:
//      4 wgmma m64n128k16 with Pb as the register A operand (the accumulator layout of step 1 is
//      the A layout) and dO as the MN-major B operand — the tile's 16-row k-blocks ascending,
//      issued before step 3 (the tensor cores run it during step 3).
//   3. dS = P ⊗ (dP ⊖ δ), dSb (masked: +0); dK += dSbᵀ·Q (4 wgmma, Q MN-major).
//   So dV[j, d] (dK) is one chain from +0 over heads ascending, then rows kc … end in 16-row
//   k-blocks ascending: §B.9's order. After the walk dV, dK ⊗ scale_f are stored (keys < len).
// dq_wg_kernel: one CTA per (sequence, query head, 128 rows [r0, r0 + 128)): consumer warpgroup w
// owns rows r0 + 64w … (dQ in registers), a producer warp loads (TMA) Q and dO of the 128 rows
// once, then the 64-key blocks 0 … of K and V; per block b ≤ (r0 + 64w) / 64 each warpgroup
// computes S = Q·Kᵀ and dP = dO·Vᵀ (rows × keys), dS (masked: +0), and dQ += dSb·K (4 wgmma, K
// MN-major): one chain from +0 over the keys 0 … 64·⌊i/64⌋ + 63 in 16-key k-blocks ascending,
// then ⊗ scale_f.
//
// Masking and the sequence end (§B.9): masked entries (key > row, or a row past the end) are +0
// beside their real operands. TMA reads whole 64-row boxes, so rows past the sequence end hold the
// next sequence's rows (zeros only past T): where they are a chain's k dimension they must be +0
// (§B.9: rows past the end have dout = q = +0, keys past the end k = +0), so the consumers zero
// them in shared memory before the products — dkdv: the Q and dO rows of a head's last tile; dq:
// the K rows of the last key block. Elsewhere (keys past the end in dkdv, rows past the end in dq)
// they only reach outputs that are never stored.
// Pb and dSb are rounded by cvt.rn.bf16x2 (the bits of f32_to_bf16 for every non-NaN value; a NaN
// operand makes the MMA's result 0x7fffffff whatever its payload, §M.1).
//
// NOTE: what was measured and tried (interleaving a tile's dK / dQ behind the next scores,
// FA3-style ping-pong turns: both slower; the ring of 4 slots: faster) is in docs/perf.md,
// 2026-12-04 (sessions 16, 17) and 2026-12-06 (session 19).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only)
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention_common.cuh"    // canon, pack_bf16_rn
#include "cuda/backward/attention.cuh"  // BwdParams
#include "cuda/sm90_async.cuh"          // mbarriers, TMA loads, named barriers
#include "cuda/sm90_wgmma.cuh"          // wgmma, descriptors, accumulator fences

namespace lockstep::cuda::attn_bwd_wg {

using attn_bwd_detail::BwdParams;
using attn_common::canon;
using attn_common::pack_bf16_rn;
using detail::fence_acc;
using detail::mbar_arrive;
using detail::mbar_arrive_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
using detail::named_bar_sync;
using detail::smem_u32;
using detail::tma_load_2d;
using detail::wgmma_commit;
using detail::wgmma_fence;
using detail::wgmma_wait;

constexpr int kD = 128;     // head_dim (compile time)
constexpr int kBlk = 64;    // rows / keys per tile (contract A.2)
constexpr int kWide = 128;  // keys (dkdv) / rows (dq) per CTA: two warpgroups
// dq: 2 consumer warpgroups + 1 producer warp (168 registers: 64 accumulators + 64 scores fit);
// the consumers come first (a warpgroup is 4 warps from a multiple of 4). dkdv: kKvThreads below.
constexpr int kConsumers = 256;
constexpr int kThreads = kConsumers + 32;
constexpr int kStages = 3;  // ring slots (dq)
// dkdv: 4 ring slots, loaded 2 steps ahead, so warp 0 refills the slot of step s - 2 (which both
// warpgroups have long released) rather than of step s - 1 (which made warpgroup 0 wait for
// warpgroup 1 to finish its step before starting its own).
constexpr int kKvStages = 4;
constexpr int kKvAhead = 2;
constexpr int kBox64 = kBlk * 64 * 2;    // one box: 64 columns x 64 rows (8 KB)
constexpr int kBox128 = kWide * 64 * 2;  // one box: 64 columns x 128 rows (16 KB)
constexpr int kTile64 = 2 * kBox64;      // [64, 128] bf16: two boxes
constexpr int kTile128 = 2 * kBox128;    // [128, 128] bf16: two boxes

// dkdv: K, V of the CTA (128 keys each), per stage Q, dO (64 rows each), then per stage λ[64],
// δ[64] (after the tiles: every tile stays 1024-aligned, as the 128B swizzle needs).
constexpr int kKvStage = 2 * kTile64;
constexpr int kLdStage = 2 * kBlk * 4;
constexpr int kKvSmem =
    2 * kTile128 + kKvStages * (kKvStage + kLdStage) + 8 * (2 * kKvStages + 1) + 1024;
// dq: Q, dO of the CTA (128 rows each), then per stage K, V (64 keys each).
constexpr int kQStage = 2 * kTile64;
constexpr int kQSmem = 2 * kTile128 + kStages * kQStage + 8 * (2 * kStages + 1) + 1024;
static_assert(kKvStage % 1024 == 0 && kQStage % 1024 == 0, "stage alignment");

// One CTA: the sequence's first packed row t0 and length len, its first key (dkdv) or row (dq)
// x0, a multiple of 128; the head is blockIdx.x % heads.
struct WgItem {
  int32_t t0, len, x0, pad_;
};

__device__ __forceinline__ void fence_u32(uint32_t (&a)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}
// Generic-proxy writes to shared memory made visible to the async proxy (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void prefetch_map(const CUtensorMap* m) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
}
// Rows [r_lo, rows) of `boxes` consecutive 128-byte-row boxes of `rows` rows set to +0 (a whole
// 128-byte row: the swizzle only permutes chunks inside it); thread t of n.
__device__ __forceinline__ void zero_rows(uint8_t* box, int boxes, int rows, int r_lo, int t,
                                          int n) {
  const int per_box = (rows - r_lo) * 8;
  for (int i = t; i < boxes * per_box; i += n) {
    const int b = i / per_box, c = i - b * per_box;
    *reinterpret_cast<uint4*>(box + b * rows * 128 + r_lo * 128 + c * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}
// C = A·B over D = 128 (8 k-blocks ascending, the first with scale-d = 0: c = +0), one commit
// group. a_lo, b_lo: the low words of the operands' start descriptors (K-major, sw128_desc_lo),
// each stored as two boxes kBoxA / kBoxB bytes apart; k-block kb starts (kb / 4)·kBox + 32·(kb % 4)
// bytes in.
template <int kBoxA, int kBoxB>
__device__ __forceinline__ void chain_d(float (&c)[32], uint32_t a_lo, uint32_t b_lo) {
  uint64_t da[8], db[8];
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    da[kb] = detail::sw128_desc_lo(a_lo + uint32_t((kb >> 2) * kBoxA + 32 * (kb & 3)) / 16);
    db[kb] = detail::sw128_desc_lo(b_lo + uint32_t((kb >> 2) * kBoxB + 32 * (kb & 3)) / 16);
    asm volatile("" : "+l"(da[kb]), "+l"(db[kb]));
  }
  int sd0 = 0, sd1 = 1;
  asm volatile("" : "+r"(sd0), "+r"(sd1));
  detail::wgmma_k16<64>(c, da[0], db[0], sd0);
#pragma unroll
  for (int kb = 1; kb < 8; ++kb) detail::wgmma_k16<64>(c, da[kb], db[kb], sd1);
  wgmma_commit();
}
// acc += A·B over the 4 k-blocks (16 rows / keys each) of a 64-row tile: A = the bf16 fragments in
// registers, B = a [64, 128] tile of two boxes read MN-major (2048 bytes per k-block); one commit
// group.
__device__ __forceinline__ void chain_tile(float (&acc)[64], const uint32_t (&a)[4][4],
                                           uint32_t tile) {
  const uint32_t lo = detail::sw128_mn_lo(tile);
  int sd1 = 1;
  asm volatile("" : "+r"(sd1));
  uint64_t db[4];
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    db[kb] = detail::sw128_desc_lo(lo + 128u * uint32_t(kb));
    asm volatile("" : "+l"(db[kb]));
  }
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) detail::wgmma_m64n128k16_rs<1>(acc, a[kb], db[kb], sd1);
  wgmma_commit();
}
// Accumulator entries c[8kb + 4j' + 2h + e] as bf16 A fragments: k-block kb holds columns
// 16kb … 16kb + 15 (the m64nN accumulator layout is the m64k16 A layout, as in attention_wg.cuh).
__device__ __forceinline__ void pack_frags(uint32_t (&a)[4][4], const float (&c)[32]) {
#pragma unroll
  for (int kb = 0; kb < 4; ++kb)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[kb][j] = pack_bf16_rn(c[8 * kb + 2 * j], c[8 * kb + 2 * j + 1]);
}

// x <- 2^x (ls_ex2_sfu: one MUFU.EX2 each, contract 0.5) for a thread's 32 entries of a tile.
__device__ __forceinline__ void exp2_tile(float (&x)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) x[i] = ls_ex2_sfu(x[i]);
}

// ------------------------------------------------------------------------------------------------
// Accumulator layout of an m64n64 tile: c[4n + 2h + e] = M index 16·warp + g + 8h, N index
// 8n + 2tq + e. dkdv: M = keys, N = rows; dq: M = rows, N = keys.

// dkdv steps 2 and 3 for one tile. MASK: per entry, key j ≤ row i and row i < len (the diagonal
// tile, the sequence's last tile); else every entry is valid.
template <bool MASK>
__device__ __forceinline__ void dkdv_tile(float (&s)[32], float (&dp)[32], float (&dv)[64],
                                          float (&dk)[64], const float* lam_s, const float* del_s,
                                          uint32_t q_tile, uint32_t do_tile, float sigma, int key,
                                          int row, int len, int tq) {
  wgmma_wait<1>();  // Sᵀ (dPᵀ may still run)
  fence_acc(s);
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 lm = *reinterpret_cast<const float2*>(lam_s + 8 * n + 2 * tq);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * n + 2 * h + e];
        x = __fsub_rn(__fmul_rn(x, sigma), e ? lm.y : lm.x);
      }
  }
  exp2_tile(s);
  if constexpr (MASK) {
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = row + 8 * n + 2 * tq + e, j = key + 8 * h;
          float& x = s[4 * n + 2 * h + e];
          x = (j <= i && i < len) ? x : 0.0f;
        }
  }
  uint32_t pa[4][4];
  pack_frags(pa, s);
  fence_acc(dv);
  wgmma_fence();
  chain_tile(dv, pa, do_tile);
  wgmma_wait<1>();  // dPᵀ (dV may still run)
  fence_acc(dp);
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    const float2 dl = *reinterpret_cast<const float2*>(del_s + 8 * n + 2 * tq);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& y = dp[4 * n + 2 * h + e];
        const float dsv = __fmul_rn(s[4 * n + 2 * h + e], __fsub_rn(y, e ? dl.y : dl.x));
        if constexpr (MASK) {
          const int i = row + 8 * n + 2 * tq + e, j = key + 8 * h;
          y = (j <= i && i < len) ? dsv : 0.0f;
        } else {
          y = dsv;
        }
      }
  }
  uint32_t da[4][4];
  pack_frags(da, dp);
  fence_acc(dk);
  wgmma_fence();
  chain_tile(dk, da, q_tile);
  wgmma_wait<0>();
  fence_acc(dv);
  fence_acc(dk);
  fence_u32(pa);
  fence_u32(da);
}

// NOTE: dkdv runs 256 threads (the two consumer warpgroups) and no producer warp: 8 warps leave
// ptxas 255 registers per thread, which the 128 dV / dK accumulators + 64 scores need (a ninth warp
// puts three warps on one SM sub-partition: 168 registers at launch; setmaxnreg could move them
// since mbar_wait's trap went out of line, not yet tried here). Warp 0 issues the loads in-line: at
// step s it refills the slot of step s − 2 with step s + kKvAhead once both warpgroups have
// released it.
constexpr int kKvThreads = kConsumers;

// 4 bytes global → shared by cp.async, +0 when !valid (src-size 0: nothing is read).
__device__ __forceinline__ void cp_async4(uint32_t dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
// An arrival on `bar` once this thread's earlier cp.async copies have landed (counted in the
// barrier's init count: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

__global__ void __launch_bounds__(kKvThreads, 1)
    dkdv_wg_kernel(const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v,
                   const __grid_constant__ CUtensorMap tm_do, const BwdParams p,
                   const WgItem* items) {
  extern __shared__ uint8_t smem[];
  const uint32_t raw = smem_u32(smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const gbase = smem + (base - raw);  // generic pointer to `base`
  const uint32_t k_s = base, v_s = base + kTile128;
  const uint32_t st0 = base + 2 * kTile128;         // stage s: Q, dO at st0 + s·kKvStage
  const uint32_t ld0 = st0 + kKvStages * kKvStage;  // stage s: λ, δ at ld0 + s·kLdStage
  const uint32_t bars = ld0 + kKvStages * kLdStage;
  auto full_bar = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty_bar = [&](int s) { return bars + 8u * uint32_t(kKvStages + s); };
  const uint32_t kv_bar = bars + 8u * uint32_t(2 * kKvStages);

  const int Hkv = p.Hq / p.G;
  const WgItem it = items[blockIdx.x / Hkv];
  const int kvh = blockIdx.x % Hkv;
  const int j0 = it.x0, len = it.len;
  const int per_head = (len - j0 + kBlk - 1) / kBlk;  // query tiles j0, j0 + 64, … per head
  const int nsteps = p.G * per_head;

  const int tid = threadIdx.x;
  // Warpgroup-uniform as ptxas sees it (a value it cannot prove uniform makes it serialize wgmma).
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int wt = tid & 127, warp = wt >> 5, lane = wt & 31, g = lane >> 2, tq = lane & 3;
  const bool loader = tid < 32;  // warp 0

  if (tid == 0) {
    for (int s = 0; s < kKvStages; ++s) {
      mbar_init(full_bar(s), 1 + 32);  // lane 0's arrive.expect_tx + warp 0's cp.async arrivals
      mbar_init(empty_bar(s), kKvThreads);  // every consumer thread
    }
    mbar_init(kv_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    prefetch_map(&tm_q);
    prefetch_map(&tm_k);
    prefetch_map(&tm_v);
    prefetch_map(&tm_do);
  }
  __syncthreads();

  // Step t's loads into slot t % kKvStages (warp 0): Q, dO by TMA (lane 0), λ, δ by cp.async.
  auto load_step = [&](int t) {
    const int st = t % kKvStages;
    if (t >= kKvStages) mbar_wait(empty_bar(st), uint32_t((t / kKvStages - 1) & 1));
    const int h = kvh * p.G + t / per_head, i0 = j0 + kBlk * (t % per_head);
    const uint32_t q_t = st0 + uint32_t(st) * kKvStage;
    if (lane == 0) {
      mbar_arrive_expect_tx(full_bar(st), uint32_t(2 * kTile64));
      const int32_t row = it.t0 + i0;
      tma_load_2d(q_t, &tm_q, h * kD, row, full_bar(st));
      tma_load_2d(q_t + kBox64, &tm_q, h * kD + 64, row, full_bar(st));
      tma_load_2d(q_t + kTile64, &tm_do, h * kD, row, full_bar(st));
      tma_load_2d(q_t + kTile64 + kBox64, &tm_do, h * kD + 64, row, full_bar(st));
    }
    const uint32_t ld = ld0 + uint32_t(st) * kLdStage;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int r = lane + 32 * u, i = i0 + r;
      const int64_t idx = (int64_t(it.t0) + min(i, len - 1)) * p.Hq + h;
      cp_async4(ld + 4u * uint32_t(r), p.lam + idx, i < len);
      cp_async4(ld + 4u * uint32_t(kBlk + r), p.delta + idx, i < len);
    }
    cp_async_arrive(full_bar(st));
  };
  if (loader) {
    if (lane == 0) {
      mbar_arrive_expect_tx(kv_bar, uint32_t(2 * kTile128));
      tma_load_2d(k_s, &tm_k, kvh * kD, it.t0 + j0, kv_bar);
      tma_load_2d(k_s + kBox128, &tm_k, kvh * kD + 64, it.t0 + j0, kv_bar);
      tma_load_2d(v_s, &tm_v, kvh * kD, it.t0 + j0, kv_bar);
      tma_load_2d(v_s + kBox128, &tm_v, kvh * kD + 64, it.t0 + j0, kv_bar);
    }
    for (int t = 0; t < kKvAhead && t < nsteps; ++t) load_step(t);
  }

  const int kc = j0 + 64 * wg;         // this warpgroup's first key
  const bool live = kc < len;          // it owns keys of the sequence
  const int key = kc + 16 * warp + g;  // this thread's keys key, key + 8

  float dv[64], dk[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    dv[i] = 0.0f;
    dk[i] = 0.0f;
  }
  // A = this warpgroup's 64 keys of K / V.
  const uint32_t dak = detail::sw128_lo(k_s + uint32_t(wg) * 8192u);
  const uint32_t dav = detail::sw128_lo(v_s + uint32_t(wg) * 8192u);
  mbar_wait(kv_bar, 0);

  int stage = 0, i0 = j0;
  uint32_t phase = 0;
  for (int s = 0; s < nsteps; ++s) {
    if (loader && s + kKvAhead < nsteps) load_step(s + kKvAhead);
    mbar_wait(full_bar(stage), phase);
    const uint32_t q_t = st0 + uint32_t(stage) * kKvStage, do_t = q_t + kTile64;
    if (live && i0 >= kc) {
      if (i0 + kBlk > len) {
        // A head's last tile: rows past the end are +0 in Q and dO (the chains' k dimension).
        // Every warpgroup that computes this tile zeroes them (the same stores), then both sync:
        // warpgroup 1 computes it iff i0 ≥ j0 + 64.
        const int n = i0 >= j0 + kBlk ? 256 : 128;
        zero_rows(gbase + (q_t - base), 4, kBlk, len - i0, n == 256 ? tid : wt, n);
        fence_proxy_async();
        named_bar_sync(1, n);
      }
      float sc[32], dp[32];
      wgmma_fence();
      chain_d<kBox128, kBox64>(sc, dak, detail::sw128_lo(q_t));
      chain_d<kBox128, kBox64>(dp, dav, detail::sw128_lo(do_t));
      const float* lam_s = reinterpret_cast<const float*>(gbase + (ld0 - base) + stage * kLdStage);
      const float* del_s = lam_s + kBlk;
      if (i0 == kc || i0 + kBlk > len) {
        dkdv_tile<true>(sc, dp, dv, dk, lam_s, del_s, q_t, do_t, p.sigma, key, i0, len, tq);
      } else {
        dkdv_tile<false>(sc, dp, dv, dk, lam_s, del_s, q_t, do_t, p.sigma, key, i0, len, tq);
      }
    }
    mbar_arrive(empty_bar(stage));  // every lane (its λ, δ reads are its own)
    i0 += kBlk;
    if (i0 >= len) i0 = j0;
    if (++stage == kKvStages) {
      stage = 0;
      phase ^= 1u;
    }
  }

  if (!live) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = key + 8 * h;
    if (j >= len) continue;
    const int64_t tok = int64_t(it.t0) + j;
    float* dvp = p.dv + tok * p.dv_s0 + int64_t(kvh) * p.dv_s1;
    float* dkp = p.dk + tok * p.dk_s0 + int64_t(kvh) * p.dk_s1;
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = 8 * i + 2 * tq + e;
        dvp[d] = canon(dv[4 * i + 2 * h + e]);
        dkp[d] = canon(__fmul_rn(dk[4 * i + 2 * h + e], p.scale_f));
      }
  }
}

// ------------------------------------------------------------------------------------------------
// dq: dS of one key block (diagonal: key j ≤ row i, per entry), then dQ += dSb·K.
template <bool DIAG>
__device__ __forceinline__ void dq_block(float (&s)[32], float (&dp)[32], float (&acc)[64],
                                         const float (&lam)[2], const float (&del)[2],
                                         uint32_t k_tile, float sigma, int rw, int tq) {
  wgmma_wait<1>();  // S (dP may still run)
  fence_acc(s);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * n + 2 * h + e];
        x = __fsub_rn(__fmul_rn(x, sigma), lam[h]);
      }
  exp2_tile(s);
  wgmma_wait<0>();
  fence_acc(dp);
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& y = dp[4 * n + 2 * h + e];
        const float dsv = __fmul_rn(s[4 * n + 2 * h + e], __fsub_rn(y, del[h]));
        y = (!DIAG || 8 * n + 2 * tq + e <= rw + 8 * h) ? dsv : 0.0f;
      }
  uint32_t da[4][4];
  pack_frags(da, dp);
  fence_acc(acc);
  wgmma_fence();
  chain_tile(acc, da, k_tile);
  wgmma_wait<0>();
  fence_acc(acc);
  fence_u32(da);
}

__global__ void __launch_bounds__(kThreads, 1)
    dq_wg_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                 const __grid_constant__ CUtensorMap tm_v,
                 const __grid_constant__ CUtensorMap tm_do, const BwdParams p,
                 const WgItem* items) {
  extern __shared__ uint8_t smem[];
  const uint32_t raw = smem_u32(smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const gbase = smem + (base - raw);  // generic pointer to `base`
  const uint32_t q_s = base, do_s = base + kTile128;
  const uint32_t st0 = base + 2 * kTile128;  // stage s: K, V at st0 + s·kQStage
  const uint32_t bars = st0 + kStages * kQStage;
  auto full_bar = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty_bar = [&](int s) { return bars + 8u * uint32_t(kStages + s); };
  const uint32_t q_bar = bars + 8u * uint32_t(2 * kStages);

  const WgItem it = items[blockIdx.x / p.Hq];
  const int h = blockIdx.x % p.Hq, kvh = h / p.G;
  const int r0 = it.x0, len = it.len;
  const int last = min(r0 + kWide, len) - 1;  // the CTA's last row
  const int nblk = last / kBlk + 1;           // key blocks the producer loads

  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), 8);
    }
    mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    prefetch_map(&tm_q);
    prefetch_map(&tm_k);
    prefetch_map(&tm_v);
    prefetch_map(&tm_do);
  }
  __syncthreads();

  if (tid >= kConsumers) {
    if (tid == kConsumers) {  // the producer warp's lane 0
      mbar_arrive_expect_tx(q_bar, uint32_t(2 * kTile128));
      tma_load_2d(q_s, &tm_q, h * kD, it.t0 + r0, q_bar);
      tma_load_2d(q_s + kBox128, &tm_q, h * kD + 64, it.t0 + r0, q_bar);
      tma_load_2d(do_s, &tm_do, h * kD, it.t0 + r0, q_bar);
      tma_load_2d(do_s + kBox128, &tm_do, h * kD + 64, it.t0 + r0, q_bar);
      int stage = 0;
      uint32_t phase = 0;
      for (int b = 0; b < nblk; ++b) {
        mbar_wait(empty_bar(stage), phase ^ 1u);
        mbar_arrive_expect_tx(full_bar(stage), uint32_t(kQStage));
        const uint32_t dst = st0 + uint32_t(stage) * kQStage;
        const int32_t row = it.t0 + b * kBlk;
        tma_load_2d(dst, &tm_k, kvh * kD, row, full_bar(stage));
        tma_load_2d(dst + kBox64, &tm_k, kvh * kD + 64, row, full_bar(stage));
        tma_load_2d(dst + kTile64, &tm_v, kvh * kD, row, full_bar(stage));
        tma_load_2d(dst + kTile64 + kBox64, &tm_v, kvh * kD + 64, row, full_bar(stage));
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
    return;
  }

  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int wt = tid & 127, warp = wt >> 5, lane = wt & 31, g = lane >> 2, tq = lane & 3;
  const int r0w = r0 + 64 * wg;                   // first row of this warpgroup
  const int nb = r0w < len ? r0w / kBlk + 1 : 0;  // key blocks it computes
  const int rw = 16 * warp + g;                   // its rows rw, rw + 8 (of 64)

  float lam[2], del[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = r0w + rw + 8 * hh;
    const int64_t idx = (int64_t(it.t0) + i) * p.Hq + h;
    lam[hh] = i < len ? p.lam[idx] : 0.0f;
    del[hh] = i < len ? p.delta[idx] : 0.0f;
  }
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  // A = this warpgroup's 64 rows of Q / dO.
  const uint32_t daq = detail::sw128_lo(q_s + uint32_t(wg) * 8192u);
  const uint32_t dao = detail::sw128_lo(do_s + uint32_t(wg) * 8192u);
  mbar_wait(q_bar, 0);

  int stage = 0;
  uint32_t phase = 0;
  for (int b = 0; b < nblk; ++b) {
    mbar_wait(full_bar(stage), phase);
    if (b < nb) {
      const uint32_t k_t = st0 + uint32_t(stage) * kQStage, v_t = k_t + kTile64;
      const int jb = b * kBlk;
      if (jb + kBlk > len) {
        // The sequence's last key block: keys past the end are +0 in K (dQ's k dimension). Only
        // the warpgroup holding the last row computes this block (the other one has no rows or
        // stops a block earlier), so it syncs alone.
        zero_rows(gbase + (k_t - base), 2, kBlk, len - jb, wt, 128);
        fence_proxy_async();
        named_bar_sync(1 + wg, 128);
      }
      float sc[32], dp[32];
      wgmma_fence();
      chain_d<kBox128, kBox64>(sc, daq, detail::sw128_lo(k_t));
      chain_d<kBox128, kBox64>(dp, dao, detail::sw128_lo(v_t));
      if (b == nb - 1) {
        dq_block<true>(sc, dp, acc, lam, del, k_t, p.sigma, rw, tq);
      } else {
        dq_block<false>(sc, dp, acc, lam, del, k_t, p.sigma, rw, tq);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar(stage));
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }

  if (nb == 0) return;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = r0w + rw + 8 * hh;
    if (i >= len) continue;
    float* dqp = p.dq + (int64_t(it.t0) + i) * p.dq_s0 + int64_t(h) * p.dq_s1;
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        dqp[8 * n + 2 * tq + e] = canon(__fmul_rn(acc[4 * n + 2 * hh + e], p.scale_f));
  }
}

}  // namespace lockstep::cuda::attn_bwd_wg
