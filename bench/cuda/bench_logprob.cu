// Benchmark of the CUDA LogP op (cuda::linear_logprob) at a training shape: T tokens, hidden H,
// vocab V (default 8192 x 4096 x 151936, bf16) — the automatic choice, then each logits ->
// tile-state producer forced (fused GEMM epilogue / unfused GEMM + tile-state kernel; their
// outputs are compared bitwise with the automatic call's) — plus the logits GEMM alone (the same
// cuda::gemm_bf16_nt calls the op makes, into one [256, V] fp32 scratch) and cuda::sample on the
// first rows. Time: median of --reps calls (cudaEvent pair around each call). Memory: the
// stream-ordered pool's high-water mark of used bytes (cudaMemPoolAttrUsedMemHigh, reset before
// the timed calls) = the op's scratch, and cudaMemGetInfo before / after. Writes a JSON summary
// (--json PATH) that bench/cuda/logprob_torch.py prints next to PyTorch's numbers:
//   ./build-gpu-lp/bench_logprob --json /tmp/lp.json && python3 bench/cuda/logprob_torch.py \
//       --ours /tmp/lp.json
// Sampling's choice stage (filters + the mass choice after the logits and the LogP state exist:
// cuda::detail::sample_block_choose) is timed alone on --choice-rows rows (default 128) per
// setting, at temperature 1 (flat rows: z has std ~1.3) and 0.25 (peaked), next to the whole
// cuda::sample on the same rows (whose ids must equal the stage's; the exit status says so too).
// The JSON's "choice" part is what bench/cuda/sampling_torch.py (the torch sampler on logits of
// the same shape and law) prints beside its own times:
//   ./build-gpu/bench_logprob --json /tmp/lp.json && python3 bench/cuda/sampling_torch.py \
//       --ours /tmp/lp.json
// NOTE: the default pool's release threshold is raised so freed scratch stays reserved between
// calls (as PyTorch's caching allocator keeps its blocks); the first, cold call is timed apart.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"            // CK
#include "cuda/logprob_internal.h"   // the producer hook (fused / unfused)
#include "cuda/sampling_internal.h"  // the sampling stages
#include "lockstep/contract.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/sampling.h"

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

