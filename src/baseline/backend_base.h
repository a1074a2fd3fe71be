// What the CPU and the CUDA baseline backends share: the checks the contract leaves to a backend
// (gemm with either output dtype, a vocab shard), and the three paged attention entry points:
// decode / chunked prefill, split-KV and prefix-shared (cascade) attention are one
// flash-decoding routine, paged(), whose split count is the backend's batch-dependent choice
// unless split-KV forces one (forced_splits > 0). Without cascade kernels a prefix-shared call
// reads the positions below shared_len through the group's prefix table. (docs/baseline.md)
#pragma once

#include "contract/checks.h"
#include "engine/backend.h"
#include "lockstep/error.h"

namespace lockstep::engine {

struct GemmDims {
  int64_t M, N, K;
};

// gemm's checks: cfg.segments, x [M, K] and w [N, K], y [M, N] bf16 or f32 (last dim contiguous)
// overlapping neither.
inline GemmDims check_baseline_gemm(const char* op, Device dev, const TensorView& x,
                                    const TensorView& w, const GemmConfig& cfg,
                                    const TensorView& y) {
  contract::check_segments(op, dev, cfg);
  contract::check_xw(op, dev, x, w);
  const GemmDims d{x.size(0), w.size(0), x.size(1)};
  check_tensor_dtypes(op, "y", y, {DType::kBF16, DType::kF32}, {d.M, d.N}, dev);
  check_inner_contiguous(op, "y", y);
  LS_CHECK(!contract::overlaps(y, x) && !contract::overlaps(y, w), op,
           "argument 'y' must not overlap x or w");
  return d;
}

// embedding_vocab_parallel's shard: inside the vocabulary [0, vocab).
inline void check_vocab_shard(const char* op, const VocabShard& shard, int64_t vocab) {
  LS_CHECK(vocab >= 1 && shard.begin >= 0 && shard.begin <= shard.end && shard.end <= vocab, op,
           "argument 'shard' ", shard.to_string(), " is not inside the vocabulary [0, ", vocab,
           ")");
}

template <typename Base>
class BaselinePagedAttention : public Base {
 public:
  using Base::Base;

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
  // Rows q over one layer's caches, the step's tables in `meta` (reading positions below a
  // group's shared_len through the prefix table when `cascade`). Checks the call with
  // contract::check_paged_call on the backend's device.
  virtual void paged(const char* op, const TensorView& q, const PagedMeta& meta,
                     const TensorView& k_cache, const TensorView& v_cache, bool cascade,
                     const AttentionConfig& cfg, int forced_splits, const TensorView& out,
                     const TensorView& lse) const = 0;
};

}  // namespace lockstep::engine
