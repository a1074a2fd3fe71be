// Baseline attention kernels (ordinary, not batch-invariant):
//   prefill_kernel — packed varlen causal prefill, flash-attention 2 style: a CTA of 4 warps owns
//     64 query rows (16 per warp) of one head and one slice of up to DV output columns; keys in
//     64-key blocks from the first row's sequence start, S = Q·Kᵀ and O += P·V by mma.sync
//     m16n8k16 (bf16 in, fp32 accumulate), online softmax in base 2 (exp2f), P rounded to bf16.
//     Rows of one tile may belong to different sequences: each row masks keys outside
//     [its sequence start, itself].
//   paged_kernel — flash-decoding over a paged cache (SIMT fp32): one CTA per (row, kv head, up to
//     4 query heads of its group, split), one warp per query head; 64-key blocks staged in shared
//     memory through the block table (and the prefix table below shared_len for cascade).
//   merge_kernel — merges the per-split (m, l, acc) states of a row in split order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "baseline/cuda/common.cuh"

namespace lockstep::cuda::baseline::kernels {

constexpr int kPrefillRows = 64;  // query rows per CTA (4 warps x 16)
constexpr int kPrefillKeys = 64;  // keys per step
constexpr int kPrefillThreads = 128;
constexpr int kSmemPad = 8;  // bf16 elements of padding per shared row (ldmatrix conflict-free)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 8 bf16 of row `src` (elements [c, c + 8)) into shared `dst`; zeros when !valid.
__device__ __forceinline__ void copy8(uint16_t* dst, const uint16_t* src, bool valid, bool vec) {
  if (!valid) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
  if (vec) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = src[i];
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Like copy8, asynchronously (cp.async) when the source is 16-byte aligned.
__device__ __forceinline__ void copy8_async(uint16_t* dst, const uint16_t* src, bool valid,
                                            bool vec) {
  if (valid && vec) {
    cp_async16(dst, src);
  } else {
    copy8(dst, src, valid, vec);
  }
}

// Largest b in [0, B) with cu[b] <= t (the sequence of packed token t < cu[B]).
__device__ __forceinline__ int64_t seq_start(const int32_t* cu, int64_t cs, int64_t B, int64_t t) {
  int64_t lo = 0, hi = B;  // invariant: cu[lo] <= t (cu[0] == 0), answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu[mid * cs] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int64_t s = cu[lo * cs];
  return s < 0 ? 0 : (s > t ? t : s);  // trusted device data, clamped anyway
}

// Shared-memory stages of K/V: two (the next block's cp.async overlaps this block's math) up to
// head_dim 256, one above (head_dim 512 would not fit twice).
inline int prefill_stages(int64_t D) { return D <= 256 ? 2 : 1; }

template <int DV>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(PrefillArgs a, bool vec, int nst) {
  extern __shared__ __align__(16) uint16_t smem[];
  __shared__ int64_t row_start[kPrefillRows];
  const int D = int(a.D), ldq = D + kSmemPad, ldv = DV + kSmemPad;
  uint16_t* Qs = smem;                             // [64][ldq]
  uint16_t* Ks0 = Qs + kPrefillRows * ldq;         // [nst][64][ldq]
  uint16_t* Vs0 = Ks0 + nst * kPrefillKeys * ldq;  // [nst][64][ldv]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t tile = int64_t(gridDim.x) - 1 - blockIdx.x;  // longest tiles first
  const int64_t h = blockIdx.y, hk = h / (a.Hq / a.Hkv);
  const int d0 = int(blockIdx.z) * DV;
  const int64_t row0 = tile * kPrefillRows;
  const uint16_t* q = static_cast<const uint16_t*>(a.q.p);
  const uint16_t* k = static_cast<const uint16_t*>(a.k.p);
  const uint16_t* v = static_cast<const uint16_t*>(a.v.p);

  if (tid < kPrefillRows) {
    const int64_t t = row0 + tid;
    row_start[tid] = t < a.T ? seq_start(a.cu_seqlens, a.cu_s, a.B, t) : a.T;
  }
  const int cpr = D / 8;  // 8-element chunks per row
  for (int c = tid; c < kPrefillRows * cpr; c += kPrefillThreads) {
    const int r = c / cpr, cc = (c % cpr) * 8;
    const int64_t t = row0 + r;
    copy8(Qs + r * ldq + cc, q + t * a.q.s0 + h * a.q.s1 + cc, t < a.T, vec);
  }
  __syncthreads();

  const int64_t last_row = (row0 + kPrefillRows <= a.T ? row0 + kPrefillRows : a.T) - 1;
  const int64_t kv_lo = row_start[0], kv_hi = last_row + 1;
  const int64_t w_row0 = row0 + warp * 16;
  const int64_t w_last = w_row0 + 15 < last_row ? w_row0 + 15 : last_row;
  const int64_t w_start = w_row0 < a.T ? row_start[warp * 16] : a.T;
  // This thread's two accumulator rows (fragment rows lane/4 and lane/4 + 8).
  const int ra = warp * 16 + (lane >> 2), rb = ra + 8;
  const int64_t ta = row0 + ra, tb = row0 + rb;
  const int64_t sa = row_start[ra], sb = row_start[rb];

  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
  float acc[DV / 8][4];
#pragma unroll
  for (int i = 0; i < DV / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  // K/V block at key kb into stage st.
  auto load_kv = [&](int64_t kb, int st) {
    uint16_t* Ks = Ks0 + st * kPrefillKeys * ldq;
    uint16_t* Vs = Vs0 + st * kPrefillKeys * ldv;
    for (int c = tid; c < kPrefillKeys * cpr; c += kPrefillThreads) {
      const int r = c / cpr, cc = (c % cpr) * 8;
      const int64_t j = kb + r;
      copy8_async(Ks + r * ldq + cc, k + j * a.k.s0 + hk * a.k.s1 + cc, j < kv_hi, vec);
    }
    constexpr int vcpr = DV / 8;
    for (int c = tid; c < kPrefillKeys * vcpr; c += kPrefillThreads) {
      const int r = c / vcpr, cc = (c % vcpr) * 8;
      const int64_t j = kb + r;
      copy8_async(Vs + r * ldv + cc, v + j * a.v.s0 + hk * a.v.s1 + d0 + cc,
                  j < kv_hi && d0 + cc < D, vec);
    }
  };
  load_kv(kv_lo, 0);
  cp_async_commit();
  int it = 0;
  for (int64_t kb = kv_lo; kb < kv_hi; kb += kPrefillKeys, ++it) {
    const int st = nst == 2 ? (it & 1) : 0;
    if (nst == 2) {
      if (kb + kPrefillKeys < kv_hi) load_kv(kb + kPrefillKeys, st ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage st is complete for every thread
    const uint16_t* Ks = Ks0 + st * kPrefillKeys * ldq;
    const uint16_t* Vs = Vs0 + st * kPrefillKeys * ldv;
    // Whole block above the warp's last row, or below its first row's sequence: nothing to do.
    if (!(w_row0 >= a.T || kb > w_last || kb + kPrefillKeys <= w_start)) {
      float s[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      for (int kk = 0; kk < D; kk += 16) {
        uint32_t af[4];
        {
          const int mi = lane >> 3;
          ldsm_x4(af, Qs + (warp * 16 + (mi & 1) * 8 + (lane & 7)) * ldq + kk + (mi >> 1) * 8);
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bfr[4];
          const int mi = lane >> 3;
          ldsm_x4(bfr, Ks + (np * 16 + (mi >> 1) * 8 + (lane & 7)) * ldq + kk + (mi & 1) * 8);
          mma_bf16(s[2 * np], af, bfr[0], bfr[1]);
          mma_bf16(s[2 * np + 1], af, bfr[2], bfr[3]);
        }
      }
      // Scale, mask, online softmax (base 2).
      float bmax[2] = {neg_inf(), neg_inf()};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t j = kb + nt * 8 + 2 * (lane & 3) + (e & 1);
          const bool hi = e >= 2;
          const int64_t t = hi ? tb : ta, st = hi ? sb : sa;
          const bool valid = t < a.T && j >= st && j <= t;
          s[nt][e] = valid ? s[nt][e] * a.scale_log2 : neg_inf();
          bmax[hi] = fmaxf(bmax[hi], s[nt][e]);
        }
      }
      float corr[2], muse[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        bmax[i] = fmaxf(bmax[i], __shfl_xor_sync(0xffffffffu, bmax[i], 1));
        bmax[i] = fmaxf(bmax[i], __shfl_xor_sync(0xffffffffu, bmax[i], 2));
        const float mnew = fmaxf(m[i], bmax[i]);
        muse[i] = mnew == neg_inf() ? 0.0f : mnew;
        corr[i] = exp2f(m[i] - muse[i]);
        m[i] = mnew;
        l[i] *= corr[i];
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1;
          s[nt][e] = exp2f(s[nt][e] - muse[i]);
          l[i] += s[nt][e];
        }
      }
#pragma unroll
      for (int nt = 0; nt < DV / 8; ++nt) {
        acc[nt][0] *= corr[0];
        acc[nt][1] *= corr[0];
        acc[nt][2] *= corr[1];
        acc[nt][3] *= corr[1];
      }
      // O += P·V: P's accumulator layout is the A-fragment layout of the next MMA.
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t pf[4];
        pf[0] = pack_bf2(s[2 * ks][0], s[2 * ks][1]);
        pf[1] = pack_bf2(s[2 * ks][2], s[2 * ks][3]);
        pf[2] = pack_bf2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
        pf[3] = pack_bf2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
        for (int np = 0; np < DV / 16; ++np) {
          uint32_t bfr[4];
          const int mi = lane >> 3;
          ldsm_x4_trans(bfr,
                        Vs + (ks * 16 + (mi & 1) * 8 + (lane & 7)) * ldv + np * 16 + (mi >> 1) * 8);
          mma_bf16(acc[2 * np], pf, bfr[0], bfr[1]);
          mma_bf16(acc[2 * np + 1], pf, bfr[2], bfr[3]);
        }
      }
    }                 // not skipped
    __syncthreads();  // stage st is no longer read
    if (nst == 1 && kb + kPrefillKeys < kv_hi) {
      load_kv(kb + kPrefillKeys, 0);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();

  // Finish: row sums over the quad, normalize, store.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  uint16_t* out = static_cast<uint16_t*>(a.out.p);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t t = i ? tb : ta;
    if (t >= a.T) continue;
    const float inv = 1.0f / l[i];
    uint16_t* o = out + t * a.out.s0 + h * a.out.s1;
#pragma unroll
    for (int nt = 0; nt < DV / 8; ++nt) {
      const int d = d0 + nt * 8 + 2 * (lane & 3);
      if (d < D) {
        o[d] = to_bf(acc[nt][2 * i] * inv);
        o[d + 1] = to_bf(acc[nt][2 * i + 1] * inv);
      }
    }
    if (a.lse.p != nullptr && blockIdx.z == 0 && (lane & 3) == 0)
      a.lse.p[t * a.lse.s0 + h * a.lse.s1] = (m[i] + log2f(l[i])) * 0.69314718055994531f;
  }
}

// ---------------------------------------------------------------------------------------------
// Paged flash-decoding.

constexpr int kPagedHeadsPerCta = 4;
constexpr int kPagedMaxD = 512;
constexpr int kPagedPairs =
    kPagedMaxD / 64;  // bf16 pairs of the output per lane (d = 64i + 2·lane)

struct PagedWs {
  float* m;    // [N, Hq, splits]
  float* l;    // [N, Hq, splits]
  float* acc;  // [N, Hq, splits, D]
};

__global__ void paged_kernel(PagedArgs a, int hpc, int hgroups, bool vec16, PagedWs ws) {
  extern __shared__ __align__(16) unsigned char psmem[];
  const int D = int(a.D), BK = kPagedBlock, ldk = D + 2;       // +2: conflict-free row reads
  float* qs = reinterpret_cast<float*>(psmem);                 // [hpc][D]
  float* ps = qs + hpc * D;                                    // [hpc][BK]
  int32_t* kpage = reinterpret_cast<int32_t*>(ps + hpc * BK);  // [BK]
  uint16_t* Vs = reinterpret_cast<uint16_t*>(kpage + BK);      // [BK][D] (16-byte aligned)
  uint16_t* Ks = Vs + BK * D;                                  // [BK][ldk]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nthreads = blockDim.x;
  const int64_t r = blockIdx.x;
  const int64_t hk = blockIdx.y / hgroups, hg = blockIdx.y % hgroups;
  const int64_t G = a.Hq / a.Hkv;
  const int64_t h0 = hk * G + hg * hpc;
  const int nh = int(G - hg * hpc < hpc ? G - hg * hpc : hpc);
  const int sp = blockIdx.z;

  // The row's sequence and key range (device metadata clamped: never read outside the tables).
  const int64_t s = a.q_seq[r * a.qseq_s], pos = a.q_pos[r * a.qpos_s];
  const bool ok = s >= 0 && s < a.S && pos >= 0;
  int64_t ctx = ok ? pos + 1 : 0;
  if (ctx > a.MP * a.P) ctx = a.MP * a.P;
  const int32_t* own = a.block_table + (ok ? s : 0) * a.bt_s0;
  const int32_t* shared = nullptr;
  int64_t shared_len = 0;
  if (ok && a.prefix_table != nullptr) {
    const int64_t g = a.seq_group[s * a.sg_s];
    if (g >= 0 && g < a.GR) {
      shared = a.prefix_table + g * a.pt_s0;
      shared_len = a.shared_len[g * a.sl_s];
      const int64_t cap = a.MPs * a.P;
      shared_len = shared_len < 0 ? 0 : (shared_len > cap ? cap : shared_len);
    }
  }
  const int64_t nblk = (ctx + BK - 1) / BK;
  const int64_t per = (nblk + a.splits - 1) / a.splits;
  const int64_t b_lo = sp * per, b_hi = b_lo + per < nblk ? b_lo + per : nblk;
  const int64_t j_lo = b_lo * BK, j_hi = b_hi * BK < ctx ? b_hi * BK : ctx;

  const uint16_t* q = static_cast<const uint16_t*>(a.q.p);
  for (int i = tid; i < nh * D; i += nthreads)
    qs[i] = bf(q[r * a.q.s0 + (h0 + i / D) * a.q.s1 + i % D]);

  float m = neg_inf(), l = 0.0f;
  float acc[2 * kPagedPairs];
#pragma unroll
  for (int i = 0; i < 2 * kPagedPairs; ++i) acc[i] = 0.0f;
  const uint16_t* kc = static_cast<const uint16_t*>(a.k_cache.p);
  const uint16_t* vc = static_cast<const uint16_t*>(a.v_cache.p);
  const int half = D / 2;

  for (int64_t jb = j_lo; jb < j_hi; jb += BK) {
    __syncthreads();
    for (int i = tid; i < BK; i += nthreads) {
      const int64_t j = jb + i;
      int64_t page = -1;
      if (j < j_hi) page = j < shared_len ? shared[j / a.P] : own[j / a.P];
      kpage[i] = (page >= 0 && page < a.NP) ? int32_t(page) : -1;
    }
    __syncthreads();
    // K/V rows of the block, 8 elements per step (one 16-byte load each when aligned).
    const int cpr = D / 8;
#pragma unroll 4
    for (int i = tid; i < BK * cpr; i += nthreads) {
      const int kslot = i / cpr, c = (i % cpr) * 8;
      const int64_t page = kpage[kslot];
      uint4 kw = make_uint4(0u, 0u, 0u, 0u), vw = kw;
      if (page >= 0) {
        const int64_t off = (jb + kslot) % a.P;
        const uint16_t* kp = kc + page * a.k_cache.s0 + off * a.k_cache.s1 + hk * a.k_cache.s2 + c;
        const uint16_t* vp = vc + page * a.v_cache.s0 + off * a.v_cache.s1 + hk * a.v_cache.s2 + c;
        if (vec16) {
          kw = *reinterpret_cast<const uint4*>(kp);
          vw = *reinterpret_cast<const uint4*>(vp);
        } else {
          uint32_t kk[4], vv[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            kk[e] = uint32_t(kp[2 * e]) | (uint32_t(kp[2 * e + 1]) << 16);
            vv[e] = uint32_t(vp[2 * e]) | (uint32_t(vp[2 * e + 1]) << 16);
          }
          kw = make_uint4(kk[0], kk[1], kk[2], kk[3]);
          vw = make_uint4(vv[0], vv[1], vv[2], vv[3]);
        }
      }
      // Ks rows are padded by 2 elements (4-byte aligned only): four word stores.
      uint32_t* kd = reinterpret_cast<uint32_t*>(Ks + kslot * ldk + c);
      kd[0] = kw.x;
      kd[1] = kw.y;
      kd[2] = kw.z;
      kd[3] = kw.w;
      *reinterpret_cast<uint4*>(Vs + kslot * D + c) = vw;
    }
    __syncthreads();
    if (warp >= nh) continue;
    const float* qw = qs + warp * D;
    const int64_t nvalid = j_hi - jb < BK ? j_hi - jb : BK;
    float sc[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int kslot = lane + 32 * u;
      const uint16_t* kr = Ks + kslot * ldk;
      float dot = 0.0f;
      for (int dw = 0; dw < half; ++dw) {
        const uint32_t kw = *reinterpret_cast<const uint32_t*>(kr + 2 * dw);
        dot = fmaf(qw[2 * dw], bf(uint16_t(kw & 0xffffu)), dot);
        dot = fmaf(qw[2 * dw + 1], bf(uint16_t(kw >> 16)), dot);
      }
      sc[u] = (kslot < nvalid && kpage[kslot] >= 0) ? dot * a.scale_log2 : neg_inf();
    }
    const float mnew = fmaxf(m, warp_max(fmaxf(sc[0], sc[1])));
    const float muse = mnew == neg_inf() ? 0.0f : mnew;
    const float corr = exp2f(m - muse);
    const float p0 = exp2f(sc[0] - muse), p1 = exp2f(sc[1] - muse);
    ps[warp * BK + lane] = p0;
    ps[warp * BK + lane + 32] = p1;
    l = l * corr + warp_sum(p0 + p1);
    m = mnew;
#pragma unroll
    for (int i = 0; i < 2 * kPagedPairs; ++i) acc[i] *= corr;
    __syncwarp();
    for (int kslot = 0; kslot < nvalid; ++kslot) {
      const float p = ps[warp * BK + kslot];
      const uint16_t* vr = Vs + kslot * D;
#pragma unroll
      for (int i = 0; i < kPagedPairs; ++i) {
        const int d = 64 * i + 2 * lane;
        if (d < D) {
          const uint32_t vw = *reinterpret_cast<const uint32_t*>(vr + d);
          acc[2 * i] = fmaf(p, bf(uint16_t(vw & 0xffffu)), acc[2 * i]);
          acc[2 * i + 1] = fmaf(p, bf(uint16_t(vw >> 16)), acc[2 * i + 1]);
        }
      }
    }
  }
  if (warp >= nh) return;
  const int64_t h = h0 + warp;
  if (a.splits == 1) {
    const float inv = 1.0f / l;
    uint16_t* o = static_cast<uint16_t*>(a.out.p) + r * a.out.s0 + h * a.out.s1;
#pragma unroll
    for (int i = 0; i < kPagedPairs; ++i) {
      const int d = 64 * i + 2 * lane;
      if (d < D) {
        o[d] = to_bf(acc[2 * i] * inv);
        o[d + 1] = to_bf(acc[2 * i + 1] * inv);
      }
    }
    if (a.lse.p != nullptr && lane == 0)
      a.lse.p[r * a.lse.s0 + h * a.lse.s1] = (m + log2f(l)) * 0.69314718055994531f;
    return;
  }
  const int64_t idx = (r * a.Hq + h) * a.splits + sp;
  if (lane == 0) {
    ws.m[idx] = m;
    ws.l[idx] = l;
  }
  float* wa = ws.acc + idx * D;
#pragma unroll
  for (int i = 0; i < kPagedPairs; ++i) {
    const int d = 64 * i + 2 * lane;
    if (d < D) {
      wa[d] = acc[2 * i];
      wa[d + 1] = acc[2 * i + 1];
    }
  }
}

// One block per (row, head): the splits' states merged in split order.
__global__ void merge_kernel(PagedArgs a, PagedWs ws) {
  const int64_t rh = blockIdx.x, r = rh / a.Hq, h = rh % a.Hq;
  const int S = a.splits, D = int(a.D);
  const float* m = ws.m + rh * S;
  const float* l = ws.l + rh * S;
  float M = neg_inf();
  for (int i = 0; i < S; ++i) M = fmaxf(M, m[i]);
  const float muse = M == neg_inf() ? 0.0f : M;
  float L = 0.0f;
  for (int i = 0; i < S; ++i)
    if (l[i] > 0.0f) L += l[i] * exp2f(m[i] - muse);
  const float inv = 1.0f / L;
  uint16_t* o = static_cast<uint16_t*>(a.out.p) + r * a.out.s0 + h * a.out.s1;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < S; ++i)
      if (l[i] > 0.0f) acc += ws.acc[(rh * S + i) * D + d] * exp2f(m[i] - muse);
    o[d] = to_bf(acc * inv);
  }
  if (a.lse.p != nullptr && threadIdx.x == 0)
    a.lse.p[r * a.lse.s0 + h * a.lse.s1] = (M + log2f(L)) * 0.69314718055994531f;
}

}  // namespace lockstep::cuda::baseline::kernels
