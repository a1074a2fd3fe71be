// Benchmark of the small-M (decode) GEMM vs cuBLAS on the Qwen3-8B layer shapes, side by side in
// one run: y[M,N] = x[M,K] w[N,K]^T, bf16 in, bf16 out, S = 1, M in {1, 8, 16, 32, 64}.
//   default:   the cp.async-ring tile plan_gemm picks for operands TMA cannot read
//   candidate: the tile plan_gemm picks for these (TMA-compatible) operands (TMA ring, or wgmma),
//              and whether its y is bitwise equal to the default's on the benchmark data
//   public:    lockstep::cuda::gemm_bf16_nt (host checks + dispatch included)
//   cuBLAS:    cublasGemmEx(OP_T, OP_N, N, M, K, w, x), bf16 -> bf16, CUBLAS_COMPUTE_32F
// Timing: one cudaEvent pair around each call, median of --reps (default 60) after 5 warm-ups.
// Before each call a ~30 us spin kernel is queued so that the host-side launch cost (argument
// checks, tensor maps, cuBLAS heuristics) is hidden: the events time the GPU work only, for all
// peers alike. "cold": each call uses the next of several copies of w (>= 240 MB in all, L2 is
// 50-60 MB), so w comes from HBM as in a real decode step; "hot": the same w every call (o_proj
// fits in L2). GB/s counts the bytes of w (N·K·2) only. Also: a device-to-device copy (HBM
// reference) and, with --sweep, every shipped small-M tile per shape (cold), to tune the tables
// (built as dev_bench_gemm_small_m with -DLOCKSTEP_DEV_GEMM=ON, also dev/gemm's sweep-only tiles).
// Rows are printed as they are measured (a fault in one variant leaves the earlier ones); the
// summary tables follow. --no-ws: leave the kind 1 variants out (candidate column empty).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"        // CK
#include "cuda/gemm/internal.h"  // gemm_bf16_nt_with_plan, gemm_problem
#include "cuda/gemm/plan.h"
#include "engine/config.h"         // qwen3_gemm_shapes
#include "engine/default_model.h"  // qwen3_shape_config
#ifdef LOCKSTEP_DEV_GEMM_SWEEP
#include "dev/gemm/sweep_tiles.h"  // the sweep-only tiles
#endif
#include "baseline/cuda/kernels.h"  // baseline::Context: the cuBLAS peer's handle
#include "lockstep/cuda/gemm.h"
#include "lockstep/ops/gemm.h"

using lockstep::Device;
using lockstep::DType;
using lockstep::GemmConfig;
using lockstep::TensorView;
namespace detail = lockstep::cuda::detail;

namespace {

// bf16 values in ±[0.5, 2) from a hash (never zeros: zeros can run faster).
__global__ void fill_kernel(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    p[i] = uint16_t(0x3f00 + (z & 0xff)) | uint16_t((z >> 8) & 1) << 15;
  }
}

// Keeps the GPU busy for ~ns nanoseconds so the next launches queue up behind it.
__global__ void spin_kernel(int64_t ns) {
  const uint64_t start = clock64();
  const uint64_t cycles = uint64_t(ns) * 2;  // ~2 GHz
  while (clock64() - start < cycles) {
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timer {
  cudaStream_t s;
  cudaEvent_t e0, e1;
  int reps;
  explicit Timer(cudaStream_t st, int r) : s(st), reps(r) {
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
  }
  ~Timer() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  // f(i): the i-th call. Median microseconds.
  template <class F>
  float us(F&& f) {
    for (int i = 0; i < 5; ++i) f(i);
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      spin_kernel<<<1, 1, 0, s>>>(30000);
      CK(cudaEventRecord(e0, s));
      f(i + 5);
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1e3f);
    }
    CK(cudaGetLastError());
    return median(t);
  }
};

