// The GEMM contract (docs/contract.md §G): settings, the K layout, TP K ranges, and the argument
// checks every backend applies (CPU and CUDA alike: the device is a parameter).
#include "lockstep/contract/gemm.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "contract/checks.h"
#include "core/mma_model.h"

namespace lockstep {

void GemmConfig::validate() const {
  LS_CHECK(segments == 1 || segments == 2 || segments == 4 || segments == 8, "GemmConfig",
           "segments must be 1, 2, 4 or 8, got ", segments);
}

std::string GemmConfig::to_string() const {
  std::ostringstream os;
  os << "gemm: segments=" << segments;
  return os.str();
}

GemmKLayout gemm_k_layout(const GemmConfig& cfg, int64_t k) {
  cfg.validate();
  LS_CHECK(k >= 0, "gemm_k_layout", "k must be >= 0, got ", k);
  GemmKLayout l;
  l.k = k;
  l.segments = cfg.segments;
  int64_t unit = int64_t(kMmaK) * cfg.segments;
  l.padded = (k + unit - 1) / unit * unit;
  l.segment_len = l.padded / cfg.segments;
  return l;
}

GemmKRange gemm_tp_k_range(const GemmConfig& cfg, int64_t k, int tp_size, int tp_rank) {
  GemmKLayout l = gemm_k_layout(cfg, k);
  LS_CHECK(tp_size >= 1 && (tp_size & (tp_size - 1)) == 0 && tp_size <= cfg.segments,
           "gemm_tp_k_range", "tp_size must be a power of two <= segments (", cfg.segments,
           "), got ", tp_size);
  LS_CHECK(tp_rank >= 0 && tp_rank < tp_size, "gemm_tp_k_range", "tp_rank must be in [0, ", tp_size,
           "), got ", tp_rank);
  int64_t per_rank = l.padded / tp_size;
  GemmKRange r;
  r.begin = std::min<int64_t>(k, tp_rank * per_rank);
  r.end = std::min<int64_t>(k, (tp_rank + 1) * per_rank);
  return r;
}

}  // namespace lockstep

namespace lockstep::contract {

void check_bias(const char* op, Device dev, const TensorView* bias, int64_t n) {
  if (bias == nullptr) return;
  check_tensor_dtypes(op, "bias", *bias, {DType::kBF16, DType::kF32}, {n}, dev);
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto span = [](const TensorView& t, const char*& lo, const char*& hi) {
    int64_t last = 0;
    for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.stride[i];
    lo = static_cast<const char*>(t.data);
    hi = lo + (last + 1) * dtype_size(t.dtype);
  };
  const char *alo, *ahi, *blo, *bhi;
  span(a, alo, ahi);
  span(b, blo, bhi);
  return alo < bhi && blo < ahi;
}

void check_segments(const char* op, Device dev, const GemmConfig& cfg) {
  LS_CHECK(cfg.segments == 1 || cfg.segments == 2 || cfg.segments == 4 || cfg.segments == 8, op,
           "cfg.segments must be 1, 2, 4 or 8, got ", cfg.segments);
}

void check_xw(const char* op, Device dev, const TensorView& x, const TensorView& w) {
  check_tensor(op, "x", x, DType::kBF16, {-1, -1}, dev);
  check_tensor(op, "w", w, DType::kBF16, {-1, -1}, dev);
  check_inner_contiguous(op, "x", x);
  check_inner_contiguous(op, "w", w);
  LS_CHECK(x.size(1) == w.size(1), op, "x and w must have the same K: x is ", x.shape_string(),
           ", w is ", w.shape_string());
}

void check_gemm(const char* op, Device dev, const TensorView& x, const TensorView& w,
                const TensorView* bias, const GemmConfig& cfg, const TensorView& y) {
  check_segments(op, dev, cfg);
  check_xw(op, dev, x, w);
  const int64_t M = x.size(0), N = w.size(0);
  check_bias(op, dev, bias, N);
  check_tensor_dtypes(op, "y", y, {DType::kBF16, DType::kF32}, {M, N}, dev);
  check_inner_contiguous(op, "y", y);
  LS_CHECK(!overlaps(y, x) && !overlaps(y, w) && !(bias && overlaps(y, *bias)), op,
           "argument 'y' must not overlap x, w or bias");
}

void check_gemm_partial(const char* op, Device dev, const TensorView& x_shard,
                        const TensorView& w_shard, int64_t k_total, int tp_size, int tp_rank,
                        const GemmConfig& cfg, const TensorView& y_partial) {
  check_segments(op, dev, cfg);
  LS_CHECK(k_total >= 0, op, "k_total must be >= 0, got ", k_total);
  LS_CHECK(tp_size >= 1 && (tp_size & (tp_size - 1)) == 0 && tp_size <= cfg.segments, op,
           "tp_size must be a power of two <= segments (", cfg.segments, "), got ", tp_size);
  LS_CHECK(tp_rank >= 0 && tp_rank < tp_size, op, "tp_rank must be in [0, ", tp_size, "), got ",
           tp_rank);
  check_xw(op, dev, x_shard, w_shard);
  const GemmKRange r = gemm_tp_k_range(cfg, k_total, tp_size, tp_rank);
  LS_CHECK(x_shard.size(1) == r.end - r.begin, op, "rank ", tp_rank, " of ", tp_size,
           " owns K columns [", r.begin, ", ", r.end, ") of ", k_total, " (", r.end - r.begin,
           " columns), but x_shard is ", x_shard.shape_string());
  const int64_t M = x_shard.size(0), N = w_shard.size(0);
  check_view(op, "y_partial", y_partial, DType::kF32, {M, N}, dev);
  LS_CHECK(!overlaps(y_partial, x_shard) && !overlaps(y_partial, w_shard), op,
           "argument 'y_partial' must not overlap x_shard or w_shard");
}

void check_gemm_combine(const char* op, Device dev, const std::vector<TensorView>& partials,
                        const TensorView* bias, const TensorView& y) {
  check_tensor(op, "partials[0]", partials[0], DType::kF32, {-1, -1}, dev);
  const int64_t M = partials[0].size(0), N = partials[0].size(1);
  for (size_t i = 0; i < partials.size(); ++i) {
    const std::string name = "partials[" + std::to_string(i) + "]";
    check_view(op, name.c_str(), partials[i], DType::kF32, {M, N}, dev);
  }
  check_bias(op, dev, bias, N);
  check_tensor_dtypes(op, "y", y, {DType::kBF16, DType::kF32}, {M, N}, dev);
  check_inner_contiguous(op, "y", y);
  for (size_t i = 0; i < partials.size(); ++i) {
    const bool same = partials[i].data == y.data && y.dtype == DType::kF32 &&
                      (M <= 1 || partials[i].stride[0] == y.stride[0]);
    LS_CHECK(same || !overlaps(y, partials[i]), op, "argument 'y' overlaps partials[", i,
             "] (only an exact alias of an f32 partial is allowed)");
  }
  LS_CHECK(!(bias && overlaps(y, *bias)), op, "argument 'y' must not overlap bias");
}

}  // namespace lockstep::contract
