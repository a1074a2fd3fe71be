// Launcher of cuda::silu_mul (kernel: activation.cuh): argument checks before the launch (the
// CPU op's rules, docs/contract.md §E.3, on device views), asynchronous launch, launch errors
// throw.
#include <cuda_runtime.h>

#include "cuda/activation.cuh"
#include "lockstep/cuda/elementwise.h"

namespace lockstep::cuda {

void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out, void* stream) {
  const char* op = "cuda::silu_mul";
  using detail::check_device_view;
  check_device_view(op, "gate", gate, DType::kBF16, {-1, -1});
  const int64_t T = gate.shape[0], I = gate.shape[1];
  LS_CHECK(I >= 1, op, "argument 'gate' expected a last dimension >= 1, got ", gate.shape_string());
  check_device_view(op, "up", up, DType::kBF16, {T, I});
  check_device_view(op, "out", out, DType::kBF16, {T, I});
  if (T == 0) return;
  detail::SiluMulParams p{};
  p.gate = static_cast<const uint16_t*>(gate.data);
  p.up = static_cast<const uint16_t*>(up.data);
  p.out = static_cast<uint16_t*>(out.data);
  p.lg = gate.stride[0];
  p.lu = up.stride[0];
  p.lo = out.stride[0];
  p.T = T;
  p.I = I;
  constexpr int kThreads = 256;
  detail::silu_mul_kernel<<<detail::grid_for(T * I, kThreads), kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(p);
  detail::check_launch(op);
}

}  // namespace lockstep::cuda
