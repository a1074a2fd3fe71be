// Continuous-batching scheduler, driven by a fake model: tokens come from a hash of (request,
// position, prefix), and the "KV cache" stores, per slot, a hash of the sequence prefix that
// produced it. So the tests check, without any arithmetic, that every position a step reads holds
// the right sequence's key (page tables, forks, copy-on-write, preemption/recompute), that limits
// are respected, that every request finishes, and that the generated tokens do not depend on the
// scheduling configuration.
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

// Hash of tokens[0..=j] (what the key at position j depends on).
std::vector<uint64_t> prefix_tags(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> t(tokens.size());
  uint64_t h = 1;
  for (size_t j = 0; j < tokens.size(); ++j) t[j] = h = mix(h, uint64_t(tokens[j]));
  return t;
}

constexpr int32_t kVocab = 50;
constexpr int32_t kEos = 7;

// The fake "sample": depends on the request, the position and the whole prefix.
int32_t fake_token(int64_t request, int64_t position, uint64_t prefix_tag) {
  return int32_t(mix(mix(prefix_tag, uint64_t(request)), uint64_t(position)) % kVocab);
}

struct Workload {
  std::vector<SeqSpec> specs;
};

// P prompts x G samples (request id = prompt * G + g), group = prompt.
Workload make_workload(int prompts, int G, std::mt19937_64& g, int max_prompt, int max_new,
                       int arrival_span, bool stop_on_eos) {
  Workload w;
  for (int p = 0; p < prompts; ++p) {
    std::vector<int32_t> prompt(1 + g() % max_prompt);
    for (auto& t : prompt) t = int32_t(g() % kVocab);
    for (int s = 0; s < G; ++s) {
      SeqSpec sp;
      sp.id = p * G + s;
      sp.prompt = prompt;
      sp.max_new_tokens = 1 + int64_t(g() % max_new);
      if (stop_on_eos) sp.stop_ids = {kEos};
      sp.arrival_step = arrival_span ? int64_t(g() % arrival_span) : 0;
      sp.group = p;
      w.specs.push_back(sp);
    }
  }
  return w;
}

struct RunResult {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, FinishReason> finish;
  SchedulerStats stats;
};

RunResult run(const Workload& w, const SchedulerConfig& sc, const KvCacheConfig& kc) {
  Scheduler s(sc, kc, w.specs);
  std::vector<uint64_t> cache(size_t(kc.num_pages * kc.page_size), 0);
  auto slot = [&](int64_t seq, int64_t j) {
    const auto& table = s.kv().block_table(seq);
    EXPECT_LT(j / kc.page_size, int64_t(table.size()));
    return size_t(table[size_t(j / kc.page_size)] * kc.page_size + j % kc.page_size);
  };
  int64_t guard = 0;
  while (!s.done()) {
    StepPlan plan = s.schedule();
    EXPECT_LE(plan.num_tokens, sc.max_batched_tokens);
    EXPECT_LE(int64_t(plan.seqs.size()), sc.max_running);
    EXPECT_LE(s.num_running(), sc.max_running);
    EXPECT_GE(plan.num_tokens, 1);
    s.kv().check_invariants();
    // Page copies first, in order; then every scheduled token writes its key.
    for (const PageCopy& c : plan.copies)
      for (int64_t i = 0; i < c.slots; ++i)
        cache[size_t(c.dst * kc.page_size + i)] = cache[size_t(c.src * kc.page_size + i)];
    for (const ScheduledSeq& ss : plan.seqs) {
      const auto tags = prefix_tags(s.tokens(ss.seq));
      EXPECT_EQ(s.kv().length(ss.seq), ss.start + ss.count);
      for (int64_t j = ss.start; j < ss.start + ss.count; ++j) cache[slot(ss.seq, j)] = tags[j];
    }
    // Then every scheduled sequence reads all its keys: each must be its own prefix's.
    std::vector<int32_t> sampled;
    for (const ScheduledSeq& ss : plan.seqs) {
      const auto& toks = s.tokens(ss.seq);
      const auto tags = prefix_tags(toks);
      for (int64_t j = 0; j < ss.start + ss.count; ++j) {
        if (cache[slot(ss.seq, j)] != tags[j]) {
          ADD_FAILURE() << "request " << ss.seq << " position " << j << " step " << plan.step
                        << " reads another sequence's key";
          return RunResult{};
        }
      }
      if (!ss.sample) continue;
      const int64_t pos = ss.start + ss.count;
      EXPECT_EQ(pos, int64_t(toks.size()));
      sampled.push_back(fake_token(ss.seq, pos, tags[size_t(pos - 1)]));
      for (int64_t m : ss.forks) {
        EXPECT_EQ(s.tokens(m), s.spec(m).prompt);  // not started
        sampled.push_back(fake_token(m, pos, tags[size_t(pos - 1)]));
      }
    }
    s.complete(plan, sampled);
    if (++guard > 100000) {
      ADD_FAILURE() << "scheduler does not terminate";
      break;
    }
  }
  EXPECT_EQ(s.kv().num_free_pages(), kc.num_pages);
  EXPECT_EQ(s.kv().num_sequences(), 0);
  RunResult r;
  for (const SeqSpec& sp : w.specs) {
    r.tokens[sp.id] = s.tokens(sp.id);
    r.finish[sp.id] = s.finish_reason(sp.id);
  }
  r.stats = s.stats();
  return r;
}

