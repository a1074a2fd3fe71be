// The GRPO loop (engine/grpo.h): zero rollout-vs-trainer log-prob mismatches and PPO ratios of
// exactly 1 on every step's first mini-batch; two runs give identical weights; micro-batch size
// and simulated training TP 1 vs 2 give identical final weights; the baseline kernels show
// mismatches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/thread_pool.h"
#include "engine/default_model.h"
#include "engine/grpo.h"
#include "engine/profiled_backend.h"
#include "engine/safetensors.h"
#include "engine/sha256.h"
#include "lockstep/error.h"
#include "util/grpo_test_util.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

Qwen3Config small_config() { return test::grpo_test_model(); }
GrpoConfig small_run() { return test::grpo_test_run(); }

struct GrpoRun {
  std::vector<GrpoStepMetrics> steps;
  std::string final_sha;
};

// weights_sha256 is the text of grpo.h: 16 MiB pieces per tensor (an 18 MiB tensor is two, an
// empty one is one empty piece), their hex digests concatenated and hashed; any thread count; one
// changed byte changes it.
TEST(GrpoWeightsHash, IsTheStatedPieceDigest) {
  Weights w;
  w.emplace_back("big", Tensor(DType::kBF16, {int64_t(9) << 20}));  // 18 MiB
  w.emplace_back("empty", Tensor(DType::kBF16, {0}));
  w.emplace_back("small", Tensor(DType::kF32, {5}));
  for (auto& [name, t] : w) {
    auto* p = static_cast<uint8_t*>(t.data());
    for (int64_t i = 0, n = t.nbytes(); i < n; ++i) p[i] = uint8_t(uint64_t(i) * 2654435761u >> 13);
  }
  const auto* big = static_cast<const uint8_t*>(w[0].second.data());
  const size_t piece = size_t(16) << 20;
  const std::string stated =
      sha256_hex(big, piece) + sha256_hex(big + piece, w[0].second.nbytes() - piece) +
      sha256_hex(nullptr, 0) + sha256_hex(w[2].second.data(), w[2].second.nbytes());
  const int threads = num_threads();
  set_num_threads(1);
  const std::string one = weights_sha256(w);
  set_num_threads(3);
  const std::string three = weights_sha256(w);
  set_num_threads(threads);
  EXPECT_EQ(one, sha256_hex(stated.data(), stated.size()));
  EXPECT_EQ(three, one);
  static_cast<uint8_t*>(w[0].second.data())[piece + 7] ^= 1;
  EXPECT_NE(weights_sha256(w), one);
}

GrpoRun run(const GrpoConfig& g) {
  const Qwen3Config c = small_config();
  const Weights w0 = random_qwen3_weights(c, 3);
  GrpoRun r;
  GrpoHooks h;
  h.on_step = [&](const GrpoStepMetrics& m) { r.steps.push_back(m); };
  r.final_sha = weights_sha256(run_grpo(g, c, w0, h));
  return r;
}

TEST(Grpo, EveryStepZeroMismatchesRatiosExactlyOneAndWeightsMove) {
  const GrpoRun r = run(small_run());
  ASSERT_EQ(r.steps.size(), 3u);
  std::string prev;
  for (const GrpoStepMetrics& m : r.steps) {
    EXPECT_GT(m.logp_compared, 0) << "step " << m.step;
    EXPECT_EQ(m.logp_mismatches, 0) << "step " << m.step;
    EXPECT_EQ(m.ratio_min, 1.0) << "step " << m.step;
    EXPECT_EQ(m.ratio_max, 1.0) << "step " << m.step;
    EXPECT_TRUE(std::isfinite(m.grad_norm));
    EXPECT_NE(m.weights_sha256, prev) << "the weights did not change at step " << m.step;
    prev = m.weights_sha256;
    // One optimizer step per step (no warm-up here): on-policy, no staleness.
    EXPECT_EQ(m.rollout_weight_version, m.step) << "step " << m.step;
    EXPECT_EQ(m.max_staleness, 0) << "step " << m.step;
  }
}

