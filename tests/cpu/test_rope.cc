// RoPE: the table (host double -> fp32, hash, printing), the rotation re-implemented from the
// stated formula, strided q/k views inside a qkv buffer, i32 vs i64 positions, fp64 accuracy,
// specials, errors. Token invariance, threads and determinism: the op-case table's RoPE cases
// (tests/ops, tests/cpu/test_op_cases.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "lockstep/ops/rope.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::f;

RopeConfig small_config(int64_t D = 128, int64_t P = 4096) {
  RopeConfig c;
  c.head_dim = D;
  c.theta = 1e6;
  c.max_positions = P;
  return c;
}

Tensor positions_i64(const std::vector<int64_t>& p) {
  Tensor t(DType::kI64, {int64_t(p.size())});
  std::copy(p.begin(), p.end(), t.ptr<int64_t>());
  return t;
}

bf16 canon(float v) { return std::isnan(v) ? bf16{test::kCanonNan} : f32_to_bf16(v); }

TEST(RopeTable, HostDoubleRoundedToFp32) {
  const RopeConfig cfg = small_config(128, 40960);
  const RopeTable t = RopeTable::build(cfg);
  const int64_t half = 64;
  ASSERT_EQ(int64_t(t.cos.size()), cfg.max_positions * half);
  // Position 0: cos 1, sin +0 exactly.
  for (int64_t i = 0; i < half; ++i) {
    EXPECT_EQ(t.cos[size_t(i)], 1.0f);
    EXPECT_EQ(f32_bits(t.sin[size_t(i)]), 0u);
  }
  // i = 0 has inv_freq 1: angle = pos.
  EXPECT_EQ(t.cos[size_t(1 * half)], float(std::cos(1.0)));
  EXPECT_EQ(t.sin[size_t(1 * half)], float(std::sin(1.0)));
  // Every entry is the fp32 rounding of cos/sin of the contract's double angle: within half an
  // fp32 ulp (+ slack for the double libm) of long-double cos/sin of that same angle. Against the
  // ideal angle (long double throughout) the error is absolute: cos/sin are ill-conditioned near
  // their zeros at large angles, where the double angle's own rounding (~pos * 2^-53) dominates.
  auto g = test::rng(1);
  std::uniform_int_distribution<int64_t> pick(0, cfg.max_positions * half - 1);
  double worst = 0, worst_abs = 0;
  for (int n = 0; n < 20000; ++n) {
    const int64_t e = pick(g), p = e / half, i = e % half;
    const double ang = double(p) * (1.0 / std::pow(cfg.theta, double(2 * i) / 128.0));
    const long double c = std::cos((long double)ang), s = std::sin((long double)ang);
    const double ulp_c = std::ldexp(1.0, std::ilogb(std::max(std::fabs(double(c)), 1e-30)) - 23);
    const double ulp_s = std::ldexp(1.0, std::ilogb(std::max(std::fabs(double(s)), 1e-30)) - 23);
    worst = std::max(worst, double(std::fabs(t.cos[size_t(e)] - c)) / ulp_c);
    worst = std::max(worst, double(std::fabs(t.sin[size_t(e)] - s)) / ulp_s);
    const long double ideal =
        (long double)p / std::pow((long double)cfg.theta, (long double)(2 * i) / 128.0L);
    worst_abs = std::max(worst_abs, double(std::fabs(t.cos[size_t(e)] - std::cos(ideal))));
    worst_abs = std::max(worst_abs, double(std::fabs(t.sin[size_t(e)] - std::sin(ideal))));
  }
  EXPECT_LE(worst, 0.5 + 1e-3);
  EXPECT_LE(worst_abs, 0x1p-24);
  std::printf("[rope] table max abs error vs long-double ideal angle: %.3g\n", worst_abs);
  std::printf("[rope] table max error vs long-double cos/sin of the double angle: %.4f fp32 ulp\n",
              worst);
}

