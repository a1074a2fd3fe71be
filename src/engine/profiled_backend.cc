// ProfiledBackend: every OpsBackend call forwarded to the inner backend between two OpClock marks.
// See profiled_backend.h.
#include "engine/profiled_backend.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "lockstep/error.h"

namespace lockstep::engine {

namespace {

// A weight matrix's line: "gemm N6144 K4096" for w [N, K].
std::string by_weight(const char* op, const TensorView& w) {
  return detail::concat(op, " N", w.ndim == 2 ? w.shape[0] : -1, " K",
                        w.ndim == 2 ? w.shape[1] : -1);
}

const char* side(const TensorView& v) { return v.device == Device::kCPU ? "host" : "device"; }

}  // namespace

ProfiledBackend::ProfiledBackend(std::shared_ptr<OpsBackend> inner) : inner_(std::move(inner)) {
  LS_CHECK(inner_ != nullptr, "ProfiledBackend", "no backend to profile");
  clock_ = inner_->make_op_clock();
}

template <class F>
void ProfiledBackend::timed(const std::string& label, F&& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int before = clock_->mark();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const auto t1 = std::chrono::steady_clock::now();
  const double host = std::chrono::duration<double>(t1 - t0).count();
  const int after = clock_->mark();
  pending_.push_back(PendingOp{before, after, count_locked(label, host), decode_on_, t0, t1});
  if (2 * pending_.size() > kMaxPendingMarks) {
    inner_->synchronize();
    resolve_locked();
  }
}

size_t ProfiledBackend::count_locked(const std::string& label, double host_s) const {
  const auto [it, added] = row_of_.try_emplace(label, all_.size());
  if (added) {
    all_.push_back(OpTimes{label});
    decode_.push_back(OpTimes{label});
  }
  for (OpTimes* t : {&all_[it->second], decode_on_ ? &decode_[it->second] : nullptr})
    if (t) {
      ++t->calls;
      t->host_s += host_s;
    }
  return it->second;
}

void ProfiledBackend::resolve_locked() const {
  for (const PendingOp& p : pending_) {
    const double s = clock_->seconds(p.before, p.after);
    all_[p.row].device_s += s;
    if (p.decode) decode_[p.row].device_s += s;
    if (last_) {
      const double idle = clock_->seconds(last_->after, p.before);
      const double host = std::chrono::duration<double>(p.host_begin - last_->host_end).count();
      for (auto* m : {&gaps_, p.decode ? &decode_gaps_ : nullptr}) {
        if (!m) continue;
        OpGap& g = (*m)[{last_->row, p.row}];
        ++g.count;
        g.device_s += idle;
        g.host_s += host;
      }
    }
    last_ = LastOp{p.after, p.row, p.host_end};
  }
  pending_.clear();
  if (last_) {
    last_->after = clock_->keep_only(last_->after);
  } else {
    clock_->clear();
  }
}

void ProfiledBackend::set_decode(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  decode_on_ = on;
}

OpProfile ProfiledBackend::profile_of(
    const std::vector<OpTimes>& rows,
    const std::map<std::pair<size_t, size_t>, OpGap>& gaps) const {
  OpProfile p;
  for (const auto& [key, g] : gaps) {
    OpGap named = g;
    named.from = all_[key.first].label;
    named.to = all_[key.second].label;
    p.gaps.push_back(std::move(named));
  }
  std::sort(p.gaps.begin(), p.gaps.end(), [](const OpGap& a, const OpGap& b) {
    if (a.device_s != b.device_s) return a.device_s > b.device_s;
    return a.from != b.from ? a.from < b.from : a.to < b.to;
  });
  p.total.label = "total";
  for (const OpTimes& t : rows)
    if (t.calls > 0) p.rows.push_back(t);
  std::sort(p.rows.begin(), p.rows.end(), [](const OpTimes& a, const OpTimes& b) {
    return a.device_s != b.device_s ? a.device_s > b.device_s : a.label < b.label;
  });
  for (const OpTimes& t : p.rows) {  // summed in row order
    p.total.calls += t.calls;
    p.total.device_s += t.device_s;
    p.total.host_s += t.host_s;
  }
  return p;
}

OpProfile ProfiledBackend::report() const {
  std::lock_guard<std::mutex> lock(mu_);
  inner_->synchronize();
  resolve_locked();
  return profile_of(all_, gaps_);
}

OpProfile ProfiledBackend::decode_report() const {
  std::lock_guard<std::mutex> lock(mu_);
  inner_->synchronize();
  resolve_locked();
  return profile_of(decode_, decode_gaps_);
}

void ProfiledBackend::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  inner_->synchronize();
  resolve_locked();
  row_of_.clear();
  all_.clear();
  decode_.clear();
  last_.reset();
  clock_->clear();
  gaps_.clear();
  decode_gaps_.clear();
  decode_on_ = false;
}

