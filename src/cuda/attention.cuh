// CUDA attention kernels (docs/contract.md §A): every (query row, head) is computed in the
// canonical order of A.4 — 64-key blocks by absolute position, MMA-chain scores over D from +0,
// x = s ⊗ σ, the max rule, p = ls_ex2_sfu(x ⊖ m_use), P = bf16(p), the halving-tree row sum of the
// fp32 p, l = α ⊗ l ⊕ rowsum, per d the PV chain of 4 k-blocks from c = α ⊗ acc, chunk states
// (kv_chunk keys) merged left to right, out = bf16(acc ⊗ (1 ⊘ l)), lse = (m ⊕ log2 l) ⊗ ln2_f.
//
// Layout ("keys as rows"): a score tile is S^T = K·Q^T with K as the MMA A operand (16 keys) and
// Q^T as B (8 query columns); the PV tile is O^T = V^T·P^T (A = V^T via ldmatrix.trans, B = P^T
// via movmatrix). By §M an MMA k-block is symmetric in a <-> b, so each score and each output is
// exactly the contract's chain; the layout only lets decode (G query heads of one row) fill 8
// MMA columns instead of 16 rows. A "column" is one (query row, head) pair.
//
// Two kernels, the same arithmetic:
//   attn_cs_kernel  (column split; prefill, chunked prefill): 4 warps x 16 columns; each warp owns
//                   its columns over all 64 keys and all of D.
//   attn_ks_kernel  (key split; decode, any head_dim): 4 warps share <= 8 columns; warp w computes
//                   the scores of keys 16w..16w+15 and the PV of d-tiles w, w+4, ...; the block
//                   max and the p values go through shared memory.
// Masking: a column's keys past its position get p = +0 and (A.6) V' = +0. Keys past the largest
// position of the CTA are zero-filled on load; when a V tile shared by columns with different
// limits holds a non-finite value, the PV is recomputed per distinct limit with the masked keys'
// V zeroed in registers (rare: only NaN/inf in the cache). A column whose position lies before a
// block (rows of one tile in different blocks) skips it exactly: α = 1, p = +0, V' = +0, which
// returns acc unchanged (a k-block with only c as a term is exact, §M).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/math.h"
#include "cuda/attention_common.cuh"  // ldmatrix, cp.async, bf16 pairs
#include "cuda/mma_sync.cuh"          // mma_16816, cp.async group steps
#include "lockstep/dtype.h"

namespace lockstep::cuda::attn_detail {

using attn_common::canon;
using attn_common::cp_async16;
using attn_common::ldsm_x4;
using attn_common::ldsm_x4_t;
using attn_common::load8_scalar;
using attn_common::pack_bf16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::mma_16816;

constexpr int kBlk = 64;                // keys per block (contract A.2)
constexpr float kLn2f = 0x1.62e43p-1f;  // ln 2 rounded to fp32
constexpr int kThreads = 128;           // both kernels: 4 warps
constexpr int kCsCols = 64;             // columns of a cs CTA (4 warps x 2 n-tiles x 8)
constexpr int kKsCols = 8;              // columns of a ks CTA (one n-tile)
constexpr float kNegInf = -__builtin_huge_valf();

enum Finish : int32_t {
  kFinalize = 0,     // write out / lse
  kStoreChunks = 1,  // write every chunk state of [c_lo, c_hi) (empty past a row's last chunk)
  kStorePrefix = 2,  // write the folded state of chunks [c_lo, c_hi) to the prefix workspace
};

// One CTA's work (x kv head in grid.y, x column block in grid.z): rows [rb, rb + nr) of the row
// lists, all of one KV source, over chunks [c_lo, c_hi) (each row clips c_hi to pos / K + 1).
struct AttnItem {
  const int32_t* own;     // paged: block-table row of the sequence; nullptr: packed k/v
  const int32_t* shared;  // prefix block-table row (positions < shared_len) or nullptr
  int64_t base;           // packed: token index of position 0
  int64_t shared_base;    // packed: token index of position 0 for positions < shared_len (the
                          // prompt of a shared-prompt completion, §B.11)
  int32_t own_pages;      // entries of `own` that may be read (guard)
  int32_t shared_pages;   // entries of `shared`
  int32_t shared_len;     // positions read from the prefix (paged) or the prompt (packed)
  int32_t rb, nr;
  int32_t c_lo, c_hi;
  int32_t pad_;
};

struct AttnParams {
  const uint16_t* q;  // [N, Hq, D]
  int64_t q_s0, q_s1;
  const uint16_t* k;  // packed [T, Hkv, D] or paged [NP, P, Hkv, D]
  const uint16_t* v;
  int64_t k_s0, k_s1, k_sh, v_s0, v_s1, v_sh;  // packed: s0 = token; paged: s0 page, s1 slot
  int64_t NP;
  int32_t P;
  int32_t G, Hq, D, K;  // K = kv_chunk
  float scale;          // σ
  const AttnItem* items;
  const int32_t* row_ids;  // q row of each row-list entry
  const int32_t* row_pos;  // its absolute position
  int32_t finish;
  uint16_t* out;  // [N, Hq, D] bf16
  int64_t o_s0, o_s1;
  float* lse;  // [N, Hq] or nullptr
  int64_t l_s0, l_s1;
  float* st_m;  // chunk states (kStoreChunks), chunk index c - st_c0
  float* st_l;
  float* st_acc;
  int64_t sm0, sm1, sm2, sl0, sl1, sl2, sa0, sa1, sa2;
  int64_t st_c0;
  float* prefix;              // [N, Hq, D + 2] (m, l, acc): kStorePrefix writes, kFinalize reads
  const uint8_t* has_prefix;  // [N] or nullptr: row starts from its prefix state
  int32_t kv_vec;             // k/v 16-byte aligned rows (cp.async)
  int32_t q_vec;              // q 16-byte aligned rows
};

// ------------------------------------------------------------------------------------------------
// Small device helpers.

__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const uint16_t* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}
__device__ __forceinline__ uint32_t movtrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The contract's max: b > a ? b : a, a zero result is +0 (NaN b never wins; the running max is
// never NaN, so the order of a max over a set does not matter).
__device__ __forceinline__ float max_rule(float a, float b) {
  const float m = b > a ? b : a;
  return m == 0.0f ? 0.0f : m;
}
__device__ __forceinline__ bool nonfinite_pair(uint32_t u) {
  return (u & 0x7f80u) == 0x7f80u || (u & 0x7f800000u) == 0x7f800000u;
}
// Zero the bf16 halves of an A fragment (V^T, k = key) whose key index is >= t (slow path).
__device__ __forceinline__ void mask_keys(uint32_t (&a)[4], int kb, int lane, int t) {
  const int k0 = kb * 16 + 2 * (lane & 3);
  const uint32_t m0 = (k0 < t ? 0x0000ffffu : 0u) | (k0 + 1 < t ? 0xffff0000u : 0u);
  const uint32_t m1 = (k0 + 8 < t ? 0x0000ffffu : 0u) | (k0 + 9 < t ? 0xffff0000u : 0u);
  a[0] &= m0;
  a[1] &= m0;
  a[2] &= m1;
  a[3] &= m1;
}

