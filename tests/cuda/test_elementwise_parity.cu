// Probe: straightforward CUDA kernels written from docs/contract.md §E alone (RMSNorm
// one warp per row with the 32-lane layout, RoPE, SiLU-and-mul, embedding + vocab-parallel
// combine), compared bit for bit with the CPU backend (src/cpu/*.cc) on random data, specials
// (NaN, inf, +-0, subnormal squares, overflow) and every bf16 gate value. Not a product kernel:
// it proves the contract text is GPU-implementable and that hardware cvt/div/sqrt/exp agree.
//   nvcc -std=c++17 -O2 -fmad=false -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc \
//     dev/elementwise_parity.cu <lockstep CPU objects> -o elementwise_parity
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/math.h"
#include "lockstep/ops/activation.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"

using lockstep::bf16;
using lockstep::DType;
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

// ---- device helpers: hardware conversion + the contract's canonical NaN.
__device__ __forceinline__ float ld(const uint16_t* p, int64_t i) {
  return __uint_as_float(uint32_t(p[i]) << 16);
}
__device__ __forceinline__ uint16_t rnd(float v) {  // RNE via cvt.rn.bf16.f32, NaN -> 0x7FC0
  if (v != v) return 0x7FC0;
  __nv_bfloat16 h = __float2bfloat16_rn(v);
  return *reinterpret_cast<uint16_t*>(&h);
}
__device__ __forceinline__ uint16_t rnd_raw(float v) {  // intermediate rounding, NaN unspecified
  __nv_bfloat16 h = __float2bfloat16_rn(v);
  return *reinterpret_cast<uint16_t*>(&h);
}

// ---- RMSNorm (+ residual): one warp per row.
__global__ void rmsnorm_kernel(const uint16_t* x, const uint16_t* res, const uint16_t* w,
                               uint16_t* res_out, uint16_t* y, int64_t rows, int64_t H, float eps) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warp exits together
  const uint16_t* xr = x + row * H;
  const uint16_t* src = xr;
  if (res) {
    for (int64_t g = lane; g * 8 < H; g += 32) {
      for (int64_t k = g * 8; k < g * 8 + 8 && k < H; ++k) {
        res_out[row * H + k] = rnd(__fadd_rn(ld(xr, k), ld(res + row * H, k)));
      }
    }
    src = res_out + row * H;  // each lane re-reads only what it wrote itself
  }
  float acc = 0.0f;
  for (int64_t g = lane; g * 8 < H; g += 32) {
    for (int64_t k = g * 8; k < g * 8 + 8 && k < H; ++k) {
      const float v = ld(src, k);
      acc = __fadd_rn(acc, __fmul_rn(v, v));
    }
  }
  for (int o = 16; o >= 1; o /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
  const float mean = __fdiv_rn(acc, float(H));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
  for (int64_t g = lane; g * 8 < H; g += 32) {
    for (int64_t k = g * 8; k < g * 8 + 8 && k < H; ++k) {
      const uint16_t t = rnd_raw(__fmul_rn(ld(src, k), r));
      y[row * H + k] = rnd(__fmul_rn(__uint_as_float(uint32_t(t) << 16), ld(w, k)));
    }
  }
}

