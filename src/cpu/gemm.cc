// GEMM "nt" on the CPU: y[m,n] = tree over S K-segments of the MMA k-block chain (from +0), plus
// bias in fp32, rounded once. Every output is computed by one task in the fixed contract order, so
// its bits never depend on M, other rows, threads or TP degree. See include/lockstep/ops/gemm.h.
#include "lockstep/ops/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "contract/checks.h"
#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "cpu/gemm_kernel.h"

namespace lockstep {

namespace cpu {

float gemm_detail::tree_value_scalar(const bf16* xr, const bf16* wr, int64_t kw, int nseg,
                                     int64_t seg_len, bf16* xbuf, bf16* wbuf) {
  const int64_t kp = int64_t(nseg) * seg_len;
  std::fill(xbuf, xbuf + kp, bf16{0});
  std::fill(wbuf, wbuf + kp, bf16{0});
  if (kw) {
    std::memcpy(xbuf, xr, size_t(kw) * sizeof(bf16));
    std::memcpy(wbuf, wr, size_t(kw) * sizeof(bf16));
  }
  float part[8] = {};
  for (int s = 0; s < nseg; ++s)
    part[s] = mma_chain_bf16(xbuf + s * seg_len, wbuf + s * seg_len, seg_len, 0.0f);
  return tree_sum(part, nseg);
}

namespace {

constexpr const char* kOp = "gemm_bf16_nt";

float load_f32(const TensorView& t, int64_t i) {
  const char* p = static_cast<const char*>(t.data) + i * t.stride[0] * dtype_size(t.dtype);
  if (t.dtype == DType::kBF16) return bf16_to_f32(*reinterpret_cast<const bf16*>(p));
  return *reinterpret_cast<const float*>(p);
}

const bf16* row_ptr(const TensorView& t, int64_t r) {
  return static_cast<const bf16*>(t.data) + r * t.stride[0];
}

using namespace contract;
using gemm_detail::Problem;
using gemm_detail::tree_sum;

// Writes tree values of one row chunk: + bias (fp32, one add), then round once to y's dtype
// (bf16 RNE) or keep fp32; a NaN is stored as the canonical NaN.
struct RowWriter {
  TensorView y;
  const float* bias = nullptr;  // [N] fp32 or nullptr
  void operator()(int64_t m, int64_t n0, int64_t count, const float* v) const {
    char* row = static_cast<char*>(y.data) + m * y.stride[0] * dtype_size(y.dtype);
    if (y.dtype == DType::kBF16) {
      bf16* out = reinterpret_cast<bf16*>(row) + n0;
      if (bias) {
        for (int64_t j = 0; j < count; ++j) out[j] = f32_to_bf16(v[j] + bias[n0 + j]);
      } else {
        for (int64_t j = 0; j < count; ++j) out[j] = f32_to_bf16(v[j]);
      }
    } else {
      float* out = reinterpret_cast<float*>(row) + n0;  // stored NaNs are canonical (contract §4)
      if (bias) {
        for (int64_t j = 0; j < count; ++j) out[j] = canonical_f32(v[j] + bias[n0 + j]);
      } else {
        for (int64_t j = 0; j < count; ++j) out[j] = canonical_f32(v[j]);
      }
    }
  }
};

// Scalar path: one output at a time, the contract written plainly.
void tree_rows_scalar(const Problem& p, int64_t m0, int64_t m1, const RowWriter& out) {
  int64_t kp = int64_t(p.nseg) * p.seg_len;
  std::vector<bf16> xb(static_cast<size_t>(kp)), wb(static_cast<size_t>(kp));
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      float v = gemm_detail::tree_value_scalar(row_ptr(p.x, m), row_ptr(p.w, n), p.kw, p.nseg,
                                               p.seg_len, xb.data(), wb.data());
      out(m, n, 1, &v);
    }
}

// Every output's tree value, by the vectorized kernel where this build has it (bitwise equal to
// the scalar path on every input, so this is a speed choice, not a numerics one).
void tree_all(const Problem& p, bool scalar, const RowWriter& out) {
  if (!scalar && gemm_detail::fast_kernel_available()) {
    gemm_detail::TileSink sink = [](void* ctx, int64_t m, int64_t n0, int64_t count,
                                    const float* v) {
      (*static_cast<const RowWriter*>(ctx))(m, n0, count, v);
    };
    gemm_detail::tree_all_fast(p, sink, const_cast<RowWriter*>(&out));
    return;
  }
  // Rows are independent: any split over threads gives the same bits.
  parallel_for(p.M, 1, [&](int64_t m0, int64_t m1) { tree_rows_scalar(p, m0, m1, out); });
}

// The bias as fp32 (exact conversion from bf16), or empty.
std::vector<float> bias_f32(const TensorView* bias) {
  std::vector<float> b;
  if (bias == nullptr) return b;
  b.resize(size_t(bias->size(0)));
  for (int64_t n = 0; n < bias->size(0); ++n) b[size_t(n)] = load_f32(*bias, n);
  return b;
}

void gemm_impl(const TensorView& x, const TensorView& w, const TensorView* bias,
               const GemmConfig& cfg, const TensorView& y, bool scalar) {
  check_gemm(kOp, Device::kCPU, x, w, bias, cfg, y);
  int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  GemmKLayout l = gemm_k_layout(cfg, K);
  Problem p{x, w, M, N, K, cfg.segments, l.segment_len};
  if (M == 0 || N == 0) return;
  std::vector<float> b = bias_f32(bias);
  tree_all(p, scalar, RowWriter{y, bias ? b.data() : nullptr});
}

}  // namespace

void gemm_bf16_nt(const TensorView& x, const TensorView& w, const TensorView* bias,
                  const GemmConfig& cfg, const TensorView& y) {
  gemm_impl(x, w, bias, cfg, y, /*scalar=*/false);
}

void gemm_bf16_nt_scalar(const TensorView& x, const TensorView& w, const TensorView* bias,
                         const GemmConfig& cfg, const TensorView& y) {
  gemm_impl(x, w, bias, cfg, y, /*scalar=*/true);
}

void gemm_bf16_nt_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& y_partial) {
  check_gemm_partial("gemm_bf16_nt_partial", Device::kCPU, x_shard, w_shard, k_total, tp_size,
                     tp_rank, cfg, y_partial);
  int64_t M = x_shard.size(0), N = w_shard.size(0);
  GemmKLayout l = gemm_k_layout(cfg, k_total);
  Problem p{x_shard, w_shard, M, N, x_shard.size(1), cfg.segments / tp_size, l.segment_len};
  if (M == 0 || N == 0) return;
  tree_all(p, false, RowWriter{y_partial, nullptr});
}

void gemm_tree_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                       const TensorView& y) {
  const char* op = "gemm_tree_combine";
  int t = int(partials.size());
  LS_CHECK(t >= 1 && t <= 8 && (t & (t - 1)) == 0, op,
           "the number of partials must be 1, 2, 4 or 8, got ", t);
  check_gemm_combine(op, Device::kCPU, partials, bias, y);
  const int64_t M = partials[0].size(0), N = partials[0].size(1);
  std::vector<float> b = bias_f32(bias);
  const RowWriter out{y, bias ? b.data() : nullptr};
  parallel_for(M, 16, [&](int64_t m0, int64_t m1) {
    float v[8];
    for (int64_t m = m0; m < m1; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        for (int i = 0; i < t; ++i)
          v[i] = static_cast<const float*>(partials[i].data)[m * partials[i].stride[0] + n];
        float r = tree_sum(v, t);
        out(m, n, 1, &r);
      }
    }
  });
}

}  // namespace cpu
}  // namespace lockstep
