// CUDA attention: the same bits as the lockstep::cpu attention ops (docs/contract.md §A): per row,
// 64-key blocks by absolute position, kv_chunk chunks, the A.4 fold; every mode (packed prefill,
// paged decode / chunked prefill, split-KV, cascade, chunk states) computes the same operations.
// Plain C++ header (no CUDA types; stream = opaque cudaStream_t, nullptr = default stream).
//
// Metadata (cu_seqlens, q_seq, q_pos, block tables, seq_lens, shared_len, seq_group, slot_mapping)
// may be host views (Device::kCPU: every value is checked exactly like the CPU op, then copied to
// the device) or device views. Device block tables and a device slot_mapping are trusted (only
// dtype/shape are checked; kernels never read outside the caches and tables: a table entry or
// page index out of range reads as a zero key, an out-of-range slot is skipped). The small
// per-row / per-sequence views (cu_seqlens, q_seq, q_pos, seq_lens, shared_len, seq_group) are
// needed to plan the launch: device ones are copied back (one synchronous copy each) and checked
// like host ones. q/k/v/caches/out/lse/states are device views. Each call uploads its work list
// (one stream-ordered allocation and copy) and frees it in stream order.
#pragma once

#include <string>

#include "lockstep/ops/attention.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda {

void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& cu_seqlens, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse, void* stream = nullptr);
// Over validated packed sequences (PackedSeqs): the launch plans from its host-side boundaries;
// nothing is re-validated or copied back.
void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const PackedSeqs& seqs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse, void* stream = nullptr);
// Over shared-prompt groups (SharedPromptSeqs, docs/contract.md §B.11): a completion's rows read
// the keys below Lp from its prompt's rows; every row gets the bits of the unshared packing. The
// launch plans from the validated host-side segments.
void attention_prefill_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                              const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse, void* stream = nullptr);
void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                     const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse, void* stream = nullptr);
void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                              const PagedKv& kv, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse, void* stream = nullptr);
void attention_paged_cascade(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                             const PagedKv& kv, const SharedPrefix& prefix,
                             const AttentionConfig& cfg, const TensorView& out,
                             const TensorView& lse, void* stream = nullptr);
// The paged ops over one step's validated metadata (PagedMeta, lockstep/contract/attention.h):
// nothing is re-validated or copied back; only q, the caches, out and lse are checked against
// the meta (O(1)). The kernels read the meta's device copies of the block tables (device views;
// host copies are uploaded per call); q_seq / q_pos / seq_lens / prefix groups come from the
// meta's host-side values. _cascade takes a meta with prefix tables, the others one without.
void attention_paged(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                     const TensorView& v_cache, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse, void* stream = nullptr);
void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                              const TensorView& v_cache, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse, void* stream = nullptr);
void attention_paged_cascade(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                             const TensorView& v_cache, const AttentionConfig& cfg,
                             const TensorView& out, const TensorView& lse, void* stream = nullptr);
void attention_paged_chunk_states(const TensorView& q, const TensorView& q_seq,
                                  const TensorView& q_pos, const PagedKv& kv,
                                  const AttentionConfig& cfg, int64_t chunk_begin,
                                  const AttentionChunkStates& states, void* stream = nullptr);
void attention_merge_chunk_states(const AttentionChunkStates& states, const TensorView& q_pos,
                                  const AttentionConfig& cfg, const TensorView& out,
                                  const TensorView& lse, void* stream = nullptr);
void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                    const TensorView& k_cache, const TensorView& v_cache, void* stream = nullptr);

// The launch choices (tile sizes, grid, split counts) for given non-batch sizes, printable.
std::string attention_launch_plan(const AttentionConfig& cfg, int64_t hq, int64_t hkv,
                                  int64_t head_dim);

}  // namespace lockstep::cuda
