// Probe: straightforward CUDA kernels written from docs/contract.md §L and §S
// alone — tile states (8 threads per tile, xor butterfly 1,2,4), per-segment fold + segment tree +
// finish, and plain/greedy Gumbel-max sampling (one block per row, order-free argmax reduction) —
// compared bit for bit with the CPU backend (cpu::linear_logprob, cpu::sample). The logits come
// from the CPU GEMM (cpu::gemm_bf16_nt, fp32 out): the GEMM's own parity is the GEMM probe's job.
// Not a product kernel: it proves the text is GPU-implementable and that device ls_expf/ls_logf,
// Philox and IEEE ops agree with the host.
//   g++ -std=c++20 -O2 -march=native -ffp-contract=off -Iinclude -Isrc -c <core, gemm*, logprob,
//     sampling sources>;  nvcc -std=c++20 -O2 -fmad=false -gencode arch=compute_90a,code=sm_90a \
//     -Iinclude -Isrc dev/logprob_parity.cu *.o -o logprob_parity
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/math.h"
#include "core/philox.h"
#include "lockstep/contract.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/sampling.h"

using namespace lockstep;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

constexpr float kNegInfD = -__builtin_huge_valf();

__device__ __forceinline__ float mx(float a, float b) { return b > a ? b : a; }
__device__ __forceinline__ float canon(float x) {
  return x != x ? __uint_as_float(0x7fc00000u) : x;
}

struct DState {
  float m, s, w;
};

__device__ DState merge(DState a, DState b) {
  if (b.s == 0.0f) return a;
  if (a.s == 0.0f) return b;
  const float M = mx(a.m, b.m);
  const float da = __fsub_rn(a.m, M), db = __fsub_rn(b.m, M);
  const float ea = ls_expf(da), eb = ls_expf(db);
  DState r;
  r.m = M;
  r.s = __fadd_rn(__fmul_rn(a.s, ea), __fmul_rn(b.s, eb));
  r.w = __fadd_rn(__fmul_rn(__fadd_rn(a.w, __fmul_rn(da, a.s)), ea),
                  __fmul_rn(__fadd_rn(b.w, __fmul_rn(db, b.s)), eb));
  return r;
}

// L.5: grid (tiles, T), 8 threads; lane l owns entries l, l+8, ...
__global__ void tile_kernel(const float* z, int64_t V, int64_t L, const float* tau,
                            const int64_t* targets, DState* states, float* ytgt, int64_t n_tiles,
                            bool wrong_tree) {
  const int64_t tile = blockIdx.x, t = blockIdx.y;
  const int l = threadIdx.x;
  const float* zr = z + t * V;
  auto y_at = [&](int64_t j) {
    const int64_t v = tile * L + j;
    return v < V ? __fdiv_rn(zr[v], tau[t]) : kNegInfD;
  };
  float m = kNegInfD;
  for (int64_t j = l; j < L; j += 8) m = mx(m, y_at(j));
  for (int o = 1; o <= 4; o *= 2) m = mx(m, __shfl_xor_sync(0xffu, m, o));
  if (m == 0.0f) m = 0.0f;
  float s = 0.0f, w = 0.0f;
  for (int64_t j = l; j < L; j += 8) {
    const float y = y_at(j);
    if (y == kNegInfD) continue;
    const float d = __fsub_rn(y, m);
    const float e = ls_expf(d);
    s = __fadd_rn(s, e);
    w = __fadd_rn(w, __fmul_rn(e, d));
  }
  for (int i = 0; i < 3; ++i) {
    const int o = wrong_tree ? 4 >> i : 1 << i;  // negative control: tree 4,2,1 instead of 1,2,4
    s = __fadd_rn(s, __shfl_xor_sync(0xffu, s, o));
    w = __fadd_rn(w, __shfl_xor_sync(0xffu, w, o));
  }
  if (l == 0) {
    states[t * n_tiles + tile] = DState{m, s, w};
    const int64_t g = targets[t];
    if (g >= tile * L && g < tile * L + L && g < V) ytgt[t] = y_at(g - tile * L);
  }
}

