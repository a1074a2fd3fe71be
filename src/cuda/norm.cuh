// RMSNorm (+ fused residual add) kernel, docs/contract.md §E.1: one warp per row. Lane j owns the
// 8-element groups g ≡ j (mod 32) and adds fp32(s_k)·fp32(s_k) (separate RNE multiply and add) in
// ascending k from +0; lanes combine by the xor butterfly 16, 8, 4, 2, 1; r = 1 / sqrt(sum/H + eps)
// with IEEE divide and sqrt; y = round(round(s·r)·w). Groups are read as one 16-byte load where
// the row is 16-byte aligned and the group whole, element by element otherwise (same bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/elementwise_common.cuh"

namespace lockstep::cuda::detail {

constexpr int kNormWarps = 4;  // rows per CTA

struct RmsNormParams {
  const uint16_t* x;    // [rows, H] via xm
  const uint16_t* res;  // nullptr: plain rmsnorm
  const uint16_t* w;    // [H] contiguous
  uint16_t* res_out;    // with res: the new residual stream s
  uint16_t* y;
  RowMap xm, rm, om, ym;
  int64_t rows, H;
  float eps;
  int vec;  // every row of every view is 16-byte aligned
};

// Elements [k0, k0 + n) of a row into e[0..n) (n <= 8); one uint4 load when whole and aligned.
__device__ __forceinline__ void load_group(const uint16_t* row, int64_t k0, int n, bool vec,
                                           uint16_t (&e)[8]) {
  if (vec && n == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + k0);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      e[2 * i] = uint16_t(u[i] & 0xffffu);
      e[2 * i + 1] = uint16_t(u[i] >> 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = i < n ? row[k0 + i] : uint16_t(0);
  }
}

__device__ __forceinline__ void store_group(uint16_t* row, int64_t k0, int n, bool vec,
                                            const uint16_t (&e)[8]) {
  if (vec && n == 8) {
    uint4 v;
    v.x = uint32_t(e[0]) | (uint32_t(e[1]) << 16);
    v.y = uint32_t(e[2]) | (uint32_t(e[3]) << 16);
    v.z = uint32_t(e[4]) | (uint32_t(e[5]) << 16);
    v.w = uint32_t(e[6]) | (uint32_t(e[7]) << 16);
    *reinterpret_cast<uint4*>(row + k0) = v;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n) row[k0 + i] = e[i];
  }
}

// §E.1 step 2 over one 8-element group: acc + fp32(s_k)·fp32(s_k), k ascending (separate RNE
// multiply and add).
__device__ __forceinline__ float add_squares8(float acc, const uint16_t (&s)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float v = bf16_bits_to_f32(s[k]);
    acc = __fadd_rn(acc, __fmul_rn(v, v));
  }
  return acc;
}

// §E.1 steps 3-4 for a warp's row: the lanes' sums combined by the xor butterfly 16, 8, 4, 2, 1
// (every lane gets the row's sum), then r = 1 / sqrt(sum / H + eps) (IEEE divide and sqrt).
__device__ __forceinline__ float warp_rms_recip(float acc, float H, float eps) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
  const float mean = __fdiv_rn(acc, H);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// NOTE: no __restrict__ / __ldg: y may be the same memory as x, residual_out as residual or x
