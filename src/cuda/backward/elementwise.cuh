// Kernels of the CUDA elementwise backward, docs/contract.md §B.4-B.7, each the CPU op's
// arithmetic step for step (fp32 RNE, one operation at a time with __f*_rn, no fma, canonical NaN
// on every store). RMSNorm: one warp per row in the forward's lane layout (§E.1) for r and for
// the dot; the weight gradient as per-token-block sums (kernel 1) chained per column in canonical
// order (kernel 2). RoPE, SiLU: one thread per pair / element. Embedding: one thread per (id,
// column) walking the id's rows in canonical order. No atomics, no reduction whose order depends
// on the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/math.h"
#include "cuda/elementwise_common.cuh"
#include "lockstep/contract/backward.h"
#include "lockstep/contract/norm.h"

namespace lockstep::cuda::detail {

// ---- B.4 RMSNorm ----------------------------------------------------------------------------

constexpr int kNormBwdWarps = 4;  // rows per CTA of the per-row kernels

struct NormBwdParams {
  const uint16_t* s;  // [rows, H] bf16 via sm (rows = tokens·heads)
  const float* gy;    // via gm
  const float* gres;  // via rm; nullptr: plain rmsnorm_backward
  const uint16_t* w;  // [H] contiguous
  float* out;         // dx (or ds) via om
  RowMap sm, gm, rm, om;
  int64_t rows, H, heads;
  float eps;
};

// §E.1 steps 2-3 for the calling lane of a warp: lane j owns the 8-element groups g ≡ j (mod 32)
// and adds term(k) in ascending k from +0; then the xor butterfly 16 .. 1 (every lane ends with
// the sum's bits).
template <typename Term>
__device__ __forceinline__ float warp_lane_sum(int64_t H, int lane, const Term& term) {
  float acc = 0.0f;
  for (int64_t g = lane; g * kRmsNormGroup < H; g += kRmsNormLanes) {
    const int64_t k0 = g * kRmsNormGroup;
    const int64_t k1 = k0 + kRmsNormGroup < H ? k0 + kRmsNormGroup : H;
    for (int64_t k = k0; k < k1; ++k) acc = __fadd_rn(acc, term(k));
  }
#pragma unroll
  for (int o = kRmsNormLanes / 2; o >= 1; o >>= 1)
    acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
  return acc;
}

// r = 1 / sqrt(sum(s_k²) / H + eps) of one row: the forward's bits (§E.1 step 4).
__device__ __forceinline__ float warp_rms_inv(const uint16_t* sr, int64_t H, float eps, int lane) {
  const float sum = warp_lane_sum(H, lane, [sr](int64_t k) {
    const float v = bf16_bits_to_f32(sr[k]);
    return __fmul_rn(v, v);
  });
  const float mean = __fdiv_rn(sum, float(H));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// r of every row into rinv[rows] (read by the weight gradient's block sums).
static __global__ void __launch_bounds__(32 * kNormBwdWarps)
    rmsnorm_rinv_kernel(const NormBwdParams p, float* rinv) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kNormBwdWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;  // whole warps leave together
  const float r = warp_rms_inv(p.s + p.sm.offset(row), p.H, p.eps, lane);
  if (lane == 0) rinv[row] = r;
}

// dx_k = (gt_k·r) − (s_k·coef), gt = gy·w, coef = dot·((r·r·r)/H), dot = the lane sum of gt·s;
// the residual form stores gres ⊕ dx.
// NOTE: no __restrict__: out may be the same view as gy or gres. Every element is read and then
// written by the lane that owns its group, and no lane reads another lane's groups.
static __global__ void __launch_bounds__(32 * kNormBwdWarps)
    rmsnorm_backward_kernel(const NormBwdParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kNormBwdWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const int64_t H = p.H;
  const uint16_t* sr = p.s + p.sm.offset(row);
  const float* gr = p.gy + p.gm.offset(row);
  const uint16_t* w = p.w;
  const float r = warp_rms_inv(sr, H, p.eps, lane);
  const float dot = warp_lane_sum(H, lane, [sr, gr, w](int64_t k) {
    const float gt = __fmul_rn(gr[k], bf16_bits_to_f32(w[k]));
    return __fmul_rn(gt, bf16_bits_to_f32(sr[k]));
  });
  const float c3 = __fdiv_rn(__fmul_rn(__fmul_rn(r, r), r), float(H));
  const float coef = __fmul_rn(dot, c3);
  const float* rr = p.gres ? p.gres + p.rm.offset(row) : nullptr;
  float* out = p.out + p.om.offset(row);
  for (int64_t g = lane; g * kRmsNormGroup < H; g += kRmsNormLanes) {
    const int64_t k0 = g * kRmsNormGroup;
    const int64_t k1 = k0 + kRmsNormGroup < H ? k0 + kRmsNormGroup : H;
    for (int64_t k = k0; k < k1; ++k) {
      const float gt = __fmul_rn(gr[k], bf16_bits_to_f32(w[k]));
      const float dx = __fsub_rn(__fmul_rn(gt, r), __fmul_rn(bf16_bits_to_f32(sr[k]), coef));
      out[k] = canonical(rr ? __fadd_rn(rr[k], dx) : dx);
    }
  }
}

// One token block of the canonical order (§B.1): token rows [row, row + len), len 1 .. 16;
// positions len .. 15 are padding (+0).
struct NormTokenBlock {
  int64_t row, len;
};

// Kernel 1 of the weight gradient: b[blk][k] = tree16(c_0[k] .. c_15[k]) for the blocks
// blocks[0 .. gridDim.x), c_i[k] = the heads' gy·t summed in head order from g_0 itself
// (padding +0), t = round_bf16(s·r) with r from rinv. Grid (blocks, ceil(H / blockDim.x)).
static __global__ void rmsnorm_dweight_blocks_kernel(const NormBwdParams p, const float* rinv,
                                                     const NormTokenBlock* blocks, float* b) {
  const int64_t k = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (k >= p.H) return;
  const NormTokenBlock blk = blocks[blockIdx.x];
  float c[kTokenBlock];
#pragma unroll
  for (int i = 0; i < kTokenBlock; ++i) {
    c[i] = 0.0f;
    if (i < blk.len) {
      for (int64_t h = 0; h < p.heads; ++h) {
        const int64_t row = (blk.row + i) * p.heads + h;
        const float s = bf16_bits_to_f32(p.s[p.sm.offset(row) + k]);
        const float t = bf16_bits_to_f32(f32_to_bf16_bits(__fmul_rn(s, rinv[row])));
        const float g = __fmul_rn(p.gy[p.gm.offset(row) + k], t);
        c[i] = h == 0 ? g : __fadd_rn(c[i], g);
      }
    }
  }
  // §2's tree: adjacent pairs, level by level.
#pragma unroll
  for (int half = kTokenBlock / 2; half >= 1; half /= 2)
#pragma unroll
    for (int i = 0; i < half; ++i) c[i] = __fadd_rn(c[2 * i], c[2 * i + 1]);
  b[int64_t(blockIdx.x) * p.H + k] = c[0];
}

// Kernel 2: dw[k] = dw[k] ⊕ b[0][k] ⊕ b[1][k] ... (n block sums in canonical order), one thread
// per column, stored canonical.
static __global__ void rmsnorm_dweight_chain_kernel(const float* b, int64_t n, int64_t H,
                                                    float* dw) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= H) return;
  float acc = dw[k];
