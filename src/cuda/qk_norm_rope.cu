// cuda::qk_norm_rope: a layer's q and k heads normalized (Qwen3's per-head RMSNorm, q_norm for
// heads [0, nq), k_norm for the rest) and rotated (RoPE) in place, in one launch: the bits of
// cuda::rmsnorm on each part followed by cuda::rope on both (docs/contract.md §E.1, §E.2), with
// the normalized values never stored. One warp per (token, head) row of D = 128: lane j < 16 holds
// elements 8j .. 8j + 7 (§E.1's group j, the rmsnorm_regs_kernel ownership: its fp32 chain of
// squares in ascending k from +0, the xor butterfly 16 .. 1 over all 32 lanes, r = 1 / sqrt(sum /
// D + eps), y = round(round(s·r)·w)); then lane j < 8 (the pair's first half, i = 8j + k) and lane
// j + 8 (i + 64) swap their values with one shuffle and each computes its element of the pair as
// rope_rows_kernel does (separate RNE products, then the difference or the sum). A position
// outside [0, P) gives a canonical-NaN row, as cuda::rope.
#include <cuda_runtime.h>

#include "contract/checks.h"
#include "cuda/elementwise_common.cuh"
#include "cuda/norm.cuh"  // unpack8, pack8, add_squares8, warp_rms_recip
#include "lockstep/cuda/elementwise.h"

namespace lockstep::cuda {
namespace detail {
namespace {

constexpr int kQkD = 128;
constexpr int kQkWarps = 4;  // rows per CTA

struct QkNormRopeParams {
  uint16_t* x;  // row (t, h) at t·s0 + h·s1, D contiguous elements, 16-byte aligned
  int64_t s0, s1;
  const uint16_t* wq;  // [D]
  const uint16_t* wk;  // [D]
  int32_t rows, heads, nq;
  float eps;
  RopeTableRef tab;
};

__global__ void __launch_bounds__(32 * kQkWarps) qk_norm_rope_kernel(const QkNormRopeParams p) {
  const int lane = threadIdx.x & 31;
  const int32_t row = int32_t(blockIdx.x) * kQkWarps + int32_t(threadIdx.x >> 5);
  if (row >= p.rows) return;  // whole warps leave together
  const int32_t t = row / p.heads, h = row - t * p.heads;
  uint16_t* xr = p.x + int64_t(t) * p.s0 + int64_t(h) * p.s1;
  const uint16_t* w = h < p.nq ? p.wq : p.wk;
  const bool own = lane < kQkD / 8;
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  const uint4 sv = own ? *reinterpret_cast<const uint4*>(xr + 8 * lane) : z;
  const uint4 wv = own ? *reinterpret_cast<const uint4*>(w + 8 * lane) : z;
  const int64_t pos = p.tab.pos[t];
  // RMSNorm (§E.1).
  uint16_t s[8];
  unpack8(sv, s);
  const float r = warp_rms_recip(own ? add_squares8(0.0f, s) : 0.0f, float(kQkD), p.eps);
  uint16_t wt[8], n[8];
  unpack8(wv, wt);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint16_t u = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(s[k]), r));
    n[k] = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(u), bf16_bits_to_f32(wt[k])));
  }
  // RoPE (§E.2): pairs (i, i + 64); lane j and lane j ^ 8 hold the two halves.
  const uint4 nv = pack8(n);
  uint4 ov;
  ov.x = __shfl_xor_sync(0xffffffffu, nv.x, 8);
  ov.y = __shfl_xor_sync(0xffffffffu, nv.y, 8);
  ov.z = __shfl_xor_sync(0xffffffffu, nv.z, 8);
  ov.w = __shfl_xor_sync(0xffffffffu, nv.w, 8);
  if (!own) return;
  uint16_t other[8], y[8];
  unpack8(ov, other);
  if (pos < 0 || pos >= p.tab.P) {
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] = kNanBf16;
  } else {
    const bool first = lane < 8;  // elements i = 8·lane + k (else i + 64 of lane - 8's i)
    const int i0 = 8 * (lane & 7);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float c = p.tab.cos[pos * p.tab.cs + i0 + k], sn = p.tab.sin[pos * p.tab.ss + i0 + k];
      const float a = bf16_bits_to_f32(first ? n[k] : other[k]);
      const float b = bf16_bits_to_f32(first ? other[k] : n[k]);
      y[k] = first ? rope_first(a, b, c, sn) : rope_second(a, b, c, sn);
    }
  }
  *reinterpret_cast<uint4*>(xr + 8 * lane) = pack8(y);
}

}  // namespace
}  // namespace detail

