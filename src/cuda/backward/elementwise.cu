// PLACEHOLDER (being written): the CUDA elementwise backward (docs/contract.md §B.4-B.7).
#include "lockstep/cuda/backward.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
void rmsnorm_backward(const TensorView&, const TensorView&, const RmsNormConfig&, const TensorView&,
                      const TensorView&, const TokenOrder*, const TensorView*, void*) {
  LS_CHECK(false, "cuda::rmsnorm_backward", "not implemented yet");
}
void rmsnorm_residual_backward(const TensorView&, const TensorView&, const RmsNormConfig&,
                               const TensorView&, const TensorView&, const TensorView&,
                               const TokenOrder*, const TensorView*, void*) {
  LS_CHECK(false, "cuda::rmsnorm_residual_backward", "not implemented yet");
}
void rope_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                   const TensorView&, void*) {
  LS_CHECK(false, "cuda::rope_backward", "not implemented yet");
}
void silu_mul_backward(const TensorView&, const TensorView&, const TensorView&, void*) {
  LS_CHECK(false, "cuda::silu_mul_backward", "not implemented yet");
}
void embedding_backward(const TensorView&, const TensorView&, const TokenOrder&, const TensorView&,
                        void*) {
  LS_CHECK(false, "cuda::embedding_backward", "not implemented yet");
}
}  // namespace lockstep::cuda
