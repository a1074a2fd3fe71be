// PLACEHOLDER (being written): the CUDA attention backward (docs/contract.md §B.9).
#include "lockstep/cuda/backward.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
void attention_backward_varlen(const TensorView&, const TensorView&, const TensorView&,
                               const TensorView&, const TensorView&, const TensorView&,
                               const PackedSeqs&, const AttentionConfig&, const TensorView&,
                               const TensorView&, const TensorView&, void*) {
  LS_CHECK(false, "cuda::attention_backward_varlen", "not implemented yet");
}
}  // namespace lockstep::cuda
