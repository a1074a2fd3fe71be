// AdamW with its state on the GPU: the CPU engine::AdamW (engine/optim.h) bit for bit — the same
// fp32 masters and moments, bf16 compute weights, grad_norm, clip_scale and lr, step after step —
// with fp32 device gradients (e.g. Gradients::all() of a CUDA backend). The kernels are
// lockstep::cuda::sum_of_squares_chunks and adamw_update (lockstep/cuda/optim.h); the host adds
// the chunk sums in the canonical order, checks for non-finite gradients, takes the sqrt and the
// clip scale, and computes the step's constants with the CPU's own double expressions, so every
// scalar is the CPU's. Checkpoints keep the CPU format: state() is AdamW::state() (copied back to
// the host), from_state takes it. Everything runs on the legacy default stream, ordered with the
// engine's CUDA backends (engine/cuda/device_backend.h).
#pragma once

#include <cstdint>

#include "engine/default_model.h"
#include "engine/optim.h"
#include "lockstep/tensor.h"

namespace lockstep::engine {

class CudaAdamW {
 public:
  // As AdamW(weights, cfg): host weights (bf16 or f32, HF names); masters = their fp32 values,
  // moments zero, all uploaded one tensor at a time (no host copy of the whole state).
  CudaAdamW(const Weights& weights, const AdamWConfig& cfg);
  // The exact state of a CPU optimizer, uploaded.
  explicit CudaAdamW(const AdamW& host);
  // As AdamW::from_state (the same checks and errors): a host state (a checkpoint's).
  static CudaAdamW from_state(const Weights& state, const AdamWConfig& cfg);

  // AdamW::step with fp32 gradients on the device (same names, shapes and order as the weights).
  // Waits for the gradients (the norm is read back to the host before the update is launched);
  // the update itself is queued, not waited for. A non-finite gradient throws naming the first
  // such tensor, with nothing updated, as on the CPU.
  StepStats step(const Weights& grads);

  // The bf16 compute weights on the device (round to nearest even of the masters, canonical NaN),
  // rewritten in place by every step (the same buffers for the optimizer's lifetime): the
  // rollout engine's weights (a Model built over their views copies them on the device). Valid
  // in stream order.
  const Weights& bf16_weights() const { return bf16_; }
  Weights bf16_weights_host() const;  // AdamW::bf16_weights(), copied to the host
  // The fp32 state on the device.
  const Weights& master() const { return master_; }
  const Weights& m() const { return m_; }
  const Weights& v() const { return v_; }
  int64_t steps_done() const { return t_; }
  const AdamWConfig& config() const { return cfg_; }

  // AdamW::state() (host tensors, the same names, order and bits).
  Weights state() const;
  // The same optimizer on the CPU (AdamW::from_state(state(), config())).
  AdamW to_host() const;

 private:
  CudaAdamW() = default;
  void refresh_bf16();  // bf16_ = round(master_) on the device
  AdamWConfig cfg_;
  Weights master_, m_, v_, bf16_;  // device tensors, weight order
  int64_t t_ = 0;
};

}  // namespace lockstep::engine
