// Probe of the Hopper SFU's exp2 (MUFU.EX2, PTX ex2.approx.ftz.f32), contract §P.11: reads the
// tables T+[F] = ex2(F 2^-23) and T-[F] = ex2(-F 2^-23) (F < 2^23) off the GPU, then runs every
// one of the 2^32 inputs through the instruction and through the sign-magnitude fixed-point model
// X = q(|x| 2^23), y = T±[X mod 2^23] 2^±(X >> 23) (ftz), for four quantizers q, counting
// mismatches by sign and exponent of x. Writes ex2_summary.txt and the tables as int8 deltas of
// their bit patterns (g_delta.bin = T+, gn_delta.bin = T-: dev/ex2/make_tables.py's input).
// The model with q = trunc is §P.11: 0 mismatches expected.
//   nvcc -O3 -arch=sm_90a -o probe_ex2 dev/ex2/probe_ex2.cu && ./probe_ex2 OUTDIR
// (Session 26 ran this check as two probes, x >= 0 on an H100 and x < 0 on an H200; this merged
// form compiled but has not run yet.)
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

constexpr int kF = 23;
constexpr uint32_t kN = 1u << kF;
constexpr int kModels = 4;  // q: 0 trunc, 1 RNE, 2 ceil, 3 round half away (of |x| 2^23)
constexpr int kExamples = 16;
const char* const kNames[kModels] = {"trunc", "rne", "ceil", "round_away"};

// g[0 .. kN) = T+, g[kN .. 2kN) = T-.
__global__ void table_kernel(uint32_t* g) {
  const uint32_t f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f < kN) {
    g[f] = __float_as_uint(hw_ex2(static_cast<float>(f) * 0x1p-23f));
    g[kN + f] = __float_as_uint(hw_ex2(static_cast<float>(f) * -0x1p-23f));
  }
}

__device__ uint32_t model(const uint32_t* g, float x, int m) {
  const uint32_t u = __float_as_uint(x);
  const bool neg = (u >> 31) != 0;
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if (u & 0x007fffffu) return 0x7fffffffu;
    return neg ? 0u : 0x7f800000u;
  }
  if ((u & 0x7f800000u) == 0) x = 0.0f;  // subnormal inputs count as 0
  const double t = fabs(static_cast<double>(x)) * 0x1p23;
  double q;
  switch (m) {
    case 0: q = trunc(t); break;
    case 1: q = rint(t); break;
    case 2: q = ceil(t); break;
    default: q = round(t); break;
  }
  if (q >= 0x1p30) return neg ? 0u : 0x7f800000u;  // |x| >= 128
  const long long X = static_cast<long long>(q);
  const int i = static_cast<int>(X >> kF);
  const uint32_t gb = g[(neg ? kN : 0) + static_cast<uint32_t>(X & (kN - 1))];
  const int e = static_cast<int>((gb >> 23) & 0xff) + (neg ? -i : i);
  if (e >= 255) return 0x7f800000u;
  if (e <= 0) return 0u;  // ftz
  return (gb & 0x807fffffu) | (static_cast<uint32_t>(e) << 23);
}

struct Counts {
  unsigned long long bad[kModels][2][256];  // model, sign, exponent field of x
  unsigned int nex[kModels];
  uint32_t ex[kModels][kExamples][3];  // u, hw, model
};

__global__ void check_kernel(const uint32_t* g, uint64_t base, Counts* c) {
  const uint32_t u = static_cast<uint32_t>(base + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x);
  const float x = __uint_as_float(u);
  const uint32_t hw = __float_as_uint(hw_ex2(x));
  for (int m = 0; m < kModels; ++m) {
    const uint32_t mo = model(g, x, m);
    if (mo != hw) {
      atomicAdd(&c->bad[m][u >> 31][(u >> 23) & 0xff], 1ull);
      const unsigned k = atomicAdd(&c->nex[m], 1u);
      if (k < kExamples) {
        c->ex[m][k][0] = u;
        c->ex[m][k][1] = hw;
        c->ex[m][k][2] = mo;
      }
    }
  }
}

static bool write_deltas(const char* path, const uint32_t* bits) {
  std::vector<int8_t> d(kN);
  for (uint32_t f = 0; f < kN; ++f) {
    const long long dd = f ? static_cast<long long>(bits[f]) - static_cast<long long>(bits[f - 1]) : 0;
    if (dd < -128 || dd > 127) {
      fprintf(stderr, "%s: step %lld at %u does not fit int8\n", path, dd, f);
      return false;
    }
    d[f] = static_cast<int8_t>(dd);
  }
  FILE* f = fopen(path, "wb");
  if (!f) return false;
  const bool ok = fwrite(d.data(), 1, kN, f) == kN;
  return fclose(f) == 0 && ok;
}

int main(int argc, char** argv) {
  const char* out = argc > 1 ? argv[1] : ".";
  uint32_t* g;
  Counts* c;
  CK(cudaMalloc(&g, 2 * kN * sizeof(uint32_t)));
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
  std::vector<uint32_t> h(2 * kN);
  CK(cudaMemcpy(h.data(), g, 2 * kN * sizeof(uint32_t), cudaMemcpyDeviceToHost));

  char path[512];
  snprintf(path, sizeof path, "%s/ex2_summary.txt", out);
  FILE* s = fopen(path, "w");
  if (!s) return 1;
  for (int m = 0; m < kModels; ++m) {
    unsigned long long tot = 0;
    for (int sg = 0; sg < 2; ++sg)
      for (int e = 0; e < 256; ++e) tot += c->bad[m][sg][e];
    fprintf(s, "model %s: %llu mismatches of 2^32\n", kNames[m], tot);
    for (int sg = 0; sg < 2; ++sg)
      for (int e = 0; e < 256; ++e)
        if (c->bad[m][sg][e])
          fprintf(s, "  sign %d exp %3d (2^%d): %llu\n", sg, e, e - 127, c->bad[m][sg][e]);
    for (unsigned k = 0; k < c->nex[m] && k < kExamples; ++k)
      fprintf(s, "  ex u=0x%08x hw=0x%08x model=0x%08x\n", c->ex[m][k][0], c->ex[m][k][1],
              c->ex[m][k][2]);
  }
  fprintf(s, "T+[1]=0x%08x T+[2^22]=0x%08x T+[2^23-1]=0x%08x T-[1]=0x%08x T-[2^22]=0x%08x "
          "T-[2^23-1]=0x%08x\n",
          h[1], h[1u << 22], h[kN - 1], h[kN + 1], h[kN + (1u << 22)], h[2 * kN - 1]);
  fclose(s);
  snprintf(path, sizeof path, "%s/g_delta.bin", out);
  if (!write_deltas(path, h.data())) return 1;
  snprintf(path, sizeof path, "%s/gn_delta.bin", out);
  if (!write_deltas(path, h.data() + kN)) return 1;
  printf("done: %s/ex2_summary.txt\n", out);
  return 0;
}
