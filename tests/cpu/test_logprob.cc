// LogP op (linear_logprob): strides, padding == -inf logits, accuracy vs an fp64 oracle, the
// -inf-safe merge, and bad inputs. Token invariance (alone vs in batches), vocab-parallel subtrees
// (vocab_segments 1/2/4/8, every TP degree), thread counts and determinism: the op-case table's
// log-prob cases (tests/ops, tests/cpu/test_op_cases.cc).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "lockstep/contract.h"
#include "lockstep/ops/logprob.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::bitwise_equal;

struct Outputs {
  std::vector<float> logp, lse, entropy;
};

// T, H, V: tokens, hidden, vocab.
Tensor make_targets(const std::vector<int64_t>& ids) {
  Tensor t(DType::kI64, {int64_t(ids.size())});
  std::copy(ids.begin(), ids.end(), t.ptr<int64_t>());
  return t;
}

std::vector<int64_t> random_targets(int64_t T, int64_t V, std::mt19937_64& g) {
  std::vector<int64_t> ids(static_cast<size_t>(T));
  for (auto& id : ids) id = int64_t(g() % uint64_t(V));
  return ids;
}

Outputs run(const TensorView& h, const TensorView& w, const TensorView& targets,
            const LogprobParams& p, const ContractConfig& cfg) {
  const int64_t T = h.size(0);
  Tensor logp = test::poisoned(DType::kF32, {T}), lse = test::poisoned(DType::kF32, {T}),
         ent = test::poisoned(DType::kF32, {T});
  cpu::linear_logprob(h, w, targets, p, cfg, logp.view(), lse.view(), ent.view());
  Outputs o;
  o.logp.assign(logp.ptr<float>(), logp.ptr<float>() + T);
  o.lse.assign(lse.ptr<float>(), lse.ptr<float>() + T);
  o.entropy.assign(ent.ptr<float>(), ent.ptr<float>() + T);
  return o;
}

Outputs run(const Tensor& h, const Tensor& w, const std::vector<int64_t>& targets,
            const LogprobParams& p, const ContractConfig& cfg) {
  Tensor tg = make_targets(targets);
  return run(h.view(), w.view(), tg.view(), p, cfg);
}

::testing::AssertionResult outputs_equal(const Outputs& a, const Outputs& b) {
  auto r = bitwise_equal(a.logp, b.logp);
  if (!r) return r << " (logp)";
  r = bitwise_equal(a.lse, b.lse);
  if (!r) return r << " (lse)";
  r = bitwise_equal(a.entropy, b.entropy);
  if (!r) return r << " (entropy)";
  return ::testing::AssertionSuccess();
}

// Row t of each output as a 1-element Outputs.
Outputs row(const Outputs& o, int64_t t) {
  return Outputs{{o.logp[size_t(t)]}, {o.lse[size_t(t)]}, {o.entropy[size_t(t)]}};
}

ContractConfig config(int vocab_tile, int vocab_segments, int gemm_segments = 1) {
  ContractConfig c;
  c.vocab_tile = vocab_tile;
  c.vocab_segments = vocab_segments;
  c.gemm_segments = gemm_segments;
  return c;
}

// fp64 oracle: exact bf16 products summed in double, then the plain math.
struct Oracle {
  double logp, lse, entropy;
};
Oracle oracle(const bf16* h, const Tensor& w, int64_t H, int64_t target, double temperature) {
  const int64_t V = w.shape()[0];
  std::vector<double> y(static_cast<size_t>(V));
  double m = -INFINITY;
  for (int64_t v = 0; v < V; ++v) {
    double z = 0;
    for (int64_t k = 0; k < H; ++k)
      z += double(bf16_to_f32(h[k])) * double(bf16_to_f32(w.ptr<bf16>()[v * H + k]));
    y[size_t(v)] = z / temperature;
    m = std::max(m, y[size_t(v)]);
  }
  double s = 0, sy = 0;
  for (double yv : y) {
    double e = std::exp(yv - m);
    s += e;
    sy += e * (yv - m);
  }
  Oracle o;
  o.lse = m + std::log(s);
  o.entropy = std::log(s) - sy / s;
  o.logp = y[size_t(target)] - o.lse;
  return o;
}

