// The Qwen3 backward (docs/contract.md §B.10): saved forward activations (through the model's
// trace) and the reverse pass by the contract's backward ops.
#include "engine/train.h"

#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "engine/device.h"
#include "lockstep/contract/embedding.h"
#include "lockstep/contract/gemm.h"
#include "lockstep/contract/norm.h"
#include "lockstep/dist/communicator.h"
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

// A host tensor on the backend's device (itself on a CPU backend).
Tensor to_backend(const OpsBackend& ops, Tensor host) {
  if (ops.device() == Device::kCPU) return host;
  Tensor t = ops.empty(host.dtype(), host.shape());
  ops.copy(t.view(), host.view());
  return t;
}

TensorView cols(const TensorView& m, int64_t c0, int64_t c1) {
  TensorView v = m;
  v.data = static_cast<char*>(m.data) + c0 * m.stride[1] * dtype_size(m.dtype);
  v.shape[1] = c1 - c0;
  return v;
}

// A [T, n·D] tensor as [T, n, D] (also on the device).
TensorView heads(const Tensor& t, int64_t n, int64_t D) {
  TensorView v = t.view();
  const int64_t T = t.shape()[0];
  return TensorView::contiguous(v.data, v.dtype, {T, n, D}, v.device);
}
TensorView flat(const TensorView& v3) {  // [T, n, D] contiguous -> [T, n·D]
  return TensorView::contiguous(v3.data, v3.dtype, {v3.shape[0], v3.shape[1] * v3.shape[2]},
                                v3.device);
}

}  // namespace

// --- rank blocks ---

