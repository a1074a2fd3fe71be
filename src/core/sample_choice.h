// The sampler's choice (docs/contract.md §S.6-S.7, contract 0.6), host and device: a candidate's
// mass q = floor(p · 2^32), the row's 64-bit uniform U from one Philox call, and the target
// floor(U · Q / 2^64) in [0, Q) that the candidates' mass prefix (ascending vocab id) is searched
// for. Pure integer math past ls_expf: every backend computes the same bits.
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/math.h"
#include "core/philox.h"

namespace lockstep {

// q = floor(p · 2^32) of p = ls_expf(d), d = y − lse (p · 2^32 is exact in fp32; the conversion
// truncates). d < −23 gives 0 without the exp: p <= e^-23 (1 + 2^-23) < 2^-32 (ls_expf errs by
// < 1 ulp), so floor(p · 2^32) = 0 (−inf, the padding, included).
LS_HD uint64_t sample_mass_q32(float d) { return d < -23.0f ? 0 : uint64_t(ls_expf(d) * 0x1p32f); }

// ls_expf and the mass in fewer instructions, for the sampler's passes over a row. For
// −86 <= d <= 88 (the passes need −23 <= d <= 0: d = y − lse <= 0, lse >= max y by §L.7) ls_expf's
// clamps and NaN test do nothing and p · 2^k is normal (k = round(d · log2 e) in [−124, 127],
// e^r in [0.70, 1.42]), so scale_pow2's two exact products are an add to the exponent field: the
// same bits as ls_expf there (tests/cpu/test_sampling.cc).
LS_HD float sample_expf_normal(float d) {
  using namespace math_detail;
  const ExpReduced e = expf_reduced(d);
  return f32_from_bits(f32_bits(e.p) + ((f32_bits(e.kt) - kRoundMagicBits) << 23));
}
// floor(p · 2^32) for 0 <= p < 2^32 (p · 2^32 is exact): a 32-bit conversion below 2^32 (every
// p < 1), a 64-bit one above. Equals sample_mass_q32's uint64_t(ls_expf(d) * 0x1p32f).
LS_HD uint64_t sample_q32(float p) {
  const float t = p * 0x1p32f;
  return t < 0x1p32f ? uint64_t(uint32_t(t)) : uint64_t(t);
}
// The same for 0 <= p <= 1 (every mass: d <= 0), without the 64-bit conversion.
LS_HD uint64_t sample_q32_unit(float p) {
  const float t = p * 0x1p32f;
  return t < 0x1p32f ? uint64_t(uint32_t(t)) : uint64_t(1) << 32;
}

// The Philox counter's first word of the row uniform: above every vocab group's (v >> 2 < 2^19),
// so the row's word never equals an entry's word of the same key and counter.
constexpr uint32_t kSampleUniformCounter = 0xffffffffu;

// U = (out[0] << 32) | out[1] of Philox4x32-10 with key (seed lo, seed hi) and counter
// (0xffffffff, position, request id lo, request id hi).
LS_HD uint64_t sample_row_uniform(uint64_t seed, uint64_t request_id, uint32_t position) {
  const Philox4 w = philox4x32_10(
      Philox4{{kSampleUniformCounter, position, uint32_t(request_id), uint32_t(request_id >> 32)}},
      uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(w.v[0]) << 32) | uint64_t(w.v[1]);
}

// floor(u · total / 2^64): the high word of the 128-bit product, in [0, total) for total > 0.
LS_HD uint64_t sample_target(uint64_t u, uint64_t total) {
  const uint64_t a0 = u & 0xffffffffu, a1 = u >> 32, b0 = total & 0xffffffffu, b1 = total >> 32;
  const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

}  // namespace lockstep
