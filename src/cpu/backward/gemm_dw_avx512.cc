// The vectorized kernel of the GEMM weight gradient (gemm_dw_kernel.h, docs/contract.md §B.3):
// dw[n, k] advances by one MMA chain over a chunk's tokens, 16 outputs k (lanes) × 4 rows n at a
// time, with the GEMM's exact k-block arithmetic (gemm_avx512.cc, mma_batch.cc, contract §G.9).
// The lanes read x row-major (16 consecutive k of one token), so no transpose is needed, and the
// 4 rows share every x load. Per k-block of 16 tokens i, for row n (a = dy[i, n], a scalar
// broadcast) and lane k (b = x[i, k]):
//   pass 1  E = max(27, max_i field(b_i) + e(a_i), field(c)) (biased; a zero a carries a huge
//           negative exponent, a zero b counts as field 0, which never raises E while e(a) <= 27);
//   pass 2  term_i = trunc((b·a)·2^(25-E)), exact in fp32, summed exactly in int32;
//   finish  sum = P + trunc(c·2^(25-E)) (int64 on overflow), rounded toward zero, × 2^(E-25).
// Exact under the conditions of mma_batch.cc: every nonzero product's exponent in [-100, 90],
// no inf/NaN/subnormal operand, e(a) <= 27, and the starting c ±0 or finite with exponent field
// >= 25. Any other output is recomputed with mma_chain_bf16.
#include <algorithm>
#include <vector>

#include "core/mma_model.h"
#include "cpu/backward/gemm_dw_kernel.h"
#include "cpu/kblock_avx512.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define LOCKSTEP_DW_AVX512 1
#include <immintrin.h>
// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as "maybe
// uninitialized" (a false positive): silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace lockstep::cpu::dw_detail {

namespace {

// Every output of rows [n0, n1) with the scalar chain (the model itself).
void chain_rows_scalar(const Chunk& ch, int64_t n0, int64_t n1, float* dw, int64_t ldw) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < ch.K; ++k) {
      float& d = dw[n * ldw + k];
      d = mma_chain_bf16(ch.dyc + n * ch.ld, ch.xc + k * ch.ld, ch.ld, d);
    }
}

}  // namespace

#if defined(LOCKSTEP_DW_AVX512)

namespace {

using namespace kblock_avx512;  // RowStats, make_stats, modelled, wide_sum_rz, kEFloor

constexpr int32_t kZeroExp = -16000;  // exponent of a zero a element: sums stay far below kEFloor
constexpr uint32_t kMinCField = 25;   // smallest modelled exponent field of a nonzero starting c
constexpr int kRows = 4;              // dw rows per tile, sharing the x loads

inline bool c_modelled(float c) {
  const uint32_t u = f32_bits(c), field = (u >> 23) & 0xffu;
  return (u & 0x7fffffffu) == 0 || (field >= kMinCField && field != 0xffu);
}

RowStats stats_of(const bf16* v, int64_t n) {
  int emin = 255, emax = 0;
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = v[i].bits;
    if ((u & 0x7fffu) == 0) continue;
    const int field = int((u >> 7) & 0xffu);
    any = true;
    emin = std::min(emin, field);
    emax = std::max(emax, field);
  }
  return make_stats(any, emin, emax);
}

// A dy column decoded once: fp32 values and unbiased exponents (kZeroExp for zeros).
void decode(const bf16* a, int64_t n, float* af, int32_t* ae) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = a[i].bits;
    af[i] = bf16_to_f32(a[i]);
    ae[i] = (u & 0x7fffu) != 0 ? int32_t((u >> 7) & 0xffu) - 127 : kZeroExp;
  }
}

