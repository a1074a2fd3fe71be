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

namespace cpu {

// y = rmsnorm(x) * weight, row by row over the last dimension.
//   x      [T, H] or [T, heads, D]  bf16, last dim contiguous, any outer strides
//   weight [H] (or [D])              bf16, contiguous
//   y      same shape as x           bf16, last dim contiguous; may be the same view as x
void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
             const TensorView& y);

// Fused residual add then RMSNorm (HF decoder layer order):
//   s = bf16(fp32(x) + fp32(residual))   -> written to residual_out (the new residual stream)
//   y = rmsnorm(s) * weight
//   x, residual, residual_out, y: same shape ([T, H] or [T, heads, D]), bf16, last dim contiguous.
// residual_out may be the same view as residual, and y the same view as x (in place, as vLLM's
// fused_add_rms_norm); other overlaps are not allowed.
void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& residual_out,
                      const TensorView& y);

}  // namespace cpu
}  // namespace lockstep
