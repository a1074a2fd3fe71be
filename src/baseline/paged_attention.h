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

  void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                       const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) const final {
    paged("baseline attention_paged", q, q_seq, q_pos, kv, nullptr, cfg, 0, out, lse);
  }

  void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq,
                                const TensorView& q_pos, const PagedKv& kv,
                                const AttentionConfig& cfg, int num_splits, const TensorView& out,
                                const TensorView& lse) const final {
    const char* op = "baseline attention_paged_split_kv";
    LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
    paged(op, q, q_seq, q_pos, kv, nullptr, cfg, num_splits, out, lse);
  }

  void attention_paged_cascade(const TensorView& q, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const SharedPrefix& prefix, const AttentionConfig& cfg,
                               const TensorView& out, const TensorView& lse) const final {
    paged("baseline attention_paged_cascade", q, q_seq, q_pos, kv, &prefix, cfg, 0, out, lse);
  }

 protected:
  // Rows q (with q_seq / q_pos) over the paged cache (and the prefix tables, when given).
  virtual void paged(const char* op, const TensorView& q, const TensorView& q_seq,
                     const TensorView& q_pos, const PagedKv& kv, const SharedPrefix* prefix,
                     const AttentionConfig& cfg, int forced_splits, const TensorView& out,
                     const TensorView& lse) const = 0;
};

}  // namespace lockstep::engine
