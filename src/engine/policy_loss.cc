// GRPO / PPO policy losses (see policy_loss.h, docs/training-loss.md for the formulas). Every sum
// is in double, sequences in call order, positions ascending; a per-token gradient is a function of
// its own token's values and the mini-batch's counts only (never of the other sequences' values).
#include "engine/policy_loss.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

const char* name_of(AdvantageMode m) { return m == AdvantageMode::kGrpo ? "grpo" : "dr_grpo"; }

const char* name_of(LossAgg a) {
  switch (a) {
    case LossAgg::kTokenMean:
      return "token-mean";
    case LossAgg::kSeqMeanTokenMean:
      return "seq-mean-token-mean";
    case LossAgg::kSeqMeanTokenSum:
      return "seq-mean-token-sum";
  }
  return "?";
}

const char* name_of(KlEstimator k) {
  switch (k) {
    case KlEstimator::kNone:
      return "none";
    case KlEstimator::kK1:
      return "k1";
    case KlEstimator::kK3:
      return "k3";
  }
  return "?";
}

void check_coef(double v, const char* name) {
  LS_CHECK(std::isfinite(v) && v >= 0, "PolicyLossConfig", name, " must be finite and >= 0, got ",
           v);
}

void check_finite(const std::vector<float>& v, const char* what, size_t s) {
  for (size_t t = 0; t < v.size(); ++t)
    LS_CHECK(std::isfinite(v[t]), "policy_loss", "sequence ", s, " token ", t, ": ", what,
             " is not finite (", v[t], ")");
}

}  // namespace

void PolicyLossConfig::validate() const {
  check_coef(adv_eps, "adv_eps");
  check_coef(clip_low, "clip_low");
  check_coef(clip_high, "clip_high");
  check_coef(kl_coef, "kl_coef");
  check_coef(entropy_coef, "entropy_coef");
}

std::string PolicyLossConfig::to_string() const {
  return detail::concat("advantage=", name_of(advantage), " adv_eps=", adv_eps, " clip=[1-",
                        clip_low, ", 1+", clip_high, "] agg=", name_of(agg), " kl=", name_of(kl),
                        " kl_coef=", kl_coef, " entropy_coef=", entropy_coef);
}

std::vector<double> group_advantages(const std::vector<double>& rewards,
                                     const std::vector<int64_t>& group,
                                     const PolicyLossConfig& cfg) {
  cfg.validate();
  LS_CHECK(rewards.size() == group.size(), "group_advantages", "rewards has ", rewards.size(),
           " entries but group has ", group.size());
  for (size_t i = 0; i < rewards.size(); ++i)
    LS_CHECK(std::isfinite(rewards[i]), "group_advantages", "reward of sequence ", i,
             " is not finite (", rewards[i], ")");

  // Per group: count, mean, then the population variance from a second pass (both in sequence
  // order), so the result does not depend on how the groups interleave.
  struct Stats {
    int64_t n = 0;
    double sum = 0, sq = 0, mean = 0, std = 0;
  };
  std::map<int64_t, Stats> stats;
  for (size_t i = 0; i < rewards.size(); ++i) {
    Stats& st = stats[group[i]];
    st.n += 1;
    st.sum += rewards[i];
  }
  for (auto& [id, st] : stats) st.mean = st.sum / double(st.n);
  for (size_t i = 0; i < rewards.size(); ++i) {
    Stats& st = stats[group[i]];
    const double d = rewards[i] - st.mean;
    st.sq += d * d;
  }
  for (auto& [id, st] : stats) st.std = std::sqrt(st.sq / double(st.n));

  std::vector<double> adv(rewards.size(), 0.0);
  for (size_t i = 0; i < rewards.size(); ++i) {
    const Stats& st = stats[group[i]];
    if (st.n == 1) continue;  // a group of one carries no signal
    const double centered = rewards[i] - st.mean;
    adv[i] = cfg.advantage == AdvantageMode::kGrpo ? centered / (st.std + cfg.adv_eps) : centered;
  }
  return adv;
}

