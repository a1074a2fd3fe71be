// Embedding gather and its vocab-parallel form on the CPU, the executable form of
// docs/contract.md §E "Embedding": a row copy (NaN -> canonical 0x7FC0), non-owned rows
// of a shard as -0.0, and an fp32 rank-order sum of partials that is exact. Ids are all checked
// before anything is written.
#include "lockstep/ops/embedding.h"

#include <algorithm>

#include "core/thread_pool.h"
#include "cpu/checks.h"
#include "cpu/elementwise_common.h"

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

namespace cpu {
namespace {

constexpr uint16_t kNegZeroBf16 = 0x8000;  // the IEEE additive identity: x + -0 == x for every x

int64_t id_at(const TensorView& ids, int64_t t) {
  const int64_t off = t * ids.stride[0];
  return ids.dtype == DType::kI32 ? int64_t(ids.ptr<const int32_t>()[off])
                                  : ids.ptr<const int64_t>()[off];
}

}  // namespace

namespace check_detail {

int64_t check_gather(const char* op, const TensorView& ids, const TensorView& table,
                     int64_t table_rows, int64_t vocab, const TensorView& out) {
  check_tensor_dtypes(op, "ids", ids, {DType::kI32, DType::kI64}, {-1});
  const int64_t T = ids.shape[0];
  check_tensor(op, "table", table, DType::kBF16, {table_rows, -1});
  check_inner_contiguous(op, "table", table);
  const int64_t H = table.shape[1];
  LS_CHECK(H >= 1, op, "argument 'table' expected a hidden size >= 1, got ", table.shape_string());
  check_tensor(op, "out", out, DType::kBF16, {T, H});
  check_inner_contiguous(op, "out", out);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = id_at(ids, t);
    LS_CHECK(id >= 0 && id < vocab, op, "argument 'ids' element ", t, " = ", id,
             " is outside the vocabulary [0, ", vocab, ")");
  }
  return T;
}

void check_embedding_combine(const char* op, const std::vector<TensorView>& partials,
                             const TensorView& out) {
  LS_CHECK(!partials.empty(), op, "argument 'partials' must hold at least one view");
  check_tensor(op, "out", out, DType::kBF16, {-1, -1});
  check_inner_contiguous(op, "out", out);
  const int64_t T = out.shape[0], H = out.shape[1];
  LS_CHECK(H >= 1, op, "argument 'out' expected a hidden size >= 1, got ", out.shape_string());
  for (size_t r = 0; r < partials.size(); ++r) {
    const std::string name = detail::concat("partials[", r, "]");
    check_tensor(op, name.c_str(), partials[r], DType::kBF16, {T, H});
    check_inner_contiguous(op, name.c_str(), partials[r]);
  }
}

}  // namespace check_detail

namespace {

using check_detail::check_gather;

void copy_row(const bf16* src, int64_t H, bf16* dst) {
  for (int64_t k = 0; k < H; ++k) {
    const bool nan = (src[k].bits & 0x7fffu) > 0x7f80u;
    dst[k] = nan ? bf16{kCanonicalNanBf16} : src[k];
  }
}

}  // namespace

void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  const char* op = "embedding";
  check_tensor(op, "table", table, DType::kBF16, {-1, -1});
  const int64_t V = table.shape[0];
  const int64_t T = check_gather(op, ids, table, V, V, out);
  if (T == 0) return;
  const int64_t H = table.shape[1];
  const detail::RowAddr ta(table), oa(out);
  parallel_for(T, std::max<int64_t>(1, 16384 / H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      copy_row(ta.row<const bf16>(id_at(ids, t)), H, oa.row<bf16>(t));
    }
  });
}

void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                              const VocabShard& shard, int64_t vocab, const TensorView& out) {
  const char* op = "embedding_vocab_parallel";
  LS_CHECK(vocab >= 1 && shard.begin >= 0 && shard.begin <= shard.end && shard.end <= vocab, op,
           "argument 'shard' ", shard.to_string(), " is not inside the vocabulary [0, ", vocab,
           ")");
  const int64_t T = check_gather(op, ids, table, shard.size(), vocab, out);
  if (T == 0) return;
  const int64_t H = table.shape[1];
  const detail::RowAddr ta(table), oa(out);
  parallel_for(T, std::max<int64_t>(1, 16384 / H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t id = id_at(ids, t);
      bf16* o = oa.row<bf16>(t);
      if (id >= shard.begin && id < shard.end) {
        copy_row(ta.row<const bf16>(id - shard.begin), H, o);
      } else {
        std::fill(o, o + H, bf16{kNegZeroBf16});
      }
    }
  });
}

void embedding_combine(const std::vector<TensorView>& partials, const TensorView& out) {
  check_detail::check_embedding_combine("embedding_combine", partials, out);
  const int64_t T = out.shape[0], H = out.shape[1];
  if (T == 0) return;
  std::vector<detail::RowAddr> pa;
  for (const TensorView& p : partials) pa.emplace_back(p);
  const detail::RowAddr oa(out);
  parallel_for(T, std::max<int64_t>(1, 16384 / H), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      bf16* o = oa.row<bf16>(t);
      for (int64_t k = 0; k < H; ++k) {
        float acc = bf16_to_f32(pa[0].row<const bf16>(t)[k]);
        for (size_t r = 1; r < pa.size(); ++r) acc = acc + bf16_to_f32(pa[r].row<const bf16>(t)[k]);
        o[k] = round_bf16_canonical(acc);
      }
    }
  });
}

}  // namespace cpu
}  // namespace lockstep
