// Benchmark of the model backward on the GPU (engine/train.h over the invariant CUDA backend):
// a Qwen3 shape (default: Qwen3-8B's dimensions with 2 layers, random weights), one packed
// micro-batch of `batch` sequences of `seq` tokens; times the forward without trace, the forward
// with its activations saved (Backprop::forward: the trace's host round trip included) and the
// backward (Backprop::backward: every parameter's fp32 gradient), each the mean of `iters` calls
// after one warm-up, with a device synchronize around each call; checks that two backward runs
// give identical gradients. `--json FILE` writes the numbers for bench/cuda/train_torch.py, which
// runs the same shape through transformers' Qwen3 (SDPA) forward + backward beside it.
//   ./bench_train --json /tmp/train.json && python3 bench/cuda/train_torch.py --ours
//   /tmp/train.json
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"
#include "engine/cuda/backends.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/train.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<uint8_t> host_bytes(const OpsBackend& ops, const TensorView& v) {
  Tensor h(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.ndim));
  ops.copy(h.view(), v);
  ops.synchronize();
  const uint8_t* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen3-8b", json;
  int layers = 2, iters = 3;
  int64_t seq = 1024, batch = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_train: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--shape")
      shape = next();
    else if (a == "--layers")
      layers = std::atoi(next().c_str());
    else if (a == "--seq")
      seq = std::atoll(next().c_str());
    else if (a == "--batch")
      batch = std::atoll(next().c_str());
    else if (a == "--iters")
      iters = std::atoi(next().c_str());
    else if (a == "--json")
      json = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_train [--shape qwen3-8b|qwen3-0.6b] [--layers N] [--seq N] "
                   "[--batch N] [--iters N] [--json FILE]\n");
      return 2;
    }
  }
  if (layers < 1 || seq < 1 || batch < 1 || iters < 1) {
    std::fprintf(stderr, "bench_train: --layers, --seq, --batch and --iters must be >= 1\n");
    return 2;
  }
  Qwen3Config cfg = qwen3_shape_config(shape);
  cfg.num_hidden_layers = layers;
  const int64_t T = seq * batch;
  std::printf(
      "model backward, %s shape with %d layers (H %lld, I %lld, Hq %lld, Hkv %lld, D %lld, "
      "V %lld, %s), %lld x %lld tokens, contract defaults\n",
      shape.c_str(), layers, (long long)cfg.hidden_size, (long long)cfg.intermediate_size,
      (long long)cfg.num_attention_heads, (long long)cfg.num_key_value_heads,
      (long long)cfg.head_dim, (long long)cfg.vocab_size,
      cfg.tie_word_embeddings ? "tied" : "untied", (long long)batch, (long long)seq);
  std::fflush(stdout);
  const Weights weights = random_qwen3_weights(cfg, 1);
  std::map<std::string, TensorView> views;
  for (auto& [n, t] : weights) views[n] = t.view();
  ModelOptions opt;
  opt.max_positions = seq;
  Model model(cfg, views, opt, make_cuda_invariant_backend());
  const OpsBackend& ops = model.ops();
  Backprop bp(cfg, views, opt, ops);
  Gradients grads(cfg, ops);

  std::mt19937_64 g(7);
  std::uniform_int_distribution<int32_t> id(0, int32_t(cfg.vocab_size - 1));
  std::normal_distribution<float> nd(0.0f, 1.0f / float(T));
  std::vector<int32_t> tokens(static_cast<size_t>(T)), cu;
  for (auto& x : tokens) x = id(g);
  for (int64_t b = 0; b <= batch; ++b) cu.push_back(int32_t(b * seq));
  std::vector<int64_t> targets(static_cast<size_t>(T));
  std::vector<float> g_lp(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    targets[size_t(t)] = (t + 1) % seq == 0 ? -1 : tokens[size_t(t + 1)];
    g_lp[size_t(t)] = nd(g);
  }
  std::vector<int64_t> step(static_cast<size_t>(batch));
  std::iota(step.begin(), step.end(), 0);
  const TensorView tv = TensorView::contiguous(tokens.data(), DType::kI32, {T});
  const TensorView cv = TensorView::contiguous(cu.data(), DType::kI32, {batch + 1});
  const TensorView tg = TensorView::contiguous(targets.data(), DType::kI64, {T});
  const TensorView glp = TensorView::contiguous(g_lp.data(), DType::kF32, {T});

  // Forward without trace (device output).
  Tensor hidden = ops.empty(DType::kBF16, {T, cfg.hidden_size});
  auto timed = [&](auto&& fn) {
    fn();
    ops.synchronize();
    double sum = 0;
    for (int i = 0; i < iters; ++i) {
      const double t0 = now_ms();
      fn();
      ops.synchronize();
      sum += now_ms() - t0;
    }
    return sum / iters;
  };
  const double fwd_ms = timed([&] { model.forward_packed(tv, cv, hidden.view()); });
  SavedForward f;
  const double save_ms = timed([&] { f = bp.forward(model, tv, cv); });
  Tensor lp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
  model.logprob(f.hidden.view(), tg, 1.0f, lp.view(), lse.view(), ent.view());
  const std::string lm = cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  const std::string q0 = "model.layers.0.self_attn.q_proj.weight";
  auto backward = [&] {
    grads.reset();
    bp.backward(f, tg, LogprobParams{}, lse.view(), ent.view(), glp, nullptr, step, grads);
  };
  const double bwd_ms = timed(backward);
  // Determinism, outside the timing: two more runs, the lm_head's and layer 0's q_proj gradients.
  backward();
  const std::vector<uint8_t> first_lm = host_bytes(ops, grads[lm]),
                             first_q = host_bytes(ops, grads[q0]);
  backward();
  const bool identical =
      host_bytes(ops, grads[lm]) == first_lm && host_bytes(ops, grads[q0]) == first_q;
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  const double used_gib = double(total_b - free_b) / double(1ull << 30);
  std::printf("| step | ms | tokens/s |\n| --- | --- | --- |\n");
  std::printf("| forward (no trace) | %.2f | %.0f |\n", fwd_ms, T / fwd_ms * 1e3);
  std::printf("| forward, activations saved | %.2f | %.0f |\n", save_ms, T / save_ms * 1e3);
  std::printf("| backward (all fp32 gradients) | %.2f | %.0f |\n", bwd_ms, T / bwd_ms * 1e3);
  std::printf("gradients identical run to run (lm_head, layer 0 q_proj): %s\n",
              identical ? "yes" : "NO");
  std::printf("device memory in use at the end: %.1f GiB\n", used_gib);
  if (!json.empty()) {
    std::ofstream o(json);
    o << "{\"shape\": \"" << shape << "\", \"layers\": " << layers << ", \"seq\": " << seq
      << ", \"batch\": " << batch << ", \"forward_ms\": " << fwd_ms
      << ", \"forward_saved_ms\": " << save_ms << ", \"backward_ms\": " << bwd_ms
      << ", \"identical\": " << (identical ? "true" : "false") << "}\n";
  }
  return identical ? 0 : 1;
}
