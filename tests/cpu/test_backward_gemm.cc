// GEMM backward (docs/contract.md §B.3): dX and dW against a literal transcription of §B.3
// (scalar MMA model, explicit trees and token blocks), dX's TP partials (§B.2) for every t <= S,
// dX row invariance, dW invariance to micro-batch splits, packing (shuffled rows, garbage padding)
// and thread count, accuracy vs an fp64 oracle, special values, poisoned outputs, bad arguments.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "cpu/token_order_test_util.h"
#include "lockstep/ops/backward.h"
#include "lockstep/ops/gemm.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::bitwise_equal;
using test::expect_error;

constexpr uint32_t kCanonNanF32 = 0x7FC00000u;

uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// bf16 data with special values mixed in: ±0, subnormals, huge / tiny exponents, ±inf, NaN.
void fill_special(bf16* p, int64_t n, std::mt19937_64& g) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int kind = int(g() % 40);
    float v = d(g);
    if (kind == 0) v = 0.0f;
    if (kind == 1) v = -0.0f;
    if (kind == 2) v = std::ldexp(v, -130);  // bf16 subnormal
    if (kind == 3) v = std::ldexp(v, 60);
    if (kind == 4) v = std::ldexp(v, -60);
    p[i] = f32_to_bf16(v);
    if (kind == 5) p[i] = bf16{uint16_t(g() % 2 ? 0x7f80 : 0xff80)};
    if (kind == 6) p[i] = bf16{0x7fc0};
  }
}

// ---- §B.3 written out literally --------------------------------------------------------------

// dx[t, k] = round(tree_S(seg_s)), seg_s = the chain from +0 over the N-segment s of the
// zero-padded (dy[t, n], w[n, k]) pairs, N padded to a multiple of 16·S.
Tensor literal_dx(const Tensor& dy, const Tensor& w, int S, DType out) {
  const int64_t T = dy.shape()[0], N = dy.shape()[1], K = w.shape()[1];
  const int64_t np = (N + 16 * S - 1) / (16 * S) * (16 * S), len = np / S;
  Tensor dx(out, {T, K});
  std::vector<bf16> a(static_cast<size_t>(np)), b(static_cast<size_t>(np));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = 0; n < np; ++n) {
        a[size_t(n)] = n < N ? dy.ptr<bf16>()[t * N + n] : bf16{0};
        b[size_t(n)] = n < N ? w.ptr<bf16>()[n * K + k] : bf16{0};
      }
      float seg[8];
      for (int s = 0; s < S; ++s) {
        float c = 0.0f;
        for (int64_t n = s * len; n < (s + 1) * len; n += 16)
          c = mma_kblock_bf16(&a[size_t(n)], &b[size_t(n)], c);
        seg[s] = c;
      }
      for (int w2 = S / 2; w2 >= 1; w2 /= 2)  // tree(p0..p_{S-1}): adjacent pairs, level by level
        for (int i = 0; i < w2; ++i) seg[i] = seg[2 * i] + seg[2 * i + 1];
      if (out == DType::kF32) {
        dx.ptr<float>()[t * K + k] = std::isnan(seg[0]) ? f32_from_bits(kCanonNanF32) : seg[0];
      } else {
        dx.ptr<bf16>()[t * K + k] = f32_to_bf16(seg[0]);
      }
    }
  return dx;
}

// dw[n, k] = mma(dy[block rows, n], x[block rows, k], dw[n, k]) for every token block, sequences
// by ascending step index, blocks ascending, rows past the sequence's end zero.
void literal_dw(const Tensor& dy, const Tensor& x, std::vector<TokenSeq> seqs, Tensor& dw) {
  const int64_t N = dy.shape()[1], K = x.shape()[1];
  std::sort(seqs.begin(), seqs.end(),
            [](const TokenSeq& a, const TokenSeq& b) { return a.step_index < b.step_index; });
  bf16 a[16], b[16];
  for (const TokenSeq& s : seqs)
    for (int64_t p0 = 0; p0 < s.len; p0 += 16)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          for (int i = 0; i < 16; ++i) {
            const bool real = p0 + i < s.len;
            a[i] = real ? dy.ptr<bf16>()[(s.row + p0 + i) * N + n] : bf16{0};
            b[i] = real ? x.ptr<bf16>()[(s.row + p0 + i) * K + k] : bf16{0};
          }
          float& d = dw.ptr<float>()[n * K + k];
          d = mma_kblock_bf16(a, b, d);
          if (std::isnan(d)) d = f32_from_bits(kCanonNanF32);
        }
}