// ---- RoPE: one thread per (row, pair).
__global__ void rope_kernel(const uint16_t* x, const int64_t* pos, const float* cosT,
                            const float* sinT, uint16_t* y, int64_t T, int64_t heads, int64_t D) {
  const int64_t half = D / 2;
  const int64_t n = T * heads * half;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int64_t row = idx / half, i = idx % half, t = row / heads;
  const float c = cosT[pos[t] * half + i], s = sinT[pos[t] * half + i];
  const float a = ld(x + row * D, i), b = ld(x + row * D, i + half);
  y[row * D + i] = rnd(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
  y[row * D + i + half] = rnd(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

// ---- SiLU-and-mul on the fused [T, 2I] layout.
__global__ void silu_kernel(const uint16_t* gu, uint16_t* out, int64_t T, int64_t I) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * I) return;
  const int64_t t = idx / I, i = idx % I;
  const float g = ld(gu + t * 2 * I, i), u = ld(gu + t * 2 * I, I + i);
  const float e = lockstep::ls_expf(-g);
  const float d = __fadd_rn(1.0f, e);
  const float s = __fdiv_rn(g, d);
  out[idx] = rnd(__fmul_rn(s, u));
}

// ---- Embedding: gather (canonical NaN), shard partial (-0 elsewhere), combine.
__global__ void embed_kernel(const int64_t* ids, const uint16_t* table, int64_t v0, int64_t v1,
                             uint16_t* out, int64_t T, int64_t H) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * H) return;
  const int64_t t = idx / H, k = idx % H, id = ids[t];
  if (id < v0 || id >= v1) {
    out[idx] = 0x8000;
    return;
  }
  const uint16_t b = table[(id - v0) * H + k];
  out[idx] = (b & 0x7fff) > 0x7f80 ? 0x7FC0 : b;
}
__global__ void combine_kernel(const uint16_t* parts, int nparts, uint16_t* out, int64_t n) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  float acc = ld(parts, idx);
  for (int r = 1; r < nparts; ++r) acc = __fadd_rn(acc, ld(parts + r * n, idx));
  out[idx] = rnd(acc);
}

// ---- host side
template <typename T>
T* to_dev(const void* p, size_t bytes) {
  T* d;
  CK(cudaMalloc(&d, bytes ? bytes : 1));
  CK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
  return d;
}
std::vector<uint16_t> from_dev(const uint16_t* d, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  CK(cudaMemcpy(h.data(), d, size_t(n) * 2, cudaMemcpyDeviceToHost));
  return h;
}

int failures = 0;
void compare(const char* what, const std::vector<uint16_t>& gpu, const void* cpu, int64_t n) {
  const uint16_t* c = static_cast<const uint16_t*>(cpu);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (gpu[size_t(i)] != c[i]) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad) {
    ++failures;
    std::printf("MISMATCH %s: %lld of %lld differ; first at %lld: gpu 0x%04x cpu 0x%04x\n", what,
                (long long)bad, (long long)n, (long long)first, gpu[size_t(first)], c[first]);
  } else {
    std::printf("ok %s: %lld elements bitwise equal\n", what, (long long)n);
  }
}

std::mt19937_64 gen(12345);
void fill(Tensor& t, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<bf16>()[i] = lockstep::f32_to_bf16(d(gen));
}