// The first mini-batch's head from the rollout (the default: no head forward there; the backward
// recomputes logp / lse / entropy and they are compared) gives, step by step, the weights and the
// comparison counts of the trainer's own head forward; with 2 mini-batches only the first takes
// it.
TEST(Grpo, HeadFromTheRolloutGivesTheWeightsOfTheHeadForward) {
  for (int64_t mini : {int64_t(1), int64_t(2)}) {
    GrpoConfig g = small_run();
    g.mini_batches = mini;
    ASSERT_TRUE(g.head_from_rollout);
    const GrpoRun a = run(g);
    g.head_from_rollout = false;
    const GrpoRun b = run(g);
    ASSERT_EQ(a.steps.size(), b.steps.size());
    for (size_t i = 0; i < a.steps.size(); ++i) {
      EXPECT_EQ(a.steps[i].weights_sha256, b.steps[i].weights_sha256)
          << "mini-batches " << mini << ", step " << i;
      EXPECT_EQ(a.steps[i].logp_compared, b.steps[i].logp_compared) << "step " << i;
      EXPECT_GT(a.steps[i].logp_compared, 0) << "step " << i;
      EXPECT_EQ(a.steps[i].logp_mismatches, 0) << "step " << i;
      EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i;
      EXPECT_EQ(a.steps[i].entropy_mean, b.steps[i].entropy_mean) << "step " << i;
    }
    EXPECT_EQ(a.final_sha, b.final_sha) << "mini-batches " << mini;
  }
}

// The CPU's invariant backend whose one-pass log-prob head returns one wrong logp bit on its first
// `corrupt` calls (the rest forwarded as they are): a broken one-pass head as the GRPO loop would
// see it.
class WrongHeadBackend : public ProfiledBackend {
 public:
  explicit WrongHeadBackend(int corrupt)
      : ProfiledBackend(make_invariant_backend()), corrupt_(corrupt) {}
  void linear_logprob_backward_recompute(const TensorView& h, const TensorView& w,
                                         const TensorView& targets, const LogprobParams& params,
                                         const ContractConfig& cfg, const TensorView& lse,
                                         const TensorView& entropy, const TensorView& g_lp,
                                         const TensorView* g_ent, const TensorView& dh,
                                         const TokenOrder& order, const TensorView& dw,
                                         const TensorView& logp_out, const TensorView& lse_out,
                                         const TensorView& entropy_out) const override {
    ProfiledBackend::linear_logprob_backward_recompute(h, w, targets, params, cfg, lse, entropy,
                                                       g_lp, g_ent, dh, order, dw, logp_out,
                                                       lse_out, entropy_out);
    ++calls_;
    if (calls_ > corrupt_) return;
    const auto* t = static_cast<const int64_t*>(targets.data);
    for (int64_t i = 0; i < targets.size(0); ++i)
      if (t[i] >= 0) {  // the first row with a target: its logp is compared
        static_cast<uint32_t*>(logp_out.data)[i] ^= 1u;
        return;
      }
  }
  int calls() const { return calls_; }

 private:
  int corrupt_;
  mutable int calls_ = 0;
};

// A one-pass head that disagrees with the rollout (a broken contract, injected) is caught: the
// step counts it as head_mismatches and redoes the mini-batch with the trainer's own head forward,
// so the weights, comparisons and loss are those of the run without the one pass.
TEST(Grpo, AWrongOnePassHeadIsCountedAndTheMiniBatchRedone) {
  GrpoConfig g = small_run();
  const Qwen3Config c = small_config();
  const Weights w0 = random_qwen3_weights(c, 3);
  auto wrong = std::make_shared<WrongHeadBackend>(1);
  GrpoDevice dev = cpu_grpo_device();
  dev.backend = [wrong, cpu = dev.backend](bool baseline) -> std::shared_ptr<OpsBackend> {
    if (baseline) return cpu(true);
    return wrong;
  };
  GrpoRun a;
  GrpoHooks h;
  h.on_step = [&](const GrpoStepMetrics& m) { a.steps.push_back(m); };
  a.final_sha = weights_sha256(run_grpo(g, c, w0, dev, h));
  EXPECT_GE(wrong->calls(), int(g.steps)) << "the one-pass head did not run on every step";
  g.head_from_rollout = false;
  const GrpoRun b = run(g);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].head_mismatches, i == 0 ? 1 : 0) << "step " << i;
    EXPECT_EQ(b.steps[i].head_mismatches, 0) << "step " << i;
    EXPECT_EQ(a.steps[i].weights_sha256, b.steps[i].weights_sha256) << "step " << i;
    EXPECT_EQ(a.steps[i].logp_compared, b.steps[i].logp_compared) << "step " << i;
    EXPECT_EQ(a.steps[i].logp_mismatches, 0) << "step " << i;
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i;
  }
  EXPECT_EQ(a.final_sha, b.final_sha);
}

