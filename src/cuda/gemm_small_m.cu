// NOTE: placeholder until the small-M kernel lands: declines every case (the general kernel runs).
#include "cuda/gemm_small_m.cuh"

namespace lockstep::cuda::detail {

bool gemm_bf16_nt_small_m(const TensorView&, const TensorView&, const TensorView*,
                          const GemmConfig&, const TensorView&, cudaStream_t) {
  return false;
}

}  // namespace lockstep::cuda::detail