bool qk_norm_rope_supported(const TensorView& qk) {
  return qk.ndim == 3 && qk.dtype == DType::kBF16 && qk.shape[2] == detail::kQkD &&
         qk.stride[2] == 1 && qk.stride[0] % 8 == 0 && qk.stride[1] % 8 == 0 &&
         reinterpret_cast<uintptr_t>(qk.data) % 16 == 0;
}

void qk_norm_rope(const TensorView& qk, int64_t nq, const TensorView& q_weight,
                  const TensorView& k_weight, const RmsNormConfig& cfg, const TensorView& positions,
                  const TensorView& cos, const TensorView& sin, void* stream) {
  const char* op = "cuda::qk_norm_rope";
  using detail::check_device_view;
  check_device_view(op, "qk", qk, DType::kBF16, {-1, -1, detail::kQkD});
  LS_CHECK(qk_norm_rope_supported(qk), op,
           "argument 'qk': needs head_dim 128, contiguous heads and 16-byte aligned rows (use "
           "cuda::rmsnorm and cuda::rope otherwise)");
  const int64_t T = qk.shape[0], heads = qk.shape[1];
  LS_CHECK(nq >= 0 && nq <= heads, op, "argument 'nq': must be in [0, ", heads, "], got ", nq);
  auto heads_view = [&](int64_t h0, int64_t n) {  // heads [h0, h0 + n) of qk
    TensorView v = qk;
    v.data = static_cast<char*>(qk.data) + h0 * qk.stride[1] * 2;
    v.shape[1] = n;
    return v;
  };
  const TensorView q = heads_view(0, nq), k = heads_view(nq, heads - nq);
  contract::check_rmsnorm(op, Device::kCUDA, q, q_weight, cfg, q);
  contract::check_rmsnorm(op, Device::kCUDA, k, k_weight, cfg, k);
  LS_CHECK(detail::rows_16b_aligned(q_weight) && detail::rows_16b_aligned(k_weight), op,
           "arguments 'q_weight', 'k_weight': must be 16-byte aligned");
  check_device_view(op, "cos", cos, DType::kF32, {-1, detail::kQkD / 2});
  const int64_t P = cos.shape[0];
  LS_CHECK(P >= 1, op, "argument 'cos': expected at least one table row, got ", cos.shape_string());
  check_device_view(op, "sin", sin, DType::kF32, {P, detail::kQkD / 2});
  contract::check_rope_args(op, Device::kCUDA, qk, positions, detail::kQkD, P, qk);
  const int64_t rows = T * heads;
  if (rows == 0) return;
  LS_CHECK(rows < (int64_t(1) << 31) - detail::kQkWarps, op, "too many rows: ", rows);
  detail::QkNormRopeParams p{};
  p.x = static_cast<uint16_t*>(qk.data);
  p.s0 = qk.stride[0];
  p.s1 = qk.stride[1];
  p.wq = static_cast<const uint16_t*>(q_weight.data);
  p.wk = static_cast<const uint16_t*>(k_weight.data);
  p.rows = int32_t(rows);
  p.heads = int32_t(heads);
  p.nq = int32_t(nq);
  p.eps = cfg.eps;
  p.tab = detail::rope_table_ref(positions, cos, sin);
  const unsigned blocks = unsigned((rows + detail::kQkWarps - 1) / detail::kQkWarps);
  detail::
      qk_norm_rope_kernel<<<blocks, 32 * detail::kQkWarps, 0, static_cast<cudaStream_t>(stream)>>>(
          p);
  detail::check_launch(op);
}

}  // namespace lockstep::cuda