// NR rows × the 16 lanes k0 .. k0+15 (lanes past `lanes` read nothing): the chains over the
// chunk's ld tokens from c[r] (16 values), results back into c[r].
template <int NR>
void chain_tile(const float* const* af, const int32_t* const* ae, const bf16* xr, int64_t K,
                int64_t k0, __mmask16 lanes, int64_t ld, float (*c)[16]) {
  const __m512i kff = _mm512_set1_epi32(0xff), efloor = _mm512_set1_epi32(kEFloor);
  const __m512i c279 = _mm512_set1_epi32(int32_t(279u << 23)), kexp = _mm512_set1_epi32(0x7f800000);
  const __m512i c254 = _mm512_set1_epi32(254 << 23);
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_load_ps(c[r]);
  for (int64_t t0 = 0; t0 < ld; t0 += kMmaK) {
    __m512 b[kMmaK];
    __m512i field[kMmaK];
    for (int i = 0; i < kMmaK; ++i) {
      const __m256i h = _mm256_maskz_loadu_epi16(lanes, xr + (t0 + i) * K + k0);
      const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
      b[i] = _mm512_castsi512_ps(u);
      field[i] = _mm512_and_si512(_mm512_srli_epi32(u, 23), kff);
    }
    for (int r = 0; r < NR; ++r) {
      // Pass 1: E = max(27, max_i field(b_i) + e(a_i)), then c's field.
      __m512i E = efloor;
      for (int i = 0; i < kMmaK; ++i)
        E = _mm512_max_epi32(E, _mm512_add_epi32(field[i], _mm512_set1_epi32(ae[r][t0 + i])));
      __m512i eh = _mm512_slli_epi32(E, 23);
      eh = _mm512_max_epi32(eh, _mm512_and_si512(_mm512_castps_si512(acc[r]), kexp));
      const __m512 sc = _mm512_castsi512_ps(_mm512_sub_epi32(c279, eh));  // 2^(25-E)
      // Pass 2: truncated terms, summed exactly in int32.
      __m512i P = _mm512_setzero_si512();
      for (int i = 0; i < kMmaK; ++i) {
        const __m512 av = _mm512_set1_ps(af[r][t0 + i]);
        P = _mm512_add_epi32(P, _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(b[i], av), sc)));
      }
      // Finish: + c's truncated term, round toward zero, scale back by 2^(E-25).
      const __m512i C = _mm512_cvttps_epi32(_mm512_mul_ps(acc[r], sc));
      const __m512i sum = _mm512_add_epi32(P, C);
      // Signed overflow iff P and C share a sign that sum does not: (P^sum)&(C^sum) < 0.
      const __mmask16 ovf = _mm512_movepi32_mask(_mm512_ternarylogic_epi32(P, C, sum, 0x42));
      __m512 res = _mm512_cvt_roundepi32_ps(sum, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      if (__builtin_expect(ovf != 0, 0)) res = wide_sum_rz(P, C);
      const __m512 inv = _mm512_castsi512_ps(_mm512_sub_epi32(c254, _mm512_castps_si512(sc)));
      acc[r] = _mm512_mul_ps(res, inv);
    }
  }
  for (int r = 0; r < NR; ++r) _mm512_store_ps(c[r], acc[r]);
}

}  // namespace

void chain_rows(const Chunk& ch, int64_t n0, int64_t n1, float* dw, int64_t ldw) {
  const int64_t K = ch.K, ld = ch.ld;
  std::vector<RowStats> xs(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) xs[size_t(k)] = stats_of(ch.xc + k * ld, ld);
  // Rows the tile may take (dy column modelled: no special, e(a) <= 27), in groups of kRows.
  std::vector<int64_t> rows;
  std::vector<RowStats> as(static_cast<size_t>(n1 - n0));
  for (int64_t n = n0; n < n1; ++n) {
    const RowStats s = stats_of(ch.dyc + n * ld, ld);
    as[size_t(n - n0)] = s;
    if (s.special || (s.any && s.emax > 127 + kEFloor)) {
      chain_rows_scalar(ch, n, n + 1, dw, ldw);
    } else {
      rows.push_back(n);
    }
  }
  std::vector<float> afv(static_cast<size_t>(kRows * ld));
  std::vector<int32_t> aev(static_cast<size_t>(kRows * ld));
  alignas(64) float c[kRows][16];
  for (size_t g = 0; g < rows.size(); g += kRows) {
    const int nr = int(std::min<size_t>(kRows, rows.size() - g));
    const float* af[kRows];
    const int32_t* ae[kRows];
    for (int r = 0; r < nr; ++r) {
      decode(ch.dyc + rows[g + r] * ld, ld, afv.data() + r * ld, aev.data() + r * ld);
      af[r] = afv.data() + r * ld;
      ae[r] = aev.data() + r * ld;
    }
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
      const int count = int(std::min<int64_t>(16, K - k0));
      const __mmask16 lanes = count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1);
      for (int r = 0; r < nr; ++r) {
        std::fill(c[r], c[r] + 16, 0.0f);
        std::copy(dw + rows[g + r] * ldw + k0, dw + rows[g + r] * ldw + k0 + count, c[r]);
      }
      if (nr == kRows) {
        chain_tile<kRows>(af, ae, ch.xr, K, k0, lanes, ld, c);
      } else {
        for (int r = 0; r < nr; ++r) chain_tile<1>(af + r, ae + r, ch.xr, K, k0, lanes, ld, c + r);
      }
      for (int r = 0; r < nr; ++r) {
        const int64_t n = rows[g + r];
        for (int j = 0; j < count; ++j) {
          float& d = dw[n * ldw + k0 + j];
          if (__builtin_expect(!modelled(as[size_t(n - n0)], xs[size_t(k0 + j)]) || !c_modelled(d),
                               0)) {
            d = mma_chain_bf16(ch.dyc + n * ld, ch.xc + (k0 + j) * ld, ld, d);
          } else {
            d = c[r][j];
          }
        }
      }
    }
  }
}

#else

void chain_rows(const Chunk& ch, int64_t n0, int64_t n1, float* dw, int64_t ldw) {
  chain_rows_scalar(ch, n0, n1, dw, ldw);
}

#endif  // LOCKSTEP_DW_AVX512

}  // namespace lockstep::cpu::dw_detail
