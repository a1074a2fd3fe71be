// Embedding backward (docs/contract.md §B.7): against a literal transcription (one sequential
// chain per (id, k) in canonical token order), invariance to micro-batch splits, packing
// (shuffled rows, garbage padding rows whose ids are out of range) and thread count, accuracy vs
// an fp64 oracle, canonical NaN, and bad arguments (ids out of range name the element).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "cpu/token_order_test_util.h"
#include "lockstep/ops/backward.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::expect_error;

constexpr uint32_t kCanonNanF32 = 0x7FC00000u;

uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

TensorView v(const Tensor& t) { return t.view(); }

// §B.7 literally: tokens of `seqs` by ascending step index, positions ascending;
// dtable[id][k] = dtable[id][k] + gh[t][k] (a stored NaN is canonical).
void literal(const Tensor& ids, const Tensor& gh, std::vector<TokenSeq> seqs, Tensor& dtable) {
  const int64_t H = dtable.shape()[1];
  std::sort(seqs.begin(), seqs.end(),
            [](const TokenSeq& a, const TokenSeq& b) { return a.step_index < b.step_index; });
  for (const TokenSeq& s : seqs)
    for (int64_t t = s.row; t < s.row + s.len; ++t) {
      const int64_t id = ids.ptr<int64_t>()[t];
      for (int64_t k = 0; k < H; ++k) {
        float& d = dtable.ptr<float>()[id * H + k];
        d = d + gh.ptr<float>()[t * H + k];
        if (std::isnan(d)) d = f32_from_bits(kCanonNanF32);
      }
    }
}

// A step: ids drawn from a small vocabulary (many repeats), gh random.
struct EmbStep {
  test::Step step;
  Tensor ids, gh;  // ids [tokens, 1] i64 (2-D for packed_rows), gh [tokens, H]
  EmbStep(std::vector<int64_t> lens, int64_t V, int64_t H, std::mt19937_64& g)
      : step(std::move(lens)) {
    ids = Tensor(DType::kI64, {step.tokens, 1});
    for (int64_t t = 0; t < step.tokens; ++t) ids.ptr<int64_t>()[t] = int64_t(g() % uint64_t(V));
    gh = test::random_f32({step.tokens, H}, g);
  }
};

TensorView ids_view(const Tensor& ids2d) {
  return TensorView::contiguous(ids2d.data(), DType::kI64, {ids2d.shape()[0]});
}

// dtable after the micro-batches in order, from init (packed ids of padding rows: garbage).
Tensor dtable_of(const EmbStep& e, const std::vector<std::vector<int64_t>>& batches,
                 const Tensor& init, std::mt19937_64& g, bool shuffle, int max_pad) {
  Tensor d = test::clone(init);
  GradStep gs;
  for (const auto& b : batches) {
    const test::Packing p = test::pack(e.step, b, g, shuffle, max_pad);
    gs.accept(p.order);
    Tensor ids = test::packed_rows(e.ids, p, g), gh = test::packed_rows(e.gh, p, g);
    cpu::embedding_backward(ids_view(ids), v(gh), p.order, v(d));
  }
  return d;
}

TEST(EmbeddingBackward, MatchesLiteralTranscription) {
  auto g = test::rng(1);
  for (int64_t H : {1, 3, 17, 64, 130}) {
    const int64_t V = 11;
    EmbStep e({1, 17, 33, 5, 16}, V, H, g);
    e.gh.ptr<float>()[4 * H] = f32_from_bits(0xffc00001u);  // a non-canonical NaN
    e.gh.ptr<float>()[9 * H] = INFINITY;
    Tensor init = test::random_f32({V, H}, g);
    const test::Packing p = test::pack(e.step, test::id_range(0, 5), g, true, 3);
    Tensor ids = test::packed_rows(e.ids, p, g), gh = test::packed_rows(e.gh, p, g);
    Tensor got = test::clone(init), ref = test::clone(init);
    cpu::embedding_backward(ids_view(ids), v(gh), p.order, v(got));
    literal(ids, gh, std::vector<TokenSeq>(p.order.seqs().begin(), p.order.seqs().end()), ref);
    EXPECT_BITWISE_EQ(got.data(), ref.data(), got.numel(), DType::kF32) << "H=" << H;
    const int64_t nan_id = e.ids.ptr<int64_t>()[4];
    EXPECT_EQ(bits(got.ptr<float>()[nan_id * H]), kCanonNanF32);
  }
}