// L.6 / L.7: one thread per token.
__global__ void finish_kernel(const DState* states, const float* ytgt, const int64_t* targets,
                              int64_t T, int64_t n_tiles, int S, float* logp, float* lse,
                              float* entropy) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int64_t tps = n_tiles / S;
  DState seg[8];
  for (int k = 0; k < S; ++k) {
    DState acc{kNegInfD, 0.0f, 0.0f};
    for (int64_t i = 0; i < tps; ++i) acc = merge(acc, states[t * n_tiles + k * tps + i]);
    seg[k] = acc;
  }
  for (int len = S; len > 1; len /= 2)
    for (int i = 0; i < len / 2; ++i) seg[i] = merge(seg[2 * i], seg[2 * i + 1]);
  const float ls = ls_logf(seg[0].s);
  const float l = __fadd_rn(seg[0].m, ls);
  lse[t] = canon(l);
  entropy[t] = canon(__fsub_rn(ls, __fdiv_rn(seg[0].w, seg[0].s)));
  logp[t] = targets[t] < 0 ? 0.0f : canon(__fsub_rn(ytgt[t], l));
}

// S.4 / S.6 / S.7 without filters: one block of 256 per row.
__global__ void sample_kernel(const float* z, int64_t V, const float* temperature,
                              const uint64_t* seed, const uint64_t* rid, const uint32_t* pos,
                              int64_t* ids) {
  const int64_t t = blockIdx.x;
  const float temp = temperature[t];
  const float tau = temp == 0.0f ? 1.0f : temp;
  float best = kNegInfD;
  int64_t best_v = -1;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float y = __fdiv_rn(z[t * V + v], tau);
    if (y == kNegInfD) continue;
    float score = y;
    if (temp != 0.0f) {
      Philox4 ctr{{uint32_t(v >> 2), pos[t], uint32_t(rid[t]), uint32_t(rid[t] >> 32)}};
      const uint32_t word = philox4x32_10(ctr, uint32_t(seed[t]), uint32_t(seed[t] >> 32)).v[v & 3];
      const float g = -ls_logf(-ls_logf(philox_uniform(word)));
      score = __fadd_rn(y, g);
    }
    if (best_v < 0 || score > best) {  // ascending v per thread: strict > keeps the lowest
      best = score;
      best_v = v;
    }
  }
  __shared__ float sb[256];
  __shared__ int64_t sv[256];
  sb[threadIdx.x] = best;
  sv[threadIdx.x] = best_v;
  __syncthreads();
  for (int o = 128; o >= 1; o /= 2) {
    if (threadIdx.x < o) {
      const float b2 = sb[threadIdx.x + o];
      const int64_t v2 = sv[threadIdx.x + o];
      const int64_t v1 = sv[threadIdx.x];
      const bool take =
          v2 >= 0 && (v1 < 0 || b2 > sb[threadIdx.x] || (b2 == sb[threadIdx.x] && v2 < v1));
      if (take) {
        sb[threadIdx.x] = b2;
        sv[threadIdx.x] = v2;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[t] = sv[0];
}

template <typename T>
T* to_dev(const std::vector<T>& h) {
  T* d;
  CK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> from_dev(const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

int64_t count_diff(const void* a, const void* b, size_t n, size_t es, const char* what) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(a) + i * es, static_cast<const char*>(b) + i * es,
                    es) != 0) {
      if (bad < 3) {
        uint64_t x = 0, y = 0;
        std::memcpy(&x, static_cast<const char*>(a) + i * es, es);
        std::memcpy(&y, static_cast<const char*>(b) + i * es, es);
        std::printf("  %s[%zu]: gpu 0x%llx cpu 0x%llx\n", what, i, (unsigned long long)x,
                    (unsigned long long)y);
      }
      ++bad;
    }
  }
  return bad;
}