// --- memory ---

Tensor ProfiledBackend::empty(DType dtype, std::vector<int64_t> shape) const {
  Tensor t;
  timed("empty", [&] { t = inner_->empty(dtype, std::move(shape)); });
  return t;
}
void ProfiledBackend::copy(const TensorView& dst, const TensorView& src) const {
  timed(detail::concat("copy ", side(src), "->", side(dst)), [&] { inner_->copy(dst, src); });
}
void ProfiledBackend::synchronize() const {
  // No marks around the wait: a mark recorded after it would still be pending when resolved.
  std::lock_guard<std::mutex> lock(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  inner_->synchronize();
  const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  count_locked("synchronize", host);
  resolve_locked();
}

// --- ops: each forwarded under its method's name ---

void ProfiledBackend::gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
                           const TensorView& y) const {
  timed(by_weight("gemm", w), [&] { inner_->gemm(x, w, cfg, y); });
}
void ProfiledBackend::gemm_partial(const TensorView& x_shard, const TensorView& w_shard,
                                   int64_t k_total, int tp_size, int tp_rank, const GemmConfig& cfg,
                                   const TensorView& y_partial) const {
  timed(by_weight("gemm_partial", w_shard),
        [&] { inner_->gemm_partial(x_shard, w_shard, k_total, tp_size, tp_rank, cfg, y_partial); });
}
void ProfiledBackend::gemm_combine(const std::vector<TensorView>& partials,
                                   const TensorView& y) const {
  timed("gemm_combine", [&] { inner_->gemm_combine(partials, y); });
}

void ProfiledBackend::rmsnorm(const TensorView& x, const TensorView& weight,
                              const RmsNormConfig& cfg, const TensorView& y) const {
  timed("rmsnorm", [&] { inner_->rmsnorm(x, weight, cfg, y); });
}
void ProfiledBackend::rmsnorm_residual(const TensorView& x, const TensorView& residual,
                                       const TensorView& weight, const RmsNormConfig& cfg,
                                       const TensorView& residual_out, const TensorView& y) const {
  timed("rmsnorm_residual",
        [&] { inner_->rmsnorm_residual(x, residual, weight, cfg, residual_out, y); });
}
void ProfiledBackend::rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
                           const TensorView& y) const {
  timed("rope", [&] { inner_->rope(x, positions, table, y); });
}
void ProfiledBackend::qk_norm_rope(const TensorView& qk, int64_t nq, const TensorView& q_weight,
                                   const TensorView& k_weight, const RmsNormConfig& cfg,
                                   const TensorView& positions, const RopeTable& table) const {
  timed("qk_norm_rope",
        [&] { inner_->qk_norm_rope(qk, nq, q_weight, k_weight, cfg, positions, table); });
}
void ProfiledBackend::silu_mul(const TensorView& gate, const TensorView& up,
                               const TensorView& out) const {
  timed("silu_mul", [&] { inner_->silu_mul(gate, up, out); });
}

void ProfiledBackend::embedding(const TensorView& ids, const TensorView& table,
                                const TensorView& out) const {
  timed("embedding", [&] { inner_->embedding(ids, table, out); });
}
void ProfiledBackend::embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                               const VocabShard& shard, int64_t vocab,
                                               const TensorView& out) const {
  timed("embedding_vocab_parallel",
        [&] { inner_->embedding_vocab_parallel(ids, table, shard, vocab, out); });
}
void ProfiledBackend::embedding_combine(const std::vector<TensorView>& partials,
                                        const TensorView& out) const {
  timed("embedding_combine", [&] { inner_->embedding_combine(partials, out); });
}