TEST(RopeTable, PrintsConfigAndHash) {
  const RopeTable a = RopeTable::build(small_config(64, 100));
  const RopeTable b = RopeTable::build(small_config(64, 100));
  RopeConfig c2 = small_config(64, 100);
  c2.theta = 10000;
  const RopeTable c = RopeTable::build(c2);
  EXPECT_EQ(a.to_string(), b.to_string());
  EXPECT_NE(a.hash(), c.hash());
  EXPECT_NE(a.to_string().find("rope: head_dim=64 theta=1000000 max_positions=100 table_fnv1a=0x"),
            std::string::npos)
      << a.to_string();
  EXPECT_EQ(a.cos_view().shape_string(), "[100, 32]");
  RopeConfig bad = small_config(63, 10);
  test::expect_error([&] { RopeTable::build(bad); }, {"head_dim", "63"});
  bad = small_config(64, 0);
  test::expect_error([&] { RopeTable::build(bad); }, {"max_positions"});
  bad = small_config(64, 10);
  bad.theta = -1;
  test::expect_error([&] { RopeTable::build(bad); }, {"theta"});
}

// The stated per-element arithmetic, written out: separate fp32 products, one sum, one rounding.
TEST(Rope, MatchesTheStatedFormula) {
  for (int64_t D : {2, 64, 128, 136}) {
    const RopeTable table = RopeTable::build(small_config(D, 512));
    const int64_t T = 7, heads = 3, half = D / 2;
    auto g = test::rng(10 + uint64_t(D));
    Tensor x = test::random_bf16({T, heads, D}, g, 2.0f);
    std::vector<int64_t> pos = {0, 1, 2, 511, 300, 17, 255};
    Tensor p = positions_i64(pos);
    Tensor y = test::poisoned(DType::kBF16, {T, heads, D});
    cpu::rope(x.view(), p.view(), table, y.view());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const bf16* xr = x.ptr<bf16>() + (t * heads + h) * D;
        const bf16* yr = y.ptr<bf16>() + (t * heads + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const float c = table.cos[size_t(pos[size_t(t)] * half + i)];
          const float s = table.sin[size_t(pos[size_t(t)] * half + i)];
          const float a = f(xr[i]), b = f(xr[i + half]);
          const float p1 = a * c, p2 = b * s, p3 = b * c, p4 = a * s;
          ASSERT_EQ(yr[i].bits, canon(p1 - p2).bits) << "D=" << D << " t=" << t << " i=" << i;
          ASSERT_EQ(yr[i + half].bits, canon(p3 + p4).bits) << "D=" << D << " t=" << t;
        }
      }
    }
  }
}

// q and k as strided views inside a fused qkv buffer, in place, with i32 positions: same bits as
// contiguous copies with i64 positions; v is untouched.
TEST(Rope, StridedInPlaceAndI32PositionsEqualContiguous) {
  const int64_t T = 17, Hq = 4, Hkv = 2, D = 64, W = (Hq + 2 * Hkv) * D;
  const RopeTable table = RopeTable::build(small_config(D, 1000));
  auto g = test::rng(4);
  Tensor qkv = test::random_bf16({T, W}, g);
  Tensor orig(DType::kBF16, {T, W});
  std::memcpy(orig.data(), qkv.data(), size_t(qkv.nbytes()));
  std::vector<int64_t> pos(static_cast<size_t>(T));
  std::uniform_int_distribution<int64_t> pd(0, 999);
  for (auto& p : pos) p = pd(g);
  Tensor p64 = positions_i64(pos);
  Tensor p32(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) p32.ptr<int32_t>()[t] = int32_t(pos[size_t(t)]);

  TensorView q = TensorView::contiguous(qkv.data(), DType::kBF16, {T, Hq, D});
  q.stride[0] = W;
  TensorView k = q;
  k.shape[1] = Hkv;
  k.data = qkv.ptr<bf16>() + Hq * D;
  cpu::rope(q, p32.view(), table, q);
  cpu::rope(k, p32.view(), table, k);

  Tensor cq(DType::kBF16, {T, Hq, D}), ck(DType::kBF16, {T, Hkv, D});
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(cq.ptr<bf16>() + t * Hq * D, orig.ptr<bf16>() + t * W, size_t(Hq * D) * 2);
    std::memcpy(ck.ptr<bf16>() + t * Hkv * D, orig.ptr<bf16>() + t * W + Hq * D,
                size_t(Hkv * D) * 2);
  }
  Tensor yq = test::poisoned(DType::kBF16, {T, Hq, D}),
         yk = test::poisoned(DType::kBF16, {T, Hkv, D});
  cpu::rope(cq.view(), p64.view(), table, yq.view());
  cpu::rope(ck.view(), p64.view(), table, yk.view());
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(qkv.ptr<bf16>() + t * W, yq.ptr<bf16>() + t * Hq * D, Hq * D, DType::kBF16);
    ASSERT_BITWISE_EQ(qkv.ptr<bf16>() + t * W + Hq * D, yk.ptr<bf16>() + t * Hkv * D, Hkv * D,
                      DType::kBF16);
    ASSERT_BITWISE_EQ(qkv.ptr<bf16>() + t * W + (Hq + Hkv) * D,
                      orig.ptr<bf16>() + t * W + (Hq + Hkv) * D, Hkv * D, DType::kBF16);
  }
  // Strided positions (every other element of a longer array).
  Tensor p2(DType::kI64, {2 * T});
  for (int64_t t = 0; t < T; ++t) {
    p2.ptr<int64_t>()[2 * t] = pos[size_t(t)];
    p2.ptr<int64_t>()[2 * t + 1] = -5;
  }
  TensorView ps = TensorView::contiguous(p2.data(), DType::kI64, {T});
  ps.stride[0] = 2;
  Tensor yq2 = test::poisoned(DType::kBF16, {T, Hq, D});
  cpu::rope(cq.view(), ps, table, yq2.view());
  EXPECT_BITWISE_EQ(yq2.data(), yq.data(), T * Hq * D, DType::kBF16);
}

