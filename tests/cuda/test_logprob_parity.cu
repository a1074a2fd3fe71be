// GPU parity of the CUDA LogP op and sampling (lockstep::cuda::linear_logprob, _partial, _combine,
// sample; src/cuda/{logprob,sampling}.cu) with the CPU ops (lockstep::cpu::*), bit for bit
// (docs/contract.md §L, §S), memcmp on fresh random data (outputs poisoned with 0xA5 on both
// sides, padding cells of strided outputs compared too):
//   - LogP: V in {77, 1000, 4099, 151936}, vocab_tile 8..256, vocab_segments 1..8, gemm_segments
//     1..8, temperatures 0.7 / 1 / 1.9, logit scales 0.3..3, a NaN row, ignored targets, target
//     V-1, host (i64) and device (i32) targets;
//   - strided h / w / targets / outputs, T > the token block, V > one vocab chunk (chunked GEMM);
//   - invariance on the GPU: a token alone == the same token in the batch;
//   - vocab parallelism: every rank count R | S, partial states == cpu partial states, combine ==
//     cpu linear_logprob (all-padding ranks included);
//   - device targets outside [0, V): logp NaN, lse / entropy unaffected;
//   - negative control: a host fold with the lane tree 4, 2, 1 must differ from the GPU (and the
//     same host fold with the contract's tree 1, 2, 4 must equal it);
//   - sampling: greedy, plain, top-k, top-p, min-p and combinations, tied logits (duplicated W
//     rows), host / device request ids and positions, i32 / i64 strided token ids; ids, logp, lse,
//     entropy == cpu::sample; a row alone == in batch; a NaN row throws naming the row and writes
//     nothing; stress rows for the radix select (all logits equal, 9 exact tie levels, 90% -inf or
//     huge negative logits, a dominant entry with p = 1; top-k / top-p boundaries inside the ties,
//     top-k 2 with top-p, bins past the kernel's shared-memory list at V >= 20011);
//   - the two logits -> tile-state producers (fused GEMM epilogue, unfused GEMM + tile-state
//     kernel) forced on the same inputs, each == cpu (T 1..8201, V 1000 / 4099 / 151936, tau 0.7
//     / 1 / 1.9, NaN / inf rows, a NaN W row, ignored targets, strided h / w / targets / outputs,
//     partial states of every rank and the combine); unaligned strides fall back; auto choice;
//   - argument errors before any launch.
// Fresh seed each run (printed; pass one as argv[1] to repeat). --quick: small sizes (sanitizer).
// --producers: only the fused / unfused producer checks.
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/math.h"
#include "cuda/backward/logprob_plan.h"  // the backward's chunk plan (host)
#include "cuda/logprob_internal.h"       // linear_logprob_with_producer (fused / unfused)
#include "cuda/parity_fixture.h"         // report, DevPool, view, bitwise, expect_error
#include "lockstep/contract.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/sampling.h"

using namespace lockstep;

namespace {

ContractConfig make_cfg(int tile, int segs, int gsegs) {
  ContractConfig c;
  c.vocab_tile = tile;
  c.vocab_segments = segs;
  c.gemm_segments = gsegs;
  return c;
}

// h [T, H], w [V, H] on the host (contiguous) and the device (copies).
struct Problem {
  int64_t T = 0, H = 0, V = 0;
  Tensor h, w;
  DevPool d;
  void* dh = nullptr;
  void* dw = nullptr;
  Problem(int64_t T_, int64_t H_, int64_t V_, float scale)
      : T(T_), H(H_), V(V_), h(DType::kBF16, {T_, H_}), w(DType::kBF16, {V_, H_}) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < T * H; ++i) h.ptr<bf16>()[i] = f32_to_bf16(nd(g_rng));
    for (int64_t i = 0; i < V * H; ++i) w.ptr<bf16>()[i] = f32_to_bf16(scale * nd(g_rng));
  }
  void upload() {
    dh = d.upload(h.data(), size_t(h.nbytes()));
    dw = d.upload(w.data(), size_t(w.nbytes()));
  }
  TensorView dev_h() const { return view(dh, DType::kBF16, {T, H}); }
  TensorView dev_w() const { return view(dw, DType::kBF16, {V, H}); }
};

std::vector<int64_t> random_targets(int64_t T, int64_t V) {
  std::vector<int64_t> t(static_cast<size_t>(T));
  for (auto& x : t) x = int64_t(g_rng() % uint64_t(V));
  t[0] = -1;
  if (T > 1) t[size_t(T - 1)] = V - 1;
  return t;
}

// ---- host fold with a chosen lane tree (negative control and harness check) -------------------

LogprobState tile_state_tree(const float* y, int64_t L, bool wrong) {
  const float ninf = -INFINITY;
  float m8[8], s8[8], w8[8];
  for (int l = 0; l < 8; ++l) m8[l] = ninf, s8[l] = 0.0f, w8[l] = 0.0f;
  for (int64_t j = 0; j < L; j += 8)
    for (int l = 0; l < 8; ++l) m8[l] = y[j + l] > m8[l] ? y[j + l] : m8[l];
  float m = m8[0];
  for (int l = 1; l < 8; ++l) m = m8[l] > m ? m8[l] : m;
  if (m == 0.0f) m = 0.0f;
  for (int64_t j = 0; j < L; j += 8)
    for (int l = 0; l < 8; ++l) {
      const float v = y[j + l];
      if (v == ninf) continue;
      const float d = v - m;
      const float e = ls_expf(d);
      s8[l] = s8[l] + e;
      w8[l] = w8[l] + e * d;
    }
  auto tree = [&](const float* a) {
    return wrong ? ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
                 : ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  };
  return LogprobState{m, tree(s8), tree(w8)};
}

// The (m, s, w) state of every token over the whole vocab from fp32 logits z [T, V], tempered,
// with the chosen lane tree (canonical NaN, as linear_logprob_partial writes it).
std::vector<LogprobState> host_states(const float* z, int64_t T, int64_t V, float tau,
                                      const ContractConfig& cfg, bool wrong) {
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  const int64_t n_tiles = lay.padded / lay.tile;
  std::vector<LogprobState> out(static_cast<size_t>(T));
  std::vector<float> y(static_cast<size_t>(lay.padded));
  std::vector<LogprobState> tiles(static_cast<size_t>(n_tiles)), segs(size_t(lay.segments));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t v = 0; v < lay.padded; ++v) y[size_t(v)] = v < V ? z[t * V + v] / tau : -INFINITY;
    for (int64_t i = 0; i < n_tiles; ++i)
      tiles[size_t(i)] = tile_state_tree(y.data() + i * lay.tile, lay.tile, wrong);
    for (int k = 0; k < lay.segments; ++k) {
      LogprobState acc;
      for (int64_t i = 0; i < lay.tiles_per_segment; ++i)
        acc = logprob_merge(acc, tiles[size_t(k * lay.tiles_per_segment + i)]);
      segs[size_t(k)] = acc;
    }
    LogprobState st = logprob_tree(segs.data(), lay.segments);
    out[size_t(t)] = LogprobState{canonical_f32(st.m), canonical_f32(st.s), canonical_f32(st.w)};
  }
  return out;
}

// ---- LogP parity -------------------------------------------------------------------------------

struct Case {
  int64_t T, H, V;
  int tile, segs, gsegs;
};

