// The Qwen3 backward (docs/contract.md §B.10): saved forward activations (through the model's
// trace) and the reverse pass by the contract's backward ops.
#include "engine/train.h"

#include <cstring>
#include <utility>

#include "lockstep/contract/gemm.h"
#include "lockstep/contract/norm.h"
#include "lockstep/error.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/backward.h"
#include "lockstep/ops/gemm.h"

namespace lockstep::engine {
namespace {

constexpr const char* kOp = "Backprop";

// A contiguous host copy of a host view of any row stride (2-D, or 1-D).
Tensor copy_of(const TensorView& v) {
  LS_CHECK(v.device == Device::kCPU, kOp, "expected a host view");
  Tensor t(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.ndim));
  const int64_t es = dtype_size(v.dtype);
  if (v.ndim == 1) {
    for (int64_t i = 0; i < v.shape[0]; ++i)
      std::memcpy(static_cast<char*>(t.data()) + i * es,
                  static_cast<const char*>(v.data) + i * v.stride[0] * es, size_t(es));
    return t;
  }
  LS_CHECK(v.ndim == 2 && (v.shape[1] <= 1 || v.stride[1] == 1), kOp,
           "expected a 2-D view with contiguous rows, got ", v.shape_string());
  for (int64_t r = 0; r < v.shape[0]; ++r)
    std::memcpy(static_cast<char*>(t.data()) + r * v.shape[1] * es,
                static_cast<const char*>(v.data) + r * v.stride[0] * es, size_t(v.shape[1] * es));
  return t;
}

TensorView cols(const TensorView& m, int64_t c0, int64_t c1) {
  TensorView v = m;
  v.data = static_cast<char*>(m.data) + c0 * m.stride[1] * dtype_size(m.dtype);
  v.shape[1] = c1 - c0;
  return v;
}

// Rows [r0, r1) of each range, stacked: a [Σ, C] contiguous copy.
Tensor stack_rows(const TensorView& m, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t n = 0;
  for (auto [a, b] : ranges) n += b - a;
  Tensor t(m.dtype, {n, m.shape[1]});
  const int64_t es = dtype_size(m.dtype), C = m.shape[1];
  int64_t o = 0;
  for (auto [a, b] : ranges)
    for (int64_t r = a; r < b; ++r, ++o)
      std::memcpy(static_cast<char*>(t.data()) + o * C * es,
                  static_cast<const char*>(m.data) + r * m.stride[0] * es, size_t(C * es));
  return t;
}

// Columns [c0, c1) of each range, side by side: a [R, Σ] contiguous copy.
Tensor stack_cols(const TensorView& m, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t n = 0;
  for (auto [a, b] : ranges) n += b - a;
  const int64_t R = m.shape[0], es = dtype_size(m.dtype);
  Tensor t(m.dtype, {R, n});
  for (int64_t r = 0; r < R; ++r) {
    int64_t o = 0;
    for (auto [a, b] : ranges) {
      std::memcpy(static_cast<char*>(t.data()) + (r * n + o) * es,
                  static_cast<const char*>(m.data) + (r * m.stride[0] + a) * es,
                  size_t((b - a) * es));
      o += b - a;
    }
  }
  return t;
}

// round_bf16 of an f32 [R, C] tensor (RNE, canonical NaN): the tensor-core operand (B.0).
Tensor to_bf16(const Tensor& f) {
  Tensor t(DType::kBF16, f.shape());
  const float* s = f.ptr<float>();
  bf16* d = t.ptr<bf16>();
  for (int64_t i = 0; i < f.numel(); ++i) d[i] = f32_to_bf16(s[i]);
  return t;
}

Tensor zeros_f32(std::vector<int64_t> shape) {
  Tensor t(DType::kF32, std::move(shape));
  std::memset(t.data(), 0, size_t(t.nbytes()));  // +0
  return t;
}

TensorView heads(const Tensor& t, int64_t n, int64_t D) {
  TensorView v = t.view();
  const int64_t T = t.shape()[0];
  return TensorView::contiguous(v.data, v.dtype, {T, n, D});
}

}  // namespace

// --- Gradients ---

