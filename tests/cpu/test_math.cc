// Math primitives (src/core/math.h): ls_exp2f / ls_expf / ls_log2f / ls_logf against an fp64
// oracle over dense sweeps of fp32 inputs (every k-th bit pattern plus exhaustive binades), special
// values, exact cases, known-answer hashes (the bits are the contract), determinism, threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "core/math.h"
#include "core/thread_pool.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

// The bounds this file asserts (docs/contract.md §P). Measured over all 2^32 inputs
// (dev/math_sweep.cc): exp2 0.910, exp 0.874, log2 0.585, log 0.559 ulp.
constexpr double kMaxUlpExp2 = 1.0;
constexpr double kMaxUlpExp = 1.0;
constexpr double kMaxUlpLog2 = 0.6;
constexpr double kMaxUlpLog = 0.6;

using MathFn = float (*)(float);
using RefFn = double (*)(double);

struct Func {
  const char* name;
  MathFn f;
  RefFn ref;
  double bound;
};

double ref_exp2(double x) { return std::exp2(x); }
double ref_exp(double x) { return std::exp(x); }
double ref_log2(double x) { return std::log2(x); }
double ref_log(double x) { return std::log(x); }

const Func kExp2{"ls_exp2f", ls_exp2f, ref_exp2, kMaxUlpExp2};
const Func kExp{"ls_expf", ls_expf, ref_exp, kMaxUlpExp};
const Func kLog2{"ls_log2f", ls_log2f, ref_log2, kMaxUlpLog2};
const Func kLog{"ls_logf", ls_logf, ref_log, kMaxUlpLog};

// Error of y in ulps of the exact value ref (a double; the oracle's own error, < 1 ulp of double,
// is < 2^-29 fp32 ulp). The ulp is that of ref's binade, 2^-149 below 2^-126 (subnormal grid).
// Past the overflow threshold (FLT_MAX + half an ulp) the only right answer is inf; below it an inf
// counts as 2^128. Returns +inf where y's class is wrong (NaN / inf / sign).
double ulp_error(float y, double ref) {
  constexpr double kOverflow = 0x1.ffffffp127;  // rounds to inf from here on
  if (std::isnan(ref)) return std::isnan(y) ? 0.0 : INFINITY;
  if (std::isnan(y)) return INFINITY;
  if (std::fabs(ref) >= kOverflow) {
    return (std::isinf(y) && (y > 0) == (ref > 0)) ? 0.0 : INFINITY;
  }
  double yv = std::isinf(y) ? std::copysign(0x1p128, y) : double(y);
  double a = std::fabs(ref);
  int e = a == 0.0 ? -126 : std::max(std::ilogb(a), -126);
  return std::fabs(yv - ref) / std::ldexp(1.0, e - 23);
}

struct SweepStats {
  uint64_t count = 0;
  uint64_t correctly_rounded = 0;
  double max_ulp = 0;
  uint32_t worst = 0;  // input bits of the largest error
  uint32_t first_bad = 0;
  uint64_t bad = 0;  // inputs over the bound
  void merge(const SweepStats& o) {
    if (o.bad && !bad) first_bad = o.first_bad;
    bad += o.bad;
    count += o.count;
    correctly_rounded += o.correctly_rounded;
    if (o.max_ulp > max_ulp) max_ulp = o.max_ulp, worst = o.worst;
  }
};

// Evaluates fn on the bit patterns lo, lo + stride, ... <= hi, split over threads in interleaved
// chunks (each chunk samples the whole range, so the threads stay balanced).
SweepStats sweep(const Func& fn, uint32_t lo, uint32_t hi, uint32_t stride) {
  const uint64_t n = (uint64_t(hi) - lo) / stride + 1;
  const int64_t chunks = 64;
  std::vector<SweepStats> part(chunks);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      SweepStats s;
      for (uint64_t i = uint64_t(c); i < n; i += chunks) {
        uint32_t bits = uint32_t(lo + i * stride);
        float x = f32_from_bits(bits);
        float y = fn.f(x);
        double ref = fn.ref(double(x));
        double err = ulp_error(y, ref);
        ++s.count;
        if (f32_bits(y) == f32_bits(float(ref)) || (std::isnan(ref) && std::isnan(y))) {
          ++s.correctly_rounded;
        }
        if (err > s.max_ulp) s.max_ulp = err, s.worst = bits;
        if (!(err <= fn.bound)) {
          if (!s.bad) s.first_bad = bits;
          ++s.bad;
        }
      }
      part[c] = s;
    }
  });
  SweepStats total;
  for (const SweepStats& s : part) total.merge(s);
  return total;
}