void test_logprob_case(const Case& c) {
  const ContractConfig cfg = make_cfg(c.tile, c.segs, c.gsegs);
  const std::vector<float> scales =
      g_quick ? std::vector<float>{1.0f} : std::vector<float>{0.3f, 1.0f, 3.0f};
  for (float scale : scales) {
    Problem pb(c.T, c.H, c.V, scale);
    if (c.T > 1) pb.h.ptr<bf16>()[c.H + 1] = f32_to_bf16(NAN);  // row 1: NaN logits
    pb.upload();
    const std::vector<int64_t> targets = random_targets(c.T, c.V);
    Tensor tg(DType::kI64, {c.T}), tg32(DType::kI32, {c.T});
    for (int64_t t = 0; t < c.T; ++t) {
      tg.ptr<int64_t>()[t] = targets[size_t(t)];
      tg32.ptr<int32_t>()[t] = int32_t(targets[size_t(t)]);
    }
    void* dtg32 = pb.d.upload(tg32.data(), size_t(tg32.nbytes()));
    void* dout = pb.d.alloc(size_t(3 * c.T) * 4);
    float* dlp = static_cast<float*>(dout);
    const TensorView vlp = view(dlp, DType::kF32, {c.T}), vls = view(dlp + c.T, DType::kF32, {c.T}),
                     ven = view(dlp + 2 * c.T, DType::kF32, {c.T});
    int tau_i = 0;
    for (float tau : {1.0f, 0.7f, 1.9f}) {
      Tensor ref(DType::kF32, {3, c.T});
      float* r = ref.ptr<float>();
      cpu::linear_logprob(pb.h.view(), pb.w.view(), tg.view(), LogprobParams{tau}, cfg,
                          view(r, DType::kF32, {c.T}, {}, Device::kCPU),
                          view(r + c.T, DType::kF32, {c.T}, {}, Device::kCPU),
                          view(r + 2 * c.T, DType::kF32, {c.T}, {}, Device::kCPU));
      CK(cudaMemset(dout, 0xA5, size_t(3 * c.T) * 4));
      const bool host_targets = (tau_i++ % 2) == 0;
      cuda::linear_logprob(pb.dev_h(), pb.dev_w(),
                           host_targets ? tg.view() : view(dtg32, DType::kI32, {c.T}),
                           LogprobParams{tau}, cfg, vlp, vls, ven);
      char tag[192];
      std::snprintf(tag, sizeof tag,
                    "linear_logprob %s T=%lld H=%lld V=%lld tau=%g scale=%g %s targets",
                    cfg.to_string().c_str(), (long long)c.T, (long long)c.H, (long long)c.V,
                    double(tau), double(scale), host_targets ? "host i64" : "device i32");
      bitwise(std::string(tag) + " (logp, lse, entropy)",
              download(dout, size_t(3 * c.T) * 4).data(), r, size_t(3 * c.T), 4);
    }
    if (scale == 1.0f) {
      // Harness check + negative control on the GPU's whole-vocab state (m, s, w) at tau = 1,
      // from linear_logprob_partial with one rank owning every segment.
      void* dst = pb.d.alloc(size_t(c.T) * 16);
      cuda::linear_logprob_partial(pb.dev_h(), pb.dev_w(), tg.view(), LogprobParams{1.0f}, cfg,
                                   LogprobShard{c.V, 0, c.segs}, view(dst, DType::kF32, {c.T, 4}));
      const std::vector<uint8_t> g = download(dst, size_t(c.T) * 16);
      const float* gs = reinterpret_cast<const float*>(g.data());
      Tensor z(DType::kF32, {c.T, c.V});
      cpu::gemm_bf16_nt(pb.h.view(), pb.w.view(), logprob_logits_gemm(cfg), z.view());
      {  // the logits producer alone (diagnoses a GEMM mismatch apart from the LogP kernels)
        void* dz = pb.d.alloc(size_t(z.nbytes()));
        cuda::gemm_bf16_nt(pb.dev_h(), pb.dev_w(), nullptr, logprob_logits_gemm(cfg),
                           view(dz, DType::kF32, {c.T, c.V}));
        bitwise("cuda::gemm_bf16_nt logits == cpu (V=" + std::to_string(c.V) + ")",
                download(dz, size_t(z.nbytes())).data(), z.data(), size_t(c.T * c.V), 4);
      }
      const std::vector<LogprobState> right =
          host_states(z.ptr<float>(), c.T, c.V, 1.0f, cfg, false);
      const std::vector<LogprobState> wrong =
          host_states(z.ptr<float>(), c.T, c.V, 1.0f, cfg, true);
      int64_t right_bad = 0, differ = 0;
      for (int64_t t = 0; t < c.T; ++t) {
        right_bad += std::memcmp(gs + 4 * t, &right[size_t(t)], 12) != 0;
        differ += std::memcmp(gs + 4 * t, &wrong[size_t(t)], 12) != 0;
      }
      report(right_bad == 0, "host fold with the contract's lane tree == GPU state (m, s, w) (V=" +
                                 std::to_string(c.V) + ")");
      if (right_bad)
        std::printf("  %lld of %lld tokens differ\n", (long long)right_bad, (long long)c.T);
      std::printf("negative control (lane tree 4,2,1) V=%lld: %lld of %lld token states differ\n",
                  (long long)c.V, (long long)differ, (long long)c.T);
      if (c.T >= 16)
        report(differ > 0, "negative control sees the lane tree (V=" + std::to_string(c.V) + ")");
    }
  }
}

// Strided views, several token blocks, poisoned gaps; device targets out of range.
void test_logprob_strided() {
  const int64_t T = g_quick ? 19 : 1100, H = 40, V = 4099, lh = H + 3, lw = H + 8;  // > 1 block
  const ContractConfig cfg = make_cfg(24, 2, 2);
  Tensor hb(DType::kBF16, {T, lh}), wb(DType::kBF16, {V, lw});
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < T * lh; ++i) hb.ptr<bf16>()[i] = f32_to_bf16(nd(g_rng));
  for (int64_t i = 0; i < V * lw; ++i) wb.ptr<bf16>()[i] = f32_to_bf16(nd(g_rng));
  std::vector<int64_t> targets = random_targets(T, V);
  targets[0] = 5;  // ignore_index is -7 here
  Tensor tg(DType::kI64, {T * 3});
  for (int64_t t = 0; t < T; ++t) tg.ptr<int64_t>()[t * 3] = targets[size_t(t)];
  const TensorView hh = view(hb.data(), DType::kBF16, {T, H}, {lh, 1}, Device::kCPU);
  const TensorView hw = view(wb.data(), DType::kBF16, {V, H}, {lw, 1}, Device::kCPU);
  const TensorView ht = view(tg.data(), DType::kI64, {T}, {3}, Device::kCPU);
  Tensor ref(DType::kF32, {3, 2 * T});
  std::memset(ref.data(), 0xA5, size_t(ref.nbytes()));
  float* r = ref.ptr<float>();
  const LogprobParams prm{0.8f, -7};
  auto outv = [&](float* base, int i, Device dev) {
    return view(base + i * 2 * T, DType::kF32, {T}, {2}, dev);
  };
  DevPool d;
  void* dh = d.upload(hb.data(), size_t(hb.nbytes()));
  void* dw = d.upload(wb.data(), size_t(wb.nbytes()));
  void* dt = d.upload(tg.data(), size_t(tg.nbytes()));
  void* dout = d.alloc(size_t(ref.nbytes()));
  float* o = static_cast<float*>(dout);
  const TensorView vh = view(dh, DType::kBF16, {T, H}, {lh, 1});
  const TensorView vw = view(dw, DType::kBF16, {V, H}, {lw, 1});
  const TensorView vt = view(dt, DType::kI64, {T}, {3});
  // Ignored targets with ignore_index -7.
  Tensor tg2(DType::kI64, {T * 3});
  std::memcpy(tg2.data(), tg.data(), size_t(tg.nbytes()));
  tg2.ptr<int64_t>()[0] = -7;
  const TensorView ht2 = view(tg2.data(), DType::kI64, {T}, {3}, Device::kCPU);
  cpu::linear_logprob(hh, hw, ht2, prm, cfg, outv(r, 0, Device::kCPU), outv(r, 1, Device::kCPU),
                      outv(r, 2, Device::kCPU));
  cuda::linear_logprob(vh, vw, ht2, prm, cfg, outv(o, 0, Device::kCUDA), outv(o, 1, Device::kCUDA),
                       outv(o, 2, Device::kCUDA));
  bitwise("linear_logprob strided h/w/targets/outputs, T=" + std::to_string(T) +
              " (gaps untouched, ignore_index -7)",
          download(dout, size_t(ref.nbytes())).data(), r, size_t(6 * T), 4);

  // Invariance: tokens alone == in the batch.
  const std::vector<uint8_t> batch = download(dout, size_t(ref.nbytes()));
  const float* bf = reinterpret_cast<const float*>(batch.data());
  for (int64_t t : {int64_t(0), int64_t(1), T / 2, T - 1}) {
    void* d1 = d.alloc(12);
    float* o1 = static_cast<float*>(d1);
    cuda::linear_logprob(vh.rows(t, t + 1), vw, ht2.rows(t, t + 1), prm, cfg,
                         view(o1, DType::kF32, {1}), view(o1 + 1, DType::kF32, {1}),
                         view(o1 + 2, DType::kF32, {1}));
    const std::vector<uint8_t> g = download(d1, 12);
    const float want[3] = {bf[2 * t], bf[2 * T + 2 * t], bf[4 * T + 2 * t]};
    bitwise("linear_logprob token " + std::to_string(t) + " alone == in batch", g.data(), want, 3,
            4);
  }

  // Device targets outside [0, V): logp NaN, lse / entropy as with a valid target.
  Tensor bad(DType::kI64, {T * 3});
  std::memcpy(bad.data(), tg.data(), size_t(tg.nbytes()));
  bad.ptr<int64_t>()[3] = V;
  if (T > 2) bad.ptr<int64_t>()[6] = -3;
  void* db = d.upload(bad.data(), size_t(bad.nbytes()));
  CK(cudaMemset(dout, 0xA5, size_t(ref.nbytes())));
  cuda::linear_logprob(vh, vw, view(db, DType::kI64, {T}, {3}), prm, cfg, outv(o, 0, Device::kCUDA),
                       outv(o, 1, Device::kCUDA), outv(o, 2, Device::kCUDA));
  cpu::linear_logprob(hh, hw, ht, prm, cfg, outv(r, 0, Device::kCPU), outv(r, 1, Device::kCPU),
                      outv(r, 2, Device::kCPU));
  r[2 * 1] = f32_from_bits(kCanonicalNanF32);
  if (T > 2) r[2 * 2] = f32_from_bits(kCanonicalNanF32);
  bitwise("linear_logprob device targets outside [0, V): logp NaN, rest unchanged",
          download(dout, size_t(ref.nbytes())).data(), r, size_t(6 * T), 4);
}