TEST(LogprobAccuracy, MatchesFp64Oracle) {
  // Tolerance: |got - ref| <= 4e-6 · (1 + |ref|) for logp, lse and entropy (measured worst over
  // many seeds: ~1e-6). The error budget: logits from the MMA model (truncation to 2^(E-25) per
  // k-block, a few ulp of the largest partial sum), one divide, exp/log < 1 ulp, fp32 sums.
  auto g = test::rng(1);
  double worst = 0;
  for (ContractConfig cfg : {config(256, 1), config(64, 2, 2), config(8, 8, 4), config(24, 4, 8)}) {
    for (int64_t H : {64, 48, 16}) {
      for (float temperature : {1.0f, 0.7f, 1.9f}) {
        const int64_t T = 17, V = 1000;
        Tensor h = test::random_bf16({T, H}, g);
        Tensor w = test::random_bf16({V, H}, g, 0.5f);
        auto targets = random_targets(T, V, g);
        Outputs o = run(h, w, targets, LogprobParams{temperature}, cfg);
        for (int64_t t = 0; t < T; ++t) {
          Oracle ref = oracle(h.ptr<bf16>() + t * H, w, H, targets[size_t(t)], temperature);
          auto check = [&](double got, double want, const char* what) {
            double err = std::fabs(got - want) / (1.0 + std::fabs(want));
            worst = std::max(worst, err);
            EXPECT_LE(err, 4e-6) << what << " t=" << t << " got " << got << " want " << want << " ("
                                 << cfg.to_string() << ", H=" << H
                                 << ", temperature=" << temperature << ")";
          };
          check(o.logp[size_t(t)], ref.logp, "logp");
          check(o.lse[size_t(t)], ref.lse, "lse");
          check(o.entropy[size_t(t)], ref.entropy, "entropy");
          EXPECT_GE(o.entropy[size_t(t)], 0.0f);
        }
      }
    }
  }
  std::printf("[lockstep] logprob worst relative error vs fp64: %.3g\n", worst);
}

TEST(LogprobAccuracy, PeakedAndFlatDistributions) {
  // One dominant logit (entropy ~ 0, logp ~ 0) and all-equal logits (entropy = log V).
  const int64_t H = 16, V = 300;
  Tensor h(DType::kBF16, {2, H});
  for (int64_t k = 0; k < H; ++k) h.ptr<bf16>()[k] = h.ptr<bf16>()[H + k] = f32_to_bf16(0.0f);
  h.ptr<bf16>()[0] = f32_to_bf16(1.0f);  // row 0: z = W[:, 0]
  h.ptr<bf16>()[H] = f32_to_bf16(1.0f);  // row 1: same, but W[:, 1] doesn't matter
  Tensor w(DType::kBF16, {V, H});
  for (int64_t i = 0; i < V * H; ++i) w.ptr<bf16>()[i] = f32_to_bf16(0.25f);
  Outputs flat = run(h, w, {5, 299}, LogprobParams{}, config(64, 2));
  for (int t = 0; t < 2; ++t) {
    EXPECT_NEAR(flat.lse[size_t(t)], 0.25 + std::log(double(V)), 2e-6);
    EXPECT_NEAR(flat.entropy[size_t(t)], std::log(double(V)), 2e-6);
    EXPECT_NEAR(flat.logp[size_t(t)], -std::log(double(V)), 2e-6);
  }
  w.ptr<bf16>()[7 * H] = f32_to_bf16(80.0f);  // z[7] = 80, others 0.25
  Outputs peaked = run(h, w, {7, 8}, LogprobParams{}, config(64, 2));
  EXPECT_EQ(peaked.lse[0], 80.0f);
  EXPECT_EQ(peaked.logp[0], 0.0f);
  EXPECT_GE(peaked.entropy[0], 0.0f);
  EXPECT_LT(peaked.entropy[0], 1e-30f);
  EXPECT_NEAR(peaked.logp[1], 0.25 - 80.0, 1e-5);
}

