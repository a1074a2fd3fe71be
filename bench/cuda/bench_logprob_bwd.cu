// Benchmark of the CUDA LogP forward + backward (cuda::linear_logprob, then
// cuda::linear_logprob_backward, docs/contract.md §L and §B.8) at a training shape: T tokens,
// hidden H, vocab V (default 8192 x 4096 x 151936, bf16), a cross-entropy upstream gradient
// (g_lp = -1/T; --ent adds a random g_ent), sequences of --seq-len tokens (default: one).
// Time: median of --reps calls (cudaEvent pair around forward + backward; dw zeroed outside it),
// also forward and backward alone. Memory: the stream-ordered pool's high-water mark of used
// bytes (cudaMemPoolAttrUsedMemHigh, reset before the calls) = the ops' scratch, plus dh ([T, H]
// f32) and the [T] vectors: "extra beyond the lm_head's fp32 gradient" (inputs h, W excluded), and
// cudaMemGetInfo before / after. Then: a rerun gives the same dh and dw bits, and each other dh
// path (LogprobBwdPath: gemm_bf16_dw on Gᵀ, gemm_bf16_nt on a re-laid-out Wᵀ,
// gemm_bf16_nn_accumulate on G in place) gives the same bits (compared on the device, word by word)
// and is timed alone; first, a self-check of the chunk plan on a small packed micro-batch (forced
// small chunks / slices / hidden slices / each path: the same bits). Writes a JSON summary (--json
// PATH) that bench/cuda/logprob_bwd_peers.py prints next to the peers' numbers:
//   ./build-gpu/bench_logprob_bwd --json /tmp/lpb.json && python3 bench/cuda/logprob_bwd_peers.py \
//       --ours /tmp/lpb.json
// Options: T H V (positional), --vseg S (vocab_segments, default 1 = the contract default),
// --gseg S (gemm_segments), --tile L (vocab_tile), --seq-len N, --ent, --reps N, --no-other-path,
// --path auto|dw|wt|dx (the dh path of the timed calls; default auto = the library's choice),
// --self-check-only (the plan self-check alone: seconds; exit status 0 iff identical), --once (one
// forward + backward call and nothing else, for a profiler: `ncu --clock-control none ...`).
// NOTE: the default pool's release threshold is raised so freed scratch stays reserved between
// calls (as PyTorch's caching allocator keeps its blocks); the first, cold call is timed apart.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda/backward/logprob_plan.h"  // LogprobBwdPath, the plan
#include "cuda/cuda_ck.h"                // CK
#include "lockstep/contract.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/ops/logprob.h"

using namespace lockstep;

namespace {

__device__ uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// bf16 values uniform in [-scale, scale) (scale a power of two: exact).
__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float u =
        (float(mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 8) * 0x1p-24f) * 2.0f - 1.0f;
    p[i] = f32_to_bf16(u * scale).bits;
  }
}

__global__ void fill_f32_kernel(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] =
        ((float(mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 8) * 0x1p-24f) * 2.0f - 1.0f) *
        scale;
}

__global__ void fill_const_kernel(float* p, int64_t n, float v) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void fill_targets_kernel(int64_t* p, int64_t n, int64_t V, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = int64_t(mix(seed + uint64_t(i)) % uint32_t(V));
}

// Counts the 32-bit words where a and b differ (a benchmark check, not a result reduction).
__global__ void count_diff_kernel(const uint32_t* a, const uint32_t* b, int64_t n,
                                  unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i] ? 1 : 0;
  if (local) atomicAdd(count, local);
}

