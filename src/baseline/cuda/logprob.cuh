// Baseline log-prob / sampling kernels over materialized fp32 logits (the cuBLAS GEMM of a block
// of rows): plain two-pass softmax statistics per row (one block per row: max, then Σ __expf and
// Σ e·(y − M), block reductions with warp shuffles), vocab-parallel states and their rank-order
// combine, and the sampler: greedy argmax or Gumbel-max with the invariant sampler's Philox noise
// (g = −ls_logf(−ls_logf(u)), sampling_gumbel), over all ids or over the top-k / top-p / min-p
// candidates read from a sorted copy of the row. Ties go to the lowest vocab id.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "baseline/cuda/common.cuh"
#include "core/math.h"
#include "core/philox.h"

namespace lockstep::cuda::baseline::kernels {

constexpr int kStatsThreads = 256;

__device__ __forceinline__ float qnan() { return __int_as_float(0x7fc00000); }

struct RowStats {
  float M, s, w;
};

// Max, then Σ e and Σ e·(y − M) of y = z / temperature over a row (−inf entries add nothing).
// kWrite: y is stored back into z.
template <bool kWrite>
__device__ RowStats row_stats(float* z, int64_t V, float temperature, float* red) {
  float mx = neg_inf();
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float y = z[v] / temperature;
    if (kWrite) z[v] = y;
    mx = fmaxf(mx, y);
  }
  RowStats st;
  st.M = block_max(mx, red);
  float s = 0.0f, w = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float y = kWrite ? z[v] : z[v] / temperature;
    if (y == neg_inf()) continue;
    const float d = y - st.M;
    const float e = __expf(d);
    s += e;
    w += e * d;
  }
  st.s = block_sum(s, red);
  st.w = block_sum(w, red);
  return st;
}

__global__ void __launch_bounds__(kStatsThreads) logprob_rows_kernel(StatsArgs a) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float* z = const_cast<float*>(a.z) + r * a.ldz;
  const RowStats st = row_stats<false>(z, a.V, a.temperature, red);
  if (threadIdx.x != 0) return;
  const float ls = logf(st.s);
  const float lse = st.M + ls;
  const int64_t g = read_index(a.targets, r);
  float logp;
  if (g == a.ignore_index) {
    logp = 0.0f;
  } else if (g >= 0 && g < a.V) {
    logp = z[g] / a.temperature - lse;
  } else {
    logp = qnan();
  }
  a.out.logp[r * a.out.s_logp] = logp;
  a.out.lse[r * a.out.s_lse] = lse;
  a.out.entropy[r * a.out.s_entropy] = ls - st.w / st.s;
}

__global__ void __launch_bounds__(kStatsThreads) logprob_partial_kernel(PartialArgs a) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  float* o = a.state + r * a.ld_state;
  if (a.Vs == 0) {
    if (threadIdx.x == 0) {
      o[0] = neg_inf();
      o[1] = 0.0f;
      o[2] = 0.0f;
      o[3] = qnan();
    }
    return;
  }
  float* z = const_cast<float*>(a.z) + r * a.ldz;
  const RowStats st = row_stats<false>(z, a.Vs, a.temperature, red);
  if (threadIdx.x != 0) return;
  const int64_t g = read_index(a.targets, r);
  const bool mine = g != a.ignore_index && g >= a.v0 && g < a.v0 + a.Vs;
  o[0] = st.M;
  o[1] = st.s;
  o[2] = st.w;
  o[3] = mine ? z[g - a.v0] / a.temperature : qnan();
}

__global__ void logprob_combine_kernel(CombineArgs a) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= a.T) return;
  auto at = [&](int64_t r) { return a.states + r * a.st_sR + t * a.st_sT; };
  float M = neg_inf();
  for (int64_t r = 0; r < a.R; ++r) M = fmaxf(M, at(r)[0]);
  float S = 0.0f, W = 0.0f;
  for (int64_t r = 0; r < a.R; ++r) {
    const float* p = at(r);
    if (p[1] == 0.0f) continue;  // an empty rank adds nothing
    const float d = p[0] - M, f = __expf(d);
    S += p[1] * f;
    W += (p[2] + d * p[1]) * f;
  }
  const float ls = logf(S), lse = M + ls;
  const int64_t g = read_index(a.targets, t);
  float logp;
  if (g == a.ignore_index) {
    logp = 0.0f;
  } else if (g >= 0 && g < a.V && g / a.rank_len < a.R) {
    logp = at(g / a.rank_len)[3] - lse;
  } else {
    logp = qnan();
  }
  a.out.logp[t * a.out.s_logp] = logp;
  a.out.lse[t * a.out.s_lse] = lse;
  a.out.entropy[t * a.out.s_entropy] = ls - W / S;
}

