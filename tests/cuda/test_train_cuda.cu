// The Qwen3 backward on the GPU (engine/train.h over the invariant CUDA backend, docs/contract.md
// §B.10): every parameter's fp32 gradient equals the CPU reference's bit for bit, and stays so
// across micro-batch splits of a step, shuffled packing inside a micro-batch and simulated TP
// 1/2/4 — on a tiny model and (outside --quick) on a wider one with long sequences, whose GEMMs
// take the tensor-core paths. The same for group-shared prompts (§B.11: forward_shared +
// backward_shared; the completion tokens' log-prob, lse and entropy too). Harness:
// cuda/gpu_harness.h (exits non-zero on any mismatch).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/gpu_harness.h"
#include "engine/backend.h"
#include "engine/cuda/backends.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/train.h"
#include "lockstep/cuda/runtime.h"
#include "util/shared_train_util.h"

namespace lockstep::engine {
namespace {

using gpu_test::report;

struct Setup {
  std::string name;
  Qwen3Config cfg;
  ContractConfig contract;
  std::vector<int> lens;
};

Setup tiny(bool tied) {
  Setup s;
  s.name = tied ? "tiny tied" : "tiny";
  Qwen3Config& c = s.cfg;
  c.vocab_size = 320;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = tied;
  s.contract.gemm_segments = 4;
  s.contract.kv_chunk = 64;
  s.contract.vocab_tile = 32;
  s.contract.vocab_segments = 4;
  s.lens = {1, 17, 5, 33, 16, 9, 40};
  return s;
}

// Wide enough that every GEMM has M, N, K >= 256 (the wgmma paths), head_dim 128, sequences past
// several 64-key blocks.
Setup wide() {
  Setup s;
  s.name = "wide";
  Qwen3Config& c = s.cfg;
  c.vocab_size = 4000;
  c.hidden_size = 512;
  c.intermediate_size = 1408;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = true;
  s.contract.gemm_segments = 4;
  s.contract.kv_chunk = 128;
  s.contract.vocab_tile = 64;
  s.contract.vocab_segments = 8;
  s.lens = {300, 1, 129, 64, 511, 17, 200};
  return s;
}

struct StepData {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> g_lp, g_ent;
};

StepData make_step(const Setup& s, uint64_t seed) {
  std::mt19937_64 g(seed);
  StepData d;
  std::uniform_int_distribution<int32_t> id(0, int32_t(s.cfg.vocab_size - 1));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int n : s.lens) {
    std::vector<int32_t> q(static_cast<size_t>(n));
    for (auto& x : q) x = id(g);
    d.seqs.push_back(q);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (auto& x : a) x = nd(g);
    for (auto& x : b) x = nd(g);
    d.g_lp.push_back(a);
    d.g_ent.push_back(b);
  }
  return d;
}

// Host copies of every gradient (HF order).
using HostGrads = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

// One step on `device` ("cpu" or "cuda") at TP `tp`: micro-batches = runs of the step's sequence
// indices, each packed in the order given.
HostGrads run_step(const Setup& s, const Weights& weights, const StepData& d, bool cuda, int tp,
                   const std::vector<std::vector<int64_t>>& micro_batches) {
  std::map<std::string, TensorView> views;
  for (auto& [n, t] : weights) views[n] = t.view();
  ModelOptions opt;
  opt.contract = s.contract;
  opt.tp = tp;
  Model model(s.cfg, views, opt, cuda ? make_cuda_invariant_backend() : make_invariant_backend());
  const OpsBackend& ops = model.ops();
  Backprop bp(s.cfg, views, opt, ops);
  Gradients grads(s.cfg, ops);
  for (const auto& mb : micro_batches) {
    std::vector<int32_t> tokens, cu = {0};
    std::vector<int64_t> targets;
    std::vector<float> g_lp, g_ent;
    for (int64_t i : mb) {
      const auto& q = d.seqs[size_t(i)];
      for (size_t p = 0; p < q.size(); ++p) {
        tokens.push_back(q[p]);
        targets.push_back(p + 1 < q.size() ? q[p + 1] : -1);
        g_lp.push_back(d.g_lp[size_t(i)][p]);
        g_ent.push_back(d.g_ent[size_t(i)][p]);
      }
      cu.push_back(int32_t(tokens.size()));
    }
    const int64_t T = int64_t(tokens.size());
    const TensorView tv = TensorView::contiguous(tokens.data(), DType::kI32, {T});
    const TensorView cv = TensorView::contiguous(cu.data(), DType::kI32, {int64_t(cu.size())});
    const SavedForward f = bp.forward(model, tv, cv);
    Tensor logp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
    const TensorView tg = TensorView::contiguous(targets.data(), DType::kI64, {T});
    model.logprob(f.hidden.view(), tg, 1.0f, logp.view(), lse.view(), ent.view());
    const TensorView glp = TensorView::contiguous(g_lp.data(), DType::kF32, {T});
    const TensorView gent = TensorView::contiguous(g_ent.data(), DType::kF32, {T});
    bp.backward(f, tg, LogprobParams{}, lse.view(), ent.view(), glp, &gent, mb, grads);
  }
  grads.finish();
  ops.synchronize();
  HostGrads out;
  for (const auto& [name, t] : grads.all()) {
    std::vector<uint8_t> h(size_t(t.nbytes()));
    Tensor ht(DType::kF32, t.shape());
    ops.copy(ht.view(), t.view());
    ops.synchronize();
    std::memcpy(h.data(), ht.data(), h.size());
    out.emplace_back(name, std::move(h));
  }
  return out;
}

void compare(const HostGrads& got, const HostGrads& want, const std::string& what) {
  if (got.size() != want.size()) {
    report(false, what + ": parameter count differs");
    return;
  }
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& a = got[i].second;
    const auto& b = want[i].second;
    if (a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0) continue;
    ++bad;
    const size_t n = std::min(a.size(), b.size()) / 4;
    size_t e = 0;
    while (e < n && std::memcmp(a.data() + 4 * e, b.data() + 4 * e, 4) == 0) ++e;
    uint32_t x = 0, y = 0;
    if (e < n) {
      std::memcpy(&x, a.data() + 4 * e, 4);
      std::memcpy(&y, b.data() + 4 * e, 4);
    }
    std::printf("  %s: %s differs first at element %zu: 0x%08x vs 0x%08x\n", what.c_str(),
                got[i].first.c_str(), e, x, y);
  }
  report(bad == 0, what + " (" + std::to_string(got.size()) + " parameters, " +
                       std::to_string(bad) + " differ)");
}

