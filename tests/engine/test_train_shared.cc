// Group-shared prompts in training (engine/train.h, docs/contract.md §B.11): the completion
// tokens' log-probs (and lse, entropy) of the shared forward are bitwise those of the unshared
// one; the shared gradients are bitwise identical across reruns, micro-batch splits at group
// boundaries, packing orders of the groups, simulated TP and thread counts; with one completion per
// group and prompts of multiples of 16 tokens every gradient but the lm_head's is the unshared one
// bit for bit; against the unshared gradients they differ by roundings only (the fp64-oracle
// comparison is in test_train_oracle); bad inputs are refused with clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/thread_pool.h"
#include "engine/backend.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/train.h"
#include "lockstep/error.h"
#include "util/shared_train_util.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

using test_shared::GroupStep;
using test_shared::run_shared_step;
using test_shared::run_unshared_step;
using test_shared::StepOut;

struct Fixture {
  Qwen3Config cfg;
  Weights weights;
  std::map<std::string, TensorView> views;
  ModelOptions opt;
};

Fixture make_setup(bool tied) {
  Fixture s;
  s.cfg.vocab_size = 320;
  s.cfg.hidden_size = 64;
  s.cfg.intermediate_size = 128;
  s.cfg.num_hidden_layers = 2;
  s.cfg.num_attention_heads = 8;
  s.cfg.num_key_value_heads = 4;
  s.cfg.head_dim = 16;
  s.cfg.rope_theta = 1e6;
  s.cfg.max_position_embeddings = 512;
  s.cfg.tie_word_embeddings = tied;
  s.weights = random_qwen3_weights(s.cfg, 21);
  for (auto& [n, t] : s.weights) s.views[n] = t.view();
  s.opt.contract.gemm_segments = 4;
  s.opt.contract.kv_chunk = 64;
  s.opt.contract.vocab_tile = 32;
  s.opt.contract.vocab_segments = 4;
  return s;
}

// Three groups: prompts of 37, 70 and 3 tokens (not multiples of 16; 70 crosses a 64-key block).
GroupStep make_step(const Qwen3Config& cfg, uint64_t salt) {
  auto g = test::rng(salt);
  return test_shared::make_group_step(cfg, {{37, {9, 23, 4}}, {70, {20, 1}}, {3, {1, 30, 6, 2}}},
                                      g);
}

::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  return test::bitwise_equal(a.data(), b.data(), int64_t(a.size()), DType::kF32);
}

void expect_same(const Gradients& a, const Gradients& b, const std::string& what,
                 const std::string& skip = "") {
  ASSERT_EQ(a.all().size(), b.all().size());
  for (size_t i = 0; i < a.all().size(); ++i) {
    const auto& [name, ta] = a.all()[i];
    if (name == skip) continue;
    const Tensor& tb = b.all()[i].second;
    EXPECT_TRUE(test::bitwise_equal(ta.data(), tb.data(), ta.numel(), DType::kF32))
        << what << ": " << name;
  }
}

TEST(TrainShared, CompletionLogprobsAreTheUnsharedBits) {
  for (bool tied : {true, false}) {
    const Fixture s = make_setup(tied);
    const GroupStep st = make_step(s.cfg, 1);
    const StepOut sh = run_shared_step(s.cfg, s.views, s.opt, st, {{0, 1, 2}});
    const StepOut un = run_unshared_step(s.cfg, s.views, s.opt, st, {{0, 1, 2}});
    int64_t n = 0;
    for (size_t k = 0; k < st.groups.size(); ++k) {
      for (size_t c = 0; c < st.groups[k].completions.size(); ++c) {
        SCOPED_TRACE("group " + std::to_string(k) + " completion " + std::to_string(c));
        EXPECT_TRUE(same_bits(sh.logp[k][c], un.logp[k][c])) << "logp";
        EXPECT_TRUE(same_bits(sh.lse[k][c], un.lse[k][c])) << "lse";
        EXPECT_TRUE(same_bits(sh.ent[k][c], un.ent[k][c])) << "entropy";
        n += int64_t(sh.logp[k][c].size());
      }
    }
    EXPECT_EQ(n, 9 + 23 + 4 + 20 + 1 + 1 + 30 + 6 + 2);
    // The shared form forwards each prompt once: 37·2 + 70 + 3·3 fewer rows.
    EXPECT_EQ(un.rows - sh.rows, 37 * 2 + 70 + 3 * 3);
  }
}

