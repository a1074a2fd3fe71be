// Policy losses: gradients against central finite differences of the loss itself (each aggregation
// mode, KL k1/k3, entropy bonus), clipping on both sides for both signs of the advantage, hand
// values of the aggregation modes, ratio exactly 1.0 on unchanged log-probs, independence of a
// sequence's gradients from the other sequences' order, empty sequences, group advantages, and one
// clear error per bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>

#include "engine/policy_loss.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
  }
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Sequences whose log-ratios lie well away from the clip boundaries (clip 0.2: ratio 0.8 / 1.2),
// so a finite difference never straddles a kink; both branches and both advantage signs occur.
std::vector<SeqLoss> random_seqs(std::mt19937_64& g, std::vector<size_t> lens) {
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const float deltas[] = {-0.5f, -0.1f, 0.05f, 0.3f};  // ratios ~0.61, 0.90, 1.05, 1.35
  std::vector<SeqLoss> seqs;
  for (size_t i = 0; i < lens.size(); ++i) {
    SeqLoss q;
    q.advantage = (i % 2 ? -1.0 : 1.0) * (0.25 + u(g));
    for (size_t t = 0; t < lens[i]; ++t) {
      const float lp = -0.1f - 3.f * u(g);
      q.logp.push_back(lp);
      q.old_logp.push_back(lp - deltas[g() % 4] - 0.01f * (u(g) - 0.5f));
      q.entropy.push_back(2.f * u(g));
      q.ref_logp.push_back(lp + 0.4f * (u(g) - 0.5f));
    }
    seqs.push_back(q);
  }
  return seqs;
}

// dloss/dx at x = seqs[s].<field>[t] by a central difference in double. The f32 inputs move by
// the representable steps x±h, so the step is measured after rounding.
double finite_diff(std::vector<SeqLoss> seqs, const PolicyLossConfig& cfg, size_t s, size_t t,
                   std::vector<float> SeqLoss::*field) {
  float& x = (seqs[s].*field)[t];
  const float x0 = x, h = 1e-3f;
  x = x0 + h;
  const float xp = x;
  const double lp = policy_loss(seqs, cfg).loss;
  x = x0 - h;
  const float xm = x;
  const double lm = policy_loss(seqs, cfg).loss;
  return (lp - lm) / (double(xp) - double(xm));
}

class GradCheck : public ::testing::TestWithParam<std::tuple<LossAgg, KlEstimator>> {};

