// Helpers of the argument checks (checks.h) shared by every op's contract file.
#include "contract/checks.h"

namespace lockstep::contract {

int64_t index_at(const TensorView& t, int64_t i) {
  const int64_t off = i * t.stride[0];
  return t.dtype == DType::kI32 ? int64_t(t.ptr<const int32_t>()[off])
                                : t.ptr<const int64_t>()[off];
}

void check_host_view(const char* op, const char* arg, const TensorView& t) {
  LS_CHECK(t.device == Device::kCPU, op, "argument '", arg,
           "' must be a host view (its contents are validated on the host), got ", t.describe());
}

void check_view(const char* op, const char* arg, const TensorView& t, DType dtype,
                std::initializer_list<int64_t> shape, Device dev) {
  check_tensor(op, arg, t, dtype, shape, dev);
  check_inner_contiguous(op, arg, t);
}

}  // namespace lockstep::contract