TEST(LogprobInvariance, StridedViewsAndI32Targets) {
  auto g = test::rng(3);
  const int64_t T = 19, H = 32, V = 200;
  const ContractConfig cfg = config(16, 4);
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g);
  auto targets = random_targets(T, V, g);
  Outputs ref = run(h, w, targets, LogprobParams{}, cfg);

  // Row-strided copies of h and W (extra columns filled with other data).
  Tensor hb = test::random_bf16({T, H + 24}, g), wb = test::random_bf16({V, H + 8}, g);
  for (int64_t t = 0; t < T; ++t)
    std::copy(h.ptr<bf16>() + t * H, h.ptr<bf16>() + (t + 1) * H, hb.ptr<bf16>() + t * (H + 24));
  for (int64_t v = 0; v < V; ++v)
    std::copy(w.ptr<bf16>() + v * H, w.ptr<bf16>() + (v + 1) * H, wb.ptr<bf16>() + v * (H + 8));
  TensorView hv = hb.view(), wv = wb.view();
  hv.shape[1] = H;
  wv.shape[1] = H;
  // i32 targets and outputs with stride 2.
  Tensor tg(DType::kI32, {2 * T});
  for (int64_t t = 0; t < T; ++t) {
    tg.ptr<int32_t>()[2 * t] = int32_t(targets[size_t(t)]);
    tg.ptr<int32_t>()[2 * t + 1] = -7;
  }
  TensorView tv = tg.view();
  tv.shape[0] = T;
  tv.stride[0] = 2;
  Tensor out = test::poisoned(DType::kF32, {3, 2 * T});
  TensorView ov[3];
  for (int i = 0; i < 3; ++i) {
    ov[i] = TensorView::contiguous(out.ptr<float>() + i * 2 * T, DType::kF32, {T});
    ov[i].stride[0] = 2;
  }
  cpu::linear_logprob(hv, wv, tv, LogprobParams{}, cfg, ov[0], ov[1], ov[2]);
  Outputs o;
  for (int64_t t = 0; t < T; ++t) {
    o.logp.push_back(out.ptr<float>()[2 * t]);
    o.lse.push_back(out.ptr<float>()[2 * T + 2 * t]);
    o.entropy.push_back(out.ptr<float>()[4 * T + 2 * t]);
  }
  EXPECT_TRUE(outputs_equal(o, ref));
  // The skipped (odd) output elements stay poisoned.
  for (int64_t i = 1; i < 6 * T; i += 2) {
    uint32_t bits = f32_bits(out.ptr<float>()[i]);
    ASSERT_EQ(bits, 0xA5A5A5A5u) << "element " << i << " was written";
  }
}

TEST(LogprobInvariance, PaddingEqualsMinusInfLogits) {
  // V = 1000 padded by the op vs V = 1024 with 24 real rows whose logits are exactly -inf.
  auto g = test::rng(4);
  const int64_t T = 9, H = 32, V = 1000, Vp = 1024;
  for (ContractConfig cfg : {config(256, 1), config(64, 2, 2), config(128, 8)}) {
    Tensor h = test::random_bf16({T, H}, g);
    for (int64_t t = 0; t < T; ++t)
      h.ptr<bf16>()[t * H] = f32_to_bf16(std::fabs(bf16_to_f32(h.ptr<bf16>()[t * H])) + 0.5f);
    Tensor w = test::random_bf16({V, H}, g);
    Tensor wp(DType::kBF16, {Vp, H});
    std::copy(w.ptr<bf16>(), w.ptr<bf16>() + V * H, wp.ptr<bf16>());
    for (int64_t v = V; v < Vp; ++v) {
      for (int64_t k = 0; k < H; ++k) wp.ptr<bf16>()[v * H + k] = f32_to_bf16(0.0f);
      wp.ptr<bf16>()[v * H] = f32_to_bf16(-INFINITY);  // z = -inf · h0 (h0 > 0) = -inf
    }
    auto targets = random_targets(T, V, g);
    ASSERT_EQ(logprob_vocab_layout(cfg, V).padded, Vp);
    EXPECT_TRUE(outputs_equal(run(h, w, targets, LogprobParams{}, cfg),
                              run(h, wp, targets, LogprobParams{}, cfg)))
        << cfg.to_string();
  }
}

TEST(LogprobTargets, IgnoreIndexWritesZeroAndKeepsLseEntropy) {
  auto g = test::rng(8);
  const int64_t T = 5, H = 16, V = 50;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g);
  std::vector<int64_t> targets = {3, -1, 49, -1, 0};
  Outputs o = run(h, w, targets, LogprobParams{}, config(8, 2));
  std::vector<int64_t> real = {3, 1, 49, 2, 0};
  Outputs r = run(h, w, real, LogprobParams{}, config(8, 2));
  EXPECT_TRUE(bitwise_equal(o.lse, r.lse));
  EXPECT_TRUE(bitwise_equal(o.entropy, r.entropy));
  EXPECT_EQ(f32_bits(o.logp[1]), 0u);
  EXPECT_EQ(f32_bits(o.logp[3]), 0u);
  EXPECT_EQ(o.logp[0], r.logp[0]);
  // A custom ignore_index; -1 is then an error.
  LogprobParams p;
  p.ignore_index = -100;
  Outputs c = run(h, w, {3, -100, 49, -100, 0}, p, config(8, 2));
  EXPECT_TRUE(outputs_equal(c, o));
  EXPECT_THROW(run(h, w, targets, p, config(8, 2)), Error);
}

