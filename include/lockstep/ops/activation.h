// SiLU-and-mul (the Qwen3/LLaMA MLP gate): out = round(silu(g) * u) with
// silu(g) = g / (1 + ls_expf(-g)), all in fp32 with separate IEEE ops and ONE rounding to bf16.
// Purely elementwise: bits depend only on (g, u). Normative text: docs/contract.md §E
// "SiLU-and-mul".
#pragma once

#include "lockstep/tensor.h"

namespace lockstep::cpu {

// out[t, i] = round_bf16(silu(gate[t, i]) * up[t, i]).
//   gate, up [T, I] bf16, last dim contiguous, any row stride (e.g. the two halves of a fused
//            [T, 2I] gate_up buffer)
//   out      [T, I] bf16, last dim contiguous; may be the same view as gate or up
void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out);

// The fused vLLM layout: gate_up [T, 2I] = [gate | up] along the last dim; out [T, I].
// Same arithmetic as silu_mul on the two column halves.
void silu_and_mul(const TensorView& gate_up, const TensorView& out);

}  // namespace lockstep::cpu
