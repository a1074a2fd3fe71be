// Launcher of the CUDA attention backward (docs/contract.md §B.9, §B.11; kernels in
// attention.cuh): the CPU op's argument checks (contract::check_attention_backward,
// Device::kCUDA), the block table planned from the validated host boundaries, then three launches
// on `stream`: δ / λ, dK / dV, dQ. Each output element is one chain in the contract's order inside
// one thread, so no choice made here (grid order, CTA placement) can change a bit. The varlen op
// is the shared one without completions, on kernels compiled without the part walk.
// Which kernels run (the same bits either way: only speed differs):
//   - varlen, head_dim 128, sm_90, q / k / v / dout rows TMA can read (wg_ok): the Hopper kernels
//     of attention_wg.cuh (wgmma + TMA), dK / dV per 128 keys and dQ per 128 rows;
//   - everything else — the shared form (§B.11), D ≠ 128, other GPUs, strides TMA cannot read:
//     the mma.sync kernels of attention.cuh.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "contract/checks.h"
#include "cuda/backward/attention.cuh"
#include "cuda/backward/attention_wg.cuh"
#include "cuda/tensor_map.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
namespace {

using namespace attn_bwd_detail;

void cuda_check(const char* op, cudaError_t e, const char* what) {
  LS_CHECK(e == cudaSuccess, op, what, " failed: ", cudaGetErrorString(e));
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
  const char* op;
  cudaStream_t s = nullptr;
  std::vector<void*> ptrs;
  Scratch(const char* o, cudaStream_t st) : op(o), s(st) {}
  ~Scratch() {
    for (void* p : ptrs) cudaFreeAsync(p, s);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    cuda_check(op, cudaMallocAsync(&p, std::max<size_t>(bytes, 16), s), "cudaMallocAsync");
    ptrs.push_back(p);
    return p;
  }
  void* upload(const std::vector<uint8_t>& v) {
    void* d = alloc(v.size());
    if (!v.empty())
      cuda_check(op, cudaMemcpyAsync(d, v.data(), v.size(), cudaMemcpyHostToDevice, s), "upload");
    return d;
  }
};

// NOTE: one template instance per kernel, so the once-per-process shared-memory attribute is set
// for each of them.
template <auto Kernel>
void launch(const char* op, int smem, dim3 grid, cudaStream_t s, const BwdParams& p) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  LS_CHECK(attr == cudaSuccess, op, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  Kernel<<<grid, kThreads, smem, s>>>(p);
  cuda_check(op, cudaGetLastError(), "kernel launch");
}

// DF: D when it equals DP (the kernels' trip counts become compile-time), else 0.
template <int DP, int DF, bool kShared>
void launch_grads(const char* op, dim3 grid_kv, dim3 grid_q, const BwdParams& pkv,
                  const BwdParams& pq, cudaStream_t s) {
  constexpr int smem = BwdShape<DP>::kSmem;
  constexpr auto dkdv = kShared ? dkdv_shared_kernel<DP, DF> : dkdv_kernel<DP, DF>;
  constexpr auto dq = kShared ? dq_shared_kernel<DP, DF> : dq_kernel<DP, DF>;
  if (grid_kv.x > 0) launch<dkdv>(op, smem, grid_kv, s, pkv);
  if (grid_q.x > 0) launch<dq>(op, smem, grid_q, s, pq);
}
template <bool kShared>
void launch_grads(const char* op, int64_t D, int64_t Dp, dim3 grid_kv, dim3 grid_q,
                  const BwdParams& pkv, const BwdParams& pq, cudaStream_t s) {
  if (D == 64)
    launch_grads<64, 64, kShared>(op, grid_kv, grid_q, pkv, pq, s);
  else if (Dp <= 64)
    launch_grads<64, 0, kShared>(op, grid_kv, grid_q, pkv, pq, s);
  else if (D == 128)
    launch_grads<128, 128, kShared>(op, grid_kv, grid_q, pkv, pq, s);
  else
    launch_grads<128, 0, kShared>(op, grid_kv, grid_q, pkv, pq, s);
}

// One part on the host: packed rows [t0, t0 + n) at positions pos0 … pos0 + n − 1.
struct HostPart {
  int64_t t0, pos0, n;
  BwdPart rows() const { return BwdPart{t0 - pos0, int32_t(pos0), int32_t(pos0 + n)}; }
};

// 64-row tiles of a part's rows in a dkdv walk of key block j0 (PartWalk: from
// max(j0, 64·⌊pos0/64⌋) to the part's end).
int64_t walk_tiles(const BwdPart& pt, int64_t j0) {
  const int64_t first = std::max<int64_t>(j0, pt.pos0 / kBlk * kBlk);
  return pt.pos1 > first ? (pt.pos1 - first + kBlk - 1) / kBlk : 0;
}

// The CTAs of every group (groups[i]: its prompt, then its completions in ascending segment
// order; an unshared sequence is a prompt alone): dK / dV per (part's keys, 64-key block) and
// dQ per (part, 64-row block), by absolute position; the costliest first (scheduling only:
// every CTA owns its outputs). G: query heads per kv head.
struct BwdPlan {
  std::vector<BwdItem> kv, q;
  std::vector<BwdPart> parts;
};
BwdPlan plan_backward(const std::vector<std::vector<HostPart>>& groups, int64_t G) {
  BwdPlan pl;
  for (const std::vector<HostPart>& gr : groups) {
    const BwdPart prompt = gr[0].rows();
    const int64_t Lp = gr[0].n;
    for (const HostPart& hp : gr) {
      if (hp.n == 0) continue;
      const BwdPart pt = hp.rows();
      for (int64_t blk = pt.pos0 / kBlk; blk * kBlk < pt.pos1; ++blk) {
        BwdItem it{};
        it.part = pt;
        it.krow = pt.row0;
        it.krow_lo = prompt.row0;  // a completion's keys below Lp: its prompt's rows
        it.khi = pt.pos1;
        it.ksplit = pt.pos0;
        it.blk = int32_t(blk);
        pl.q.push_back(it);
      }
    }
    // Key blocks of the prompt: per head, its own rows and then every completion's.
    const int32_t pb = int32_t(pl.parts.size());
    for (const HostPart& hp : gr)
      if (hp.n > 0) pl.parts.push_back(hp.rows());
    const int32_t pe = int32_t(pl.parts.size());
    for (int64_t blk = 0; blk * kBlk < Lp; ++blk) {
      BwdItem it{};
      it.part = prompt;
      it.krow = it.krow_lo = prompt.row0;
      it.khi = int32_t(Lp);
      it.blk = int32_t(blk);
      it.pb = pb;
      it.pe = pe;
      int64_t tiles = 0;
      for (int32_t i = pb; i < pe; ++i) tiles += walk_tiles(pl.parts[size_t(i)], blk * kBlk);
      it.nsteps = int32_t(G * tiles);
      pl.kv.push_back(it);
    }
    // Key blocks of each completion: its own rows only (parts pb + 1 …, one each).
    int32_t pi = pb + (Lp > 0 ? 1 : 0);
    for (size_t c = 1; c < gr.size(); ++c) {
      if (gr[c].n == 0) continue;
      const BwdPart pt = gr[c].rows();
      for (int64_t blk = pt.pos0 / kBlk; blk * kBlk < pt.pos1; ++blk) {
        BwdItem it{};
        it.part = pt;
        it.krow = it.krow_lo = pt.row0;
        it.klo = pt.pos0;
        it.khi = pt.pos1;
        it.blk = int32_t(blk);
        it.pb = pi;
        it.pe = pi + 1;
        it.nsteps = int32_t(G * walk_tiles(pt, blk * kBlk));
        pl.kv.push_back(it);
      }
      ++pi;
    }
  }
  std::stable_sort(pl.kv.begin(), pl.kv.end(),
                   [](const BwdItem& a, const BwdItem& b) { return a.nsteps > b.nsteps; });
  std::stable_sort(pl.q.begin(), pl.q.end(),
                   [](const BwdItem& a, const BwdItem& b) { return a.blk > b.blk; });
  return pl;
}

// ------------------------------------------------------------------------------------------------
// The Hopper kernels (attention_wg.cuh).

// [rows, heads, 128] bf16 with the heads of a row adjacent (stride 128), the row stride a multiple
// of 8 elements (16 bytes) and a 16-byte aligned base: one 2-D tensor map [rows, heads·128].
bool wg_rows(const TensorView& t) {
  namespace wg = attn_bwd_wg;
  return t.ndim == 3 && t.shape[2] == wg::kD && t.stride[2] == 1 &&
         (t.shape[1] == 1 || t.stride[1] == wg::kD) && t.stride[0] % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0 && t.shape[0] < (int64_t(1) << 31) - 256;
}
bool wg_ok(int64_t D, const TensorView& q, const TensorView& k, const TensorView& v,
           const TensorView& dout) {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major == 9 && detail::tensor_map_encoder() != nullptr;
  }();
  return sm90 && D == attn_bwd_wg::kD && wg_rows(q) && wg_rows(k) && wg_rows(v) && wg_rows(dout);
}

