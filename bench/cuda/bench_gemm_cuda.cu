// Throughput of lockstep::cuda::gemm_bf16_nt vs cuBLAS, side by side in one process, on the
// Qwen3-8B layer shapes: y[M,N] = x[M,K] · w[N,K]ᵀ, bf16 in, bf16 out (cuBLAS: cublasGemmEx
// OP_T/OP_N, bf16 -> bf16, CUBLAS_COMPUTE_32F, the same row-major layout, on the baseline engine's
// handle). Each point: 3 warm-up
// calls, then the median of 20 timed calls (one cudaEvent pair around each call; the lockstep
// launcher's host-side checks and tensor-map encoding are inside the timing). Operands: random bf16
// in ±[0.5, 2) (never zeros). Prints a markdown table (and the kernel plan of each shape); writes
// nothing else. Usage: bench_gemm_cuda [--quick] [--fill uniform|normal|ones] [--only SHAPE]
// [--m LIST] (--quick: M in {1, 1024, 4096} only; --fill normal: x ~ N(0, 1) and w ~ N(0, 0.02²),
// the engine's random model and activations, instead of ±[0.5, 2); ones: every element 1, the
// fewest toggling bits: a kernel whose time moves with the data is power-limited; --only: one of
// qkv, o_proj, gate_up, down, lm_head (V = 151936, only by this flag); --m M,M,...: these M in the
// main table, and in the forced table every wgmma plan at S = 1 and 4 at each of them, e.g. the
// training forward's micro-batch sizes). A last table times the large-M kernels the launcher can
// choose from (S = 1, 4, 8; M = 1024 and 4096, --quick included), each forced (test hook), beside
// the automatic choice and cuBLAS (same bits on every path: test_gemm_parity); at S = 1 the
// 128x256, ping-pong and 128x128 tiles.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iterator>
#include <vector>

#include "baseline/cuda/kernels.h"  // baseline::Context: the cuBLAS peer's handle
#include "cuda/cuda_ck.h"           // CK
#include "cuda/gemm/internal.h"     // gemm_bf16_nt_with_plan, gemm_problem (forced-plan table)
#include "cuda/gemm/plan.h"         // GemmPlan, gemm_legal_plans
#include "engine/config.h"          // qwen3_gemm_shapes
#include "engine/default_model.h"   // qwen3_shape_config
#include "lockstep/cuda/gemm.h"

using lockstep::Device;
using lockstep::DType;
using lockstep::GemmConfig;
using lockstep::TensorView;

namespace {

// bf16 values in ±[0.5, 2) from a hash of the index.
__global__ void bench_fill(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    p[i] = uint16_t(0x3f00 + (z & 0xff)) | uint16_t((z >> 8) & 1) << 15;
  }
}

