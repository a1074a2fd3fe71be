// The "baseline" OpsBackend: the same op set as the invariant backend, computed the way ordinary
// inference and training stacks do it (OpenBLAS sgemm / sgemv, batch-dependent reductions and
// split-KV, plain sequential tensor-parallel sums, plain log_softmax with libm exp/log). Every op
// is a correct implementation of the math (tested against fp64 oracles), but a token's bits depend
// on the batch around it, the prefill/decode path and the TP degree — the train-vs-rollout
// mismatches `lockstep audit --baseline` shows. What each op does and what it mirrors:
// docs/baseline.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend.h"

namespace lockstep::engine {

// Every setting of the baseline kernels. Unlike the contract's settings, the kernels apply these
// as functions of the batch (that is the point); the values themselves are fixed when the backend
// is made, so one backend object gives the same bits for the same call (methods stay const).
struct BaselineConfig {
  // Machine width (the SM count of a GPU, the core count of a CPU). RMSNorm of a call with
  // T < num_threads tokens splits every row's sum of squares into num_threads consecutive parts
  // added in order (the "split reduction for small batches" kernel); otherwise a plain loop.
  int num_threads = 1;
  // Paged attention: keys per online-softmax block: kv_block_small when the call holds at most
  // kv_block_switch distinct sequences, kv_block_large when it holds more.
  int kv_block_small = 32;
  int kv_block_large = 128;
  int kv_block_switch = 4;
  // Paged attention (attention_paged, _cascade): every row's keys [0, ctx) are cut into
  // splits = max(1, kv_split_budget / sequences) ranges [ctx·i/splits, ctx·(i+1)/splits), merged
  // in order. attention_paged_split_kv uses the caller's num_splits instead.
  int kv_split_budget = 8;
  // LogP and sampling: token rows per logits GEMM (a block of one row goes through sgemv), and
  // vocab rows of W converted to fp32 per GEMM call.
  int64_t logits_token_block = 256;
  int64_t logits_vocab_chunk = 8192;

  void validate() const;  // throws lockstep::Error
  // "baseline: num_threads=2 kv_block=32/128 (switch at >4 seqs) kv_split_budget=8 ..."
  std::string to_string() const;
};

// The default settings for a machine of `num_threads` threads (0: lockstep::num_threads()).
BaselineConfig default_baseline_config(int num_threads = 0);

// The baseline backend; name() is "baseline".
std::unique_ptr<OpsBackend> make_baseline_backend(
    int num_threads = 0 /*0: lockstep::num_threads()*/);
std::unique_ptr<OpsBackend> make_baseline_backend(const BaselineConfig& config);

}  // namespace lockstep::engine