template <auto Kernel>
void launch_wg(const char* op, int threads, int smem, unsigned grid, cudaStream_t s,
               const CUtensorMap (&tm)[4], const BwdParams& p, const attn_bwd_wg::WgItem* items) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  LS_CHECK(attr == cudaSuccess, op, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  Kernel<<<grid, threads, smem, s>>>(tm[0], tm[1], tm[2], tm[3], p, items);
  cuda_check(op, cudaGetLastError(), "kernel launch");
}

// dK / dV per (sequence, 128 keys) and dQ per (sequence, 128 rows), each over every head (CTA
// item·heads + head), the costliest first (a dK / dV CTA walks the rows from its keys to the end,
// a dQ CTA the keys up to its rows): scheduling only, every CTA owns its outputs.
void run_backward_wg(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& dout, const BwdParams& p, const std::vector<HostPart>& seqs,
                     Scratch& scr, cudaStream_t s) {
  namespace wg = attn_bwd_wg;
  const int64_t Hq = p.Hq, Hkv = Hq / p.G;
  struct Costed {
    int64_t cost;
    wg::WgItem it;
  };
  std::vector<Costed> kv, qi;
  for (const HostPart& sq : seqs) {
    for (int64_t x0 = 0; x0 < sq.n; x0 += wg::kWide) {
      const wg::WgItem it{int32_t(sq.t0), int32_t(sq.n), int32_t(x0), 0};
      kv.push_back({sq.n - x0, it});
      qi.push_back({std::min<int64_t>(x0 + wg::kWide, sq.n), it});
    }
  }
  if (kv.empty()) return;
  auto by_cost = [](const Costed& a, const Costed& b) { return a.cost > b.cost; };
  std::stable_sort(kv.begin(), kv.end(), by_cost);
  std::stable_sort(qi.begin(), qi.end(), by_cost);
  LS_CHECK(qi.size() * size_t(Hq) < (size_t(1) << 31), op, "problem too large for one launch (",
           qi.size() * size_t(Hq), " CTAs)");
  std::vector<uint8_t> blob((kv.size() + qi.size()) * sizeof(wg::WgItem));
  for (size_t i = 0; i < kv.size(); ++i)
    std::memcpy(blob.data() + i * sizeof(wg::WgItem), &kv[i].it, sizeof(wg::WgItem));
  for (size_t i = 0; i < qi.size(); ++i)
    std::memcpy(blob.data() + (kv.size() + i) * sizeof(wg::WgItem), &qi[i].it, sizeof(wg::WgItem));
  const auto* items = static_cast<const wg::WgItem*>(scr.upload(blob));

  // Maps [T, H·128] per tensor: 64-row boxes for the ring's tiles, 128-row boxes for the CTA's own.
  auto encode = [&](CUtensorMap* m, const TensorView& t, int box_rows) {
    return detail::encode_bf16_tensor_map(m, t.ptr<const uint16_t>(), t.shape[0],
                                          t.shape[1] * wg::kD, t.stride[0], box_rows);
  };
  CUtensorMap tkv[4], tq[4];  // q, k, v, dout
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < 4 && r == CUDA_SUCCESS; ++i) {
    const TensorView& t = i == 0 ? q : i == 1 ? k : i == 2 ? v : dout;
    const bool kv_side = i == 1 || i == 2;
    r = encode(&tkv[i], t, kv_side ? wg::kWide : wg::kBlk);
    if (r == CUDA_SUCCESS) r = encode(&tq[i], t, kv_side ? wg::kBlk : wg::kWide);
  }
  LS_CHECK(r == CUDA_SUCCESS, op, "cuTensorMapEncodeTiled failed (", int(r), ")");
  launch_wg<wg::dkdv_wg_kernel>(op, wg::kKvThreads, wg::kKvSmem, unsigned(kv.size() * size_t(Hkv)),
                                s, tkv, p, items);
  launch_wg<wg::dq_wg_kernel>(op, wg::kThreads, wg::kQSmem, unsigned(qi.size() * size_t(Hq)), s, tq,
                              p, items + kv.size());
}

