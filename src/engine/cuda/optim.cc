// CudaAdamW (engine/cuda/optim.h). The device does the per-element work (the chunk chains of the
// norm and the update); every scalar of a step — the chunk sums' combination, the norm, the clip
// scale, the learning rate, 1 − β and 1 − β^t — is computed here by the same double expressions,
// in the same order, as engine::AdamW::step (src/engine/optim.cc; host code builds with
// -ffp-contract=off there and here), so the kernels receive the CPU's constants bit for bit.
#include "engine/cuda/optim.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/optim.h"
#include "lockstep/cuda/runtime.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

constexpr const char* kOp = "adamw";  // the CPU optimizer's name: the same errors
// A tensor as one contiguous row (the kernels see elements, not shapes).
TensorView flat(const Tensor& t) {
  return TensorView::contiguous(t.data(), t.dtype(), {t.numel()}, t.device());
}

Tensor upload(const Tensor& host) {
  Tensor d = cuda::empty(host.dtype(), host.shape());
  // A pageable host source may be dropped once copy() returns (engine/backend.h).
  if (host.numel() > 0) cuda::copy(flat(d), flat(host));
  return d;
}

// Zeros as [numel / last, last] rows (one 2-D memset whose pitch is one row, not the tensor).
Tensor zeros_f32(const std::vector<int64_t>& shape) {
  Tensor d = cuda::empty(DType::kF32, shape);
  if (d.numel() == 0) return d;
  const int64_t last = shape.empty() ? 1 : shape.back();
  cuda::fill_zero(
      TensorView::contiguous(d.data(), DType::kF32, {d.numel() / last, last}, Device::kCUDA));
  return d;
}

// Host copies of device tensors (one wait for all), names prefixed.
Weights download(const Weights& dev, const std::string& prefix, Weights out = {}) {
  for (const auto& [name, t] : dev) {
    Tensor h(t.dtype(), t.shape());
    if (t.numel() > 0) cuda::copy(flat(h), flat(t));
    out.emplace_back(prefix + name, std::move(h));
  }
  cuda::synchronize();
  return out;
}

}  // namespace

CudaAdamW::CudaAdamW(const Weights& weights, const AdamWConfig& cfg) : cfg_(cfg) {
  cfg.validate();
  check_adamw_weights(weights);
  for (const auto& [name, w] : weights) {
    // The master's fp32 value exactly as AdamW's constructor makes it, one tensor at a time.
    master_.emplace_back(name, upload(adamw_master(w)));
    m_.emplace_back(name, zeros_f32(w.shape()));
    v_.emplace_back(name, zeros_f32(w.shape()));
  }
  refresh_bf16();
}

CudaAdamW::CudaAdamW(const AdamW& host) : cfg_(host.config()), t_(host.steps_done()) {
  for (size_t k = 0; k < host.master().size(); ++k) {
    const std::string& name = host.master()[k].first;
    master_.emplace_back(name, upload(host.master()[k].second));
    m_.emplace_back(name, upload(host.m()[k].second));
    v_.emplace_back(name, upload(host.v()[k].second));
  }
  refresh_bf16();
}

CudaAdamW CudaAdamW::from_state(const Weights& state, const AdamWConfig& cfg) {
  return CudaAdamW(AdamW::from_state(state, cfg));
}

void CudaAdamW::refresh_bf16() {
  bf16_.clear();
  for (const auto& [name, w] : master_) {
    Tensor b = cuda::empty(DType::kBF16, w.shape());
    if (w.numel() > 0) cuda::round_bf16(flat(w), flat(b));
    bf16_.emplace_back(name, std::move(b));
  }
}

StepStats CudaAdamW::step(const Weights& grads) {
  check_step_gradients(master_, grads, Device::kCUDA, "the GPU", t_);

  // Global norm: the chunk chains on the device, then (as optim.cc) each tensor's chunk sums in
  // chunk order from +0, the tensors' sums in weight order from +0, the sqrt.
  std::vector<TensorView> views;
  views.reserve(grads.size());
  for (const auto& [name, g] : grads) views.push_back(flat(g));
  const std::vector<double> chunks = cuda::sum_of_squares_chunks(views);
  std::vector<double> sums;
  sums.reserve(grads.size());
  size_t c = 0;
  for (const auto& [name, g] : grads) {
    const int64_t n = (g.numel() + cuda::kNormChunk - 1) / cuda::kNormChunk;
    double s = 0.0;
    for (int64_t j = 0; j < n; ++j) s = s + chunks[c++];
    sums.push_back(s);
  }
  const StepStats stats = adamw_step_stats(cfg_, t_, grads, sums);

  // The step's constants, as optim.cc computes them (t = steps_done() + 1).
  const int64_t t = t_ + 1;
  cuda::AdamWStepConsts k;
  k.beta1 = cfg_.beta1;
  k.beta2 = cfg_.beta2;
  k.eps = cfg_.eps;
  k.one_minus_beta1 = 1.0 - cfg_.beta1;
  k.one_minus_beta2 = 1.0 - cfg_.beta2;
  k.c1 = 1.0 - adamw_power(cfg_.beta1, t);
  k.c2 = 1.0 - adamw_power(cfg_.beta2, t);
  k.clip_scale = stats.clip_scale;
  k.lr = stats.lr;
  std::vector<cuda::AdamWTensor> tensors(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    cuda::AdamWTensor& x = tensors[i];
    x.grad = flat(grads[i].second);
    x.master = flat(master_[i].second);
    x.m = flat(m_[i].second);
    x.v = flat(v_[i].second);
    x.weight = flat(bf16_[i].second);
    x.weight_decay = master_[i].second.shape().size() >= 2 ? cfg_.weight_decay : 0.0;
  }
  cuda::adamw_update(tensors, k);
  t_ = t;
  return stats;
}

Weights CudaAdamW::bf16_weights_host() const { return download(bf16_, ""); }

Weights CudaAdamW::state() const {
  Weights out;
  out.reserve(3 * master_.size() + 1);
  out = download(master_, "master/", std::move(out));
  out = download(m_, "m/", std::move(out));
  out = download(v_, "v/", std::move(out));
  Tensor step(DType::kF32, {1});
  step.ptr<float>()[0] = float(t_);  // exact: t_ < 2^24
  out.emplace_back("step", std::move(step));
  return out;
}

AdamW CudaAdamW::to_host() const { return AdamW::from_state(state(), cfg_); }

}  // namespace lockstep::engine
