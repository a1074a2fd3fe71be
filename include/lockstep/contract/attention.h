// Causal GQA attention (bf16 q/k/v, bf16 output, fp32 LSE) in ONE canonical order fixed by absolute
// key positions: scores by the MMA model, 64-key blocks with an online softmax (ls_ex2_sfu, the
// SFU's exp2), blocks folded inside kv_chunk-key chunks, chunk states merged left to right by one
// formula. Packed prefill, paged decode, chunked prefill, split-KV and prefix-shared (cascade)
// attention therefore give identical bits for a (sequence, position, head). Normative text:
// docs/contract.md §A.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

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

// The paged metadata of one engine step: the tables every paged attention call of the step reads
// (decode, chunked prefill, split-KV, cascade; every layer and TP rank), validated ONCE on the
// host by PagedMeta::validate against a cache geometry (NP pages of P keys), together with their
// copies on the device the ops run on (device_copies: for a CPU backend the host views
// themselves). An op taking a PagedMeta checks only its per-call tensors (q, caches, out, lse)
// against it, in O(1): no metadata loop, no copy back. Views are not owned: the host tables and
// their copies must outlive every use of the meta.
struct PagedTables {
  TensorView q_seq;        // [N] i32, host: row of block_table of each query row
  TensorView q_pos;        // [N] i32, host: absolute position of each query row
  TensorView block_table;  // [S, MP] i32, last dim contiguous (PagedKv::block_table)
  TensorView seq_lens;     // [S] i32, host (PagedKv::seq_lens)
  // Prefix sharing (SharedPrefix), or all three empty views (ndim 0): no prefix.
  TensorView prefix_block_table;  // [GR, MPs] i32, last dim contiguous
  TensorView shared_len;          // [GR] i32, host
  TensorView seq_group;           // [S] i32, host

  bool has_prefix() const { return prefix_block_table.ndim != 0 || prefix_block_table.data; }
};

// Chunk range of a PagedMeta validated for every key of each row.
constexpr int64_t kAttnAllChunks = std::numeric_limits<int64_t>::max();

class PagedMeta {
 public:
  // Validates the tables (cfg too) for a cache of NP pages of P keys, exactly as the paged ops
  // check their metadata: q_seq, q_pos, seq_lens, shared_len and seq_group are host views whose
  // every value is checked; block tables are host views (every page index that the computation
  // of kv chunks [chunk_begin, chunk_end) reads is checked) or device views (only dtype / shape:
  // trusted, the kernels read an entry outside the table or the cache as a zero key). Throws
  // lockstep::Error naming `op`. The device copies are the host views until with_device_copies.
  static PagedMeta validate(const char* op, const PagedTables& host, int64_t NP, int64_t P,
                            const AttentionConfig& cfg, int64_t chunk_begin = 0,
                            int64_t chunk_end = kAttnAllChunks);

  // This meta with `copies` as the device copies: views on `dev` of the same dtypes and shapes
  // as host() (any strides), holding the same values (the caller's upload of the validated
  // tables). Throws if a copy's dtype, shape or device differs.
  PagedMeta with_device_copies(Device dev, const PagedTables& copies) &&;

  const PagedTables& host() const { return host_; }
  const PagedTables& device_copies() const { return dev_; }
  Device device() const { return device_; }

  int64_t N() const { return int64_t(seq_.size()); }  // query rows
  int64_t S() const { return S_; }                    // sequences (block-table rows)
  int64_t MP() const { return MP_; }                  // pages per block-table row
  int64_t NP() const { return NP_; }                  // pages of the cache validated against
  int64_t P() const { return P_; }                    // page size validated against
  int64_t MPs() const { return MPs_; }                // pages per prefix-table row (0: none)
  bool has_prefix() const { return host_.has_prefix(); }
  // Whether block-table entries were checked (host tables) or are trusted (device tables).
  bool tables_checked() const { return tables_checked_; }
  int64_t chunk_begin() const { return chunk_begin_; }
  int64_t chunk_end() const { return chunk_end_; }
  bool all_chunks() const { return chunk_begin_ == 0 && chunk_end_ == kAttnAllChunks; }