// The tiles the sweep can run: the shipped small-M tiles (plan.h), then (dev build) dev/gemm's.
struct SweepTile {
  std::string name;
  int kind;                       // 0 cp.async ring, 1 TMA ring, 2 wgmma
  lockstep::cuda::GemmPlan plan;  // shipped tiles
  int dev = -1;                   // dev/gemm tile index
};
std::vector<SweepTile> sweep_tiles() {
  using lockstep::cuda::GemmMainloop;
  std::vector<SweepTile> v;
  const GemmMainloop kinds[3] = {GemmMainloop::kSmallMRing, GemmMainloop::kSmallMTma,
                                 GemmMainloop::kSmallMWgmma};
  for (int k = 0; k < 3; ++k) {
    for (const auto& t : lockstep::cuda::gemm_small_m_tiles(kinds[k])) {
      SweepTile st;
      st.plan.mainloop = kinds[k];
      st.plan.tile = t;
      st.kind = k;
      st.name = std::string(lockstep::cuda::gemm_mainloop_name(kinds[k])) + " " + t.to_string();
      v.push_back(st);
    }
  }
#ifdef LOCKSTEP_DEV_GEMM_SWEEP
  for (int i = 0; i < lockstep::dev::small_m_sweep_tile_count(); ++i) {
    SweepTile st;
    st.name = "[dev] " + lockstep::dev::small_m_sweep_tile_name(i);
    st.kind = lockstep::dev::small_m_sweep_tile_uses_tma(i) ? 1 : 0;
    st.dev = i;
    v.push_back(st);
  }
#endif
  return v;
}