// Element offsets of key j's K and V rows for kv head kvh, or -1 (zero-filled): past `lim`,
// or a page-table entry / page index outside the tables and the cache. Packed k/v: token
// base + j, or shared_base + j below shared_len (a completion reading its prompt's rows).
__device__ __forceinline__ void key_offsets(const AttnParams& p, const AttnItem& it, int kvh,
                                            int64_t j, int64_t lim, int64_t* ko, int64_t* vo) {
  *ko = -1;
  *vo = -1;
  if (j > lim) return;
  if (it.own == nullptr) {
    const int64_t t = (j < it.shared_len ? it.shared_base : it.base) + j;
    *ko = t * p.k_s0 + kvh * p.k_sh;
    *vo = t * p.v_s0 + kvh * p.v_sh;
    return;
  }
  const bool sh = j < it.shared_len;
  const int32_t* tbl = sh ? it.shared : it.own;
  const int64_t np = sh ? it.shared_pages : it.own_pages;
  const int64_t i = j / p.P;
  if (tbl == nullptr || i >= np) return;
  const int64_t page = tbl[i];
  if (page < 0 || page >= p.NP) return;
  const int64_t slot = j - i * p.P;
  *ko = page * p.k_s0 + slot * p.k_s1 + kvh * p.k_sh;
  *vo = page * p.v_s0 + slot * p.v_s1 + kvh * p.v_sh;
}

// Offsets of the 64 keys of block b (threads 0..63).
__device__ __forceinline__ void block_offsets(const AttnParams& p, const AttnItem& it, int kvh,
                                              int64_t b, int64_t lim, int64_t* off, int tid) {
  if (tid < kBlk) {
    int64_t ko, vo;
    key_offsets(p, it, kvh, b * kBlk + tid, lim, &ko, &vo);
    off[tid] = ko;
    off[kBlk + tid] = vo;
  }
}

// Q tile of a CTA's COLS columns (q_s [COLS, lds] bf16): column c -> q[row, head, :] of item
// column col0 + c (zeros past the item's columns).
template <int COLS>
__device__ __forceinline__ void load_q_tile(const AttnParams& p, const AttnItem& it, int kvh,
                                            int col0, int D, uint16_t* q_s, int lds, int tid) {
  for (int qi = tid; qi < COLS * (D / 8); qi += kThreads) {
    const int c = qi / (D / 8), ch = qi % (D / 8);
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    const int cc = col0 + c;
    if (cc < it.nr * p.G) {
      const int ri = cc / p.G, g = cc - ri * p.G;
      const int64_t row = p.row_ids[it.rb + ri];
      const uint16_t* src = p.q + row * p.q_s0 + int64_t(kvh * p.G + g) * p.q_s1 + ch * 8;
      val = p.q_vec ? *reinterpret_cast<const uint4*>(src) : load8_scalar(src);
    }
    *reinterpret_cast<uint4*>(q_s + c * lds + ch * 8) = val;
  }
}

// K and V rows of one block into shared memory (row stride lds): cp.async when aligned, zeros for
// keys without an offset.
template <int DC>  // DC > 0: compile-time head_dim
__device__ __forceinline__ void load_block(const AttnParams& p, int D, uint16_t* ks, int lds,
                                           const int64_t* off, int tid) {
  const int cpr = DC > 0 ? DC / 8 : D / 8;
  const int total = kBlk * cpr;
  uint16_t* vs = ks + kBlk * lds;
  for (int qi = tid; qi < total; qi += kThreads) {
    const int key = qi / cpr, ch = qi - key * cpr;
    uint16_t* kd = ks + key * lds + ch * 8;
    uint16_t* vd = vs + key * lds + ch * 8;
    const int64_t ko = off[key], vo = off[kBlk + key];
    if (ko < 0) {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0u, 0u, 0u, 0u);
    } else if (p.kv_vec) {
      cp_async16(kd, p.k + ko + ch * 8);
      cp_async16(vd, p.v + vo + ch * 8);
    } else {
      *reinterpret_cast<uint4*>(kd) = load8_scalar(p.k + ko + ch * 8);
      *reinterpret_cast<uint4*>(vd) = load8_scalar(p.v + vo + ch * 8);
    }
  }
}

// Any non-finite V among keys [k_lo, k_hi) and d in [d_lo, d_hi) of a shared tile (one warp).
__device__ __forceinline__ bool tile_nonfinite(const uint16_t* vs, int lds, int k_lo, int k_hi,
                                               int d_lo, int d_hi, int lane) {
  const int cpr = (d_hi - d_lo) / 8;
  bool bad = false;
  for (int qi = lane; qi < (k_hi - k_lo) * cpr; qi += 32) {
    const int key = k_lo + qi / cpr, ch = qi % cpr;
    const uint4 w = *reinterpret_cast<const uint4*>(vs + key * lds + d_lo + ch * 8);
    bad |= nonfinite_pair(w.x) | nonfinite_pair(w.y) | nonfinite_pair(w.z) | nonfinite_pair(w.w);
  }
  return __any_sync(0xffffffffu, bad);
}

// Halving tree over the 64 keys of one column, keys-as-rows accumulator layout: v[mt][h] holds
// key 16·mt + 8·h + lane/4. Levels 32, 16, 8 in the thread, then 4, 2, 1 across lanes (xor 16,
// 8, 4). fp32 + is commutative, so every lane of the column ends with the same bits.
__device__ __forceinline__ float tree64_rows(float v00, float v01, float v10, float v11, float v20,
                                             float v21, float v30, float v31) {
  const float a0 = __fadd_rn(v00, v20), a1 = __fadd_rn(v01, v21);  // w = 32
  const float b0 = __fadd_rn(v10, v30), b1 = __fadd_rn(v11, v31);
  const float c0 = __fadd_rn(a0, b0), c1 = __fadd_rn(a1, b1);  // w = 16
  float t = __fadd_rn(c0, c1);                                 // w = 8
  t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 16));       // w = 4
  t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 8));        // w = 2
  t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 4));        // w = 1
  return t;
}

