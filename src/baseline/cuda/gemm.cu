// Baseline GEMM (cuBLAS) and the plain rank-order sums of row-parallel partials (declared in
// cuda/baseline.h). cuBLAS chooses its algorithm (tile, split-K, GEMV-like kernels) from M, N and
// K: the same row gets different bits in different batches, as in every inference stack.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>

#include "baseline/cuda/common.cuh"

namespace lockstep::cuda::baseline {

namespace {

struct Parts {
  const void* p[kMaxParts];
  int64_t ld[kMaxParts];
};

// y = Σ parts in rank order (fp32), one rounding. One thread per element, grid-stride.
template <bool kBf16In>
__global__ void sum_kernel(Parts parts, int n, int64_t M, int64_t N, void* y, int64_t ldy,
                           bool y_f32) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, c = i % N;
    float acc = 0.0f;
    for (int r = 0; r < n; ++r) {
      const float v = kBf16In ? bf(static_cast<const uint16_t*>(parts.p[r])[m * parts.ld[r] + c])
                              : static_cast<const float*>(parts.p[r])[m * parts.ld[r] + c];
      acc = r == 0 ? v : acc + v;
    }
    if (y_f32) {
      static_cast<float*>(y)[m * ldy + c] = acc;
    } else {
      static_cast<uint16_t*>(y)[m * ldy + c] = to_bf(acc);
    }
  }
}

__global__ void zero_rows_kernel(void* y, int64_t ldy, int64_t M, int64_t N, int esize) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / N, c = i % N;
    if (esize == 4) {
      static_cast<float*>(y)[m * ldy + c] = 0.0f;
    } else {
      static_cast<uint16_t*>(y)[m * ldy + c] = 0;
    }
  }
}

unsigned grid_for(int64_t total) { return grid_1d(total, 256, 65535 * 8); }

}  // namespace

void gemm(const Context& ctx, const void* x, int64_t ldx, const void* w, int64_t ldw, void* y,
          int64_t ldy, bool y_f32, int64_t M, int64_t N, int64_t K, void* stream) {
  const char* op = "baseline gemm (cuBLAS)";
  if (M == 0 || N == 0) return;
  if (K == 0) {
    zero_rows_kernel<<<grid_for(M * N), 256, 0, as_stream(stream)>>>(y, ldy, M, N, y_f32 ? 4 : 2);
    LS_BASE_LAUNCHED(op);
    return;
  }
  LS_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && ldx <= INT_MAX && ldw <= INT_MAX &&
               ldy <= INT_MAX,
           op, "sizes M=", M, " N=", N, " K=", K, " exceed cuBLAS's int range");
  cublasHandle_t h = static_cast<cublasHandle_t>(ctx.cublas());
  cublasStatus_t st = cublasSetStream(h, as_stream(stream));
  LS_CHECK(st == CUBLAS_STATUS_SUCCESS, op, "cublasSetStream failed: ", cublasGetStatusString(st));
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[M, N] = x·wᵀ is column-major yᵀ[N, M] = wᵀ(op T of w's [K, N]) · xᵀ([K, M]).
  st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w, CUDA_R_16BF,
                    int(ldw), x, CUDA_R_16BF, int(ldx), &beta, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF,
                    int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  LS_CHECK(st == CUBLAS_STATUS_SUCCESS, op, "cublasGemmEx(M=", M, ", N=", N, ", K=", K,
           ") failed: ", cublasGetStatusString(st));
}

void sum_parts(const void* const* parts, bool parts_bf16, const int64_t* lds, int n, int64_t M,
               int64_t N, void* y, int64_t ldy, bool y_f32, void* stream) {
  const char* op = parts_bf16 ? "baseline embedding_combine" : "baseline gemm_combine";
  LS_CHECK(n >= 1 && n <= kMaxParts, op, "expected 1..", kMaxParts, " partials, got ", n);
  if (M == 0 || N == 0) return;
  Parts p{};
  for (int i = 0; i < n; ++i) {
    p.p[i] = parts[i];
    p.ld[i] = lds[i];
  }
  if (parts_bf16) {
    sum_kernel<true><<<grid_for(M * N), 256, 0, as_stream(stream)>>>(p, n, M, N, y, ldy, y_f32);
  } else {
    sum_kernel<false><<<grid_for(M * N), 256, 0, as_stream(stream)>>>(p, n, M, N, y, ldy, y_f32);
  }
  LS_BASE_LAUNCHED(op);
}

}  // namespace lockstep::cuda::baseline
