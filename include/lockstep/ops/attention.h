// attention: the CPU reference op (the executable spec of the contract). Its types, layouts and
// formulas, and the normative description, are in lockstep/contract/attention.h.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/contract/attention.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu {

// Outputs of every attention op:
//   out  [N, Hq, D] bf16, last dim contiguous: softmax(scores)·v, rounded once
//   lse  [N, Hq] f32 natural-log log-sum-exp of softmax_scale·q·k over the row's keys; pass an
//        empty TensorView{} (ndim 0) when it is not wanted.

// Packed variable-length causal prefill: sequence b holds tokens [cu_seqlens[b], cu_seqlens[b+1])
// at positions 0, 1, ...; each token attends to its own sequence's keys at positions <= its own.
//   q          [T, Hq, D]  bf16, last dim contiguous, any outer strides (e.g. a fused qkv view)
//   k, v       [T, Hkv, D] bf16, likewise
//   cu_seqlens [B+1] i32: 0 = cu[0] <= cu[1] <= ... <= cu[B] = T (empty sequences allowed)
//   out [T, Hq, D], lse [T, Hq]
void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& cu_seqlens, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse);
// The same over validated packed sequences (PackedSeqs, lockstep/contract/attention.h): only q,
// k, v, out and lse are checked (O(1)).
void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              const PackedSeqs& seqs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse);

// Packed prefill over shared-prompt groups (SharedPromptSeqs, docs/contract.md §B.11): a prompt
// segment's rows at positions 0 .. Lp-1 attend to its own keys; a completion's rows at positions
// Lp .. attend to its prompt's keys (positions < Lp, the prompt's rows) and then its own. Every row
// computes §A.4 exactly: its out / lse are bitwise those of the same row in an unshared packing
// (prompt + completion as one sequence of attention_prefill_varlen).
//   q [T, Hq, D], k, v [T, Hkv, D] bf16 (as attention_prefill_varlen); out [T, Hq, D], lse [T, Hq]
void attention_prefill_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                              const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse);

// Paged attention, one op for decode and chunked prefill: query row r of sequence q_seq[r] at
// position q_pos[r] attends to that sequence's cached keys at positions 0 .. q_pos[r] (its own key
// must already be written). Decode: one row per sequence, q_pos = seq_len - 1. Chunked prefill:
// rows at positions p0 .. p0+c-1 of one sequence, after writing their keys.
//   q [N, Hq, D] bf16; q_seq [N] i32 (row of kv.block_table); q_pos [N] i32, 0 <= q_pos < seq_len
//   out [N, Hq, D], lse [N, Hq]
// The implementation may split long KV ranges across threads (split-KV); bits never depend on it.
void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                     const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse);

// Split-KV paged attention: each row's chunks are cut into num_splits contiguous ranges
// (split s of a row with C chunks: [C*s/num_splits, C*(s+1)/num_splits)), computed as independent
// tasks that write per-chunk states, then merged left to right. Equal bits to attention_paged
// for every num_splits >= 1.
void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                              const PagedKv& kv, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse);

// Prefix-shared (cascade) paged attention: for every group, the prefix chunks (chunks lying wholly
// below shared_len, c < shared_len / kv_chunk) are computed once per K/V block for all rows of the
// group, from the shared pages; each row then continues with the remaining chunks from its own
// view (the chunk holding position shared_len mixes shared and own keys: chunk membership is by
// absolute position). Equal bits to attention_paged over a per-sequence table holding the prefix.
void attention_paged_cascade(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                             const PagedKv& kv, const SharedPrefix& prefix,
                             const AttentionConfig& cfg, const TensorView& out,
                             const TensorView& lse);

// The same three ops over one step's validated metadata (PagedMeta, lockstep/contract/attention.h;
// its device copies are the host tables): the engine builds the meta once per step and passes it
// to every layer and rank. Only q, the caches, out and lse are checked against it (O(1)):
//   q [N, Hq, D] with the meta's N; k_cache, v_cache [NP, P, Hkv, D] with the meta's NP and P.
// attention_paged and _split_kv take a meta without prefix tables, _cascade one with them.
void attention_paged(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                     const TensorView& v_cache, const AttentionConfig& cfg, const TensorView& out,
                     const TensorView& lse);
void attention_paged_split_kv(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                              const TensorView& v_cache, const AttentionConfig& cfg, int num_splits,
                              const TensorView& out, const TensorView& lse);
void attention_paged_cascade(const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
                             const TensorView& v_cache, const AttentionConfig& cfg,
                             const TensorView& out, const TensorView& lse);

// Chunk states of chunks [chunk_begin, chunk_begin + C) of every row (C from states' shape).
// Chunks past a row's last chunk (c > q_pos[r] / kv_chunk) are written empty (m = -inf, l = 0,
// acc = 0). Only pages holding positions of the computed chunks are read (context parallelism:
// a rank may own only its chunks' pages).
void attention_paged_chunk_states(const TensorView& q, const TensorView& q_seq,
                                  const TensorView& q_pos, const PagedKv& kv,
                                  const AttentionConfig& cfg, int64_t chunk_begin,
                                  const AttentionChunkStates& states);

// Folds the chunk states 0 .. q_pos[r] / kv_chunk of each row left to right by the canonical merge
// and normalizes: equal bits to attention_paged. states must start at chunk 0 (C >= every row's
// chunk count); entries past a row's last chunk are not read.
void attention_merge_chunk_states(const AttentionChunkStates& states, const TensorView& q_pos,
                                  const AttentionConfig& cfg, const TensorView& out,
                                  const TensorView& lse);

// KV-cache write: token t's k/v rows go to slot slot_mapping[t] = page * P + offset of the caches;
// slot -1 skips the token (padding). Slots must be distinct and in [0, NP * P).
//   k, v          [T, Hkv, D] bf16, last dim contiguous
//   slot_mapping  [T] i32 or i64
//   k_cache, v_cache [NP, P, Hkv, D] bf16 (written in place)
void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                    const TensorView& k_cache, const TensorView& v_cache);

}  // namespace lockstep::cpu