__device__ __forceinline__ float colmax_rows(float m) {
  m = max_rule(m, __shfl_xor_sync(0xffffffffu, m, 4));
  m = max_rule(m, __shfl_xor_sync(0xffffffffu, m, 8));
  m = max_rule(m, __shfl_xor_sync(0xffffffffu, m, 16));
  return m;
}

// The canonical merge of a run state (ma, la) with a chunk state (mb, lb): factors fa, fb for the
// acc update acc = fa ⊗ acc_run ⊕ fb ⊗ acc_chunk; returns the merged m, l.
__device__ __forceinline__ void merge_factors(float ma, float la, float mb, float lb, float* fa,
                                              float* fb, float* m, float* l) {
  const float mm = max_rule(ma, mb);
  const float mu = mm == kNegInf ? 0.0f : mm;
  *fa = ls_ex2_sfu(__fsub_rn(ma, mu));
  *fb = ls_ex2_sfu(__fsub_rn(mb, mu));
  *l = __fadd_rn(__fmul_rn(*fa, la), __fmul_rn(*fb, lb));
  *m = mm;
}

// Per column of a CTA: which q row / head it is and its position (-1: padding column).
struct ColInfo {
  int32_t row, head, pos, cend;
};
__device__ __forceinline__ ColInfo col_info(const AttnParams& p, const AttnItem& it, int kvh,
                                            int cc) {
  ColInfo ci{0, 0, -1, 0};
  if (cc < it.nr * p.G) {
    const int ri = cc / p.G, g = cc - ri * p.G;
    ci.row = p.row_ids[it.rb + ri];
    ci.head = kvh * p.G + g;
    ci.pos = p.row_pos[it.rb + ri];
    const int64_t ce = int64_t(ci.pos) / p.K + 1;
    ci.cend = int32_t(ce < it.c_hi ? ce : it.c_hi);
  }
  return ci;
}

// ------------------------------------------------------------------------------------------------
// Column-split kernel: 64 columns (4 warps x 2 n-tiles), D in {64, 128} (compile time).

template <int D, int NS>
struct CsShape {
  static constexpr int kNdt = D / 16;
  static constexpr int kLds = D + 8;                // bf16; 16 B pad: ldmatrix conflict-free
  static constexpr int kStage = 2 * kBlk * kLds;    // K and V (elements)
  static constexpr int kKvBytes = NS * kStage * 2;  //
  static constexpr int kOffBytes = (NS + 1) * 2 * kBlk * 8;
  static constexpr int kQBytes = kCsCols * kLds * 2;
  static constexpr int kRunBytes = 4 * kNdt * 2 * 4 * 32 * 4;  // warps x acc regs x lanes
  static constexpr int kSmem =
      kKvBytes + kOffBytes + (kQBytes > kRunBytes ? kQBytes : kRunBytes) + 16;
};

template <int D, int NS>
__global__ void __launch_bounds__(kThreads, 2) attn_cs_kernel(const AttnParams p) {
  using S = CsShape<D, NS>;
  constexpr int NDT = S::kNdt, LDS = S::kLds;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem);
  int64_t* off_s = reinterpret_cast<int64_t*>(smem + S::kKvBytes);
  uint8_t* uni = smem + S::kKvBytes + S::kOffBytes;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(uni);
  float* run_s = reinterpret_cast<float*>(uni);
  int* lim_s =
      reinterpret_cast<int*>(uni + (S::kQBytes > S::kRunBytes ? S::kQBytes : S::kRunBytes));

  const AttnItem it = p.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int col0 = blockIdx.z * kCsCols;
  if (col0 >= it.nr * p.G) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) *lim_s = -1;

  load_q_tile<kCsCols>(p, it, kvh, col0, D, q_s, LDS, tid);
  // This thread's columns (n-tile nt, e): warp*16 + nt*8 + 2*(lane&3) + e.
  ColInfo ci[2][2];
  int mypos = -1;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      ci[nt][e] = col_info(p, it, kvh, col0 + warp * 16 + nt * 8 + 2 * (lane & 3) + e);
      mypos = max(mypos, ci[nt][e].pos);
    }
  mypos = __reduce_max_sync(0xffffffffu, mypos);
  __syncthreads();  // lim_s initialized, q_s written
  if (lane == 0) atomicMax(lim_s, mypos);
  uint32_t qf[2][NDT][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int kb = 0; kb < NDT; ++kb)
      ldsm_x2(qf[nt][kb],
              q_s + (warp * 16 + nt * 8 + (lane & 7)) * LDS + kb * 16 + ((lane >> 3) & 1) * 8);
  __syncthreads();  // q_s no longer read (run_s aliases it); lim final
  const int64_t lim = *lim_s;
  const int64_t K = p.K;
  const int64_t c_end = min(int64_t(it.c_hi), lim / K + 1);
  const int64_t jb = int64_t(it.c_lo) * K, je = min(c_end * K, lim + 1);
  const int64_t b_lo = jb / kBlk, b_hi = je > jb ? (je + kBlk - 1) / kBlk : b_lo;

  // Running state (run: folded chunks; cur: the chunk being computed).
  float m[2][2], l[2][2], rm[2][2], rl[2][2];
  float acc[NDT][2][4];
  bool has_run[2][2], fin_regs[2][2];
  float* run_w = run_s + warp * (NDT * 2 * 4 * 32);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      has_run[nt][e] = false;
      fin_regs[nt][e] = false;
      rm[nt][e] = kNegInf;
      rl[nt][e] = 0.0f;
      m[nt][e] = kNegInf;
      l[nt][e] = 0.0f;
      const ColInfo& c = ci[nt][e];
      if (p.has_prefix != nullptr && c.pos >= 0 && p.has_prefix[c.row]) {
        const float* src = p.prefix + (int64_t(c.row) * p.Hq + c.head) * (D + 2);
        rm[nt][e] = src[0];
        rl[nt][e] = src[1];
        has_run[nt][e] = true;
#pragma unroll
        for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            run_w[((dt * 2 + nt) * 4 + h * 2 + e) * 32 + lane] =
                src[2 + dt * 16 + (lane >> 2) + 8 * h];
      }
    }
