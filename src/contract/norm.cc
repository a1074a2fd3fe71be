// The RMSNorm contract (docs/contract.md §E): settings and argument checks.
#include "lockstep/contract/norm.h"

#include <cmath>
#include <cstdio>

#include "contract/checks.h"

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

}  // namespace lockstep

namespace lockstep::contract {

void check_norm_rows(const char* op, Device dev, const char* arg, const TensorView& t,
                     const TensorView& x, DType dtype) {
  if (x.ndim == 2) {
    check_tensor(op, arg, t, dtype, {x.shape[0], x.shape[1]}, dev);
  } else {
    check_tensor(op, arg, t, dtype, {x.shape[0], x.shape[1], x.shape[2]}, dev);
  }
  check_inner_contiguous(op, arg, t);
}

void check_norm_input(const char* op, Device dev, const char* arg, const TensorView& x) {
  LS_CHECK(x.ndim == 2 || x.ndim == 3, op, "argument '", arg,
           "' expected shape [T, H] or [T, heads, D], got ", x.shape_string());
  LS_CHECK(x.dtype == DType::kBF16, op, "argument '", arg, "' expected dtype bf16, got ",
           dtype_name(x.dtype));
  LS_CHECK(x.device == dev, op, "argument '", arg, "' expected device ", device_name(dev), ", got ",
           device_name(x.device));
  LS_CHECK(x.shape[x.ndim - 1] >= 1, op, "argument '", arg,
           "' expected a last dimension >= 1, got ", x.shape_string());
  check_norm_rows(op, dev, arg, x, x, DType::kBF16);
}

namespace {

void check_rows_like(const char* op, Device dev, const char* arg, const TensorView& t,
                     const TensorView& x) {
  check_norm_rows(op, dev, arg, t, x, DType::kBF16);
}

void check_x(const char* op, Device dev, const TensorView& x) { check_norm_input(op, dev, "x", x); }

void check_weight(const char* op, Device dev, const TensorView& w, int64_t H) {
  check_view(op, "weight", w, DType::kBF16, {H}, dev);
}

}  // namespace

int64_t check_rmsnorm(const char* op, Device dev, const TensorView& x, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& y) {
  cfg.validate();
  check_x(op, dev, x);
  const int64_t H = x.shape[x.ndim - 1];  // hidden (or head_dim for q/k norm)
  check_weight(op, dev, weight, H);
  check_rows_like(op, dev, "y", y, x);
  return H;
}

int64_t check_rmsnorm_residual(const char* op, Device dev, const TensorView& x,
                               const TensorView& residual, const TensorView& weight,
                               const RmsNormConfig& cfg, const TensorView& residual_out,
                               const TensorView& y) {
  cfg.validate();
  check_x(op, dev, x);
  const int64_t H = x.shape[x.ndim - 1];
  check_rows_like(op, dev, "residual", residual, x);
  check_weight(op, dev, weight, H);
  check_rows_like(op, dev, "residual_out", residual_out, x);
  check_rows_like(op, dev, "y", y, x);
  LS_CHECK(residual_out.data != y.data || x.numel() == 0, op,
           "outputs 'residual_out' and 'y' must not be the same memory");
  return H;
}

}  // namespace lockstep::contract
