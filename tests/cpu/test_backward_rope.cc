// RoPE backward (docs/contract.md §B.5): the stated formula written out, the exact transpose of
// the forward's rotation in fp64 (accuracy), a row alone vs inside batches (bitwise), strided and
// in-place views, i32/i64 positions, threads, determinism, special values, poisoned outputs and
// argument errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "lockstep/ops/backward.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

constexpr uint32_t kCanonNanF32 = 0x7FC00000u;

RopeTable make_table(int64_t D, int64_t P) {
  RopeConfig c;
  c.head_dim = D;
  c.theta = 1e6;
  c.max_positions = P;
  return RopeTable::build(c);
}

Tensor positions_i64(const std::vector<int64_t>& p) {
  Tensor t(DType::kI64, {int64_t(p.size())});
  std::copy(p.begin(), p.end(), t.ptr<int64_t>());
  return t;
}

std::vector<int64_t> random_positions(int64_t T, int64_t P, std::mt19937_64& g) {
  std::vector<int64_t> pos(static_cast<size_t>(T));
  std::uniform_int_distribution<int64_t> pd(0, P - 1);
  for (auto& p : pos) p = pd(g);
  return pos;
}

float canon(float v) { return std::isnan(v) ? f32_from_bits(kCanonNanF32) : v; }

// §B.5 written out from its text: separate fp32 products, one sum / difference, f32 stored with
// the canonical NaN. gy and dx: contiguous [T, heads, D].
std::vector<float> stated(const std::vector<float>& gy, const std::vector<int64_t>& pos,
                          int64_t heads, const RopeTable& table) {
  const int64_t D = table.config.head_dim, half = D / 2, T = int64_t(pos.size());
  std::vector<float> dx(gy.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const size_t r = size_t((t * heads + h) * D);
        const float a = gy[r + size_t(i)], b = gy[r + size_t(i + half)];
        const float c = table.cos[size_t(pos[size_t(t)] * half + i)];
        const float s = table.sin[size_t(pos[size_t(t)] * half + i)];
        const float ac = a * c, bs = b * s, bc = b * c, as = a * s;
        dx[r + size_t(i)] = canon(ac + bs);
        dx[r + size_t(i + half)] = canon(bc - as);
      }
  return dx;
}

std::vector<float> run(const std::vector<float>& gy, const std::vector<int64_t>& pos, int64_t heads,
                       const RopeTable& table) {
  const int64_t T = int64_t(pos.size()), D = table.config.head_dim;
  Tensor p = positions_i64(pos);
  Tensor dx = test::poisoned(DType::kF32, {T, heads, D});
  cpu::rope_backward(
      TensorView::contiguous(const_cast<float*>(gy.data()), DType::kF32, {T, heads, D}), p.view(),
      table, dx.view());
  return std::vector<float>(dx.ptr<float>(), dx.ptr<float>() + T * heads * D);
}

std::vector<float> random_vec(int64_t n, std::mt19937_64& g, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  test::fill_f32(v.data(), n, g, scale);
  return v;
}

TEST(RopeBackward, MatchesTheStatedFormula) {
  for (int64_t D : {2, 6, 64, 128, 136}) {
    const RopeTable table = make_table(D, 512);
    for (int64_t T : {1, 17, 33}) {
      const int64_t heads = 3;
      auto g = test::rng(100 + uint64_t(D * 64 + T));
      const std::vector<float> gy = random_vec(T * heads * D, g, 2.0f);
      std::vector<int64_t> pos = random_positions(T, 512, g);
      pos[0] = 0;
      pos[size_t(T - 1)] = 511;
      EXPECT_TRUE(test::bitwise_equal(run(gy, pos, heads, table), stated(gy, pos, heads, table)))
          << "D=" << D << " T=" << T;
    }
  }
}

