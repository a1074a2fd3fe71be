// The Qwen3 backward (docs/contract.md §B.10): a packed training forward that keeps its
// activations, and the backward through it into fp32 gradients for every parameter, by the
// contract's backward ops through an OpsBackend (engine/backend.h): the invariant CPU backend
// (lockstep/ops/backward.h) or the invariant CUDA backend (lockstep/cuda/backward.h), the same
// bits. Weights, saved activations and gradients live on the backend's device.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "lockstep/contract/backward.h"
#include "lockstep/contract/logprob.h"
#include "lockstep/tensor.h"

namespace lockstep::dist {
class Communicator;
}

namespace lockstep::engine {

// Rank-local training (docs/dist.md): the block of weight `name` (an HF name of
// qwen3_weight_specs(cfg)) that rank `rank` of opt.tp holds and whose gradient it computes:
// q|k|v and gate|up their rank's rows (its query heads, kv heads, intermediate range), o_proj and
// down_proj their rank's K columns, the lm_head its vocab segments' rows (as the forward's
// vocab-parallel head), embed_tokens its vocab_shard rows (tied too: the lm_head part of a tied
// table has the segments' rows and Gradients::finish moves it), the norms whole (replicated:
// every rank computes the same bits). tp = 1: every block is whole. r1 / c1 = -1: to the end.
WeightBlock gradient_block(const Qwen3Config& cfg, const ModelOptions& opt, int rank,
                           const std::string& name);

// One training step's fp32 gradients, one per weight of qwen3_weight_specs(cfg) (HF names), all
// +0 at construction and after reset(). Micro-batches add to them in the canonical order (B.1:
// step() refuses one out of order). With tied embeddings the lm_head's gradient and the embedding
// gradient accumulate apart and finish() combines them once (B.7): call it after the step's last
// micro-batch, before reading model.embed_tokens.weight.
class Gradients {
 public:
  explicit Gradients(const Qwen3Config& cfg);  // host buffers
  // Buffers on `ops`'s device (kept: `ops` must outlive this object).
  Gradients(const Qwen3Config& cfg, const OpsBackend& ops);
  // Rank-local (docs/dist.md): rank comm.rank() of a job of comm.size() == opt.tp ranks holds
  // the gradient blocks gradient_block(cfg, opt, rank, name) only (host buffers, or on `ops`'s
  // device). Its Backprop must be the rank-local one of the same rank; finish() is then a
  // collective (call it on every rank). The communicator must outlive this object.
  Gradients(const Qwen3Config& cfg, const ModelOptions& opt, dist::Communicator& comm,
            const OpsBackend* ops = nullptr);
  void reset();
  TensorView operator[](const std::string& name) const;  // f32, the weight's (block's) shape
  const Weights& all() const { return grads_; }
  GradStep& step() { return step_; }
  // Tied embeddings: embed_tokens += the lm_head part (once; a second call throws).
  void finish();
  TensorView tied_lm_head() const;  // the lm_head part of a tied embedding (empty view: untied)
  int rank() const { return comm_ ? rank_ : -1; }  // -1: whole gradients (not rank-local)
  int tp() const { return tp_; }                   // the job's size (1: whole gradients)
  // Rank-local: every rank's blocks gathered, on every rank (a collective): the whole fp32
  // gradients on the host, the bits of a simulated step's Gradients (after finish()). Whole
  // gradients: host copies.
  Weights gather() const;