int tile_index(const std::vector<SweepTile>& tiles, const lockstep::cuda::GemmPlan& p) {
  for (size_t i = 0; i < tiles.size(); ++i)
    if (tiles[i].dev < 0 && tiles[i].plan.mainloop == p.mainloop && tiles[i].plan.tile == p.tile)
      return int(i);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  bool sweep = false, kind1 = true;
  int reps = 60;
  const char* out_dir = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--sweep") == 0)
      sweep = true;
    else if (std::strcmp(argv[i], "--no-ws") == 0)
      kind1 = false;
    else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(5, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc)
      out_dir = argv[++i];
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_gemm_small_m: %s, %d SMs, L2 %d MB, reps %d\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, reps);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // cuBLAS as the baseline engine configures it (baseline::Context: a 32 MiB workspace, fp32
  // split-K sums), so the GEMM bars and the engine's ratios share one peer.
  const lockstep::cuda::baseline::Context cublas_ctx;
  cublasHandle_t h = static_cast<cublasHandle_t>(cublas_ctx.cublas());
  cublasSetStream(h, stream);
  Timer timer(stream, reps);

  // HBM reference: device-to-device copy of 1 GiB (bytes read + written).
  double copy_gbs = 0;
  {
    const size_t bytes = size_t(1) << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, stream));
    Timer t(stream, 10);
    const float us =
        t.us([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream)); });
    copy_gbs = 2.0 * double(bytes) / (us * 1e-6) / 1e9;
    std::printf("device-to-device copy 1 GiB: %.1f us, %.0f GB/s (read + write)\n", us, copy_gbs);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }

  using Shape = lockstep::engine::GemmShape;
  const std::vector<Shape> shapes =
      lockstep::engine::qwen3_gemm_shapes(lockstep::engine::qwen3_shape_config("qwen3-8b"));
  const int64_t Ms[] = {1, 8, 16, 32, 64};
  const float alpha = 1.0f, beta = 0.0f;

  struct Row {
    std::string shape;
    int64_t M;
    double wbytes;
    int vdef, vcand;
    float cold_def, cold_cand, cold_pub, cold_cub, hot_def, hot_cand, hot_cub;
    int same;  // candidate y == default y bitwise (1), differs (0), not run (-1)
  };
  std::vector<Row> rows;
  std::string sweep_csv = "shape,M,variant,tile,us_cold,GBps\n";
  std::vector<std::string> sweep_best;
  const std::vector<SweepTile> tiles = sweep_tiles();
  std::printf("\nper row (cold us): default | candidate | public | cuBLAS\n");

  for (const Shape& s : shapes) {
    const size_t wbytes = size_t(s.n * s.k * 2);
    const int copies = int(std::max<size_t>(2, (size_t(240) << 20) / wbytes + 1));
    std::vector<void*> ws(copies);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&ws[c], wbytes));
      fill_kernel<<<2048, 256, 0, stream>>>(static_cast<uint16_t*>(ws[c]), s.n * s.k, 77 + c);
    }
    void *dx = nullptr, *dy = nullptr, *dy2 = nullptr;
    CK(cudaMalloc(&dx, size_t(64 * s.k * 2)));
    CK(cudaMalloc(&dy, size_t(64 * s.n * 2)));
    CK(cudaMalloc(&dy2, size_t(64 * s.n * 2)));
    fill_kernel<<<256, 256, 0, stream>>>(static_cast<uint16_t*>(dx), 64 * s.k, 5);
    CK(cudaStreamSynchronize(stream));
    CK(cudaGetLastError());

    for (int64_t M : Ms) {
      TensorView xg = TensorView::contiguous(dx, DType::kBF16, {M, s.k}, Device::kCUDA);
      TensorView yg = TensorView::contiguous(dy, DType::kBF16, {M, s.n}, Device::kCUDA);
      auto wv = [&](int i) {
        return TensorView::contiguous(ws[i % copies], DType::kBF16, {s.n, s.k}, Device::kCUDA);
      };
      bool ok = true;
      auto ours = [&](int i, int variant, const TensorView& y) {
        const SweepTile& t = tiles[size_t(variant)];
#ifdef LOCKSTEP_DEV_GEMM_SWEEP
        if (t.dev >= 0) {
          ok = lockstep::dev::run_small_m_sweep_tile(t.dev, xg, wv(i), y, stream) && ok;
          return;
        }
#endif
        const TensorView w = wv(i);
        if (!lockstep::cuda::gemm_plan_legal(detail::gemm_problem(xg, w, GemmConfig{1}), t.plan)) {
          ok = false;
          return;
        }
        detail::gemm_bf16_nt_with_plan(xg, w, nullptr, GemmConfig{1}, y, t.plan, stream);
      };
      auto pub = [&](int i) {
        lockstep::cuda::gemm_bf16_nt(xg, wv(i), nullptr, GemmConfig{1}, yg, stream);
      };
      bool cub_ok = true;
      auto cub = [&](int i) {
        cublasStatus_t st =
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(M), int(s.k), &alpha,
                         ws[i % copies], CUDA_R_16BF, int(s.k), dx, CUDA_R_16BF, int(s.k), &beta,
                         dy, CUDA_R_16BF, int(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) cub_ok = false;
      };
      Row r{s.name, M, double(wbytes)};
      lockstep::cuda::GemmProblem q = detail::gemm_problem(xg, wv(0), GemmConfig{1});
      r.vcand = kind1 ? tile_index(tiles, lockstep::cuda::plan_gemm(q)) : -1;
      q.tma_ok = false;
      r.vdef = tile_index(tiles, lockstep::cuda::plan_gemm(q));
      r.cold_def = timer.us([&](int i) { ours(i, r.vdef, yg); });
      r.cold_cand = r.hot_cand = -1;
      r.same = -1;
      if (r.vcand >= 0) {
        r.cold_cand = timer.us([&](int i) { ours(i, r.vcand, yg); });
        // Bits: the candidate's y against the default's, same x and w (copy 0).
        TensorView y2 = TensorView::contiguous(dy2, DType::kBF16, {M, s.n}, Device::kCUDA);
        CK(cudaMemsetAsync(dy, 0x11, size_t(M * s.n * 2), stream));
        CK(cudaMemsetAsync(dy2, 0x22, size_t(M * s.n * 2), stream));
        ours(0, r.vdef, yg);
        ours(0, r.vcand, y2);
        std::vector<uint16_t> a(size_t(M * s.n)), b(a.size());
        CK(cudaMemcpyAsync(a.data(), dy, a.size() * 2, cudaMemcpyDeviceToHost, stream));
        CK(cudaMemcpyAsync(b.data(), dy2, b.size() * 2, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        r.same = std::memcmp(a.data(), b.data(), a.size() * 2) == 0 ? 1 : 0;
      }
      r.cold_pub = timer.us(pub);
      r.cold_cub = timer.us(cub);
      r.hot_def = timer.us([&](int) { ours(0, r.vdef, yg); });
      if (r.vcand >= 0) r.hot_cand = timer.us([&](int) { ours(0, r.vcand, yg); });
      r.hot_cub = timer.us([&](int) { cub(0); });
      if (!ok || !cub_ok)
        std::printf("WARNING %s M=%lld: ours ok=%d cublas ok=%d\n", s.name, (long long)M, int(ok),
                    int(cub_ok));
      std::printf("%s M=%lld: #%d %.1f | #%d %.1f%s | %.1f | %.1f\n", s.name, (long long)M, r.vdef,
                  r.cold_def, r.vcand, r.cold_cand,
                  r.same < 0   ? ""
                  : r.same > 0 ? " (bits == default)"
                               : " (BITS DIFFER from default)",
                  r.cold_pub, r.cold_cub);
      std::fflush(stdout);
      rows.push_back(r);

      if (sweep) {
        float best = 1e30f;
        int bestv = -1;
        for (int v = 0; v < int(tiles.size()); ++v) {
          if (!kind1 && tiles[size_t(v)].kind >= 1) continue;
          ok = true;
          const float t = timer.us([&](int i) { ours(i, v, yg); });
          char line[240];
          // A declined launch (e.g. a cluster the GPU cannot place) timed nothing: marked, never
          // the best.
          std::snprintf(line, sizeof line, "%s,%lld,%d,%s,%.2f,%.0f%s\n", s.name, (long long)M, v,
                        tiles[size_t(v)].name.c_str(), t, wbytes / (t * 1e3),
                        ok ? "" : ",declined");
          sweep_csv += line;
          if (ok && t < best) {
            best = t;
            bestv = v;
          }
        }
        char line[320];
        std::snprintf(line, sizeof line,
                      "%s M=%lld: best #%d %.1f us (%s) | default #%d %.1f | candidate #%d %.1f | "
                      "cuBLAS %.1f",
                      s.name, (long long)M, bestv, best,
                      bestv >= 0 ? tiles[size_t(bestv)].name.c_str() : "-", r.vdef, r.cold_def,
                      r.vcand, r.cold_cand, r.cold_cub);
        std::printf("%s\n", line);
        std::fflush(stdout);
        sweep_best.push_back(line);
      }
    }
    for (void* p : ws) CK(cudaFree(p));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dy2));
  }

  if (sweep) {
    std::printf("\nsweep (cold, every tile; full table in sweep.csv with --out):\n");
    for (auto& l : sweep_best) std::printf("%s\n", l.c_str());
    if (out_dir) {
      std::string path = std::string(out_dir) + "/sweep.csv";
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::fputs(sweep_csv.c_str(), f);
        std::fclose(f);
      }
    }
  }

  std::printf(
      "\ncold w (rotating copies, from HBM); GB/s of w; x cuBLAS = cuBLAS time / our time; HBM%% = "
      "GB/s / %.0f (D2D copy)\n",
      copy_gbs);
  std::printf(
      "| shape (N,K) | M | default tile | default us | x cuBLAS | candidate tile | candidate us "
      "| x cuBLAS | bits | candidate GB/s (HBM%%) | public us | cuBLAS us | cuBLAS GB/s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const double gd = r.wbytes / (r.cold_def * 1e3), gc = r.wbytes / (r.cold_cub * 1e3);
    const double gk = r.cold_cand > 0 ? r.wbytes / (r.cold_cand * 1e3) : 0.0;
    (void)gd;
    std::printf(
        "| %s | %lld | #%d | %.1f | %.2f | #%d | %.1f | %.2f | %s | %.0f (%.0f) | %.1f | %.1f | "
        "%.0f |\n",
        r.shape.c_str(), (long long)r.M, r.vdef, r.cold_def, r.cold_cub / r.cold_def, r.vcand,
        r.cold_cand, r.cold_cand > 0 ? r.cold_cub / r.cold_cand : 0.0,
        r.same < 0 ? "-"
        : r.same   ? "same"
                   : "DIFFER",
        gk, 100.0 * gk / copy_gbs, r.cold_pub, r.cold_cub, gc);
  }
  std::printf("\nhot w (same copy every call: L2-resident when it fits)\n");
  std::printf(
      "| shape | M | default us | candidate us | cuBLAS us | default x cuBLAS | candidate x "
      "cuBLAS |\n|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.2f | %.2f |\n", r.shape.c_str(),
                (long long)r.M, r.hot_def, r.hot_cand, r.hot_cub, r.hot_cub / r.hot_def,
                r.hot_cand > 0 ? r.hot_cub / r.hot_cand : 0.0);
  std::printf("\ntiles:\n");
  for (int v = 0; v < int(tiles.size()); ++v) {
    bool used = false;
    for (const Row& r : rows) used = used || r.vdef == v || r.vcand == v;
    if (used) std::printf("  #%d: %s\n", v, tiles[size_t(v)].name.c_str());
  }
  CK(cudaStreamDestroy(stream));
  return 0;
}