// The transpose of the forward's rotation (y_i = a·c − b·s, y_{i+D/2} = b·c + a·s) applied to gy
// in fp64, (1) with the table's cos/sin: only the fp32 arithmetic differs, two products and one
// add each rounded: |dx − ref| ≤ 2^-23·(|a| + |b|); (2) with exact cos/sin of the ideal angle:
// plus the table's error (≤ 2^-24 absolute, §E.2). Also the adjoint identity
// <rope(x), gy> = <x, dx> in fp64 over whole rows (relative 2^-20 of Σ|x|·(|a| + |b|)).
TEST(RopeBackward, ExactTransposeVsFp64Oracle) {
  const int64_t D = 128, half = 64, T = 64, heads = 2, P = 40960;
  const RopeTable table = make_table(D, P);
  auto g = test::rng(6);
  const std::vector<float> gy = random_vec(T * heads * D, g, 3.0f);
  const std::vector<int64_t> pos = random_positions(T, P, g);
  const std::vector<float> dx = run(gy, pos, heads, table);
  std::vector<float> x = random_vec(T * heads * D, g, 1.0f);
  double worst_table = 0, worst_ideal = 0, worst_adj = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const size_t r = size_t((t * heads + h) * D);
      double lhs = 0, rhs = 0, mag = 0;
      for (int64_t i = 0; i < half; ++i) {
        const double c = table.cos[size_t(pos[size_t(t)] * half + i)];
        const double s = table.sin[size_t(pos[size_t(t)] * half + i)];
        const long double ang =
            (long double)pos[size_t(t)] / std::pow(1e6L, (long double)(2 * i) / (long double)D);
        const double ce = double(std::cos(ang)), se = double(std::sin(ang));
        const double a = gy[r + size_t(i)], b = gy[r + size_t(i + half)];
        const double m = std::fabs(a) + std::fabs(b);
        // Forward matrix [[c, −s], [s, c]]; its transpose [[c, s], [−s, c]].
        const double r0 = c * a + s * b, r1 = -s * a + c * b;
        const double e0 = ce * a + se * b, e1 = -se * a + ce * b;
        const double d0 = dx[r + size_t(i)], d1 = dx[r + size_t(i + half)];
        worst_table = std::max({worst_table, std::fabs(d0 - r0) / m, std::fabs(d1 - r1) / m});
        worst_ideal = std::max({worst_ideal, std::fabs(d0 - e0) / m, std::fabs(d1 - e1) / m});
        ASSERT_LE(std::fabs(d0 - r0), 0x1p-23 * m) << "t=" << t << " i=" << i;
        ASSERT_LE(std::fabs(d1 - r1), 0x1p-23 * m) << "t=" << t << " i=" << i;
        ASSERT_LE(std::fabs(d0 - e0), 0x1p-23 * m + 0x1p-24 * m) << "t=" << t << " i=" << i;
        ASSERT_LE(std::fabs(d1 - e1), 0x1p-23 * m + 0x1p-24 * m) << "t=" << t << " i=" << i;
        const double xa = x[r + size_t(i)], xb = x[r + size_t(i + half)];
        lhs += (c * xa - s * xb) * a + (s * xa + c * xb) * b;  // <R x, gy>
        rhs += xa * d0 + xb * d1;                              // <x, Rᵀ gy>
        mag += (std::fabs(xa) + std::fabs(xb)) * m;
      }
      worst_adj = std::max(worst_adj, std::fabs(lhs - rhs) / mag);
      ASSERT_LE(std::fabs(lhs - rhs), 0x1p-20 * mag) << "t=" << t << " h=" << h;
    }
  std::printf(
      "[rope_backward] max |dx - ref| / (|a| + |b|): %.3g (table cos/sin), %.3g (exact cos/sin); "
      "adjoint identity %.3g\n",
      worst_table, worst_ideal, worst_adj);
}

// A row's dx alone == inside batches of 1/3/17 other tokens at other offsets with other contents
// (bitwise); i32 positions == i64; strided views (gy and dx inside wider rows) and in place
// (dx the same view as gy) == contiguous; threads 1 vs 3; reruns identical.
TEST(RopeBackward, InvariantToBatchLayoutThreadsAndReruns) {
  const int64_t D = 64, heads = 4, P = 1000;
  const RopeTable table = make_table(D, P);
  auto g = test::rng(7);
  const std::vector<float> one = random_vec(heads * D, g);
  const int64_t one_pos = 777;
  const std::vector<float> alone = run(one, {one_pos}, heads, table);
  for (int64_t others : {1, 3, 17}) {
    const int64_t T = others + 1;
    for (int64_t at : {int64_t(0), others / 2, others}) {
      std::vector<float> gy = random_vec(T * heads * D, g);
      std::vector<int64_t> pos = random_positions(T, P, g);
      std::copy(one.begin(), one.end(), gy.begin() + at * heads * D);
      pos[size_t(at)] = one_pos;
      const std::vector<float> dx = run(gy, pos, heads, table);
      ASSERT_BITWISE_EQ(dx.data() + at * heads * D, alone.data(), heads * D, DType::kF32);
    }
  }

  // Strided / in place / i32 / threads on one batch.
  const int64_t T = 33, ld = heads * D + 24;
  std::vector<float> gy = random_vec(T * heads * D, g);
  const std::vector<int64_t> pos = random_positions(T, P, g);
  const std::vector<float> ref = run(gy, pos, heads, table);
  EXPECT_TRUE(test::bitwise_equal(run(gy, pos, heads, table), ref));  // rerun

  Tensor wide(DType::kF32, {T, ld});
  test::poison(wide.data(), wide.nbytes());
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(wide.ptr<float>() + t * ld, gy.data() + t * heads * D, size_t(heads * D) * 4);
  TensorView gv = TensorView::contiguous(wide.data(), DType::kF32, {T, heads, D});
  gv.stride[0] = ld;
  Tensor p32(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) p32.ptr<int32_t>()[t] = int32_t(pos[size_t(t)]);
  Tensor dwide = test::poisoned(DType::kF32, {T, ld});
  TensorView dv = gv;
  dv.data = dwide.data();
  cpu::rope_backward(gv, p32.view(), table, dv);
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(dwide.ptr<float>() + t * ld, ref.data() + t * heads * D, heads * D,
                      DType::kF32);
    for (int64_t j = heads * D; j < ld; ++j)  // the gaps between rows are untouched
      ASSERT_EQ(f32_bits(dwide.ptr<float>()[t * ld + j]), 0xA5A5A5A5u);
  }
  cpu::rope_backward(gv, p32.view(), table, gv);  // in place
  for (int64_t t = 0; t < T; ++t)
    ASSERT_BITWISE_EQ(wide.ptr<float>() + t * ld, ref.data() + t * heads * D, heads * D,
                      DType::kF32);

  const int saved = num_threads();
  for (int n : {1, 3}) {
    set_num_threads(n);
    EXPECT_TRUE(test::bitwise_equal(run(gy, pos, heads, table), ref)) << n << " threads";
  }
  set_num_threads(saved);
}

