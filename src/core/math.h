// The project's own fp32 exp2 / exp / log2 / log: ONE source for host (g++ -ffp-contract=off)
// and device (nvcc -fmad=false) giving identical bits on every input. Only IEEE binary32 + - * /,
// explicit fmaf (correctly rounded on both sides) and integer bit manipulation; no tables, no
// libm, no intrinsics. Max error < 1 ulp (measured over all 2^32 inputs; docs/contract.md §P
// is the normative description, including every coefficient and the evaluation order).
// Subnormal results are produced (gradual underflow), never flushed; subnormal inputs are exact.
#pragma once

#include <math.h>  // fmaf

#include <cstdint>

#include "core/hd.h"
#include "lockstep/dtype.h"

namespace lockstep {
namespace math_detail {

// ln 2 rounded to fp32 (kLn2) and the rest (ln 2 - kLn2, rounded).
constexpr float kLn2 = 0x1.62e430p-1f;
constexpr float kLn2Lo = -0x1.05c610p-29f;
// ln 2 with 16 significant bits (e * kLn2Hi16 is exact for |e| < 2^8) and the rest.
constexpr float kLn2Hi16 = 0x1.62e400p-1f;
constexpr float kLn2Lo16 = 0x1.7f7d1cp-20f;
constexpr float kLog2e = 0x1.715476p+0f;
// 2 / ln 2 as an fp32 pair: log2(m) = (2 / ln 2) * atanh(s).
constexpr float kTwoOverLn2 = 0x1.715476p+1f;
constexpr float kTwoOverLn2Lo = 0x1.4ae0c0p-25f;
// t + 1.5*2^23 rounds |t| < 2^22 to the nearest integer (ties to even); the integer is then the
// low bits of the sum's pattern.
constexpr float kRoundMagic = 0x1.8p23f;
constexpr uint32_t kRoundMagicBits = 0x4b400000u;
constexpr uint32_t kNegInfBits = 0xff800000u;

// NOTE: every NaN these functions return is the canonical kCanonicalNanF32 (0x7FC00000), chosen
// explicitly: x86 and CUDA arithmetic produce different NaN patterns (contract §2).
LS_HD bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// 2^r for |r| <= 1/2 (in [0.70, 1.42]): 1 + r * q(r), q = minimax fit of (2^r - 1) / r on
// [-1/2, 1/2], Horner with fma.
LS_HD float exp2_reduced(float r) {
  float q = 0x1.41a702p-13f;
  q = fmaf(q, r, 0x1.5f053ap-10f);
  q = fmaf(q, r, 0x1.3b2d58p-7f);
  q = fmaf(q, r, 0x1.c6af74p-5f);
  q = fmaf(q, r, 0x1.ebfbdep-3f);
  q = fmaf(q, r, 0x1.62e430p-1f);
  return fmaf(q, r, 1.0f);
}

// p * 2^k for p in [0.7, 1.5] and k in [-152, 130]. 2^k = 2^k1 * 2^k2 with both factors normal:
// the first product is exact, the second rounds once (into the subnormal range, or to inf).
LS_HD float scale_pow2(float p, int32_t k) {
  int32_t k1 = k >> 1;  // arithmetic shift: floor(k / 2)
  int32_t k2 = k - k1;
  float s1 = f32_from_bits(uint32_t(k1 + 127) << 23);
  float s2 = f32_from_bits(uint32_t(k2 + 127) << 23);
  return (p * s1) * s2;
}

// Result of the log reduction: x = 2^e * m, m in [sqrt(1/2), sqrt(2)), s = (m - 1) / (m + 1)
// carried as sh + sl (sl corrects the rounding of sh), |s| <= 0.1716.
struct LogReduced {
  float e;  // exponent as an exact float
  float sh;
  float sl;
};

// u: bits of a positive finite x (other patterns give garbage that the caller replaces).
LS_HD LogReduced log_reduce(uint32_t u) {
  // Positive subnormals (and +0): scale by 2^23 (exact) and correct the exponent.
  // (The product is computed unconditionally so that compilers can vectorize the select.)
  bool tiny = u < 0x00800000u;
  uint32_t scaled = f32_bits(f32_from_bits(u) * 0x1p23f);
  uint32_t v = tiny ? scaled : u;
  int32_t eadj = tiny ? -23 : 0;
  // Adding 0x3f800000 - bits(0.70710677f) moves the exponent boundary to sqrt(1/2).
  uint32_t eb = ((v + 0x004afb0du) >> 23) - 127u;  // e, two's complement
  float m = f32_from_bits(v - (eb << 23));
  float f = m - 1.0f;         // exact (Sterbenz)
  float d = 2.0f + f;         // m + 1, rounded
  float dl = (2.0f - d) + f;  // its rounding error, exact (Fast2Sum, |2| > |f|)
  float inv = 1.0f / d;
  float sh = f * inv;
  float rem = fmaf(-sh, d, f) - sh * dl;  // f - sh * (m + 1)
  float sl = rem * inv;
  return LogReduced{float(int32_t(eb) + eadj), sh, sl};
}

// Special inputs of log and log2 (u = bits of x): +-0 -> -inf, +inf -> +inf, NaN and x < 0
// (incl. -inf) -> canonical NaN; every positive finite x keeps y. Integer blend, not a
// branch, so that compilers keep y's arithmetic unconditional and vectorize the loop.
LS_HD float log_special(uint32_t u, float y) {
  uint32_t special = u > 0x7f800000u ? kCanonicalNanF32 : u;
  special = (u << 1) == 0 ? kNegInfBits : special;             // (u = +inf keeps +inf)
  uint32_t mask = (u - 1u) >= 0x7f7fffffu ? 0xffffffffu : 0u;  // not in [min subnormal, max]
  return f32_from_bits((f32_bits(y) & ~mask) | (special & mask));
}

}  // namespace math_detail

// -inf (an empty max, vocab padding, a masked logit), made from its bit pattern on host and device.
LS_HD float neg_inf_f32() { return f32_from_bits(math_detail::kNegInfBits); }

// 2^x. Max error 0.910 ulp (all inputs). 2^-inf = +0, 2^+inf = +inf, NaN -> canonical NaN,
// overflow -> +inf, results below 2^-126 are subnormals (gradual underflow) or +0.
// Branch-free. (Attention's softmax used it until contract 0.4; since 0.5 it uses ls_ex2_sfu.)
LS_HD float ls_exp2f(float x) {
  using namespace math_detail;
  // Clamp (NaN passes both compares): 2^-151 rounds to 0 and 2^129 overflows, as they should.
  float xc = x < -151.0f ? -151.0f : x;
  xc = xc > 129.0f ? 129.0f : xc;
  float kt = xc + kRoundMagic;
  float kf = kt - kRoundMagic;  // k = nearest integer to x
  int32_t k = int32_t(f32_bits(kt) - kRoundMagicBits);
  float r = xc - kf;  // exact, |r| <= 1/2
  float y = scale_pow2(exp2_reduced(r), k);
  return is_nan_bits(f32_bits(x)) ? f32_from_bits(kCanonicalNanF32) : y;
}

namespace math_detail {
float ex2_sfu_host(float x);  // src/core/ex2_sfu.cc
}  // namespace math_detail

// 2^x exactly as the Hopper SFU computes it (MUFU.EX2, PTX `ex2.approx.ftz.f32`): the GPU runs the
// instruction, the host reproduces its bits from two 2^23-entry tables read off the GPU
// (contract §P.11; tests/cuda/test_math_parity checks all 2^32 inputs). Error vs 2^x: -2.06 to
// +1.39 ulp over every input with a normal result; inputs |x| < 2^-23 (and subnormals) give 1,
// results below 2^-126 are +0, x >= 128 gives +inf, NaN gives 0x7FFFFFFF (not the canonical
// 0x7FC00000: callers that store it canonicalize). Attention's softmax (contract 0.5 on) uses it.
LS_HD float ls_ex2_sfu(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return math_detail::ex2_sfu_host(x);
#endif
}

namespace math_detail {
// ls_expf's reduction and polynomial for a clamped x: e^x = p · 2^k with k = the low bits of kt's
// pattern minus kRoundMagicBits (kt = x · log2 e + kRoundMagic, rounded once).
struct ExpReduced {
  float p, kt;
};
LS_HD ExpReduced expf_reduced(float xc) {
  float kt = fmaf(xc, kLog2e, kRoundMagic);
  float kf = kt - kRoundMagic;
  float r = fmaf(-kf, kLn2, xc);  // exact, |r| <= 0.3466
  r = fmaf(-kf, kLn2Lo, r);
  // e^r = 1 + r (1 + r * Q(r)), Q = minimax fit of (e^r - 1 - r) / r^2 on |r| <= 0.3468.
  float q = 0x1.9f083cp-13f;
  q = fmaf(q, r, 0x1.6d8d78p-10f);
  q = fmaf(q, r, 0x1.111272p-7f);
  q = fmaf(q, r, 0x1.55548ep-5f);
  q = fmaf(q, r, 0x1.555554p-3f);
  q = fmaf(q, r, 0x1.000000p-1f);
  q = fmaf(q, r, 1.0f);
  return ExpReduced{fmaf(q, r, 1.0f), kt};
}
}  // namespace math_detail

// e^x. Max error 0.874 ulp (all inputs). Direct reduction x = k ln2 + r (not exp2(x log2 e)):
// k = nearest integer to x * log2 e, r = (x - k * kLn2) - k * kLn2Lo (the first step exact).
// Special values, overflow and subnormal policy as ls_exp2f.
LS_HD float ls_expf(float x) {
  using namespace math_detail;
  // e^-105 < 2^-151 rounds to 0; e^90 overflows.
  float xc = x < -105.0f ? -105.0f : x;
  xc = xc > 90.0f ? 90.0f : xc;
  const ExpReduced e = expf_reduced(xc);
  float y = scale_pow2(e.p, int32_t(f32_bits(e.kt) - kRoundMagicBits));
  return is_nan_bits(f32_bits(x)) ? f32_from_bits(kCanonicalNanF32) : y;
}

// log2(x). Max error 0.585 ulp (all inputs); exact for powers of two (incl. subnormals).
// log2(+-0) = -inf, log2(+inf) = +inf, log2(x < 0) and log2(NaN) = canonical NaN.
LS_HD float ls_log2f(float x) {
  using namespace math_detail;
  uint32_t u = f32_bits(x);
  LogReduced lr = log_reduce(u);
  // log2(m) = (2/ln2) s + s^3 T(s^2): the linear term as hi + lo (exact product split), the
  // tail T = minimax fit of (2/ln2)(atanh(s)/s - 1)/s^2 (relative error of the sum < 2^-30).
  float z = lr.sh * lr.sh;
  float t = fmaf(0x1.b95202p-2f, z, 0x1.274c38p-1f);
  t = fmaf(t, z, 0x1.ec70d4p-1f);
  float tail = (lr.sh * z) * t;
  float hi = kTwoOverLn2 * lr.sh;
  float lo = fmaf(kTwoOverLn2, lr.sh, -hi) + fmaf(kTwoOverLn2Lo, lr.sh, kTwoOverLn2 * lr.sl);
  float sum = lr.e + hi;
  float err = (lr.e - sum) + hi;  // exact (Fast2Sum: |e| >= 1 > |hi|, or e = 0)
  float y = sum + (err + (lo + tail));
  return log_special(u, y);
}

// ln(x). Max error 0.559 ulp (all inputs). Same special values as ls_log2f; ln(1) = +0.
LS_HD float ls_logf(float x) {
  using namespace math_detail;
  uint32_t u = f32_bits(x);
  LogReduced lr = log_reduce(u);
  // ln(m) = 2 s + s^3 T(s^2), T = minimax fit of 2 (atanh(s)/s - 1)/s^2.
  float z = lr.sh * lr.sh;
  float t = fmaf(0x1.31e662p-2f, z, 0x1.995e9cp-2f);
  t = fmaf(t, z, 0x1.55557ap-1f);
  float tail = (lr.sh * z) * t;
  float hi = 2.0f * lr.sh;    // exact
  float a = lr.e * kLn2Hi16;  // exact
  float sum = a + hi;
  float err = (a - sum) + hi;  // exact (Fast2Sum: |a| >= 0.69 > |hi|, or e = 0)
  float lo = fmaf(lr.e, kLn2Lo16, 2.0f * lr.sl);
  float y = sum + (err + (lo + tail));
  return log_special(u, y);
}

}  // namespace lockstep
