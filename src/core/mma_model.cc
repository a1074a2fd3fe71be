// Scalar reference implementation of the MMA k-block model. See mma_model.h.
// NOTE: first version models finite normal inputs and zeros; subnormal/inf/NaN behaviour is
// pinned down by the H200 probe (tools/probes) and the golden tests.
#include "core/mma_model.h"

#include <cmath>
#include <cstdlib>

namespace lockstep {
namespace {

constexpr uint32_t kNaN = 0x7fffffffu;

struct Decoded {
  int64_t mant;  // signed integer mantissa
  int exp;       // value = mant * 2^(exp - frac_bits)
  bool zero;
};

}  // namespace

float mma_kblock_bf16(const bf16* a, const bf16* b, float c) {
  // Products: value = (ma*mb) * 2^(ea+eb-14), ma, mb 8-bit integer mantissas.
  int64_t pm[kMmaK];
  int pe[kMmaK];
  bool pz[kMmaK];
  bool any_nan = false;
  int inf_sign = 0;  // +1 / -1 when an infinite product appears
  bool inf_conflict = false;
  int E = INT32_MIN;
  for (int i = 0; i < kMmaK; ++i) {
    uint32_t ua = a[i].bits, ub = b[i].bits;
    int xa = (ua >> 7) & 0xff, xb = (ub >> 7) & 0xff;
    uint32_t fa = ua & 0x7f, fb = ub & 0x7f;
    bool sa = ua >> 15, sb = ub >> 15;
    bool za = xa == 0 && fa == 0, zb = xb == 0 && fb == 0;
    if ((xa == 0xff && fa) || (xb == 0xff && fb)) {
      any_nan = true;
      pz[i] = true;
      continue;
    }
    if (xa == 0xff || xb == 0xff) {
      if (za || zb) {
        any_nan = true;  // inf * 0
      } else {
        int s = (sa ^ sb) ? -1 : 1;
        if (inf_sign != 0 && inf_sign != s) inf_conflict = true;
        inf_sign = s;
      }
      pz[i] = true;
      continue;
    }
    if (za || zb) {
      pz[i] = true;
      continue;
    }
    int ma = xa ? int(fa | 0x80) : int(fa), mb = xb ? int(fb | 0x80) : int(fb);
    int ea = (xa ? xa : 1) - 127, eb = (xb ? xb : 1) - 127;
    pm[i] = int64_t(ma * mb) * ((sa ^ sb) ? -1 : 1);
    pe[i] = ea + eb;
    pz[i] = false;
    if (pe[i] > E) E = pe[i];
  }
  uint32_t uc = f32_bits(c);
  int xc = (uc >> 23) & 0xff;
  uint32_t fc = uc & 0x7fffff;
  if (xc == 0xff) {
    if (fc) any_nan = true;
    else {
      int s = (uc >> 31) ? -1 : 1;
      if (inf_sign != 0 && inf_sign != s) inf_conflict = true;
      inf_sign = s;
    }
  }
  if (any_nan || inf_conflict) return f32_from_bits(kNaN);
  if (inf_sign != 0) return inf_sign > 0 ? INFINITY : -INFINITY;
  bool cz = xc == 0 && fc == 0;
  int64_t cm = 0;
  int ce = 0;
  if (!cz) {
    cm = int64_t(xc ? (fc | 0x800000u) : fc) * ((uc >> 31) ? -1 : 1);
    ce = (xc ? xc : 1) - 127;  // value = cm * 2^(ce-23)
    if (ce > E) E = ce;
  }
  if (E == INT32_MIN) return 0.0f;  // every term is zero
  // Sum in units of 2^(E-25); truncation toward zero of each term's magnitude.
  int64_t sum = 0;
  auto add = [&](int64_t m, int shift) {
    int64_t mag = std::llabs(m);
    int64_t t = shift >= 0 ? (mag << shift) : (shift <= -62 ? 0 : (mag >> -shift));
    sum += m < 0 ? -t : t;
  };
  for (int i = 0; i < kMmaK; ++i)
    if (!pz[i]) add(pm[i], pe[i] - E + 11);  // (e-14) - (E-25)
  if (!cz) add(cm, ce - E + 2);              // (e-23) - (E-25)
  if (sum == 0) return 0.0f;
  // Round toward zero to 24 significant bits, then scale: exact in double, exact in float
  // while the result is normal.
  bool neg = sum < 0;
  uint64_t mag = uint64_t(neg ? -sum : sum);
  int bits = 64 - __builtin_clzll(mag);
  int drop = bits > 24 ? bits - 24 : 0;
  mag >>= drop;
  double v = std::ldexp(double(mag), E - 25 + drop);
  float r = float(v);
  return neg ? -r : r;
}

float mma_chain_bf16(const bf16* a, const bf16* b, int64_t k, float c) {
  for (int64_t i = 0; i < k; i += kMmaK) c = mma_kblock_bf16(a + i, b + i, c);
  return c;
}

}  // namespace lockstep
