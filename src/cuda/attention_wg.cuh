// Hopper kernel of packed varlen prefill attention for head_dim 128 (docs/contract.md §A.4,
// §A.10): wgmma for both products, TMA loads through an mbarrier ring,
// warpgroup 0 produces, warpgroups 1 and 2 consume. Same bits as attention.cuh's kernels and the
// CPU spec: only the layout of the products differs.
//
// A CTA computes one tile: 128 consecutive positions [r0, r0 + 128) of one sequence for one query
// head (r0 a multiple of 128); consumer warpgroup w owns the 64 rows [r0 + 64w, r0 + 64w + 64).
// The producer loads the tile's Q once (two 64-column boxes of 128 rows) and the 64-key blocks
// b = 0 .. (last position) / 64 of K and V (two boxes each) into kStages ring slots.
// Per block, each consumer warpgroup:
//   1. S = Q·Kᵀ: 8 wgmma m64n64k16 (A = Q, B = K, both K-major, 128B swizzle), the chain over D
//      from +0 (scale-d = 0 on the first k-block) — one MMA chain per score (§M).
//   2. x = s ⊗ σ, the max rule over the valid keys, m_use, p = ls_ex2_sfu(x ⊖ m_use) (masked: +0),
//      the halving-tree row sum in the accumulator layout (A.3), α, l.
//   3. acc = α ⊗ acc, then 4 wgmma m64n128k16 with P (bf16, RNE) as the register A operand and V
//      as the MN-major B operand: the PV chain of 4 k-blocks per output (scale-d = 0 on a chunk's
//      first block: c = +0).
//   4. At a chunk's end the chunk state folds into the run state (A.4's merge; chunk 0 is taken as
//      is); after the last block out = bf16(acc ⊗ (1 ⊘ l)), lse = (m ⊕ log2 l) ⊗ ln2_f.
// Masking: r0 + 64w is a multiple of 64, so only a warpgroup's last block (its diagonal) masks
// keys: row i of the warpgroup keeps keys j0 .. j0 + i. Rows past the sequence (or past T) are
// computed on whatever TMA read and never stored. A.6: when the diagonal V tile holds a
// non-finite value at a key some row masks, PV for that block is recomputed per row limit on
// mma.sync with the masked keys' V zeroed in registers (the same k-block chain; rare).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only)
#include <cuda_runtime.h>

#include <cstdint>

#include "core/math.h"
#include "cuda/attention_common.cuh"  // canon, pack_bf16
#include "cuda/mma_sync.cuh"          // mma_16816 (the non-finite V path)
#include "cuda/sm90_async.cuh"        // mbarriers, TMA loads
#include "cuda/sm90_wgmma.cuh"        // wgmma, descriptors, accumulator fences
#include "lockstep/dtype.h"

