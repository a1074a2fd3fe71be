// Embedding gather and its vocab-parallel form on the CPU, the executable form of
// docs/contract.md §E "Embedding": a row copy (NaN -> canonical 0x7FC0), non-owned rows
// of a shard as -0.0, and an fp32 rank-order sum of partials that is exact. Ids are all checked
// before anything is written.
#include "lockstep/ops/embedding.h"

#include <algorithm>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_common.h"

namespace lockstep {

namespace cpu {
namespace {

constexpr uint16_t kNegZeroBf16 = 0x8000;  // the IEEE additive identity: x + -0 == x for every x

int64_t id_at(const TensorView& ids, int64_t t) {
  const int64_t off = t * ids.stride[0];
  return ids.dtype == DType::kI32 ? int64_t(ids.ptr<const int32_t>()[off])
                                  : ids.ptr<const int64_t>()[off];
}

using contract::check_gather;

void copy_row(const bf16* src, int64_t H, bf16* dst) {
  for (int64_t k = 0; k < H; ++k) {
    const bool nan = (src[k].bits & 0x7fffu) > 0x7f80u;
    dst[k] = nan ? bf16{kCanonicalNanBf16} : src[k];
  }
}

// Rows of ids in [shard.begin, shard.end) copy their table row, the others are -0 (the whole
// vocabulary: shard [0, V), every row copied).
void gather(const char* op, const TensorView& ids, const TensorView& table, const VocabShard& shard,
            int64_t vocab, const TensorView& out) {
  const int64_t T = check_gather(op, Device::kCPU, ids, table, shard.size(), vocab, out);
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

}  // namespace

void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  const char* op = "embedding";
  check_tensor(op, "table", table, DType::kBF16, {-1, -1});
  gather(op, ids, table, VocabShard{0, table.shape[0]}, table.shape[0], out);
}

void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                              const VocabShard& shard, int64_t vocab, const TensorView& out) {
  const char* op = "embedding_vocab_parallel";
  LS_CHECK(vocab >= 1 && shard.begin >= 0 && shard.begin <= shard.end && shard.end <= vocab, op,
           "argument 'shard' ", shard.to_string(), " is not inside the vocabulary [0, ", vocab,
           ")");
  gather(op, ids, table, shard, vocab, out);
}

void embedding_combine(const std::vector<TensorView>& partials, const TensorView& out) {
  contract::check_embedding_combine("embedding_combine", Device::kCPU, partials, out);
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
