// Rollout engine and training forward on a tiny random-weight model: the recorded values do not
// depend on any engine choice (page size, token budget, batch limit, arrival order, prefix sharing,
// cascade, split-KV, TP, preemption), reruns are identical, the training side recomputes them bit
// for bit under any packing, sampling settings behave, and bad inputs are clear errors.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "dist/thread_transport.h"
#include "engine/rollout.h"
#include "engine/rollout_test_util.h"
#include "engine/trainer.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

using test_util::make_requests;
using test_util::same_completions;
using test_util::TinyModel;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

const TinyModel& tiny() {
  static TinyModel m;
  return m;
}

RolloutConfig reference_config() {
  RolloutConfig c;
  c.kv = KvCacheConfig{16, 256};
  c.scheduler.max_running = 1000;
  c.scheduler.max_batched_tokens = 100000;
  c.scheduler.prefix_sharing = false;
  return c;
}

// A random engine configuration; small pools sometimes (preemption).
RolloutConfig random_config(std::mt19937_64& g, const std::vector<RolloutRequest>& reqs) {
  RolloutConfig c;
  c.kv.page_size = std::vector<int64_t>{1, 3, 16, 5, 64}[g() % 5];
  int64_t need = 1;
  for (const auto& r : reqs)
    need = std::max(need, c.kv.pages_for(int64_t(r.prompt.size()) + r.max_new_tokens - 1));
  c.kv.num_pages = g() % 2 ? need + int64_t(g() % (2 * need)) : need * 40;
  c.scheduler.max_running = std::vector<int64_t>{1, 2, 5, 32}[g() % 4];
  c.scheduler.max_batched_tokens = std::vector<int64_t>{1, 3, 7, 20, 512}[g() % 5];
  c.scheduler.prefix_sharing = g() % 3 != 0;
  c.step.cascade = c.scheduler.prefix_sharing && g() % 2;
  c.step.kv_splits = int(1 + g() % 3);
  return c;
}

void shuffle_arrivals(std::mt19937_64& g, std::vector<RolloutRequest>* reqs) {
  const int64_t span = int64_t(g() % 3) * 8;
  for (auto& r : *reqs) r.arrival_step = span ? int64_t(g() % span) : 0;
}

TEST(Rollout, ConfigValidatesAndPrints) {
  RolloutConfig c;
  c.validate();
  EXPECT_EQ(c.to_string(),
            "kv: page_size=16 num_pages=256; scheduler: max_running=32 max_batched_tokens=256 "
            "prefix_sharing=on; step: kv_splits=1 cascade=off");
  c.scheduler.prefix_sharing = false;
  c.step.cascade = true;
  EXPECT_NE(error_of([&] { c.validate(); }).find("cascade attention needs prefix sharing"),
            std::string::npos);
}

// The heart of the engine's guarantee: any engine configuration, any TP, same records.
TEST(Rollout, RandomEngineConfigurationsRecordIdenticalBits) {
  auto g = test::rng(1);
  const auto reqs = make_requests(g, 5, 4, 40, 20, tiny().config().vocab_size);
  auto ref_model = tiny().make(1);
  const RolloutResult ref = run_rollout(*ref_model, reqs, reference_config());
  int64_t gen = 0;
  for (const auto& c : ref.completions) gen += int64_t(c.tokens.size());
  ASSERT_GT(gen, 20);
  std::unique_ptr<Model> models[3] = {tiny().make(1), tiny().make(2), tiny().make(4)};
  int64_t preemptions = 0, copies = 0, forks = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int tpi = int(g() % 3);
    RolloutConfig cfg = random_config(g, reqs);
    auto r2 = reqs;
    shuffle_arrivals(g, &r2);
    SCOPED_TRACE("tp=" + std::to_string(1 << tpi) + " " + cfg.to_string());
    const RolloutResult res = run_rollout(*models[tpi], r2, cfg);
    EXPECT_TRUE(same_completions(ref.completions, res.completions));
    preemptions += res.stats.preemptions;
    copies += res.stats.page_copies;
    forks += res.stats.forks;
  }
  std::printf("preemptions=%lld page_copies=%lld forks=%lld\n", (long long)preemptions,
              (long long)copies, (long long)forks);
}

