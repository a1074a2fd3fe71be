// AdamW (docs/training-optimizer.md): every element's update is a fixed chain of IEEE double
// operations on its fp32 state (no fma: host code builds with -ffp-contract=off; no libm call
// that is not correctly rounded: β^t by repeated multiplication, the cosine by a fixed polynomial),
// stored back as fp32. The gradient norm is a double sum in a fixed chunked order. Elements and
// chunks run in parallel; no result depends on the thread count.
#include "engine/optim.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include "core/thread_pool.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

constexpr const char* kOp = "adamw";
// Elements per chunk of the gradient norm's sum (part of its definition, see optim.h).
constexpr int64_t kNormChunk = 65536;
constexpr int64_t kGrain = 16384;
// The step is checkpointed as an exact integer-valued float.
constexpr int64_t kMaxSteps = int64_t(1) << 24;

const char* schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::kConstant:
      return "constant";
    case LrSchedule::kLinearWarmup:
      return "linear_warmup";
    case LrSchedule::kCosine:
      return "cosine";
  }
  return "?";
}

// Shortest text that reads back as the same double.
std::string fmt(double x) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

// 0.5·(1 + cos(π·p)) for p in [0, 1], without libm (its cos differs between libraries): with
// x = π·|p − 1/2| in [0, π/2], cos(π·p) = ∓sin(x) (− for p < 1/2), and sin(x) is its Taylor
// series to x^23/23! (truncation error < 1e-18), evaluated by Horner in a fixed order.
double half_cosine(double p) {
  constexpr double kPi = 3.141592653589793;
  const double d = p - 0.5;
  const double x = kPi * (d < 0 ? -d : d);
  const double x2 = x * x;
  double s = 1.0;
  for (int k = 23; k >= 3; k -= 2) s = 1.0 - s * x2 / double(k * (k - 1));
  s = s * x;  // sin(x)
  const double c = d < 0 ? s : -s;
  return 0.5 * (1.0 + c);
}

Tensor zeros_f32(const std::vector<int64_t>& shape) {
  Tensor t(DType::kF32, shape);
  float* p = t.ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0.0f;
  return t;
}

Tensor copy_f32(const Tensor& src) {
  Tensor t(DType::kF32, src.shape());
  const float* s = src.ptr<float>();
  float* d = t.ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = s[i];
  return t;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The canonical sum of squares of one tensor (see optim.h): chunks of kNormChunk elements, each a
// sequential double chain in element order, the chunk sums added in chunk order.
double sum_of_squares(const float* g, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(chunks);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t begin = c * kNormChunk, end = std::min(n, begin + kNormChunk);
      double s = 0.0;
      for (int64_t i = begin; i < end; ++i) {
        const double x = g[i];
        s = s + x * x;  // x·x is exact in double (24-bit mantissas)
      }
      partial[c] = s;
    }
  });
  double s = 0.0;
  for (double p : partial) s = s + p;
  return s;
}

}  // namespace

void AdamWConfig::validate() const {
  auto finite = [](double x) { return std::isfinite(x); };
  LS_CHECK(finite(lr) && lr > 0, kOp, "lr must be finite and > 0, got ", fmt(lr));
  LS_CHECK(finite(beta1) && beta1 >= 0 && beta1 < 1, kOp, "beta1 must be in [0, 1), got ",
           fmt(beta1));
  LS_CHECK(finite(beta2) && beta2 >= 0 && beta2 < 1, kOp, "beta2 must be in [0, 1), got ",
           fmt(beta2));
  LS_CHECK(finite(eps) && eps > 0, kOp, "eps must be finite and > 0, got ", fmt(eps));
  LS_CHECK(finite(weight_decay) && weight_decay >= 0, kOp,
           "weight_decay must be finite and >= 0, got ", fmt(weight_decay));
  LS_CHECK(finite(max_grad_norm), kOp, "max_grad_norm must be finite (<= 0: off), got ",
           fmt(max_grad_norm));
  LS_CHECK(schedule == LrSchedule::kConstant || schedule == LrSchedule::kLinearWarmup ||
               schedule == LrSchedule::kCosine,
           kOp, "unknown schedule ", int(schedule));
  LS_CHECK(warmup_steps >= 0, kOp, "warmup_steps must be >= 0, got ", warmup_steps);
  LS_CHECK(total_steps >= 0, kOp, "total_steps must be >= 0, got ", total_steps);
  LS_CHECK(schedule != LrSchedule::kConstant || warmup_steps == 0, kOp,
           "warmup_steps = ", warmup_steps,
           " with the constant schedule (use linear_warmup or cosine)");
  LS_CHECK(schedule != LrSchedule::kCosine || total_steps > warmup_steps, kOp,
           "cosine needs total_steps > warmup_steps, got total_steps = ", total_steps,
           ", warmup_steps = ", warmup_steps);
  LS_CHECK(finite(min_lr_ratio) && min_lr_ratio >= 0 && min_lr_ratio <= 1, kOp,
           "min_lr_ratio must be in [0, 1], got ", fmt(min_lr_ratio));
}

