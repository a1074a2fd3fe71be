// The exact AVX-512 k-block arithmetic shared by the GEMM fast path (gemm_avx512.cc) and the
// batched chains (mma_batch.cc): row exponent statistics, the "modelled range" test that decides
// whether an output may take the fast path (docs/contract.md §G.9), a 16x16 transpose, and the
// int64 fallback sum. Include only where the AVX-512 feature macros below are defined.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#include <immintrin.h>

#include <cstdint>

namespace lockstep::cpu::kblock_avx512 {

constexpr int kEFloor = 27;  // E is at least 27 (biased), i.e. 2^-100
// Modelled range of a product's exponent ea + eb (unbiased) for nonzero normal a, b.
constexpr int kMinProdExp = -100, kMaxProdExp = 90;

inline int reduce_max(__m512i v) { return _mm512_reduce_max_epi32(v); }
inline int reduce_min(__m512i v) { return _mm512_reduce_min_epi32(v); }

// Exponent statistics of one row: over its nonzero elements, min/max exponent field; whether it
// holds inf/NaN/subnormal values (not modelled by the fast kernel).
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

// Whether the fast kernel models every k-block of the pair (row x, row w) exactly.
inline bool modelled(const RowStats& a, const RowStats& b) {
  if (a.special || b.special) return false;
  if (!a.any || !b.any) return true;  // every product is zero
  return a.emax + b.emax - 254 <= kMaxProdExp && a.emin + b.emin - 254 >= kMinProdExp;
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

// Round toward zero of the exact int64 sum P + C (the rare case where it overflows int32).
inline __m512 wide_sum_rz(__m512i P, __m512i C) {
  __m512i lo = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(P)),
                                _mm512_cvtepi32_epi64(_mm512_castsi512_si256(C)));
  __m512i hi = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(P, 1)),
                                _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(C, 1)));
  __m256 rlo = _mm512_cvt_roundepi64_ps(lo, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256 rhi = _mm512_cvt_roundepi64_ps(hi, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  return _mm512_insertf32x8(_mm512_castps256_ps512(rlo), rhi, 1);
}

// Exponent statistics of 16 rows from their (w[n][k], w[n][k+1]) pairs, in int16 lanes: the
// max magnitude and the min (magnitude - 1) as unsigned (zeros wrap to 0xFFFF and drop out);
// a magnitude's exponent field is magnitude >> 7.
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

}  // namespace lockstep::cpu::kblock_avx512

#endif
