// The Qwen3 backward (engine/train.h, docs/contract.md §B.10): every parameter's fp32 gradient is
// bitwise identical across micro-batch splits of a step, shuffled packing inside a micro-batch,
// simulated TP 1/2/4 and thread counts, and across reruns; micro-batches out of canonical order
// are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/thread_pool.h"
#include "engine/backend.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/train.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

Qwen3Config small_config(bool tied) {
  Qwen3Config c;
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
  return c;
}

ContractConfig contract() {
  ContractConfig k;
  k.gemm_segments = 4;
  k.kv_chunk = 64;
  k.vocab_tile = 32;
  k.vocab_segments = 4;
  return k;
}

// One training step's data: sequences (token ids), per-token upstream gradients.
struct StepData {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> g_lp, g_ent;
};

StepData make_step(const Qwen3Config& cfg, std::mt19937_64& g) {
  StepData d;
  const std::vector<int> lens = {1, 17, 5, 33, 16, 9, 40};
  std::uniform_int_distribution<int32_t> id(0, int32_t(cfg.vocab_size - 1));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int n : lens) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& x : s) x = id(g);
    d.seqs.push_back(s);
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (auto& x : a) x = nd(g);
    for (auto& x : b) x = nd(g);
    d.g_lp.push_back(a);
    d.g_ent.push_back(b);
  }
  return d;
}

struct TrainSetup {
  Qwen3Config cfg;
  Weights weights;
  std::map<std::string, TensorView> views;
  ModelOptions opt;
};

TrainSetup make_setup(bool tied, int tp) {
  TrainSetup s;
  s.cfg = small_config(tied);
  s.weights = random_qwen3_weights(s.cfg, 11);
  for (auto& [n, t] : s.weights) s.views[n] = t.view();
  s.opt.contract = contract();
  s.opt.tp = tp;
  return s;
}