#pragma unroll 8
  for (int64_t j = 0; j < n; ++j) acc = __fadd_rn(acc, b[j * H + k]);
  dw[k] = canonical(acc);
}

// ---- B.5 RoPE -------------------------------------------------------------------------------

struct RopeBwdParams {
  const float* gy;  // [T, heads, D] f32 via gm (rows = T·heads)
  float* dx;        // via dm; may be the same view as gy
  RowMap gm, dm;
  RopeTableRef tab;
  int64_t rows, heads, half;
};

// dx_i = (a·c) + (b·s), dx_{i+D/2} = (b·c) − (a·s). A position outside [0, P) (device positions
// are not read on the host) gives a canonical-NaN pair, as the forward.
// NOTE: dx may be the same view as gy: a thread reads both elements of its pair before writing.
static __global__ void rope_backward_kernel(const RopeBwdParams p) {
  const int64_t n = p.rows * p.half;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / p.half, i = idx - row * p.half;
    const int64_t pos = p.tab.pos[row / p.heads];
    const float* g = p.gy + p.gm.offset(row);
    float* o = p.dx + p.dm.offset(row);
    const float a = g[i], b = g[i + p.half];
    if (pos < 0 || pos >= p.tab.P) {
      o[i] = __uint_as_float(kCanonicalNanF32);
      o[i + p.half] = __uint_as_float(kCanonicalNanF32);
      continue;
    }
    const float c = p.tab.cos[pos * p.tab.cs + i], s = p.tab.sin[pos * p.tab.ss + i];
    const float ac = __fmul_rn(a, c), bs = __fmul_rn(b, s), bc = __fmul_rn(b, c),
                as = __fmul_rn(a, s);
    o[i] = canonical(__fadd_rn(ac, bs));
    o[i + p.half] = canonical(__fsub_rn(bc, as));
  }
}

