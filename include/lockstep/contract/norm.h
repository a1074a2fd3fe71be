// RMSNorm (Qwen3/HF order) with an optional fused residual add, on rows of [T, H] or per head on
// [T, heads, D]. Sum of squares in a fixed 32-lane layout (8-element groups, lane = group % 32,
// ascending order per lane, then an xor-butterfly 16,8,4,2,1); r = 1/sqrt(sum/H + eps) with IEEE
// div/sqrt; y = bf16(bf16(x·r)·w). Every row is computed alone: bits never depend on T, the other
// rows, strides or the thread count. Normative text: docs/contract.md §E "RMSNorm".
#pragma once

#include <string>

#include "lockstep/tensor.h"

namespace lockstep {

// The fixed reduction layout (part of the contract; not settings).
constexpr int kRmsNormLanes = 32;  // one warp per row
constexpr int kRmsNormGroup = 8;   // elements per lane step (one 16-byte bf16 load)

struct RmsNormConfig {
  float eps = 1e-6f;  // from the model config (Qwen3: rms_norm_eps); finite, >= 0

  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // "rmsnorm: eps=0x1.0c6f7ap-20 (9.99999997e-07) lanes=32 group=8"
};

}  // namespace lockstep
