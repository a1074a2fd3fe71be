// Sampling kernels, docs/contract.md §S, over a block of rows whose tempered logits
// y = z / τ_lp (padding −inf) sit in a [rows, V_pad] scratch and whose lse / entropy the LogP
// kernels (logprob.cuh) already wrote:
//   - greedy (τ = 0): argmax y, ties → lowest index;
//   - plain rows (no filter, or min-p only): Gumbel-max over y[v] + g_v (Philox4x32-10, one call
//     per 4 consecutive ids, g = −log(−log(u)) with the project's log) over the entries with
//     y != −inf (and p_v >= min_p·p_max);
//   - top-k / top-p rows: the row's (y desc, v asc) keys sorted by the launcher (CUB), then top-k =
//     the first k, top-p = the shortest prefix whose integer masses floor(p·2^32) reach
//     ceil(top_p·Q) (exact: integer sums), min-p elementwise, Gumbel-max over what is left.
// Every argmax is a reduction with the total order "greater score, or equal score and lower id",
// so any reduction tree gives the same id (§S.7). One CTA per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "core/math.h"
#include "core/philox.h"
#include "cuda/logprob.cuh"

namespace lockstep::cuda::detail {

constexpr int kSelectThreads = 512;
constexpr int kMaxSortRows = 64;
constexpr int kVocabBits = 21;  // V < 2^21: a sort key is (desc(y) << 21) | v
constexpr uint64_t kVocabMask = (uint64_t(1) << kVocabBits) - 1;

enum SampleMode : int { kGreedy = 0, kPlain = 1, kSorted = 2 };

// One row's settings (from SamplingParams, on the device).
struct SampleRow {
  uint64_t seed;
  float temperature;
  float tau_lp;  // logprob_temperature()
  int64_t top_k;
  float top_p;
  float min_p;
  int mode;      // SampleMode
  int top_k_on;  // 0 < top_k < V
};

struct SampleBlockParams {
  float* y;  // [rows, ldy]: z on entry of the temper kernel, y afterwards
  int64_t ldy, rows, row0, V;
  const SampleRow* info;  // [T]
  IndexRef rid, pos;      // [T]
  const float* lse;       // [T] (row stats, canonical)
  int64_t* out_id;        // [T]
  float* out_logp;        // [T]
};

struct Cand {
  float score;
  int v;
};

__device__ __forceinline__ bool better(const Cand& a, const Cand& b) {
  return a.score > b.score || (a.score == b.score && a.v < b.v);
}

__device__ __forceinline__ Cand no_cand() { return Cand{neg_inf_f32(), 0x7fffffff}; }

// Block-wide best candidate (every thread gets it). smem: >= 32 Cands.
__device__ __forceinline__ Cand block_best(Cand c, Cand* smem) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    Cand x{__shfl_xor_sync(0xffffffffu, c.score, o), __shfl_xor_sync(0xffffffffu, c.v, o)};
    if (better(x, c)) c = x;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = c;
  __syncthreads();
  if (warp == 0) {
    c = lane < int(blockDim.x >> 5) ? smem[lane] : no_cand();
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
      Cand x{__shfl_xor_sync(0xffffffffu, c.score, o), __shfl_xor_sync(0xffffffffu, c.v, o)};
      if (better(x, c)) c = x;
    }
    if (lane == 0) smem[32] = c;
  }
  __syncthreads();
  const Cand r = smem[32];
  __syncthreads();
  return r;
}

// p_v = exp(y − lse) (§S.5).
__device__ __forceinline__ float row_prob(float y, float lse) { return ls_expf(__fsub_rn(y, lse)); }

// g_v from one Philox word (§S.6).
__device__ __forceinline__ float gumbel_from_word(uint32_t word) {
  return -ls_logf(-ls_logf(philox_uniform(word)));
}

__device__ __forceinline__ Philox4 noise_words(uint64_t seed, uint64_t rid, uint32_t pos,
                                               int64_t group) {
  return philox4x32_10(Philox4{{uint32_t(group), pos, uint32_t(rid), uint32_t(rid >> 32)}},
                       uint32_t(seed), uint32_t(seed >> 32));
}

