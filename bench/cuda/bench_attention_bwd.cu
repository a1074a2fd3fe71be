// Benchmark of the CUDA attention backward (docs/contract.md §B.9) with its forward on the issue's
// training shape: packed causal, B = 4 sequences of S = 4096, Hq = 32, Hkv = 8, D = 128, bf16.
// Prints ms and TFLOP/s of the forward (cuda::attention_prefill_varlen), the backward
// (cuda::attention_backward_varlen, δ included) and forward + backward. FLOPs: the forward's
// causal 2·2·T·avg_ctx·D·Hq (avg_ctx = (S+1)/2), the backward counted as 2.5x the forward (as the
// issue does). Times are the mean of back-to-back calls between CUDA events after warm-up (host
// planning included). It also checks that two backward runs give identical dq / dk / dv bytes.
// With `--sdpa FILE` (written by bench/cuda/attention_bwd_sdpa.py on the same shape) it prints the
// ratio to PyTorch SDPA forward + backward (cuDNN and flash backends).
//   python3 bench/cuda/attention_bwd_sdpa.py --out /tmp/sdpa_bwd.csv
//   ./build-gpu/bench_attention_bwd --sdpa /tmp/sdpa_bwd.csv
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.cuh"  // dalloc, time_ms
#include "cuda/cuda_ck.h"  // CK
#include "lockstep/contract/attention.h"
#include "lockstep/cuda/attention.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/dtype.h"

using lockstep::AttentionConfig;
using lockstep::Device;
using lockstep::DType;
using lockstep::PackedSeqs;
using lockstep::TensorView;

namespace {

constexpr int64_t kB = 4, kS = 4096, kHq = 32, kHkv = 8, kD = 128;

using bench_util::dalloc;
using bench_util::time_ms;

std::map<std::string, std::string> read_sdpa(const char* path) {
  std::map<std::string, std::string> m;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string key, val;
    if (std::getline(ss, key, ',') && std::getline(ss, val)) m[key] = val;
  }
  return m;
}

