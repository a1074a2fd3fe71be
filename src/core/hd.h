// Host/device qualifiers: one source for CPU and CUDA code paths.
#pragma once

#if defined(__CUDACC__)
#define LS_HD __host__ __device__ __forceinline__
#define LS_DEVICE __device__ __forceinline__
#else
#define LS_HD inline
#define LS_DEVICE inline
#endif