TensorView v(const Tensor& t) { return t.view(); }

// ---- dX --------------------------------------------------------------------------------------

TEST(GemmBackward, DxMatchesLiteralTranscription) {
  auto g = test::rng(1);
  for (int S : {1, 2, 4, 8})
    for (auto [T, N, K] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {17, 40, 23}, {33, 130, 17}, {5, 16, 64}, {3, 300, 9}})
      for (DType out : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE("S=" + std::to_string(S) + " T=" + std::to_string(T) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K) + " " + dtype_name(out));
        Tensor dy(DType::kBF16, {T, N}), w(DType::kBF16, {N, K});
        test::fill_bf16(dy.ptr<bf16>(), dy.numel(), g);
        test::fill_bf16(w.ptr<bf16>(), w.numel(), g, 0.1f);
        if (T >= 3) fill_special(dy.ptr<bf16>() + N, N, g);  // row 1: specials
        if (K >= 3) fill_special(w.ptr<bf16>(), N, g);       // some specials in w too
        Tensor dx = test::poisoned(out, {T, K});
        cpu::gemm_bf16_dx(v(dy), v(w), GemmConfig{S}, v(dx));
        Tensor ref = literal_dx(dy, w, S, out);
        EXPECT_BITWISE_EQ(dx.data(), ref.data(), dx.numel(), out);
      }
}

TEST(GemmBackward, DxTensorParallelPartialsGiveTheFullBits) {
  auto g = test::rng(2);
  for (int S : {1, 2, 4, 8})
    for (int64_t N : {1, 37, 128, 200})
      for (int t = 1; t <= S; t *= 2) {
        SCOPED_TRACE("S=" + std::to_string(S) + " N=" + std::to_string(N) +
                     " t=" + std::to_string(t));
        const int64_t T = 19, K = 29;
        Tensor dy = test::random_bf16({T, N}, g), w = test::random_bf16({N, K}, g, 0.1f);
        const GemmConfig cfg{S};
        std::vector<Tensor> parts;
        std::vector<TensorView> views;
        for (int r = 0; r < t; ++r) {
          const GemmKRange range = gemm_tp_k_range(cfg, N, t, r);
          // dy's shard is a strided column view of dy; w's shard a row range of w.
          TensorView dys = v(dy);
          dys.data = dy.ptr<bf16>() + range.begin;
          dys.shape[1] = range.end - range.begin;
          const TensorView ws = v(w).rows(range.begin, range.end);
          parts.push_back(test::poisoned(DType::kF32, {T, K}));
          cpu::gemm_bf16_dx_partial(dys, ws, N, t, r, cfg, v(parts.back()));
          views.push_back(v(parts.back()));
        }
        for (DType out : {DType::kF32, DType::kBF16}) {
          Tensor full = test::poisoned(out, {T, K}), tp = test::poisoned(out, {T, K});
          cpu::gemm_bf16_dx(v(dy), v(w), cfg, v(full));
          cpu::gemm_tree_combine(views, nullptr, v(tp));
          EXPECT_BITWISE_EQ(full.data(), tp.data(), full.numel(), out);
        }
      }
}

