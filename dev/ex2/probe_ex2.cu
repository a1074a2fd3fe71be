// Probe of the Hopper SFU's exp2 (MUFU.EX2, PTX ex2.approx.ftz.f32): is it a pure function of a
// fixed-point form of x, X = q(x * 2^23) (integer part -> exponent, 23-bit fraction F -> a
// mantissa table g[F] = ex2(F * 2^-23))? Runs every one of the 2^32 inputs through the hardware and
// through four candidate quantizers q, counting mismatches by the input's sign and exponent, and
// writes g as int8 deltas of its mantissa (g_delta.bin, 2^23 bytes) for the host-side analysis.
//   nvcc -O3 -arch=sm_90a -o probe_ex2 dev/ex2/probe_ex2.cu && ./probe_ex2 OUTDIR
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

__device__ __forceinline__ float hw_ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float hw_ex2_noftz(float x) {
  float y;
  asm volatile("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr int kF = 23;
constexpr uint32_t kN = 1u << kF;
constexpr int kModels = 4;  // 0 trunc toward 0, 1 RNE, 2 floor, 3 round half away
constexpr int kExamples = 24;

__global__ void table_kernel(uint32_t* g) {
  uint32_t f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f < kN) g[f] = __float_as_uint(hw_ex2(static_cast<float>(f) * 0x1p-23f));
}

// Model: y = g[F] * 2^i with ftz (results below 2^-126 -> +0), overflow -> +inf.
__device__ uint32_t model(const uint32_t* g, float x, int m) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if (u & 0x007fffffu) return 0x7fffffffu;  // NaN (value checked loosely below)
    return (u >> 31) ? 0u : 0x7f800000u;
  }
  if ((u & 0x7f800000u) == 0) x = 0.0f;  // denormal input treated as zero (ftz)
  double t = static_cast<double>(x) * 0x1p23;
  double q;
  switch (m) {
    case 0: q = trunc(t); break;
    case 1: q = rint(t); break;
    case 2: q = floor(t); break;
    default: q = round(t); break;
  }
  if (q >= 0x1p31) return 0x7f800000u;
  if (q <= -0x1p31) return 0u;
  long long X = static_cast<long long>(q);
  long long i = X >> kF;  // floor
  uint32_t F = static_cast<uint32_t>(X & (kN - 1));
  uint32_t gb = g[F];
  int e = static_cast<int>((gb >> 23) & 0xff) + static_cast<int>(i);
  if (e >= 255) return 0x7f800000u;
  if (e <= 0) return 0u;
  return (gb & 0x807fffffu) | (static_cast<uint32_t>(e) << 23);
}

struct Counts {
  unsigned long long bad[kModels][2][256];  // model, sign, exponent field of x
  unsigned int nex[kModels];
  uint32_t ex[kModels][kExamples][3];  // u, hw, model
  unsigned long long nan_noncanon;
  uint32_t nan_bits;
  unsigned long long ftz_diff;  // ex2.approx.f32 vs .ftz.f32 differ (count)
};

__global__ void check_kernel(const uint32_t* g, uint64_t base, Counts* c) {
  uint64_t idx = base + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  uint32_t u = static_cast<uint32_t>(idx);
  float x = __uint_as_float(u);
  uint32_t hw = __float_as_uint(hw_ex2(x));
  uint32_t hn = __float_as_uint(hw_ex2_noftz(x));
  if (hn != hw) atomicAdd(&c->ftz_diff, 1ull);
  bool isnan_in = (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu);
  if (isnan_in) {
    if (hw != 0x7fffffffu) {
      atomicAdd(&c->nan_noncanon, 1ull);
      c->nan_bits = hw;
    }
    return;
  }
  for (int m = 0; m < kModels; ++m) {
    uint32_t mo = model(g, x, m);
    if (mo != hw) {
      atomicAdd(&c->bad[m][u >> 31][(u >> 23) & 0xff], 1ull);
      unsigned k = atomicAdd(&c->nex[m], 1u);
      if (k < kExamples) {
        c->ex[m][k][0] = u;
        c->ex[m][k][1] = hw;
        c->ex[m][k][2] = mo;
      }
    }
  }
}

