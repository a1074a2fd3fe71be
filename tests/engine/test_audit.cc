// `lockstep audit` on a tiny random-weight model: zero mismatches on many random rollout/training
// configuration pairs (TP pairs, page sizes, budgets, batch limits, sharing, preemption), identical
// reruns, a perturbed backend is caught and localized to the right op, the reports carry what they
// must. The command line's flags are tested in test_cli.cc.
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dist/thread_transport.h"
#include "engine/audit.h"
#include "engine/rollout_test_util.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

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

ModelFactory factory(const ContractConfig& contract) {
  return [contract](int tp, std::shared_ptr<OpsBackend> b, dist::Communicator* comm) {
    return tiny().make(tp, std::move(b), contract, comm);
  };
}

std::shared_ptr<OpsBackend> invariant() {
  return std::shared_ptr<OpsBackend>(make_invariant_backend());
}

// A small audit: a few prompts, short completions.
AuditConfig small_config() {
  AuditConfig c;
  c.prompts = 4;
  c.group_size = 3;
  c.prompt_len_min = 3;
  c.prompt_len_max = 30;
  c.max_new_tokens = 10;
  c.rollout.kv.num_pages = 0;
  c.contract = test_util::tiny_contract();
  return c;
}

AuditSide run(const AuditConfig& c, std::shared_ptr<OpsBackend> b = nullptr) {
  AuditConfig r = c;
  if (r.rollout.kv.num_pages == 0) r.rollout.kv.num_pages = audit_auto_kv_pages(r);
  return run_audit_side(r, factory(r.contract), b ? b : invariant());
}

// The rollout and / or the training forward run rank-locally (one model per rank, on threads, over
// the thread transport): zero mismatches, with prefix sharing, cascade and preemption.
TEST(Audit, RankLocalSidesOnThreadsHaveZeroMismatches) {
  for (auto [rtp, ttp] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{4, 2}, std::pair{1, 4}}) {
    AuditConfig c = small_config();
    c.prompts = 3;
    c.group_size = 3;
    c.prompt_len_min = 20;
    c.prompt_len_max = 90;
    c.max_new_tokens = 12;
    c.rollout_tp = rtp;
    c.train_tp = ttp;
    c.rollout_ranks = rtp > 1 ? RankMode::kThreads : RankMode::kSimulated;
    c.train_ranks = ttp > 1 ? RankMode::kThreads : RankMode::kSimulated;
    c.rollout.scheduler.prefix_sharing = true;
    c.rollout.step.cascade = true;
    c.rollout.step.kv_splits = 2;
    c.rollout.kv.page_size = 3;
    c.rollout.kv.num_pages = c.rollout.kv.pages_for(c.prompt_len_max + c.max_new_tokens) + 4;
    SCOPED_TRACE(c.rollout_string() + " | training " + c.training_string());
    EXPECT_EQ(c.rollout_string().find("rank-local models on threads") != std::string::npos,
              rtp > 1);
    EXPECT_EQ(c.training_string().find("rank-local models on threads") != std::string::npos,
              ttp > 1);
    const AuditSide s = run(c);
    EXPECT_GT(s.tokens_compared, 0);
    EXPECT_EQ(s.mismatches, 0);
    EXPECT_EQ(s.entropy_mismatches, 0);
    EXPECT_FALSE(s.first.has_value());
    EXPECT_GT(s.rollout_stats.preemptions, 0) << "the tight pool did not preempt";
  }
  AuditConfig one = small_config();
  one.rollout_tp = 1;
  one.rollout_ranks = RankMode::kThreads;
  EXPECT_NE(
      error_of([&] { one.validate(); }).find("--rollout-ranks threads needs --rollout-tp > 1"),
      std::string::npos);
  one.rollout_ranks = RankMode::kSimulated;
  one.train_tp = 1;
  one.train_ranks = RankMode::kThreads;
  EXPECT_NE(error_of([&] { one.validate(); }).find("--train-ranks threads needs --train-tp > 1"),
            std::string::npos);
}