// Several mini-batches per rollout batch: mini-batch m trains on the rollout's version + m, which
// the metrics show; the warm-up's steps count.
TEST(Grpo, WeightVersionsShowTheMiniBatchStaleness) {
  GrpoConfig g = small_run();
  g.steps = 2;
  g.mini_batches = 3;
  g.sft_steps = 2;
  const GrpoRun r = run(g);
  ASSERT_EQ(r.steps.size(), 2u);
  for (const GrpoStepMetrics& m : r.steps) {
    EXPECT_EQ(m.rollout_weight_version, 2 + 3 * m.step) << "step " << m.step;
    EXPECT_EQ(m.max_staleness, 2) << "step " << m.step;
    EXPECT_EQ(m.logp_mismatches, 0) << "step " << m.step;
  }
}

TEST(Grpo, TwoRunsMicroBatchSizeAndTrainingTpGiveTheSameWeights) {
  const GrpoConfig g = small_run();
  const GrpoRun a = run(g);
  EXPECT_EQ(a.final_sha, run(g).final_sha) << "rerun";
  GrpoConfig mb = g;
  mb.micro_batch_tokens = 1000;  // one micro-batch per step
  EXPECT_EQ(a.final_sha, run(mb).final_sha) << "micro-batch size";
  GrpoConfig tp = g;
  tp.train_tp = 2;
  EXPECT_EQ(a.final_sha, run(tp).final_sha) << "training tp 2";
  GrpoConfig rtp = g;
  rtp.rollout_tp = 4;
  EXPECT_EQ(a.final_sha, run(rtp).final_sha) << "rollout tp 4";
}

TEST(Grpo, ResumeFromACheckpointGivesTheUninterruptedBits) {
  const GrpoConfig g = small_run();
  const GrpoRun full = run(g);
  const std::string dir = ::testing::TempDir() + "grpo_ckpt_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  GrpoConfig first = g;
  first.steps = 1;
  first.checkpoint_dir = dir;
  const GrpoRun a = run(first);
  ASSERT_TRUE(std::filesystem::exists(dir + "/step-1/model.safetensors"));
  ASSERT_TRUE(std::filesystem::exists(dir + "/latest"));
  GrpoConfig rest = g;
  rest.resume = dir;
  const GrpoRun b = run(rest);
  ASSERT_EQ(b.steps.size(), 2u);
  EXPECT_EQ(b.steps[0].step, 1);
  EXPECT_EQ(b.final_sha, full.final_sha);
  for (size_t i = 0; i < b.steps.size(); ++i)
    EXPECT_EQ(b.steps[i].weights_sha256, full.steps[i + 1].weights_sha256) << "step " << i + 1;
  // A reward command that fails stops the run with a clear error and writes no checkpoint.
  GrpoConfig cmd = g;
  cmd.steps = 1;
  cmd.checkpoint_dir = dir + "_cmd";
  cmd.reward_command = "cat >/dev/null; echo abc";
  try {
    run(cmd);
    ADD_FAILURE() << "a non-number reward was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a number"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "_cmd/latest")) << "a failed step wrote a checkpoint";
  std::filesystem::remove_all(dir + "_cmd");
  // Other settings than the checkpoint's are refused.
  GrpoConfig other = rest;
  other.optim.lr = 5e-3;
  EXPECT_THROW(run(other), Error);
  std::filesystem::remove_all(dir);
}

TEST(Grpo, BaselineKernelsShowMismatches) {
  GrpoConfig g = small_run();
  g.baseline = true;
  g.steps = 1;
  // 64 sequences (~250 compared tokens): with 16 (~60 tokens) the random weights' peaked
  // distributions left the baseline without a mismatch once the embedding std became 0.2·√(128/H).
  g.prompts = 16;
  g.rollout.kv.num_pages = 512;
  g.rollout.scheduler.max_running = 64;
  const GrpoRun r = run(g);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_GT(r.steps[0].logp_mismatches, 0);
}