void test_rmsnorm(int64_t H) {
  const int64_t T = 64;
  Tensor x(DType::kBF16, {T, H}), r(DType::kBF16, {T, H}), w(DType::kBF16, {H});
  fill(w, 1.0f);
  const float scales[] = {1.0f, 1e-20f, 1e-35f, 1e15f, 3e19f, 0.01f, 100.0f, 1e-30f};
  for (int64_t t = 0; t < T; ++t) {
    std::normal_distribution<float> d(0.0f, scales[t % 8]);
    for (int64_t k = 0; k < H; ++k) {
      x.ptr<bf16>()[t * H + k] = lockstep::f32_to_bf16(d(gen));
      r.ptr<bf16>()[t * H + k] = lockstep::f32_to_bf16(d(gen));
    }
  }
  bf16* xp = x.ptr<bf16>();
  xp[9 * H + H / 2] = bf16{0x7fc1};                                                     // NaN row
  xp[10 * H + 1] = bf16{0x7f80};                                                        // inf row
  xp[11 * H + 0] = bf16{0xff80};                                                        // -inf row
  for (int64_t k = 0; k < H; ++k) xp[12 * H + k] = bf16{uint16_t(k & 1 ? 0x8000 : 0)};  // zeros
  xp[13 * H + 2] = lockstep::f32_to_bf16(3e38f);  // residual overflow
  r.ptr<bf16>()[13 * H + 2] = lockstep::f32_to_bf16(3e38f);

  lockstep::RmsNormConfig cfg{1e-6f};
  Tensor y(DType::kBF16, {T, H}), y2(DType::kBF16, {T, H}), s2(DType::kBF16, {T, H});
  lockstep::cpu::rmsnorm(x.view(), w.view(), cfg, y.view());
  lockstep::cpu::rmsnorm_residual(x.view(), r.view(), w.view(), cfg, s2.view(), y2.view());

  auto* dx = to_dev<uint16_t>(x.data(), size_t(x.nbytes()));
  auto* dr = to_dev<uint16_t>(r.data(), size_t(r.nbytes()));
  auto* dw = to_dev<uint16_t>(w.data(), size_t(w.nbytes()));
  uint16_t *dy, *ds;
  CK(cudaMalloc(&dy, size_t(x.nbytes())));
  CK(cudaMalloc(&ds, size_t(x.nbytes())));
  const int warps = 4;
  const unsigned blocks = unsigned((T + warps - 1) / warps);
  rmsnorm_kernel<<<blocks, 32 * warps>>>(dx, nullptr, dw, nullptr, dy, T, H, cfg.eps);
  CK(cudaDeviceSynchronize());
  char name[64];
  std::snprintf(name, sizeof name, "rmsnorm H=%lld", (long long)H);
  compare(name, from_dev(dy, T * H), y.data(), T * H);
  rmsnorm_kernel<<<blocks, 32 * warps>>>(dx, dr, dw, ds, dy, T, H, cfg.eps);
  CK(cudaDeviceSynchronize());
  std::snprintf(name, sizeof name, "rmsnorm_residual y H=%lld", (long long)H);
  compare(name, from_dev(dy, T * H), y2.data(), T * H);
  std::snprintf(name, sizeof name, "rmsnorm_residual residual_out H=%lld", (long long)H);
  compare(name, from_dev(ds, T * H), s2.data(), T * H);
  cudaFree(dx), cudaFree(dr), cudaFree(dw), cudaFree(dy), cudaFree(ds);
}

void test_rope() {
  const int64_t T = 512, heads = 8, D = 128;
  lockstep::RopeConfig rc;
  rc.head_dim = D;
  rc.max_positions = 40960;
  const lockstep::RopeTable table = lockstep::RopeTable::build(rc);
  Tensor x(DType::kBF16, {T, heads, D});
  fill(x, 3.0f);
  x.ptr<bf16>()[5] = bf16{0xffc3};
  x.ptr<bf16>()[D * heads + 7] = bf16{0x7f80};
  Tensor pos(DType::kI64, {T});
  std::uniform_int_distribution<int64_t> pd(0, rc.max_positions - 1);
  for (int64_t t = 0; t < T; ++t) pos.ptr<int64_t>()[t] = t < 4 ? t : pd(gen);
  Tensor y(DType::kBF16, {T, heads, D});
  lockstep::cpu::rope(x.view(), pos.view(), table, y.view());
  auto* dx = to_dev<uint16_t>(x.data(), size_t(x.nbytes()));
  auto* dp = to_dev<int64_t>(pos.data(), size_t(pos.nbytes()));
  auto* dc = to_dev<float>(table.cos.data(), table.cos.size() * 4);
  auto* dsn = to_dev<float>(table.sin.data(), table.sin.size() * 4);
  uint16_t* dy;
  CK(cudaMalloc(&dy, size_t(x.nbytes())));
  const int64_t n = T * heads * D / 2;
  rope_kernel<<<unsigned((n + 255) / 256), 256>>>(dx, dp, dc, dsn, dy, T, heads, D);
  CK(cudaDeviceSynchronize());
  compare("rope D=128", from_dev(dy, T * heads * D), y.data(), T * heads * D);
  cudaFree(dx), cudaFree(dp), cudaFree(dc), cudaFree(dsn), cudaFree(dy);
}

