// The baseline backends' three paged attention entry points, shared by the CPU and the CUDA
// baseline: decode / chunked prefill, split-KV and prefix-shared (cascade) attention are one
// flash-decoding routine, paged(), whose split count is the backend's batch-dependent choice
// unless split-KV forces one (forced_splits > 0). Without cascade kernels a prefix-shared call
// reads the positions below shared_len through the group's prefix table. (docs/baseline.md)
#pragma once

#include "engine/backend.h"
#include "lockstep/error.h"

namespace lockstep::engine {

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