TEST(Rollout, PreemptionRecomputesTheSameBits) {
  auto g = test::rng(2);
  const auto reqs = make_requests(g, 3, 4, 20, 24, tiny().config().vocab_size);
  auto model = tiny().make(2);
  const RolloutResult ref = run_rollout(*model, reqs, reference_config());
  RolloutConfig cfg;
  cfg.kv.page_size = 4;
  int64_t need = 1;
  for (const auto& r : reqs)
    need = std::max(need, cfg.kv.pages_for(int64_t(r.prompt.size()) + r.max_new_tokens - 1));
  // As few pages as the longest sequence needs: 12 running sequences must preempt (with two
  // spare pages some random workloads, whose sequences stop early, never ran out).
  cfg.kv.num_pages = need;
  cfg.scheduler.max_running = 12;
  cfg.scheduler.max_batched_tokens = 32;
  cfg.scheduler.prefix_sharing = true;
  cfg.step.cascade = true;
  cfg.step.kv_splits = 2;
  const RolloutResult res = run_rollout(*model, reqs, cfg);
  EXPECT_GT(res.stats.preemptions, 0) << res.stats.to_string();
  EXPECT_TRUE(same_completions(ref.completions, res.completions));
}

// Prompts longer than a KV chunk (64 in tiny_contract): cascade attention really reads whole
// chunks once per group, and the records are still those of the unshared reference.
TEST(Rollout, CascadeOverLongSharedPromptsRecordsIdenticalBits) {
  auto g = test::rng(8);
  auto reqs = make_requests(g, 3, 4, 10, 12, tiny().config().vocab_size);
  for (auto& r : reqs) {
    r.prompt.resize(size_t(100 + r.group * 23), int32_t(7 + r.group));
    r.stop_on_eos = false;
  }
  auto model = tiny().make(2);
  const RolloutResult ref = run_rollout(*model, reqs, reference_config());
  for (int64_t P : {1, 16, 64}) {
    RolloutConfig cfg;
    cfg.kv = KvCacheConfig{P, 4000 / P};
    cfg.scheduler.prefix_sharing = true;
    cfg.scheduler.max_batched_tokens = 50;
    cfg.step.cascade = true;
    cfg.step.kv_splits = 2;
    const RolloutResult res = run_rollout(*model, reqs, cfg);
    EXPECT_GT(res.cascade_rows, 0) << "P=" << P;
    EXPECT_TRUE(same_completions(ref.completions, res.completions)) << "P=" << P;
  }
}

// The rollout engine over rank-local models (one per rank, over the thread transport): every
// rank's scheduler takes the same decisions (the sampled ids are the same on every rank), its KV
// pool holds the rank's kv heads, and every rank records the single-model bits, with prefix
// sharing, cascade, split-KV and preemption.
TEST(Rollout, RankLocalModelsRecordTheSingleModelBits) {
  auto g = test::rng(9);
  const auto reqs = make_requests(g, 3, 4, 30, 16, tiny().config().vocab_size);
  const RolloutResult ref = run_rollout(*tiny().make(1), reqs, reference_config());
  for (int tp : {2, 4}) {
    RolloutConfig cfg = random_config(g, reqs);
    cfg.kv.num_pages = std::max<int64_t>(4, cfg.kv.num_pages / 3);  // some preemption
    int64_t need = 1;
    for (const auto& r : reqs)
      need = std::max(need, cfg.kv.pages_for(int64_t(r.prompt.size()) + r.max_new_tokens - 1));
    cfg.kv.num_pages = std::max(cfg.kv.num_pages, need);
    SCOPED_TRACE("tp=" + std::to_string(tp) + " " + cfg.to_string());
    std::vector<RolloutResult> got(static_cast<size_t>(tp));
    dist::run_ranks(tp, [&](dist::Communicator& comm) {
      auto m = tiny().make(tp, nullptr, test_util::tiny_contract(), &comm);
      got[size_t(comm.rank())] = run_rollout(*m, reqs, cfg);
    });
    for (int r = 0; r < tp; ++r)
      EXPECT_TRUE(same_completions(ref.completions, got[size_t(r)].completions)) << "rank " << r;
  }
}

TEST(Rollout, RerunIsIdentical) {
  auto g = test::rng(3);
  const auto reqs = make_requests(g, 3, 3, 16, 10, tiny().config().vocab_size);
  auto model = tiny().make(4);
  RolloutConfig cfg = random_config(g, reqs);
  EXPECT_TRUE(same_completions(run_rollout(*model, reqs, cfg).completions,
                               run_rollout(*model, reqs, cfg).completions));
}

TEST(Rollout, ThreadCountDoesNotMatter) {
  auto g = test::rng(4);
  const auto reqs = make_requests(g, 2, 3, 16, 8, tiny().config().vocab_size);
  auto model = tiny().make(2);
  const int saved = num_threads();
  set_num_threads(1);
  const RolloutResult a = run_rollout(*model, reqs, reference_config());
  set_num_threads(3);
  const RolloutResult b = run_rollout(*model, reqs, reference_config());
  set_num_threads(saved);
  EXPECT_TRUE(same_completions(a.completions, b.completions));
}

