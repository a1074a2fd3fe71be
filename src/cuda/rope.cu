// Launcher of cuda::rope (kernel: rope.cuh): checks every argument before the launch (the CPU
// op's rules, docs/contract.md §E.2, on device views; positions on the device are not read here),
// launches on the caller's stream, throws on a launch error.
#include <cuda_runtime.h>

#include "contract/checks.h"
#include "cuda/rope.cuh"
#include "lockstep/cuda/elementwise.h"

namespace lockstep::cuda {

void rope(const TensorView& x, const TensorView& positions, const TensorView& cos,
          const TensorView& sin, const TensorView& y, void* stream) {
  const char* op = "cuda::rope";
  using detail::check_device_view;
  check_device_view(op, "x", x, DType::kBF16, {-1, -1, -1});
  const int64_t T = x.shape[0], heads = x.shape[1], D = x.shape[2];
  LS_CHECK(D >= 2 && D % 2 == 0, op, "argument 'x': head_dim (dim 2) must be even and >= 2, got ",
           D);
  const int64_t half = D / 2;
  check_device_view(op, "cos", cos, DType::kF32, {-1, half});
  const int64_t P = cos.shape[0];
  LS_CHECK(P >= 1, op, "argument 'cos': expected at least one table row, got ", cos.shape_string());
  check_device_view(op, "sin", sin, DType::kF32, {P, half});
  contract::check_rope_args(op, Device::kCUDA, x, positions, D, P, y);
  const int64_t rows = T * heads;
  if (rows == 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (half <= 256 && 256 % half == 0 && rows < (int64_t(1) << 31) - 256) {
    detail::RopeRowsParams q{};
    q.x = static_cast<const uint16_t*>(x.data);
    q.y = static_cast<uint16_t*>(y.data);
    q.xs0 = x.stride[0];
    q.xs1 = x.stride[1];
    q.ys0 = y.stride[0];
    q.ys1 = y.stride[1];
    q.tab = detail::rope_table_ref(positions, cos, sin);
    q.rows = int32_t(rows);
    q.heads = int32_t(heads);
    const dim3 block{unsigned(half), unsigned(256 / half)};
    const unsigned blocks = unsigned((rows + block.y - 1) / block.y);
    detail::rope_rows_kernel<<<blocks, block, 0, st>>>(q);
    detail::check_launch(op);
    return;
  }
  detail::RopeParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.y = static_cast<uint16_t*>(y.data);
  p.xm = detail::row_map(x);
  p.ym = detail::row_map(y);
  p.tab = detail::rope_table_ref(positions, cos, sin);
  p.rows = rows;
  p.heads = heads;
  p.half = half;
  constexpr int kThreads = 256;
  detail::rope_kernel<<<detail::grid_for(rows * half, kThreads), kThreads, 0, st>>>(p);
  detail::check_launch(op);
}

}  // namespace lockstep::cuda
