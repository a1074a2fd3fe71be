// SiLU-and-mul backward (docs/contract.md §B.6): the stated formula over every bf16 gate value,
// the fp64 derivative (accuracy) and a finite-difference check of that oracle, a row alone vs
// inside batches (bitwise), strided views, threads, determinism, special values, poisoned outputs
// and argument errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/math.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "lockstep/ops/backward.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::f;
constexpr uint32_t kCanonNanF32 = 0x7FC00000u;

float canon(float v) { return std::isnan(v) ? f32_from_bits(kCanonNanF32) : v; }

// §B.6 written out from its text, each step one fp32 op.
void stated(bf16 gb, bf16 ub, float ga, float* dg, float* du) {
  const float g = f(gb), u = f(ub);
  const float e = ls_expf(-g);
  const float d = 1.0f + e;
  const float s = g / d;
  const float sigma = 1.0f / d;
  *du = canon(ga * s);
  const float gs = ga * u;
  const float one_minus = 1.0f - sigma;
  const float inner = 1.0f + g * one_minus;
  *dg = canon(gs * (sigma * inner));
}

// The fp64 oracle: silu(g) = g·σ(g), silu'(g) = σ(g)·(1 + g·(1 − σ(g))).
double sigma64(double g) { return 1.0 / (1.0 + std::exp(-g)); }
double silu64(double g) { return g * sigma64(g); }
double dsilu64(double g) {
  const double s = sigma64(g);
  return s * (1.0 + g * (1.0 - s));
}

// gate_up [T, 2I] bf16 and ga [T, I] f32, contiguous; returns dgu [T, 2I].
std::vector<float> run(const Tensor& gate_up, const Tensor& ga) {
  const int64_t T = gate_up.shape()[0], I2 = gate_up.shape()[1];
  Tensor dgu = test::poisoned(DType::kF32, {T, I2});
  cpu::silu_mul_backward(gate_up.view(), ga.view(), dgu.view());
  return std::vector<float>(dgu.ptr<float>(), dgu.ptr<float>() + T * I2);
}

// Every one of the 65536 gate patterns, against up values including ±0, ±inf, NaN, subnormal,
// and ga values including 0, subnormal and inf.
TEST(SiluMulBackward, MatchesTheStatedFormulaForEveryBf16Gate) {
  const std::vector<uint16_t> ups = {0x3f80, 0xbf80, 0x4049, 0x0000,
                                     0x8000, 0x7f80, 0x0001, 0x7fc1};
  const std::vector<float> gas = {1.0f, -0.3f, 0.0f, 0x1p-140f, INFINITY};
  const int64_t T = 256, I = 256;
  Tensor gu(DType::kBF16, {T, 2 * I});
  Tensor ga(DType::kF32, {T, I});
  for (uint16_t u : ups)
    for (float gv : gas) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < I; ++i) {
          gu.ptr<bf16>()[t * 2 * I + i] = bf16{uint16_t(t * I + i)};
          gu.ptr<bf16>()[t * 2 * I + I + i] = bf16{u};
          ga.ptr<float>()[t * I + i] = gv;
        }
      const std::vector<float> out = run(gu, ga);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < I; ++i) {
          float dg, du;
          stated(bf16{uint16_t(t * I + i)}, bf16{u}, gv, &dg, &du);
          ASSERT_EQ(f32_bits(out[size_t(t * 2 * I + i)]), f32_bits(dg))
              << "dg: gate bits 0x" << std::hex << t * I + i << " up 0x" << u << " ga " << gv;
          ASSERT_EQ(f32_bits(out[size_t(t * 2 * I + I + i)]), f32_bits(du))
              << "du: gate bits 0x" << std::hex << t * I + i << " up 0x" << u << " ga " << gv;
        }
    }
}