namespace {

// The slice `b` of a view (rows and columns; r1 / c1 = -1: to the end).
TensorView block_of(const TensorView& v, const WeightBlock& b) {
  TensorView out = v;
  const int64_t r1 = b.r1 < 0 ? v.shape[0] : b.r1;
  out = out.rows(b.r0, r1);
  if (v.ndim == 2) {
    const int64_t c1 = b.c1 < 0 ? v.shape[1] : b.c1;
    out = cols(out, b.c0, c1);
  }
  return out;
}

std::vector<int64_t> block_shape(const std::vector<int64_t>& shape, const WeightBlock& b) {
  std::vector<int64_t> s = shape;
  s[0] = (b.r1 < 0 ? shape[0] : b.r1) - b.r0;
  if (s.size() == 2) s[1] = (b.c1 < 0 ? shape[1] : b.c1) - b.c0;
  return s;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// The lm_head rows of rank r's vocab segments (the forward's vocab-parallel head).
WeightBlock head_rows(const Qwen3Config& cfg, const ModelOptions& opt, int r) {
  if (opt.tp == 1) return {};
  const LogprobVocabLayout lay = logprob_vocab_layout(opt.contract, cfg.vocab_size);
  const int per = opt.contract.vocab_segments / opt.tp;
  const int64_t V = cfg.vocab_size;
  return {std::min(V, int64_t(r * per) * lay.segment_len),
          std::min(V, int64_t((r + 1) * per) * lay.segment_len), 0, -1};
}

// The rank's shares of a layer in a rank-local job (whole at tp = 1, and for a simulated model).
struct RankPart {
  int64_t q0 = 0, nq = 0, kv0 = 0, nkv = 0, i0 = 0, ni = 0;
};

RankPart rank_part(const Qwen3Config& cfg, const ModelOptions& opt, int r) {
  const int tp = opt.tp;
  const int64_t Hq = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads;
  LS_CHECK(tp >= 1 && r >= 0 && r < tp, kOp, "rank ", r, " is outside [0, tp = ", tp, ")");
  LS_CHECK(Hq % tp == 0 && Hkv % tp == 0, kOp, "tp (", tp, ") must divide Hq (", Hq, ") and Hkv (",
           Hkv, "): kv heads replicated across ranks are not supported");
  RankPart p;
  p.nq = Hq / tp;
  p.q0 = r * p.nq;
  p.nkv = Hkv / tp;
  p.kv0 = r * p.nkv;
  const GemmConfig down = GemmConfig::for_layer(opt.contract, LayerRole::kRowParallel);
  const GemmKRange ir = gemm_tp_k_range(down, cfg.intermediate_size, tp, r);
  p.i0 = ir.begin;
  p.ni = ir.end - ir.begin;
  return p;
}

}  // namespace

WeightBlock gradient_block(const Qwen3Config& cfg, const ModelOptions& opt, int rank,
                           const std::string& name) {
  bool known = false;
  for (const WeightSpec& s : qwen3_weight_specs(cfg)) known = known || s.name == name;
  LS_CHECK(known, kOp, "no parameter named '", name, "'");
  LS_CHECK(opt.tp >= 1 && rank >= 0 && rank < opt.tp, kOp, "rank ", rank,
           " is outside [0, tp = ", opt.tp, ")");
  if (opt.tp == 1) return {};
  const RankPart p = rank_part(cfg, opt, rank);
  const int64_t D = cfg.head_dim;
  if (name == "model.embed_tokens.weight") {
    const VocabShard sh = vocab_shard(cfg.vocab_size, rank, opt.tp);
    return {sh.begin, sh.end, 0, -1};
  }
  if (name == "lm_head.weight") return head_rows(cfg, opt, rank);
  if (ends_with(name, ".self_attn.q_proj.weight")) return {p.q0 * D, (p.q0 + p.nq) * D, 0, -1};
  if (ends_with(name, ".self_attn.k_proj.weight") || ends_with(name, ".self_attn.v_proj.weight"))
    return {p.kv0 * D, (p.kv0 + p.nkv) * D, 0, -1};
  if (ends_with(name, ".self_attn.o_proj.weight")) return {0, -1, p.q0 * D, (p.q0 + p.nq) * D};
  if (ends_with(name, ".mlp.gate_proj.weight") || ends_with(name, ".mlp.up_proj.weight"))
    return {p.i0, p.i0 + p.ni, 0, -1};
  if (ends_with(name, ".mlp.down_proj.weight")) return {0, -1, p.i0, p.i0 + p.ni};
  return {};  // norms: replicated
}

// --- Gradients ---

Gradients::Gradients(const Qwen3Config& cfg) : cfg_(cfg) { allocate(); }

Gradients::Gradients(const Qwen3Config& cfg, const OpsBackend& ops) : cfg_(cfg), ops_(&ops) {
  allocate();
}

Gradients::Gradients(const Qwen3Config& cfg, const ModelOptions& opt, dist::Communicator& comm,
                     const OpsBackend* ops)
    : cfg_(cfg), ops_(ops), comm_(&comm), opt_(opt), rank_(comm.rank()), tp_(opt.tp) {
  LS_CHECK(comm.size() == opt.tp, "Gradients", "the communicator has ", comm.size(),
           " ranks, options.tp is ", opt.tp);
  allocate();
}

void Gradients::allocate() {
  cfg_.validate();
  auto make = [&](std::vector<int64_t> shape) {
    return ops_ ? ops_->empty(DType::kF32, std::move(shape))
                : Tensor(DType::kF32, std::move(shape));
  };
  for (const WeightSpec& s : qwen3_weight_specs(cfg_)) {
    const WeightBlock b = comm_ ? gradient_block(cfg_, opt_, rank_, s.name) : WeightBlock{};
    index_[s.name] = grads_.size();
    grads_.emplace_back(s.name, make(block_shape(s.shape, b)));
  }
  if (cfg_.tie_word_embeddings) {
    const WeightBlock b = comm_ ? head_rows(cfg_, opt_, rank_) : WeightBlock{};
    tied_lm_ = make(block_shape({cfg_.vocab_size, cfg_.hidden_size}, b));
  }
  reset();
}

void Gradients::reset() {
  auto zero = [&](Tensor& t) {
    if (!t.numel()) return;
    if (!ops_) {
      std::memset(t.data(), 0, size_t(t.nbytes()));
      return;
    }
    const int64_t n = t.numel();
    ops_->fill_zero(TensorView::contiguous(t.data(), DType::kF32, {n}, ops_->device()));
  };
  for (auto& [name, t] : grads_) zero(t);
  zero(tied_lm_);
  step_.reset();
  finished_ = false;
}

TensorView Gradients::operator[](const std::string& name) const {
  auto it = index_.find(name);
  LS_CHECK(it != index_.end(), "Gradients", "no parameter named '", name, "'");
  return grads_[it->second].second.view();
}

TensorView Gradients::tied_lm_head() const {
  return cfg_.tie_word_embeddings ? tied_lm_.view() : TensorView{};
}

void Gradients::finish() {
  LS_CHECK(!finished_, "Gradients::finish", "already finished for this step (reset() first)");
  finished_ = true;
  if (!cfg_.tie_word_embeddings) return;
  // dE = d_lm_head ⊕ d_embed, element-wise, in that order (B.7), a NaN stored canonical: the
  // two-leaf tree of the GEMM combine on a device backend.
  const TensorView e = (*this)["model.embed_tokens.weight"];
  auto add_rows = [&](const TensorView& l, const TensorView& dst) {  // dst = l ⊕ dst
    if (!l.numel()) return;
    if (ops_ && ops_->device() != Device::kCPU) {
      ops_->gemm_combine({l, dst}, dst);
      return;
    }
    for (int64_t r = 0; r < l.shape[0]; ++r) {
      const float* a = l.ptr<const float>() + r * l.stride[0];
      float* d = dst.ptr<float>() + r * dst.stride[0];
      for (int64_t c = 0; c < l.shape[1]; ++c) d[c] = canonical_f32(a[c] + d[c]);
    }
  };
  if (!comm_ || tp_ == 1) {
    add_rows(tied_lm_.view(), e);
    return;
  }
  // Rank-local: the lm_head part of each rank (its vocab segments' rows) goes to the ranks whose
  // embedding rows (vocab_shard) it overlaps: one broadcast per rank, rank order.
  const VocabShard mine = vocab_shard(cfg_.vocab_size, rank_, tp_);
  const int64_t H = cfg_.hidden_size;
  for (int root = 0; root < tp_; ++root) {
    const WeightBlock hb = head_rows(cfg_, opt_, root);
    const int64_t n = hb.r1 - hb.r0;
    Tensor buf;
    TensorView bv;
    if (root == rank_) {
      bv = tied_lm_.view();
    } else {
      buf = ops_ ? ops_->empty(DType::kF32, {n, H}) : Tensor(DType::kF32, {n, H});
      bv = buf.view();
    }
    if (ops_) ops_->synchronize();
    comm_->broadcast(bv, root);
    const int64_t a = std::max(hb.r0, mine.begin), b = std::min(hb.r1, mine.end);
    if (a < b) add_rows(bv.rows(a - hb.r0, b - hb.r0), e.rows(a - mine.begin, b - mine.begin));
  }
}

Weights Gradients::gather() const {
  Weights out;
  auto host = [&](const TensorView& v) {
    return ops_ && ops_->device() != Device::kCPU ? to_host(*ops_, v) : copy_of(v);
  };
  for (const WeightSpec& s : qwen3_weight_specs(cfg_)) {
    const TensorView mine = (*this)[s.name];
    // Each rank's block padded to the widest, all-gathered, then placed; a weight whose blocks
    // are all whole (the norms) is every rank's own copy (decided alike on every rank).
    std::vector<WeightBlock> bl;
    bool whole = true;
    int64_t mr = 0, mc = 0;
    for (int r = 0; comm_ && r < tp_; ++r) {
      bl.push_back(gradient_block(cfg_, opt_, r, s.name));
      const std::vector<int64_t> sh = block_shape(s.shape, bl.back());
      whole = whole && sh == s.shape;
      mr = std::max(mr, sh[0]);
      mc = std::max(mc, sh.size() == 2 ? sh[1] : 1);
    }
    if (!comm_ || whole) {
      out.emplace_back(s.name, host(mine));
      continue;
    }
    Tensor pad(DType::kF32, {mr, mc});
    std::memset(pad.data(), 0, size_t(pad.nbytes()));
    const Tensor h = host(mine);
    for (int64_t r = 0; r < h.shape()[0]; ++r)
      std::memcpy(pad.ptr<float>() + r * mc, h.ptr<float>() + r * h.shape()[1],
                  size_t(h.shape()[1]) * sizeof(float));
    Tensor all(DType::kF32, {int64_t(tp_), mr, mc});
    comm_->all_gather(pad.view(), all.view());
    Tensor full(DType::kF32, s.shape);
    for (int r = 0; r < tp_; ++r) {
      const TensorView dst = block_of(full.view(), bl[size_t(r)]);
      for (int64_t i = 0; i < dst.shape[0]; ++i)
        std::memcpy(dst.ptr<float>() + i * dst.stride[0], all.ptr<float>() + (r * mr + i) * mc,
                    size_t(dst.shape[1]) * sizeof(float));
    }
    out.emplace_back(s.name, std::move(full));
  }
  return out;
}

int64_t SavedForward::bytes() const {
  int64_t b = tokens.nbytes() + cu_seqlens.nbytes() + positions.nbytes() + s_final.nbytes() +
              hidden.nbytes() + prompt_of.nbytes();
  for (const Layer& L : layers)
    for (const Tensor* t : {&L.s1, &L.xn1, &L.q, &L.k, &L.v, &L.q_rope, &L.k_rope, &L.attn, &L.lse,
                            &L.s2, &L.xn2, &L.gate, &L.up, &L.act})
      b += t->nbytes();
  return b;
}

// --- shared-prompt packing ---

SharedPack pack_prompt_groups(const std::vector<PromptGroup>& groups,
                              std::span<const size_t> members) {
  const char* op = "pack_prompt_groups";
  std::vector<int64_t> first(groups.size() + 1, 0);  // s_k
  for (size_t k = 0; k < groups.size(); ++k) {
    LS_CHECK(!groups[k].prompt.empty(), op, "group ", k, ": empty prompt");
    LS_CHECK(!groups[k].completions.empty(), op, "group ", k, ": no completion");
    first[k + 1] = first[k] + 1 + int64_t(groups[k].completions.size());
  }
  SharedPack pk;
  pk.cu = {0};
  auto segment = [&](const std::vector<int32_t>& toks, int32_t prompt, int64_t step) {
    pk.tokens.insert(pk.tokens.end(), toks.begin(), toks.end());
    pk.cu.push_back(int32_t(pk.tokens.size()));
    pk.prompt_of.push_back(prompt);
    pk.step_indices.push_back(step);
  };
  for (size_t k : members) {
    LS_CHECK(k < groups.size(), op, "member ", k, " is not one of the ", groups.size(), " groups");
    const PromptGroup& g = groups[k];
    const int32_t ps = int32_t(pk.prompt_of.size());
    const int64_t last_prompt_row = int64_t(pk.tokens.size() + g.prompt.size()) - 1;
    segment(g.prompt, -1, first[k]);
    pk.head_row0.emplace_back();
    for (size_t c = 0; c < g.completions.size(); ++c) {
      const std::vector<int32_t>& comp = g.completions[c];
      LS_CHECK(!comp.empty(), op, "group ", k, " completion ", c, ": no token");
      const int64_t row0 = int64_t(pk.tokens.size()), h0 = int64_t(pk.head.rows.size());
      segment(comp, ps, first[k] + 1 + int64_t(c));
      // Token i is predicted by the prompt's last row (i = 0), else by the completion's row i-1.
      for (size_t i = 0; i < comp.size(); ++i) {
        pk.head.rows.push_back(i == 0 ? last_prompt_row : row0 + int64_t(i) - 1);
        pk.targets.push_back(comp[i]);
      }
      pk.head.seqs.push_back({first[k] + 1 + int64_t(c), h0, int64_t(comp.size())});
      pk.head_row0.back().push_back(h0);
    }
  }
  return pk;
}

// --- Backprop ---

Backprop::Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
                   const ModelOptions& opt)
    : cfg_(cfg), opt_(opt), own_(make_invariant_backend()), ops_(own_.get()) {
  init(weights);
}

