// Shared helpers of the rollout / audit tests: a tiny random-weight Qwen3 model (fast enough for
// dozens of whole rollouts per test binary), random request sets and bitwise comparison of rollout
// records.
#pragma once

#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/rollout.h"
#include "util/test_util.h"

namespace lockstep::engine::test_util {

// V=300 (not a multiple of any tile: vocab padding is exercised), H=64, I=96, L=2, Hq=4, Hkv=2,
// D=16 (Hq and Hkv divide by TP 1/2/4 as the model requires). Many EOS ids, so that stop-on-EOS
// ends sequences at varied lengths.
inline Qwen3Config tiny_config() {
  Qwen3Config c;
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  c.torch_dtype = "bfloat16";
  c.bos_token_ids = {1};
  c.eos_token_ids = {2, 13, 29, 41, 57, 88, 101, 150, 222, 299};
  c.validate();
  return c;
}

// The same shapes, untied, no bos/eos, 512 positions: the model tests' and baseline tests' model.
// I=96 with gemm_segments=4 gives tp=4 rank 3 an empty intermediate range (K padded to 128: ranks
// own [0,32) [32,64) [64,96) [96,96)).
inline Qwen3Config small_untied_config() {
  Qwen3Config c = tiny_config();
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = false;
  c.bos_token_ids.clear();
  c.eos_token_ids.clear();
  return c;
}

// The contract both sides use in tests: segments for TP up to 4, small chunks so that sequences
// of a few dozen tokens span several KV chunks (split-KV and cascade really split).
inline ContractConfig tiny_contract() {
  ContractConfig c;
  c.gemm_segments = 4;
  c.vocab_segments = 4;
  c.kv_chunk = 64;
  c.vocab_tile = 32;
  return c;
}

class TinyModel {
 public:
  explicit TinyModel(uint64_t seed = 0x7e57, Qwen3Config cfg = tiny_config())
      : cfg_(cfg), weights_(random_qwen3_weights(cfg_, seed)) {
    for (auto& [name, t] : weights_) views_[name] = t.view();
  }
  const Qwen3Config& config() const { return cfg_; }
  // comm: a rank-local model of that communicator's job (nullptr: simulated TP).
  std::unique_ptr<Model> make(int tp, std::shared_ptr<OpsBackend> backend = nullptr,
                              const ContractConfig& contract = tiny_contract(),
                              dist::Communicator* comm = nullptr) const {
    ModelOptions o;
    o.contract = contract;
    o.tp = tp;
    if (!backend) backend = std::shared_ptr<OpsBackend>(make_invariant_backend());
    return std::make_unique<Model>(cfg_, views_, o, std::move(backend), comm);
  }

 private:
  Qwen3Config cfg_;
  Weights weights_;
  std::map<std::string, TensorView> views_;
};

// `prompts` prompts x G samples with assorted sampling settings and lengths.
inline std::vector<RolloutRequest> make_requests(std::mt19937_64& g, int prompts, int G,
                                                 int max_prompt, int max_new, int64_t V) {
  std::vector<RolloutRequest> out;
  for (int p = 0; p < prompts; ++p) {
    std::vector<int32_t> prompt(1 + g() % max_prompt);
    for (auto& t : prompt) t = int32_t(g() % V);
    SamplingParams sp;
    sp.seed = g();
    switch (g() % 5) {
      case 0:
        sp.temperature = 1.0f;
        break;
      case 1:
        sp.temperature = 0.8f, sp.top_k = 20;
        break;
      case 2:
        sp.temperature = 1.1f, sp.top_p = 0.85f;
        break;
      case 3:
        sp.temperature = 0.9f, sp.min_p = 0.1f;
        break;
      case 4:
        sp.temperature = 0.0f;
        break;
    }
    const bool eos = g() % 3 != 0;
    for (int s = 0; s < G; ++s) {
      RolloutRequest r;
      r.id = p * G + s;
      r.prompt = prompt;
      r.sampling = sp;
      r.max_new_tokens = 1 + int64_t(g() % max_new);
      r.stop_on_eos = eos;
      r.group = p;
      out.push_back(r);
    }
  }
  return out;
}

// Bitwise equality of two rollouts' records (tokens, logp, lse, entropy, finish reason).
inline ::testing::AssertionResult same_completions(const std::vector<Completion>& a,
                                                   const std::vector<Completion>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " completions";
  for (size_t i = 0; i < a.size(); ++i) {
    const Completion &x = a[i], &y = b[i];
    if (x.id != y.id) return ::testing::AssertionFailure() << "completion " << i << ": ids differ";
    if (x.tokens != y.tokens) {
      size_t j = 0;
      while (j < x.tokens.size() && j < y.tokens.size() && x.tokens[j] == y.tokens[j]) ++j;
      return ::testing::AssertionFailure()
             << "request " << x.id << ": tokens differ at index " << j << " (lengths "
             << x.tokens.size() << ", " << y.tokens.size() << ")";
    }
    if (x.finish != y.finish)
      return ::testing::AssertionFailure() << "request " << x.id << ": finish reasons differ";
    for (auto [name, u, v] :
         {std::tuple{"logp", &x.logp, &y.logp}, std::tuple{"lse", &x.lse, &y.lse},
          std::tuple{"entropy", &x.entropy, &y.entropy}}) {
      auto r = test::bitwise_equal(*u, *v);
      if (!r)
        return ::testing::AssertionFailure()
               << "request " << x.id << " " << name << ": " << r.message();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace lockstep::engine::test_util
