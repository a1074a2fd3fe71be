// RMSNorm (+ fused residual add) on the CPU, the executable form of docs/contract.md §E
// "RMSNorm": per row, sum of x*x (separate mul then add, fp32 RNE) in the 32-lane / 8-element-group
// layout of one warp with 16-byte loads, xor-butterfly over lanes; mean = sum / float(H);
// r = 1 / sqrt(mean + eps); y = round(round(x*r) * w). One task computes a whole row.
#include "lockstep/ops/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_common.h"
#include "cpu/norm_internal.h"

namespace lockstep {

namespace cpu {

namespace {

using norm_detail::rms_inv;

void normalize_row(const bf16* s, const bf16* w, int64_t H, float r, bf16* y) {
  for (int64_t k = 0; k < H; ++k) {
    // HF: (x * rsqrt).to(bf16), then weight * that, rounded to bf16 again.
    const bf16 t = f32_to_bf16(bf16_to_f32(s[k]) * r);
    y[k] = round_bf16_canonical(bf16_to_f32(t) * bf16_to_f32(w[k]));
  }
}

int64_t row_grain(int64_t H) { return std::max<int64_t>(1, 16384 / H); }

}  // namespace

void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
             const TensorView& y) {
  const int64_t H = contract::check_rmsnorm("rmsnorm", Device::kCPU, x, weight, cfg, y);
  const int64_t rows = x.numel() / H;
  if (rows == 0) return;

  const detail::RowAddr xa(x), ya(y);
  const bf16* w = weight.ptr<bf16>();
  const float eps = cfg.eps;
  parallel_for(rows, row_grain(H), [&](int64_t begin, int64_t end) {
    std::vector<bf16> buf(
        static_cast<size_t>(H));  // a copy of the row, so y may be the same view as x
    for (int64_t i = begin; i < end; ++i) {
      const bf16* xr = xa.row<const bf16>(i);
      std::copy(xr, xr + H, buf.begin());
      const float r = rms_inv(buf.data(), H, eps);
      normalize_row(buf.data(), w, H, r, ya.row<bf16>(i));
    }
  });
}

void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& residual_out,
                      const TensorView& y) {
  const int64_t H = contract::check_rmsnorm_residual("rmsnorm_residual", Device::kCPU, x, residual,
                                                     weight, cfg, residual_out, y);
  const int64_t rows = x.numel() / H;
  if (rows == 0) return;

  const detail::RowAddr xa(x), ra(residual), roa(residual_out), ya(y);
  const bf16* w = weight.ptr<bf16>();
  const float eps = cfg.eps;
  parallel_for(rows, row_grain(H), [&](int64_t begin, int64_t end) {
    std::vector<bf16> s(static_cast<size_t>(H));  // the new residual stream of this row
    for (int64_t i = begin; i < end; ++i) {
      const bf16* xr = xa.row<const bf16>(i);
      const bf16* rr = ra.row<const bf16>(i);
      for (int64_t k = 0; k < H; ++k) {
        s[size_t(k)] = round_bf16_canonical(bf16_to_f32(xr[k]) + bf16_to_f32(rr[k]));
      }
      std::copy(s.begin(), s.end(), roa.row<bf16>(i));
      const float r = rms_inv(s.data(), H, eps);
      normalize_row(s.data(), w, H, r, ya.row<bf16>(i));
    }
  });
}

}  // namespace cpu
}  // namespace lockstep
