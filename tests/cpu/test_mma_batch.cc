// cpu::mma_chain_rows_bf16 (src/cpu/mma_batch.cc) against the scalar chain mma_chain_bf16, bit
// for bit: random data over every routing class (extreme exponent spreads, ±0, ±inf, NaN,
// subnormals, tiny/huge/special c), n not a multiple of 16, k = 16 .. 256, strided rows, and
// targeted cases that fail if any one of the fast path's routing conditions is dropped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/mma_model.h"
#include "cpu/mma_batch.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

constexpr uint32_t kSentinel = 0x7fa5a5a5u;

bf16 bf16_pow2(int e, uint32_t mant = 0, bool neg = false) {  // normal: 2^e · 1.mant
  return bf16{uint16_t((neg ? 0x8000u : 0u) | (uint32_t(e + 127) << 7) | (mant & 0x7fu))};
}

// Runs the batched call and compares every output with the scalar chain; lanes past n untouched.
::testing::AssertionResult check(const std::vector<bf16>& a, const std::vector<bf16>& b,
                                 int64_t ldb, int64_t n, int64_t k, const float* c_in,
                                 const std::string& what) {
  std::vector<float> out(static_cast<size_t>(n + 3));
  for (auto& v : out) v = f32_from_bits(kSentinel);
  cpu::mma_chain_rows_bf16(a.data(), b.data(), ldb, n, k, c_in, out.data());
  for (int64_t j = 0; j < n; ++j) {
    const float want = mma_chain_bf16(a.data(), b.data() + j * ldb, k, c_in ? c_in[j] : 0.0f);
    if (f32_bits(want) != f32_bits(out[size_t(j)])) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    " n=%lld k=%lld ldb=%lld: output %lld is 0x%08x (%g), want 0x%08x (%g)",
                    (long long)n, (long long)k, (long long)ldb, (long long)j,
                    f32_bits(out[size_t(j)]), out[size_t(j)], f32_bits(want), want);
      return ::testing::AssertionFailure() << what << buf;
    }
  }
  for (int64_t j = n; j < n + 3; ++j) {
    if (f32_bits(out[size_t(j)]) != kSentinel)
      return ::testing::AssertionFailure() << what << ": wrote past n at " << j;
  }
  return ::testing::AssertionSuccess();
}

// One random element: exponent uniform in [elo, ehi], and with probability `odd` one of the
// classes the fast path does not model (or zeros).
bf16 random_elem(std::mt19937_64& g, int elo, int ehi, double odd) {
  std::uniform_int_distribution<int> ed(elo, ehi), md(0, 127), cls(0, 6);
  std::uniform_real_distribution<double> u(0, 1);
  const bool neg = g() & 1;
  const uint16_t s = neg ? 0x8000 : 0;
  if (u(g) < odd) {
    switch (cls(g)) {
      case 0:
        return bf16{s};  // ±0
      case 1:
        return bf16{uint16_t(s | 0x7f80)};  // ±inf
      case 2:
        return bf16{uint16_t(s | 0x7f80 | (1 + md(g) % 127))};  // NaN
      case 3:
        return bf16{uint16_t(s | (1 + md(g) % 127))};  // subnormal
      case 4:
        return bf16_pow2(std::uniform_int_distribution<int>(-126, 127)(g), md(g), neg);
      default:
        return bf16{s};
    }
  }
  return bf16_pow2(std::clamp(ed(g), -126, 127), md(g), neg);
}

float random_c(std::mt19937_64& g) {
  std::uniform_int_distribution<int> cls(0, 9);
  const uint32_t s = (g() & 1) ? 0x80000000u : 0u, m = uint32_t(g()) & 0x7fffffu;
  auto with_field = [&](int lo, int hi) {
    return f32_from_bits(s | (uint32_t(std::uniform_int_distribution<int>(lo, hi)(g)) << 23) | m);
  };
  switch (cls(g)) {
    case 0:
      return f32_from_bits(s);  // ±0
    case 1:
      return with_field(1, 30);  // tiny (around the 2^-125 grid)
    case 2:
      return f32_from_bits(s | (m ? m : 1));  // subnormal
    case 3:
      return with_field(220, 254);  // huge
    case 4:
      return f32_from_bits(s | 0x7f800000u);  // inf
    case 5:
      return f32_from_bits(s | 0x7f800000u | (m ? m : 1));  // NaN
    default:
      return with_field(100, 154);  // ordinary
  }
}