#pragma unroll
  for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[dt][nt][r] = 0.0f;

  // Pipeline prologue: offsets of the first NS blocks, loads of the first NS-1.
  for (int i = 0; i < NS; ++i)
    if (b_lo + i < b_hi)
      block_offsets(p, it, kvh, b_lo + i, lim, off_s + ((b_lo + i) % (NS + 1)) * 2 * kBlk, tid);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {
    if (b_lo + i < b_hi)
      load_block<D>(p, D, kv_s + ((b_lo + i) % NS) * S::kStage, LDS,
                    off_s + ((b_lo + i) % (NS + 1)) * 2 * kBlk, tid);
    cp_async_commit();
  }

  for (int64_t b = b_lo; b < b_hi; ++b) {
    cp_async_wait<NS - 2>();
    __syncthreads();
    if (b + NS - 1 < b_hi)
      load_block<D>(p, D, kv_s + ((b + NS - 1) % NS) * S::kStage, LDS,
                    off_s + ((b + NS - 1) % (NS + 1)) * 2 * kBlk, tid);
    cp_async_commit();
    if (b + NS < b_hi)
      block_offsets(p, it, kvh, b + NS, lim, off_s + ((b + NS) % (NS + 1)) * 2 * kBlk, tid);

    const uint16_t* kt = kv_s + (b % NS) * S::kStage;
    const uint16_t* vt = kt + kBlk * LDS;
    const int64_t j0 = b * kBlk;
    const int64_t c = j0 / K;
    if (j0 == c * K) {  // first block of a chunk: state (-inf, 0, +0)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          m[nt][e] = kNegInf;
          l[nt][e] = 0.0f;
        }
#pragma unroll
      for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[dt][nt][r] = 0.0f;
    }
    // Valid keys of each column in this block (0: the column skips it).
    int n[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const ColInfo& cc = ci[nt][e];
        const int64_t nv = cc.pos - j0 + 1;
        n[nt][e] = (c < cc.cend && nv > 0) ? int(nv < kBlk ? nv : kBlk) : 0;
      }

    // Scores S^T = K·Q^T: per (key, column) one chain over D from +0.
    float s[4][2][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[mt][nt][r] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < NDT; ++kb) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        uint32_t a[4];
        ldsm_x4(a, kt + (mt * 16 + (lane & 15)) * LDS + kb * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) mma_16816(s[mt][nt], a, qf[nt][kb][0], qf[nt][kb][1]);
      }
    }
    // x = s ⊗ σ; block max over the valid keys.
    float mb[2][2] = {{kNegInf, kNegInf}, {kNegInf, kNegInf}};
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int key = mt * 16 + (lane >> 2) + 8 * (r >> 1);
          const float x = __fmul_rn(s[mt][nt][r], p.scale);
          s[mt][nt][r] = x;
          if (key < n[nt][r & 1]) mb[nt][r & 1] = max_rule(mb[nt][r & 1], x);
        }
    float mu[2][2], alpha[2][2], mnext[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float bm = colmax_rows(mb[nt][e]);
        const float mn = max_rule(m[nt][e], bm);
        const float use = mn == kNegInf ? 0.0f : mn;
        const bool act = n[nt][e] > 0;
        mu[nt][e] = use;
        alpha[nt][e] = act ? ls_ex2_sfu(__fsub_rn(m[nt][e], use)) : 1.0f;
        mnext[nt][e] = act ? mn : m[nt][e];
      }
      // p (fp32), then the row sums.
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int key = mt * 16 + (lane >> 2) + 8 * (r >> 1);
          const int e = r & 1;
          s[mt][nt][r] = key < n[nt][e] ? ls_ex2_sfu(__fsub_rn(s[mt][nt][r], mu[nt][e])) : 0.0f;
        }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float rs = tree64_rows(s[0][nt][e], s[0][nt][e + 2], s[1][nt][e], s[1][nt][e + 2],
                                     s[2][nt][e], s[2][nt][e + 2], s[3][nt][e], s[3][nt][e + 2]);
        if (n[nt][e] > 0) l[nt][e] = __fadd_rn(__fmul_rn(alpha[nt][e], l[nt][e]), rs);
        m[nt][e] = mnext[nt][e];
      }
    // P^T fragments (B operand, k = key): movmatrix of the bf16 accumulator halves.
    uint32_t pb[4][2][2];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        pb[mt][nt][0] = movtrans(pack_bf16(s[mt][nt][0], s[mt][nt][1]));
        pb[mt][nt][1] = movtrans(pack_bf16(s[mt][nt][2], s[mt][nt][3]));
      }
      // c = α ⊗ acc.