TEST(GemmBackward, DxOfARowDependsOnlyOnItsDyRow) {
  auto g = test::rng(3);
  const int64_t N = 70, K = 45;
  Tensor w = test::random_bf16({N, K}, g, 0.1f);
  Tensor row = test::random_bf16({1, N}, g);
  const int saved = num_threads();
  for (int S : {1, 4}) {
    Tensor alone = test::poisoned(DType::kF32, {1, K});
    cpu::gemm_bf16_dx(v(row), v(w), GemmConfig{S}, v(alone));
    for (int64_t T : {1, 3, 17, 40}) {
      set_num_threads(T % 2 ? 3 : 1);
      // dy with a row stride of N + 5, the row at position T / 2, neighbours random.
      Tensor buf = test::random_bf16({T, N + 5}, g);
      const int64_t at = T / 2;
      std::memcpy(buf.ptr<bf16>() + at * (N + 5), row.ptr<bf16>(), size_t(N) * 2);
      TensorView dy = test::strided_view(buf, T, N, N + 5);
      Tensor dxbuf = test::poisoned(DType::kF32, {T, K + 3});
      TensorView dx = TensorView::contiguous(dxbuf.data(), DType::kF32, {T, K});
      dx.stride[0] = K + 3;
      cpu::gemm_bf16_dx(dy, v(w), GemmConfig{S}, dx);
      EXPECT_BITWISE_EQ(dxbuf.ptr<float>() + at * (K + 3), alone.data(), K, DType::kF32)
          << "T=" << T << " S=" << S;
    }
  }
  set_num_threads(saved);
}

TEST(GemmBackward, DxAccuracyAgainstFp64) {
  auto g = test::rng(4);
  const int64_t T = 9, N = 333, K = 31;
  for (int S : {1, 8}) {
    Tensor dy = test::random_bf16({T, N}, g), w = test::random_bf16({N, K}, g, 0.05f);
    Tensor dx(DType::kF32, {T, K});
    cpu::gemm_bf16_dx(v(dy), v(w), GemmConfig{S}, v(dx));
    const int64_t np = (N + 16 * S - 1) / (16 * S) * (16 * S);
    const double blocks = double(np / 16);
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        double ref = 0, a = 0;
        for (int64_t n = 0; n < N; ++n) {
          const double p = double(bf16_to_f32(dy.ptr<bf16>()[t * N + n])) *
                           double(bf16_to_f32(w.ptr<bf16>()[n * K + k]));
          ref += p;
          a += std::fabs(p);
        }
        const double bound = (blocks + std::log2(double(S)) + 2) * std::ldexp(1.0, -20) * a;
        const double err = std::fabs(double(dx.ptr<float>()[t * K + k]) - ref);
        EXPECT_LE(err, bound) << "t=" << t << " k=" << k;
        worst = std::max(worst, err / bound);
      }
    std::printf("[dx S=%d] worst error / bound = %.3g\n", S, worst);
  }
}

// ---- dW --------------------------------------------------------------------------------------

// A step of sequences with odd lengths and its global dy [tokens, N], x [tokens, K].
struct DwStep {
  test::Step step;
  Tensor dy, x;
  DwStep(std::vector<int64_t> lens, int64_t N, int64_t K, std::mt19937_64& g)
      : step(std::move(lens)) {
    dy = test::random_bf16({step.tokens, N}, g);
    x = test::random_bf16({step.tokens, K}, g);
  }
};

// dw after applying the micro-batches (each a list of step indices) in order, from `init`.
Tensor dw_of(const DwStep& s, const std::vector<std::vector<int64_t>>& batches, const Tensor& init,
             std::mt19937_64& g, bool shuffle, int max_pad) {
  Tensor dw = test::clone(init);
  GradStep gs;
  for (const auto& ids : batches) {
    const test::Packing p = test::pack(s.step, ids, g, shuffle, max_pad);
    gs.accept(p.order);
    Tensor dy = test::packed_rows(s.dy, p, g), x = test::packed_rows(s.x, p, g);
    cpu::gemm_bf16_dw(v(dy), v(x), p.order, v(dw));
  }
  return dw;
}

