// OpsBackend: the op set the Qwen3 model (src/engine/model.h) runs on. Every numeric step of the
// forward, the log-prob heads and sampling goes through one of these calls, so a backend decides
// all the bits. The invariant backend (make_invariant_backend) forwards to lockstep::cpu::*, whose
// contract is docs/contract.md; a "baseline" backend with ordinary kernels implements the same
// interface. Signatures and argument rules are those of the cpu ops (include/lockstep/ops/*.h).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/contract.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/backward.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"
#include "lockstep/ops/sampling.h"
#include "lockstep/tensor.h"

namespace lockstep::engine {

// Timing marks for a profiler (ProfiledBackend, profiled_backend.h). mark() is ordered after every
// op issued so far on the backend that made the clock; seconds(a, b) is the time from mark a to
// mark b, valid after that backend's synchronize(); clear() drops every mark (indices restart).
class OpClock {
 public:
  virtual ~OpClock() = default;
  virtual int mark() = 0;
  virtual double seconds(int a, int b) = 0;
  virtual void clear() = 0;
  // Forgets every mark but `mark`, which becomes mark 0 (the same time); returns 0.
  virtual int keep_only(int mark) = 0;
};

// NOTE: methods are const: a backend's results may depend only on its arguments and its own
// fixed settings (a baseline backend may keep e.g. a thread count as a setting), never on
// earlier calls.
class OpsBackend {
 public:
  virtual ~OpsBackend() = default;
  virtual std::string name() const = 0;  // "invariant", "baseline", ...

