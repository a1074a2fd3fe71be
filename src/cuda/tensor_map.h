// TMA tensor maps of bf16 row-major matrices, shared by the GEMM launchers (gemm/sm90_launch.cuh:
// the wgmma tiles; gemm/small_m_launch.cuh: the small-M TMA tiles). Host code; the encoder is
// fetched from the driver at run time (no link dependency on libcuda).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>

namespace lockstep::cuda::detail {

// The driver's cuTensorMapEncodeTiled, or nullptr if the driver does not provide it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// [rows, K] bf16 with rows ld elements apart, read in boxes of 64 (k) x box_rows with the 128B
// swizzle and zero fill out of bounds. Returns the driver's result (CUDA_ERROR_NOT_SUPPORTED when
// there is no encoder).
CUresult encode_bf16_tensor_map(CUtensorMap* map, const uint16_t* p, int64_t rows, int64_t K,
                                int64_t ld, int box_rows);

// [rows, cols] f32 with rows ld elements apart, in boxes of 32 columns (128 bytes) x box_rows
// with the 128B swizzle, zero fill out of bounds (loads) and clipping (stores).
CUresult encode_f32_tensor_map(CUtensorMap* map, const float* p, int64_t rows, int64_t cols,
                               int64_t ld, int box_rows);

}  // namespace lockstep::cuda::detail