#pragma unroll
    for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[dt][nt][r] = __fmul_rn(alpha[nt][r & 1], acc[dt][nt][r]);
    // A.6: columns of this warp with different limits share the V tile; non-finite V there needs
    // per-limit masking.
    const int nk = int(lim - j0 + 1 < kBlk ? lim - j0 + 1 : kBlk);
    int nmin = kBlk;
    bool mixed = false;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (ci[nt][e].pos >= 0) {
          mixed |= n[nt][e] < nk;
          nmin = min(nmin, n[nt][e]);
        }
    bool slow = false;
    if (__any_sync(0xffffffffu, mixed)) {
      nmin = __reduce_min_sync(0xffffffffu, nmin);
      slow = tile_nonfinite(vt, LDS, nmin, nk, 0, D, lane);
    }
    if (!slow) {
#pragma unroll
      for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          uint32_t a[4];
          ldsm_x4_t(a, vt + (kb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + dt * 16 +
                           ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) mma_16816(acc[dt][nt], a, pb[kb][nt][0], pb[kb][nt][1]);
        }
    } else {
      // One pass per distinct limit t among the warp's columns (ascending); each pass zeroes the
      // V of keys >= t and keeps the results of the columns whose limit is t.
#pragma unroll
      for (int dt = 0; dt < NDT; ++dt) {
        float cin[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) cin[nt][r] = acc[dt][nt][r];
        int t = -1;
        for (;;) {
          int cand = 0x7fffffff;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (ci[nt][e].pos >= 0 && n[nt][e] > t) cand = min(cand, n[nt][e]);
          t = __reduce_min_sync(0xffffffffu, cand);
          if (t == 0x7fffffff) break;
          float tmp[2][4];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r) tmp[nt][r] = cin[nt][r];
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            uint32_t a[4];
            ldsm_x4_t(a, vt + (kb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + dt * 16 +
                             ((lane >> 3) & 1) * 8);
            mask_keys(a, kb, lane, t);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) mma_16816(tmp[nt], a, pb[kb][nt][0], pb[kb][nt][1]);
          }
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              if (n[nt][r & 1] == t) acc[dt][nt][r] = tmp[nt][r];
        }
      }
    }

    // End of a chunk: store it, or fold it into the run.
    if (j0 + kBlk >= (c + 1) * K || b == b_hi - 1) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const ColInfo& cc = ci[nt][e];
          const bool act = cc.pos >= 0 && c < cc.cend;
          if (p.finish == kStoreChunks) {
            if (!act) continue;
            const int64_t cs = c - p.st_c0;
            if ((lane >> 2) == 0) {
              p.st_m[cc.row * p.sm0 + cc.head * p.sm1 + cs * p.sm2] = canon(m[nt][e]);
              p.st_l[cc.row * p.sl0 + cc.head * p.sl1 + cs * p.sl2] = canon(l[nt][e]);
            }
            float* dst = p.st_acc + cc.row * p.sa0 + cc.head * p.sa1 + cs * p.sa2;
#pragma unroll
            for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                dst[dt * 16 + (lane >> 2) + 8 * h] = canon(acc[dt][nt][h * 2 + e]);
            continue;
          }
          if (!act) continue;
          if (has_run[nt][e]) {
            float fa, fb, mm, ll;
            merge_factors(rm[nt][e], rl[nt][e], m[nt][e], l[nt][e], &fa, &fb, &mm, &ll);
            m[nt][e] = mm;
            l[nt][e] = ll;
#pragma unroll
            for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const float ra = run_w[((dt * 2 + nt) * 4 + h * 2 + e) * 32 + lane];
                acc[dt][nt][h * 2 + e] =
                    __fadd_rn(__fmul_rn(fa, ra), __fmul_rn(fb, acc[dt][nt][h * 2 + e]));
              }
          }
          if (c == c_end - 1) {
            fin_regs[nt][e] = true;
          } else {
            rm[nt][e] = m[nt][e];
            rl[nt][e] = l[nt][e];
            has_run[nt][e] = true;
#pragma unroll
            for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                run_w[((dt * 2 + nt) * 4 + h * 2 + e) * 32 + lane] = acc[dt][nt][h * 2 + e];
          }
        }
    }
  }
  cp_async_wait<0>();

  // Outputs.
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const ColInfo& cc = ci[nt][e];
      if (cc.pos < 0) continue;
      if (p.finish == kStoreChunks) {
        for (int64_t c = max(int64_t(it.c_lo), int64_t(cc.cend)); c < it.c_hi; ++c) {
          const int64_t cs = c - p.st_c0;
          if ((lane >> 2) == 0) {
            p.st_m[cc.row * p.sm0 + cc.head * p.sm1 + cs * p.sm2] = kNegInf;
            p.st_l[cc.row * p.sl0 + cc.head * p.sl1 + cs * p.sl2] = 0.0f;
          }
          float* dst = p.st_acc + cc.row * p.sa0 + cc.head * p.sa1 + cs * p.sa2;
#pragma unroll
          for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
            for (int h = 0; h < 2; ++h) dst[dt * 16 + (lane >> 2) + 8 * h] = 0.0f;
        }
        continue;
      }
      const bool fr = fin_regs[nt][e];
      const float fm = fr ? m[nt][e] : rm[nt][e];
      const float fl = fr ? l[nt][e] : rl[nt][e];
      if (p.finish == kFinalize) {
        const float inv = __fdiv_rn(1.0f, fl);
        uint16_t* o = p.out + cc.row * p.o_s0 + cc.head * p.o_s1;
#pragma unroll
        for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float a =
                fr ? acc[dt][nt][h * 2 + e] : run_w[((dt * 2 + nt) * 4 + h * 2 + e) * 32 + lane];
            o[dt * 16 + (lane >> 2) + 8 * h] = f32_to_bf16(__fmul_rn(a, inv)).bits;
          }
        if (p.lse != nullptr && (lane >> 2) == 0)
          p.lse[cc.row * p.l_s0 + cc.head * p.l_s1] =
              canon(__fmul_rn(__fadd_rn(fm, ls_log2f(fl)), kLn2f));
      } else {  // kStorePrefix
        float* dst = p.prefix + (int64_t(cc.row) * p.Hq + cc.head) * (D + 2);
        if ((lane >> 2) == 0) {
          dst[0] = fm;
          dst[1] = fl;
        }
#pragma unroll
        for (int dt = 0; dt < NDT; ++dt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            dst[2 + dt * 16 + (lane >> 2) + 8 * h] =
                fr ? acc[dt][nt][h * 2 + e] : run_w[((dt * 2 + nt) * 4 + h * 2 + e) * 32 + lane];
      }
    }
}

// ------------------------------------------------------------------------------------------------
// Key-split kernel: <= 8 columns, 4 warps; any head_dim D <= DM (a multiple of 16); EXACT: D == DM.

template <int DM, int NS>
struct KsShape {
  static constexpr int kNdtMax = DM / 16;
  static constexpr int kNdw = (kNdtMax + 3) / 4;  // d-tiles per warp
  static constexpr int kLds = DM + 8;
  static constexpr int kStage = 2 * kBlk * kLds;
  static constexpr int kKvBytes = NS * kStage * 2;
  static constexpr int kOffBytes = (NS + 1) * 2 * kBlk * 8;
  static constexpr int kQBytes = kKsCols * kLds * 2;
  static constexpr int kRedBytes = 4 * kKsCols * 4;
  static constexpr int kPBytes = kBlk * kKsCols * 4;
  static constexpr int kSmem = kKvBytes + kOffBytes + kQBytes + kRedBytes + kPBytes;
};