namespace lockstep::cuda::attn_wg {

using attn_common::canon;
using attn_common::pack_bf16;
using attn_common::pack_bf16_rn;
using detail::fence_acc;
using detail::mbar_arrive;
using detail::mbar_arrive_expect_tx;
using detail::mbar_init;
using detail::mbar_wait;
using detail::mma_16816;
using detail::smem_u32;
using detail::tma_load_2d;
using detail::wgmma_commit;
using detail::wgmma_fence;
using detail::wgmma_wait;

constexpr int kD = 128;                       // head_dim (compile time)
constexpr int kRows = 128;                    // query rows per CTA
constexpr int kBlk = 64;                      // keys per block (contract A.2)
constexpr int kStages = 3;                    // K/V ring slots
constexpr int kThreads = 384;                 // producer warpgroup + 2 consumer warpgroups
constexpr int kQBytes = kRows * kD * 2;       // two boxes of 64 columns x 128 rows
constexpr int kKvBoxBytes = kBlk * 64 * 2;    // one box: 64 columns x 64 keys
constexpr int kStageBytes = 4 * kKvBoxBytes;  // K (2 boxes), then V (2 boxes)
constexpr int kRunBytes = 2 * 64 * 128 * 4;   // the run state's acc of both warpgroups
constexpr int kSmem = kQBytes + kStages * kStageBytes + kRunBytes + 8 * (2 * kStages + 1) + 1024;
constexpr float kLn2f = 0x1.62e43p-1f;
constexpr float kNegInf = -__builtin_huge_valf();

// One CTA's tile: the sequence's first token t0 and length len, the tile's first position r0,
// the query head.
struct Tile {
  int32_t t0, len, r0, head;
};

struct Params {
  const Tile* tiles;
  int32_t G;      // query heads per kv head
  int32_t K;      // kv_chunk
  float scale;    // σ
  uint16_t* out;  // [T, Hq, D] bf16
  int64_t o_s0, o_s1;
  float* lse;  // [T, Hq] or nullptr
  int64_t l_s0, l_s1;
};

__device__ __forceinline__ float max_rule(float a, float b) {
  const float m = b > a ? b : a;
  return m == 0.0f ? 0.0f : m;
}

// Byte offset of (row, 16-byte chunk) in a 128B-swizzled box (rows of 128 bytes).
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ bool nonfinite_pair(uint32_t u) {
  return (u & 0x7f80u) == 0x7f80u || (u & 0x7f800000u) == 0x7f800000u;
}

// Any non-finite bf16 among V rows [k_lo, 64) of a stage (both 64-column boxes; one warp).
__device__ __forceinline__ bool v_nonfinite(const uint8_t* v, int k_lo, int lane) {
  bool bad = false;
  for (int i = lane; i < 2 * 64 * 8; i += 32) {
    const int box = i >> 9, row = (i >> 3) & 63;
    if (row < k_lo) continue;
    const uint4 w =
        *reinterpret_cast<const uint4*>(v + box * kKvBoxBytes + row * 128 + (i & 7) * 16);
    bad |= nonfinite_pair(w.x) | nonfinite_pair(w.y) | nonfinite_pair(w.z) | nonfinite_pair(w.w);
  }
  return __any_sync(0xffffffffu, bad);
}

// The B fragment of mma.m16n8k16 for keys 16kb .. 16kb + 15 and d 8i .. 8i + 7 from a V stage
// (rows = keys, 128B swizzle), keys >= t zeroed.
__device__ __forceinline__ void v_frag_masked(const uint8_t* v, int kb, int i, int t, int lane,
                                              uint32_t& b0, uint32_t& b1) {
  const int key = 16 * kb + (lane & 15);
  const uint32_t addr = smem_u32(v + (i >> 3) * kKvBoxBytes + sw128_offset(key, i & 7));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1)
               : "r"(addr));
  const int k0 = 16 * kb + 2 * (lane & 3);
  b0 &= (k0 < t ? 0x0000ffffu : 0u) | (k0 + 1 < t ? 0xffff0000u : 0u);
  b1 &= (k0 + 8 < t ? 0x0000ffffu : 0u) | (k0 + 9 < t ? 0xffff0000u : 0u);
}

