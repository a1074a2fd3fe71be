// Benchmark of AdamW on the GPU (engine::CudaAdamW, engine/cuda/optim.h) over a Qwen3 shape's
// tensor list (default: Qwen3-0.6B's, all layers; `--layers N` cuts it): the mean time of a full
// step (the canonical norm's chunk chains, their read-back, the host's combination, the update)
// and of its two device parts alone, beside the HBM floor of the update — every parameter's
// gradient, master, m and v read (16 bytes) and master, m, v and bf16 weight written (14 bytes):
// 30 bytes per parameter; the norm reads the gradient once more (4 bytes). The floor is given at
// the bandwidth of a device-to-device cudaMemcpy measured here and at `--peak-gbs` (H200: 4800).
// `--check` then takes one step on the CPU engine::AdamW from the same state and gradients and
// compares the whole state and the bf16 weights bitwise (a full-size parity check; slow).
//   ./bench_optim [--shape qwen3-0.6b] [--layers N] [--iters 20] [--peak-gbs 4800] [--check]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"
#include "engine/config.h"
#include "engine/cuda/optim.h"
#include "engine/default_model.h"
#include "engine/optim.h"
#include "lockstep/cuda/optim.h"
#include "lockstep/cuda/runtime.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A cheap deterministic fill (the optimizer's speed does not depend on the values).
uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return uint32_t(x);
}
float value(uint64_t i, uint64_t salt, float scale) {
  return (float(mix(i * 0x9e3779b97f4a7c15ull + salt) >> 8) * (1.0f / 16777216.0f) - 0.5f) * scale;
}

// Bytes per second of a device-to-device copy (read + write), the practical HBM ceiling.
double copy_gbs() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int reps = 10;
  CK(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i) CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * double(bytes) * reps / (double(ms) * 1e-3) / 1e9;
}

