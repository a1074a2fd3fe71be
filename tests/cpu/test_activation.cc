// SiLU-and-mul: the stated formula over EVERY bf16 gate value, large-|g| and special values,
// fused [T, 2I] layout == separate gate/up views, fp64 accuracy, argument errors. Row invariance,
// threads and determinism: the op-case table's SiLU cases (tests/ops, tests/cpu/test_op_cases.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/math.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "lockstep/ops/activation.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::f;

// The contract, written out: four separate fp32 ops, one canonical-NaN rounding.
bf16 stated(bf16 gb, bf16 ub) {
  const float g = f(gb), u = f(ub);
  const float e = ls_expf(-g);
  const float d = 1.0f + e;
  const float s = g / d;
  const float o = s * u;
  return std::isnan(o) ? bf16{test::kCanonNan} : f32_to_bf16(o);
}

// Every one of the 65536 gate patterns against several up values (incl. +-0, +-inf, NaN).
TEST(SiluMul, MatchesTheStatedFormulaForEveryBf16Gate) {
  const std::vector<uint16_t> ups = {0x3f80, 0xbf80, 0x4049, 0x3c23, 0x0000, 0x8000,
                                     0x7f80, 0xff80, 0x0001, 0x7fc1, 0x5f00};
  const int64_t T = 256, I = 256;  // 65536 gates, one per element
  Tensor gate(DType::kBF16, {T, I}), up(DType::kBF16, {T, I});
  for (int64_t i = 0; i < T * I; ++i) gate.ptr<bf16>()[i] = bf16{uint16_t(i)};
  for (uint16_t u : ups) {
    for (int64_t i = 0; i < T * I; ++i) up.ptr<bf16>()[i] = bf16{u};
    Tensor out = test::poisoned(DType::kBF16, {T, I});
    cpu::silu_mul(gate.view(), up.view(), out.view());
    for (int64_t i = 0; i < T * I; ++i) {
      ASSERT_EQ(out.ptr<bf16>()[i].bits, stated(bf16{uint16_t(i)}, bf16{u}).bits)
          << "gate bits 0x" << std::hex << i << " up bits 0x" << u;
    }
  }
}

// Documented behaviour at the edges (see contract): exp overflow -> g / inf = -0; g = -inf -> NaN;
// g = +inf -> inf * u; NaN in -> canonical NaN out.
TEST(SiluMul, LargeMagnitudeAndSpecialValues) {
  auto one = [](float g, float u) {
    bf16 gb = f32_to_bf16(g), ub = f32_to_bf16(u), o;
    TensorView gv = TensorView::contiguous(&gb, DType::kBF16, {1, 1});
    TensorView uv = TensorView::contiguous(&ub, DType::kBF16, {1, 1});
    TensorView ov = TensorView::contiguous(&o, DType::kBF16, {1, 1});
    cpu::silu_mul(gv, uv, ov);
    return o.bits;
  };
  EXPECT_EQ(one(-100.0f, 1.0f), 0x8000);   // -100 / inf = -0, times +1
  EXPECT_EQ(one(-100.0f, -1.0f), 0x0000);  // -0 * -1 = +0
  EXPECT_EQ(one(-3e38f, 2.0f), 0x8000);
  EXPECT_EQ(one(100.0f, 3.0f), f32_to_bf16(300.0f).bits);  // e^-100 tiny: s = g exactly
  EXPECT_EQ(one(INFINITY, 2.0f), 0x7f80);
  EXPECT_EQ(one(INFINITY, 0.0f), test::kCanonNan);   // inf * 0
  EXPECT_EQ(one(-INFINITY, 1.0f), test::kCanonNan);  // -inf / inf, as PyTorch's silu
  EXPECT_EQ(one(NAN, 1.0f), test::kCanonNan);
  EXPECT_EQ(one(1.0f, NAN), test::kCanonNan);
  EXPECT_EQ(one(0.0f, 5.0f), 0x0000);
  EXPECT_EQ(one(-0.0f, 5.0f), 0x8000);  // -0 / 2 = -0
  // Between: -80 is still finite (e^80 < FLT_MAX): a tiny negative, rounded once.
  const float s80 = -80.0f / (1.0f + ls_expf(80.0f));
  EXPECT_EQ(one(-80.0f, 1.0f), f32_to_bf16(s80).bits);
  EXPECT_LT(s80, 0.0f);
  // The product can overflow bf16 after the rounding: 3e38 * 3 -> inf.
  EXPECT_EQ(one(3e38f, 3.0f), 0x7f80);
}

// Fused [T, 2I] layout and separate strided views give the same bits; in place works.
TEST(SiluMul, FusedLayoutEqualsSeparateViews) {
  for (int64_t I : {1, 3, 17, 111, 1000}) {
    const int64_t T = 19;
    auto g = test::rng(10 + uint64_t(I));
    Tensor gu = test::random_bf16({T, 2 * I}, g, 4.0f);
    Tensor gate(DType::kBF16, {T, I}), up(DType::kBF16, {T, I});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < I; ++i) {
        gate.ptr<bf16>()[t * I + i] = gu.ptr<bf16>()[t * 2 * I + i];
        up.ptr<bf16>()[t * I + i] = gu.ptr<bf16>()[t * 2 * I + I + i];
      }
    }
    Tensor a = test::poisoned(DType::kBF16, {T, I}), b = test::poisoned(DType::kBF16, {T, I});
    cpu::silu_and_mul(gu.view(), a.view());
    cpu::silu_mul(gate.view(), up.view(), b.view());
    ASSERT_BITWISE_EQ(a.data(), b.data(), T * I, DType::kBF16) << "I=" << I;
    for (int64_t i = 0; i < T * I; ++i) {
      ASSERT_EQ(b.ptr<bf16>()[i].bits, stated(gate.ptr<bf16>()[i], up.ptr<bf16>()[i]).bits);
    }
    // Output into a strided buffer, and in place over the gate half of gate_up.
    const int64_t ld = 2 * I + 5;
    Tensor ob = test::poisoned(DType::kBF16, {T, ld});
    cpu::silu_and_mul(gu.view(), test::strided_view(ob, T, I, ld, 2));
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_BITWISE_EQ(ob.ptr<bf16>() + t * ld + 2, a.ptr<bf16>() + t * I, I, DType::kBF16);
    }
    TensorView gate_half = test::strided_view(gu, T, I, 2 * I, 0);
    cpu::silu_and_mul(gu.view(), gate_half);
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_BITWISE_EQ(gu.ptr<bf16>() + t * 2 * I, a.ptr<bf16>() + t * I, I, DType::kBF16);
    }
  }
}