// (each lane reads a group before it writes it, and re-reads only groups it wrote itself).
static __global__ void __launch_bounds__(32 * kNormWarps) rmsnorm_kernel(const RmsNormParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;  // whole warps leave together
  const bool vec = p.vec != 0;
  const int64_t H = p.H;
  const uint16_t* xr = p.x + p.xm.offset(row);
  const uint16_t* src = xr;  // the norm's input s
  float acc = 0.0f;
  if (p.res) {
    const uint16_t* rr = p.res + p.rm.offset(row);
    uint16_t* sr = p.res_out + p.om.offset(row);
    for (int64_t g = lane; g * 8 < H; g += 32) {
      const int64_t k0 = g * 8;
      const int n = H - k0 < 8 ? int(H - k0) : 8;
      uint16_t a[8], b[8], s[8];
      load_group(xr, k0, n, vec, a);
      load_group(rr, k0, n, vec, b);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        s[i] = f32_to_bf16_bits(__fadd_rn(bf16_bits_to_f32(a[i]), bf16_bits_to_f32(b[i])));
        if (i < n) {
          const float v = bf16_bits_to_f32(s[i]);
          acc = __fadd_rn(acc, __fmul_rn(v, v));
        }
      }
      store_group(sr, k0, n, vec, s);
    }
    src = sr;
  } else {
    for (int64_t g = lane; g * 8 < H; g += 32) {
      const int64_t k0 = g * 8;
      const int n = H - k0 < 8 ? int(H - k0) : 8;
      uint16_t a[8];
      load_group(xr, k0, n, vec, a);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (i < n) {
          const float v = bf16_bits_to_f32(a[i]);
          acc = __fadd_rn(acc, __fmul_rn(v, v));
        }
      }
    }
  }
  const float r = warp_rms_recip(acc, float(H), p.eps);

  uint16_t* yr = p.y + p.ym.offset(row);
  for (int64_t g = lane; g * 8 < H; g += 32) {
    const int64_t k0 = g * 8;
    const int n = H - k0 < 8 ? int(H - k0) : 8;
    uint16_t s[8], w[8], o[8];
    load_group(src, k0, n, vec, s);
    // weight is contiguous [H]: 16-byte aligned groups when its base is (checked on the host
    // as part of `vec`).
    load_group(p.w, k0, n, vec, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint16_t t = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(s[i]), r));
      o[i] = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(t), bf16_bits_to_f32(w[i])));
    }
    store_group(yr, k0, n, vec, o);
  }
}

// The same arithmetic with every group of the row held in registers (H a multiple of 8, H <= 256 ·
// GPL, 16-byte aligned rows): each lane issues all its loads (x, residual, weight) before its
// first add, so a row costs one memory round trip, not one per group and a second pass. Lane j's
// groups g = j + 32i, i ascending, are exactly §E.1's ownership and order. All loads come before
// any store, so the aliasing above is safe here too.
__device__ __forceinline__ void unpack8(const uint4& v, uint16_t (&e)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    e[2 * i] = uint16_t(u[i] & 0xffffu);
    e[2 * i + 1] = uint16_t(u[i] >> 16);
  }
}
__device__ __forceinline__ uint4 pack8(const uint16_t (&e)[8]) {
  return make_uint4(
      uint32_t(e[0]) | (uint32_t(e[1]) << 16), uint32_t(e[2]) | (uint32_t(e[3]) << 16),
      uint32_t(e[4]) | (uint32_t(e[5]) << 16), uint32_t(e[6]) | (uint32_t(e[7]) << 16));
}

template <int GPL>
static __global__ void __launch_bounds__(32 * kNormWarps)
    rmsnorm_regs_kernel(const RmsNormParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;  // whole warps leave together
  const int ng = int(p.H / 8);
  const uint16_t* xr = p.x + p.xm.offset(row);
  const uint16_t* rr = p.res ? p.res + p.rm.offset(row) : nullptr;
  uint4 sv[GPL], wv[GPL], rv[GPL];
#pragma unroll
  for (int i = 0; i < GPL; ++i) {
    const int g = lane + 32 * i;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    sv[i] = g < ng ? *reinterpret_cast<const uint4*>(xr + 8 * g) : z;
    wv[i] = g < ng ? *reinterpret_cast<const uint4*>(p.w + 8 * g) : z;
    rv[i] = (rr != nullptr && g < ng) ? *reinterpret_cast<const uint4*>(rr + 8 * g) : z;
  }
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < GPL; ++i) {
    const int g = lane + 32 * i;
    if (g >= ng) continue;
    uint16_t s[8];
    unpack8(sv[i], s);
    if (rr != nullptr) {
      uint16_t b[8];
      unpack8(rv[i], b);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        s[k] = f32_to_bf16_bits(__fadd_rn(bf16_bits_to_f32(s[k]), bf16_bits_to_f32(b[k])));
      sv[i] = pack8(s);
      *reinterpret_cast<uint4*>(p.res_out + p.om.offset(row) + 8 * g) = sv[i];
    }
    acc = add_squares8(acc, s);
  }
  const float r = warp_rms_recip(acc, float(p.H), p.eps);
  uint16_t* yr = p.y + p.ym.offset(row);