bool same(const Weights& a, const Weights& b, const char* what) {
  bool ok = a.size() == b.size();
  for (size_t k = 0; ok && k < a.size(); ++k) {
    ok = a[k].first == b[k].first && a[k].second.nbytes() == b[k].second.nbytes() &&
         std::memcmp(a[k].second.data(), b[k].second.data(), size_t(a[k].second.nbytes())) == 0;
    if (!ok) std::printf("  %s: '%s' differs\n", what, a[k].first.c_str());
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen3-0.6b";
  int layers = -1, iters = 20;
  double peak_gbs = 4800;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_optim: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--shape") {
      shape = next();
    } else if (a == "--layers") {
      layers = std::atoi(next().c_str());
    } else if (a == "--iters") {
      iters = std::atoi(next().c_str());
    } else if (a == "--peak-gbs") {
      peak_gbs = std::atof(next().c_str());
    } else if (a == "--check") {
      check = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_optim [--shape qwen3-0.6b|qwen3-8b|default] [--layers N] "
                   "[--iters N] [--peak-gbs GBS] [--check]\n");
      return 2;
    }
  }
  if (iters < 1 || peak_gbs <= 0) {
    std::fprintf(stderr, "bench_optim: --iters must be >= 1 and --peak-gbs > 0\n");
    return 2;
  }
  if (!cuda::available()) {
    std::printf("bench_optim: no CUDA device; failing\n");
    return 2;
  }
  Qwen3Config cfg = qwen3_shape_config(shape);
  if (layers > 0) cfg.num_hidden_layers = layers;
  const std::vector<WeightSpec> specs = qwen3_weight_specs(cfg);
  int64_t params = 0, largest = 0;
  for (const WeightSpec& s : specs) {
    int64_t n = 1;
    for (int64_t e : s.shape) n *= e;
    params += n;
    largest = std::max(largest, n);
  }
  std::printf("%s\nAdamW on the GPU, %s shape with %lld layers: %zu tensors, %lld parameters\n",
              cuda::device_summary().c_str(), shape.c_str(), (long long)cfg.num_hidden_layers,
              specs.size(), (long long)params);

  // Host bf16 weights, device fp32 gradients (filled from one host buffer, tensor by tensor).
  Weights weights, grads;
  std::vector<float> host(static_cast<size_t>(largest));
  for (size_t k = 0; k < specs.size(); ++k) {
    Tensor w(DType::kBF16, specs[k].shape);
    for (int64_t i = 0; i < w.numel(); ++i) w.ptr<bf16>()[i] = f32_to_bf16(value(i, k, 0.04f));
    weights.emplace_back(specs[k].name, std::move(w));
    Tensor g = cuda::empty(DType::kF32, specs[k].shape);
    for (int64_t i = 0; i < g.numel(); ++i) host[size_t(i)] = value(i, k + 1000, 2e-4f);
    cuda::copy(TensorView::contiguous(g.data(), DType::kF32, {g.numel()}, Device::kCUDA),
               TensorView::contiguous(host.data(), DType::kF32, {g.numel()}));
    cuda::synchronize();
    grads.emplace_back(specs[k].name, std::move(g));
  }
  AdamWConfig ocfg;
  ocfg.lr = 1e-4;
  ocfg.beta2 = 0.95;
  ocfg.weight_decay = 0.1;
  ocfg.max_grad_norm = 1.0;
  CudaAdamW opt(weights, ocfg);
  weights.clear();

  // The full step.
  for (int i = 0; i < 2; ++i) opt.step(grads);
  cuda::synchronize();
  double t0 = now_ms();
  StepStats st;
  for (int i = 0; i < iters; ++i) st = opt.step(grads);
  cuda::synchronize();
  const double step_ms = (now_ms() - t0) / iters;

  // Its parts: the norm (launch, read-back, wait) and the update alone (the last step's constants).
  std::vector<TensorView> views;
  for (const auto& [n, g] : grads)
    views.push_back(TensorView::contiguous(g.data(), DType::kF32, {g.numel()}, Device::kCUDA));
  t0 = now_ms();
  for (int i = 0; i < iters; ++i) cuda::sum_of_squares_chunks(views);
  const double norm_ms = (now_ms() - t0) / iters;
  cuda::AdamWStepConsts c;
  c.beta1 = ocfg.beta1;
  c.beta2 = ocfg.beta2;
  c.eps = ocfg.eps;
  c.one_minus_beta1 = 1.0 - ocfg.beta1;
  c.one_minus_beta2 = 1.0 - ocfg.beta2;
  c.c1 = 0.5;
  c.c2 = 0.5;
  c.clip_scale = st.clip_scale;
  c.lr = st.lr;
  std::vector<cuda::AdamWTensor> ts(grads.size());
  for (size_t k = 0; k < grads.size(); ++k) {
    auto flat = [](const Tensor& t) {
      return TensorView::contiguous(t.data(), t.dtype(), {t.numel()}, Device::kCUDA);
    };
    ts[k].grad = flat(grads[k].second);
    ts[k].master = flat(opt.master()[k].second);
    ts[k].m = flat(opt.m()[k].second);
    ts[k].v = flat(opt.v()[k].second);
    ts[k].weight = flat(opt.bf16_weights()[k].second);
    ts[k].weight_decay = 0.1;
  }
  // The bench's own update consts change the state: --check runs from the state left afterwards.
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cuda::adamw_update(ts, c);
  CK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) cuda::adamw_update(ts, c);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float upd_total = 0;
  CK(cudaEventElapsedTime(&upd_total, e0, e1));
  const double update_ms = double(upd_total) / iters;

  const double gbs = copy_gbs();
  const double update_bytes = 30.0 * double(params), norm_bytes = 4.0 * double(params);
  auto floor_ms = [](double bytes, double gb_per_s) { return bytes / (gb_per_s * 1e9) * 1e3; };
  std::printf("grad_norm %.6g, clip_scale %.6g (last step)\n", st.grad_norm, st.clip_scale);
  std::printf("device-to-device copy: %.0f GB/s (read + write); nominal peak %.0f GB/s\n", gbs,
              peak_gbs);
  std::printf("%-28s %10s %14s %14s %9s %9s\n", "part", "ms", "floor ms@copy", "floor ms@peak",
              "x copy", "x peak");
  auto row = [&](const char* name, double ms, double bytes) {
    const double fc = floor_ms(bytes, gbs), fp = floor_ms(bytes, peak_gbs);
    std::printf("%-28s %10.3f %14.3f %14.3f %9.2f %9.2f\n", name, ms, fc, fp, ms / fc, ms / fp);
  };
  row("step (norm + update)", step_ms, update_bytes + norm_bytes);
  row("norm (chains + read-back)", norm_ms, norm_bytes);
  row("update", update_ms, update_bytes);
  std::printf(
      "(floors: 30 B/parameter for the update, 4 B for the norm's read of the gradients)\n");

  if (!check) return 0;
  // One step on the CPU from the GPU's state with the same gradients: everything bitwise.
  std::printf("check: one step on the CPU AdamW from the same state (slow)...\n");
  AdamW cpu = opt.to_host();
  Weights host_grads;
  for (const auto& [n, g] : grads) {
    Tensor h(DType::kF32, g.shape());
    cuda::copy(h.view(), g.view());
    host_grads.emplace_back(n, std::move(h));
  }
  cuda::synchronize();
  const double c0 = now_ms();
  const StepStats sc = cpu.step(host_grads);
  const double cpu_ms = now_ms() - c0;
  const StepStats sg = opt.step(grads);
  const bool stats_ok = std::memcmp(&sc, &sg, sizeof(StepStats)) == 0;
  const bool state_ok = same(opt.state(), cpu.state(), "state");
  const bool bf16_ok = same(opt.bf16_weights_host(), cpu.bf16_weights(), "bf16 weights");
  std::printf("check: CPU step %.0f ms; stats %s, state %s, bf16 weights %s\n", cpu_ms,
              stats_ok ? "equal" : "DIFFER", state_ok ? "equal" : "DIFFER",
              bf16_ok ? "equal" : "DIFFER");
  return stats_ok && state_ok && bf16_ok ? 0 : 1;
}
