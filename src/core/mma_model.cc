// Reference implementation of the tensor-core MMA k-block model (see mma_model.h and
// docs/contract.md §M). Every step below was fitted to, and is checked against, outputs
// recorded on an H200 (tools/probes/probe_mma.cu, tests/golden/, tests/cpu/test_mma_model.cc).
// Pure function of its inputs: integer arithmetic only, no floating-point rounding anywhere.
#include "core/mma_model.h"

#include <cstdint>

namespace lockstep {
namespace {

constexpr uint32_t kNaNBits = 0x7fffffffu;  // the only NaN the tensor core produces
constexpr uint32_t kInfBits = 0x7f800000u;
// The truncation unit 2^(E-25) never goes below 2^-158 (equivalently E is clamped to >= -133):
// measured, it decides the last bit of results in fp32's subnormal range.
constexpr int kMinUnitExp = -158;

// Result when some operand is inf or NaN: NaN if any NaN, inf*0, or infinities of both signs
// (products and c together); otherwise the infinity. Finite terms never matter then.
uint32_t special_result(const bf16* a, const bf16* b, uint32_t uc) {
  bool nan = false;
  int inf_sign = 0;  // +1 / -1 once an infinity is seen
  auto add_inf = [&](bool negative) {
    int s = negative ? -1 : 1;
    if (inf_sign != 0 && inf_sign != s) nan = true;
    inf_sign = s;
  };
  for (int i = 0; i < kMmaK; ++i) {
    uint32_t ua = a[i].bits, ub = b[i].bits;
    bool a_special = (ua & 0x7f80u) == 0x7f80u, b_special = (ub & 0x7f80u) == 0x7f80u;
    if (!a_special && !b_special) continue;
    if ((a_special && (ua & 0x7fu)) || (b_special && (ub & 0x7fu))) {
      nan = true;  // a NaN operand
    } else if ((ua & 0x7fffu) == 0 || (ub & 0x7fffu) == 0) {
      nan = true;  // inf * 0
    } else {
      add_inf(((ua ^ ub) & 0x8000u) != 0);
    }
  }
  if ((uc & 0x7f800000u) == 0x7f800000u) {
    if (uc & 0x7fffffu)
      nan = true;
    else
      add_inf((uc >> 31) != 0);
  }
  if (nan) return kNaNBits;
  return inf_sign > 0 ? kInfBits : (kInfBits | 0x80000000u);
}

}  // namespace

float mma_kblock_bf16(const bf16* a, const bf16* b, float c) {
  // Products: p = (ma*mb) * 2^(pe-14) exactly, ma/mb the 8-bit integer significands (hidden bit
  // included for normals; subnormals use exponent -126 and no hidden bit). pe = e(a)+e(b) is the
  // unnormalized exponent: ma*mb lies in [2^14, 2^16) for normal inputs. The loops are written
  // branch-free over 16 lanes so that the compiler vectorizes them.
  constexpr int32_t kNone = -100000;  // exponent of a zero term: below everything
  int32_t mag[kMmaK];                 // |ma*mb| < 2^16
  int32_t pe[kMmaK];                  // e(a)+e(b), unbiased; kNone for a zero product
  int32_t neg[kMmaK];                 // 1 for a negative product
  int32_t special = 0;                // some operand is inf or NaN
  for (int i = 0; i < kMmaK; ++i) {
    const int32_t ua = a[i].bits, ub = b[i].bits;
    const int32_t xa = (ua >> 7) & 0xff, xb = (ub >> 7) & 0xff;
    special |= int32_t(xa == 0xff) | int32_t(xb == 0xff);
    const int32_t ma = (ua & 0x7f) | (xa != 0 ? 0x80 : 0);
    const int32_t mb = (ub & 0x7f) | (xb != 0 ? 0x80 : 0);
    const int32_t p = ma * mb;
    mag[i] = p;
    pe[i] = p != 0 ? (xa != 0 ? xa : 1) + (xb != 0 ? xb : 1) - 254 : kNone;
    neg[i] = ((ua ^ ub) >> 15) & 1;
  }
  const uint32_t uc = f32_bits(c);
  const int xc = int((uc >> 23) & 0xffu);
  if (special || xc == 0xff) return f32_from_bits(special_result(a, b, uc));

  // c = cm * 2^(ce-23); subnormal c uses exponent -126 (not renormalized).
  const int32_t cmag = int32_t(uc & 0x7fffffu) | (xc ? 0x800000 : 0);
  const int ce = (xc ? xc : 1) - 127;

  // E = max exponent over the nonzero terms (products with their unnormalized exponent, and c).
  int32_t E = kNone;
  for (int i = 0; i < kMmaK; ++i) E = pe[i] > E ? pe[i] : E;
  if (cmag != 0 && ce > E) E = ce;
  if (E == kNone) return 0.0f;  // all terms zero: +0 whatever the signs of the zeros

  // Every term truncated toward zero to a multiple of 2^u, u = max(E-25, -158), summed exactly.
  // A product in units of 2^u is p * 2^(pe-14-u) = (p << 11) >> (u+25-pe), shift >= 0. Each
  // (p << 11) < 2^27 and 16 of them stay below 2^31, so the product sum fits in int32.
  const int32_t u = E - 25 > kMinUnitExp ? E - 25 : kMinUnitExp;
  int32_t psum = 0;
  for (int i = 0; i < kMmaK; ++i) {
    int32_t sh = u + 25 - pe[i];
    sh = sh < 31 ? sh : 31;
    const int32_t t = (mag[i] << 11) >> sh;
    psum += neg[i] ? -t : t;
  }
  int64_t sum = psum;
  if (cmag != 0) {
    const int sh = ce - 23 - u;  // <= 2
    const int64_t t = sh >= 0 ? (int64_t(cmag) << sh) : (sh <= -31 ? 0 : (cmag >> -sh));
    sum += (uc >> 31) ? -t : t;
  }

  // Round the exact sum toward zero onto the fp32 grid (subnormals included); an exact zero
  // is +0; a result of 2^128 or more is inf (only reachable when the truncated sum is that big).
  if (sum == 0) return 0.0f;
  const uint32_t sign = sum < 0 ? 0x80000000u : 0u;
  const uint64_t smag = uint64_t(sum < 0 ? -sum : sum);
  const int lead = u + (63 - __builtin_clzll(smag));  // exponent of the leading bit
  if (lead >= 128) return f32_from_bits(sign | kInfBits);
  const int q = lead - 23 > -149 ? lead - 23 : -149;  // exponent of the result's last bit
  const uint64_t m = q >= u ? (q - u >= 64 ? 0 : smag >> (q - u)) : smag << (u - q);
  if (m == 0) return 0.0f;  // underflow to zero: +0
  // Normal: field (q+150) with m in [2^23, 2^24) -> ((q+149) << 23) + m; subnormal: q = -149.
  return f32_from_bits(sign | ((uint32_t(q + 149) << 23) + uint32_t(m)));
}

float mma_chain_bf16(const bf16* a, const bf16* b, int64_t k, float c) {
  for (int64_t i = 0; i < k; i += kMmaK) c = mma_kblock_bf16(a + i, b + i, c);
  return c;
}

}  // namespace lockstep