Gradients::Gradients(const Qwen3Config& cfg) : cfg_(cfg) {
  for (const WeightSpec& s : qwen3_weight_specs(cfg)) {
    index_[s.name] = grads_.size();
    grads_.emplace_back(s.name, zeros_f32(s.shape));
  }
  if (cfg.tie_word_embeddings) tied_lm_ = zeros_f32({cfg.vocab_size, cfg.hidden_size});
}

void Gradients::reset() {
  for (auto& [name, t] : grads_) std::memset(t.data(), 0, size_t(t.nbytes()));
  if (tied_lm_.numel()) std::memset(tied_lm_.data(), 0, size_t(tied_lm_.nbytes()));
  step_.reset();
  finished_ = false;
}

TensorView Gradients::operator[](const std::string& name) const {
  auto it = index_.find(name);
  LS_CHECK(it != index_.end(), "Gradients", "no parameter named '", name, "'");
  return grads_[it->second].second.view();
}

TensorView Gradients::tied_lm_head() const {
  return tied_lm_.numel() ? tied_lm_.view() : TensorView{};
}

void Gradients::finish() {
  LS_CHECK(!finished_, "Gradients::finish", "already finished for this step (reset() first)");
  finished_ = true;
  if (!cfg_.tie_word_embeddings) return;
  // dE = d_lm_head ⊕ d_embed, element-wise, in that order (B.7).
  float* e = (*this)["model.embed_tokens.weight"].ptr<float>();
  const float* l = tied_lm_.ptr<float>();
  for (int64_t i = 0; i < tied_lm_.numel(); ++i) e[i] = l[i] + e[i];
}

int64_t SavedForward::bytes() const {
  int64_t b = tokens.nbytes() + cu_seqlens.nbytes() + positions.nbytes() + s_final.nbytes() +
              hidden.nbytes();
  for (const Layer& L : layers)
    for (const Tensor* t : {&L.s1, &L.xn1, &L.q, &L.k, &L.v, &L.q_rope, &L.k_rope, &L.attn, &L.s2,
                            &L.xn2, &L.gate, &L.up, &L.act})
      b += t->nbytes();
  return b;
}

// --- Backprop ---

Backprop::Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
                   const ModelOptions& opt)
    : cfg_(cfg), opt_(opt) {
  cfg.validate();
  opt.contract.validate();
  const int S = opt.contract.gemm_segments;
  const int64_t Hq = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads;
  const int64_t D = cfg.head_dim, I = cfg.intermediate_size;
  LS_CHECK(Hq % S == 0 && Hkv % S == 0, kOp, "the 0.2 backward needs Hq (", Hq, ") and Hkv (", Hkv,
           ") to be multiples of gemm_segments (", S,
           "): kv heads replicated across TP shards are not supported (docs/contract.md §B.2)");
  LS_CHECK(opt.tp >= 1 && S % opt.tp == 0, kOp, "tp (", opt.tp, ") must divide gemm_segments (", S,
           ")");
  for (const WeightSpec& s : qwen3_weight_specs(cfg)) {
    auto it = weights.find(s.name);
    LS_CHECK(it != weights.end(), kOp, "missing weight '", s.name, "'");
    const TensorView& v = it->second;
    LS_CHECK(v.device == Device::kCPU && v.dtype == DType::kBF16, kOp, "weight '", s.name,
             "' must be a bf16 host view");
    LS_CHECK(std::vector<int64_t>(v.shape, v.shape + v.ndim) == s.shape, kOp, "weight '", s.name,
             "' has shape ", v.shape_string());
    w_[s.name] = copy_of(v);
  }
  RopeConfig rc;
  rc.head_dim = D;
  rc.theta = cfg.rope_theta;
  rc.max_positions = opt.max_positions > 0 ? opt.max_positions : cfg.max_position_embeddings;
  rope_ = RopeTable::build(rc);
  const GemmConfig gemm = GemmConfig::from_contract(opt.contract);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Tensor> qkv, gu;
    for (int s = 0; s < S; ++s) {
      // Shard s (B.2): its q rows, k rows, v rows; its gate rows, up rows.
      const int64_t q0 = s * (Hq / S) * D, q1 = (s + 1) * (Hq / S) * D;
      const int64_t k0 = s * (Hkv / S) * D, k1 = (s + 1) * (Hkv / S) * D;
      const Tensor wq = stack_rows(w(p + "self_attn.q_proj.weight"), {{q0, q1}});
      const Tensor wk = stack_rows(w(p + "self_attn.k_proj.weight"), {{k0, k1}});
      const Tensor wv = stack_rows(w(p + "self_attn.v_proj.weight"), {{k0, k1}});
      Tensor fused(DType::kBF16, {(q1 - q0) + 2 * (k1 - k0), cfg.hidden_size});
      const int64_t row_bytes = cfg.hidden_size * 2;
      char* dst = static_cast<char*>(fused.data());
      for (const Tensor* t : {&wq, &wk, &wv}) {
        std::memcpy(dst, t->data(), size_t(t->shape()[0] * row_bytes));
        dst += t->shape()[0] * row_bytes;
      }
      qkv.push_back(std::move(fused));
      const GemmKRange ir = gemm_tp_k_range(gemm, I, S, s);
      const Tensor wg = stack_rows(w(p + "mlp.gate_proj.weight"), {{ir.begin, ir.end}});
      const Tensor wu = stack_rows(w(p + "mlp.up_proj.weight"), {{ir.begin, ir.end}});
      Tensor g2(DType::kBF16, {2 * (ir.end - ir.begin), cfg.hidden_size});
      std::memcpy(g2.data(), wg.data(), size_t(wg.nbytes()));
      std::memcpy(static_cast<char*>(g2.data()) + wg.nbytes(), wu.data(), size_t(wu.nbytes()));
      gu.push_back(std::move(g2));
    }
    qkv_shards_.push_back(std::move(qkv));
    gu_shards_.push_back(std::move(gu));
  }
}

