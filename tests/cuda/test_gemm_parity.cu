// GPU parity of the tensor-core GEMM (lockstep::cuda::gemm_bf16_nt, gemm_bf16_nt_partial,
// gemm_tree_combine; src/cuda/gemm/) with the CPU GEMM (lockstep::cpu::*), bit for bit
// (docs/contract.md §G, docs/cuda-gemm.md). Every case is computed once on the CPU and then on the
// GPU by EVERY plan the launcher can run for it (plan_gemm's own choice through the public
// function, and each of gemm_legal_plans through detail::gemm_bf16_nt_with_plan: mma.sync 32x64 /
// 128x128, wgmma+TMA 128x256 / 128x128 / 64x128 / 64x256 ping-pong with per-segment fp32 planes,
// 128x128 / 64x128 with the in-CTA register tree, the segment-pair path, the 64x256 ping-pong
// and 128x256 tiles with their segments folded through the stash, every compiled small-M
// tile for M <= 64), in three layouts
// (contiguous; padded rows with 16-byte strides, which TMA takes; odd strides and an unaligned
// base, which it cannot, so the mma.sync kernel must run). Covered: odd M, N, K (K not a multiple
// of 16·S), S = 1, 2, 4, 8, bf16 / f32 output, no / bf16 / f32 bias, special values, poisoned
// outputs (cells outside y stay untouched), row invariance (row alone vs inside batches of 64..2048
// rows), TP partials and the tree combine vs the CPU's, Qwen3-8B layer shapes (M = 1, 8 whole; M =
// 4096 on sampled rows computed on the CPU from those rows only: rows are independent), argument
// errors. Fresh seed each run (printed; pass one as argv to repeat). --quick: small sizes only (<
// 10 s). Prints "N passed, M failed" and exits non-zero on any failure. Timing: bench_gemm.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"        // CK
#include "cuda/gemm/internal.h"  // gemm_bf16_nt_with_plan, gemm_problem
#include "cuda/gemm/plan.h"      // GemmPlan, gemm_legal_plans
#include "cuda/gpu_harness.h"
#include "engine/config.h"         // qwen3_gemm_shapes
#include "engine/default_model.h"  // qwen3_shape_config
#include "lockstep/cuda/gemm.h"
#include "lockstep/dtype.h"
#include "lockstep/ops/gemm.h"

using lockstep::Device;
using lockstep::DType;
using lockstep::GemmConfig;
using lockstep::TensorView;
using lockstep::cuda::GemmPlan;