// Runs f, expects an Error whose message contains every string in `needles`.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "expected lockstep::Error";
  } catch (const Error& e) {
    for (const char* n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message '" << e.what() << "' lacks '" << n << "'";
  }
}

TEST(LogprobBadInputs, ClearErrors) {
  auto g = test::rng(9);
  const int64_t T = 4, H = 16, V = 30;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g);
  Tensor tg = make_targets({1, 2, 3, 4});
  Tensor out[3] = {Tensor(DType::kF32, {T}), Tensor(DType::kF32, {T}), Tensor(DType::kF32, {T})};
  const ContractConfig cfg = config(8, 1);
  auto call = [&](const TensorView& hh, const TensorView& ww, const TensorView& tt,
                  LogprobParams p = {}, ContractConfig c = config(8, 1),
                  TensorView lse = TensorView()) {
    cpu::linear_logprob(hh, ww, tt, p, c, out[0].view(), lse.data ? lse : out[1].view(),
                        out[2].view());
  };
  // Targets out of range.
  Tensor bad = make_targets({1, 30, 3, 4});
  expect_error([&] { call(h.view(), w.view(), bad.view()); },
               {"linear_logprob", "targets[1] = 30", "[0, 30)"});
  Tensor neg = make_targets({1, 2, -2, 4});
  expect_error([&] { call(h.view(), w.view(), neg.view()); }, {"targets[2] = -2"});
  // Wrong dtypes / shapes / strides.
  Tensor hf(DType::kF32, {T, H});
  expect_error([&] { call(hf.view(), w.view(), tg.view()); }, {"'h'", "bf16", "f32"});
  Tensor w2 = test::random_bf16({V, H + 16}, g);
  expect_error([&] { call(h.view(), w2.view(), tg.view()); }, {"'w'", "[*, 16]", "[30, 32]"});
  Tensor tf(DType::kF32, {T});
  expect_error([&] { call(h.view(), w.view(), tf.view()); }, {"'targets'", "i32 or i64"});
  Tensor t5 = make_targets({1, 2, 3, 4, 5});
  expect_error([&] { call(h.view(), w.view(), t5.view()); }, {"'targets'", "[4]", "[5]"});
  Tensor l5(DType::kF32, {T + 1});
  expect_error([&] { call(h.view(), w.view(), tg.view(), {}, cfg, l5.view()); }, {"'lse'"});
  TensorView hs = h.view();
  hs.shape[1] = H / 2;
  hs.stride[1] = 2;
  expect_error([&] { call(hs, w.view(), tg.view()); }, {"'h'", "stride 1"});
  Tensor w0(DType::kBF16, {0, H});
  expect_error(
      [&] {
        call(h.view(), w0.view(), make_targets({-1, -1, -1, -1}).view());
      },
      {"'w'", "vocab"});
  // Bad settings.
  for (float temp : {0.0f, -1.0f, NAN, INFINITY})
    expect_error([&] { call(h.view(), w.view(), tg.view(), LogprobParams{temp}); },
                 {"temperature"});
  expect_error(
      [&] {
        call(h.view(), w.view(), tg.view(), LogprobParams{1.0f, 3});
      },
      {"ignore_index"});
  expect_error([&] { call(h.view(), w.view(), tg.view(), {}, config(12, 1)); }, {"vocab_tile"});
  expect_error([&] { call(h.view(), w.view(), tg.view(), {}, config(8, 3)); }, {"vocab_segments"});
  // Bad shards / rank counts.
  Tensor st(DType::kF32, {T, 4});
  expect_error(
      [&] {
        cpu::linear_logprob_partial(h.view(), w.view(), tg.view(), {}, config(8, 4),
                                    LogprobShard{V, 1, 2}, st.view());
      },
      {"linear_logprob_partial", "aligned"});
  expect_error(
      [&] {
        cpu::linear_logprob_partial(h.view(), w.view(), tg.view(), {}, config(8, 2),
                                    LogprobShard{V, 0, 1}, st.view());
      },
      {"'w_shard'", "[16, 16]"});
  Tensor st3(DType::kF32, {3, T, 4});
  expect_error(
      [&] {
        cpu::linear_logprob_combine(st3.view(), tg.view(), {}, config(8, 4), V, out[0].view(),
                                    out[1].view(), out[2].view());
      },
      {"linear_logprob_combine", "'states'", "power of two"});
  // Empty batch: nothing to do, no error.
  Tensor h0(DType::kBF16, {0, H});
  Tensor e0(DType::kF32, {0});
  Tensor t0(DType::kI64, {0});
  EXPECT_NO_THROW(cpu::linear_logprob(h0.view(), w.view(), t0.view(), {}, cfg, e0.view(), e0.view(),
                                      e0.view()));
}

