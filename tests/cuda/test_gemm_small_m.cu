// GPU parity of the small-M GEMM kernels (src/cuda/gemm/mainloop_small_m_*.cuh, launch_small_m.cu:
// M <= 64, decode) with the CPU GEMM (lockstep::cpu::gemm_bf16_nt), bit for bit (docs/contract.md
// §G, §M). Every case runs the public lockstep::cuda::gemm_bf16_nt (whose plan must be a small-M
// one) AND every compiled small-M tile through detail::gemm_bf16_nt_with_plan (quick mode: a
// rotating eighth of them per case), each compared with memcmp against the CPU, the poisoned
// padding of y included. A TMA tile (kind 1: warp-specialized TMA ring; kind 2: wgmma) is not a
// legal plan for operands TMA cannot read: the test knows which cases those are, counts and
// prints each skip, and fails if such a tile is refused for a case it should take. Covered: M in
// {1,2,3,7,8,16,17,33,64}, odd N and K (K not a multiple of 16), S = 1, 2, 4, 8, bias none / bf16 /
// f32, bf16 and f32 y, contiguous, padded (TMA-compatible) and unaligned rows, an unaligned x base,
// NaN / inf / subnormal inputs, segments of one k-block, K below one TMA box, several waves of
// CTAs, the Qwen3-8B layer shapes at M = 1, 8, 64, row invariance (a row alone == the same row
// inside M = 17 / 33 / 64; also through the TMA candidate tiles), and that the public call reaches
// the small-M kernel (its plan). First of all (section 0, CPU only), the kind 1 index math is
// emulated on the host for every kind 1 configuration (TMA swizzle, ldmatrix, mma fragments,
// tile sequence, tree, epilogue) and compared with the CPU GEMM: if a kind 1 variant then fails
// on the GPU while its emulation passed, look at synchronization / PTX, not at the layout.
// Fresh seed each run (printed; pass a number to repeat one). --quick: small sizes only (< 10 s,
// for compute-sanitizer). --no-dispatch-check: do not require that the public launcher calls the
// small-M path (before the launcher is wired). --no-ws: leave the kind 1 variants out. Prints
// "N passed, M failed"; exit 1 on failure (a CUDA fault stops the run at once, naming the path).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "cuda/cuda_ck.h"                    // CK
#include "cuda/gemm/internal.h"              // gemm_bf16_nt_with_plan, gemm_problem
#include "cuda/gemm/plan.h"                  // plan_gemm, gemm_small_m_tiles
#include "cuda/gemm/small_m_tma_layout.cuh"  // the kind 1 geometry (host emulation)
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
namespace detail = lockstep::cuda::detail;