void ProfiledBackend::attention_prefill_varlen(const TensorView& q, const TensorView& k,
                                               const TensorView& v, const PackedSeqs& seqs,
                                               const AttentionConfig& cfg, const TensorView& out,
                                               const TensorView& lse) const {
  timed("attention_prefill_varlen",
        [&] { inner_->attention_prefill_varlen(q, k, v, seqs, cfg, out, lse); });
}
void ProfiledBackend::attention_paged(const TensorView& q, const PagedMeta& meta,
                                      const TensorView& k_cache, const TensorView& v_cache,
                                      const AttentionConfig& cfg, const TensorView& out,
                                      const TensorView& lse) const {
  timed("attention_paged",
        [&] { inner_->attention_paged(q, meta, k_cache, v_cache, cfg, out, lse); });
}
void ProfiledBackend::attention_paged_split_kv(const TensorView& q, const PagedMeta& meta,
                                               const TensorView& k_cache, const TensorView& v_cache,
                                               const AttentionConfig& cfg, int num_splits,
                                               const TensorView& out, const TensorView& lse) const {
  timed("attention_paged_split_kv", [&] {
    inner_->attention_paged_split_kv(q, meta, k_cache, v_cache, cfg, num_splits, out, lse);
  });
}
void ProfiledBackend::attention_paged_cascade(const TensorView& q, const PagedMeta& meta,
                                              const TensorView& k_cache, const TensorView& v_cache,
                                              const AttentionConfig& cfg, const TensorView& out,
                                              const TensorView& lse) const {
  timed("attention_paged_cascade",
        [&] { inner_->attention_paged_cascade(q, meta, k_cache, v_cache, cfg, out, lse); });
}
void ProfiledBackend::kv_cache_write(const TensorView& k, const TensorView& v,
                                     const TensorView& slot_mapping, const TensorView& k_cache,
                                     const TensorView& v_cache) const {
  timed("kv_cache_write", [&] { inner_->kv_cache_write(k, v, slot_mapping, k_cache, v_cache); });
}

void ProfiledBackend::linear_logprob(const TensorView& h, const TensorView& w,
                                     const TensorView& targets, const LogprobParams& params,
                                     const ContractConfig& cfg, const TensorView& logp,
                                     const TensorView& lse, const TensorView& entropy) const {
  timed("linear_logprob",
        [&] { inner_->linear_logprob(h, w, targets, params, cfg, logp, lse, entropy); });
}
void ProfiledBackend::linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                                             const TensorView& targets, const LogprobParams& params,
                                             const ContractConfig& cfg, const LogprobShard& shard,
                                             const TensorView& state) const {
  timed("linear_logprob_partial",
        [&] { inner_->linear_logprob_partial(h, w_shard, targets, params, cfg, shard, state); });
}
void ProfiledBackend::linear_logprob_combine(const TensorView& states, const TensorView& targets,
                                             const LogprobParams& params, const ContractConfig& cfg,
                                             int64_t vocab_size, const TensorView& logp,
                                             const TensorView& lse,
                                             const TensorView& entropy) const {
  timed("linear_logprob_combine", [&] {
    inner_->linear_logprob_combine(states, targets, params, cfg, vocab_size, logp, lse, entropy);
  });
}
void ProfiledBackend::sample(const TensorView& h, const TensorView& w,
                             std::span<const SamplingParams> params, const TensorView& request_ids,
                             const TensorView& positions, const ContractConfig& cfg,
                             const TensorView& token_ids, const TensorView& logp,
                             const TensorView& lse, const TensorView& entropy) const {
  timed("sample", [&] {
    inner_->sample(h, w, params, request_ids, positions, cfg, token_ids, logp, lse, entropy);
  });
}

void ProfiledBackend::lm_head_logits(const TensorView& h, const TensorView& w_rows,
                                     const ContractConfig& cfg, const TensorView& z) const {
  timed("lm_head_logits", [&] { inner_->lm_head_logits(h, w_rows, cfg, z); });
}

void ProfiledBackend::sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                                    const TensorView& request_ids, const TensorView& positions,
                                    const ContractConfig& cfg, const TensorView& token_ids,
                                    const TensorView& logp, const TensorView& lse,
                                    const TensorView& entropy) const {
  timed("sample_logits", [&] {
    inner_->sample_logits(z, params, request_ids, positions, cfg, token_ids, logp, lse, entropy);
  });
}

// --- backward ---