// Approximately N(0, std²) bf16 (the sum of four 16-bit uniforms, as the engine's random model
// draws its weights), or every element 1 (std = 0).
__global__ void bench_fill_normal(uint16_t* p, int64_t n, uint64_t seed, float std) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    const int s = int(z & 0xffff) + int((z >> 16) & 0xffff) + int((z >> 32) & 0xffff) +
                  int((z >> 48) & 0xffff) - 2 * 65535;
    const float v = std == 0.0f ? 1.0f : float(s) * (std * 1.7320508f / 65536.0f);
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  bool quick = false;
  const char* fill = "uniform";
  const char* only = nullptr;
  // --m: these M in the main table, and every wgmma plan forced at them
  std::vector<int64_t> m_list;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--fill") == 0 && i + 1 < argc) {
      fill = argv[++i];
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--m") == 0 && i + 1 < argc) {
      for (const char* q = argv[++i]; *q;) {
        char* end = nullptr;
        const long long m = std::strtoll(q, &end, 10);
        if (end == q || m < 1 || m > 16384 || (*end != ',' && *end != '\0')) {
          std::fprintf(
              stderr,
              "bench_gemm_cuda: --m takes a comma-separated list of M in [1, 16384], got '%s'\n",
              argv[i]);
          return 2;
        }
        m_list.push_back(m);
        q = *end ? end + 1 : end;
      }
    } else {
      std::fprintf(
          stderr,
          "bench_gemm_cuda: unknown or incomplete argument '%s'\nusage: bench_gemm_cuda "
          "[--quick] [--fill uniform|normal|ones] [--only qkv|o_proj|gate_up|down|lm_head] "
          "[--m M,M,...]\n",
          argv[i]);
      return 2;
    }
  }
  if (std::strcmp(fill, "uniform") != 0 && std::strcmp(fill, "normal") != 0 &&
      std::strcmp(fill, "ones") != 0) {
    std::fprintf(stderr, "bench_gemm_cuda: --fill takes uniform, normal or ones, not '%s'\n", fill);
    return 2;
  }
  using Shape = lockstep::engine::GemmShape;
  // The lm_head (V = 151936, the last) only when --only names it: its w alone is 1.2 GB.
  const std::vector<Shape> all_shapes =
      lockstep::engine::qwen3_gemm_shapes(lockstep::engine::qwen3_shape_config("qwen3-8b"), true);
  const size_t n_default = all_shapes.size() - 1;
  std::vector<Shape> shapes;
  for (size_t i = 0; i < all_shapes.size(); ++i)
    if (only ? std::strcmp(only, all_shapes[i].name) == 0 : i < n_default)
      shapes.push_back(all_shapes[i]);
  if (shapes.empty()) {
    std::fprintf(stderr,
                 "bench_gemm_cuda: --only takes qkv, o_proj, gate_up, down or lm_head, "
                 "not '%s'\n",
                 only);
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  CK(cudaDriverGetVersion(&driver));
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("bench_gemm: %s (%d SMs), CUDA driver %d, %s; data: %s\n", prop.name,
              prop.multiProcessorCount, driver, date, fill);

  // As the runtime does (src/cuda/runtime.cu): freed stream-ordered blocks stay in the default
  // pool, so a multi-segment call's workspace is not re-mapped after every synchronization.
  {
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  // cuBLAS as the baseline engine configures it (baseline::Context: a 32 MiB workspace, fp32
  // split-K sums), so the GEMM bars and the engine's ratios share one peer.
  const lockstep::cuda::baseline::Context cublas_ctx;
  cublasHandle_t h = static_cast<cublasHandle_t>(cublas_ctx.cublas());
  std::vector<int64_t> Ms = {1, 8, 64, 256, 1024, 4096, 16384};
  if (quick) Ms = {1, 1024, 4096};
  if (!m_list.empty()) Ms = m_list;
  const int64_t maxM = std::max<int64_t>(4096, *std::max_element(Ms.begin(), Ms.end()));
  int64_t maxNK = 0, maxN = 0, maxK = 0;  // the largest w (N·K), y row, x row
  for (const Shape& s : shapes)
    maxNK = std::max(maxNK, s.n * s.k), maxN = std::max(maxN, s.n), maxK = std::max(maxK, s.k);
  void *dx = nullptr, *dw = nullptr, *dy = nullptr;
  CK(cudaMalloc(&dx, size_t(maxM * maxK) * 2));
  CK(cudaMalloc(&dw, size_t(maxNK) * 2));
  CK(cudaMalloc(&dy, size_t(maxM * maxN) * 2));
  if (std::strcmp(fill, "uniform") == 0) {
    bench_fill<<<4096, 256>>>(static_cast<uint16_t*>(dx), maxM * maxK, 12345);
    bench_fill<<<4096, 256>>>(static_cast<uint16_t*>(dw), maxNK, 67890);
  } else {
    const bool ones = std::strcmp(fill, "ones") == 0;
    bench_fill_normal<<<4096, 256>>>(static_cast<uint16_t*>(dx), maxM * maxK, 12345,
                                     ones ? 0.0f : 1.0f);
    bench_fill_normal<<<4096, 256>>>(static_cast<uint16_t*>(dw), maxNK, 67890, ones ? 0.0f : 0.02f);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int kWarm = 3, kRuns = 20;

  for (const Shape& s : shapes)
    std::printf("plan %s: %s\n", s.name,
                lockstep::cuda::gemm_launch_plan(4096, s.n, s.k, GemmConfig{1}).c_str());
  std::printf(
      "\ny[M,N] = x[M,K] w[N,K]^T, bf16 in, bf16 out; median of %d timed calls after %d "
      "warm-up; ratio = lockstep / cuBLAS throughput\n\n",
      kRuns, kWarm);
  std::printf(
      "| shape | S | M | K | N | lockstep us | lockstep TFLOP/s | cuBLAS us | cuBLAS TFLOP/s | "
      "ratio |\n|---|---|---|---|---|---|---|---|---|---|\n");
  auto time = [&](auto&& f) {
    for (int i = 0; i < kWarm; ++i) f();
    std::vector<float> ms;
    for (int i = 0; i < kRuns; ++i) {
      CK(cudaEventRecord(e0));
      f();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    return median(ms);
  };
  using lockstep::cuda::GemmPlan;
  const GemmPlan* force = nullptr;  // nullptr: the launcher's own plan
  auto row = [&](const Shape& s, int64_t M, int S) {
    TensorView xg = TensorView::contiguous(dx, DType::kBF16, {M, s.k}, Device::kCUDA);
    TensorView wg = TensorView::contiguous(dw, DType::kBF16, {s.n, s.k}, Device::kCUDA);
    TensorView yg = TensorView::contiguous(dy, DType::kBF16, {M, s.n}, Device::kCUDA);
    bool ok = true;
    auto ours = [&] {
      try {
        if (force) {
          lockstep::cuda::detail::gemm_bf16_nt_with_plan(xg, wg, nullptr, GemmConfig{S}, yg,
                                                         *force);
        } else {
          lockstep::cuda::gemm_bf16_nt(xg, wg, nullptr, GemmConfig{S}, yg);
        }
      } catch (const std::exception& e) {
        if (ok) std::printf("lockstep error: %s\n", e.what());
        ok = false;
      }
    };
    const float alpha = 1.0f, beta = 0.0f;
    bool cublas_ok = true;
    auto theirs = [&] {
      const cublasStatus_t st =
          cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(M), int(s.k), &alpha, dw,
                       CUDA_R_16BF, int(s.k), dx, CUDA_R_16BF, int(s.k), &beta, dy, CUDA_R_16BF,
                       int(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) cublas_ok = false;
    };
    const float tl = time(ours), tc = time(theirs);
    CK(cudaGetLastError());
    const double flop = 2.0 * double(M) * double(s.n) * double(s.k);
    const double fl = flop / (tl * 1e-3) / 1e12, fc = flop / (tc * 1e-3) / 1e12;
    std::printf("| %s | %d | %lld | %lld | %lld | %.1f%s | %.1f | %.1f%s | %.1f | %.2f |\n", s.name,
                S, (long long)M, (long long)s.k, (long long)s.n, tl * 1e3, ok ? "" : " (error)", fl,
                tc * 1e3, cublas_ok ? "" : " (error)", fc, fl / fc);
  };
  for (const Shape& s : shapes)
    for (int64_t M : Ms) row(s, M, 1);
  // Segments (the TP-invariant setting S > 1; cuBLAS computes the same product without them).
  // (S = 4 at M = 1024 too: the training forward's micro-batch at the audit contract, where
  // issue 13's row-parallel bar is read.)
  for (const Shape& s : shapes) {
    row(s, 1024, 4);
    for (int S : {2, 4, 8}) row(s, 4096, S);
  }
  if (!quick)
    for (const Shape& s : shapes) row(s, 256, 4);
  // S = 4 / 8: every kernel that takes them, forced, beside the automatic choice.
  std::printf(
      "\nLarge-M kernels, each forced (auto = the launcher's choice; same bits on every path)\n\n"
      "| path | shape | S | M | K | N | lockstep us | lockstep TFLOP/s | cuBLAS us | cuBLAS "
      "TFLOP/s "
      "| ratio |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<int64_t> forced_ms = {1024, 4096, 16384};
  if (!m_list.empty()) forced_ms = m_list;
  for (const Shape& s : shapes) {
    for (int S : {1, 4, 8}) {
      for (int64_t M : forced_ms) {
        if (m_list.empty() && ((quick && M == 16384) || (S > 1 && M > 4096))) continue;
        if (!m_list.empty() && (S == 8 || M < 64)) continue;
        const TensorView xq = TensorView::contiguous(dx, DType::kBF16, {M, s.k}, Device::kCUDA);
        const TensorView wq = TensorView::contiguous(dw, DType::kBF16, {s.n, s.k}, Device::kCUDA);
        const lockstep::cuda::GemmProblem q =
            lockstep::cuda::detail::gemm_problem(xq, wq, GemmConfig{S});
        // auto, then the 128x256 tile, the ping-pong tile, the register trees, the pairs, and at
        // S = 1 the 128x128 tile (the register tree's S = 1 reference).
        std::vector<GemmPlan> plans;
        for (int kind = 0; kind < 5; ++kind) {
          for (const GemmPlan& pl : lockstep::cuda::gemm_legal_plans(q)) {
            if (pl.mainloop != lockstep::cuda::GemmMainloop::kWgmma) continue;
            const bool take = !m_list.empty() ? kind == 0  // --m: every wgmma plan
                              : kind == 0     ? pl.tile.bm == 128 && pl.tile.bn == 256
                              : kind == 1     ? pl.ping_pong
                              : kind == 2 ? S > 1 && pl.fold == lockstep::cuda::GemmFold::kRegisters
                              : kind == 3 ? pl.fold == lockstep::cuda::GemmFold::kPairs
                                          : S == 1 && pl.tile.bm == 128 && pl.tile.bn == 128;
            if (take) plans.push_back(pl);
          }
        }
        const GemmPlan chosen = lockstep::cuda::plan_gemm(q);
        for (int i = -1; i < int(plans.size()); ++i) {
          force = i < 0 ? nullptr : &plans[size_t(i)];
          std::printf("| %s%s ", i < 0 ? "auto: " : "",
                      (i < 0 ? chosen : plans[size_t(i)]).to_string().c_str());
          row(s, M, S);
        }
      }
    }
  }
  force = nullptr;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  return 0;
}
