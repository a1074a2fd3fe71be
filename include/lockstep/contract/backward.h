// The backward's shared contract types (docs/contract.md §B): the canonical token order of weight
// gradients (token blocks of 16 positions, sequences by step index), the step object that keeps
// micro-batches in that order, and the layer roles that decide the segments of a GEMM's dX.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/contract/config.h"
#include "lockstep/contract/gemm.h"

namespace lockstep {

// Positions per token block (B.1): the rows of one MMA k-block of a weight gradient.
constexpr int kTokenBlock = 16;

// One sequence of a micro-batch: its positions 0 .. len-1 are the packed rows [row, row + len),
// and step_index is its place in the training step's canonical order.
struct TokenSeq {
  int64_t step_index = 0;
  int64_t row = 0;
  int64_t len = 0;
};

// A micro-batch's sequences in canonical order (ascending step index), validated once: step
// indices distinct and >= 0, len >= 0, row ranges inside [0, rows) and disjoint. Rows not
// covered by any sequence (padding) take no part in any reduction.
class TokenOrder {
 public:
  TokenOrder() = default;
  // `seqs` in any order (sorted here); `rows` = the packed buffer's row count. Throws
  // lockstep::Error naming `op` and the offending sequence.
  static TokenOrder make(const char* op, std::vector<TokenSeq> seqs, int64_t rows);
  // Sequence b at rows [cu[b], cu[b+1]) with step index first_step_index + b (cu as validated by
  // PackedSeqs: 0 = cu[0] <= ... <= cu[B] = rows).
  static TokenOrder packed(std::span<const int64_t> cu, int64_t first_step_index);

  std::span<const TokenSeq> seqs() const { return seqs_; }
  int64_t rows() const { return rows_; }
  bool empty() const { return seqs_.empty(); }
  int64_t first_step_index() const;  // -1 when empty
  int64_t last_step_index() const;   // -1 when empty

 private:
  std::vector<TokenSeq> seqs_;
  int64_t rows_ = 0;
};

// One training step's weight-gradient order across micro-batches (B.1): the micro-batches must be
// consecutive runs of the canonical order, applied in that order.
class GradStep {
 public:
  // Throws lockstep::Error if `order` holds a step index not greater than every index of the
  // micro-batches accepted so far (the accumulation would no longer follow the canonical order).
  void accept(const TokenOrder& order);
  void reset() { last_ = -1; }
  int64_t last_step_index() const { return last_; }

 private:
  int64_t last_ = -1;
};

// The segments of dX = dY·W over N for a layer of `role` (B.3; LayerRole in contract/gemm.h):
// gemm_segments for a column-parallel layer (TP splits N, so dX reduces over a split axis), 1 for
// a row-parallel one (dX reduces over the whole N on one rank).
int dx_segments(const ContractConfig& cfg, LayerRole role);

}  // namespace lockstep