// A job's communicator that counts the collectives made over it.
class CountingCommunicator : public dist::Communicator {
 public:
  explicit CountingCommunicator(dist::Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  const dist::CommOptions& options() const override { return c_.options(); }
  void all_gather(const TensorView& send, const TensorView& recv) override {
    ++calls;
    c_.all_gather(send, recv);
  }
  void broadcast(const TensorView& buf, int root) override {
    ++calls;
    c_.broadcast(buf, root);
  }
  void barrier() override {
    ++calls;
    c_.barrier();
  }
  int64_t calls = 0;

 private:
  dist::Communicator& c_;
};

// A side run as one rank of a launched job (RankMode::kLaunch): every rank of the job calls
// run_audit_side with its communicator. The engine does not care which transport the job is on
// (the command line's is the process transport, tests/engine/test_cli.cc Launch.*); here the
// ranks are threads. Every rank returns the simulated run's records, bit for bit (by their sha256,
// whose inputs are the records' fp32 bit patterns), and the same comparison.
TEST(Audit, LaunchedSidesGiveTheSimulatedBitsOnEveryRank) {
  for (auto [rollout, train] : {std::pair{RankMode::kLaunch, RankMode::kSimulated},
                                std::pair{RankMode::kSimulated, RankMode::kLaunch},
                                std::pair{RankMode::kLaunch, RankMode::kLaunch}}) {
    AuditConfig c = small_config();
    c.rollout_tp = 2;
    c.train_tp = 2;
    c.rollout.kv.num_pages = audit_auto_kv_pages(c);
    const AuditSide sim = run(c);
    c.rollout_ranks = rollout;
    c.train_ranks = train;
    SCOPED_TRACE(c.rollout_string() + " | training " + c.training_string());
    std::vector<AuditSide> sides(2);
    std::vector<int64_t> calls(2);
    dist::run_ranks(2, [&](dist::Communicator& c2) {
      CountingCommunicator job(c2);
      sides[size_t(job.rank())] = run_audit_side(c, factory(c.contract), invariant(), {}, &job);
      calls[size_t(job.rank())] = job.calls;
    });
    EXPECT_EQ(sim.rollout_sha256.size(), 64u);
    // The launched sides' models exchanged their parts over the job: more collectives than the
    // one digest check per launched side.
    EXPECT_GT(calls[0], 2);
    EXPECT_EQ(calls[0], calls[1]);
    for (const AuditSide& s : sides) {
      EXPECT_EQ(s.rollout_sha256, sim.rollout_sha256);
      EXPECT_EQ(s.train_sha256, sim.train_sha256);
      EXPECT_EQ(s.tokens_compared, sim.tokens_compared);
      EXPECT_GT(s.tokens_compared, 0);
      EXPECT_EQ(s.mismatches, 0);
      EXPECT_EQ(s.entropy_mismatches, 0);
    }
  }
  // The job must be there, of the side's TP degree.
  AuditConfig c = small_config();
  c.rollout.kv.num_pages = audit_auto_kv_pages(c);
  c.rollout_ranks = RankMode::kLaunch;  // rollout_tp 2
  EXPECT_NE(error_of([&] {
              run_audit_side(c, factory(c.contract), invariant());
            }).find("--rollout-ranks launch: this process is not a rank of a job"),
            std::string::npos);
  c.rollout_ranks = RankMode::kSimulated;
  c.train_tp = 2;
  c.train_ranks = RankMode::kLaunch;
  std::vector<std::string> errors(4);
  dist::run_ranks(4, [&](dist::Communicator& job) {
    errors[size_t(job.rank())] =
        error_of([&] { run_audit_side(c, factory(c.contract), invariant(), {}, &job); });
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("--train-ranks launch: the job has 4 ranks, but --train-tp is 2"),
              std::string::npos)
        << e;
  c.rollout_ranks = RankMode::kLaunch;
  c.train_tp = 4;
  EXPECT_NE(error_of([&] { c.validate(); })
                .find("--rollout-ranks launch and --train-ranks launch run both sides on the ranks "
                      "of one job: they need --rollout-tp == --train-tp, got 2 and 4"),
            std::string::npos);
  c.rollout_tp = 1;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--rollout-ranks launch needs --rollout-tp > 1"),
            std::string::npos);
}

// How a launched job's ranks check that they agree: one all_gather of their digests; a rank that
// differs fails every rank with the same message, naming it.
TEST(Audit, LaunchedRanksCheckTheirDigestsAgree) {
  const std::string a(64, 'a'), b(64, 'b');
  dist::run_ranks(
      3, [&](dist::Communicator& job) { check_same_sha256_on_every_rank(job, a, "the records"); });
  std::vector<std::string> errors(3);
  dist::run_ranks(3, [&](dist::Communicator& job) {
    errors[size_t(job.rank())] = error_of(
        [&] { check_same_sha256_on_every_rank(job, job.rank() == 2 ? b : a, "the records"); });
  });
  for (const std::string& e : errors)
    EXPECT_EQ(e,
              "the records: the ranks of the job disagree (rank-local models must compute the "
              "same bits on every rank): ranks [2] differ from rank 0 (sha256 " +
                  a + ")");
  EXPECT_NE(error_of([&] {
              dist::run_ranks(2, [&](dist::Communicator& job) {
                check_same_sha256_on_every_rank(job, "abc", "the records");
              });
            }).find("the records: expected a sha256 of 64 hex digits, got 'abc'"),
            std::string::npos);
}

TEST(Audit, RandomConfigurationsHaveZeroMismatches) {
  auto g = test::rng(1);
  const std::pair<int, int> tp_pairs[] = {{1, 2}, {2, 1}, {4, 1}, {1, 4}, {2, 4}, {1, 1}};
  int64_t compared = 0, preemptions = 0, cascade_rows = 0;
  for (int trial = 0; trial < 80; ++trial) {
    AuditConfig c = small_config();
    c.seed = g();
    c.prompts = 1 + int64_t(g() % 5);
    c.group_size = 1 + int64_t(g() % 6);
    c.max_new_tokens = 1 + int64_t(g() % 24);
    c.prompt_len_max = std::vector<int64_t>{3, 30, 150}[g() % 3];
    c.prompt_len_min = 1 + int64_t(g() % uint64_t(c.prompt_len_max));
    c.mixed_sampling = g() % 4 != 0;
    c.stop_on_eos = g() % 2;
    std::tie(c.rollout_tp, c.train_tp) = tp_pairs[g() % 6];
    c.rollout.kv.page_size = std::vector<int64_t>{1, 3, 16}[g() % 3];
    c.rollout.scheduler.max_running = std::vector<int64_t>{1, 2, 7, 64}[g() % 4];
    c.rollout.scheduler.max_batched_tokens = std::vector<int64_t>{1, 5, 16, 256}[g() % 4];
    c.rollout.scheduler.prefix_sharing = g() % 3 != 0;
    c.rollout.step.cascade = c.rollout.scheduler.prefix_sharing && g() % 2;
    c.rollout.step.kv_splits = int(1 + g() % 3);
    c.arrival_seed = g() % 4;
    c.arrival_stagger = int64_t(g() % 4);
    c.packing.micro_batch_tokens = std::vector<int64_t>{1, 40, 100, 4096}[g() % 4];
    c.packing.seed = g() % 3;
    if (g() % 3 == 0) {  // a pool that barely holds the longest sequence: preemption
      c.rollout.kv.num_pages =
          c.rollout.kv.pages_for(c.prompt_len_max + c.max_new_tokens) + int64_t(g() % 3);
    }
    // NOTE: the first two trials are pinned so that every seed covers cascade attention (shared
    // prompts longer than a KV chunk, groups decoding together) and preemption (a tight pool);
    // the random draws above still advance the generator identically.
    if (trial == 0) {
      c.prompts = 2;
      c.group_size = 4;
      c.prompt_len_min = c.prompt_len_max = 150;
      c.max_new_tokens = 8;
      c.stop_on_eos = false;
      c.rollout.scheduler.max_running = 64;
      c.rollout.scheduler.max_batched_tokens = 256;
      c.rollout.scheduler.prefix_sharing = true;
      c.rollout.step.cascade = true;
      c.rollout.kv.num_pages = 0;
    } else if (trial == 1) {  // two prompts fit, their growth does not: one is preempted
      c.prompts = 3;
      c.group_size = 2;
      c.prompt_len_min = c.prompt_len_max = 30;
      c.max_new_tokens = 12;
      c.stop_on_eos = false;
      c.arrival_stagger = 0;
      c.rollout.kv.page_size = 1;
      c.rollout.scheduler.max_running = 64;
      c.rollout.scheduler.max_batched_tokens = 256;
      c.rollout.scheduler.prefix_sharing = false;
      c.rollout.step.cascade = false;
      c.rollout.kv.num_pages = 2 * 30 + 2;
    }
    SCOPED_TRACE(c.workload_string() + " | rollout " + c.rollout_string() + " | training " +
                 c.training_string());
    const AuditSide s = run(c);
    EXPECT_GT(s.tokens_compared, 0);
    EXPECT_EQ(s.mismatches, 0);
    EXPECT_EQ(s.entropy_mismatches, 0);
    EXPECT_EQ(s.max_abs_diff, 0.0);
    EXPECT_FALSE(s.first.has_value());
    EXPECT_EQ(s.sequences, c.prompts * c.group_size);
    compared += s.tokens_compared;
    preemptions += s.rollout_stats.preemptions;
    cascade_rows += s.cascade_rows;
    if (trial == 0) EXPECT_GT(s.cascade_rows, 0) << "the pinned cascade trial did not use cascade";
    if (trial == 1) EXPECT_GT(s.rollout_stats.preemptions, 0) << "the pinned trial did not preempt";
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(cascade_rows, 0);
  std::printf("tokens compared %lld, preemptions %lld, cascade rows %lld\n", (long long)compared,
              (long long)preemptions, (long long)cascade_rows);
}

TEST(Audit, IdenticalRunsGiveIdenticalReports) {
  AuditConfig c = small_config();
  c.rollout_tp = 4;
  c.rollout.kv.page_size = 3;
  auto json_without_timing = [&] {
    AuditReport r;
    r.contract = c.contract.to_string();
    r.config = c;
    r.sides.push_back(run(c));
    auto j = nlohmann::json::parse(audit_report_json(r));
    j.erase("rollout_seconds");
    j.erase("train_seconds");
    return j.dump();
  };
  EXPECT_EQ(json_without_timing(), json_without_timing());
}

// A backend that is the invariant one except for one op, whose output gets its lowest bit flipped:
// the audit must see mismatches and localization must name that op.
class PerturbedBackend : public OpsBackend {
 public:
  enum class Target { kPrefillAttention, kTrainingLogprob };
  explicit PerturbedBackend(Target t) : t_(t), b_(make_invariant_backend()) {}
  std::string name() const override { return "perturbed"; }

  void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
            const TensorView& y) const override {
    b_->gemm(x, w, cfg, y);
  }
  void gemm_partial(const TensorView& x, const TensorView& w, int64_t k, int tp, int r,
                    const GemmConfig& cfg, const TensorView& y) const override {
    b_->gemm_partial(x, w, k, tp, r, cfg, y);
  }
  void gemm_combine(const std::vector<TensorView>& p, const TensorView& y) const override {
    b_->gemm_combine(p, y);
  }
  void rmsnorm(const TensorView& x, const TensorView& w, const RmsNormConfig& c,
               const TensorView& y) const override {
    b_->rmsnorm(x, w, c, y);
  }
  void rmsnorm_residual(const TensorView& x, const TensorView& r, const TensorView& w,
                        const RmsNormConfig& c, const TensorView& ro,
                        const TensorView& y) const override {
    b_->rmsnorm_residual(x, r, w, c, ro, y);
  }
  void rope(const TensorView& x, const TensorView& p, const RopeTable& t,
            const TensorView& y) const override {
    b_->rope(x, p, t, y);
  }
  void silu_mul(const TensorView& g, const TensorView& u, const TensorView& o) const override {
    b_->silu_mul(g, u, o);
  }
  void embedding(const TensorView& i, const TensorView& t, const TensorView& o) const override {
    b_->embedding(i, t, o);
  }
  void embedding_vocab_parallel(const TensorView& i, const TensorView& t, const VocabShard& s,
                                int64_t v, const TensorView& o) const override {
    b_->embedding_vocab_parallel(i, t, s, v, o);
  }
  void embedding_combine(const std::vector<TensorView>& p, const TensorView& o) const override {
    b_->embedding_combine(p, o);
  }
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const PackedSeqs& cu, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const override {
    b_->attention_prefill_varlen(q, k, v, cu, cfg, out, lse);
    if (t_ == Target::kPrefillAttention) flip_bf16(out);
  }
  void attention_paged(const TensorView& q, const PagedMeta& m, const TensorView& kc,
                       const TensorView& vc, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) const override {
    b_->attention_paged(q, m, kc, vc, cfg, out, lse);
  }
  void attention_paged_split_kv(const TensorView& q, const PagedMeta& m, const TensorView& kc,
                                const TensorView& vc, const AttentionConfig& cfg, int n,
                                const TensorView& out, const TensorView& lse) const override {
    b_->attention_paged_split_kv(q, m, kc, vc, cfg, n, out, lse);
  }
  void attention_paged_cascade(const TensorView& q, const PagedMeta& m, const TensorView& kc,
                               const TensorView& vc, const AttentionConfig& cfg,
                               const TensorView& out, const TensorView& lse) const override {
    b_->attention_paged_cascade(q, m, kc, vc, cfg, out, lse);
  }
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& s,
                      const TensorView& kc, const TensorView& vc) const override {
    b_->kv_cache_write(k, v, s, kc, vc);
  }
  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& t,
                      const LogprobParams& p, const ContractConfig& c, const TensorView& logp,
                      const TensorView& lse, const TensorView& ent) const override {
    b_->linear_logprob(h, w, t, p, c, logp, lse, ent);
    if (t_ == Target::kTrainingLogprob) flip_f32(logp);
  }
  void linear_logprob_partial(const TensorView& h, const TensorView& w, const TensorView& t,
                              const LogprobParams& p, const ContractConfig& c,
                              const LogprobShard& s, const TensorView& st) const override {
    b_->linear_logprob_partial(h, w, t, p, c, s, st);
  }
  void linear_logprob_combine(const TensorView& st, const TensorView& t, const LogprobParams& p,
                              const ContractConfig& c, int64_t V, const TensorView& logp,
                              const TensorView& lse, const TensorView& ent) const override {
    b_->linear_logprob_combine(st, t, p, c, V, logp, lse, ent);
    if (t_ == Target::kTrainingLogprob) flip_f32(logp);
  }
  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> p,
              const TensorView& r, const TensorView& pos, const ContractConfig& c,
              const TensorView& ids, const TensorView& logp, const TensorView& lse,
              const TensorView& ent) const override {
    b_->sample(h, w, p, r, pos, c, ids, logp, lse, ent);
  }

 private:
  static void flip_bf16(const TensorView& t) {  // [N, Hq, D], last dim contiguous
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t h = 0; h < t.shape[1]; ++h)
        for (int64_t d = 0; d < t.shape[2]; ++d)
          t.ptr<bf16>()[i * t.stride[0] + h * t.stride[1] + d].bits ^= 1;
  }
  static void flip_f32(const TensorView& t) {
    for (int64_t i = 0; i < t.shape[0]; ++i) {
      float& f = t.ptr<float>()[i * t.stride[0]];
      f = f32_from_bits(f32_bits(f) ^ 1u);
    }
  }
  Target t_;
  std::unique_ptr<OpsBackend> b_;
};