namespace {

using namespace lockstep::gpu_test;  // report, g_quick, g_rng, g_pass, start, finish

bool g_dispatch_check = true;
bool g_kind1 = true;  // --no-ws: leave the TMA variants (kind 1 and the wgmma kind 2) out
// Every-variant sweep over run_case's cases: checks run / skipped (the variant declined a case it
// cannot take, e.g. kind 1 on operands TMA cannot read) / cases seen (quick mode rotates).
int64_t g_variant_checks = 0, g_variant_skips = 0, g_case_counter = 0;
std::vector<int64_t> g_checks_per_variant;

// ---- The compiled small-M tiles (plan.h), indexed for this test's every-tile sweep: kind 0 =
// cp.async ring, 1 = warp-specialized TMA ring, 2 = wgmma.
using lockstep::cuda::GemmMainloop;
using lockstep::cuda::GemmPlan;
struct SmallMTile {
  GemmMainloop mainloop;
  lockstep::cuda::GemmTile tile;
  int kind;
  std::string to_string() const {
    return std::string(lockstep::cuda::gemm_mainloop_name(mainloop)) + " " + tile.to_string();
  }
};
const std::vector<SmallMTile>& small_m_tiles() {
  static const std::vector<SmallMTile> v = [] {
    std::vector<SmallMTile> t;
    const GemmMainloop kinds[3] = {GemmMainloop::kSmallMRing, GemmMainloop::kSmallMTma,
                                   GemmMainloop::kSmallMWgmma};
    for (int k = 0; k < 3; ++k)
      for (const auto& tile : lockstep::cuda::gemm_small_m_tiles(kinds[k]))
        t.push_back({kinds[k], tile, k});
    return t;
  }();
  return v;
}
int small_m_variant_count() { return int(small_m_tiles().size()); }
const SmallMTile& small_m_variant(int v) { return small_m_tiles()[size_t(v)]; }

// The plan that runs tile v with S segments (every small-M kernel folds in registers).
GemmPlan tile_plan(int v, int S) {
  GemmPlan p;
  p.mainloop = small_m_variant(v).mainloop;
  p.tile = small_m_variant(v).tile;
  p.fold = S > 1 ? lockstep::cuda::GemmFold::kRegisters : lockstep::cuda::GemmFold::kNone;
  p.tree_levels = S > 1 ? 3 : 0;
  return p;
}
bool is_small_m(const GemmPlan& p) {
  return p.mainloop == GemmMainloop::kSmallMRing || p.mainloop == GemmMainloop::kSmallMTma ||
         p.mainloop == GemmMainloop::kSmallMWgmma;
}

// Tile v on these operands; false (nothing launched) if it is not a legal plan for them.
bool run_tile(const TensorView& x, const TensorView& w, const TensorView* b, const GemmConfig& cfg,
              const TensorView& y, int v) {
  const GemmPlan plan = tile_plan(v, cfg.segments);
  if (!lockstep::cuda::gemm_plan_legal(detail::gemm_problem(x, w, cfg), plan)) return false;
  detail::gemm_bf16_nt_with_plan(x, w, b, cfg, y, plan);
  return true;
}
// The public call; false (after running it) if its plan is not a small-M one.
bool run_public_small_m(const TensorView& x, const TensorView& w, const TensorView* b,
                        const GemmConfig& cfg, const TensorView& y) {
  lockstep::cuda::gemm_bf16_nt(x, w, b, cfg, y);
  return is_small_m(lockstep::cuda::plan_gemm(detail::gemm_problem(x, w, cfg)));
}
// The tile plan_gemm picks for TMA-compatible operands of these sizes.
int candidate_tile(int64_t M, int64_t N, int64_t K, int S) {
  lockstep::cuda::GemmProblem q;
  q.M = M;
  q.N = N;
  q.K = K;
  q.segments = S;
  q.segment_len = lockstep::gemm_k_layout(GemmConfig{S}, K).segment_len;
  const GemmPlan p = lockstep::cuda::plan_gemm(q);
  for (int v = 0; v < small_m_variant_count(); ++v)
    if (small_m_variant(v).mainloop == p.mainloop && small_m_variant(v).tile == p.tile) return v;
  return -1;
}

// Random bf16: normal values with exponents spread over 2^±8; with `specials`, also zeros of both
// signs, subnormals, infinities and NaNs (quiet and signalling payloads).
void fill(std::vector<uint16_t>& v, bool specials) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ed(-8, 8);
  std::uniform_int_distribution<int> sp(0, 999);
  for (auto& e : v) {
    uint16_t b = lockstep::f32_to_bf16(std::ldexp(nd(g_rng), ed(g_rng))).bits;
    if (specials) {
      const int r = sp(g_rng);
      if (r < 20)
        b = 0x0000;
      else if (r < 30)
        b = 0x8000;
      else if (r < 45)
        b = uint16_t(0x0001 + (g_rng() % 0x7f)) | uint16_t((g_rng() & 1) << 15);
      else if (r < 47)
        b = (g_rng() & 1) ? 0x7f80 : 0xff80;
      else if (r < 48)
        b = (g_rng() & 1) ? 0x7fa1 : 0xffc3;
    }
    e = b;
  }
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t n) { CK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

TensorView view2(void* p, DType t, int64_t rows, int64_t cols, int64_t ld, Device d) {
  TensorView v = TensorView::contiguous(p, t, {rows, cols}, d);
  v.stride[0] = ld;
  return v;
}

// The CPU reference, split over column slices of N on the CPU backend's pool (each output is
// computed by exactly one slice with the contract's chain: same bits as one call).
void cpu_ref(const TensorView& x, const TensorView& w, const TensorView* bias,
             const GemmConfig& cfg, const TensorView& y) {
  const int64_t N = w.shape[0];
  const int64_t slices = std::min<int64_t>(N, 64);
  lockstep::parallel_for(slices, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t n0 = N * s / slices, n1 = N * (s + 1) / slices;
      if (n0 == n1) continue;
      TensorView ws = w, ys = y, bs;
      ws.data = static_cast<uint16_t*>(w.data) + n0 * w.stride[0];
      ws.shape[0] = n1 - n0;
      ys.data = static_cast<char*>(y.data) + n0 * lockstep::dtype_size(y.dtype);
      ys.shape[1] = n1 - n0;
      if (bias) {
        bs = *bias;
        bs.data = static_cast<char*>(bias->data) +
                  n0 * bias->stride[0] * int64_t(lockstep::dtype_size(bias->dtype));
        bs.shape[0] = n1 - n0;
      }
      lockstep::cpu::gemm_bf16_nt(x, ws, bias ? &bs : nullptr, cfg, ys);
    }
  });
}

struct Case {
  int64_t M, N, K;
  int S;
  DType ydt;
  int bias;                              // 0 none, 1 bf16, 2 f32
  int64_t padx = 0, padw = 0, pady = 0;  // extra row stride (elements)
  bool specials = false;
  int variant = -1;  // -1: public API + default small-M tile; else this tile only
  int64_t offx = 0;  // x starts this many elements into its buffer (unaligned base if odd)
};

std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "M=%lld N=%lld K=%lld S=%d y=%s bias=%s pads=%lld/%lld/%lld offx=%lld%s%s",
                (long long)c.M, (long long)c.N, (long long)c.K, c.S, lockstep::dtype_name(c.ydt),
                c.bias == 0   ? "none"
                : c.bias == 1 ? "bf16"
                              : "f32",
                (long long)c.padx, (long long)c.padw, (long long)c.pady, (long long)c.offx,
                c.specials ? " specials" : "",
                c.variant >= 0 ? (" " + small_m_variant(c.variant).to_string()).c_str() : "");
  return buf;
}

// memcmp of the whole buffer (written cells and the poisoned padding); "" when equal.
std::string compare(const std::vector<uint8_t>& ref, const std::vector<uint8_t>& got, size_t esz,
                    int64_t ld) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < ref.size(); i += esz) {
    if (std::memcmp(&ref[i], &got[i], esz) != 0) {
      if (first < 0) first = int64_t(i / esz);
      ++bad;
    }
  }
  if (bad == 0) return "";
  uint32_t a = 0, b = 0;
  std::memcpy(&a, &ref[size_t(first) * esz], esz);
  std::memcpy(&b, &got[size_t(first) * esz], esz);
  char buf[160];
  std::snprintf(buf, sizeof buf, ": %lld mismatches, first at m=%lld n=%lld cpu=0x%x gpu=0x%x",
                (long long)bad, (long long)(first / ld), (long long)(first % ld), a, b);
  return buf;
}

