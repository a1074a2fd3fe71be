// The SiLU-and-mul contract (docs/contract.md §E): argument checks.
#include "contract/checks.h"

namespace lockstep::contract {

void check_silu_mul(const char* op, Device dev, const TensorView& gate, const TensorView& up,
                    const TensorView& out) {
  check_tensor(op, "gate", gate, DType::kBF16, {-1, -1}, dev);
  check_inner_contiguous(op, "gate", gate);
  const int64_t T = gate.shape[0], I = gate.shape[1];
  LS_CHECK(I >= 1, op, "argument 'gate' expected a last dimension >= 1, got ", gate.shape_string());
  check_tensor(op, "up", up, DType::kBF16, {T, I}, dev);
  check_inner_contiguous(op, "up", up);
  check_tensor(op, "out", out, DType::kBF16, {T, I}, dev);
  check_inner_contiguous(op, "out", out);
}

}  // namespace lockstep::contract
