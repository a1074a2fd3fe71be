// GRPO / PPO policy losses (issue 12; docs/training.md): group-normalized advantages, the PPO
// clipped-ratio objective with verl's loss aggregation modes, optional KL to a reference policy
// (k1 / k3) and an entropy bonus (formulas: docs/training-loss.md). The loss is expressed through
// its upstream gradients with respect to the trainer's per-token log-probs and entropies (what
// Backprop::backward takes), plus the loss value and metrics. All arithmetic in double except where
// a result is stored as f32; the order of every sum is the canonical token order (sequences in step
// order, positions ascending).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::engine {

enum class AdvantageMode { kGrpo, kDrGrpo };  // (r - mean) / (std + eps) | r - mean
enum class LossAgg { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum };  // verl loss_agg_mode
enum class KlEstimator { kNone, kK1, kK3 };

struct PolicyLossConfig {
  AdvantageMode advantage = AdvantageMode::kGrpo;
  double adv_eps = 1e-6;
  double clip_low = 0.2, clip_high = 0.2;  // ratio clipped to [1 - clip_low, 1 + clip_high]
  LossAgg agg = LossAgg::kTokenMean;
  KlEstimator kl = KlEstimator::kNone;
  double kl_coef = 0.0;
  double entropy_coef = 0.0;      // loss -= entropy_coef · entropy (a bonus)
  void validate() const;          // throws lockstep::Error: every number finite and >= 0
  std::string to_string() const;  // one line
};

// Advantages per sequence from rewards, per group (group[i] = the group of sequence i; groups of
// any size >= 1; a group of one gets advantage 0). std is the population std (ddof 0), as verl.
// Mean and std in double, each a sum in sequence order. Throws on a size mismatch or a non-finite
// reward.
std::vector<double> group_advantages(const std::vector<double>& rewards,
                                     const std::vector<int64_t>& group,
                                     const PolicyLossConfig& cfg);

// One sequence's completion tokens inside a mini-batch.
struct SeqLoss {
  double advantage = 0;
  std::vector<float> old_logp;  // the rollout's recorded log-probs (the old policy)
  std::vector<float> logp;      // the trainer's
  std::vector<float> entropy;   // the trainer's
  std::vector<float> ref_logp;  // the reference policy's (with kl != kNone; else empty or ignored)
};

struct LossResult {
  double loss = 0;
  // Per sequence, per token: dloss/dlogp and dloss/dentropy (f32, what backward takes).
  std::vector<std::vector<float>> g_logp, g_entropy;
  // Metrics over the mini-batch's tokens (all 0 when it has none). clip_fraction: the share of
  // tokens where the clipped branch is taken (strictly below the unclipped one); kl: the mean of
  // the configured estimator (0 without KL).
  double ratio_min = 0, ratio_max = 0, clip_fraction = 0, kl = 0, entropy_mean = 0;
  int64_t tokens = 0;
};

// The loss over all sequences of one mini-batch: call it once per mini-batch. The aggregation's
// denominators (tokens, or non-empty sequences) count the whole call, so the trainer may split the
// backward into micro-batches freely, but two calls on halves are a different loss. A sequence's
// gradients depend on its own tokens and those counts only, not on the other sequences or their
// order. Empty sequences weigh nothing (the sequence-mean modes count non-empty ones). ratio =
// exp(logp - old_logp) per token, computed in double from the f32 values: exactly 1.0 where they
// are equal. Throws lockstep::Error on size mismatches, non-finite inputs (naming sequence and
// token), an overflowing ratio or KL term, or a bad config.
LossResult policy_loss(const std::vector<SeqLoss>& seqs, const PolicyLossConfig& cfg);

}  // namespace lockstep::engine