void run_case(const Case& c) {
  const int64_t ldx = c.K + c.padx, ldw = c.K + c.padw, ldy = c.N + c.pady;
  const size_t ysz = lockstep::dtype_size(c.ydt);
  std::vector<uint16_t> hx(size_t(std::max<int64_t>(c.M * ldx + c.offx, 1)));
  std::vector<uint16_t> hw(size_t(std::max<int64_t>(c.N * ldw, 1)));
  fill(hx, c.specials);
  fill(hw, c.specials);
  std::vector<uint16_t> hb16(size_t(std::max<int64_t>(c.N, 1)));
  std::vector<float> hb32(size_t(std::max<int64_t>(c.N, 1)));
  fill(hb16, false);
  for (auto& b : hb32) b = std::ldexp(std::normal_distribution<float>(0, 1)(g_rng), 3);
  const size_t ybytes = size_t(std::max<int64_t>(c.M * ldy, 1)) * ysz;
  std::vector<uint8_t> hy_cpu(ybytes, 0xA5), hy_gpu(ybytes);

  GemmConfig cfg{c.S};
  TensorView xc = view2(hx.data() + c.offx, DType::kBF16, c.M, c.K, ldx, Device::kCPU);
  TensorView wc = view2(hw.data(), DType::kBF16, c.N, c.K, ldw, Device::kCPU);
  TensorView yc = view2(hy_cpu.data(), c.ydt, c.M, c.N, ldy, Device::kCPU);
  TensorView bc;
  if (c.bias == 1) bc = TensorView::contiguous(hb16.data(), DType::kBF16, {c.N});
  if (c.bias == 2) bc = TensorView::contiguous(hb32.data(), DType::kF32, {c.N});
  cpu_ref(xc, wc, c.bias ? &bc : nullptr, cfg, yc);

  Dev dx(hx.size() * 2), dw(hw.size() * 2), dy(ybytes), db(hb32.size() * 4);
  CK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  if (c.bias == 1) CK(cudaMemcpy(db.p, hb16.data(), hb16.size() * 2, cudaMemcpyHostToDevice));
  if (c.bias == 2) CK(cudaMemcpy(db.p, hb32.data(), hb32.size() * 4, cudaMemcpyHostToDevice));
  TensorView xg =
      view2(static_cast<uint16_t*>(dx.p) + c.offx, DType::kBF16, c.M, c.K, ldx, Device::kCUDA);
  TensorView wg = view2(dw.p, DType::kBF16, c.N, c.K, ldw, Device::kCUDA);
  TensorView yg = view2(dy.p, c.ydt, c.M, c.N, ldy, Device::kCUDA);
  TensorView bg;
  if (c.bias) {
    bg = TensorView::contiguous(db.p, c.bias == 1 ? DType::kBF16 : DType::kF32, {c.N},
                                Device::kCUDA);
  }
  const TensorView* bp = c.bias ? &bg : nullptr;

  // One GPU path: poison y, run, compare everything with the CPU. may_decline: a decline is a
  // skip (printed by the caller), not a failure; returns false when the path declined.
  auto check = [&](const std::string& path, auto&& call, bool may_decline = false) {
    CK(cudaMemset(dy.p, 0xA5, ybytes));
    const bool ran = call();
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      // A kernel fault is sticky: report what ran and stop (nothing later could run).
      std::printf("FAIL %s %s: CUDA error %s\n", path.c_str(), describe(c).c_str(),
                  cudaGetErrorString(e));
      std::printf("test_gemm_small_m: %d passed, %d failed (stopped at a CUDA error)\n", g_pass,
                  g_fail + 1);
      std::exit(1);
    }
    CK(cudaMemcpy(hy_gpu.data(), dy.p, ybytes, cudaMemcpyDeviceToHost));
    std::string what = path + " " + describe(c);
    if (!ran) {
      if (!may_decline) report(false, what + ": small-M path declined the case");
      return false;
    }
    const std::string diff = compare(hy_cpu, hy_gpu, ysz, ldy);
    report(diff.empty(), what + diff);
    return true;
  };
  // Kind 1 variants need TMA-compatible operands (16-byte aligned bases, row strides of views
  // with more than one row a multiple of 8 elements, K >= 1); kind 0 takes everything.
  const bool tma_ok = (c.offx * 2) % 16 == 0 && (c.M <= 1 || ldx % 8 == 0) &&
                      (c.N <= 1 || ldw % 8 == 0) && c.K >= 1;
  auto run_variant = [&](int v, const char* label) {
    const SmallMTile& t = small_m_variant(v);
    // Kind 2 (wgmma) also needs S <= 8 (its tree lives in registers).
    const bool applicable = t.kind == 0 || (tma_ok && (t.kind == 1 || c.S <= 8));
    const bool ran = check(
        std::string(label) + " #" + std::to_string(v) + " (" + t.to_string() + ")",
        [&] { return run_tile(xg, wg, bp, cfg, yg, v); }, !applicable);
    if (ran) {
      ++g_variant_checks;
      ++g_checks_per_variant[size_t(v)];
    }
    return ran;
  };
  if (c.variant >= 0) {
    if (small_m_variant(c.variant).kind >= 1 && !g_kind1) return;
    if (!run_variant(c.variant, "variant")) {
      ++g_variant_skips;
      std::printf("skip tile #%d (not applicable: operands not TMA-compatible) %s\n", c.variant,
                  describe(c).c_str());
    }
    return;
  }
  check("public", [&] { return run_public_small_m(xg, wg, bp, cfg, yg); });
  // Every compiled variant on this case (quick mode: a rotating eighth of them), kind 0 first.
  const int64_t idx = g_case_counter++;
  int skipped = 0;
  for (int kind = 0; kind < 3; ++kind) {
    if (kind >= 1 && !g_kind1) break;
    for (int v = 0; v < small_m_variant_count(); ++v) {
      if (small_m_variant(v).kind != kind) continue;
      if (g_quick && (v + idx) % 8 != 0) continue;
      if (!run_variant(v, "every-variant")) ++skipped;
    }
  }
  if (skipped > 0) {
    g_variant_skips += skipped;
    std::printf("skip %d TMA variant(s) (not applicable: operands not TMA-compatible) %s\n",
                skipped, describe(c).c_str());
  }
}

