// CUDA attention backward kernels (docs/contract.md §B.9, and §B.11's shared-prompt groups):
// packed, causal, GQA, D ≤ 128. Every output element is one MMA chain in the contract's order,
// owned by one thread:
//   delta_kernel  δ = halving tree over d of dout ⊗ out (D padded to a power of two with +0) and
//                 λ = lse ⊗ log2e_f, per (token, query head), one warp per row.
//   dkdv_kernel   one CTA per (sequence, kv head, 64-key block j0): the group's query heads
//                 ascending, for each the 64-row query blocks from j0 to the sequence end, in
//                 16-row k-blocks ascending: dV += Pbᵀ·dO, dK += dSbᵀ·Q (one chain from +0).
//   dq_kernel     one CTA per (sequence, query head, 64-row query block i0): the key blocks
//                 0 … i0 ascending, in 16-key k-blocks ascending: dQ += dSb·K (one chain from +0).
// The shared form (kShared, §B.11) is the same kernels over *parts* (a prompt: positions
// 0 … Lp−1; a completion: Lp … Lp+C−1; an unshared sequence is a prompt without completions),
// blocks and 16-row k-blocks by absolute position: a dq CTA reads keys below Lp from its prompt's
// rows; a dkdv CTA of prompt keys walks, per head, the prompt's rows and then every completion's
// (one chain), one of completion keys only its completion's rows. The 16-row k-blocks lying wholly
// outside a part are skipped (their rows are +0), those that hold part rows run whole.
// Scores and dP are recomputed per tile with mma.sync m16n8k16 over D (k-blocks of 16 ascending
// from +0), x = s ⊗ σ (the forward's score bits), P = exp2(x ⊖ λ), dS = P ⊗ (dP ⊖ δ). Masked
// entries (key > row, or a row past the sequence end) are +0 with the real operands of their
// 64-block, as §B.9 defines; rows and keys past the sequence end are zero-filled on load, so the
// last 16-row / 16-key k-blocks may be skipped when they lie wholly past the end (a k-block of
// zero products returns its accumulator unchanged, §M.1).
// Layout (warp w of 4): dkdv — the warp owns keys 16w … 16w+15 of the block (Sᵀ = K·Qᵀ and
// dPᵀ = V·dOᵀ as m16 × n16 tiles, whose accumulators are the A fragments of the dV / dK MMAs);
// dq — the warp owns rows 16w … 16w+15 (S = Q·Kᵀ, dP = dO·Vᵀ, accumulators → A of dS·K). By
// §M's a↔b symmetry every product set is the contract's k-block whatever the operand roles.
// Speed without a change of order: the kernels are instanced for D = 64 and D = 128 exactly
// (compile-time trip counts; other D take the generic instances); the score pass takes two
// 16-row (dkdv) / 16-key (dq) k-blocks at once, sharing the fragments of one operand, and each
// [16 × 16] tile is classified per warp as wholly masked (no exp, P = dS = +0), wholly unmasked
// (no per-entry mask) or mixed; Pb / dSb are rounded by cvt.rn.bf16x2 (the software rounding
// only when a NaN is present, for the canonical NaN); full 64-row tiles are copied with one
// pointer step per cp.async.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/math.h"
#include "cuda/attention_common.cuh"  // ldmatrix, cp.async, bf16 pairs
#include "cuda/mma_sync.cuh"          // mma_16816, cp.async group steps
#include "lockstep/dtype.h"