// The reference: every request alone, one token per step, plenty of memory.
std::map<int64_t, std::vector<int32_t>> reference(const Workload& w) {
  std::map<int64_t, std::vector<int32_t>> out;
  for (const SeqSpec& sp : w.specs) {
    std::vector<int32_t> t = sp.prompt;
    for (int64_t i = 0; i < sp.max_new_tokens; ++i) {
      const auto tags = prefix_tags(t);
      const int32_t tok = fake_token(sp.id, int64_t(t.size()), tags.back());
      t.push_back(tok);
      if (std::find(sp.stop_ids.begin(), sp.stop_ids.end(), tok) != sp.stop_ids.end()) break;
    }
    out[sp.id] = t;
  }
  return out;
}

void check_finish(const Workload& w, const RunResult& r) {
  for (const SeqSpec& sp : w.specs) {
    const auto& t = r.tokens.at(sp.id);
    const int64_t gen = int64_t(t.size() - sp.prompt.size());
    ASSERT_GE(gen, 1);
    if (r.finish.at(sp.id) == FinishReason::kStop) {
      EXPECT_EQ(t.back(), kEos);
      EXPECT_LE(gen, sp.max_new_tokens);
    } else {
      EXPECT_EQ(r.finish.at(sp.id), FinishReason::kLength);
      EXPECT_EQ(gen, sp.max_new_tokens);
    }
  }
}

TEST(Scheduler, ConfigValidatesAndPrints) {
  SchedulerConfig c;
  c.validate();
  EXPECT_EQ(c.to_string(), "scheduler: max_running=32 max_batched_tokens=256 prefix_sharing=on");
  c.max_running = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("max_running"), std::string::npos);
  c.max_running = 1;
  c.max_batched_tokens = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("max_batched_tokens"), std::string::npos);
}

TEST(Scheduler, SingleRequestChunkedPrefillThenDecodes) {
  SeqSpec sp;
  sp.id = 3;
  sp.prompt = {1, 2, 3, 4, 5, 6, 8, 9, 10, 11};
  sp.max_new_tokens = 4;
  SchedulerConfig sc;
  sc.max_batched_tokens = 4;
  Scheduler s(sc, KvCacheConfig{3, 10}, {sp});
  std::vector<int64_t> counts;
  while (!s.done()) {
    StepPlan p = s.schedule();
    ASSERT_EQ(p.seqs.size(), 1u);
    counts.push_back(p.seqs[0].count);
    std::vector<int32_t> tok;
    if (p.seqs[0].sample) tok.push_back(20);
    s.complete(p, tok);
  }
  // 10 prompt tokens in chunks of 4, 4, 2 (the last one samples), then 3 decodes.
  EXPECT_EQ(counts, (std::vector<int64_t>{4, 4, 2, 1, 1, 1}));
  EXPECT_EQ(s.num_generated(3), 4);
  EXPECT_EQ(s.finish_reason(3), FinishReason::kLength);
  EXPECT_EQ(s.stats().prefill_tokens, 9);
}