template <int DM, bool EXACT, int NS>
__global__ void __launch_bounds__(kThreads) attn_ks_kernel(const AttnParams p) {
  using S = KsShape<DM, NS>;
  constexpr int NDW = S::kNdw, LDS = S::kLds;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* kv_s = reinterpret_cast<uint16_t*>(smem);
  int64_t* off_s = reinterpret_cast<int64_t*>(smem + S::kKvBytes);
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + S::kKvBytes + S::kOffBytes);
  float* red_s = reinterpret_cast<float*>(smem + S::kKvBytes + S::kOffBytes + S::kQBytes);
  float* p_s = red_s + 4 * kKsCols;  // [64 keys][8 columns] fp32

  const int D = EXACT ? DM : p.D;
  const int ndt = D / 16;
  const AttnItem it = p.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int col0 = blockIdx.z * kKsCols;
  if (col0 >= it.nr * p.G) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  load_q_tile<kKsCols>(p, it, kvh, col0, D, q_s, LDS, tid);
  // Columns of this thread in the accumulator layout: 2*(lane&3) + e.
  ColInfo ci[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) ci[e] = col_info(p, it, kvh, col0 + 2 * (lane & 3) + e);
  int lim = -1;
  {
    const int hi = min(kKsCols, it.nr * p.G - col0);
    for (int c = 0; c < hi; ++c) lim = max(lim, p.row_pos[it.rb + (col0 + c) / p.G]);
  }
  const int64_t K = p.K;
  const int64_t c_end = min(int64_t(it.c_hi), int64_t(lim) / K + 1);
  const int64_t jb = int64_t(it.c_lo) * K, je = min(c_end * K, int64_t(lim) + 1);
  const int64_t b_lo = jb / kBlk, b_hi = je > jb ? (je + kBlk - 1) / kBlk : b_lo;

  float m[2], l[2], rm[2], rl[2];
  float acc[NDW][4], racc[NDW][4];
  bool has_run[2], fin_regs[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    m[e] = kNegInf;
    l[e] = 0.0f;
    rm[e] = kNegInf;
    rl[e] = 0.0f;
    has_run[e] = false;
    fin_regs[e] = false;
  }
#pragma unroll
  for (int i = 0; i < NDW; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      acc[i][r] = 0.0f;
      racc[i][r] = 0.0f;
    }
  if (p.has_prefix != nullptr) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const ColInfo& c = ci[e];
      if (c.pos >= 0 && p.has_prefix[c.row]) {
        const float* src = p.prefix + (int64_t(c.row) * p.Hq + c.head) * (D + 2);
        rm[e] = src[0];
        rl[e] = src[1];
        has_run[e] = true;
#pragma unroll
        for (int i = 0; i < NDW; ++i) {
          const int dt = warp + 4 * i;
          if (dt < ndt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) racc[i][h * 2 + e] = src[2 + dt * 16 + (lane >> 2) + 8 * h];
          }
        }
      }
    }
  }

  for (int i = 0; i < NS; ++i)
    if (b_lo + i < b_hi)
      block_offsets(p, it, kvh, b_lo + i, lim, off_s + ((b_lo + i) % (NS + 1)) * 2 * kBlk, tid);
  __syncthreads();  // q_s, offsets
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {
    if (b_lo + i < b_hi)
      load_block<EXACT ? DM : 0>(p, D, kv_s + ((b_lo + i) % NS) * S::kStage, LDS,
                                 off_s + ((b_lo + i) % (NS + 1)) * 2 * kBlk, tid);
    cp_async_commit();
  }

  for (int64_t b = b_lo; b < b_hi; ++b) {
    if (NS == 1) {
      load_block<EXACT ? DM : 0>(p, D, kv_s, LDS, off_s + (b % 2) * 2 * kBlk, tid);
      cp_async_commit();
      cp_async_wait<0>();
    } else {
      cp_async_wait<(NS >= 2 ? NS - 2 : 0)>();
    }
    __syncthreads();  // (A) block b in shared memory
    if (NS > 1) {
      if (b + NS - 1 < b_hi)
        load_block<EXACT ? DM : 0>(p, D, kv_s + ((b + NS - 1) % NS) * S::kStage, LDS,
                                   off_s + ((b + NS - 1) % (NS + 1)) * 2 * kBlk, tid);
      cp_async_commit();
    }
    if (b + NS < b_hi)
      block_offsets(p, it, kvh, b + NS, lim, off_s + ((b + NS) % (NS + 1)) * 2 * kBlk, tid);

    const uint16_t* kt = kv_s + (NS == 1 ? 0 : int(b % NS)) * S::kStage;
    const uint16_t* vt = kt + kBlk * LDS;
    const int64_t j0 = b * kBlk;
    const int64_t c = j0 / K;
    if (j0 == c * K) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        m[e] = kNegInf;
        l[e] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < NDW; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][r] = 0.0f;
    }
    int n[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t nv = ci[e].pos - j0 + 1;
      n[e] = (c < ci[e].cend && nv > 0) ? int(nv < kBlk ? nv : kBlk) : 0;
    }
    // Scores of keys 16*warp .. +15.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kb = 0; kb < S::kNdtMax; ++kb) {
      if (EXACT || kb < ndt) {
        uint32_t a[4], bq[2];
        ldsm_x4(a, kt + (warp * 16 + (lane & 15)) * LDS + kb * 16 + (lane >> 4) * 8);
        ldsm_x2(bq, q_s + (lane & 7) * LDS + kb * 16 + ((lane >> 3) & 1) * 8);
        mma_16816(s, a, bq[0], bq[1]);
      }
    }
    float pm[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = warp * 16 + (lane >> 2) + 8 * (r >> 1);
      s[r] = __fmul_rn(s[r], p.scale);
      if (key < n[r & 1]) pm[r & 1] = max_rule(pm[r & 1], s[r]);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      pm[e] = colmax_rows(pm[e]);
      if (lane < 4) red_s[warp * kKsCols + 2 * lane + e] = pm[e];
    }
    __syncthreads();  // (B) partial maxima
    float mu[2], alpha[2], mnext[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float bm = kNegInf;
#pragma unroll
      for (int w = 0; w < 4; ++w) bm = max_rule(bm, red_s[w * kKsCols + 2 * (lane & 3) + e]);
      const float mn = max_rule(m[e], bm);
      const float use = mn == kNegInf ? 0.0f : mn;
      const bool act = n[e] > 0;
      mu[e] = use;
      alpha[e] = act ? ls_ex2_sfu(__fsub_rn(m[e], use)) : 1.0f;
      mnext[e] = act ? mn : m[e];
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = warp * 16 + (lane >> 2) + 8 * (r >> 1);
      const int e = r & 1;
      const float pv = key < n[e] ? ls_ex2_sfu(__fsub_rn(s[r], mu[e])) : 0.0f;
      p_s[key * kKsCols + 2 * (lane & 3) + e] = pv;
    }
    __syncthreads();  // (C) p of all 64 keys
    // Row sums: lane = (column lane&7, q = lane>>3) holds keys q, q+4, ..., q+60.
    float rs;
    {
      const int col = lane & 7, q = lane >> 3;
      float v[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = p_s[(q + 4 * k) * kKsCols + col];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __fadd_rn(v[k], v[k + 8]);  // w = 32
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __fadd_rn(v[k], v[k + 4]);  // w = 16
#pragma unroll
      for (int k = 0; k < 2; ++k) v[k] = __fadd_rn(v[k], v[k + 2]);  // w = 8
      float t = __fadd_rn(v[0], v[1]);                               // w = 4
      t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 16));         // w = 2
      t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 8));          // w = 1
      rs = t;
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float r = __shfl_sync(0xffffffffu, rs, 2 * (lane & 3) + e);
      if (n[e] > 0) l[e] = __fadd_rn(__fmul_rn(alpha[e], l[e]), r);
      m[e] = mnext[e];
    }
    // P^T fragments for the 4 k-blocks of keys.
    uint32_t pb[4][2];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      const int k0 = kb * 16 + 2 * (lane & 3), col = lane >> 2;
      pb[kb][0] = pack_bf16(p_s[k0 * kKsCols + col], p_s[(k0 + 1) * kKsCols + col]);
      pb[kb][1] = pack_bf16(p_s[(k0 + 8) * kKsCols + col], p_s[(k0 + 9) * kKsCols + col]);
    }
