// Embedding: gather of every bf16 bit pattern (NaN -> canonical), i32/i64/strided ids, strided
// table and out, vocab shards, errors naming index and value. Token invariance, vocab-parallel
// TP = 1 vs 2/3/4/8 (-0 in non-owned rows, reversed ranks, in place), threads and determinism:
// the op-case table's embedding cases (tests/ops, tests/cpu/test_op_cases.cc).
#include <algorithm>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "lockstep/ops/embedding.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

// A [V, H] table of uniformly random bit patterns: every class of bf16 value appears (normals,
// subnormals, +-0, +-inf, NaNs with payloads), plus a few forced specials.
Tensor random_bits_table(int64_t V, int64_t H, uint64_t salt) {
  auto g = test::rng(salt);
  Tensor t(DType::kBF16, {V, H});
  std::uniform_int_distribution<uint32_t> d(0, 0xffff);
  for (int64_t i = 0; i < V * H; ++i) t.ptr<bf16>()[i] = bf16{uint16_t(d(g))};
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7f80, 0xff80, 0x7fc0, 0xffff};
  for (int k = 0; k < 8 && k < V * H; ++k) t.ptr<bf16>()[k * 7 % (V * H)] = bf16{specials[k]};
  return t;
}

Tensor ids_i64(const std::vector<int64_t>& v) {
  Tensor t(DType::kI64, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.ptr<int64_t>());
  return t;
}

bf16 canon(bf16 v) { return test::is_nan(v) ? bf16{test::kCanonNan} : v; }

std::vector<int64_t> random_ids(int64_t T, int64_t V, uint64_t salt) {
  auto g = test::rng(salt);
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  std::vector<int64_t> ids(static_cast<size_t>(T));
  for (auto& i : ids) i = d(g);
  ids[0] = 0;
  if (T > 1) ids[size_t(T - 1)] = V - 1;
  return ids;
}

TEST(Embedding, GathersRowsBitExactWithCanonicalNan) {
  for (int64_t H : {1, 3, 17, 64, 111, 1000}) {
    const int64_t V = 50, T = 33;
    Tensor table = random_bits_table(V, H, uint64_t(H));
    std::vector<int64_t> ids = random_ids(T, V, 1 + uint64_t(H));
    Tensor id64 = ids_i64(ids);
    Tensor id32(DType::kI32, {T});
    for (int64_t t = 0; t < T; ++t) id32.ptr<int32_t>()[t] = int32_t(ids[size_t(t)]);
    Tensor a = test::poisoned(DType::kBF16, {T, H}), b = test::poisoned(DType::kBF16, {T, H});
    cpu::embedding(id64.view(), table.view(), a.view());
    cpu::embedding(id32.view(), table.view(), b.view());
    EXPECT_BITWISE_EQ(a.data(), b.data(), T * H, DType::kBF16) << "i32 vs i64, H=" << H;
    int nans = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < H; ++k) {
        const bf16 src = table.ptr<bf16>()[ids[size_t(t)] * H + k];
        nans += test::is_nan(src);
        ASSERT_EQ(a.ptr<bf16>()[t * H + k].bits, canon(src).bits) << "t=" << t << " k=" << k;
      }
    }
    if (H >= 64) {
      EXPECT_GT(nans, 0) << "the table should contain NaN patterns";
    }
  }
}

TEST(Embedding, StridedIdsTableAndOut) {
  const int64_t V = 40, H = 136, T = 17, ldt = 150, ldo = 140;
  Tensor table = random_bits_table(V, H, 5);
  Tensor wide = test::poisoned(DType::kBF16, {V, ldt});
  for (int64_t v = 0; v < V; ++v) {
    std::memcpy(wide.ptr<bf16>() + v * ldt + 4, table.ptr<bf16>() + v * H, size_t(H) * 2);
  }
  std::vector<int64_t> ids = random_ids(T, V, 6);
  Tensor id2(DType::kI32, {2 * T});
  for (int64_t t = 0; t < T; ++t) {
    id2.ptr<int32_t>()[2 * t] = int32_t(ids[size_t(t)]);
    id2.ptr<int32_t>()[2 * t + 1] = -7;  // skipped by the stride
  }
  TensorView idv = TensorView::contiguous(id2.data(), DType::kI32, {T});
  idv.stride[0] = 2;
  Tensor ref = test::poisoned(DType::kBF16, {T, H}), ob = test::poisoned(DType::kBF16, {T, ldo});
  Tensor id64 = ids_i64(ids);
  cpu::embedding(id64.view(), table.view(), ref.view());
  cpu::embedding(idv, test::strided_view(wide, V, H, ldt, 4), test::strided_view(ob, T, H, ldo, 1));
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(ob.ptr<bf16>() + t * ldo + 1, ref.ptr<bf16>() + t * H, H, DType::kBF16) << t;
  }
}