void run_setup(const Setup& s, uint64_t seed) {
  const Weights weights = random_qwen3_weights(s.cfg, seed);
  const StepData d = make_step(s, seed + 1);
  const size_t n = d.seqs.size();
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  const HostGrads ref = run_step(s, weights, d, false, 1, {all});
  compare(run_step(s, weights, d, true, 1, {all}), ref, s.name + ": cuda == cpu, one micro-batch");
  compare(run_step(s, weights, d, true, 1, {all}), ref, s.name + ": cuda rerun");
  // Micro-batch splits (consecutive runs of the canonical order), shuffled packing inside each.
  std::vector<std::vector<int64_t>> split = {{2, 0, 1}, {3}, {6, 4, 5}};
  compare(run_step(s, weights, d, true, 1, split), ref,
          s.name + ": cuda, 3 micro-batches packed shuffled");
  std::vector<std::vector<int64_t>> singles;
  for (int64_t i = 0; i < int64_t(n); ++i) singles.push_back({i});
  compare(run_step(s, weights, d, true, 1, singles), ref,
          s.name + ": cuda, one sequence per micro-batch");
  for (int tp : {2, 4})
    compare(run_step(s, weights, d, true, tp, split), ref,
            s.name + ": cuda, simulated TP " + std::to_string(tp));
}

