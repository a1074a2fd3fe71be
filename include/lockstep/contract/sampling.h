// Sampling: per token, after top-k → top-p → min-p filters over y = z / temperature (z = h·Wᵀ by
// the GEMM contract), the id whose exact integer mass interval (q = floor(p · 2^32), ascending
// vocab ids) holds the target floor(U · Q / 2^64), U one Philox4x32-10 draw keyed by the seed and
// counted by (request id, position). Returns the sampled id and the LogP op's logp / lse / entropy
// of the untruncated tempered distribution, bit-equal to linear_logprob(targets = sampled ids).
// Normative text: docs/contract.md §S.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lockstep/contract/config.h"
#include "lockstep/tensor.h"

namespace lockstep {

// Vocab sizes the sampler accepts: V < 2^21 keeps the top-p masses (Σ q, q <= 2^32) exact in a
// double.
constexpr int64_t kSampleMaxVocab = int64_t(1) << 21;

// Per-request settings (one per token row in the op; rows of one request share them).
struct SamplingParams {
  uint64_t seed = 0;         // Philox key
  float temperature = 1.0f;  // 0: greedy (argmax z); otherwise finite and > 0
  int64_t top_k = 0;         // 0: off; otherwise keep the k best entries (k >= V: off)
  float top_p = 1.0f;        // in (0, 1]; 1: off
  float min_p = 0.0f;        // in [0, 1]; 0: off

  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // "sampling: seed=7 temperature=0x1.6p-1 (0.6875) top_k=0 ..."
  // The temperature of the recorded logp / lse / entropy: `temperature`, or 1 for greedy. The
  // training side recomputes them with linear_logprob at this temperature.
  float logprob_temperature() const { return temperature == 0.0f ? 1.0f : temperature; }
};

// The row's uniform (normative, §S.6): one Philox4x32-10 call,
//   key = (seed & 0xffffffff, seed >> 32)
//   ctr = (0xffffffff, position, request_id & 0xffffffff, request_id >> 32)
//   U = (out[0] << 32) | out[1]   (a uniform 64-bit integer)
uint64_t sampling_uniform(uint64_t seed, uint64_t request_id, uint32_t position);
// The choice's target for candidates of total mass Q > 0 (§S.7): floor(U · Q / 2^64), in [0, Q).
uint64_t sampling_target(uint64_t u, uint64_t total);

// Per-entry Gumbel noise with the same key: the baseline backend's sampler (an ordinary
// Gumbel-max, not the contract's choice since 0.6; the contract's choice until 0.5). One call
// serves 4 consecutive vocab entries: ctr = (v >> 2, position, request_id lo, request_id hi),
// word = out[v & 3], u = philox_uniform(word) in (0, 1), g = -log(-log(u)) (the project's log).
uint32_t sampling_noise_word(uint64_t seed, uint64_t request_id, uint32_t position, int64_t v);
float sampling_gumbel(uint64_t seed, uint64_t request_id, uint32_t position, int64_t v);

}  // namespace lockstep
