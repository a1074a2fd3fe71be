// Sampling kernels, docs/contract.md §S, over a block of rows whose tempered logits y = z / τ_lp
// (padding −inf) sit in a [rows, ldy] scratch and whose LogP tile states, lse and entropy the
// LogP kernels (logprob.cuh) already wrote. One CTA per row (sample_choose_kernel):
//   - the argmax (lowest index among the largest y) from the tile maxima: greedy rows stop here;
//   - the choice (§S.7) of every other row: each warp sums the candidates' masses
//     q = floor(p · 2^32) over its segment of the row (kChooseWarps segments of consecutive
//     ids), a scan over the segments finds the one holding the target floor(U · Q / 2^64), and
//     the CTA scans that segment's masses in id order for the entry whose interval holds it;
//   - plain rows (no filter, or min-p only): one pass over the row (the masses), then that;
//   - top-k / top-p rows, bounds first: with k <= the tile count, the level-0 bin of the k-th
//     largest tile maximum bounds every top-k entry (k tiles' maxima are k entries at or above
//     it), so one pass of compares copies those bins to the list; top-p alone: level 0's counts
//     bound each bin's mass (topp_bracket), which brackets the boundary's bins, and one pass takes
//     every entry's mass once (Q, the sums before the bracket, the bracket to the list). When a
//     bound's list overflows, the exact path below runs;
//   - top-k / top-p rows, exact: a radix select on the canonical order instead of a sort. Pass 1: a
//     histogram over lse − y in bins of 1/128 nat (4095 bins, then a tail) of counts (top-k) or
//     exact integer masses floor(p·2^32) (top-p alone); the scans give the bins [b_lo, b_hi]
//     that can hold the boundaries. With top-k, when the bins up to top-k's bin hold at most
//     kListCap entries, they all go to the list (b_lo = 0) and top-p's boundary is found there:
//     no row masses at all (otherwise pass 1 runs again with masses, and b_lo is top-p's
//     bin). Pass 2: a bin is a range of y (bin_cut), so each entry is two compares: y above
//     b_lo's range is a candidate (its mass goes to its segment's sum now), y inside
//     [b_lo, b_hi] goes to a shared-memory list, where 8-bit digit histograms of the unique keys
//     (y descending, v ascending) narrow each boundary to one key; the list's candidates then add
//     their masses. If the list overflows, extra passes narrow by 12-bit key digits over the row,
//     then one last pass sums the candidates' masses.
// Every count and mass is an integer sum and the order is strict and total, so the boundaries are
// those of a full sort and the segment sums and prefixes are exact whatever the reduction order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "core/math.h"
#include "core/sample_choice.h"
#include "cuda/logprob.cuh"
#include "cuda/sampling_internal.h"

namespace lockstep::cuda::detail {

// NOTE: 512 threads (up to 128 registers: the passes run without spills; 1024 threads spill at
// 64), kAhead loads of 16 bytes in flight per thread in the passes over the row.
constexpr int kChooseThreads = 512;
constexpr int kChooseWarps = kChooseThreads / 32;
constexpr int kAhead = 4;
constexpr int kVocabBits = 21;  // V < 2^21: a key is (desc(y) << 21) | v
constexpr uint64_t kVocabMask = (uint64_t(1) << kVocabBits) - 1;
constexpr int kBucketBits = 12;  // level 0 and the row digits: 4096 bins
constexpr int kBuckets = 1 << kBucketBits;
constexpr int kTail = kBuckets - 1;  // lse − y >= 31.99 nat, and y = −inf
constexpr int kListCap = 8192;       // boundary entries kept in shared memory
constexpr int kListDigitBits = 8;
constexpr int kListBins = 1 << kListDigitBits;
constexpr int kFew = 32;  // a key window this small is ranked by one warp
// Plain rows' masses are summed by a grid of kPlainSlices CTAs per row (sample_plain_sums_kernel):
// kPlainSegs segments of consecutive groups, one per warp.
constexpr int kPlainThreads = 256;
constexpr int kPlainWarps = kPlainThreads / 32;
constexpr int kPlainSlices = 16;
constexpr int kPlainSegs = kPlainSlices * kPlainWarps;
static_assert(kPlainSegs % 32 == 0 && kPlainSegs >= kChooseWarps, "one warp scans the segments");

// p_v = exp(d), d = y − lse (§S.5), and its mass q = floor(p · 2^32) (sample_mass_q32).
__device__ __forceinline__ float row_prob(float y, float lse) { return ls_expf(__fsub_rn(y, lse)); }
__device__ __forceinline__ uint64_t mass_q32(float d) {
  return d < -23.0f ? 0 : sample_q32(sample_expf_normal(d));  // sample_mass_q32 (d <= 0)
}

// A float's bits as an unsigned integer in the float's order (−0 just below +0).
__device__ __forceinline__ uint32_t ordered(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// The canonical order's key: (desc(y) << 21) | v ascending = y descending, then v ascending
// (−0 keyed as +0, so equal y compare by index for signed zeros too).
__device__ __forceinline__ uint64_t sample_key(float y, int64_t v) {
  uint32_t u = __float_as_uint(y);
  if ((u & 0x7fffffffu) == 0) u = 0;
  return (uint64_t(~ordered(__uint_as_float(u))) << kVocabBits) | uint64_t(v);
}

// Level-0 bin of an entry, from d = y − lse: −d in bins of 1/128 nat (32 − d lies in [32, 64),
// where the float bits are linear: 2^-18 nat per step, >> 11), kTail for −d >= 31.99 and y = −inf.
// Non-increasing in y, so the bins are key ranges in canonical order and never split equal y.
__device__ __forceinline__ int level0_bin(float d) {
  const float x = fmaxf(__fsub_rn(32.0f, d), 32.0f);
  const uint32_t b = (__float_as_uint(x) - 0x42000000u) >> 11;
  return b < uint32_t(kTail) ? int(b) : kTail;
}

// A mass sum in two shared u32 words: lo = the sum of the masses' low kMassLoBits bits, hi = the
// sum of the rest (q >> kMassLoBits). Neither wraps: lo < V·2^11 < 2^32, and hi <= the total mass
// (about 2^32, never above 2^33) / 2^11. Both are plain adds without a returned value (reductions),
// exact whatever their order.
constexpr int kMassLoBits = 11;
static_assert(kVocabBits + kMassLoBits <= 32, "the low-bit sums of a row fit a u32");
__device__ __forceinline__ void add_mass(uint32_t* lo, uint32_t* hi, uint64_t q) {
  const uint32_t ql = uint32_t(q) & ((1u << kMassLoBits) - 1u);
  const uint32_t qh = uint32_t(q >> kMassLoBits);
  if (ql != 0) atomicAdd(lo, ql);
  if (qh != 0) atomicAdd(hi, qh);
}
__device__ __forceinline__ uint64_t mass_of(uint32_t lo, uint32_t hi) {
  return (uint64_t(hi) << kMassLoBits) + uint64_t(lo);
}

// A histogram of counts and masses in shared memory; after scan_hist, inclusive prefixes.
struct Hist {
  uint32_t* cnt;
  uint32_t* lo;
  uint32_t* hi;
  __device__ void clear(int n) const {
    for (int i = threadIdx.x; i < n; i += blockDim.x) cnt[i] = lo[i] = hi[i] = 0;
  }
  __device__ void add(int b, uint64_t q) const {
    atomicAdd(&cnt[b], 1u);
    add_mass(&lo[b], &hi[b], q);
  }
  __device__ uint64_t count(int b) const { return b < 0 ? 0 : cnt[b]; }
  __device__ uint64_t mass(int b) const { return b < 0 ? 0 : mass_of(lo[b], hi[b]); }
  __device__ uint64_t cum(int b, bool by_mass) const { return by_mass ? mass(b) : count(b); }
};

using ChooseScan = cub::BlockScan<unsigned long long, kChooseThreads>;

struct ChooseSmem {
  uint32_t cnt[kBuckets], lo[kBuckets], hi[kBuckets];  // level 0
  union {
    struct {
      uint64_t key[kListCap];
      uint64_t q[kListCap];
    } list;
    struct {
      uint32_t cnt[kBuckets], lo[kBuckets], hi[kBuckets];
    } digit;  // row digits (only while the list is being rebuilt)
  } u;
  uint32_t sub_cnt[kListBins], sub_lo[kListBins], sub_hi[kListBins];  // list digits
  unsigned long long seg_mass[kPlainSegs];  // the candidates' mass of each segment of the row
  uint64_t few_key[kFew], few_q[kFew];
  union {
    ChooseScan::TempStorage scan;
    uint64_t red[33];  // block_all
  } t;
  uint64_t found[3];
  uint32_t list_n, few_n;
  int choice;
};

template <class T>
__device__ __forceinline__ T shfl_xor_any(T v, int o) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "one or two words");
  if constexpr (sizeof(T) == 4) {
    uint32_t w;
    memcpy(&w, &v, 4);
    w = __shfl_xor_sync(0xffffffffu, w, o);
    memcpy(&v, &w, 4);
  } else {
    unsigned long long w;
    memcpy(&w, &v, 8);
    w = __shfl_xor_sync(0xffffffffu, w, o);
    memcpy(&v, &w, 8);
  }
  return v;
}

