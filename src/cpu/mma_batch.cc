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
#include "cpu/kblock_avx512.h"
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

using namespace kblock_avx512;  // RowStats, make_stats, modelled, transpose16, wide_sum_rz, ...

constexpr int32_t kZeroExp = -16000;  // exponent of a zero a element: sums stay far below kEFloor
// Smallest modelled exponent field of a nonzero c_in: from 25 on, c is a multiple of 2^-125.
constexpr uint32_t kMinCField = 25;

inline bool c_modelled(float c) {
  const uint32_t u = f32_bits(c), field = (u >> 23) & 0xffu;
  return (u & 0x7fffffffu) == 0 || (field >= kMinCField && field != 0xffu);
}

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