namespace {

using namespace lockstep::gpu_test;  // report, g_quick, g_rng, start, section, finish

std::map<std::string, int> g_path_runs;  // which kernel actually ran, over all GPU calls

// Random bf16: normal values with exponents spread over 2^±8; with `specials`, also some zeros
// of both signs, subnormals, infinities and NaNs.
void fill(std::vector<uint16_t>& v, bool specials) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ed(-8, 8);
  std::uniform_int_distribution<int> sp(0, 999);
  for (auto& e : v) {
    float f = std::ldexp(nd(g_rng), ed(g_rng));
    uint16_t b = lockstep::f32_to_bf16(f).bits;
    if (specials) {
      const int r = sp(g_rng);
      if (r < 20)
        b = 0x0000;
      else if (r < 30)
        b = 0x8000;
      else if (r < 40)
        b = uint16_t(0x0001 + (g_rng() % 0x7f)) | uint16_t((g_rng() & 1) << 15);
      else if (r < 42)
        b = (g_rng() & 1) ? 0x7f80 : 0xff80;
      else if (r < 43)
        b = 0x7fa1;
    }
    e = b;
  }
}

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) { CK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

TensorView view2(void* p, DType t, int64_t rows, int64_t cols, int64_t ld, Device d) {
  TensorView v = TensorView::contiguous(p, t, {rows, cols}, d);
  v.stride[0] = ld;
  return v;
}

const char* bias_name(int b) { return b == 0 ? "none" : b == 1 ? "bf16" : "f32"; }

// One problem's host data (logical, contiguous) and its CPU result.
struct Problem {
  int64_t M, N, K;
  int S;
  DType ydt;
  int bias;  // 0 none, 1 bf16, 2 f32
  bool specials = false;
  std::vector<uint16_t> x, w, b16;
  std::vector<float> b32;
  std::vector<uint8_t> ref;  // [M, N] contiguous, ydt
};

void make_problem(Problem& p) {
  p.x.assign(size_t(p.M * p.K), 0);
  p.w.assign(size_t(p.N * p.K), 0);
  fill(p.x, p.specials);
  fill(p.w, p.specials);
  p.b16.assign(size_t(std::max<int64_t>(p.N, 1)), 0);
  fill(p.b16, false);
  p.b32.resize(p.b16.size());
  for (auto& b : p.b32) b = std::ldexp(std::normal_distribution<float>(0, 1)(g_rng), 3);
  const size_t ysz = lockstep::dtype_size(p.ydt);
  p.ref.assign(size_t(std::max<int64_t>(p.M * p.N, 1)) * ysz, 0);
  TensorView xc = TensorView::contiguous(p.x.data(), DType::kBF16, {p.M, p.K});
  TensorView wc = TensorView::contiguous(p.w.data(), DType::kBF16, {p.N, p.K});
  TensorView yc = TensorView::contiguous(p.ref.data(), p.ydt, {p.M, p.N});
  TensorView bc;
  if (p.bias == 1) bc = TensorView::contiguous(p.b16.data(), DType::kBF16, {p.N});
  if (p.bias == 2) bc = TensorView::contiguous(p.b32.data(), DType::kF32, {p.N});
  lockstep::cpu::gemm_bf16_nt(xc, wc, p.bias ? &bc : nullptr, GemmConfig{p.S}, yc);
}

// Device layout of one run: row strides K + pad, base offsets (elements) for x.
struct Layout {
  const char* name;
  int64_t padx, padw, pady, offx;
};

// Runs problem p on the GPU with layout L, through the public function (plan == nullptr: the
// planner's choice) or with `plan`; compares every cell of y with the CPU result and checks the
// poisoned padding. Returns the plan that ran.
GemmPlan run_gpu(const Problem& p, const Layout& L, const GemmPlan* plan) {
  const int64_t ldx = p.K + L.padx, ldw = p.K + L.padw, ldy = p.N + L.pady;
  const size_t ysz = lockstep::dtype_size(p.ydt);
  std::vector<uint16_t> hx(size_t(std::max<int64_t>(p.M * ldx + L.offx, 1)), 0x7fc0);
  std::vector<uint16_t> hw(size_t(std::max<int64_t>(p.N * ldw, 1)), 0x7fc0);
  for (int64_t m = 0; m < p.M; ++m)
    std::memcpy(&hx[size_t(L.offx + m * ldx)], &p.x[size_t(m * p.K)], size_t(p.K) * 2);
  for (int64_t n = 0; n < p.N; ++n)
    std::memcpy(&hw[size_t(n * ldw)], &p.w[size_t(n * p.K)], size_t(p.K) * 2);
  const size_t ybytes = size_t(std::max<int64_t>(p.M * ldy, 1)) * ysz;
  Dev dx(hx.size() * 2), dw(hw.size() * 2), dy(ybytes), db(p.b32.size() * 4);
  CK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dy.p, 0xA5, ybytes));
  if (p.bias == 1) CK(cudaMemcpy(db.p, p.b16.data(), p.b16.size() * 2, cudaMemcpyHostToDevice));
  if (p.bias == 2) CK(cudaMemcpy(db.p, p.b32.data(), p.b32.size() * 4, cudaMemcpyHostToDevice));
  TensorView xg =
      view2(static_cast<uint16_t*>(dx.p) + L.offx, DType::kBF16, p.M, p.K, ldx, Device::kCUDA);
  TensorView wg = view2(dw.p, DType::kBF16, p.N, p.K, ldw, Device::kCUDA);
  TensorView yg = view2(dy.p, p.ydt, p.M, p.N, ldy, Device::kCUDA);
  TensorView bg;
  if (p.bias)
    bg = TensorView::contiguous(db.p, p.bias == 1 ? DType::kBF16 : DType::kF32, {p.N},
                                Device::kCUDA);
  std::string err;
  const GemmPlan ran = plan ? *plan
                            : lockstep::cuda::plan_gemm(
                                  lockstep::cuda::detail::gemm_problem(xg, wg, GemmConfig{p.S}));
  try {
    if (plan) {
      lockstep::cuda::detail::gemm_bf16_nt_with_plan(xg, wg, p.bias ? &bg : nullptr,
                                                     GemmConfig{p.S}, yg, *plan);
    } else {
      lockstep::cuda::gemm_bf16_nt(xg, wg, p.bias ? &bg : nullptr, GemmConfig{p.S}, yg);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> hy(ybytes);
  CK(cudaMemcpy(hy.data(), dy.p, ybytes, cudaMemcpyDeviceToHost));

  int64_t bad = 0, first = -1, poison_bad = 0;
  for (int64_t m = 0; m < p.M; ++m) {
    for (int64_t n = 0; n < ldy; ++n) {
      const uint8_t* g = &hy[size_t(m * ldy + n) * ysz];
      if (n < p.N) {
        if (std::memcmp(g, &p.ref[size_t(m * p.N + n) * ysz], ysz) != 0) {
          if (first < 0) first = m * p.N + n;
          ++bad;
        }
      } else {
        for (size_t b = 0; b < ysz; ++b) poison_bad += g[b] != 0xA5;
      }
    }
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "M=%lld N=%lld K=%lld S=%d y=%s bias=%s%s layout=%s %s=%s",
                (long long)p.M, (long long)p.N, (long long)p.K, p.S, lockstep::dtype_name(p.ydt),
                bias_name(p.bias), p.specials ? " specials" : "", L.name, plan ? "plan" : "auto",
                ran.to_string().c_str());
  std::string what = buf;
  if (!err.empty()) what += ": exception " + err;
  if (bad) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &p.ref[size_t(first) * ysz], ysz);
    const size_t gi = size_t((first / p.N) * ldy + first % p.N) * ysz;
    std::memcpy(&b, &hy[gi], ysz);
    std::snprintf(buf, sizeof buf, ": %lld mismatches, first at m=%lld n=%lld cpu=0x%x gpu=0x%x",
                  (long long)bad, (long long)(first / p.N), (long long)(first % p.N), a, b);
    what += buf;
  }
  if (poison_bad) what += ": padding of y overwritten";
  ++g_path_runs[lockstep::cuda::gemm_mainloop_name(ran.mainloop)];
  report(err.empty() && bad == 0 && poison_bad == 0, what);
  return ran;
}