// op over the block (kChooseThreads threads), in every thread. op is min / max / an integer sum /
// the candidate order here: any tree gives the same value.
template <class T, class Op>
__device__ T block_all(T v, Op op, ChooseSmem& sm) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "fits a red slot");
  static_assert((kChooseWarps & (kChooseWarps - 1)) == 0 && kChooseWarps <= 32, "warp tree");
  T* s = reinterpret_cast<T*>(sm.t.red);
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = op(v, shfl_xor_any(v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = s[lane < kChooseWarps ? lane : 0];
#pragma unroll
    for (int o = kChooseWarps / 2; o >= 1; o >>= 1) v = op(v, shfl_xor_any(v, o));
    if (lane == 0) s[32] = v;
  }
  __syncthreads();
  const T r = s[32];
  __syncthreads();
  return r;
}

__device__ __forceinline__ uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
__device__ __forceinline__ uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }
__device__ __forceinline__ uint64_t sum_u64(uint64_t a, uint64_t b) { return a + b; }

// In place: the bins [0, n) of h -> inclusive prefix counts and masses.
__device__ void scan_hist(const Hist& h, int n, ChooseSmem& sm) {
  const int per = (n + kChooseThreads - 1) / kChooseThreads;
  const int b0 = min(n, int(threadIdx.x) * per), b1 = min(n, b0 + per);
  unsigned long long c = 0, m = 0;
  for (int b = b0; b < b1; ++b) c += h.cnt[b], m += h.mass(b);
  unsigned long long ce, me;
  ChooseScan(sm.t.scan).ExclusiveSum(c, ce);
  __syncthreads();
  ChooseScan(sm.t.scan).ExclusiveSum(m, me);
  for (int b = b0; b < b1; ++b) {
    ce += h.cnt[b];
    me += h.mass(b);
    h.cnt[b] = uint32_t(ce);
    h.lo[b] = uint32_t(me) & ((1u << kMassLoBits) - 1u);  // the prefix in the same form
    h.hi[b] = uint32_t(me >> kMassLoBits);
  }
  __syncthreads();
}

// The first bin of a scanned h whose prefix reaches target (n − 1 if none does).
__device__ int first_reaching(const Hist& h, int n, uint64_t target, bool by_mass, ChooseSmem& sm) {
  uint64_t first = uint64_t(n - 1);
  for (int b = threadIdx.x; b < n; b += blockDim.x) {
    if (h.cum(b, by_mass) >= target) {
      first = uint64_t(b);
      break;
    }
  }
  return int(block_all(first, min_u64, sm));
}

// A boundary key and the count and mass of the keys <= it.
struct Found {
  uint64_t key, cnt, mass;
};

// A window of the canonical order: the m keys in [lo, hi], after below_c keys of mass below_m.
struct Window {
  uint64_t lo, hi, below_c, below_m, m;
  __device__ bool holds(uint64_t key) const { return key >= lo && key <= hi; }
  // The shift that makes (key − lo) >> shift a `bits`-bit digit of every key in the window.
  __device__ int digit_shift(int bits) const {
    const int span = 64 - __clzll(hi - lo);
    return span > bits ? span - bits : 0;
  }
  // After h counted the window's keys by (key − lo) >> shift into n bins: the window becomes the
  // bin where the prefix (count, or mass) reaches target.
  __device__ void narrow(const Hist& h, int n, int shift, uint64_t target, bool by_mass,
                         ChooseSmem& sm) {
    scan_hist(h, n, sm);
    const int s = first_reaching(h, n, target - (by_mass ? below_m : below_c), by_mass, sm);
    below_c += h.count(s - 1);
    below_m += h.mass(s - 1);
    m = h.count(s) - h.count(s - 1);
    lo += uint64_t(s) << shift;
    hi = min_u64(hi, lo + ((uint64_t(1) << shift) - 1));
  }
};