TEST(MmaBatch, RandomAllClasses) {
  auto g = test::rng(0x6d6d61);
  const int64_t ks[] = {16, 32, 48, 64, 80, 128, 144, 256};
  const int64_t ns[] = {1, 3, 15, 16, 17, 31, 33, 64, 100};
  struct Profile {
    int elo, ehi;
    double row_odd;  // probability that a row carries unmodelled elements
  };
  const Profile profiles[] = {
      {-8, 8, 0.0},      // the attention range: every lane fast
      {-8, 8, 0.3},      // mostly fast, some lanes routed
      {-60, 60, 0.2},    // products over [-120, 120]
      {-126, 127, 0.5},  // everything
      {-70, -40, 0.1},   // tiny products around the 2^-100 clamp
      {30, 70, 0.1},     // huge products around 2^90 .. 2^140
  };
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 1500; ++trial) {
    const Profile& pr = profiles[trial % 6];
    const int64_t k = ks[g() % 8], n = ns[g() % 9];
    const int64_t ldb = k + int64_t(g() % 3) * 8;  // contiguous or strided rows
    std::vector<bf16> a(static_cast<size_t>(k)), b(static_cast<size_t>(n * ldb + 32));
    const double a_odd = u(g) < 0.15 ? 0.05 : 0.0;
    for (auto& x : a) x = random_elem(g, pr.elo, pr.ehi, a_odd);
    if (u(g) < 0.2)  // zeros in a (masked keys in attention)
      for (int64_t i = k / 2; i < k; ++i) a[size_t(i)] = bf16{0};
    for (int64_t j = 0; j < n; ++j) {
      const double odd = u(g) < pr.row_odd ? 0.05 : 0.0;
      for (int64_t i = 0; i < ldb; ++i)
        b[size_t(j * ldb + i)] = random_elem(g, pr.elo, pr.ehi, odd);
    }
    std::vector<float> c(static_cast<size_t>(n));
    const int cmode = int(g() % 3);  // nullptr, ordinary/zero c, any c
    for (auto& x : c) x = cmode == 1 ? (u(g) < 0.5 ? 0.0f : float(u(g) * 100 - 50)) : random_c(g);
    ASSERT_TRUE(
        check(a, b, ldb, n, k, cmode == 0 ? nullptr : c.data(), "trial " + std::to_string(trial)));
  }
}

// In-place use (c_out == c_in), as attention's P·V does.
TEST(MmaBatch, InPlace) {
  auto g = test::rng(0x696e70);
  const int64_t n = 37, k = 64;
  std::vector<bf16> a(static_cast<size_t>(k)), b(static_cast<size_t>(n * k));
  for (auto& x : a) x = random_elem(g, -6, 0, 0.0);
  for (auto& x : b) x = random_elem(g, -4, 4, 0.01);
  std::vector<float> c(static_cast<size_t>(n)), want(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    c[size_t(j)] = j % 5 == 0 ? random_c(g) : float(j) * 0.37f - 3.0f;
    want[size_t(j)] = mma_chain_bf16(a.data(), b.data() + j * k, k, c[size_t(j)]);
  }
  cpu::mma_chain_rows_bf16(a.data(), b.data(), k, n, k, c.data(), c.data());
  EXPECT_TRUE(test::bitwise_equal(c, want));
}

