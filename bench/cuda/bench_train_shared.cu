// Training time and device memory with group-shared prompts (docs/contract.md §B.11) against the
// unshared packing, on the GPU (the invariant CUDA backend): one training step over `groups` GRPO
// groups of one prompt of P tokens and G completions of C tokens each, one group per micro-batch,
// a Qwen3 shape with random weights (default: Qwen3-0.6B, all 28 layers; P 2048, G 8, C 256).
// Per form: the forward with saved activations (Backprop::forward / forward_shared, the trace's
// host round trip included), the log-prob head's forward, the backward, each summed over the
// micro-batches and the best of `iters` steps after one warm-up; packed rows; the saved
// activations' bytes; the step's peak device memory beyond the model's weights (the default
// memory pool's high-water mark: cuda::empty allocates from it). Checks that the completion
// log-probs, lse and entropies of the two forms are the same bits (they must be: §B.11) and reports
// how far the gradients are apart (the prompt keys' sums are a different chain: within the fp64
// oracle's tolerance, not equal).
//   ./bench_train_shared [--shape qwen3-0.6b] [--layers N] [--prompt P] [--group G]
//                        [--completion C] [--groups N] [--iters N]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"
#include "engine/cuda/backends.h"
#include "engine/default_model.h"
#include "engine/device.h"
#include "util/shared_train_util.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// The device's default memory pool (cuda::empty allocates from it): bytes in use now, and the
// high-water mark since the last reset.
cudaMemPool_t pool() {
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaMemPool_t p;
  CK(cudaDeviceGetDefaultMemPool(&p, dev));
  return p;
}
double pool_gib(cudaMemPoolAttr attr) {
  uint64_t v = 0;
  CK(cudaMemPoolGetAttribute(pool(), attr, &v));
  return double(v) / double(1ull << 30);
}
void reset_pool_high() {
  uint64_t zero = 0;
  CK(cudaMemPoolSetAttribute(pool(), cudaMemPoolAttrUsedMemHigh, &zero));
}

