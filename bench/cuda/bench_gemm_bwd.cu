// Throughput of the CUDA GEMM backward (lockstep::cuda::gemm_bf16_dx / gemm_bf16_dw,
// docs/contract.md §B.3) vs cuBLAS, side by side in one process, on the Qwen3-8B layer shapes
// (forward y = x·wᵀ, x [T, K], w [N, K]):
//   dX  dx[T, K] = dy[T, N] · w[N, K], bf16 in, f32 or bf16 out, one segment (a row-parallel
//       layer's setting; cuBLAS: cublasGemmEx OP_N/OP_N, CUBLAS_COMPUTE_32F). lockstep reads w
//       in place (the nn layout).
//   dW  dw[N, K] += dy[T, N]ᵀ · x[T, K], bf16 in, f32 accumulated in place (cuBLAS: OP_N/OP_T,
//       beta = 1, CUBLAS_COMPUTE_32F). lockstep's time includes the host token-slot table, its
//       upload; sequences of 1024 (no padding slots) read dy and x in place in one run, sequences
//       of 1000 (8 padding slots each) take the blocked form (full blocks in place, each
//       sequence's last block gathered), and again with the blocked form off (every row gathered:
//       "gathered (forced)", not a bar). One micro-batch.
// Each point: 2 warm-up calls, then the median of 10 timed calls (one cudaEvent pair around each
// call, host-side checks inside). Operands: random bf16 in ±[0.5, 2)·2^-6 (dw stays finite).
// Prints a markdown table; writes nothing else. Usage: bench_gemm_bwd [--quick] (--quick:
// T = 4096 only).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <vector>

#include "baseline/cuda/kernels.h"  // baseline::Context: the cuBLAS peer's handle
#include "cuda/cuda_ck.h"           // CK
#include "cuda/gemm/internal.h"     // gemm_bf16_tn_accumulate (the TN plans table)
#include "cuda/gemm/plan.h"
#include "engine/config.h"         // qwen3_gemm_shapes
#include "engine/default_model.h"  // qwen3_shape_config
#include "lockstep/contract/backward.h"
#include "lockstep/cuda/backward.h"

using lockstep::Device;
using lockstep::DType;
using lockstep::GemmConfig;
using lockstep::TensorView;
using lockstep::TokenOrder;

namespace {

// bf16 values in ±[0.5, 2) · 2^-6 from a hash of the index.
__global__ void bench_fill(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    p[i] = uint16_t(0x3c80 + (z & 0xff)) | uint16_t((z >> 8) & 1) << 15;
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
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") != 0) {
      std::fprintf(stderr,
                   "bench_gemm_bwd: unknown argument '%s'\nusage: bench_gemm_bwd [--quick]\n",
                   argv[i]);
      return 2;
    }
    quick = true;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  CK(cudaDriverGetVersion(&driver));
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("bench_gemm_bwd: %s (%d SMs), CUDA driver %d, %s\n", prop.name,
              prop.multiProcessorCount, driver, date);
  // As the runtime does: freed stream-ordered blocks stay in the default pool (the workspace of
  // the transposes and gathers is not re-mapped after every synchronization).
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
  using Shape = lockstep::engine::GemmShape;
  const std::vector<Shape> shapes =
      lockstep::engine::qwen3_gemm_shapes(lockstep::engine::qwen3_shape_config("qwen3-8b"));
  std::vector<int64_t> Ts = {1024, 4096, 16384};
  if (quick) Ts = {4096};
  int64_t maxNK = 0, maxN = 0, maxK = 0;  // the largest w / dw (N·K), dy row, x row
  for (const Shape& s : shapes)
    maxNK = std::max(maxNK, s.n * s.k), maxN = std::max(maxN, s.n), maxK = std::max(maxK, s.k);
  const int64_t maxT = Ts.back();
  void *x = nullptr, *w = nullptr, *dy = nullptr, *dx = nullptr, *dw = nullptr;
  CK(cudaMalloc(&x, size_t(maxT * maxK) * 2));
  CK(cudaMalloc(&w, size_t(maxNK) * 2));
  CK(cudaMalloc(&dy, size_t(maxT * maxN) * 2));
  CK(cudaMalloc(&dx, size_t(maxT * maxK) * 4));
  CK(cudaMalloc(&dw, size_t(maxNK) * 4));
  bench_fill<<<4096, 256>>>(static_cast<uint16_t*>(x), maxT * maxK, 12345);
  bench_fill<<<4096, 256>>>(static_cast<uint16_t*>(w), maxNK, 67890);
  bench_fill<<<4096, 256>>>(static_cast<uint16_t*>(dy), maxT * maxN, 13579);
  CK(cudaMemset(dw, 0, size_t(maxNK) * 4));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int kWarm = 2, kRuns = 10;
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

