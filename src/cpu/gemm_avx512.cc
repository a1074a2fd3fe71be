// The vectorized GEMM kernels: the MMA k-block model (core/mma_model.h) for 32 (or, for M <= 4,
// 16) outputs at once, bitwise equal to mma_kblock_bf16 chained along each segment, then the
// segment tree. Inputs the kernels do not model exactly (inf, NaN, subnormal, exponent sums
// outside [-100, 90]) are detected per row and those outputs are recomputed with the scalar chain.
//
// How one k-block of 16 is computed for 32 outputs n (lanes) and one row m (see also
// docs/contract.md §G, "fast path"):
//   pass 1  E = max(27, max_k ex[m,k] + ew[n,k]) in int16 lanes (exponents biased like fp32, zeros
//           carry a huge negative exponent so they never raise E), then E = max(E, field(c)).
//   pass 2  term_k = trunc((x·w) · 2^(25-E)): x·w is exact in fp32 (8-bit mantissas), the scaling
//           is exact, so cvtt gives exactly the model's term truncated toward zero to a multiple
//           of 2^(E-25), |term| < 2^27; 16 terms sum exactly in int32 (< 2^31).
//   finish  sum = P + trunc(c · 2^(25-E)) (int32, int64 on overflow), rounded toward zero to fp32
//           (cvt with RZ), times 2^(E-25) (exact: the result is a normal float). That is the model
//           (truncate each term, exact sum, round toward zero) step by step.
// Why the clamp E >= 27 (unbiased -100) is exact: every nonzero product has exponent >= -100 in
// the modelled range, so the clamp only matters when all products are zero; then c is a multiple
// of 2^-125 (it is a previous result), so c's term stays exact and the result is c, as in the
// model.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/thread_pool.h"
#include "cpu/gemm_kernel.h"
#include "cpu/kblock_avx512.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define LOCKSTEP_GEMM_AVX512 1
#include <immintrin.h>
// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as "maybe
// uninitialized" (a false positive): silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace lockstep::cpu::gemm_detail {

#if defined(LOCKSTEP_GEMM_AVX512)

bool fast_kernel_available() { return true; }

