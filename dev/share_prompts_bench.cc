// Training time and memory with group-shared prompts (docs/contract.md §B.11) vs unshared, on the
// CPU reference: one training step (forward with saved activations, log-prob head, backward) over
// `groups` GRPO groups of one prompt of P tokens and G completions of C tokens, one group per
// micro-batch, on a small random Qwen3 shape. Prints seconds (best of `reps`), packed rows and the
// saved activations' bytes of one micro-batch, for both forms. Dev tool: numbers for reports.
//   cmake --build build -j2 --target lockstep
//   g++ -O2 -std=c++20 -march=native -ffp-contract=off -Iinclude -Isrc -Itests \
//       dev/share_prompts_bench.cc build/liblockstep.a build/liblockstep_cpu.a \
//       build/liblockstep_contract.a build/liblockstep_core.a -lpthread -o /tmp/share_bench
//   /tmp/share_bench [P=512] [G=8] [C=64] [layers=2] [groups=1] [reps=2]
//   [form=both|shared|unshared]
// With one form the process's peak resident memory (VmHWM) is that form's.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "engine/default_model.h"
#include "util/shared_train_util.h"

using namespace lockstep;
using namespace lockstep::engine;

// Peak resident set size of this process (Linux /proc), MiB.
static double peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return 0;
}

int main(int argc, char** argv) {
  auto arg = [&](int i, int def) { return argc > i ? std::atoi(argv[i]) : def; };
  const int P = arg(1, 512), G = arg(2, 8), C = arg(3, 64), L = arg(4, 2), NG = arg(5, 1);
  const int reps = arg(6, 2);
  const std::string form = argc > 7 ? argv[7] : "both";
  Qwen3Config cfg;
  cfg.vocab_size = 1024;
  cfg.hidden_size = 128;
  cfg.intermediate_size = 256;
  cfg.num_hidden_layers = L;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 32;
  cfg.max_position_embeddings = P + C + 64;
  cfg.tie_word_embeddings = true;
  const Weights weights = random_qwen3_weights(cfg, 1);
  std::map<std::string, TensorView> views;
  for (const auto& [n, t] : weights) views[n] = t.view();
  ModelOptions opt;  // the default contract (kv_chunk 1024, one GEMM segment)
  std::mt19937_64 g(7);
  std::vector<std::pair<int, std::vector<int>>> shape(size_t(NG), {P, std::vector<int>(G, C)});
  const test_shared::GroupStep st = test_shared::make_group_step(cfg, shape, g);
  std::vector<std::vector<size_t>> mbs;
  for (int k = 0; k < NG; ++k) mbs.push_back({size_t(k)});
  std::printf(
      "model H=%lld L=%d Hq=%lld Hkv=%lld D=%lld V=%lld; %d group(s) of P=%d, G=%d x C=%d\n",
      (long long)cfg.hidden_size, L, (long long)cfg.num_attention_heads,
      (long long)cfg.num_key_value_heads, (long long)cfg.head_dim, (long long)cfg.vocab_size, NG, P,
      G, C);
  for (bool shared : {false, true}) {
    if (form != "both" && form != (shared ? "shared" : "unshared")) continue;
    double best = 1e30;
    int64_t rows = 0, bytes = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const test_shared::StepOut o = shared
                                         ? test_shared::run_shared_step(cfg, views, opt, st, mbs)
                                         : test_shared::run_unshared_step(cfg, views, opt, st, mbs);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
      rows = o.rows;
      bytes = o.saved_bytes;
    }
    std::printf("%-9s step %.3f s  packed rows %lld  saved activations per micro-batch %.2f MiB\n",
                shared ? "shared" : "unshared", best, (long long)rows, double(bytes) / (1 << 20));
  }
  std::printf("peak resident memory %.1f MiB\n", peak_rss_mib());
  return 0;
}
