// Launchers of the baseline elementwise kernels (baseline_elementwise.cuh); arguments were checked
// by the backend (src/engine/cuda/baseline_backend.cc).
#include "baseline/cuda/elementwise.cuh"

namespace lockstep::cuda::baseline {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t total) { return grid_1d(total, kThreads, 65535 * 16); }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Rows of `r` start on 16-byte boundaries (so whole 8-element groups can be one load).
bool rows_vec(const Rows& r) {
  return aligned16(r.p) && r.s0 % 8 == 0 && (r.inner <= 1 || r.s1 % 8 == 0);
}

}  // namespace

void rmsnorm(Rows x, Rows residual, const void* w, Rows residual_out, Rows y, int64_t rows,
             int64_t H, float eps, void* stream) {
  if (rows == 0) return;
  const bool res = residual.p != nullptr;
  const bool vec = H % 8 == 0 && rows_vec(x) && rows_vec(y) && aligned16(w) &&
                   (!res || (rows_vec(residual) && rows_vec(residual_out)));
  const unsigned grid = grid_1d(rows, kernels::kNormWarps, 1048576);  // one warp per row
  const auto* wp = static_cast<const uint16_t*>(w);
  if (res) {
    kernels::rmsnorm_kernel<true><<<grid, 32 * kernels::kNormWarps, 0, as_stream(stream)>>>(
        x, residual, wp, residual_out, y, rows, H, eps, vec);
  } else {
    kernels::rmsnorm_kernel<false><<<grid, 32 * kernels::kNormWarps, 0, as_stream(stream)>>>(
        x, Rows{}, wp, x, y, rows, H, eps, vec);
  }
  LS_BASE_LAUNCHED(res ? "baseline rmsnorm_residual" : "baseline rmsnorm");
}

void rope(Rows x, Index positions, Rows y, int64_t T, int64_t heads, int64_t D, float theta,
          void* stream) {
  const int64_t rows = T * heads;
  if (rows == 0 || D < 2) return;
  kernels::rope_kernel<<<grid_for(rows * (D / 2)), kThreads, 0, as_stream(stream)>>>(
      x, positions, y, rows, D, theta);
  LS_BASE_LAUNCHED("baseline rope");
}

void silu_mul(const void* gate, int64_t ldg, const void* up, int64_t ldu, void* out, int64_t ldo,
              int64_t T, int64_t I, void* stream) {
  if (T == 0 || I == 0) return;
  kernels::silu_mul_kernel<<<grid_for(T * I), kThreads, 0, as_stream(stream)>>>(
      static_cast<const uint16_t*>(gate), ldg, static_cast<const uint16_t*>(up), ldu,
      static_cast<uint16_t*>(out), ldo, T, I);
  LS_BASE_LAUNCHED("baseline silu_mul");
}

void embedding(Index ids, const void* table, int64_t ldt, int64_t row_begin, int64_t table_rows,
               void* out, int64_t ldo, int64_t T, int64_t H, void* stream) {
  if (T == 0 || H == 0) return;
  kernels::embedding_kernel<<<grid_for(T * H), kThreads, 0, as_stream(stream)>>>(
      ids, static_cast<const uint16_t*>(table), ldt, row_begin, table_rows,
      static_cast<uint16_t*>(out), ldo, T, H);
  LS_BASE_LAUNCHED("baseline embedding");
}

}  // namespace lockstep::cuda::baseline
