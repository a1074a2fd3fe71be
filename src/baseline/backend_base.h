// What the CPU and the CUDA baseline backends share: the checks the contract leaves to a backend
// (gemm with either output dtype, attention's optional lse) and the entry points they implement
// alike. Embedding is one gather, gather(), over the whole vocabulary or a shard. Decode / chunked
// prefill, split-KV and prefix-shared (cascade) paged attention are one flash-decoding routine,
// paged(), whose split count is the backend's batch-dependent choice unless split-KV forces one
// (forced_splits > 0). Without cascade kernels a prefix-shared call reads the positions below
// shared_len through the group's prefix table. (docs/baseline.md)
#pragma once

#include "contract/checks.h"
#include "engine/backend.h"
#include "lockstep/error.h"

namespace lockstep::engine {

// gemm's checks: cfg.segments, x [M, K] and w [N, K], y [M, N] bf16 or f32 (last dim contiguous)
// overlapping neither.
inline void check_baseline_gemm(const char* op, Device dev, const TensorView& x,
                                const TensorView& w, const GemmConfig& cfg, const TensorView& y) {
  contract::check_segments(op, dev, cfg);
  contract::check_xw(op, dev, x, w);
  check_tensor_dtypes(op, "y", y, {DType::kBF16, DType::kF32}, {x.size(0), w.size(0)}, dev);
  check_inner_contiguous(op, "y", y);
  LS_CHECK(!contract::overlaps(y, x) && !contract::overlaps(y, w), op,
           "argument 'y' must not overlap x or w");
}

// Whether attention's optional lse [N, Hq] is wanted: given (not a none view) and not empty.
inline bool wants_lse(const TensorView& lse) {
  return (lse.ndim != 0 || lse.data != nullptr) && lse.numel() > 0;
}

template <typename Base>
class BaselineOps : public Base {
 public:
  using Base::Base;

  void embedding(const TensorView& ids, const TensorView& table,
                 const TensorView& out) const final {
    const char* op = "baseline embedding";
    check_tensor(op, "table", table, DType::kBF16, {-1, -1}, this->device());
    gather(op, ids, table, VocabShard{0, table.shape[0]}, table.shape[0], out);
  }

  // Megatron's VocabParallelEmbedding: rows outside the shard are +0, then summed across ranks.
  void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                const VocabShard& shard, int64_t vocab,
                                const TensorView& out) const final {
    const char* op = "baseline embedding_vocab_parallel";
    LS_CHECK(vocab >= 1 && shard.begin >= 0 && shard.begin <= shard.end && shard.end <= vocab, op,
             "argument 'shard' ", shard.to_string(), " is not inside the vocabulary [0, ", vocab,
             ")");
    gather(op, ids, table, shard, vocab, out);
  }

  using Base::attention_paged;
  using Base::attention_paged_cascade;
  using Base::attention_paged_split_kv;

  void attention_paged(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                       const TensorView& v_cache, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) const final {
    paged("baseline attention_paged", q, meta, k_cache, v_cache, false, cfg, 0, out, lse);
  }

  void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta,
                                const TensorView& k_cache, const TensorView& v_cache,
                                const AttentionConfig& cfg, int num_splits, const TensorView& out,
                                const TensorView& lse) const final {
    const char* op = "baseline attention_paged_split_kv";
    LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
    paged(op, q, meta, k_cache, v_cache, false, cfg, num_splits, out, lse);
  }

  void attention_paged_cascade(const TensorView& q, const PagedMeta& meta,
                               const TensorView& k_cache, const TensorView& v_cache,
                               const AttentionConfig& cfg, const TensorView& out,
                               const TensorView& lse) const final {
    paged("baseline attention_paged_cascade", q, meta, k_cache, v_cache, true, cfg, 0, out, lse);
  }

 protected:
  // out[t] = table row ids[t] - shard.begin for an id inside the shard, else +0. Checks the call
  // with contract::check_gather on the backend's device.
  virtual void gather(const char* op, const TensorView& ids, const TensorView& table,
                      const VocabShard& shard, int64_t vocab, const TensorView& out) const = 0;
  // Rows q over one layer's caches, the step's tables in `meta` (reading positions below a
  // group's shared_len through the prefix table when `cascade`). Checks the call with
  // contract::check_paged_call on the backend's device.
  virtual void paged(const char* op, const TensorView& q, const PagedMeta& meta,
                     const TensorView& k_cache, const TensorView& v_cache, bool cascade,
                     const AttentionConfig& cfg, int forced_splits, const TensorView& out,
                     const TensorView& lse) const = 0;
};

}  // namespace lockstep::engine