bool same_bits(const std::vector<std::vector<std::vector<float>>>& a,
               const std::vector<std::vector<std::vector<float>>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size()) return false;
    for (size_t c = 0; c < a[k].size(); ++c)
      if (a[k][c].size() != b[k][c].size() ||
          std::memcmp(a[k][c].data(), b[k][c].data(), a[k][c].size() * sizeof(float)) != 0)
        return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen3-0.6b";
  int layers = -1, iters = 2;
  int P = 2048, G = 8, C = 256, groups = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_train_shared: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--shape" && i + 1 < argc)
      shape = argv[++i];
    else if (a == "--layers")
      layers = next();
    else if (a == "--prompt")
      P = next();
    else if (a == "--group")
      G = next();
    else if (a == "--completion")
      C = next();
    else if (a == "--groups")
      groups = next();
    else if (a == "--iters")
      iters = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_train_shared [--shape qwen3-0.6b|qwen3-8b] [--layers N] "
                   "[--prompt P] [--group G] [--completion C] [--groups N] [--iters N]\n");
      return 2;
    }
  }
  if (P < 1 || G < 1 || C < 2 || groups < 1 || iters < 1 || layers == 0 || layers < -1) {
    std::fprintf(stderr,
                 "bench_train_shared: --prompt, --group, --groups, --iters and --layers must be "
                 ">= 1, --completion >= 2\n");
    return 2;
  }
  Qwen3Config cfg = qwen3_shape_config(shape);
  if (layers > 0) cfg.num_hidden_layers = layers;
  cfg.max_position_embeddings = std::max<int64_t>(cfg.max_position_embeddings, P + C);
  std::printf(
      "shared vs unshared prompts, %s shape, %lld layers (H %lld, Hq %lld, Hkv %lld, D %lld, V "
      "%lld, %s); %d group(s) of P = %d, G = %d x C = %d, one group per micro-batch\n",
      shape.c_str(), (long long)cfg.num_hidden_layers, (long long)cfg.hidden_size,
      (long long)cfg.num_attention_heads, (long long)cfg.num_key_value_heads,
      (long long)cfg.head_dim, (long long)cfg.vocab_size,
      cfg.tie_word_embeddings ? "tied" : "untied", groups, P, G, C);
  std::fflush(stdout);
  const Weights weights = random_qwen3_weights(cfg, 1);
  std::map<std::string, TensorView> views;
  for (const auto& [n, t] : weights) views[n] = t.view();
  ModelOptions opt;  // the default contract
  opt.max_positions = P + C;
  std::mt19937_64 g(7);
  std::vector<std::pair<int, std::vector<int>>> shape_of(size_t(groups),
                                                         {P, std::vector<int>(size_t(G), C)});
  const test_shared::GroupStep st = test_shared::make_group_step(cfg, shape_of, g);
  std::vector<std::vector<size_t>> mbs;
  for (int k = 0; k < groups; ++k) mbs.push_back({size_t(k)});

  test_shared::StepModel m(cfg, views, opt, make_cuda_invariant_backend());
  CK(cudaDeviceSynchronize());
  const double base_gib = pool_gib(cudaMemPoolAttrUsedMemCurrent);  // weights, RoPE tables
  struct Result {
    std::optional<test_shared::StepOut> out;
    double fwd = 1e30, head = 1e30, bwd = 1e30, step = 1e30;
    double mem_gib = 0;  // peak device memory of a step beyond the weights
  };
  auto run = [&](bool shared) {
    Result r;
    CK(cudaDeviceSynchronize());
    reset_pool_high();
    for (int it = 0; it <= iters; ++it) {
      r.out.reset();  // the previous step's gradients freed first (the peak is one step's)
      test_shared::StepOut o = shared ? test_shared::run_shared_step(m, st, mbs)
                                      : test_shared::run_unshared_step(m, st, mbs);
      if (it > 0) {  // the first is the warm-up
        r.fwd = std::min(r.fwd, o.forward_s);
        r.head = std::min(r.head, o.head_s);
        r.bwd = std::min(r.bwd, o.backward_s);
        r.step = std::min(r.step, o.forward_s + o.head_s + o.backward_s);
      }
      r.out = std::move(o);
    }
    CK(cudaDeviceSynchronize());
    r.mem_gib = pool_gib(cudaMemPoolAttrUsedMemHigh) - base_gib;
    return r;
  };
  const Result un = run(false);
  const Result sh = run(true);
  std::printf(
      "| form | packed rows | forward (saved) s | head s | backward s | step s | saved "
      "activations GiB | peak device memory GiB (beyond the weights) |\n|---|---|---|---|---|---|"
      "---|---|\n");
  for (const auto* r : {&un, &sh})
    std::printf("| %s | %lld | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f |\n",
                r == &un ? "unshared" : "shared", (long long)r->out->rows, r->fwd, r->head, r->bwd,
                r->step, double(r->out->saved_bytes) / double(1ull << 30), r->mem_gib);
  std::printf(
      "shared / unshared: step %.2fx less time, forward %.2fx, backward %.2fx; saved "
      "activations %.2fx less\n",
      un.step / sh.step, un.fwd / sh.fwd, un.bwd / sh.bwd,
      double(un.out->saved_bytes) / double(sh.out->saved_bytes));
  const bool lp = same_bits(un.out->logp, sh.out->logp) && same_bits(un.out->lse, sh.out->lse) &&
                  same_bits(un.out->ent, sh.out->ent);
  std::printf("completion logp / lse / entropy bitwise equal across the forms: %s\n",
              lp ? "yes" : "NO");
  // Gradients: max over parameters of |shared - unshared|_max / |unshared|_max.
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < un.out->grads.all().size(); ++i) {
    const auto& [name, tu] = un.out->grads.all()[i];
    const Tensor hu = to_host(m.model.ops(), tu.view());
    const Tensor hs = to_host(m.model.ops(), sh.out->grads.all()[i].second.view());
    double diff = 0, mag = 0;
    for (int64_t j = 0; j < hu.numel(); ++j) {
      const double a = hu.ptr<float>()[j], b = hs.ptr<float>()[j];
      diff = std::max(diff, std::fabs(a - b));
      mag = std::max(mag, std::fabs(a));
    }
    const double rel = mag > 0 ? diff / mag : diff;
    if (rel >= worst) {
      worst = rel;
      worst_name = name;
    }
  }
  std::printf("gradients: largest max|shared - unshared| / max|unshared| = %.3g (%s)\n", worst,
              worst_name.c_str());
  return lp ? 0 : 1;
}
