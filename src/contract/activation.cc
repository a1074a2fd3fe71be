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

GateUpHalves split_gate_up(const char* op, Device dev, const TensorView& gate_up,
                           const TensorView& out) {
  check_view(op, "gate_up", gate_up, DType::kBF16, {-1, -1}, dev);
  const int64_t T = gate_up.shape[0], I2 = gate_up.shape[1];
  LS_CHECK(I2 >= 2 && I2 % 2 == 0, op,
           "argument 'gate_up' expected shape [T, 2I] with I >= 1, got ", gate_up.shape_string());
  const int64_t I = I2 / 2;
  check_view(op, "out", out, DType::kBF16, {T, I}, dev);
  GateUpHalves h{gate_up, gate_up};
  h.gate.shape[1] = I;
  h.up.shape[1] = I;
  h.up.data = gate_up.ptr<bf16>() + I;
  return h;
}

}  // namespace lockstep::contract
