// What one pass over a filtered row costs, piece by piece (docs/perf.md, session 33): the sampler's
// pass shapes (one 512-thread CTA per row as sample_choose_kernel; 16 × 256-thread CTAs per row as
// sample_plain_sums_kernel) over 128 rows × 151,936 fp32 logits N(0, 1.33), each variant adding one
// piece: the read alone, the level-0 bin and its count atomic, the mass's exp into a register, the
// mass histogram's atomics, the exp on the SFU, per-warp coarse mass bins, a compare-only pass.
// Timing only (no bits are checked here): median of cudaEvent times, L2 flushed between calls.
// Build (here): nvcc -std=c++20 -O3 -arch=sm_90a -Isrc -Iinclude dev/sampling_s33/pass_costs.cu
//   -o .v33pass/pass_costs (build_variants.sh does)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda/sampling.cuh"

using namespace lockstep;
using namespace lockstep::cuda::detail;

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

constexpr int kRows = 128;
constexpr int64_t kV = 151936;

enum Var : int {
  kRead = 0,       // y summed (bits), nothing else
  kCount,          // level0_bin + atomicAdd(cnt)
  kExpReg,         // mass_q32 into a register sum
  kCountExpReg,    // both
  kMassHist,       // level0_bin + add_mass (lo, hi) + tail in registers: pass 1 of top-p today
  kCountMassHist,  // + the count: pass 1 of top-k + top-p today
  kSfuReg,         // q from ex2.approx(d·log2e) into a register sum
  kSfuCount,       // + the count atomic
  kCoarseWarp,     // counts (fine) + per-warp coarse (1/8 nat, 256 bins) mass histogram
  kCompare,        // pass 2 without exps: y >= cut counted, y in a window appended (rare)
  kVarCount
};
const char* kVarName[] = {"read",          "count",       "exp->reg",      "count+exp->reg",
                          "mass hist",     "count+mass hist", "sfu->reg",   "sfu+count",
                          "count+coarse/warp", "compare only"};

__device__ __forceinline__ uint64_t sfu_q(float d) {
  if (d < -23.0f) return 0;
  const float p = ls_ex2_sfu(__fmul_rn(d, 1.4426950408889634f));
  return sample_q32_unit(p);
}

// Per-warp coarse bins: −d in 1/8 nat, 256 bins (the last takes the rest).
__device__ __forceinline__ int coarse_bin(float d) {
  const float x = fminf(__fmul_rn(-d, 8.0f), 255.0f);
  return int(x);
}

template <int kVar>
__global__ void __launch_bounds__(kChooseThreads)
    one_cta(const float* __restrict__ ys, const float* __restrict__ lses, int64_t ldy,
            unsigned long long* out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint32_t* cnt = reinterpret_cast<uint32_t*>(smem_raw);
  uint32_t* lo = cnt + kBuckets;
  uint32_t* hi = lo + kBuckets;
  uint32_t* wlo = hi + kBuckets;            // [kChooseWarps][256]
  uint32_t* whi = wlo + kChooseWarps * 256;  // [kChooseWarps][256]
  for (int i = threadIdx.x; i < 3 * kBuckets + 2 * kChooseWarps * 256; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const int r = blockIdx.x, warp = threadIdx.x >> 5;
  const float* y = ys + r * ldy;
  const float lse = lses[r];
  const float cut = lse - 3.0f, wlo_y = lse - 3.05f;
  uint64_t acc = 0;
  uint32_t tail_n = 0;
  uint64_t tail_q = 0;
  for_each_group(y, kV, false, [&](int64_t g, const float* v4, int nv) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e >= nv) break;
      const float d = __fsub_rn(v4[e], lse);
      if constexpr (kVar == kRead) {
        acc += __float_as_uint(v4[e]);
      } else if constexpr (kVar == kCount) {
        atomicAdd(&cnt[level0_bin(d)], 1u);
      } else if constexpr (kVar == kExpReg) {
        acc += mass_q32(d);
      } else if constexpr (kVar == kCountExpReg) {
        atomicAdd(&cnt[level0_bin(d)], 1u);
        acc += mass_q32(d);
      } else if constexpr (kVar == kMassHist || kVar == kCountMassHist) {
        const int b = level0_bin(d);
        const uint64_t q = mass_q32(d);
        if (b == kTail) {
          tail_n += 1;
          tail_q += q;
        } else {
          if (kVar == kCountMassHist) atomicAdd(&cnt[b], 1u);
          if (q != 0) add_mass(&lo[b], &hi[b], q);
        }
      } else if constexpr (kVar == kSfuReg) {
        acc += sfu_q(d);
      } else if constexpr (kVar == kSfuCount) {
        atomicAdd(&cnt[level0_bin(d)], 1u);
        acc += sfu_q(d);
      } else if constexpr (kVar == kCoarseWarp) {
        atomicAdd(&cnt[level0_bin(d)], 1u);
        const uint64_t q = mass_q32(d);
        const int c = warp * 256 + coarse_bin(d);
        if (q != 0) add_mass(&wlo[c], &whi[c], q);
      } else if constexpr (kVar == kCompare) {
        const float yv = v4[e];
        acc += yv >= cut ? 1 : 0;
        if (yv >= wlo_y && yv < cut) atomicAdd(&cnt[int(4 * g + e) & (kBuckets - 1)], 1u);
      }
    }
  });
  __syncthreads();
  acc += tail_n + tail_q + cnt[threadIdx.x] + lo[threadIdx.x] + wlo[threadIdx.x];
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