namespace {

using namespace kblock_avx512;  // RowStats, make_stats, modelled, transpose16, wide_sum_rz, ...

constexpr int kNR = 32;  // outputs per tile (lanes): one int16 exponent vector, two fp32 vectors
constexpr int kMR = 4;   // rows per micro-kernel call
constexpr int16_t kZeroExp = -16000;  // exponent of a zero element: sums stay far below kEFloor

// 64-byte aligned scratch that grows on demand (one per thread).
class Scratch {
 public:
  ~Scratch() { std::free(p_); }
  void* get(size_t bytes) {
    if (bytes > cap_) {
      std::free(p_);
      cap_ = (bytes + 4095) / 4096 * 4096;
      p_ = std::aligned_alloc(64, cap_);
      if (p_ == nullptr) throw Error("gemm_bf16_nt: out of memory for scratch");
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

// Decodes an x row (kw values, zero-padded to kp, a multiple of 16) into f = fp32 values and
// e = exponents as int32, kZeroExp for zeros:
//   kPairs (packed kernel): the exponent field in both int16 halves, so that one 32-bit
//           broadcast fills all 32 int16 lanes of the kernel's exponent vector;
//   otherwise (small-M kernel): the unbiased exponent field - 127.
template <bool kPairs>
RowStats decode_row(const bf16* src, int64_t kw, int64_t kp, float* f, int32_t* e) {
  const __m512i k7fff = _mm512_set1_epi32(0x7fff), kff = _mm512_set1_epi32(0xff);
  const __m512i zero_e = _mm512_set1_epi32(kPairs ? int32_t(uint32_t(uint16_t(kZeroExp)) * 0x10001u)
                                                  : int32_t(kZeroExp));
  __m512i vmax = _mm512_set1_epi32(-1), vmin = _mm512_set1_epi32(1000);
  __mmask16 any = 0;
  for (int64_t k = 0; k < kp; k += 16) {
    int64_t left = kw - k;
    __mmask16 mask = left >= 16 ? __mmask16(0xffff) : left <= 0 ? 0 : __mmask16((1u << left) - 1);
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, src + k));
    _mm512_store_ps(f + k, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    __m512i field = _mm512_and_si512(_mm512_srli_epi32(v, 7), kff);
    __mmask16 nz = _mm512_test_epi32_mask(v, k7fff);
    __m512i ev = kPairs ? _mm512_or_si512(field, _mm512_slli_epi32(field, 16))
                        : _mm512_sub_epi32(field, _mm512_set1_epi32(127));
    _mm512_store_si512(e + k, _mm512_mask_mov_epi32(zero_e, nz, ev));
    vmax = _mm512_max_epi32(vmax, field);  // zeros have field 0: harmless for the max
    vmin = _mm512_mask_min_epi32(vmin, nz, vmin, field);
    any |= nz;
  }
  return make_stats(any != 0, reduce_min(vmin), reduce_max(vmax));
}

// Packs 32 rows of w (n0 .. n0+31; rows >= N are zeros) into k-major panels:
//   wf[k][32] fp32 values, we[k][32] int16 unbiased exponents (kZeroExp for zeros),
// and returns each row's exponent statistics. Works on 32 k at a time: a 32-bit element holds the
// pair (w[n][k], w[n][k+1]); a 16x16 transpose of those pairs puts n in the lanes.
void pack_w(const Problem& p, int64_t n0, int64_t kp, float* wf, int16_t* we, RowStats* st) {
  const __m512i k7fff = _mm512_set1_epi16(0x7fff), kff = _mm512_set1_epi16(0xff);
  const __m512i k127 = _mm512_set1_epi16(127), zexp = _mm512_set1_epi16(kZeroExp);
  const __m512i hi16 = _mm512_set1_epi32(int32_t(0xffff0000u));
  alignas(64) int16_t even[32], odd[32];
  for (int i = 0; i < 32; ++i) {  // int16 lane 2j of half h is row 16h + j
    even[i] = int16_t(i < 16 ? 2 * i : 32 + 2 * (i - 16));
    odd[i] = int16_t(even[i] + 1);
  }
  const __m512i idx_even = _mm512_load_si512(even), idx_odd = _mm512_load_si512(odd);
  __m512i vmax[2], vmin[2];
  __mmask32 any[2] = {0, 0};
  for (int h = 0; h < 2; ++h) {
    vmax[h] = _mm512_set1_epi16(-1);
    vmin[h] = _mm512_set1_epi16(1000);
  }
  for (int64_t k0 = 0; k0 < kp; k0 += 32) {
    const int64_t left = p.kw - k0;
    const __mmask32 lm = left >= 32 ? ~__mmask32(0) : left <= 0 ? 0 : __mmask32((1u << left) - 1);
    const int dmax = int(std::min<int64_t>(16, (kp - k0) / 2));
    alignas(64) int16_t e16[2][16][32];  // [h][d][lane]: exponents, pair-interleaved
    for (int h = 0; h < 2; ++h) {
      __m512i T[16];
      for (int r = 0; r < 16; ++r) {
        const int64_t n = n0 + 16 * h + r;
        T[r] = n < p.N ? _mm512_maskz_loadu_epi16(
                             lm, static_cast<const bf16*>(p.w.data) + n * p.w.stride[0] + k0)
                       : _mm512_setzero_si512();
      }
      transpose16(T);
      for (int d = 0; d < dmax; ++d) {
        float* f0 = wf + (k0 + 2 * d) * kNR + 16 * h;
        const __m512i t = T[d];
        _mm512_store_ps(f0, _mm512_castsi512_ps(_mm512_slli_epi32(t, 16)));
        _mm512_store_ps(f0 + kNR, _mm512_castsi512_ps(_mm512_and_si512(t, hi16)));
        const __m512i field = _mm512_and_si512(_mm512_srli_epi16(t, 7), kff);
        const __mmask32 nz = _mm512_test_epi16_mask(t, k7fff);
        _mm512_store_si512(e16[h][d],
                           _mm512_mask_mov_epi16(zexp, nz, _mm512_sub_epi16(field, k127)));
        vmax[h] = _mm512_max_epi16(vmax[h], field);
        vmin[h] = _mm512_mask_min_epi16(vmin[h], nz, vmin[h], field);
        any[h] |= nz;
      }
    }
    // Un-interleave: lane j of k (even/odd) for rows 0..15 then 16..31.
    for (int d = 0; d < dmax; ++d) {
      const __m512i e0 = _mm512_load_si512(e16[0][d]), e1 = _mm512_load_si512(e16[1][d]);
      _mm512_store_si512(we + (k0 + 2 * d) * kNR, _mm512_permutex2var_epi16(e0, idx_even, e1));
      _mm512_store_si512(we + (k0 + 2 * d + 1) * kNR, _mm512_permutex2var_epi16(e0, idx_odd, e1));
    }
  }
  for (int h = 0; h < 2; ++h) {
    alignas(64) int16_t mx[32], mn[32];
    _mm512_store_si512(mx, vmax[h]);
    _mm512_store_si512(mn, vmin[h]);
    for (int r = 0; r < 16; ++r) {
      st[16 * h + r] = make_stats((any[h] >> (2 * r) & 3u) != 0, std::min(mn[2 * r], mn[2 * r + 1]),
                                  std::max(mx[2 * r], mx[2 * r + 1]));
    }
  }
}

// MR rows x 32 outputs: for each segment s, the chain over its k-blocks from +0; the segment
// values go to part[(s·MR + m)·32 + lane].
template <int MR>
void kernel(const float* const* xf, const int32_t* const* xe, const float* wf, const int16_t* we,
            int nseg, int64_t seg_len, float* part) {
  const __m512i efloor = _mm512_set1_epi16(kEFloor);
  // Exponents below are kept shifted into the fp32 exponent field (<< 23).
  const __m512i c279 = _mm512_set1_epi32(int32_t(279u << 23)), kexp = _mm512_set1_epi32(0x7f800000);
  const __m512i c254 = _mm512_set1_epi32(254 << 23);
  for (int s = 0; s < nseg; ++s) {
    __m512 c[MR][2];
    for (int m = 0; m < MR; ++m) c[m][0] = c[m][1] = _mm512_setzero_ps();
    const int64_t kb = s * seg_len, ke = kb + seg_len;
    for (int64_t k0 = kb; k0 < ke; k0 += 16) {
      // Pass 1: E per (m, lane), int16, 32 lanes.
      __m512i E[MR];
      for (int m = 0; m < MR; ++m) E[m] = efloor;
#pragma GCC unroll 16
      for (int kk = 0; kk < 16; ++kk) {
        __m512i ew = _mm512_load_si512(we + (k0 + kk) * kNR);
        for (int m = 0; m < MR; ++m)
          E[m] = _mm512_max_epi16(E[m], _mm512_add_epi16(ew, _mm512_set1_epi32(xe[m][k0 + kk])));
      }
      // The accumulator's exponent joins E; scale factors 2^(25-E).
      __m512 sc[MR][2];
      __m512i P[MR][2];
      for (int m = 0; m < MR; ++m)
        for (int h = 0; h < 2; ++h) {
          __m512i eh =
              _mm512_slli_epi32(_mm512_cvtepi16_epi32(h ? _mm512_extracti64x4_epi64(E[m], 1)
                                                        : _mm512_castsi512_si256(E[m])),
                                23);
          eh = _mm512_max_epi32(eh, _mm512_and_si512(_mm512_castps_si512(c[m][h]), kexp));
          sc[m][h] = _mm512_castsi512_ps(_mm512_sub_epi32(c279, eh));  // 2^(25-E)
          P[m][h] = _mm512_setzero_si512();
        }
        // Pass 2: truncated terms, summed exactly in int32.
#pragma GCC unroll 16
      for (int kk = 0; kk < 16; ++kk) {
        const float* wk = wf + (k0 + kk) * kNR;
        __m512 w0 = _mm512_load_ps(wk), w1 = _mm512_load_ps(wk + 16);
        for (int m = 0; m < MR; ++m) {
          __m512 xb = _mm512_set1_ps(xf[m][k0 + kk]);
          P[m][0] = _mm512_add_epi32(
              P[m][0], _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(w0, xb), sc[m][0])));
          P[m][1] = _mm512_add_epi32(
              P[m][1], _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(w1, xb), sc[m][1])));
        }
      }
      // Finish: + c's truncated term, round toward zero, scale back by 2^(E-25).
      for (int m = 0; m < MR; ++m)
        for (int h = 0; h < 2; ++h) {
          __m512i C = _mm512_cvttps_epi32(_mm512_mul_ps(c[m][h], sc[m][h]));
          __m512i sum = _mm512_add_epi32(P[m][h], C);
          // Signed overflow iff P and C share a sign that sum does not: (P^sum)&(C^sum) < 0.
          __mmask16 ovf = _mm512_movepi32_mask(_mm512_ternarylogic_epi32(P[m][h], C, sum, 0x42));
          __m512 r = _mm512_cvt_roundepi32_ps(sum, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
          if (__builtin_expect(ovf != 0, 0)) r = wide_sum_rz(P[m][h], C);
          // 2^(E-25) = 1 / 2^(25-E): exponent field 254 - field.
          __m512 inv = _mm512_castsi512_ps(_mm512_sub_epi32(c254, _mm512_castps_si512(sc[m][h])));
          c[m][h] = _mm512_mul_ps(r, inv);
        }
    }
    for (int m = 0; m < MR; ++m) {
      _mm512_store_ps(part + (s * MR + m) * kNR, c[m][0]);
      _mm512_store_ps(part + (s * MR + m) * kNR + 16, c[m][1]);
    }
  }
}