#pragma unroll
    for (int i = 0; i < NDW; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][r] = __fmul_rn(alpha[r & 1], acc[i][r]);
    const int nk = int(lim - j0 + 1 < kBlk ? lim - j0 + 1 : kBlk);
    bool mixed = false;
    int nmin = kBlk;
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (ci[e].pos >= 0) {
        mixed |= n[e] < nk;
        nmin = min(nmin, n[e]);
      }
    bool slow = false;
    if (__any_sync(0xffffffffu, mixed)) {
      nmin = __reduce_min_sync(0xffffffffu, nmin);
#pragma unroll
      for (int i = 0; i < NDW; ++i) {
        const int dt = warp + 4 * i;
        if (dt < ndt) slow |= tile_nonfinite(vt, LDS, nmin, nk, dt * 16, dt * 16 + 16, lane);
      }
    }
#pragma unroll
    for (int i = 0; i < NDW; ++i) {
      const int dt = warp + 4 * i;
      if (dt >= ndt) continue;
      if (!slow) {
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          uint32_t a[4];
          ldsm_x4_t(a, vt + (kb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + dt * 16 +
                           ((lane >> 3) & 1) * 8);
          mma_16816(acc[i], a, pb[kb][0], pb[kb][1]);
        }
      } else {
        float cin[4] = {acc[i][0], acc[i][1], acc[i][2], acc[i][3]};
        int t = -1;
        for (;;) {
          int cand = 0x7fffffff;
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (ci[e].pos >= 0 && n[e] > t) cand = min(cand, n[e]);
          t = __reduce_min_sync(0xffffffffu, cand);
          if (t == 0x7fffffff) break;
          float tmp[4] = {cin[0], cin[1], cin[2], cin[3]};
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            uint32_t a[4];
            ldsm_x4_t(a, vt + (kb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + dt * 16 +
                             ((lane >> 3) & 1) * 8);
            mask_keys(a, kb, lane, t);
            mma_16816(tmp, a, pb[kb][0], pb[kb][1]);
          }
#pragma unroll
          for (int r = 0; r < 4; ++r)
            if (n[r & 1] == t) acc[i][r] = tmp[r];
        }
      }
    }

    if (j0 + kBlk >= (c + 1) * K || b == b_hi - 1) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const ColInfo& cc = ci[e];
        const bool act = cc.pos >= 0 && c < cc.cend;
        if (!act) continue;
        if (p.finish == kStoreChunks) {
          const int64_t cs = c - p.st_c0;
          if (warp == 0 && (lane >> 2) == 0) {
            p.st_m[cc.row * p.sm0 + cc.head * p.sm1 + cs * p.sm2] = canon(m[e]);
            p.st_l[cc.row * p.sl0 + cc.head * p.sl1 + cs * p.sl2] = canon(l[e]);
          }
          float* dst = p.st_acc + cc.row * p.sa0 + cc.head * p.sa1 + cs * p.sa2;
#pragma unroll
          for (int i = 0; i < NDW; ++i) {
            const int dt = warp + 4 * i;
            if (dt < ndt) {
#pragma unroll
              for (int h = 0; h < 2; ++h)
                dst[dt * 16 + (lane >> 2) + 8 * h] = canon(acc[i][h * 2 + e]);
            }
          }
          continue;
        }
        if (has_run[e]) {
          float fa, fb, mm, ll;
          merge_factors(rm[e], rl[e], m[e], l[e], &fa, &fb, &mm, &ll);
          m[e] = mm;
          l[e] = ll;
#pragma unroll
          for (int i = 0; i < NDW; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              acc[i][h * 2 + e] =
                  __fadd_rn(__fmul_rn(fa, racc[i][h * 2 + e]), __fmul_rn(fb, acc[i][h * 2 + e]));
        }
        if (c == c_end - 1) {
          fin_regs[e] = true;
        } else {
          rm[e] = m[e];
          rl[e] = l[e];
          has_run[e] = true;
#pragma unroll
          for (int i = 0; i < NDW; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) racc[i][h * 2 + e] = acc[i][h * 2 + e];
        }
      }
    }
    if (NS == 1) __syncthreads();  // the single stage is overwritten next
  }
  cp_async_wait<0>();