// V larger than one vocab chunk of the launch plan (the GEMM runs chunk by chunk).
void test_logprob_chunked() {
  const int64_t T = g_quick ? 3 : 9, H = 16, V = 300000;
  const ContractConfig cfg = make_cfg(256, 2, 1);
  std::printf("%s\n", cuda::logprob_launch_plan(cfg, H, V).c_str());
  Problem pb(T, H, V, 2.0f);
  pb.upload();
  const std::vector<int64_t> targets = random_targets(T, V);
  Tensor tg(DType::kI64, {T});
  std::memcpy(tg.data(), targets.data(), size_t(T) * 8);
  Tensor ref(DType::kF32, {3, T});
  float* r = ref.ptr<float>();
  cpu::linear_logprob(pb.h.view(), pb.w.view(), tg.view(), LogprobParams{1.3f}, cfg,
                      view(r, DType::kF32, {T}, {}, Device::kCPU),
                      view(r + T, DType::kF32, {T}, {}, Device::kCPU),
                      view(r + 2 * T, DType::kF32, {T}, {}, Device::kCPU));
  void* dout = pb.d.alloc(size_t(3 * T) * 4);
  float* o = static_cast<float*>(dout);
  cuda::linear_logprob(pb.dev_h(), pb.dev_w(), tg.view(), LogprobParams{1.3f}, cfg,
                       view(o, DType::kF32, {T}), view(o + T, DType::kF32, {T}),
                       view(o + 2 * T, DType::kF32, {T}));
  bitwise("linear_logprob V=300000 (several vocab chunks)",
          download(dout, size_t(3 * T) * 4).data(), r, size_t(3 * T), 4);
}

// Vocab parallelism: partial states per rank and the combine, every R | S.
void test_logprob_tp(const Case& c) {
  const ContractConfig cfg = make_cfg(c.tile, c.segs, c.gsegs);
  Problem pb(c.T, c.H, c.V, 1.0f);
  pb.upload();
  const std::vector<int64_t> targets = random_targets(c.T, c.V);
  Tensor tg(DType::kI64, {c.T});
  std::memcpy(tg.data(), targets.data(), size_t(c.T) * 8);
  const LogprobParams prm{0.9f};
  Tensor ref(DType::kF32, {3, c.T});
  float* r = ref.ptr<float>();
  cpu::linear_logprob(pb.h.view(), pb.w.view(), tg.view(), prm, cfg,
                      view(r, DType::kF32, {c.T}, {}, Device::kCPU),
                      view(r + c.T, DType::kF32, {c.T}, {}, Device::kCPU),
                      view(r + 2 * c.T, DType::kF32, {c.T}, {}, Device::kCPU));
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, c.V);
  void* dtg = pb.d.upload(tg.data(), size_t(tg.nbytes()));
  for (int R = 1; R <= c.segs; R *= 2) {
    const int per = c.segs / R;
    Tensor hstates(DType::kF32, {R, c.T, 4});
    void* dstates = pb.d.alloc(size_t(hstates.nbytes()));
    bool parts_ok = true;
    for (int rk = 0; rk < R; ++rk) {
      const LogprobShard shard{c.V, rk * per, per};
      const int64_t v0 = std::min(c.V, int64_t(rk * per) * lay.segment_len);
      const int64_t v1 = std::min(c.V, int64_t((rk + 1) * per) * lay.segment_len);
      float* hs = hstates.ptr<float>() + rk * c.T * 4;
      cpu::linear_logprob_partial(pb.h.view(), pb.w.view().rows(v0, v1), tg.view(), prm, cfg, shard,
                                  view(hs, DType::kF32, {c.T, 4}, {}, Device::kCPU));
      float* ds = static_cast<float*>(dstates) + rk * c.T * 4;
      cuda::linear_logprob_partial(pb.dev_h(), pb.dev_w().rows(v0, v1),
                                   rk % 2 ? tg.view() : view(dtg, DType::kI64, {c.T}), prm, cfg,
                                   shard, view(ds, DType::kF32, {c.T, 4}));
      const std::vector<uint8_t> g = download(ds, size_t(c.T) * 16);
      parts_ok = parts_ok && bitwise("partial state R=" + std::to_string(R) + " rank " +
                                         std::to_string(rk) + " rows [" + std::to_string(v0) +
                                         ", " + std::to_string(v1) + ") V=" + std::to_string(c.V),
                                     g.data(), hs, size_t(c.T * 4), 4);
    }
    void* dout = pb.d.alloc(size_t(3 * c.T) * 4);
    float* o = static_cast<float*>(dout);
    cuda::linear_logprob_combine(view(dstates, DType::kF32, {R, c.T, 4}), tg.view(), prm, cfg, c.V,
                                 view(o, DType::kF32, {c.T}), view(o + c.T, DType::kF32, {c.T}),
                                 view(o + 2 * c.T, DType::kF32, {c.T}));
    bitwise("combine R=" + std::to_string(R) + " of " + cfg.to_string() +
                " V=" + std::to_string(c.V) + " == cpu linear_logprob",
            download(dout, size_t(3 * c.T) * 4).data(), r, size_t(3 * c.T), 4);
  }
}