// Group-shared prompts (docs/contract.md §B.11): the trainer's log-probs stay the rollout's bits
// (0 mismatches, ratios exactly 1), the run is deterministic and independent of the micro-batch
// size, and its weights are the shared form's rounding (not the unshared run's bits).
TEST(Grpo, SharedPromptsKeepZeroMismatchesAndAreDeterministic) {
  GrpoConfig g = small_run();
  g.share_prompts = true;
  const GrpoRun a = run(g);
  ASSERT_EQ(a.steps.size(), 3u);
  std::string prev;
  for (const GrpoStepMetrics& m : a.steps) {
    EXPECT_GT(m.logp_compared, 0) << "step " << m.step;
    EXPECT_EQ(m.logp_mismatches, 0) << "step " << m.step;
    EXPECT_EQ(m.ratio_min, 1.0) << "step " << m.step;
    EXPECT_EQ(m.ratio_max, 1.0) << "step " << m.step;
    EXPECT_NE(m.weights_sha256, prev) << "the weights did not change at step " << m.step;
    prev = m.weights_sha256;
  }
  EXPECT_EQ(a.final_sha, run(g).final_sha) << "rerun";
  GrpoConfig mb = g;
  mb.micro_batch_tokens = 1000;  // one micro-batch per step (40: about one group each)
  EXPECT_EQ(a.final_sha, run(mb).final_sha) << "micro-batch size";
  EXPECT_NE(a.final_sha, run(small_run()).final_sha) << "G = 4: the shared form rounds otherwise";
  GrpoConfig two = g;
  two.mini_batches = 2;
  two.steps = 1;
  const GrpoRun b = run(two);
  ASSERT_EQ(b.steps.size(), 1u);
  EXPECT_EQ(b.steps[0].logp_mismatches, 0);
  EXPECT_EQ(b.steps[0].max_staleness, 1);
  // Refused: the baseline kernels (no shared attention) and mini-batches inside a group.
  GrpoConfig bad = g;
  bad.baseline = true;
  EXPECT_THROW(run(bad), Error);
  bad = g;
  bad.mini_batches = 5;
  EXPECT_THROW(run(bad), Error);
}

// The training side as rank-local ranks on threads (one model, backward and gradient blocks per
// rank, docs/dist.md): every step's weights have the simulated run's bits, with and without shared
// prompts and with several mini-batches; the metrics (mismatches, ratios, grad norm) too.
TEST(Grpo, RankLocalTrainingGivesTheSimulatedWeightsEveryStep) {
  for (bool shared : {false, true}) {
    for (int tp : {2, 4}) {
      SCOPED_TRACE("shared " + std::to_string(shared) + " train tp " + std::to_string(tp));
      GrpoConfig g = small_run();
      g.share_prompts = shared;
      g.train_tp = tp;
      g.mini_batches = 2;
      g.steps = 2;
      const GrpoRun sim = run(g);
      g.train_ranks = RankMode::kThreads;
      const GrpoRun ranks = run(g);
      ASSERT_EQ(ranks.steps.size(), sim.steps.size());
      for (size_t i = 0; i < sim.steps.size(); ++i) {
        EXPECT_EQ(ranks.steps[i].weights_sha256, sim.steps[i].weights_sha256) << "step " << i;
        EXPECT_EQ(ranks.steps[i].logp_compared, sim.steps[i].logp_compared);
        EXPECT_EQ(ranks.steps[i].logp_mismatches, 0);
        EXPECT_EQ(ranks.steps[i].grad_norm, sim.steps[i].grad_norm);
        EXPECT_EQ(ranks.steps[i].loss, sim.steps[i].loss);
      }
    }
  }
  GrpoConfig bad = small_run();
  bad.train_ranks = RankMode::kThreads;  // train_tp 1
  lockstep::test::expect_error_mentioning([&] { run(bad); },
                                          "train ranks on threads need train_tp > 1");
  bad.train_tp = 2;
  bad.baseline = true;
  lockstep::test::expect_error_mentioning([&] { run(bad); }, "baseline kernels");
}

TEST(Grpo, BadConfigsAreRefused) {
  GrpoConfig g = small_run();
  g.steps = -1;
  EXPECT_THROW(run(g), Error);
  g = small_run();
  g.task = "nope";
  EXPECT_THROW(run(g), Error);
  g = small_run();
  g.temperature = 0;
  EXPECT_THROW(run(g), Error);
}

}  // namespace
}  // namespace lockstep::engine