namespace lockstep::cuda::attn_bwd_detail {

using attn_common::canon;
using attn_common::cp_async16;
using attn_common::ldsm_x4;
using attn_common::ldsm_x4_t;
using attn_common::load8_scalar;
using attn_common::pack_bf16;
using attn_common::pack_bf16_rn;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::mma_16816;

// P = exp2(s ⊗ σ ⊖ λ), dS = P ⊗ (dP ⊖ δ): the unmasked entry of §B.9.
__device__ __forceinline__ void p_ds(float s, float dpv, float sigma, float lam, float del,
                                     float& pv, float& dsv) {
  pv = ls_ex2_sfu(__fsub_rn(__fmul_rn(s, sigma), lam));
  dsv = __fmul_rn(pv, __fsub_rn(dpv, del));
}
// Four bf16 pairs of an m16 × n16 accumulator tile (c[n][r]) as an A fragment.
__device__ __forceinline__ void pack_tile(uint32_t (&a)[4], const float (&c)[2][4], bool nan) {
  if (nan) {
    a[0] = pack_bf16(c[0][0], c[0][1]);
    a[1] = pack_bf16(c[0][2], c[0][3]);
    a[2] = pack_bf16(c[1][0], c[1][1]);
    a[3] = pack_bf16(c[1][2], c[1][3]);
  } else {
    a[0] = pack_bf16_rn(c[0][0], c[0][1]);
    a[1] = pack_bf16_rn(c[0][2], c[0][3]);
    a[2] = pack_bf16_rn(c[1][0], c[1][1]);
    a[3] = pack_bf16_rn(c[1][2], c[1][3]);
  }
}
// Any NaN among the tile's dS (a NaN P makes its dS NaN too, so P needs no separate test).
__device__ __forceinline__ bool any_nan(const float (&c)[2][4]) {
  bool nan = false;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) nan |= c[n][r] != c[n][r];
  return nan;
}

constexpr int kBlk = 64;                   // keys / rows per block (contract A.2)
constexpr int kThreads = 128;              // 4 warps
constexpr float kLog2ef = 0x1.715476p+0f;  // log2(e) rounded to fp32: λ = lse ⊗ log2e_f

// Query rows of one part: positions [pos0, pos1), position i at packed row row0 + i (varlen:
// a sequence at [0, len)).
struct BwdPart {
  int64_t row0;
  int32_t pos0, pos1;
};

// One CTA's block blk (keys j0 = 64·blk … for dkdv, rows i0 = 64·blk … for dq, by position). Its
// keys: positions [klo, khi), key j at packed row krow + j, or krow_lo + j below ksplit (a
// completion's prompt keys). dq: the rows are `part`. dkdv: per query head the parts
// parts[pb, pe) (varlen: `part` alone), nsteps 64-row tiles in all.
struct BwdItem {
  BwdPart part;
  int64_t krow, krow_lo;
  int32_t klo, khi, ksplit, blk;
  int32_t pb, pe, nsteps, pad_;
};

struct BwdParams {
  const uint16_t *q, *k, *v, *out, *dout;  // bf16 [T, H*, D]
  int64_t q_s0, q_s1, k_s0, k_s1, v_s0, v_s1, o_s0, o_s1, do_s0, do_s1;
  const float* lse;  // [T, Hq]
  int64_t l_s0, l_s1;
  float *dq, *dk, *dv;  // f32 [T, H*, D]
  int64_t dq_s0, dq_s1, dk_s0, dk_s1, dv_s0, dv_s1;
  float* delta;  // workspace [T, Hq] (t·Hq + h)
  float* lam;    // workspace [T, Hq]
  const BwdItem* items;
  const BwdPart* parts;  // the shared form's dkdv walks
  int64_t rows;          // T·Hq (delta_kernel)
  int32_t Hq, G, D, Dp;
  float sigma;    // σ = AttentionConfig::scale_log2(D)
  float scale_f;  // fp32(resolved softmax_scale)
  int32_t vec;    // q, k, v, dout rows 16-byte aligned (cp.async)
};