// Each case is exact only because its lane is routed to the scalar chain: dropping that routing
// condition makes the fast path's answer differ. One unmodelled lane among ordinary ones.
TEST(MmaBatch, RoutingConditions) {
  const int64_t n = 20, k = 64, bad = 7;
  auto make = [&](auto fill_a, auto fill_bad, float cbad, const char* what) {
    std::vector<bf16> a(static_cast<size_t>(k)), b(static_cast<size_t>(n * k));
    auto g = test::rng(0x726f75);
    for (auto& x : b) x = random_elem(g, -4, 4, 0.0);
    for (int64_t i = 0; i < k; ++i) a[size_t(i)] = random_elem(g, -4, 4, 0.0);
    fill_a(a);
    fill_bad(b.data() + bad * k);
    std::vector<float> c(size_t(n), 1.5f);
    c[size_t(bad)] = cbad;
    EXPECT_TRUE(check(a, b, k, n, k, c.data(), what));
  };
  auto none_a = [](std::vector<bf16>&) {};
  auto none_b = [](bf16*) {};
  // Products around 2^-120 (below the clamp E >= 2^-100): e(a)+e(b) < -100.
  make(
      [&](std::vector<bf16>& a) {
        for (auto& x : a) x = bf16_pow2(-60, 0x35);
      },
      [&](bf16* r) {
        for (int64_t i = 0; i < k; ++i) r[i] = bf16_pow2(-60, uint32_t(i) * 3, i % 3 == 0);
      },
      0.0f, "tiny products");
  // Products around 2^130 (fp32 overflow in a·b): e(a)+e(b) > 90.
  make([&](std::vector<bf16>& a) { a[3] = bf16_pow2(20, 0x11); },
       [&](bf16* r) {
         r[3] = bf16_pow2(110, 0x22);
         r[5] = bf16_pow2(100, 0x7f, true);
       },
       0.0f, "huge products");
  // Products at 2^100 .. 2^105, above the modelled range.
  make(
      [&](std::vector<bf16>& a) {
        for (auto& x : a) x = bf16_pow2(50, 0x7f);
      },
      [&](bf16* r) {
        for (int64_t i = 0; i < k; ++i) r[i] = bf16_pow2(50 + int(i % 5), 0x7f, i % 2);
      },
      0.0f, "huge product spread");
  // c below the 2^-125 grid with all products zero.
  make(
      none_a,
      [&](bf16* r) {
        for (int64_t i = 0; i < k; ++i) r[i] = bf16{0};
      },
      f32_from_bits(0x06b33333u), "tiny c");
  // c just below the 2^-125 grid (field 24, last bit set) with all products zero.
  make(
      none_a,
      [&](bf16* r) {
        for (int64_t i = 0; i < k; ++i) r[i] = bf16{0};
      },
      f32_from_bits(0x0c000001u), "c below the 2^-125 grid");
  // Subnormal c.
  make(
      none_a,
      [&](bf16* r) {
        for (int64_t i = 0; i < k; ++i) r[i] = bf16{0};
      },
      f32_from_bits(0x00012345u), "subnormal c");
  // Huge c (modelled: the chain cannot overflow).
  make(
      [&](std::vector<bf16>& a) {
        for (auto& x : a) x = bf16_pow2(45, 0x7f);
      },
      [&](bf16* r) {
        for (int64_t i = 0; i < k; ++i) r[i] = bf16_pow2(44, 0x7f);
      },
      f32_from_bits(0x7f7fffffu), "huge c");
  make(none_a, none_b, f32_from_bits(0xff800000u), "-inf c");
  make(none_a, none_b, f32_from_bits(0x7fc01234u), "NaN c");
  // inf / NaN / subnormal in one b row.
  make(
      none_a, [&](bf16* r) { r[9] = bf16{0xff80}; }, 1.5f, "-inf b");
  make(
      none_a,
      [&](bf16* r) {
        r[9] = bf16{0x7f80};
        r[10] = bf16{0xff80};
      },
      1.5f, "inf-inf b");
  make(
      none_a, [&](bf16* r) { r[40] = bf16{0x7fc1}; }, 1.5f, "NaN b");
  make(
      [&](std::vector<bf16>& a) {
        for (auto& x : a) x = bf16_pow2(-20, 0x40);
      },
      [&](bf16* r) {
        for (int64_t i = 0; i < k; ++i) r[i] = bf16{uint16_t(0x7f - i)};
      },
      0.0f, "subnormal b");
  // Large a with zero b elements: a zero b element counts as field 0 in the fast path's E.
  make(
      [&](std::vector<bf16>& a) {
        a[0] = bf16_pow2(40);
        for (int64_t i = 1; i < k; ++i) a[size_t(i)] = bf16_pow2(-50, 0x5b);
      },
      [&](bf16* r) {
        r[0] = bf16{0};
        for (int64_t i = 1; i < k; ++i) r[i] = bf16_pow2(-50, uint32_t(i), i % 2);
      },
      0.0f, "large a, zero b");
}

// a itself unmodelled: every lane takes the scalar chain.
TEST(MmaBatch, SpecialA) {
  auto g = test::rng(0x737061);
  const int64_t n = 33, k = 48;
  std::vector<bf16> b(static_cast<size_t>(n * k));
  for (auto& x : b) x = random_elem(g, -4, 4, 0.02);
  const uint16_t specials[] = {0x7f80, 0xff80, 0x7fc0, 0x0001, 0x8040, 0x7f00, 0x0080};
  for (uint16_t s : specials) {
    std::vector<bf16> a(static_cast<size_t>(k));
    for (auto& x : a) x = random_elem(g, -4, 4, 0.0);
    a[17] = bf16{s};
    EXPECT_TRUE(check(a, b, k, n, k, nullptr, "special a " + std::to_string(s)));
  }
  std::vector<bf16> zeros(size_t(k), bf16{0x8000});  // -0 everywhere
  std::vector<float> c(size_t(n), -0.0f);
  EXPECT_TRUE(check(zeros, b, k, n, k, c.data(), "all-zero a, -0 c"));
}

TEST(MmaBatch, Arguments) {
  std::vector<bf16> a(16), b(16);
  float out = 0;
  EXPECT_THROW(cpu::mma_chain_rows_bf16(a.data(), b.data(), 16, 1, 8, nullptr, &out), Error);
  cpu::mma_chain_rows_bf16(a.data(), b.data(), 16, 0, 16, nullptr, &out);  // n = 0: no-op
  EXPECT_EQ(out, 0.0f);
}

}  // namespace
}  // namespace lockstep