TEST_P(GradCheck, MatchesFiniteDifferences) {
  auto g = test::rng(1);
  PolicyLossConfig cfg;
  cfg.agg = std::get<0>(GetParam());
  cfg.kl = std::get<1>(GetParam());
  cfg.kl_coef = cfg.kl == KlEstimator::kNone ? 0.0 : 0.3;
  cfg.entropy_coef = 0.01;
  const std::vector<SeqLoss> seqs = random_seqs(g, {5, 1, 0, 17, 3});
  const LossResult res = policy_loss(seqs, cfg);
  ASSERT_EQ(res.tokens, 26);
  ASSERT_GT(res.clip_fraction, 0.0);  // both branches are exercised
  ASSERT_LT(res.clip_fraction, 1.0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    ASSERT_EQ(res.g_logp[s].size(), seqs[s].logp.size());
    for (size_t t = 0; t < seqs[s].logp.size(); ++t) {
      const double fd = finite_diff(seqs, cfg, s, t, &SeqLoss::logp);
      EXPECT_NEAR(res.g_logp[s][t], fd, 1e-4 * std::abs(fd) + 1e-7) << "logp s " << s << " t " << t;
      const double fe = finite_diff(seqs, cfg, s, t, &SeqLoss::entropy);
      EXPECT_NEAR(res.g_entropy[s][t], fe, 1e-4 * std::abs(fe) + 1e-7)
          << "entropy s " << s << " t " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, GradCheck,
    ::testing::Combine(::testing::Values(LossAgg::kTokenMean, LossAgg::kSeqMeanTokenMean,
                                         LossAgg::kSeqMeanTokenSum),
                       ::testing::Values(KlEstimator::kNone, KlEstimator::kK1, KlEstimator::kK3)));

SeqLoss flat_seq(double adv, size_t n, float logp = -1.0f) {
  SeqLoss q;
  q.advantage = adv;
  q.logp.assign(n, logp);
  q.old_logp.assign(n, logp);
  q.entropy.assign(n, 0.5f);
  return q;
}

// ratio 1 everywhere: every token's loss is -A, so the aggregations are plain arithmetic.
TEST(PolicyLoss, AggregationHandValues) {
  const std::vector<SeqLoss> seqs = {flat_seq(2.0, 1), flat_seq(-1.0, 3)};
  PolicyLossConfig cfg;
  cfg.agg = LossAgg::kTokenMean;
  LossResult r = policy_loss(seqs, cfg);
  EXPECT_DOUBLE_EQ(r.loss, (-2.0 + 3.0) / 4);
  EXPECT_FLOAT_EQ(r.g_logp[0][0], -2.0f / 4);
  EXPECT_FLOAT_EQ(r.g_logp[1][2], 1.0f / 4);
  cfg.agg = LossAgg::kSeqMeanTokenMean;
  r = policy_loss(seqs, cfg);
  EXPECT_DOUBLE_EQ(r.loss, (-2.0 + 1.0) / 2);
  EXPECT_FLOAT_EQ(r.g_logp[0][0], -2.0f / 2);
  EXPECT_FLOAT_EQ(r.g_logp[1][1], 1.0f / 6);
  cfg.agg = LossAgg::kSeqMeanTokenSum;
  r = policy_loss(seqs, cfg);
  EXPECT_DOUBLE_EQ(r.loss, (-2.0 + 3.0) / 2);
  EXPECT_FLOAT_EQ(r.g_logp[0][0], -2.0f / 2);
  EXPECT_FLOAT_EQ(r.g_logp[1][0], 1.0f / 2);
  EXPECT_EQ(r.tokens, 4);
  EXPECT_EQ(r.clip_fraction, 0.0);
  EXPECT_DOUBLE_EQ(r.entropy_mean, 0.5);
  for (const auto& ge : r.g_entropy)
    for (float v : ge) EXPECT_EQ(v, 0.0f);  // no entropy bonus configured
}

// One token with a chosen ratio r and advantage A; clip [0.8, 1.2].
LossResult one_token(double log_ratio, double adv) {
  SeqLoss q = flat_seq(adv, 1);
  q.old_logp[0] = float(double(q.logp[0]) - log_ratio);
  return policy_loss({q}, PolicyLossConfig{});
}

TEST(PolicyLoss, ClippingBothSidesBothSigns) {
  struct Case {
    double log_ratio, adv;
    bool clipped;
  };
  const Case cases[] = {
      {std::log(1.5), 1.0, true},    // A > 0, r above 1 + eps: clipped, no gradient
      {std::log(0.5), 1.0, false},   // A > 0, r below 1 - eps: the min keeps r·A
      {std::log(0.5), -1.0, true},   // A < 0, r below 1 - eps: clipped
      {std::log(1.5), -1.0, false},  // A < 0, r above 1 + eps: the min keeps r·A
      {std::log(1.1), 1.0, false},   // inside the band: unclipped
      {std::log(1.1), -1.0, false},
  };
  for (const Case& c : cases) {
    const LossResult r = one_token(c.log_ratio, c.adv);
    const double ratio = r.ratio_min;
    EXPECT_EQ(r.ratio_min, r.ratio_max);
    if (c.clipped) {
      EXPECT_EQ(r.g_logp[0][0], 0.0f) << c.log_ratio << " " << c.adv;
      EXPECT_EQ(r.clip_fraction, 1.0);
      EXPECT_DOUBLE_EQ(r.loss, -std::clamp(ratio, 0.8, 1.2) * c.adv);
    } else {
      EXPECT_FLOAT_EQ(r.g_logp[0][0], float(-c.adv * ratio)) << c.log_ratio << " " << c.adv;
      EXPECT_EQ(r.clip_fraction, 0.0);
      EXPECT_DOUBLE_EQ(r.loss, -ratio * c.adv);
    }
  }
  // A = 0: both branches tie at 0, the unclipped one is taken, nothing counts as clipped.
  const LossResult z = one_token(std::log(1.5), 0.0);
  EXPECT_EQ(z.clip_fraction, 0.0);
  EXPECT_EQ(z.g_logp[0][0], -0.0f);
}

TEST(PolicyLoss, RatioExactlyOneOnUnchangedLogProbs) {
  auto g = test::rng(2);
  std::vector<SeqLoss> seqs = random_seqs(g, {7, 3, 11});
  for (SeqLoss& q : seqs) q.old_logp = q.logp;
  const LossResult r = policy_loss(seqs, PolicyLossConfig{});
  EXPECT_TRUE(same_bits(r.ratio_min, 1.0)) << r.ratio_min;
  EXPECT_TRUE(same_bits(r.ratio_max, 1.0)) << r.ratio_max;
  EXPECT_EQ(r.clip_fraction, 0.0);
  // ratio 1: the token-mean gradient is -A / N exactly as computed in double, then rounded.
  for (size_t s = 0; s < seqs.size(); ++s)
    for (float v : r.g_logp[s]) EXPECT_EQ(v, float(-seqs[s].advantage / 21.0));
}

TEST(PolicyLoss, KlEstimatorsAndEntropyBonus) {
  SeqLoss q = flat_seq(0.0, 2, -1.0f);
  q.ref_logp = {-1.5f, -1.0f};
  q.entropy = {1.0f, 3.0f};
  PolicyLossConfig cfg;
  cfg.kl_coef = 0.5;
  cfg.kl = KlEstimator::kK1;
  LossResult r = policy_loss({q}, cfg);
  EXPECT_DOUBLE_EQ(r.kl, (0.5 + 0.0) / 2);
  EXPECT_DOUBLE_EQ(r.loss, 0.5 * r.kl);
  EXPECT_FLOAT_EQ(r.g_logp[0][0], 0.5f / 2);
  EXPECT_FLOAT_EQ(r.g_logp[0][1], 0.5f / 2);
  cfg.kl = KlEstimator::kK3;
  r = policy_loss({q}, cfg);
  const double k3 = std::exp(-0.5) + 0.5 - 1.0;  // ref - logp = -0.5
  EXPECT_DOUBLE_EQ(r.kl, k3 / 2);                // and 0 where logp == ref
  EXPECT_FLOAT_EQ(r.g_logp[0][0], float(0.5 * (1.0 - std::exp(-0.5)) / 2));
  EXPECT_EQ(r.g_logp[0][1], 0.0f);
  cfg.kl = KlEstimator::kNone;
  cfg.entropy_coef = 0.1;
  r = policy_loss({q}, cfg);
  EXPECT_DOUBLE_EQ(r.entropy_mean, 2.0);
  EXPECT_DOUBLE_EQ(r.loss, -0.1 * 2.0);
  EXPECT_EQ(r.kl, 0.0);
  for (float v : r.g_entropy[0]) EXPECT_EQ(v, float(-0.1 / 2));
}

// The trainer calls policy_loss once per mini-batch. A sequence's gradients depend on its own
// tokens and the mini-batch's counts only: reordering the other sequences changes no bit of them.
// Splitting a mini-batch into two calls changes the denominators, so it is not the same loss.
TEST(PolicyLoss, GradientsIndependentOfOtherSequencesOrder) {
  auto g = test::rng(3);
  PolicyLossConfig cfg;
  cfg.kl = KlEstimator::kK3;
  cfg.kl_coef = 0.1;
  cfg.entropy_coef = 0.01;
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenMean, LossAgg::kSeqMeanTokenSum}) {
    cfg.agg = agg;
    const std::vector<SeqLoss> seqs = random_seqs(g, {4, 9, 0, 2, 13, 1});
    const LossResult a = policy_loss(seqs, cfg);
    std::vector<size_t> perm = {4, 2, 0, 5, 3, 1};
    std::vector<SeqLoss> shuffled;
    for (size_t i : perm) shuffled.push_back(seqs[i]);
    const LossResult b = policy_loss(shuffled, cfg);
    for (size_t k = 0; k < perm.size(); ++k) {
      ASSERT_EQ(a.g_logp[perm[k]].size(), b.g_logp[k].size());
      if (b.g_logp[k].empty()) continue;  // (bitwise_equal's memcmp wants non-null data)
      EXPECT_TRUE(test::bitwise_equal(a.g_logp[perm[k]], b.g_logp[k])) << "seq " << perm[k];
      EXPECT_TRUE(test::bitwise_equal(a.g_entropy[perm[k]], b.g_entropy[k])) << "seq " << perm[k];
    }
    EXPECT_NEAR(a.loss, b.loss, 1e-12 * std::abs(a.loss) + 1e-15);
    EXPECT_EQ(a.ratio_min, b.ratio_min);
    EXPECT_EQ(a.ratio_max, b.ratio_max);
    EXPECT_EQ(a.clip_fraction, b.clip_fraction);

    const std::vector<SeqLoss> head(seqs.begin(), seqs.begin() + 3);
    const LossResult h = policy_loss(head, cfg);
    EXPECT_NE(h.g_logp[0][0], a.g_logp[0][0]) << "a split call has other denominators";
  }
}