bool tma_able(const Problem& p, const Layout& L) {
  auto ok = [&](int64_t rows, int64_t ld, int64_t off) {
    return off % 8 == 0 && (rows <= 1 || ld % 8 == 0);
  };
  return p.K >= 1 && ok(p.M, p.K + L.padx, L.offx) && ok(p.N, p.K + L.padw, 0);
}

// The planner's choice and every legal plan on each layout (on the one TMA cannot take, the
// legal plans are the mma.sync and small-M cp.async-ring ones: the planner must pick one of them).
void run_all_paths(Problem& p) {
  make_problem(p);
  const int64_t r8 = (p.K + 7) / 8 * 8 - p.K;
  const Layout layouts[] = {{"contiguous", 0, 0, 0, 0},
                            {"padded16B", r8 + 8, r8 + 16, 5, 8},
                            {"odd-strides", 3 + (p.K % 8 == 5), 1, 2, 1}};
  for (int li = 0; li < 3; ++li) {
    const Layout& L = layouts[li];
    const bool tma = tma_able(p, L);
    const GemmPlan chosen = run_gpu(p, L, nullptr);
    // The problem the launcher plans (operand alignment included) for this layout.
    lockstep::cuda::GemmProblem q;
    q.M = p.M;
    q.N = p.N;
    q.K = p.K;
    q.segments = p.S;
    q.segment_len = lockstep::gemm_k_layout(GemmConfig{p.S}, p.K).segment_len;
    q.tma_ok = tma;
    const bool wgmma = chosen.mainloop == lockstep::cuda::GemmMainloop::kWgmma;
    report(!(wgmma && !tma) && lockstep::cuda::gemm_plan_legal(q, chosen),
           std::string("auto plan legal for layout ") + L.name + ": " + chosen.to_string());
    for (const GemmPlan& plan : lockstep::cuda::gemm_legal_plans(q)) run_gpu(p, L, &plan);
  }
}

