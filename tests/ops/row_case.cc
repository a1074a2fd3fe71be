// RowCase's relations: rows alone / in batches at other positions, thread counts, layouts.
#include "ops/row_case.h"

#include <algorithm>
#include <cstring>

namespace lockstep::cases {

std::vector<Relation> RowCase::relations() const {
  std::vector<Relation> rel;
  // Rows picked from the base batch, and where they go in each new batch.
  std::vector<int64_t> picks = {0, T_ / 2, T_ - 1};
  std::sort(picks.begin(), picks.end());
  picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  for (int64_t B : {int64_t(1), int64_t(3), int64_t(17), int64_t(256)}) {
    rel.push_back(
        {"rows in a batch of " + num(B),
         [this, B, picks](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
           std::mt19937_64 g(0x5eed0000u + uint64_t(B));
           // B == 1: each picked row alone; otherwise one batch holding the picked rows at
           // positions B-1, B/2, 0 (reversed order) among fresh rows.
           std::vector<std::vector<std::pair<int64_t, int64_t>>> batches;  // (src row, dst pos)
           if (B == 1) {
             for (int64_t r : picks) batches.push_back({{r, 0}});
           } else {
             std::vector<std::pair<int64_t, int64_t>> b;
             const int64_t dst[3] = {B - 1, B / 2, 0};
             for (size_t i = 0; i < picks.size(); ++i) b.push_back({picks[i], dst[i]});
             batches.push_back(b);
           }
           for (const auto& batch : batches) {
             std::vector<Tensor> rows;
             for (size_t i = 0; i < inputs_.size(); ++i) {
               const RowInput& in = inputs_[i];
               Tensor t(in.dt, {B, in.elems});
               for (int64_t r = 0; r < B; ++r) fill_row(in, t, r, g);
               const int64_t rb = in.elems * dtype_size(in.dt);
               for (auto [src, dst] : batch)
                 std::memcpy(static_cast<char*>(t.data()) + dst * rb,
                             static_cast<const char*>(rows_[i].data()) + src * rb, size_t(rb));
               rows.push_back(std::move(t));
             }
             const Outputs got = compute(ops, mem, rows, B, strided_);
             for (size_t o = 0; o < got.size(); ++o) {
               if (base[o].rows == 0) continue;
               for (auto [src, dst] : batch)
                 check(got[o].name + " row " + num(src) + " at " + num(dst) + " of " + num(B),
                       compare_bits(got[o].row(dst), base[o].row(src), base[o].row_elems,
                                    base[o].dtype));
             }
           }
         }});
  }
  rel.push_back(thread_counts_relation(
      [this](Ops& ops, Mem& mem) { return compute(ops, mem, rows_, T_, strided_); }));
  if (strided_)
    rel.push_back(
        {"strided layout == contiguous",
         [this](Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
           const Outputs got = compute(ops, mem, rows_, T_, false);
           for (size_t o = 0; o < got.size(); ++o) {
             if (base[o].rows == 0) continue;
             for (int64_t t = 0; t < T_; ++t)
               check(got[o].name + " row " + num(t),
                     compare_bits(got[o].row(t), base[o].row(t), base[o].row_elems, base[o].dtype));
           }
         }});
  return rel;
}

}  // namespace lockstep::cases