  // --- memory: every tensor an op receives lives on device() ---
  // CPU backends: Device::kCPU and host Tensors; CUDA backends: Device::kCUDA, device Tensors.
  virtual Device device() const { return Device::kCPU; }
  // A contiguous tensor on device() (contents undefined).
  virtual Tensor empty(DType dtype, std::vector<int64_t> shape) const;
  // dst <- src, same dtype and shape, either side on the host or on device(); ordered after every
  // earlier op of this backend. A host destination is valid after synchronize(). A host source in
  // ordinary (pageable) memory may be reused as soon as copy() returns (CUDA stages pageable
  // host-to-device copies before returning); the engine relies on this for its per-call metadata
  // upload (engine/device.h), so a call whose outputs stay on the device never waits.
  virtual void copy(const TensorView& dst, const TensorView& src) const;
  // Waits for every issued op; throws on a pending device error. CPU: no-op.
  virtual void synchronize() const {}
  // A clock whose marks are ordered with this backend's ops. Default: the host steady clock
  // (CPU ops are synchronous: an op has finished when its call returns); the CUDA backends record
  // events on their stream.
  virtual std::unique_ptr<OpClock> make_op_clock() const;
  // --- GEMM (lockstep/ops/gemm.h) ---
  // y[M, N] = x[M, K] · w[N, K]ᵀ; y bf16 (rounded) or f32.
  virtual void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
                    const TensorView& y) const = 0;
  // Row-parallel rank `tp_rank` of `tp_size`: fp32 partial over its K columns
  // (gemm_tp_k_range(cfg, k_total, tp_size, tp_rank)).
  virtual void gemm_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                            int tp_size, int tp_rank, const GemmConfig& cfg,
                            const TensorView& y_partial) const = 0;
  // Combines the ranks' partials (rank order) into y (bf16 rounded or f32).
  virtual void gemm_combine(const std::vector<TensorView>& partials, const TensorView& y) const = 0;

  // --- elementwise (norm.h, rope.h, activation.h) ---
  virtual void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
                       const TensorView& y) const = 0;
  virtual void rmsnorm_residual(const TensorView& x, const TensorView& residual,
                                const TensorView& weight, const RmsNormConfig& cfg,
                                const TensorView& residual_out, const TensorView& y) const = 0;
  virtual void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
                    const TensorView& y) const = 0;
  // A layer's q and k heads in place: qk [T, heads, D] (q heads [0, nq), then the k heads);
  // rmsnorm of the q heads with q_weight and of the k heads with k_weight, then rope over all of
  // them. This default makes the three calls; a backend may fuse them (the same bits).
  virtual void qk_norm_rope(const TensorView& qk, int64_t nq, const TensorView& q_weight,
                            const TensorView& k_weight, const RmsNormConfig& cfg,
                            const TensorView& positions, const RopeTable& table) const;
  // out = silu(gate) * up (gate, up may be strided column halves of one buffer).
  virtual void silu_mul(const TensorView& gate, const TensorView& up,
                        const TensorView& out) const = 0;

  // --- embedding (embedding.h) ---
  virtual void embedding(const TensorView& ids, const TensorView& table,
                         const TensorView& out) const = 0;
  virtual void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                        const VocabShard& shard, int64_t vocab,
                                        const TensorView& out) const = 0;
  virtual void embedding_combine(const std::vector<TensorView>& partials,
                                 const TensorView& out) const = 0;

  // --- attention (attention.h); lse may be an empty TensorView{} ---
  // Packed prefill over validated sequences (PackedSeqs: host cu_seqlens and its copy on
  // device(), built once per forward_packed call, engine/device.h).
  virtual void attention_prefill_varlen(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const PackedSeqs& seqs,
                                        const AttentionConfig& cfg, const TensorView& out,
                                        const TensorView& lse) const = 0;
  // The same over a cu_seqlens view (host or device(): copied back), for tests and tools.
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& cu_seqlens, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const;
  // Paged attention over one step's validated metadata (PagedMeta, lockstep/contract/attention.h:
  // host tables and their copies on device(), built once per step, engine/device.h) and one
  // layer's caches k_cache / v_cache [NP, P, Hkv, D] (a rank's kv heads). No call re-validates or
  // copies back the metadata. _cascade takes a meta with prefix tables, the others one without.
  virtual void attention_paged(const TensorView& q, const PagedMeta& meta,
                               const TensorView& k_cache, const TensorView& v_cache,
                               const AttentionConfig& cfg, const TensorView& out,
                               const TensorView& lse) const = 0;
  virtual void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta,
                                        const TensorView& k_cache, const TensorView& v_cache,
                                        const AttentionConfig& cfg, int num_splits,
                                        const TensorView& out, const TensorView& lse) const = 0;
  virtual void attention_paged_cascade(const TensorView& q, const PagedMeta& meta,
                                       const TensorView& k_cache, const TensorView& v_cache,
                                       const AttentionConfig& cfg, const TensorView& out,
                                       const TensorView& lse) const = 0;
  // The same ops over views, for tests and tools (the engine builds the meta once per step):
  // metadata on the host or on device() (copied back to the host, waiting for it), validated and
  // uploaded for this one call (paged_meta_for_views, engine/device.h).
  void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                       const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) const;
  void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq,
                                const TensorView& q_pos, const PagedKv& kv,
                                const AttentionConfig& cfg, int num_splits, const TensorView& out,
                                const TensorView& lse) const;
  void attention_paged_cascade(const TensorView& q, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const SharedPrefix& prefix, const AttentionConfig& cfg,
                               const TensorView& out, const TensorView& lse) const;
  virtual void kv_cache_write(const TensorView& k, const TensorView& v,
                              const TensorView& slot_mapping, const TensorView& k_cache,
                              const TensorView& v_cache) const = 0;

  // --- heads (logprob.h, sampling.h) ---
  virtual void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                              const LogprobParams& params, const ContractConfig& cfg,
                              const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) const = 0;
  virtual void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                                      const TensorView& targets, const LogprobParams& params,
                                      const ContractConfig& cfg, const LogprobShard& shard,
                                      const TensorView& state) const = 0;
  virtual void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                                      const LogprobParams& params, const ContractConfig& cfg,
                                      int64_t vocab_size, const TensorView& logp,
                                      const TensorView& lse, const TensorView& entropy) const = 0;
  virtual void sample(const TensorView& h, const TensorView& w,
                      std::span<const SamplingParams> params, const TensorView& request_ids,
                      const TensorView& positions, const ContractConfig& cfg,
                      const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
                      const TensorView& entropy) const = 0;
  // Vocab-parallel sampling (lockstep/ops/sampling.h): the logits of a row range of the lm_head,
  // and sample() from logits gathered side by side, with sample's bits. The invariant backends run
  // the contract ops (lockstep::cpu's, lockstep::cuda's), the CPU baseline its own; the CUDA
  // baseline does not have them (it throws lockstep::Error naming itself and the op).
  virtual void lm_head_logits(const TensorView& h, const TensorView& w_rows,
                              const ContractConfig& cfg, const TensorView& z) const;
  virtual void sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                             const TensorView& request_ids, const TensorView& positions,
                             const ContractConfig& cfg, const TensorView& token_ids,
                             const TensorView& logp, const TensorView& lse,
                             const TensorView& entropy) const;

  // --- backward (lockstep/ops/backward.h, docs/contract.md §B) ---
  // The invariant backends run the contract's backward ops; a backend without a backward (the
  // baselines today) throws lockstep::Error naming itself. rope_backward takes the host table (a
  // device backend uploads it once, as rope()).
  // dst (bf16) = round_bf16(src (f32)), 2-D, rows may be strided; and +0 fills (f32 / bf16).
  virtual void round_bf16(const TensorView& src, const TensorView& dst) const;
  virtual void fill_zero(const TensorView& dst) const;
  virtual void gemm_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
                       const TensorView& dx) const;
  virtual void gemm_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                       const TensorView& dw) const;
  virtual void rmsnorm_backward(const TensorView& s, const TensorView& weight,
                                const RmsNormConfig& cfg, const TensorView& gy,
                                const TensorView& dx, const TokenOrder* order,
                                const TensorView* dweight) const;
  virtual void rmsnorm_residual_backward(const TensorView& s, const TensorView& weight,
                                         const RmsNormConfig& cfg, const TensorView& gy,
                                         const TensorView& gres, const TensorView& ds,
                                         const TokenOrder* order, const TensorView* dweight) const;
  virtual void rope_backward(const TensorView& gy, const TensorView& positions,
                             const RopeTable& table, const TensorView& dx) const;
  virtual void silu_mul_backward(const TensorView& gate_up, const TensorView& ga,
                                 const TensorView& dgu) const;
  virtual void embedding_backward(const TensorView& ids, const TensorView& gh,
                                  const TokenOrder& order, const TensorView& dtable) const;
  virtual void linear_logprob_backward(const TensorView& h, const TensorView& w,
                                       const TensorView& targets, const LogprobParams& params,
                                       const ContractConfig& cfg, const TensorView& lse,
                                       const TensorView& entropy, const TensorView& g_lp,
                                       const TensorView* g_ent, const TensorView& dh,
                                       const TokenOrder& order, const TensorView& dw) const;
  // linear_logprob_backward from a given lse / entropy that also writes the forward's outputs of
  // the same inputs (logp_out, lse_out, entropy_out: [T] f32, the bits linear_logprob writes;
  // docs/contract.md §B.8 "The forward from the backward"): a caller that holds the forward's lse
  // already (an on-policy step: the rollout's) skips the forward and compares afterwards; where
  // the given and the returned values differ, the gradients were taken at a wrong lse. This
  // default runs linear_logprob, then linear_logprob_backward; the invariant CUDA backend does both
  // in one pass over the vocab (one logits GEMM fewer).
  virtual void linear_logprob_backward_recompute(
      const TensorView& h, const TensorView& w, const TensorView& targets,
      const LogprobParams& params, const ContractConfig& cfg, const TensorView& lse,
      const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
      const TensorView& dh, const TokenOrder& order, const TensorView& dw,
      const TensorView& logp_out, const TensorView& lse_out, const TensorView& entropy_out) const;
  virtual void attention_backward_varlen(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& dout,
                                         const PackedSeqs& seqs, const AttentionConfig& cfg,
                                         const TensorView& dq, const TensorView& dk,
                                         const TensorView& dv) const;
  // Vocab-parallel log-prob backward (lockstep/ops/backward.h, a rank-local Backprop): the
  // invariant CPU backend runs cpu::linear_logprob_backward_partial; every other backend (the
  // CUDA ones too, not implemented there yet) throws lockstep::Error naming itself and the op.
  virtual void linear_logprob_backward_partial(
      const TensorView& h, const TensorView& w_shard, const TensorView& targets,
      const LogprobParams& params, const ContractConfig& cfg, const LogprobShard& shard,
      const TensorView& lse, const TensorView& entropy, const TensorView& g_lp,
      const TensorView* g_ent, const TensorView& dh_partial, const TokenOrder& order,
      const TensorView& dw_shard) const;

  // --- shared-prompt groups (docs/contract.md §B.11) ---
  // The forward and backward of attention over SharedPromptSeqs (host metadata). The invariant
  // backends run the contract ops (lockstep::cpu's, lockstep::cuda's); every other backend (the
  // baselines) throws lockstep::Error naming itself and the op.
  virtual void attention_prefill_shared(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const SharedPromptSeqs& segs,
                                        const AttentionConfig& cfg, const TensorView& out,
                                        const TensorView& lse) const;
  virtual void attention_backward_shared(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& dout,
                                         const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                                         const TensorView& dq, const TensorView& dk,
                                         const TensorView& dv) const;
};

// The invariant CPU backend: every call is the lockstep::cpu op of the same name.
std::unique_ptr<OpsBackend> make_invariant_backend();

}  // namespace lockstep::engine