// Group-shared prompts (§B.11): prompts not multiples of 16 (or 64) tokens, completions across
// 64-key blocks; the CUDA step equals the CPU one in every gradient and every completion token's
// log-prob / lse / entropy, across micro-batch splits at group boundaries, packing and TP.
void run_shared_setup(const Setup& s, uint64_t seed,
                      const std::vector<std::pair<int, std::vector<int>>>& shape) {
  using test_shared::run_shared_step;
  using test_shared::StepOut;
  const Weights weights = random_qwen3_weights(s.cfg, seed);
  std::map<std::string, TensorView> views;
  for (auto& [n, t] : weights) views[n] = t.view();
  ModelOptions opt;
  opt.contract = s.contract;
  std::mt19937_64 g(seed + 1);
  const test_shared::GroupStep st = test_shared::make_group_step(s.cfg, shape, g);
  auto host = [](const StepOut& o) {
    HostGrads out;
    for (const auto& [name, t] : o.grads.all()) {
      const auto* p = static_cast<const uint8_t*>(t.data());
      out.emplace_back(name, std::vector<uint8_t>(p, p + t.nbytes()));
    }
    return out;
  };
  auto same_tokens = [](const StepOut& a, const StepOut& b) {
    bool ok = true;
    for (auto m : {&StepOut::logp, &StepOut::lse, &StepOut::ent})
      for (size_t k = 0; k < (a.*m).size(); ++k)
        for (size_t c = 0; c < (a.*m)[k].size(); ++c) {
          const auto &x = (a.*m)[k][c], &y = (b.*m)[k][c];
          ok &= x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
        }
    return ok;
  };
  const std::vector<std::vector<size_t>> all = {{0, 1, 2}};
  const StepOut ref = run_shared_step(s.cfg, views, opt, st, all);
  const HostGrads want = host(ref);
  const StepOut got = run_shared_step(s.cfg, views, opt, st, all, make_cuda_invariant_backend());
  report(same_tokens(got, ref), s.name + " shared: completion logp / lse / entropy cuda == cpu");
  compare(host(got), want, s.name + " shared: cuda == cpu, one micro-batch");
  compare(host(run_shared_step(s.cfg, views, opt, st, all, make_cuda_invariant_backend())), want,
          s.name + " shared: cuda rerun");
  compare(
      host(run_shared_step(s.cfg, views, opt, st, {{1, 0}, {2}}, make_cuda_invariant_backend())),
      want, s.name + " shared: cuda, groups packed 1, 0 | 2");
  ModelOptions tp2 = opt;
  tp2.tp = 2;
  compare(host(run_shared_step(s.cfg, views, tp2, st, all, make_cuda_invariant_backend())), want,
          s.name + " shared: cuda, simulated TP 2");
}

}  // namespace
}  // namespace lockstep::engine

int main(int argc, char** argv) {
  namespace gt = lockstep::gpu_test;
  using namespace lockstep::engine;
  if (!gt::start("test_train_cuda", argc, argv)) return 2;
  gt::section("tiny", [] { run_setup(tiny(false), 11); });
  gt::section("tiny tied", [] { run_setup(tiny(true), 12); });
  if (!gt::g_quick) gt::section("wide", [] { run_setup(wide(), 13); });
  gt::section("tiny shared", [] {
    run_shared_setup(tiny(true), 14, {{37, {9, 23, 4}}, {70, {20, 1}}, {3, {1, 30, 6, 2}}});
  });
  if (!gt::g_quick)
    gt::section("wide shared", [] {
      run_shared_setup(wide(), 15, {{130, {65, 1, 200}}, {64, {70}}, {300, {17, 129, 2}}});
    });
  return gt::finish("test_train_cuda");
}