TEST(VocabShard, SplitsCoverTheVocabulary) {
  for (int64_t V : {1, 7, 1000, 151936}) {
    for (int world : {1, 2, 3, 4, 8}) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const VocabShard s = vocab_shard(V, r, world);
        EXPECT_EQ(s.begin, next) << V << " " << r << "/" << world;
        EXPECT_LE(s.begin, s.end);
        next = s.end;
      }
      EXPECT_EQ(next, V);
    }
  }
  EXPECT_EQ(vocab_shard(1000, 1, 4).to_string(), "vocab rows [250, 500)");
  test::expect_error([] { vocab_shard(10, 4, 4); }, {"vocab_shard", "rank 4 of world 4"});
}

TEST(Embedding, BadInputsThrowNamingIndexAndValue) {
  const int64_t V = 10, H = 8;
  Tensor table = random_bits_table(V, H, 30);
  Tensor out = test::poisoned(DType::kBF16, {3, H});
  Tensor out0 = test::poisoned(DType::kBF16, {3, H});
  Tensor bad = ids_i64({1, 2, 10});
  test::expect_error([&] { cpu::embedding(bad.view(), table.view(), out.view()); },
                     {"embedding", "'ids'", "element 2", "= 10", "[0, 10)"});
  EXPECT_BITWISE_EQ(out.data(), out0.data(), 3 * H, DType::kBF16);  // nothing written
  Tensor neg(DType::kI32, {3});
  neg.ptr<int32_t>()[0] = 0;
  neg.ptr<int32_t>()[1] = -3;
  neg.ptr<int32_t>()[2] = 0;
  test::expect_error([&] { cpu::embedding(neg.view(), table.view(), out.view()); },
                     {"element 1", "= -3"});
  Tensor idf(DType::kF32, {3});
  test::expect_error([&] { cpu::embedding(idf.view(), table.view(), out.view()); },
                     {"'ids'", "i32 or i64"});
  Tensor ok = ids_i64({1, 2, 3});
  Tensor out_h(DType::kBF16, {3, H + 1});
  test::expect_error([&] { cpu::embedding(ok.view(), table.view(), out_h.view()); },
                     {"'out'", "[3, 8]", "[3, 9]"});
  Tensor tf(DType::kF32, {V, H});
  test::expect_error([&] { cpu::embedding(ok.view(), tf.view(), out.view()); }, {"'table'"});
  Tensor t0(DType::kBF16, {V, 0}), o0(DType::kBF16, {3, 0});
  test::expect_error([&] { cpu::embedding(ok.view(), t0.view(), o0.view()); }, {"'table'", ">= 1"});

  // Vocab-parallel: ids are checked against the FULL vocab on every rank.
  const VocabShard s = vocab_shard(V, 1, 2);
  TensorView shard = table.view().rows(s.begin, s.end);
  test::expect_error([&] { cpu::embedding_vocab_parallel(bad.view(), shard, s, V, out.view()); },
                     {"embedding_vocab_parallel", "element 2", "= 10"});
  test::expect_error(
      [&] { cpu::embedding_vocab_parallel(ok.view(), table.view(), s, V, out.view()); },
      {"'table'", "[5, *]", "[10, 8]"});
  test::expect_error(
      [&] {
        cpu::embedding_vocab_parallel(ok.view(), shard, VocabShard{8, 13}, V, out.view());
      },
      {"'shard'", "[8, 13)"});

  test::expect_error([&] { cpu::embedding_combine({}, out.view()); }, {"'partials'"});
  Tensor p1(DType::kBF16, {3, H}), p2(DType::kBF16, {4, H});
  test::expect_error(
      [&] {
        cpu::embedding_combine({p1.view(), p2.view()}, out.view());
      },
      {"embedding_combine", "'partials[1]'", "[3, 8]", "[4, 8]"});
  // Empty batch.
  Tensor e(DType::kI64, {0}), eo(DType::kBF16, {0, H});
  EXPECT_NO_THROW(cpu::embedding(e.view(), table.view(), eo.view()));
}

}  // namespace
}  // namespace lockstep