 private:
  Qwen3Config cfg_;
  const OpsBackend* ops_ = nullptr;  // nullptr: host buffers
  dist::Communicator* comm_ = nullptr;
  ModelOptions opt_;
  int rank_ = 0, tp_ = 1;
  void allocate();
  Weights grads_;
  std::map<std::string, size_t> index_;
  Tensor tied_lm_;
  GradStep step_;
  bool finished_ = false;
};

// The activations of one packed micro-batch's forward that the backward reads, on the backend's
// device (the bytes per token are in docs/engine-model.md); cu_seqlens stays on the host.
struct SavedForward {
  Tensor tokens;      // [T] i32
  Tensor cu_seqlens;  // [B+1] i32, host
  Tensor positions;   // [T] i32
  struct Layer {
    Tensor s1;        // [T, H] the stream into input_layernorm (layer 0: the embedding)
    Tensor xn1;       // [T, H] input_layernorm output (x of q|k|v)
    Tensor q, k, v;   // q / k before their norms, v: [T, Hq·D], [T, Hkv·D] x2
    Tensor q_rope;    // [T, Hq·D] q after norm and RoPE (attention's q)
    Tensor k_rope;    // [T, Hkv·D]
    Tensor attn;      // [T, Hq·D] attention output (x of o_proj)
    Tensor lse;       // [T, Hq] f32 attention's log-sum-exp (the backward's §B.9 input)
    Tensor s2;        // [T, H] the stream after the attention residual add
    Tensor xn2;       // [T, H] post_attention_layernorm output (x of gate|up)
    Tensor gate, up;  // [T, I] each
    Tensor act;       // [T, I] SiLU-and-mul output (x of down_proj)
  };
  std::vector<Layer> layers;
  Tensor s_final;  // [T, H] the stream into the final norm
  Tensor hidden;   // [T, H] the final norm's output (h of the log-prob head)
  // Shared-prompt groups (Backprop::forward_shared, docs/contract.md §B.11): prompt_of [B] i32,
  // host (the segments' prompts, SharedPromptSeqs); empty for an unshared forward.
  bool shared = false;
  Tensor prompt_of;
  int64_t bytes() const;
};

// The log-prob head's rows of a shared-prompt micro-batch (§B.11): head row i reads the hidden
// state of packed row rows[i] (a completion's tokens are predicted by its prompt's last row, then
// by its own rows but the last); seqs: one TokenSeq per completion over the head rows (the
// completion's step index, its first head row, its token count), the head's canonical order
// (B.1 over the head rows: the lm_head's gradient chain).
struct HeadRows {
  std::vector<int64_t> rows;
  std::vector<TokenSeq> seqs;
};

// One GRPO group of a training step: a prompt and its completions (docs/contract.md §B.11).
struct PromptGroup {
  std::vector<int32_t> prompt;                    // >= 1 token
  std::vector<std::vector<int32_t>> completions;  // >= 1, each >= 1 token
};

// A shared-prompt micro-batch of whole groups, the input of Backprop::forward_shared and
// backward_shared. Group k of the step holds the step indices (B.1) s_k .. s_k + G_k with
// s_k = Σ_{k' < k} (1 + G_k'): its prompt's segment, then its completions' in order.
struct SharedPack {
  std::vector<int32_t> tokens, cu, prompt_of;  // [T], [B+1], [B]: segments, their prompts
  std::vector<int64_t> step_indices;           // [B]
  HeadRows head;                               // one head row per completion token
  std::vector<int64_t> targets;                // [Th] the completion token each head row predicts
  // head_row0[i][c]: the first head row of completion c of members[i] (its Gc rows follow).
  std::vector<std::vector<int64_t>> head_row0;
};

// Packs the groups `members` of `groups` (the step's groups, in step order) in the order given
// (the packing order never changes a bit): each group's prompt rows once, then each completion's
// rows (the packed layout of §B.11). Throws lockstep::Error on an empty prompt or completion.
SharedPack pack_prompt_groups(const std::vector<PromptGroup>& groups,
                              std::span<const size_t> members);

// The backward of a model's packed forward. Built from the model's own weights (bf16 views with
// HF names, as given to Model: on the host, or on the backend's device — copied there without a
// host round trip) and options (contract, tp), on a backend: the invariant CPU
// backend (first form), or `ops` (kept: it must outlive this object; the model whose forward is
// differentiated must run on a backend of the same device).
// The log-prob head's forward outputs ([T] f32 views, host or device) a backward may write
// (Backprop::backward's head_out).
struct HeadOutputs {
  TensorView logp, lse, entropy;
};

class Backprop {
 public:
  Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
           const ModelOptions& opt);
  Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
           const ModelOptions& opt, const OpsBackend& ops);
  // Rank-local (docs/dist.md): rank comm.rank() of a job of comm.size() == opt.tp ranks, each
  // built from the same weights, keeping only its rank's blocks (gradient_block) and TP = S
  // shards. Each rank differentiates its own shards and exchanges, by all_gather, the parts the
  // simulated TP combines in-process (column-parallel dX partials, the vocab-parallel head's dh
  // partials, q/k gradients for the replicated q_norm / k_norm weights); the combines are the
  // same ops in rank order, so every rank's gradient blocks have the simulated step's bits. Its
  // gradients must be a rank-local Gradients of the same rank; every call is a collective. tp > 1
  // needs the invariant CPU backend (the vocab-parallel head backward exists there only). The
  // communicator must outlive this object.
  Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
           const ModelOptions& opt, const OpsBackend& ops, dist::Communicator& comm);
  const OpsBackend& ops() const { return *ops_; }
  int rank() const { return comm_ ? comm_rank_ : -1; }  // -1: simulated TP
  int64_t weight_bytes() const;                         // the weight copies this object holds

  // model.forward_packed(tokens, cu_seqlens) with its activations kept. The model must have been
  // built from the same weights and options (its outputs are what the backward differentiates).
  SavedForward forward(Model& model, const TensorView& tokens, const TensorView& cu_seqlens) const;
  // The same over shared-prompt groups: model.forward_packed_shared(tokens, cu_seqlens,
  // prompt_of) (Model, §B.11), prompt_of [B] i32 on the host.
  SavedForward forward_shared(Model& model, const TensorView& tokens, const TensorView& cu_seqlens,
                              const TensorView& prompt_of) const;
  // The head's input of a shared-prompt forward: hidden rows head.rows gathered, [Th, H] bf16
  // (bit copies), on the backend's device.
  Tensor head_hidden(const SavedForward& f, const HeadRows& head) const;

  // From the log-prob head's upstream gradients (g_lp [T] f32; g_ent [T] f32 or nullptr) at the
  // forward's lse / entropy ([T] f32, from Model::logprob at params.temperature), adds this
  // micro-batch's gradients to `grads`. step_indices[b]: the step index (B.1) of the packed
  // sequence b (any order inside the micro-batch; the micro-batches of a step hold consecutive
  // runs of the step's order and come in that order, else lockstep::Error).
  // head_out (optional; whole-model backward only, not rank-local): the head's forward outputs
  // of these inputs written as well ([T] f32 views, host or device: logp, lse, entropy with the
  // bits Model::logprob writes; OpsBackend::linear_logprob_backward_recompute), so that a caller
  // holding the forward's lse already (an on-policy step: the rollout's) passes it in without
  // running the head's forward and compares afterwards.
  void backward(const SavedForward& f, const TensorView& targets, const LogprobParams& params,
                const TensorView& lse, const TensorView& entropy, const TensorView& g_lp,
                const TensorView* g_ent, std::span<const int64_t> step_indices, Gradients& grads,
                const HeadOutputs* head_out = nullptr) const;
  // The backward of a shared-prompt forward (§B.11): the head's inputs (targets, lse, entropy,
  // g_lp, g_ent) are over the head rows of `head` ([Th], lse / entropy from Model::logprob of
  // head_hidden), step_indices[b] is packed segment b's step index (prompts and completions: the
  // B.1 order of every other weight gradient). The head rows' dh are summed into their packed rows
  // in head-row order (a prompt's last row: over its completions). CPU backend only.
  void backward_shared(const SavedForward& f, const HeadRows& head, const TensorView& targets,
                       const LogprobParams& params, const TensorView& lse,
                       const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
                       std::span<const int64_t> step_indices, Gradients& grads) const;

 private:
  SavedForward forward_impl(Model& model, const TensorView& tokens, const TensorView& cu_seqlens,
                            const TensorView* prompt_of) const;
  void backward_impl(const SavedForward& f, const HeadRows* head, const TensorView& targets,
                     const LogprobParams& params, const TensorView& lse, const TensorView& entropy,
                     const TensorView& g_lp, const TensorView* g_ent,
                     std::span<const int64_t> step_indices, Gradients& grads,
                     const HeadOutputs* head_out = nullptr) const;
  Qwen3Config cfg_;
  ModelOptions opt_;
  std::unique_ptr<OpsBackend> own_;  // the CPU backend of the first constructor
  const OpsBackend* ops_ = nullptr;
  dist::Communicator* comm_ = nullptr;  // rank-local: this rank's communicator
  int comm_rank_ = 0;
  // bf16 copies on ops_'s device, HF names (rank-local: the rank's blocks of the weights the
  // backward reads directly: norms, o_proj / down_proj columns, the head's rows).
  std::map<std::string, Tensor> w_;
  // Per layer, the TP = S shards (B.2) of the fused column-parallel weights that this object runs
  // (all S, or the rank's S / tp from shard0_ on).
  std::vector<std::vector<Tensor>> qkv_shards_, gu_shards_;
  int shard0_ = 0;
  RopeTable rope_;
  void init(const std::map<std::string, TensorView>& weights);
  const TensorView w(const std::string& name) const;
};

}  // namespace lockstep::engine