std::vector<uint8_t> host_copy(const float* p, size_t n) {
  std::vector<uint8_t> h(n * 4);
  CK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const char* sdpa_path = nullptr;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--sdpa") == 0 && i + 1 < argc) sdpa_path = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  AttentionConfig cfg;  // scale 1/sqrt(D)
  const int64_t T = kB * kS;
  uint16_t* q = static_cast<uint16_t*>(dalloc(size_t(T * kHq * kD) * 2, 1));
  uint16_t* k = static_cast<uint16_t*>(dalloc(size_t(T * kHkv * kD) * 2, 2));
  uint16_t* v = static_cast<uint16_t*>(dalloc(size_t(T * kHkv * kD) * 2, 3));
  uint16_t* dout = static_cast<uint16_t*>(dalloc(size_t(T * kHq * kD) * 2, 4));
  uint16_t* o = nullptr;
  float *lse = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  CK(cudaMalloc(&o, size_t(T * kHq * kD) * 2));
  CK(cudaMalloc(&lse, size_t(T * kHq) * 4));
  CK(cudaMalloc(&dq, size_t(T * kHq * kD) * 4));
  CK(cudaMalloc(&dk, size_t(T * kHkv * kD) * 4));
  CK(cudaMalloc(&dv, size_t(T * kHkv * kD) * 4));
  std::vector<int32_t> cu(size_t(kB + 1));
  for (int64_t b = 0; b <= kB; ++b) cu[size_t(b)] = int32_t(b * kS);
  const TensorView cu_v = TensorView::contiguous(cu.data(), DType::kI32, {kB + 1});
  const PackedSeqs seqs = PackedSeqs::validate("bench_attention_bwd", cu_v, T);
  const TensorView qv = TensorView::contiguous(q, DType::kBF16, {T, kHq, kD}, Device::kCUDA);
  const TensorView kv = TensorView::contiguous(k, DType::kBF16, {T, kHkv, kD}, Device::kCUDA);
  const TensorView vv = TensorView::contiguous(v, DType::kBF16, {T, kHkv, kD}, Device::kCUDA);
  const TensorView ov = TensorView::contiguous(o, DType::kBF16, {T, kHq, kD}, Device::kCUDA);
  const TensorView lv = TensorView::contiguous(lse, DType::kF32, {T, kHq}, Device::kCUDA);
  const TensorView dov = TensorView::contiguous(dout, DType::kBF16, {T, kHq, kD}, Device::kCUDA);
  const TensorView dqv = TensorView::contiguous(dq, DType::kF32, {T, kHq, kD}, Device::kCUDA);
  const TensorView dkv = TensorView::contiguous(dk, DType::kF32, {T, kHkv, kD}, Device::kCUDA);
  const TensorView dvv = TensorView::contiguous(dv, DType::kF32, {T, kHkv, kD}, Device::kCUDA);
  auto fwd = [&] { lockstep::cuda::attention_prefill_varlen(qv, kv, vv, seqs, cfg, ov, lv); };
  auto bwd = [&] {
    lockstep::cuda::attention_backward_varlen(qv, kv, vv, ov, lv, dov, seqs, cfg, dqv, dkv, dvv);
  };

  // Determinism: two backward runs, byte for byte.
  fwd();
  bwd();
  CK(cudaDeviceSynchronize());
  const auto dq1 = host_copy(dq, size_t(T * kHq * kD)), dk1 = host_copy(dk, size_t(T * kHkv * kD)),
             dv1 = host_copy(dv, size_t(T * kHkv * kD));
  CK(cudaMemset(dq, 0, size_t(T * kHq * kD) * 4));
  CK(cudaMemset(dk, 0, size_t(T * kHkv * kD) * 4));
  CK(cudaMemset(dv, 0, size_t(T * kHkv * kD) * 4));
  bwd();
  CK(cudaDeviceSynchronize());
  const bool same = host_copy(dq, size_t(T * kHq * kD)) == dq1 &&
                    host_copy(dk, size_t(T * kHkv * kD)) == dk1 &&
                    host_copy(dv, size_t(T * kHkv * kD)) == dv1;

  const int iters = quick ? 3 : 10;
  const double ms_f = time_ms(fwd, 2, iters);
  const double ms_b = time_ms(bwd, 2, iters);
  const double ms_fb = time_ms(
      [&] {
        fwd();
        bwd();
      },
      2, iters);
  const double flops_f = 4.0 * double(T) * (double(kS + 1) / 2.0) * kD * kHq;
  const double flops_b = 2.5 * flops_f;
  auto tf = [](double flops, double ms) { return flops / (ms * 1e-3) / 1e12; };

  std::printf(
      "attention forward + backward (packed varlen, causal), B=%lld S=%lld Hq=%lld Hkv=%lld "
      "D=%lld bf16\n",
      (long long)kB, (long long)kS, (long long)kHq, (long long)kHkv, (long long)kD);
  std::printf("%-22s %10s %10s\n", "", "ms", "TFLOP/s");
  std::printf("%-22s %10.3f %10.1f\n", "lockstep forward", ms_f, tf(flops_f, ms_f));
  std::printf("%-22s %10.3f %10.1f\n", "lockstep backward", ms_b, tf(flops_b, ms_b));
  std::printf("%-22s %10.3f %10.1f\n", "lockstep fwd+bwd", ms_fb, tf(flops_f + flops_b, ms_fb));
  std::printf("lockstep dq/dk/dv identical run to run: %s\n", same ? "yes" : "NO");
  if (sdpa_path) {
    const auto sdpa = read_sdpa(sdpa_path);
    for (const char* be : {"cudnn", "flash"}) {
      const auto it = sdpa.find(std::string("fwdbwd_") + be);
      if (it == sdpa.end()) {
        std::printf("SDPA %-17s %10s\n", be, "-");
        continue;
      }
      const double ms = std::atof(it->second.c_str());
      const double t = tf(flops_f + flops_b, ms);
      std::printf("SDPA %-17s %10.3f %10.1f   lockstep / SDPA throughput %.2fx\n", be, ms, t,
                  tf(flops_f + flops_b, ms_fb) / t);
    }
  }
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                  static_cast<void*>(dout), static_cast<void*>(o), static_cast<void*>(lse),
                  static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv)})
    CK(cudaFree(p));
  return same ? 0 : 1;
}
