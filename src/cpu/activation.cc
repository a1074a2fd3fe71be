// SiLU-and-mul on the CPU, the executable form of docs/contract.md §E "SiLU-and-mul":
// e = ls_expf(-g); d = 1 + e; s = g / d; out = round_bf16(s * u); each step one fp32 RNE op (no
// fma), NaN stored canonically. One task computes a whole row; no reduction anywhere.
#include "lockstep/ops/activation.h"

#include <algorithm>

#include "contract/checks.h"
#include "core/math.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_common.h"

namespace lockstep::cpu {
namespace {

// NOTE: large |g|: g -> -inf side, ls_expf(-g) overflows to +inf, d = inf, s = g / inf = -0
// (so out = -0 * u: a signed zero); g = -inf gives -inf / inf = NaN (as PyTorch's silu);
// g -> +inf side, e underflows to 0, s = g exactly.
LS_HD float silu_mul_f32(float g, float u) {
  const float e = ls_expf(-g);
  const float d = 1.0f + e;
  const float s = g / d;
  return s * u;
}

}  // namespace

void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out) {
  contract::check_silu_mul("silu_mul", Device::kCPU, gate, up, out);
  const int64_t T = gate.shape[0], I = gate.shape[1];
  if (T == 0) return;

  const detail::RowAddr ga(gate), ua(up), oa(out);
  parallel_for(T, std::max<int64_t>(1, 16384 / I), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16* g = ga.row<const bf16>(t);
      const bf16* u = ua.row<const bf16>(t);
      bf16* o = oa.row<bf16>(t);
      for (int64_t i = 0; i < I; ++i) {
        o[i] = round_bf16_canonical(silu_mul_f32(bf16_to_f32(g[i]), bf16_to_f32(u[i])));
      }
    }
  });
}

void silu_and_mul(const TensorView& gate_up, const TensorView& out) {
  const contract::GateUpHalves h =
      contract::split_gate_up("silu_and_mul", Device::kCPU, gate_up, out);
  silu_mul(h.gate, h.up, out);
}

}  // namespace lockstep::cpu