// The read alone, one CTA per row, with kDepth float4 loads in flight per lane (the passes use
// kAhead = 4): each warp streams its segment of the row.
template <int kDepth>
__global__ void __launch_bounds__(kChooseThreads)
    read_deep(const float* __restrict__ ys, int64_t ldy, unsigned long long* out) {
  const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float4* y4 = reinterpret_cast<const float4*>(ys + r * ldy);
  const int ng = int((kV + 3) >> 2), S = seg_groups(kV, kChooseWarps);
  const int g0 = min(ng, warp * S), g1 = min(ng, g0 + S);
  uint32_t acc = 0;
  for (int base = g0; base < g1; base += 32 * kDepth) {
    float4 v[kDepth];
#pragma unroll
    for (int j = 0; j < kDepth; ++j) {
      const int g = base + lane + 32 * j;
      v[j] = g < g1 ? __ldg(y4 + g) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kDepth; ++j)
      acc += __float_as_uint(v[j].x) ^ __float_as_uint(v[j].y) ^ __float_as_uint(v[j].z) ^
             __float_as_uint(v[j].w);
  }
  acc = uint32_t(warp_sum(acc));
  if ((threadIdx.x & 31) == 0) atomicAdd(out, (unsigned long long)acc);
}

// 16 CTAs of 256 threads per row (sample_plain_sums_kernel's shape), per-CTA shared histograms.
template <int kVar>
__global__ void __launch_bounds__(kPlainThreads)
    sliced(const float* __restrict__ ys, const float* __restrict__ lses, int64_t ldy,
           unsigned long long* out) {
  __shared__ uint32_t cnt[kBuckets], lo[kBuckets], hi[kBuckets];
  for (int i = threadIdx.x; i < kBuckets; i += blockDim.x) cnt[i] = lo[i] = hi[i] = 0;
  __syncthreads();
  const int r = blockIdx.y, warp = threadIdx.x >> 5;
  const float* y = ys + r * ldy;
  const float lse = lses[r];
  const int ng = int((kV + 3) >> 2), S = seg_groups(kV, kPlainSegs);
  const int seg = int(blockIdx.x) * kPlainWarps + warp, g0 = min(ng, seg * S);
  uint64_t acc = 0;
  for_each_group_batched(y, g0, min(ng, g0 + S), [&](const float* v4) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float d = __fsub_rn(v4[e], lse);
      if constexpr (kVar == kRead) {
        acc += __float_as_uint(v4[e]);
      } else if constexpr (kVar == kCount) {
        atomicAdd(&cnt[level0_bin(d)], 1u);
      } else if constexpr (kVar == kExpReg) {
        acc += mass_q32(d);
      } else if constexpr (kVar == kMassHist) {
        const int b = level0_bin(d);
        const uint64_t q = mass_q32(d);
        if (q != 0) add_mass(&lo[b], &hi[b], q);
      } else if constexpr (kVar == kSfuReg) {
        acc += sfu_q(d);
      }
    }
  });
  __syncthreads();
  acc += cnt[threadIdx.x] + lo[threadIdx.x];
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

__global__ void fill(float* y, int64_t ldy) {  // N(0, 1.33) from a hash (Box-Muller)
  const int64_t n = kRows * ldy;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = i % ldy;
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) * 0x85EBCA77u;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    uint32_t h2 = h * 0x165667B1u + 0x27D4EB2Fu;
    h2 ^= h2 >> 13, h2 *= 0x85EBCA6Bu, h2 ^= h2 >> 16;
    const float u1 = (float(h >> 8) + 0.5f) * 0x1p-24f, u2 = float(h2 >> 8) * 0x1p-24f;
    const float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    y[i] = v < kV ? 1.33f * z : -INFINITY;
  }
}

