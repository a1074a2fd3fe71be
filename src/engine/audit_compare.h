// The audit's comparison: every generated token's fp32 log-prob and entropy from the rollout
// against the training forward's, bit for bit (memcmp of the patterns, never a tolerance), and the
// localization of the first divergence: both sides replay that token with Model::set_trace and the
// first op boundary whose activation row differs is named. Pure functions of the two runs' results;
// they never change what is compared.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/rollout.h"
#include "engine/trainer.h"

namespace lockstep::engine {

// One bitwise difference: request, completion index, absolute position of the token, the token.
struct Divergence {
  int64_t request = -1;
  int64_t index = -1;
  int64_t position = -1;
  int32_t token = -1;
  float rollout_logp = 0, train_logp = 0;
};

// The result of comparing a rollout with the training forward over the same sequences.
struct LogprobComparison {
  int64_t sequences = 0;
  int64_t tokens_compared = 0;
  int64_t mismatches = 0;  // log-prob bit patterns that differ
  int64_t entropy_mismatches = 0;
  double max_abs_diff = 0;  // max |Δ logp| (NaN-aware: any NaN mismatch counts as inf)
  std::optional<Divergence> first;
  int64_t first_sequence = -1;  // index into the completions of the first divergence
};

// Compares rr.completions[i] with tr.sequences[i] token by token (same order, same lengths).
LogprobComparison compare_logprobs(const RolloutResult& rr, const TrainResult& tr);

// Activation comparison at one op boundary of the replayed token's row.
struct OpComparison {
  std::string op;
  int layer = -1;
  int64_t elements = 0;
  int64_t mismatches = 0;
  double max_abs_diff = 0;
  int64_t first = -1;  // first differing element
  float rollout_value = 0, train_value = 0;
};

struct Localization {
  bool replayed = false;          // both sides captured the token's row
  std::vector<OpComparison> ops;  // in the rollout's op order; the last one is the "logp" head
  int first_divergent = -1;       // index into ops, -1: none differs
  std::string summary;            // one line for the report
};

// Replays the divergent token `d` (of requests[request_index]) on both sides with activation
// traces: the rollout is rerun up to the step that samples it, the training forward up to the
// micro-batch that holds it, with the same configurations as the audited run.
Localization localize_divergence(Model& rollout_model, Model& train_model,
                                 const std::vector<RolloutRequest>& requests,
                                 const RolloutConfig& rollout_cfg,
                                 const std::vector<TrainSequence>& train_seqs,
                                 const PackingConfig& packing, const Divergence& d,
                                 int64_t request_index);

// Text of reported values: "%.9g" (fp32 round trip) and the bit pattern "0x%08x".
std::string audit_float_text(double v);
std::string audit_bits_text(float f);

}  // namespace lockstep::engine