// ---- fused vs unfused producer ----------------------------------------------------------------

using cuda::detail::LogprobProducer;

// Runs `fn` (an internal entry called with the producer option `p`; it returns the producer that
// ran); checks that `p` actually ran (want_ran) or that the launcher fell back to the unfused one.
void with_producer(LogprobProducer p, LogprobProducer want_ran, const std::string& tag,
                   const std::function<LogprobProducer(LogprobProducer)>& fn) {
  const LogprobProducer ran = fn(p);
  report(ran == want_ran, tag + ": producer ran = " + cuda::detail::logprob_producer_name(ran));
  if (ran != want_ran) std::printf("  wanted %s\n", cuda::detail::logprob_producer_name(want_ran));
}

struct ProdCase {
  int64_t T, H, V;
  int segs;
  int64_t lh, lw;  // row strides of h and w (>= H)
  bool fusable;    // the fused producer can take it (alignment / strides)
};

// Both producers on the same inputs, each memcmp'd against cpu::linear_logprob: NaN rows (h row
// and, for one case, a W row), ignored targets, host i64 / device i32 strided targets, strided
// outputs, temperatures 0.7 / 1 / 1.9; then (segs > 1) the vocab-parallel partial states of every
// rank count and the combine, through both producers.
void test_producers_case(const ProdCase& c, bool nan_w_row) {
  const ContractConfig cfg = make_cfg(256, c.segs, 1);
  const int64_t T = c.T, H = c.H, V = c.V;
  Tensor hb(DType::kBF16, {T, c.lh}), wb(DType::kBF16, {V, c.lw});
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float wscale = T % 2 ? 0.5f : 2.0f;
  for (int64_t i = 0; i < T * c.lh; ++i) hb.ptr<bf16>()[i] = f32_to_bf16(nd(g_rng));
  for (int64_t i = 0; i < V * c.lw; ++i) wb.ptr<bf16>()[i] = f32_to_bf16(wscale * nd(g_rng));
  if (T > 2) hb.ptr<bf16>()[2 * c.lh + H / 2] = f32_to_bf16(NAN);        // row 2: NaN logits
  if (T > 4) hb.ptr<bf16>()[4 * c.lh] = f32_to_bf16(INFINITY);           // row 4: inf / NaN logits
  if (nan_w_row) wb.ptr<bf16>()[(V / 2) * c.lw + 1] = f32_to_bf16(NAN);  // poisons every token
  std::vector<int64_t> targets = random_targets(T, V);
  for (int64_t t = 3; t < T; t += 7) targets[size_t(t)] = -1;  // ignored
  if (T > 5) targets[5] = 0;
  Tensor tg(DType::kI64, {T}), tg32(DType::kI32, {2 * T});
  for (int64_t t = 0; t < T; ++t) {
    tg.ptr<int64_t>()[t] = targets[size_t(t)];
    tg32.ptr<int32_t>()[2 * t] = int32_t(targets[size_t(t)]);
  }
  const TensorView hh = view(hb.data(), DType::kBF16, {T, H}, {c.lh, 1}, Device::kCPU);
  const TensorView hw = view(wb.data(), DType::kBF16, {V, H}, {c.lw, 1}, Device::kCPU);
  DevPool d;
  void* dh = d.upload(hb.data(), size_t(hb.nbytes()));
  void* dw = d.upload(wb.data(), size_t(wb.nbytes()));
  void* dtg32 = d.upload(tg32.data(), size_t(tg32.nbytes()));
  const TensorView vh = view(dh, DType::kBF16, {T, H}, {c.lh, 1});
  const TensorView vw = view(dw, DType::kBF16, {V, H}, {c.lw, 1});
  void* dout = d.alloc(size_t(6 * T) * 4);  // outputs with stride 2
  float* o = static_cast<float*>(dout);
  auto outv = [&](float* base, int i, Device dev) {
    return view(base + i * 2 * T, DType::kF32, {T}, {2}, dev);
  };
  char tagc[256];
  std::snprintf(tagc, sizeof tagc, "%s T=%lld H=%lld V=%lld lh=%lld lw=%lld%s",
                cfg.to_string().c_str(), (long long)T, (long long)H, (long long)V, (long long)c.lh,
                (long long)c.lw, nan_w_row ? " NaN W row" : "");
  const std::string tag = tagc;
  const LogprobProducer fused_ran = c.fusable ? LogprobProducer::kFused : LogprobProducer::kUnfused;
  int tau_i = 0;
  for (float tau : {0.7f, 1.0f, 1.9f}) {
    Tensor ref(DType::kF32, {6 * T});
    std::memset(ref.data(), 0xA5, size_t(ref.nbytes()));
    float* r = ref.ptr<float>();
    cpu::linear_logprob(hh, hw, tg.view(), LogprobParams{tau}, cfg, outv(r, 0, Device::kCPU),
                        outv(r, 1, Device::kCPU), outv(r, 2, Device::kCPU));
    const bool host_t = (tau_i++ % 2) == 0;
    const TensorView tv = host_t ? tg.view() : view(dtg32, DType::kI32, {T}, {2});
    for (LogprobProducer p : {LogprobProducer::kFused, LogprobProducer::kUnfused}) {
      const std::string t2 = std::string(p == LogprobProducer::kFused ? "FUSED " : "UNFUSED ") +
                             tag + " tau=" + std::to_string(tau) +
                             (host_t ? " host i64 targets" : " device i32 targets");
      CK(cudaMemset(dout, 0xA5, size_t(6 * T) * 4));
      with_producer(p, p == LogprobProducer::kFused ? fused_ran : LogprobProducer::kUnfused, t2,
                    [&](LogprobProducer q) {
                      return cuda::detail::linear_logprob_with_producer(
                          vh, vw, tv, LogprobParams{tau}, cfg, outv(o, 0, Device::kCUDA),
                          outv(o, 1, Device::kCUDA), outv(o, 2, Device::kCUDA), q);
                    });
      bitwise(t2 + " == cpu (logp, lse, entropy, gaps)", download(dout, size_t(6 * T) * 4).data(),
              r, size_t(6 * T), 4);
    }
  }
  if (c.segs == 1) return;
  // Vocab parallelism through both producers.
  const LogprobParams prm{0.9f};
  Tensor ref(DType::kF32, {3 * T});
  float* r = ref.ptr<float>();
  cpu::linear_logprob(hh, hw, tg.view(), prm, cfg, view(r, DType::kF32, {T}, {}, Device::kCPU),
                      view(r + T, DType::kF32, {T}, {}, Device::kCPU),
                      view(r + 2 * T, DType::kF32, {T}, {}, Device::kCPU));
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  for (int R = 2; R <= c.segs; R *= 4) {  // R = 2 and 8 (segs 8) / 2 (segs 2, 4)
    const int per = c.segs / R;
    Tensor hs(DType::kF32, {R, T, 4});
    void* dstates = d.alloc(size_t(hs.nbytes()));
    for (int rk = 0; rk < R; ++rk) {
      const LogprobShard shard{V, rk * per, per};
      const int64_t v0 = std::min(V, int64_t(rk * per) * lay.segment_len);
      const int64_t v1 = std::min(V, int64_t((rk + 1) * per) * lay.segment_len);
      float* hsr = hs.ptr<float>() + rk * T * 4;
      cpu::linear_logprob_partial(hh, hw.rows(v0, v1), tg.view(), prm, cfg, shard,
                                  view(hsr, DType::kF32, {T, 4}, {}, Device::kCPU));
      float* ds = static_cast<float*>(dstates) + rk * T * 4;
      for (LogprobProducer p : {LogprobProducer::kFused, LogprobProducer::kUnfused}) {
        const std::string t2 = std::string(p == LogprobProducer::kFused ? "FUSED " : "UNFUSED ") +
                               "partial " + tag + " R=" + std::to_string(R) + " rank " +
                               std::to_string(rk) + " rows [" + std::to_string(v0) + ", " +
                               std::to_string(v1) + ")";
        // An all-padding rank has no w rows: always the unfused (empty) path.
        const LogprobProducer want =
            (p == LogprobProducer::kFused && v1 > v0) ? fused_ran : LogprobProducer::kUnfused;
        CK(cudaMemset(ds, 0xA5, size_t(T) * 16));
        with_producer(p, want, t2, [&](LogprobProducer q) {
          return cuda::detail::linear_logprob_partial_with_producer(
              vh, vw.rows(v0, v1), rk % 2 ? tg.view() : view(dtg32, DType::kI32, {T}, {2}), prm,
              cfg, shard, view(ds, DType::kF32, {T, 4}), q);
        });
        bitwise(t2 + " == cpu partial state", download(ds, size_t(T) * 16).data(), hsr,
                size_t(T * 4), 4);
      }
    }
    // The states now hold the unfused producer's values, which equal the fused ones (checked).
    void* dc = d.alloc(size_t(3 * T) * 4);
    float* oc = static_cast<float*>(dc);
    cuda::linear_logprob_combine(view(dstates, DType::kF32, {R, T, 4}), tg.view(), prm, cfg, V,
                                 view(oc, DType::kF32, {T}), view(oc + T, DType::kF32, {T}),
                                 view(oc + 2 * T, DType::kF32, {T}));
    bitwise("combine R=" + std::to_string(R) + " " + tag + " == cpu linear_logprob",
            download(dc, size_t(3 * T) * 4).data(), r, size_t(3 * T), 4);
  }
}