TEST(TrainShared, GradientsAreDeterministicAcrossMicroBatchesPackingAndThreads) {
  const Fixture s = make_setup(true);
  const GroupStep st = make_step(s.cfg, 2);
  const StepOut ref = run_shared_step(s.cfg, s.views, s.opt, st, {{0, 1, 2}});
  for (const auto& [name, t] : ref.grads.all()) {
    double sum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) sum += std::fabs(t.ptr<float>()[i]);
    EXPECT_TRUE(std::isfinite(sum) && sum > 0) << name;
  }
  expect_same(ref.grads, run_shared_step(s.cfg, s.views, s.opt, st, {{0, 1, 2}}).grads, "rerun");
  expect_same(ref.grads, run_shared_step(s.cfg, s.views, s.opt, st, {{0}, {1}, {2}}).grads,
              "one group per micro-batch");
  expect_same(ref.grads, run_shared_step(s.cfg, s.views, s.opt, st, {{0, 1}, {2}}).grads,
              "split 2/1");
  expect_same(ref.grads, run_shared_step(s.cfg, s.views, s.opt, st, {{2, 0, 1}}).grads,
              "groups packed 2, 0, 1");
  expect_same(ref.grads, run_shared_step(s.cfg, s.views, s.opt, st, {{1, 0}, {2}}).grads,
              "groups packed 1, 0 | 2");
  for (int tp : {2, 4}) {
    Fixture t = make_setup(true);
    t.opt.tp = tp;
    expect_same(ref.grads, run_shared_step(t.cfg, t.views, t.opt, st, {{0, 1, 2}}).grads,
                "tp=" + std::to_string(tp));
  }
  const int saved = num_threads();
  set_num_threads(1);
  const StepOut one = run_shared_step(s.cfg, s.views, s.opt, st, {{0}, {2, 1}});
  set_num_threads(saved);
  expect_same(ref.grads, one.grads, "1 thread");
}

TEST(TrainShared, OneCompletionPerGroupIsTheUnsharedFormButTheLmHead) {
  const Fixture s = make_setup(false);
  auto g = test::rng(3);
  const GroupStep st = test_shared::make_group_step(s.cfg, {{16, {9}}, {32, {40}}, {64, {3}}}, g);
  const StepOut sh = run_shared_step(s.cfg, s.views, s.opt, st, {{0, 1}, {2}});
  const StepOut un = run_unshared_step(s.cfg, s.views, s.opt, st, {{0, 1}, {2}});
  // The head's chain runs over the head rows (from the prompt's last row), not the packed rows.
  expect_same(sh.grads, un.grads, "one completion, prompts of 16k tokens", "lm_head.weight");
}

// Shared and unshared gradients: the same sum rounded differently. Per tensor, the relative L2
// difference is of the order of the bf16 roundings (the shared prompt rows' gradients are rounded
// once instead of G times), far from O(1); test_train_oracle compares both with fp64.
TEST(TrainShared, GradientsDifferFromTheUnsharedOnesByRoundingsOnly) {
  const Fixture s = make_setup(true);
  const GroupStep st = make_step(s.cfg, 4);
  const StepOut sh = run_shared_step(s.cfg, s.views, s.opt, st, {{0, 1, 2}});
  const StepOut un = run_unshared_step(s.cfg, s.views, s.opt, st, {{0, 1, 2}});
  double worst = 0;
  int differ = 0;
  for (size_t i = 0; i < sh.grads.all().size(); ++i) {
    const Tensor& a = sh.grads.all()[i].second;
    const Tensor& b = un.grads.all()[i].second;
    double num = 0, den = 0;
    for (int64_t j = 0; j < a.numel(); ++j) {
      const double d = double(a.ptr<float>()[j]) - double(b.ptr<float>()[j]);
      num += d * d;
      den += double(b.ptr<float>()[j]) * double(b.ptr<float>()[j]);
    }
    const double rel = std::sqrt(num / den);
    differ += num > 0;
    EXPECT_LT(rel, 0.05) << sh.grads.all()[i].first;
    worst = std::max(worst, rel);
  }
  std::printf("[train shared] shared vs unshared: worst relative L2 difference %.3g\n", worst);
  EXPECT_GT(differ, 0) << "G > 1: the prompt rows' sums round differently";
}