#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const ColInfo& cc = ci[e];
    if (cc.pos < 0) continue;
    if (p.finish == kStoreChunks) {
      for (int64_t c = max(int64_t(it.c_lo), int64_t(cc.cend)); c < it.c_hi; ++c) {
        const int64_t cs = c - p.st_c0;
        if (warp == 0 && (lane >> 2) == 0) {
          p.st_m[cc.row * p.sm0 + cc.head * p.sm1 + cs * p.sm2] = kNegInf;
          p.st_l[cc.row * p.sl0 + cc.head * p.sl1 + cs * p.sl2] = 0.0f;
        }
        float* dst = p.st_acc + cc.row * p.sa0 + cc.head * p.sa1 + cs * p.sa2;
#pragma unroll
        for (int i = 0; i < NDW; ++i) {
          const int dt = warp + 4 * i;
          if (dt < ndt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) dst[dt * 16 + (lane >> 2) + 8 * h] = 0.0f;
          }
        }
      }
      continue;
    }
    const bool fr = fin_regs[e];
    const float fm = fr ? m[e] : rm[e];
    const float fl = fr ? l[e] : rl[e];
    if (p.finish == kFinalize) {
      const float inv = __fdiv_rn(1.0f, fl);
      uint16_t* o = p.out + cc.row * p.o_s0 + cc.head * p.o_s1;
#pragma unroll
      for (int i = 0; i < NDW; ++i) {
        const int dt = warp + 4 * i;
        if (dt < ndt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float a = fr ? acc[i][h * 2 + e] : racc[i][h * 2 + e];
            o[dt * 16 + (lane >> 2) + 8 * h] = f32_to_bf16(__fmul_rn(a, inv)).bits;
          }
        }
      }
      if (p.lse != nullptr && warp == 0 && (lane >> 2) == 0)
        p.lse[cc.row * p.l_s0 + cc.head * p.l_s1] =
            canon(__fmul_rn(__fadd_rn(fm, ls_log2f(fl)), kLn2f));
    } else {
      float* dst = p.prefix + (int64_t(cc.row) * p.Hq + cc.head) * (D + 2);
      if (warp == 0 && (lane >> 2) == 0) {
        dst[0] = fm;
        dst[1] = fl;
      }
#pragma unroll
      for (int i = 0; i < NDW; ++i) {
        const int dt = warp + 4 * i;
        if (dt < ndt) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            dst[2 + dt * 16 + (lane >> 2) + 8 * h] = fr ? acc[i][h * 2 + e] : racc[i][h * 2 + e];
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Merge of chunk states (A.4) and normalization: one CTA per (row, head), threads over d.

struct MergeParams {
  const float* m;
  const float* l;
  const float* acc;
  int64_t m0, m1, m2, l0, l1, l2, a0, a1, a2;
  const int32_t* pos;  // [N]
  int32_t Hq, D, K;
  uint16_t* out;
  int64_t o_s0, o_s1;
  float* lse;
  int64_t ls0, ls1;
};

constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads) attn_merge_kernel(const MergeParams mp) {
  const int64_t r = blockIdx.x / mp.Hq;
  const int h = int(blockIdx.x - r * mp.Hq);
  const int64_t C = int64_t(mp.pos[r]) / mp.K + 1;
  const float* mrow = mp.m + r * mp.m0 + h * mp.m1;
  const float* lrow = mp.l + r * mp.l0 + h * mp.l1;
  const float* arow = mp.acc + r * mp.a0 + h * mp.a1;
  constexpr int kPer = 512 / kMergeThreads;  // D <= 512
  float a[kPer];
  float m = mrow[0], l = lrow[0];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = threadIdx.x + i * kMergeThreads;
    a[i] = d < mp.D ? arow[d] : 0.0f;
  }
  for (int64_t c = 1; c < C; ++c) {
    float fa, fb, mm, ll;
    merge_factors(m, l, mrow[c * mp.m2], lrow[c * mp.l2], &fa, &fb, &mm, &ll);
    m = mm;
    l = ll;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = threadIdx.x + i * kMergeThreads;
      if (d < mp.D) a[i] = __fadd_rn(__fmul_rn(fa, a[i]), __fmul_rn(fb, arow[c * mp.a2 + d]));
    }
  }
  const float inv = __fdiv_rn(1.0f, l);
  uint16_t* o = mp.out + r * mp.o_s0 + h * mp.o_s1;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = threadIdx.x + i * kMergeThreads;
    if (d < mp.D) o[d] = f32_to_bf16(__fmul_rn(a[i], inv)).bits;
  }
  if (mp.lse != nullptr && threadIdx.x == 0)
    mp.lse[r * mp.ls0 + h * mp.ls1] = canon(__fmul_rn(__fadd_rn(m, ls_log2f(l)), kLn2f));
}

// ------------------------------------------------------------------------------------------------
// KV-cache write: token t's [Hkv, D] rows to slot slot[t] (skipped when -1 or outside the cache).

struct KvWriteParams {
  const uint16_t* k;
  const uint16_t* v;
  int64_t k_s0, k_s1, v_s0, v_s1;
  const void* slots;
  int32_t slots_i64;
  int64_t slot_s0;
  uint16_t* kc;
  uint16_t* vc;
  int64_t kc0, kc1, kc2, vc0, vc1, vc2;
  int64_t NP, P;
  int32_t Hkv, D;
  int32_t vec;
};

__global__ void __launch_bounds__(kThreads) kv_cache_write_kernel(const KvWriteParams w) {
  const int64_t t = blockIdx.x;
  const int64_t s = w.slots_i64 ? static_cast<const int64_t*>(w.slots)[t * w.slot_s0]
                                : int64_t(static_cast<const int32_t*>(w.slots)[t * w.slot_s0]);
  if (s < 0 || s >= w.NP * w.P) return;
  const int64_t page = s / w.P, off = s - page * w.P;
  if (w.vec) {
    const int cpr = w.D / 8;
    for (int qi = threadIdx.x; qi < w.Hkv * cpr; qi += kThreads) {
      const int h = qi / cpr, ch = qi - h * cpr;
      *reinterpret_cast<uint4*>(w.kc + page * w.kc0 + off * w.kc1 + h * w.kc2 + ch * 8) =
          *reinterpret_cast<const uint4*>(w.k + t * w.k_s0 + h * w.k_s1 + ch * 8);
      *reinterpret_cast<uint4*>(w.vc + page * w.vc0 + off * w.vc1 + h * w.vc2 + ch * 8) =
          *reinterpret_cast<const uint4*>(w.v + t * w.v_s0 + h * w.v_s1 + ch * 8);
    }
  } else {
    for (int qi = threadIdx.x; qi < w.Hkv * w.D; qi += kThreads) {
      const int h = qi / w.D, d = qi - h * w.D;
      w.kc[page * w.kc0 + off * w.kc1 + h * w.kc2 + d] = w.k[t * w.k_s0 + h * w.k_s1 + d];
      w.vc[page * w.vc0 + off * w.vc1 + h * w.vc2 + d] = w.v[t * w.v_s0 + h * w.v_s1 + d];
    }
  }
}

}  // namespace lockstep::cuda::attn_detail