TEST(GemmBackward, DwMatchesLiteralTranscription) {
  auto g = test::rng(5);
  for (auto [N, K] : std::vector<std::array<int64_t, 2>>{{1, 1}, {17, 23}, {40, 33}, {16, 5}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K));
    DwStep s({1, 17, 33, 5, 16}, N, K, g);
    fill_special(s.dy.ptr<bf16>() + 3 * N, 20 * N, g);  // specials in some rows
    fill_special(s.x.ptr<bf16>() + 30 * K, 10 * K, g);
    Tensor init = test::random_f32({N, K}, g);
    const test::Packing p = test::pack(s.step, test::id_range(0, 5), g, true, 3);
    Tensor dy = test::packed_rows(s.dy, p, g), x = test::packed_rows(s.x, p, g);
    Tensor dw = test::clone(init), ref = test::clone(init);
    cpu::gemm_bf16_dw(v(dy), v(x), p.order, v(dw));
    literal_dw(dy, x, std::vector<TokenSeq>(p.order.seqs().begin(), p.order.seqs().end()), ref);
    EXPECT_BITWISE_EQ(dw.data(), ref.data(), dw.numel(), DType::kF32);
  }
}

TEST(GemmBackward, DwIsInvariantToMicroBatchSplitsPackingAndThreads) {
  auto g = test::rng(6);
  const int64_t N = 37, K = 50;
  DwStep s({1, 17, 33, 5, 40, 16, 3}, N, K, g);
  Tensor init = test::random_f32({N, K}, g, 1e-3f);
  const Tensor one = dw_of(s, {test::id_range(0, 7)}, init, g, false, 0);
  // Three consecutive runs, packed shuffled with garbage padding.
  const Tensor three = dw_of(s, {{0, 1}, {2, 3, 4}, {5, 6}}, init, g, true, 4);
  EXPECT_BITWISE_EQ(one.data(), three.data(), one.numel(), DType::kF32);
  // One sequence per micro-batch.
  std::vector<std::vector<int64_t>> each;
  for (int64_t i = 0; i < 7; ++i) each.push_back({i});
  const Tensor singles = dw_of(s, each, init, g, true, 5);
  EXPECT_BITWISE_EQ(one.data(), singles.data(), one.numel(), DType::kF32);
  // Shuffled packing of the whole step in one micro-batch, for thread counts 1 and 3.
  const int saved = num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    const Tensor shuffled = dw_of(s, {test::id_range(0, 7)}, init, g, true, 6);
    EXPECT_BITWISE_EQ(one.data(), shuffled.data(), one.numel(), DType::kF32)
        << "threads=" << threads;
  }
  set_num_threads(saved);
  // Rerun: same bits.
  const Tensor again = dw_of(s, {test::id_range(0, 7)}, init, g, false, 0);
  EXPECT_BITWISE_EQ(one.data(), again.data(), one.numel(), DType::kF32);
}