TEST(Audit, PerturbedAttentionIsCaughtAndLocalized) {
  AuditConfig c = small_config();
  c.localize = true;
  c.train_tp = 2;
  const AuditSide s =
      run(c, std::make_shared<PerturbedBackend>(PerturbedBackend::Target::kPrefillAttention));
  EXPECT_EQ(s.backend, "perturbed");
  EXPECT_GT(s.mismatches, 0);
  EXPECT_GT(s.max_abs_diff, 0.0);
  ASSERT_TRUE(s.first.has_value());
  ASSERT_TRUE(s.localization.has_value());
  const Localization& l = *s.localization;
  EXPECT_TRUE(l.replayed) << l.summary;
  ASSERT_GE(l.first_divergent, 0) << l.summary;
  const OpComparison& op = l.ops[size_t(l.first_divergent)];
  EXPECT_EQ(op.op, "attn") << l.summary;
  EXPECT_EQ(op.layer, 0) << l.summary;
  EXPECT_GT(op.mismatches, 0);
  EXPECT_GT(l.first_divergent, 0);  // embedding, norms, projections before it agree
  EXPECT_NE(l.summary.find("first divergent op: attn (layer 0)"), std::string::npos) << l.summary;
  std::printf("%s\n", l.summary.c_str());
}

TEST(Audit, PerturbedHeadIsLocalizedToTheLogprob) {
  for (int tp : {1, 2}) {
    AuditConfig c = small_config();
    c.localize = true;
    c.train_tp = tp;
    const AuditSide s =
        run(c, std::make_shared<PerturbedBackend>(PerturbedBackend::Target::kTrainingLogprob));
    EXPECT_EQ(s.mismatches, s.tokens_compared);
    EXPECT_EQ(s.entropy_mismatches, 0);
    ASSERT_TRUE(s.localization.has_value());
    const Localization& l = *s.localization;
    ASSERT_GE(l.first_divergent, 0) << l.summary;
    EXPECT_EQ(l.ops[size_t(l.first_divergent)].op, "logp") << l.summary;
    EXPECT_EQ(size_t(l.first_divergent), l.ops.size() - 1);
    EXPECT_NE(l.summary.find("log-prob head"), std::string::npos) << l.summary;
  }
}

