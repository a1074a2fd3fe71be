// Causal GQA attention (bf16 q/k/v, bf16 output, fp32 LSE) in ONE canonical order fixed by absolute
// key positions: scores by the MMA model, 64-key blocks with an online softmax (ls_exp2f), blocks
// folded inside kv_chunk-key chunks, chunk states merged left to right by one formula. Packed
// prefill, paged decode, chunked prefill, split-KV and prefix-shared (cascade) attention therefore
// give identical bits for a (sequence, position, head). Normative text:
// docs/contract.md §A.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/contract/config.h"
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

}  // namespace lockstep
