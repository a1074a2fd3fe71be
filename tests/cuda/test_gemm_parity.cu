// GPU parity of the tensor-core GEMM (lockstep::cuda::gemm_bf16_nt, src/cuda/gemm_bf16_nt.cu) with
// the CPU GEMM (lockstep::cpu::gemm_bf16_nt), bit for bit (docs/contract.md §G, docs/cuda-gemm.md):
// odd shapes (M, N, K in {1, 3, 17, 111, 1000, ...}, K not a multiple of 16·S), S = 1, 2, 4, 8,
// bf16 and f32 output, no / bf16 / f32 bias, strided rows, special values, row invariance (row m
// alone vs inside M = 64 / 1024), poisoned outputs (cells outside y stay untouched), argument
// errors. Fresh seed each run (printed; pass one as argv[1] to repeat). Then, unless --no-bench, a
// timing table vs cuBLAS (cublasGemmEx bf16 -> bf16, CUBLAS_COMPUTE_32F) on Qwen3-8B layer shapes.
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <cublas_v2.h>
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

#include "lockstep/cuda/gemm.h"
#include "lockstep/dtype.h"
#include "lockstep/ops/gemm.h"

using lockstep::bf16;
using lockstep::Device;
using lockstep::DType;
using lockstep::GemmConfig;
using lockstep::Tensor;
using lockstep::TensorView;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

int g_pass = 0, g_fail = 0;
std::mt19937_64 g_rng;

void report(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    std::printf("FAIL %s\n", what.c_str());
  }
}

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

struct Case {
  int64_t M, N, K;
  int S;
  DType ydt;
  int bias;                              // 0 none, 1 bf16, 2 f32
  int64_t padx = 0, padw = 0, pady = 0;  // extra row stride (elements)
  bool specials = false;
};

std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "M=%lld N=%lld K=%lld S=%d y=%s bias=%s pads=%lld/%lld/%lld%s",
                (long long)c.M, (long long)c.N, (long long)c.K, c.S, lockstep::dtype_name(c.ydt),
                c.bias == 0   ? "none"
                : c.bias == 1 ? "bf16"
                              : "f32",
                (long long)c.padx, (long long)c.padw, (long long)c.pady,
                c.specials ? " specials" : "");
  return buf;
}

// One parity case: GPU vs CPU bits over y, and the poisoned padding of y untouched.
void run_case(const Case& c) {
  const int64_t ldx = c.K + c.padx, ldw = c.K + c.padw, ldy = c.N + c.pady;
  const size_t ysz = lockstep::dtype_size(c.ydt);
  std::vector<uint16_t> hx(size_t(std::max<int64_t>(c.M * ldx, 1)));
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
  TensorView xc = view2(hx.data(), DType::kBF16, c.M, c.K, ldx, Device::kCPU);
  TensorView wc = view2(hw.data(), DType::kBF16, c.N, c.K, ldw, Device::kCPU);
  TensorView yc = view2(hy_cpu.data(), c.ydt, c.M, c.N, ldy, Device::kCPU);
  TensorView bc;
  if (c.bias == 1) bc = TensorView::contiguous(hb16.data(), DType::kBF16, {c.N});
  if (c.bias == 2) bc = TensorView::contiguous(hb32.data(), DType::kF32, {c.N});
  lockstep::cpu::gemm_bf16_nt(xc, wc, c.bias ? &bc : nullptr, cfg, yc);

  Dev dx(hx.size() * 2), dw(hw.size() * 2), dy(ybytes), db(hb32.size() * 4);
  CK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dy.p, 0xA5, ybytes));  // poison: same pattern as the CPU buffer's padding
  if (c.bias == 1) CK(cudaMemcpy(db.p, hb16.data(), hb16.size() * 2, cudaMemcpyHostToDevice));
  if (c.bias == 2) CK(cudaMemcpy(db.p, hb32.data(), hb32.size() * 4, cudaMemcpyHostToDevice));
  TensorView xg = view2(dx.p, DType::kBF16, c.M, c.K, ldx, Device::kCUDA);
  TensorView wg = view2(dw.p, DType::kBF16, c.N, c.K, ldw, Device::kCUDA);
  TensorView yg = view2(dy.p, c.ydt, c.M, c.N, ldy, Device::kCUDA);
  TensorView bg;
  if (c.bias) {
    bg = TensorView::contiguous(db.p, c.bias == 1 ? DType::kBF16 : DType::kF32, {c.N},
                                Device::kCUDA);
  }
  lockstep::cuda::gemm_bf16_nt(xg, wg, c.bias ? &bg : nullptr, cfg, yg);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hy_gpu.data(), dy.p, ybytes, cudaMemcpyDeviceToHost));

  // The whole buffer: written cells must match, poisoned padding must be untouched on both.
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < ybytes; i += ysz) {
    if (std::memcmp(&hy_cpu[i], &hy_gpu[i], ysz) != 0) {
      if (first < 0) first = int64_t(i / ysz);
      ++bad;
    }
  }
  std::string what = describe(c);
  if (bad) {
    char buf[160];
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &hy_cpu[size_t(first) * ysz], ysz);
    std::memcpy(&b, &hy_gpu[size_t(first) * ysz], ysz);
    std::snprintf(buf, sizeof buf, ": %lld mismatches, first at m=%lld n=%lld cpu=0x%x gpu=0x%x",
                  (long long)bad, (long long)(first / ldy), (long long)(first % ldy), a, b);
    what += buf;
  }
  report(bad == 0, what);
}

