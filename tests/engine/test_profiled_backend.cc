// ProfiledBackend (bench-engine --profile-ops) over the CPU invariant backend: a rollout and a
// training forward through it record the unwrapped backend's bits, and its report counts every op
// kind the model issues (exact call counts where the model fixes them), with per-weight GEMM lines,
// a decode section, and pending marks resolved past the limit.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/profiled_backend.h"
#include "engine/rollout.h"
#include "engine/rollout_test_util.h"
#include "engine/trainer.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

using test_util::make_requests;
using test_util::same_completions;
using test_util::TinyModel;

RolloutConfig rollout_config() {
  RolloutConfig c;
  c.kv = KvCacheConfig{16, 64};
  c.scheduler.max_running = 4;  // the last group waits: decode and prefill steps mix
  c.scheduler.max_batched_tokens = 32;
  c.scheduler.prefix_sharing = true;
  return c;
}

const OpTimes* row(const OpProfile& p, const std::string& label) {
  for (const OpTimes& t : p.rows)
    if (t.label == label) return &t;
  return nullptr;
}

int64_t calls(const OpProfile& p, const std::string& label) {
  const OpTimes* t = row(p, label);
  return t ? t->calls : 0;
}

::testing::AssertionResult well_formed(const OpProfile& p) {
  OpTimes sum;
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const OpTimes& t = p.rows[i];
    if (t.calls <= 0 || !(t.device_s >= 0) || !(t.host_s >= 0))
      return ::testing::AssertionFailure() << t.label << ": calls " << t.calls << ", device "
                                           << t.device_s << " s, host " << t.host_s << " s";
    if (i > 0 && p.rows[i - 1].device_s < t.device_s)
      return ::testing::AssertionFailure() << "rows not by device time at " << t.label;
    sum.calls += t.calls;
    sum.device_s += t.device_s;
    sum.host_s += t.host_s;
  }
  if (sum.calls != p.total.calls || sum.device_s != p.total.device_s ||
      sum.host_s != p.total.host_s)
    return ::testing::AssertionFailure() << "the total is not the rows' sum";
  return ::testing::AssertionSuccess();
}

TEST(ProfiledBackend, RolloutBitsAreTheInnerBackendsAndEveryOpIsCounted) {
  const TinyModel tiny;
  const int tp = 2;
  const int64_t L = tiny.config().num_hidden_layers;
  auto g = test::rng(11);
  const auto reqs = make_requests(g, 3, 2, 40, 10, tiny.config().vocab_size);
  const RolloutResult want = run_rollout(*tiny.make(tp), reqs, rollout_config());

  auto prof =
      std::make_shared<ProfiledBackend>(std::shared_ptr<OpsBackend>(make_invariant_backend()));
  EXPECT_EQ(prof->name(), "invariant");
  EXPECT_EQ(prof->device(), Device::kCPU);
  const auto model = tiny.make(tp, prof);
  prof->reset();  // the weight copies of the model's construction
  EXPECT_TRUE(prof->report().rows.empty());
  int64_t decode_steps = 0, sample_steps = 0;
  RolloutHooks hooks;
  hooks.before_step = [&](const RolloutStepInfo& info) {
    prof->set_decode(info.plan->decode_only());
    decode_steps += info.plan->decode_only();
    sample_steps += info.plan->num_samples() > 0;
    return true;
  };
  const RolloutResult got = run_rollout(*model, reqs, rollout_config(), hooks);
  ASSERT_TRUE(same_completions(want.completions, got.completions));
  ASSERT_GT(decode_steps, 0);
  ASSERT_LT(decode_steps, got.stats.steps);

  const OpProfile all = prof->report(), decode = prof->decode_report();
  ASSERT_TRUE(well_formed(all));
  ASSERT_TRUE(well_formed(decode));
  const int64_t steps = got.stats.steps;
  // Fixed by the model: per step one embedding (a lookup per rank), one sample call if a row
  // samples; per layer and rank one K/V write, one attention call and two GEMMs (q|k|v, gate|up).
  EXPECT_EQ(calls(all, "embedding_vocab_parallel"), steps * tp);
  EXPECT_EQ(calls(all, "embedding_combine"), steps);
  EXPECT_EQ(calls(all, "kv_cache_write"), steps * L * tp);
  EXPECT_EQ(calls(all, "attention_paged"), steps * L * tp);
  EXPECT_EQ(calls(all, "sample"), sample_steps);
  EXPECT_EQ(calls(decode, "sample"), decode_steps);
  EXPECT_EQ(calls(decode, "attention_paged"), decode_steps * L * tp);
  // One line per weight shape. q|k|v is [(2 + 2·1)·16, 64] = [64, 64] on both ranks; I = 96 splits
  // over its padded K as [0, 64) and [64, 96), so gate|up is [128, 64] on rank 0, [64, 64] on 1.
  // o_proj and down_proj run as gemm_partial over column blocks.
  int64_t gemms = 0, partials = 0, gemm_lines = 0;
  for (const OpTimes& t : all.rows) {
    if (t.label.rfind("gemm N", 0) == 0) gemms += t.calls, ++gemm_lines;
    if (t.label.rfind("gemm_partial N", 0) == 0) partials += t.calls;
  }
  EXPECT_EQ(gemms, 2 * steps * L * tp);
  EXPECT_EQ(gemm_lines, 2);
  EXPECT_EQ(calls(all, "gemm N64 K64"), 3 * steps * L);
  EXPECT_EQ(partials, 2 * steps * L * tp);
  EXPECT_EQ(calls(all, "gemm_combine"), 2 * steps * L);
  for (const char* label :
       {"rmsnorm", "rmsnorm_residual", "qk_norm_rope", "silu_mul", "copy host->host", "empty"})
    EXPECT_GT(calls(all, label), 0) << label;
  EXPECT_EQ(row(all, "attention_prefill_varlen"), nullptr);  // the rollout's attention is paged
  EXPECT_GT(all.total.device_s, 0.0);
  EXPECT_LT(decode.total.calls, all.total.calls);

  // The training forward of the same sequences, profiled alone after a reset.
  prof->reset();
  EXPECT_TRUE(prof->report().rows.empty());
  EXPECT_TRUE(prof->decode_report().rows.empty());  // reset turned the decode flag off
  const auto seqs = train_sequences(got);
  const auto train_model = tiny.make(1, prof);
  prof->reset();
  const TrainResult tr = run_training_forward(*train_model, seqs, PackingConfig{});
  ASSERT_EQ(tr.sequences.size(), got.completions.size());
  for (size_t i = 0; i < seqs.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(got.completions[i].logp, tr.sequences[i].logp)) << i;
  const OpProfile train = prof->report();
  ASSERT_TRUE(well_formed(train));
  EXPECT_EQ(calls(train, "attention_prefill_varlen"), tr.micro_batches * L);
  EXPECT_GT(calls(train, "linear_logprob"), 0);
  EXPECT_EQ(calls(train, "sample"), 0);
  EXPECT_TRUE(prof->decode_report().rows.empty());
}

