// The GRPO tests' model and run (tests/engine/test_grpo.cc on the CPU, tests/cuda/test_grpo_cuda.cu
// on the GPU): small enough for a few steps in seconds, with every contract setting that can cut
// (K segments, KV chunks, vocab tiles and segments) cut, and rollout TP 2 vs training TP 1.
#pragma once

#include "engine/default_model.h"
#include "engine/grpo.h"

namespace lockstep::engine::test {

// V=64 H=64 I=128 L=2 Hq=Hkv=4 D=16, tied embeddings.
inline Qwen3Config grpo_test_model() {
  Qwen3Config c;
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  c.bos_token_ids = {1};
  c.eos_token_ids = {2};
  return c;
}

// 3 steps of 4 copy-task prompts x G=4, micro-batches of at most 40 tokens, 8-token pages.
inline GrpoConfig grpo_test_run() {
  GrpoConfig g;
  g.task = "copy";
  g.digits = 3;
  g.steps = 3;
  g.prompts = 4;
  g.group = 4;
  g.seed = 5;
  g.contract.gemm_segments = 4;
  g.contract.kv_chunk = 64;
  g.contract.vocab_tile = 16;
  g.contract.vocab_segments = 4;
  g.rollout_tp = 2;
  g.train_tp = 1;
  g.micro_batch_tokens = 40;
  g.optim.lr = 1e-2;
  g.rollout.kv.page_size = 8;
  g.rollout.kv.num_pages = 128;
  g.rollout.scheduler.max_running = 16;
  g.rollout.scheduler.max_batched_tokens = 64;
  return g;
}

}  // namespace lockstep::engine::test