// fp64 oracle with exact cos/sin: one bf16 rounding (half an ulp of the result) plus the fp32
// table/arithmetic error (a few 2^-24 of |a| + |b|, which matters under cancellation).
// Tolerance: |y - ref| <= 2^-8 |ref| + 2^-20 (|a| + |b|).
TEST(Rope, AccuracyVsFp64Oracle) {
  const int64_t D = 128, half = 64, T = 64, heads = 2, P = 40960;
  const RopeTable table = RopeTable::build(small_config(D, P));
  auto g = test::rng(6);
  Tensor x = test::random_bf16({T, heads, D}, g, 3.0f);
  std::vector<int64_t> pos(static_cast<size_t>(T));
  std::uniform_int_distribution<int64_t> pd(0, P - 1);
  for (auto& p : pos) p = pd(g);
  Tensor p = positions_i64(pos);
  Tensor y = test::poisoned(DType::kBF16, {T, heads, D});
  cpu::rope(x.view(), p.view(), table, y.view());
  double worst_ulps = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const bf16* xr = x.ptr<bf16>() + (t * heads + h) * D;
      const bf16* yr = y.ptr<bf16>() + (t * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const double ang = double(pos[size_t(t)]) / std::pow(1e6, double(2 * i) / double(D));
        const double c = std::cos(ang), s = std::sin(ang);
        const double a = f(xr[i]), b = f(xr[i + half]);
        const double r1 = a * c - b * s, r2 = b * c + a * s;
        const double tol_abs = 0x1p-20 * (std::fabs(a) + std::fabs(b));
        ASSERT_LE(std::fabs(f(yr[i]) - r1), 0x1p-8 * std::fabs(r1) + tol_abs) << t << " " << i;
        ASSERT_LE(std::fabs(f(yr[i + half]) - r2), 0x1p-8 * std::fabs(r2) + tol_abs)
            << t << " " << i;
        if (std::fabs(r1) > 1e-3) worst_ulps = std::max(worst_ulps, test::bf16_ulps(f(yr[i]), r1));
      }
    }
  }
  std::printf("[rope] max error vs fp64 (|ref| > 1e-3): %.3f bf16 ulp\n", worst_ulps);
}