// A row alone (M = 1, x pointing at the row) == the same row inside M = 17, 33, 64 (different
// small-M tiles), through the detail call and the public one.
void run_invariance(int S, DType ydt) {
  const int64_t Mb = 64, N = 300, K = 1000;
  std::vector<uint16_t> hx(Mb * K), hw(N * K);
  fill(hx, false);
  fill(hw, false);
  const size_t ysz = lockstep::dtype_size(ydt);
  Dev dx(hx.size() * 2), dw(hw.size() * 2), dy(Mb * N * ysz), d1(N * ysz);
  CK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  GemmConfig cfg{S};
  TensorView wg = TensorView::contiguous(dw.p, DType::kBF16, {N, K}, Device::kCUDA);
  for (int64_t Mc : {int64_t(17), int64_t(33), Mb}) {
    for (int pub = 1; pub < (g_kind1 ? 3 : 2); ++pub) {
      // pub: 1 the public call (its plan must be small-M), 2 the TMA candidate tile of each M.
      auto gemm = [&](const TensorView& x, const TensorView& y) {
        if (pub == 2) return run_tile(x, wg, nullptr, cfg, y, candidate_tile(x.shape[0], N, K, S));
        return run_public_small_m(x, wg, nullptr, cfg, y);
      };
      std::vector<uint8_t> big(Mc * N * ysz), one(N * ysz);
      TensorView xg = TensorView::contiguous(dx.p, DType::kBF16, {Mc, K}, Device::kCUDA);
      TensorView yg = TensorView::contiguous(dy.p, ydt, {Mc, N}, Device::kCUDA);
      bool ran = gemm(xg, yg);
      CK(cudaMemcpy(big.data(), dy.p, big.size(), cudaMemcpyDeviceToHost));
      int bad = 0;
      for (int64_t m : {int64_t(0), int64_t(9), Mc - 1, Mc / 2 + 1}) {
        TensorView x1 = TensorView::contiguous(static_cast<uint16_t*>(dx.p) + m * K, DType::kBF16,
                                               {1, K}, Device::kCUDA);
        TensorView y1 = TensorView::contiguous(d1.p, ydt, {1, N}, Device::kCUDA);
        ran = gemm(x1, y1) && ran;
        CK(cudaMemcpy(one.data(), d1.p, one.size(), cudaMemcpyDeviceToHost));
        if (std::memcmp(one.data(), &big[size_t(m) * N * ysz], one.size()) != 0) ++bad;
      }
      char buf[160];
      std::snprintf(buf, sizeof buf, "invariance (%s) M=1 vs M=%lld S=%d y=%s (%d rows differ)%s",
                    pub == 2 ? "candidate"
                    : pub    ? "public"
                             : "detail",
                    (long long)Mc, S, lockstep::dtype_name(ydt), bad,
                    ran ? "" : " small-M path declined");
      report(bad == 0 && ran, buf);
    }
  }
}

// The public launcher must route M <= 64 to the small-M kernel (and M > 64 elsewhere).
void run_dispatch() {
  const int64_t N = 40, K = 64;
  Dev dx(65 * K * 2), dw(N * K * 2), dy(65 * N * 4);
  CK(cudaMemset(dx.p, 0, 65 * K * 2));
  CK(cudaMemset(dw.p, 0, N * K * 2));
  TensorView wg = TensorView::contiguous(dw.p, DType::kBF16, {N, K}, Device::kCUDA);
  auto count_for = [&](int64_t M) {
    TensorView xg = TensorView::contiguous(dx.p, DType::kBF16, {M, K}, Device::kCUDA);
    TensorView yg = TensorView::contiguous(dy.p, DType::kF32, {M, N}, Device::kCUDA);
    const bool small = run_public_small_m(xg, wg, nullptr, GemmConfig{1}, yg);
    CK(cudaDeviceSynchronize());
    return int64_t(small ? 1 : 0);
  };
  const int64_t c1 = count_for(1), c64 = count_for(64), c65 = count_for(65);
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "dispatch: public gemm_bf16_nt small-M launches at M=1: %lld, M=64: %lld, M=65: "
                "%lld (want 1, 1, 0)",
                (long long)c1, (long long)c64, (long long)c65);
  const bool ok = c1 == 1 && c64 == 1 && c65 == 0;
  if (!ok && !g_dispatch_check) {
    std::printf("NOTE (not counted, --no-dispatch-check) %s\n", buf);
    return;
  }
  report(ok, buf);
}

