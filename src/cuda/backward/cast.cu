// The backward's glue on the device: the f32 → bf16 rounding of an activation gradient where it
// becomes a tensor-core operand (docs/contract.md §B.0) and zero fills of gradient buffers.
#include <cuda_runtime.h>

#include "cuda/elementwise_common.cuh"
#include "lockstep/cuda/backward.h"

namespace lockstep::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void round_bf16_kernel(const float* src, int64_t lds, uint16_t* dst, int64_t ldd,
                                  int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ldd + c] = detail::f32_to_bf16_bits(src[r * lds + c]);
  }
}

// A view as rows: [rows, cols] with row stride ld (a 1-D view is one row of any element stride
// only when contiguous: checked).
struct Rows {
  int64_t rows, cols, ld;
};
Rows rows_of(const char* op, const char* arg, const TensorView& v) {
  LS_CHECK(v.device == Device::kCUDA, op, "argument '", arg, "' must be a CUDA view");
  LS_CHECK(v.ndim == 1 || v.ndim == 2, op, "argument '", arg, "' must be 1-D or 2-D, got ",
           v.shape_string());
  if (v.ndim == 1) {
    LS_CHECK(v.shape[0] <= 1 || v.stride[0] == 1, op, "argument '", arg, "' must be contiguous");
    return {1, v.shape[0], v.shape[0]};
  }
  LS_CHECK(v.shape[1] <= 1 || v.stride[1] == 1, op, "argument '", arg,
           "': the last dimension must be contiguous");
  return {v.shape[0], v.shape[1], v.stride[0]};
}

}  // namespace

void round_bf16(const TensorView& src, const TensorView& dst, void* stream) {
  const char* op = "cuda::round_bf16";
  LS_CHECK(src.dtype == DType::kF32, op, "argument 'src' must be f32");
  LS_CHECK(dst.dtype == DType::kBF16, op, "argument 'dst' must be bf16");
  const Rows s = rows_of(op, "src", src), d = rows_of(op, "dst", dst);
  LS_CHECK(s.rows == d.rows && s.cols == d.cols, op, "argument 'dst' has shape ",
           dst.shape_string(), ", src ", src.shape_string());
  if (s.rows * s.cols == 0) return;
  const int64_t n = s.rows * s.cols;
  const int blocks = int(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
  round_bf16_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const float*>(src.data), s.ld, static_cast<uint16_t*>(dst.data), d.ld, s.rows,
      s.cols);
  detail::check_launch(op);
}

void fill_zero(const TensorView& dst, void* stream) {
  const char* op = "cuda::fill_zero";
  LS_CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16, op,
           "argument 'dst' must be f32 or bf16");
  const Rows d = rows_of(op, "dst", dst);
  if (d.rows * d.cols == 0) return;
  const size_t es = size_t(dtype_size(dst.dtype));
  const cudaError_t e = cudaMemset2DAsync(dst.data, size_t(d.ld) * es, 0, size_t(d.cols) * es,
                                          size_t(d.rows), static_cast<cudaStream_t>(stream));
  LS_CHECK(e == cudaSuccess, op, "cudaMemset2DAsync: ", cudaGetErrorString(e));
}

}  // namespace lockstep::cuda
