// Benchmark of the CUDA attention ops on the Qwen3-8B attention shape (Hq = 32, Hkv = 8, D = 128,
// kv_chunk 1024): packed causal prefill (seq 1024 / 4096 / 8192, batch so T ~ 16k tokens) in
// TFLOP/s with causal FLOPs = 2·2·T·avg_ctx·D·Hq (avg_ctx = (L+1)/2), and paged decode (batch 1 /
// 32 / 128, context 1k / 4k / 16k, page size 16) in us, GB/s of K/V read and % of the 4.8 TB/s
// HBM peak. Each time is the mean of the calls after warm-up, measured with CUDA events around
// back-to-back calls (host planning included; metadata: host cu_seqlens / q_seq / q_pos /
// seq_lens, device block table). With `--sdpa FILE` (written by bench/cuda/attention_sdpa.py on the
// same shapes) it prints the ratio to PyTorch SDPA (flash backend).
//   python3 bench/cuda/attention_sdpa.py --out /tmp/sdpa.csv && ./bench_attention --sdpa
//   /tmp/sdpa.csv
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.cuh"  // dalloc, time_ms
#include "cuda/cuda_ck.h"  // CK
#include "lockstep/cuda/attention.h"
#include "lockstep/dtype.h"

using lockstep::AttentionConfig;
using lockstep::Device;
using lockstep::DType;
using lockstep::PagedKv;
using lockstep::TensorView;

namespace {

constexpr int64_t kHq = 32, kHkv = 8, kD = 128;
constexpr double kPeakBytes = 4.8e12;

using bench_util::dalloc;
using bench_util::time_ms;

std::map<std::string, double> read_sdpa(const char* path) {
  std::map<std::string, double> m;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string key, val;
    if (std::getline(ss, key, ',') && std::getline(ss, val, ',')) m[key] = std::atof(val.c_str());
  }
  return m;
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
  const auto sdpa = sdpa_path ? read_sdpa(sdpa_path) : std::map<std::string, double>{};
  AttentionConfig cfg;  // kv_chunk 1024, scale 1/sqrt(D)
  std::printf("%s\n", lockstep::cuda::attention_launch_plan(cfg, kHq, kHkv, kD).c_str());

