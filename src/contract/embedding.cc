// The embedding contract (docs/contract.md §E): vocab shards and argument checks.
#include "lockstep/contract/embedding.h"

#include <algorithm>
#include <string>

#include "contract/checks.h"

namespace lockstep {

std::string VocabShard::to_string() const {
  return detail::concat("vocab rows [", begin, ", ", end, ")");
}

VocabShard vocab_shard(int64_t vocab, int rank, int world) {
  LS_CHECK(vocab >= 1, "vocab_shard", "vocab must be >= 1, got ", vocab);
  LS_CHECK(world >= 1 && rank >= 0 && rank < world, "vocab_shard",
           "expected 0 <= rank < world, got rank ", rank, " of world ", world);
  const int64_t block = (vocab + world - 1) / world;
  VocabShard s;
  s.begin = std::min<int64_t>(vocab, rank * block);
  s.end = std::min<int64_t>(vocab, (rank + 1) * block);
  return s;
}

}  // namespace lockstep

namespace lockstep::contract {

int64_t check_gather(const char* op, Device dev, const TensorView& ids, const TensorView& table,
                     int64_t table_rows, int64_t vocab, const TensorView& out) {
  check_tensor_dtypes(op, "ids", ids, {DType::kI32, DType::kI64}, {-1}, dev);
  const int64_t T = ids.shape[0];
  check_view(op, "table", table, DType::kBF16, {table_rows, -1}, dev);
  const int64_t H = table.shape[1];
  LS_CHECK(H >= 1, op, "argument 'table' expected a hidden size >= 1, got ", table.shape_string());
  check_view(op, "out", out, DType::kBF16, {T, H}, dev);
  // Host ids are all checked before anything is written; device ids: an id outside the vocab
  // gives a canonical-NaN row (the kernel's guard).
  if (dev != Device::kCPU) return T;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = index_at(ids, t);
    LS_CHECK(id >= 0 && id < vocab, op, "argument 'ids' element ", t, " = ", id,
             " is outside the vocabulary [0, ", vocab, ")");
  }
  return T;
}

void check_embedding_combine(const char* op, Device dev, const std::vector<TensorView>& partials,
                             const TensorView& out) {
  LS_CHECK(!partials.empty(), op, "argument 'partials' must hold at least one view");
  check_view(op, "out", out, DType::kBF16, {-1, -1}, dev);
  const int64_t T = out.shape[0], H = out.shape[1];
  LS_CHECK(H >= 1, op, "argument 'out' expected a hidden size >= 1, got ", out.shape_string());
  for (size_t r = 0; r < partials.size(); ++r) {
    const std::string name = detail::concat("partials[", r, "]");
    check_view(op, name.c_str(), partials[r], DType::kBF16, {T, H}, dev);
  }
}

}  // namespace lockstep::contract