std::string AdamWConfig::to_string() const {
  std::string s = "adamw lr=" + fmt(lr) + " betas=(" + fmt(beta1) + ", " + fmt(beta2) +
                  ") eps=" + fmt(eps) + " weight_decay=" + fmt(weight_decay) +
                  " max_grad_norm=" + fmt(max_grad_norm) + " schedule=" + schedule_name(schedule);
  if (schedule != LrSchedule::kConstant) s += " warmup_steps=" + std::to_string(warmup_steps);
  if (schedule == LrSchedule::kCosine) {
    s += " total_steps=" + std::to_string(total_steps) + " min_lr_ratio=" + fmt(min_lr_ratio);
  }
  return s;
}

double learning_rate(const AdamWConfig& cfg, int64_t step) {
  LS_CHECK(step >= 0, kOp, "learning_rate: step must be >= 0, got ", step);
  if (cfg.schedule == LrSchedule::kConstant) return cfg.lr;
  if (step < cfg.warmup_steps) return cfg.lr * double(step + 1) / double(cfg.warmup_steps);
  if (cfg.schedule == LrSchedule::kLinearWarmup) return cfg.lr;
  // Cosine: from lr at step = warmup to min_lr_ratio·lr at step = total_steps, constant after.
  if (step >= cfg.total_steps) return cfg.lr * cfg.min_lr_ratio;
  const double p = double(step - cfg.warmup_steps) / double(cfg.total_steps - cfg.warmup_steps);
  return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * half_cosine(p));
}

void check_adamw_weights(const Weights& weights) {
  LS_CHECK(!weights.empty(), kOp, "no weights");
  std::set<std::string> names;
  for (const auto& [name, w] : weights) {
    LS_CHECK(names.insert(name).second, kOp, "duplicate weight name '", name, "'");
    LS_CHECK(w.device() == Device::kCPU, kOp, "weight '", name, "' must be on the CPU");
    LS_CHECK(w.dtype() == DType::kBF16 || w.dtype() == DType::kF32, kOp, "weight '", name,
             "': expected bf16 or f32, got ", dtype_name(w.dtype()));
  }
}

Tensor adamw_master(const Tensor& w) {
  Tensor master(DType::kF32, w.shape());
  float* d = master.ptr<float>();
  if (w.dtype() == DType::kF32) {
    const float* s = w.ptr<float>();
    for (int64_t i = 0; i < w.numel(); ++i) d[i] = s[i];
  } else {
    const bf16* s = w.ptr<bf16>();
    for (int64_t i = 0; i < w.numel(); ++i) d[i] = bf16_to_f32(s[i]);
  }
  return master;
}

AdamW::AdamW(const Weights& weights, const AdamWConfig& cfg) : cfg_(cfg) {
  cfg.validate();
  check_adamw_weights(weights);
  for (const auto& [name, w] : weights) {
    master_.emplace_back(name, adamw_master(w));
    m_.emplace_back(name, zeros_f32(w.shape()));
    v_.emplace_back(name, zeros_f32(w.shape()));
  }
}

