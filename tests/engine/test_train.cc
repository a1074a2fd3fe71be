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
#include "dist/process_transport.h"
#include "dist/thread_transport.h"
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

// Runs one step on (model, bp, grads): micro-batches = runs of the step's sequence indices, each
// packed in the order given (a permutation of the run); then finishes the gradients.
void step_batches(const StepData& d, const std::vector<std::vector<int64_t>>& micro_batches,
                  Model& model, const Backprop& bp, Gradients& grads) {
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
}

// One step with a simulated-TP model and backward (s.opt.tp). Returns the finished gradients.
Gradients run_step(const TrainSetup& s, const StepData& d,
                   const std::vector<std::vector<int64_t>>& micro_batches) {
  Model model(s.cfg, s.views, s.opt, make_invariant_backend());
  Backprop bp(s.cfg, s.views, s.opt);
  Gradients grads(s.cfg);
  step_batches(d, micro_batches, model, bp, grads);
  return grads;
}

// The same step on rank comm.rank() of a rank-local job of s.opt.tp ranks (model, backward and
// gradients rank-local): its own gradient blocks and every rank's, gathered.
struct RankStep {
  Weights blocks, gathered;
  int64_t weight_bytes = 0, grad_bytes = 0;
};
RankStep run_rank_step(const TrainSetup& s, const StepData& d,
                       const std::vector<std::vector<int64_t>>& micro_batches,
                       dist::Communicator& comm) {
  std::shared_ptr<OpsBackend> ops = make_invariant_backend();
  Model model(s.cfg, s.views, s.opt, ops, &comm);
  Backprop bp(s.cfg, s.views, s.opt, *ops, comm);
  Gradients grads(s.cfg, s.opt, comm);
  EXPECT_EQ(bp.rank(), comm.rank());
  EXPECT_EQ(grads.rank(), comm.rank());
  step_batches(d, micro_batches, model, bp, grads);
  RankStep r;
  for (const auto& [name, t] : grads.all()) {
    Tensor c(t.dtype(), t.shape());
    std::memcpy(c.data(), t.data(), size_t(t.nbytes()));
    r.blocks.emplace_back(name, std::move(c));
    r.grad_bytes += t.nbytes();
  }
  r.gathered = grads.gather();
  r.weight_bytes = bp.weight_bytes();
  return r;
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

// --- rank-local training (issue 15, docs/dist.md): one model, backward and gradients per rank ---

// Whether `got` (a rank's block) has the bits of `ref`'s block b (whole gradients).
::testing::AssertionResult same_block(const Tensor& ref, const WeightBlock& b, const Tensor& got) {
  const int64_t R = ref.shape()[0], C = ref.shape().size() == 2 ? ref.shape()[1] : 1;
  const int64_t r0 = b.r0, r1 = b.r1 < 0 ? R : b.r1, c0 = b.c0, c1 = b.c1 < 0 ? C : b.c1;
  if (got.numel() != (r1 - r0) * (c1 - c0))
    return ::testing::AssertionFailure() << "block size " << got.numel();
  for (int64_t r = r0; r < r1; ++r)
    if (std::memcmp(ref.ptr<float>() + r * C + c0, got.ptr<float>() + (r - r0) * (c1 - c0),
                    size_t(c1 - c0) * sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "row " << r << " differs";
  return ::testing::AssertionSuccess();
}

// Every rank's gradient blocks, and the gradients gathered on every rank, have the bits of the
// simulated step (tp = 1 and the simulated tp): tied and untied heads, tp 1, 2, 4, micro-batch
// splits with shuffled packing; over the ranks every weight byte is held once, but the norms.
TEST(TrainRanks, RankLocalGradientsEqualTheSimulatedStep) {
  auto g = test::rng(5);
  for (bool tied : {true, false}) {
    const TrainSetup s1 = make_setup(tied, 1);
    const StepData d = make_step(s1.cfg, g);
    const Gradients ref = run_step(s1, d, one_micro_batch(d.seqs.size()));
    const std::vector<std::vector<int64_t>> mbs = {{2, 0, 1}, {3}, {6, 4, 5}};
    int64_t whole_bytes = 0, norm_bytes = 0;
    for (const auto& [name, t] : ref.all()) {
      whole_bytes += t.nbytes();
      if (t.shape().size() == 1) norm_bytes += t.nbytes();
    }
    for (int tp : {1, 2, 4}) {
      SCOPED_TRACE("tied " + std::to_string(tied) + " tp " + std::to_string(tp));
      const TrainSetup st = make_setup(tied, tp);
      std::vector<RankStep> got(static_cast<size_t>(tp));
      dist::run_ranks(tp, [&](dist::Communicator& comm) {
        got[size_t(comm.rank())] = run_rank_step(st, d, mbs, comm);
      });
      int64_t grad_bytes = 0;
      for (int r = 0; r < tp; ++r) {
        const RankStep& rs = got[size_t(r)];
        grad_bytes += rs.grad_bytes;
        ASSERT_EQ(rs.gathered.size(), ref.all().size());
        for (size_t i = 0; i < ref.all().size(); ++i) {
          const auto& [name, t] = ref.all()[i];
          EXPECT_EQ(rs.gathered[i].first, name);
          EXPECT_TRUE(
              test::bitwise_equal(t.data(), rs.gathered[i].second.data(), t.numel(), DType::kF32))
              << "rank " << r << " gathered " << name;
          EXPECT_TRUE(same_block(t, gradient_block(st.cfg, st.opt, r, name), rs.blocks[i].second))
              << "rank " << r << " block of " << name;
        }
      }
      EXPECT_EQ(grad_bytes, whole_bytes + (tp - 1) * norm_bytes);
    }
  }
}

// The same on the process transport (one rank per process): each rank checks its blocks and the
// gathered gradients against the reference computed before the ranks fork, and throws on a
// difference (which fails the job with the rank's message).
TEST(TrainRanks, RankLocalGradientsOnProcesses) {
  auto g = test::rng(6);
  const TrainSetup s1 = make_setup(true, 1);
  const StepData d = make_step(s1.cfg, g);
  const Gradients ref = run_step(s1, d, one_micro_batch(d.seqs.size()));
  for (int tp : {2, 4}) {
    const TrainSetup st = make_setup(true, tp);
    dist::run_rank_processes(tp, [&](dist::Communicator& comm) {
      const RankStep rs = run_rank_step(st, d, {{0, 1, 2, 3}, {5, 4, 6}}, comm);
      for (size_t i = 0; i < ref.all().size(); ++i) {
        const auto& [name, t] = ref.all()[i];
        if (!test::bitwise_equal(t.data(), rs.gathered[i].second.data(), t.numel(), DType::kF32))
          throw Error("rank " + std::to_string(comm.rank()) + ": gathered " + name + " differs");
        if (!same_block(t, gradient_block(st.cfg, st.opt, comm.rank(), name), rs.blocks[i].second))
          throw Error("rank " + std::to_string(comm.rank()) + ": block of " + name + " differs");
      }
    });
  }
}

// A rank-local backward holds the blocks it reads only: over the ranks every weight it uses is
// held once (q|k|v and gate|up as the rank's shards, o_proj / down_proj columns, the head's rows),
// the norms on every rank, the embedding table nowhere (its backward does not read it).
TEST(TrainRanks, EachRankHoldsOnlyItsWeightBlocks) {
  for (int tp : {2, 4}) {
    const TrainSetup st = make_setup(false, tp);
    int64_t expected = 0;
    for (const WeightSpec& w : qwen3_weight_specs(st.cfg)) {
      if (w.name == "model.embed_tokens.weight") continue;
      int64_t n = 2;  // bf16
      for (int64_t d : w.shape) n *= d;
      expected += w.shape.size() == 1 ? tp * n : n;
    }
    std::vector<int64_t> bytes(static_cast<size_t>(tp));
    dist::run_ranks(tp, [&](dist::Communicator& comm) {
      auto ops = make_invariant_backend();
      bytes[size_t(comm.rank())] = Backprop(st.cfg, st.views, st.opt, *ops, comm).weight_bytes();
    });
    int64_t sum = 0;
    for (int64_t b : bytes) sum += b;
    EXPECT_EQ(sum, expected) << "tp " << tp;
  }
}

TEST(TrainRanks, MismatchedJobsAndGradientsAreRefused) {
  const TrainSetup st = make_setup(false, 2);
  const TrainSetup s1 = make_setup(false, 1);
  auto g = test::rng(7);
  const StepData d = make_step(st.cfg, g);
  dist::run_ranks(4, [&](dist::Communicator& comm) {
    auto ops = make_invariant_backend();
    test::expect_error_mentioning([&] { Backprop(st.cfg, st.views, st.opt, *ops, comm); },
                                  "the communicator has 4 ranks, options.tp is 2");
    test::expect_error_mentioning([&] { Gradients(st.cfg, st.opt, comm); },
                                  "the communicator has 4 ranks, options.tp is 2");
  });
  dist::run_ranks(2, [&](dist::Communicator& comm) {
    std::shared_ptr<OpsBackend> ops = make_invariant_backend();
    Model model(st.cfg, st.views, st.opt, ops, &comm);
    Backprop bp(st.cfg, st.views, st.opt, *ops, comm);
    Gradients whole(st.cfg);
    test::expect_error_mentioning(
        [&] {
          step_batches(d, {{0, 1}}, model, bp, whole);
        },
        "the gradients are whole, this backward is rank");
  });
  Model model(s1.cfg, s1.views, s1.opt, make_invariant_backend());
  Backprop bp(s1.cfg, s1.views, s1.opt);
  dist::run_ranks(1, [&](dist::Communicator& comm) {
    Gradients ranked(s1.cfg, s1.opt, comm);
    test::expect_error_mentioning(
        [&] {
          step_batches(d, {{0, 1}}, model, bp, ranked);
        },
        "this backward is simulated TP");
  });
  test::expect_error_mentioning([&] { gradient_block(st.cfg, st.opt, 2, "lm_head.weight"); },
                                "rank 2 is outside [0, tp = 2)");
  test::expect_error_mentioning([&] { gradient_block(st.cfg, st.opt, 0, "nope"); },
                                "no parameter named 'nope'");
}

}  // namespace
}  // namespace lockstep::engine
