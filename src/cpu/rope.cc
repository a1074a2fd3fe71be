// RoPE on the CPU, the executable form of docs/contract.md §E "RoPE": host double
// cos/sin table rounded to fp32; per pair (i, i + D/2) of a row at position p, with c = cos[p,i],
// s = sin[p,i]: y_i = round(x_i*c - x_{i+D/2}*s), y_{i+D/2} = round(x_{i+D/2}*c + x_i*s), each
// product and the sum a separate fp32 RNE op. One task computes a whole (token, head) row.
#include "lockstep/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "contract/checks.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_common.h"

namespace lockstep {

namespace cpu {

void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
          const TensorView& y) {
  const char* op = "rope";
  table.config.validate();
  const int64_t D = table.config.head_dim, half = D / 2, P = table.config.max_positions;
  LS_CHECK(int64_t(table.cos.size()) == P * half && int64_t(table.sin.size()) == P * half, op,
           "argument 'table' has ", table.cos.size(), " cos and ", table.sin.size(),
           " sin entries, expected ", P * half, " each (build it with RopeTable::build)");
  contract::check_rope_args(op, Device::kCPU, x, positions, D, P, y);
  const int64_t T = x.shape[0], heads = x.shape[1];
  auto pos_at = [&](int64_t t) -> int64_t {
    const int64_t off = t * positions.stride[0];
    return positions.dtype == DType::kI32 ? int64_t(positions.ptr<const int32_t>()[off])
                                          : positions.ptr<const int64_t>()[off];
  };
  const int64_t rows = T * heads;
  if (rows == 0) return;

  const detail::RowAddr xa(x), ya(y);
  parallel_for(rows, std::max<int64_t>(1, 16384 / D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = pos_at(r / heads);
      const float* c = table.cos.data() + p * half;
      const float* s = table.sin.data() + p * half;
      const bf16* xr = xa.row<const bf16>(r);
      bf16* yr = ya.row<bf16>(r);
      for (int64_t i = 0; i < half; ++i) {
        // Read the pair before writing it: y may be the same view as x.
        const float a = bf16_to_f32(xr[i]), b = bf16_to_f32(xr[i + half]);
        const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
        yr[i] = round_bf16_canonical(ac - bs);
        yr[i + half] = round_bf16_canonical(bc + as);
      }
    }
  });
}

}  // namespace cpu
}  // namespace lockstep