// ---------------------------------------------------------------------------------------------
// Sampling.

// g = −log(−log u) of one noise word (sampling_gumbel's definition, the project's log).
__device__ __forceinline__ float gumbel(uint32_t word) {
  return -ls_logf(-ls_logf(philox_uniform(word)));
}

__device__ __forceinline__ Philox4 noise_words(uint64_t seed, uint64_t rid, uint32_t pos,
                                               int64_t group) {
  return philox4x32_10(Philox4{{uint32_t(group), pos, uint32_t(rid), uint32_t(rid >> 32)}},
                       uint32_t(seed), uint32_t(seed >> 32));
}

// (score, id) better: larger score, then lower id; id < 0 is "none".
__device__ __forceinline__ bool better(float s, int64_t id, float bs, int64_t bid) {
  if (id < 0) return false;
  if (bid < 0) return true;
  return s > bs || (s == bs && id < bid);
}

// Warp argmax of (score, id); every lane gets the winner.
__device__ __forceinline__ void warp_argmax(float& s, int64_t& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const int64_t i2 = __shfl_xor_sync(0xffffffffu, id, o);
    if (better(s2, i2, s, id)) {
      s = s2;
      id = i2;
    }
  }
}

// Block argmax of (score, id); every thread gets the winner.
__device__ __forceinline__ void block_argmax(float& s, int64_t& id, float* rs, int64_t* ri) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  warp_argmax(s, id);
  __syncthreads();
  if (lane == 0) {
    rs[wid] = s;
    ri[wid] = id;
  }
  __syncthreads();
  s = lane < nw ? rs[lane] : 0.0f;
  id = lane < nw ? ri[lane] : -1;
  warp_argmax(s, id);
}

__device__ __forceinline__ void store_id(const SampleArgs& a, int64_t r, int64_t id) {
  if (a.ids_i64) {
    static_cast<int64_t*>(a.token_ids)[r * a.s_ids] = id;
  } else {
    static_cast<int32_t*>(a.token_ids)[r * a.s_ids] = int32_t(id);
  }
}

// One block per row: y = z / T in place, stats, then greedy / unfiltered Gumbel-max. Filtered
// rows get their lse in row_lse and are finished by sample_filtered_kernel.
__global__ void __launch_bounds__(kStatsThreads) sample_kernel(SampleArgs a, float* row_lse) {
  __shared__ float red[32];
  __shared__ float rs[32];
  __shared__ int64_t ri[32];
  const int64_t r = blockIdx.x;
  const SampleRow p = a.params[r];
  float* y = a.z + r * a.ldz;
  const float temperature = p.temperature == 0.0f ? 1.0f : p.temperature;
  const RowStats st = row_stats<true>(y, a.V, temperature, red);
  const float ls = logf(st.s), lse = st.M + ls;
  if (!isfinite(lse)) {
    if (threadIdx.x == 0) {
      atomicMin(a.bad_row, a.row_offset + uint32_t(r));
      row_lse[r] = lse;
    }
    return;
  }
  if (threadIdx.x == 0) {
    a.out.lse[r * a.out.s_lse] = lse;
    a.out.entropy[r * a.out.s_entropy] = ls - st.w / st.s;
    row_lse[r] = lse;
  }
  if (p.filtered) return;
  float best = 0.0f;
  int64_t bid = -1;
  if (p.temperature == 0.0f) {
    for (int64_t v = threadIdx.x; v < a.V; v += blockDim.x)
      if (better(y[v], v, best, bid) && !isnan(y[v])) {
        best = y[v];
        bid = v;
      }
  } else {
    const uint64_t rid = uint64_t(read_index(a.request_ids, r));
    const uint32_t pos = uint32_t(read_index(a.positions, r));
    const int64_t groups = (a.V + 3) / 4;
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      const Philox4 w = noise_words(p.seed, rid, pos, g);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t v = 4 * g + i;
        if (v >= a.V || y[v] == neg_inf()) continue;
        const float sc = y[v] + gumbel(w.v[i]);
        if (better(sc, v, best, bid)) {
          best = sc;
          bid = v;
        }
      }
    }
  }
  block_argmax(best, bid, rs, ri);
  if (threadIdx.x == 0) {
    const int64_t id = bid < 0 ? 0 : bid;
    store_id(a, r, id);
    a.out.logp[r * a.out.s_logp] = y[id] - lse;
  }
}