const TensorView Backprop::w(const std::string& name) const {
  auto it = w_.find(name);
  LS_CHECK(it != w_.end(), kOp, "no weight '", name, "'");
  return it->second.view();
}

SavedForward Backprop::forward(Model& model, const TensorView& tokens,
                               const TensorView& cu_seqlens) const {
  LS_CHECK(model.ops().device() == Device::kCPU, kOp,
           "the backward runs on the CPU reference only for now (the CUDA backward kernels are "
           "not written yet); build the model on a CPU backend");
  LS_CHECK(model.config().to_string() == cfg_.to_string(), kOp,
           "the model's config differs from the backward's: ", model.config().to_string(), " vs ",
           cfg_.to_string());
  LS_CHECK(model.options().to_string() == opt_.to_string(), kOp,
           "the model's options differ from the backward's: ", model.options().to_string(), " vs ",
           opt_.to_string());
  const int64_t T = tokens.size(0), L = cfg_.num_hidden_layers;
  SavedForward f;
  f.layers.resize(size_t(L));
  Tensor hidden(DType::kBF16, {T, cfg_.hidden_size});
  model.set_trace([&](const std::string& op, int layer, const TensorView& t) {
    SavedForward::Layer* Ls = layer >= 0 ? &f.layers[size_t(layer)] : nullptr;
    static const std::map<std::string, Tensor SavedForward::Layer::*> kLayer = {
        {"input_residual", &SavedForward::Layer::s1},
        {"input_norm", &SavedForward::Layer::xn1},
        {"q", &SavedForward::Layer::q},
        {"k", &SavedForward::Layer::k},
        {"v", &SavedForward::Layer::v},
        {"q_rope", &SavedForward::Layer::q_rope},
        {"k_rope", &SavedForward::Layer::k_rope},
        {"attn", &SavedForward::Layer::attn},
        {"post_residual", &SavedForward::Layer::s2},
        {"post_norm", &SavedForward::Layer::xn2},
        {"gate", &SavedForward::Layer::gate},
        {"up", &SavedForward::Layer::up},
        {"act", &SavedForward::Layer::act}};
    if (op == "embed") {
      if (L > 0) f.layers[0].s1 = copy_of(t);
    } else if (op == "final_residual") {
      f.s_final = copy_of(t);
    } else if (auto it = kLayer.find(op); it != kLayer.end() && Ls) {
      Ls->*(it->second) = copy_of(t);
    }
  });
  try {
    model.forward_packed(tokens, cu_seqlens, hidden.view());
  } catch (...) {
    model.set_trace(nullptr);
    throw;
  }
  model.set_trace(nullptr);
  f.hidden = std::move(hidden);
  f.invariant = model.ops().name() == "invariant";
  f.tokens = Tensor(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) {
    f.tokens.ptr<int32_t>()[t] =
        tokens.dtype == DType::kI64
            ? int32_t(static_cast<const int64_t*>(tokens.data)[t * tokens.stride[0]])
            : static_cast<const int32_t*>(tokens.data)[t * tokens.stride[0]];
  }
  f.cu_seqlens = copy_of(cu_seqlens);
  f.positions = Tensor(DType::kI32, {T});
  const int32_t* cu = f.cu_seqlens.ptr<int32_t>();
  for (int64_t b = 0; b + 1 < f.cu_seqlens.numel(); ++b)
    for (int32_t t = cu[b]; t < cu[b + 1]; ++t) f.positions.ptr<int32_t>()[t] = t - cu[b];
  for (int64_t l = 0; l < L; ++l)
    LS_CHECK(f.layers[size_t(l)].act.numel() == T * cfg_.intermediate_size || T == 0, kOp,
             "the forward's trace lacks layer ", l, "'s activations");
  return f;
}

