// The RMSNorm row reduction (docs/contract.md §E.1 steps 2-3), shared by the forward
// (src/cpu/norm.cc: the sum of squares) and the backward (src/cpu/backward/norm.cc, §B.4: the sum
// of gt_k·s_k), so that both use one implementation of the lane layout and the butterfly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lockstep/contract/norm.h"
#include "lockstep/dtype.h"

namespace lockstep::cpu::norm_detail {

// Sum over one row of H terms in the contract's layout: group g (elements 8g .. 8g+7, the last
// one possibly partial: absent elements are skipped, which equals adding +0) belongs to lane
// g % 32; each lane starts from +0 and adds term(k) of its elements in ascending k (the term is
// computed first: a separate multiply, never an fma); then the xor butterfly over the lanes.
template <typename Term>
float lane_sum(int64_t H, const Term& term) {
  float lane[kRmsNormLanes];
  for (float& l : lane) l = 0.0f;  // +0: lanes that own no group contribute +0
  const int64_t groups = (H + kRmsNormGroup - 1) / kRmsNormGroup;
  for (int64_t g = 0; g < groups; ++g) {
    float acc = lane[g % kRmsNormLanes];
    const int64_t end = std::min<int64_t>(H, (g + 1) * kRmsNormGroup);
    for (int64_t k = g * kRmsNormGroup; k < end; ++k) {
      const float q = term(k);
      acc = acc + q;
    }
    lane[g % kRmsNormLanes] = acc;
  }
  // xor-butterfly, offsets 16, 8, 4, 2, 1: lane j's value becomes lane[j] + lane[j ^ o]; we keep
  // only the lanes that still feed lane 0 (every lane ends with the same bits: + is commutative).
  for (int o = kRmsNormLanes / 2; o >= 1; o /= 2) {
    for (int j = 0; j < o; ++j) lane[j] = lane[j] + lane[j + o];
  }
  return lane[0];
}

// r = 1 / sqrt(sum(s_k²) / H + eps) of one row (§E.1 step 4).
// NOTE: s*s of a bf16 value is exact in fp32 (8-bit significands), except when it overflows
// (|s| >= 2^64) or leaves the normal range (|s| < 2^-63); so mul-then-add vs fma only differs
// there, and we state the separate mul (the -fmad=false GPU form).
inline float rms_inv(const bf16* s, int64_t H, float eps) {
  const float sum = lane_sum(H, [s](int64_t k) {
    const float v = bf16_to_f32(s[k]);
    return v * v;
  });
  const float mean = sum / float(H);
  return 1.0f / std::sqrt(mean + eps);
}

}  // namespace lockstep::cpu::norm_detail
