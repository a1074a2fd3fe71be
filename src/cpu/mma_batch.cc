// Batched MMA-model chains (mma_batch.h). The AVX-512 path puts 16 b rows (outputs) in the lanes:
// it reads 32 k at a time from each row, transposes the pairs (b[j][k], b[j][k+1]) in registers
// and runs the GEMM's exact k-block arithmetic (gemm_avx512.cc, docs/contract.md §G.9):
//   pass 1  E = max(27, max_k e(a_k) + e(b_k), field(c)) (biased exponents; zero a carry a huge
//           negative exponent, zero b count as field 0, which never raises E while e(a) <= 27);
//   pass 2  term_k = trunc((a·b)·2^(25-E)), exact in fp32, summed exactly in int32;
//   finish  sum = P + trunc(c·2^(25-E)) (int64 on overflow), rounded toward zero, times 2^(E-25).
// Exact when every nonzero product has exponent in [-100, 90], no operand is inf/NaN/subnormal,
// e(a) <= 27, and c_in is ±0 or finite with exponent field >= 25: then every chained c is a
// multiple of 2^-125, so the clamp E >= 27 never drops a bit of c. No k-block overflows to inf
// (whose next block the fast path would not model): |c| <= 2^128 - 2^104, the 16 products add
// less than 2^96, and rounding toward zero never rounds up. Any other output is recomputed with
// the scalar chain.
#include "cpu/mma_batch.h"

#include <algorithm>
#include <vector>