// fp64 oracle g / (1 + e^-g) * u: one bf16 rounding of an fp32 value within a few fp32 ulp
// (ls_expf < 1 ulp, then +, /, *): tolerance 2^-8 (1 + 2^-10) |ref| (half a bf16 ulp + slack).
TEST(SiluMul, AccuracyVsFp64Oracle) {
  const int64_t T = 64, I = 4096;
  auto g = test::rng(30);
  Tensor x = test::random_bf16({T, 2 * I}, g, 4.0f);
  Tensor y = test::poisoned(DType::kBF16, {T, I});
  cpu::silu_and_mul(x.view(), y.view());
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      const double gg = f(x.ptr<bf16>()[t * 2 * I + i]), u = f(x.ptr<bf16>()[t * 2 * I + I + i]);
      const double ref = gg / (1.0 + std::exp(-gg)) * u;
      const double got = f(y.ptr<bf16>()[t * I + i]);
      ASSERT_LE(std::fabs(got - ref), 0x1p-8 * (1 + 0x1p-10) * std::fabs(ref))
          << "g=" << gg << " u=" << u << " got " << got << " ref " << ref;
      worst = std::max(worst, test::bf16_ulps(float(got), ref));
    }
  }
  std::printf("[silu_mul] max error vs fp64 (random): %.4f bf16 ulp\n", worst);

  // Every finite bf16 gate with up = 1. Where e^-g overflows fp32 (g < -88.72) the result is -0
  // while the true silu is below 2^-120 in magnitude; results in the bf16 subnormal range carry an
  // absolute error of at most half a subnormal ulp (2^-134) plus slack.
  double worst_all = 0;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const bf16 gb{uint16_t(bits)};
    const double gg = f(gb);
    if (!std::isfinite(gg)) continue;
    bf16 o, ub = f32_to_bf16(1.0f);
    cpu::silu_mul(TensorView::contiguous(const_cast<bf16*>(&gb), DType::kBF16, {1, 1}),
                  TensorView::contiguous(&ub, DType::kBF16, {1, 1}),
                  TensorView::contiguous(&o, DType::kBF16, {1, 1}));
    const double ref = gg / (1.0 + std::exp(-gg));
    const double got = f(o);
    if (gg < -88.72) {
      ASSERT_EQ(o.bits, 0x8000) << "g=" << gg;
      ASSERT_LT(std::fabs(ref), 0x1p-120) << "g=" << gg;
    } else if (std::fabs(ref) < 0x1p-126) {
      ASSERT_LE(std::fabs(got - ref), 0x1p-134 * 1.01) << "g=" << gg;
    } else {
      ASSERT_LE(std::fabs(got - ref), 0x1p-8 * (1 + 0x1p-10) * std::fabs(ref)) << "g=" << gg;
      worst_all = std::max(worst_all, test::bf16_ulps(float(got), ref));
    }
  }
  std::printf("[silu_mul] max error vs fp64 (every bf16 gate): %.4f bf16 ulp\n", worst_all);
}

TEST(SiluMul, BadInputsThrowNamingTheArgument) {
  const int64_t T = 4, I = 8;
  Tensor gu(DType::kBF16, {T, 2 * I}), out(DType::kBF16, {T, I});
  Tensor odd(DType::kBF16, {T, 2 * I + 1});
  test::expect_error([&] { cpu::silu_and_mul(odd.view(), out.view()); },
                     {"silu_and_mul", "'gate_up'", "[T, 2I]", "[4, 17]"});
  Tensor out2(DType::kBF16, {T, I + 1});
  test::expect_error([&] { cpu::silu_and_mul(gu.view(), out2.view()); }, {"'out'", "[4, 8]"});
  Tensor f32(DType::kF32, {T, 2 * I});
  test::expect_error([&] { cpu::silu_and_mul(f32.view(), out.view()); },
                     {"'gate_up'", "bf16", "f32"});
  Tensor gate(DType::kBF16, {T, I}), up(DType::kBF16, {T + 1, I});
  test::expect_error([&] { cpu::silu_mul(gate.view(), up.view(), out.view()); },
                     {"silu_mul", "'up'"});
  TensorView gs = gate.view();
  gs.stride[1] = 2;
  gs.shape[1] = I / 2;
  Tensor out3(DType::kBF16, {T, I / 2});
  test::expect_error([&] { cpu::silu_mul(gs, gs, out3.view()); }, {"'gate'", "stride 1"});
  Tensor g0(DType::kBF16, {T, 0});
  test::expect_error([&] { cpu::silu_mul(g0.view(), g0.view(), g0.view()); }, {"'gate'", ">= 1"});
  Tensor e(DType::kBF16, {0, 2 * I}), eo(DType::kBF16, {0, I});
  EXPECT_NO_THROW(cpu::silu_and_mul(e.view(), eo.view()));
}

}  // namespace
}  // namespace lockstep