Backprop::Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
                   const ModelOptions& opt, const OpsBackend& ops)
    : cfg_(cfg), opt_(opt), ops_(&ops) {
  init(weights);
}

Backprop::Backprop(const Qwen3Config& cfg, const std::map<std::string, TensorView>& weights,
                   const ModelOptions& opt, const OpsBackend& ops, dist::Communicator& comm)
    : cfg_(cfg), opt_(opt), ops_(&ops), comm_(&comm), comm_rank_(comm.rank()) {
  LS_CHECK(comm.size() == opt.tp, kOp, "the communicator has ", comm.size(),
           " ranks, options.tp is ", opt.tp);
  init(weights);
}

void Backprop::init(const std::map<std::string, TensorView>& weights) {
  const Qwen3Config& cfg = cfg_;
  const ModelOptions& opt = opt_;
  const OpsBackend& ops = *ops_;
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
  // A rank-local job with tp > 1 holds blocks; tp = 1 (one rank) is the whole model.
  const bool blocks = comm_ && opt.tp > 1;
  LS_CHECK(!blocks || opt.contract.vocab_segments % opt.tp == 0, kOp, "tp (", opt.tp,
           ") must divide vocab_segments (", opt.contract.vocab_segments, ")");
  const std::string head_name =
      cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  // The weights may be on the host or already on the backend's device (a trainer's optimizer
  // weights): the backward's own copies are made with the backend's copies either way (device to
  // device: no host round trip). Rank-local: only the blocks the backward reads directly.
  for (const WeightSpec& s : qwen3_weight_specs(cfg)) {
    auto it = weights.find(s.name);
    LS_CHECK(it != weights.end(), kOp, "missing weight '", s.name, "'");
    const TensorView& v = it->second;
    LS_CHECK(v.dtype == DType::kBF16 && (v.device == Device::kCPU || v.device == ops.device()), kOp,
             "weight '", s.name, "' must be a bf16 view on the host or on ",
             device_name(ops.device()), ", got ", dtype_name(v.dtype), " on ",
             device_name(v.device));
    LS_CHECK(std::vector<int64_t>(v.shape, v.shape + v.ndim) == s.shape, kOp, "weight '", s.name,
             "' has shape ", v.shape_string());
    WeightBlock b;
    if (blocks) {
      const bool direct = s.shape.size() == 1 || ends_with(s.name, ".o_proj.weight") ||
                          ends_with(s.name, ".down_proj.weight") || s.name == head_name;
      if (!direct) continue;  // q|k|v, gate|up: in the shards below; the embedding: not read
      b = s.name == head_name ? head_rows(cfg, opt, comm_rank_)
                              : gradient_block(cfg, opt, comm_rank_, s.name);
    }
    const TensorView src = block_of(v, b);
    Tensor t = ops.empty(DType::kBF16, std::vector<int64_t>(src.shape, src.shape + src.ndim));
    ops.copy(t.view(), src);
    w_[s.name] = std::move(t);
  }
  RopeConfig rc;
  rc.head_dim = D;
  rc.theta = cfg.rope_theta;
  rc.max_positions = opt.max_positions > 0 ? opt.max_positions : cfg.max_position_embeddings;
  rope_ = RopeTable::build(rc);
  const GemmConfig down = GemmConfig::for_layer(opt.contract, LayerRole::kRowParallel);
  // Row ranges of weights stacked into one [Σ rows, H] tensor on the backend, in order (read from
  // the given views: the whole weights are not all copied for a rank-local job).
  auto stack = [&](const std::vector<std::tuple<std::string, int64_t, int64_t>>& parts) {
    int64_t n = 0;
    for (const auto& [name, a, b] : parts) n += b - a;
    Tensor t = ops.empty(DType::kBF16, {n, cfg.hidden_size});
    int64_t o = 0;
    for (const auto& [name, a, b] : parts) {
      ops.copy(t.view().rows(o, o + (b - a)), weights.at(name).rows(a, b));
      o += b - a;
    }
    return t;
  };
  // The TP = S shards this object runs: all S, or rank r's S / tp, whose intermediate columns
  // are the rank's (the down_proj K ranges nest: checked).
  const int per = blocks ? S / opt.tp : S;
  shard0_ = blocks ? comm_rank_ * per : 0;
  if (blocks) {
    const RankPart rp = rank_part(cfg, opt, comm_rank_);
    const GemmKRange first = gemm_tp_k_range(down, I, S, shard0_);
    const GemmKRange last = gemm_tp_k_range(down, I, S, shard0_ + per - 1);
    LS_CHECK(first.begin == rp.i0 && last.end == rp.i0 + rp.ni, kOp,
             "the TP = S shards' intermediate ranges do not nest in rank ", comm_rank_,
             "'s (internal error)");
  }
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Tensor> qkv, gu;
    for (int s = shard0_; s < shard0_ + per; ++s) {
      // Shard s (B.2): its q rows, k rows, v rows; its gate rows, up rows.
      const int64_t q0 = s * (Hq / S) * D, q1 = (s + 1) * (Hq / S) * D;
      const int64_t k0 = s * (Hkv / S) * D, k1 = (s + 1) * (Hkv / S) * D;
      qkv.push_back(stack({{p + "self_attn.q_proj.weight", q0, q1},
                           {p + "self_attn.k_proj.weight", k0, k1},
                           {p + "self_attn.v_proj.weight", k0, k1}}));
      const GemmKRange ir = gemm_tp_k_range(down, I, S, s);
      gu.push_back(stack({{p + "mlp.gate_proj.weight", ir.begin, ir.end},
                          {p + "mlp.up_proj.weight", ir.begin, ir.end}}));
    }
    qkv_shards_.push_back(std::move(qkv));
    gu_shards_.push_back(std::move(gu));
  }
  ops.synchronize();
}

