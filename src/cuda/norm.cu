// Launchers of cuda::rmsnorm / cuda::rmsnorm_residual (kernel: norm.cuh). Every argument is
// checked before the launch with the CPU op's rules (docs/contract.md §E.1), on device views; the
// launch is asynchronous on the caller's stream and a launch error throws.
#include <cuda_runtime.h>

#include "cuda/norm.cuh"
#include "lockstep/cuda/elementwise.h"

namespace lockstep::cuda {
namespace {

using detail::check_device_view;

// Every row tensor has exactly x's shape ([T, H] or [T, heads, D]).
void check_rows_like(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  if (x.ndim == 2) {
    check_device_view(op, arg, t, DType::kBF16, {x.shape[0], x.shape[1]});
  } else {
    check_device_view(op, arg, t, DType::kBF16, {x.shape[0], x.shape[1], x.shape[2]});
  }
}

int64_t check_x_weight(const char* op, const TensorView& x, const TensorView& weight) {
  LS_CHECK(x.ndim == 2 || x.ndim == 3, op,
           "argument 'x' expected shape [T, H] or [T, heads, D], got ", x.shape_string());
  LS_CHECK(x.dtype == DType::kBF16, op, "argument 'x' expected dtype bf16, got ",
           dtype_name(x.dtype));
  LS_CHECK(x.device == Device::kCUDA, op, "argument 'x' expected device cuda, got ",
           device_name(x.device));
  LS_CHECK(x.shape[x.ndim - 1] >= 1, op, "argument 'x' expected a last dimension >= 1, got ",
           x.shape_string());
  check_rows_like(op, "x", x, x);
  const int64_t H = x.shape[x.ndim - 1];
  check_device_view(op, "weight", weight, DType::kBF16, {H});
  return H;
}

void launch(const detail::RmsNormParams& p, void* stream, const char* op) {
  if (p.rows == 0) return;
  const unsigned blocks = unsigned((p.rows + detail::kNormWarps - 1) / detail::kNormWarps);
  LS_CHECK(p.rows <= int64_t(0x7fffffff) * detail::kNormWarps, op, "too many rows: ", p.rows);
  detail::rmsnorm_kernel<<<blocks, 32 * detail::kNormWarps, 0, static_cast<cudaStream_t>(stream)>>>(
      p);
  detail::check_launch(op);
}

}  // namespace

void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
             const TensorView& y, void* stream) {
  const char* op = "cuda::rmsnorm";
  cfg.validate();
  const int64_t H = check_x_weight(op, x, weight);
  check_rows_like(op, "y", y, x);
  detail::RmsNormParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.w = static_cast<const uint16_t*>(weight.data);
  p.y = static_cast<uint16_t*>(y.data);
  p.xm = detail::row_map(x);
  p.ym = detail::row_map(y);
  p.rows = x.numel() / H;
  p.H = H;
  p.eps = cfg.eps;
  p.vec = detail::rows_16b_aligned(x) && detail::rows_16b_aligned(y) &&
          detail::rows_16b_aligned(weight);
  launch(p, stream, op);
}

void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& residual_out, const TensorView& y,
                      void* stream) {
  const char* op = "cuda::rmsnorm_residual";
  cfg.validate();
  const int64_t H = check_x_weight(op, x, weight);
  check_rows_like(op, "residual", residual, x);
  check_rows_like(op, "residual_out", residual_out, x);
  check_rows_like(op, "y", y, x);
  LS_CHECK(residual_out.data != y.data || x.numel() == 0, op,
           "outputs 'residual_out' and 'y' must not be the same memory");
  detail::RmsNormParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.res = static_cast<const uint16_t*>(residual.data);
  p.w = static_cast<const uint16_t*>(weight.data);
  p.res_out = static_cast<uint16_t*>(residual_out.data);
  p.y = static_cast<uint16_t*>(y.data);
  p.xm = detail::row_map(x);
  p.rm = detail::row_map(residual);
  p.om = detail::row_map(residual_out);
  p.ym = detail::row_map(y);
  p.rows = x.numel() / H;
  p.H = H;
  p.eps = cfg.eps;
  p.vec = detail::rows_16b_aligned(x) && detail::rows_16b_aligned(residual) &&
          detail::rows_16b_aligned(residual_out) && detail::rows_16b_aligned(y) &&
          detail::rows_16b_aligned(weight);
  launch(p, stream, op);
}

}  // namespace lockstep::cuda
