// The elementwise ops of a Qwen3-8B layer on the GPU (docs/contract.md §E), at the decode step's
// row count (T = 128) and a training micro-batch's (T = 1024), with the engine's layouts: the
// fused residual RMSNorm over [T, 4096], the per-head q norm over the q columns of the fused qkv
// buffer ([T, 32, 128] rows 6144 apart), RoPE on those q columns, SiLU-and-mul over the halves of
// the fused gate|up buffer. Each beside a device-to-device copy of the bytes it must move (its
// floor: every input read once, every output written once), median of 5 timings of 20 calls:
//   ./build-gpu/bench_elementwise
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench_util.cuh"  // dalloc
#include "cuda/cuda_ck.h"  // CK
#include "lockstep/cuda/elementwise.h"
#include "lockstep/dtype.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"

using lockstep::Device;
using lockstep::DType;
using lockstep::TensorView;

namespace {

constexpr int64_t kH = 4096, kI = 12288, kHq = 32, kHkv = 8, kD = 128;

uint16_t* dalloc(size_t elems, uint32_t seed) {
  return static_cast<uint16_t*>(bench_util::dalloc(elems * 2, seed));
}

template <typename F>
double median_us(F f) {
  std::vector<double> t;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int w = 0; w < 3; ++w) f();
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < 20; ++i) f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(double(ms) * 1e3 / 20);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

TensorView view(void* p, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> st,
                DType dt = DType::kBF16) {
  TensorView v;
  v.data = p;
  v.dtype = dt;
  v.device = Device::kCUDA;
  v.ndim = int(shape.size());
  int d = 0;
  for (int64_t s : shape) v.shape[d++] = s;
  d = 0;
  for (int64_t s : st) v.stride[d++] = s;
  return v;
}

void row(const char* op, int64_t T, double us, double bytes, void* scratch) {
  // The floor: the same bytes through a device-to-device copy (reads and writes bytes / 2 each).
  const size_t half = size_t(bytes / 2) & ~size_t(15);
  void* dst = static_cast<char*>(scratch) + (size_t(1) << 29);
  const double cu = median_us([&] { CK(cudaMemcpyAsync(dst, scratch, half, cudaMemcpyDefault)); });
  std::printf("%-34s %6lld %10.2f %10.0f %12.2f %10.2f\n", op, (long long)T, us, bytes / us / 1e3,
              cu, us / cu);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::fprintf(stderr, "bench_elementwise: no CUDA device\n");
    return 2;
  }
  std::printf("bench_elementwise: %s; Qwen3-8B layer shapes; median of 5 x 20 calls\n", prop.name);
  std::printf("%-34s %6s %10s %10s %12s %10s\n", "op", "T", "us", "GB/s", "copy us", "x copy");
  void* scratch = nullptr;
  CK(cudaMalloc(&scratch, size_t(1) << 30));
  lockstep::RmsNormConfig norm;
  norm.eps = 1e-6f;
  const int64_t qkv_w = (kHq + 2 * kHkv) * kD;
  for (int64_t T : {int64_t(128), int64_t(1024)}) {
    uint16_t* x = dalloc(size_t(T * kH), 1);
    uint16_t* res = dalloc(size_t(T * kH), 2);
    uint16_t* y = dalloc(size_t(T * kH), 3);
    uint16_t* w = dalloc(size_t(kH), 4);
    uint16_t* qkv = dalloc(size_t(T * qkv_w), 5);
    uint16_t* gu = dalloc(size_t(T * 2 * kI), 6);
    uint16_t* act = dalloc(size_t(T * kI), 7);
    const double b = 2.0;
    // residual_out = residual (in place), y = a separate buffer: the engine's call.
    row("rmsnorm_residual [T, 4096]", T, median_us([&] {
          lockstep::cuda::rmsnorm_residual(view(x, {T, kH}, {kH, 1}), view(res, {T, kH}, {kH, 1}),
                                           view(w, {kH}, {1}), norm, view(res, {T, kH}, {kH, 1}),
                                           view(y, {T, kH}, {kH, 1}));
        }),
        b * double(T * kH) * 4, scratch);
    row("rmsnorm q [T, 32, 128] of qkv", T, median_us([&] {
          lockstep::cuda::rmsnorm(view(qkv, {T, kHq, kD}, {qkv_w, kD, 1}), view(w, {kD}, {1}), norm,
                                  view(qkv, {T, kHq, kD}, {qkv_w, kD, 1}));
        }),
        b * double(T * kHq * kD) * 2, scratch);
    row("silu_mul [T, 12288] of gate|up", T, median_us([&] {
          lockstep::cuda::silu_mul(view(gu, {T, kI}, {2 * kI, 1}),
                                   view(gu + kI, {T, kI}, {2 * kI, 1}),
                                   view(act, {T, kI}, {kI, 1}));
        }),
        b * double(T * kI) * 3, scratch);
    // RoPE on the q columns (positions 0 .. T-1; a zero-filled table: the bits do not matter here).
    int32_t* pos = nullptr;
    float* tab = nullptr;
    std::vector<int32_t> hp(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) hp[size_t(t)] = int32_t(t);
    CK(cudaMalloc(&pos, size_t(T) * 4));
    CK(cudaMemcpy(pos, hp.data(), size_t(T) * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&tab, size_t(2 * T * kD / 2) * 4));
    CK(cudaMemset(tab, 0, size_t(2 * T * kD / 2) * 4));
    row("rope q [T, 32, 128] of qkv", T, median_us([&] {
          lockstep::cuda::rope(view(qkv, {T, kHq, kD}, {qkv_w, kD, 1}),
                               view(pos, {T}, {1}, DType::kI32),
                               view(tab, {T, kD / 2}, {kD / 2, 1}, DType::kF32),
                               view(tab + T * kD / 2, {T, kD / 2}, {kD / 2, 1}, DType::kF32),
                               view(qkv, {T, kHq, kD}, {qkv_w, kD, 1}));
        }),
        b * double(T * kHq * kD) * 2, scratch);
    CK(cudaDeviceSynchronize());
    CK(cudaFree(pos));
    CK(cudaFree(tab));
    for (uint16_t* p : {x, res, y, w, qkv, gu, act}) CK(cudaFree(p));
  }
  CK(cudaFree(scratch));
  return 0;
}