// f(std::integral_constant<int, R>{}) for R = rows in 1..3, else R = 4: a kernel's row count as
// a template argument.
template <typename F>
void with_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

// One task: rows [m0, m1) x column groups [g0, g1) of 32.
void run_task(const Problem& p, int64_t kp, int64_t m0, int64_t m1, int64_t g0, int64_t g1,
              TileSink sink, void* ctx) {
  thread_local Scratch sx, sw, st;
  const int64_t rows = m1 - m0;
  const size_t xbytes = size_t(rows * kp) * 8, wbytes = size_t(kp) * kNR * 6;
  char* xbuf = static_cast<char*>(sx.get(xbytes + 64));
  float* xf = reinterpret_cast<float*>(xbuf);
  int32_t* xe = reinterpret_cast<int32_t*>(xbuf + size_t(rows * kp) * 4);
  char* wbuf = static_cast<char*>(sw.get(wbytes + 64));
  float* wf = reinterpret_cast<float*>(wbuf);
  int16_t* we = reinterpret_cast<int16_t*>(wbuf + size_t(kp) * kNR * 4);
  // Scratch: the segment values of a tile and the scalar path's padded rows.
  const size_t part_bytes = size_t(p.nseg) * kMR * kNR * 4;
  char* tbuf = static_cast<char*>(st.get(part_bytes + size_t(kp) * 4 + 64));
  float* part = reinterpret_cast<float*>(tbuf);
  bf16* sxb = reinterpret_cast<bf16*>(tbuf + part_bytes);
  bf16* swb = sxb + kp;

  RowStats xs[64 + kMR];
  for (int64_t i = 0; i < rows; ++i) {
    const bf16* row = static_cast<const bf16*>(p.x.data) + (m0 + i) * p.x.stride[0];
    xs[i] = decode_row<true>(row, p.kw, kp, xf + i * kp, xe + i * kp);
  }
  RowStats ws[kNR];
  alignas(64) float vals[kNR];
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t n0 = g * kNR, count = std::min<int64_t>(kNR, p.N - n0);
    pack_w(p, n0, kp, wf, we, ws);
    for (int64_t i0 = 0; i0 < rows; i0 += kMR) {
      const int mr = int(std::min<int64_t>(kMR, rows - i0));
      const float* xfp[kMR];
      const int32_t* xep[kMR];
      for (int i = 0; i < mr; ++i) {
        xfp[i] = xf + (i0 + i) * kp;
        xep[i] = xe + (i0 + i) * kp;
      }
      with_rows(mr, [&](auto R) { kernel<R>(xfp, xep, wf, we, p.nseg, p.seg_len, part); });
      for (int i = 0; i < mr; ++i) {
        const int64_t m = m0 + i0 + i;
        // The segment tree, 16 lanes at a time (the same fp32 adds as tree_sum).
        for (int h = 0; h < 2; ++h) {
          __m512 v[8];
          for (int s = 0; s < p.nseg; ++s)
            v[s] = _mm512_load_ps(part + (s * mr + i) * kNR + 16 * h);
          for (int width = p.nseg; width > 1; width /= 2)
            for (int s = 0; s < width / 2; ++s) v[s] = _mm512_add_ps(v[2 * s], v[2 * s + 1]);
          _mm512_store_ps(vals + 16 * h, v[0]);
        }
        // Outputs whose inputs the kernel does not model: the scalar chain.
        for (int64_t j = 0; j < count; ++j) {
          if (__builtin_expect(!modelled(xs[i0 + i], ws[j]), 0)) {
            const bf16* xr = static_cast<const bf16*>(p.x.data) + m * p.x.stride[0];
            const bf16* wr = static_cast<const bf16*>(p.w.data) + (n0 + j) * p.w.stride[0];
            vals[j] = tree_value_scalar(xr, wr, p.kw, p.nseg, p.seg_len, sxb, swb);
          }
        }
        sink(ctx, m, n0, count, vals);
      }
    }
  }
}

