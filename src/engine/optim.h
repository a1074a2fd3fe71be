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
  double grad_norm = 0;  // before clipping (fp64 of the fp32 canonical sum, see below)
  double clip_scale = 1;
  double lr = 0;
};

class AdamW {
 public:
  // From bf16 (or f32) weights, HF names: master = fp32 copies, moments zero.
  AdamW(const Weights& weights, const AdamWConfig& cfg);

  // One update from fp32 gradients (same names/shapes, in the same order as the weights). The
  // global norm is sqrt(Σ_tensors Σ_elements g²) with each tensor's sum of squares a sequential
  // fp32 chain in element order and the tensors' sums added in weight order (fp32), then sqrt; a
  // non-finite norm throws (nothing is updated). Returns the stats.
  StepStats step(const Weights& grads);

  // The bf16 compute weights (round to nearest even of the fp32 masters, canonical NaN).
  Weights bf16_weights() const;
  const Weights& master() const { return master_; }
  const Weights& m() const { return m_; }
  const Weights& v() const { return v_; }
  int64_t steps_done() const { return t_; }
  const AdamWConfig& config() const { return cfg_; }

  // Checkpoint: exact state (masters, moments, step) to / from named fp32 tensors.
  Weights state() const;  // "master/<name>", "m/<name>", "v/<name>", plus "step" [1] f32 bits
  static AdamW from_state(const Weights& state, const AdamWConfig& cfg);

 private:
  AdamW() = default;
  AdamWConfig cfg_;
  Weights master_, m_, v_;
  int64_t t_ = 0;
};

}  // namespace lockstep::engine