void report(const Func& fn, const char* what, const SweepStats& s) {
  std::printf(
      "[math] %-9s %-34s %11llu inputs  max %.4f ulp at %a (0x%08x)  %.4f%% correctly "
      "rounded\n",
      fn.name, what, (unsigned long long)s.count, s.max_ulp, double(f32_from_bits(s.worst)),
      s.worst, 100.0 * double(s.correctly_rounded) / double(std::max<uint64_t>(s.count, 1)));
}

void expect_within_bound(const Func& fn, const char* what, const SweepStats& s) {
  report(fn, what, s);
  float x = f32_from_bits(s.first_bad);
  EXPECT_EQ(s.bad, 0u) << fn.name << " " << what << ": " << s.bad << " inputs over " << fn.bound
                       << " ulp; first x = " << x << " (0x" << std::hex << s.first_bad << std::dec
                       << ") -> " << fn.f(x) << ", oracle " << fn.ref(double(x)) << "; max error "
                       << s.max_ulp << " ulp";
}

// Every `stride`-th fp32 bit pattern (all of them: specials, NaNs, subnormals, out-of-range),
// starting at a seeded offset, plus exhaustive sweeps of the binades that hold the worst cases.
constexpr uint32_t kStride = 47;  // 9.1e7 patterns per function

uint32_t seeded_offset(uint64_t salt) { return uint32_t(test::rng(salt)() % kStride); }

TEST(MathAccuracy, Exp2) {
  SweepStats all = sweep(kExp2, seeded_offset(1), 0xffffffffu, kStride);
  expect_within_bound(kExp2, "every 47th pattern", all);
  // x in [-1, -1/4] and [1/4, 1]: r covers [-1/2, 1/2] for k = -1, 0, 1 (every input).
  expect_within_bound(kExp2, "all x in [1/4, 1]", sweep(kExp2, 0x3e800000u, 0x3f800000u, 1));
  expect_within_bound(kExp2, "all x in [-1, -1/4]", sweep(kExp2, 0xbe800000u, 0xbf800000u, 1));
  // Gradual underflow: results from 2^-126 down to 0 (x in [-152, -125]), every input.
  expect_within_bound(kExp2, "all x in [-152, -125] (subnormals)",
                      sweep(kExp2, 0xc2fa0000u, 0xc3180000u, 1));
  // Overflow boundary: x in [127, 129], every input.
  expect_within_bound(kExp2, "all x in [127, 129] (overflow)",
                      sweep(kExp2, 0x42fe0000u, 0x43010000u, 1));
}

TEST(MathAccuracy, Exp) {
  SweepStats all = sweep(kExp, seeded_offset(2), 0xffffffffu, kStride);
  expect_within_bound(kExp, "every 47th pattern", all);
  expect_within_bound(kExp, "all x in [1/4, 1]", sweep(kExp, 0x3e800000u, 0x3f800000u, 1));
  expect_within_bound(kExp, "all x in [-1, -1/4]", sweep(kExp, 0xbe800000u, 0xbf800000u, 1));
  expect_within_bound(kExp, "all x in [-8, -4]", sweep(kExp, 0xc0800000u, 0xc1000000u, 1));
  // Gradual underflow (x in [-106, -87]) and overflow (x in [88, 89]), every input.
  expect_within_bound(kExp, "all x in [-106, -87] (subnormals)",
                      sweep(kExp, 0xc2ae0000u, 0xc2d40000u, 1));
  expect_within_bound(kExp, "all x in [88, 89] (overflow)",
                      sweep(kExp, 0x42b00000u, 0x42b20000u, 1));
}