void test_producers() {
  // H multiple of 8 and strides multiple of 8: the fused kernel takes it; H = 100 / lh = H + 3:
  // the launcher must fall back (and still match).
  std::vector<ProdCase> cases = {
      {67, 64, 151936, 1, 64, 64, true}, {3, 64, 151936, 8, 72, 64, true},
      {1, 16, 1000, 8, 16, 16, true},    {129, 40, 1000, 2, 48, 56, true},
      {300, 48, 4099, 4, 48, 48, true},  {37, 100, 4099, 1, 100, 100, false},
      {45, 32, 4099, 2, 35, 32, false},  {131, 64, 1000, 1, 64, 64, true},
  };
  if (g_quick) cases = {{19, 32, 4099, 2, 32, 40, true}, {5, 16, 1000, 8, 16, 16, true}};
  for (const ProdCase& c : cases) test_producers_case(c, false);
  test_producers_case(
      g_quick ? ProdCase{7, 16, 1000, 1, 16, 16, true} : ProdCase{70, 32, 4099, 1, 32, 32, true},
      true);
  if (!g_quick) {
    // Two fused token blocks (the second one short).
    const ContractConfig cfg = make_cfg(256, 1, 1);
    const int64_t nt = logprob_vocab_layout(cfg, 1000).padded / 256;
    const int64_t tb = cuda::detail::logprob_fused_plan(nt, 256).token_block;
    test_producers_case({tb + 9, 16, 1000, 1, 16, 16, true}, false);
  }
  // Auto choice: T > 64 with the default settings runs fused, T <= 64 unfused.
  {
    const ContractConfig cfg;
    Problem pb(65, 16, 300, 1.0f);
    pb.upload();
    Tensor tg(DType::kI64, {65});
    for (int64_t t = 0; t < 65; ++t) tg.ptr<int64_t>()[t] = t;
    void* dout = pb.d.alloc(65 * 12);
    float* o = static_cast<float*>(dout);
    for (int64_t T : {int64_t(65), int64_t(64)}) {
      const LogprobProducer ran = cuda::detail::linear_logprob_with_producer(
          pb.dev_h().rows(0, T), pb.dev_w(), tg.view().rows(0, T), {}, cfg,
          view(o, DType::kF32, {T}), view(o + 65, DType::kF32, {T}),
          view(o + 130, DType::kF32, {T}), LogprobProducer::kAuto);
      const LogprobProducer want = T > 64 ? LogprobProducer::kFused : LogprobProducer::kUnfused;
      report(ran == want, "auto producer at T=" + std::to_string(T) + " is " +
                              cuda::detail::logprob_producer_name(want));
    }
  }
}

// The backward's chunk plan (host only; the bits never depend on it): which token orders read
// every chunk's rows in place, and that those plans reserve no gather buffers and give the bytes
// to wider vocab slices within the same workspace budget.
void test_backward_plan_rows() {
  using cuda::detail::logprob_rows_in_place;
  auto order = [](std::vector<TokenSeq> seqs, int64_t T) {
    return TokenOrder::make("test_backward_plan_rows", seqs, T);
  };
  report(logprob_rows_in_place(order({{0, 0, 8192}}, 8192), 8192), "one sequence: in place");
  report(logprob_rows_in_place(order({{0, 0, 1000}, {1, 1000, 37}, {2, 1037, 7155}}, 8192), 8192),
         "sequences packed in step order (odd lengths): in place");
  report(logprob_rows_in_place(order({{0, 0, 100}}, 130), 130),
         "uncovered rows after the last sequence: in place");
  report(!logprob_rows_in_place(order({{1, 0, 100}, {0, 100, 100}}, 200), 200),
         "step order not row order: gathered");
  report(!logprob_rows_in_place(order({{0, 0, 100}, {1, 130, 70}}, 200), 200),
         "uncovered rows between sequences: gathered");
  const LogprobVocabLayout lay = logprob_vocab_layout(ContractConfig{}, 151936);
  using cuda::detail::logprob_backward_plan;
  const auto gathered = logprob_backward_plan(lay, 4096, 8192);
  const auto in_place = logprob_backward_plan(lay, 4096, 8192, {}, true);
  report(in_place.gather_bytes == 0 && gathered.gather_bytes > 0,
         "in-place plan reserves no gather buffers");
  report(in_place.slice > gathered.slice &&
             in_place.total_bytes() <= cuda::detail::kLogprobBwdWorkspaceBudget,
         "in-place plan: wider vocab slice (" + std::to_string(in_place.slice) + " vs " +
             std::to_string(gathered.slice) + ") within the workspace budget");
}