// The smallest key K of the shared-memory list (n entries, window w) whose prefix (count, or mass,
// of the keys <= K, from the start of the order) reaches target, inside w. Narrows the window by
// 8-bit digits until at most kFew keys are left, which one warp ranks.
__device__ Found list_locate(ChooseSmem& sm, int n, Window w, uint64_t target, bool by_mass) {
  const Hist sub{sm.sub_cnt, sm.sub_lo, sm.sub_hi};
  const uint64_t* key = sm.u.list.key;
  const uint64_t* q = sm.u.list.q;
  while (w.m > uint64_t(kFew)) {
    const int shift = w.digit_shift(kListDigitBits);
    __syncthreads();  // every thread has read the previous digit's bins
    sub.clear(kListBins);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (w.holds(key[i])) sub.add(int((key[i] - w.lo) >> shift), q[i]);
    __syncthreads();
    w.narrow(sub, kListBins, shift, target, by_mass, sm);
  }
  if (threadIdx.x == 0) sm.few_n = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (w.holds(key[i])) {
      const uint32_t j = atomicAdd(&sm.few_n, 1u);
      sm.few_key[j] = key[i];
      sm.few_q[j] = q[i];
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int few = int(sm.few_n), lane = int(threadIdx.x);
    if (lane < few) {
      const uint64_t k = sm.few_key[lane], qk = sm.few_q[lane];
      uint64_t c = w.below_c, m = w.below_m;  // prefix of the keys <= k
      for (int j = 0; j < few; ++j) {
        if (sm.few_key[j] <= k) {
          c += 1;
          m += sm.few_q[j];
        }
      }
      // Exactly one key is the first whose prefix reaches the target (keys are unique).
      const bool hit = by_mass ? (m >= target && m - qk < target) : (c >= target && c - 1 < target);
      if (hit) {
        sm.found[0] = k;
        sm.found[1] = c;
        sm.found[2] = m;
      }
    }
  }
  __syncthreads();
  const Found f{sm.found[0], sm.found[1], sm.found[2]};
  __syncthreads();
  return f;
}

// The shared-memory list of boundary entries: the keys of window w (with their masses, total_m).
struct ListRange {
  bool valid;
  Window w;
  uint64_t total_m;
  __device__ bool covers(uint64_t target, bool by_mass) const {
    return valid && (by_mass ? w.below_m < target && target - w.below_m <= total_m
                             : w.below_c < target && target - w.below_c <= w.m);
  }
};

// The lowest finite float: y >= kFiniteLow is y != −inf (y is never NaN in a row whose lse is
// finite).
constexpr float kFiniteLow = -0x1.fffffep127f;

// The smallest y (in float order, −inf … +inf) whose level-0 bin is below b; level0_bin(y − lse) is
// non-increasing in y, so an entry's bin is < b exactly when y >= bin_cut(b) (−0 and +0 share a
// bin). NaN (no y) for b <= 0. A binary search over the ordered bits: 32 steps.
__device__ __forceinline__ float bin_cut(int b, float lse) {
  if (b <= 0) return __uint_as_float(0x7fc00000u);
  uint32_t lo = ordered(neg_inf_f32()), hi = ordered(__uint_as_float(0x7f800000u));
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (level0_bin(__fsub_rn(from_ordered(mid), lse)) < b) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return from_ordered(lo);
}

// thr = ceil(top_p · Q) in one double multiply (§S.5).
__device__ __forceinline__ uint64_t topp_threshold(float top_p, uint64_t Q) {
  return uint64_t(ceil(__dmul_rn(double(top_p), double(Q))));
}

// Bounds on the mass q = floor(ls_expf(d) · 2^32) of any entry in level-0 bin b. level0_bin rounds
// 32 − d to 2^-18, so an entry of bin b < kTail has d in [−(b + 1)/128 − 2^-19, −b/128 + 2^-19];
// ls_expf errs by < 1 ulp (< 2^-23 relative), the double exp by far less than the 2^-21 margin;
// d < −23 gives q = 0. The tail's entries (−d >= 31.99, or −inf) have q = 0.
__device__ __forceinline__ void bin_mass_bounds(int b, uint64_t& lo, uint64_t& hi) {
  if (b >= kTail) {
    lo = hi = 0;
    return;
  }
  const double d_hi = -double(b) * 0x1p-7 + 0x1p-19, d_lo = -double(b + 1) * 0x1p-7 - 0x1p-19;
  hi = uint64_t(fmin(exp(d_hi) * (1.0 + 0x1p-21), 1.0) * 0x1p32);
  lo = d_lo < -23.0 ? 0 : uint64_t(exp(d_lo) * (1.0 - 0x1p-21) * 0x1p32);
}

// top-p's bracket is used up to this top_p: below it ceil(top_p · Q) grows by at most 1 when Q
// grows by 1 (top_p + ulp(top_p · Q) < 1 for Q < 2^33), which topp_bracket relies on.
constexpr float kBracketTopPMax = 0x1.fffep-1f;  // 1 − 2^-16

// The level-0 bins [b_lo, b_hi] that hold top-p's boundary (over every entry: no top-k), from the
// bins' counts alone (h: level 0's counts, not yet scanned). Each bin's mass lies between its count
// times bin_mass_bounds' lo and hi. With C(b) the mass of the bins <= b and R(b) = Q − C(b) the
// mass after them, the boundary's bin is the first b with C(b) >= thr(C(b) + R(b));
// C − thr(C + R) is non-decreasing in C (top_p <= kBracketTopPMax) and non-increasing in R, so a
// bin with C_hi < thr(C_hi + R_lo) surely precedes the boundary's and one with C_lo >= thr(C_lo +
// R_hi) surely does not: b_lo is the first bin that does not surely precede it, b_hi the first that
// surely does not (the tail always: thr(Q) <= Q). The width is the bounds' spread weighted by
// 1 − top_p on C and top_p on R, not Q's own spread (docs/perf.md, session 33, for its size).
__device__ int2 topp_bracket(const Hist& h, float top_p, ChooseSmem& sm) {
  constexpr int per = kBuckets / kChooseThreads;
  static_assert(kBuckets % kChooseThreads == 0, "whole runs of bins per thread");
  const int b0 = int(threadIdx.x) * per;
  unsigned long long run_lo = 0, run_hi = 0;
  for (int b = b0; b < b0 + per; ++b) {
    uint64_t lo, hi;
    bin_mass_bounds(b, lo, hi);
    run_lo += uint64_t(h.cnt[b]) * lo;
    run_hi += uint64_t(h.cnt[b]) * hi;
  }
  unsigned long long c_lo, c_hi, q_lo, q_hi;
  ChooseScan(sm.t.scan).ExclusiveSum(run_lo, c_lo, q_lo);
  __syncthreads();
  ChooseScan(sm.t.scan).ExclusiveSum(run_hi, c_hi, q_hi);
  __syncthreads();
  uint64_t first_open = uint64_t(kTail), first_after = uint64_t(kTail);
  for (int b = b0; b < b0 + per; ++b) {
    uint64_t lo, hi;
    bin_mass_bounds(b, lo, hi);
    c_lo += uint64_t(h.cnt[b]) * lo;
    c_hi += uint64_t(h.cnt[b]) * hi;
    const bool before = c_hi < topp_threshold(top_p, c_hi + (q_lo - c_lo));
    const bool after = c_lo >= topp_threshold(top_p, c_lo + (q_hi - c_hi));
    if (!before && first_open == uint64_t(kTail)) first_open = uint64_t(b);
    if (after && first_after == uint64_t(kTail)) first_after = uint64_t(b);
  }
  const int b_lo = int(block_all(first_open, min_u64, sm));
  const int b_hi = int(block_all(first_after, min_u64, sm));
  return make_int2(b_lo, b_hi);
}

