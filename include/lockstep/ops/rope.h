// rope: the CPU reference op (the executable spec of the contract). Its types, layouts and
// formulas, and the normative description, are in lockstep/contract/rope.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/contract/rope.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu {

// y = rope(x) at each token's position.
//   x         [T, heads, D]  bf16, last dim contiguous, any outer strides (e.g. q or k inside a
//                            fused qkv buffer)
//   positions [T]            i32 or i64 (any stride); each in [0, table.config.max_positions)
//   y         [T, heads, D]  bf16, last dim contiguous; may be the same view as x (in place)
// Packed varlen prefill and decode are the same call: only the per-token position matters.
void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
          const TensorView& y);

}  // namespace lockstep::cpu