#include "core/mma_model.h"
#include "lockstep/error.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define LOCKSTEP_MMA_BATCH_AVX512 1
#include <immintrin.h>
// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as "maybe
// uninitialized" (a false positive): silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace lockstep::cpu {
namespace {

void chain_rows_scalar(const bf16* a, const bf16* b, int64_t ldb, int64_t n, int64_t k,
                       const float* c_in, float* c_out) {
  for (int64_t j = 0; j < n; ++j)
    c_out[j] = mma_chain_bf16(a, b + j * ldb, k, c_in != nullptr ? c_in[j] : 0.0f);
}

#if defined(LOCKSTEP_MMA_BATCH_AVX512)

constexpr int32_t kZeroExp = -16000;  // exponent of a zero a element: sums stay far below kEFloor
constexpr int kEFloor = 27;           // E is at least 27 (biased), i.e. 2^-100
// Modelled range of a product's exponent e(a) + e(b) (unbiased) for nonzero normal a, b.
constexpr int kMinProdExp = -100, kMaxProdExp = 90;
// Smallest modelled exponent field of a nonzero c_in: from 25 on, c is a multiple of 2^-125.
constexpr uint32_t kMinCField = 25;

// Exponent statistics of one row over its nonzero elements: min/max exponent field; whether it
// holds inf/NaN/subnormal values (not modelled).
struct RowStats {
  int emin = 255, emax = 0;
  bool any = false;
  bool special = false;
};

// Field 255 (inf/NaN) shows as emax == 255, a subnormal (field 0, nonzero) as emin == 0.
inline RowStats make_stats(bool any, int emin, int emax) {
  RowStats s;
  s.any = any;
  if (any) {
    s.emin = emin;
    s.emax = emax;
    s.special = emax == 255 || emin == 0;
  }
  return s;
}

// Whether the fast path models every k-block of the pair (row a, row b) exactly.
inline bool modelled(const RowStats& a, const RowStats& b) {
  if (a.special || b.special) return false;
  if (!a.any || !b.any) return true;  // every product is zero
  return a.emax + b.emax - 254 <= kMaxProdExp && a.emin + b.emin - 254 >= kMinProdExp;
}

inline bool c_modelled(float c) {
  const uint32_t u = f32_bits(c), field = (u >> 23) & 0xffu;
  return (u & 0x7fffffffu) == 0 || (field >= kMinCField && field != 0xffu);
}

// 16x16 transpose of 32-bit elements: r[i] lane j <- r[j] lane i.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// P + C (int32 lanes whose int32 sum overflowed) summed in int64, rounded toward zero to fp32.
inline __m512 wide_sum_rz(__m512i P, __m512i C) {
  __m512i lo = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(P)),
                                _mm512_cvtepi32_epi64(_mm512_castsi512_si256(C)));
  __m512i hi = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(P, 1)),
                                _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(C, 1)));
  __m256 rlo = _mm512_cvt_roundepi64_ps(lo, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256 rhi = _mm512_cvt_roundepi64_ps(hi, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  return _mm512_insertf32x8(_mm512_castps256_ps512(rlo), rhi, 1);
}

// Exponent statistics of 16 rows from their (b[j][k], b[j][k+1]) pairs, in int16 lanes: the max
// magnitude and the min (magnitude - 1) as unsigned (zeros wrap to 0xFFFF and drop out); a
// magnitude's exponent field is magnitude >> 7.
struct LaneStats {
  __m512i vmax = _mm512_setzero_si512(), vmin = _mm512_set1_epi32(-1);
  __m512i add(__m512i pair) {  // returns the pair's magnitudes
    const __m512i mag = _mm512_and_si512(pair, _mm512_set1_epi16(0x7fff));
    vmax = _mm512_max_epu16(vmax, mag);
    vmin = _mm512_min_epu16(vmin, _mm512_sub_epi16(mag, _mm512_set1_epi16(1)));
    return mag;
  }
  void store(RowStats* st) const {
    alignas(64) uint16_t mx[32], mn[32];
    _mm512_store_si512(mx, vmax);
    _mm512_store_si512(mn, vmin);
    for (int j = 0; j < 16; ++j) {
      const int hi = std::max(mx[2 * j], mx[2 * j + 1]);
      const int lo = std::min(mn[2 * j], mn[2 * j + 1]);
      st[j] = make_stats(hi != 0, (lo + 1) >> 7, hi >> 7);
    }
  }
};

// Outputs j0 .. j0+count-1 (count <= 16; lanes past count read nothing): the chains of the
// decoded a (af values, ae unbiased exponents or kZeroExp) against the b rows, from c_in (or
// +0). Writes 16 lane values to out and the b rows' statistics to st.
void chain16(const float* af, const int32_t* ae, const bf16* b, int64_t ldb, int64_t j0, int count,
             int64_t k, const float* c_in, float* out, RowStats* st) {
  const __m512i kff = _mm512_set1_epi32(0xff), hi16 = _mm512_set1_epi32(int32_t(0xffff0000u));
  const __m512i efloor = _mm512_set1_epi32(kEFloor);
  const __m512i c279 = _mm512_set1_epi32(int32_t(279u << 23)), kexp = _mm512_set1_epi32(0x7f800000);
  const __m512i c254 = _mm512_set1_epi32(254 << 23);
  const __mmask16 lanes = count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1);
  __m512 c = c_in != nullptr ? _mm512_maskz_loadu_ps(lanes, c_in + j0) : _mm512_setzero_ps();
  LaneStats stats;
  alignas(64) int32_t tb[16][16];  // [k pair][lane]: (b[j][k], b[j][k+1]) of the current 32 k
  for (int64_t k0 = 0; k0 < k; k0 += 32) {
    const int64_t left = k - k0;
    const __mmask32 lm = left >= 32 ? ~__mmask32(0) : __mmask32((1u << left) - 1);
    __m512i T[16];
    for (int r = 0; r < 16; ++r)
      T[r] = r < count ? _mm512_maskz_loadu_epi16(lm, b + (j0 + r) * ldb + k0)
                       : _mm512_setzero_si512();
    transpose16(T);
    for (int d = 0; d < 16; ++d) _mm512_store_si512(tb[d], T[d]);
    const int blocks = left >= 32 ? 2 : 1;
    for (int bb = 0; bb < blocks; ++bb) {
      const int64_t kb = k0 + 16 * bb;
      // Pass 1: E = max(27, max_k field(b) + e(a)).
      __m512i E = efloor, mag;
#pragma GCC unroll 16
      for (int kk = 0; kk < 16; ++kk) {
        if (kk % 2 == 0) mag = stats.add(_mm512_load_si512(tb[8 * bb + kk / 2]));
        const __m512i field =
            kk % 2 ? _mm512_srli_epi32(mag, 23) : _mm512_and_si512(_mm512_srli_epi32(mag, 7), kff);
        E = _mm512_max_epi32(E, _mm512_add_epi32(field, _mm512_set1_epi32(ae[kb + kk])));
      }
      __m512i eh = _mm512_slli_epi32(E, 23);
      eh = _mm512_max_epi32(eh, _mm512_and_si512(_mm512_castps_si512(c), kexp));
      const __m512 sc = _mm512_castsi512_ps(_mm512_sub_epi32(c279, eh));  // 2^(25-E)
      // Pass 2: truncated terms, summed exactly in int32.
      __m512i P = _mm512_setzero_si512();
#pragma GCC unroll 16
      for (int kk = 0; kk < 16; ++kk) {
        const __m512i t = _mm512_load_si512(tb[8 * bb + kk / 2]);
        const __m512 bv =
            _mm512_castsi512_ps(kk % 2 ? _mm512_and_si512(t, hi16) : _mm512_slli_epi32(t, 16));
        const __m512 av = _mm512_set1_ps(af[kb + kk]);
        P = _mm512_add_epi32(P, _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(bv, av), sc)));
      }
      // Finish: + c's truncated term, round toward zero, scale back by 2^(E-25).
      const __m512i C = _mm512_cvttps_epi32(_mm512_mul_ps(c, sc));
      const __m512i sum = _mm512_add_epi32(P, C);
      // Signed overflow iff P and C share a sign that sum does not: (P^sum)&(C^sum) < 0.
      const __mmask16 ovf = _mm512_movepi32_mask(_mm512_ternarylogic_epi32(P, C, sum, 0x42));
      __m512 r = _mm512_cvt_roundepi32_ps(sum, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      if (__builtin_expect(ovf != 0, 0)) r = wide_sum_rz(P, C);
      const __m512 inv = _mm512_castsi512_ps(_mm512_sub_epi32(c254, _mm512_castps_si512(sc)));
      c = _mm512_mul_ps(r, inv);
    }
  }
  _mm512_store_ps(out, c);
  stats.store(st);
}