// Which entries of a row are candidates of the choice, and their masses (§S.5-S.7).
struct Cands {
  float lse, min_p_thr;
  int min_p;      // the min-p filter is on
  uint64_t last;  // candidates have key <= last (all ones: no such bound)
  float y_lo;     // candidates have y >= y_lo (implied by key <= last; a cheap first test)
  // q of the entry (yv, v) if it is a candidate, else 0 (sample_mass_q32's number: the exp and the
  // conversion in their short forms, sample_expf_normal / sample_q32, since −23 <= d <= 0 here).
  // NOTE: d < −23 gives q = 0 whether or not the entry passes min-p, so it needs neither test.
  __device__ __forceinline__ uint64_t mass(float yv, int64_t v) const {
    const float d = __fsub_rn(yv, lse);
    if (!(yv >= y_lo) || d < -23.0f) return 0;
    if (last != ~uint64_t(0) && sample_key(yv, v) > last) return 0;
    const float pv = sample_expf_normal(d);
    if (min_p && !(pv >= min_p_thr)) return 0;
    return sample_q32(pv);
  }
};

// The row's 4-entry groups cut into n segments of consecutive groups (segment s: groups
// [s·S, (s + 1)·S), S = seg_groups(V, n)). A prefix over the segments in order is a prefix over
// ascending ids.
__device__ __forceinline__ int seg_groups(int64_t V, int n) {
  const int ng = int((V + 3) >> 2);  // V < 2^21
  return (ng + n - 1) / n;
}

// Calls fn(g, ys, nv) for the 4-entry groups g in [g0, g1) of the row (ys = y[4g .. 4g+3], nv of
// them below V), one warp: 32 consecutive groups per step (one per lane: coalesced), the next
// kAhead steps' loads in flight; descending group order when `reverse`. Every lane of the warp
// calls fn together (a lane past g1 with nv = 0 and ys = −inf), and the warp reconverges after
// each call: lanes whose group took a rare path would otherwise run the rest of the loop apart
// from the others, each subset issuing every instruction again.
// NOTE: fn is inlined once (a small loop body: the kernel's code is large, and unrolling the
// groups with two load buffers cost more in instruction fetch than it gained in loads in flight;
// docs/perf.md, 2026-12-04).
template <class Fn>
__device__ __forceinline__ void for_each_group_in(const float* __restrict__ y, int64_t V, int g0,
                                                  int g1, bool reverse, Fn&& fn) {
  const int ng = int((V + 3) >> 2), nv_last = int(V - 4 * int64_t(ng - 1));
  const int lane = int(threadIdx.x) & 31, n = g1 - g0;
  const float4* y4 = reinterpret_cast<const float4*>(y);
  auto at = [&](int i) {
    return i < n ? __ldg(y4 + (reverse ? g1 - 1 - i : g0 + i))
                 : make_float4(neg_inf_f32(), neg_inf_f32(), neg_inf_f32(), neg_inf_f32());
  };
  float4 ahead[kAhead];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) ahead[j] = at(lane + j * 32);
  for (int k = 0; k < n; k += 32) {
    const int i = lane + k;
    const float4 cur = ahead[0];
#pragma unroll
    for (int j = 0; j + 1 < kAhead; ++j) ahead[j] = ahead[j + 1];
    ahead[kAhead - 1] = at(i + kAhead * 32);
    const int g = reverse ? g1 - 1 - i : g0 + i;
    const float ys[4] = {cur.x, cur.y, cur.z, cur.w};
    fn(int64_t(i < n ? g : 0), ys, i >= n ? 0 : g == ng - 1 ? nv_last : 4);
    __syncwarp();
  }
}

// The groups [g0, g1) of a row, ascending, in loads of kAhead groups per lane issued together
// and then handed to fn(ys) one by one (unrolled: no register rotation between iterations);
// groups past g1 read as −inf, like the row's padding past V. For kernels with many warps per SM
// (sample_plain_sums_kernel), whose other warps hide the loads' latency.
template <class Fn>
__device__ __forceinline__ void for_each_group_batched(const float* __restrict__ y, int g0, int g1,
                                                       Fn&& fn) {
  const int lane = int(threadIdx.x) & 31;
  const float4* y4 = reinterpret_cast<const float4*>(y);
  for (int base = g0; base < g1; base += 32 * kAhead) {  // (warp-uniform)
    float4 v[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int g = base + lane + 32 * j;
      v[j] = g < g1 ? __ldg(y4 + g)
                    : make_float4(neg_inf_f32(), neg_inf_f32(), neg_inf_f32(), neg_inf_f32());
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const float ys[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
      fn(ys);
    }
  }
}

// for_each_group_in over this warp's segment of the CTA's kChooseWarps segments of the row.
template <class Fn>
__device__ __forceinline__ void for_each_group(const float* __restrict__ y, int64_t V, bool reverse,
                                               Fn&& fn) {
  const int ng = int((V + 3) >> 2), S = seg_groups(V, kChooseWarps);
  const int g0 = min(ng, (int(threadIdx.x) >> 5) * S);
  for_each_group_in(y, V, g0, min(ng, g0 + S), reverse, fn);
}

// The lanes' sums added (any tree: integers), in every lane.
__device__ __forceinline__ uint64_t warp_sum(uint64_t acc) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) acc += shfl_xor_any(acc, o);
  return acc;
}