  std::span<const int64_t> seq() const { return seq_; }  // [N] q_seq
  std::span<const int64_t> pos() const { return pos_; }  // [N] q_pos
  // [S] prefix group of each sequence or -1 (all -1 without a prefix); [GR] shared lengths.
  std::span<const int64_t> group() const { return group_; }
  std::span<const int64_t> shared_len() const { return shared_len_; }
  int64_t num_seqs() const { return num_seqs_; }  // distinct sequences among the rows

 private:
  PagedMeta() = default;
  PagedTables host_, dev_;
  Device device_ = Device::kCPU;
  int64_t S_ = 0, MP_ = 0, NP_ = 0, P_ = 0, MPs_ = 0, num_seqs_ = 0;
  int64_t chunk_begin_ = 0, chunk_end_ = kAttnAllChunks;
  bool tables_checked_ = true;
  std::vector<int64_t> seq_, pos_, group_, shared_len_;
};

// The packed sequences of one training forward (attention_prefill_varlen): cu_seqlens [B+1] i32,
// 0 = cu[0] <= cu[1] <= ... <= cu[B] = T, validated ONCE on the host by PackedSeqs::validate,
// with its copy on the device the ops run on (device_copy: for a CPU backend the host view). An
// op taking a PackedSeqs checks only q, k, v, out and lse against it (O(1)). Views are not owned.
class PackedSeqs {
 public:
  // Checks the host view cu_seqlens for T packed tokens; throws lockstep::Error naming `op`.
  static PackedSeqs validate(const char* op, const TensorView& cu_seqlens, int64_t T);
  // This object with `copy` ([B+1] i32 on `dev`, any stride: the caller's upload of the validated
  // host view) as the device copy.
  PackedSeqs with_device_copy(Device dev, const TensorView& copy) &&;

  const TensorView& host() const { return host_; }
  const TensorView& device_copy() const { return dev_; }
  Device device() const { return device_; }
  int64_t T() const { return cu_.back(); }               // packed tokens
  int64_t B() const { return int64_t(cu_.size()) - 1; }  // sequences
  std::span<const int64_t> cu() const { return cu_; }    // [B+1] the validated boundaries

 private:
  PackedSeqs() = default;
  TensorView host_, dev_;
  Device device_ = Device::kCPU;
  std::vector<int64_t> cu_;
};

// Shared-prompt groups of one training forward (GRPO groups; docs/contract.md §B.11): the packed
// rows are cut into segments by cu_seqlens [B+1] i32 (as PackedSeqs), and prompt_of [B] i32 says
// what each segment is: -1, a prompt (or a sequence of its own) at positions 0 .. len-1; or the
// index of the prompt segment it continues, a completion at positions Lp .. Lp+len-1 (Lp = that
// prompt's length) whose rows attend to the prompt's keys, stored once, then to its own. A prompt's
// completions are taken in ascending segment index (the order of its gradient sums, §B.11).
// Validated ONCE on the host; views are not owned.
class SharedPromptSeqs {
 public:
  // Checks cu_seqlens (PackedSeqs::validate) and prompt_of (host, [B] i32, each -1 or a prompt
  // segment index: in [0, B), not the segment itself, and naming a segment whose prompt_of is -1).
  // Throws lockstep::Error naming `op` and the offending entry.
  static SharedPromptSeqs validate(const char* op, const TensorView& cu_seqlens,
                                   const TensorView& prompt_of, int64_t T);

  const PackedSeqs& segments() const { return segs_; }  // the segments' row ranges
  int64_t T() const { return segs_.T(); }
  int64_t B() const { return segs_.B(); }
  std::span<const int64_t> cu() const { return segs_.cu(); }
  std::span<const int64_t> prompt_of() const { return prompt_of_; }  // [B]
  int64_t len(int64_t b) const { return cu()[size_t(b + 1)] - cu()[size_t(b)]; }
  // Position of segment b's first row: 0 for a prompt, the prompt's length for a completion.
  int64_t first_position(int64_t b) const {
    return prompt_of_[size_t(b)] < 0 ? 0 : len(prompt_of_[size_t(b)]);
  }
  // The completions of prompt segment b, ascending (empty for a completion).
  std::span<const int64_t> completions(int64_t b) const;

 private:
  explicit SharedPromptSeqs(PackedSeqs segs) : segs_(std::move(segs)) {}
  PackedSeqs segs_;
  std::vector<int64_t> prompt_of_;
  std::vector<int64_t> child_begin_,
      children_;  // completions of b: children_[begin[b]..begin[b+1])
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