// A.4 steps 1-5 for one block of a warpgroup's scores s[4n + 2h + e] (row rw + 8h, key
// 8n + 2tq + e of the block): x = s ⊗ σ, the block max over the valid keys, m_use, s <- p
// (masked: +0), α, l. DIAG: row r keeps keys 0 .. r (the warpgroup's diagonal block); else every
// key is valid. The exps run for every entry, masked ones selected away after (no branch).
// Same bits as the contract's steps, in fewer instructions:
// - the max rule's chain (max_rule per key: the larger, -0 made +0) is the plain maximum of the
//   non-NaN values with a zero made +0 once at the end (fmaxf ignores NaN as `b > a` does);
// - p = ls_ex2_sfu, one MUFU.EX2 (contract 0.5).
template <bool DIAG>
__device__ __forceinline__ void softmax_step(float (&s)[32], float scale, bool first, int rw,
                                             int tq, float (&m)[2], float (&l)[2],
                                             float (&alpha)[2]) {
  float pm[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * n + 2 * h + e];
        x = __fmul_rn(x, scale);
        const bool valid = !DIAG || 8 * n + 2 * tq + e <= rw + 8 * h;
        pm[h] = fmaxf(pm[h], valid ? x : kNegInf);
      }
  float use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    pm[h] = pm[h] == 0.0f ? 0.0f : pm[h];
    pm[h] = max_rule(pm[h], __shfl_xor_sync(0xffffffffu, pm[h], 1));
    pm[h] = max_rule(pm[h], __shfl_xor_sync(0xffffffffu, pm[h], 2));
    const float mprev = first ? kNegInf : m[h];
    const float mn = max_rule(mprev, pm[h]);
    use[h] = mn == kNegInf ? 0.0f : mn;
    alpha[h] = ls_ex2_sfu(__fsub_rn(mprev, use[h]));
    m[h] = mn;
  }
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * n + 2 * h + e];
        const float pv = ls_ex2_sfu(__fsub_rn(x, use[h]));
        x = (!DIAG || 8 * n + 2 * tq + e <= rw + 8 * h) ? pv : 0.0f;
      }
  }
  // Row sums: the halving tree over key column c = 8n + 2tq + e (A.3): levels 32, 16, 8 over n
  // in the thread, 4 and 2 across the quad (xor 2, xor 1), 1 over e.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float c[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int o = 2 * h + e;
      const float a0 = __fadd_rn(s[o], s[16 + o]), a1 = __fadd_rn(s[4 + o], s[20 + o]);
      const float a2 = __fadd_rn(s[8 + o], s[24 + o]), a3 = __fadd_rn(s[12 + o], s[28 + o]);
      float v = __fadd_rn(__fadd_rn(a0, a2), __fadd_rn(a1, a3));
      v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
      v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
      c[e] = v;
    }
    const float rs = __fadd_rn(c[0], c[1]);
    l[h] = first ? rs : __fadd_rn(__fmul_rn(alpha[h], l[h]), rs);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    attn_wg_prefill_kernel(const __grid_constant__ CUtensorMap tm_q,
                           const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v, const Params p) {
  extern __shared__ uint8_t smem[];
  const uint32_t raw = smem_u32(smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const gbase = smem + (base - raw);  // generic pointer to `base`
  const uint32_t q_s = base;
  const uint32_t st0 = base + kQBytes;
  // The run state's acc (A.4's fold of the chunks so far), per thread: run[i·128 + thread].
  float* const run_all = reinterpret_cast<float*>(gbase + kQBytes + kStages * kStageBytes);
  const uint32_t bars = st0 + kStages * kStageBytes + kRunBytes;  // full[], empty[], q
  auto full_bar = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty_bar = [&](int s) { return bars + 8u * uint32_t(kStages + s); };
  const uint32_t q_bar = bars + 8u * uint32_t(2 * kStages);

  const Tile t = p.tiles[blockIdx.x];
  const int kvh = t.head / p.G;
  const int last = min(t.r0 + kRows, t.len) - 1;  // the tile's last position
  const int nblk = last / kBlk + 1;               // blocks the producer loads

  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 1);   // the producer's arrive.expect_tx (+ the copies' bytes)
      mbar_init(empty_bar(s), 8);  // lane 0 of each consumer warp
    }
    mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_q)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_k)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_v)) : "memory");
  }
  __syncthreads();

  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) {
      mbar_arrive_expect_tx(q_bar, uint32_t(kQBytes));
      tma_load_2d(q_s, &tm_q, t.head * kD, t.t0 + t.r0, q_bar);
      tma_load_2d(q_s + kQBytes / 2, &tm_q, t.head * kD + 64, t.t0 + t.r0, q_bar);
      int stage = 0;
      uint32_t phase = 0;
      for (int b = 0; b < nblk; ++b) {
        mbar_wait(empty_bar(stage), phase ^ 1u);
        mbar_arrive_expect_tx(full_bar(stage), uint32_t(kStageBytes));
        const uint32_t dst = st0 + uint32_t(stage) * kStageBytes;
        const int32_t row = t.t0 + b * kBlk;
        tma_load_2d(dst, &tm_k, kvh * kD, row, full_bar(stage));
        tma_load_2d(dst + kKvBoxBytes, &tm_k, kvh * kD + 64, row, full_bar(stage));
        tma_load_2d(dst + 2 * kKvBoxBytes, &tm_v, kvh * kD, row, full_bar(stage));
        tma_load_2d(dst + 3 * kKvBoxBytes, &tm_v, kvh * kD + 64, row, full_bar(stage));
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  // Warpgroup-uniform as ptxas sees it (a value it cannot prove uniform makes it serialize wgmma).
  const int wg = __shfl_sync(0xffffffffu, (tid - 128) >> 7, 0);
  const int wt = tid & 127, warp = wt >> 5, lane = wt & 31, g = lane >> 2, tq = lane & 3;
  const int r0w = t.r0 + 64 * wg;                   // first position of this warpgroup
  const int nb = r0w < t.len ? r0w / kBlk + 1 : 0;  // blocks it computes
  const int rw = 16 * warp + g;                     // its rows rw, rw + 8 (of 64)

  // The chunk accumulators: acc[4i + 2h + e] = row rw + 8h, d 8i + 2tq + e. The run state: m_s,
  // l_s here, its acc in shared memory (run), except after the last chunk (then acc holds it).
  float acc[64];
  float* const run = run_all + wg * 64 * 128 + wt;
  float m[2], l[2], m_s[2], l_s[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = kNegInf;
    l[h] = 0.0f;
    m_s[h] = kNegInf;
    l_s[h] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  float s[32];        // the scores of the block in the softmax step
  uint32_t pa[4][4];  // P of the block whose PV is issued next

  // Blocks b = 0 .. nb - 1 in a software pipeline (one warpgroup's view; a warp's wgmma groups
  // complete in issue order). Iteration b: issue S_b = Q·K_bᵀ, then PV_{b-1} (P_{b-1} from
  // registers); wait for S_b; the softmax step of S_b runs while PV_{b-1} is on the tensor cores;
  // wait for PV_{b-1} (its K/V slot goes back to the producer); acc = α_b ⊗ acc; P_b packed. A
  // chunk that ends at block b - 1 folds right after PV_{b-1} (before S_b's softmax step resets
  // m, l). Only the order of issue changes: every chain and every rounding is the one above.
  // Every wgmma wait below is reached on every path through the iteration (ptxas serializes all
  // wgmma of the kernel when it cannot place its own waits).
  // Block b's ring slot and parity, and its place in its kv chunk, are carried from block to block
  // (no division in the loop: a runtime p.K made every `% p.K` a dozen instructions).
  const int bpc = p.K / kBlk;  // blocks per chunk (kv_chunk is a multiple of 64)
  auto slot = [&](int st) { return st0 + uint32_t(st) * kStageBytes; };
  auto wait_full = [&](int st, uint32_t ph) { mbar_wait(full_bar(st), ph); };
  auto release = [&](int st) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar(st));
  };
  // Descriptors from low words (sw128_desc_lo): two instructions per operand.
  const uint32_t q_lo = detail::sw128_lo(q_s + uint32_t(wg) * 8192u);
  // 1. Scores of the block in slot st into s: s[4n + 2h + e] = row rw + 8h, key 8n + 2tq + e of
  // the block (issued, committed, not waited for).
  auto issue_scores = [&](int st) {
    const uint32_t k_lo = detail::sw128_lo(slot(st));
    uint64_t da[8], db[8];
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      da[kb] = detail::sw128_desc_lo(
          q_lo + (uint32_t(kb >> 2) * (kQBytes / 2) + 32u * uint32_t(kb & 3)) / 16);
      db[kb] = detail::sw128_desc_lo(
          k_lo + (uint32_t(kb >> 2) * kKvBoxBytes + 32u * uint32_t(kb & 3)) / 16);
      asm volatile("" : "+l"(da[kb]), "+l"(db[kb]));
    }
    int sd0 = 0, sd1 = 1;
    asm volatile("" : "+r"(sd0), "+r"(sd1));
    wgmma_fence();
    detail::wgmma_k16<64>(s, da[0], db[0], sd0);
#pragma unroll
    for (int kb = 1; kb < 8; ++kb) detail::wgmma_k16<64>(s, da[kb], db[kb], sd1);
    wgmma_commit();
  };
  // 3. acc += P·V of the block in slot st: 4 wgmma m64n128k16 with P (bf16 RNE, packed in pa) as
  // the register A operand and V MN-major (issued, committed, not waited for); c = +0 on a chunk's
  // first block.
  auto issue_pv = [&](int st, bool chunk_first) {
    const uint32_t v_lo = detail::sw128_mn_lo(slot(st) + 2 * kKvBoxBytes);
    uint64_t dv[4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      dv[kb] =
          detail::sw128_desc_lo(v_lo + 128u * uint32_t(kb));  // + 2048 bytes per k-block (MN-major)
      asm volatile("" : "+l"(dv[kb]));
    }
    int sd0 = chunk_first ? 0 : 1, sd1 = 1;
    asm volatile("" : "+r"(sd0), "+r"(sd1));
    fence_acc(acc);
    wgmma_fence();
    detail::wgmma_m64n128k16_rs<1>(acc, pa[0], dv[0], sd0);
    detail::wgmma_m64n128k16_rs<1>(acc, pa[1], dv[1], sd1);
    detail::wgmma_m64n128k16_rs<1>(acc, pa[2], dv[2], sd1);
    detail::wgmma_m64n128k16_rs<1>(acc, pa[3], dv[3], sd1);
    wgmma_commit();
  };
  // 2. Softmax step of a block (A.4 steps 1-5; only the diagonal block masks), then, once the PV of
  // the block before is done, acc = α ⊗ acc and P into pa (a NaN p is any NaN: the MMA makes it
  // 0x7fffffff, §M; k-block kb = keys 16kb .. 16kb + 15). diag: the warpgroup's last block; first:
  // a chunk's first block; rel: the slot of the block before, given back once its PV is done, or
  // -1.
  auto softmax_and_pack = [&](bool diag, bool first, int rel) {
    float alpha[2];
    if (diag) {
      softmax_step<true>(s, p.scale, first, rw, tq, m, l, alpha);
    } else {
      softmax_step<false>(s, p.scale, first, rw, tq, m, l, alpha);
    }
    wgmma_wait<0>();
    fence_acc(acc);
    if (rel >= 0) release(rel);
    // α = 1 on every row of the warp (no row's max rose, the usual case late in a chunk):
    // acc ⊗ 1 = acc bit for bit (a NaN stays a NaN, and stored NaNs are canonical), so the 64
    // products are skipped. The vote is per warp: each warp owns its rows' accumulators.
    if (!first && !__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = __fmul_rn(alpha[(i >> 1) & 1], acc[i]);
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      pa[kb][0] = pack_bf16_rn(s[8 * kb + 0], s[8 * kb + 1]);
      pa[kb][1] = pack_bf16_rn(s[8 * kb + 2], s[8 * kb + 3]);
      pa[kb][2] = pack_bf16_rn(s[8 * kb + 4], s[8 * kb + 5]);
      pa[kb][3] = pack_bf16_rn(s[8 * kb + 6], s[8 * kb + 7]);
    }
  };
  // 4. The chunk that ends at block b folds into the run state (chunk 0 is taken as is). After the
  // last block acc holds the run state's acc; before it, the run's acc goes to shared memory.
  // (chunk0: the block lies in chunk 0; last: the warpgroup's last block.)
  auto fold = [&](bool chunk0, bool last) {
    if (chunk0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_s[h] = m[h];
        l_s[h] = l[h];
      }
      if (!last) {
#pragma unroll
        for (int i = 0; i < 64; ++i) run[i * 128] = acc[i];
      }
    } else {
      float fa[2], fb[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mm = max_rule(m_s[h], m[h]);
        const float mu = mm == kNegInf ? 0.0f : mm;
        fa[h] = ls_ex2_sfu(__fsub_rn(m_s[h], mu));
        fb[h] = ls_ex2_sfu(__fsub_rn(m[h], mu));
        l_s[h] = __fadd_rn(__fmul_rn(fa[h], l_s[h]), __fmul_rn(fb[h], l[h]));
        m_s[h] = mm;
      }
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int h = (i >> 1) & 1;
        const float v = __fadd_rn(__fmul_rn(fa[h], run[i * 128]), __fmul_rn(fb[h], acc[i]));
        if (last) {
          acc[i] = v;
        } else {
          run[i * 128] = v;
        }
      }
    }
  };

  // Block b's slot st, its full barrier's parity ph, its place cpos in its chunk.
  int st = 0, cpos = 0;
  uint32_t ph = 0;
  mbar_wait(q_bar, 0);
  if (nb > 0) {
    wait_full(st, ph);
    issue_scores(st);
    wgmma_wait<0>();
    fence_acc(s);
    softmax_and_pack(nb == 1, true, -1);
  }