TEST(Scheduler, StopTokenEndsASequence) {
  SeqSpec sp;
  sp.prompt = {1};
  sp.max_new_tokens = 10;
  sp.stop_ids = {kEos};
  Scheduler s(SchedulerConfig{}, KvCacheConfig{4, 4}, {sp});
  StepPlan p = s.schedule();
  s.complete(p, std::vector<int32_t>{5});
  p = s.schedule();
  s.complete(p, std::vector<int32_t>{kEos});
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.finish_reason(0), FinishReason::kStop);
  EXPECT_EQ(s.tokens(0), (std::vector<int32_t>{1, 5, kEos}));
}

TEST(Scheduler, GroupPrefillsOnceAndForks) {
  std::vector<SeqSpec> specs;
  for (int i = 0; i < 4; ++i) {
    SeqSpec sp;
    sp.id = 10 + i;
    sp.prompt = {1, 2, 3, 4, 5};
    sp.max_new_tokens = 3;
    sp.group = 0;
    specs.push_back(sp);
  }
  Scheduler s(SchedulerConfig{}, KvCacheConfig{2, 32}, specs);
  StepPlan p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);  // only the leader prefills
  EXPECT_EQ(p.seqs[0].seq, 10);
  EXPECT_EQ(p.seqs[0].count, 5);
  EXPECT_EQ(p.seqs[0].forks, (std::vector<int64_t>{11, 12, 13}));
  EXPECT_EQ(p.num_samples(), 4);
  s.complete(p, std::vector<int32_t>{20, 21, 22, 23});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.tokens(10 + i).back(), 20 + i);
  EXPECT_EQ(s.kv().refcount(s.kv().block_table(10)[0]), 4);
  // Next step: 4 decodes at position 5, inside the shared partial page -> 3 or 4 copies.
  p = s.schedule();
  EXPECT_EQ(p.seqs.size(), 4u);
  EXPECT_EQ(p.num_tokens, 4);
  EXPECT_EQ(p.copies.size(), 3u);  // the last writer owns the original page
  s.kv().check_invariants();
}

TEST(Scheduler, BadRequestsAreClearErrors) {
  SeqSpec ok;
  ok.prompt = {1, 2};
  ok.max_new_tokens = 2;
  auto make = [&](std::vector<SeqSpec> v, KvCacheConfig kc = KvCacheConfig{4, 4}) {
    return error_of([&] { Scheduler s(SchedulerConfig{}, kc, v); });
  };
  SeqSpec dup = ok;
  EXPECT_NE(make({ok, dup}).find("appears twice"), std::string::npos);
  SeqSpec empty = ok;
  empty.prompt.clear();
  EXPECT_NE(make({empty}).find("empty prompt"), std::string::npos);
  SeqSpec zero = ok;
  zero.max_new_tokens = 0;
  EXPECT_NE(make({zero}).find("max_new_tokens"), std::string::npos);
  SeqSpec big = ok;
  big.max_new_tokens = 20;
  EXPECT_NE(make({big}).find("needs 6 KV pages"), std::string::npos);
  SeqSpec a = ok, b = ok;
  a.group = b.group = 1;
  b.id = 1;
  b.prompt = {1, 3};
  EXPECT_NE(make({a, b}).find("different prompts"), std::string::npos);
  SeqSpec neg = ok;
  neg.id = -2;
  EXPECT_NE(make({neg}).find("id must be >= 0"), std::string::npos);
}

TEST(Scheduler, MisuseIsAnError) {
  SeqSpec sp;
  sp.prompt = {1};
  Scheduler s(SchedulerConfig{}, KvCacheConfig{4, 4}, {sp});
  StepPlan p = s.schedule();
  EXPECT_NE(error_of([&] { s.schedule(); }).find("twice"), std::string::npos);
  EXPECT_NE(error_of([&] { s.complete(p, {}); }).find("sample rows"), std::string::npos);
  s.complete(p, std::vector<int32_t>{1});
  EXPECT_NE(error_of([&] { s.schedule(); }).find("finished"), std::string::npos);
}