void test_logprob_errors() {
  const ContractConfig cfg = make_cfg(8, 2, 1);
  const int64_t T = 3, H = 16, V = 30;
  Problem pb(T, H, V, 1.0f);
  pb.upload();
  Tensor tg(DType::kI64, {T});
  const int64_t tv[] = {0, 30, 2};
  std::memcpy(tg.data(), tv, sizeof tv);
  Tensor ok_tg(DType::kI64, {T});
  const int64_t ov[] = {0, 1, 2};
  std::memcpy(ok_tg.data(), ov, sizeof ov);
  void* dout = pb.d.alloc(64);
  float* o = static_cast<float*>(dout);
  const TensorView lp = view(o, DType::kF32, {T}), ls = view(o + 4, DType::kF32, {T}),
                   en = view(o + 8, DType::kF32, {T});
  auto call = [&](const TensorView& h, const TensorView& w, const TensorView& t,
                  const LogprobParams& p,
                  const ContractConfig& c) { cuda::linear_logprob(h, w, t, p, c, lp, ls, en); };
  expect_error(
      "h on the host", [&] { call(pb.h.view(), pb.dev_w(), ok_tg.view(), {}, cfg); },
      "expected device cuda");
  expect_error(
      "host target out of range", [&] { call(pb.dev_h(), pb.dev_w(), tg.view(), {}, cfg); },
      "targets[1] = 30 is outside [0, 30) and is not ignore_index (-1)");
  expect_error(
      "temperature 0",
      [&] { call(pb.dev_h(), pb.dev_w(), ok_tg.view(), LogprobParams{0.0f}, cfg); }, "temperature");
  expect_error(
      "ignore_index >= 0",
      [&] {
        call(pb.dev_h(), pb.dev_w(), ok_tg.view(), LogprobParams{1.0f, 3}, cfg);
      },
      "ignore_index");
  expect_error(
      "w hidden mismatch",
      [&] {
        call(pb.dev_h(), view(pb.dw, DType::kBF16, {V, H - 1}), ok_tg.view(), {}, cfg);
      },
      "'w'");
  expect_error(
      "V = 0",
      [&] {
        call(pb.dev_h(), view(pb.dw, DType::kBF16, {0, H}), ok_tg.view(), {}, cfg);
      },
      "vocab size");
  expect_error(
      "bad vocab_tile", [&] { call(pb.dev_h(), pb.dev_w(), ok_tg.view(), {}, make_cfg(7, 2, 1)); },
      "vocab_tile");
  expect_error(
      "lse dtype",
      [&] {
        cuda::linear_logprob(pb.dev_h(), pb.dev_w(), ok_tg.view(), {}, cfg, lp,
                             view(o + 4, DType::kI32, {T}), en);
      },
      "'lse'");
  expect_error(
      "targets shape", [&] { call(pb.dev_h(), pb.dev_w(), ok_tg.view().rows(0, 2), {}, cfg); },
      "'targets'");
  void* dst = pb.d.alloc(size_t(2 * T * 4) * 4);
  expect_error(
      "partial shard not an aligned subtree",
      [&] {
        cuda::linear_logprob_partial(pb.dev_h(), pb.dev_w(), ok_tg.view(), {}, make_cfg(8, 4, 1),
                                     LogprobShard{V, 1, 2}, view(dst, DType::kF32, {T, 4}));
      },
      "aligned power-of-two subtree");
  expect_error(
      "partial w_shard rows",
      [&] {
        cuda::linear_logprob_partial(pb.dev_h(), pb.dev_w(), ok_tg.view(), {}, cfg,
                                     LogprobShard{V, 0, 1}, view(dst, DType::kF32, {T, 4}));
      },
      "'w_shard'");
  expect_error(
      "partial state shape",
      [&] {
        cuda::linear_logprob_partial(pb.dev_h(), pb.dev_w(), ok_tg.view(), {}, cfg,
                                     LogprobShard{V, 0, 2}, view(dst, DType::kF32, {T, 3}));
      },
      "'state'");
  expect_error(
      "combine rank count 3",
      [&] {
        cuda::linear_logprob_combine(view(dst, DType::kF32, {3, 1, 4}), ok_tg.view().rows(0, 1), {},
                                     make_cfg(8, 4, 1), V, lp.rows(0, 1), ls.rows(0, 1),
                                     en.rows(0, 1));
      },
      "rank count");
  // T = 0: a valid no-op.
  cuda::linear_logprob(view(pb.dh, DType::kBF16, {0, H}), pb.dev_w(), ok_tg.view().rows(0, 0), {},
                       cfg, lp.rows(0, 0), ls.rows(0, 0), en.rows(0, 0));
  CK(cudaDeviceSynchronize());
  report(true, "linear_logprob T = 0 no-op");
}

// ---- sampling ----------------------------------------------------------------------------------

SamplingParams random_params(int64_t V) {
  SamplingParams p;
  p.seed = g_rng();
  const float temps[] = {0.0f, 0.6f, 1.0f, 1.7f};
  p.temperature = temps[g_rng() % 4];
  const int64_t ks[] = {0, 0, 1, 5, 50, V - 1, V, V + 3};
  const float ps[] = {1.0f, 1.0f, 0.9f, 0.5f, 0.1f, 1e-6f};
  const float ms[] = {0.0f, 0.0f, 0.05f, 0.5f, 1.0f};
  p.top_k = std::max<int64_t>(0, ks[g_rng() % 8]);
  p.top_p = ps[g_rng() % 6];
  p.min_p = ms[g_rng() % 5];
  return p;
}

// Runs cpu::sample and cuda::sample on the same rows and compares everything.
void check_sample(const std::string& tag, Problem& pb, const ContractConfig& cfg,
                  const std::vector<SamplingParams>& ps, bool host_meta, bool ids32) {
  const int64_t T = pb.T;
  Tensor rid(DType::kI64, {T}), pos(DType::kI32, {2 * T});
  for (int64_t t = 0; t < T; ++t) {
    rid.ptr<int64_t>()[t] = int64_t(g_rng());
    pos.ptr<int32_t>()[2 * t] = int32_t(g_rng() % 100000);
  }
  const TensorView hpos = view(pos.data(), DType::kI32, {T}, {2}, Device::kCPU);
  Tensor ids(DType::kI64, {T}), out(DType::kF32, {3, T});
  float* o = out.ptr<float>();
  cpu::sample(pb.h.view(), pb.w.view(), ps, rid.view(), hpos, cfg, ids.view(),
              view(o, DType::kF32, {T}, {}, Device::kCPU),
              view(o + T, DType::kF32, {T}, {}, Device::kCPU),
              view(o + 2 * T, DType::kF32, {T}, {}, Device::kCPU));
  DevPool d;
  void* drid = d.upload(rid.data(), size_t(rid.nbytes()));
  void* dpos = d.upload(pos.data(), size_t(pos.nbytes()));
  void* dids = d.alloc(size_t(2 * T) * 8);
  void* dout = d.alloc(size_t(3 * T) * 4);
  float* go = static_cast<float*>(dout);
  const TensorView vids = ids32 ? view(dids, DType::kI32, {T}, {2}) : view(dids, DType::kI64, {T});
  cuda::sample(pb.dev_h(), pb.dev_w(), ps, host_meta ? rid.view() : view(drid, DType::kI64, {T}),
               host_meta ? hpos : view(dpos, DType::kI32, {T}, {2}), cfg, vids,
               view(go, DType::kF32, {T}), view(go + T, DType::kF32, {T}),
               view(go + 2 * T, DType::kF32, {T}));
  const std::vector<uint8_t> gi = download(dids, size_t(2 * T) * 8);
  std::vector<int64_t> gid(static_cast<size_t>(T));
  bool gaps_ok = true;
  for (int64_t t = 0; t < T; ++t) {
    if (ids32) {
      int32_t v, gap;
      std::memcpy(&v, gi.data() + 8 * t, 4);
      std::memcpy(&gap, gi.data() + 8 * t + 4, 4);
      gid[size_t(t)] = v;
      gaps_ok = gaps_ok && uint32_t(gap) == 0xA5A5A5A5u;
    } else {
      std::memcpy(&gid[size_t(t)], gi.data() + 8 * t, 8);
    }
  }
  const std::string sfx = " " + tag + (host_meta ? " host ids/pos" : " device ids/pos") +
                          (ids32 ? " i32 ids" : " i64 ids");
  bitwise("sample ids" + sfx, gid.data(), ids.data(), size_t(T), 8);
  bitwise("sample logp, lse, entropy" + sfx, download(dout, size_t(3 * T) * 4).data(), o,
          size_t(3 * T), 4);
  if (ids32) report(gaps_ok, "sample i32 strided ids: gaps untouched" + sfx);

  // Vocab-parallel: the logits of two row ranges of w side by side in a strided [T, V] buffer,
  // then sample_logits: the same ids and values as sample over the whole w.
  {
    const int64_t V = pb.V, ld = V + 7, cut = V / 2;
    float* zb = static_cast<float*>(d.alloc(size_t(T * ld) * 4));
    for (auto [v0, v1] : {std::pair{int64_t(0), cut}, std::pair{cut, V}}) {
      TensorView zs = view(zb + v0, DType::kF32, {T, v1 - v0}, {ld});
      cuda::lm_head_logits(pb.dev_h(), pb.dev_w().rows(v0, v1), cfg, zs);
    }
    void* vout = d.alloc(size_t(4 * T) * 8);
    int64_t* vid = static_cast<int64_t*>(vout);
    float* vo = reinterpret_cast<float*>(vid + T);
    cuda::sample_logits(view(zb, DType::kF32, {T, V}, {ld}), ps,
                        host_meta ? rid.view() : view(drid, DType::kI64, {T}),
                        host_meta ? hpos : view(dpos, DType::kI32, {T}, {2}), cfg,
                        view(vid, DType::kI64, {T}), view(vo, DType::kF32, {T}),
                        view(vo + T, DType::kF32, {T}), view(vo + 2 * T, DType::kF32, {T}));
    const std::vector<uint8_t> g = download(vout, size_t(T) * 8 + size_t(3 * T) * 4);
    bitwise("sample_logits (2 shards' lm_head_logits) ids" + sfx, g.data(), ids.data(), size_t(T),
            8);
    bitwise("sample_logits (2 shards' lm_head_logits) logp, lse, entropy" + sfx,
            g.data() + size_t(T) * 8, o, size_t(3 * T), 4);
  }

  // Invariance: two rows alone.
  for (int64_t t : {int64_t(0), T - 1}) {
    void* d1 = d.alloc(32);
    int64_t* i1 = static_cast<int64_t*>(d1);
    float* f1 = reinterpret_cast<float*>(i1 + 1);
    cuda::sample(pb.dev_h().rows(t, t + 1), pb.dev_w(),
                 std::span<const SamplingParams>(ps.data() + t, 1), rid.view().rows(t, t + 1),
                 hpos.rows(t, t + 1), cfg, view(i1, DType::kI64, {1}), view(f1, DType::kF32, {1}),
                 view(f1 + 1, DType::kF32, {1}), view(f1 + 2, DType::kF32, {1}));
    const std::vector<uint8_t> g = download(d1, 20);
    const bool same = std::memcmp(g.data(), ids.ptr<int64_t>() + t, 8) == 0 &&
                      std::memcmp(g.data() + 8, o + t, 4) == 0 &&
                      std::memcmp(g.data() + 12, o + T + t, 4) == 0 &&
                      std::memcmp(g.data() + 16, o + 2 * T + t, 4) == 0;
    report(same, "sample row " + std::to_string(t) + " alone == in batch" + sfx + " (" +
                     ps[size_t(t)].to_string() + ")");
  }
}