const auto expect_error = test::expect_error_mentioning;

TEST(TrainShared, BadInputsAreRefused) {
  const Fixture s = make_setup(false);
  const GroupStep st = make_step(s.cfg, 5);
  // Micro-batches must come in the step's order (whole groups).
  expect_error(
      [&] {
        run_shared_step(s.cfg, s.views, s.opt, st, {{1}, {0, 2}});
      },
      "out of canonical order");
  std::vector<PromptGroup> bad = st.groups;
  bad[1].completions[0].clear();
  const std::vector<size_t> all = {0, 1, 2};
  expect_error([&] { pack_prompt_groups(bad, all); }, "group 1 completion 0: no token");
  bad = st.groups;
  bad[2].prompt.clear();
  expect_error([&] { pack_prompt_groups(bad, all); }, "group 2: empty prompt");
  const std::vector<size_t> nine = {9};
  expect_error([&] { pack_prompt_groups(st.groups, nine); }, "member 9");

  Model model(s.cfg, s.views, s.opt, make_invariant_backend());
  Backprop bp(s.cfg, s.views, s.opt);
  SharedPack pk = pack_prompt_groups(st.groups, all);
  const int64_t T = int64_t(pk.tokens.size());
  const TensorView tv = TensorView::contiguous(pk.tokens.data(), DType::kI32, {T});
  const TensorView cv = TensorView::contiguous(pk.cu.data(), DType::kI32, {int64_t(pk.cu.size())});
  std::vector<int32_t> po = pk.prompt_of;
  po[2] = 1;  // a completion of a completion
  expect_error(
      [&] {
        bp.forward_shared(model, tv, cv,
                          TensorView::contiguous(po.data(), DType::kI32, {int64_t(po.size())}));
      },
      "names a completion");
  const TensorView pv =
      TensorView::contiguous(pk.prompt_of.data(), DType::kI32, {int64_t(pk.prompt_of.size())});
  const SavedForward f = bp.forward_shared(model, tv, cv, pv);
  HeadRows head = pk.head;
  head.rows[3] = T + 5;
  expect_error([&] { bp.head_hidden(f, head); }, "outside [0, T");
  const int64_t Th = int64_t(pk.targets.size());
  std::vector<float> zeros(size_t(std::max(T, Th)), 0.0f);
  const TensorView z = TensorView::contiguous(zeros.data(), DType::kF32, {Th});
  const TensorView tg = TensorView::contiguous(pk.targets.data(), DType::kI64, {Th});
  Gradients grads(s.cfg);
  expect_error(
      [&] { bp.backward(f, tg, LogprobParams{}, z, z, z, nullptr, pk.step_indices, grads); },
      "takes backward_shared");
  const SavedForward fu = bp.forward(model, tv, cv);
  expect_error(
      [&] {
        bp.backward_shared(fu, pk.head, tg, LogprobParams{}, z, z, z, nullptr, pk.step_indices,
                           grads);
      },
      "needs a shared-prompt forward");
  // A position past the model's context.
  Fixture short_ctx = make_setup(false);
  short_ctx.cfg.max_position_embeddings = 80;
  Model m80(short_ctx.cfg, short_ctx.views, short_ctx.opt, make_invariant_backend());
  Tensor hidden(DType::kBF16, {T, s.cfg.hidden_size});
  expect_error([&] { m80.forward_packed_shared(tv, cv, pv, hidden.view()); }, "max positions");
}

}  // namespace
}  // namespace lockstep::engine