// ---- Host emulation of the kind 1 kernel's index math (no GPU): TMA's 128B-swizzled boxes with
// zero fill (x in cluster slices), ldmatrix x4 / x2 lane addressing, the mma.sync m16n8k16
// fragment layouts (each output by the contract's mma_kblock_bf16), the tile / segment sequence,
// the G.4 fold and the epilogue mapping, all through small_m_ws::Shape (gemm_small_m_ws_layout.cuh,
// the functions the kernel calls), compared bitwise with the CPU GEMM. If a kind 1 variant fails
// on the GPU while this passes, the fault is in synchronization / PTX, not in the layout.
namespace emu {

struct Mat {
  const uint16_t* p;
  int64_t rows, K, ld;
};

void tma_box(std::vector<uint8_t>& sm, uint32_t dst, const Mat& t, int64_t k0, int64_t row0,
             int rows) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < 8; ++c)
      for (int e = 0; e < 8; ++e) {
        const int64_t k = k0 + c * 8 + e, row = row0 + r;
        const uint16_t v = (row < t.rows && k < t.K) ? t.p[row * t.ld + k] : uint16_t(0);
        std::memcpy(&sm[dst + uint32_t(r * 128 + ((c ^ (r & 7)) << 4) + e * 2)], &v, 2);
      }
}
// ldmatrix: matrix i's row r from lane 8i + r's address; lane T gets word (T % 4) of row T / 4.
bool ldsm(const std::vector<uint8_t>& sm, const uint32_t (&addr)[32], int nmat,
          uint32_t (&out)[32][4]) {
  for (int T = 0; T < 32; ++T)
    for (int i = 0; i < nmat; ++i) {
      const uint32_t a = addr[8 * i + T / 4];
      if (a % 16 != 0 || a + 16 > sm.size()) return false;
      std::memcpy(&out[T][i], &sm[a + 4 * (T % 4)], 4);
    }
  return true;
}
// d += a·b for one m16n8k16 (row.col) from the 32 lanes' fragments.
void mma(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], float (&d)[32][4]) {
  lockstep::bf16 A[16][16], B[8][16];
  float C[16][8];
  auto lo = [](uint32_t w) { return lockstep::bf16{uint16_t(w & 0xffff)}; };
  auto hi = [](uint32_t w) { return lockstep::bf16{uint16_t(w >> 16)}; };
  for (int T = 0; T < 32; ++T) {
    const int g = T >> 2, t = T & 3;
    for (int r = 0; r < 4; ++r) {
      const int row = g + (r & 1) * 8, col = 2 * t + (r >> 1) * 8;
      A[row][col] = lo(a[T][r]);
      A[row][col + 1] = hi(a[T][r]);
    }
    for (int r = 0; r < 2; ++r) {
      B[g][2 * t + r * 8] = lo(b[T][r]);
      B[g][2 * t + r * 8 + 1] = hi(b[T][r]);
    }
    for (int c = 0; c < 4; ++c) C[g + (c >> 1) * 8][2 * t + (c & 1)] = d[T][c];
  }
  for (int T = 0; T < 32; ++T) {
    const int g = T >> 2, t = T & 3;
    for (int c = 0; c < 4; ++c) {
      const int row = g + (c >> 1) * 8, col = 2 * t + (c & 1);
      d[T][c] = lockstep::mma_kblock_bf16(A[row], B[col], C[row][col]);
    }
  }
}
uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The kernel's y for these operands (f32 y: canonical bits; bf16 y: the bf16 bits), or an empty
// vector if an address went wrong.
template <int WM, int MB, int WN, int NA, int KB64, int NS, int CL>
std::vector<uint32_t> run(const Mat& x, const Mat& w, const float* bias, int S, bool y_f32) {
  using Sh = lockstep::cuda::detail::small_m_ws::Shape<WM, MB, WN, NA, KB64, NS>;
  const int64_t M = x.rows, N = w.rows;
  const int seg_len = int(lockstep::gemm_k_layout(GemmConfig{S}, x.K).segment_len);
  const int nkt = Sh::nkt(seg_len), total = nkt * S;
  constexpr int C = Sh::kConsumers, R = NA * MB * 4;
  std::vector<uint32_t> y(size_t(M * N), 0xDEADBEEFu);
  for (int64_t m0 = 0; m0 < M; m0 += Sh::BM)
    for (int64_t n0 = 0; n0 < N; n0 += Sh::BN) {
      std::vector<uint8_t> sm(size_t(NS) * Sh::kStage, 0xCD);  // poison: boxes never loaded
      std::vector<float> acc(size_t(C) * 32 * R, 0.0f), stk(acc.size() * 3, 0.0f);
      auto A = [&](int wp, int T, int i, int j, int c) -> float& {
        return acc[((size_t(wp) * 32 + T) * NA * MB + i * MB + j) * 4 + c];
      };
      int stage = 0, sg = 0, kt = 0;
      for (int t = 0; t < total; ++t) {
        const uint32_t sb = uint32_t(stage * Sh::kStage);
        const int32_t k0 = Sh::tile_k0(seg_len, sg, kt);
        for (int b = 0; b < Sh::tile_boxes(seg_len, kt); ++b) {
          tma_box(sm, sb + Sh::w_box(b), w, k0 + b * 64, n0, Sh::BN);
          for (int r = 0; r < CL; ++r)
            tma_box(sm, sb + Sh::x_box(b) + uint32_t(r * (Sh::BM / CL) * 128), x, k0 + b * 64,
                    m0 + r * (Sh::BM / CL), Sh::BM / CL);
        }
        for (int wp = 0; wp < C; ++wp) {
          const int wm = wp / WN, wn = wp % WN;
          for (int kb = 0; kb < Sh::tile_kblocks(seg_len, kt); ++kb) {
            uint32_t af[NA][32][4], bf[MB][32][2], addr[32], r4[32][4];
            for (int i = 0; i < NA; ++i) {
              for (int T = 0; T < 32; ++T)
                addr[T] = sb + Sh::a_addr(Sh::a_lane_row(T, wn), Sh::a_lane_sw(T), kb) +
                          uint32_t(i) * Sh::a_tile_step();
              if (!ldsm(sm, addr, 4, af[i])) return {};
            }
            for (int q = 0; q < (MB + 1) / 2; ++q) {
              for (int T = 0; T < 32; ++T)
                addr[T] = (MB == 1 && T >= 16)
                              ? 0u
                              : sb + Sh::b_addr(Sh::b_lane_row(T, wm), Sh::b_lane_sw(T), kb) +
                                    uint32_t(q) * Sh::b_pair_step();
              if (!ldsm(sm, addr, MB == 1 ? 2 : 4, r4)) return {};
              for (int T = 0; T < 32; ++T)
                for (int h = 0; h < (MB == 1 ? 1 : 2); ++h) {
                  bf[2 * q + h][T][0] = r4[T][2 * h];
                  bf[2 * q + h][T][1] = r4[T][2 * h + 1];
                }
            }
            for (int i = 0; i < NA; ++i)
              for (int j = 0; j < MB; ++j) {
                float d[32][4];
                for (int T = 0; T < 32; ++T)
                  for (int c = 0; c < 4; ++c) d[T][c] = A(wp, T, i, j, c);
                mma(af[i], bf[j], d);
                for (int T = 0; T < 32; ++T)
                  for (int c = 0; c < 4; ++c) A(wp, T, i, j, c) = d[T][c];
              }
          }
        }
        stage = stage + 1 == NS ? 0 : stage + 1;
        if (++kt == nkt) {
          if (S > 1) {
            for (size_t e = 0; e < acc.size(); ++e) {
              int lvl = 0;
              for (; (sg >> lvl) & 1; ++lvl) acc[e] = stk[size_t(lvl) * acc.size() + e] + acc[e];
              if (sg + 1 < S) {
                stk[size_t(lvl) * acc.size() + e] = acc[e];
                acc[e] = 0.0f;
              }
            }
          }
          kt = 0;
          ++sg;
        }
      }
      for (int wp = 0; wp < C; ++wp)
        for (int T = 0; T < 32; ++T)
          for (int i = 0; i < NA; ++i)
            for (int h = 0; h < 2; ++h)
              for (int j = 0; j < MB; ++j)
                for (int e = 0; e < 2; ++e) {
                  const int64_t n = n0 + Sh::out_n(T, wp % WN, i, h);
                  const int64_t m = m0 + Sh::out_m(T, wp / WN, j, e);
                  if (n >= N || m >= M) continue;
                  float v = A(wp, T, i, j, 2 * h + e);
                  if (bias) v = v + bias[n];
                  uint32_t& out = y[size_t(m * N + n)];
                  if (out != 0xDEADBEEFu) return {};  // stored twice
                  const uint32_t u = f32_bits(v);
                  out = y_f32 ? (((u & 0x7fffffffu) > 0x7f800000u) ? 0x7FC00000u : u)
                              : lockstep::f32_to_bf16(v).bits;
                  if (!y_f32 && (u & 0x7fffffffu) > 0x7f800000u) out = 0x7FC0;
                }
    }
  return y;
}