__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// ------------------------------------------------------------------------------------------------
// δ and λ, one warp per (token, query head). Lane l holds t[l + 32c]; the levels w ≥ 32 of the
// halving tree add inside the thread, w = 16 … 1 are xor shuffles (fp32 + is commutative, so lane
// l < w gets t[l] ⊕ t[l + w] bit for bit).
__global__ void __launch_bounds__(256) delta_kernel(const BwdParams p) {
  const int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.rows) return;
  const int64_t t = row / p.Hq, h = row - t * p.Hq;
  const uint16_t* o = p.out + t * p.o_s0 + h * p.o_s1;
  const uint16_t* g = p.dout + t * p.do_s0 + h * p.do_s1;
  float v[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int d = lane + 32 * c;
    v[c] = d < p.D ? __fmul_rn(bf(g[d]), bf(o[d])) : 0.0f;
  }
  if (p.Dp == 128) {
    v[0] = __fadd_rn(v[0], v[2]);  // w = 64
    v[1] = __fadd_rn(v[1], v[3]);
  }
  if (p.Dp >= 64) v[0] = __fadd_rn(v[0], v[1]);  // w = 32
  for (int w = (p.Dp >= 32 ? 16 : p.Dp / 2); w >= 1; w /= 2)
    v[0] = __fadd_rn(v[0], __shfl_xor_sync(0xffffffffu, v[0], w));
  if (lane == 0) {
    p.delta[row] = v[0];
    p.lam[row] = __fmul_rn(p.lse[t * p.l_s0 + h * p.l_s1], kLog2ef);
  }
}

// A 64-row tile of a [T, H, D] bf16 tensor (head offset folded into base, token stride s0): tile
// row r is packed row tok + r, or tok_lo + r for r < split; rows outside [lo, hi) are +0. Without
// kShared only hi is read (lo = split = 0).
struct TileRows {
  const uint16_t* base;
  int64_t s0, tok, tok_lo;
  int lo, split, hi;
};

