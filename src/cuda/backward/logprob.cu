// PLACEHOLDER (being written): the CUDA linear log-prob backward (docs/contract.md §B.8).
#include "lockstep/cuda/backward.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
void linear_logprob_backward(const TensorView&, const TensorView&, const TensorView&,
                             const LogprobParams&, const ContractConfig&, const TensorView&,
                             const TensorView&, const TensorView&, const TensorView*,
                             const TensorView&, const TokenOrder&, const TensorView&, void*) {
  LS_CHECK(false, "cuda::linear_logprob_backward", "not implemented yet");
}
}  // namespace lockstep::cuda