TEST(Audit, LocalizeWithoutMismatchSaysSo) {
  AuditConfig c = small_config();
  c.localize = true;
  const AuditSide s = run(c);
  EXPECT_EQ(s.mismatches, 0);
  ASSERT_TRUE(s.localization.has_value());
  EXPECT_NE(s.localization->summary.find("nothing to localize"), std::string::npos);
}

TEST(Audit, ReportsCarryTheRequiredFields) {
  AuditConfig c = small_config();
  AuditReport r;
  r.model = "tiny";
  r.contract = c.contract.to_string();
  r.config = c;
  r.sides.push_back(run(c));
  r.sides.push_back(
      run(c, std::make_shared<PerturbedBackend>(PerturbedBackend::Target::kTrainingLogprob)));
  EXPECT_TRUE(r.passed());
  const std::string human = format_audit_report(r);
  for (const char* s : {"tokens compared", "logp mismatches", "max |Δlogp|", "first divergence",
                        "invariant", "perturbed", "contract 0.6: gemm_segments=4",
                        "PASS:", "rollout   tp=2", "training  tp=1", "no tokenizer"})
    EXPECT_NE(human.find(s), std::string::npos) << s << "\n" << human;
  std::printf("%s", human.c_str());

  const auto j = nlohmann::json::parse(audit_report_json(r));
  EXPECT_EQ(j["tokens_compared"].get<int64_t>(), r.sides[0].tokens_compared);
  EXPECT_EQ(j["mismatches"].get<int64_t>(), 0);
  EXPECT_EQ(j["max_abs_diff"].get<double>(), 0.0);
  EXPECT_EQ(j["contract"].get<std::string>(), c.contract.to_string());
  EXPECT_EQ(j["backend"].get<std::string>(), "invariant");
  EXPECT_TRUE(j["passed"].get<bool>());
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_EQ(j["rollout"]["tp"].get<int>(), 2);
  EXPECT_EQ(j["training"]["tp"].get<int>(), 1);
  EXPECT_GT(j["perturbed"]["mismatches"].get<int64_t>(), 0);
  EXPECT_FALSE(j["perturbed"]["first_divergence"].is_null());

  // A failing primary side fails the report.
  std::swap(r.sides[0], r.sides[1]);
  EXPECT_FALSE(r.passed());
  EXPECT_NE(format_audit_report(r).find("FAIL:"), std::string::npos);
  EXPECT_FALSE(nlohmann::json::parse(audit_report_json(r))["passed"].get<bool>());
}