// A tile into shared memory (row stride lds). cp.async when vec. With DF (D known at compile
// time) and all 64 rows valid from one source, each thread copies one fixed 16-byte column of
// every kThreads / (D / 8)-th row (a pointer step per copy instead of the index arithmetic).
template <int DF, bool kShared>
__device__ __forceinline__ void load_rows(uint16_t* dst, int lds, const TileRows& t, int D, int vec,
                                          int tid) {
  if constexpr (DF != 0) {
    if (vec && t.hi >= kBlk && (!kShared || (t.lo <= 0 && t.split <= 0))) {
      constexpr int kCpr = DF / 8, kStep = kThreads / kCpr;
      static_assert(kThreads % kCpr == 0 && kBlk % kStep == 0, "load_rows: tile split");
      const int r = tid / kCpr, ch = tid % kCpr;
      const uint16_t* sp = t.base + (t.tok + r) * t.s0 + ch * 8;
      uint16_t* dp = dst + r * lds + ch * 8;
      const int64_t sstep = kStep * t.s0;
#pragma unroll
      for (int m = 0; m < kBlk / kStep; ++m) cp_async16(dp + m * kStep * lds, sp + m * sstep);
      return;
    }
  }
  const int cpr = D / 8;
  for (int qi = tid; qi < kBlk * cpr; qi += kThreads) {
    const int r = qi / cpr, ch = qi - r * cpr;
    uint16_t* d = dst + r * lds + ch * 8;
    if (r >= t.hi || (kShared && r < t.lo)) {
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    const uint16_t* src =
        t.base + ((kShared && r < t.split ? t.tok_lo : t.tok) + r) * t.s0 + ch * 8;
    if (vec) {
      cp_async16(d, src);
    } else {
      *reinterpret_cast<uint4*>(d) = load8_scalar(src);
    }
  }
}

template <int DP>
struct BwdShape {
  static constexpr int kLds = DP + 8;        // bf16; 16 B pad: ldmatrix conflict-free
  static constexpr int kTile = kBlk * kLds;  // one [64, D] tile (elements)
  static constexpr int kSmem =
      6 * kTile * 2    // dkdv: K, V + 2 stages of Q, dO; dq: Q, dO + 2 x K, V
      + 4 * kBlk * 4;  // dkdv: 2 stages of λ, δ
};

// ------------------------------------------------------------------------------------------------
// The 64-row query tile of a dkdv step: query head h, first position i0, the part it belongs to.
struct RowTile {
  int h, i0;
  BwdPart part;
};

// The shared form's walk over a dkdv CTA's steps: query head e (of the group) ascending, per head
// the parts pb … pe−1, per part its 64-row tiles from max(j0, 64·⌊pos0/64⌋) to its end.
struct PartWalk {
  int e, pi, i0;
  BwdPart part;
  __device__ __forceinline__ void first_tile(int j0) { i0 = max(j0, part.pos0 / kBlk * kBlk); }
  __device__ __forceinline__ void start(const BwdParams& p, const BwdItem& it, int j0) {
    e = 0;
    pi = it.pb;
    part = p.parts[pi];
    first_tile(j0);
  }
  __device__ __forceinline__ void next(const BwdParams& p, const BwdItem& it, int j0) {
    i0 += kBlk;
    if (i0 < part.pos1) return;
    if (++pi == it.pe) {
      pi = it.pb;
      ++e;
    }
    part = p.parts[pi];
    first_tile(j0);
  }
};

// dK, dV of one (sequence, kv head, 64-key block); kShared: of one part's keys in the block, over
// the item's parts (§B.11). DF: the head dim when it is DP (compile-time trip counts), else 0
// (p.D). The kernels are dkdv_kernel / dkdv_shared_kernel below.
template <int DP, int DF, bool kShared>
__device__ __forceinline__ void dkdv_block(const BwdParams& p) {
  using S = BwdShape<DP>;
  constexpr int LDS = S::kLds, NKB = DP / 16;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* k_s = reinterpret_cast<uint16_t*>(smem);
  uint16_t* v_s = k_s + S::kTile;
  uint16_t* qd_s = v_s + S::kTile;  // stage st: q at qd_s + 2·st·kTile, dout after it
  float* ld_s = reinterpret_cast<float*>(smem + 6 * S::kTile * 2);  // stage st: λ[64], δ[64]

  const BwdItem it = p.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int j0 = it.blk * kBlk, D = DF ? DF : p.D, nkd = D / 16;
  // The CTA's keys (stored); varlen: the sequence's (its rows' source), so nothing else stays live.
  const int klo = kShared ? it.klo : 0, khi = kShared ? it.khi : it.part.pos1;
  const int64_t krow = kShared ? it.krow : it.part.row0;
  const int per_head = (it.part.pos1 + kBlk - 1) / kBlk - it.blk;  // varlen: query blocks per head
  const int nsteps = it.nsteps;
  // Step s's tile: the walk w at step s (shared form), or s's head and query block (varlen).
  auto tile = [&](int s, const PartWalk& w) {
    if constexpr (kShared)
      return RowTile{kvh * p.G + w.e, w.i0, w.part};
    else
      return RowTile{kvh * p.G + s / per_head, (it.blk + s % per_head) * kBlk, it.part};
  };
  PartWalk walk_load{}, walk{};  // the loader's step (one ahead) and the compute's
  if constexpr (kShared) {
    walk_load.start(p, it, j0);
    walk = walk_load;
  }

  load_rows<DF, kShared>(
      k_s, LDS, TileRows{p.k + kvh * p.k_s1, p.k_s0, krow + j0, krow + j0, klo - j0, 0, khi - j0},
      D, p.vec, tid);
  load_rows<DF, kShared>(
      v_s, LDS, TileRows{p.v + kvh * p.v_s1, p.v_s0, krow + j0, krow + j0, klo - j0, 0, khi - j0},
      D, p.vec, tid);
  auto load_step = [&](int s, const RowTile& tl) {
    const int st = s & 1;
    const int h = tl.h, i0 = tl.i0;
    const int lo = tl.part.pos0 - i0, hi = tl.part.pos1 - i0;  // the part's rows in the tile
    const int64_t t = tl.part.row0 + i0;
    uint16_t* q_s = qd_s + 2 * st * S::kTile;
    load_rows<DF, kShared>(q_s, LDS, TileRows{p.q + h * p.q_s1, p.q_s0, t, t, lo, 0, hi}, D, p.vec,
                           tid);
    load_rows<DF, kShared>(q_s + S::kTile, LDS,
                           TileRows{p.dout + h * p.do_s1, p.do_s0, t, t, lo, 0, hi}, D, p.vec, tid);
    if (tid < kBlk) {
      const bool in = tid < hi && (!kShared || tid >= lo);
      ld_s[st * 2 * kBlk + tid] = in ? p.lam[(t + tid) * p.Hq + h] : 0.0f;
      ld_s[st * 2 * kBlk + kBlk + tid] = in ? p.delta[(t + tid) * p.Hq + h] : 0.0f;
    }
  };
  load_step(0, tile(0, walk_load));
  cp_async_commit();

  float dv[2 * NKB][4], dk[2 * NKB][4];  // n-tiles of 8 d: key 16w + g + 8·(r>>1), d 8n + 2t4 + r&1
#pragma unroll
  for (int n = 0; n < 2 * NKB; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      dv[n][r] = 0.0f;
      dk[n][r] = 0.0f;
    }
  // Keys outside the CTA's are never stored.
  const bool warp_live = j0 + 16 * warp < khi && (!kShared || j0 + 16 * warp + 16 > klo);
  const uint16_t* kw = k_s + (16 * warp + (lane & 15)) * LDS + (lane >> 4) * 8;
  const uint16_t* vw = v_s + (16 * warp + (lane & 15)) * LDS + (lane >> 4) * 8;

  for (int s = 0; s < nsteps; ++s) {
    if (s + 1 < nsteps) {
      if constexpr (kShared) walk_load.next(p, it, j0);
      load_step(s + 1, tile(s + 1, walk_load));
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int st = s & 1;
    const RowTile tl = tile(s, walk);
    if constexpr (kShared) walk.next(p, it, j0);
    const int i0 = tl.i0;
    const int pos0 = kShared ? tl.part.pos0 : 0, L = tl.part.pos1;  // the part's rows
    const uint16_t* q_s = qd_s + 2 * st * S::kTile;
    const uint16_t* do_s = q_s + S::kTile;
    const float* lam_s = ld_s + st * 2 * kBlk;
    const float* del_s = lam_s + kBlk;
    // The 16-row k-blocks kr0 … nr16−1 hold rows of the part.
    const int nr16 = min(4, (L - i0 + 15) / 16);
    const int kr0 = kShared ? max(0, pos0 - i0) / 16 : 0;
    if (warp_live) {
      // Two 16-row k-blocks at a time: their score MMAs share the K / V fragments (eight
      // independent chains); dV / dK still take k-block kr before kr + 1 (pairs from an even
      // k-block: one before kr0 is scored on zero rows and not used).
      for (int kr = kr0 & ~1; kr < nr16; kr += 2) {
        // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ over D: [16 keys, 16 rows] per k-block, chains from +0 (a second
        // k-block wholly past the sequence end reads zero-filled rows and is not used).
        float sc[2][2][4], dp[2][2][4];
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              sc[u][n][r] = 0.0f;
              dp[u][n][r] = 0.0f;
            }
        const int brow = (16 * kr + (lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kb = 0; kb < NKB; ++kb) {
          if (kb < nkd) {
            uint32_t a[4], b[4];
            ldsm_x4(a, kw + kb * 16);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              ldsm_x4(b, q_s + brow + 16 * u * LDS + kb * 16);
              mma_16816(sc[u][0], a, b[0], b[1]);
              mma_16816(sc[u][1], a, b[2], b[3]);
            }
            ldsm_x4(a, vw + kb * 16);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              ldsm_x4(b, do_s + brow + 16 * u * LDS + kb * 16);
              mma_16816(dp[u][0], a, b[0], b[1]);
              mma_16816(dp[u][1], a, b[2], b[3]);
            }
          }
        }
        // P, dS (masked: +0), rounded to bf16 as the A fragments [16 keys, 16 rows]. Each tile
        // is wholly masked (every key past every row: P = dS = +0 whatever the scores), wholly
        // unmasked, or mixed (the diagonal, the sequence end).
        uint32_t pa[2][4], da[2][4];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int r0 = 16 * (kr + u);
          const int kmin = j0 + 16 * warp, rmin = i0 + r0;
          if (kmin > rmin + 15) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              pa[u][r] = 0u;
              da[u][r] = 0u;
            }
            continue;
          }
          if (kmin + 15 <= rmin && rmin + 16 <= L && (!kShared || rmin >= pos0)) {
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                const int ii = r0 + 8 * n + 2 * t4 + (r & 1);
                p_ds(sc[u][n][r], dp[u][n][r], p.sigma, lam_s[ii], del_s[ii], sc[u][n][r],
                     dp[u][n][r]);
              }
          } else {
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                const int jj = 16 * warp + g + 8 * (r >> 1);
                const int ii = r0 + 8 * n + 2 * t4 + (r & 1);
                const bool valid =
                    j0 + jj <= i0 + ii && i0 + ii < L && (!kShared || i0 + ii >= pos0);
                float pv = 0.0f, dsv = 0.0f;
                if (valid) p_ds(sc[u][n][r], dp[u][n][r], p.sigma, lam_s[ii], del_s[ii], pv, dsv);
                sc[u][n][r] = pv;
                dp[u][n][r] = dsv;
              }
          }
          const bool nan = any_nan(dp[u]);
          pack_tile(pa[u], sc[u], nan);
          pack_tile(da[u], dp[u], nan);
        }
        // dV += Pbᵀ·dO, dK += dSbᵀ·Q: the 16-row k-blocks kr, kr + 1 of every d.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (kr + u < nr16 && (!kShared || kr + u >= kr0)) {
            const int trow =
                (16 * (kr + u) + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + (lane >> 4) * 8;
#pragma unroll
            for (int c = 0; c < NKB; ++c) {
              if (c < nkd) {
                uint32_t b[4];
                ldsm_x4_t(b, do_s + trow + c * 16);
                mma_16816(dv[2 * c], pa[u], b[0], b[1]);
                mma_16816(dv[2 * c + 1], pa[u], b[2], b[3]);
                ldsm_x4_t(b, q_s + trow + c * 16);
                mma_16816(dk[2 * c], da[u], b[0], b[1]);
                mma_16816(dk[2 * c + 1], da[u], b[2], b[3]);
              }
            }
          }
        }
      }
    }
    __syncthreads();  // stage st is reloaded by the next iteration's prefetch
  }
  cp_async_wait<0>();

  if (!warp_live) return;