// Row invariance: row m computed alone (M = 1: the small-M or 32x64 kernel) equals the same row
// inside batches of Mc rows (other kernels), bitwise.
void run_invariance(int S, DType ydt) {
  const int64_t Mb = g_quick ? 300 : 2048, N = 520, K = 1000;
  std::vector<uint16_t> hx(size_t(Mb * K)), hw(size_t(N * K));
  fill(hx, false);
  fill(hw, false);
  const size_t ysz = lockstep::dtype_size(ydt);
  Dev dx(hx.size() * 2), dw(hw.size() * 2), dy(size_t(Mb * N) * ysz), d1(size_t(N) * ysz);
  CK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  GemmConfig cfg{S};
  TensorView wg = TensorView::contiguous(dw.p, DType::kBF16, {N, K}, Device::kCUDA);
  for (int64_t Mc : {int64_t(64), int64_t(300), Mb}) {
    if (Mc > Mb) continue;
    std::vector<uint8_t> big(size_t(Mc * N) * ysz), one(size_t(N) * ysz);
    TensorView xg = TensorView::contiguous(dx.p, DType::kBF16, {Mc, K}, Device::kCUDA);
    TensorView yg = TensorView::contiguous(dy.p, ydt, {Mc, N}, Device::kCUDA);
    lockstep::cuda::gemm_bf16_nt(xg, wg, nullptr, cfg, yg);
    const GemmPlan big_path =
        lockstep::cuda::plan_gemm(lockstep::cuda::detail::gemm_problem(xg, wg, cfg));
    CK(cudaMemcpy(big.data(), dy.p, big.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int64_t m : {int64_t(0), int64_t(37), Mc - 1, Mc / 2 + 5}) {
      TensorView x1 = TensorView::contiguous(static_cast<uint16_t*>(dx.p) + m * K, DType::kBF16,
                                             {1, K}, Device::kCUDA);
      TensorView y1 = TensorView::contiguous(d1.p, ydt, {1, N}, Device::kCUDA);
      lockstep::cuda::gemm_bf16_nt(x1, wg, nullptr, cfg, y1);
      CK(cudaMemcpy(one.data(), d1.p, one.size(), cudaMemcpyDeviceToHost));
      if (std::memcmp(one.data(), &big[size_t(m * N) * ysz], one.size()) != 0) ++bad;
    }
    const TensorView x1 = TensorView::contiguous(dx.p, DType::kBF16, {1, K}, Device::kCUDA);
    const GemmPlan one_path =
        lockstep::cuda::plan_gemm(lockstep::cuda::detail::gemm_problem(x1, wg, cfg));
    char buf[600];
    std::snprintf(buf, sizeof buf, "invariance M=1 (%s) vs M=%lld (%s) S=%d y=%s (%d rows differ)",
                  one_path.to_string().c_str(), (long long)Mc, big_path.to_string().c_str(), S,
                  lockstep::dtype_name(ydt), bad);
    report(bad == 0, buf);
  }
}

// TP: GPU partials == CPU partials (f32 bits), GPU combine of the GPU partials == the CPU's full
// GEMM, and the in-place f32 combine.
// pairs: each rank with 4 or 8 segments runs the segment-pair plan (the others their own choice).
void run_partials(int64_t M, int64_t N, int64_t K, int S, bool pairs = false) {
  std::vector<uint16_t> hx(size_t(M * K)), hw(size_t(N * K)), hb(static_cast<size_t>(N));
  fill(hx, false);
  fill(hw, false);
  fill(hb, false);
  GemmConfig cfg{S};
  std::vector<uint16_t> ref(size_t(M * N));
  TensorView xc = TensorView::contiguous(hx.data(), DType::kBF16, {M, K});
  TensorView wc = TensorView::contiguous(hw.data(), DType::kBF16, {N, K});
  TensorView bc = TensorView::contiguous(hb.data(), DType::kBF16, {N});
  lockstep::cpu::gemm_bf16_nt(xc, wc, &bc, cfg,
                              TensorView::contiguous(ref.data(), DType::kBF16, {M, N}));
  Dev dx(hx.size() * 2), dw(hw.size() * 2), db(hb.size() * 2), dy(size_t(M * N) * 4);
  CK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db.p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  TensorView bg = TensorView::contiguous(db.p, DType::kBF16, {N}, Device::kCUDA);
  for (int t = 1; t <= S; t *= 2) {
    std::vector<Dev*> parts;
    std::vector<TensorView> views;
    int bad_partial = 0;
    std::string paths;
    for (int r = 0; r < t; ++r) {
      const lockstep::GemmKRange kr = lockstep::gemm_tp_k_range(cfg, K, t, r);
      const int64_t Kr = kr.end - kr.begin;
      std::vector<float> cpu_part(size_t(M * N));
      TensorView xs = xc, ws = wc;
      xs.data = hx.data() + kr.begin;
      xs.shape[1] = Kr;
      ws.data = hw.data() + kr.begin;
      ws.shape[1] = Kr;
      lockstep::cpu::gemm_bf16_nt_partial(
          xs, ws, K, t, r, cfg, TensorView::contiguous(cpu_part.data(), DType::kF32, {M, N}));
      parts.push_back(new Dev(size_t(M * N) * 4));
      TensorView yp = TensorView::contiguous(parts.back()->p, DType::kF32, {M, N}, Device::kCUDA);
      TensorView xg =
          view2(static_cast<uint16_t*>(dx.p) + kr.begin, DType::kBF16, M, Kr, K, Device::kCUDA);
      TensorView wg =
          view2(static_cast<uint16_t*>(dw.p) + kr.begin, DType::kBF16, N, Kr, K, Device::kCUDA);
      const lockstep::cuda::GemmProblem q =
          lockstep::cuda::detail::gemm_partial_problem(xg, wg, K, t, cfg);
      GemmPlan ran = lockstep::cuda::plan_gemm(q);
      bool forced = false;
      if (pairs && S / t >= 4) {
        for (const GemmPlan& pl : lockstep::cuda::gemm_legal_plans(q)) {
          if (pl.fold == lockstep::cuda::GemmFold::kPairs) {
            ran = pl;
            forced = true;
          }
        }
        if (!forced) ++bad_partial;  // the pair plan must be legal wherever a rank has 4 or 8
      }
      if (forced) {
        lockstep::cuda::detail::gemm_bf16_nt_partial_with_plan(xg, wg, K, t, r, cfg, yp, ran);
      } else {
        lockstep::cuda::gemm_bf16_nt_partial(xg, wg, K, t, r, cfg, yp);
      }
      paths += std::string(r ? ", " : "") + ran.to_string();
      std::vector<float> gpu_part(size_t(M * N));
      CK(cudaMemcpy(gpu_part.data(), yp.data, gpu_part.size() * 4, cudaMemcpyDeviceToHost));
      if (std::memcmp(gpu_part.data(), cpu_part.data(), gpu_part.size() * 4) != 0) ++bad_partial;
      views.push_back(yp);
    }
    TensorView yg = TensorView::contiguous(dy.p, DType::kBF16, {M, N}, Device::kCUDA);
    lockstep::cuda::gemm_tree_combine(views, &bg, yg);
    std::vector<uint16_t> got(size_t(M * N));
    CK(cudaMemcpy(got.data(), dy.p, got.size() * 2, cudaMemcpyDeviceToHost));
    const bool comb_ok = std::memcmp(got.data(), ref.data(), got.size() * 2) == 0;
    // In place: f32 y = partials[0] (no bias), then round on the host like the contract does.
    lockstep::cuda::gemm_tree_combine(views, nullptr, views[0]);
    std::vector<float> inpl(size_t(M * N));
    CK(cudaMemcpy(inpl.data(), views[0].data, inpl.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<float> ref32(size_t(M * N));
    lockstep::cpu::gemm_bf16_nt(xc, wc, nullptr, cfg,
                                TensorView::contiguous(ref32.data(), DType::kF32, {M, N}));
    const bool inpl_ok = std::memcmp(inpl.data(), ref32.data(), inpl.size() * 4) == 0;
    char buf[1200];
    std::snprintf(
        buf, sizeof buf,
        "partials M=%lld N=%lld K=%lld S=%d t=%d (%s): %d partials differ from the CPU's, "
        "combine %s, in-place combine %s",
        (long long)M, (long long)N, (long long)K, S, t, paths.c_str(), bad_partial,
        comb_ok ? "equal" : "DIFFERS", inpl_ok ? "equal" : "DIFFERS");
    report(bad_partial == 0 && comb_ok && inpl_ok, buf);
    for (Dev* d : parts) delete d;
  }
}

// Device fill for big operands: bf16 with random sign, exponent 2^±8, random mantissa.
__global__ void big_fill(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    const uint32_t e = 127 - 8 + uint32_t((z >> 8) % 17);
    p[i] = uint16_t(((z >> 40) & 1) << 15 | e << 7 | (z & 0x7f));
  }
}

// A Qwen3-8B layer shape: y = x w^T for M rows on the GPU (the launcher's choice), compared with
// the CPU on `rows` (all rows when M is small, else sampled rows: the first and last 8 and random
// ones, computed on the CPU from those rows of x only).
void run_qwen(const char* name, int64_t N, int64_t K, int64_t M, int S, DType ydt, bool bias) {
  Dev dx(size_t(M * K) * 2), dw(size_t(N * K) * 2), dy(size_t(M * N) * 4), db(size_t(N) * 2);
  big_fill<<<1024, 256>>>(static_cast<uint16_t*>(dx.p), M * K, g_rng());
  big_fill<<<1024, 256>>>(static_cast<uint16_t*>(dw.p), N * K, g_rng());
  big_fill<<<64, 256>>>(static_cast<uint16_t*>(db.p), N, g_rng());
  CK(cudaGetLastError());
  const size_t ysz = lockstep::dtype_size(ydt);
  TensorView xg = TensorView::contiguous(dx.p, DType::kBF16, {M, K}, Device::kCUDA);
  TensorView wg = TensorView::contiguous(dw.p, DType::kBF16, {N, K}, Device::kCUDA);
  TensorView yg = TensorView::contiguous(dy.p, ydt, {M, N}, Device::kCUDA);
  TensorView bg = TensorView::contiguous(db.p, DType::kBF16, {N}, Device::kCUDA);
  lockstep::cuda::gemm_bf16_nt(xg, wg, bias ? &bg : nullptr, GemmConfig{S}, yg);
  const GemmPlan ran =
      lockstep::cuda::plan_gemm(lockstep::cuda::detail::gemm_problem(xg, wg, GemmConfig{S}));
  CK(cudaDeviceSynchronize());
  std::vector<int64_t> rows;
  if (M <= 64) {
    for (int64_t m = 0; m < M; ++m) rows.push_back(m);
  } else {
    for (int64_t i = 0; i < 8; ++i) rows.push_back(i), rows.push_back(M - 8 + i);
    for (int i = 0; i < 16; ++i) rows.push_back(int64_t(g_rng() % uint64_t(M)));
  }
  const int64_t R = int64_t(rows.size());
  std::vector<uint16_t> hw(size_t(N * K)), hx(size_t(R * K)), hb(static_cast<size_t>(N));
  CK(cudaMemcpy(hw.data(), dw.p, hw.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), db.p, hb.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> got(size_t(R * N) * ysz), ref(size_t(R * N) * ysz);
  for (int64_t i = 0; i < R; ++i) {
    CK(cudaMemcpy(&hx[size_t(i * K)], static_cast<uint16_t*>(dx.p) + rows[size_t(i)] * K,
                  size_t(K) * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&got[size_t(i * N) * ysz],
                  static_cast<uint8_t*>(dy.p) + size_t(rows[size_t(i)] * N) * ysz, size_t(N) * ysz,
                  cudaMemcpyDeviceToHost));
  }
  TensorView bc = TensorView::contiguous(hb.data(), DType::kBF16, {N});
  lockstep::cpu::gemm_bf16_nt(TensorView::contiguous(hx.data(), DType::kBF16, {R, K}),
                              TensorView::contiguous(hw.data(), DType::kBF16, {N, K}),
                              bias ? &bc : nullptr, GemmConfig{S},
                              TensorView::contiguous(ref.data(), ydt, {R, N}));
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < R * N; ++i)
    if (std::memcmp(&got[size_t(i) * ysz], &ref[size_t(i) * ysz], ysz) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
  char buf[700];
  std::snprintf(buf, sizeof buf,
                "qwen3-8b %s M=%lld N=%lld K=%lld S=%d y=%s bias=%s (%s): %lld rows checked, %lld "
                "mismatches%s",
                name, (long long)M, (long long)N, (long long)K, S, lockstep::dtype_name(ydt),
                bias ? "bf16" : "none", ran.to_string().c_str(), (long long)R, (long long)bad,
                bad ? "" : "");
  std::string what = buf;
  if (bad) {
    std::snprintf(buf, sizeof buf, ", first at row %lld n=%lld", (long long)rows[size_t(first / N)],
                  (long long)(first % N));
    what += buf;
  }
  ++g_path_runs[lockstep::cuda::gemm_mainloop_name(ran.mainloop)];
  report(bad == 0, what);
}

template <typename F>
bool throws(F&& f) {
  try {
    f();
  } catch (const lockstep::Error&) {
    return true;
  }
  return false;
}

void run_errors() {
  Dev d(8192);
  char* base = static_cast<char*>(d.p);
  TensorView x = TensorView::contiguous(base, DType::kBF16, {4, 8}, Device::kCUDA);
  TensorView w = TensorView::contiguous(base + 1024, DType::kBF16, {4, 8}, Device::kCUDA);
  TensorView y = TensorView::contiguous(base + 2048, DType::kF32, {4, 4}, Device::kCUDA);
  GemmConfig cfg{1};
  TensorView xcpu = x;
  xcpu.device = Device::kCPU;
  report(throws([&] { lockstep::cuda::gemm_bf16_nt(xcpu, w, nullptr, cfg, y); }),
         "error: x on the CPU");
  TensorView wk = TensorView::contiguous(w.data, DType::kBF16, {4, 7}, Device::kCUDA);
  report(throws([&] { lockstep::cuda::gemm_bf16_nt(x, wk, nullptr, cfg, y); }), "error: K differs");
  TensorView yo = TensorView::contiguous(d.p, DType::kF32, {4, 4}, Device::kCUDA);
  report(throws([&] { lockstep::cuda::gemm_bf16_nt(x, w, nullptr, cfg, yo); }),
         "error: y overlaps x");
  report(throws([&] { lockstep::cuda::gemm_bf16_nt(x, w, nullptr, GemmConfig{3}, y); }),
         "error: segments = 3");
  TensorView b3 = TensorView::contiguous(base + 4096, DType::kF32, {3}, Device::kCUDA);
  report(throws([&] { lockstep::cuda::gemm_bf16_nt(x, w, &b3, cfg, y); }), "error: bias shape");
  report(!throws([&] { lockstep::cuda::gemm_bf16_nt(x, w, nullptr, cfg, y); }) &&
             cudaDeviceSynchronize() == cudaSuccess,
         "valid small call");
  // Partials (S = 4, K = 8: Kp = 64, each of 2 ranks owns 32 padded columns: rank 0 all 8 real).
  GemmConfig c4{4};
  report(throws([&] { lockstep::cuda::gemm_bf16_nt_partial(x, w, 8, 3, 0, c4, y); }),
         "error: partial tp_size = 3");
  report(throws([&] { lockstep::cuda::gemm_bf16_nt_partial(x, w, 8, 8, 0, c4, y); }),
         "error: partial tp_size > segments");
  report(throws([&] { lockstep::cuda::gemm_bf16_nt_partial(x, w, 8, 2, 1, c4, y); }),
         "error: partial shard width (rank 1 owns no real column)");
  TensorView yb = TensorView::contiguous(base + 2048, DType::kBF16, {4, 4}, Device::kCUDA);
  report(throws([&] { lockstep::cuda::gemm_bf16_nt_partial(x, w, 8, 2, 0, c4, yb); }),
         "error: partial y_partial not f32");
  report(!throws([&] { lockstep::cuda::gemm_bf16_nt_partial(x, w, 8, 2, 0, c4, y); }) &&
             cudaDeviceSynchronize() == cudaSuccess,
         "valid partial call");
  // Combine.
  TensorView p1 = TensorView::contiguous(base + 4096, DType::kF32, {4, 4}, Device::kCUDA);
  TensorView p2 = TensorView::contiguous(base + 6144, DType::kF32, {4, 4}, Device::kCUDA);
  report(throws([&] {
           lockstep::cuda::gemm_tree_combine({y, p1, p2}, nullptr, yb);
         }),
         "error: combine of 3 partials");
  TensorView yov = TensorView::contiguous(base + 4096, DType::kBF16, {4, 4}, Device::kCUDA);
  report(throws([&] {
           lockstep::cuda::gemm_tree_combine({y, p1}, nullptr, yov);
         }),
         "error: combine y (bf16) overlaps a partial");
  TensorView p5 = TensorView::contiguous(base + 6144, DType::kF32, {4, 5}, Device::kCUDA);
  report(throws([&] {
           lockstep::cuda::gemm_tree_combine({y, p5}, nullptr, yb);
         }),
         "error: combine partial shapes differ");
  report(!throws([&] {
    lockstep::cuda::gemm_tree_combine({p1, p2}, nullptr, p1);
  }) && cudaDeviceSynchronize() == cudaSuccess,
         "valid in-place combine");
}

}  // namespace

int main(int argc, char** argv) {
  bool no_bench = false;  // --no-bench: accepted for old scripts (timing moved to bench_gemm)
  if (!start("test_gemm_parity", argc, argv, {{"--no-bench", &no_bench}})) return 2;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const auto t0 = std::chrono::steady_clock::now();

  try {
    std::vector<std::vector<int64_t>> shapes = {
        {1, 1, 1},
        {3, 17, 111},
        {17, 3, 1000},
        {111, 1000, 17},
        {1000, 111, 1000},
        {1, 1000, 1000},
        {1000, 17, 3},
        {130, 129, 333},
        {64, 256, 4096},
        {256, 384, 64},
        {5, 7, 0},
        {300, 520, 1000},
        {257, 777, 4104},
        {640, 1280, 512},
        // 297 tiles of 64x256 on 132 CTAs: the stash plan's tile pairs and lone last tiles (2 or
        // 3 tiles per CTA); K = 264: segments of one partial k-tile (S = 8) or 1.25 (S = 4)
        {1700, 2600, 264}};
    if (g_quick) shapes = {{1, 1, 1}, {3, 17, 111}, {130, 129, 333}, {257, 300, 1000}, {5, 7, 0}};
    int variant = 0;
    for (const auto& sh : shapes) {
      const bool big = sh[0] * sh[1] * sh[2] > 100000000;
      for (int S : {1, 2, 4, 8}) {
        if (g_quick && (S == 2 || S == 8)) continue;
        for (DType ydt : {DType::kBF16, DType::kF32}) {
          if (big && (ydt == DType::kF32) != (S == 2 || S == 8)) continue;  // CPU time
          Problem p{sh[0], sh[1], sh[2], S, ydt, variant % 3};
          ++variant;
          run_all_paths(p);
        }
      }
    }
    // Special values (NaN, ±inf, ±0, subnormals).
    for (int S : {1, 4}) {
      for (DType ydt : {DType::kBF16, DType::kF32}) {
        Problem p{g_quick ? 70 : 200, g_quick ? 90 : 300, 500, S, ydt, S == 1 ? 2 : 1, true};
        run_all_paths(p);
      }
    }
    for (int S : {1, 2, 8}) run_invariance(S, S == 2 ? DType::kF32 : DType::kBF16);
    run_partials(g_quick ? 70 : 300, g_quick ? 90 : 520, 1000, 8);
    run_partials(g_quick ? 70 : 257, g_quick ? 90 : 300, 333, 8);
    // The segment-pair path on TP partials (S / t = 8, 4 segments per rank; fewer: the tree).
    run_partials(g_quick ? 70 : 300, g_quick ? 90 : 520, 1000, 8, /*pairs=*/true);
    if (!g_quick) run_partials(130, 260, 4104, 4);
    if (!g_quick) {
      using Q = lockstep::engine::GemmShape;
      const std::vector<Q> qs =
          lockstep::engine::qwen3_gemm_shapes(lockstep::engine::qwen3_shape_config("qwen3-8b"));
      const Q &qkv = qs[0], &down = qs[3];
      for (const Q& q : qs) {
        run_qwen(q.name, q.n, q.k, 1, 1, DType::kBF16, false);
        run_qwen(q.name, q.n, q.k, 8, 2, DType::kF32, true);
        run_qwen(q.name, q.n, q.k, 4096, 1, DType::kBF16, &q == &qkv);
      }
      run_qwen(qkv.name, qkv.n, qkv.k, 4096, 4, DType::kF32, false);
      run_qwen(down.name, down.n, down.k, 4096, 4, DType::kBF16, true);
      for (const Q& q : qs)
        std::printf("plan: %s\n",
                    lockstep::cuda::gemm_launch_plan(4096, q.n, q.k, GemmConfig{1}).c_str());
      std::printf("plan: %s\n",
                  lockstep::cuda::gemm_launch_plan(8, 4096, 4096, GemmConfig{1}).c_str());
      std::printf("plan: %s\n",
                  lockstep::cuda::gemm_launch_plan(1024, qkv.n, qkv.k, GemmConfig{4}).c_str());
    }
    run_errors();
  } catch (const std::exception& e) {
    report(false, std::string("exception: ") + e.what());
  }
  std::printf("kernel runs:");
  for (const auto& kv : g_path_runs) std::printf(" [%s] %d", kv.first.c_str(), kv.second);
  std::printf("\n");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("test_gemm_parity: %.1f s\n", secs);
  return finish("test_gemm_parity");
}