// Empty sequences weigh nothing: in every mode, adding one changes no bit of the result (the
// sequence-mean modes count non-empty sequences only).
TEST(PolicyLoss, EmptySequences) {
  auto g = test::rng(4);
  const std::vector<SeqLoss> seqs = random_seqs(g, {3, 5});
  std::vector<SeqLoss> with_empty = {seqs[0], SeqLoss{}, seqs[1], SeqLoss{}};
  with_empty[1].advantage = 7.0;
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenMean, LossAgg::kSeqMeanTokenSum}) {
    PolicyLossConfig cfg;
    cfg.agg = agg;
    const LossResult a = policy_loss(seqs, cfg), b = policy_loss(with_empty, cfg);
    EXPECT_TRUE(same_bits(a.loss, b.loss));
    EXPECT_TRUE(test::bitwise_equal(a.g_logp[0], b.g_logp[0]));
    EXPECT_TRUE(test::bitwise_equal(a.g_logp[1], b.g_logp[2]));
    EXPECT_TRUE(b.g_logp[1].empty() && b.g_entropy[3].empty());
  }
  const LossResult none = policy_loss({SeqLoss{}, SeqLoss{}}, PolicyLossConfig{});
  EXPECT_EQ(none.tokens, 0);
  EXPECT_EQ(none.loss, 0.0);
  EXPECT_EQ(none.g_logp.size(), 2u);
  EXPECT_EQ(policy_loss({}, PolicyLossConfig{}).tokens, 0);
}

