// Launchers of cuda::silu_mul and silu_and_mul (kernel: activation.cuh): argument checks before the
// launch (the contract's checks, docs/contract.md §E.3, on device views), asynchronous launch,
// launch errors throw.
#include <cuda_runtime.h>

#include "contract/checks.h"
#include "cuda/activation.cuh"
#include "lockstep/cuda/elementwise.h"

namespace lockstep::cuda {

void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out, void* stream) {
  const char* op = "cuda::silu_mul";
  contract::check_silu_mul(op, Device::kCUDA, gate, up, out);
  const int64_t T = gate.shape[0], I = gate.shape[1];
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
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool vec = I % 8 == 0 && T <= 65535 && detail::rows_16b_aligned(gate) &&
                   detail::rows_16b_aligned(up) && detail::rows_16b_aligned(out);
  if (vec) {
    const dim3 grid{unsigned((I / 8 + kThreads - 1) / kThreads), unsigned(T)};
    detail::silu_mul_vec_kernel<<<grid, kThreads, 0, s>>>(p);
  } else {
    detail::silu_mul_kernel<<<detail::grid_for(T * I, kThreads), kThreads, 0, s>>>(p);
  }
  detail::check_launch(op);
}

void silu_and_mul(const TensorView& gate_up, const TensorView& out, void* stream) {
  const contract::GateUpHalves h =
      contract::split_gate_up("cuda::silu_and_mul", Device::kCUDA, gate_up, out);
  silu_mul(h.gate, h.up, out, stream);
}

}  // namespace lockstep::cuda