void ProfiledBackend::round_bf16(const TensorView& src, const TensorView& dst) const {
  timed("round_bf16", [&] { inner_->round_bf16(src, dst); });
}
void ProfiledBackend::fill_zero(const TensorView& dst) const {
  timed("fill_zero", [&] { inner_->fill_zero(dst); });
}
void ProfiledBackend::gemm_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
                              const TensorView& dx) const {
  timed(by_weight("gemm_dx", w), [&] { inner_->gemm_dx(dy, w, cfg, dx); });
}
void ProfiledBackend::gemm_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                              const TensorView& dw) const {
  timed(by_weight("gemm_dw", dw), [&] { inner_->gemm_dw(dy, x, order, dw); });
}
void ProfiledBackend::rmsnorm_backward(const TensorView& s, const TensorView& weight,
                                       const RmsNormConfig& cfg, const TensorView& gy,
                                       const TensorView& dx, const TokenOrder* order,
                                       const TensorView* dweight) const {
  timed("rmsnorm_backward",
        [&] { inner_->rmsnorm_backward(s, weight, cfg, gy, dx, order, dweight); });
}
void ProfiledBackend::rmsnorm_residual_backward(const TensorView& s, const TensorView& weight,
                                                const RmsNormConfig& cfg, const TensorView& gy,
                                                const TensorView& gres, const TensorView& ds,
                                                const TokenOrder* order,
                                                const TensorView* dweight) const {
  timed("rmsnorm_residual_backward",
        [&] { inner_->rmsnorm_residual_backward(s, weight, cfg, gy, gres, ds, order, dweight); });
}
void ProfiledBackend::rope_backward(const TensorView& gy, const TensorView& positions,
                                    const RopeTable& table, const TensorView& dx) const {
  timed("rope_backward", [&] { inner_->rope_backward(gy, positions, table, dx); });
}
void ProfiledBackend::silu_mul_backward(const TensorView& gate_up, const TensorView& ga,
                                        const TensorView& dgu) const {
  timed("silu_mul_backward", [&] { inner_->silu_mul_backward(gate_up, ga, dgu); });
}
void ProfiledBackend::embedding_backward(const TensorView& ids, const TensorView& gh,
                                         const TokenOrder& order, const TensorView& dtable) const {
  timed("embedding_backward", [&] { inner_->embedding_backward(ids, gh, order, dtable); });
}
void ProfiledBackend::linear_logprob_backward(const TensorView& h, const TensorView& w,
                                              const TensorView& targets,
                                              const LogprobParams& params,
                                              const ContractConfig& cfg, const TensorView& lse,
                                              const TensorView& entropy, const TensorView& g_lp,
                                              const TensorView* g_ent, const TensorView& dh,
                                              const TokenOrder& order, const TensorView& dw) const {
  timed("linear_logprob_backward", [&] {
    inner_->linear_logprob_backward(h, w, targets, params, cfg, lse, entropy, g_lp, g_ent, dh,
                                    order, dw);
  });
}
void ProfiledBackend::linear_logprob_backward_recompute(
    const TensorView& h, const TensorView& w, const TensorView& targets,
    const LogprobParams& params, const ContractConfig& cfg, const TensorView& lse,
    const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
    const TensorView& dh, const TokenOrder& order, const TensorView& dw, const TensorView& logp_out,
    const TensorView& lse_out, const TensorView& entropy_out) const {
  timed("linear_logprob_backward_recompute", [&] {
    inner_->linear_logprob_backward_recompute(h, w, targets, params, cfg, lse, entropy, g_lp, g_ent,
                                              dh, order, dw, logp_out, lse_out, entropy_out);
  });
}
void ProfiledBackend::linear_logprob_backward_partial(
    const TensorView& h, const TensorView& w_shard, const TensorView& targets,
    const LogprobParams& params, const ContractConfig& cfg, const LogprobShard& shard,
    const TensorView& lse, const TensorView& entropy, const TensorView& g_lp,
    const TensorView* g_ent, const TensorView& dh_partial, const TokenOrder& order,
    const TensorView& dw_shard) const {
  timed("linear_logprob_backward_partial", [&] {
    inner_->linear_logprob_backward_partial(h, w_shard, targets, params, cfg, shard, lse, entropy,
                                            g_lp, g_ent, dh_partial, order, dw_shard);
  });
}
void ProfiledBackend::attention_backward_varlen(const TensorView& q, const TensorView& k,
                                                const TensorView& v, const TensorView& out,
                                                const TensorView& lse, const TensorView& dout,
                                                const PackedSeqs& seqs, const AttentionConfig& cfg,
                                                const TensorView& dq, const TensorView& dk,
                                                const TensorView& dv) const {
  timed("attention_backward_varlen",
        [&] { inner_->attention_backward_varlen(q, k, v, out, lse, dout, seqs, cfg, dq, dk, dv); });
}

// --- shared-prompt groups ---

void ProfiledBackend::attention_prefill_shared(const TensorView& q, const TensorView& k,
                                               const TensorView& v, const SharedPromptSeqs& segs,
                                               const AttentionConfig& cfg, const TensorView& out,
                                               const TensorView& lse) const {
  timed("attention_prefill_shared",
        [&] { inner_->attention_prefill_shared(q, k, v, segs, cfg, out, lse); });
}
void ProfiledBackend::attention_backward_shared(const TensorView& q, const TensorView& k,
                                                const TensorView& v, const TensorView& out,
                                                const TensorView& lse, const TensorView& dout,
                                                const SharedPromptSeqs& segs,
                                                const AttentionConfig& cfg, const TensorView& dq,
                                                const TensorView& dk, const TensorView& dv) const {
  timed("attention_backward_shared",
        [&] { inner_->attention_backward_shared(q, k, v, out, lse, dout, segs, cfg, dq, dk, dv); });
}

}  // namespace lockstep::engine