TEST(MathAccuracy, Log2) {
  SweepStats all = sweep(kLog2, seeded_offset(3), 0xffffffffu, kStride);
  expect_within_bound(kLog2, "every 47th pattern", all);
  // x in [1/2, 2]: the reduction boundary sqrt(1/2) and results near 0 (every input).
  expect_within_bound(kLog2, "all x in [1/2, 2]", sweep(kLog2, 0x3f000000u, 0x40000000u, 1));
  expect_within_bound(kLog2, "all subnormal x", sweep(kLog2, 0x00000001u, 0x007fffffu, 1));
}

TEST(MathAccuracy, Log) {
  SweepStats all = sweep(kLog, seeded_offset(4), 0xffffffffu, kStride);
  expect_within_bound(kLog, "every 47th pattern", all);
  expect_within_bound(kLog, "all x in [1/2, 2]", sweep(kLog, 0x3f000000u, 0x40000000u, 1));
  expect_within_bound(kLog, "all subnormal x", sweep(kLog, 0x00000001u, 0x007fffffu, 1));
}

uint32_t bits_of(float (*f)(float), float x) { return f32_bits(f(x)); }

constexpr uint32_t kPosInf = 0x7f800000u, kNegInf = 0xff800000u;
const float kInf = std::numeric_limits<float>::infinity();
const float kMax = std::numeric_limits<float>::max();
const float kDenormMin = std::numeric_limits<float>::denorm_min();
const uint32_t kNaNs[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                          0x7fffffffu, 0xffffffffu, 0x7fa00000u};

TEST(MathSpecial, Exp2AndExp) {
  for (MathFn f : {MathFn(ls_exp2f), MathFn(ls_expf)}) {
    EXPECT_EQ(bits_of(f, -kInf), 0u);  // +0
    EXPECT_EQ(bits_of(f, kInf), kPosInf);
    EXPECT_EQ(bits_of(f, kMax), kPosInf);
    EXPECT_EQ(bits_of(f, -kMax), 0u);
    EXPECT_EQ(bits_of(f, 0.0f), f32_bits(1.0f));
    EXPECT_EQ(bits_of(f, -0.0f), f32_bits(1.0f));
    EXPECT_EQ(bits_of(f, kDenormMin), f32_bits(1.0f));
    EXPECT_EQ(bits_of(f, -kDenormMin), f32_bits(1.0f));
    for (uint32_t nan : kNaNs) EXPECT_EQ(bits_of(f, f32_from_bits(nan)), kCanonicalNanF32);
  }
  EXPECT_EQ(bits_of(ls_exp2f, 128.0f), kPosInf);
  EXPECT_TRUE(std::isfinite(ls_exp2f(0x1.fffffep6f)));  // 2^(128 - 2^-17) < FLT_MAX
  EXPECT_EQ(bits_of(ls_exp2f, -150.0f), 0u);            // 2^-150 is a tie: rounds to even (0)
  EXPECT_EQ(bits_of(ls_exp2f, -149.0f), 1u);            // smallest subnormal
  EXPECT_EQ(bits_of(ls_exp2f, -149.5f), 1u);            // 0.707 * 2^-149 rounds up
  EXPECT_EQ(bits_of(ls_exp2f, -151.0f), 0u);
  // Exact thresholds (the same as the correctly rounded function's).
  EXPECT_EQ(bits_of(ls_expf, 0x1.62e42ep+6f), 0x7f7fff84u);  // largest x with a finite e^x
  EXPECT_EQ(bits_of(ls_expf, 0x1.62e430p+6f), kPosInf);
  EXPECT_EQ(bits_of(ls_expf, -0x1.9fe368p+6f), 1u);  // most negative x with e^x > 0
  EXPECT_EQ(bits_of(ls_expf, -0x1.9fe36ap+6f), 0u);
  EXPECT_EQ(bits_of(ls_exp2f, -0x1.2bfffep+7f), 1u);          // -149.99998: 2^x > 2^-150 rounds up
  EXPECT_EQ(bits_of(ls_exp2f, 0x1.fffffep+6f), 0x7f7fffa7u);  // largest x with a finite 2^x
  EXPECT_EQ(bits_of(ls_expf, 88.8f), kPosInf);                // e^88.8 > FLT_MAX
  EXPECT_TRUE(std::isfinite(ls_expf(88.72f)));                // e^88.72 < FLT_MAX
  EXPECT_EQ(bits_of(ls_expf, -104.0f), 0u);                   // e^-104 < 2^-150
  EXPECT_EQ(bits_of(ls_expf, -103.9f), 1u);                   // e^-103.9 rounds to 2^-149
  EXPECT_EQ(bits_of(ls_expf, 1.0f), f32_bits(float(std::exp(1.0))));
}