struct Shp {
  int64_t M, N, K, ldx, ldw;
  int S;
  bool y_f32, bias;
};

// "" if every case matches the CPU, else what differed.
template <int WM, int MB, int WN, int NA, int KB64, int NS, int CL>
std::string check(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Shp shapes[] = {{7, 77, 333, 336, 344, 2, false, true},
                        {64, 50, 17, 24, 32, 8, true, false},
                        {3, 40, 1100, 1104, 1104, 1, true, true},
                        {33, 20, 130, 136, 136, 4, false, false}};
  for (const Shp& s : shapes) {
    std::vector<uint16_t> hx(size_t(s.M * s.ldx)), hw(size_t(s.N * s.ldw));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> ed(-8, 8);
    for (auto& e : hx) e = lockstep::f32_to_bf16(std::ldexp(nd(rng), ed(rng))).bits;
    for (auto& e : hw) e = lockstep::f32_to_bf16(std::ldexp(nd(rng), ed(rng))).bits;
    std::vector<float> hb(static_cast<size_t>(s.N));
    for (auto& b : hb) b = std::ldexp(nd(rng), 3);
    TensorView xv = view2(hx.data(), DType::kBF16, s.M, s.K, s.ldx, Device::kCPU);
    TensorView wv = view2(hw.data(), DType::kBF16, s.N, s.K, s.ldw, Device::kCPU);
    TensorView bv = TensorView::contiguous(hb.data(), DType::kF32, {s.N});
    std::vector<uint32_t> ref(size_t(s.M * s.N), 0);
    std::vector<uint16_t> ref16(ref.size(), 0);
    TensorView yv = s.y_f32 ? TensorView::contiguous(ref.data(), DType::kF32, {s.M, s.N})
                            : TensorView::contiguous(ref16.data(), DType::kBF16, {s.M, s.N});
    lockstep::cpu::gemm_bf16_nt(xv, wv, s.bias ? &bv : nullptr, GemmConfig{s.S}, yv);
    if (!s.y_f32)
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = ref16[i];
    const std::vector<uint32_t> got = run<WM, MB, WN, NA, KB64, NS, CL>(
        Mat{hx.data(), s.M, s.K, s.ldx}, Mat{hw.data(), s.N, s.K, s.ldw},
        s.bias ? hb.data() : nullptr, s.S, s.y_f32);
    char buf[200];
    if (got.empty()) {
      std::snprintf(buf, sizeof buf, "M=%lld N=%lld K=%lld: bad address or double store",
                    (long long)s.M, (long long)s.N, (long long)s.K);
      return buf;
    }
    for (size_t i = 0; i < ref.size(); ++i)
      if (ref[i] != got[i]) {
        std::snprintf(buf, sizeof buf, "M=%lld N=%lld K=%lld S=%d: first difference m=%lld n=%lld",
                      (long long)s.M, (long long)s.N, (long long)s.K, s.S,
                      (long long)(int64_t(i) / s.N), (long long)(int64_t(i) % s.N));
        return buf;
      }
  }
  return "";
}

}  // namespace emu

