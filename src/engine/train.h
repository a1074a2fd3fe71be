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

namespace lockstep::engine {

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
  void reset();
  TensorView operator[](const std::string& name) const;  // f32, the weight's shape
  const Weights& all() const { return grads_; }
  GradStep& step() { return step_; }
  // Tied embeddings: embed_tokens += the lm_head part (once; a second call throws).
  void finish();
  TensorView tied_lm_head() const;  // the lm_head part of a tied embedding (empty view: untied)

 private:
  Qwen3Config cfg_;
  const OpsBackend* ops_ = nullptr;  // nullptr: host buffers
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
  int64_t bytes() const;
};

// The backward of a model's packed forward. Built from the model's own weights (host bf16 views
// with HF names, as given to Model) and options (contract, tp), on a backend: the invariant CPU
// backend (first form), or `ops` (kept: it must outlive this object; the model whose forward is
// differentiated must run on a backend of the same device).
class Backprop {
 public:
  Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
           const ModelOptions& opt);
  Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
           const ModelOptions& opt, const OpsBackend& ops);
  const OpsBackend& ops() const { return *ops_; }

  // model.forward_packed(tokens, cu_seqlens) with its activations kept. The model must have been
  // built from the same weights and options (its outputs are what the backward differentiates).
  SavedForward forward(Model& model, const TensorView& tokens, const TensorView& cu_seqlens) const;

  // From the log-prob head's upstream gradients (g_lp [T] f32; g_ent [T] f32 or nullptr) at the
  // forward's lse / entropy ([T] f32, from Model::logprob at params.temperature), adds this
  // micro-batch's gradients to `grads`. step_indices[b]: the step index (B.1) of the packed
  // sequence b (any order inside the micro-batch; the micro-batches of a step hold consecutive
  // runs of the step's order and come in that order, else lockstep::Error).
  void backward(const SavedForward& f, const TensorView& targets, const LogprobParams& params,
                const TensorView& lse, const TensorView& entropy, const TensorView& g_lp,
                const TensorView* g_ent, std::span<const int64_t> step_indices,
                Gradients& grads) const;

 private:
  Qwen3Config cfg_;
  ModelOptions opt_;
  std::unique_ptr<OpsBackend> own_;  // the CPU backend of the first constructor
  const OpsBackend* ops_ = nullptr;
  std::map<std::string, Tensor> w_;  // bf16 copies on ops_'s device, HF names
  // Per layer, the TP = S shards (B.2) of the fused column-parallel weights.
  std::vector<std::vector<Tensor>> qkv_shards_, gu_shards_;
  RopeTable rope_;
  void init(const std::map<std::string, TensorView>& weights);
  const TensorView w(const std::string& name) const;
};

}  // namespace lockstep::engine
