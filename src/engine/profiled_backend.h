// ProfiledBackend: an OpsBackend that forwards every call to another backend and times it, for
// `lockstep bench-engine --profile-ops`. Per label (the method name; GEMMs also by their weight's
// N and K, so each weight matrix is its own line) it counts calls, the host time inside the call
// (steady clock) and the op's device time: the time between two marks of the inner backend's
// OpClock taken just before and just after the call (CUDA: events on its stream; CPU: host time).
// The results are the inner backend's, bit for bit; the two marks per op perturb the timing
// slightly.
// Device idle between ops: the time from one op's after-mark to the next op's before-mark (on a
// GPU: the device waiting for the host to issue the next op), summed per transition "from -> to"
// with the host time between the two calls, so that the wall time that no op covers can be traced
// to the host work between two ops (e.g. a step's end and the next step's first upload).
// NOTE: marks are read back ("resolved") after the inner synchronize() that the engine calls every
// step when it reads the sampled tokens, so profiling adds no wait of its own there; only when more
// than kMaxPendingMarks are pending (a long call with no wait) and at report() does it synchronize.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace lockstep::engine {

struct OpTimes {
  std::string label;  // "rmsnorm", "gemm N6144 K4096", "copy host->device", ...
  int64_t calls = 0;
  double device_s = 0;  // Σ over the calls of the time between the marks around each
  double host_s = 0;    // Σ over the calls of the host time inside the call
};

// One transition between consecutive ops: the device idle and the host time between them.
struct OpGap {
  std::string from, to;  // the ops' labels
  int64_t count = 0;
  double device_s = 0;  // Σ the time between from's after-mark and to's before-mark
  double host_s = 0;    // Σ the host time from from's return to to's call
};

struct OpProfile {
  std::vector<OpTimes> rows;  // largest device time first (ties: by label)
  OpTimes total;              // label "total": the sums over the rows, in row order
  std::vector<OpGap> gaps;    // every transition, largest device idle first (ties: by labels)
};

// Not final: a forwarding decorator of every op, so a test may derive from it to change one op
// (tests/engine/test_grpo.cc changes the one-pass log-prob head's output to check the GRPO loop's
// redo).
class ProfiledBackend : public OpsBackend {
 public:
  static constexpr size_t kMaxPendingMarks = 4096;

  explicit ProfiledBackend(std::shared_ptr<OpsBackend> inner);
  const OpsBackend& inner() const { return *inner_; }

  // While on, calls count into the decode section as well as the whole (a rollout hook sets it
  // before each step's forward: the step's forward and sampling are then its ops).
  void set_decode(bool on);
  // Both sections since the last reset() (resolving pending marks: waits for the inner backend).
  OpProfile report() const;
  OpProfile decode_report() const;
  // Resolves pending marks, then forgets every count and time; the decode flag goes off.
  void reset();

  // --- forwarded, not timed (no op runs) ---
  std::string name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  std::unique_ptr<OpClock> make_op_clock() const override { return inner_->make_op_clock(); }

  // --- forwarded and timed ---
  Tensor empty(DType dtype, std::vector<int64_t> shape) const override;
  void copy(const TensorView& dst, const TensorView& src) const override;
  // Resolves the pending marks after the inner wait (the step's one wait, see the NOTE above).
  void synchronize() const override;