TEST(MathSpecial, Log2AndLog) {
  for (MathFn f : {MathFn(ls_log2f), MathFn(ls_logf)}) {
    EXPECT_EQ(bits_of(f, 0.0f), kNegInf);
    EXPECT_EQ(bits_of(f, -0.0f), kNegInf);
    EXPECT_EQ(bits_of(f, kInf), kPosInf);
    EXPECT_EQ(bits_of(f, 1.0f), 0u);  // +0, not -0
    for (float neg : {-1.0f, -kInf, -kMax, -kDenormMin, -0x1p-126f, -2.0f})
      EXPECT_EQ(bits_of(f, neg), kCanonicalNanF32) << neg;
    for (uint32_t nan : kNaNs) EXPECT_EQ(bits_of(f, f32_from_bits(nan)), kCanonicalNanF32);
  }
  EXPECT_EQ(ls_log2f(kMax), 128.0f);  // log2(FLT_MAX) = 128 - 2^-24.5 rounds to 128
  EXPECT_EQ(ls_logf(kDenormMin), float(std::log(double(kDenormMin))));
}

// Exact cases: 2^n and log2(2^n) = n for every n in range, including subnormal powers of two.
TEST(MathSpecial, PowersOfTwoAreExact) {
  for (int n = -149; n <= 127; ++n) {
    float p = std::ldexp(1.0f, n);
    ASSERT_EQ(ls_exp2f(float(n)), p) << n;
    ASSERT_EQ(ls_log2f(p), float(n)) << n;
  }
  for (int n = -200; n <= -151; ++n) ASSERT_EQ(bits_of(ls_exp2f, float(n)), 0u) << n;
  for (int n = 128; n <= 300; ++n) ASSERT_EQ(bits_of(ls_exp2f, float(n)), kPosInf) << n;
}

// ls_exp2f(x) for x <= 0 stays in [0, 1] (the softmax path until contract 0.4), over
// every 11th pattern of [-160, -0]. NOTE: exp2 is not guaranteed monotone (a < 1 ulp error allows
// adjacent inputs to invert by 1 ulp: 83,328 of the 2^30 adjacent pairs in [-2, 0] do): the walk
// prints how often that happens.
TEST(MathSpecial, Exp2OfNonPositiveStaysInUnitInterval) {
  // Walks from x = -160 toward -0 (negative floats: a smaller pattern is a larger x).
  const uint32_t lo_bits = 0xc3200000u, hi_bits = 0x80000000u, stride = 11;
  float prev = ls_exp2f(f32_from_bits(lo_bits));
  uint64_t inversions = 0;
  for (uint64_t b = lo_bits - stride; b >= hi_bits; b -= stride) {
    float x = f32_from_bits(uint32_t(b));
    float y = ls_exp2f(x);
    ASSERT_TRUE(y >= 0.0f && y <= 1.0f) << "x = " << x;
    inversions += y < prev;
    prev = y;
  }
  std::printf("[math] ls_exp2f on [-160, -0], every 11th pattern: %llu neighbour inversions\n",
              (unsigned long long)inversions);
  EXPECT_EQ(ls_exp2f(-0.0f), 1.0f);
  EXPECT_EQ(ls_exp2f(-0x1p-30f), 1.0f);
  EXPECT_EQ(ls_exp2f(-0x1p-24f), 0x1.fffffep-1f);  // 1 - 2^-24 ln2 rounds to the float below 1
}