// The vectorized dW kernel against the model on inputs at the edges of what it models: wide
// exponent spreads (products near the [-100, 90] limits and beyond), accumulators that are tiny,
// subnormal, ±0, huge, inf or NaN, dy columns with e(a) > 27, lane and row tails (K, N not
// multiples of 16 / 4), and k-blocks whose exact sum overflows int32.
TEST(GemmBackward, DwFastKernelEqualsTheModelOnHardInputs) {
  auto g = test::rng(14);
  std::uniform_int_distribution<int> ex(-64, 64);
  for (int iter = 0; iter < 12; ++iter) {
    const int64_t N = 1 + int64_t(g() % 13), K = 1 + int64_t(g() % 40);
    DwStep s({int64_t(1 + g() % 40), int64_t(1 + g() % 40)}, N, K, g);
    const int spread = iter % 3 == 0 ? 0 : iter % 3 == 1 ? 20 : 64;
    for (int64_t i = 0; i < s.dy.numel(); ++i) {
      bf16& v0 = s.dy.ptr<bf16>()[i];
      v0 = f32_to_bf16(std::ldexp(bf16_to_f32(v0), spread ? ex(g) % (spread + 1) : 0));
    }
    for (int64_t i = 0; i < s.x.numel(); ++i) {
      bf16& v0 = s.x.ptr<bf16>()[i];
      v0 = f32_to_bf16(std::ldexp(bf16_to_f32(v0), spread ? ex(g) % (spread + 1) : 0));
    }
    if (iter == 3 || iter == 6) {
      // A dy column with e(a) > 27 and one with e(a) = 27 exactly, over zero x elements of the
      // same tokens (a zero b must not raise E).
      s.dy.ptr<bf16>()[3 * N] = f32_to_bf16(std::ldexp(1.0f, 40));
      if (N > 1) s.dy.ptr<bf16>()[0 * N + 1] = f32_to_bf16(std::ldexp(1.5f, 27));
      for (int64_t k = 0; k < K; k += 2) {
        s.x.ptr<bf16>()[3 * K + k] = bf16{0};
        s.x.ptr<bf16>()[0 * K + k] = bf16{0x8000};
      }
    }
    if (iter == 7) {  // every product and c at the top of one binade: the int32 sum overflows
      for (int64_t i = 0; i < s.dy.numel(); ++i) s.dy.ptr<bf16>()[i] = bf16{0x3fff};
      for (int64_t i = 0; i < s.x.numel(); ++i) s.x.ptr<bf16>()[i] = bf16{0x3fff};
    }
    Tensor init = test::random_f32({N, K}, g);
    const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu,
                             0x0c800000u, 0x0d000000u, 0x0cffffffu, 0x7f000000u,
                             0x7f800000u, 0x7fc00000u, 0x3fffffffu, 0xbfffffffu};
    for (int64_t i = 0; i < init.numel(); ++i)
      if (g() % 3 == 0) init.ptr<float>()[i] = f32_from_bits(edge[g() % 12]);
    const test::Packing p = test::pack(s.step, {0, 1}, g, true, 2);
    Tensor dy = test::packed_rows(s.dy, p, g), x = test::packed_rows(s.x, p, g);
    Tensor dw = test::clone(init), ref = test::clone(init);
    cpu::gemm_bf16_dw(v(dy), v(x), p.order, v(dw));
    literal_dw(dy, x, std::vector<TokenSeq>(p.order.seqs().begin(), p.order.seqs().end()), ref);
    EXPECT_BITWISE_EQ(dw.data(), ref.data(), dw.numel(), DType::kF32)
        << "iter " << iter << " N=" << N << " K=" << K;
  }
}

// A zero x element next to a large dy value must not raise a k-block's E: dy column 0 holds 2^80
// at a token whose x is zero, every other product is near 2^-90 and the accumulators are +0.
TEST(GemmBackward, DwFastKernelZeroXNextToLargeDy) {
  auto g = test::rng(15);
  const int64_t N = 5, K = 19;
  DwStep s({20}, N, K, g);
  for (int64_t i = 0; i < s.x.numel(); ++i)
    s.x.ptr<bf16>()[i] = f32_to_bf16(std::ldexp(bf16_to_f32(s.x.ptr<bf16>()[i]), -90));
  s.dy.ptr<bf16>()[3 * N] = f32_to_bf16(std::ldexp(1.0f, 80));
  for (int64_t k = 0; k < K; ++k) s.x.ptr<bf16>()[3 * K + k] = bf16{0};
  Tensor init(DType::kF32, {N, K});
  std::memset(init.data(), 0, size_t(init.nbytes()));
  const test::Packing p = test::pack_all(s.step);
  Tensor dw = test::clone(init), ref = test::clone(init);
  cpu::gemm_bf16_dw(v(s.dy), v(s.x), p.order, v(dw));
  literal_dw(s.dy, s.x, std::vector<TokenSeq>(p.order.seqs().begin(), p.order.seqs().end()), ref);
  EXPECT_BITWISE_EQ(dw.data(), ref.data(), dw.numel(), DType::kF32);
}

