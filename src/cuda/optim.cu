// The AdamW kernels (include/lockstep/cuda/optim.h): engine::AdamW's canonical gradient sum of
// squares and its elementwise update, the same IEEE double operations in the same order as
// src/engine/optim.cc. Every double operation is an explicit round-to-nearest intrinsic
// (__dadd_rn, __dmul_rn, __ddiv_rn, __dsqrt_rn: never contracted, correctly rounded), every
// conversion is exact (f32 -> f64) or RNE (f64 -> f32, subnormals kept: no -ftz), so each stored
// value equals the CPU's. Nothing is reduced across threads: each chunk's chain runs in one lane.
//   sum of squares: one lane per 65536-element chunk, a warp runs 32 chunks' chains side by side;
//   update:         one thread per element, each block a run of one tensor's elements.
// Up to kBatch tensors per launch, their table a by-value kernel parameter.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/elementwise_common.cuh"
#include "lockstep/cuda/optim.h"
#include "lockstep/dtype.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
namespace {

constexpr const char* kSumOp = "cuda::sum_of_squares_chunks";
constexpr const char* kUpdateOp = "cuda::adamw_update";
constexpr int kBatch = 32;  // tensors per launch

// The largest k < count with begin[k] <= x (begin non-decreasing, begin[0] = 0 <= x).
__device__ __forceinline__ int find_tensor(const int64_t* begin, int count, int64_t x) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (begin[mid] <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ---- sum of squares ----------------------------------------------------------------------------

// NOTE: one lane per chunk, so that every FP64 instruction of the chains does 32 useful adds: the
// warp's lane j runs the chain of the warp's chunk j. Per tile the warp stages kSumTile elements
// of each of its 32 chunks (kRowLoads coalesced 32-element rows per chunk) in shared memory, each
// chunk's row padded to kSumTile + 1 words so that the 32 lanes, each reading its own row, hit 32
// different banks; the next tile's loads are in flight while the lanes run the current one.
// Elements past a chunk's end are staged as +0: s + (+0)·(+0) = s for every s >= +0, +inf or
// NaN, so the padding changes no bit of any chain.
constexpr int kLanes = 32;
constexpr int kSumWarps = 2;                  // warps per block
constexpr int kRowLoads = 2;                  // loads per lane per chunk per tile
constexpr int kSumTile = kRowLoads * kLanes;  // elements of each chunk per staged tile

struct SumBatch {
  int count = 0;
  int64_t chunk_begin[kBatch + 1] = {};  // the batch's first chunk of tensor k; [count] = total
  const float* grad[kBatch] = {};
  int64_t numel[kBatch] = {};
};

__global__ void __launch_bounds__(kSumWarps* kLanes)
    sum_of_squares_kernel(const __grid_constant__ SumBatch b, double* out) {
  __shared__ float tile[kSumWarps][kLanes][kSumTile + 1];
  __shared__ const float* row_ptr[kSumWarps][kLanes];
  __shared__ int row_len[kSumWarps][kLanes];
  const int warp = int(threadIdx.x) / kLanes, lane = int(threadIdx.x) % kLanes;
  const int64_t total = b.chunk_begin[b.count];
  // This lane's chunk (its index in the batch).
  const int64_t chunk = (int64_t(blockIdx.x) * kSumWarps + warp) * kLanes + lane;
  const float* p = nullptr;
  int len = 0;
  if (chunk < total) {
    const int k = find_tensor(b.chunk_begin, b.count, chunk);
    const int64_t first = (chunk - b.chunk_begin[k]) * kNormChunk;
    p = b.grad[k] + first;
    len = int(b.numel[k] - first < kNormChunk ? b.numel[k] - first : kNormChunk);
  }
  row_ptr[warp][lane] = p;
  row_len[warp][lane] = len;
  int longest = len;
  for (int o = kLanes / 2; o > 0; o /= 2) longest = max(longest, __shfl_xor_sync(~0u, longest, o));
  __syncwarp();

  float(*t)[kSumTile + 1] = tile[warp];
  float x[kRowLoads][kLanes];  // x[q][r]: element base + 32·q + lane of the warp's chunk r
  auto load = [&](int base) {
#pragma unroll
    for (int q = 0; q < kRowLoads; ++q) {
      const int i = base + q * kLanes + lane;
#pragma unroll
      for (int r = 0; r < kLanes; ++r) x[q][r] = i < row_len[warp][r] ? row_ptr[warp][r][i] : 0.0f;
    }
  };
  double s = 0.0;
  if (longest > 0) load(0);
  for (int base = 0; base < longest; base += kSumTile) {
    __syncwarp();  // the previous tile's reads are done
#pragma unroll
    for (int q = 0; q < kRowLoads; ++q) {
#pragma unroll
      for (int r = 0; r < kLanes; ++r) t[r][q * kLanes + lane] = x[q][r];
    }
    __syncwarp();
    if (base + kSumTile < longest) load(base + kSumTile);  // in flight during the chain
#pragma unroll
    for (int i = 0; i < kSumTile; ++i) {
      const double d = double(t[lane][i]);  // element base + i of this lane's chunk
      s = __dadd_rn(s, __dmul_rn(d, d));    // d·d is exact in double
    }
  }
  if (chunk < total) out[chunk] = s;
}

// ---- update ------------------------------------------------------------------------------------

constexpr int kUpdateThreads = 256;
constexpr int kUpdatePerThread = 4;
constexpr int64_t kUpdateBlockElems = int64_t(kUpdateThreads) * kUpdatePerThread;

struct UpdateBatch {
  int count = 0;
  int64_t block_begin[kBatch + 1] = {};  // the batch's first block of tensor k; [count] = total
  const float* grad[kBatch] = {};
  float* master[kBatch] = {};
  float* m[kBatch] = {};
  float* v[kBatch] = {};
  uint16_t* weight[kBatch] = {};
  int64_t numel[kBatch] = {};
  double weight_decay[kBatch] = {};
};

__global__ void __launch_bounds__(kUpdateThreads)
    adamw_update_kernel(const __grid_constant__ UpdateBatch b, const AdamWStepConsts c) {
  const int k = find_tensor(b.block_begin, b.count, int64_t(blockIdx.x));
  const int64_t n = b.numel[k];
  const int64_t first = (int64_t(blockIdx.x) - b.block_begin[k]) * kUpdateBlockElems;
  const float* __restrict__ g = b.grad[k];
  float* __restrict__ w = b.master[k];
  float* __restrict__ m = b.m[k];
  float* __restrict__ v = b.v[k];
  uint16_t* __restrict__ out = b.weight[k];
  const double wd = b.weight_decay[k];
  // All of this thread's loads first (kUpdatePerThread elements in flight), then the math.
  float gf[kUpdatePerThread], wf[kUpdatePerThread], mf[kUpdatePerThread], vf[kUpdatePerThread];
#pragma unroll
  for (int j = 0; j < kUpdatePerThread; ++j) {
    const int64_t i = first + int64_t(j) * kUpdateThreads + threadIdx.x;
    if (i < n) {
      gf[j] = g[i];
      wf[j] = w[i];
      mf[j] = m[i];
      vf[j] = v[i];
    }
  }
#pragma unroll
  for (int j = 0; j < kUpdatePerThread; ++j) {
    const int64_t i = first + int64_t(j) * kUpdateThreads + threadIdx.x;
    if (i >= n) break;
    // optim.cc, operation for operation:
    //   gi = g·scale; mi = b1·m + (1−b1)·gi; vi = b2·v + (1−b2)·(gi·gi);
    //   m_hat = mi/c1; v_hat = vi/c2; update = m_hat/(sqrt(v_hat) + eps) + wd·wi;
    //   w = float(wi − lr·update); m = float(mi); v = float(vi)
    const double gi = __dmul_rn(double(gf[j]), c.clip_scale);
    const double mi =
        __dadd_rn(__dmul_rn(c.beta1, double(mf[j])), __dmul_rn(c.one_minus_beta1, gi));
    const double vi = __dadd_rn(__dmul_rn(c.beta2, double(vf[j])),
                                __dmul_rn(c.one_minus_beta2, __dmul_rn(gi, gi)));
    const double m_hat = __ddiv_rn(mi, c.c1), v_hat = __ddiv_rn(vi, c.c2);
    const double wi = double(wf[j]);
    const double update =
        __dadd_rn(__ddiv_rn(m_hat, __dadd_rn(__dsqrt_rn(v_hat), c.eps)), __dmul_rn(wd, wi));
    const float w_new = __double2float_rn(__dsub_rn(wi, __dmul_rn(c.lr, update)));
    w[i] = w_new;
    m[i] = __double2float_rn(mi);
    v[i] = __double2float_rn(vi);
    out[i] = f32_to_bf16(w_new).bits;
  }
}

// ---- host side ---------------------------------------------------------------------------------

void check_cuda(cudaError_t e, const char* op, const char* what) {
  LS_CHECK(e == cudaSuccess, op, what, ": ", cudaGetErrorString(e));
}

void check_view(const char* op, size_t k, const char* arg, const TensorView& t, DType dtype) {
  LS_CHECK(t.device == Device::kCUDA, op, "tensor ", k, ": argument '", arg,
           "' must be a CUDA view, got ", t.describe());
  LS_CHECK(t.dtype == dtype, op, "tensor ", k, ": argument '", arg, "' must be ", dtype_name(dtype),
           ", got ", t.describe());
  LS_CHECK(t.is_contiguous(), op, "tensor ", k, ": argument '", arg, "' must be contiguous, got ",
           t.describe());
  LS_CHECK(t.numel() == 0 || t.data != nullptr, op, "tensor ", k, ": argument '", arg,
           "' has a null data pointer");
}

// The device buffer of the chunk sums, freed on every path.
struct DeviceDoubles {
  double* p = nullptr;
  cudaStream_t stream = nullptr;
  ~DeviceDoubles() {
    if (p) cudaFreeAsync(p, stream);
  }
};

}  // namespace

std::vector<double> sum_of_squares_chunks(const std::vector<TensorView>& grads, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  int64_t total = 0;
  for (size_t k = 0; k < grads.size(); ++k) {
    check_view(kSumOp, k, "grad", grads[k], DType::kF32);
    total += (grads[k].numel() + kNormChunk - 1) / kNormChunk;
  }
  std::vector<double> sums(size_t(total), 0.0);
  if (total == 0) return sums;
  DeviceDoubles dev;
  dev.stream = s;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&dev.p), size_t(total) * sizeof(double), s),
             kSumOp, "cudaMallocAsync");
  int64_t done = 0;  // chunks before the batch
  SumBatch b;
  auto launch = [&] {
    if (b.count == 0) return;
    const int64_t chunks = b.chunk_begin[b.count];
    const int64_t per_block = int64_t(kSumWarps) * kLanes;
    const int64_t blocks = (chunks + per_block - 1) / per_block;
    LS_CHECK(blocks < (int64_t(1) << 31), kSumOp, "too many chunks in one launch: ", chunks);
    sum_of_squares_kernel<<<unsigned(blocks), kSumWarps * kLanes, 0, s>>>(b, dev.p + done);
    detail::check_launch(kSumOp);
    done += chunks;
    b = SumBatch{};
  };
  for (const TensorView& g : grads) {
    const int64_t n = g.numel();
    if (n == 0) continue;
    b.grad[b.count] = static_cast<const float*>(g.data);
    b.numel[b.count] = n;
    b.chunk_begin[b.count + 1] = b.chunk_begin[b.count] + (n + kNormChunk - 1) / kNormChunk;
    if (++b.count == kBatch) launch();
  }
  launch();
  check_cuda(cudaMemcpyAsync(sums.data(), dev.p, size_t(total) * sizeof(double),
                             cudaMemcpyDeviceToHost, s),
             kSumOp, "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(s), kSumOp, "cudaStreamSynchronize");
  return sums;
}