// ---- B.6 SiLU-and-mul -----------------------------------------------------------------------

struct SiluBwdParams {
  const uint16_t* gu;  // [T, 2I] bf16 (gate | up), row stride lgu
  const float* ga;     // [T, I], row stride lga
  float* dgu;          // [T, 2I] (dg | du), row stride ld
  int64_t lgu, lga, ld, T, I;
};

// e = exp(−g), d = 1 + e, s = g / d, σ = 1 / d; du = ga·s, dg = (ga·u)·(σ·(1 + g·(1 − σ))).
static __global__ void silu_mul_backward_kernel(const SiluBwdParams p) {
  const int64_t n = p.T * p.I;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.I, i = idx - t * p.I;
    const uint16_t* gu = p.gu + t * p.lgu;
    const float g = bf16_bits_to_f32(gu[i]), u = bf16_bits_to_f32(gu[i + p.I]);
    const float ga = p.ga[t * p.lga + i];
    const float e = ls_expf(-g);
    const float d = __fadd_rn(1.0f, e);
    const float s = __fdiv_rn(g, d);
    const float sig = __fdiv_rn(1.0f, d);
    const float du = __fmul_rn(ga, s);
    const float gs = __fmul_rn(ga, u);
    const float dg =
        __fmul_rn(gs, __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig)))));
    float* o = p.dgu + t * p.ld;
    o[i] = canonical(dg);
    o[i + p.I] = canonical(du);
  }
}

// ---- B.7 Embedding --------------------------------------------------------------------------

struct EmbedBwdParams {
  const float* gh;        // [T, H], row stride lg
  float* dtable;          // [V, H], row stride lt
  const int64_t* rows;    // the covered rows grouped by id (stable: canonical order inside a group)
  const int64_t* run_id;  // [runs] the id of group j
  const int64_t* run_begin;  // [runs + 1] group j = rows[run_begin[j] .. run_begin[j+1])
  int64_t lg, lt, H;
};

// Grid (runs, ceil(H / blockDim.x)): thread (j, k) owns the chain dtable[id_j][k] and adds the
// group's rows in canonical order, dtable ⊕ gh each step (canonical NaN).
static __global__ void embedding_backward_kernel(const EmbedBwdParams p) {
  const int64_t k = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (k >= p.H) return;
  const int64_t j = blockIdx.x;
  float* d = p.dtable + p.run_id[j] * p.lt + k;
  float acc = *d;
  for (int64_t r = p.run_begin[j]; r < p.run_begin[j + 1]; ++r)
    acc = canonical(__fadd_rn(acc, p.gh[p.rows[r] * p.lg + k]));
  *d = acc;
}

}  // namespace lockstep::cuda::detail