// The choice (§S.7) once sm.seg_mass[0, n_segs) holds every segment's candidate mass (c's
// candidates; segments of seg_groups(V, n_segs) groups): Q, the target floor(u · Q / 2^64), the
// segment holding it (one warp: each lane a run of consecutive segments, the runs' sums scanned),
// then the segment's entries in id order (a contiguous run of groups per thread, the runs' sums
// scanned across the CTA) to the one whose mass interval holds it. Returns the id (−1 only if
// Q = 0, which a row with a finite lse cannot have: its argmax is a candidate of mass > 0).
__device__ int choose_by_mass(ChooseSmem& sm, const float* __restrict__ y, int64_t V,
                              const Cands& c, uint64_t u, int n_segs) {
  __syncthreads();  // every segment's mass is in
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x), per = (n_segs + 31) / 32;
    const int j0 = min(n_segs, lane * per), j1 = min(n_segs, j0 + per);
    uint64_t run = 0;
    for (int j = j0; j < j1; ++j) run += sm.seg_mass[j];
    uint64_t incl = run;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      unsigned long long w = incl;
      w = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) incl += w;
    }
    const uint64_t total = __shfl_sync(0xffffffffu, (unsigned long long)incl, 31);
    const uint64_t target = total == 0 ? 0 : sample_target(u, total);
    const unsigned hit = __ballot_sync(0xffffffffu, incl > target);
    if (lane == 0) {
      sm.found[0] = ~uint64_t(0);  // no segment (Q = 0)
      sm.found[1] = target;
    }
    __syncwarp();
    if (hit != 0 && lane == __ffs(int(hit)) - 1) {
      uint64_t below = incl - run;  // the mass before this lane's run
      for (int j = j0; j < j1; ++j) {
        if (below + sm.seg_mass[j] > target) {
          sm.found[0] = uint64_t(j);
          sm.found[2] = below;
          break;
        }
        below += sm.seg_mass[j];
      }
    }
  }
  if (threadIdx.x == 0) sm.choice = -1;
  __syncthreads();
  if (sm.found[0] != ~uint64_t(0)) {
    const int s = int(sm.found[0]);
    const uint64_t t = sm.found[1] - sm.found[2];  // the target inside segment s
    const int ng = int((V + 3) >> 2), S = seg_groups(V, n_segs);
    const int g0 = min(ng, s * S), n = min(ng, g0 + S) - g0;
    const int per = (n + kChooseThreads - 1) / kChooseThreads;
    const int a = g0 + min(n, int(threadIdx.x) * per),
              b = g0 + min(n, int(threadIdx.x) * per + per);
    auto q_at = [&](int64_t v) { return v < V ? c.mass(__ldg(y + v), v) : uint64_t(0); };
    unsigned long long sum = 0, ex = 0;
    for (int g = a; g < b; ++g)
      for (int e = 0; e < 4; ++e) sum += q_at(4 * int64_t(g) + e);
    ChooseScan(sm.t.scan).ExclusiveSum(sum, ex);
    if (ex <= t && t - ex < sum) {  // exactly one thread: its run holds the target
      uint64_t cum = ex;
      for (int64_t v = 4 * int64_t(a); v < 4 * int64_t(b); ++v) {
        cum += q_at(v);
        if (cum > t) {
          sm.choice = int(v);
          break;
        }
      }
    }
  }
  __syncthreads();
  const int id = sm.choice;
  __syncthreads();
  return id;
}

// The entries v0 + e (e < nv) with list_lo <= y < cand_lo onto the shared-memory list, with
// their masses (entries past kListCap are counted, not stored: the list then overflows).
static __device__ __forceinline__ void list_append(ChooseSmem& sm, float4 y4, int64_t v0, int nv,
                                                   float list_lo, float cand_lo, float lse) {
  const float ys[4] = {y4.x, y4.y, y4.z, y4.w};
  for (int e = 0; e < nv; ++e) {
    if (!(ys[e] >= list_lo) || ys[e] >= cand_lo) continue;
    const uint32_t i = atomicAdd(&sm.list_n, 1u);
    if (i < uint32_t(kListCap)) {
      sm.u.list.key[i] = sample_key(ys[e], v0 + e);
      sm.u.list.q[i] = mass_q32(__fsub_rn(ys[e], lse));
    }
  }
}

// y = z / τ_lp for v < V, −inf for the padding [V, ldy). Grid-stride over rows·ldy.
static __global__ void sample_temper_kernel(const SampleBlockParams p) {
  const int64_t n = p.rows * p.ldy;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.ldy, v = i - r * p.ldy;
    p.y[i] = v < p.V ? __fdiv_rn(p.y[i], p.info[p.row0 + r].tau_lp) : neg_inf_f32();
  }
}

// Writes the sampled id and logp = y[id] − lse of a row (or −1 / NaN for a row that cannot be
// sampled, id < 0: the launcher throws for it before any output is written).
__device__ __forceinline__ void write_choice(const SampleBlockParams& p, int64_t t, const float* y,
                                             float lse, int id) {
  if (threadIdx.x != 0) return;
  const bool ok = id >= 0;
  p.out_id[t] = ok ? id : -1;
  p.out_logp[t] = ok ? canonical(__fsub_rn(y[id], lse)) : __uint_as_float(kCanonicalNanF32);
}

// The plain rows' (kPlain: no filter, or min-p only) candidate masses per segment: grid
// (kPlainSlices, rows), warp w of CTA x sums segment x·kPlainWarps + w of the row's kPlainSegs
// into p.seg[r, ·] (other rows' CTAs return at once). Many small CTAs per row keep enough loads in
// flight; one 512-thread CTA per row streamed its row at a fraction of the bandwidth
// (docs/perf.md).
static __global__ void __launch_bounds__(kPlainThreads)
    sample_plain_sums_kernel(const SampleBlockParams p) {
  const int64_t r = blockIdx.y, t = p.row0 + r, V = p.V;
  const SampleRow info = p.info[t];
  const float lse = p.lse[t];
  if (info.mode != kPlain || !isfinite(lse)) return;
  const float* y = p.y + r * p.ldy;
  const int tid = int(threadIdx.x), warp = tid >> 5;
  float min_p_thr = 0.0f;
  if (info.min_p > 0.0f) {  // p_max from the tile maxima, as sample_choose_kernel
    __shared__ float red[kPlainWarps];
    const float* st = p.states + r * p.n_tiles * 3;
    float ym = neg_inf_f32();
    for (int64_t i = tid; i < p.n_tiles; i += kPlainThreads) ym = lp_max(ym, st[3 * i]);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) ym = lp_max(ym, __shfl_xor_sync(0xffffffffu, ym, o));
    if ((tid & 31) == 0) red[warp] = ym;
    __syncthreads();
    ym = red[0];
    for (int w = 1; w < kPlainWarps; ++w) ym = lp_max(ym, red[w]);
    min_p_thr = __fmul_rn(info.min_p, row_prob(ym, lse));
  }
  const bool min_p = info.min_p > 0.0f;
  const int ng = int((V + 3) >> 2), S = seg_groups(V, kPlainSegs);
  const int seg = int(blockIdx.x) * kPlainWarps + warp, g0 = min(ng, seg * S);
  uint64_t acc = 0;
  // Cands::mass of a plain row (no key bound; y >= kFiniteLow is d >= −23's consequence) for the
  // group's four entries at once: one branch per group (rows where most entries lie below −23 skip
  // them), none per entry.
  for_each_group_batched(y, g0, min(ng, g0 + S), [&](const float* ys) {
    float d[4];
    bool any = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      d[e] = __fsub_rn(ys[e], lse);  // (padding and entries past the segment: −inf)
      any |= d[e] >= -23.0f;
    }
    if (!any) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pv = sample_expf_normal(fmaxf(d[e], -23.0f));
      const bool keep = d[e] >= -23.0f && !(min_p && !(pv >= min_p_thr));
      const uint64_t q = sample_q32_unit(pv);
      acc += keep ? q : 0;
    }
  });
  acc = warp_sum(acc);
  if ((tid & 31) == 0) p.seg[r * kPlainSegs + seg] = acc;
}