TEST(EmbeddingBackward, IsInvariantToSplitsPackingAndThreads) {
  auto g = test::rng(2);
  const int64_t V = 7, H = 200;
  EmbStep e({1, 17, 33, 5, 40, 16, 3}, V, H, g);
  Tensor init = test::random_f32({V, H}, g, 1e-3f);
  const Tensor one = dtable_of(e, {test::id_range(0, 7)}, init, g, false, 0);
  EXPECT_BITWISE_EQ(one.data(), dtable_of(e, {{0, 1}, {2, 3, 4}, {5, 6}}, init, g, true, 4).data(),
                    one.numel(), DType::kF32);
  std::vector<std::vector<int64_t>> each;
  for (int64_t i = 0; i < 7; ++i) each.push_back({i});
  EXPECT_BITWISE_EQ(one.data(), dtable_of(e, each, init, g, true, 5).data(), one.numel(),
                    DType::kF32);
  const int saved = num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    EXPECT_BITWISE_EQ(one.data(), dtable_of(e, {test::id_range(0, 7)}, init, g, true, 6).data(),
                      one.numel(), DType::kF32)
        << "threads=" << threads;
  }
  set_num_threads(saved);
  // Rerun: same bits.
  EXPECT_BITWISE_EQ(one.data(), dtable_of(e, {test::id_range(0, 7)}, init, g, false, 0).data(),
                    one.numel(), DType::kF32);
}

TEST(EmbeddingBackward, StridedViewsAndI32Ids) {
  auto g = test::rng(3);
  const int64_t V = 9, H = 33, T = 20, ld = 40;
  Tensor ids64(DType::kI64, {T}), ids32(DType::kI32, {2 * T});
  for (int64_t t = 0; t < T; ++t) {
    ids64.ptr<int64_t>()[t] = int64_t(g() % uint64_t(V));
    ids32.ptr<int32_t>()[2 * t] = int32_t(ids64.ptr<int64_t>()[t]);
    ids32.ptr<int32_t>()[2 * t + 1] = -5;  // between the strided elements: never read
  }
  Tensor gh = test::random_f32({T, H}, g), ghb = test::random_f32({T, ld}, g);
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(ghb.ptr<float>() + t * ld + 2, gh.ptr<float>() + t * H, size_t(H) * 4);
  const TokenOrder order = TokenOrder::make("t", {{1, 0, 8}, {0, 8, 12}}, T);
  Tensor init = test::random_f32({V, H}, g);
  Tensor a = test::clone(init);
  cpu::embedding_backward(v(ids64), v(gh), order, v(a));
  TensorView idv = TensorView::contiguous(ids32.data(), DType::kI32, {T});
  idv.stride[0] = 2;
  TensorView ghv = TensorView::contiguous(ghb.ptr<float>() + 2, DType::kF32, {T, H});
  ghv.stride[0] = ld;
  Tensor tb(DType::kF32, {V, ld});
  for (int64_t r = 0; r < V; ++r)
    std::memcpy(tb.ptr<float>() + r * ld + 1, init.ptr<float>() + r * H, size_t(H) * 4);
  TensorView tv = TensorView::contiguous(tb.ptr<float>() + 1, DType::kF32, {V, H});
  tv.stride[0] = ld;
  cpu::embedding_backward(idv, ghv, order, tv);
  for (int64_t r = 0; r < V; ++r)
    ASSERT_BITWISE_EQ(tb.ptr<float>() + r * ld + 1, a.ptr<float>() + r * H, H, DType::kF32) << r;
}