constexpr int kFilterThreads = 512;

// One block per filtered row, over its sorted copy (ys descending, vs the ids; stable: equal
// values keep ascending ids): top-k keeps the first k; top-p the shortest prefix whose
// probability mass reaches top_p of the kept mass; min-p drops p < min_p · p_max; then
// Gumbel-max over what is left.
__global__ void __launch_bounds__(kFilterThreads)
    sample_filtered_kernel(SampleArgs a, const int32_t* rows, const float* keys, const int32_t* ids,
                           const float* row_lse) {
  __shared__ float red[32];
  __shared__ float rs[32];
  __shared__ int64_t ri[32];
  __shared__ float carry;
  __shared__ int64_t found;
  const int64_t r = rows[blockIdx.x];
  const float lse = row_lse[r];
  if (!isfinite(lse)) return;
  const SampleRow p = a.params[r];
  const float* ys = keys + r * a.ldz;
  const int32_t* vs = ids + r * a.ldz;
  int64_t n = (p.top_k > 0 && p.top_k < a.V) ? p.top_k : a.V;
  if (p.top_p < 1.0f) {
    float part = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) part += __expf(ys[i] - lse);
    const float thr = p.top_p * block_sum(part, red);
    // Prefix sums chunk by chunk until the running mass reaches thr.
    if (threadIdx.x == 0) {
      carry = 0.0f;
      found = n;
    }
    __syncthreads();
    for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
      const int64_t i = c0 + threadIdx.x;
      const float pi = i < n ? __expf(ys[i] - lse) : 0.0f;
      // Inclusive scan of the chunk: warp scan, then warp totals.
      float x = pi;
      const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y2 = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y2;
      }
      __syncthreads();
      if (lane == 31) red[wid] = x;
      __syncthreads();
      float before = carry;
      for (int w = 0; w < wid; ++w) before += red[w];
      const float incl = before + x;
      __syncthreads();
      if (i < n && incl >= thr)
        atomicMin(reinterpret_cast<unsigned long long*>(&found), (unsigned long long)i);
      if (threadIdx.x == blockDim.x - 1) carry = incl;
      __syncthreads();
      if (found < n) break;
    }
    n = found < n ? found + 1 : n;
  }
  const float pmin = p.min_p > 0.0f ? p.min_p * __expf(ys[0] - lse) : 0.0f;
  const uint64_t rid = uint64_t(read_index(a.request_ids, r));
  const uint32_t pos = uint32_t(read_index(a.positions, r));
  float best = 0.0f;
  int64_t bid = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float yv = ys[i];
    if (yv == neg_inf()) continue;
    if (p.min_p > 0.0f && !(__expf(yv - lse) >= pmin)) continue;
    const int64_t v = vs[i];
    const Philox4 w = noise_words(p.seed, rid, pos, v >> 2);
    const float sc = yv + gumbel(w.v[v & 3]);
    if (better(sc, v, best, bid)) {
      best = sc;
      bid = v;
    }
  }
  block_argmax(best, bid, rs, ri);
  if (threadIdx.x == 0) {
    const int64_t id = bid < 0 ? vs[0] : bid;
    store_id(a, r, id);
    a.out.logp[r * a.out.s_logp] = a.z[r * a.ldz + id] - lse;
  }
}

__global__ void iota_rows_kernel(int32_t* ids, int64_t rows, int64_t ld) {
  const int64_t total = rows * ld;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x)
    ids[e] = int32_t(e % ld);
}

}  // namespace lockstep::cuda::baseline::kernels
