// AdamW for the trainer (issue 12): fp32 master weights and moments, bf16 compute weights refreshed
// after every step with one rounding, decoupled weight decay, an LR schedule, global-norm gradient
// clipping with the norm summed in a canonical order. Deterministic: the update is a pure function
// of (master weights, moments, step, gradients, config), element by element, so it does not depend
// on thread count, micro-batch size, packing or TP degree (the gradients do not either, §B).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/default_model.h"
#include "lockstep/tensor.h"

namespace lockstep::engine {

enum class LrSchedule { kConstant, kLinearWarmup, kCosine };

struct AdamWConfig {
  double lr = 1e-3;  // peak learning rate
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;   // decoupled (AdamW); not applied to 1-D weights (norms)
  double max_grad_norm = 1.0;  // global-norm clipping; <= 0: off
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;  // linear warmup from 0 (kLinearWarmup and kCosine)
  int64_t total_steps = 0;   // cosine: decays to min_lr_ratio·lr at total_steps
  double min_lr_ratio = 0.0;
  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // one line
};

// The learning rate of optimizer step `step` (0-based) under cfg.
double learning_rate(const AdamWConfig& cfg, int64_t step);

struct StepStats {
  double grad_norm = 0;  // before clipping (the canonical double sum, see step())
  double clip_scale = 1;
  double lr = 0;
};

// β^t as t sequential double multiplications (the update's bias corrections; std::pow is not
// guaranteed correctly rounded).
double adamw_power(double beta, int64_t t);

// The constructors' checks (AdamW's and CudaAdamW's: the same errors): at least one weight, unique
// names, every weight a host tensor of bf16 or f32.
void check_adamw_weights(const Weights& weights);
// The fp32 master of a host weight (bf16 or f32): its values exactly, on the host.
Tensor adamw_master(const Tensor& w);

// The argument checks of a step (AdamW::step and the GPU's CudaAdamW::step: the same errors):
// grads has the masters' names, order and shapes, every one f32 on `device` (named `where` in
// the message, e.g. "the CPU"), and another step fits the checkpoint's exact step count.
void check_step_gradients(const Weights& master, const Weights& grads, Device device,
                          const char* where, int64_t steps_done);

// The step's scalars from each gradient tensor's canonical sum of squares (tensor_sums, weight
// order; step()'s chunked chains): grad_norm = sqrt of their sum in weight order from +0,
// clip_scale, the learning rate of step steps_done. A non-finite sum throws naming the first such
// tensor ("nothing was updated").
StepStats adamw_step_stats(const AdamWConfig& cfg, int64_t steps_done, const Weights& grads,
                           const std::vector<double>& tensor_sums);

class AdamW {
 public:
  // From bf16 (or f32) weights, HF names: master = fp32 copies, moments zero.
  AdamW(const Weights& weights, const AdamWConfig& cfg);

  // One update from fp32 gradients (same names/shapes, in the same order as the weights).
  // The global norm is sqrt(Σ_tensors Σ_elements g²), summed in double in a canonical order that
  // does not depend on threads: each tensor is cut into chunks of 65536 elements, each chunk's
  // sum of squares is a sequential chain in element order, the chunk sums are added in chunk
  // order, the tensors' sums in weight order, then sqrt (correctly rounded). g² is exact in double
  // and no finite fp32 gradient overflows the sum, so the norm is finite iff every gradient is;
  // a non-finite gradient throws naming the first such tensor (nothing is updated).
  // clip_scale = min(1, max_grad_norm / (norm + 1e-6)) (1 when max_grad_norm <= 0). Then, per
  // element, in double from the fp32 state, stored back as fp32 (t = steps_done() + 1):
  //   g' = g·clip_scale; m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·g'²;
  //   m̂ = m/(1−β1^t); v̂ = v/(1−β2^t); w = w − lr_t·(m̂/(sqrt(v̂)+eps) + wd·w)
  // with β^t by t sequential multiplications, wd = 0 for 1-D weights, lr_t = learning_rate(cfg,
  // t−1). Details and the reasons: docs/training-optimizer.md. Returns the stats.
  StepStats step(const Weights& grads);

  // The bf16 compute weights (round to nearest even of the fp32 masters, canonical NaN).
  Weights bf16_weights() const;
  const Weights& master() const { return master_; }
  const Weights& m() const { return m_; }
  const Weights& v() const { return v_; }
  int64_t steps_done() const { return t_; }
  const AdamWConfig& config() const { return cfg_; }

  // Checkpoint: exact state (masters, moments, step) to / from named fp32 tensors.
  // "master/<name>", then "m/<name>", then "v/<name>" (weight order), then "step": f32 [1]
  // holding steps_done() as an exact integer (< 2^24). from_state takes the weight order from the
  // order of the "master/" entries, the rest in any order, and throws lockstep::Error on a missing,
  // extra or duplicate entry, a wrong dtype or shape, or a step that is not an integer in [0,
  // 2^24).
  Weights state() const;
  static AdamW from_state(const Weights& state, const AdamWConfig& cfg);

 private:
  AdamW() = default;
  AdamWConfig cfg_;
  Weights master_, m_, v_;
  int64_t t_ = 0;
};

}  // namespace lockstep::engine