void Backprop::backward(const SavedForward& f, const TensorView& targets,
                        const LogprobParams& params, const TensorView& lse,
                        const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
                        std::span<const int64_t> step_indices, Gradients& grads) const {
  const int64_t T = f.tokens.numel();
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, D = cfg_.head_dim;
  const int64_t Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
  const int S = opt_.contract.gemm_segments, tp = opt_.tp;
  const ContractConfig& contract = opt_.contract;
  const GemmConfig gemm = GemmConfig::from_contract(contract);
  RmsNormConfig norm;
  norm.eps = cfg_.rms_norm_eps_f32();
  const AttentionConfig attn = AttentionConfig::from_contract(contract);

  const PackedSeqs seqs = PackedSeqs::validate(kOp, f.cu_seqlens.view(), T);
  LS_CHECK(int64_t(step_indices.size()) == seqs.B(), kOp, "step_indices has ", step_indices.size(),
           " entries for ", seqs.B(), " packed sequences");
  std::vector<TokenSeq> ts;
  for (int64_t b = 0; b < seqs.B(); ++b)
    ts.push_back({step_indices[size_t(b)], seqs.cu()[size_t(b)],
                  seqs.cu()[size_t(b) + 1] - seqs.cu()[size_t(b)]});
  const TokenOrder order = TokenOrder::make(kOp, std::move(ts), T);
  grads.step().accept(order);
  if (T == 0) return;
  const GemmConfig one{1};

  // The dX of a column-parallel layer (B.2, B.3): one chain per TP = S shard, the shard results
  // combined by tree; simulated TP: rank r of tp combines its S/tp shards, then the ranks combine.
  auto column_dx = [&](const Tensor& dy_b, const std::vector<Tensor>& w_shards,
                       const std::vector<std::vector<std::pair<int64_t, int64_t>>>& shard_cols) {
    std::vector<Tensor> part;
    for (int s = 0; s < S; ++s) {
      const Tensor dys = stack_cols(dy_b.view(), shard_cols[size_t(s)]);
      part.push_back(Tensor(DType::kF32, {T, H}));
      cpu::gemm_bf16_dx(dys.view(), w_shards[size_t(s)].view(), one, part.back().view());
    }
    std::vector<Tensor> rank;
    std::vector<TensorView> rank_views;
    for (int r = 0; r < tp; ++r) {
      std::vector<TensorView> mine;
      for (int s = r * (S / tp); s < (r + 1) * (S / tp); ++s)
        mine.push_back(part[size_t(s)].view());
      rank.push_back(Tensor(DType::kF32, {T, H}));
      cpu::gemm_tree_combine(mine, nullptr, rank.back().view());
      rank_views.push_back(rank.back().view());
    }
    Tensor dx(DType::kF32, {T, H});
    cpu::gemm_tree_combine(rank_views, nullptr, dx.view());
    return dx;
  };

  // Head: dh and dW of the lm_head (tied: the separate lm_head buffer, B.7).
  const bool tied = cfg_.tie_word_embeddings;
  const TensorView w_lm = w(tied ? "model.embed_tokens.weight" : "lm_head.weight");
  const TensorView dw_lm = tied ? grads.tied_lm_head() : grads["lm_head.weight"];
  Tensor gh(DType::kF32, {T, H});
  cpu::linear_logprob_backward(f.hidden.view(), w_lm, targets, params, contract, lse, entropy, g_lp,
                               g_ent, gh.view(), order, dw_lm);
  // Final norm (its residual_out is not used downstream: gres = +0).
  Tensor d(DType::kF32, {T, H});
  {
    const Tensor zero = zeros_f32({T, H});
    const TensorView dwn = grads["model.norm.weight"];
    cpu::rmsnorm_residual_backward(f.s_final.view(), w("model.norm.weight"), norm, gh.view(),
                                   zero.view(), d.view(), &order, &dwn);
  }

  for (int64_t l = cfg_.num_hidden_layers - 1; l >= 0; --l) {
    const SavedForward::Layer& A = f.layers[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // d: the gradient of this layer's down output and of s2 (both feed the next add).
    // MLP: down (row-parallel: one segment), SiLU-and-mul, gate|up (column-parallel).
    const Tensor dy_down = to_bf16(d);
    Tensor d_act(DType::kF32, {T, I});
    cpu::gemm_bf16_dx(dy_down.view(), w(p + "mlp.down_proj.weight"), one, d_act.view());
    cpu::gemm_bf16_dw(dy_down.view(), A.act.view(), order, grads[p + "mlp.down_proj.weight"]);
    Tensor gu(DType::kBF16, {T, 2 * I});  // the forward's gate|up layout (§E.3)
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(gu.ptr<bf16>() + t * 2 * I, A.gate.ptr<bf16>() + t * I, size_t(I * 2));
      std::memcpy(gu.ptr<bf16>() + t * 2 * I + I, A.up.ptr<bf16>() + t * I, size_t(I * 2));
    }
    Tensor dgu(DType::kF32, {T, 2 * I});
    cpu::silu_mul_backward(gu.view(), d_act.view(), dgu.view());
    const Tensor dgu_b = to_bf16(dgu);
    cpu::gemm_bf16_dw(cols(dgu_b.view(), 0, I), A.xn2.view(), order,
                      grads[p + "mlp.gate_proj.weight"]);
    cpu::gemm_bf16_dw(cols(dgu_b.view(), I, 2 * I), A.xn2.view(), order,
                      grads[p + "mlp.up_proj.weight"]);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> gu_cols;
    for (int s = 0; s < S; ++s) {
      const GemmKRange ir = gemm_tp_k_range(gemm, I, S, s);
      gu_cols.push_back({{ir.begin, ir.end}, {I + ir.begin, I + ir.end}});
    }
    const Tensor d_xn2 = column_dx(dgu_b, gu_shards_[size_t(l)], gu_cols);
    Tensor ds2(DType::kF32, {T, H});
    {
      const TensorView dwn = grads[p + "post_attention_layernorm.weight"];
      cpu::rmsnorm_residual_backward(A.s2.view(), w(p + "post_attention_layernorm.weight"), norm,
                                     d_xn2.view(), d.view(), ds2.view(), &order, &dwn);
    }

    // Attention: o_proj (row-parallel), attention, RoPE, q/k norms, q|k|v (column-parallel).
    const Tensor dy_o = to_bf16(ds2);
    Tensor d_attn(DType::kF32, {T, Hq * D});
    cpu::gemm_bf16_dx(dy_o.view(), w(p + "self_attn.o_proj.weight"), one, d_attn.view());
    cpu::gemm_bf16_dw(dy_o.view(), A.attn.view(), order, grads[p + "self_attn.o_proj.weight"]);
    const Tensor dout = to_bf16(d_attn);
    // The forward's lse (recomputed: the same bits; the trace does not carry it) and out.
    Tensor out(DType::kBF16, {T, Hq, D}), lse_a(DType::kF32, {T, Hq});
    cpu::attention_prefill_varlen(heads(A.q_rope, Hq, D), heads(A.k_rope, Hkv, D),
                                  heads(A.v, Hkv, D), seqs, attn, out.view(), lse_a.view());
    LS_CHECK(!f.invariant || std::memcmp(out.data(), A.attn.data(), size_t(out.nbytes())) == 0, kOp,
             "layer ", l,
             ": the recomputed attention differs from the saved forward's (weights or options "
             "differ from the model's?)");
    Tensor dq(DType::kF32, {T, Hq, D}), dk(DType::kF32, {T, Hkv, D}), dv(DType::kF32, {T, Hkv, D});
    cpu::attention_backward_varlen(heads(A.q_rope, Hq, D), heads(A.k_rope, Hkv, D),
                                   heads(A.v, Hkv, D), out.view(), lse_a.view(), heads(dout, Hq, D),
                                   seqs, attn, dq.view(), dk.view(), dv.view());
    cpu::rope_backward(dq.view(), f.positions.view(), rope_, dq.view());
    cpu::rope_backward(dk.view(), f.positions.view(), rope_, dk.view());
    Tensor dqkv(DType::kF32, {T, (Hq + 2 * Hkv) * D});
    {
      Tensor dq_raw(DType::kF32, {T, Hq, D}), dk_raw(DType::kF32, {T, Hkv, D});
      const TensorView dqn = grads[p + "self_attn.q_norm.weight"];
      const TensorView dkn = grads[p + "self_attn.k_norm.weight"];
      cpu::rmsnorm_backward(heads(A.q, Hq, D), w(p + "self_attn.q_norm.weight"), norm, dq.view(),
                            dq_raw.view(), &order, &dqn);
      cpu::rmsnorm_backward(heads(A.k, Hkv, D), w(p + "self_attn.k_norm.weight"), norm, dk.view(),
                            dk_raw.view(), &order, &dkn);
      const int64_t W = (Hq + 2 * Hkv) * D;
      for (int64_t t = 0; t < T; ++t) {
        float* row = dqkv.ptr<float>() + t * W;
        std::memcpy(row, dq_raw.ptr<float>() + t * Hq * D, size_t(Hq * D * 4));
        std::memcpy(row + Hq * D, dk_raw.ptr<float>() + t * Hkv * D, size_t(Hkv * D * 4));
        std::memcpy(row + (Hq + Hkv) * D, dv.ptr<float>() + t * Hkv * D, size_t(Hkv * D * 4));
      }
    }
    const Tensor dqkv_b = to_bf16(dqkv);
    cpu::gemm_bf16_dw(cols(dqkv_b.view(), 0, Hq * D), A.xn1.view(), order,
                      grads[p + "self_attn.q_proj.weight"]);
    cpu::gemm_bf16_dw(cols(dqkv_b.view(), Hq * D, (Hq + Hkv) * D), A.xn1.view(), order,
                      grads[p + "self_attn.k_proj.weight"]);
    cpu::gemm_bf16_dw(cols(dqkv_b.view(), (Hq + Hkv) * D, (Hq + 2 * Hkv) * D), A.xn1.view(), order,
                      grads[p + "self_attn.v_proj.weight"]);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> qkv_cols;
    for (int s = 0; s < S; ++s) {
      const int64_t q0 = s * (Hq / S) * D, q1 = (s + 1) * (Hq / S) * D;
      const int64_t k0 = s * (Hkv / S) * D, k1 = (s + 1) * (Hkv / S) * D;
      qkv_cols.push_back(
          {{q0, q1}, {Hq * D + k0, Hq * D + k1}, {(Hq + Hkv) * D + k0, (Hq + Hkv) * D + k1}});
    }
    const Tensor d_xn1 = column_dx(dqkv_b, qkv_shards_[size_t(l)], qkv_cols);
    {
      const TensorView dwn = grads[p + "input_layernorm.weight"];
      cpu::rmsnorm_residual_backward(A.s1.view(), w(p + "input_layernorm.weight"), norm,
                                     d_xn1.view(), ds2.view(), d.view(), &order, &dwn);
    }
  }
  // d: the gradient of the embedding output.
  cpu::embedding_backward(f.tokens.view(), d.view(), order, grads["model.embed_tokens.weight"]);
}

}  // namespace lockstep::engine