// More marks than the limit without a wait: resolved on the way, every call still counted once.
TEST(ProfiledBackend, ResolvesPendingMarksPastTheLimit) {
  auto inner = std::shared_ptr<OpsBackend>(make_invariant_backend());
  ProfiledBackend prof(inner);
  Tensor x(DType::kF32, {3, 5});
  const int64_t n = int64_t(ProfiledBackend::kMaxPendingMarks) + 7;
  for (int64_t i = 0; i < n; ++i) prof.fill_zero(x.view());
  const OpProfile p = prof.report();
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].label, "fill_zero");
  EXPECT_EQ(p.rows[0].calls, n);
  EXPECT_GE(p.rows[0].device_s, 0.0);
}

// A backward op forwards its bits and its errors: round_bf16 equals the inner call, and a call the
// inner backend rejects throws its error and is not counted.
TEST(ProfiledBackend, ForwardsBackwardOpsAndErrors) {
  auto inner = std::shared_ptr<OpsBackend>(make_invariant_backend());
  ProfiledBackend prof(inner);
  Tensor src(DType::kF32, {2, 3}), a(DType::kBF16, {2, 3}), b(DType::kBF16, {2, 3});
  for (int64_t i = 0; i < 6; ++i) src.ptr<float>()[i] = 1.0f / float(3 + i);
  inner->round_bf16(src.view(), a.view());
  prof.round_bf16(src.view(), b.view());
  EXPECT_TRUE(test::bitwise_equal(a.ptr<bf16>(), b.ptr<bf16>(), 6, DType::kBF16));
  EXPECT_THROW(prof.round_bf16(src.view(), Tensor(DType::kBF16, {3, 2}).view()), Error);
  const OpProfile p = prof.report();
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].calls, 1);
}

TEST(OpClock, HostClockMarksAreOrdered) {
  const auto clock = make_invariant_backend()->make_op_clock();
  const int a = clock->mark(), b = clock->mark();
  EXPECT_GE(clock->seconds(a, b), 0.0);
  clock->clear();
  EXPECT_THROW(clock->seconds(a, b), Error);
}

TEST(OpClock, KeepOnlyKeepsOneMarkAndItsTime) {
  const auto clock = make_invariant_backend()->make_op_clock();
  const int a = clock->mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int b = clock->mark();
  clock->mark();
  EXPECT_EQ(clock->keep_only(a), 0);
  EXPECT_THROW(clock->seconds(0, b), Error);  // b is gone
  const int c = clock->mark();
  EXPECT_EQ(c, 1);
  EXPECT_GE(clock->seconds(0, c), 0.02);  // mark 0 is still a's time
  EXPECT_THROW(clock->keep_only(5), Error);
}

// The device idle between two ops lands on their transition, with the host time between the calls
// (on the CPU both are host time: at least the sleep between the calls), also when a
// synchronize() resolved the marks in between; reset() forgets it.
TEST(ProfiledBackend, IdleBetweenOpsGoesToTheirTransition) {
  ProfiledBackend prof(make_invariant_backend());
  Tensor src(DType::kF32, {2, 3}), dst(DType::kBF16, {2, 3});
  for (int64_t i = 0; i < 6; ++i) src.ptr<float>()[i] = float(i);
  prof.round_bf16(src.view(), dst.view());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  prof.fill_zero(dst.view());
  prof.synchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  prof.round_bf16(src.view(), dst.view());
  const OpProfile p = prof.report();
  ASSERT_EQ(p.gaps.size(), 2u);
  const OpGap& first = p.gaps[0];  // largest first
  EXPECT_EQ(first.from, "round_bf16");
  EXPECT_EQ(first.to, "fill_zero");
  EXPECT_EQ(first.count, 1);
  EXPECT_GE(first.device_s, 0.03);
  EXPECT_GE(first.host_s, 0.03);
  const OpGap& second = p.gaps[1];  // across the synchronize
  EXPECT_EQ(second.from, "fill_zero");
  EXPECT_EQ(second.to, "round_bf16");
  EXPECT_GE(second.device_s, 0.02);
  EXPECT_GE(second.host_s, 0.02);
  EXPECT_TRUE(prof.decode_report().gaps.empty());  // the decode flag was off
  prof.reset();
  prof.round_bf16(src.view(), dst.view());
  EXPECT_TRUE(prof.report().gaps.empty());  // no op before it since the reset
}

}  // namespace
}  // namespace lockstep::engine
