// The RMSNorm backward's argument checks (docs/contract.md §B.4), one definition for every
// backend.
#include "contract/checks.h"

namespace lockstep::contract {

namespace {

void check_like_s(const char* op, Device dev, const char* arg, const TensorView& t,
                  const TensorView& s) {
  check_norm_rows(op, dev, arg, t, s, DType::kF32);
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.ndim != b.ndim || a.dtype != b.dtype) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.stride[i] != b.stride[i])) return false;
  return true;
}

}  // namespace

int64_t check_rmsnorm_backward(const char* op, Device dev, const TensorView& s,
                               const TensorView& weight, const RmsNormConfig& cfg,
                               const TensorView& gy, const TensorView* gres, const TensorView& dx,
                               const TokenOrder* order, const TensorView* dweight) {
  cfg.validate();
  check_norm_input(op, dev, "s", s);
  const int64_t H = s.shape[s.ndim - 1];
  check_tensor(op, "weight", weight, DType::kBF16, {H}, dev);
  check_inner_contiguous(op, "weight", weight);
  check_like_s(op, dev, "gy", gy, s);
  if (gres) check_like_s(op, dev, "gres", *gres, s);
  const char* out = gres ? "ds" : "dx";
  check_like_s(op, dev, out, dx, s);
  LS_CHECK(!overlaps(dx, s) && !overlaps(dx, weight), op, "argument '", out,
           "' must not overlap s or weight");
  LS_CHECK(same_view(dx, gy) || !overlaps(dx, gy), op, "argument '", out,
           "' overlaps gy (only the same view as gy is allowed)");
  LS_CHECK(!gres || same_view(dx, *gres) || !overlaps(dx, *gres), op, "argument '", out,
           "' overlaps gres (only the same view as gres is allowed)");
  LS_CHECK((order == nullptr) == (dweight == nullptr), op,
           "arguments 'order' and 'dweight' must be given together (or both be null)");
  if (dweight) {
    LS_CHECK(order->rows() == s.shape[0], op, "argument 'order' covers ", order->rows(),
             " rows, but s has ", s.shape[0], " tokens");
    check_tensor(op, "dweight", *dweight, DType::kF32, {H}, dev);
    check_inner_contiguous(op, "dweight", *dweight);
    LS_CHECK(!overlaps(*dweight, s) && !overlaps(*dweight, weight) && !overlaps(*dweight, gy) &&
                 !overlaps(*dweight, dx) && !(gres && overlaps(*dweight, *gres)),
             op, "argument 'dweight' must not overlap any other argument");
  }
  return H;
}

}  // namespace lockstep::contract