  void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
            const TensorView& y) const override;
  void gemm_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                    int tp_size, int tp_rank, const GemmConfig& cfg,
                    const TensorView& y_partial) const override;
  void gemm_combine(const std::vector<TensorView>& partials, const TensorView& y) const override;

  void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
               const TensorView& y) const override;
  void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                        const RmsNormConfig& cfg, const TensorView& residual_out,
                        const TensorView& y) const override;
  void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
            const TensorView& y) const override;
  void qk_norm_rope(const TensorView& qk, int64_t nq, const TensorView& q_weight,
                    const TensorView& k_weight, const RmsNormConfig& cfg,
                    const TensorView& positions, const RopeTable& table) const override;
  void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out) const override;

  void embedding(const TensorView& ids, const TensorView& table,
                 const TensorView& out) const override;
  void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                const VocabShard& shard, int64_t vocab,
                                const TensorView& out) const override;
  void embedding_combine(const std::vector<TensorView>& partials,
                         const TensorView& out) const override;

  // The view forms (metadata as tensors) are OpsBackend's: they build the metadata through this
  // backend's copy() / synchronize() and call the forms below.
  using OpsBackend::attention_paged;
  using OpsBackend::attention_paged_cascade;
  using OpsBackend::attention_paged_split_kv;
  using OpsBackend::attention_prefill_varlen;
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const PackedSeqs& seqs, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const override;
  void attention_paged(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                       const TensorView& v_cache, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) const override;
  void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta,
                                const TensorView& k_cache, const TensorView& v_cache,
                                const AttentionConfig& cfg, int num_splits, const TensorView& out,
                                const TensorView& lse) const override;
  void attention_paged_cascade(const TensorView& q, const PagedMeta& meta,
                               const TensorView& k_cache, const TensorView& v_cache,
                               const AttentionConfig& cfg, const TensorView& out,
                               const TensorView& lse) const override;
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                      const TensorView& k_cache, const TensorView& v_cache) const override;

  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                      const LogprobParams& params, const ContractConfig& cfg,
                      const TensorView& logp, const TensorView& lse,
                      const TensorView& entropy) const override;
  void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                              const TensorView& targets, const LogprobParams& params,
                              const ContractConfig& cfg, const LogprobShard& shard,
                              const TensorView& state) const override;
  void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                              const LogprobParams& params, const ContractConfig& cfg,
                              int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) const override;
  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
              const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
              const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
              const TensorView& entropy) const override;
  void lm_head_logits(const TensorView& h, const TensorView& w_rows, const ContractConfig& cfg,
                      const TensorView& z) const override;
  void sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                     const TensorView& request_ids, const TensorView& positions,
                     const ContractConfig& cfg, const TensorView& token_ids, const TensorView& logp,
                     const TensorView& lse, const TensorView& entropy) const override;

  void round_bf16(const TensorView& src, const TensorView& dst) const override;
  void fill_zero(const TensorView& dst) const override;
  void gemm_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
               const TensorView& dx) const override;
  void gemm_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
               const TensorView& dw) const override;
  void rmsnorm_backward(const TensorView& s, const TensorView& weight, const RmsNormConfig& cfg,
                        const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                        const TensorView* dweight) const override;
  void rmsnorm_residual_backward(const TensorView& s, const TensorView& weight,
                                 const RmsNormConfig& cfg, const TensorView& gy,
                                 const TensorView& gres, const TensorView& ds,
                                 const TokenOrder* order, const TensorView* dweight) const override;
  void rope_backward(const TensorView& gy, const TensorView& positions, const RopeTable& table,
                     const TensorView& dx) const override;
  void silu_mul_backward(const TensorView& gate_up, const TensorView& ga,
                         const TensorView& dgu) const override;
  void embedding_backward(const TensorView& ids, const TensorView& gh, const TokenOrder& order,
                          const TensorView& dtable) const override;
  void linear_logprob_backward(const TensorView& h, const TensorView& w, const TensorView& targets,
                               const LogprobParams& params, const ContractConfig& cfg,
                               const TensorView& lse, const TensorView& entropy,
                               const TensorView& g_lp, const TensorView* g_ent,
                               const TensorView& dh, const TokenOrder& order,
                               const TensorView& dw) const override;
  void linear_logprob_backward_recompute(const TensorView& h, const TensorView& w,
                                         const TensorView& targets, const LogprobParams& params,
                                         const ContractConfig& cfg, const TensorView& lse,
                                         const TensorView& entropy, const TensorView& g_lp,
                                         const TensorView* g_ent, const TensorView& dh,
                                         const TokenOrder& order, const TensorView& dw,
                                         const TensorView& logp_out, const TensorView& lse_out,
                                         const TensorView& entropy_out) const override;
  void linear_logprob_backward_partial(const TensorView& h, const TensorView& w_shard,
                                       const TensorView& targets, const LogprobParams& params,
                                       const ContractConfig& cfg, const LogprobShard& shard,
                                       const TensorView& lse, const TensorView& entropy,
                                       const TensorView& g_lp, const TensorView* g_ent,
                                       const TensorView& dh_partial, const TokenOrder& order,
                                       const TensorView& dw_shard) const override;
  void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse,
                                 const TensorView& dout, const PackedSeqs& seqs,
                                 const AttentionConfig& cfg, const TensorView& dq,
                                 const TensorView& dk, const TensorView& dv) const override;

  void attention_prefill_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                                const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const override;
  void attention_backward_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse,
                                 const TensorView& dout, const SharedPromptSeqs& segs,
                                 const AttentionConfig& cfg, const TensorView& dq,
                                 const TensorView& dk, const TensorView& dv) const override;

 private:
  // One call: the inner call `f` between two marks, its host time and call count under `label`.
  template <class F>
  void timed(const std::string& label, F&& f) const;
  // One more call and its host time under `label`; returns the label's row.
  size_t count_locked(const std::string& label, double host_s) const;
  // Reads the pending marks' times into the rows (the inner backend must have synchronized).
  void resolve_locked() const;
  OpProfile profile_of(const std::vector<OpTimes>& rows,
                       const std::map<std::pair<size_t, size_t>, OpGap>& gaps) const;

  using HostTime = std::chrono::steady_clock::time_point;
  struct PendingOp {
    int before = 0, after = 0;  // marks
    size_t row = 0;             // into all_ (and decode_)
    bool decode = false;
    HostTime host_begin, host_end;  // the inner call's
  };
  // The last resolved op: its after-mark is kept (OpClock::keep_only) for the next op's gap.
  struct LastOp {
    int after = 0;
    size_t row = 0;
    HostTime host_end;
  };

  std::shared_ptr<OpsBackend> inner_;
  // NOTE: OpsBackend's methods are const, so the profiler's state is mutable, behind mu_. The
  // engine issues a backend's calls from one thread (Model runs TP ranks one after another; a CPU
  // op's own thread pool is inside the call), so the lock is never contended; it keeps a call's
  // two marks and its counts together should a caller ever share a backend between threads.
  mutable std::mutex mu_;
  std::unique_ptr<OpClock> clock_;
  mutable std::vector<PendingOp> pending_;
  mutable std::map<std::string, size_t> row_of_;  // label -> index into all_ / decode_
  mutable std::vector<OpTimes> all_, decode_;
  mutable std::optional<LastOp> last_;
  // (from row, to row) -> the transition's gaps; a gap counts into decode_gaps_ when the op after
  // it does into decode_.
  mutable std::map<std::pair<size_t, size_t>, OpGap> gaps_, decode_gaps_;
  bool decode_on_ = false;
};

}  // namespace lockstep::engine