double adamw_power(double beta, int64_t t) {
  double p = 1.0;
  for (int64_t i = 0; i < t; ++i) p = p * beta;
  return p;
}

void check_step_gradients(const Weights& master, const Weights& grads, Device device,
                          const char* where, int64_t steps_done) {
  LS_CHECK(grads.size() == master.size(), kOp, "step: expected ", master.size(), " gradients, got ",
           grads.size());
  for (size_t k = 0; k < grads.size(); ++k) {
    const auto& [name, g] = grads[k];
    const auto& [wname, w] = master[k];
    LS_CHECK(name == wname, kOp, "step: gradient ", k, " is '", name, "', expected '", wname, "'");
    LS_CHECK(g.device() == device && g.dtype() == DType::kF32, kOp, "step: gradient '", name,
             "' must be f32 on ", where, ", got ", dtype_name(g.dtype()), " on ",
             device_name(g.device()));
    LS_CHECK(g.shape() == w.shape(), kOp, "step: gradient '", name, "' has shape ",
             shape_str(g.shape()), ", expected ", shape_str(w.shape()));
  }
  LS_CHECK(steps_done + 1 < kMaxSteps, kOp, "step: more than ", kMaxSteps - 1, " steps");
}

StepStats adamw_step_stats(const AdamWConfig& cfg, int64_t steps_done, const Weights& grads,
                           const std::vector<double>& tensor_sums) {
  LS_CHECK(tensor_sums.size() == grads.size(), kOp, "internal: ", tensor_sums.size(), " sums for ",
           grads.size(), " gradients");
  // No finite fp32 gradient overflows the double sum (|g|² < 2^256), so the sum is finite
  // exactly when every gradient is.
  double sum = 0.0;
  for (size_t k = 0; k < grads.size(); ++k) {
    LS_CHECK(std::isfinite(tensor_sums[k]), kOp, "step: non-finite gradient in '", grads[k].first,
             "' (nothing was updated)");
    sum = sum + tensor_sums[k];
  }
  StepStats stats;
  stats.grad_norm = std::sqrt(sum);
  if (cfg.max_grad_norm > 0) {
    stats.clip_scale = std::min(1.0, cfg.max_grad_norm / (stats.grad_norm + 1e-6));
  }
  stats.lr = learning_rate(cfg, steps_done);
  return stats;
}

StepStats AdamW::step(const Weights& grads) {
  check_step_gradients(master_, grads, Device::kCPU, "the CPU", t_);

  std::vector<double> sums;
  sums.reserve(grads.size());
  for (const auto& [name, g] : grads) sums.push_back(sum_of_squares(g.ptr<float>(), g.numel()));
  const StepStats stats = adamw_step_stats(cfg_, t_, grads, sums);

  // The update, per element, all in double from the fp32 state, stored as fp32 (optim.h):
  //   g' = g·clip_scale; m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·g'²;
  //   m̂ = m/(1−β1^t); v̂ = v/(1−β2^t); w = w − lr_t·(m̂/(sqrt(v̂)+eps) + wd·w)
  // with m̂, v̂ and the decay term from the double m, v, w before their fp32 rounding.
  const int64_t t = t_ + 1;
  const double b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
  const double one_m_b1 = 1.0 - b1, one_m_b2 = 1.0 - b2;
  const double c1 = 1.0 - adamw_power(b1, t), c2 = 1.0 - adamw_power(b2, t);
  const double scale = stats.clip_scale, lr = stats.lr;
  for (size_t k = 0; k < grads.size(); ++k) {
    const float* g = grads[k].second.ptr<float>();
    float* w = master_[k].second.ptr<float>();
    float* m = m_[k].second.ptr<float>();
    float* v = v_[k].second.ptr<float>();
    const double wd = master_[k].second.shape().size() >= 2 ? cfg_.weight_decay : 0.0;
    parallel_for(master_[k].second.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double gi = double(g[i]) * scale;
        const double mi = b1 * double(m[i]) + one_m_b1 * gi;
        const double vi = b2 * double(v[i]) + one_m_b2 * (gi * gi);
        const double m_hat = mi / c1, v_hat = vi / c2;
        const double wi = double(w[i]);
        const double update = m_hat / (std::sqrt(v_hat) + eps) + wd * wi;
        w[i] = float(wi - lr * update);
        m[i] = float(mi);
        v[i] = float(vi);
      }
    });
  }
  t_ = t;
  return stats;
}