void test_sampling_case(const Case& c) {
  const ContractConfig cfg = make_cfg(c.tile, c.segs, c.gsegs);
  for (float scale : {1.0f, 3.0f}) {
    if (g_quick && scale > 1.0f) continue;
    Problem pb(c.T, c.H, c.V, scale);
    // Ties: w rows [10, 20) = 4 · row 10 (exact), so those logits are equal for every token and,
    // where positive, the largest.
    if (c.V > 20) {
      for (int64_t v = 19; v >= 10; --v)  // row 10 last: it is the source
        for (int64_t k = 0; k < c.H; ++k)
          pb.w.ptr<bf16>()[v * c.H + k] =
              f32_to_bf16(4.0f * bf16_to_f32(pb.w.ptr<bf16>()[10 * c.H + k]));
    }
    pb.upload();
    std::vector<SamplingParams> ps(size_t(c.T));
    for (auto& p : ps) p = random_params(c.V);
    // A few fixed rows: plain, greedy, top-k at the tie block, top-p tiny / large, min-p alone.
    auto fix = [&](int64_t t, float temp, int64_t k, float tp, float mp) {
      if (t >= c.T) return;
      ps[size_t(t)].temperature = temp;
      ps[size_t(t)].top_k = k;
      ps[size_t(t)].top_p = tp;
      ps[size_t(t)].min_p = mp;
    };
    fix(0, 1.0f, 0, 1.0f, 0.0f);
    fix(1, 0.0f, 0, 1.0f, 0.0f);
    fix(2, 0.8f, 5, 1.0f, 0.0f);
    fix(3, 1.0f, 0, 0.3f, 0.0f);
    fix(4, 1.2f, 0, 1.0f, 0.2f);
    fix(5, 0.7f, 40, 0.8f, 0.1f);
    const std::string tag = cfg.to_string() + " T=" + std::to_string(c.T) +
                            " V=" + std::to_string(c.V) + " scale=" + std::to_string(scale);
    check_sample(tag, pb, cfg, ps, scale == 1.0f, scale != 1.0f);
  }
}

// ---- sampling: rows built for the radix select's edge cases -----------------------------------

struct SampleSetting {
  float temperature;
  int64_t top_k;
  float top_p, min_p;
};

// Every filter off, greedy, top-k 1 / 2 / at and around a tie group of `group` entries / V/2 /
// V-1 / at and past the tile count (the largest k whose list the tile maxima bound), top-p tiny
// to 0.99999 (boundaries inside ties; 0.99999 past the kernel's bracket of top-p's bins), top-k 2
// with top-p, min-p, combinations; `tau` for the rows at temperature 1.
std::vector<SamplingParams> stress_params(int64_t V, int64_t group, float tau, int64_t tiles) {
  const SampleSetting set[] = {
      {tau, 0, 1.0f, 0.0f},          {0.0f, 0, 1.0f, 0.0f},
      {tau, 1, 1.0f, 0.0f},          {tau, 2, 1.0f, 0.0f},
      {tau, 2, 0.5f, 0.0f},          {tau, std::max<int64_t>(group - 1, 0), 1.0f, 0.0f},
      {tau, group + 1, 1.0f, 0.0f},  {tau, 2 * group + 3, 0.9f, 0.0f},
      {tau, V / 2, 1.0f, 0.0f},      {tau, V - 1, 1.0f, 0.0f},
      {tau, 0, 0.05f, 0.0f},         {tau, 0, 0.5f, 0.0f},
      {tau, 0, 0.97f, 0.0f},         {tau, 0, 1e-6f, 0.0f},
      {tau, 0, 1.0f, 0.5f},          {tau, V - 1, 0.999f, 0.01f},
      {0.5f, group + 1, 0.7f, 0.2f}, {2.0f, 0, 0.8f, 0.0f},
      {tau, tiles, 1.0f, 0.0f},      {tau, tiles + 1, 0.9f, 0.05f},
      {tau, 0, 0.99f, 0.1f},         {tau, 0, 0.99999f, 0.0f},
  };
  std::vector<SamplingParams> ps;
  for (const SampleSetting& x : set) {
    SamplingParams p;
    p.seed = g_rng();
    p.temperature = x.temperature;
    p.top_k = x.top_k;
    p.top_p = x.top_p;
    p.min_p = x.min_p;
    ps.push_back(p);
  }
  return ps;
}

