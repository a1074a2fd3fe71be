// The SiLU-and-mul contract (docs/contract.md §E): argument checks.
#include "contract/checks.h"

namespace lockstep::contract {

void check_silu_mul(const char* op, Device dev, const TensorView& gate, const TensorView& up,
                    const TensorView& out) {
  check_view(op, "gate", gate, DType::kBF16, {-1, -1}, dev);
  const int64_t T = gate.shape[0], I = gate.shape[1];
  LS_CHECK(I >= 1, op, "argument 'gate' expected a last dimension >= 1, got ", gate.shape_string());
  check_view(op, "up", up, DType::kBF16, {T, I}, dev);
  check_view(op, "out", out, DType::kBF16, {T, I}, dev);
}

}  // namespace lockstep::contract