Weights AdamW::bf16_weights() const {
  Weights out;
  out.reserve(master_.size());
  for (const auto& [name, w] : master_) {
    Tensor b(DType::kBF16, w.shape());
    const float* s = w.ptr<float>();
    bf16* d = b.ptr<bf16>();
    parallel_for(w.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) d[i] = f32_to_bf16(s[i]);
    });
    out.emplace_back(name, std::move(b));
  }
  return out;
}

Weights AdamW::state() const {
  Weights out;
  out.reserve(3 * master_.size() + 1);
  for (const auto& [name, w] : master_) out.emplace_back("master/" + name, copy_f32(w));
  for (const auto& [name, w] : m_) out.emplace_back("m/" + name, copy_f32(w));
  for (const auto& [name, w] : v_) out.emplace_back("v/" + name, copy_f32(w));
  Tensor step(DType::kF32, {1});
  step.ptr<float>()[0] = float(t_);  // exact: t_ < 2^24
  out.emplace_back("step", std::move(step));
  return out;
}

AdamW AdamW::from_state(const Weights& state, const AdamWConfig& cfg) {
  cfg.validate();
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : state) {
    LS_CHECK(by_name.emplace(name, &t).second, kOp, "from_state: duplicate entry '", name, "'");
    LS_CHECK(t.device() == Device::kCPU && t.dtype() == DType::kF32, kOp, "from_state: '", name,
             "' must be f32 on the CPU, got ", dtype_name(t.dtype()), " on ",
             device_name(t.device()));
  }
  auto step_it = by_name.find("step");
  LS_CHECK(step_it != by_name.end(), kOp, "from_state: no 'step' entry");
  const Tensor& step = *step_it->second;
  LS_CHECK(step.shape() == std::vector<int64_t>{1}, kOp, "from_state: 'step' has shape ",
           shape_str(step.shape()), ", expected [1]");
  const float s = step.ptr<float>()[0];
  LS_CHECK(std::isfinite(s) && s >= 0 && s < float(kMaxSteps) && s == std::floor(s), kOp,
           "from_state: 'step' must be an integer in [0, 2^24), got ", fmt(s));

  AdamW opt;
  opt.cfg_ = cfg;
  opt.t_ = int64_t(s);
  size_t used = 1;
  for (const auto& [key, t] : state) {
    if (key.rfind("master/", 0) != 0) continue;
    const std::string name = key.substr(7);
    for (const char* prefix : {"m/", "v/"}) {
      auto it = by_name.find(prefix + name);
      LS_CHECK(it != by_name.end(), kOp, "from_state: '", key, "' has no '", prefix, name, "'");
      LS_CHECK(it->second->shape() == t.shape(), kOp, "from_state: '", prefix, name, "' has shape ",
               shape_str(it->second->shape()), ", expected ", shape_str(t.shape()));
    }
    opt.master_.emplace_back(name, copy_f32(t));
    opt.m_.emplace_back(name, copy_f32(*by_name.at("m/" + name)));
    opt.v_.emplace_back(name, copy_f32(*by_name.at("v/" + name)));
    used += 3;
  }
  if (used != state.size()) {
    for (const auto& [key, t] : state) {
      const bool known = key == "step" || key.rfind("master/", 0) == 0 ||
                         ((key.rfind("m/", 0) == 0 || key.rfind("v/", 0) == 0) &&
                          by_name.count("master/" + key.substr(2)));
      LS_CHECK(known, kOp, "from_state: unexpected entry '", key, "'");
    }
  }
  LS_CHECK(!opt.master_.empty(), kOp, "from_state: no 'master/<name>' entries");
  return opt;
}

}  // namespace lockstep::engine