// y = z / τ_lp for v < V, −inf for the padding [V, ldy). Grid-stride over rows·ldy.
static __global__ void sample_temper_kernel(const SampleBlockParams p) {
  const int64_t n = p.rows * p.ldy;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.ldy, v = i - r * p.ldy;
    p.y[i] = v < p.V ? __fdiv_rn(p.y[i], p.info[p.row0 + r].tau_lp) : neg_inf_f32();
  }
}

// Writes the sampled id and logp = y[id] − lse of a row (or −1 / NaN for a row that cannot be
// sampled: the launcher throws for it before any output is written).
__device__ __forceinline__ void write_choice(const SampleBlockParams& p, int64_t t, const float* y,
                                             float lse, const Cand& best) {
  if (threadIdx.x != 0) return;
  const bool ok = best.v != 0x7fffffff;
  p.out_id[t] = ok ? best.v : -1;
  p.out_logp[t] = ok ? canonical(__fsub_rn(y[best.v], lse)) : __uint_as_float(kCanonicalNanF32);
}

// Greedy and plain rows (grid: rows; rows of other modes return at once).
static __global__ void __launch_bounds__(kSelectThreads)
    sample_select_kernel(const SampleBlockParams p) {
  __shared__ Cand smem[33];
  const int64_t r = blockIdx.x, t = p.row0 + r;
  const SampleRow info = p.info[t];
  if (info.mode == kSorted) return;
  const float* y = p.y + r * p.ldy;
  const float lse = p.lse[t];
  if (!isfinite(lse)) {
    write_choice(p, t, y, lse, no_cand());
    return;
  }
  // argmax y, ties -> lowest index (greedy's choice; min-p's p_max).
  Cand best = no_cand();
  if (info.mode == kGreedy || info.min_p > 0.0f) {
    for (int64_t v = threadIdx.x; v < p.V; v += blockDim.x) {
      const Cand c{y[v], int(v)};
      if (better(c, best)) best = c;
    }
    best = block_best(best, smem);
    if (info.mode == kGreedy) {
      write_choice(p, t, y, lse, best);
      return;
    }
  }
  const bool min_p = info.min_p > 0.0f;
  const float thr = min_p ? __fmul_rn(info.min_p, row_prob(y[best.v], lse)) : 0.0f;
  const uint64_t rid = uint64_t(p.rid[t]);
  const uint32_t pos = uint32_t(p.pos[t]);
  Cand mine = no_cand();
  for (int64_t q = threadIdx.x; q * 4 < p.V; q += blockDim.x) {
    const Philox4 words = noise_words(info.seed, rid, pos, q);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t v = q * 4 + e;
      if (v >= p.V) break;
      const float yv = y[v];
      if (yv == neg_inf_f32()) continue;  // probability 0: never sampled
      if (min_p && !(row_prob(yv, lse) >= thr)) continue;
      const Cand c{__fadd_rn(yv, gumbel_from_word(words.v[e])), int(v)};
      if (better(c, mine)) mine = c;
    }
  }
  write_choice(p, t, y, lse, block_best(mine, smem));
}

struct SortRows {
  int n;
  int row[kMaxSortRows];  // row index within the block
};

// keys[b·V + v] = (desc(y) << 21) | v, desc(y) ascending = y descending (−0 keyed as +0, so the
// canonical tie rule "equal y -> lower index" holds for signed zeros too). Grid (·, n).
static __global__ void sample_keys_kernel(const SampleBlockParams p, const SortRows rows,
                                          uint64_t* keys) {
  const int b = blockIdx.y;
  const float* y = p.y + int64_t(rows.row[b]) * p.ldy;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < p.V;
       v += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u = __float_as_uint(y[v]);
    if ((u & 0x7fffffffu) == 0) u = 0;                                // ±0 -> +0
    const uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending in y
    keys[int64_t(b) * p.V + v] = (uint64_t(~asc) << kVocabBits) | uint64_t(v);
  }
}

static __global__ void sample_offsets_kernel(int* offsets, int n, int V) {
  for (int i = threadIdx.x; i <= n; i += blockDim.x) offsets[i] = i * V;
}