int main(int argc, char** argv) {
  const char* out = argc > 1 ? argv[1] : ".";
  uint32_t* g;
  Counts* c;
  CK(cudaMalloc(&g, kN * sizeof(uint32_t)));
  CK(cudaMallocManaged(&c, sizeof(Counts)));
  memset(c, 0, sizeof(Counts));
  table_kernel<<<kN / 256, 256>>>(g);
  CK(cudaGetLastError());
  const uint64_t chunk = 1ull << 30;
  for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
    check_kernel<<<static_cast<unsigned>(chunk / 256), 256>>>(g, base, c);
    CK(cudaGetLastError());
  }
  CK(cudaDeviceSynchronize());
  std::vector<uint32_t> h(kN);
  CK(cudaMemcpy(h.data(), g, kN * sizeof(uint32_t), cudaMemcpyDeviceToHost));

  char path[512];
  snprintf(path, sizeof path, "%s/ex2_summary.txt", out);
  FILE* s = fopen(path, "w");
  if (!s) return 1;
  const char* names[kModels] = {"trunc", "rne", "floor", "round_away"};
  fprintf(s, "nan inputs with non-canonical (!=0x7fffffff) output: %llu (last 0x%08x)\n",
          c->nan_noncanon, c->nan_bits);
  fprintf(s, "inputs where ex2.approx.f32 != ex2.approx.ftz.f32: %llu\n", c->ftz_diff);
  for (int m = 0; m < kModels; ++m) {
    unsigned long long tot = 0;
    for (int sg = 0; sg < 2; ++sg)
      for (int e = 0; e < 256; ++e) tot += c->bad[m][sg][e];
    fprintf(s, "model %s: %llu mismatches of 2^32\n", names[m], tot);
    for (int sg = 0; sg < 2; ++sg)
      for (int e = 0; e < 256; ++e)
        if (c->bad[m][sg][e])
          fprintf(s, "  sign %d exp %3d (2^%d): %llu\n", sg, e, e - 127, c->bad[m][sg][e]);
    for (unsigned k = 0; k < c->nex[m] && k < kExamples; ++k)
      fprintf(s, "  ex u=0x%08x x=%.9g hw=0x%08x model=0x%08x\n", c->ex[m][k][0],
              static_cast<double>(__builtin_bit_cast(float, c->ex[m][k][0])), c->ex[m][k][1],
              c->ex[m][k][2]);
  }
  // Table: g[0] bits and int8 deltas of the bits (escape count reported).
  unsigned long long esc = 0;
  int exp_other = 0;
  std::vector<int8_t> d(kN);
  for (uint32_t f = 0; f < kN; ++f) {
    if ((h[f] >> 23) != 127) ++exp_other;
    long long dd = f ? static_cast<long long>(h[f]) - static_cast<long long>(h[f - 1]) : 0;
    if (dd < -128 || dd > 127) ++esc;
    d[f] = static_cast<int8_t>(dd);
  }
  fprintf(s, "g[0]=0x%08x g[1]=0x%08x g[2^22]=0x%08x g[2^23-1]=0x%08x; entries not in [1,2): %d; "
          "deltas outside int8: %llu\n",
          h[0], h[1], h[1u << 22], h[kN - 1], exp_other, esc);
  fclose(s);
  snprintf(path, sizeof path, "%s/g_delta.bin", out);
  FILE* f = fopen(path, "wb");
  if (!f) return 1;
  fwrite(d.data(), 1, kN, f);
  fclose(f);
  // Also the raw table of the first and last 4096 entries (bits) for a quick look.
  snprintf(path, sizeof path, "%s/g_ends.bin", out);
  f = fopen(path, "wb");
  fwrite(h.data(), 4, 4096, f);
  fwrite(h.data() + kN - 4096, 4, 4096, f);
  fclose(f);
  printf("done\n");
  return 0;
}
