// The engine's CUDA backends (built when CUDA is on, in lockstep_cuda):
//   invariant — every op is the lockstep::cuda op of the same name: the contract's bits, equal to
//               the CPU invariant backend (docs/contract.md);
//   baseline  — ordinary fast kernels (cuBLAS GEMM, batch-dependent split-KV, plain reductions):
//               the performance peer, not batch-invariant (docs/baseline.md).
// Both keep every tensor on the GPU (OpsBackend::device() == Device::kCUDA).
#pragma once

#include <memory>

#include "engine/backend.h"

namespace lockstep::engine {

std::unique_ptr<OpsBackend> make_cuda_invariant_backend();
std::unique_ptr<OpsBackend> make_cuda_baseline_backend();

}  // namespace lockstep::engine
