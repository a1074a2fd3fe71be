// Launchers of cuda::rmsnorm / cuda::rmsnorm_residual (kernel: norm.cuh). Every argument is
// checked before the launch with the CPU op's rules (docs/contract.md §E.1), on device views; the
// launch is asynchronous on the caller's stream and a launch error throws.
#include <cuda_runtime.h>

#include "contract/checks.h"
#include "cuda/norm.cuh"
#include "lockstep/cuda/elementwise.h"

namespace lockstep::cuda {
namespace {

// One launch for both ops: residual == nullptr is the plain rmsnorm (residual_out unused).
void launch(const char* op, const TensorView& x, const TensorView* residual,
            const TensorView& weight, const RmsNormConfig& cfg, const TensorView* residual_out,
            const TensorView& y, int64_t H, void* stream) {
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
  if (residual != nullptr) {
    p.res = static_cast<const uint16_t*>(residual->data);
    p.res_out = static_cast<uint16_t*>(residual_out->data);
    p.rm = detail::row_map(*residual);
    p.om = detail::row_map(*residual_out);
    p.vec = p.vec && detail::rows_16b_aligned(*residual) && detail::rows_16b_aligned(*residual_out);
  }
  if (p.rows == 0) return;
  const unsigned blocks = unsigned((p.rows + detail::kNormWarps - 1) / detail::kNormWarps);
  LS_CHECK(p.rows <= int64_t(0x7fffffff) * detail::kNormWarps, op, "too many rows: ", p.rows);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = 32 * detail::kNormWarps;
  // Rows held in registers (norm.cuh: one memory round trip per row) when whole 16-byte groups
  // cover them: 8 <= H <= 4096; the same bits as the general kernel.
  const int64_t gpl = (H / 8 + 31) / 32;    // groups per lane
  const int64_t gpt = (H / 8 + 127) / 128;  // groups per thread of a CTA per row
  if (p.vec && H % 8 == 0 && H >= 1024 && gpt <= 8 && p.rows <= 0x7fffffff) {
    const unsigned rows = unsigned(p.rows);
    if (gpt <= 1) {
      detail::rmsnorm_cta_kernel<1><<<rows, 128, 0, s>>>(p);
    } else if (gpt <= 2) {
      detail::rmsnorm_cta_kernel<2><<<rows, 128, 0, s>>>(p);
    } else if (gpt <= 4) {
      detail::rmsnorm_cta_kernel<4><<<rows, 128, 0, s>>>(p);
    } else {
      detail::rmsnorm_cta_kernel<8><<<rows, 128, 0, s>>>(p);
    }
  } else if (p.vec && H % 8 == 0 && gpl <= 16) {
    if (gpl <= 1) {
      detail::rmsnorm_regs_kernel<1><<<blocks, threads, 0, s>>>(p);
    } else if (gpl <= 2) {
      detail::rmsnorm_regs_kernel<2><<<blocks, threads, 0, s>>>(p);
    } else if (gpl <= 4) {
      detail::rmsnorm_regs_kernel<4><<<blocks, threads, 0, s>>>(p);
    } else if (gpl <= 8) {
      detail::rmsnorm_regs_kernel<8><<<blocks, threads, 0, s>>>(p);
    } else {
      detail::rmsnorm_regs_kernel<16><<<blocks, threads, 0, s>>>(p);
    }
  } else {
    detail::rmsnorm_kernel<<<blocks, threads, 0, s>>>(p);
  }
  detail::check_launch(op);
}

}  // namespace

void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
             const TensorView& y, void* stream) {
  const char* op = "cuda::rmsnorm";
  const int64_t H = contract::check_rmsnorm(op, Device::kCUDA, x, weight, cfg, y);
  launch(op, x, nullptr, weight, cfg, nullptr, y, H, stream);
}

void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& residual_out, const TensorView& y,
                      void* stream) {
  const char* op = "cuda::rmsnorm_residual";
  const int64_t H = contract::check_rmsnorm_residual(op, Device::kCUDA, x, residual, weight, cfg,
                                                     residual_out, y);
  launch(op, x, &residual, weight, cfg, &residual_out, y, H, stream);
}

}  // namespace lockstep::cuda