int64_t Backprop::weight_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : w_) n += t.nbytes();
  for (const auto& layer : {&qkv_shards_, &gu_shards_})
    for (const auto& shards : *layer)
      for (const Tensor& t : shards) n += t.nbytes();
  return n;
}

const TensorView Backprop::w(const std::string& name) const {
  auto it = w_.find(name);
  LS_CHECK(it != w_.end(), kOp, "no weight '", name, "'");
  return it->second.view();
}

SavedForward Backprop::forward(Model& model, const TensorView& tokens,
                               const TensorView& cu_seqlens) const {
  return forward_impl(model, tokens, cu_seqlens, nullptr);
}

SavedForward Backprop::forward_shared(Model& model, const TensorView& tokens,
                                      const TensorView& cu_seqlens,
                                      const TensorView& prompt_of) const {
  return forward_impl(model, tokens, cu_seqlens, &prompt_of);
}

SavedForward Backprop::forward_impl(Model& model, const TensorView& tokens,
                                    const TensorView& cu_seqlens,
                                    const TensorView* prompt_of) const {
  LS_CHECK(model.ops().device() == ops_->device(), kOp, "the model runs on ",
           device_name(model.ops().device()), ", the backward on ", device_name(ops_->device()));
  LS_CHECK(model.config().to_string() == cfg_.to_string(), kOp,
           "the model's config differs from the backward's: ", model.config().to_string(), " vs ",
           cfg_.to_string());
  LS_CHECK(model.options().to_string() == opt_.to_string(), kOp,
           "the model's options differ from the backward's: ", model.options().to_string(), " vs ",
           opt_.to_string());
  const OpsBackend& ops = *ops_;
  const int64_t T = tokens.size(0), L = cfg_.num_hidden_layers;
  SavedForward f;
  f.layers.resize(size_t(L));
  // The trace hands host views (model.h); each saved activation goes to the backend's device.
  auto save = [&](const TensorView& t) { return to_backend(ops, copy_of(t)); };
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
        {"attn_lse", &SavedForward::Layer::lse},
        {"post_residual", &SavedForward::Layer::s2},
        {"post_norm", &SavedForward::Layer::xn2},
        {"gate", &SavedForward::Layer::gate},
        {"up", &SavedForward::Layer::up},
        {"act", &SavedForward::Layer::act}};
    if (op == "embed") {
      if (L > 0) f.layers[0].s1 = save(t);
    } else if (op == "final_residual") {
      f.s_final = save(t);
    } else if (auto it = kLayer.find(op); it != kLayer.end() && Ls) {
      Ls->*(it->second) = save(t);
    }
  });
  Tensor hidden = ops.empty(DType::kBF16, {T, cfg_.hidden_size});
  try {
    if (prompt_of)
      model.forward_packed_shared(tokens, cu_seqlens, *prompt_of, hidden.view());
    else
      model.forward_packed(tokens, cu_seqlens, hidden.view());
  } catch (...) {
    model.set_trace(nullptr);
    throw;
  }
  model.set_trace(nullptr);
  f.hidden = std::move(hidden);
  Tensor tok(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) {
    tok.ptr<int32_t>()[t] =
        tokens.dtype == DType::kI64
            ? int32_t(static_cast<const int64_t*>(tokens.data)[t * tokens.stride[0]])
            : static_cast<const int32_t*>(tokens.data)[t * tokens.stride[0]];
  }
  f.cu_seqlens = copy_of(cu_seqlens);
  Tensor pos(DType::kI32, {T});
  const int32_t* cu = f.cu_seqlens.ptr<int32_t>();
  std::optional<SharedPromptSeqs> segs;
  if (prompt_of) {
    f.shared = true;
    f.prompt_of = copy_of(*prompt_of);
    segs = SharedPromptSeqs::validate(kOp, f.cu_seqlens.view(), f.prompt_of.view(), T);
  }
  for (int64_t b = 0; b + 1 < f.cu_seqlens.numel(); ++b) {
    const int32_t p0 = segs ? int32_t(segs->first_position(b)) : 0;
    for (int32_t t = cu[b]; t < cu[b + 1]; ++t) pos.ptr<int32_t>()[t] = p0 + t - cu[b];
  }
  f.tokens = to_backend(ops, std::move(tok));
  f.positions = to_backend(ops, std::move(pos));
  for (int64_t l = 0; l < L; ++l)
    LS_CHECK((f.layers[size_t(l)].act.numel() == T * cfg_.intermediate_size &&
              f.layers[size_t(l)].lse.numel() == T * cfg_.num_attention_heads) ||
                 T == 0,
             kOp, "the forward's trace lacks layer ", l, "'s activations");
  ops.synchronize();
  return f;
}