#pragma unroll 1
  for (int b = 1; b < nb; ++b) {
    const int st_prev = st;
    const bool prev_first = cpos == 0, prev_chunk0 = b - 1 < bpc;
    if (++st == kStages) {
      st = 0;
      ph ^= 1u;
    }
    if (++cpos == bpc) cpos = 0;
    wait_full(st, ph);
    issue_scores(st);
    issue_pv(st_prev, prev_first);
    if (cpos == 0) {  // a chunk ended at block b - 1
      wgmma_wait<0>();
      fence_acc(acc);
      fold(prev_chunk0, false);
    }
    wgmma_wait<1>();
    fence_acc(s);
    softmax_and_pack(b == nb - 1, cpos == 0, st_prev);
  }
  if (nb > 0) {
    // The diagonal block's PV. A.6: a masked key's V must act as +0: keys 1 .. 63 of the diagonal
    // block are masked for some row. Every warp scans the whole tile, so the choice is the same
    // in the warpgroup.
    const bool first = cpos == 0;
    const uint8_t* vgen = gbase + (slot(st) + 2 * kKvBoxBytes - base);
    if (!v_nonfinite(vgen, 1, lane)) {
      issue_pv(st, first);
      wgmma_wait<0>();
      fence_acc(acc);
    } else {
      // Per row limit tl (row rw + 8h keeps tl = rw + 8h + 1 keys): the chain from c = α ⊗ acc
      // (+0 on a chunk's first block) with keys >= tl zeroed; each row takes its own limit's
      // result. A row's acc still holds its c until its limit's pass (rows are taken once).
#pragma unroll 1
      for (int tl = 16 * warp + 1; tl <= 16 * warp + 16; ++tl) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          float tmp[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) tmp[r] = first ? 0.0f : acc[4 * i + r];
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            uint32_t b0, b1;
            v_frag_masked(vgen, kb, i, tl, lane, b0, b1);
            mma_16816(tmp, pa[kb], b0, b1);
          }
#pragma unroll
          for (int r = 0; r < 4; ++r)
            if (rw + 8 * (r >> 1) + 1 == tl) acc[4 * i + r] = tmp[r];
        }
      }
    }
    release(st);
    fold(nb - 1 < bpc, true);
  }
  // Blocks the producer loads for the other warpgroup only: taken in order and given back.
  for (int b = nb; b < nblk; ++b) {
    wait_full(b % kStages, uint32_t(b / kStages) & 1u);
    release(b % kStages);
  }
  // Output rows of this thread: positions r0w + rw + 8h inside the sequence.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pos = r0w + rw + 8 * h;
    if (nb == 0 || pos >= t.len) continue;
    const int64_t tok = int64_t(t.t0) + pos;
    const float inv = __fdiv_rn(1.0f, l_s[h]);
    uint16_t* o = p.out + tok * p.o_s0 + int64_t(t.head) * p.o_s1;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t v =
          pack_bf16(__fmul_rn(acc[4 * i + 2 * h], inv), __fmul_rn(acc[4 * i + 2 * h + 1], inv));
      *reinterpret_cast<uint32_t*>(o + 8 * i + 2 * tq) = v;
    }
    if (p.lse != nullptr && tq == 0)
      p.lse[tok * p.l_s0 + int64_t(t.head) * p.l_s1] =
          canon(__fmul_rn(__fadd_rn(m_s[h], ls_log2f(l_s[h])), kLn2f));
  }
}

}  // namespace lockstep::cuda::attn_wg