// The bits are the contract: FNV-1a over the outputs of each function on every 4099th pattern.
// A change here is a change of the contract (bump kContractVersion, update the CUDA side).
uint64_t known_answer_hash(MathFn f) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 4099) {
    uint32_t y = f32_bits(f(f32_from_bits(uint32_t(b))));
    for (int i = 0; i < 4; ++i) h = (h ^ ((y >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  }
  return h;
}

TEST(MathDeterminism, KnownAnswerHashes) {
  EXPECT_EQ(known_answer_hash(ls_exp2f), 0xb960360cdc14150full)
      << std::hex << known_answer_hash(ls_exp2f);
  EXPECT_EQ(known_answer_hash(ls_expf), 0xef78e5ab32f60be8ull)
      << std::hex << known_answer_hash(ls_expf);
  EXPECT_EQ(known_answer_hash(ls_log2f), 0x8f78bd01fa00dfadull)
      << std::hex << known_answer_hash(ls_log2f);
  EXPECT_EQ(known_answer_hash(ls_logf), 0x7265d326f1d6d11aull)
      << std::hex << known_answer_hash(ls_logf);
  EXPECT_EQ(known_answer_hash(ls_ex2_sfu), 0x199e01a2edfedab4ull)  // also checked on the GPU
      << std::hex << known_answer_hash(ls_ex2_sfu);
}

// ls_ex2_sfu (§P.11): the SFU's exp2, reproduced from the tables read off the GPU. Its bits on the
// GPU are checked over all 2^32 inputs by tests/cuda/test_math_parity; here: values the GPU
// printed, the fixed-point structure, special values and the accuracy over every table entry.
uint32_t sfu_bits(float x) { return f32_bits(ls_ex2_sfu(x)); }

TEST(MathEx2Sfu, ValuesReadOffTheGpu) {
  EXPECT_EQ(sfu_bits(0x1p-23f), 0x3f800001u);                    // T+[1]
  EXPECT_EQ(sfu_bits(0.5f), 0x3fb504f3u);                        // T+[2^22]
  EXPECT_EQ(sfu_bits(1.0f - 0x1p-23f), 0x3fffffffu);             // T+[2^23 - 1]
  EXPECT_EQ(sfu_bits(-0x1p-23f), 0x3f7ffffeu);                   // T-[1]
  EXPECT_EQ(sfu_bits(-0.5f), 0x3f3504f2u);                       // T-[2^22]
  EXPECT_EQ(sfu_bits(-(1.0f - 0x1p-23f)), 0x3f000000u);          // T-[2^23 - 1]
  EXPECT_EQ(sfu_bits(f32_from_bits(0xb40003a0u)), 0x3f7ffffeu);  // -1.19e-7: trunc -> T-[1]
  EXPECT_EQ(sfu_bits(f32_from_bits(0x33800dc0u)), 0x3f800000u);  // 5.96e-8 < 2^-23: 1
  EXPECT_EQ(sfu_bits(f32_from_bits(0x80805ea0u)), 0x3f800000u);  // -1.18e-38: 1
}

TEST(MathEx2Sfu, SpecialValues) {
  EXPECT_EQ(sfu_bits(f32_from_bits(0x7fc00000u)), 0x7fffffffu);  // NaN: the SFU's NaN
  EXPECT_EQ(sfu_bits(f32_from_bits(0xffc00001u)), 0x7fffffffu);
  EXPECT_EQ(sfu_bits(INFINITY), 0x7f800000u);
  EXPECT_EQ(sfu_bits(-INFINITY), 0u);
  EXPECT_EQ(sfu_bits(128.0f), 0x7f800000u);
  EXPECT_EQ(sfu_bits(0x1.fffffep6f), 0x7f7fffa8u);  // the largest input below 128 stays finite
  EXPECT_EQ(sfu_bits(-128.0f), 0u);
  EXPECT_EQ(sfu_bits(-126.0f), 0x00800000u);  // 2^-126, the smallest normal
  EXPECT_EQ(sfu_bits(-126.5f), 0u);           // below 2^-126: +0 (ftz)
  EXPECT_EQ(sfu_bits(0.0f), 0x3f800000u);
  EXPECT_EQ(sfu_bits(-0.0f), 0x3f800000u);
  EXPECT_EQ(sfu_bits(f32_from_bits(0x00000001u)), 0x3f800000u);  // subnormals count as 0
  EXPECT_EQ(sfu_bits(f32_from_bits(0x807fffffu)), 0x3f800000u);
}

// x = ±(i + F 2^-23) (the fixed point, truncated): 2^x = T±[F] 2^±i, and every x of one cell of
// the 2^-23 grid gives the same bits.
TEST(MathEx2Sfu, FixedPointStructure) {
  auto g = test::rng(11);
  for (int n = 0; n < 200000; ++n) {
    const uint32_t F = uint32_t(g()) & 0x7fffffu;
    const int i = int(g() % 126);
    const float f = float(F) * 0x1p-23f;
    const float x = float(i) + f;  // exact when i + F 2^-23 fits 24 bits; skip the others
    if (double(x) != double(i) + double(f)) continue;
    ASSERT_EQ(ls_ex2_sfu(x), std::ldexp(ls_ex2_sfu(f), i)) << x;
    const float yn = std::ldexp(ls_ex2_sfu(-f), -i);
    ASSERT_EQ(sfu_bits(-x), yn >= 0x1p-126f ? f32_bits(yn) : 0u) << -x;
  }
  // Inside one cell [F 2^-23, (F + 1) 2^-23): the same bits (trunc of |x| 2^23).
  for (uint32_t F : {0u, 1u, 12345u, 0x400000u, 0x7ffffeu}) {
    const float lo = float(F) * 0x1p-23f;
    const float hi = std::nextafter(float(F + 1) * 0x1p-23f, 0.0f);
    EXPECT_EQ(sfu_bits(lo), sfu_bits(hi)) << F;
    EXPECT_EQ(sfu_bits(-lo), sfu_bits(-hi)) << F;
  }
}

// Error over every entry of both tables (x = ±F 2^-23), in ulps of the result's binade; over all
// inputs with a normal result it is -2.055 .. +1.390 (dev/math_sweep.cc, fn 4).
TEST(MathEx2Sfu, AccuracyOverEveryTableEntry) {
  double lo[2] = {0, 0}, hi[2] = {0, 0};
  for (uint32_t F = 0; F < (1u << 23); ++F) {
    for (int s = 0; s < 2; ++s) {
      const float x = (s ? -1.0f : 1.0f) * float(F) * 0x1p-23f;
      const double ref = std::exp2(double(x));
      const double ulp = std::ldexp(1.0, std::ilogb(ref) - 23);
      const double e = (double(ls_ex2_sfu(x)) - ref) / ulp;
      lo[s] = std::min(lo[s], e);
      hi[s] = std::max(hi[s], e);
    }
  }
  std::printf("[math] ls_ex2_sfu error (ulp): x >= 0 [%.4f, %.4f], x <= 0 [%.4f, %.4f]\n", lo[0],
              hi[0], lo[1], hi[1]);
  EXPECT_GE(lo[0], -0.75);
  EXPECT_LE(hi[0], 1.40);
  EXPECT_GE(lo[1], -2.06);
  EXPECT_LE(hi[1], 0.56);
  // Monotone along each table (the softmax never sees a larger p for a smaller x there).
  uint32_t prev_p = 0, prev_n = 0xffffffffu;
  for (uint32_t F = 0; F < (1u << 23); ++F) {
    const uint32_t p = sfu_bits(float(F) * 0x1p-23f), n = sfu_bits(-float(F) * 0x1p-23f);
    ASSERT_GE(p, prev_p) << F;
    ASSERT_LE(n, prev_n) << F;
    prev_p = p;
    prev_n = n;
  }
}

// Rerun and thread count: the same bits (the functions are pure; this guards against anything
// stateful, e.g. a rounding-mode or FTZ/DAZ change leaking in).
TEST(MathDeterminism, RerunAndThreadCountGiveSameBits) {
  const int saved_threads = num_threads();
  auto g = test::rng(5);
  const int64_t n = 1 << 20;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = f32_from_bits(uint32_t(g()));
  for (MathFn f :
       {MathFn(ls_exp2f), MathFn(ls_expf), MathFn(ls_log2f), MathFn(ls_logf), MathFn(ls_ex2_sfu)}) {
    auto run = [&](int threads) {
      set_num_threads(threads);
      std::vector<float> y(static_cast<size_t>(n));
      test::poison(y.data(), n * 4);
      parallel_for(n, 1024, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) y[size_t(i)] = f(x[size_t(i)]);
      });
      return y;
    };
    std::vector<float> a = run(1), b = run(3), c = run(1);
    EXPECT_TRUE(test::bitwise_equal(a, b));
    EXPECT_TRUE(test::bitwise_equal(a, c));
  }
  set_num_threads(saved_threads);
}

}  // namespace
}  // namespace lockstep