LossResult policy_loss(const std::vector<SeqLoss>& seqs, const PolicyLossConfig& cfg) {
  cfg.validate();
  const bool use_kl = cfg.kl != KlEstimator::kNone;
  int64_t tokens = 0, nonempty = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqLoss& q = seqs[s];
    const size_t n = q.logp.size();
    LS_CHECK(q.old_logp.size() == n && q.entropy.size() == n, "policy_loss", "sequence ", s,
             ": logp has ", n, " tokens, old_logp ", q.old_logp.size(), ", entropy ",
             q.entropy.size());
    // Without KL ref_logp is ignored, but a wrong size still means a caller bug.
    LS_CHECK(q.ref_logp.size() == n || (!use_kl && q.ref_logp.empty()), "policy_loss", "sequence ",
             s, ": logp has ", n, " tokens, ref_logp ", q.ref_logp.size(),
             use_kl ? " (KL needs one per token)" : " (give none or one per token)");
    LS_CHECK(std::isfinite(q.advantage), "policy_loss", "sequence ", s,
             ": advantage is not finite (", q.advantage, ")");
    check_finite(q.old_logp, "old_logp", s);
    check_finite(q.logp, "logp", s);
    check_finite(q.entropy, "entropy", s);
    if (use_kl) check_finite(q.ref_logp, "ref_logp", s);
    tokens += int64_t(n);
    nonempty += n > 0 ? 1 : 0;
  }

  LossResult res;
  res.tokens = tokens;
  res.g_logp.resize(seqs.size());
  res.g_entropy.resize(seqs.size());
  if (tokens == 0) return res;  // loss 0, no gradients, metrics 0

  const double lo = 1.0 - cfg.clip_low, hi = 1.0 + cfg.clip_high;
  double loss = 0, kl_sum = 0, ent_sum = 0, ratio_min = 0, ratio_max = 0;
  int64_t clipped = 0;
  bool first = true;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqLoss& q = seqs[s];
    const size_t n = q.logp.size();
    res.g_logp[s].resize(n);
    res.g_entropy[s].resize(n);
    if (n == 0) continue;
    // The aggregation weight of each of this sequence's tokens (see docs/training-loss.md §2).
    double denom = 0;
    switch (cfg.agg) {
      case LossAgg::kTokenMean:
        denom = double(tokens);
        break;
      case LossAgg::kSeqMeanTokenMean:
        denom = double(nonempty) * double(n);
        break;
      case LossAgg::kSeqMeanTokenSum:
        denom = double(nonempty);
        break;
    }
    const double A = q.advantage;
    double seq_sum = 0;
    for (size_t t = 0; t < n; ++t) {
      const double logp = q.logp[t];
      // NOTE: exp of the double difference: exactly 1.0 when logp == old_logp bitwise.
      const double r = std::exp(logp - double(q.old_logp[t]));
      LS_CHECK(std::isfinite(r), "policy_loss", "sequence ", s, " token ", t,
               ": ratio exp(logp - old_logp) overflows (logp ", q.logp[t], ", old_logp ",
               q.old_logp[t], ")");
      const double unclipped = r * A;
      const double clipped_obj = std::clamp(r, lo, hi) * A;
      double l = 0, dl = 0;
      if (unclipped <= clipped_obj) {  // the min picks the unclipped branch (ties included)
        l = -unclipped;
        dl = -A * r;
      } else {  // the clipped branch: constant in logp
        l = -clipped_obj;
        clipped += 1;
      }
      if (use_kl) {
        const double ref = q.ref_logp[t];
        double k = 0, dk = 0;
        if (cfg.kl == KlEstimator::kK1) {
          k = logp - ref;
          dk = 1.0;
        } else {
          const double e = std::exp(ref - logp);
          k = e - (ref - logp) - 1.0;
          dk = 1.0 - e;
        }
        LS_CHECK(std::isfinite(k), "policy_loss", "sequence ", s, " token ", t,
                 ": KL overflows (logp ", q.logp[t], ", ref_logp ", q.ref_logp[t], ")");
        kl_sum += k;
        l += cfg.kl_coef * k;
        dl += cfg.kl_coef * dk;
      }
      const double ent = q.entropy[t];
      ent_sum += ent;
      l -= cfg.entropy_coef * ent;
      seq_sum += l;
      res.g_logp[s][t] = float(dl / denom);
      res.g_entropy[s][t] = float(-cfg.entropy_coef / denom);
      if (first || r < ratio_min) ratio_min = r;
      if (first || r > ratio_max) ratio_max = r;
      first = false;
    }
    loss += cfg.agg == LossAgg::kSeqMeanTokenMean ? seq_sum / double(n) : seq_sum;
  }
  const double n_tokens = double(tokens);
  res.loss = loss / (cfg.agg == LossAgg::kTokenMean ? n_tokens : double(nonempty));
  res.ratio_min = ratio_min;
  res.ratio_max = ratio_max;
  res.clip_fraction = double(clipped) / n_tokens;
  res.kl = kl_sum / n_tokens;
  res.entropy_mean = ent_sum / n_tokens;
  return res;
}

}  // namespace lockstep::engine
