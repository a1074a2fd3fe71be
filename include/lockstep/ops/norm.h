// norm: the CPU reference op (the executable spec of the contract). Its types, layouts and
// formulas, and the normative description, are in lockstep/contract/norm.h.
#pragma once

#include <string>

#include "lockstep/contract/norm.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu {

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

}  // namespace lockstep::cpu
