// Kernels of the CUDA linear log-prob backward (docs/contract.md §B.8), fed the forward's fp32
// logits z from the GEMM contract (cuda::gemm_bf16_nt, as in the forward):
//   G (lpb_grad_kernel): per entry of one vocab segment y = z ⊘ τ, p = exp(y ⊖ lse), a, b, gy
//     and G = round_bf16(gy ⊘ τ), at column e (the segment's entry) of G_k [rows, seg_pad] (the
//     launcher zeroes the padding columns e >= n_k);
//   Wᵀ_k (lpb_relayout_wt_kernel): the segment's W rows transposed through shared memory into
//     [hidden columns, seg_pad];
//   row gather / scatter (lpb_gather_rows_kernel, lpb_scatter_rows_kernel): a chunk's rows in
//     canonical block order as one compact buffer, and its dh rows back to their places.
// Every element is computed alone, so the grids never change a bit. The arithmetic of the G
// kernel is the CPU's grad_entry (src/cpu/backward/logprob.cc) with the IEEE intrinsics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/math.h"  // ls_expf
#include "cuda/elementwise_common.cuh"

namespace lockstep::cuda::detail {

constexpr int kLpbThreads = 256;
constexpr int kLpbTransposeTile = 32;  // the Wᵀ transpose: 32 x 32 tiles, 32 x 8 threads

// One token's inputs to §B.8's entries.
struct LpbToken {
  float lse, mu, g_lp, g_ent;
  int64_t target;
  bool ignored;
};

// The per-token inputs, indexed by the micro-batch row (element strides).
struct LpbTokenInputs {
  const float* lse;
  int64_t lse_s;
  const float* entropy;
  int64_t entropy_s;
  const float* g_lp;
  int64_t g_lp_s;
  const float* g_ent;  // nullptr: no entropy term
  int64_t g_ent_s;
  IndexRef targets;
  int64_t ignore_index;
  __device__ __forceinline__ LpbToken load(int64_t t) const {
    LpbToken tk;
    tk.lse = lse[t * lse_s];
    tk.mu = __fsub_rn(tk.lse, entropy[t * entropy_s]);  // E_p[y]
    tk.g_lp = g_lp[t * g_lp_s];
    tk.g_ent = g_ent ? g_ent[t * g_ent_s] : 0.0f;
    tk.target = targets[t];
    tk.ignored = tk.target == ignore_index;
    return tk;
  }
};

struct LpbGradParams {
  const float* z;  // [rows, ldz]: column c = segment entry e0 + c
  int64_t ldz;
  int64_t e0, ncols;  // segment entries [e0, e0 + ncols), all real (vocab id v_seg + entry < V)
  int64_t v_seg;      // vocab id of the segment's entry 0
  int64_t rows;
  const int64_t* src;  // [rows]: the micro-batch row of chunk row r
  LpbTokenInputs tok;
  float tau;
  uint16_t* G;  // [rows, ldg] bf16 bits: column = segment entry
  int64_t ldg;
  uint16_t* Gt;  // nullptr, or [entries, ldgt] bf16 bits: Gᵀ (row = segment entry, column = row)
  int64_t ldgt;
};

// One entry of §B.8 from its forward logit z (the CPU's grad_entry, IEEE intrinsics).
// G's fp32 value before its rounding to bf16 (lpb_entry rounds it; the fused epilogue of
// logprob_epilogue.cuh rounds it in its bf16 store, the same RNE with canonical NaN).
// tau = 1 skips both divides: x ⊘ 1 = x bit for bit (z comes from the MMA and gy from arithmetic
// or the constant +0, so a NaN is already canonical).
__device__ __forceinline__ float lpb_entry_f32(float z, int64_t v, const LpbToken& tk,
                                               bool with_ent, float tau) {
  const bool temper = tau != 1.0f;
  const float y = temper ? __fdiv_rn(z, tau) : z;
  const float pr = ls_expf(__fsub_rn(y, tk.lse));
  // NOTE: an ignored target's logp is the constant +0, so its a is +0 whatever g_lp holds.
  const float a =
      tk.ignored ? 0.0f : __fmul_rn(tk.g_lp, __fsub_rn(v == tk.target ? 1.0f : 0.0f, pr));
  const float gy =
      with_ent ? __fadd_rn(a, __fmul_rn(tk.g_ent, __fmul_rn(pr, __fsub_rn(tk.mu, y)))) : a;
  return temper ? __fdiv_rn(gy, tau) : gy;
}
__device__ __forceinline__ uint16_t lpb_entry(float z, int64_t v, const LpbToken& tk, bool with_ent,
                                              float tau) {
  return f32_to_bf16_bits(lpb_entry_f32(z, v, tk, with_ent, tau));
}

// Grid (ceil(ncols / 32), ceil(rows / 32)), 32 x 8 threads: a tile of 32 rows x 32 entries,
// thread (x, y) computing entry x of rows y, y + 8, y + 16, y + 24; G written along the entries,
// Gᵀ (if wanted) through shared memory along the rows.
static __global__ void lpb_grad_kernel(const LpbGradParams p) {
  __shared__ uint16_t tile[kLpbTransposeTile][kLpbTransposeTile + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kLpbTransposeTile;
  const int64_t r0 = int64_t(blockIdx.y) * kLpbTransposeTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = c0 + tx;
  for (int i = ty; i < kLpbTransposeTile; i += blockDim.y) {
    const int64_t r = r0 + i;
    if (r >= p.rows || c >= p.ncols) continue;
    const LpbToken tk = p.tok.load(p.src[r]);
    const int64_t e = p.e0 + c;
    const uint16_t g =
        lpb_entry(p.z[r * p.ldz + c], p.v_seg + e, tk, p.tok.g_ent != nullptr, p.tau);
    p.G[r * p.ldg + e] = g;
    tile[i][tx] = g;
  }
  if (!p.Gt) return;
  __syncthreads();
  for (int i = ty; i < kLpbTransposeTile; i += blockDim.y) {
    const int64_t cc = c0 + i, r = r0 + tx;
    if (r < p.rows && cc < p.ncols) p.Gt[(p.e0 + cc) * p.ldgt + r] = tile[tx][i];
  }
}

struct LpbRelayoutParams {
  const uint16_t* w;  // [n, ldw] bf16 bits: one vocab segment's real rows
  int64_t ldw, n;
  int64_t h0, hc;  // hidden columns [h0, h0 + hc)
  uint16_t* wt;    // [hc, ldt]: wt[j·ldt + e] = w[e, h0 + j]
  int64_t ldt;
};

// Grid (ceil(n / 32), ceil(hc / 32)), 32 x 8 threads: a 32 x 32 tile through shared memory, read
// along h and written along v.
static __global__ void lpb_relayout_wt_kernel(const LpbRelayoutParams p) {
  __shared__ uint16_t tile[kLpbTransposeTile][kLpbTransposeTile + 1];
  const int64_t v0 = int64_t(blockIdx.x) * kLpbTransposeTile;
  const int64_t j0 = int64_t(blockIdx.y) * kLpbTransposeTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int i = ty; i < kLpbTransposeTile; i += blockDim.y) {
    const int64_t v = v0 + i, j = j0 + tx;
    if (v < p.n && j < p.hc) tile[i][tx] = p.w[v * p.ldw + p.h0 + j];
  }
  __syncthreads();
  for (int i = ty; i < kLpbTransposeTile; i += blockDim.y) {
    const int64_t j = j0 + i, v = v0 + tx;
    if (v < p.n && j < p.hc) p.wt[j * p.ldt + v] = tile[tx][i];
  }
}

// dst[r·ldd + k] = src[rowmap[r]·lds + k] for r < rows, k < cols (bf16 bits).
static __global__ void lpb_gather_rows_kernel(const uint16_t* src, int64_t lds,
                                              const int64_t* rowmap, int64_t rows, int64_t cols,
                                              uint16_t* dst, int64_t ldd) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, k = i % cols;
    dst[r * ldd + k] = src[rowmap[r] * lds + k];
  }
}

// dst[rowmap[r]·ldd + k] = src[r·lds + k] for r < rows, k < cols (f32; rowmap injective).
static __global__ void lpb_scatter_rows_kernel(const float* src, int64_t lds, const int64_t* rowmap,
                                               int64_t rows, int64_t cols, float* dst,
                                               int64_t ldd) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, k = i % cols;
    dst[rowmap[r] * ldd + k] = src[r * lds + k];
  }
}

}  // namespace lockstep::cuda::detail