void test_silu() {
  // Every gate bit pattern against a set of up values (incl. specials), plus random pairs.
  const uint16_t ups[] = {0x3f80, 0xbf80, 0x4049, 0x0000, 0x8000, 0x7f80, 0xff80, 0x0001, 0x7fc1};
  const int64_t I = 65536, T = int64_t(sizeof ups / sizeof ups[0]) + 64;
  Tensor gu(DType::kBF16, {T, 2 * I});
  std::normal_distribution<float> d(0.0f, 4.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      bf16* row = gu.ptr<bf16>() + t * 2 * I;
      if (t < int64_t(sizeof ups / sizeof ups[0])) {
        row[i] = bf16{uint16_t(i)};
        row[I + i] = bf16{ups[t]};
      } else {
        row[i] = lockstep::f32_to_bf16(d(gen));
        row[I + i] = lockstep::f32_to_bf16(d(gen));
      }
    }
  }
  Tensor out(DType::kBF16, {T, I});
  lockstep::cpu::silu_and_mul(gu.view(), out.view());
  auto* dg = to_dev<uint16_t>(gu.data(), size_t(gu.nbytes()));
  uint16_t* dout;
  CK(cudaMalloc(&dout, size_t(out.nbytes())));
  silu_kernel<<<unsigned((T * I + 255) / 256), 256>>>(dg, dout, T, I);
  CK(cudaDeviceSynchronize());
  compare("silu_and_mul (every bf16 gate x specials, + random)", from_dev(dout, T * I), out.data(),
          T * I);
  cudaFree(dg), cudaFree(dout);
}

void test_embedding() {
  const int64_t V = 1000, H = 136, T = 300;
  Tensor table(DType::kBF16, {V, H});
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  for (int64_t i = 0; i < V * H; ++i) table.ptr<bf16>()[i] = bf16{uint16_t(bits(gen))};
  Tensor ids(DType::kI64, {T});
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  for (int64_t t = 0; t < T; ++t) ids.ptr<int64_t>()[t] = pick(gen);
  Tensor ref(DType::kBF16, {T, H});
  lockstep::cpu::embedding(ids.view(), table.view(), ref.view());
  auto* dids = to_dev<int64_t>(ids.data(), size_t(ids.nbytes()));
  for (int world : {1, 2, 4, 8}) {
    std::vector<uint16_t*> shards;
    uint16_t* dparts;
    CK(cudaMalloc(&dparts, size_t(world * T * H) * 2));
    for (int r = 0; r < world; ++r) {
      const lockstep::VocabShard s = lockstep::vocab_shard(V, r, world);
      auto* dt = to_dev<uint16_t>(table.ptr<bf16>() + s.begin * H, size_t(s.size() * H) * 2);
      embed_kernel<<<unsigned((T * H + 255) / 256), 256>>>(dids, dt, s.begin, s.end,
                                                           dparts + r * T * H, T, H);
      // CPU partial of the same rank must match too.
      Tensor part(DType::kBF16, {T, H});
      lockstep::cpu::embedding_vocab_parallel(ids.view(), table.view().rows(s.begin, s.end), s, V,
                                              part.view());
      CK(cudaDeviceSynchronize());
      char name[64];
      std::snprintf(name, sizeof name, "embedding partial rank %d/%d", r, world);
      compare(name, from_dev(dparts + r * T * H, T * H), part.data(), T * H);
      cudaFree(dt);
    }
    uint16_t* dout;
    CK(cudaMalloc(&dout, size_t(T * H) * 2));
    combine_kernel<<<unsigned((T * H + 255) / 256), 256>>>(dparts, world, dout, T * H);
    CK(cudaDeviceSynchronize());
    char name[64];
    std::snprintf(name, sizeof name, "embedding combine TP=%d vs CPU TP=1", world);
    compare(name, from_dev(dout, T * H), ref.data(), T * H);
    cudaFree(dparts), cudaFree(dout);
  }
  cudaFree(dids);
}

int main() {
  for (int64_t H : {1, 3, 17, 64, 111, 128, 136, 1000, 4096, 5120}) test_rmsnorm(H);
  test_rope();
  test_silu();
  test_embedding();
  std::printf("%s: %d mismatching checks\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
