// PLACEHOLDER (being written): the CUDA GEMM backward (docs/contract.md §B.3).
#include "lockstep/cuda/backward.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
void gemm_bf16_dx(const TensorView&, const TensorView&, const GemmConfig&, const TensorView&,
                  void*) {
  LS_CHECK(false, "cuda::gemm_bf16_dx", "not implemented yet");
}
void gemm_bf16_dx_partial(const TensorView&, const TensorView&, int64_t, int, int,
                          const GemmConfig&, const TensorView&, void*) {
  LS_CHECK(false, "cuda::gemm_bf16_dx_partial", "not implemented yet");
}
void gemm_bf16_dw(const TensorView&, const TensorView&, const TokenOrder&, const TensorView&,
                  void*) {
  LS_CHECK(false, "cuda::gemm_bf16_dw", "not implemented yet");
}
}  // namespace lockstep::cuda