#pragma unroll
  for (int i = 0; i < GPL; ++i) {
    const int g = lane + 32 * i;
    if (g >= ng) continue;
    uint16_t s[8], w[8], o[8];
    unpack8(sv[i], s);
    unpack8(wv[i], w);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint16_t t = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(s[k]), r));
      o[k] = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(t), bf16_bits_to_f32(w[k])));
    }
    *reinterpret_cast<uint4*>(yr + 8 * g) = pack8(o);
  }
}

// Long rows (H >= 1024) with one CTA of 128 threads per row: thread t loads and rounds the groups
// g = t + 128i (x, residual, weight in registers; residual_out written), the row's s goes to
// shared memory, warp 0 runs §E.1's lane chains from there (lane j: groups j, j + 32, … in
// ascending order, elements ascending, separate multiply and add) and the butterfly, and every
// thread writes its groups' outputs. The same bits as the warp-per-row kernels; a decode step's
// 128 rows then keep 128 CTAs busy instead of 32 (one row's chain is ~128 dependent adds).
template <int GPT>  // groups per thread: H <= 1024 · GPT
static __global__ void __launch_bounds__(128) rmsnorm_cta_kernel(const RmsNormParams p) {
  __shared__ uint4 s_sh[128 * GPT];
  __shared__ float r_sh;
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t row = blockIdx.x;
  const int ng = int(p.H / 8);
  const uint16_t* xr = p.x + p.xm.offset(row);
  const uint16_t* rr = p.res ? p.res + p.rm.offset(row) : nullptr;
  uint4 sv[GPT], wv[GPT], rv[GPT];
#pragma unroll
  for (int i = 0; i < GPT; ++i) {
    const int g = tid + 128 * i;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    sv[i] = g < ng ? *reinterpret_cast<const uint4*>(xr + 8 * g) : z;
    wv[i] = g < ng ? *reinterpret_cast<const uint4*>(p.w + 8 * g) : z;
    rv[i] = (rr != nullptr && g < ng) ? *reinterpret_cast<const uint4*>(rr + 8 * g) : z;
  }
#pragma unroll
  for (int i = 0; i < GPT; ++i) {
    const int g = tid + 128 * i;
    if (g >= ng) continue;
    if (rr != nullptr) {
      uint16_t a[8], b[8];
      unpack8(sv[i], a);
      unpack8(rv[i], b);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        a[k] = f32_to_bf16_bits(__fadd_rn(bf16_bits_to_f32(a[k]), bf16_bits_to_f32(b[k])));
      sv[i] = pack8(a);
      *reinterpret_cast<uint4*>(p.res_out + p.om.offset(row) + 8 * g) = sv[i];
    }
    s_sh[g] = sv[i];
  }
  __syncthreads();
  if (tid < 32) {
    float acc = 0.0f;
#pragma unroll
    for (int m = 0; m < 4 * GPT; ++m) {
      const int g = lane + 32 * m;
      if (g >= ng) break;
      uint16_t e[8];
      unpack8(s_sh[g], e);
      acc = add_squares8(acc, e);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    const float mean = __fdiv_rn(acc, float(p.H));
    if (lane == 0) r_sh = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, p.eps)));
  }
  __syncthreads();
  const float r = r_sh;
  uint16_t* yr = p.y + p.ym.offset(row);
#pragma unroll
  for (int i = 0; i < GPT; ++i) {
    const int g = tid + 128 * i;
    if (g >= ng) continue;
    uint16_t sk[8], w[8], o[8];
    unpack8(sv[i], sk);
    unpack8(wv[i], w);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint16_t t = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(sk[k]), r));
      o[k] = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(t), bf16_bits_to_f32(w[k])));
    }
    *reinterpret_cast<uint4*>(yr + 8 * g) = pack8(o);
  }
}

}  // namespace lockstep::cuda::detail
