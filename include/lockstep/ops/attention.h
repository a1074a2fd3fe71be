// Causal GQA attention (bf16 q/k/v, bf16 output, fp32 LSE) in ONE canonical order fixed by absolute
// key positions: scores by the MMA model, 64-key blocks with an online softmax (ls_exp2f), blocks
// folded inside kv_chunk-key chunks, chunk states merged left to right by one formula. Packed
// prefill, paged decode, chunked prefill, split-KV and prefix-shared (cascade) attention therefore
// give identical bits for a (sequence, position, head). Normative text:
// docs/contract.md §A.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/contract.h"
#include "lockstep/tensor.h"

namespace lockstep {

// Dimension names used below:
//   T  packed tokens          B  sequences of a packed batch     N  query rows
//   Hq query heads            Hkv kv heads (Hq % Hkv == 0; G = Hq / Hkv heads share one kv head)
//   D  head_dim (multiple of 16, 16..512)
//   NP pages of a KV cache    P  page size (keys per page, any >= 1)
//   S  sequences of a paged batch (rows of a block table)     MP pages per block-table row
//   C  KV chunks (of kv_chunk keys)                           GR prefix-sharing groups

constexpr int kAttnBlock = 64;  // keys per online-softmax block (by absolute position, from 0)
constexpr int kAttnMmaK = 16;   // k-block of the score and PV MMAs
constexpr int kAttnMaxHeadDim = 512;

// Every attention setting that can change bits. Depends only on the model (head_dim, scale) and the
// deployment's contract (kv_chunk), never on batch, lengths, splits or threads.
struct AttentionConfig {
  int kv_chunk = 1024;         // keys per canonical KV chunk: a positive multiple of kAttnBlock
  double softmax_scale = 0.0;  // multiplies q·k; 0 means 1/sqrt(head_dim)

  static AttentionConfig from_contract(const ContractConfig& c, double softmax_scale = 0.0) {
    AttentionConfig a;
    a.kv_chunk = c.kv_chunk;
    a.softmax_scale = softmax_scale;
    return a;
  }
  // The scale in effect for a head_dim (softmax_scale, or 1/sqrt(D) in double when 0).
  double resolved_scale(int64_t head_dim) const;
  // The one fp32 constant the scores are multiplied by: fp32(resolved_scale(D) * log2(e)),
  // product in double, rounded to fp32 once (RNE).
  float scale_log2(int64_t head_dim) const;
  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // "attention: kv_chunk=1024 block=64 softmax_scale=1/sqrt(D)"
};

// A paged KV cache and the per-sequence tables that map absolute positions to cache slots:
// position j of sequence s lives in page block_table[s][j / P], slot j % P.
struct PagedKv {
  TensorView k_cache;      // [NP, P, Hkv, D] bf16, last dim contiguous, any outer strides
  TensorView v_cache;      // [NP, P, Hkv, D] bf16, same shape as k_cache
  TensorView block_table;  // [S, MP] i32, last dim contiguous: page of each page-slot of a sequence
  TensorView seq_lens;     // [S] i32: keys stored for sequence s (positions 0 .. len-1)
};

// Prefix sharing (GRPO groups): sequences of one group share the KV of a prompt prefix, stored
// once. Position j < shared_len[g] of a sequence in group g is read from the group's pages
// (prefix block_table row g, page j / P, slot j % P); positions >= shared_len[g] from the
// sequence's own block_table row (indexed by ABSOLUTE page j / P; its entries for pages wholly
// below shared_len are never read and may be anything, e.g. -1).
struct SharedPrefix {
  TensorView block_table;  // [GR, MPs] i32, last dim contiguous: pages of each group's prefix
  TensorView shared_len;   // [GR] i32: prefix length of each group (0 allowed)
  TensorView seq_group;    // [S] i32: group of each sequence of the PagedKv, or -1 (not shared)
};

// Partial results per canonical KV chunk (split-KV, context parallelism). For query row r,
// head h and chunk c: m = max scaled score (log2 units), l = row sum, acc = unnormalized output;
// see docs/contract.md §A "Chunk state". Any strides (acc: last dim contiguous).
struct AttentionChunkStates {
  TensorView m;    // [N, Hq, C] f32
  TensorView l;    // [N, Hq, C] f32
  TensorView acc;  // [N, Hq, C, D] f32
};

namespace cpu {

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

}  // namespace cpu
}  // namespace lockstep