TEST(Rollout, SamplingSettingsBehave) {
  auto model = tiny().make(1);
  std::vector<int32_t> prompt = {5, 77, 123, 9, 250, 31};
  auto req = [&](int64_t id, SamplingParams sp) {
    RolloutRequest r;
    r.id = id;
    r.prompt = prompt;
    r.sampling = sp;
    r.max_new_tokens = 12;
    r.stop_on_eos = false;
    return r;
  };
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.seed = 1;
  SamplingParams greedy2 = greedy;
  greedy2.seed = 99;  // greedy ignores the seed
  SamplingParams topk1;
  topk1.temperature = 1.0f;
  topk1.top_k = 1;
  SamplingParams hot;
  hot.temperature = 1.5f;
  hot.seed = 5;
  const RolloutResult r = run_rollout(
      *model, {req(0, greedy), req(1, greedy2), req(2, topk1), req(3, hot), req(4, hot)},
      reference_config());
  const auto& c = r.completions;
  EXPECT_EQ(c[0].tokens, c[1].tokens);
  EXPECT_TRUE(test::bitwise_equal(c[0].logp, c[1].logp));
  // top_k = 1 at temperature 1 picks the argmax, and records logp at temperature 1 like greedy.
  EXPECT_EQ(c[0].tokens, c[2].tokens);
  EXPECT_TRUE(test::bitwise_equal(c[0].logp, c[2].logp));
  // Same settings, different request ids: different noise, so (almost surely) other tokens.
  EXPECT_NE(c[3].tokens, c[4].tokens);
  for (const auto& x : c) {
    EXPECT_EQ(x.tokens.size(), 12u);
    EXPECT_EQ(x.finish, FinishReason::kLength);
    for (size_t j = 0; j < x.logp.size(); ++j) {
      EXPECT_LE(x.logp[j], 0.0f);
      EXPECT_GE(x.entropy[j], 0.0f);
    }
  }
}

TEST(Rollout, StopOnEos) {
  auto g = test::rng(5);
  auto reqs = make_requests(g, 6, 2, 10, 40, tiny().config().vocab_size);
  const auto& eos = tiny().config().eos_token_ids;
  auto is_eos = [&](int32_t t) { return std::find(eos.begin(), eos.end(), t) != eos.end(); };
  auto model = tiny().make(1);
  for (bool stop : {true, false}) {
    for (auto& r : reqs) {
      r.stop_on_eos = stop;
      r.max_new_tokens = 40;
      r.sampling.temperature = 1.0f;
    }
    const RolloutResult res = run_rollout(*model, reqs, reference_config());
    int64_t stopped = 0, eos_inside = 0;
    for (const auto& c : res.completions) {
      for (size_t j = 0; j + 1 < c.tokens.size(); ++j) eos_inside += is_eos(c.tokens[j]);
      if (c.finish == FinishReason::kStop) {
        ++stopped;
        EXPECT_TRUE(is_eos(c.tokens.back()));
      } else {
        EXPECT_EQ(c.tokens.size(), 40u);
      }
    }
    if (stop) {
      EXPECT_GT(stopped, 0);
      EXPECT_EQ(eos_inside, 0);
    } else {
      EXPECT_EQ(stopped, 0);
      EXPECT_GT(eos_inside, 0);
    }
  }
}

TEST(Rollout, BadInputsAreClearErrors) {
  auto model = tiny().make(1);
  RolloutRequest ok;
  ok.prompt = {1, 2, 3};
  ok.max_new_tokens = 4;
  auto run1 = [&](std::vector<RolloutRequest> reqs, RolloutConfig cfg = reference_config()) {
    return error_of([&] { run_rollout(*model, reqs, cfg); });
  };
  RolloutRequest r = ok;
  r.prompt = {1, 300, 3};
  EXPECT_NE(run1({r}).find("prompt token 1 = 300 is outside the vocab [0, 300)"),
            std::string::npos);
  r.prompt = {-1};
  EXPECT_NE(run1({r}).find("outside the vocab"), std::string::npos);
  r = ok;
  r.prompt.assign(250, 7);
  r.max_new_tokens = 7;
  EXPECT_NE(run1({r}).find("prompt of 250 tokens + 7 new tokens exceeds the model's context of "
                           "256 positions"),
            std::string::npos);
  r = ok;
  r.prompt.clear();
  EXPECT_NE(run1({r}).find("empty prompt"), std::string::npos);
  r = ok;
  r.max_new_tokens = 0;
  EXPECT_NE(run1({r}).find("max_new_tokens"), std::string::npos);
  r = ok;
  r.sampling.temperature = -1.0f;
  EXPECT_NE(run1({r}).find("request 0"), std::string::npos);
  r = ok;
  r.sampling.top_p = 0.0f;
  EXPECT_NE(run1({r}).find("top_p"), std::string::npos);
  EXPECT_NE(run1({ok, ok}).find("appears twice"), std::string::npos);
  RolloutConfig small = reference_config();
  small.kv = KvCacheConfig{2, 2};
  EXPECT_NE(run1({ok}, small).find("needs 3 KV pages of 2 keys but the pool has only 2"),
            std::string::npos);
  RolloutConfig bad = reference_config();
  bad.step.kv_splits = 0;
  EXPECT_NE(run1({ok}, bad).find("kv_splits"), std::string::npos);
}