// More token blocks than one gather chunk (32) in a micro-batch: the chunks continue the chain.
TEST(GemmBackward, DwAcrossGatherChunks) {
  auto g = test::rng(13);
  const int64_t N = 20, K = 18;
  DwStep s({300, 5, 400}, N, K, g);  // 19 + 1 + 25 blocks
  Tensor init = test::random_f32({N, K}, g);
  const test::Packing p = test::pack(s.step, test::id_range(0, 3), g, true, 3);
  Tensor dy = test::packed_rows(s.dy, p, g), x = test::packed_rows(s.x, p, g);
  Tensor dw = test::clone(init), ref = test::clone(init);
  cpu::gemm_bf16_dw(v(dy), v(x), p.order, v(dw));
  literal_dw(dy, x, std::vector<TokenSeq>(p.order.seqs().begin(), p.order.seqs().end()), ref);
  EXPECT_BITWISE_EQ(dw.data(), ref.data(), dw.numel(), DType::kF32);
  const Tensor singles = dw_of(s, {{0}, {1}, {2}}, init, g, true, 2);
  EXPECT_BITWISE_EQ(dw.data(), singles.data(), dw.numel(), DType::kF32);
}

TEST(GemmBackward, DwStepRefusesAnOutOfOrderMicroBatch) {
  auto g = test::rng(7);
  const test::Step step({4, 5, 6, 7});
  GradStep gs;
  gs.accept(test::pack(step, {0, 1}, g, true, 2).order);
  expect_error(
      [&] {
        gs.accept(test::pack(step, {1, 2}, g, true, 2).order);
      },
      {"GradStep", "out of canonical order", "step index 1"});
  gs.accept(test::pack(step, {3}, g, true, 2).order);  // a gap is fine, going back is not
  expect_error([&] { gs.accept(test::pack(step, {2}, g, true, 2).order); }, {"GradStep"});
}

TEST(GemmBackward, DwSequenceGradientDoesNotDependOnOtherSequences) {
  auto g = test::rng(8);
  const int64_t N = 21, K = 19;
  // Sequence 1 alone vs with sequences 0 and 2 whose dy are zero (their contributions are exact
  // zeros, so the chain over sequence 1's blocks is the same), packed around it.
  DwStep s({9, 33, 12}, N, K, g);
  for (int64_t r = 0; r < 9; ++r)
    std::fill(s.dy.ptr<bf16>() + r * N, s.dy.ptr<bf16>() + (r + 1) * N, bf16{0});
  for (int64_t r = 42; r < 54; ++r)
    std::fill(s.dy.ptr<bf16>() + r * N, s.dy.ptr<bf16>() + (r + 1) * N, bf16{0});
  Tensor init = test::random_f32({N, K}, g);
  const Tensor alone = dw_of(s, {{1}}, init, g, true, 3);
  const Tensor all = dw_of(s, {{0, 1, 2}}, init, g, true, 3);
  EXPECT_BITWISE_EQ(alone.data(), all.data(), alone.numel(), DType::kF32);
}

TEST(GemmBackward, DwAccuracyAgainstFp64) {
  auto g = test::rng(9);
  const int64_t N = 24, K = 30;
  DwStep s({100, 57, 200}, N, K, g);
  Tensor dw(DType::kF32, {N, K});
  std::memset(dw.data(), 0, size_t(dw.nbytes()));
  const Tensor got = dw_of(s, {{0, 1, 2}}, dw, g, true, 2);
  const double blocks = double((100 + 15) / 16 + (57 + 15) / 16 + (200 + 15) / 16);
  double worst = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double ref = 0, a = 0;
      for (int64_t t = 0; t < s.step.tokens; ++t) {
        const double p = double(bf16_to_f32(s.dy.ptr<bf16>()[t * N + n])) *
                         double(bf16_to_f32(s.x.ptr<bf16>()[t * K + k]));
        ref += p;
        a += std::fabs(p);
      }
      const double bound = (blocks + 2) * std::ldexp(1.0, -23) * a;
      const double err = std::fabs(double(got.ptr<float>()[n * K + k]) - ref);
      EXPECT_LE(err, bound) << "n=" << n << " k=" << k;
      worst = std::max(worst, err / bound);
    }
  std::printf("[dw] worst error / bound = %.3g\n", worst);
}