// The three launches over the groups' parts; shared: the kernels' part walk (§B.11), else each
// group is one sequence (§B.9).
void run_backward(const char* op, bool shared, const TensorView& q, const TensorView& k,
                  const TensorView& v, const TensorView& out, const TensorView& lse,
                  const TensorView& dout, const contract::QShape& qs, const AttentionConfig& cfg,
                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                  const std::vector<std::vector<HostPart>>& groups, cudaStream_t s) {
  const int64_t T = qs.N, Hq = qs.Hq, Hkv = k.shape[1], D = qs.D;
  LS_CHECK(D <= 128, op, "argument 'q': head_dim ", D,
           " is not supported by the CUDA backward (16 … 128, multiples of 16)");
  if (T == 0) return;
  int64_t Dp = 1;
  while (Dp < D) Dp *= 2;
  const BwdPlan pl = plan_backward(groups, Hq / Hkv);

  Scratch scr(op, s);
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
  cuda_check(op, cudaGetLastError(), "kernel launch");
  if (!shared && wg_ok(D, q, k, v, dout)) {
    std::vector<HostPart> seqs;
    for (const std::vector<HostPart>& gr : groups) seqs.push_back(gr[0]);
    run_backward_wg(op, q, k, v, dout, p, seqs, scr, s);
    return;
  }

  // The dK / dV items, the dQ items and the parts in ONE upload.
  std::vector<uint8_t> blob;
  auto put = [&](const auto& vec) {
    const size_t off = (blob.size() + 63) & ~size_t(63), bytes = vec.size() * sizeof(vec[0]);
    blob.resize(off + bytes);
    if (bytes > 0) std::memcpy(blob.data() + off, vec.data(), bytes);
    return off;
  };
  const size_t o_kv = put(pl.kv), o_q = put(pl.q), o_parts = put(pl.parts);
  const uint8_t* base = static_cast<const uint8_t*>(scr.upload(blob));
  BwdParams pkv = p, pq = p;
  pkv.items = reinterpret_cast<const BwdItem*>(base + o_kv);
  pkv.parts = reinterpret_cast<const BwdPart*>(base + o_parts);
  pq.items = reinterpret_cast<const BwdItem*>(base + o_q);
  const dim3 grid_kv(unsigned(pl.kv.size()), unsigned(Hkv));
  const dim3 grid_q(unsigned(pl.q.size()), unsigned(Hq));
  if (shared)
    launch_grads<true>(op, D, Dp, grid_kv, grid_q, pkv, pq, s);
  else
    launch_grads<false>(op, D, Dp, grid_kv, grid_q, pkv, pq, s);
}

}  // namespace