#endif  // LOCKSTEP_MMA_BATCH_AVX512

}  // namespace

void mma_chain_rows_bf16(const bf16* a, const bf16* b, int64_t ldb, int64_t n, int64_t k,
                         const float* c_in, float* c_out) {
  LS_CHECK(k >= 0 && k % kMmaK == 0, "mma_chain_rows_bf16", "k = ", k,
           " must be a non-negative multiple of ", kMmaK);
  LS_CHECK(n >= 0, "mma_chain_rows_bf16", "n = ", n, " must be >= 0");
#if defined(LOCKSTEP_MMA_BATCH_AVX512)
  if (n == 0) return;
  // Decode a once: fp32 values and unbiased exponents (kZeroExp for zeros), with its statistics.
  thread_local std::vector<float> afv;
  thread_local std::vector<int32_t> aev;
  afv.resize(size_t(k));
  aev.resize(size_t(k));
  int emin = 255, emax = 0;
  bool any = false;
  for (int64_t i = 0; i < k; ++i) {
    const uint32_t u = a[i].bits;
    const int field = int((u >> 7) & 0xffu);
    const bool nz = (u & 0x7fffu) != 0;
    afv[size_t(i)] = bf16_to_f32(a[i]);
    aev[size_t(i)] = nz ? field - 127 : kZeroExp;
    if (nz) {
      any = true;
      emin = std::min(emin, field);
      emax = std::max(emax, field);
    }
  }
  const RowStats as = make_stats(any, emin, emax);
  // NOTE: a zero b element counts as field 0 in pass 1, which is only harmless while e(a) <= 27.
  if (k == 0 || as.special || (as.any && as.emax > 127 + kEFloor)) {
    chain_rows_scalar(a, b, ldb, n, k, c_in, c_out);
    return;
  }
  alignas(64) float vals[16];
  RowStats st[16];
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int count = int(std::min<int64_t>(16, n - j0));
    chain16(afv.data(), aev.data(), b, ldb, j0, count, k, c_in, vals, st);
    for (int j = 0; j < count; ++j) {
      const float c = c_in != nullptr ? c_in[j0 + j] : 0.0f;
      if (__builtin_expect(!modelled(as, st[j]) || !c_modelled(c), 0))
        vals[j] = mma_chain_bf16(a, b + (j0 + j) * ldb, k, c);
      c_out[j0 + j] = vals[j];
    }
  }
#else
  chain_rows_scalar(a, b, ldb, n, k, c_in, c_out);
#endif
}

}  // namespace lockstep::cpu