TEST(GemmBackward, DwSpecialValuesStoreTheCanonicalNan) {
  auto g = test::rng(10);
  const int64_t N = 5, K = 6;
  DwStep s({20}, N, K, g);
  s.dy.ptr<bf16>()[3 * N + 1] = bf16{0xffc1};  // NaN (non-canonical payload) in dy column 1
  s.x.ptr<bf16>()[17 * K + 2] = bf16{0x7f80};  // +inf in x column 2 (second block)
  s.x.ptr<bf16>()[17 * K + 4] = bf16{0x0001};  // a subnormal in x column 4
  Tensor init(DType::kF32, {N, K});
  std::memset(init.data(), 0, size_t(init.nbytes()));
  init.ptr<float>()[0 * K + 5] = f32_from_bits(0xffc00001u);  // a non-canonical NaN already there
  const Tensor dw = dw_of(s, {{0}}, init, g, true, 2);
  Tensor ref = test::clone(init);
  const test::Packing p = test::pack_all(s.step);
  literal_dw(s.dy, s.x, std::vector<TokenSeq>(p.order.seqs().begin(), p.order.seqs().end()), ref);
  EXPECT_BITWISE_EQ(dw.data(), ref.data(), dw.numel(), DType::kF32);
  for (int64_t k = 0; k < K; ++k) EXPECT_EQ(bits(dw.ptr<float>()[1 * K + k]), kCanonNanF32);
  EXPECT_EQ(bits(dw.ptr<float>()[0 * K + 5]), kCanonNanF32);
  for (int64_t n = 0; n < N; ++n) {
    if (n == 1) continue;
    const float d = dw.ptr<float>()[n * K + 2];
    const float dyv = bf16_to_f32(s.dy.ptr<bf16>()[17 * N + n]);
    EXPECT_TRUE(std::isinf(d) && std::signbit(d) == std::signbit(dyv)) << "n=" << n << " " << d;
  }
}

TEST(GemmBackward, EmptyShapesAndEmptyOrders) {
  auto g = test::rng(11);
  // T = 0: dx is empty; an empty order leaves dw untouched.
  Tensor dy(DType::kBF16, {0, 8}), w = test::random_bf16({8, 4}, g), dx(DType::kF32, {0, 4});
  cpu::gemm_bf16_dx(v(dy), v(w), GemmConfig{2}, v(dx));
  Tensor x(DType::kBF16, {0, 4});
  Tensor dw = test::random_f32({8, 4}, g), before = test::clone(dw);
  cpu::gemm_bf16_dw(v(dy), v(x), TokenOrder::make("t", {}, 0), v(dw));
  EXPECT_BITWISE_EQ(dw.data(), before.data(), dw.numel(), DType::kF32);
  // Only padding rows (and a zero-length sequence): dw untouched.
  Tensor dy2 = test::random_bf16({5, 8}, g), x2 = test::random_bf16({5, 4}, g);
  cpu::gemm_bf16_dw(v(dy2), v(x2), TokenOrder::make("t", {{0, 2, 0}}, 5), v(dw));
  EXPECT_BITWISE_EQ(dw.data(), before.data(), dw.numel(), DType::kF32);
  // N = 0 for dx: dx [T, K] from an empty reduction is +0.
  Tensor dy3(DType::kBF16, {3, 0}), w3(DType::kBF16, {0, 4});
  Tensor dx3 = test::poisoned(DType::kF32, {3, 4});
  cpu::gemm_bf16_dx(v(dy3), v(w3), GemmConfig{1}, v(dx3));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(bits(dx3.ptr<float>()[i]), 0u);
}