// IEEE results through the formula, NaN stored canonically, subnormals kept. Position 0 has
// cos = 1, sin = +0: a = inf gives dx_i = inf + b·0 = inf, dx_{i+D/2} = b − inf·0 = NaN.
TEST(RopeBackward, SpecialValues) {
  const int64_t D = 8, half = 4;
  const RopeTable table = make_table(D, 16);
  const float inf = INFINITY, nan = std::nanf(""), sub = 0x1p-140f;
  // Pairs (a, b) at position 0 and position 3.
  const std::vector<float> as = {inf, -0.0f, sub, nan}, bs = {1.0f, -0.0f, 0.0f, 2.0f};
  std::vector<float> gy(2 * D);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t i = 0; i < half; ++i) {
      gy[size_t(t * D + i)] = as[size_t(i)];
      gy[size_t(t * D + i + half)] = bs[size_t(i)];
    }
  const std::vector<int64_t> pos = {0, 3};
  const std::vector<float> dx = run(gy, pos, 1, table);
  EXPECT_TRUE(test::bitwise_equal(dx, stated(gy, pos, 1, table)));
  EXPECT_EQ(dx[0], inf);
  EXPECT_EQ(f32_bits(dx[half]), kCanonNanF32);     // 1 − inf·0
  EXPECT_EQ(f32_bits(dx[1]), 0x80000000u);         // −0·1 + −0·0 = −0
  EXPECT_EQ(f32_bits(dx[1 + half]), 0x00000000u);  // −0·1 − (−0·0) = +0
  EXPECT_EQ(dx[2], sub);                           // subnormal kept
  EXPECT_EQ(f32_bits(dx[3]), kCanonNanF32);        // NaN in a: both outputs
  EXPECT_EQ(f32_bits(dx[3 + half]), kCanonNanF32);
  for (int64_t i = 0; i < D; ++i)  // position 3: only the NaN pair is NaN
    EXPECT_EQ(std::isnan(dx[size_t(D + i)]), i == 3 || i == 3 + half) << i;
}

TEST(RopeBackward, Errors) {
  const int64_t T = 3, heads = 2, D = 8;
  const RopeTable table = make_table(D, 10);
  Tensor gy(DType::kF32, {T, heads, D}), dx = test::poisoned(DType::kF32, {T, heads, D});
  std::memset(gy.data(), 0, size_t(gy.nbytes()));
  Tensor pos = positions_i64({1, 2, 3});
  Tensor bad_pos = positions_i64({1, 10, 3});
  Tensor gy_bf(DType::kBF16, {T, heads, D});
  Tensor dx_small(DType::kF32, {T, heads, D - 2});
  Tensor pos_f(DType::kF32, {T});
  auto call = [&](const TensorView& a, const TensorView& p, const RopeTable& tb,
                  const TensorView& o) { cpu::rope_backward(a, p, tb, o); };
  test::expect_error([&] { call(gy_bf.view(), pos.view(), table, dx.view()); },
                     {"rope_backward", "gy"});
  test::expect_error([&] { call(gy.view(), pos_f.view(), table, dx.view()); },
                     {"rope_backward", "positions"});
  test::expect_error([&] { call(gy.view(), bad_pos.view(), table, dx.view()); },
                     {"rope_backward", "positions", "element 1", "10"});
  test::expect_error([&] { call(gy.view(), pos.view(), table, dx_small.view()); },
                     {"rope_backward", "dx"});
  TensorView shifted = gy.view();  // overlaps gy by all but one element
  shifted.data = gy.ptr<float>() + 1;
  shifted.shape[0] = T - 1;
  TensorView gy2 = gy.view();
  gy2.shape[0] = T - 1;
  Tensor pos2 = positions_i64({1, 2});
  test::expect_error([&] { call(gy2, pos2.view(), table, shifted); }, {"rope_backward", "dx"});
  RopeTable broken = table;
  broken.sin.pop_back();
  test::expect_error([&] { call(gy.view(), pos.view(), broken, dx.view()); },
                     {"rope_backward", "table"});
  // Nothing was written by any failing call.
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(f32_bits(dx.ptr<float>()[i]), 0xA5A5A5A5u);
  // T = 0 does nothing.
  Tensor e(DType::kF32, {0, heads, D});
  Tensor pe(DType::kI64, {0});
  call(e.view(), pe.view(), table, e.view());
}

}  // namespace
}  // namespace lockstep