  std::printf(
      "\nprefill (packed varlen, causal), Hq=%lld Hkv=%lld D=%lld; ratio = lockstep / peer "
      "throughput\n",
      (long long)kHq, (long long)kHkv, (long long)kD);
  std::printf("%8s %6s %7s %6s %10s %9s %12s %12s %9s %9s\n", "seq", "batch", "T", "chunk", "ms",
              "TFLOP/s", "flash TF/s", "cuDNN TF/s", "x flash", "x cuDNN");
  for (int64_t L : {1024, 4096, 8192}) {
    const int64_t B = 16384 / L, T = B * L;
    uint16_t* q = static_cast<uint16_t*>(dalloc(size_t(T * kHq * kD) * 2, 1));
    uint16_t* k = static_cast<uint16_t*>(dalloc(size_t(T * kHkv * kD) * 2, 2));
    uint16_t* v = static_cast<uint16_t*>(dalloc(size_t(T * kHkv * kD) * 2, 3));
    uint16_t* o = nullptr;
    float* lse = nullptr;
    CK(cudaMalloc(&o, size_t(T * kHq * kD) * 2));
    CK(cudaMalloc(&lse, size_t(T * kHq) * 4));
    std::vector<int32_t> cu(static_cast<size_t>(B + 1));
    for (int64_t b = 0; b <= B; ++b) cu[size_t(b)] = int32_t(b * L);
    const double flops = 4.0 * double(T) * (double(L + 1) / 2.0) * kD * kHq;
    auto peer_tf = [&](const char* name) {
      char key[64];
      std::snprintf(key, sizeof key, name, (long long)L);
      const auto it = sdpa.find(key);
      return it == sdpa.end() ? 0.0 : flops / (it->second * 1e-3) / 1e12;
    };
    const double flash = peer_tf("prefill_%lld"), cudnn = peer_tf("prefill_cudnn_%lld");
    // The one-GPU contract's chunk (1024 keys) and the audit contract's (64).
    for (int chunk : {1024, 64}) {
      AttentionConfig c = cfg;
      c.kv_chunk = chunk;
      auto call = [&] {
        lockstep::cuda::attention_prefill_varlen(
            TensorView::contiguous(q, DType::kBF16, {T, kHq, kD}, Device::kCUDA),
            TensorView::contiguous(k, DType::kBF16, {T, kHkv, kD}, Device::kCUDA),
            TensorView::contiguous(v, DType::kBF16, {T, kHkv, kD}, Device::kCUDA),
            TensorView::contiguous(cu.data(), DType::kI32, {B + 1}), c,
            TensorView::contiguous(o, DType::kBF16, {T, kHq, kD}, Device::kCUDA),
            TensorView::contiguous(lse, DType::kF32, {T, kHq}, Device::kCUDA));
      };
      const double ms = time_ms(call, 2, quick ? 3 : 10);
      const double tf = flops / (ms * 1e-3) / 1e12;
      auto cell = [](double peer, double ours, bool ratio) {
        char b[32];
        if (peer <= 0) return std::string("-");
        std::snprintf(b, sizeof b, ratio ? "%.2fx" : "%.1f", ratio ? ours / peer : peer);
        return std::string(b);
      };
      std::printf("%8lld %6lld %7lld %6d %10.3f %9.1f %12s %12s %9s %9s\n", (long long)L,
                  (long long)B, (long long)T, chunk, ms, tf, cell(flash, tf, false).c_str(),
                  cell(cudnn, tf, false).c_str(), cell(flash, tf, true).c_str(),
                  cell(cudnn, tf, true).c_str());
    }
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(o));
    CK(cudaFree(lse));
  }

  std::printf("\ndecode (paged, page 16, one row per sequence), Hq=%lld Hkv=%lld D=%lld\n",
              (long long)kHq, (long long)kHkv, (long long)kD);
  std::printf("%6s %7s %10s %10s %8s %10s\n", "batch", "ctx", "us", "GB/s", "% HBM", "SDPA us");
  const int64_t P = 16;
  for (int64_t batch : {1, 32, 128}) {
    for (int64_t ctx : {1024, 4096, 16384}) {
      const int64_t pages = ctx / P, NP = batch * pages;
      const size_t cache_elems = size_t(NP * P * kHkv * kD);
      uint16_t* kc = static_cast<uint16_t*>(dalloc(cache_elems * 2, 4));
      uint16_t* vc = static_cast<uint16_t*>(dalloc(cache_elems * 2, 5));
      uint16_t* q = static_cast<uint16_t*>(dalloc(size_t(batch * kHq * kD) * 2, 6));
      uint16_t* o = nullptr;
      float* lse = nullptr;
      CK(cudaMalloc(&o, size_t(batch * kHq * kD) * 2));
      CK(cudaMalloc(&lse, size_t(batch * kHq) * 4));
      std::vector<int32_t> table(static_cast<size_t>(NP));
      std::mt19937 rng(7);
      for (int64_t i = 0; i < NP; ++i) table[size_t(i)] = int32_t(i);
      std::shuffle(table.begin(), table.end(), rng);
      int32_t* dtable = nullptr;
      CK(cudaMalloc(&dtable, table.size() * 4));
      CK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
      std::vector<int32_t> seq(static_cast<size_t>(batch)),
          pos(static_cast<size_t>(batch), static_cast<int32_t>(ctx - 1)),
          lens(static_cast<size_t>(batch), static_cast<int32_t>(ctx));
      for (int64_t b = 0; b < batch; ++b) seq[size_t(b)] = int32_t(b);
      PagedKv kv{TensorView::contiguous(kc, DType::kBF16, {NP, P, kHkv, kD}, Device::kCUDA),
                 TensorView::contiguous(vc, DType::kBF16, {NP, P, kHkv, kD}, Device::kCUDA),
                 TensorView::contiguous(dtable, DType::kI32, {batch, pages}, Device::kCUDA),
                 TensorView::contiguous(lens.data(), DType::kI32, {batch})};
      auto call = [&] {
        lockstep::cuda::attention_paged(
            TensorView::contiguous(q, DType::kBF16, {batch, kHq, kD}, Device::kCUDA),
            TensorView::contiguous(seq.data(), DType::kI32, {batch}),
            TensorView::contiguous(pos.data(), DType::kI32, {batch}), kv, cfg,
            TensorView::contiguous(o, DType::kBF16, {batch, kHq, kD}, Device::kCUDA),
            TensorView::contiguous(lse, DType::kF32, {batch, kHq}, Device::kCUDA));
      };
      const double ms = time_ms(call, 3, quick ? 5 : 20);
      const double bytes = double(batch) * double(ctx) * kHkv * kD * 2.0 * 2.0;
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      char key[64];
      std::snprintf(key, sizeof key, "decode_%lld_%lld", (long long)batch, (long long)ctx);
      const auto it = sdpa.find(key);
      char sd[32] = "-";
      if (it != sdpa.end()) std::snprintf(sd, sizeof sd, "%.1f", it->second * 1e3);
      std::printf("%6lld %7lld %10.1f %10.0f %7.1f%% %10s\n", (long long)batch, (long long)ctx,
                  ms * 1e3, gbs, 100.0 * bytes / (ms * 1e-3) / kPeakBytes, sd);
      CK(cudaFree(kc));
      CK(cudaFree(vc));
      CK(cudaFree(q));
      CK(cudaFree(o));
      CK(cudaFree(lse));
      CK(cudaFree(dtable));
    }
  }
  return 0;
}
