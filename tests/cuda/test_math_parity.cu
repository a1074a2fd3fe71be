// GPU parity and throughput for src/core/math.h: every one of the 2^32 inputs of each function
// on the GPU (nvcc -fmad=false) vs the host build (g++ -ffp-contract=off), bitwise; then the
// known-answer hashes of tests/cpu/test_math.cc computed on the GPU, checked against that test's
// constants; then a throughput loop (printed, not checked). Pass/fail counting, the CUDA-device
// check and --quick come from cuda/gpu_harness.h. Not an op-case table program: it runs its own
// kernels over all 2^32 bit patterns.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/math.h"
#include "cuda/gpu_harness.h"

void cpu_eval(int fn, uint32_t start, uint64_t n, float* out);

__device__ float eval(int fn, float x) {
  switch (fn) {
    case 0:
      return lockstep::ls_exp2f(x);
    case 1:
      return lockstep::ls_expf(x);
    case 2:
      return lockstep::ls_log2f(x);
    case 3:
      return lockstep::ls_logf(x);
    default:
      return lockstep::ls_ex2_sfu(x);  // the SFU's instruction vs the host's tables (§P.11)
  }
}

__global__ void eval_kernel(int fn, uint32_t start, uint64_t n, float* out) {
  uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = eval(fn, lockstep::f32_from_bits(uint32_t(start + i)));
}

// Throughput: each thread chains `iters` calls on values in the softmax range.
template <int kFn>
__global__ void tput_kernel(float* out, int iters) {
  float x = -1.0f - (threadIdx.x & 255) * 0.01f;
  float acc = 0.0f;
  for (int j = 0; j < iters; ++j) {
    float v;
    if (kFn == 0)
      v = lockstep::ls_exp2f(x);
    else if (kFn == 1)
      v = lockstep::ls_expf(x);
    else if (kFn == 2)
      v = lockstep::ls_log2f(-x);
    else if (kFn == 3)
      v = lockstep::ls_logf(-x);
    else if (kFn == 4)
      v = exp2f(x);  // CUDA libdevice (not bitwise-portable), for comparison
    else {
      float r;
      asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
      v = r;
    }
    acc += v;
    x -= 0.001f;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

constexpr int kFns = 5;  // checked functions (eval's cases)
static const char* kNames[] = {"ls_exp2f", "ls_expf", "ls_log2f", "ls_logf", "ls_ex2_sfu"};
static const char* kTputNames[] = {"ls_exp2f", "ls_expf",      "ls_log2f",
                                   "ls_logf",  "exp2f (CUDA)", "ex2.approx.ftz"};

template <int kFn>
static double tput(float* d_out, int blocks, int threads, int iters) {
  tput_kernel<kFn><<<blocks, threads>>>(d_out, iters);
  cudaDeviceSynchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  tput_kernel<kFn><<<blocks, threads>>>(d_out, iters);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  double evals = double(blocks) * threads * iters;
  printf("%-16s %8.1f Geval/s\n", kTputNames[kFn], evals / (ms * 1e-3) / 1e9);
  return ms;
}

// --quick (for compute-sanitizer): the first 2^20 inputs of each function only, no hashes or
// throughput.
int main(int argc, char** argv) {
  namespace gt = lockstep::gpu_test;
  if (!gt::start("test_math_parity", argc, argv)) return 2;
  const bool quick = gt::g_quick;
  const uint64_t chunk = quick ? (1ull << 20) : (1ull << 28);
  const uint64_t range = quick ? chunk : (1ull << 32);
  float* d_out;
  CK(cudaMalloc(&d_out, chunk * 4));
  std::vector<float> gpu(chunk), cpu(chunk);
  for (int fn = 0; fn < kFns; ++fn) {
    uint64_t mismatches = 0;
    uint32_t first = 0;
    double t_gpu = 0, t_cpu = 0;
    for (uint64_t start = 0; start < range; start += chunk) {
      auto t0 = std::chrono::steady_clock::now();
      eval_kernel<<<unsigned((chunk + 255) / 256), 256>>>(fn, uint32_t(start), chunk, d_out);
      CK(cudaGetLastError());
      CK(cudaMemcpy(gpu.data(), d_out, chunk * 4, cudaMemcpyDeviceToHost));
      auto t1 = std::chrono::steady_clock::now();
      cpu_eval(fn, uint32_t(start), chunk, cpu.data());
      auto t2 = std::chrono::steady_clock::now();
      t_gpu += std::chrono::duration<double>(t1 - t0).count();
      t_cpu += std::chrono::duration<double>(t2 - t1).count();
      if (std::memcmp(gpu.data(), cpu.data(), chunk * 4) != 0) {
        for (uint64_t i = 0; i < chunk; ++i) {
          uint32_t g, c;
          std::memcpy(&g, &gpu[i], 4);
          std::memcpy(&c, &cpu[i], 4);
          if (g != c) {
            if (!mismatches) first = uint32_t(start + i);
            ++mismatches;
          }
        }
      }
    }
    printf("%-9s %s inputs: %llu GPU/CPU mismatches (first at 0x%08x)  [gpu %.1fs cpu %.1fs]\n",
           kNames[fn], quick ? "first 2^20" : "all 2^32", (unsigned long long)mismatches, first,
           t_gpu, t_cpu);
    gt::report(mismatches == 0, std::string(kNames[fn]) + " GPU == CPU on " +
                                    (quick ? "the first 2^20 inputs" : "all 2^32 inputs"));
  }
  if (quick) {
    CK(cudaFree(d_out));
    return gt::finish("test_math_parity");
  }
  // Known-answer hashes (same definition and constants as tests/cpu/test_math.cc
  // MathDeterminism.KnownAnswerHashes), from GPU results.
  const uint64_t kKnown[kFns] = {0xb960360cdc14150full, 0xef78e5ab32f60be8ull,
                                 0x8f78bd01fa00dfadull, 0x7265d326f1d6d11aull,
                                 0x199e01a2edfedab4ull};
  for (int fn = 0; fn < kFns; ++fn) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t start = 0; start < (1ull << 32); start += chunk) {
      eval_kernel<<<unsigned((chunk + 255) / 256), 256>>>(fn, uint32_t(start), chunk, d_out);
      CK(cudaMemcpy(gpu.data(), d_out, chunk * 4, cudaMemcpyDeviceToHost));
      for (uint64_t i = (4099 - start % 4099) % 4099; i < chunk; i += 4099) {
        uint32_t y;
        std::memcpy(&y, &gpu[i], 4);
        for (int k = 0; k < 4; ++k) h = (h ^ ((y >> (8 * k)) & 0xff)) * 0x100000001b3ull;
      }
    }
    printf("%-9s known-answer hash (GPU) 0x%016llx\n", kNames[fn], (unsigned long long)h);
    gt::report(h == kKnown[fn], std::string(kNames[fn]) + " known-answer hash");
  }
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int blocks = sms * 16, threads = 256, iters = 4096;
  tput<0>(d_out, blocks, threads, iters);
  tput<1>(d_out, blocks, threads, iters);
  tput<2>(d_out, blocks, threads, iters);
  tput<3>(d_out, blocks, threads, iters);
  tput<4>(d_out, blocks, threads, iters);
  tput<5>(d_out, blocks, threads, iters);
  CK(cudaFree(d_out));
  return gt::finish("test_math_parity");
}
