// Decode speed of the CPU reference backend on a ~20M-parameter Qwen3-shaped model (random
// weights from a fixed seed): one sequence, prompt prefilled, then token-by-token decode through
// the paged KV cache with sampling — the rollout engine's inner loop. Prints ms/token and
// tokens/s at a few context lengths. Not a test: speed lives here.
//   ./build/bench_decode [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "engine/default_model.h"
#include "engine/model.h"

using namespace lockstep;
using namespace lockstep::engine;

int main(int argc, char** argv) {
  if (argc > 1) set_num_threads(std::atoi(argv[1]));
  Qwen3Config cfg = default_model_config();
  cfg.vocab_size = 8192;
  cfg.hidden_size = 512;
  cfg.intermediate_size = 1536;
  cfg.num_hidden_layers = 6;
  cfg.num_attention_heads = 8;
  cfg.num_key_value_heads = 4;
  cfg.head_dim = 64;
  cfg.max_position_embeddings = 4096;
  cfg.validate();
  Weights w = random_qwen3_weights(cfg, 1);
  std::map<std::string, TensorView> views;
  for (auto& [name, t] : w) views[name] = t.view();
  ModelOptions opt;
  opt.contract.gemm_segments = 1;
  Model model(cfg, views, opt, make_invariant_backend());
  std::printf("bench_decode: %lld parameters (%s), %d threads\n",
              (long long)qwen3_num_parameters(cfg), cfg.to_string().c_str(), num_threads());

  const int64_t page = 16, max_ctx = 1024, pages = max_ctx / page, L = cfg.num_hidden_layers;
  const int64_t Hkv = cfg.num_key_value_heads, D = cfg.head_dim, H = cfg.hidden_size;
  std::vector<Tensor> kc, vc;
  KvCacheView cache;
  for (int64_t l = 0; l < L; ++l) {
    kc.emplace_back(DType::kBF16, std::vector<int64_t>{pages, page, Hkv, D});
    vc.emplace_back(DType::kBF16, std::vector<int64_t>{pages, page, Hkv, D});
    cache.k.push_back(kc.back().view());
    cache.v.push_back(vc.back().view());
  }
  Tensor bt(DType::kI32, {1, pages}), lens(DType::kI32, {1});
  for (int64_t p = 0; p < pages; ++p) bt.ptr<int32_t>()[p] = int32_t(p);
  cache.block_table = bt.view();
  cache.seq_lens = lens.view();

  std::printf("%10s %12s %12s\n", "context", "ms/token", "tokens/s");
  int64_t pos = 0;
  int64_t next = 1;
  for (int64_t target : {64, 256, 1000}) {
    // Advance to `target` by decoding (so the timing also covers getting there), time the last 32.
    auto t_start = std::chrono::steady_clock::now();
    int64_t timed = 0;
    while (pos < target) {
      bool timing = pos >= target - 32;
      if (timing && timed == 0) t_start = std::chrono::steady_clock::now();
      Tensor tok(DType::kI64, {1}), seq(DType::kI32, {1}), ps(DType::kI32, {1});
      tok.ptr<int64_t>()[0] = next;
      seq.ptr<int32_t>()[0] = 0;
      ps.ptr<int32_t>()[0] = int32_t(pos);
      lens.ptr<int32_t>()[0] = int32_t(pos + 1);
      Tensor h(DType::kBF16, {1, H});
      model.forward_step(tok.view(), seq.view(), ps.view(), cache, StepOptions{}, h.view());
      SamplingParams sp;
      sp.seed = 7;
      sp.temperature = 0.8f;
      Tensor rid(DType::kI64, {1}), id(DType::kI64, {1}), lp(DType::kF32, {1}),
          lse(DType::kF32, {1}), ent(DType::kF32, {1});
      rid.ptr<int64_t>()[0] = 0;
      model.sample(h.view(), std::span<const SamplingParams>(&sp, 1), rid.view(), ps.view(),
                   id.view(), lp.view(), lse.view(), ent.view());
      next = id.ptr<int64_t>()[0];
      ++pos;
      if (timing) ++timed;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    std::printf("%10lld %12.2f %12.1f\n", (long long)target, 1e3 * s / double(timed),
                double(timed) / s);
  }
  return 0;
}