// The fp64 oracle's derivative against central differences of the fp64 forward
// silu(g)·u·ga (in g and in u): relative 1e-7 (h = 1e-5·max(1, |g|): truncation ~h², rounding
// ~1e-16/h).
TEST(SiluMulBackward, OracleMatchesFiniteDifferences) {
  auto g = test::rng(3);
  std::uniform_real_distribution<double> gd(-30.0, 30.0), ud(-4.0, 4.0);
  double worst = 0;
  for (int n = 0; n < 20000; ++n) {
    const double x = n < 200 ? -10.0 + 0.1 * n : gd(g), u = ud(g), ga = ud(g);
    const double h = 1e-5 * std::max(1.0, std::fabs(x));
    auto fwd = [&](double gg, double uu) { return ga * silu64(gg) * uu; };
    const double fd_g = (fwd(x + h, u) - fwd(x - h, u)) / (2 * h);
    const double fd_u = (fwd(x, u + h) - fwd(x, u - h)) / (2 * h);
    const double an_g = ga * u * dsilu64(x), an_u = ga * silu64(x);
    const double scale_g = std::fabs(ga * u) * std::max(1.0, std::fabs(x)) + 1e-300;
    const double scale_u = std::fabs(ga) * std::max(1.0, std::fabs(x)) + 1e-300;
    const double eg = std::fabs(fd_g - an_g) / scale_g, eu = std::fabs(fd_u - an_u) / scale_u;
    worst = std::max({worst, eg, eu});
    ASSERT_LE(eg, 1e-7) << "g=" << x << " fd " << fd_g << " analytic " << an_g;
    ASSERT_LE(eu, 1e-7) << "g=" << x << " fd " << fd_u << " analytic " << an_u;
  }
  std::printf("[silu_mul_backward] oracle vs central differences: max scaled error %.3g\n", worst);
}

// Every finite bf16 gate with |g| <= 80 (beyond, s and σ are below 2^-110), random u and ga.
// du = ga·s: a few fp32 roundings, |du − ref| <= 2^-21·|ref|.
// dg: σ carries ~2^-23 absolute error, which 1 − σ and g·(1 − σ) turn into an absolute error
// ~|g|·2^-23 of (1 + g·(1 − σ)); so |dg − ref| <= 2^-21·|ref| + 2^-21·|ga·u|·σ·(1 + |g|).
TEST(SiluMulBackward, AccuracyVsFp64Oracle) {
  auto g = test::rng(4);
  std::vector<bf16> gates;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = f(bf16{uint16_t(b)});
    if (std::isfinite(v) && std::fabs(v) <= 80.0f) gates.push_back(bf16{uint16_t(b)});
  }
  const int64_t I = 512, T = (int64_t(gates.size()) + I - 1) / I;
  Tensor gu(DType::kBF16, {T, 2 * I});
  Tensor ga = test::random_f32({T, I}, g);
  test::fill_bf16(gu.ptr<bf16>(), T * 2 * I, g, 2.0f);
  for (size_t k = 0; k < gates.size(); ++k)
    gu.ptr<bf16>()[int64_t(k) / I * 2 * I + int64_t(k) % I] = gates[k];
  const std::vector<float> out = run(gu, ga);
  double worst_du = 0, worst_dg = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      const double x = f(gu.ptr<bf16>()[t * 2 * I + i]), u = f(gu.ptr<bf16>()[t * 2 * I + I + i]);
      const double gr = ga.ptr<float>()[t * I + i];
      const double du_ref = gr * silu64(x), dg_ref = gr * u * dsilu64(x);
      const double du = out[size_t(t * 2 * I + I + i)], dg = out[size_t(t * 2 * I + i)];
      const double slack = 0x1p-21 * std::fabs(gr * u) * sigma64(x) * (1 + std::fabs(x));
      ASSERT_LE(std::fabs(du - du_ref), 0x1p-21 * std::fabs(du_ref) + 0x1p-140) << "g=" << x;
      ASSERT_LE(std::fabs(dg - dg_ref), 0x1p-21 * std::fabs(dg_ref) + slack + 0x1p-140)
          << "g=" << x;
      if (std::fabs(du_ref) >= 0x1p-126)
        worst_du = std::max(worst_du, std::fabs(du - du_ref) / std::fabs(du_ref));
      const double sc = std::fabs(gr * u) * sigma64(x) * (1 + std::fabs(x));
      if (sc > 0) worst_dg = std::max(worst_dg, std::fabs(dg - dg_ref) / sc);
    }
  std::printf(
      "[silu_mul_backward] max |du - ref|/|ref| (normal results) = %.3g (%.2f x 2^-24); "
      "max |dg - ref| / (|ga u| sigma (1+|g|)) = %.3g (%.2f x 2^-24)\n",
      worst_du, worst_du * 0x1p24, worst_dg, worst_dg * 0x1p24);
}