TEST(GemmBackward, BadArgumentsThrowNamingTheArgument) {
  auto g = test::rng(12);
  Tensor dy = test::random_bf16({4, 8}, g), w = test::random_bf16({8, 6}, g);
  Tensor dx(DType::kF32, {4, 6}), dyf(DType::kF32, {4, 8});
  expect_error([&] { cpu::gemm_bf16_dx(v(dyf), v(w), GemmConfig{1}, v(dx)); },
               {"gemm_bf16_dx", "'dy'"});
  Tensor w2 = test::random_bf16({7, 6}, g);
  expect_error([&] { cpu::gemm_bf16_dx(v(dy), v(w2), GemmConfig{1}, v(dx)); },
               {"gemm_bf16_dx", "'w'"});
  Tensor dx2(DType::kF32, {4, 5});
  expect_error([&] { cpu::gemm_bf16_dx(v(dy), v(w), GemmConfig{1}, v(dx2)); },
               {"gemm_bf16_dx", "'dx'"});
  expect_error([&] { cpu::gemm_bf16_dx(v(dy), v(w), GemmConfig{3}, v(dx)); },
               {"gemm_bf16_dx", "segments"});
  TensorView alias = v(w);  // dx over w's memory
  alias.dtype = DType::kBF16;
  alias.shape[0] = 4;
  alias.shape[1] = 6;
  alias.stride[0] = 6;
  expect_error([&] { cpu::gemm_bf16_dx(v(dy), v(w), GemmConfig{1}, alias); },
               {"gemm_bf16_dx", "'dx'", "overlap"});
  // Partials.
  Tensor part(DType::kF32, {4, 6});
  expect_error([&] { cpu::gemm_bf16_dx_partial(v(dy), v(w), 8, 4, 0, GemmConfig{2}, v(part)); },
               {"gemm_bf16_dx_partial", "tp_size"});
  expect_error([&] { cpu::gemm_bf16_dx_partial(v(dy), v(w), 8, 2, 2, GemmConfig{2}, v(part)); },
               {"gemm_bf16_dx_partial", "tp_rank"});
  expect_error([&] { cpu::gemm_bf16_dx_partial(v(dy), v(w), 40, 2, 0, GemmConfig{2}, v(part)); },
               {"gemm_bf16_dx_partial", "'dy_shard'"});
  Tensor part_bf(DType::kBF16, {4, 6});
  expect_error([&] { cpu::gemm_bf16_dx_partial(v(dy), v(w), 8, 1, 0, GemmConfig{2}, v(part_bf)); },
               {"gemm_bf16_dx_partial", "'dx_partial'"});
  // dW.
  Tensor x = test::random_bf16({4, 6}, g), dw(DType::kF32, {8, 6});
  const TokenOrder order = TokenOrder::make("t", {{0, 0, 4}}, 4);
  const TokenOrder order5 = TokenOrder::make("t", {{0, 0, 4}}, 5);
  expect_error([&] { cpu::gemm_bf16_dw(v(dy), v(x), order5, v(dw)); }, {"gemm_bf16_dw", "'dy'"});
  Tensor x5 = test::random_bf16({5, 6}, g);
  expect_error([&] { cpu::gemm_bf16_dw(v(dy), v(x5), order, v(dw)); }, {"gemm_bf16_dw", "'x'"});
  Tensor dwb(DType::kBF16, {8, 6}), dw2(DType::kF32, {6, 8});
  expect_error([&] { cpu::gemm_bf16_dw(v(dy), v(x), order, v(dwb)); }, {"gemm_bf16_dw", "'dw'"});
  expect_error([&] { cpu::gemm_bf16_dw(v(dy), v(x), order, v(dw2)); }, {"gemm_bf16_dw", "'dw'"});
  Tensor big(DType::kF32, {8, 6 + 8});  // x's bytes inside dw
  TensorView dwv = TensorView::contiguous(big.data(), DType::kF32, {8, 6});
  TensorView xv = TensorView::contiguous(big.ptr<float>() + 6, DType::kBF16, {4, 6});
  xv.stride[0] = 28;
  expect_error([&] { cpu::gemm_bf16_dw(v(dy), xv, order, dwv); },
               {"gemm_bf16_dw", "'dw'", "overlap"});
  TensorView strided = v(x);
  strided.stride[1] = 2;
  strided.stride[0] = 12;
  expect_error([&] { cpu::gemm_bf16_dw(v(dy), strided, order, v(dw)); }, {"gemm_bf16_dw", "'x'"});
}

}  // namespace
}  // namespace lockstep