// GPU LogP from fp32 logits z [T, V].
void gpu_logprob(const std::vector<float>& z, int64_t T, int64_t V, const ContractConfig& cfg,
                 const std::vector<float>& tau, const std::vector<int64_t>& targets,
                 std::vector<float>* logp, std::vector<float>* lse, std::vector<float>* ent,
                 bool wrong_tree = false) {
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  const int64_t n_tiles = lay.padded / lay.tile;
  float* dz = to_dev(z);
  float* dtau = to_dev(tau);
  int64_t* dtg = to_dev(targets);
  DState* dst;
  float *dy, *dl, *ds, *de;
  CK(cudaMalloc(&dst, size_t(T * n_tiles) * sizeof(DState)));
  CK(cudaMalloc(&dy, size_t(T) * 4));
  CK(cudaMalloc(&dl, size_t(T) * 4));
  CK(cudaMalloc(&ds, size_t(T) * 4));
  CK(cudaMalloc(&de, size_t(T) * 4));
  tile_kernel<<<dim3(unsigned(n_tiles), unsigned(T)), 8>>>(dz, V, lay.tile, dtau, dtg, dst, dy,
                                                           n_tiles, wrong_tree);
  CK(cudaGetLastError());
  finish_kernel<<<unsigned((T + 127) / 128), 128>>>(dst, dy, dtg, T, n_tiles, lay.segments, dl, ds,
                                                    de);
  CK(cudaDeviceSynchronize());
  *logp = from_dev(dl, size_t(T));
  *lse = from_dev(ds, size_t(T));
  *ent = from_dev(de, size_t(T));
  for (void* p :
       {(void*)dz, (void*)dtau, (void*)dtg, (void*)dst, (void*)dy, (void*)dl, (void*)ds, (void*)de})
    CK(cudaFree(p));
}

