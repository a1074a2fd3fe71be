// The backward's shared contract types (docs/contract.md §B.1, B.2): TokenOrder, GradStep,
// dx_segments.
#include "lockstep/contract/backward.h"

#include <algorithm>

#include "lockstep/error.h"

namespace lockstep {

TokenOrder TokenOrder::make(const char* op, std::vector<TokenSeq> seqs, int64_t rows) {
  LS_CHECK(rows >= 0, op, "order: rows must be >= 0, got ", rows);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const TokenSeq& s = seqs[i];
    LS_CHECK(s.step_index >= 0, op, "order: sequence ", i, " has step index ", s.step_index,
             " (must be >= 0)");
    LS_CHECK(s.len >= 0 && s.row >= 0 && s.row <= rows - s.len, op, "order: sequence ", i,
             " (step index ", s.step_index, ") has rows [", s.row, ", ", s.row + s.len,
             ") outside the micro-batch's ", rows, " rows");
  }
  std::stable_sort(seqs.begin(), seqs.end(), [](const TokenSeq& a, const TokenSeq& b) {
    return a.step_index < b.step_index;
  });
  for (size_t i = 1; i < seqs.size(); ++i)
    LS_CHECK(seqs[i].step_index != seqs[i - 1].step_index, op, "order: step index ",
             seqs[i].step_index, " appears twice");
  // Disjoint rows: sort the ranges by row and compare neighbours.
  std::vector<const TokenSeq*> by_row;
  for (const TokenSeq& s : seqs)
    if (s.len > 0) by_row.push_back(&s);
  std::sort(by_row.begin(), by_row.end(),
            [](const TokenSeq* a, const TokenSeq* b) { return a->row < b->row; });
  for (size_t i = 1; i < by_row.size(); ++i)
    LS_CHECK(by_row[i]->row >= by_row[i - 1]->row + by_row[i - 1]->len, op,
             "order: the rows of step indices ", by_row[i - 1]->step_index, " and ",
             by_row[i]->step_index, " overlap");
  TokenOrder o;
  o.seqs_ = std::move(seqs);
  o.rows_ = rows;
  return o;
}

TokenOrder TokenOrder::packed(std::span<const int64_t> cu, int64_t first_step_index) {
  LS_CHECK(!cu.empty(), "TokenOrder::packed", "cu_seqlens must have at least one entry");
  std::vector<TokenSeq> seqs;
  for (size_t b = 0; b + 1 < cu.size(); ++b)
    seqs.push_back({first_step_index + int64_t(b), cu[b], cu[b + 1] - cu[b]});
  return make("TokenOrder::packed", std::move(seqs), cu.back());
}

int64_t TokenOrder::first_step_index() const {
  return seqs_.empty() ? -1 : seqs_.front().step_index;
}
int64_t TokenOrder::last_step_index() const { return seqs_.empty() ? -1 : seqs_.back().step_index; }

void GradStep::accept(const TokenOrder& order) {
  if (order.empty()) return;
  LS_CHECK(order.first_step_index() > last_, "GradStep",
           "micro-batch out of canonical order: ", "it starts at step index ",
           order.first_step_index(), " but step index ", last_,
           " was already accumulated (micro-batches must be consecutive runs of the step's "
           "sequence order, applied in order; docs/contract.md §B.1)");
  last_ = order.last_step_index();
}

int dx_segments(const ContractConfig& cfg, LayerRole role) {
  return role == LayerRole::kColumnParallel ? cfg.gemm_segments : 1;
}

}  // namespace lockstep