// The main property: many random configurations, every key read is the right one, limits hold,
// every request finishes, and the generated tokens equal the one-at-a-time reference.
TEST(Scheduler, RandomConfigurationsGiveTheReferenceTokens) {
  auto g = test::rng(21);
  int64_t preemptions = 0, drops = 0, forks = 0, copies = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int prompts = 1 + int(g() % 6), G = 1 + int(g() % 5);
    const bool eos = g() % 2;
    Workload w = make_workload(prompts, G, g, 20, 12, int(g() % 3) * 10, eos);
    SchedulerConfig sc;
    sc.max_running = 1 + int64_t(g() % 12);
    sc.max_batched_tokens = 1 + int64_t(g() % 40);
    sc.prefix_sharing = g() % 4 != 0;
    const int64_t P = std::vector<int64_t>{1, 2, 3, 4, 16}[g() % 5];
    int64_t need = 1;
    for (const SeqSpec& sp : w.specs)
      need = std::max(need, (int64_t(sp.prompt.size()) + sp.max_new_tokens - 1 + P - 1) / P);
    KvCacheConfig kc{P, need + int64_t(g() % (3 * need + 1))};  // sometimes barely fits
    SCOPED_TRACE(sc.to_string() + " " + kc.to_string() + " prompts=" + std::to_string(prompts) +
                 " G=" + std::to_string(G));
    RunResult r = run(w, sc, kc);
    if (HasFailure()) return;
    check_finish(w, r);
    EXPECT_EQ(r.tokens, reference(w));
    preemptions += r.stats.preemptions;
    drops += r.stats.kv_drops;
    forks += r.stats.forks;
    copies += r.stats.page_copies;
  }
  // The trials must have exercised the interesting paths.
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(forks, 0);
  EXPECT_GT(copies, 0);
  std::printf("preemptions=%lld kv_drops=%lld forks=%lld page_copies=%lld\n",
              (long long)preemptions, (long long)drops, (long long)forks, (long long)copies);
}

TEST(Scheduler, TinyPoolPreemptsAndStillFinishes) {
  auto g = test::rng(33);
  Workload w = make_workload(4, 4, g, 12, 16, 0, false);
  SchedulerConfig sc;
  sc.max_running = 16;
  sc.max_batched_tokens = 64;
  KvCacheConfig kc{2, 14};  // the longest sequence needs at most 14 pages
  RunResult r = run(w, sc, kc);
  check_finish(w, r);
  EXPECT_EQ(r.tokens, reference(w));
  EXPECT_GT(r.stats.preemptions, 0);
  std::printf("%s\n", r.stats.to_string().c_str());
}

TEST(Scheduler, BudgetsAndLimitsShapeTheBatches) {
  auto g = test::rng(44);
  Workload w = make_workload(6, 2, g, 30, 10, 0, false);
  SchedulerConfig sc;
  sc.max_running = 3;
  sc.max_batched_tokens = 7;
  sc.prefix_sharing = false;
  RunResult r = run(w, sc, KvCacheConfig{4, 200});
  EXPECT_EQ(r.stats.max_step_tokens, 7);
  EXPECT_EQ(r.stats.max_step_seqs, 3);
  EXPECT_EQ(r.stats.preemptions, 0);
  EXPECT_EQ(r.tokens, reference(w));
}

TEST(Scheduler, StaggeredArrivalsWaitForTheirStep) {
  SeqSpec a, b;
  a.id = 0;
  a.prompt = {1, 2};
  a.max_new_tokens = 2;
  b = a;
  b.id = 1;
  b.arrival_step = 5;
  Scheduler s(SchedulerConfig{}, KvCacheConfig{4, 8}, {b, a});
  std::vector<std::pair<int64_t, int64_t>> seen;  // (step, seq)
  while (!s.done()) {
    StepPlan p = s.schedule();
    std::vector<int32_t> tok;
    for (const auto& ss : p.seqs) {
      seen.push_back({p.step, ss.seq});
      if (ss.sample) tok.push_back(3);
    }
    s.complete(p, tok);
  }
  // a runs at steps 0, 1; nothing happens at 2..4; b at 5, 6.
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 0}, {5, 1}, {6, 1}}));
}

}  // namespace
}  // namespace lockstep::engine
