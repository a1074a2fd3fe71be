// A consumer of the installed lockstep package: one small GEMM on the CPU, checked exactly, and
// one bad setting, which must throw lockstep::Error. Exits 0 only if every check holds.
#include <cstdio>
#include <cstring>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/tensor.h"

namespace {

constexpr int64_t M = 3, N = 5, K = 40;  // y [M, N] = x [M, K] · w [N, K]ᵀ

// Small integers: bf16 holds them exactly and every fp32 partial sum is an exact integer, so any
// summation order gives the same y (the expected values need no lockstep code).
float x_at(int64_t m, int64_t k) { return float((m * 7 + k * 3) % 11) - 5.0f; }
float w_at(int64_t n, int64_t k) { return float((n * 5 + k) % 9) - 4.0f; }

}  // namespace

int main() {
  using namespace lockstep;
  Tensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K}), y(DType::kF32, {M, N});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x.ptr<bf16>()[m * K + k] = f32_to_bf16(x_at(m, k));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w.ptr<bf16>()[n * K + k] = f32_to_bf16(w_at(n, k));

  GemmConfig cfg;
  cfg.segments = 2;
  cpu::gemm_bf16_nt(x.view(), w.view(), cfg, y.view());

  int failures = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float want = 0.0f;
      for (int64_t k = 0; k < K; ++k) want += x_at(m, k) * w_at(n, k);
      const float got = y.ptr<float>()[m * N + n];
      if (std::memcmp(&got, &want, sizeof(float)) != 0) {
        std::printf("y[%lld, %lld] = %g, expected %g\n", (long long)m, (long long)n, got, want);
        ++failures;
      }
    }
  }

  bool threw = false;
  try {
    GemmConfig bad;
    bad.segments = 3;  // the contract allows 1, 2, 4 or 8
    cpu::gemm_bf16_nt(x.view(), w.view(), bad, y.view());
  } catch (const Error& e) {
    threw = true;
    std::printf("bad setting rejected: %s\n", e.what());
  }
  if (!threw) {
    std::printf("gemm_bf16_nt accepted segments = 3\n");
    ++failures;
  }

  std::printf("%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