// Runs one step: micro-batches = runs of the step's sequence indices, each packed in the order
// given (a permutation of the run). Returns the finished gradients.
Gradients run_step(const TrainSetup& s, const StepData& d,
                   const std::vector<std::vector<int64_t>>& micro_batches) {
  Model model(s.cfg, s.views, s.opt, make_invariant_backend());
  Backprop bp(s.cfg, s.views, s.opt);
  Gradients grads(s.cfg);
  for (const auto& mb : micro_batches) {
    std::vector<int32_t> tokens, cu = {0};
    std::vector<int64_t> targets;
    std::vector<float> g_lp, g_ent;
    for (int64_t i : mb) {
      const auto& q = d.seqs[size_t(i)];
      for (size_t p = 0; p < q.size(); ++p) {
        tokens.push_back(q[p]);
        targets.push_back(p + 1 < q.size() ? q[p + 1] : -1);  // next token; the last: none
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
    LogprobParams params;
    bp.backward(f, tg, params, lse.view(), ent.view(), glp, &gent, mb, grads);
  }
  grads.finish();
  return grads;
}

void expect_same(const Gradients& a, const Gradients& b, const std::string& what) {
  ASSERT_EQ(a.all().size(), b.all().size());
  for (size_t i = 0; i < a.all().size(); ++i) {
    const auto& [name, ta] = a.all()[i];
    const Tensor& tb = b.all()[i].second;
    EXPECT_TRUE(test::bitwise_equal(ta.data(), tb.data(), ta.numel(), DType::kF32))
        << what << ": " << name;
  }
}

std::vector<std::vector<int64_t>> one_micro_batch(size_t n) {
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  return {all};
}

TEST(Train, GradientsAreFiniteAndNonzero) {
  for (bool tied : {true, false}) {
    const TrainSetup s = make_setup(tied, 1);
    auto g = test::rng(1);
    const StepData d = make_step(s.cfg, g);
    const Gradients grads = run_step(s, d, one_micro_batch(d.seqs.size()));
    for (const auto& [name, t] : grads.all()) {
      double sum = 0;
      bool finite = true;
      for (int64_t i = 0; i < t.numel(); ++i) {
        finite = finite && std::isfinite(t.ptr<float>()[i]);
        sum += std::fabs(t.ptr<float>()[i]);
      }
      EXPECT_TRUE(finite) << name;
      EXPECT_GT(sum, 0.0) << name << " (tied=" << tied << ")";
    }
  }
}

TEST(Train, MicroBatchSplitsPackingTpAndThreadsGiveTheSameBits) {
  auto g = test::rng(2);
  const TrainSetup s1 = make_setup(true, 1);
  const StepData d = make_step(s1.cfg, g);
  const size_t n = d.seqs.size();
  const Gradients ref = run_step(s1, d, one_micro_batch(n));
  // Rerun: the same bits.
  expect_same(ref, run_step(s1, d, one_micro_batch(n)), "rerun");
  // Micro-batch sizes: consecutive runs of the step's order.
  expect_same(ref, run_step(s1, d, {{0, 1, 2}, {3}, {4, 5, 6}}), "split 3/1/3");
  std::vector<std::vector<int64_t>> singles;
  for (size_t i = 0; i < n; ++i) singles.push_back({int64_t(i)});
  expect_same(ref, run_step(s1, d, singles), "one sequence per micro-batch");
  // Shuffled packing inside the micro-batches.
  expect_same(ref, run_step(s1, d, {{2, 0, 1}, {6, 3, 5, 4}}), "shuffled packing");
  // Simulated TP.
  for (int tp : {2, 4}) {
    const TrainSetup st = make_setup(true, tp);
    expect_same(ref, run_step(st, d, one_micro_batch(n)), "tp=" + std::to_string(tp));
  }
  // Threads.
  set_num_threads(1);
  const Gradients one_thread = run_step(s1, d, {{0, 1, 2}, {3, 4, 5, 6}});
  set_num_threads(3);
  expect_same(ref, one_thread, "1 thread");
  expect_same(ref, run_step(s1, d, {{1, 0}, {2, 3, 4, 5, 6}}), "3 threads");
  set_num_threads(2);
}

TEST(Train, MicroBatchesOutOfOrderAreRefused) {
  const TrainSetup s = make_setup(false, 1);
  auto g = test::rng(3);
  const StepData d = make_step(s.cfg, g);
  try {
    run_step(s, d, {{3, 4}, {0, 1}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of canonical order"), std::string::npos) << e.what();
  }
}

TEST(Train, RefusesModelsItCannotDifferentiate) {
  TrainSetup s = make_setup(false, 1);
  s.cfg.num_key_value_heads = 2;  // Hkv < gemm_segments: kv heads replicated across shards
  s.weights = random_qwen3_weights(s.cfg, 1);
  s.views.clear();
  for (auto& [n, t] : s.weights) s.views[n] = t.view();
  EXPECT_THROW(Backprop(s.cfg, s.views, s.opt), Error);
}

TEST(Train, RefusesWeightsOfTheWrongDtypeOrShape) {
  const TrainSetup s = make_setup(false, 1);
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  const TensorView& up = s.views.at(name);
  Tensor f32(DType::kF32, std::vector<int64_t>(up.shape, up.shape + up.ndim));
  std::map<std::string, TensorView> views = s.views;
  views[name] = f32.view();
  test::expect_error_mentioning([&] { Backprop(s.cfg, views, s.opt); },
                                "weight '" + name + "' must be a bf16 view");
  views[name] = s.views.at(name).rows(0, 1);
  test::expect_error_mentioning([&] { Backprop(s.cfg, views, s.opt); },
                                "weight '" + name + "' has shape");
  views.erase(name);
  test::expect_error_mentioning([&] { Backprop(s.cfg, views, s.opt); },
                                "missing weight '" + name + "'");
}

}  // namespace
}  // namespace lockstep::engine