#pragma unroll
  for (int n = 0; n < 2 * NKB; ++n) {
    if (n < 2 * nkd) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = j0 + 16 * warp + g + 8 * (r >> 1);
        if (j >= khi || (kShared && j < klo)) continue;
        const int d = 8 * n + 2 * t4 + (r & 1);
        const int64_t tok = krow + j;
        p.dv[tok * p.dv_s0 + kvh * p.dv_s1 + d] = canon(dv[n][r]);
        p.dk[tok * p.dk_s0 + kvh * p.dk_s1 + d] = canon(__fmul_rn(dk[n][r], p.scale_f));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// dQ of one (sequence, query head, 64-row query block); kShared: of one part's rows in the block,
// over the part's keys (§B.11). DF as in dkdv_block.
template <int DP, int DF, bool kShared>
__device__ __forceinline__ void dq_block(const BwdParams& p) {
  using S = BwdShape<DP>;
  constexpr int LDS = S::kLds, NKB = DP / 16;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);
  uint16_t* do_s = q_s + S::kTile;
  uint16_t* kv_s = do_s + S::kTile;  // stage st: k at kv_s + 2·st·kTile, v after it

  const BwdItem it = p.items[blockIdx.x];
  const int h = blockIdx.y, kvh = h / p.G;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int i0 = it.blk * kBlk, D = DF ? DF : p.D, nkd = D / 16;
  const int pos0 = kShared ? it.part.pos0 : 0, L = it.part.pos1;  // the rows (and keys < L)
  const int64_t row0 = it.part.row0;
  const int nsteps = it.blk + 1;  // key blocks 0 … blk

  {
    const int64_t t = row0 + i0;
    const int lo = pos0 - i0, hi = L - i0;
    load_rows<DF, kShared>(q_s, LDS, TileRows{p.q + h * p.q_s1, p.q_s0, t, t, lo, 0, hi}, D, p.vec,
                           tid);
    load_rows<DF, kShared>(do_s, LDS, TileRows{p.dout + h * p.do_s1, p.do_s0, t, t, lo, 0, hi}, D,
                           p.vec, tid);
  }
  // The keys: positions [0, khi), from krow (krow_lo below ksplit); varlen: the rows' sequence.
  const int khi = kShared ? it.khi : L;
  const int64_t krow = kShared ? it.krow : row0;
  auto load_step = [&](int s) {
    uint16_t* k_s = kv_s + 2 * (s & 1) * S::kTile;
    const int jb = s * kBlk;
    const int64_t t = krow + jb, t_lo = kShared ? it.krow_lo + jb : t;
    const int split = kShared ? it.ksplit - jb : 0, hi = khi - jb;
    load_rows<DF, kShared>(k_s, LDS, TileRows{p.k + kvh * p.k_s1, p.k_s0, t, t_lo, 0, split, hi}, D,
                           p.vec, tid);
    load_rows<DF, kShared>(k_s + S::kTile, LDS,
                           TileRows{p.v + kvh * p.v_s1, p.v_s0, t, t_lo, 0, split, hi}, D, p.vec,
                           tid);
  };
  load_step(0);
  cp_async_commit();

  // This thread's rows: i0 + 16w + g + 8·hh (hh = r >> 1 of the accumulators).
  const bool warp_live = i0 + 16 * warp < L && (!kShared || i0 + 16 * warp + 16 > pos0);
  float lam[2], del[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = i0 + 16 * warp + g + 8 * hh;
    const bool in = i < L && (!kShared || i >= pos0);
    lam[hh] = in ? p.lam[(row0 + i) * p.Hq + h] : 0.0f;
    del[hh] = in ? p.delta[(row0 + i) * p.Hq + h] : 0.0f;
  }
  float acc[2 * NKB][4];  // n-tiles of 8 d: row 16w + g + 8·(r>>1), d 8n + 2t4 + r&1
#pragma unroll
  for (int n = 0; n < 2 * NKB; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[n][r] = 0.0f;
  uint32_t qf[NKB][4], df[NKB][4];

  for (int s = 0; s < nsteps; ++s) {
    if (s + 1 < nsteps) load_step(s + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (s == 0) {
#pragma unroll
      for (int kb = 0; kb < NKB; ++kb) {
        if (kb < nkd) {
          ldsm_x4(qf[kb], q_s + (16 * warp + (lane & 15)) * LDS + kb * 16 + (lane >> 4) * 8);
          ldsm_x4(df[kb], do_s + (16 * warp + (lane & 15)) * LDS + kb * 16 + (lane >> 4) * 8);
        }
      }
    }
    const uint16_t* k_s = kv_s + 2 * (s & 1) * S::kTile;
    const uint16_t* v_s = k_s + S::kTile;
    const int j0 = s * kBlk;
    const int nk16 = min(4, (khi - j0 + 15) / 16);
    if (warp_live) {
      // Two 16-key k-blocks at a time (eight independent score chains); dQ still takes k-block
      // kk before kk + 1.
      for (int kk = 0; kk < nk16; kk += 2) {
        // S = Q·Kᵀ, dP = dO·Vᵀ over D: [16 rows, 16 keys] per k-block, chains from +0 (a second
        // k-block wholly past the sequence end reads zero-filled keys and is not used).
        float sc[2][2][4], dp[2][2][4];
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              sc[u][n][r] = 0.0f;
              dp[u][n][r] = 0.0f;
            }
        const int brow = (16 * kk + (lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kb = 0; kb < NKB; ++kb) {
          if (kb < nkd) {
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              uint32_t b[4];
              ldsm_x4(b, k_s + brow + 16 * u * LDS + kb * 16);
              mma_16816(sc[u][0], qf[kb], b[0], b[1]);
              mma_16816(sc[u][1], qf[kb], b[2], b[3]);
              ldsm_x4(b, v_s + brow + 16 * u * LDS + kb * 16);
              mma_16816(dp[u][0], df[kb], b[0], b[1]);
              mma_16816(dp[u][1], df[kb], b[2], b[3]);
            }
          }
        }
        // dS (masked: +0) as the A fragments: each tile wholly masked, wholly unmasked or mixed
        // (as in dkdv_kernel).
        uint32_t da[2][4];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int rmin = i0 + 16 * warp, kmin = j0 + 16 * (kk + u);
          if (kmin > rmin + 15) {
#pragma unroll
            for (int r = 0; r < 4; ++r) da[u][r] = 0u;
            continue;
          }
          if (kmin + 15 <= rmin && rmin + 16 <= L && (!kShared || rmin >= pos0)) {
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                float pv;
                p_ds(sc[u][n][r], dp[u][n][r], p.sigma, lam[r >> 1], del[r >> 1], pv, dp[u][n][r]);
              }
          } else {
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                const int i = i0 + 16 * warp + g + 8 * (r >> 1);
                const int j = kmin + 8 * n + 2 * t4 + (r & 1);
                float pv, dsv = 0.0f;
                if (j <= i && i < L && (!kShared || i >= pos0))
                  p_ds(sc[u][n][r], dp[u][n][r], p.sigma, lam[r >> 1], del[r >> 1], pv, dsv);
                dp[u][n][r] = dsv;
              }
          }
          pack_tile(da[u], dp[u], any_nan(dp[u]));
        }
        // dQ += dSb·K: the 16-key k-blocks kk, kk + 1 of every d.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (kk + u < nk16) {
            const int trow =
                (16 * (kk + u) + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + (lane >> 4) * 8;
#pragma unroll
            for (int c = 0; c < NKB; ++c) {
              if (c < nkd) {
                uint32_t b[4];
                ldsm_x4_t(b, k_s + trow + c * 16);
                mma_16816(acc[2 * c], da[u], b[0], b[1]);
                mma_16816(acc[2 * c + 1], da[u], b[2], b[3]);
              }
            }
          }
        }
      }
    }
    __syncthreads();  // stage s & 1 is reloaded by the next iteration's prefetch
  }
  cp_async_wait<0>();

  if (!warp_live) return;
