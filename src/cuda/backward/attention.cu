// Launcher of the CUDA attention backward (docs/contract.md §B.9; kernels in attention.cuh): the
// CPU op's argument checks (contract::check_attention_backward, Device::kCUDA), the block table
// planned from the validated host boundaries, then three launches on `stream`: δ / λ, dK / dV,
// dQ. Each output element is one chain in the contract's order inside one thread, so no choice
// made here (grid order, CTA placement) can change a bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "contract/checks.h"
#include "cuda/backward/attention.cuh"
#include "lockstep/cuda/backward.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
namespace {

using namespace attn_bwd_detail;

constexpr const char* kOp = "cuda::attention_backward_varlen";

void cuda_check(cudaError_t e, const char* what) {
  LS_CHECK(e == cudaSuccess, kOp, what, " failed: ", cudaGetErrorString(e));
}

// 16-byte vector loads are possible: the base 16-byte aligned and every outer stride a multiple
// of 8 elements.
bool vec16(const TensorView& t) {
  if ((reinterpret_cast<uintptr_t>(t.data) & 15u) != 0) return false;
  for (int d = 0; d + 1 < t.ndim; ++d)
    if (t.stride[d] % 8 != 0) return false;
  return true;
}

// Device scratch of one call, freed in stream order when the call returns.
struct Scratch {
  cudaStream_t s = nullptr;
  std::vector<void*> ptrs;
  explicit Scratch(cudaStream_t st) : s(st) {}
  ~Scratch() {
    for (void* p : ptrs) cudaFreeAsync(p, s);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, std::max<size_t>(bytes, 16), s), "cudaMallocAsync");
    ptrs.push_back(p);
    return p;
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* d = static_cast<T*>(alloc(v.size() * sizeof(T)));
    if (!v.empty())
      cuda_check(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s),
                 "upload");
    return d;
  }
};

// NOTE: one template instance per kernel, so the once-per-process shared-memory attribute is set
// for each of them.
template <auto Kernel>
void launch(int smem, dim3 grid, cudaStream_t s, const BwdParams& p) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  LS_CHECK(attr == cudaSuccess, kOp, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  Kernel<<<grid, kThreads, smem, s>>>(p);
  cuda_check(cudaGetLastError(), "kernel launch");
}

// DF: D when it equals DP (the kernels' trip counts become compile-time), else 0.
template <int DP, int DF>
void launch_grads(dim3 grid_kv, dim3 grid_q, const BwdParams& pkv, const BwdParams& pq,
                  cudaStream_t s) {
  constexpr int smem = BwdShape<DP>::kSmem;
  if (grid_kv.x > 0) launch<dkdv_kernel<DP, DF>>(smem, grid_kv, s, pkv);
  if (grid_q.x > 0) launch<dq_kernel<DP, DF>>(smem, grid_q, s, pq);
}

}  // namespace

void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const PackedSeqs& seqs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const contract::QShape qs = contract::check_attention_backward(kOp, Device::kCUDA, q, k, v, out,
                                                                 lse, dout, seqs, cfg, dq, dk, dv);
  const int64_t T = qs.N, Hq = qs.Hq, Hkv = k.shape[1], D = qs.D;
  LS_CHECK(D <= 128, kOp, "argument 'q': head_dim ", D,
           " is not supported by the CUDA backward (16 … 128, multiples of 16)");
  if (T == 0) return;
  int64_t Dp = 1;
  while (Dp < D) Dp *= 2;

  // Blocks of every sequence: dK/dV per 64-key block, dQ per 64-row block; the costliest first
  // (scheduling only: every CTA owns its outputs).
  std::vector<BwdItem> kv_items, q_items;
  for (int64_t b = 0; b < seqs.B(); ++b) {
    const int64_t t0 = seqs.cu()[size_t(b)], len = seqs.cu()[size_t(b + 1)] - t0;
    for (int64_t blk = 0; blk * kBlk < len; ++blk) {
      kv_items.push_back({t0, int32_t(len), int32_t(blk)});
      q_items.push_back({t0, int32_t(len), int32_t(blk)});
    }
  }
  std::stable_sort(kv_items.begin(), kv_items.end(), [](const BwdItem& a, const BwdItem& b) {
    const int64_t ca = (a.len + kBlk - 1) / kBlk - a.blk, cb = (b.len + kBlk - 1) / kBlk - b.blk;
    return ca > cb;
  });
  std::stable_sort(q_items.begin(), q_items.end(),
                   [](const BwdItem& a, const BwdItem& b) { return a.blk > b.blk; });

  Scratch scr(s);
  BwdParams p{};
  p.q = q.ptr<const uint16_t>();
  p.k = k.ptr<const uint16_t>();
  p.v = v.ptr<const uint16_t>();
  p.out = out.ptr<const uint16_t>();
  p.dout = dout.ptr<const uint16_t>();
  p.q_s0 = q.stride[0];
  p.q_s1 = q.stride[1];
  p.k_s0 = k.stride[0];
  p.k_s1 = k.stride[1];
  p.v_s0 = v.stride[0];
  p.v_s1 = v.stride[1];
  p.o_s0 = out.stride[0];
  p.o_s1 = out.stride[1];
  p.do_s0 = dout.stride[0];
  p.do_s1 = dout.stride[1];
  p.lse = lse.ptr<const float>();
  p.l_s0 = lse.stride[0];
  p.l_s1 = lse.stride[1];
  p.dq = dq.ptr<float>();
  p.dk = dk.ptr<float>();
  p.dv = dv.ptr<float>();
  p.dq_s0 = dq.stride[0];
  p.dq_s1 = dq.stride[1];
  p.dk_s0 = dk.stride[0];
  p.dk_s1 = dk.stride[1];
  p.dv_s0 = dv.stride[0];
  p.dv_s1 = dv.stride[1];
  p.rows = T * Hq;
  p.Hq = int32_t(Hq);
  p.G = int32_t(Hq / Hkv);
  p.D = int32_t(D);
  p.Dp = int32_t(Dp);
  p.sigma = cfg.scale_log2(D);
  p.scale_f = float(cfg.resolved_scale(D));
  p.vec = vec16(q) && vec16(k) && vec16(v) && vec16(dout);
  p.delta = static_cast<float*>(scr.alloc(size_t(T * Hq) * sizeof(float)));
  p.lam = static_cast<float*>(scr.alloc(size_t(T * Hq) * sizeof(float)));

  delta_kernel<<<dim3(unsigned((T * Hq + 7) / 8)), 256, 0, s>>>(p);
  cuda_check(cudaGetLastError(), "kernel launch");

  BwdParams pkv = p, pq = p;
  pkv.items = scr.upload(kv_items);
  pq.items = scr.upload(q_items);
  const dim3 grid_kv(unsigned(kv_items.size()), unsigned(Hkv));
  const dim3 grid_q(unsigned(q_items.size()), unsigned(Hq));
  if (D == 64)
    launch_grads<64, 64>(grid_kv, grid_q, pkv, pq, s);
  else if (Dp <= 64)
    launch_grads<64, 0>(grid_kv, grid_q, pkv, pq, s);
  else if (D == 128)
    launch_grads<128, 128>(grid_kv, grid_q, pkv, pq, s);
  else
    launch_grads<128, 0>(grid_kv, grid_q, pkv, pq, s);
}

}  // namespace lockstep::cuda