__global__ void flush(float* buf, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    buf[i] += 1.0f;
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  const int64_t ldy = (kV + 127) / 128 * 128;
  float *y, *lse, *fl;
  unsigned long long* out;
  const int64_t nfl = 64ll << 20;  // 256 MB
  CK(cudaMalloc(&y, kRows * ldy * 4));
  CK(cudaMalloc(&lse, kRows * 4));
  CK(cudaMalloc(&fl, nfl * 4));
  CK(cudaMalloc(&out, 8));
  CK(cudaMemset(fl, 0, nfl * 4));
  fill<<<1024, 256>>>(y, ldy);
  CK(cudaDeviceSynchronize());
  std::vector<float> hy(kRows * ldy), hl(kRows);
  CK(cudaMemcpy(hy.data(), y, hy.size() * 4, cudaMemcpyDeviceToHost));
  for (int r = 0; r < kRows; ++r) {
    double m = -1e30, s = 0;
    for (int64_t v = 0; v < kV; ++v) m = std::max(m, double(hy[r * ldy + v]));
    for (int64_t v = 0; v < kV; ++v) s += std::exp(double(hy[r * ldy + v]) - m);
    hl[r] = float(m + std::log(s)) + 1e-3f;  // >= the row's max (d <= 0)
  }
  CK(cudaMemcpy(lse, hl.data(), kRows * 4, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const size_t smem1 = (3 * kBuckets + 2 * kChooseWarps * 256) * 4;
  bool do_flush = true;
  auto time = [&](auto launch) {
    std::vector<float> t;
    for (int i = 0; i < reps + 2; ++i) {
      if (do_flush) flush<<<1024, 256>>>(fl, nfl);
      CK(cudaEventRecord(a));
      launch();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 2) t.push_back(ms * 1000.0f);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s; %d rows x %lld fp32 logits N(0, 1.33) (%.1f MB); median of %d, L2 flushed\n",
              prop.name, kRows, (long long)kV, kRows * kV * 4 / 1e6, reps);
  std::printf("%-20s %14s %16s\n", "piece", "1 CTA/row, us", "16 CTAs/row, us");
  auto row = [&](auto var_tag, bool sliced_too) {
    constexpr int kVar = decltype(var_tag)::value;
    CK(cudaFuncSetAttribute(one_cta<kVar>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem1)));
    const float t1 =
        time([&] { one_cta<kVar><<<kRows, kChooseThreads, smem1>>>(y, lse, ldy, out); });
    float t2 = -1;
    if (sliced_too)
      t2 = time([&] { sliced<kVar><<<dim3(kPlainSlices, kRows), kPlainThreads>>>(y, lse, ldy, out); });
    if (t2 >= 0)
      std::printf("%-20s %14.1f %16.1f\n", kVarName[kVar], t1, t2);
    else
      std::printf("%-20s %14.1f %16s\n", kVarName[kVar], t1, "-");
  };
  row(std::integral_constant<int, kRead>{}, true);
  row(std::integral_constant<int, kCount>{}, true);
  row(std::integral_constant<int, kExpReg>{}, true);
  row(std::integral_constant<int, kCountExpReg>{}, false);
  row(std::integral_constant<int, kMassHist>{}, true);
  row(std::integral_constant<int, kCountMassHist>{}, false);
  row(std::integral_constant<int, kSfuReg>{}, true);
  row(std::integral_constant<int, kSfuCount>{}, false);
  row(std::integral_constant<int, kCoarseWarp>{}, false);
  row(std::integral_constant<int, kCompare>{}, false);
  for (bool f : {true, false}) {
    do_flush = f;
    const char* how = f ? "L2 flushed" : "no flush (the data of the previous call)";
    std::printf("read, 1 CTA/row, loads in flight per lane, %s: 4 %.1f us, 8 %.1f us, 16 %.1f us\n",
                how, time([&] { read_deep<4><<<kRows, kChooseThreads>>>(y, ldy, out); }),
                time([&] { read_deep<8><<<kRows, kChooseThreads>>>(y, ldy, out); }),
                time([&] { read_deep<16><<<kRows, kChooseThreads>>>(y, ldy, out); }));
  }
  return 0;
}