#pragma unroll
  for (int n = 0; n < 2 * NKB; ++n) {
    if (n < 2 * nkd) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + 16 * warp + g + 8 * (r >> 1);
        if (i >= L || (kShared && i < pos0)) continue;
        const int d = 8 * n + 2 * t4 + (r & 1);
        p.dq[(row0 + i) * p.dq_s0 + h * p.dq_s1 + d] = canon(__fmul_rn(acc[n][r], p.scale_f));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The kernels: varlen (§B.9) and shared (§B.11) instances of the blocks above.
// NOTE: the shared instances are bounded to the occupancy the varlen ones reach by themselves (4
// CTAs per SM for D ≤ 64, 2 for D ≤ 128, which their shared memory allows): unbounded, the part
// walk's registers would cost D ≤ 64 one CTA per SM.
template <int DP, int DF>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const BwdParams p) {
  dkdv_block<DP, DF, false>(p);
}
template <int DP, int DF>
__global__ void __launch_bounds__(kThreads, DP == 64 ? 4 : 2)
    dkdv_shared_kernel(const BwdParams p) {
  dkdv_block<DP, DF, true>(p);
}
template <int DP, int DF>
__global__ void __launch_bounds__(kThreads) dq_kernel(const BwdParams p) {
  dq_block<DP, DF, false>(p);
}
template <int DP, int DF>
__global__ void __launch_bounds__(kThreads, DP == 64 ? 4 : 2) dq_shared_kernel(const BwdParams p) {
  dq_block<DP, DF, true>(p);
}

}  // namespace lockstep::cuda::attn_bwd_detail
