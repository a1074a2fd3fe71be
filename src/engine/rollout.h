// The rollout engine: a continuous-batching generator over a paged KV cache (scheduler.h,
// kv_cache.h) that samples completions with per-request settings through Model::sample and
// records, for every generated token, its id and the sampling op's fp32 log-prob, logsumexp and
// entropy — the LogP op's values at the request's logprob_temperature(), which the training side
// recomputes (trainer.h). Engine choices (page size, token budget, batch limit, arrival order,
// prefix sharing, split-KV, cascade) never change a bit of a recorded value with the invariant
// backend; that is what `lockstep audit` checks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "lockstep/ops/sampling.h"

namespace lockstep::engine {

struct RolloutRequest {
  int64_t id = 0;               // unique, >= 0; also the sampling op's request id (Philox counter)
  std::vector<int32_t> prompt;  // token ids in [0, V), >= 1 of them
  SamplingParams sampling;
  int64_t max_new_tokens = 16;  // >= 1; prompt + max_new_tokens <= the model's context
  bool stop_on_eos = true;      // stop after any of the config's eos_token_ids
  int64_t arrival_step = 0;     // first engine step it may join
  int64_t group = -1;           // GRPO group (same prompt): prefix sharing, -1 = none
};

struct RolloutConfig {
  KvCacheConfig kv;           // page size and pool size
  SchedulerConfig scheduler;  // batch limit, token budget, prefix sharing
  StepOptions step;           // split-KV count, cascade attention (needs prefix sharing)

  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // the three parts' to_string, separated by "; "
};

// One request's output: the generated tokens and, per token, the recorded fp32 values.
struct Completion {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;  // generated ids
  std::vector<float> logp;      // log p(token) at sampling.logprob_temperature()
  std::vector<float> lse;       // logsumexp of the tempered logits
  std::vector<float> entropy;   // entropy of the tempered distribution (nats)
  SamplingParams sampling;
  FinishReason finish = FinishReason::kNone;
};

struct RolloutProgress {
  int64_t step = 0;
  int64_t finished = 0, total = 0;  // requests
  int64_t generated = 0;            // tokens generated so far
};

// Called on a sampled token (activation capture hooks, divergence localization): the step, the
// plan, and the map from each plan entry to its rows in the step's forward call.
struct RolloutStepInfo {
  const StepPlan* plan = nullptr;
  std::vector<int64_t> row_begin;  // plan.seqs[i] computes rows [row_begin[i], + count)
};

// One engine step as run: its rows (query tokens), scheduled sequences, the keys its attention
// read (Σ over the sequences of their KV length after the step), whether every sequence decoded
// one token, and its wall time (scheduling, the forward, sampling and the host bookkeeping).
struct RolloutStepTime {
  int64_t tokens = 0, seqs = 0, keys = 0;
  bool decode = false;
  double seconds = 0;
};

struct RolloutResult {
  std::vector<Completion> completions;      // in request order
  std::vector<RolloutStepTime> step_times;  // in step order
  SchedulerStats stats;
  int64_t generated_tokens = 0;
  // Query rows that read at least one whole KV chunk through a shared prefix (cascade attention
  // really shared work); 0 when prompts are shorter than a KV chunk.
  int64_t cascade_rows = 0;
  double seconds = 0;
};

struct RolloutHooks {
  // Every `progress_every_s` seconds (and at the end) when set.
  std::function<void(const RolloutProgress&)> progress;
  double progress_every_s = 2.0;
  // Before each step's forward call (e.g. to arm a trace for a row); return false to stop the
  // rollout early after this step (its results are still recorded).
  std::function<bool(const RolloutStepInfo&)> before_step;
};

// Checks every request up front (ids unique, prompt non-empty, token ids in [0, V), sampling
// settings valid, prompt + max_new_tokens within the model's context, each sequence fits the KV
// pool) with an Error naming the request; then runs the engine to completion.
RolloutResult run_rollout(const Model& model, const std::vector<RolloutRequest>& requests,
                          const RolloutConfig& cfg, const RolloutHooks& hooks = {});

// Positions a model can hold: ModelOptions::max_positions, or max_position_embeddings when 0.
int64_t model_context(const Model& model);

}  // namespace lockstep::engine