// IEEE results, NaN stored canonically: a NaN in x_i poisons both y_i and y_{i+D/2}; inf at
// position 0 (sin = +0) gives y_i = inf and y_{i+D/2} = NaN (inf * 0).
TEST(Rope, NanAndInfInputs) {
  const int64_t D = 8;
  const RopeTable table = RopeTable::build(small_config(D, 16));
  auto g = test::rng(7);
  Tensor x = test::random_bf16({2, 1, D}, g);
  x.ptr<bf16>()[1] = bf16{0xffc1};               // token 0: NaN at i = 1
  x.ptr<bf16>()[D + 2] = f32_to_bf16(INFINITY);  // token 1: inf at i = 2
  Tensor p = positions_i64({5, 0});
  Tensor y = test::poisoned(DType::kBF16, {2, 1, D});
  cpu::rope(x.view(), p.view(), table, y.view());
  const bf16* yy = y.ptr<bf16>();
  EXPECT_EQ(yy[1].bits, test::kCanonNan);
  EXPECT_EQ(yy[1 + 4].bits, test::kCanonNan);
  EXPECT_FALSE(test::is_nan(yy[0]));
  EXPECT_EQ(yy[D + 2].bits, 0x7f80);
  EXPECT_EQ(yy[D + 2 + 4].bits, test::kCanonNan);
  EXPECT_EQ(yy[D + 3].bits, x.ptr<bf16>()[D + 3].bits);  // position 0 is the identity
}

TEST(Rope, BadInputsThrowNamingTheArgument) {
  const int64_t T = 3, heads = 2, D = 64;
  const RopeTable table = RopeTable::build(small_config(D, 100));
  auto g = test::rng(8);
  Tensor x = test::random_bf16({T, heads, D}, g);
  Tensor y(DType::kBF16, {T, heads, D});
  Tensor p = positions_i64({0, 100, 5});
  test::expect_error([&] { cpu::rope(x.view(), p.view(), table, y.view()); },
                     {"rope", "'positions'", "element 1", "= 100", "[0, 100)"});
  Tensor pn = positions_i64({0, 1, -1});
  test::expect_error([&] { cpu::rope(x.view(), pn.view(), table, y.view()); },
                     {"'positions'", "element 2", "= -1"});
  // Nothing was written when the check failed.
  Tensor yp = test::poisoned(DType::kBF16, {T, heads, D});
  Tensor yp0 = test::poisoned(DType::kBF16, {T, heads, D});
  EXPECT_THROW(cpu::rope(x.view(), p.view(), table, yp.view()), Error);
  EXPECT_BITWISE_EQ(yp.data(), yp0.data(), T * heads * D, DType::kBF16);

  Tensor ok = positions_i64({0, 1, 2});
  Tensor pf(DType::kF32, {T});
  test::expect_error([&] { cpu::rope(x.view(), pf.view(), table, y.view()); },
                     {"'positions'", "i32 or i64", "f32"});
  Tensor pshort = positions_i64({0, 1});
  test::expect_error([&] { cpu::rope(x.view(), pshort.view(), table, y.view()); },
                     {"'positions'", "[2]"});
  Tensor x128 = test::random_bf16({T, heads, 128}, g);
  test::expect_error([&] { cpu::rope(x128.view(), ok.view(), table, y.view()); },
                     {"'x'", "[*, *, 64]", "[3, 2, 128]"});
  Tensor x2 = test::random_bf16({T, D}, g);
  test::expect_error([&] { cpu::rope(x2.view(), ok.view(), table, y.view()); }, {"'x'"});
  Tensor yb(DType::kBF16, {T, heads + 1, D});
  test::expect_error([&] { cpu::rope(x.view(), ok.view(), table, yb.view()); }, {"'y'"});
  TensorView xs = x.view();
  xs.stride[2] = 2;
  test::expect_error([&] { cpu::rope(xs, ok.view(), table, y.view()); }, {"'x'", "stride 1"});
  RopeTable broken = table;
  broken.sin.pop_back();
  test::expect_error([&] { cpu::rope(x.view(), ok.view(), broken, y.view()); }, {"'table'"});
  // Empty batch is fine.
  Tensor xe(DType::kBF16, {0, heads, D}), ye(DType::kBF16, {0, heads, D});
  Tensor pe(DType::kI64, {0});
  EXPECT_NO_THROW(cpu::rope(xe.view(), pe.view(), table, ye.view()));
}

}  // namespace
}  // namespace lockstep
