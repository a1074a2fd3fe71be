// The GEMM backward's argument checks (docs/contract.md §B.3), one definition for every backend:
// dX = dY·W is the forward GEMM contract with N as the reduced axis, dW += dYᵀ·X a token
// reduction in the canonical order of a TokenOrder.
#include "contract/checks.h"

namespace lockstep::contract {

namespace {

void check_bf16_matrix(const char* op, Device dev, const char* arg, const TensorView& t,
                       int64_t rows, int64_t cols) {
  check_tensor(op, arg, t, DType::kBF16, {rows, cols}, dev);
  check_inner_contiguous(op, arg, t);
}

void check_tp(const char* op, int64_t n_total, int tp_size, int tp_rank, const GemmConfig& cfg) {
  LS_CHECK(n_total >= 0, op, "n_total must be >= 0, got ", n_total);
  LS_CHECK(tp_size >= 1 && (tp_size & (tp_size - 1)) == 0 && tp_size <= cfg.segments, op,
           "tp_size must be a power of two <= segments (", cfg.segments, "), got ", tp_size);
  LS_CHECK(tp_rank >= 0 && tp_rank < tp_size, op, "tp_rank must be in [0, ", tp_size, "), got ",
           tp_rank);
}

}  // namespace

void check_gemm_dx(const char* op, Device dev, const TensorView& dy, const TensorView& w,
                   const GemmConfig& cfg, const TensorView& dx) {
  check_segments(op, dev, cfg);
  check_bf16_matrix(op, dev, "dy", dy, -1, -1);
  const int64_t T = dy.size(0), N = dy.size(1);
  check_bf16_matrix(op, dev, "w", w, N, -1);
  const int64_t K = w.size(1);
  check_tensor_dtypes(op, "dx", dx, {DType::kBF16, DType::kF32}, {T, K}, dev);
  check_inner_contiguous(op, "dx", dx);
  LS_CHECK(!overlaps(dx, dy) && !overlaps(dx, w), op, "argument 'dx' must not overlap dy or w");
}

void check_gemm_dx_partial(const char* op, Device dev, const TensorView& dy_shard,
                           const TensorView& w_shard, int64_t n_total, int tp_size, int tp_rank,
                           const GemmConfig& cfg, const TensorView& dx_partial) {
  check_segments(op, dev, cfg);
  check_tp(op, n_total, tp_size, tp_rank, cfg);
  const GemmKRange r = gemm_tp_k_range(cfg, n_total, tp_size, tp_rank);
  check_bf16_matrix(op, dev, "dy_shard", dy_shard, -1, r.end - r.begin);
  check_bf16_matrix(op, dev, "w_shard", w_shard, r.end - r.begin, -1);
  const int64_t T = dy_shard.size(0), K = w_shard.size(1);
  check_tensor(op, "dx_partial", dx_partial, DType::kF32, {T, K}, dev);
  check_inner_contiguous(op, "dx_partial", dx_partial);
  LS_CHECK(!overlaps(dx_partial, dy_shard) && !overlaps(dx_partial, w_shard), op,
           "argument 'dx_partial' must not overlap dy_shard or w_shard");
}

void check_gemm_dw(const char* op, Device dev, const TensorView& dy, const TensorView& x,
                   const TokenOrder& order, const TensorView& dw) {
  const int64_t rows = order.rows();
  check_bf16_matrix(op, dev, "dy", dy, rows, -1);
  check_bf16_matrix(op, dev, "x", x, rows, -1);
  const int64_t N = dy.size(1), K = x.size(1);
  check_tensor(op, "dw", dw, DType::kF32, {N, K}, dev);
  check_inner_contiguous(op, "dw", dw);
  LS_CHECK(!overlaps(dw, dy) && !overlaps(dw, x), op, "argument 'dw' must not overlap dy or x");
}

}  // namespace lockstep::contract