// Section 0: the emulation of every kind 1 configuration of the variant table (gemm_small_m.cu;
// keep the list in step with it), on the CPU pool, one report each.
void run_host_emulation() {
  struct Job {
    const char* name;
    std::string (*fn)(uint64_t);
  };
#define LS_EMU(WM, MB, WN, NA, KB64, NS, CL)                                         \
  Job {                                                                              \
    "WM=" #WM " MB=" #MB " WN=" #WN " NA=" #NA " KB64=" #KB64 " NS=" #NS " CL=" #CL, \
        &emu::check<WM, MB, WN, NA, KB64, NS, CL>                                    \
  }
  const Job jobs[] = {
      LS_EMU(1, 1, 1, 1, 4, 12, 1), LS_EMU(1, 1, 2, 1, 4, 9, 1),  LS_EMU(1, 1, 3, 1, 4, 7, 1),
      LS_EMU(1, 1, 4, 1, 2, 11, 1), LS_EMU(1, 1, 3, 2, 2, 7, 1),  LS_EMU(1, 1, 4, 3, 1, 8, 1),
      LS_EMU(1, 2, 1, 1, 4, 10, 1), LS_EMU(1, 2, 2, 1, 4, 8, 1),  LS_EMU(1, 2, 3, 1, 4, 6, 1),
      LS_EMU(1, 2, 4, 1, 2, 10, 1), LS_EMU(1, 2, 3, 2, 2, 7, 1),  LS_EMU(1, 2, 4, 3, 1, 8, 1),
      LS_EMU(2, 2, 1, 1, 4, 8, 1),  LS_EMU(2, 2, 2, 1, 2, 12, 1), LS_EMU(2, 2, 3, 1, 2, 10, 1),
      LS_EMU(2, 2, 2, 2, 2, 8, 1),  LS_EMU(2, 2, 3, 2, 2, 6, 1),  LS_EMU(2, 2, 4, 3, 1, 7, 1),
      LS_EMU(2, 4, 1, 1, 2, 10, 1), LS_EMU(2, 4, 2, 1, 2, 8, 1),  LS_EMU(2, 4, 3, 1, 2, 7, 1),
      LS_EMU(2, 4, 2, 2, 2, 6, 1),  LS_EMU(2, 4, 3, 2, 1, 10, 1), LS_EMU(2, 4, 6, 2, 1, 6, 1),
      LS_EMU(1, 1, 1, 2, 4, 9, 1),  LS_EMU(1, 1, 2, 1, 1, 32, 1), LS_EMU(1, 1, 2, 1, 8, 4, 1),
      LS_EMU(1, 2, 1, 2, 4, 8, 1),  LS_EMU(1, 1, 3, 2, 2, 4, 1),  LS_EMU(1, 2, 4, 3, 2, 4, 1),
      LS_EMU(4, 2, 2, 1, 2, 8, 1),  LS_EMU(1, 8, 2, 1, 2, 8, 1),  LS_EMU(4, 2, 2, 2, 2, 6, 1),
      LS_EMU(2, 2, 1, 1, 4, 8, 2),  LS_EMU(2, 2, 2, 1, 2, 12, 2), LS_EMU(2, 2, 3, 1, 2, 10, 2),
      LS_EMU(2, 2, 2, 2, 2, 8, 2),  LS_EMU(2, 2, 3, 2, 2, 6, 2),  LS_EMU(2, 2, 4, 3, 1, 7, 2),
      LS_EMU(2, 4, 1, 1, 2, 10, 2), LS_EMU(2, 4, 2, 1, 2, 8, 2),  LS_EMU(2, 4, 3, 1, 2, 7, 2),
      LS_EMU(2, 4, 2, 2, 2, 6, 2),  LS_EMU(2, 4, 3, 2, 1, 10, 2), LS_EMU(2, 4, 6, 2, 1, 6, 2),
      LS_EMU(1, 2, 2, 1, 4, 8, 2),  LS_EMU(2, 4, 2, 1, 2, 8, 4),  LS_EMU(2, 4, 1, 2, 2, 8, 2),
      LS_EMU(2, 4, 1, 2, 2, 8, 1),
  };
#undef LS_EMU
  constexpr int64_t kJobs = int64_t(sizeof(jobs) / sizeof(jobs[0]));
  std::vector<std::string> result(static_cast<size_t>(kJobs));
  const uint64_t seed = g_rng();
  lockstep::parallel_for(kJobs, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) result[size_t(j)] = jobs[j].fn(seed + uint64_t(j));
  });
  for (int64_t j = 0; j < kJobs; ++j)
    report(result[size_t(j)].empty(),
           std::string("host emulation of kind 1 ") + jobs[j].name +
               (result[size_t(j)].empty() ? "" : ": " + result[size_t(j)]));
  std::printf("host emulation: %lld kind 1 configurations checked against the CPU GEMM\n",
              (long long)kJobs);
}

}  // namespace