// A row's gradients alone == inside batches of 1/3/17 other rows at other offsets with other
// contents; strided views (gate_up and ga inside wider rows, dgu inside a wider buffer, gaps
// untouched) == contiguous; threads 1 vs 3; reruns identical.
TEST(SiluMulBackward, InvariantToBatchLayoutThreadsAndReruns) {
  const int64_t I = 37;
  auto g = test::rng(5);
  Tensor one = test::random_bf16({1, 2 * I}, g, 3.0f);
  Tensor one_ga = test::random_f32({1, I}, g);
  const std::vector<float> alone = run(one, one_ga);
  for (int64_t others : {1, 3, 17}) {
    const int64_t T = others + 1;
    for (int64_t at : {int64_t(0), others / 2, others}) {
      Tensor gu = test::random_bf16({T, 2 * I}, g, 3.0f);
      Tensor ga = test::random_f32({T, I}, g);
      std::memcpy(gu.ptr<bf16>() + at * 2 * I, one.data(), size_t(one.nbytes()));
      std::memcpy(ga.ptr<float>() + at * I, one_ga.data(), size_t(one_ga.nbytes()));
      const std::vector<float> out = run(gu, ga);
      ASSERT_BITWISE_EQ(out.data() + at * 2 * I, alone.data(), 2 * I, DType::kF32);
    }
  }
  const int64_t T = 33, ldx = 2 * I + 6, ldg = I + 3, ldo = 2 * I + 10;
  Tensor gu = test::random_bf16({T, 2 * I}, g, 3.0f);
  Tensor ga = test::random_f32({T, I}, g);
  const std::vector<float> ref = run(gu, ga);
  EXPECT_TRUE(test::bitwise_equal(run(gu, ga), ref));  // rerun
  Tensor wx = test::random_bf16({T, ldx}, g), wg = test::random_f32({T, ldg}, g);
  Tensor wo = test::poisoned(DType::kF32, {T, ldo});
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(wx.ptr<bf16>() + t * ldx, gu.ptr<bf16>() + t * 2 * I, size_t(2 * I) * 2);
    std::memcpy(wg.ptr<float>() + t * ldg, ga.ptr<float>() + t * I, size_t(I) * 4);
  }
  TensorView xv = TensorView::contiguous(wx.data(), DType::kBF16, {T, 2 * I});
  xv.stride[0] = ldx;
  TensorView gv = TensorView::contiguous(wg.data(), DType::kF32, {T, I});
  gv.stride[0] = ldg;
  TensorView ov = TensorView::contiguous(wo.data(), DType::kF32, {T, 2 * I});
  ov.stride[0] = ldo;
  cpu::silu_mul_backward(xv, gv, ov);
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(wo.ptr<float>() + t * ldo, ref.data() + t * 2 * I, 2 * I, DType::kF32);
    for (int64_t j = 2 * I; j < ldo; ++j)
      ASSERT_EQ(f32_bits(wo.ptr<float>()[t * ldo + j]), 0xA5A5A5A5u);
  }
  const int saved = num_threads();
  for (int n : {1, 3}) {
    set_num_threads(n);
    EXPECT_TRUE(test::bitwise_equal(run(gu, ga), ref)) << n << " threads";
  }
  set_num_threads(saved);
}

