// The GRPO loop's GPU (engine/grpo.h GrpoDevice): the invariant and baseline CUDA backends
// (engine/cuda/backends.h) and CudaAdamW (engine/cuda/optim.h), every step the CPU's bits. The
// rollout and training models are built over CudaAdamW's device bf16 weights (a device-to-device
// copy); the backward's weight copies and the sha256 take a host copy (Backprop reads host views).
#pragma once

#include "engine/grpo.h"

namespace lockstep::engine {

// Throws lockstep::Error when no CUDA device is usable.
GrpoDevice cuda_grpo_device();

}  // namespace lockstep::engine