Tensor Backprop::head_hidden(const SavedForward& f, const HeadRows& head) const {
  const int64_t T = f.tokens.numel(), Th = int64_t(head.rows.size());
  Tensor hh = ops_->empty(DType::kBF16, {Th, cfg_.hidden_size});
  for (int64_t i = 0; i < Th; ++i) {
    const int64_t r = head.rows[size_t(i)];
    LS_CHECK(r >= 0 && r < T, kOp, "head row ", i, " reads packed row ", r, ", outside [0, T = ", T,
             ")");
    ops_->copy(hh.view().rows(i, i + 1), f.hidden.view().rows(r, r + 1));
  }
  return hh;
}

void Backprop::backward(const SavedForward& f, const TensorView& targets,
                        const LogprobParams& params, const TensorView& lse,
                        const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
                        std::span<const int64_t> step_indices, Gradients& grads,
                        const HeadOutputs* head_out) const {
  LS_CHECK(!f.shared, kOp, "a shared-prompt forward (forward_shared) takes backward_shared");
  LS_CHECK(!head_out || !(comm_ && opt_.tp > 1), kOp,
           "the head's forward outputs from the backward (head_out) are not implemented for a "
           "rank-local backward (tp > 1)");
  backward_impl(f, nullptr, targets, params, lse, entropy, g_lp, g_ent, step_indices, grads,
                head_out);
}

void Backprop::backward_shared(const SavedForward& f, const HeadRows& head,
                               const TensorView& targets, const LogprobParams& params,
                               const TensorView& lse, const TensorView& entropy,
                               const TensorView& g_lp, const TensorView* g_ent,
                               std::span<const int64_t> step_indices, Gradients& grads) const {
  LS_CHECK(f.shared, kOp, "backward_shared needs a shared-prompt forward (forward_shared)");
  backward_impl(f, &head, targets, params, lse, entropy, g_lp, g_ent, step_indices, grads);
}

