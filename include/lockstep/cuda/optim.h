// The AdamW kernels on the GPU (src/cuda/optim.cu): the canonical gradient sum of squares and the
// elementwise update of engine::AdamW (src/engine/optim.h, docs/training-optimizer.md), the same
// IEEE double operations in the same order, so the bits equal the CPU's. The optimizer object
// that holds the state (engine::CudaAdamW, src/engine/cuda/optim.h) calls these.
// Plain C++ header: device pointers live in TensorViews with device == Device::kCUDA; `stream` is
// an opaque cudaStream_t (nullptr = the legacy default stream). Arguments are checked before any
// launch (lockstep::Error naming the op and the argument).
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/tensor.h"

namespace lockstep::cuda {

// Elements per chunk of the gradient norm's canonical sum (engine/optim.h's definition).
constexpr int64_t kNormChunk = 65536;

// The sum of squares of every chunk of every gradient: grads[k] is cut into chunks of kNormChunk
// elements, and each chunk's value is the sequential double chain s = s + double(g)·double(g)
// from +0 in element order. Returned on the host in tensor order, then chunk order
// (Σ_k ceil(numel_k / kNormChunk) values; an empty tensor has none). Waits for the stream.
// grads: f32, contiguous, on the device, any shapes.
std::vector<double> sum_of_squares_chunks(const std::vector<TensorView>& grads,
                                          void* stream = nullptr);

// One step's constants, computed on the host exactly as engine::AdamW::step does.
struct AdamWStepConsts {
  double beta1 = 0, beta2 = 0, eps = 0;
  double one_minus_beta1 = 0, one_minus_beta2 = 0;  // 1 − β1, 1 − β2
  double c1 = 0, c2 = 0;                            // 1 − β1^t, 1 − β2^t
  double clip_scale = 1, lr = 0;
};

// One tensor of the update: all views contiguous, on the device, with the same element count, and
// no two of them (nor two tensors' views) overlapping.
struct AdamWTensor {
  TensorView grad;          // f32, read
  TensorView master, m, v;  // f32, updated in place
  TensorView weight;        // bf16, written: round to nearest even of the new master
  double weight_decay = 0;  // 0 for 1-D weights (the caller decides)
};

// Per element, in double from the fp32 state (engine::AdamW::step's chain, optim.h):
//   g' = g·s; m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·(g'·g');
//   m̂ = m/c1; v̂ = v/c2; w = w − lr·(m̂/(sqrt(v̂)+eps) + wd·w)
// stored as fp32 (RNE), and weight = f32_to_bf16(stored w). Asynchronous on `stream`.
void adamw_update(const std::vector<AdamWTensor>& tensors, const AdamWStepConsts& c,
                  void* stream = nullptr);

}  // namespace lockstep::cuda