void adamw_update(const std::vector<AdamWTensor>& tensors, const AdamWStepConsts& c, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const AdamWTensor& t = tensors[k];
    check_view(kUpdateOp, k, "grad", t.grad, DType::kF32);
    check_view(kUpdateOp, k, "master", t.master, DType::kF32);
    check_view(kUpdateOp, k, "m", t.m, DType::kF32);
    check_view(kUpdateOp, k, "v", t.v, DType::kF32);
    check_view(kUpdateOp, k, "weight", t.weight, DType::kBF16);
    const int64_t n = t.master.numel();
    LS_CHECK(t.grad.numel() == n && t.m.numel() == n && t.v.numel() == n && t.weight.numel() == n,
             kUpdateOp, "tensor ", k, ": element counts differ: grad ", t.grad.numel(), ", master ",
             n, ", m ", t.m.numel(), ", v ", t.v.numel(), ", weight ", t.weight.numel());
  }
  UpdateBatch b;
  auto launch = [&] {
    if (b.count == 0) return;
    const int64_t blocks = b.block_begin[b.count];
    LS_CHECK(blocks < (int64_t(1) << 31), kUpdateOp, "too many elements in one launch: ", blocks,
             " blocks");
    adamw_update_kernel<<<unsigned(blocks), kUpdateThreads, 0, s>>>(b, c);
    detail::check_launch(kUpdateOp);
    b = UpdateBatch{};
  };
  for (const AdamWTensor& t : tensors) {
    const int64_t n = t.master.numel();
    if (n == 0) continue;
    const int i = b.count;
    b.grad[i] = static_cast<const float*>(t.grad.data);
    b.master[i] = static_cast<float*>(t.master.data);
    b.m[i] = static_cast<float*>(t.m.data);
    b.v[i] = static_cast<float*>(t.v.data);
    b.weight[i] = static_cast<uint16_t*>(t.weight.data);
    b.numel[i] = n;
    b.weight_decay[i] = t.weight_decay;
    b.block_begin[i + 1] = b.block_begin[i] + (n + kUpdateBlockElems - 1) / kUpdateBlockElems;
    if (++b.count == kBatch) launch();
  }
  launch();
}

}  // namespace lockstep::cuda