// The documented edges (§B.6): g ≪ 0 gives σ = +0 and dg = ±0, du = ga·(−0); g = −inf: NaN in
// both; g = +inf: dg = (ga·u)·(1·(1 + inf·0)) = NaN, du = ga·inf; large positive g: σ = 1 and
// dg = ga·u exactly, du = ga·g; NaN stored as 0x7FC00000.
TEST(SiluMulBackward, LargeMagnitudeAndSpecialValues) {
  auto one = [](float gate, float up, float ga, float* dg, float* du) {
    bf16 in[2] = {f32_to_bf16(gate), f32_to_bf16(up)};
    float out[2];
    cpu::silu_mul_backward(TensorView::contiguous(in, DType::kBF16, {1, 2}),
                           TensorView::contiguous(&ga, DType::kF32, {1, 1}),
                           TensorView::contiguous(out, DType::kF32, {1, 2}));
    *dg = out[0];
    *du = out[1];
  };
  float dg, du;
  one(-100.0f, 1.0f, 1.0f, &dg, &du);
  EXPECT_EQ(f32_bits(dg), 0x80000000u);  // (1·1)·(+0·(1 − 100)) = −0
  EXPECT_EQ(f32_bits(du), 0x80000000u);  // 1·(−100/inf)
  one(-100.0f, -1.0f, 1.0f, &dg, &du);
  EXPECT_EQ(f32_bits(dg), 0x00000000u);
  one(-INFINITY, 1.0f, 1.0f, &dg, &du);
  EXPECT_EQ(f32_bits(dg), kCanonNanF32);
  EXPECT_EQ(f32_bits(du), kCanonNanF32);
  one(INFINITY, 2.0f, 1.0f, &dg, &du);
  EXPECT_EQ(f32_bits(dg), kCanonNanF32);
  EXPECT_EQ(du, INFINITY);
  one(100.0f, 3.0f, 0.5f, &dg, &du);
  EXPECT_EQ(dg, 1.5f);
  EXPECT_EQ(du, 50.0f);
  one(1.0f, std::nanf(""), 1.0f, &dg, &du);
  EXPECT_EQ(f32_bits(dg), kCanonNanF32);
  EXPECT_EQ(du, float(1.0f / (1.0f + ls_expf(-1.0f))));
  one(2.0f, 1.0f, std::nanf(""), &dg, &du);
  EXPECT_EQ(f32_bits(dg), kCanonNanF32);
  EXPECT_EQ(f32_bits(du), kCanonNanF32);
  one(0.0f, 1.0f, 1.0f, &dg, &du);  // silu'(0) = 1/2, silu(0) = 0
  EXPECT_EQ(dg, 0.5f);
  EXPECT_EQ(f32_bits(du), 0u);
  one(1.0f, 1.0f, 0x1p-140f, &dg, &du);  // subnormal gradients kept
  EXPECT_GT(dg, 0.0f);
  EXPECT_GT(du, 0.0f);
}

TEST(SiluMulBackward, Errors) {
  const int64_t T = 3, I = 4;
  Tensor gu(DType::kBF16, {T, 2 * I}), ga(DType::kF32, {T, I});
  std::memset(gu.data(), 0, size_t(gu.nbytes()));
  std::memset(ga.data(), 0, size_t(ga.nbytes()));
  Tensor out = test::poisoned(DType::kF32, {T, 2 * I});
  Tensor gu_odd(DType::kBF16, {T, 2 * I - 1}), gu_f32(DType::kF32, {T, 2 * I});
  Tensor ga_bad(DType::kF32, {T, I + 1}), ga_bf(DType::kBF16, {T, I});
  Tensor out_bf(DType::kBF16, {T, 2 * I}), out_short(DType::kF32, {T, I});
  auto call = [](const TensorView& a, const TensorView& b, const TensorView& c) {
    cpu::silu_mul_backward(a, b, c);
  };
  test::expect_error([&] { call(gu_odd.view(), ga.view(), out.view()); },
                     {"silu_mul_backward", "gate_up"});
  test::expect_error([&] { call(gu_f32.view(), ga.view(), out.view()); },
                     {"silu_mul_backward", "gate_up"});
  test::expect_error([&] { call(gu.view(), ga_bad.view(), out.view()); },
                     {"silu_mul_backward", "ga"});
  test::expect_error([&] { call(gu.view(), ga_bf.view(), out.view()); },
                     {"silu_mul_backward", "ga"});
  test::expect_error([&] { call(gu.view(), ga.view(), out_bf.view()); },
                     {"silu_mul_backward", "dgu"});
  test::expect_error([&] { call(gu.view(), ga.view(), out_short.view()); },
                     {"silu_mul_backward", "dgu"});
  // dgu overlapping ga: ga as the du half of dgu.
  TensorView alias = TensorView::contiguous(out.ptr<float>() + I, DType::kF32, {T, I});
  alias.stride[0] = 2 * I;
  test::expect_error([&] { call(gu.view(), alias, out.view()); },
                     {"silu_mul_backward", "dgu", "ga"});
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(f32_bits(out.ptr<float>()[i]), 0xA5A5A5A5u);
  Tensor e(DType::kBF16, {0, 2 * I}), eg(DType::kF32, {0, I}), eo(DType::kF32, {0, 2 * I});
  call(e.view(), eg.view(), eo.view());  // T = 0 does nothing
}

}  // namespace
}  // namespace lockstep