void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const PackedSeqs& seqs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               void* stream) {
  const char* op = "cuda::attention_backward_varlen";
  const contract::QShape qs = contract::check_attention_backward(op, Device::kCUDA, q, k, v, out,
                                                                 lse, dout, seqs, cfg, dq, dk, dv);
  std::vector<std::vector<HostPart>> groups;
  for (int64_t b = 0; b < seqs.B(); ++b) {
    const int64_t t0 = seqs.cu()[size_t(b)];
    groups.push_back({HostPart{t0, 0, seqs.cu()[size_t(b + 1)] - t0}});
  }
  run_backward(op, false, q, k, v, out, lse, dout, qs, cfg, dq, dk, dv, groups,
               static_cast<cudaStream_t>(stream));
}

void attention_backward_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               void* stream) {
  const char* op = "cuda::attention_backward_shared";
  const contract::QShape qs = contract::check_attention_backward(
      op, Device::kCUDA, q, k, v, out, lse, dout, segs.segments(), cfg, dq, dk, dv);
  std::vector<std::vector<HostPart>> groups;
  for (int64_t b = 0; b < segs.B(); ++b) {
    if (segs.prompt_of()[size_t(b)] >= 0) continue;
    std::vector<HostPart> parts{HostPart{segs.cu()[size_t(b)], 0, segs.len(b)}};
    for (int64_t c : segs.completions(b))
      parts.push_back(HostPart{segs.cu()[size_t(c)], segs.len(b), segs.len(c)});
    groups.push_back(std::move(parts));
  }
  run_backward(op, true, q, k, v, out, lse, dout, qs, cfg, dq, dk, dv, groups,
               static_cast<cudaStream_t>(stream));
}

}  // namespace lockstep::cuda
