// The training side of the audit: the rollout's sequences (prompt + completion) packed into
// variable-length micro-batches (a token budget per micro-batch, order shuffled by a seed), one
// Model::forward_packed per micro-batch, then Model::logprob over the rows that predict completion
// tokens (targets = the next token, temperature = the request's logprob_temperature()), giving
// per-token fp32 logp / lse / entropy. Rows are gathered per temperature into [Tc, H] bf16; no
// [T x V] buffer exists anywhere. How sequences are packed never changes a bit (invariant ops).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/rollout.h"

namespace lockstep::engine {

struct PackingConfig {
  // Tokens per micro-batch: sequences are added in packing order while the sum stays within it;
  // a longer sequence gets a micro-batch of its own. >= 1.
  int64_t micro_batch_tokens = 1024;
  // Packing order: 0 keeps the input order, otherwise a Fisher-Yates shuffle driven by Philox
  // keyed by this seed.
  uint64_t seed = 0;

  void validate() const;
  std::string to_string() const;  // "packing: micro_batch_tokens=1024 seed=0"
};

struct TrainSequence {
  int64_t id = 0;
  std::vector<int32_t> prompt;      // >= 1 token
  std::vector<int32_t> completion;  // >= 1 token
  float temperature = 1.0f;         // the rollout's SamplingParams::logprob_temperature()
};

struct TrainTokens {
  std::vector<float> logp, lse, entropy;  // one per completion token
};

struct TrainResult {
  std::vector<TrainTokens> sequences;  // in input order
  int64_t micro_batches = 0;
  int64_t tokens_forwarded = 0;  // Σ over micro-batches of packed tokens
  int64_t max_micro_batch_tokens = 0;
  double seconds = 0;
};

// Micro-batches as lists of input indices, in execution order (exposed for tests and the report).
std::vector<std::vector<size_t>> pack_sequences(const std::vector<int64_t>& lengths,
                                                const PackingConfig& cfg);

struct TrainHooks {
  // Progress after each micro-batch: (sequences done, total).
  std::function<void(int64_t, int64_t)> progress;
  // Before a micro-batch's forward: its input indices and each one's first row in the packed
  // batch; return false to skip the micro-batch (divergence localization replays one).
  std::function<bool(const std::vector<size_t>&, const std::vector<int64_t>&)> before_batch;
};

// Packed sequence = prompt + completion (the last completion token is fed too, as a trainer does;
// its row predicts nothing). Checks token ids, lengths against the model's context, temperatures.
TrainResult run_training_forward(const Model& model, const std::vector<TrainSequence>& seqs,
                                 const PackingConfig& cfg, const TrainHooks& hooks = {});

// A rollout's completions as training sequences (same ids, prompts, completion tokens, each at
// its request's logprob_temperature()), in completion order.
std::vector<TrainSequence> train_sequences(const RolloutResult& rollout);

}  // namespace lockstep::engine