// Rows whose canonical order has long runs of ties, bins holding most of the vocabulary (past the
// kernel's shared-memory list at V >= 20011), −inf and huge negative logits, and a dominant entry
// (p = 1, mass 2^32): each == cpu::sample.
void test_sampling_stress() {
  const int64_t H = 32;
  std::vector<int64_t> sizes = {77, 4099, 20011};
  if (!g_quick) sizes.push_back(151936);
  for (int64_t V : sizes) {
    const ContractConfig cfg = V > 5000 ? make_cfg(256, 2, 1) : make_cfg(8, 4, 1);
    const int64_t tiles = logprob_vocab_layout(cfg, V).padded / cfg.vocab_tile;
    const int64_t T = int64_t(stress_params(V, 1, 1.0f, tiles).size());
    auto w_at = [](Problem& pb, int64_t v, int64_t k) -> bf16& {
      return pb.w.ptr<bf16>()[v * pb.H + k];
    };
    auto run = [&](const std::string& what, Problem& pb, int64_t group, float tau) {
      pb.upload();
      check_sample("stress " + what + " V=" + std::to_string(V), pb, cfg,
                   stress_params(V, group, tau, tiles), true, false);
    };
    {  // Every logit of a row equal.
      Problem pb(T, H, V, 1.0f);
      for (int64_t v = 1; v < V; ++v)
        for (int64_t k = 0; k < H; ++k) w_at(pb, v, k) = w_at(pb, 0, k);
      run("all equal", pb, V, 1.0f);
    }
    {  // 9 levels z, z/2, ..., z/128, 0 (exact), each a tie group of V/9 entries.
      Problem pb(T, H, V, 1.0f);
      for (int64_t v = 1; v < V; ++v)
        for (int64_t k = 0; k < H; ++k) {
          const int j = int(v % 9);
          w_at(pb, v, k) = f32_to_bf16(j == 8 ? 0.0f : std::ldexp(bf16_to_f32(w_at(pb, 0, k)), -j));
        }
      run("9 tie levels", pb, V / 9, 1.0f);
    }
    for (float tau : {1.0f, 0.5f}) {  // 90% of z = -2^127 + ...: y huge negative, or -inf at τ 0.5
      Problem pb(T, H, V, 1.0f);
      for (int64_t t = 0; t < T; ++t) pb.h.ptr<bf16>()[t * H] = f32_to_bf16(1.0f);
      int64_t live = 0;
      for (int64_t v = 0; v < V; ++v) {
        if (v % 10 == 3) {
          ++live;
        } else {
          w_at(pb, v, 0) = f32_to_bf16(-0x1p127f);
        }
      }
      run(tau == 1.0f ? "90% huge negative" : "90% -inf", pb, live, tau);
    }
    {  // Entry 7 dominates half the rows (z ~ 64x the others): p = 1, mass 2^32.
      Problem pb(T, H, V, 1.0f);
      for (int64_t k = 0; k < H; ++k)
        w_at(pb, 7, k) = f32_to_bf16(64.0f * bf16_to_f32(w_at(pb, 7, k)));
      run("dominant entry", pb, 1, 1.0f);
    }
  }
}

void test_sampling_errors() {
  const ContractConfig cfg = make_cfg(8, 1, 1);
  const int64_t T = 3, H = 16, V = 40;
  Problem pb(T, H, V, 1.0f);
  pb.h.ptr<bf16>()[1 * H + 3] = f32_to_bf16(NAN);  // row 1 cannot be sampled
  pb.upload();
  std::vector<SamplingParams> ps(static_cast<size_t>(T));
  Tensor rid(DType::kI64, {T}), pos(DType::kI64, {T});
  for (int64_t t = 0; t < T; ++t) rid.ptr<int64_t>()[t] = t, pos.ptr<int64_t>()[t] = t;
  DevPool d;
  void* dids = d.alloc(size_t(T) * 8);
  void* dout = d.alloc(size_t(3 * T) * 4);
  float* o = static_cast<float*>(dout);
  const TensorView vid = view(dids, DType::kI64, {T}), lp = view(o, DType::kF32, {T}),
                   ls = view(o + T, DType::kF32, {T}), en = view(o + 2 * T, DType::kF32, {T});
  expect_error(
      "sample NaN row",
      [&] {
        cuda::sample(pb.dev_h(), pb.dev_w(), ps, rid.view(), pos.view(), cfg, vid, lp, ls, en);
      },
      "row 1: logsumexp is");
  const std::vector<uint8_t> gi = download(dids, size_t(T) * 8),
                             go = download(dout, size_t(3 * T) * 4);
  bool poisoned = true;
  for (uint8_t b : gi) poisoned = poisoned && b == 0xA5;
  for (uint8_t b : go) poisoned = poisoned && b == 0xA5;
  report(poisoned, "sample NaN row: no output written");
  Problem ok(T, H, V, 1.0f);
  ok.upload();
  expect_error(
      "params size",
      [&] {
        cuda::sample(ok.dev_h(), ok.dev_w(), std::span<const SamplingParams>(ps.data(), 2),
                     rid.view(), pos.view(), cfg, vid, lp, ls, en);
      },
      "'params'");
  std::vector<SamplingParams> badp(ps);
  badp[2].top_p = 0.0f;
  expect_error(
      "params[2] top_p = 0",
      [&] {
        cuda::sample(ok.dev_h(), ok.dev_w(), badp, rid.view(), pos.view(), cfg, vid, lp, ls, en);
      },
      "params[2]");
  expect_error(
      "V >= 2^21",
      [&] {
        cuda::sample(ok.dev_h(), view(ok.dw, DType::kBF16, {int64_t(1) << 21, H}), ps, rid.view(),
                     pos.view(), cfg, vid, lp, ls, en);
      },
      "2^21");
  Tensor bpos(DType::kI64, {T});
  const int64_t bp[] = {0, -1, 2};
  std::memcpy(bpos.data(), bp, sizeof bp);
  expect_error(
      "host position -1",
      [&] {
        cuda::sample(ok.dev_h(), ok.dev_w(), ps, rid.view(), bpos.view(), cfg, vid, lp, ls, en);
      },
      "positions[1] = -1");
  Tensor rid32(DType::kI32, {T});
  expect_error(
      "request_ids dtype",
      [&] {
        cuda::sample(ok.dev_h(), ok.dev_w(), ps, rid32.view(), pos.view(), cfg, vid, lp, ls, en);
      },
      "'request_ids'");
  expect_error(
      "token_ids dtype",
      [&] {
        cuda::sample(ok.dev_h(), ok.dev_w(), ps, rid.view(), pos.view(), cfg,
                     view(dids, DType::kF32, {T}), lp, ls, en);
      },
      "'token_ids'");
  expect_error(
      "token_ids on the host",
      [&] {
        cuda::sample(ok.dev_h(), ok.dev_w(), ps, rid.view(), pos.view(), cfg, rid.view(), lp, ls,
                     en);
      },
      "'token_ids'");
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  bool producers_only = false;  // --producers: only the fused / unfused producer checks
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      g_quick = true;
    } else if (std::strcmp(argv[i], "--producers") == 0) {
      producers_only = true;
    } else {
      seed = std::strtoull(argv[i], nullptr, 10);
    }
  }
  std::printf("test_logprob_parity: seed %llu%s\n", (unsigned long long)seed,
              g_quick ? " (quick)" : "");
  g_rng.seed(seed);
  std::printf("%s\n", cuda::logprob_launch_plan(ContractConfig{}, 4096, 151936).c_str());
  const std::vector<Case> cases = {{g_quick ? 4 : 64, 64, 151936, 256, 8, 1},
                                   {37, 48, 1000, 64, 2, 2},
                                   {5, 16, 77, 8, 4, 4},
                                   {g_quick ? 21 : 300, 32, 4099, 24, 1, 8}};
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](const char* what) {
    std::printf("[%6.1f s] %s: %d passed, %d failed so far\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), what,
                g_pass, g_fail);
    std::fflush(stdout);
  };
  if (producers_only) {
    test_producers();
    progress("fused vs unfused producer");
    std::printf("test_logprob_parity --producers: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
  }
  for (const Case& c : cases) test_logprob_case(c);
  progress("linear_logprob cases");
  test_logprob_strided();
  test_logprob_chunked();
  progress("strided / invariance / chunked");
  test_logprob_tp({37, 48, 1000, 64, 4, 2});
  test_logprob_tp({5, 16, 77, 8, 8, 1});  // ranks 5..7 hold only padding
  if (!g_quick) test_logprob_tp({16, 32, 151936, 256, 8, 2});
  progress("vocab-parallel partial / combine");
  test_producers();
  progress("fused vs unfused producer");
  test_logprob_errors();
  test_backward_plan_rows();
  for (const Case& c : cases) test_sampling_case(c);
  progress("sampling");
  test_sampling_stress();
  progress("sampling stress rows");
  test_sampling_errors();
  std::printf("test_logprob_parity: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
