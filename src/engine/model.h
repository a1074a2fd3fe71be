// The Qwen3 dense decoder (HF Qwen3ForCausalLM) on an OpsBackend: a training-side packed forward,
// a rollout-side paged step, and the vocab-parallel log-prob / sampling heads, with tensor
// parallelism simulated in-process (tp = 1, 2, 4, 8) or run rank-local (one model per rank over a
// dist::Communicator). With the invariant backend a token's hidden state and log-prob have the
// same bits on every path (packed or paged, any packing, chunking, page size, split-KV, cascade,
// tp, simulated or rank-local, thread count). Description: docs/engine-model.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/safetensors.h"
#include "lockstep/contract.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/rope.h"
#include "lockstep/ops/sampling.h"
#include "lockstep/tensor.h"

namespace lockstep::dist {
class Communicator;
}

namespace lockstep::engine {

// Dimension names (config.h): V vocab, H hidden, I intermediate, L layers, Hq / Hkv heads, D
// head_dim; T packed tokens, B packed sequences, N new tokens of a step, S cache rows (sequences),
// NP pages, P page size, MP pages per block-table row.

struct ModelOptions {
  ContractConfig
      contract;  // every bit-changing setting (gemm_segments >= tp, vocab_segments >= tp)
  int tp = 1;    // tensor-parallel degree: 1, 2, 4 or 8 (simulated, or the communicator's size)
  // RoPE table rows (positions 0 .. max_positions-1); 0: config.max_position_embeddings. Any
  // value gives the same bits for a position (each table entry is computed alone).
  int64_t max_positions = 0;
  std::string to_string() const;  // "tp=2 contract 0.3: gemm_segments=4 ..."
};

// Per-layer paged KV cache storage owned by the caller (the rollout engine allocates pages). A
// simulated-TP model's cache holds all Hkv heads, whatever tp (rank r reads and writes its head
// slice); a rank-local model's cache holds its rank's kv heads only (Model::cache_kv_heads()).
struct KvCacheView {
  // per layer: [NP, P, Hkv, D] bf16 (last dim contiguous), on the backend's device
  std::vector<TensorView> k, v;
  TensorView block_table;  // [S, MP] i32 (host): page of each page-slot of a sequence
  TensorView seq_lens;     // [S] i32 (host): keys valid for attention in this step (incl. new)
  // Prefix sharing (GRPO groups), see SharedPrefix in lockstep/ops/attention.h; read only when
  // StepOptions::cascade is on (attention_paged_cascade). New K/V are always written through the
  // sequence's OWN block_table, so the sequence that prefills a group's prompt must have the
  // group's prefix pages in its own row; the other members' rows are read only at positions
  // >= shared_len. Prefill steps (seq_lens < shared_len) run with cascade off. Host views.
  std::optional<SharedPrefix> prefix;
};

struct StepOptions {
  int kv_splits = 1;     // split-KV count (>= 1): 1 = attention_paged, else _split_kv. Same bits.
  bool cascade = false;  // prefix-shared attention (needs KvCacheView::prefix). Same bits.
  std::string to_string() const;
};

// Activation capture at every op boundary (issue 3 item 7), in this order: "embed" (layer -1);
// per layer "input_residual" (not in layer 0), "input_norm", "q", "k", "v", "q_norm", "k_norm",
// "q_rope", "k_rope", "attn", "attn_lse" (forward_packed only), "o_proj", "post_residual",
// "post_norm", "gate", "up", "act", "down"; then "final_residual", "final_norm" (layer -1). The
// tensor is the full (all-rank, contiguous) activation, rows in the call's token order: [T, Hq·D]
// (q, q_norm, q_rope, attn), [T, Hq] f32 (attn_lse), [T, Hkv·D] (k, v, k_norm, k_rope), [T, I]
// (gate, up, act), else [T, H]. Valid only during the call.
using TraceFn = std::function<void(const std::string& op, int layer, const TensorView& t)>;

// Devices: every weight, activation and KV page lives on the backend's device (ops->device()).
// Metadata arguments (tokens, cu_seqlens, seq, pos, block tables, seq_lens, prefix tables,
// targets, request_ids, positions) are always HOST views: validated on the host, then uploaded
// once per call and used by every layer. Activation arguments and outputs (hidden, hidden_out,
// logp, lse, entropy, token_ids) may be host views or views on the backend's device; a host one
// is staged through a device temporary (outputs are copied back and the call waits for them). A
// call whose outputs are all on the device does not wait for the device. KV-cache views must be on
// the backend's device. With a CPU backend nothing is copied.
class Model {
 public:
  // Takes weights from a checkpoint (bf16 kept as is, zero-copy on a CPU backend, one upload to a
  // device backend; f32/f16 rounded to bf16 RNE once at load), checks it against `cfg` with
  // ckpt.check_qwen3(cfg) (layer count, names, shapes, dtypes, NaN/Inf: clear errors; warnings
  // are not reported here: use Checkpoint::load with a LoadOptions::warn sink, or strict, first),
  // and shards the weights for options.tp. A CPU-backend model keeps the checkpoint's mapping
  // alive.
  //
  // comm: nullptr simulates all options.tp ranks in this one model. Otherwise the model is rank
  // comm->rank() of a job of comm->size() == options.tp ranks (one model per rank, each made with
  // its own communicator, the same config, options and weights): it keeps only its rank's shards
  // (its query / kv heads of q|k|v and o_proj, its intermediate columns of gate|up and down_proj,
  // its vocab rows of the embedding and the lm_head; the norms are replicated) and exchanges the
  // row-parallel fp32 partials, the embedding parts, the log-prob tile states and the sampling
  // logits with the other ranks by all_gather, combining them with the same canonical ops as the
  // simulated TP: every rank's outputs have the simulated model's bits. Every call (and
  // set_trace) must then be made on every rank with the same arguments, like a collective. The
  // communicator must outlive the model. The views the model hands to the communicator live on
  // the backend's device (the thread transport takes host views only: a CPU backend).
  Model(const Qwen3Config& cfg, const Checkpoint& ckpt, const ModelOptions& opt,
        std::shared_ptr<OpsBackend> ops, dist::Communicator* comm = nullptr);
  // Same from named weights (HF names, e.g. from random_qwen3_weights): bf16 or f32 views of the
  // qwen3_weight_specs(cfg) shapes (last dim contiguous) on the host, or bf16 views on the
  // backend's device; they are copied (f32 rounded to bf16 on the host).
  Model(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
        const ModelOptions& opt, std::shared_ptr<OpsBackend> ops,
        dist::Communicator* comm = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const Qwen3Config& config() const;
  const ModelOptions& options() const;
  const OpsBackend& ops() const;
  const RopeTable& rope_table() const;  // positions 0 .. max_position_embeddings-1
  int64_t weight_bytes() const;         // bytes of weights this model's store copied/packed
  int rank() const;  // this model's rank in a rank-local job, -1 for a simulated-TP model
  // kv heads per layer the KV cache of forward_step holds: Hkv (simulated TP), the rank's kv
  // heads (rank-local: Hkv / tp, or 1 when Hkv < tp and heads are replicated).
  int64_t cache_kv_heads() const;

  // A model with the same weights (shared, not copied), config, options and communicator on
  // another backend of the same device, e.g. the invariant and the baseline CUDA backends over
  // one upload.
  std::unique_ptr<Model> with_backend(std::shared_ptr<OpsBackend> ops) const;

  // Training side: packed sequences, tokens [T] i32/i64, cu_seqlens [B+1] i32 (B sequences,
  // each starting at position 0). Writes the final-normed hidden states [T, H] bf16.
  void forward_packed(const TensorView& tokens, const TensorView& cu_seqlens,
                      const TensorView& hidden_out) const;
  // The same over shared-prompt groups (docs/contract.md §B.11): cu_seqlens cuts the rows into
  // segments and prompt_of [B] i32 (host) names each completion's prompt segment (-1: a prompt or a
  // sequence of its own); a completion's rows sit at positions Lp .. and attend to its prompt's
  // keys then its own. Every row's hidden state has the bits of the same row in an unshared
  // forward_packed (the prompt + completion as one sequence). The invariant backends (CPU, CUDA)
  // implement the shared attention; others throw lockstep::Error.
  void forward_packed_shared(const TensorView& tokens, const TensorView& cu_seqlens,
                             const TensorView& prompt_of, const TensorView& hidden_out) const;

  // Rollout side: one engine step over N new tokens of sequences that live in `cache`:
  // tokens [N] i32/i64, seq [N] i32 (row of the cache's block table), pos [N] i32 (absolute
  // position). Writes each token's K/V (every layer) into the cache at its slot, attends (causal,
  // up to and including pos) and writes final-normed hidden [N, H] bf16. Within a step, a sequence
  // may have several consecutive new tokens (chunked prefill) — their K/V are written before
  // attention. Requires pos < seq_lens[seq] and all positions < seq_lens[seq] written by now.
  void forward_step(const TensorView& tokens, const TensorView& seq, const TensorView& pos,
                    KvCacheView& cache, const StepOptions& step,
                    const TensorView& hidden_out) const;

  // Heads (lm_head = lm_head.weight or the tied embed_tokens), vocab-parallel across tp ranks.
  // hidden [T, H] bf16; targets [T] i32/i64 (in [0, V), or -1: no target, logp written as +0);
  // logp, lse, entropy [T] f32 at the given temperature (> 0).
  void logprob(const TensorView& hidden, const TensorView& targets, float temperature,
               const TensorView& logp, const TensorView& lse, const TensorView& entropy) const;
  // One token per row, the sampling op's contract (lockstep/ops/sampling.h): token_ids [T]
  // i32/i64, logp/lse/entropy [T] f32 = logprob(hidden, token_ids,
  // params[t].logprob_temperature()). request_ids [T] i64, positions [T] i32/i64 (the Philox
  // counter).
  void sample(const TensorView& hidden, std::span<const SamplingParams> params,
              const TensorView& request_ids, const TensorView& positions,
              const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
              const TensorView& entropy) const;

  // Optional per-op activation capture (nullptr: off). A rank-local model gathers the other
  // ranks' columns, so every rank sees the full activations: set it on every rank or on none.
  void set_trace(TraceFn fn);

 private:
  Model();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::engine