// ---- Small M (decode): w decoded in registers, no packing -------------------------------------
//
// For M <= kSmallM the packing above would cost more than the arithmetic it feeds, so this path
// reads 16 rows of w (outputs n0 .. n0+15, the lanes) 32 k at a time, transposes the pairs
// (w[n][k], w[n][k+1]) in registers and runs the same two passes per k-block on 16 lanes with
// int32 exponents. The arithmetic per output is identical to kernel<> (same steps, same order).
constexpr int64_t kSmallM = 4;

// MR rows x 16 outputs (w rows n0 .. n0+15; rows >= N are zeros). Segment values go to
// part[(s·MR + m)·16 + lane]; the rows' exponent statistics to st[0..16).
template <int MR>
void kernel_small(const Problem& p, int64_t n0, int64_t kp, const float* const* xf,
                  const int32_t* const* xe, float* part, RowStats* st) {
  const __m512i kff = _mm512_set1_epi32(0xff), hi16 = _mm512_set1_epi32(int32_t(0xffff0000u));
  const __m512i efloor = _mm512_set1_epi32(kEFloor);
  const __m512i c279 = _mm512_set1_epi32(int32_t(279u << 23)), kexp = _mm512_set1_epi32(0x7f800000);
  const __m512i c254 = _mm512_set1_epi32(254 << 23);
  LaneStats stats;
  alignas(64) int32_t tb[16][16];  // [k pair][lane]: (w[n][k], w[n][k+1]) of the current 32 k
  __m512 c[MR];
  int seg = -1;
  for (int64_t k0 = 0; k0 < kp; k0 += 32) {
    const int64_t left = p.kw - k0;
    const __mmask32 lm = left >= 32 ? ~__mmask32(0) : left <= 0 ? 0 : __mmask32((1u << left) - 1);
    __m512i T[16];
    for (int r = 0; r < 16; ++r) {
      const int64_t n = n0 + r;
      T[r] = n < p.N ? _mm512_maskz_loadu_epi16(
                           lm, static_cast<const bf16*>(p.w.data) + n * p.w.stride[0] + k0)
                     : _mm512_setzero_si512();
    }
    transpose16(T);
    for (int d = 0; d < 16; ++d) _mm512_store_si512(tb[d], T[d]);
    const int blocks = kp - k0 >= 32 ? 2 : 1;
    for (int b = 0; b < blocks; ++b) {
      const int64_t kb = k0 + 16 * b;
      if (kb % p.seg_len == 0) {  // a segment starts: its chain starts from +0
        if (seg >= 0)
          for (int m = 0; m < MR; ++m) _mm512_store_ps(part + (seg * MR + m) * 16, c[m]);
        ++seg;
        for (int m = 0; m < MR; ++m) c[m] = _mm512_setzero_ps();
      }
      // Pass 1: E = max(27, max_k field(w) + (field(x) - 127)); zero x carry kZeroExp.
      __m512i E[MR], mag;
      for (int m = 0; m < MR; ++m) E[m] = efloor;
#pragma GCC unroll 16
      for (int kk = 0; kk < 16; ++kk) {
        // mag: both elements' magnitudes; field: this k's exponent field (0 for a zero w, whose
        // sum field + ex stays <= 27 because this path takes x rows with exponents <= 27 only).
        if (kk % 2 == 0) mag = stats.add(_mm512_load_si512(tb[8 * b + kk / 2]));
        const __m512i field =
            kk % 2 ? _mm512_srli_epi32(mag, 23) : _mm512_and_si512(_mm512_srli_epi32(mag, 7), kff);
        for (int m = 0; m < MR; ++m)
          E[m] = _mm512_max_epi32(E[m], _mm512_add_epi32(field, _mm512_set1_epi32(xe[m][kb + kk])));
      }
      __m512 sc[MR];
      __m512i P[MR];
      for (int m = 0; m < MR; ++m) {
        __m512i eh = _mm512_slli_epi32(E[m], 23);
        eh = _mm512_max_epi32(eh, _mm512_and_si512(_mm512_castps_si512(c[m]), kexp));
        sc[m] = _mm512_castsi512_ps(_mm512_sub_epi32(c279, eh));  // 2^(25-E)
        P[m] = _mm512_setzero_si512();
      }
      // Pass 2: truncated terms, summed exactly in int32.
#pragma GCC unroll 16
      for (int kk = 0; kk < 16; ++kk) {
        const __m512i t = _mm512_load_si512(tb[8 * b + kk / 2]);
        const __m512 wv =
            _mm512_castsi512_ps(kk % 2 ? _mm512_and_si512(t, hi16) : _mm512_slli_epi32(t, 16));
        for (int m = 0; m < MR; ++m) {
          const __m512 xb = _mm512_set1_ps(xf[m][kb + kk]);
          P[m] = _mm512_add_epi32(P[m],
                                  _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_mul_ps(wv, xb), sc[m])));
        }
      }
      // Finish: as in kernel<>.
      for (int m = 0; m < MR; ++m) {
        const __m512i C = _mm512_cvttps_epi32(_mm512_mul_ps(c[m], sc[m]));
        const __m512i sum = _mm512_add_epi32(P[m], C);
        const __mmask16 ovf = _mm512_movepi32_mask(_mm512_ternarylogic_epi32(P[m], C, sum, 0x42));
        __m512 r = _mm512_cvt_roundepi32_ps(sum, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        if (__builtin_expect(ovf != 0, 0)) r = wide_sum_rz(P[m], C);
        const __m512 inv = _mm512_castsi512_ps(_mm512_sub_epi32(c254, _mm512_castps_si512(sc[m])));
        c[m] = _mm512_mul_ps(r, inv);
      }
    }
  }
  if (seg >= 0)
    for (int m = 0; m < MR; ++m) _mm512_store_ps(part + (seg * MR + m) * 16, c[m]);
  for (int s = seg + 1; s < p.nseg; ++s)  // only when kp == 0
    for (int m = 0; m < MR; ++m) _mm512_store_ps(part + (s * MR + m) * 16, _mm512_setzero_ps());
  stats.store(st);
}

