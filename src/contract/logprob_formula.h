// The LogP formulas written once for host and device (docs/contract.md §L.5-§L.7): the max rule,
// the merge and the finish. The CPU spec (logprob_merge / logprob_finish, src/contract/logprob.cc)
// and the CUDA kernels (src/cuda/logprob.cuh) call these very functions on their own state types
// (any struct with float members m, s, w): host code is built with -ffp-contract=off, device code
// with -fmad=false, so each + and * below rounds once on both sides and the bits agree.
#pragma once

#include "core/hd.h"
#include "core/math.h"
#include "lockstep/dtype.h"

namespace lockstep::contract {

// The contract's max rule: the later operand wins only if strictly greater (never NaN: m starts
// at -inf and NaN > x is false; NaN entries poison s instead).
LS_HD float lp_max(float a, float b) { return b > a ? b : a; }

// §L.6 merge: empty states (s == 0) are identities, returned bit-exact (a NaN s is not empty).
// Never fused.
template <class State>
LS_HD State lp_merge(const State& a, const State& b) {
  if (b.s == 0.0f) return a;
  if (a.s == 0.0f) return b;
  const float M = lp_max(a.m, b.m);
  const float da = a.m - M, db = b.m - M;
  const float ea = ls_expf(da), eb = ls_expf(db);
  State r;
  r.m = M;
  r.s = a.s * ea + b.s * eb;
  // w is relative to the max: Σ e^(y-M)(y-M) = e^(m-M)·(w + (m-M)·s) for each side.
  r.w = (a.w + da * a.s) * ea + (b.w + db * b.s) * eb;
  return r;
}

// §L.7: lse = m + log s, entropy = log s - w / s (both canonical NaN); returns lse.
// NOTE: entropy is a sum of two non-negative terms (w <= 0): no cancellation, unlike
// lse - Σ p·y. The NaN test is v != v (the kernels' own canonical()), not canonical_f32's bit
// test: the same values, and the kernels' code stays what it was.
template <class State>
LS_HD float lp_finish(const State& st, float* entropy) {
  const float ls = ls_logf(st.s);
  const float e = ls - st.w / st.s, l = st.m + ls;
  *entropy = e != e ? f32_from_bits(kCanonicalNanF32) : e;
  return l != l ? f32_from_bits(kCanonicalNanF32) : l;
}

}  // namespace lockstep::contract
