// The invariant CUDA backend: each OpsBackend call is the lockstep::cuda op of the same name
// (include/lockstep/cuda/*.h), whose bits are the contract's (docs/contract.md) and therefore the
// CPU invariant backend's. No arithmetic of its own; every op is issued on the legacy default
// stream, in call order. Memory: lockstep::cuda::empty / copy / synchronize (runtime.h).
// RoPE: the cuda op takes the table's cos/sin as device views; each distinct RopeTable is uploaded
// once (exact fp32 bits, host-built in double as the contract says) and kept for the backend's
// lifetime.
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "engine/cuda/backends.h"
#include "engine/cuda/device_backend.h"
#include "lockstep/cuda/attention.h"
#include "lockstep/cuda/elementwise.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/cuda/runtime.h"

namespace lockstep::engine {

namespace {

class CudaInvariantBackend final : public CudaDeviceBackend {
 public:
  std::string name() const override { return "invariant"; }

  void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
            const TensorView& y) const override {
    cuda::gemm_bf16_nt(x, w, nullptr, cfg, y, stream_);
  }
  void gemm_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                    int tp_size, int tp_rank, const GemmConfig& cfg,
                    const TensorView& y_partial) const override {
    cuda::gemm_bf16_nt_partial(x_shard, w_shard, k_total, tp_size, tp_rank, cfg, y_partial,
                               stream_);
  }
  void gemm_combine(const std::vector<TensorView>& partials, const TensorView& y) const override {
    cuda::gemm_tree_combine(partials, nullptr, y, stream_);
  }

  void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
               const TensorView& y) const override {
    cuda::rmsnorm(x, weight, cfg, y, stream_);
  }
  void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                        const RmsNormConfig& cfg, const TensorView& residual_out,
                        const TensorView& y) const override {
    cuda::rmsnorm_residual(x, residual, weight, cfg, residual_out, y, stream_);
  }
  void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
            const TensorView& y) const override {
    const DeviceTable& t = device_table(table);
    cuda::rope(x, positions, t.cos.view(), t.sin.view(), y, stream_);
  }
  void silu_mul(const TensorView& gate, const TensorView& up,
                const TensorView& out) const override {
    cuda::silu_mul(gate, up, out, stream_);
  }

  void embedding(const TensorView& ids, const TensorView& table,
                 const TensorView& out) const override {
    cuda::embedding(ids, table, out, stream_);
  }
  void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                const VocabShard& shard, int64_t vocab,
                                const TensorView& out) const override {
    cuda::embedding_vocab_parallel(ids, table, shard, vocab, out, stream_);
  }
  void embedding_combine(const std::vector<TensorView>& partials,
                         const TensorView& out) const override {
    cuda::embedding_combine(partials, out, stream_);
  }

  // The cuda:: attention ops plan their launches from the host-side values that PackedSeqs and
  // PagedMeta carry: nothing is copied back.
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const PackedSeqs& seqs, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const override {
    cuda::attention_prefill_varlen(q, k, v, seqs, cfg, out, lse, stream_);
  }
  void attention_paged(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                       const TensorView& v_cache, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) const override {
    cuda::attention_paged(q, meta, k_cache, v_cache, cfg, out, lse, stream_);
  }
  void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta,
                                const TensorView& k_cache, const TensorView& v_cache,
                                const AttentionConfig& cfg, int num_splits, const TensorView& out,
                                const TensorView& lse) const override {
    cuda::attention_paged_split_kv(q, meta, k_cache, v_cache, cfg, num_splits, out, lse, stream_);
  }
  void attention_paged_cascade(const TensorView& q, const PagedMeta& meta,
                               const TensorView& k_cache, const TensorView& v_cache,
                               const AttentionConfig& cfg, const TensorView& out,
                               const TensorView& lse) const override {
    cuda::attention_paged_cascade(q, meta, k_cache, v_cache, cfg, out, lse, stream_);
  }
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                      const TensorView& k_cache, const TensorView& v_cache) const override {
    cuda::kv_cache_write(k, v, slot_mapping, k_cache, v_cache, stream_);
  }

  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                      const LogprobParams& params, const ContractConfig& cfg,
                      const TensorView& logp, const TensorView& lse,
                      const TensorView& entropy) const override {
    cuda::linear_logprob(h, w, targets, params, cfg, logp, lse, entropy, stream_);
  }
  void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                              const TensorView& targets, const LogprobParams& params,
                              const ContractConfig& cfg, const LogprobShard& shard,
                              const TensorView& state) const override {
    cuda::linear_logprob_partial(h, w_shard, targets, params, cfg, shard, state, stream_);
  }
  void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                              const LogprobParams& params, const ContractConfig& cfg,
                              int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) const override {
    cuda::linear_logprob_combine(states, targets, params, cfg, vocab_size, logp, lse, entropy,
                                 stream_);
  }
  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
              const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
              const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
              const TensorView& entropy) const override {
    cuda::sample(h, w, params, request_ids, positions, cfg, token_ids, logp, lse, entropy, stream_);
  }

 private:
  struct DeviceTable {
    Tensor cos, sin;
  };
  // The device copy of a RoPE table. Keyed by the host table's storage and config: a table is a
  // pure function of its config (RopeTable::build), and the model keeps its table alive for as
  // long as it issues ops, so a (storage, config) key names one set of bits.
  const DeviceTable& device_table(const RopeTable& table) const {
    const auto key = std::make_tuple(
        static_cast<const void*>(table.cos.data()), static_cast<const void*>(table.sin.data()),
        table.config.head_dim, table.config.max_positions, table.config.theta);
    std::lock_guard<std::mutex> g(mu_);
    auto it = tables_.find(key);
    if (it != tables_.end()) return it->second;
    table.config.validate();
    const int64_t P = table.config.max_positions, half = table.half_dim();
    LS_CHECK(int64_t(table.cos.size()) == P * half && int64_t(table.sin.size()) == P * half,
             "cuda invariant rope", "table holds ", table.cos.size(), " cos and ", table.sin.size(),
             " sin entries, expected ", P * half);
    DeviceTable t{cuda::empty(DType::kF32, {P, half}), cuda::empty(DType::kF32, {P, half})};
    cuda::copy(t.cos.view(), table.cos_view(), stream_);
    cuda::copy(t.sin.view(), table.sin_view(), stream_);
    cuda::synchronize(stream_);
    return tables_.emplace(key, std::move(t)).first->second;
  }

  mutable std::mutex mu_;
  mutable std::map<std::tuple<const void*, const void*, int64_t, int64_t, double>, DeviceTable>
      tables_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_cuda_invariant_backend() {
  return std::make_unique<CudaInvariantBackend>();
}

}  // namespace lockstep::engine