unsigned long long count_diff(const void* a, const void* b, int64_t bytes) {
  unsigned long long* d = nullptr;
  CK(cudaMalloc(&d, sizeof(unsigned long long)));
  CK(cudaMemset(d, 0, sizeof(unsigned long long)));
  count_diff_kernel<<<4096, 256>>>(static_cast<const uint32_t*>(a), static_cast<const uint32_t*>(b),
                                   bytes / 4, d);
  CK(cudaGetLastError());
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `reps` calls of fn, `before` run outside the timed region.
double time_ms(int reps, const std::function<void()>& before, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    before();
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0.0f;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(ms);
}

// A small micro-batch on the device for the self-checks: h [T, H] and W [V, H] bf16 (seeds seed,
// seed + 1), targets in [0, V) (seed + 2), n_vec [T] f32 vectors of which 3 and 4 (g_lp, g_ent)
// are filled (seed + 3), dh [T, H] and dw [V, H] f32; freed at the end of its scope.
struct CheckBatch {
  int64_t T, H, V;
  uint16_t *h = nullptr, *w = nullptr;
  int64_t* tg = nullptr;
  float *vec = nullptr, *dh = nullptr, *dw = nullptr;
  CheckBatch(int64_t T_, int64_t H_, int64_t V_, int n_vec, uint64_t seed) : T(T_), H(H_), V(V_) {
    CK(cudaMalloc(&h, size_t(T * H) * 2));
    CK(cudaMalloc(&w, size_t(V * H) * 2));
    CK(cudaMalloc(&tg, size_t(T) * 8));
    CK(cudaMalloc(&vec, size_t(n_vec * T) * 4));
    CK(cudaMalloc(&dh, size_t(T * H) * 4));
    CK(cudaMalloc(&dw, size_t(V * H) * 4));
    fill_bf16_kernel<<<256, 256>>>(h, T * H, seed, 2.0f);
    fill_bf16_kernel<<<256, 256>>>(w, V * H, seed + 1, 0.25f);
    fill_targets_kernel<<<8, 256>>>(tg, T, V, seed + 2);
    fill_f32_kernel<<<8, 256>>>(vec + 3 * T, 2 * T, seed + 3, 1.0f);
    CK(cudaGetLastError());
  }
  CheckBatch(const CheckBatch&) = delete;
  CheckBatch& operator=(const CheckBatch&) = delete;
  ~CheckBatch() {
    for (void* p : {static_cast<void*>(h), static_cast<void*>(w), static_cast<void*>(tg),
                    static_cast<void*>(vec), static_cast<void*>(dh), static_cast<void*>(dw)})
      cudaFree(p);
  }
  TensorView vh() const { return TensorView::contiguous(h, DType::kBF16, {T, H}, Device::kCUDA); }
  TensorView vw() const { return TensorView::contiguous(w, DType::kBF16, {V, H}, Device::kCUDA); }
  TensorView vt() const { return TensorView::contiguous(tg, DType::kI64, {T}, Device::kCUDA); }
  TensorView vv(int i) const {
    return TensorView::contiguous(vec + int64_t(i) * T, DType::kF32, {T}, Device::kCUDA);
  }
  TensorView vdh() const { return TensorView::contiguous(dh, DType::kF32, {T, H}, Device::kCUDA); }
  TensorView vdw() const { return TensorView::contiguous(dw, DType::kF32, {V, H}, Device::kCUDA); }
};

// Self-check of the chunk plan on a small packed micro-batch (sequences in shuffled rows with
// padding rows between them, seg_len 8 mod 16, gemm_segments 2): the automatic plan, forced small
// chunks and slices (several chunks, gathered rows, several slices per segment, narrow logits
// blocks), the W^T path with hidden slices and the nn-accumulate path give the same dh and dw bits.
// Returns true if so.
bool plan_self_check() {
  const int64_t H = 72, V = 5000;
  ContractConfig cfg;
  cfg.vocab_tile = 200;
  cfg.vocab_segments = 4;
  cfg.gemm_segments = 2;
  const std::vector<int64_t> lens = {100, 5, 64, 37, 1, 17};
  const std::vector<int> at_order = {3, 0, 5, 2, 4, 1};  // packing order of the sequences
  std::vector<TokenSeq> seqs;
  int64_t row = 3;
  for (int i : at_order) {
    seqs.push_back({int64_t(i), row, lens[size_t(i)]});
    row += lens[size_t(i)] + 1 + i % 3;
  }
  const int64_t T = row + 2;
  const TokenOrder order = TokenOrder::make("bench_logprob_bwd self-check", seqs, T);
  const CheckBatch cb(T, H, V, 5, 11);
  float *const dh = cb.dh, *const dw = cb.dw;
  const TensorView vh = cb.vh(), vw = cb.vw(), vt = cb.vt();
  auto vv = [&](int i) { return cb.vv(i); };
  const TensorView lse = vv(1), ent = vv(2), glp = vv(3), gent = vv(4);
  const LogprobParams prm{0.7f};
  cuda::linear_logprob(vh, vw, vt, prm, cfg, vv(0), lse, ent);
  using cuda::detail::LogprobBwdPath;
  using cuda::detail::LogprobBwdPlan;
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  const int64_t seg_pad = (lay.segment_len + 15) / 16 * 16;
  LogprobBwdPlan tiny;
  tiny.path = LogprobBwdPath::kDwForm;
  tiny.rows = 32;
  tiny.slice = 48;
  tiny.zcols = 40;
  LogprobBwdPlan wt;
  wt.path = LogprobBwdPath::kWtGemm;
  wt.rows = 48;
  wt.slice = seg_pad;
  wt.zcols = 136;
  wt.hc = 17;
  LogprobBwdPlan dx = tiny;
  dx.path = LogprobBwdPath::kDxForm;
  dx.rows = 48;
  dx.slice = 80;
  const LogprobBwdPlan* plans[4] = {nullptr, &tiny, &wt, &dx};
  const char* names[4] = {"automatic plan", "forced rows 32, slice 48, logits 40 columns",
                          "W^T path, rows 48, hidden slices of 17",
                          "G in place (nn accumulate), rows 48, slice 80, logits 40 columns"};
  std::vector<float> ref_dh, ref_dw;
  bool ok = true;
  for (int i = 0; i < 4; ++i) {
    CK(cudaMemset(dh, 0xA5, size_t(T * H) * 4));
    fill_f32_kernel<<<256, 256>>>(dw, V * H, 15, 0.1f);  // a nonzero incoming dw
    cuda::detail::linear_logprob_backward_with_path(vh, vw, vt, prm, cfg, lse, ent, glp, &gent,
                                                    cb.vdh(), order, cb.vdw(),
                                                    LogprobBwdPath::kAuto, nullptr, plans[i]);
    CK(cudaDeviceSynchronize());
    std::vector<float> a(size_t(T * H)), b(size_t(V * H));
    CK(cudaMemcpy(a.data(), dh, a.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), dw, b.size() * 4, cudaMemcpyDeviceToHost));
    if (i == 0) {
      ref_dh = a;
      ref_dw = b;
      continue;
    }
    const bool same_dh = std::memcmp(a.data(), ref_dh.data(), a.size() * 4) == 0;
    const bool same_dw = std::memcmp(b.data(), ref_dw.data(), b.size() * 4) == 0;
    std::printf("plan self-check (T=%lld H=%lld V=%lld, %s): %s: dh %s, dw %s\n", (long long)T,
                (long long)H, (long long)V, cfg.to_string().c_str(), names[i],
                same_dh ? "identical" : "DIFFERS", same_dw ? "identical" : "DIFFERS");
    ok = ok && same_dh && same_dw;
  }
  return ok;
}