TEST(Audit, WorkloadIsFixedBySeed) {
  AuditConfig c = small_config();
  const auto a = make_audit_requests(c, tiny().config());
  const auto b = make_audit_requests(c, tiny().config());
  ASSERT_EQ(a.size(), size_t(c.prompts * c.group_size));
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].arrival_step, b[i].arrival_step);
    EXPECT_GE(int64_t(a[i].prompt.size()), c.prompt_len_min);
    EXPECT_LE(int64_t(a[i].prompt.size()), c.prompt_len_max);
    EXPECT_EQ(a[i].prompt, a[i / size_t(c.group_size) * size_t(c.group_size)].prompt);
  }
  c.seed = 2;
  EXPECT_NE(make_audit_requests(c, tiny().config())[0].prompt, a[0].prompt);
  EXPECT_EQ(mixed_sampling_params(5, 9).temperature, 0.0f);
  EXPECT_EQ(mixed_sampling_params(1, 9).top_k, 40);
}

// The named shapes are the Hugging Face Qwen3 dimensions.
TEST(Audit, NamedModelShapes) {
  const Qwen3Config q06 = qwen3_shape_config("qwen3-0.6b");
  EXPECT_EQ(q06.hidden_size, 1024);
  EXPECT_EQ(q06.num_hidden_layers, 28);
  EXPECT_TRUE(q06.tie_word_embeddings);
  EXPECT_EQ(qwen3_num_parameters(q06), 596049920);
  const Qwen3Config q8 = qwen3_shape_config("qwen3-8b");
  EXPECT_EQ(q8.intermediate_size, 12288);
  EXPECT_FALSE(q8.tie_word_embeddings);
  EXPECT_EQ(qwen3_num_parameters(q8), 8190735360);
  // The GEMM list the benchmarks and parity tests read: Qwen3-8B's [N, K] per projection.
  const std::vector<GemmShape> g = qwen3_gemm_shapes(q8, true);
  ASSERT_EQ(g.size(), 5u);
  const int64_t nk[5][2] = {
      {6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}, {151936, 4096}};
  const char* names[5] = {"qkv", "o_proj", "gate_up", "down", "lm_head"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_STREQ(g[size_t(i)].name, names[i]);
    EXPECT_EQ(g[size_t(i)].n, nk[i][0]);
    EXPECT_EQ(g[size_t(i)].k, nk[i][1]);
    EXPECT_EQ(g[size_t(i)].row_parallel, i == 1 || i == 3);
  }
  EXPECT_EQ(qwen3_gemm_shapes(q06).size(), 4u);
  EXPECT_EQ(qwen3_gemm_shapes(q06)[0].n, 16 * 128 + 2 * 8 * 128);
  EXPECT_EQ(qwen3_shape_config("default").hidden_size, default_model_config().hidden_size);
  EXPECT_NE(error_of([] { qwen3_shape_config("x"); }).find("not one of"), std::string::npos);
}

// The baseline backend (ordinary kernels) must show the mismatches the audit exists to catch:
// rollout TP 2 with batched decode vs training TP 1 packed.
TEST(Audit, BaselineMismatches) {
  auto b = shared_baseline_backend();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->name(), "baseline");
  AuditConfig c = small_config();
  c.localize = true;
  const AuditSide s = run(c, b);
  EXPECT_GT(s.tokens_compared, 0);
  EXPECT_GT(s.mismatches, 0);
  EXPECT_GT(s.max_abs_diff, 0.0);
  ASSERT_TRUE(s.localization.has_value());
  EXPECT_GE(s.localization->first_divergent, 0) << s.localization->summary;
  std::printf("baseline: %lld of %lld log-probs differ; %s\n", (long long)s.mismatches,
              (long long)s.tokens_compared, s.localization->summary.c_str());
}

}  // namespace
}  // namespace lockstep::engine