// One small-M task: all M (<= kSmallM) rows x 16-row groups [g0, g1) of w.
void run_task_small(const Problem& p, int64_t kp, int64_t g0, int64_t g1, TileSink sink,
                    void* ctx) {
  thread_local Scratch sx, st;
  const int64_t rows = p.M;
  char* xbuf = static_cast<char*>(sx.get(size_t(rows * kp) * 8 + 64));
  float* xf = reinterpret_cast<float*>(xbuf);
  int32_t* xe = reinterpret_cast<int32_t*>(xbuf + size_t(rows * kp) * 4);
  const size_t part_bytes = size_t(p.nseg) * kSmallM * 16 * 4;
  char* tbuf = static_cast<char*>(st.get(part_bytes + size_t(kp) * 4 + 64));
  float* part = reinterpret_cast<float*>(tbuf);
  bf16* sxb = reinterpret_cast<bf16*>(tbuf + part_bytes);
  bf16* swb = sxb + kp;
  RowStats xs[kSmallM], ws[16];
  const float* xfp[kSmallM];
  const int32_t* xep[kSmallM];
  for (int64_t i = 0; i < rows; ++i) {
    const bf16* row = static_cast<const bf16*>(p.x.data) + i * p.x.stride[0];
    xs[i] = decode_row<false>(row, p.kw, kp, xf + i * kp, xe + i * kp);
    xfp[i] = xf + i * kp;
    xep[i] = xe + i * kp;
  }
  alignas(64) float vals[16];
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t n0 = g * 16, count = std::min<int64_t>(16, p.N - n0);
    with_rows(rows, [&](auto R) { kernel_small<R>(p, n0, kp, xfp, xep, part, ws); });
    for (int64_t i = 0; i < rows; ++i) {
      __m512 v[8];
      for (int s = 0; s < p.nseg; ++s) v[s] = _mm512_load_ps(part + (s * rows + i) * 16);
      for (int width = p.nseg; width > 1; width /= 2)
        for (int s = 0; s < width / 2; ++s) v[s] = _mm512_add_ps(v[2 * s], v[2 * s + 1]);
      _mm512_store_ps(vals, v[0]);
      for (int64_t j = 0; j < count; ++j) {
        // This path also needs |x| < 2^28 (see kernel_small: zero w elements are not masked).
        if (__builtin_expect(!modelled(xs[i], ws[j]) || xs[i].emax > 127 + 27, 0)) {
          const bf16* xr = static_cast<const bf16*>(p.x.data) + i * p.x.stride[0];
          const bf16* wr = static_cast<const bf16*>(p.w.data) + (n0 + j) * p.w.stride[0];
          vals[j] = tree_value_scalar(xr, wr, p.kw, p.nseg, p.seg_len, sxb, swb);
        }
      }
      sink(ctx, i, n0, count, vals);
    }
  }
}

}  // namespace