  std::printf(
      "\nGEMM backward, median of %d timed calls after %d warm-up; ratio = lockstep / cuBLAS "
      "throughput (lockstep includes its transposes / gathers)\n\n",
      kRuns, kWarm);
  std::printf(
      "| op | shape | T | N | K | out | lockstep ms | lockstep TFLOP/s | cuBLAS ms | cuBLAS "
      "TFLOP/s | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  auto report = [&](const char* op, const Shape& s, int64_t T, const char* out, float tl, bool ok,
                    float tc, bool cok) {
    const double flop = 2.0 * double(T) * double(s.n) * double(s.k);
    const double fl = flop / (tl * 1e-3) / 1e12, fc = flop / (tc * 1e-3) / 1e12;
    std::printf("| %s | %s | %lld | %lld | %lld | %s | %.3f%s | %.1f | %.3f%s | %.1f | %.2f |\n",
                op, s.name, (long long)T, (long long)s.n, (long long)s.k, out, tl,
                ok ? "" : " (error)", fl, tc, cok ? "" : " (error)", fc, fl / fc);
  };
  for (const Shape& s : shapes) {
    for (int64_t T : Ts) {
      const TensorView dyv = TensorView::contiguous(dy, DType::kBF16, {T, s.n}, Device::kCUDA);
      const TensorView wv = TensorView::contiguous(w, DType::kBF16, {s.n, s.k}, Device::kCUDA);
      const TensorView xv = TensorView::contiguous(x, DType::kBF16, {T, s.k}, Device::kCUDA);
      // dX, f32 and bf16 out.
      for (DType dt : {DType::kF32, DType::kBF16}) {
        const TensorView dxv = TensorView::contiguous(dx, dt, {T, s.k}, Device::kCUDA);
        bool ok = true, cok = true;
        auto ours = [&] {
          try {
            lockstep::cuda::gemm_bf16_dx(dyv, wv, GemmConfig{1}, dxv);
          } catch (const std::exception& e) {
            if (ok) std::printf("lockstep error: %s\n", e.what());
            ok = false;
          }
        };
        const float alpha = 1.0f, beta = 0.0f;
        const cudaDataType_t ct = dt == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
        auto theirs = [&] {
          // Column-major: dxᵀ [K, T] = wᵀ [K, N] · dyᵀ [N, T].
          const cublasStatus_t st =
              cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(s.k), int(T), int(s.n), &alpha, w,
                           CUDA_R_16BF, int(s.k), dy, CUDA_R_16BF, int(s.n), &beta, dx, ct,
                           int(s.k), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          if (st != CUBLAS_STATUS_SUCCESS) cok = false;
        };
        const float tl = time(ours), tc = time(theirs);
        CK(cudaGetLastError());
        report("dX", s, T, dt == DType::kF32 ? "f32" : "bf16", tl, ok, tc, cok);
      }
      // dW (f32, accumulated): sequences of 1024 tokens in one micro-batch (the token slots are
      // consecutive rows: dy and x read in place), then sequences of 1000 (8 padding slots each:
      // the blocked form), then the same with the blocked form off (rows gathered; a forced path,
      // kept out of the bars: which of the two the op should take).
      for (const int64_t len : {int64_t(1024), int64_t(1000), int64_t(-1000)}) {
        const bool gathered = len < 0;
        const int64_t seq_len = gathered ? -len : len;
        std::vector<int64_t> cu;
        for (int64_t r = 0; r < T; r += seq_len) cu.push_back(r);
        cu.push_back(T);
        const TokenOrder order = TokenOrder::packed(cu, 0);
        const TensorView dwv = TensorView::contiguous(dw, DType::kF32, {s.n, s.k}, Device::kCUDA);
        bool ok = true, cok = true;
        auto ours = [&] {
          try {
            if (gathered) {
              lockstep::cuda::detail::gemm_bf16_dw_gathered(dyv, xv, order, dwv);
            } else {
              lockstep::cuda::gemm_bf16_dw(dyv, xv, order, dwv);
            }
          } catch (const std::exception& e) {
            if (ok) std::printf("lockstep error: %s\n", e.what());
            ok = false;
          }
        };
        const float alpha = 1.0f, beta = 1.0f;
        auto theirs = [&] {
          // Column-major: dwᵀ [K, N] += xᵀ [K, T] · dy [T, N].
          const cublasStatus_t st =
              cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, int(s.k), int(s.n), int(T), &alpha, x,
                           CUDA_R_16BF, int(s.k), dy, CUDA_R_16BF, int(s.n), &beta, dw, CUDA_R_32F,
                           int(s.k), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          if (st != CUBLAS_STATUS_SUCCESS) cok = false;
        };
        const float tl = time(ours), tc = time(theirs);
        CK(cudaGetLastError());
        report("dW", s, T,
               len == 1024 ? "f32 +=, in place"
               : gathered  ? "f32 +=, gathered (forced)"
                           : "f32 +=, blocked",
               tl, ok, tc, cok);
      }
    }
  }
  // The TN layout's plans, each forced (detail::gemm_bf16_tn_accumulate on dy and x in place, all
  // T tokens in one launch): which tile the planner should pick (speed only: same bits).
  std::printf(
      "\nTN (dW) plans forced, one launch over all T tokens in place: lockstep TFLOP/s per plan "
      "(planner's choice marked *)\n\n| shape | T |");
  const lockstep::cuda::GemmProblem q0 = lockstep::cuda::detail::gemm_tn_problem(
      static_cast<const uint16_t*>(dy), 8, static_cast<const uint16_t*>(x), 8, 8, 8, 16);
  const std::vector<lockstep::cuda::GemmPlan> tn_plans = lockstep::cuda::gemm_legal_plans(q0);
  for (const auto& pl : tn_plans)
    std::printf(" %s%s |", pl.tile.to_string().c_str(), pl.ping_pong ? " pp" : "");
  std::printf("\n|---|---|");
  for (size_t i = 0; i < tn_plans.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const Shape& s : shapes) {
    for (const int64_t T : quick ? std::vector<int64_t>{4096}
                                 : std::vector<int64_t>{1024, 2048, 4096, 8192, 12288, 16384}) {
      const auto* dyp = static_cast<const uint16_t*>(dy);
      const auto* xp = static_cast<const uint16_t*>(x);
      const lockstep::cuda::GemmProblem q =
          lockstep::cuda::detail::gemm_tn_problem(dyp, s.n, xp, s.k, s.n, s.k, T);
      const lockstep::cuda::GemmPlan chosen = lockstep::cuda::plan_gemm(q);
      std::printf("| %s | %lld |", s.name, (long long)T);
      for (const auto& pl : tn_plans) {
        bool ok = true;
        const float t = time([&] {
          try {
            lockstep::cuda::detail::gemm_bf16_tn_accumulate(dyp, s.n, xp, s.k, s.n, s.k, T,
                                                            static_cast<float*>(dw), s.k, &pl);
          } catch (const std::exception& e) {
            if (ok) std::printf(" error: %s", e.what());
            ok = false;
          }
        });
        const double tf = 2.0 * double(T) * double(s.n) * double(s.k) / (t * 1e-3) / 1e12;
        std::printf(" %.1f%s |", tf, pl == chosen ? "*" : "");
      }
      std::printf("\n");
    }
  }
  CK(cudaGetLastError());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(x);
  cudaFree(w);
  cudaFree(dy);
  cudaFree(dx);
  cudaFree(dw);
  return 0;
}