TEST(Packing, EverySequenceOnceWithinTheBudget) {
  auto g = test::rng(6);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> lengths(1 + g() % 40);
    for (auto& l : lengths) l = 1 + int64_t(g() % 60);
    PackingConfig pc;
    pc.micro_batch_tokens = 1 + int64_t(g() % 150);
    pc.seed = g() % 3 == 0 ? 0 : g();
    const auto batches = pack_sequences(lengths, pc);
    std::vector<size_t> seen;
    for (const auto& b : batches) {
      ASSERT_FALSE(b.empty());
      int64_t sum = 0;
      for (size_t i : b) sum += lengths[i];
      if (b.size() > 1) {
        EXPECT_LE(sum, pc.micro_batch_tokens);
      }
      seen.insert(seen.end(), b.begin(), b.end());
    }
    if (pc.seed == 0) {
      EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
    }
    std::sort(seen.begin(), seen.end());
    std::vector<size_t> all(lengths.size());
    std::iota(all.begin(), all.end(), size_t(0));
    EXPECT_EQ(seen, all);
  }
  PackingConfig a, b;
  a.seed = 1;
  b.seed = 2;
  std::vector<int64_t> lengths(30, 5);
  EXPECT_NE(pack_sequences(lengths, a), pack_sequences(lengths, b));
  EXPECT_EQ(pack_sequences(lengths, a), pack_sequences(lengths, a));
  PackingConfig bad;
  bad.micro_batch_tokens = 0;
  EXPECT_NE(error_of([&] { pack_sequences(lengths, bad); }).find("micro_batch_tokens"),
            std::string::npos);
}

// Rollout records == training recompute, for any packing and TP; and packing never changes bits.
TEST(Training, RecomputesTheRolloutBitsUnderAnyPacking) {
  auto g = test::rng(7);
  const auto reqs = make_requests(g, 4, 3, 30, 12, tiny().config().vocab_size);
  auto rmodel = tiny().make(2);
  const RolloutResult roll = run_rollout(*rmodel, reqs, reference_config());
  const auto seqs = train_sequences(roll);
  std::unique_ptr<Model> models[3] = {tiny().make(1), tiny().make(2), tiny().make(4)};
  for (int trial = 0; trial < 20; ++trial) {
    PackingConfig pc;
    pc.micro_batch_tokens = std::vector<int64_t>{1, 17, 64, 100000}[g() % 4];
    pc.seed = g() % 2 ? g() : 0;
    const int tpi = int(g() % 3);
    SCOPED_TRACE("tp=" + std::to_string(1 << tpi) + " " + pc.to_string());
    const TrainResult tr = run_training_forward(*models[tpi], seqs, pc);
    ASSERT_EQ(tr.sequences.size(), roll.completions.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      EXPECT_TRUE(test::bitwise_equal(roll.completions[i].logp, tr.sequences[i].logp)) << i;
      EXPECT_TRUE(test::bitwise_equal(roll.completions[i].lse, tr.sequences[i].lse)) << i;
      EXPECT_TRUE(test::bitwise_equal(roll.completions[i].entropy, tr.sequences[i].entropy)) << i;
    }
    if (pc.micro_batch_tokens == 1) {
      EXPECT_EQ(tr.micro_batches, int64_t(seqs.size()));
    }
  }
}

TEST(Training, BadInputsAreClearErrors) {
  auto model = tiny().make(1);
  TrainSequence ok;
  ok.prompt = {1, 2};
  ok.completion = {3, 4};
  auto run1 = [&](TrainSequence s) {
    return error_of([&] { run_training_forward(*model, {s}, PackingConfig{}); });
  };
  TrainSequence s = ok;
  s.completion = {3, 1000};
  EXPECT_NE(run1(s).find("token 1000 is outside the vocab [0, 300)"), std::string::npos);
  s = ok;
  s.completion.clear();
  EXPECT_NE(run1(s).find("empty completion"), std::string::npos);
  s = ok;
  s.prompt.assign(255, 1);
  EXPECT_NE(run1(s).find("257 tokens exceed the model's context of 256"), std::string::npos);
  s = ok;
  s.temperature = 0.0f;
  EXPECT_NE(run1(s).find("temperature"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::engine
