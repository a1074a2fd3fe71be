// The GRPO loop (issue 12; docs/training.md): rollout with the engine (GRPO groups sharing their
// prompt's KV, per-request sampling) → rewards (a Task) → group advantages → packed training
// forward + backward over micro-batches (engine/train.h) → AdamW → the new bf16 weights to the
// rollout engine, step after step. On the first mini-batch of every step the trainer's log-probs
// are compared with the rollout's bit for bit and the PPO ratios computed from them (exactly 1
// when they agree). Runs on a GrpoDevice: the CPU (the reference) or the GPU
// (engine/cuda/grpo_device.h), the same bits step after step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/default_model.h"
#include "engine/optim.h"
#include "engine/policy_loss.h"
#include "engine/ranks.h"
#include "engine/rollout.h"
#include "engine/tasks.h"
#include "lockstep/contract/config.h"

namespace lockstep::engine {

struct GrpoConfig {
  std::string task = "copy";   // a built-in task (builtin_task_names())
  int64_t digits = 3;          // the task's operand length
  std::string reward_command;  // non-empty: a plug-in reward command scores the task's prompts
  double reward_timeout_s = 60;
  int64_t steps = 20;
  // Supervised warm-up before the GRPO steps (the same optimizer): sft_steps steps of sft_prompts
  // task prompts with their reference answers (+ EOS) as targets, token-mean cross-entropy. A
  // randomly initialized model almost never samples a right answer, so GRPO alone would see
  // rewards of 0 and advantages of 0.
  int64_t sft_steps = 0;
  int64_t sft_prompts = 64;
  double sft_lr = 3e-3;  // the warm-up's own AdamW (cfg.optim otherwise); GRPO starts a fresh one
  int64_t prompts = 16;  // prompts per step
  int64_t group = 8;     // samples per prompt (G)
  float temperature = 1.0f;
  uint64_t seed = 1;
  ContractConfig contract;
  int rollout_tp = 2, train_tp = 1;
  // How the training side's (forwards, backward) TP ranks run (docs/dist.md): simulated (one
  // model combines them); threads (train_tp rank-local ranks on threads over the thread
  // transport); launch (this process is one rank of a job of train_tp processes, the
  // GrpoDevice's train_job). Rank-local ranks gather their gradient blocks for the one AdamW. The
  // same bits in every mode (not a setting of the bits). Rank-local: invariant CPU kernels,
  // train_tp > 1.
  RankMode train_ranks = RankMode::kSimulated;
  int64_t micro_batch_tokens = 512;
  int64_t mini_batches = 1;  // optimizer steps per rollout batch (PPO mini-batches)
  bool baseline = false;     // ordinary (non-invariant) kernels for rollout and training forward
  // Group-shared prompts in training (docs/contract.md §B.11): each micro-batch packs whole GRPO
  // groups, a group's prompt once and its completions after it; the forward and backward compute
  // each prompt once (completion log-probs: the unshared bits; gradients: the shared form's
  // rounding). Micro-batches hold whole groups (micro_batch_tokens counts a group's prompt once)
  // and mini-batches cut at group boundaries (mini_batches <= prompts). CPU, invariant only.
  bool share_prompts = false;
  // The first mini-batch's log-prob head from the rollout: the trainer skips the head's forward
  // there and takes the rollout's lse / entropy / logp (bit for bit its own under the contract);
  // the backward recomputes them from its logits (docs/contract.md §B.8 "The forward from the
  // backward") and they are compared with the rollout's (logp_mismatches counts them as before);
  // a mismatch redoes the mini-batch with the head's forward. Invariant kernels, simulated TP, no
  // shared prompts; elsewhere (and with false) the head's forward runs. Not a setting of the bits.
  bool head_from_rollout = true;
  // Where rollout, training forward and backward, and AdamW run (the GrpoDevice given to
  // run_grpo must be of this device). Not a setting of the bits: a checkpoint written on one
  // device resumes on the other.
  Device device = Device::kCPU;
  // Checkpoints: after every `checkpoint_every` GRPO steps (0: only after the last one) when
  // checkpoint_dir is set, a directory <checkpoint_dir>/step-<N> (N steps done) holding
  // config.json + model.safetensors (the bf16 weights, loadable by transformers and --model),
  // optimizer.safetensors (the exact AdamW state) and trainer.txt (step, seed, settings), written
  // as <checkpoint_dir>/.step-<N>.tmp and renamed (never half-written), then
  // <checkpoint_dir>/latest (atomic) names it. Step N's prompts and sampling seeds are functions
  // of (seed, step), so no RNG state is needed.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  // Continue from a checkpoint directory (a step-<N> directory, or a checkpoint_dir with
  // `latest`): the remaining steps give the bits an uninterrupted run gives (the warm-up is not
  // repeated). The checkpoint's settings must equal this config's.
  std::string resume;
  AdamWConfig optim;
  PolicyLossConfig loss;
  RolloutConfig rollout;
  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // a few lines
};

struct GrpoStepMetrics {
  int64_t step = 0;
  double reward_mean = 0, reward_std = 0;
  int64_t sequences = 0, generated_tokens = 0;
  int64_t logp_compared = 0, logp_mismatches = 0;  // first mini-batch: trainer vs rollout, bits
  double max_abs_dlogp = 0;
  // The head from the rollout (GrpoConfig::head_from_rollout): values of the rollout's head (logp,
  // lse or entropy) that differ from those the backward recomputed. Any redoes the mini-batch with
  // the trainer's own head forward (compared as logp_compared / logp_mismatches); nonzero means the
  // one-pass backward broke the contract (§B.8), so `lockstep grpo` counts them as a failure too.
  int64_t head_mismatches = 0;
  double ratio_min = 0, ratio_max = 0;  // first mini-batch
  double clip_fraction = 0, kl = 0, entropy_mean = 0, loss = 0;
  double grad_norm = 0, lr = 0;  // the last mini-batch's optimizer step
  double rollout_s = 0, train_s = 0, step_s = 0;
  // Where the step's time goes (seconds; the device is waited for at every boundary): rollout
  // (generation), reward (scoring), forward (the trainer's forwards and log-prob heads), backward
  // (policy loss, backward, gradient finish), optimizer (AdamW steps, bf16 weights included) and
  // weight sync (placing the new weights for the next models: the rollout model, the training
  // models and their backward's copies, the host copy of the weights) and hash (weights_sha256).
  double reward_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, weight_sync_s = 0;
  double hash_s = 0;
  double train_tokens_per_s = 0;
  std::string weights_sha256;  // of the bf16 weights after the step
  // The weights' version (optimizer steps applied to the policy, warm-up included) that generated
  // the step's samples, and the largest lag of the trainer's weights behind it over the step's
  // mini-batches (0: on-policy; mini-batch m trains on version rollout + m).
  int64_t rollout_weight_version = 0, max_staleness = 0;
};

struct SftStepMetrics {
  int64_t step = 0;
  double loss = 0;            // mean negative log-likelihood of the answer tokens
  double token_accuracy = 0;  // answer tokens whose log-prob exceeds log(1/2)
  double grad_norm = 0, step_s = 0;
};

struct GrpoHooks {
  std::function<void(const SftStepMetrics&)> on_sft_step;
  std::function<void(const GrpoStepMetrics&)> on_step;
  std::function<void(const std::string&)> progress;  // long phases of a step
};

// The AdamW of a device: engine::AdamW on the CPU, CudaAdamW (engine/cuda/optim.h) on the GPU.
class GrpoOptimizer {
 public:
  virtual ~GrpoOptimizer() = default;
  // AdamW::step from fp32 gradients on the device (Gradients::all() of the device's backend).
  virtual StepStats step(const Weights& grads) = 0;
  // The bf16 compute weights on the device after the last step (the models are built over their
  // views, device to device), and a host copy of them (on the CPU: the same tensors).
  virtual const Weights& bf16_weights() const = 0;
  virtual Weights bf16_weights_host() const = 0;
  // AdamW::state(): host tensors, the checkpoint format of every device.
  virtual Weights state() const = 0;
};

// What run_grpo runs on: a device's backends and AdamW.
struct GrpoDevice {
  Device device = Device::kCPU;
  // The invariant (baseline = false) or baseline backend of the device, made once per run.
  std::function<std::shared_ptr<OpsBackend>(bool baseline)> backend;
  // AdamW(weights, cfg) from host bf16 weights, and AdamW::from_state(state, cfg) from a host
  // state (a checkpoint's), on the device.
  std::function<std::unique_ptr<GrpoOptimizer>(const Weights&, const AdamWConfig&)> adamw;
  std::function<std::unique_ptr<GrpoOptimizer>(const Weights&, const AdamWConfig&)>
      adamw_from_state;
  // cfg.train_ranks == kLaunch: this process's rank of the training job (train_tp processes, e.g.
  // started by `lockstep launch`), nullptr otherwise. Every rank runs run_grpo with the same
  // arguments: the warm-up, the rollout and AdamW (on the gathered gradients) alike on every
  // rank, the training side as its rank; rank 0 alone scores the samples (a reward command runs
  // once) and broadcasts the rewards, and alone writes checkpoints. Every step's weights are
  // checked equal on every rank (their sha256).
  dist::Communicator* train_job = nullptr;
};

// The CPU: the invariant and baseline CPU backends and engine::AdamW.
GrpoDevice cpu_grpo_device();

// Runs cfg.steps steps from `weights` (bf16 on the host, HF names, qwen3_weight_specs(model)
// order) on `device` (of cfg.device) and returns the final bf16 weights (host). The training
// backward always runs on the device's invariant backend (the baselines have no backward; with
// cfg.baseline the rollout and the training forward use the baseline backend, as on the CPU).
Weights run_grpo(const GrpoConfig& cfg, const Qwen3Config& model, const Weights& weights,
                 const GrpoDevice& device, const GrpoHooks& hooks = {});
// The same on the CPU (cfg.device must be kCPU).
Weights run_grpo(const GrpoConfig& cfg, const Qwen3Config& model, const Weights& weights,
                 const GrpoHooks& hooks = {});

// The weights' digest: each tensor's bytes (in the map's order; names not included) cut into
// pieces of 16 MiB (the last one shorter; an empty tensor is one empty piece), each piece's
// sha256 as 64 lowercase hex digits, and the sha256 (hex) of those digits concatenated in order.
// The pieces are hashed in parallel; the result does not depend on the thread count.
std::string weights_sha256(const Weights& w);

}  // namespace lockstep::engine
