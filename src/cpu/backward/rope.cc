// RoPE backward on the CPU, the executable form of docs/contract.md §B.5: the transpose of the
// forward's rotation with the forward's fp32 table. Per pair (i, i + D/2) of a row at position p,
// with a = gy_i, b = gy_{i+D/2}, c = cos[p][i], s = sin[p][i]:
//   dx_i = (a*c) + (b*s),  dx_{i+D/2} = (b*c) - (a*s)
// each product, sum and difference one fp32 RNE op (no fma), f32 out, NaN stored canonically.
// No reduction: one task computes a whole (token, head) row, so nothing depends on the batch.
#include <algorithm>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_common.h"
#include "lockstep/ops/backward.h"

namespace lockstep::cpu {

void rope_backward(const TensorView& gy, const TensorView& positions, const RopeTable& table,
                   const TensorView& dx) {
  contract::check_rope_backward("rope_backward", Device::kCPU, gy, positions, table, dx);
  const int64_t D = table.config.head_dim, half = D / 2;
  const int64_t T = gy.shape[0], heads = gy.shape[1];
  const int64_t rows = T * heads;
  if (rows == 0) return;

  const detail::RowAddr ga(gy), da(dx);
  parallel_for(rows, std::max<int64_t>(1, 16384 / D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = contract::index_at(positions, r / heads);
      const float* c = table.cos.data() + p * half;
      const float* s = table.sin.data() + p * half;
      const float* g = ga.row<const float>(r);
      float* o = da.row<float>(r);
      for (int64_t i = 0; i < half; ++i) {
        // Read the pair before writing it: dx may be the same view as gy.
        const float a = g[i], b = g[i + half];
        const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
        o[i] = canonical_f32(ac + bs);
        o[i + half] = canonical_f32(bc - as);
      }
    }
  });
}

}  // namespace lockstep::cpu