TEST(EmbeddingBackward, AccuracyAgainstFp64) {
  auto g = test::rng(4);
  const int64_t V = 3, H = 50;
  EmbStep e({300, 200, 77}, V, H, g);
  Tensor init(DType::kF32, {V, H});
  std::memset(init.data(), 0, size_t(init.nbytes()));
  const Tensor got = dtable_of(e, {{0, 1, 2}}, init, g, true, 2);
  std::vector<double> ref(size_t(V * H), 0.0), mag(size_t(V * H), 0.0);
  std::vector<int64_t> count(size_t(V), 0);
  for (int64_t t = 0; t < e.step.tokens; ++t) {
    const int64_t id = e.ids.ptr<int64_t>()[t];
    ++count[size_t(id)];
    for (int64_t k = 0; k < H; ++k) {
      ref[size_t(id * H + k)] += e.gh.ptr<float>()[t * H + k];
      mag[size_t(id * H + k)] += std::fabs(e.gh.ptr<float>()[t * H + k]);
    }
  }
  double worst = 0;
  for (int64_t i = 0; i < V * H; ++i) {
    const double bound = double(count[size_t(i / H)]) * std::ldexp(1.0, -24) * mag[size_t(i)];
    const double err = std::fabs(double(got.ptr<float>()[i]) - ref[size_t(i)]);
    ASSERT_LE(err, bound) << i;
    worst = std::max(worst, err / bound);
  }
  std::printf("[embedding backward] worst error / bound = %.3g\n", worst);
}

TEST(EmbeddingBackward, BadArgumentsThrowNamingTheArgument) {
  auto g = test::rng(5);
  const int64_t V = 5, H = 4, T = 6;
  Tensor ids(DType::kI64, {T});
  for (int64_t t = 0; t < T; ++t) ids.ptr<int64_t>()[t] = t % V;
  Tensor gh = test::random_f32({T, H}, g), d = test::random_f32({V, H}, g);
  const TokenOrder order = TokenOrder::make("t", {{0, 0, 3}, {1, 4, 2}}, T);  // row 3: padding
  const char* op = "embedding_backward";
  ids.ptr<int64_t>()[3] = 99;  // padding row: never read, no error
  const Tensor before = test::clone(d);
  cpu::embedding_backward(v(ids), v(gh), order, v(d));
  ids.ptr<int64_t>()[5] = V;
  Tensor d2 = test::clone(before);
  expect_error([&] { cpu::embedding_backward(v(ids), v(gh), order, v(d2)); },
               {op, "'ids'", "element 5", "= 5", "[0, 5)"});
  EXPECT_BITWISE_EQ(d2.data(), before.data(), d2.numel(), DType::kF32);  // nothing written
  ids.ptr<int64_t>()[5] = -1;
  expect_error([&] { cpu::embedding_backward(v(ids), v(gh), order, v(d2)); },
               {op, "'ids'", "element 5", "= -1"});
  ids.ptr<int64_t>()[5] = 0;
  Tensor idf(DType::kF32, {T});
  expect_error([&] { cpu::embedding_backward(v(idf), v(gh), order, v(d2)); }, {op, "'ids'"});
  const TokenOrder order7 = TokenOrder::make("t", {{0, 0, 3}}, T + 1);
  expect_error([&] { cpu::embedding_backward(v(ids), v(gh), order7, v(d2)); }, {op, "'ids'"});
  Tensor gh5(DType::kF32, {T, H + 1});
  expect_error([&] { cpu::embedding_backward(v(ids), v(gh5), order, v(d2)); }, {op, "'gh'"});
  Tensor ghb(DType::kBF16, {T, H});
  expect_error([&] { cpu::embedding_backward(v(ids), v(ghb), order, v(d2)); }, {op, "'gh'"});
  Tensor db(DType::kBF16, {V, H});
  expect_error([&] { cpu::embedding_backward(v(ids), v(gh), order, v(db)); }, {op, "'dtable'"});
  Tensor d0(DType::kF32, {V, 0}), gh0(DType::kF32, {T, 0});
  expect_error([&] { cpu::embedding_backward(v(ids), v(gh0), order, v(d0)); }, {op, "'dtable'"});
  TensorView over = TensorView::contiguous(gh.data(), DType::kF32, {1, H});  // dtable inside gh
  const TokenOrder order1 = TokenOrder::make("t", {{0, 0, 1}}, T);
  ids.ptr<int64_t>()[0] = 0;
  expect_error([&] { cpu::embedding_backward(v(ids), v(gh), order1, over); },
               {op, "'dtable'", "overlap"});
}

}  // namespace
}  // namespace lockstep