// Every row of the block, one CTA each (grid: rows; dynamic shared memory: ChooseSmem).
static __global__ void __launch_bounds__(kChooseThreads)
    sample_choose_kernel(const SampleBlockParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ChooseSmem& sm = *reinterpret_cast<ChooseSmem*>(smem_raw);
  const int tid = int(threadIdx.x);
  const int64_t r = blockIdx.x, t = p.row0 + r, V = p.V;
  const SampleRow info = p.info[t];
  const float* y = p.y + r * p.ldy;
  const float lse = p.lse[t];
  if (!isfinite(lse)) {
    write_choice(p, t, y, lse, -1);
    return;
  }

  // The argmax, lowest index among the largest y (greedy's choice, min-p's p_max, always a
  // candidate): the largest tile max, the first tile holding it, its first entry equal to it.
  const float* st = p.states + r * p.n_tiles * 3;
  float ym = neg_inf_f32();
  for (int64_t i = tid; i < p.n_tiles; i += kChooseThreads) ym = lp_max(ym, st[3 * i]);
  ym = block_all(
      ym, [](float a, float b) { return lp_max(a, b); }, sm);
  uint64_t tile = ~uint64_t(0);
  for (int64_t i = tid; i < p.n_tiles; i += kChooseThreads)
    if (st[3 * i] == ym) tile = min_u64(tile, uint64_t(i));
  tile = block_all(tile, min_u64, sm);
  uint64_t va = ~uint64_t(0);
  const int64_t e0 = int64_t(tile) * p.tile, e1 = min(V, e0 + p.tile);
  for (int64_t v = e0 + tid; v < e1; v += kChooseThreads)
    if (y[v] == ym) va = min_u64(va, uint64_t(v));
  va = block_all(va, min_u64, sm);
  if (info.mode == kGreedy) {
    write_choice(p, t, y, lse, int(va));
    return;
  }

  const uint64_t u = sample_row_uniform(info.seed, uint64_t(p.rid[t]), uint32_t(p.pos[t]));
  const bool hk = info.top_k_on != 0, hp = info.top_p < 1.0f, filtered = info.mode == kFiltered;
  const bool min_p = info.min_p > 0.0f;
  const float min_p_thr = min_p ? __fmul_rn(info.min_p, row_prob(ym, lse)) : 0.0f;
  const Cands every{lse, min_p_thr, min_p ? 1 : 0, ~uint64_t(0), kFiniteLow};
  const Hist h0{sm.cnt, sm.lo, sm.hi};
  if (filtered) h0.clear(kBuckets);
  if (tid == 0) sm.list_n = 0;
  __syncthreads();

  // One pass over the row summing each segment's candidate masses (c's: the entries with
  // y >= c.y_lo and key <= c.last) and, with_list, appending the entries with
  // list_lo <= y < c.y_lo to the list.
  auto mass_pass = [&](bool reverse, const Cands& c, bool with_list, float list_lo) {
    uint64_t acc = 0;
    for_each_group(y, V, reverse, [&](int64_t g, const float* ys, int nv) {
      const float m = fmaxf(fmaxf(ys[0], ys[1]), fmaxf(ys[2], ys[3]));
      if (with_list && nv > 0 && m >= list_lo) {
        bool any = false;
#pragma unroll
        for (int e = 0; e < 4; ++e) any = any || (ys[e] >= list_lo && !(ys[e] >= c.y_lo));
        if (any)
          list_append(sm, make_float4(ys[0], ys[1], ys[2], ys[3]), 4 * g, nv, list_lo, c.y_lo, lse);
      }
      __syncwarp();
      if (!(nv > 0 && m >= c.y_lo)) return;
#pragma unroll
      for (int e = 0; e < 4; ++e)  // (entries past V are the row's −inf padding: never >= y_lo)
        acc += c.mass(ys[e], 4 * g + e);
    });
    acc = warp_sum(acc);
    if ((tid & 31) == 0) sm.seg_mass[tid >> 5] = acc;
  };

  if (!filtered) {  // the segments' masses are sample_plain_sums_kernel's
    for (int i = tid; i < kPlainSegs; i += kChooseThreads)
      sm.seg_mass[i] = p.seg[r * kPlainSegs + i];
    write_choice(p, t, y, lse, choose_by_mass(sm, y, V, every, u, kPlainSegs));
    return;
  }

  // Pass 1: level 0 (counts for top-k; masses for top-p unless top-k's bins alone can be listed);
  // the tail bin in registers.
  auto level0_pass = [&](bool counts, bool masses) {
    uint32_t tail_n = 0;
    uint64_t tail_q = 0;
    for_each_group(y, V, false, [&](int64_t, const float* ys, int nv) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (e >= nv) break;
        const float d = __fsub_rn(ys[e], lse);
        const int b = level0_bin(d);
        const uint64_t q = masses ? mass_q32(d) : 0;
        if (b == kTail) {
          tail_n += 1;
          tail_q += q;
        } else {
          if (counts) atomicAdd(&sm.cnt[b], 1u);
          if (q != 0) add_mass(&sm.lo[b], &sm.hi[b], q);
        }
      }
    });
    if (counts && tail_n != 0) atomicAdd(&sm.cnt[kTail], tail_n);
    if (tail_q != 0) add_mass(&sm.lo[kTail], &sm.hi[kTail], tail_q);
    __syncthreads();
  };
  // The list's window: its smallest and largest key, its count and mass.
  auto finish_list = [&](int n, uint64_t below_c, uint64_t below_m) {
    uint64_t lo = ~uint64_t(0), hi = 0, tm = 0;
    for (int i = tid; i < n; i += kChooseThreads) {
      lo = min_u64(lo, sm.u.list.key[i]);
      hi = max_u64(hi, sm.u.list.key[i]);
      tm += sm.u.list.q[i];
    }
    lo = block_all(lo, min_u64, sm);
    hi = block_all(hi, max_u64, sm);
    return ListRange{true, Window{lo, hi, below_c, below_m, uint64_t(n)},
                     block_all(tm, sum_u64, sm)};
  };

  // The choice once `last` (the last kept key of the canonical order) is known and the segments'
  // sums hold every candidate outside the list: the list's candidates add their masses.
  auto choose_with_list = [&](uint64_t last, int n) {
    Cands cands = every;
    cands.last = last;
    const int S = seg_groups(V, kChooseWarps);
    for (int i = tid; i < n; i += kChooseThreads) {
      const uint64_t key = sm.u.list.key[i];
      const int64_t v = int64_t(key & kVocabMask);
      const uint64_t q = cands.mass(y[v], v);
      if (q != 0) atomicAdd(&sm.seg_mass[int(v >> 2) / S], (unsigned long long)q);
    }
    return choose_by_mass(sm, y, V, cands, u, kChooseWarps);
  };
  const uint64_t k = uint64_t(info.top_k);
  auto thr_of = [&](uint64_t Q) { return topp_threshold(info.top_p, Q); };

  // Bounds first: a list found without level 0 over the row's entries. When it overflows (ties,
  // a bin holding much of the row) or does not hold the boundary, the exact path below runs. Each
  // list is a run of the canonical order whose count and mass before it are exact (nothing before
  // it for top-k; the sure bins' summed masses for top-p), and `covers` checks the boundary's
  // target against them, so a bound that was too tight costs the exact path's time, never bits.
  // top-k (k <= the tile count): the maxima of k tiles are k entries in the bins up to the k-th
  // largest tile maximum's bin b_k, so every top-k entry lies there too: level 0 of the tile
  // maxima gives b_k, and one pass of compares copies the bins <= b_k to the list.
  if (hk && k <= uint64_t(p.n_tiles)) {
    for (int64_t i = tid; i < p.n_tiles; i += kChooseThreads)
      atomicAdd(&sm.cnt[level0_bin(__fsub_rn(st[3 * i], lse))], 1u);
    __syncthreads();
    scan_hist(h0, kBuckets, sm);
    const int b_k = first_reaching(h0, kBuckets, k, false, sm);
    if (b_k < kTail) {
      Cands none = every;
      none.y_lo = bin_cut(0, lse);  // NaN: nothing is summed, every entry of the bins <= b_k listed
      mass_pass(true, none, true, bin_cut(b_k + 1, lse));
      __syncthreads();
      const int n = int(sm.list_n);
      const ListRange list =
          n <= kListCap ? finish_list(n, 0, 0) : ListRange{false, Window{0, 0, 0, 0, 0}, 0};
      if (list.covers(k, false)) {
        const Found f = list_locate(sm, n, list.w, k, false);
        uint64_t last = f.key;
        if (hp) {
          const uint64_t thr = thr_of(f.mass);
          last = thr == 0 ? sample_key(ym, int64_t(va)) : list_locate(sm, n, list.w, thr, true).key;
        }
        write_choice(p, t, y, lse, choose_with_list(last, n));
        return;
      }
    }
  }
  // top-p alone: level 0's counts bracket the boundary's bins (topp_bracket); one pass then takes
  // every entry's mass once: Q, the sums of the bins before the bracket per segment, the bracket's
  // entries to the list.
  if (!hk && info.top_p <= kBracketTopPMax) {
    level0_pass(true, false);
    const int2 br = topp_bracket(h0, info.top_p, sm);
    scan_hist(h0, kBuckets, sm);
    const uint64_t below_c = h0.count(br.x - 1);
    if (h0.count(br.y) - below_c <= uint64_t(kListCap)) {
      const float sure_lo = bin_cut(br.x, lse), list_lo = bin_cut(br.y + 1, lse);
      uint64_t q_all = 0, q_sure = 0, acc = 0;
      for_each_group(y, V, false, [&](int64_t g, const float* ys, int nv) {
        float d[4];
        bool any = false;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          d[e] = __fsub_rn(ys[e], lse);  // (entries past V: −inf)
          any |= d[e] >= -23.0f;
        }
        if (!any) return;  // (q = 0: such entries need no place in the list either)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pv = sample_expf_normal(fmaxf(d[e], -23.0f));
          const uint64_t q = d[e] >= -23.0f ? sample_q32_unit(pv) : 0;  // sample_mass_q32
          q_all += q;
          if (ys[e] >= sure_lo) {
            q_sure += q;
            acc += min_p && !(pv >= min_p_thr) ? 0 : q;  // Cands::mass
          } else if (e < nv && ys[e] >= list_lo) {
            const uint32_t i = atomicAdd(&sm.list_n, 1u);
            if (i < uint32_t(kListCap)) {
              sm.u.list.key[i] = sample_key(ys[e], 4 * g + e);
              sm.u.list.q[i] = q;
            }
          }
        }
      });
      acc = warp_sum(acc);
      if ((tid & 31) == 0) sm.seg_mass[tid >> 5] = acc;
      const uint64_t Q = block_all(q_all, sum_u64, sm);
      const uint64_t sure = block_all(q_sure, sum_u64, sm);
      const int n = int(sm.list_n);
      const ListRange list = n <= kListCap ? finish_list(n, below_c, sure)
                                           : ListRange{false, Window{0, 0, 0, 0, 0}, 0};
      const uint64_t thr = thr_of(Q);
      if (list.covers(thr, true)) {
        write_choice(p, t, y, lse, choose_with_list(list_locate(sm, n, list.w, thr, true).key, n));
        return;
      }
    }
  }

  // The exact path: level 0 over the row's entries (pass 1), then the boundary bins' entries to
  // the list (pass 2); a bin too large for the list is narrowed over the row.
  __syncthreads();  // every thread is past the bounds' reads of h0 and the list
  h0.clear(kBuckets);
  if (tid == 0) sm.list_n = 0;
  __syncthreads();
  level0_pass(hk, hp && !hk);
  scan_hist(h0, kBuckets, sm);

  // The bins that can hold the boundaries: top-k's b_k; top-p's bin for thr = ceil(top_p·Q)
  // (after top-k, Q lies between the mass before b_k and the mass up to b_k; thr is monotone).
  // With top-k, when the bins up to b_k fit the list, they are the list (b_lo = 0): top-p's
  // boundary is then found in the list, and the row's masses are never needed.
  auto mass_bin = [&](uint64_t thr) {
    return first_reaching(h0, kBuckets, thr > 1 ? thr : 1, true, sm);
  };
  int b_lo, b_hi;
  if (hk) {
    b_hi = first_reaching(h0, kBuckets, k, false, sm);
    if (h0.count(b_hi) <= uint64_t(kListCap)) {
      b_lo = 0;
    } else if (hp) {
      // Level 0 again, with the masses. NOTE: the barrier first: a thread that cleared h0 before
      // another had read h0.count(b_hi) sent that one down the other branch (racecheck found it:
      // mismatched barriers from then on).
      __syncthreads();
      h0.clear(kBuckets);
      __syncthreads();
      level0_pass(true, true);
      scan_hist(h0, kBuckets, sm);
      b_lo = min(b_hi, mass_bin(thr_of(h0.mass(b_hi - 1))));
    } else {
      b_lo = b_hi;
    }
  } else {
    b_lo = b_hi = mass_bin(thr_of(h0.mass(kTail)));
  }

  // Pass 2 (descending: a segment's end is its warp's most recently read): bins < b_lo are
  // candidates, [b_lo, b_hi] go to the list. A bin is a range of y (level0_bin is non-increasing
  // in y). NaN cut (b_lo = 0): no entry is surely a candidate.
  Cands sure = every;
  sure.y_lo = bin_cut(b_lo, lse);
  mass_pass(true, sure, true, bin_cut(b_hi + 1, lse));
  __syncthreads();

  const int n2 = int(sm.list_n);
  ListRange list = n2 <= kListCap ? finish_list(n2, h0.count(b_lo - 1), h0.mass(b_lo - 1))
                                  : ListRange{false, Window{0, 0, 0, 0, 0}, 0};
  bool fast = list.valid;

  // The list of the level-0 bin where target is reached, for a bin of more than kListCap
  // entries narrowed first by 12-bit digits of the key (one pass over the row each).
  auto build_list = [&](uint64_t target, bool by_mass) {
    const int b = first_reaching(h0, kBuckets, target, by_mass, sm);
    uint64_t lo = ~uint64_t(0), hi = 0, m = 0;
    for_each_group(y, V, false, [&](int64_t g, const float* ys, int nv) {
      for (int e = 0; e < nv; ++e) {
        if (level0_bin(__fsub_rn(ys[e], lse)) != b) continue;
        const uint64_t key = sample_key(ys[e], 4 * g + e);
        lo = min_u64(lo, key);
        hi = max_u64(hi, key);
        m += 1;
      }
    });
    lo = block_all(lo, min_u64, sm);
    hi = block_all(hi, max_u64, sm);
    m = block_all(m, sum_u64, sm);
    Window w{lo, hi, h0.count(b - 1), h0.mass(b - 1), m};  // bin b = the keys in [lo, hi]
    const Hist hd{sm.u.digit.cnt, sm.u.digit.lo, sm.u.digit.hi};
    while (w.m > uint64_t(kListCap)) {
      const int shift = w.digit_shift(kBucketBits);
      hd.clear(kBuckets);
      __syncthreads();
      for_each_group(y, V, false, [&](int64_t g, const float* ys, int nv) {
        for (int e = 0; e < nv; ++e) {
          const uint64_t key = sample_key(ys[e], 4 * g + e);
          if (w.holds(key))
            hd.add(int((key - w.lo) >> shift), hp ? mass_q32(__fsub_rn(ys[e], lse)) : 0);
        }
      });
      __syncthreads();
      w.narrow(hd, kBuckets, shift, target, by_mass, sm);
      __syncthreads();  // every thread has read hd
    }
    if (tid == 0) sm.list_n = 0;
    __syncthreads();
    for_each_group(y, V, false, [&](int64_t g, const float* ys, int nv) {
      for (int e = 0; e < nv; ++e) {
        const uint64_t key = sample_key(ys[e], 4 * g + e);
        if (!w.holds(key)) continue;
        const uint32_t i = atomicAdd(&sm.list_n, 1u);
        sm.u.list.key[i] = key;
        sm.u.list.q[i] = hp ? mass_q32(__fsub_rn(ys[e], lse)) : 0;
      }
    });
    __syncthreads();
    return finish_list(int(w.m), w.below_c, w.below_m);
  };
  auto locate = [&](uint64_t target, bool by_mass) {
    if (!list.covers(target, by_mass)) {
      list = build_list(target, by_mass);
      fast = false;
    }
    return list_locate(sm, int(list.w.m), list.w, target, by_mass);
  };

  // The last kept key of the canonical order (§S.5: top-k, then top-p over the top-k set).
  uint64_t last = 0;
  uint64_t Q = h0.mass(kTail);
  if (hk) {
    const Found f = locate(k, false);
    last = f.key;
    Q = f.mass;
  }
  if (hp) {
    const uint64_t thr = thr_of(Q);
    if (thr == 0) {  // the first entry alone
      last = sample_key(ym, int64_t(va));
      fast = false;
    } else {
      last = locate(thr, true).key;
    }
  }

  if (fast) {  // bins < b_lo were summed in pass 2
    write_choice(p, t, y, lse, choose_with_list(last, int(list.w.m)));
    return;
  }
  // Pass 2's sums may not be this row's candidates': sum every candidate again.
  Cands cands = every;
  cands.last = last;
  const float y_last = from_ordered(~uint32_t(last >> kVocabBits));  // key <= last => y >= y_last
  cands.y_lo = fmaxf(y_last, kFiniteLow);
  __syncthreads();  // every thread is past the list's reads
  mass_pass(false, cands, false, kFiniteLow);
  write_choice(p, t, y, lse, choose_by_mass(sm, y, V, cands, u, kChooseWarps));
}

struct SampleScatterParams {
  int64_t T;
  const int64_t* id;
  const float* logp;
  const float* lse;
  const float* entropy;
  void* token_ids;
  int ids64;
  float* o_logp;
  float* o_lse;
  float* o_entropy;
  int64_t s_ids, s_logp, s_lse, s_entropy;
};

static __global__ void sample_scatter_kernel(const SampleScatterParams p) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < p.T;
       t += int64_t(gridDim.x) * blockDim.x) {
    if (p.ids64) {
      static_cast<int64_t*>(p.token_ids)[t * p.s_ids] = p.id[t];
    } else {
      static_cast<int32_t*>(p.token_ids)[t * p.s_ids] = int32_t(p.id[t]);
    }
    p.o_logp[t * p.s_logp] = p.logp[t];
    p.o_lse[t * p.s_lse] = p.lse[t];
    p.o_entropy[t * p.s_entropy] = p.entropy[t];
  }
}

}  // namespace lockstep::cuda::detail