// Top-k / top-p / min-p rows over their sorted keys (grid: rows.n).
static __global__ void __launch_bounds__(kSelectThreads)
    sample_filter_kernel(const SampleBlockParams p, const SortRows rows, const uint64_t* sorted) {
  using U64Scan = cub::BlockScan<unsigned long long, kSelectThreads>;
  __shared__ struct { typename U64Scan::TempStorage scan; } tmp;
  __shared__ Cand smem[33];
  __shared__ int64_t s_i64;

  const int b = blockIdx.x;
  const int64_t r = rows.row[b], t = p.row0 + r;
  const SampleRow info = p.info[t];
  const float* y = p.y + r * p.ldy;
  const uint64_t* keys = sorted + int64_t(b) * p.V;
  const float lse = p.lse[t];
  if (!isfinite(lse)) {
    write_choice(p, t, y, lse, no_cand());
    return;
  }
  auto id_at = [&](int64_t i) { return int64_t(keys[i] & kVocabMask); };
  // floor(p · 2^32): p·2^32 is exact in fp32, the conversion truncates.
  auto mass = [&](int64_t i) {
    return (unsigned long long)(__fmul_rn(row_prob(y[id_at(i)], lse), 0x1p32f));
  };

  int64_t n = info.top_k_on ? info.top_k : p.V;  // top-k: the first k of the canonical order
  if (info.top_p < 1.0f) {
    // Thread k owns the contiguous ranks [lo, hi) of the canonical order: its mass sum, one block
    // exclusive scan (integers: exact, any order), then the one thread whose range holds the first
    // prefix reaching thr walks it in order.
    const int64_t per = (n + blockDim.x - 1) / blockDim.x;
    const int64_t lo = min(n, int64_t(threadIdx.x) * per), hi = min(n, lo + per);
    unsigned long long local = 0;
    for (int64_t i = lo; i < hi; ++i) local += mass(i);
    unsigned long long excl, Q;
    U64Scan(tmp.scan).ExclusiveSum(local, excl, Q);  // Q: the block aggregate, in every thread
    const unsigned long long thr =
        (unsigned long long)ceil(__dmul_rn(double(info.top_p), double(Q)));
    if (threadIdx.x == 0) s_i64 = 1;  // thr == 0: the first entry alone
    __syncthreads();
    if (thr > 0 && excl < thr && excl + local >= thr) {
      unsigned long long cum = excl;
      for (int64_t i = lo; i < hi; ++i) {
        cum += mass(i);
        if (cum >= thr) {
          s_i64 = i + 1;  // the shortest prefix with mass >= thr
          break;
        }
      }
    }
    __syncthreads();
    n = s_i64;
  }
  const bool min_p = info.min_p > 0.0f;
  // p_max: the first entry of the canonical order (the row's argmax).
  const float thr = min_p ? __fmul_rn(info.min_p, row_prob(y[id_at(0)], lse)) : 0.0f;
  const uint64_t rid = uint64_t(p.rid[t]);
  const uint32_t pos = uint32_t(p.pos[t]);
  Cand mine = no_cand();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t v = id_at(i);
    const float yv = y[v];
    if (yv == neg_inf_f32()) continue;
    if (min_p && !(row_prob(yv, lse) >= thr)) continue;
    const Philox4 words = noise_words(info.seed, rid, pos, v >> 2);
    const Cand c{__fadd_rn(yv, gumbel_from_word(words.v[v & 3])), int(v)};
    if (better(c, mine)) mine = c;
  }
  write_choice(p, t, y, lse, block_best(mine, smem));
}

struct SampleScatterParams {
  int64_t T;
  const int64_t* id;
  const float* logp;
  const float* lse;
  const float* entropy;
  void* token_ids;
  int ids64;
  float* o_logp;
  float* o_lse;
  float* o_entropy;
  int64_t s_ids, s_logp, s_lse, s_entropy;
};

static __global__ void sample_scatter_kernel(const SampleScatterParams p) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < p.T;
       t += int64_t(gridDim.x) * blockDim.x) {
    if (p.ids64) {
      static_cast<int64_t*>(p.token_ids)[t * p.s_ids] = p.id[t];
    } else {
      static_cast<int32_t*>(p.token_ids)[t * p.s_ids] = int32_t(p.id[t]);
    }
    p.o_logp[t * p.s_logp] = p.logp[t];
    p.o_lse[t * p.s_lse] = p.lse[t];
    p.o_entropy[t * p.s_entropy] = p.entropy[t];
  }
}

}  // namespace lockstep::cuda::detail