TEST(PolicyLoss, BadInputs) {
  const PolicyLossConfig cfg;
  SeqLoss q = flat_seq(1.0, 3);
  auto run = [&](SeqLoss bad, PolicyLossConfig c = PolicyLossConfig{}) {
    return [bad, c, q] { policy_loss({q, bad}, c); };
  };
  SeqLoss b = q;
  b.old_logp.pop_back();
  expect_error(run(b), {"sequence 1", "logp has 3 tokens, old_logp 2"});
  b = q;
  b.entropy.push_back(0.f);
  expect_error(run(b), {"sequence 1", "entropy 4"});
  b = q;
  PolicyLossConfig kl = cfg;
  kl.kl = KlEstimator::kK1;
  expect_error(run(b, kl), {"sequence 0", "ref_logp 0", "KL needs one per token"});
  b.ref_logp = {0.f};
  expect_error(run(b), {"sequence 1", "ref_logp 1", "give none or one per token"});
  b = q;
  b.logp[2] = NAN;
  expect_error(run(b), {"sequence 1 token 2", "logp is not finite"});
  b = q;
  b.old_logp[1] = INFINITY;
  expect_error(run(b), {"sequence 1 token 1", "old_logp is not finite"});
  b = q;
  b.entropy[0] = -INFINITY;
  expect_error(run(b), {"sequence 1 token 0", "entropy is not finite"});
  b = q;
  b.advantage = NAN;
  expect_error(run(b), {"sequence 1", "advantage is not finite"});
  b = q;
  b.logp[0] = 0.f;
  b.old_logp[0] = -1000.f;
  expect_error(run(b), {"sequence 1 token 0", "ratio exp(logp - old_logp) overflows"});

  for (auto [field, name] : {std::pair{&PolicyLossConfig::clip_low, "clip_low"},
                             {&PolicyLossConfig::clip_high, "clip_high"},
                             {&PolicyLossConfig::kl_coef, "kl_coef"},
                             {&PolicyLossConfig::entropy_coef, "entropy_coef"},
                             {&PolicyLossConfig::adv_eps, "adv_eps"}}) {
    for (double v : {-0.1, double(NAN), double(INFINITY)}) {
      PolicyLossConfig c;
      c.*field = v;
      expect_error([&] { policy_loss({q}, c); }, {"PolicyLossConfig", name, "finite and >= 0"});
      expect_error([&] { group_advantages({1.0}, {0}, c); }, {name});
    }
  }
  EXPECT_NE(cfg.to_string().find("agg=token-mean"), std::string::npos) << cfg.to_string();
}

