// The argument checks of the elementwise backward ops (docs/contract.md §B.5 RoPE, §B.6
// SiLU-and-mul). Everything is checked before anything is written.
#include "contract/checks.h"

namespace lockstep::contract {
namespace {

// Exactly the same view (data, shape and strides): the supported in-place form.
bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.stride[i] != b.stride[i])) return false;
  return true;
}

}  // namespace

void check_rope_backward(const char* op, Device dev, const TensorView& gy,
                         const TensorView& positions, const RopeTable& table,
                         const TensorView& dx) {
  table.config.validate();
  const int64_t D = table.config.head_dim, half = D / 2, P = table.config.max_positions;
  LS_CHECK(int64_t(table.cos.size()) == P * half && int64_t(table.sin.size()) == P * half, op,
           "argument 'table' has ", table.cos.size(), " cos and ", table.sin.size(),
           " sin entries, expected ", P * half, " each (build it with RopeTable::build)");
  check_tensor(op, "gy", gy, DType::kF32, {-1, -1, D}, dev);
  check_inner_contiguous(op, "gy", gy);
  const int64_t T = gy.shape[0], heads = gy.shape[1];
  check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T}, dev);
  check_tensor(op, "dx", dx, DType::kF32, {T, heads, D}, dev);
  check_inner_contiguous(op, "dx", dx);
  LS_CHECK(same_view(dx, gy) || !overlaps(dx, gy), op,
           "argument 'dx' overlaps 'gy' without being the same view (in place: pass gy as dx)");
  if (dev != Device::kCPU) return;  // device positions: the kernel guards them
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = index_at(positions, t);
    LS_CHECK(p >= 0 && p < P, op, "argument 'positions' element ", t, " = ", p,
             " is outside the table's range [0, ", P, ")");
  }
}

int64_t check_silu_mul_backward(const char* op, Device dev, const TensorView& gate_up,
                                const TensorView& ga, const TensorView& dgu) {
  check_tensor(op, "gate_up", gate_up, DType::kBF16, {-1, -1}, dev);
  check_inner_contiguous(op, "gate_up", gate_up);
  const int64_t T = gate_up.shape[0], I2 = gate_up.shape[1];
  LS_CHECK(I2 >= 2 && I2 % 2 == 0, op,
           "argument 'gate_up' expected shape [T, 2I] with I >= 1, got ", gate_up.shape_string());
  const int64_t I = I2 / 2;
  check_tensor(op, "ga", ga, DType::kF32, {T, I}, dev);
  check_inner_contiguous(op, "ga", ga);
  check_tensor(op, "dgu", dgu, DType::kF32, {T, I2}, dev);
  check_inner_contiguous(op, "dgu", dgu);
  LS_CHECK(!overlaps(dgu, gate_up), op, "argument 'dgu' overlaps 'gate_up'");
  LS_CHECK(!overlaps(dgu, ga), op, "argument 'dgu' overlaps 'ga'");
  return I;
}

}  // namespace lockstep::contract
