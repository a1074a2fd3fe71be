// RMSNorm (+ fused residual add) on the CPU, the executable form of docs/contract.md §E
// "RMSNorm": per row, sum of x*x (separate mul then add, fp32 RNE) in the 32-lane / 8-element-group
// layout of one warp with 16-byte loads, xor-butterfly over lanes; mean = sum / float(H);
// r = 1 / sqrt(mean + eps); y = round(round(x*r) * w). One task computes a whole row.
#include "lockstep/ops/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/checks.h"
#include "cpu/elementwise_common.h"

namespace lockstep {

void RmsNormConfig::validate() const {
  LS_CHECK(std::isfinite(eps) && eps >= 0.0f, "RmsNormConfig", "eps must be finite and >= 0, got ",
           eps);
}

std::string RmsNormConfig::to_string() const {
  char buf[128];
  std::snprintf(buf, sizeof buf, "rmsnorm: eps=%a (%.9g) lanes=%d group=%d", double(eps),
                double(eps), kRmsNormLanes, kRmsNormGroup);
  return buf;
}

namespace cpu {
namespace check_detail {
namespace {

// x is [T, H] or [T, heads, D]; every other row tensor must have exactly x's shape.
void check_rows_like(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  if (x.ndim == 2) {
    check_tensor(op, arg, t, DType::kBF16, {x.shape[0], x.shape[1]});
  } else {
    check_tensor(op, arg, t, DType::kBF16, {x.shape[0], x.shape[1], x.shape[2]});
  }
  check_inner_contiguous(op, arg, t);
}

void check_x(const char* op, const TensorView& x) {
  LS_CHECK(x.ndim == 2 || x.ndim == 3, op,
           "argument 'x' expected shape [T, H] or [T, heads, D], got ", x.shape_string());
  LS_CHECK(x.dtype == DType::kBF16, op, "argument 'x' expected dtype bf16, got ",
           dtype_name(x.dtype));
  LS_CHECK(x.device == Device::kCPU, op, "argument 'x' expected device cpu, got ",
           device_name(x.device));
  LS_CHECK(x.shape[x.ndim - 1] >= 1, op, "argument 'x' expected a last dimension >= 1, got ",
           x.shape_string());
  check_rows_like(op, "x", x, x);
}

void check_weight(const char* op, const TensorView& w, int64_t H) {
  check_tensor(op, "weight", w, DType::kBF16, {H});
  check_inner_contiguous(op, "weight", w);
}

}  // namespace

int64_t check_rmsnorm(const char* op, const TensorView& x, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& y) {
  cfg.validate();
  check_x(op, x);
  const int64_t H = x.shape[x.ndim - 1];  // hidden (or head_dim for q/k norm)
  check_weight(op, weight, H);
  check_rows_like(op, "y", y, x);
  return H;
}

int64_t check_rmsnorm_residual(const char* op, const TensorView& x, const TensorView& residual,
                               const TensorView& weight, const RmsNormConfig& cfg,
                               const TensorView& residual_out, const TensorView& y) {
  cfg.validate();
  check_x(op, x);
  const int64_t H = x.shape[x.ndim - 1];
  check_rows_like(op, "residual", residual, x);
  check_weight(op, weight, H);
  check_rows_like(op, "residual_out", residual_out, x);
  check_rows_like(op, "y", y, x);
  LS_CHECK(residual_out.data != y.data || x.numel() == 0, op,
           "outputs 'residual_out' and 'y' must not be the same memory");
  return H;
}

}  // namespace check_detail

namespace {

// The contract's reduction: sum of squares of one row in the fixed lane layout, then r.
// NOTE: x*x of a bf16 value is exact in fp32 (8-bit significands), except when it overflows
// (|x| >= 2^64) or leaves the normal range (|x| < 2^-63); so mul-then-add vs fma only differs
// there, and we state the separate mul (the -fmad=false GPU form).
float rms_inv(const bf16* s, int64_t H, float eps) {
  float lane[kRmsNormLanes];
  for (float& l : lane) l = 0.0f;  // +0: lanes that own no group contribute +0
  // Group g (elements 8g .. 8g+7, the last one possibly partial: absent elements are skipped,
  // which equals adding +0) belongs to lane g % 32; each lane adds its elements in ascending order.
  const int64_t groups = (H + kRmsNormGroup - 1) / kRmsNormGroup;
  for (int64_t g = 0; g < groups; ++g) {
    float acc = lane[g % kRmsNormLanes];
    const int64_t end = std::min<int64_t>(H, (g + 1) * kRmsNormGroup);
    for (int64_t k = g * kRmsNormGroup; k < end; ++k) {
      const float v = bf16_to_f32(s[k]);
      const float sq = v * v;
      acc = acc + sq;
    }
    lane[g % kRmsNormLanes] = acc;
  }
  // xor-butterfly, offsets 16, 8, 4, 2, 1: lane j's value becomes lane[j] + lane[j ^ o]; we keep
  // only the lanes that still feed lane 0 (every lane ends with the same bits: + is commutative).
  for (int o = kRmsNormLanes / 2; o >= 1; o /= 2) {
    for (int j = 0; j < o; ++j) lane[j] = lane[j] + lane[j + o];
  }
  const float mean = lane[0] / float(H);
  return 1.0f / std::sqrt(mean + eps);
}

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
  const int64_t H = check_detail::check_rmsnorm("rmsnorm", x, weight, cfg, y);
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
  const int64_t H = check_detail::check_rmsnorm_residual("rmsnorm_residual", x, residual, weight,
                                                         cfg, residual_out, y);
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