TEST(LogprobNaN, NaNInHGivesNaNForThatTokenOnly) {
  // Documented result: a token whose h holds a NaN gets canonical NaN (0x7FC00000) in logp, lse
  // and entropy; the other tokens are unchanged. A NaN in W row v poisons every token.
  auto g = test::rng(10);
  const int64_t T = 6, H = 32, V = 100;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g);
  auto targets = random_targets(T, V, g);
  Outputs clean = run(h, w, targets, LogprobParams{}, config(16, 2));
  h.ptr<bf16>()[2 * H + 5] = f32_to_bf16(NAN);
  Outputs o = run(h, w, targets, LogprobParams{}, config(16, 2));
  for (int64_t t = 0; t < T; ++t) {
    if (t == 2) {
      EXPECT_EQ(f32_bits(o.logp[2]), 0x7fc00000u);
      EXPECT_EQ(f32_bits(o.lse[2]), 0x7fc00000u);
      EXPECT_EQ(f32_bits(o.entropy[2]), 0x7fc00000u);
    } else {
      EXPECT_TRUE(outputs_equal(row(o, t), row(clean, t))) << "t=" << t;
    }
  }
  h.ptr<bf16>()[2 * H + 5] = f32_to_bf16(0.5f);
  w.ptr<bf16>()[77 * H + 3] = f32_to_bf16(NAN);
  Outputs wn = run(h, w, targets, LogprobParams{}, config(16, 2));
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(f32_bits(wn.lse[size_t(t)]), 0x7fc00000u);
}

TEST(LogprobState, MergeIsMinusInfSafe) {
  const float ninf = -INFINITY;
  std::vector<float> pad(16, ninf);
  LogprobState empty = logprob_tile_state(pad.data(), 16);
  EXPECT_EQ(empty.m, ninf);
  EXPECT_EQ(f32_bits(empty.s), 0u);
  EXPECT_EQ(f32_bits(empty.w), 0u);
  std::vector<float> y = {0.5f, ninf, -3.0f, 2.0f, ninf, 1.0f, 0.0f, -1.0f};
  LogprobState x = logprob_tile_state(y.data(), 8);
  EXPECT_EQ(x.m, 2.0f);
  auto same = [](const LogprobState& a, const LogprobState& b) {
    return f32_bits(a.m) == f32_bits(b.m) && f32_bits(a.s) == f32_bits(b.s) &&
           f32_bits(a.w) == f32_bits(b.w);
  };
  EXPECT_TRUE(same(logprob_merge(x, empty), x));
  EXPECT_TRUE(same(logprob_merge(empty, x), x));
  EXPECT_TRUE(same(logprob_merge(empty, empty), empty));
  LogprobState four[4] = {empty, x, empty, empty};
  EXPECT_TRUE(same(logprob_tree(four, 4), x));
  float lse, ent;
  logprob_finish(x, &lse, &ent);
  double s = 0, sw = 0;
  for (float v : y) {
    if (v == ninf) continue;
    s += std::exp(double(v) - 2.0);
    sw += std::exp(double(v) - 2.0) * (double(v) - 2.0);
  }
  EXPECT_NEAR(lse, 2.0 + std::log(s), 1e-6);
  EXPECT_NEAR(ent, std::log(s) - sw / s, 1e-6);
  // A NaN entry poisons the state (s), and merging keeps it.
  y[6] = NAN;
  LogprobState n = logprob_tile_state(y.data(), 8);
  EXPECT_TRUE(std::isnan(n.s));
  EXPECT_TRUE(std::isnan(logprob_merge(x, n).s));
  EXPECT_TRUE(std::isnan(logprob_merge(n, empty).s));
  // Splitting a row into tiles and merging approximates the single-tile state.
  std::vector<float> big(64);
  auto g = test::rng(11);
  test::fill_f32(big.data(), 64, g, 3.0f);
  LogprobState whole = logprob_tile_state(big.data(), 64);
  LogprobState parts[8];
  for (int i = 0; i < 8; ++i) parts[i] = logprob_tile_state(big.data() + 8 * i, 8);
  LogprobState merged = logprob_tree(parts, 8);
  float l1, e1, l2, e2;
  logprob_finish(whole, &l1, &e1);
  logprob_finish(merged, &l2, &e2);
  EXPECT_NEAR(l1, l2, 1e-5);
  EXPECT_NEAR(e1, e2, 1e-5);
}

