// TMA tensor maps (tensor_map.h).
#include <cuda_runtime.h>

#include "cuda/tensor_map.h"

namespace lockstep::cuda::detail {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                           cudaEnableDefault, &q);
    return (e == cudaSuccess && q == cudaDriverEntryPointSuccess)
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f)
               : nullptr;
  }();
  return fn;
}

namespace {

// [rows, cols] of elem_bytes-byte elements, rows ld elements apart, in boxes of 128 bytes (one
// swizzle row) x box_rows with the 128B swizzle; zero fill out of bounds (loads), clipping
// (stores).
CUresult encode_sw128_2d(CUtensorMap* map, CUtensorMapDataType dtype, int elem_bytes, const void* p,
                         int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  // One row: the stride is never used; any legal value (a multiple of 16 covering the row).
  const cuuint64_t strides[1] = {rows > 1 ? cuuint64_t(ld) * elem_bytes
                                          : cuuint64_t((cols * elem_bytes + 15) / 16 * 16)};
  const cuuint32_t box[2] = {cuuint32_t(128 / elem_bytes), cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode(map, dtype, 2, const_cast<void*>(p), dims, strides, box, estr,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace

CUresult encode_bf16_tensor_map(CUtensorMap* map, const uint16_t* p, int64_t rows, int64_t K,
                                int64_t ld, int box_rows) {
  return encode_sw128_2d(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p, rows, K, ld, box_rows);
}

CUresult encode_f32_tensor_map(CUtensorMap* map, const float* p, int64_t rows, int64_t cols,
                               int64_t ld, int box_rows) {
  return encode_sw128_2d(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p, rows, cols, ld, box_rows);
}

}  // namespace lockstep::cuda::detail