__global__ void fill_targets_kernel(int64_t* p, int64_t n, int64_t V, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = int64_t(mix(seed + uint64_t(i)) % uint32_t(V));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `reps` calls of fn.
double time_ms(int reps, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
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

// One sampling setting of the choice benchmark (every row gets it).
struct ChoiceCase {
  const char* name;
  float temperature;
  int64_t top_k;
  float top_p, min_p;
};

struct ChoiceResult {
  ChoiceCase c;
  double choice_ms, sample_ms;
  bool same_ids;
};

// The choice stage alone on R rows (logits z = h[0, R) · Wᵀ, LogP state once per temperature),
// then cuda::sample on the same rows; the ids of both must agree.
std::vector<ChoiceResult> bench_choice(const TensorView& vh, const TensorView& vw,
                                       const ContractConfig& cfg, int64_t R, int reps) {
  namespace d = cuda::detail;
  const int64_t V = vw.size(0);
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  const int64_t n_tiles = lay.padded / lay.tile;
  float *z, *states, *stats, *logp;
  int64_t *ids, *ids_op, *idx;
  d::SampleRow* info;
  unsigned long long* seg;
  CK(cudaMalloc(&z, size_t(R * lay.padded) * 4));
  CK(cudaMalloc(&seg, size_t(R * d::sample_seg_count()) * 8));
  CK(cudaMalloc(&states, size_t(R * n_tiles * 3) * 4));
  CK(cudaMalloc(&stats, size_t(4 * R) * 4));
  CK(cudaMalloc(&logp, size_t(R) * 4));
  CK(cudaMalloc(&ids, size_t(R) * 8));
  CK(cudaMalloc(&ids_op, size_t(R) * 8));
  CK(cudaMalloc(&idx, size_t(2 * R) * 8));
  CK(cudaMalloc(&info, size_t(R) * sizeof(d::SampleRow)));
  std::vector<int64_t> hidx(static_cast<size_t>(2 * R));
  for (int64_t t = 0; t < R; ++t) hidx[size_t(t)] = t, hidx[size_t(R + t)] = 100 + t;
  CK(cudaMemcpy(idx, hidx.data(), hidx.size() * 8, cudaMemcpyHostToDevice));
  const TensorView rid = TensorView::contiguous(idx, DType::kI64, {R}, Device::kCUDA);
  const TensorView pos = TensorView::contiguous(idx + R, DType::kI64, {R}, Device::kCUDA);
  d::SampleBlockParams bp{.y = z,
                          .ldy = lay.padded,
                          .rows = R,
                          .V = V,
                          .states = states,
                          .n_tiles = n_tiles,
                          .tile = lay.tile,
                          .info = info,
                          .rid = d::index_ref(rid),
                          .pos = d::index_ref(pos),
                          .lse = stats,
                          .entropy = stats + R,
                          .out_id = ids,
                          .out_logp = logp,
                          .seg = seg};
  const ChoiceCase cases[] = {
      {"greedy", 0.0f, 0, 1.0f, 0.0f},
      {"plain", 1.0f, 0, 1.0f, 0.0f},
      {"min-p 0.1", 1.0f, 0, 1.0f, 0.1f},
      {"top-k 50", 1.0f, 50, 1.0f, 0.0f},
      {"top-p 0.9", 1.0f, 0, 0.9f, 0.0f},
      {"top-p 0.5", 1.0f, 0, 0.5f, 0.0f},
      {"top-k 50 + top-p 0.9", 1.0f, 50, 0.9f, 0.0f},
      {"top-k 50 + top-p 0.9 + min-p 0.05", 1.0f, 50, 0.9f, 0.05f},
  };
  std::vector<ChoiceResult> out;
  for (float tau : {1.0f, 0.25f}) {
    const TensorView zv = [&] {
      TensorView v = TensorView::contiguous(z, DType::kF32, {R, V}, Device::kCUDA);
      v.stride[0] = lay.padded;
      return v;
    }();
    for (ChoiceCase c : cases) {
      if (c.temperature == 0.0f && tau != 1.0f) continue;  // greedy: τ_lp = 1 anyway
      if (c.temperature != 0.0f) c.temperature = tau;
      SamplingParams sp;
      sp.temperature = c.temperature;
      sp.top_k = c.top_k;
      sp.top_p = c.top_p;
      sp.min_p = c.min_p;
      std::vector<SamplingParams> ps(static_cast<size_t>(R), sp);
      std::vector<d::SampleRow> rows(static_cast<size_t>(R));
      for (int64_t t = 0; t < R; ++t) {
        ps[size_t(t)].seed = uint64_t(t);
        rows[size_t(t)] = d::sample_row(ps[size_t(t)], V);
      }
      CK(cudaMemcpy(info, rows.data(), rows.size() * sizeof(d::SampleRow), cudaMemcpyHostToDevice));
      bp.any_plain = rows[0].mode == d::kPlain ? 1 : 0;  // (every row has the setting)
      // The logits and the LogP state at this setting's τ_lp (the stage reads them only).
      cuda::gemm_bf16_nt(vh.rows(0, R), vw, nullptr, logprob_logits_gemm(cfg), zv);
      d::sample_block_state(bp, lay, nullptr, "bench_choice");
      auto choose = [&] { d::sample_block_choose(bp, nullptr, "bench_choice"); };
      choose();
      const double choice_ms = time_ms(reps, choose);
      auto samp = [&] {
        cuda::sample(vh.rows(0, R), vw, ps, rid, pos, cfg,
                     TensorView::contiguous(ids_op, DType::kI64, {R}, Device::kCUDA),
                     TensorView::contiguous(logp, DType::kF32, {R}, Device::kCUDA),
                     TensorView::contiguous(stats + 2 * R, DType::kF32, {R}, Device::kCUDA),
                     TensorView::contiguous(stats + 3 * R, DType::kF32, {R}, Device::kCUDA));
      };
      samp();
      const double sample_ms = time_ms(std::max(1, reps / 2), samp);
      std::vector<int64_t> a(static_cast<size_t>(R)), b(static_cast<size_t>(R));
      CK(cudaMemcpy(a.data(), ids, size_t(R) * 8, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), ids_op, size_t(R) * 8, cudaMemcpyDeviceToHost));
      out.push_back({c, choice_ms, sample_ms, a == b});
    }
  }
  for (void* p : {static_cast<void*>(z), static_cast<void*>(states), static_cast<void*>(stats),
                  static_cast<void*>(logp), static_cast<void*>(ids), static_cast<void*>(ids_op),
                  static_cast<void*>(idx), static_cast<void*>(info), static_cast<void*>(seg)})
    CK(cudaFree(p));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 8192, H = 4096, V = 151936, Ts = 512, Rc = 128;
  int reps = 5;
  std::string json;
  std::vector<int64_t> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--sample-rows") == 0 && i + 1 < argc) {
      Ts = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--choice-rows") == 0 && i + 1 < argc) {
      Rc = std::atoll(argv[++i]);
    } else {
      pos.push_back(std::atoll(argv[i]));
    }
  }
  if (pos.size() >= 3) T = pos[0], H = pos[1], V = pos[2];
  Ts = std::min(Ts, T);
  Rc = std::min(Rc, T);
  const ContractConfig cfg;  // defaults: gemm_segments 1, vocab_tile 256, vocab_segments 1
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_logprob: %s, T=%lld H=%lld V=%lld bf16, %s\n", prop.name, (long long)T,
              (long long)H, (long long)V, cfg.to_string().c_str());
  std::printf("plan: %s\n", cuda::logprob_launch_plan(cfg, H, V).c_str());

  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

  uint16_t *h, *w;
  int64_t* tg;
  float* out;
  CK(cudaMalloc(&h, size_t(T * H) * 2));
  CK(cudaMalloc(&w, size_t(V * H) * 2));
  CK(cudaMalloc(&tg, size_t(T) * 8));
  CK(cudaMalloc(&out, size_t(3 * T) * 4));
  fill_bf16_kernel<<<4096, 256>>>(h, T * H, 1, 1.0f);
  fill_bf16_kernel<<<4096, 256>>>(w, V * H, 2, 0.0625f);
  fill_targets_kernel<<<64, 256>>>(tg, T, V, 3);
  CK(cudaDeviceSynchronize());
  const TensorView vh = TensorView::contiguous(h, DType::kBF16, {T, H}, Device::kCUDA);
  const TensorView vw = TensorView::contiguous(w, DType::kBF16, {V, H}, Device::kCUDA);
  const TensorView vt = TensorView::contiguous(tg, DType::kI64, {T}, Device::kCUDA);
  const TensorView lp = TensorView::contiguous(out, DType::kF32, {T}, Device::kCUDA);
  const TensorView ls = TensorView::contiguous(out + T, DType::kF32, {T}, Device::kCUDA);
  const TensorView en = TensorView::contiguous(out + 2 * T, DType::kF32, {T}, Device::kCUDA);
  const LogprobParams prm{1.0f};

  size_t free0 = 0, total = 0;
  CK(cudaMemGetInfo(&free0, &total));
  uint64_t zero = 0;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
  using cuda::detail::LogprobProducer;
  LogprobProducer force = LogprobProducer::kAuto, ran = LogprobProducer::kAuto;
  auto op = [&] {
    ran = cuda::detail::linear_logprob_with_producer(vh, vw, vt, prm, cfg, lp, ls, en, force);
  };
  const double cold = time_ms(1, op);
  const double ms = time_ms(reps, op);
  uint64_t used_high = 0, reserved_high = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_high));
  const char* auto_ran = cuda::detail::logprob_producer_name(ran);
  size_t free1 = 0;
  CK(cudaMemGetInfo(&free1, &total));
  // Each producer forced (same bits; checked below on the outputs).
  std::vector<float> ho_auto(size_t(3 * T));
  CK(cudaMemcpy(ho_auto.data(), out, ho_auto.size() * 4, cudaMemcpyDeviceToHost));
  double prod_ms[2] = {0, 0};
  uint64_t prod_used[2] = {0, 0};
  bool prod_same[2] = {false, false};
  const cuda::detail::LogprobProducer prods[2] = {cuda::detail::LogprobProducer::kFused,
                                                  cuda::detail::LogprobProducer::kUnfused};
  for (int i = 0; i < 2; ++i) {
    force = prods[i];
    CK(cudaMemset(out, 0xA5, size_t(3 * T) * 4));
    op();  // warm (scratch of this producer's size)
    CK(cudaDeviceSynchronize());
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    prod_ms[i] = time_ms(reps, op);
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &prod_used[i]));
    std::vector<float> hp(size_t(3 * T));
    CK(cudaMemcpy(hp.data(), out, hp.size() * 4, cudaMemcpyDeviceToHost));
    prod_same[i] = std::memcmp(hp.data(), ho_auto.data(), hp.size() * 4) == 0;
    std::printf("forced producer %s (ran: %s): %.2f ms, outputs %s the auto call's\n",
                i == 0 ? "fused" : "unfused", cuda::detail::logprob_producer_name(ran), prod_ms[i],
                prod_same[i] ? "bitwise equal to" : "DIFFER FROM");
  }
  force = LogprobProducer::kAuto;
  // A glance at the results (finite, plausible).
  std::vector<float> ho(size_t(3 * T));
  CK(cudaMemcpy(ho.data(), out, ho.size() * 4, cudaMemcpyDeviceToHost));
  double mean_lp = 0, mean_lse = 0, mean_ent = 0;
  for (int64_t t = 0; t < T; ++t)
    mean_lp += ho[size_t(t)], mean_lse += ho[size_t(T + t)], mean_ent += ho[size_t(2 * T + t)];
  std::printf("results: mean logp %.4f, mean lse %.4f, mean entropy %.4f (log V = %.4f)\n",
              mean_lp / double(T), mean_lse / double(T), mean_ent / double(T), std::log(double(V)));

  // The logits GEMM alone: the op's calls ([256, V] blocks into one fp32 scratch).
  const int64_t TB = 256;
  float* z;
  CK(cudaMalloc(&z, size_t(TB * V) * 4));
  const TensorView vz = TensorView::contiguous(z, DType::kF32, {TB, V}, Device::kCUDA);
  const GemmConfig gcfg = logprob_logits_gemm(cfg);
  auto gemm = [&] {
    for (int64_t r0 = 0; r0 + TB <= T; r0 += TB)
      cuda::gemm_bf16_nt(vh.rows(r0, r0 + TB), vw, nullptr, gcfg, vz);
  };
  gemm();
  const double gemm_ms = time_ms(reps, gemm) * double(T) / double(T / TB * TB);
  CK(cudaFree(z));

  // Sampling: Ts rows, a mix of plain, greedy, top-p 0.9 and top-k 50 rows.
  std::vector<SamplingParams> ps(static_cast<size_t>(Ts));
  for (int64_t t = 0; t < Ts; ++t) {
    ps[size_t(t)].seed = uint64_t(t);
    ps[size_t(t)].temperature = t % 4 == 1 ? 0.0f : 0.8f;
    if (t % 4 == 2) ps[size_t(t)].top_p = 0.9f;
    if (t % 4 == 3) ps[size_t(t)].top_k = 50;
  }
  std::vector<int64_t> rid(static_cast<size_t>(Ts)), sp(static_cast<size_t>(Ts));
  for (int64_t t = 0; t < Ts; ++t) rid[size_t(t)] = t, sp[size_t(t)] = 100 + t;
  int64_t* ids;
  CK(cudaMalloc(&ids, size_t(Ts) * 8));
  const TensorView hrid = TensorView::contiguous(rid.data(), DType::kI64, {Ts});
  const TensorView hpos = TensorView::contiguous(sp.data(), DType::kI64, {Ts});
  auto samp = [&] {
    cuda::sample(vh.rows(0, Ts), vw, ps, hrid, hpos, cfg,
                 TensorView::contiguous(ids, DType::kI64, {Ts}, Device::kCUDA), lp.rows(0, Ts),
                 ls.rows(0, Ts), en.rows(0, Ts));
  };
  samp();
  const double sample_ms = time_ms(std::max(1, reps / 2), samp);
  const std::vector<ChoiceResult> choice = bench_choice(vh, vw, cfg, Rc, reps);
  bool choice_same = true;
  for (const ChoiceResult& c : choice) choice_same = choice_same && c.same_ids;

  const double flop = 2.0 * double(T) * double(H) * double(V);
  const double mib = 1.0 / double(1 << 20);
  std::printf(
      "\n| op | ms | TFLOP/s | peak scratch (pool used high) MiB | pool reserved high MiB |\n");
  std::printf("|---|---|---|---|---|\n");
  std::printf("| lockstep linear_logprob (steady; auto = %s) | %.2f | %.1f | %.1f | %.1f |\n",
              auto_ran, ms, flop / ms * 1e-9, double(used_high) * mib, double(reserved_high) * mib);
  std::printf("| lockstep linear_logprob, fused producer forced | %.2f | %.1f | %.1f | |\n",
              prod_ms[0], flop / prod_ms[0] * 1e-9, double(prod_used[0]) * mib);
  std::printf("| lockstep linear_logprob, unfused producer forced | %.2f | %.1f | %.1f | |\n",
              prod_ms[1], flop / prod_ms[1] * 1e-9, double(prod_used[1]) * mib);
  std::printf("| lockstep linear_logprob (first call) | %.2f | %.1f | | |\n", cold,
              flop / cold * 1e-9);
  std::printf("| logits GEMM alone ([256, V] blocks) | %.2f | %.1f | %.1f (its z) | |\n", gemm_ms,
              flop / gemm_ms * 1e-9, double(TB * V * 4) * mib);
  std::printf("| lockstep sample (%lld rows: plain/greedy/top-p/top-k) | %.2f | | | |\n",
              (long long)Ts, sample_ms);
  std::printf("device memory: free before %.1f MiB, after %.1f MiB (inputs %.1f MiB)\n",
              double(free0) * mib, double(free1) * mib, double((T + V) * H * 2) * mib);
  std::printf(
      "\nsampling, %lld rows x V=%lld: the choice stage alone (filters + mass choice after "
      "the logits and the LogP state; %s) and the whole cuda::sample\n",
      (long long)Rc, (long long)V, cuda::detail::sample_choose_config().c_str());
  std::printf("| setting | temperature | choice stage us | whole cuda::sample ms | ids equal |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const ChoiceResult& c : choice)
    std::printf("| %s | %g | %.1f | %.3f | %s |\n", c.c.name, c.c.temperature, c.choice_ms * 1e3,
                c.sample_ms, c.same_ids ? "yes" : "NO");
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f) {
      std::fprintf(f,
                   "{\"T\": %lld, \"H\": %lld, \"V\": %lld, \"ms\": %.4f, \"cold_ms\": %.4f, "
                   "\"gemm_ms\": %.4f, \"sample_ms\": %.4f, \"sample_rows\": %lld, "
                   "\"peak_scratch_mib\": %.2f, \"reserved_high_mib\": %.2f, "
                   "\"fused_ms\": %.4f, \"unfused_ms\": %.4f, \"producers_equal\": %s, "
                   "\"choice_rows\": %lld, \"choice\": [",
                   (long long)T, (long long)H, (long long)V, ms, cold, gemm_ms, sample_ms,
                   (long long)Ts, double(used_high) * mib, double(reserved_high) * mib, prod_ms[0],
                   prod_ms[1], prod_same[0] && prod_same[1] ? "true" : "false", (long long)Rc);
      for (size_t i = 0; i < choice.size(); ++i) {
        const ChoiceResult& c = choice[i];
        std::fprintf(f,
                     "%s{\"name\": \"%s\", \"temperature\": %g, \"top_k\": %lld, "
                     "\"top_p\": %g, \"min_p\": %g, \"choice_us\": %.2f, \"sample_ms\": %.4f}",
                     i ? ", " : "", c.c.name, c.c.temperature, (long long)c.c.top_k, c.c.top_p,
                     c.c.min_p, c.choice_ms * 1e3, c.sample_ms);
      }
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  CK(cudaFree(h));
  CK(cudaFree(w));
  CK(cudaFree(tg));
  CK(cudaFree(out));
  CK(cudaFree(ids));
  return prod_same[0] && prod_same[1] && choice_same ? 0 : 1;
}