// Contract 0.3 (§L.4): the head's logits reduce K = H in one segment whatever gemm_segments (the
// lm_head is vocab-parallel, not row-parallel), so gemm_segments 1/2/4/8 give the same bits; and
// those bits are the one-segment GEMM's logits (a row's logp from the S = 1 GEMM's fp32 logits by
// the op's own fold equals the op at S = 8: checked through a one-tile vocab, where the op is
// just tile state + finish of those logits).
TEST(LogprobContract, GemmSegmentsDoNotChangeTheHead) {
  auto g = test::rng(31);
  const int64_t T = 9, H = 200, V = 700;  // H not a multiple of 16·8: padding differs per S
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g, 0.4f);
  auto targets = random_targets(T, V, g);
  for (int vs : {1, 4}) {
    const Outputs ref = run(h, w, targets, LogprobParams{0.8f}, config(64, vs, 1));
    for (int S : {2, 4, 8})
      EXPECT_TRUE(outputs_equal(run(h, w, targets, LogprobParams{0.8f}, config(64, vs, S)), ref))
          << "gemm_segments=" << S << " vocab_segments=" << vs;
  }
  // The segments the head uses: one, for every contract.
  for (int S : {1, 2, 4, 8}) EXPECT_EQ(logprob_logits_gemm(config(256, 1, S)).segments, 1);
}

TEST(LogprobRealVocab, Qwen3VocabAllDegrees) {
  // The real vocab size (151936 = 593.5 tiles of 256): 8 segments, TP 1/2/8, vs fp64.
  auto g = test::rng(12);
  const int64_t T = 2, H = 64, V = 151936;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g, 0.3f);
  auto targets = random_targets(T, V, g);
  Tensor tg = make_targets(targets);
  const ContractConfig cfg = config(256, 8);
  auto t0 = std::chrono::steady_clock::now();
  Outputs full = run(h.view(), w.view(), tg.view(), LogprobParams{}, cfg);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[lockstep] linear_logprob T=%lld H=%lld V=%lld: %.1f ms\n", (long long)T,
              (long long)H, (long long)V, ms);
  for (int64_t t = 0; t < T; ++t) {
    Oracle ref = oracle(h.ptr<bf16>() + t * H, w, H, targets[size_t(t)], 1.0);
    EXPECT_NEAR(full.lse[size_t(t)], ref.lse, 4e-6 * (1 + std::fabs(ref.lse)));
    EXPECT_NEAR(full.entropy[size_t(t)], ref.entropy, 4e-6 * (1 + ref.entropy));
    EXPECT_NEAR(full.logp[size_t(t)], ref.logp, 4e-6 * (1 + std::fabs(ref.logp)));
  }
  const LogprobVocabLayout lay = logprob_vocab_layout(cfg, V);
  for (int R : {2, 8}) {
    Tensor states(DType::kF32, {R, T, 4});
    for (int r = 0; r < R; ++r) {
      LogprobShard shard{V, r * (8 / R), 8 / R};
      int64_t v0 = std::min<int64_t>(V, shard.seg_begin * lay.segment_len);
      int64_t v1 = std::min<int64_t>(V, (shard.seg_begin + shard.seg_count) * lay.segment_len);
      cpu::linear_logprob_partial(
          h.view(), w.view().rows(v0, v1), tg.view(), {}, cfg, shard,
          TensorView::contiguous(states.ptr<float>() + r * T * 4, DType::kF32, {T, 4}));
    }
    Tensor o(DType::kF32, {3, T});
    TensorView ov[3];
    for (int i = 0; i < 3; ++i)
      ov[i] = TensorView::contiguous(o.ptr<float>() + i * T, DType::kF32, {T});
    cpu::linear_logprob_combine(states.view(), tg.view(), {}, cfg, V, ov[0], ov[1], ov[2]);
    Outputs got{{o.ptr<float>(), o.ptr<float>() + T},
                {o.ptr<float>() + T, o.ptr<float>() + 2 * T},
                {o.ptr<float>() + 2 * T, o.ptr<float>() + 3 * T}};
    EXPECT_TRUE(outputs_equal(got, full)) << "R=" << R;
  }
}

}  // namespace
}  // namespace lockstep