TEST(GroupAdvantages, GrpoAndDrGrpo) {
  // Two interleaved groups and a group of one: {1, 0, 1, 0} in group 7 and {0.5, 0.25} in group 3.
  const std::vector<double> rewards = {1.0, 0.5, 0.0, 1.0, 0.25, 0.0, 0.9};
  const std::vector<int64_t> group = {7, 3, 7, 7, 3, 7, -2};
  PolicyLossConfig cfg;
  std::vector<double> a = group_advantages(rewards, group, cfg);
  ASSERT_EQ(a.size(), rewards.size());
  const double e = cfg.adv_eps;
  EXPECT_DOUBLE_EQ(a[0], 0.5 / (0.5 + e));  // mean 0.5, std 0.5
  EXPECT_DOUBLE_EQ(a[2], -0.5 / (0.5 + e));
  EXPECT_DOUBLE_EQ(a[1], 0.125 / (0.125 + e));  // mean 0.375, std 0.125
  EXPECT_DOUBLE_EQ(a[4], -0.125 / (0.125 + e));
  EXPECT_EQ(a[6], 0.0);  // a group of one
  cfg.advantage = AdvantageMode::kDrGrpo;
  a = group_advantages(rewards, group, cfg);
  EXPECT_EQ(a[0], 0.5);
  EXPECT_EQ(a[5], -0.5);
  EXPECT_EQ(a[1], 0.125);
  EXPECT_EQ(a[6], 0.0);
  // A group of equal rewards: 0, not 0/0.
  cfg.advantage = AdvantageMode::kGrpo;
  for (double v : group_advantages({0.3, 0.3, 0.3}, {1, 1, 1}, cfg)) EXPECT_EQ(v, 0.0);
  EXPECT_TRUE(group_advantages({}, {}, cfg).empty());
}

TEST(GroupAdvantages, BadInputs) {
  const PolicyLossConfig cfg;
  expect_error(
      [&] {
        group_advantages({1.0, 2.0}, {0}, cfg);
      },
      {"rewards has 2 entries but group has 1"});
  expect_error(
      [&] {
        group_advantages({1.0, NAN}, {0, 0}, cfg);
      },
      {"reward of sequence 1 is not finite"});
}

}  // namespace
}  // namespace lockstep::engine