// Self-check of the forward recomputed by the backward (LogprobRecompute) on a small micro-batch
// packed in place (the rows no sequence covers last, a target ignored, temperature 0.7,
// vocab_tile `tile` (208, and 256: the fused epilogue's), 4 vocab segments of which the last
// ends in all-padding tiles, gemm_segments 2):
// for the automatic plan and forced ones (small chunks and slices, each dh path), the gradients
// equal the plain backward's and the recomputed logp, lse and entropy equal cuda::linear_logprob's,
// bit for bit. Returns true if so.
bool recompute_self_check(int tile) {
  const int64_t H = 72, V = 5000;
  ContractConfig cfg;
  cfg.vocab_tile = tile;
  cfg.vocab_segments = 4;
  cfg.gemm_segments = 2;
  const std::vector<int64_t> lens = {100, 5, 64, 37, 1, 17};
  std::vector<TokenSeq> seqs;
  int64_t row = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    seqs.push_back({int64_t(i), row, lens[i]});
    row += lens[i];
  }
  const int64_t T = row + 5;  // 5 rows no sequence covers, last
  const TokenOrder order = TokenOrder::make("bench_logprob_bwd recompute check", seqs, T);
  const CheckBatch cb(T, H, V, 8, 21);
  float *const vec = cb.vec, *const dh = cb.dh, *const dw = cb.dw;
  const int64_t ignored = -100;
  CK(cudaMemcpy(cb.tg + 7, &ignored, 8, cudaMemcpyHostToDevice));
  const TensorView vh = cb.vh(), vw = cb.vw(), vt = cb.vt();
  auto vv = [&](int i) { return cb.vv(i); };
  const TensorView lse = vv(1), ent = vv(2), glp = vv(3), gent = vv(4);
  LogprobParams prm{0.7f};
  prm.ignore_index = ignored;
  cuda::linear_logprob(vh, vw, vt, prm, cfg, vv(0), lse, ent);
  const TensorView vdh = cb.vdh(), vdw = cb.vdw();
  using cuda::detail::LogprobBwdPath;
  using cuda::detail::LogprobBwdPlan;
  auto run = [&](LogprobBwdPath path, const LogprobBwdPlan* plan, bool recompute) {
    CK(cudaMemset(dh, 0xA5, size_t(T * H) * 4));
    CK(cudaMemset(vec + 5 * T, 0xA5, size_t(3 * T) * 4));  // poison the recomputed outputs
    fill_f32_kernel<<<256, 256>>>(dw, V * H, 25, 0.1f);    // a nonzero incoming dw
    const cuda::detail::LogprobRecompute rc{vv(5), vv(6), vv(7)};
    cuda::detail::linear_logprob_backward_with_path(vh, vw, vt, prm, cfg, lse, ent, glp, &gent, vdh,
                                                    order, vdw, path, nullptr, plan,
                                                    recompute ? &rc : nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<float> a(size_t(T * H)), b(size_t(V * H)), f(size_t(3 * T));
    CK(cudaMemcpy(a.data(), dh, a.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), dw, b.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(f.data(), vec + 5 * T, f.size() * 4, cudaMemcpyDeviceToHost));
    a.insert(a.end(), b.begin(), b.end());
    return std::make_pair(a, f);
  };
  const auto ref = run(LogprobBwdPath::kAuto, nullptr, false);
  std::vector<float> fwd(size_t(3 * T));
  CK(cudaMemcpy(fwd.data(), vec, fwd.size() * 4, cudaMemcpyDeviceToHost));  // logp, lse, entropy
  LogprobBwdPlan small;
  small.path = LogprobBwdPath::kDwForm;
  small.rows = 32;
  small.slice = 2 * tile;
  small.zcols = tile;
  LogprobBwdPlan dx = small;
  dx.path = LogprobBwdPath::kDxForm;
  dx.rows = 48;
  dx.slice = tile;
  LogprobBwdPlan wt;
  wt.path = LogprobBwdPath::kWtGemm;
  wt.rows = 48;
  wt.slice = cfg.vocab_tile * logprob_vocab_layout(cfg, V).tiles_per_segment;
  wt.zcols = tile;
  wt.hc = 17;
  const LogprobBwdPlan* plans[4] = {nullptr, &small, &dx, &wt};
  const char* names[4] = {"automatic plan (vocab_tile 256: G from the GEMM's epilogue)",
                          "forced rows 32, slice 2 tiles, logits 1 tile",
                          "nn accumulate, rows 48, slice 1 tile", "W^T path, rows 48"};
  bool ok = true;
  for (int i = 0; i < 4; ++i) {
    const auto got = run(LogprobBwdPath::kAuto, plans[i], true);
    const bool same_g = std::memcmp(got.first.data(), ref.first.data(), got.first.size() * 4) == 0;
    const bool same_f = std::memcmp(got.second.data(), fwd.data(), fwd.size() * 4) == 0;
    std::printf(
        "recompute self-check (T=%lld H=%lld V=%lld, %s): %s: dh and dw %s, the forward's "
        "logp / lse / entropy %s\n",
        (long long)T, (long long)H, (long long)V, cfg.to_string().c_str(), names[i],
        same_g ? "identical" : "DIFFER", same_f ? "identical" : "DIFFER");
    ok = ok && same_g && same_f;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 8192, H = 4096, V = 151936, seq_len = 0;
  int reps = 3;
  bool ent = false, other_path = true, self_check_only = false, once = false;
  ContractConfig cfg;  // defaults: gemm_segments 1, vocab_tile 256, vocab_segments 1
  std::string json, path_arg = "auto";
  std::vector<int64_t> pos;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (std::strcmp(argv[i], "--reps") == 0) {
      reps = int(next());
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--vseg") == 0) {
      cfg.vocab_segments = int(next());
    } else if (std::strcmp(argv[i], "--gseg") == 0) {
      cfg.gemm_segments = int(next());
    } else if (std::strcmp(argv[i], "--tile") == 0) {
      cfg.vocab_tile = int(next());
    } else if (std::strcmp(argv[i], "--seq-len") == 0) {
      seq_len = next();
    } else if (std::strcmp(argv[i], "--ent") == 0) {
      ent = true;
    } else if (std::strcmp(argv[i], "--no-other-path") == 0) {
      other_path = false;
    } else if (std::strcmp(argv[i], "--self-check-only") == 0) {
      self_check_only = true;
    } else if (std::strcmp(argv[i], "--once") == 0) {
      once = true;
    } else if (std::strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
      path_arg = argv[++i];
    } else {
      pos.push_back(std::atoll(argv[i]));
    }
  }
  if (pos.size() >= 3) T = pos[0], H = pos[1], V = pos[2];
  if (seq_len <= 0) seq_len = T;
  reps = std::max(reps, 1);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_logprob_bwd: %s, T=%lld H=%lld V=%lld bf16, sequences of %lld, %s, %s\n",
              prop.name, (long long)T, (long long)H, (long long)V, (long long)seq_len,
              ent ? "g_lp + g_ent" : "g_lp only (cross-entropy)", cfg.to_string().c_str());
  using cuda::detail::LogprobBwdPath;
  // The timed calls' sequences of seq_len tokens, packed in order (so the plan reads the rows in
  // place).
  std::vector<TokenSeq> seqs;
  for (int64_t r = 0, i = 0; r < T; r += seq_len, ++i)
    seqs.push_back({i, r, std::min(seq_len, T - r)});
  const TokenOrder order = TokenOrder::make("bench_logprob_bwd", seqs, T);
  {
    const bool in_place = cuda::detail::logprob_rows_in_place(order, T);
    std::printf("plan: %s\n", cuda::detail::logprob_backward_plan_string(
                                  cfg, T, H, V, LogprobBwdPath::kAuto, in_place)
                                  .c_str());
    if (other_path)
      std::printf("other path: %s\n", cuda::detail::logprob_backward_plan_string(
                                          cfg, T, H, V, LogprobBwdPath::kWtGemm, in_place)
                                          .c_str());
  }

  const bool self_ok =
      once || (plan_self_check() && recompute_self_check(208) && recompute_self_check(256));
  if (self_check_only) return self_ok ? 0 : 1;
  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

  uint16_t *h, *w;
  int64_t* tg;
  float *vec, *dh, *dw;
  CK(cudaMalloc(&h, size_t(T * H) * 2));
  CK(cudaMalloc(&w, size_t(V * H) * 2));
  CK(cudaMalloc(&tg, size_t(T) * 8));
  CK(cudaMalloc(&vec, size_t(5 * T) * 4));  // logp, lse, entropy, g_lp, g_ent
  CK(cudaMalloc(&dh, size_t(T * H) * 4));
  CK(cudaMalloc(&dw, size_t(V * H) * 4));
  fill_bf16_kernel<<<4096, 256>>>(h, T * H, 1, 1.0f);
  fill_bf16_kernel<<<4096, 256>>>(w, V * H, 2, 0.0625f);
  fill_targets_kernel<<<64, 256>>>(tg, T, V, 3);
  fill_const_kernel<<<64, 256>>>(vec + 3 * T, T, -1.0f / float(T));
  fill_f32_kernel<<<64, 256>>>(vec + 4 * T, T, 4, 0.01f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const TensorView vh = TensorView::contiguous(h, DType::kBF16, {T, H}, Device::kCUDA);
  const TensorView vw = TensorView::contiguous(w, DType::kBF16, {V, H}, Device::kCUDA);
  const TensorView vt = TensorView::contiguous(tg, DType::kI64, {T}, Device::kCUDA);
  auto vec_view = [&](int i) {
    return TensorView::contiguous(vec + int64_t(i) * T, DType::kF32, {T}, Device::kCUDA);
  };
  const TensorView lp = vec_view(0), ls = vec_view(1), en = vec_view(2), glp = vec_view(3),
                   gent = vec_view(4);
  const TensorView vdh = TensorView::contiguous(dh, DType::kF32, {T, H}, Device::kCUDA);
  const TensorView vdw = TensorView::contiguous(dw, DType::kF32, {V, H}, Device::kCUDA);
  const LogprobParams prm{1.0f};

  LogprobBwdPath ran = LogprobBwdPath::kAuto;
  const LogprobBwdPath main_path = path_arg == "dx"      ? LogprobBwdPath::kDxForm
                                   : path_arg == "fused" ? LogprobBwdPath::kDxFused
                                   : path_arg == "dw"    ? LogprobBwdPath::kDwForm
                                   : path_arg == "wt"    ? LogprobBwdPath::kWtGemm
                                                         : LogprobBwdPath::kAuto;
  if (main_path == LogprobBwdPath::kAuto && path_arg != "auto") {
    std::fprintf(stderr, "bench_logprob_bwd: --path takes auto, fused, dx, dw or wt, got '%s'\n",
                 path_arg.c_str());
    return 2;
  }
  LogprobBwdPath path = main_path;
  auto fwd = [&] { cuda::linear_logprob(vh, vw, vt, prm, cfg, lp, ls, en); };
  auto bwd = [&] {
    ran = cuda::detail::linear_logprob_backward_with_path(
        vh, vw, vt, prm, cfg, ls, en, glp, ent ? &gent : nullptr, vdh, order, vdw, path);
  };
  auto both = [&] {
    fwd();
    bwd();
  };
  auto zero_dw = [&] { CK(cudaMemsetAsync(dw, 0, size_t(V * H) * 4)); };
  auto nothing = [] {};

  if (once) {  // one forward and one backward call, nothing else: for a profiler (ncu)
    zero_dw();
    both();
    CK(cudaDeviceSynchronize());
    std::printf("--once: one forward + backward call ran\n");
    return 0;
  }
  size_t free0 = 0, total = 0;
  CK(cudaMemGetInfo(&free0, &total));
  uint64_t zero = 0;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
  const double cold = time_ms(1, zero_dw, both);
  const double ms = time_ms(reps, zero_dw, both);
  uint64_t used_high = 0, reserved_high = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_high));
  size_t free1 = 0;
  CK(cudaMemGetInfo(&free1, &total));
  const double fwd_ms = time_ms(reps, nothing, fwd);
  const double bwd_ms = time_ms(reps, zero_dw, bwd);
  const char* ran_name = cuda::detail::logprob_bwd_path_name(ran);

  // Rerun from dw = 0: the same bits (on the device, word by word), and the other dh path.
  float *dh2, *dw2;
  CK(cudaMalloc(&dh2, size_t(T * H) * 4));
  CK(cudaMalloc(&dw2, size_t(V * H) * 4));
  zero_dw();
  both();
  CK(cudaMemcpy(dh2, dh, size_t(T * H) * 4, cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(dw2, dw, size_t(V * H) * 4, cudaMemcpyDeviceToDevice));
  CK(cudaMemset(dh, 0xA5, size_t(T * H) * 4));
  zero_dw();
  both();
  CK(cudaDeviceSynchronize());
  const unsigned long long rerun_dh = count_diff(dh, dh2, T * H * 4);
  const unsigned long long rerun_dw = count_diff(dw, dw2, V * H * 4);
  std::printf("rerun: dh %s (%llu words differ), dw %s (%llu words differ)\n",
              rerun_dh ? "DIFFERS" : "identical", rerun_dh, rerun_dw ? "DIFFERS" : "identical",
              rerun_dw);
  // The other dh paths (each of dw / wt / dx that is not the timed one): the same bits, and
  // their backward's time.
  struct Other {
    LogprobBwdPath path;
    double ms = 0;
    uint64_t used = 0;
    unsigned long long dh = 0, dw = 0;
  };
  std::vector<Other> others;
  const LogprobBwdPath timed = ran;
  for (LogprobBwdPath p : {LogprobBwdPath::kDwForm, LogprobBwdPath::kWtGemm,
                           LogprobBwdPath::kDxForm, LogprobBwdPath::kDxFused}) {
    if (!other_path || p == timed) continue;
    Other o{p};
    path = p;
    CK(cudaMemset(dh, 0xA5, size_t(T * H) * 4));
    zero_dw();
    bwd();  // warm, and the outputs compared below
    CK(cudaDeviceSynchronize());
    o.dh = count_diff(dh, dh2, T * H * 4);
    o.dw = count_diff(dw, dw2, V * H * 4);
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    o.ms = time_ms(reps, zero_dw, bwd);
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &o.used));
    std::printf("other path (%s): dh %s (%llu words differ), dw %s (%llu words differ)\n",
                cuda::detail::logprob_bwd_path_name(p), o.dh ? "DIFFERS" : "identical", o.dh,
                o.dw ? "DIFFERS" : "identical", o.dw);
    others.push_back(o);
  }
  path = main_path;
  // The forward from the backward (LogprobRecompute): the backward from the forward's lse (as an
  // on-policy step has it from the rollout) that also returns logp / lse / entropy — the head's
  // forward + backward in one pass over the vocab (3 GEMM-equivalents). Its gradients equal the
  // plain backward's and its outputs the forward's, bit for bit (checked here, on the device).
  float* rcv = nullptr;
  CK(cudaMalloc(&rcv, size_t(3 * T) * 4));
  const cuda::detail::LogprobRecompute rcp{
      TensorView::contiguous(rcv, DType::kF32, {T}, Device::kCUDA),
      TensorView::contiguous(rcv + T, DType::kF32, {T}, Device::kCUDA),
      TensorView::contiguous(rcv + 2 * T, DType::kF32, {T}, Device::kCUDA)};
  auto bwd_rc = [&] {
    ran = cuda::detail::linear_logprob_backward_with_path(vh, vw, vt, prm, cfg, ls, en, glp,
                                                          ent ? &gent : nullptr, vdh, order, vdw,
                                                          path, nullptr, nullptr, &rcp);
  };
  CK(cudaMemset(dh, 0xA5, size_t(T * H) * 4));
  CK(cudaMemset(rcv, 0xA5, size_t(3 * T) * 4));
  zero_dw();
  bwd_rc();
  CK(cudaDeviceSynchronize());
  const unsigned long long rc_dh = count_diff(dh, dh2, T * H * 4);
  const unsigned long long rc_dw = count_diff(dw, dw2, V * H * 4);
  const unsigned long long rc_fwd = count_diff(rcv, vec, 3 * T * 4);  // logp, lse, entropy
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  const double rc_ms = time_ms(reps, zero_dw, bwd_rc);
  uint64_t rc_used = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &rc_used));
  const bool rc_same = rc_dh == 0 && rc_dw == 0 && rc_fwd == 0;
  std::printf(
      "the forward from the backward (dh path %s): dh %s (%llu words differ), dw %s (%llu), the "
      "forward's logp / lse / entropy %s (%llu words differ)\n",
      cuda::detail::logprob_bwd_path_name(ran), rc_dh ? "DIFFERS" : "identical", rc_dh,
      rc_dw ? "DIFFERS" : "identical", rc_dw, rc_fwd ? "DIFFER" : "identical", rc_fwd);
  // The one pass with the G kernel (kDxForm) beside the automatic path, when that is another.
  const LogprobBwdPath rc_ran = ran;
  double rc_dx_ms = 0;
  bool rc_dx_same = true;
  if (other_path && rc_ran != LogprobBwdPath::kDxForm) {
    path = LogprobBwdPath::kDxForm;
    CK(cudaMemset(dh, 0xA5, size_t(T * H) * 4));
    CK(cudaMemset(rcv, 0xA5, size_t(3 * T) * 4));
    zero_dw();
    bwd_rc();
    CK(cudaDeviceSynchronize());
    rc_dx_same = count_diff(dh, dh2, T * H * 4) == 0 && count_diff(dw, dw2, V * H * 4) == 0 &&
                 count_diff(rcv, vec, 3 * T * 4) == 0;
    rc_dx_ms = time_ms(reps, zero_dw, bwd_rc);
    std::printf("the forward from the backward (dh path %s): dh, dw and the forward's outputs %s\n",
                cuda::detail::logprob_bwd_path_name(LogprobBwdPath::kDxForm),
                rc_dx_same ? "identical" : "DIFFER");
    path = main_path;
  }
  CK(cudaFree(rcv));
  bool others_same = true;
  double other_ms = 0;
  for (const Other& o : others) {
    others_same = others_same && o.dh == 0 && o.dw == 0;
    if (o.path == LogprobBwdPath::kWtGemm) other_ms = o.ms;
  }

  const double mib = 1.0 / double(1 << 20);
  const double dh_mib = double(T * H * 4) * mib, vec_mib = double(5 * T * 4) * mib;
  const double extra_mib = double(used_high) * mib + dh_mib + vec_mib;
  const double flop = 2.0 * double(T) * double(H) * double(V);
  std::printf(
      "\n| op | ms | TFLOP/s (model: 4 GEMMs of 2·T·H·V) | scratch MiB (pool used high) |\n");
  std::printf("|---|---|---|---|\n");
  std::printf("| lockstep forward + backward (steady; dh path: %s) | %.2f | %.1f | %.1f |\n",
              ran_name, ms, 4 * flop / ms * 1e-9, double(used_high) * mib);
  std::printf("| lockstep forward + backward (first call) | %.2f | %.1f | |\n", cold,
              4 * flop / cold * 1e-9);
  std::printf("| lockstep forward alone | %.2f | %.1f | |\n", fwd_ms, flop / fwd_ms * 1e-9);
  std::printf("| lockstep backward alone | %.2f | %.1f | |\n", bwd_ms, 3 * flop / bwd_ms * 1e-9);
  std::printf(
      "| lockstep forward + backward in one pass from a given lse (the forward's outputs "
      "recomputed by the backward; dh path: %s) | %.2f | %.1f | %.1f |\n",
      cuda::detail::logprob_bwd_path_name(rc_ran), rc_ms, 3 * flop / rc_ms * 1e-9,
      double(rc_used) * mib);
  if (rc_dx_ms > 0)
    std::printf("| the one pass, dh path: %s | %.2f | %.1f | |\n",
                cuda::detail::logprob_bwd_path_name(LogprobBwdPath::kDxForm), rc_dx_ms,
                3 * flop / rc_dx_ms * 1e-9);
  for (const Other& o : others)
    std::printf("| lockstep backward alone, other dh path (%s) | %.2f | %.1f | %.1f |\n",
                cuda::detail::logprob_bwd_path_name(o.path), o.ms, 3 * flop / o.ms * 1e-9,
                double(o.used) * mib);
  std::printf(
      "memory beyond the lm_head's fp32 gradient (%.1f MiB) and the inputs h, W: scratch "
      "%.1f + dh (f32) %.1f + [T] vectors %.2f = %.1f MiB = %.3f GiB (target <= 0.5 GiB: "
      "%s); pool reserved high %.1f MiB; cudaMemGetInfo free before %.1f, after %.1f MiB\n",
      double(V * H * 4) * mib, double(used_high) * mib, dh_mib, vec_mib, extra_mib,
      extra_mib / 1024.0, extra_mib <= 512.0 ? "met" : "NOT met", double(reserved_high) * mib,
      double(free0) * mib, double(free1) * mib);
  const bool ok = self_ok && rerun_dh == 0 && rerun_dw == 0 && others_same && rc_same && rc_dx_same;
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f) {
      std::fprintf(f,
                   "{\"T\": %lld, \"H\": %lld, \"V\": %lld, \"vocab_segments\": %d, \"ms\": %.4f, "
                   "\"cold_ms\": %.4f, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"other_path_ms\": "
                   "%.4f, \"scratch_mib\": %.2f, \"extra_mib\": %.2f, \"rerun_identical\": %s, "
                   "\"paths_identical\": %s, \"one_pass_ms\": %.4f, \"one_pass_identical\": "
                   "%s, \"one_pass_extra_mib\": %.2f, \"path\": \"%s\", \"one_pass_path\": "
                   "\"%s\", \"one_pass_dx_ms\": %.4f, \"other_paths\": {",
                   (long long)T, (long long)H, (long long)V, cfg.vocab_segments, ms, cold, fwd_ms,
                   bwd_ms, other_ms, double(used_high) * mib, extra_mib,
                   rerun_dh == 0 && rerun_dw == 0 ? "true" : "false",
                   others_same ? "true" : "false", rc_ms, rc_same ? "true" : "false",
                   double(rc_used) * mib + dh_mib + vec_mib, ran_name,
                   cuda::detail::logprob_bwd_path_name(rc_ran), rc_dx_ms);
      // Each other dh path's backward alone (ms), by its name.
      for (size_t i = 0; i < others.size(); ++i)
        std::fprintf(f, "%s\"%s\": %.4f", i ? ", " : "",
                     cuda::detail::logprob_bwd_path_name(others[i].path), others[i].ms);
      std::fprintf(f, "}}\n");
      std::fclose(f);
    }
  }
  CK(cudaFree(h));
  CK(cudaFree(w));
  CK(cudaFree(tg));
  CK(cudaFree(vec));
  CK(cudaFree(dh));
  CK(cudaFree(dw));
  CK(cudaFree(dh2));
  CK(cudaFree(dw2));
  return ok ? 0 : 1;
}
