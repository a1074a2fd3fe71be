// SiLU-and-mul backward on the CPU, the executable form of docs/contract.md §B.6. Per element,
// from the forward's g = fp32(gate), u = fp32(up) and ga (the gradient of out):
//   e = ls_expf(-g); d = 1 + e; s = g / d; σ = 1 / d
//   du = ga * s;  dg = (ga * u) * (σ * (1 + (g * (1 - σ))))
// each step one fp32 RNE op (no fma), f32 out, NaN stored canonically. One task computes a whole
// row; no reduction anywhere.
#include <algorithm>

#include "contract/checks.h"
#include "core/math.h"
#include "core/thread_pool.h"
#include "cpu/elementwise_common.h"
#include "lockstep/ops/backward.h"

namespace lockstep::cpu {
namespace {

// NOTE: the forward's e, d, s bits (activation.cc); σ = 1 / d is the logistic function and
// σ·(1 + g·(1 − σ)) the derivative of silu. Large |g| follows the formula: g -> -inf side gives
// σ = +0 and dg = ±0; g = -inf gives 0·(-inf) = NaN; g = +inf gives inf·0 = NaN in dg (the
// forward's out is inf·u there).
LS_HD void silu_mul_grad(float g, float u, float ga, float* dg, float* du) {
  const float e = ls_expf(-g);
  const float d = 1.0f + e;
  const float s = g / d;
  const float sig = 1.0f / d;
  *du = ga * s;
  const float gs = ga * u;
  *dg = gs * (sig * (1.0f + (g * (1.0f - sig))));
}

}  // namespace

void silu_mul_backward(const TensorView& gate_up, const TensorView& ga, const TensorView& dgu) {
  const int64_t I =
      contract::check_silu_mul_backward("silu_mul_backward", Device::kCPU, gate_up, ga, dgu);
  const int64_t T = gate_up.shape[0];
  if (T == 0) return;

  const detail::RowAddr xa(gate_up), gra(ga), oa(dgu);
  parallel_for(T, std::max<int64_t>(1, 16384 / I), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16* gate = xa.row<const bf16>(t);
      const bf16* up = gate + I;
      const float* gr = gra.row<const float>(t);
      float* dg = oa.row<float>(t);
      float* du = dg + I;
      for (int64_t i = 0; i < I; ++i) {
        float g, u;
        silu_mul_grad(bf16_to_f32(gate[i]), bf16_to_f32(up[i]), gr[i], &g, &u);
        dg[i] = canonical_f32(g);
        du[i] = canonical_f32(u);
      }
    }
  });
}

}  // namespace lockstep::cpu