void tree_all_fast(const Problem& p, TileSink sink, void* ctx) {
  const int64_t kp = int64_t(p.nseg) * p.seg_len;
  if (p.M <= kSmallM) {
    // Tasks of 16-row groups of w, about 4 per thread, handed out dynamically.
    const int64_t groups = (p.N + 15) / 16;
    const int64_t gb = std::clamp<int64_t>(groups / (4 * num_threads()), 1, 32);
    const int64_t tasks = (groups + gb - 1) / gb;
    std::atomic<int64_t> next{0};
    parallel_for(std::min<int64_t>(num_threads(), tasks), 1, [&](int64_t, int64_t) {
      for (int64_t t; (t = next.fetch_add(1)) < tasks;)
        run_task_small(p, kp, t * gb, std::min(groups, (t + 1) * gb), sink, ctx);
    });
    return;
  }
  const int64_t groups = (p.N + kNR - 1) / kNR;
  // Tile sizes only change speed, never bits (each output's arithmetic is fixed).
  // Rows per task: the decoded x rows (8 bytes per element) stay within ~1 MB of L2.
  int64_t mb = std::max<int64_t>(
      kMR, std::min<int64_t>(64, (int64_t(1) << 20) / std::max<int64_t>(kp * 8, 1)));
  mb = mb / kMR * kMR;
  mb = std::min(mb, p.M);
  // Column groups per task: about 4 tasks per thread when M is small, and as wide as 16 groups
  // (512 columns) otherwise, so that each task re-decodes its x rows less often.
  const int64_t gb = std::clamp<int64_t>(groups / (4 * num_threads()), 4, 16);
  const int64_t mtasks = (p.M + mb - 1) / mb, gtasks = (groups + gb - 1) / gb;
  // Tasks are handed out dynamically (a thread slowed by other load takes fewer); which thread
  // computes a task never matters for the bits.
  const int64_t tasks = mtasks * gtasks;
  std::atomic<int64_t> next{0};
  parallel_for(std::min<int64_t>(num_threads(), tasks), 1, [&](int64_t, int64_t) {
    for (int64_t t; (t = next.fetch_add(1)) < tasks;) {
      const int64_t mi = t / gtasks, gi = t % gtasks;
      run_task(p, kp, mi * mb, std::min(p.M, (mi + 1) * mb), gi * gb,
               std::min(groups, (gi + 1) * gb), sink, ctx);
    }
  });
}

#else  // no AVX-512: the scalar path is used (same bits)

bool fast_kernel_available() { return false; }
void tree_all_fast(const Problem&, TileSink, void*) {
  throw Error("gemm_bf16_nt: the vectorized kernel is not compiled in this build");
}

#endif

}  // namespace lockstep::cpu::gemm_detail