int main(int argc, char** argv) {
  if (!start("test_gemm_small_m", argc, argv,
             {{"--no-dispatch-check", &g_dispatch_check, false}, {"--no-ws", &g_kind1, false}}))
    return 2;
  g_checks_per_variant.assign(size_t(small_m_variant_count()), 0);
  if (!g_kind1) std::printf("--no-ws: kind 1 variants left out\n");
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; %d small-M tiles; compiled == planned: %s\n", prop.name,
              prop.multiProcessorCount, small_m_variant_count(),
              detail::small_m_kernels_missing() == 0 ? "yes" : "NO");
  report(detail::small_m_kernels_missing() == 0,
         "the compiled small-M kernels are exactly the planner's tiles");
  const auto t0 = std::chrono::steady_clock::now();

  try {
    // 0. The kind 1 index math, emulated on the host (no GPU involved).
    if (g_kind1) run_host_emulation();

    // 1. All M of interest x odd N and K x S x y dtype, bias rotating (public + detail + every
    // variant). Row strides: contiguous, padded to a multiple of 8 elements for S = 2 and 8 (odd
    // K that TMA can read), or always padded ({77, 333}).
    const int64_t Ms[] = {1, 2, 3, 7, 8, 16, 17, 33, 64};
    struct NK {
      int64_t N, K;
      int pad;  // 0 contiguous, 1 padded for S = 2 and 8, 2 always padded
    };
    std::vector<NK> nk = {{111, 1000, 0}, {3, 17, 1}, {1, 1, 1}, {77, 333, 2}};
    if (!g_quick) nk.push_back({259, 4100, 0});
    int variant = 0;
    for (int64_t M : Ms)
      for (const NK& e : nk)
        for (int S : {1, 2, 4, 8})
          for (DType ydt : {DType::kBF16, DType::kF32}) {
            Case c{M, e.N, e.K, S, ydt, variant % 3};
            if (e.pad == 2 || (e.pad == 1 && (S == 2 || S == 8))) {
              c.padx = (e.K + 7) / 8 * 8 - e.K + (S == 8 ? 8 : 0);
              c.padw = (e.K + 7) / 8 * 8 - e.K + 8;
            }
            run_case(c);
            ++variant;
          }
    run_case(Case{5, 7, 0, 1, DType::kBF16, 1});  // K = 0: y = bias
    run_case(Case{5, 7, 0, 4, DType::kF32, 0});   // K = 0: y = +0

    // 2. Every compiled tile variant (the benchmark's sweep uses them all).
    for (int v = 0; v < small_m_variant_count(); ++v) {
      const int64_t vm[] = {1, 7, 13, 40, 64};
      for (int i = 0; i < 5; ++i) {
        Case c{vm[i],
               i % 2 ? 77 : 200,
               i % 2 ? 333 : 1000,
               1 << (i % 4),
               i % 2 ? DType::kF32 : DType::kBF16,
               (v + i) % 3};
        c.variant = v;
        run_case(c);
      }
    }

    // 3. Strided rows: unaligned strides (scalar loads), aligned strides, an unaligned x base.
    for (int S : {1, 4}) {
      for (int64_t M : {1, 8, 33, 64}) {
        run_case(Case{M, 45, 200, S, DType::kBF16, 1, 5, 3, 7});
        run_case(Case{M, 200, 256, S, DType::kF32, 2, 8, 16, 1});
        run_case(Case{M, 70, 130, S, DType::kBF16, 0, 0, 0, 0, false, -1, 1});
      }
    }

    // 4. Special values: NaN, inf, subnormals, signed zeros (the padded rows: TMA-compatible).
    for (int S : {1, 4}) {
      for (int64_t M : {3, 64}) {
        run_case(Case{M, 90, 500, S, DType::kBF16, 2, 0, 0, 0, true});
        run_case(Case{M, 90, 500, S, DType::kF32, 1, 0, 0, 3, true});
        run_case(Case{M, 90, 500, S, DType::kF32, 0, 4, 12, 1, true});
      }
    }

    // 4b. Pipeline edges: segments of one k-block, most of them past K (K = 16, S = 8); K below
    // one 64-wide TMA box; a segment whose last k-tile holds one k-block (K = 2056); several
    // waves of CTAs (N = 5000); x rows past M inside a box; an x base 16 bytes into its buffer.
    run_case(Case{17, 300, 16, 8, DType::kF32, 2});
    run_case(Case{64, 33, 8, 2, DType::kBF16, 1});
    run_case(Case{40, 1000, 2056, 1, DType::kBF16, 0});
    run_case(Case{9, 5000, 520, 4, DType::kF32, 1});
    run_case(Case{2, 130, 1000, 1, DType::kBF16, 2, 0, 0, 0, false, -1, 8});

    // 5. Qwen3-8B layer shapes (N, K): qkv, o_proj, gate|up, down.
    if (!g_quick) {
      const std::vector<lockstep::engine::GemmShape> shapes =
          lockstep::engine::qwen3_gemm_shapes(lockstep::engine::qwen3_shape_config("qwen3-8b"));
      int i = 0;
      for (int64_t M : {1, 8, 64})
        for (const auto& sh : shapes) {
          run_case(Case{M, sh.n, sh.k, 1, DType::kBF16, (i % 4 == 3) ? 1 : 0});
          ++i;
        }
    }

    // 6. Row invariance and dispatch.
    for (int S : {1, 2, 8}) run_invariance(S, S == 2 ? DType::kF32 : DType::kBF16);
    run_dispatch();

    // 7. Coverage of the every-variant sweep: each variant must have run (and matched) cases.
    int64_t min_checks = -1;
    int min_v = -1;
    for (int v = 0; v < small_m_variant_count(); ++v) {
      if (small_m_variant(v).kind >= 1 && !g_kind1) continue;
      if (min_checks < 0 || g_checks_per_variant[size_t(v)] < min_checks) {
        min_checks = g_checks_per_variant[size_t(v)];
        min_v = v;
      }
    }
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "every-variant sweep: %lld checks run, %lld skipped (not applicable); fewest "
                  "checks: #%d with %lld",
                  (long long)g_variant_checks, (long long)g_variant_skips, min_v,
                  (long long)min_checks);
    std::printf("%s\n", buf);
    report(min_checks >= 5, buf);
  } catch (const std::exception& e) {
    report(false, std::string("exception: ") + e.what());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("test_gemm_small_m: %.1f s\n", secs);
  return finish("test_gemm_small_m");
}