void Backprop::backward_impl(const SavedForward& f, const HeadRows* head, const TensorView& targets,
                             const LogprobParams& params, const TensorView& lse,
                             const TensorView& entropy, const TensorView& g_lp,
                             const TensorView* g_ent, std::span<const int64_t> step_indices,
                             Gradients& grads, const HeadOutputs* head_out) const {
  const OpsBackend& ops = *ops_;
  const int64_t T = f.tokens.numel();
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, D = cfg_.head_dim;
  const int64_t Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
  const int64_t V = cfg_.vocab_size;
  const int S = opt_.contract.gemm_segments, tp = opt_.tp;
  const ContractConfig& contract = opt_.contract;
  const GemmConfig down = GemmConfig::for_layer(contract, LayerRole::kRowParallel);
  RmsNormConfig norm;
  norm.eps = cfg_.rms_norm_eps_f32();
  const AttentionConfig attn = AttentionConfig::from_contract(contract);
  // Rank-local with tp > 1: this rank's heads, intermediate columns and S / tp shards; else all.
  const bool ranked = comm_ && tp > 1;
  const RankPart me = ranked ? rank_part(cfg_, opt_, comm_rank_) : RankPart{0, Hq, 0, Hkv, 0, I};
  const int n_shards = ranked ? S / tp : S;
  LS_CHECK(grads.rank() == rank() && (!comm_ || grads.tp() == tp), kOp, "the gradients are ",
           grads.rank() < 0 ? std::string("whole")
                            : "rank " + std::to_string(grads.rank()) + " of " +
                                  std::to_string(grads.tp()) + "'s blocks",
           ", this backward is ",
           rank() < 0 ? std::string("simulated TP (whole gradients)")
                      : "rank " + std::to_string(rank()) + " of " + std::to_string(tp));

  LS_CHECK(f.cu_seqlens.view().device == Device::kCPU, kOp,
           "the saved cu_seqlens must be on the host");
  PackedSeqs seqs = PackedSeqs::validate(kOp, f.cu_seqlens.view(), T);
  std::optional<SharedPromptSeqs> segs;
  if (f.shared) segs = SharedPromptSeqs::validate(kOp, f.cu_seqlens.view(), f.prompt_of.view(), T);
  LS_CHECK(int64_t(step_indices.size()) == seqs.B(), kOp, "step_indices has ", step_indices.size(),
           " entries for ", seqs.B(), " packed sequences");
  std::vector<TokenSeq> ts;
  for (int64_t b = 0; b < seqs.B(); ++b)
    ts.push_back({step_indices[size_t(b)], seqs.cu()[size_t(b)],
                  seqs.cu()[size_t(b) + 1] - seqs.cu()[size_t(b)]});
  const TokenOrder order = TokenOrder::make(kOp, std::move(ts), T);
  grads.step().accept(order);
  if (T == 0) return;
  Tensor cu_dev;
  if (ops.device() != Device::kCPU) {
    cu_dev = to_backend(ops, copy_of(f.cu_seqlens.view()));
    seqs = std::move(seqs).with_device_copy(ops.device(), cu_dev.view());
  }
  // The head's per-token inputs may be host views: staged to the backend's device
  // (engine/device.h).
  DeviceStage stage(ops);
  const TensorView tg = stage.input(targets), lse_d = stage.input(lse);
  const TensorView ent_d = stage.input(entropy), glp_d = stage.input(g_lp);
  const TensorView gent_d = g_ent ? stage.input(*g_ent) : TensorView{};
  const GemmConfig one{1};
  auto empty = [&](DType dt, std::vector<int64_t> shape) {
    return ops.empty(dt, std::move(shape));
  };
  // round_bf16 of an f32 [R, C] tensor: the tensor-core operand (B.0).
  auto to_bf16 = [&](const Tensor& x) {
    Tensor t = empty(DType::kBF16, x.shape());
    ops.round_bf16(x.view(), t.view());
    return t;
  };
  // Column ranges of a [T, C] matrix side by side: a [T, Σ] contiguous copy.
  auto stack_cols = [&](const TensorView& m, const std::vector<std::pair<int64_t, int64_t>>& rs) {
    int64_t n = 0;
    for (auto [a, b] : rs) n += b - a;
    Tensor t = empty(m.dtype, {m.shape[0], n});
    int64_t o = 0;
    for (auto [a, b] : rs) {
      ops.copy(cols(t.view(), o, o + (b - a)), cols(m, a, b));
      o += b - a;
    }
    return t;
  };
  // This rank's columns [c0, c1) of a saved [T, C] activation, contiguous: the tensor itself when
  // they are all of it (simulated TP, tp = 1), else a copy kept in `keep`.
  std::vector<Tensor> keep;
  auto mine = [&](const Tensor& t, int64_t c0, int64_t c1) -> TensorView {
    if (c0 == 0 && c1 == t.shape()[1]) return t.view();
    keep.push_back(stack_cols(t.view(), {{c0, c1}}));
    return keep.back().view();
  };
  auto as_heads = [](const TensorView& m, int64_t n) {  // contiguous [T, n·D] -> [T, n, D]
    return TensorView::contiguous(m.data, m.dtype, {m.shape[0], n, m.shape[1] / n}, m.device);
  };
  // Every rank's `part` ([T, C] f32, contiguous) all-gathered: [tp, T, C] in rank order.
  auto gather = [&](const Tensor& part) {
    std::vector<int64_t> shape = {tp};
    for (int64_t d : part.shape()) shape.push_back(d);
    Tensor all = empty(part.dtype(), shape);
    ops.synchronize();
    comm_->all_gather(part.view(), all.view());
    return all;
  };

  // The dX of a column-parallel layer (B.2, B.3): one chain per TP = S shard, the shard results
  // combined by tree; rank r of tp combines its S/tp shards, then the ranks combine (simulated:
  // in-process; rank-local: the ranks' fp32 partials all-gathered).
  auto column_dx = [&](const Tensor& dy_b, const std::vector<Tensor>& w_shards,
                       const std::vector<std::vector<std::pair<int64_t, int64_t>>>& shard_cols) {
    std::vector<Tensor> part;
    for (int i = 0; i < n_shards; ++i) {
      const Tensor dys = stack_cols(dy_b.view(), shard_cols[size_t(i)]);
      part.push_back(empty(DType::kF32, {T, H}));
      ops.gemm_dx(dys.view(), w_shards[size_t(i)].view(), one, part.back().view());
    }
    std::vector<Tensor> rank;
    std::vector<TensorView> rank_views;
    const int n_ranks = ranked ? 1 : tp;
    for (int r = 0; r < n_ranks; ++r) {
      std::vector<TensorView> own;
      for (int i = r * (n_shards / n_ranks); i < (r + 1) * (n_shards / n_ranks); ++i)
        own.push_back(part[size_t(i)].view());
      rank.push_back(empty(DType::kF32, {T, H}));
      ops.gemm_combine(own, rank.back().view());
      rank_views.push_back(rank.back().view());
    }
    Tensor all;
    if (ranked) {
      all = gather(rank[0]);
      rank_views.clear();
      for (int r = 0; r < tp; ++r) rank_views.push_back(slab(all, r));
    }
    Tensor dx = empty(DType::kF32, {T, H});
    ops.gemm_combine(rank_views, dx.view());
    return dx;
  };

  // Head: dh and dW of the lm_head (tied: the separate lm_head buffer, B.7). Rank-local: the
  // rank's vocab segments, the ranks' dh partials all-gathered and combined in rank order.
  const bool tied = cfg_.tie_word_embeddings;
  const TensorView w_lm = w(tied ? "model.embed_tokens.weight" : "lm_head.weight");
  const TensorView dw_lm = tied ? grads.tied_lm_head() : grads["lm_head.weight"];
  auto head_backward = [&](const TensorView& h, const TokenOrder& ord, const TensorView& dh) {
    if (!ranked && head_out) {
      ops.linear_logprob_backward_recompute(
          h, w_lm, tg, params, contract, lse_d, ent_d, glp_d, g_ent ? &gent_d : nullptr, dh, ord,
          dw_lm, stage.output(head_out->logp), stage.output(head_out->lse),
          stage.output(head_out->entropy));
      stage.finish();
      return;
    }
    if (!ranked) {
      ops.linear_logprob_backward(h, w_lm, tg, params, contract, lse_d, ent_d, glp_d,
                                  g_ent ? &gent_d : nullptr, dh, ord, dw_lm);
      return;
    }
    const int per = contract.vocab_segments / tp;
    Tensor part = empty(DType::kF32, {h.shape[0], H});
    ops.linear_logprob_backward_partial(h, w_lm, tg, params, contract,
                                        LogprobShard{V, comm_rank_ * per, per}, lse_d, ent_d, glp_d,
                                        g_ent ? &gent_d : nullptr, part.view(), ord, dw_lm);
    const Tensor all = gather(part);
    std::vector<TensorView> parts;
    for (int r = 0; r < tp; ++r) parts.push_back(slab(all, r));
    ops.gemm_combine(parts, dh);
  };
  Tensor gh = empty(DType::kF32, {T, H});
  if (!head) {
    head_backward(f.hidden.view(), order, gh.view());
  } else {
    // Shared prompts (§B.11): the head over its own rows and order, then each packed row's dh is
    // its head rows' dh summed in head-row order (the first taken as is; +0 for none).
    const int64_t Th = int64_t(head->rows.size());
    const TokenOrder head_order = TokenOrder::make(kOp, head->seqs, Th);
    const Tensor hh = head_hidden(f, *head);
    Tensor ghh = empty(DType::kF32, {Th, H});
    head_backward(hh.view(), head_order, ghh.view());
    // The fold runs on the host (a device backend: ghh down, gh up, Th·H + T·H f32 over the bus;
    // one fold per micro-batch, small beside the layers' work).
    const bool on_host = ops.device() == Device::kCPU;
    const Tensor ghh_copy = on_host ? Tensor() : to_host(ops, ghh.view());
    const Tensor& ghh_host = on_host ? ghh : ghh_copy;
    Tensor gh_host(DType::kF32, {T, H});
    std::vector<uint8_t> seen(size_t(T), 0);
    float* out = gh_host.ptr<float>();
    std::memset(out, 0, size_t(gh_host.nbytes()));  // +0
    for (int64_t i = 0; i < Th; ++i) {
      const int64_t r = head->rows[size_t(i)];
      float* o = out + r * H;
      const float* g = ghh_host.ptr<float>() + i * H;
      for (int64_t c = 0; c < H; ++c) o[c] = seen[size_t(r)] ? canonical_f32(o[c] + g[c]) : g[c];
      seen[size_t(r)] = 1;
    }
    if (on_host)
      gh = std::move(gh_host);
    else
      ops.copy(gh.view(), gh_host.view());
  }
  // Final norm (its residual_out is not used downstream: gres = +0).
  Tensor d = empty(DType::kF32, {T, H});
  {
    Tensor zero = empty(DType::kF32, {T, H});
    ops.fill_zero(zero.view());
    const TensorView dwn = grads["model.norm.weight"];
    ops.rmsnorm_residual_backward(f.s_final.view(), w("model.norm.weight"), norm, gh.view(),
                                  zero.view(), d.view(), &order, &dwn);
  }

  const int64_t nq = me.nq, nkv = me.nkv, ni = me.ni;
  for (int64_t l = cfg_.num_hidden_layers - 1; l >= 0; --l) {
    const SavedForward::Layer& A = f.layers[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    keep.clear();
    // d: the gradient of this layer's down output and of s2 (both feed the next add).
    // MLP: down (row-parallel: one segment; the rank's K columns), SiLU-and-mul, gate|up
    // (column-parallel).
    const Tensor dy_down = to_bf16(d);
    Tensor d_act = empty(DType::kF32, {T, ni});
    ops.gemm_dx(dy_down.view(), w(p + "mlp.down_proj.weight"), one, d_act.view());
    ops.gemm_dw(dy_down.view(), mine(A.act, me.i0, me.i0 + ni), order,
                grads[p + "mlp.down_proj.weight"]);
    Tensor gu = empty(DType::kBF16, {T, 2 * ni});  // the forward's gate|up layout (§E.3)
    ops.copy(cols(gu.view(), 0, ni), cols(A.gate.view(), me.i0, me.i0 + ni));
    ops.copy(cols(gu.view(), ni, 2 * ni), cols(A.up.view(), me.i0, me.i0 + ni));
    Tensor dgu = empty(DType::kF32, {T, 2 * ni});
    ops.silu_mul_backward(gu.view(), d_act.view(), dgu.view());
    const Tensor dgu_b = to_bf16(dgu);
    ops.gemm_dw(cols(dgu_b.view(), 0, ni), A.xn2.view(), order, grads[p + "mlp.gate_proj.weight"]);
    ops.gemm_dw(cols(dgu_b.view(), ni, 2 * ni), A.xn2.view(), order,
                grads[p + "mlp.up_proj.weight"]);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> gu_cols;
    for (int s = shard0_; s < shard0_ + n_shards; ++s) {
      const GemmKRange ir = gemm_tp_k_range(down, I, S, s);
      const int64_t a = ir.begin - me.i0, b = ir.end - me.i0;
      gu_cols.push_back({{a, b}, {ni + a, ni + b}});
    }
    const Tensor d_xn2 = column_dx(dgu_b, gu_shards_[size_t(l)], gu_cols);
    Tensor ds2 = empty(DType::kF32, {T, H});
    {
      const TensorView dwn = grads[p + "post_attention_layernorm.weight"];
      ops.rmsnorm_residual_backward(A.s2.view(), w(p + "post_attention_layernorm.weight"), norm,
                                    d_xn2.view(), d.view(), ds2.view(), &order, &dwn);
    }

    // Attention: o_proj (row-parallel), attention, RoPE, q/k norms, q|k|v (column-parallel), on
    // the rank's query heads [q0, q0 + nq) and kv heads [kv0, kv0 + nkv).
    const Tensor dy_o = to_bf16(ds2);
    const int64_t qc0 = me.q0 * D, qc1 = (me.q0 + nq) * D;
    const int64_t kc0 = me.kv0 * D, kc1 = (me.kv0 + nkv) * D;
    Tensor d_attn = empty(DType::kF32, {T, nq * D});
    ops.gemm_dx(dy_o.view(), w(p + "self_attn.o_proj.weight"), one, d_attn.view());
    const TensorView attn_out = mine(A.attn, qc0, qc1);
    ops.gemm_dw(dy_o.view(), attn_out, order, grads[p + "self_attn.o_proj.weight"]);
    const Tensor dout = to_bf16(d_attn);
    Tensor dq = empty(DType::kF32, {T, nq, D}), dk = empty(DType::kF32, {T, nkv, D});
    Tensor dv = empty(DType::kF32, {T, nkv, D});
    const TensorView q_h = as_heads(mine(A.q_rope, qc0, qc1), nq);
    const TensorView k_h = as_heads(mine(A.k_rope, kc0, kc1), nkv);
    const TensorView v_h = as_heads(mine(A.v, kc0, kc1), nkv);
    const TensorView o_h = as_heads(attn_out, nq);
    const TensorView lse_h = mine(A.lse, me.q0, me.q0 + nq);
    const TensorView dout_h = as_heads(dout.view(), nq);
    if (segs)
      ops.attention_backward_shared(q_h, k_h, v_h, o_h, lse_h, dout_h, *segs, attn, dq.view(),
                                    dk.view(), dv.view());
    else
      ops.attention_backward_varlen(q_h, k_h, v_h, o_h, lse_h, dout_h, seqs, attn, dq.view(),
                                    dk.view(), dv.view());
    ops.rope_backward(dq.view(), f.positions.view(), rope_, dq.view());
    ops.rope_backward(dk.view(), f.positions.view(), rope_, dk.view());
    const int64_t W = (nq + 2 * nkv) * D;
    Tensor dqkv = empty(DType::kF32, {T, W});
    {
      // q_norm / k_norm: a token's weight-gradient term sums all its heads in order (B.4), so a
      // rank-local job all-gathers the ranks' dq / dk and every rank runs the whole norm backward
      // (the same bits on every rank), keeping its heads' dx.
      auto all_heads = [&](const Tensor& part, int64_t n, int64_t total) {
        if (!ranked) return Tensor();
        const Tensor all = gather(part);  // [tp, T, n, D]
        Tensor full = empty(DType::kF32, {T, total, D});
        const TensorView fv = TensorView::contiguous(full.view().data, DType::kF32, {T, total * D},
                                                     full.view().device);
        for (int r = 0; r < tp; ++r) {
          const TensorView src = slab(all, r);
          ops.copy(cols(fv, r * n * D, (r + 1) * n * D),
                   TensorView::contiguous(src.data, DType::kF32, {T, n * D}, src.device));
        }
        return full;
      };
      const Tensor dq_all = all_heads(dq, nq, Hq), dk_all = all_heads(dk, nkv, Hkv);
      const TensorView dq_in = ranked ? dq_all.view() : dq.view();
      const TensorView dk_in = ranked ? dk_all.view() : dk.view();
      Tensor dq_raw = empty(DType::kF32, {T, Hq, D}), dk_raw = empty(DType::kF32, {T, Hkv, D});
      const TensorView dqn = grads[p + "self_attn.q_norm.weight"];
      const TensorView dkn = grads[p + "self_attn.k_norm.weight"];
      ops.rmsnorm_backward(heads(A.q, Hq, D), w(p + "self_attn.q_norm.weight"), norm, dq_in,
                           dq_raw.view(), &order, &dqn);
      ops.rmsnorm_backward(heads(A.k, Hkv, D), w(p + "self_attn.k_norm.weight"), norm, dk_in,
                           dk_raw.view(), &order, &dkn);
      ops.copy(cols(dqkv.view(), 0, nq * D), cols(flat(dq_raw.view()), qc0, qc1));
      ops.copy(cols(dqkv.view(), nq * D, (nq + nkv) * D), cols(flat(dk_raw.view()), kc0, kc1));
      ops.copy(cols(dqkv.view(), (nq + nkv) * D, W), flat(dv.view()));
    }
    const Tensor dqkv_b = to_bf16(dqkv);
    ops.gemm_dw(cols(dqkv_b.view(), 0, nq * D), A.xn1.view(), order,
                grads[p + "self_attn.q_proj.weight"]);
    ops.gemm_dw(cols(dqkv_b.view(), nq * D, (nq + nkv) * D), A.xn1.view(), order,
                grads[p + "self_attn.k_proj.weight"]);
    ops.gemm_dw(cols(dqkv_b.view(), (nq + nkv) * D, W), A.xn1.view(), order,
                grads[p + "self_attn.v_proj.weight"]);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> qkv_cols;
    for (int s = shard0_; s < shard0_ + n_shards; ++s) {
      const int64_t q0 = s * (Hq / S) * D - qc0, q1 = (s + 1) * (Hq / S) * D - qc0;
      const int64_t k0 = s * (Hkv / S) * D - kc0, k1 = (s + 1) * (Hkv / S) * D - kc0;
      qkv_cols.push_back(
          {{q0, q1}, {nq * D + k0, nq * D + k1}, {(nq + nkv) * D + k0, (nq + nkv) * D + k1}});
    }
    const Tensor d_xn1 = column_dx(dqkv_b, qkv_shards_[size_t(l)], qkv_cols);
    {
      const TensorView dwn = grads[p + "input_layernorm.weight"];
      ops.rmsnorm_residual_backward(A.s1.view(), w(p + "input_layernorm.weight"), norm,
                                    d_xn1.view(), ds2.view(), d.view(), &order, &dwn);
    }
  }
  // d: the gradient of the embedding output. Rank-local: the rank applies the tokens whose id
  // lies in its vocab_shard rows (B.7: each table row is its own chains, so the same bits), as
  // one-token sequences in canonical order with ids relative to the shard.
  const TensorView d_embed = grads["model.embed_tokens.weight"];
  if (!ranked) {
    ops.embedding_backward(f.tokens.view(), d.view(), order, d_embed);
  } else {
    const VocabShard sh = vocab_shard(V, comm_rank_, tp);
    const Tensor ids = to_host(ops, f.tokens.view());
    Tensor local(DType::kI32, {T});  // rows no one-token sequence covers are never read
    std::memset(local.data(), 0, size_t(local.nbytes()));
    std::vector<TokenSeq> ones;
    int64_t k = 0;
    for (const TokenSeq& q : order.seqs())  // canonical order: by step index, then position
      for (int64_t i = 0; i < q.len; ++i) {
        const int64_t row = q.row + i, id = ids.ptr<int32_t>()[row];
        if (id < sh.begin || id >= sh.end) continue;
        ones.push_back({k++, row, 1});
        local.ptr<int32_t>()[row] = int32_t(id - sh.begin);
      }
    const TokenOrder shard_order = TokenOrder::make(kOp, std::move(ones), T);
    const Tensor local_dev = to_backend(ops, std::move(local));
    ops.embedding_backward(local_dev.view(), d.view(), shard_order, d_embed);
  }
  ops.synchronize();
}

}  // namespace lockstep::engine