int main() {
  struct Case {
    int64_t T, H, V;
    int tile, segs, gsegs;
  };
  const Case cases[] = {{64, 64, 151936, 256, 8, 1},
                        {37, 48, 1000, 64, 2, 2},
                        {5, 16, 77, 8, 4, 4},
                        {300, 32, 4099, 24, 1, 8}};
  std::mt19937_64 g(12345);
  int64_t total_bad = 0, total = 0;
  for (const Case& c : cases) {
    ContractConfig cfg;
    cfg.vocab_tile = c.tile;
    cfg.vocab_segments = c.segs;
    cfg.gemm_segments = c.gsegs;
    for (float scale : {0.3f, 1.0f, 3.0f}) {
      std::normal_distribution<float> nd(0.0f, 1.0f);
      Tensor h(DType::kBF16, {c.T, c.H}), w(DType::kBF16, {c.V, c.H});
      for (int64_t i = 0; i < c.T * c.H; ++i) h.ptr<bf16>()[i] = f32_to_bf16(nd(g));
      for (int64_t i = 0; i < c.V * c.H; ++i) w.ptr<bf16>()[i] = f32_to_bf16(scale * nd(g));
      std::vector<int64_t> targets(size_t(c.T));
      for (auto& t : targets) t = int64_t(g() % uint64_t(c.V));
      targets[0] = -1;
      targets[size_t(c.T - 1)] = c.V - 1;
      Tensor z(DType::kF32, {c.T, c.V});
      cpu::gemm_bf16_nt(h.view(), w.view(), GemmConfig::from_contract(cfg), z.view());
      std::vector<float> zv(z.ptr<float>(), z.ptr<float>() + c.T * c.V);
      // A NaN logit row (as from NaN in h) for LogP: the CPU op gets the NaN through h.
      Tensor hn(DType::kBF16, {c.T, c.H});
      std::memcpy(hn.data(), h.data(), size_t(h.nbytes()));
      hn.ptr<bf16>()[c.H + 1] = f32_to_bf16(NAN);
      Tensor zn(DType::kF32, {c.T, c.V});
      cpu::gemm_bf16_nt(hn.view(), w.view(), GemmConfig::from_contract(cfg), zn.view());
      std::vector<float> znv(zn.ptr<float>(), zn.ptr<float>() + c.T * c.V);
      Tensor tg(DType::kI64, {c.T});
      std::memcpy(tg.data(), targets.data(), size_t(c.T) * 8);
      for (float tau : {1.0f, 0.7f, 1.9f}) {
        Tensor lp(DType::kF32, {c.T}), ls(DType::kF32, {c.T}), en(DType::kF32, {c.T});
        cpu::linear_logprob(hn.view(), w.view(), tg.view(), LogprobParams{tau}, cfg, lp.view(),
                            ls.view(), en.view());
        std::vector<float> glp, gls, gen;
        gpu_logprob(znv, c.T, c.V, cfg, std::vector<float>(size_t(c.T), tau), targets, &glp, &gls,
                    &gen);
        int64_t bad = count_diff(glp.data(), lp.data(), size_t(c.T), 4, "logp") +
                      count_diff(gls.data(), ls.data(), size_t(c.T), 4, "lse") +
                      count_diff(gen.data(), en.data(), size_t(c.T), 4, "entropy");
        total += 3 * c.T;
        total_bad += bad;
        if (bad)
          std::printf("LogP mismatch: %s tau=%g scale=%g: %lld\n", cfg.to_string().c_str(), tau,
                      scale, (long long)bad);
        if (tau == 1.0f && scale == 1.0f) {  // the comparison must see a different lane tree
          gpu_logprob(znv, c.T, c.V, cfg, std::vector<float>(size_t(c.T), tau), targets, &glp, &gls,
                      &gen, true);
          int64_t neg = 0;
          for (int64_t t = 0; t < c.T; ++t)
            neg += std::memcmp(&gls[size_t(t)], ls.ptr<float>() + t, 4) != 0 ||
                   std::memcmp(&gen[size_t(t)], en.ptr<float>() + t, 4) != 0;
          std::printf("negative control (lane tree 4,2,1): %lld of %lld tokens differ\n",
                      (long long)neg, (long long)c.T);
        }
      }
      // Sampling (plain and greedy rows) + recorded values.
      std::vector<SamplingParams> ps(size_t(c.T));
      std::vector<float> temps(size_t(c.T));
      std::vector<uint64_t> seeds(size_t(c.T)), rids(size_t(c.T));
      std::vector<uint32_t> poss(size_t(c.T));
      Tensor rid(DType::kI64, {c.T}), pos(DType::kI64, {c.T});
      const float kT[] = {0.0f, 0.6f, 1.0f, 1.7f};
      for (int64_t t = 0; t < c.T; ++t) {
        ps[size_t(t)].seed = seeds[size_t(t)] = g();
        ps[size_t(t)].temperature = temps[size_t(t)] = kT[g() % 4];
        rids[size_t(t)] = g();
        poss[size_t(t)] = uint32_t(g() % 100000);
        rid.ptr<int64_t>()[t] = int64_t(rids[size_t(t)]);
        pos.ptr<int64_t>()[t] = poss[size_t(t)];
      }
      Tensor ids(DType::kI64, {c.T}), lp(DType::kF32, {c.T}), ls(DType::kF32, {c.T}),
          en(DType::kF32, {c.T});
      cpu::sample(h.view(), w.view(), ps, rid.view(), pos.view(), cfg, ids.view(), lp.view(),
                  ls.view(), en.view());
      float* dz = to_dev(zv);
      float* dt = to_dev(temps);
      uint64_t* dseed = to_dev(seeds);
      uint64_t* drid = to_dev(rids);
      uint32_t* dpos = to_dev(poss);
      int64_t* did;
      CK(cudaMalloc(&did, size_t(c.T) * 8));
      sample_kernel<<<unsigned(c.T), 256>>>(dz, c.V, dt, dseed, drid, dpos, did);
      CK(cudaDeviceSynchronize());
      std::vector<int64_t> gid = from_dev(did, size_t(c.T));
      for (void* p : {(void*)dz, (void*)dt, (void*)dseed, (void*)drid, (void*)dpos, (void*)did})
        CK(cudaFree(p));
      std::vector<float> tlp(size_t(c.T));
      for (int64_t t = 0; t < c.T; ++t) tlp[size_t(t)] = ps[size_t(t)].logprob_temperature();
      std::vector<float> glp, gls, gen;
      gpu_logprob(zv, c.T, c.V, cfg, tlp, gid, &glp, &gls, &gen);
      int64_t bad = count_diff(gid.data(), ids.data(), size_t(c.T), 8, "id") +
                    count_diff(glp.data(), lp.data(), size_t(c.T), 4, "sample logp") +
                    count_diff(gls.data(), ls.data(), size_t(c.T), 4, "sample lse") +
                    count_diff(gen.data(), en.data(), size_t(c.T), 4, "sample entropy");
      total += 4 * c.T;
      total_bad += bad;
      if (bad)
        std::printf("sample mismatch: %s scale=%g: %lld\n", cfg.to_string().c_str(), scale,
                    (long long)bad);
    }
    std::printf("done %s T=%lld H=%lld V=%lld\n", cfg.to_string().c_str(), (long long)c.T,
                (long long)c.H, (long long)c.V);
  }
  std::printf("logprob_parity: %lld of %lld outputs differ\n", (long long)total_bad,
              (long long)total);
  return total_bad == 0 ? 0 : 1;
}