// Row invariance: row m computed alone (M = 1, x pointing at that row) equals the same row inside
// the M = 64 and M = 1024 calls, bitwise.
void run_invariance(int S, DType ydt) {
  const int64_t Mb = 1024, N = 300, K = 1000;
  std::vector<uint16_t> hx(Mb * K), hw(N * K);
  fill(hx, false);
  fill(hw, false);
  const size_t ysz = lockstep::dtype_size(ydt);
  Dev dx(hx.size() * 2), dw(hw.size() * 2), dy(Mb * N * ysz), d1(N * ysz);
  CK(cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  GemmConfig cfg{S};
  TensorView wg = TensorView::contiguous(dw.p, DType::kBF16, {N, K}, Device::kCUDA);
  for (int64_t Mc : {int64_t(64), Mb}) {
    std::vector<uint8_t> big(Mc * N * ysz), one(N * ysz);
    TensorView xg = TensorView::contiguous(dx.p, DType::kBF16, {Mc, K}, Device::kCUDA);
    TensorView yg = TensorView::contiguous(dy.p, ydt, {Mc, N}, Device::kCUDA);
    lockstep::cuda::gemm_bf16_nt(xg, wg, nullptr, cfg, yg);
    CK(cudaMemcpy(big.data(), dy.p, big.size(), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int64_t m : {int64_t(0), int64_t(37), Mc - 1, Mc / 2 + 5}) {
      TensorView x1 = TensorView::contiguous(static_cast<uint16_t*>(dx.p) + m * K, DType::kBF16,
                                             {1, K}, Device::kCUDA);
      TensorView y1 = TensorView::contiguous(d1.p, ydt, {1, N}, Device::kCUDA);
      lockstep::cuda::gemm_bf16_nt(x1, wg, nullptr, cfg, y1);
      CK(cudaMemcpy(one.data(), d1.p, one.size(), cudaMemcpyDeviceToHost));
      if (std::memcmp(one.data(), &big[size_t(m) * N * ysz], one.size()) != 0) ++bad;
    }
    char buf[128];
    std::snprintf(buf, sizeof buf, "invariance M=1 vs M=%lld S=%d y=%s (%d rows differ)",
                  (long long)Mc, S, lockstep::dtype_name(ydt), bad);
    report(bad == 0, buf);
  }
}

void run_errors() {
  Dev d(4096);
  TensorView x = TensorView::contiguous(d.p, DType::kBF16, {4, 8}, Device::kCUDA);
  TensorView w =
      TensorView::contiguous(static_cast<char*>(d.p) + 1024, DType::kBF16, {4, 8}, Device::kCUDA);
  TensorView y =
      TensorView::contiguous(static_cast<char*>(d.p) + 2048, DType::kF32, {4, 4}, Device::kCUDA);
  auto throws = [](auto&& f) {
    try {
      f();
    } catch (const lockstep::Error&) {
      return true;
    }
    return false;
  };
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
  report(!throws([&] { lockstep::cuda::gemm_bf16_nt(x, w, nullptr, cfg, y); }) &&
             cudaDeviceSynchronize() == cudaSuccess,
         "valid small call");
}

// ---- Benchmark vs cuBLAS.
// Cheap device fill for the benchmark operands: bf16 values in ±[0.5, 2) from a hash.
__global__ void bench_fill(uint16_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    p[i] = uint16_t(0x3f00 + (z & 0xff)) | uint16_t((z >> 8) & 1) << 15;
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_bench() {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    std::printf("bench: cublasCreate failed\n");
    return;
  }
  struct Shape {
    const char* name;
    int64_t K, N;
  };
  const Shape shapes[] = {
      {"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate|up", 4096, 24576}, {"down", 12288, 4096}};
  const int64_t Ms[] = {1, 64, 1024, 4096};
  const int64_t maxK = 12288, maxN = 24576, maxM = 4096;
  Dev dx(maxM * maxK * 2), dw(maxN * maxK * 2), dy(maxM * maxN * 2);
  bench_fill<<<4096, 256>>>(static_cast<uint16_t*>(dx.p), maxM * maxK, g_rng());
  bench_fill<<<4096, 256>>>(static_cast<uint16_t*>(dw.p), maxN * maxK, g_rng());
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int kWarm = 3, kRuns = 20;
  std::printf(
      "\nbenchmark: y[M,N] = x[M,K] w[N,K]^T, bf16 in, bf16 out, S=1; median of %d timed "
      "runs (cudaEvents) after %d warm-up\n",
      kRuns, kWarm);
  std::printf(
      "| layer | M | K | N | lockstep us | lockstep TFLOP/s | cuBLAS us | cuBLAS TFLOP/s "
      "| ratio |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    for (int64_t M : Ms) {
      TensorView xg = TensorView::contiguous(dx.p, DType::kBF16, {M, s.K}, Device::kCUDA);
      TensorView wg = TensorView::contiguous(dw.p, DType::kBF16, {s.N, s.K}, Device::kCUDA);
      TensorView yg = TensorView::contiguous(dy.p, DType::kBF16, {M, s.N}, Device::kCUDA);
      auto ours = [&] { lockstep::cuda::gemm_bf16_nt(xg, wg, nullptr, GemmConfig{1}, yg); };
      const float alpha = 1.0f, beta = 0.0f;
      bool cublas_ok = true;
      auto theirs = [&] {
        cublasStatus_t st =
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(s.N), int(M), int(s.K), &alpha, dw.p,
                         CUDA_R_16BF, int(s.K), dx.p, CUDA_R_16BF, int(s.K), &beta, dy.p,
                         CUDA_R_16BF, int(s.N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) cublas_ok = false;
      };
      auto time = [&](auto&& f) {
        for (int i = 0; i < kWarm; ++i) f();
        std::vector<float> ms;
        for (int i = 0; i < kRuns; ++i) {
          CK(cudaEventRecord(e0));
          f();
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float t = 0;
          CK(cudaEventElapsedTime(&t, e0, e1));
          ms.push_back(t);
        }
        return median(ms);
      };
      const float tl = time(ours), tc = time(theirs);
      const double flop = 2.0 * double(M) * double(s.N) * double(s.K);
      const double fl = flop / (tl * 1e-3) / 1e12, fc = flop / (tc * 1e-3) / 1e12;
      std::printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.1f | %.1f%s | %.2f |\n", s.name,
                  (long long)M, (long long)s.K, (long long)s.N, tl * 1e3, fl, tc * 1e3, fc,
                  cublas_ok ? "" : " (cublas error)", fl / fc);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasDestroy(h);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
  bool bench = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-bench") == 0)
      bench = false;
    else
      seed = std::strtoull(argv[i], nullptr, 10);
  }
  std::printf("test_gemm_parity: seed %llu\n", (unsigned long long)seed);
  g_rng.seed(seed);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);

  try {
    const int64_t shapes[][3] = {{1, 1, 1},         {3, 17, 111},    {17, 3, 1000}, {111, 1000, 17},
                                 {1000, 111, 1000}, {1, 1000, 1000}, {1000, 17, 3}, {130, 129, 333},
                                 {64, 256, 4096},   {256, 384, 64},  {5, 7, 0}};
    int variant = 0;
    for (auto& sh : shapes) {
      for (int S : {1, 2, 4, 8}) {
        for (DType ydt : {DType::kBF16, DType::kF32}) {
          Case c{sh[0], sh[1], sh[2], S, ydt, variant % 3};
          ++variant;
          run_case(c);
        }
      }
    }
    // Strided rows (unaligned row starts force the scalar loads), and specials.
    for (int S : {1, 4}) {
      run_case(Case{77, 45, 200, S, DType::kBF16, 1, 5, 3, 7, false});
      run_case(Case{129, 200, 256, S, DType::kF32, 2, 8, 16, 1, false});
      run_case(Case{100, 90, 500, S, DType::kBF16, 2, 0, 0, 0, true});
      run_case(Case{100, 90, 500, S, DType::kF32, 0, 0, 0, 3, true});
    }
    for (int S : {1, 2, 8}) run_invariance(S, S == 2 ? DType::kF32 : DType::kBF16);
    run_errors();
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    ++g_fail;
  }
  std::printf("test_gemm_parity: %d passed, %d failed (seed %llu)\n", g_pass, g_fail,
              (unsigned long long)seed);
  if (bench && g_fail == 0) run_bench();
  return g_fail == 0 ? 0 : 1;
}
