// AdamW (src/engine/optim.h): the update equals a literal fp64 transcription of the documented
// formula, bit for bit, over several steps (bias correction, clipping, decay, schedules); the
// gradient norm's canonical chunked order; LR schedules at their key steps; thread-count
// invariance; checkpoint round trips and continuation; refusal of bad configs, bad state, bad or
// non-finite gradients with nothing changed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "engine/optim.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

using test::bitwise_equal;

// A small model: a 2-D bf16 embedding, a 1-D norm, and a 2-D f32 weight of 77100 elements (two
// norm chunks of 65536, the second partial).
Weights make_weights(uint64_t salt) {
  auto g = test::rng(salt);
  Weights w;
  w.emplace_back("model.embed_tokens.weight", test::random_bf16({17, 8}, g, 0.2f));
  w.emplace_back("model.norm.weight", test::random_bf16({8}, g, 1.0f));
  w.emplace_back("model.layers.0.mlp.down_proj.weight", test::random_f32({300, 257}, g, 0.05f));
  return w;
}

Weights make_grads(const Weights& like, uint64_t salt, float scale = 1.0f) {
  auto g = test::rng(salt);
  Weights out;
  for (const auto& [name, w] : like) out.emplace_back(name, test::random_f32(w.shape(), g, scale));
  return out;
}

::testing::AssertionResult weights_bitwise_equal(const Weights& a, const Weights& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "count differs";
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].first != b[k].first)
      return ::testing::AssertionFailure() << a[k].first << " vs " << b[k].first;
    if (a[k].second.shape() != b[k].second.shape() || a[k].second.dtype() != b[k].second.dtype())
      return ::testing::AssertionFailure() << a[k].first << ": shape or dtype differs";
    auto r = bitwise_equal(a[k].second.data(), b[k].second.data(), a[k].second.numel(),
                           a[k].second.dtype());
    if (!r) return r << " in " << a[k].first;
  }
  return ::testing::AssertionSuccess();
}

// ---- The literal transcription (docs/training-optimizer.md), plain loops, one thread. ----
struct Reference {
  std::vector<std::vector<float>> w, m, v;
  std::vector<size_t> ndim;
  int64_t t = 0;
};

Reference reference_init(const Weights& weights) {
  Reference r;
  for (const auto& [name, w] : weights) {
    std::vector<float> x(size_t(w.numel()));
    for (int64_t i = 0; i < w.numel(); ++i) x[i] = test::element_as_float(w.data(), w.dtype(), i);
    r.w.push_back(x);
    r.m.emplace_back(x.size(), 0.0f);
    r.v.emplace_back(x.size(), 0.0f);
    r.ndim.push_back(w.shape().size());
  }
  return r;
}

double reference_norm(const Weights& grads) {
  double total = 0.0;
  for (const auto& [name, g] : grads) {
    const float* p = g.ptr<float>();
    double tensor_sum = 0.0;
    for (int64_t begin = 0; begin < g.numel(); begin += 65536) {
      double chunk = 0.0;
      for (int64_t i = begin; i < std::min(g.numel(), begin + 65536); ++i) {
        chunk = chunk + double(p[i]) * double(p[i]);
      }
      tensor_sum = tensor_sum + chunk;
    }
    total = total + tensor_sum;
  }
  return std::sqrt(total);
}

StepStats reference_step(Reference& r, const Weights& grads, const AdamWConfig& cfg) {
  StepStats s;
  s.grad_norm = reference_norm(grads);
  s.clip_scale =
      cfg.max_grad_norm > 0 ? std::min(1.0, cfg.max_grad_norm / (s.grad_norm + 1e-6)) : 1.0;
  s.lr = learning_rate(cfg, r.t);
  const int64_t t = r.t + 1;
  double b1t = 1.0, b2t = 1.0;
  for (int64_t i = 0; i < t; ++i) {
    b1t = b1t * cfg.beta1;
    b2t = b2t * cfg.beta2;
  }
  for (size_t k = 0; k < grads.size(); ++k) {
    const float* g = grads[k].second.ptr<float>();
    const double wd = r.ndim[k] >= 2 ? cfg.weight_decay : 0.0;
    for (size_t i = 0; i < r.w[k].size(); ++i) {
      double gp = double(g[i]) * s.clip_scale;
      double m = cfg.beta1 * double(r.m[k][i]) + (1.0 - cfg.beta1) * gp;
      double v = cfg.beta2 * double(r.v[k][i]) + (1.0 - cfg.beta2) * (gp * gp);
      double m_hat = m / (1.0 - b1t);
      double v_hat = v / (1.0 - b2t);
      double w = double(r.w[k][i]);
      w = w - s.lr * (m_hat / (std::sqrt(v_hat) + cfg.eps) + wd * w);
      r.w[k][i] = float(w);
      r.m[k][i] = float(m);
      r.v[k][i] = float(v);
    }
  }
  r.t = t;
  return s;
}

::testing::AssertionResult matches_reference(const AdamW& opt, const Reference& r) {
  if (opt.steps_done() != r.t) return ::testing::AssertionFailure() << "step count differs";
  for (size_t k = 0; k < r.w.size(); ++k) {
    const int64_t n = int64_t(r.w[k].size());
    for (auto [mine, ref, what] :
         {std::tuple{&opt.master(), &r.w[k], "master"}, std::tuple{&opt.m(), &r.m[k], "m"},
          std::tuple{&opt.v(), &r.v[k], "v"}}) {
      auto res = bitwise_equal((*mine)[k].second.data(), ref->data(), n, DType::kF32);
      if (!res) return res << " in " << what << "/" << (*mine)[k].first;
    }
  }
  return ::testing::AssertionSuccess();
}

AdamWConfig config_all_on() {
  AdamWConfig c;
  c.lr = 3e-3;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  c.max_grad_norm = 50.0;  // the gradients' norm is ~280: clipping is active
  c.schedule = LrSchedule::kCosine;
  c.warmup_steps = 2;
  c.total_steps = 6;
  c.min_lr_ratio = 0.1;
  return c;
}

TEST(Optim, MatchesFp64TranscriptionBitwise) {
  AdamWConfig plain;  // constant LR, no decay, clipping at 1 (active)
  AdamWConfig no_clip;
  no_clip.max_grad_norm = 0;
  no_clip.weight_decay = 0.01;
  no_clip.schedule = LrSchedule::kLinearWarmup;
  no_clip.warmup_steps = 3;
  for (const AdamWConfig& cfg : {config_all_on(), plain, no_clip}) {
    SCOPED_TRACE(cfg.to_string());
    const Weights w = make_weights(1);
    AdamW opt(w, cfg);
    Reference ref = reference_init(w);
    ASSERT_TRUE(matches_reference(opt, ref));
    for (int s = 0; s < 8; ++s) {  // past the cosine's end
      const Weights g = make_grads(w, 100 + s, s == 3 ? 1e-3f : 1.0f);
      const StepStats got = opt.step(g);
      const StepStats want = reference_step(ref, g, cfg);
      EXPECT_EQ(got.grad_norm, want.grad_norm);
      EXPECT_EQ(got.clip_scale, want.clip_scale);
      EXPECT_EQ(got.lr, want.lr);
      ASSERT_TRUE(matches_reference(opt, ref)) << "after step " << s;
    }
  }
}

TEST(Optim, FirstStepIsSignDescentByBiasCorrection) {
  // t = 1: m̂ = g and v̂ = g² (bias correction undoes 1−β), so w moves by lr·g/(|g|+eps) ≈ lr·sign(g)
  // whatever β1, β2 are.
  AdamWConfig cfg;
  cfg.lr = 0.01;
  cfg.beta1 = 0.5;
  cfg.beta2 = 0.99;
  cfg.max_grad_norm = 0;
  const Weights w = make_weights(2);
  const Weights g = make_grads(w, 3);
  AdamW opt(w, cfg);
  opt.step(g);
  for (size_t k = 0; k < w.size(); ++k) {
    const Tensor& before = w[k].second;
    const float* after = opt.master()[k].second.ptr<float>();
    const float* gk = g[k].second.ptr<float>();
    for (int64_t i = 0; i < before.numel(); ++i) {
      const double w0 = test::element_as_float(before.data(), before.dtype(), i);
      const double step = double(after[i]) - w0;
      const double want = -cfg.lr * gk[i] / (std::abs(gk[i]) + cfg.eps);  // ≈ −lr·sign(g)
      ASSERT_NEAR(step, want, 1e-6 + 1e-7 * std::abs(w0)) << w[k].first << " [" << i << "]";
    }
  }
}

TEST(Optim, WeightDecaySkipsOneDimensionalWeights) {
  AdamWConfig cfg;
  cfg.lr = 0.1;
  cfg.weight_decay = 0.5;
  const Weights w = make_weights(4);
  Weights zero = make_grads(w, 5);
  for (auto& [name, t] : zero) {
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = 0.0f;
  }
  AdamW opt(w, cfg);
  opt.step(zero);  // m = v = 0: only the decay moves the weights
  for (size_t k = 0; k < w.size(); ++k) {
    const Tensor& before = w[k].second;
    const float* after = opt.master()[k].second.ptr<float>();
    for (int64_t i = 0; i < before.numel(); ++i) {
      const double w0 = test::element_as_float(before.data(), before.dtype(), i);
      const float want = before.shape().size() >= 2 ? float(w0 - 0.1 * (0.5 * w0)) : float(w0);
      ASSERT_EQ(f32_bits(after[i]), f32_bits(want)) << w[k].first << " [" << i << "]";
    }
  }
}

TEST(Optim, ClippingAboveAndBelowTheThreshold) {
  // Gradients 3 and −4 in two tensors: the norm is exactly 5.
  Weights w;
  w.emplace_back("a", Tensor(DType::kF32, {1, 1}));
  w.emplace_back("b", Tensor(DType::kF32, {1}));
  w[0].second.ptr<float>()[0] = 1.0f;
  w[1].second.ptr<float>()[0] = 1.0f;
  Weights g;
  g.emplace_back("a", Tensor(DType::kF32, {1, 1}));
  g.emplace_back("b", Tensor(DType::kF32, {1}));
  g[0].second.ptr<float>()[0] = 3.0f;
  g[1].second.ptr<float>()[0] = -4.0f;
  for (double max_norm : {1.0, 5.0, 100.0, 0.0}) {
    AdamWConfig cfg;
    cfg.max_grad_norm = max_norm;
    AdamW opt(w, cfg);
    const StepStats s = opt.step(g);
    EXPECT_EQ(s.grad_norm, 5.0);
    const double want = max_norm > 0 ? std::min(1.0, max_norm / (5.0 + 1e-6)) : 1.0;
    EXPECT_EQ(s.clip_scale, want) << "max_grad_norm " << max_norm;
    if (max_norm == 1.0) {
      EXPECT_LT(s.clip_scale, 1.0);
    } else if (max_norm >= 100.0 || max_norm == 0.0) {
      EXPECT_EQ(s.clip_scale, 1.0);
    }
    // m after one step = (1−β1)·g·clip_scale, rounded once to fp32.
    EXPECT_EQ(opt.m()[0].second.ptr<float>()[0], float((1.0 - 0.9) * (3.0 * want)));
  }
}

TEST(Optim, GradientNormIsTheCanonicalChunkedDoubleSum) {
  const Weights w = make_weights(6);
  // Magnitudes spread over many binades so that the order of the sum matters in its last bits.
  auto gen = test::rng(7);
  Weights g = make_grads(w, 8);
  for (auto& [name, t] : g) {
    float* p = t.ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::ldexp(p[i], int(gen() % 40) - 20);
  }
  AdamWConfig cfg;
  AdamW opt(w, cfg);
  EXPECT_EQ(opt.step(g).grad_norm, reference_norm(g));
}

TEST(Optim, ScheduleKeySteps) {
  AdamWConfig c;
  c.lr = 1e-3;
  EXPECT_EQ(learning_rate(c, 0), 1e-3);
  EXPECT_EQ(learning_rate(c, 1000000), 1e-3);

  c.schedule = LrSchedule::kLinearWarmup;
  c.warmup_steps = 4;
  EXPECT_EQ(learning_rate(c, 0), 1e-3 * 1 / 4);
  EXPECT_EQ(learning_rate(c, 2), 1e-3 * 3 / 4);
  EXPECT_EQ(learning_rate(c, 3), 1e-3);  // warmup's last step reaches the peak
  EXPECT_EQ(learning_rate(c, 4), 1e-3);
  EXPECT_EQ(learning_rate(c, 99), 1e-3);

  c.schedule = LrSchedule::kCosine;
  c.total_steps = 14;  // decay over steps 4..14
  c.min_lr_ratio = 0.1;
  EXPECT_EQ(learning_rate(c, 0), 1e-3 * 1 / 4);
  EXPECT_EQ(learning_rate(c, 3), 1e-3);
  EXPECT_NEAR(learning_rate(c, 4), 1e-3, 1e-18);             // cos(0)
  EXPECT_EQ(learning_rate(c, 9), 1e-3 * (0.1 + 0.9 * 0.5));  // half way: cos(π/2) = 0 exactly
  for (int64_t s = 4; s < 14; ++s) {
    const double p = double(s - 4) / 10.0;
    const double want = 1e-3 * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * p)));
    EXPECT_NEAR(learning_rate(c, s), want, 1e-18) << "step " << s;
    EXPECT_LT(learning_rate(c, s + 1), learning_rate(c, s)) << "step " << s;
  }
  EXPECT_EQ(learning_rate(c, 14), 1e-3 * 0.1);
  EXPECT_EQ(learning_rate(c, 15), 1e-3 * 0.1);
  EXPECT_EQ(learning_rate(c, 1 << 30), 1e-3 * 0.1);
  c.warmup_steps = 0;
  EXPECT_NEAR(learning_rate(c, 0), 1e-3, 1e-18);
  EXPECT_THROW(learning_rate(c, -1), Error);
}

TEST(Optim, ResultDoesNotDependOnThreadCount) {
  const int saved = num_threads();
  const Weights w = make_weights(9);
  Weights state[2], bf16[2];
  for (int r = 0; r < 2; ++r) {
    set_num_threads(r == 0 ? 1 : 3);
    AdamW opt(w, config_all_on());
    for (int s = 0; s < 3; ++s) opt.step(make_grads(w, 200 + s));
    state[r] = opt.state();
    bf16[r] = opt.bf16_weights();
  }
  set_num_threads(saved);
  EXPECT_TRUE(weights_bitwise_equal(state[0], state[1]));
  EXPECT_TRUE(weights_bitwise_equal(bf16[0], bf16[1]));
}

TEST(Optim, StateRoundTripAndContinuation) {
  const Weights w = make_weights(10);
  const AdamWConfig cfg = config_all_on();
  AdamW straight(w, cfg);
  for (int s = 0; s < 5; ++s) straight.step(make_grads(w, 300 + s));

  AdamW first(w, cfg);
  for (int s = 0; s < 2; ++s) first.step(make_grads(w, 300 + s));
  const Weights saved = first.state();
  ASSERT_EQ(saved.size(), 3 * w.size() + 1);
  EXPECT_EQ(saved[0].first, "master/model.embed_tokens.weight");
  EXPECT_EQ(saved[w.size()].first, "m/model.embed_tokens.weight");
  EXPECT_EQ(saved.back().first, "step");
  EXPECT_EQ(saved.back().second.ptr<float>()[0], 2.0f);

  // Entries in another order read the same (the masters' relative order is the weight order):
  // step, the v's, the masters, the m's.
  Weights shuffled;
  const size_t n = w.size();
  std::vector<size_t> order = {3 * n};
  for (size_t base : {2 * n, size_t(0), n}) {
    for (size_t k = 0; k < n; ++k) order.push_back(base + k);
  }
  for (size_t k : order) {
    Tensor t(DType::kF32, saved[k].second.shape());
    std::memcpy(t.data(), saved[k].second.data(), size_t(t.nbytes()));
    shuffled.emplace_back(saved[k].first, std::move(t));
  }
  AdamW resumed = AdamW::from_state(shuffled, cfg);
  EXPECT_EQ(resumed.steps_done(), 2);
  EXPECT_TRUE(weights_bitwise_equal(resumed.state(), saved));
  for (int s = 2; s < 5; ++s) resumed.step(make_grads(w, 300 + s));
  EXPECT_TRUE(weights_bitwise_equal(resumed.state(), straight.state()));
  EXPECT_TRUE(weights_bitwise_equal(resumed.bf16_weights(), straight.bf16_weights()));
}

TEST(Optim, Bf16WeightsRoundEachMasterOnce) {
  const Weights w = make_weights(11);
  AdamW opt(w, AdamWConfig{});
  // Before any step the bf16 weights are the bf16 inputs, bit for bit.
  const Weights b0 = opt.bf16_weights();
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_TRUE(
        bitwise_equal(b0[k].second.data(), w[k].second.data(), w[k].second.numel(), DType::kBF16));
  }
  opt.step(make_grads(w, 12));
  Weights state = opt.state();
  state[2].second.ptr<float>()[5] = f32_from_bits(0xFFC00001u);  // a NaN master, odd payload
  AdamW nan_opt = AdamW::from_state(state, AdamWConfig{});
  const Weights b = nan_opt.bf16_weights();
  for (size_t k = 0; k < w.size(); ++k) {
    ASSERT_EQ(b[k].second.dtype(), DType::kBF16);
    ASSERT_EQ(b[k].second.shape(), w[k].second.shape());
    const float* m = nan_opt.master()[k].second.ptr<float>();
    for (int64_t i = 0; i < w[k].second.numel(); ++i) {
      ASSERT_EQ(b[k].second.ptr<bf16>()[i].bits, f32_to_bf16(m[i]).bits);
    }
  }
  EXPECT_EQ(b[2].second.ptr<bf16>()[5].bits, kCanonicalNanBf16);
}

TEST(Optim, RejectsBadConfigs) {
  auto bad = [](auto edit) {
    AdamWConfig c;
    edit(c);
    return c;
  };
  const std::vector<AdamWConfig> configs = {
      bad([](AdamWConfig& c) { c.lr = 0; }),
      bad([](AdamWConfig& c) { c.lr = -1e-3; }),
      bad([](AdamWConfig& c) { c.lr = NAN; }),
      bad([](AdamWConfig& c) { c.beta1 = 1.0; }),
      bad([](AdamWConfig& c) { c.beta1 = -0.1; }),
      bad([](AdamWConfig& c) { c.beta2 = 1.0; }),
      bad([](AdamWConfig& c) { c.eps = 0; }),
      bad([](AdamWConfig& c) { c.weight_decay = -0.01; }),
      bad([](AdamWConfig& c) { c.max_grad_norm = INFINITY; }),
      bad([](AdamWConfig& c) { c.warmup_steps = 3; }),  // constant schedule
      bad([](AdamWConfig& c) {
        c.schedule = LrSchedule::kLinearWarmup;
        c.warmup_steps = -1;
      }),
      bad([](AdamWConfig& c) { c.schedule = LrSchedule::kCosine; }),  // total_steps = 0
      bad([](AdamWConfig& c) {
        c.schedule = LrSchedule::kCosine;
        c.warmup_steps = 10;
        c.total_steps = 10;
      }),
      bad([](AdamWConfig& c) {
        c.schedule = LrSchedule::kCosine;
        c.total_steps = 10;
        c.min_lr_ratio = 1.5;
      }),
  };
  const Weights w = make_weights(13);
  for (const AdamWConfig& c : configs) {
    EXPECT_THROW(c.validate(), Error) << c.to_string();
    EXPECT_THROW(AdamW(w, c), Error) << c.to_string();
  }
  EXPECT_NO_THROW(config_all_on().validate());
  EXPECT_EQ(config_all_on().to_string(),
            "adamw lr=0.003 betas=(0.9, 0.95) eps=1e-08 weight_decay=0.1 max_grad_norm=50 "
            "schedule=cosine warmup_steps=2 total_steps=6 min_lr_ratio=0.1");
}

TEST(Optim, RejectsBadState) {
  const Weights w = make_weights(14);
  AdamW opt(w, AdamWConfig{});
  opt.step(make_grads(w, 15));
  const Weights good = opt.state();
  auto edited = [&](auto edit) {
    Weights s;
    for (const auto& [name, t] : good) {
      Tensor c(t.dtype(), t.shape());
      std::memcpy(c.data(), t.data(), size_t(t.nbytes()));
      s.emplace_back(name, std::move(c));
    }
    edit(s);
    return s;
  };
  auto set_step = [](float x) { return [x](Weights& s) { s.back().second.ptr<float>()[0] = x; }; };
  const std::vector<std::pair<const char*, Weights>> cases = {
      {"missing m", edited([](Weights& s) { s.erase(s.begin() + 3); })},
      {"missing step", edited([](Weights& s) { s.pop_back(); })},
      {"extra entry",
       edited([](Weights& s) { s.emplace_back("m/extra", Tensor(DType::kF32, {1})); })},
      {"duplicate", edited([](Weights& s) {
         s.emplace_back("step", Tensor(DType::kF32, {1}));
         s.back().second.ptr<float>()[0] = 1.0f;
       })},
      {"wrong shape", edited([](Weights& s) {
         s[4].second = Tensor(DType::kF32, {8, 17});
       })},
      {"wrong dtype", edited([](Weights& s) {
         s[6].second = Tensor(DType::kBF16, {17, 8});
       })},
      {"step shape", edited([](Weights& s) { s.back().second = Tensor(DType::kF32, {2}); })},
      {"step -1", edited(set_step(-1.0f))},
      {"step 1.5", edited(set_step(1.5f))},
      {"step NaN", edited(set_step(NAN))},
      {"step 2^24", edited(set_step(16777216.0f))},
      {"no masters", Weights{}},
  };
  EXPECT_NO_THROW(AdamW::from_state(good, AdamWConfig{}));
  for (const auto& [what, s] : cases) {
    EXPECT_THROW(AdamW::from_state(s, AdamWConfig{}), Error) << what;
  }
  AdamWConfig bad;
  bad.lr = 0;
  EXPECT_THROW(AdamW::from_state(good, bad), Error);
}

TEST(Optim, RefusesBadGradientsChangingNothing) {
  const Weights w = make_weights(16);
  AdamW opt(w, config_all_on());
  opt.step(make_grads(w, 17));
  const Weights before = opt.state();
  auto expect_refused = [&](Weights g, const std::string& needle) {
    try {
      opt.step(g);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(opt.steps_done(), 1);
    EXPECT_TRUE(weights_bitwise_equal(opt.state(), before)) << needle;
  };
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Weights g = make_grads(w, 18);
    g[2].second.ptr<float>()[70000] = bad;  // in the last tensor's second norm chunk
    g[1].second.ptr<float>()[3] = bad;      // the first tensor with a non-finite gradient
    expect_refused(std::move(g), "non-finite gradient in 'model.norm.weight'");
  }
  {  // a finite gradient so large its square overflows fp32 (not double): accepted
    Weights g = make_grads(w, 19);
    g[0].second.ptr<float>()[0] = 3e38f;
    AdamW other(w, config_all_on());
    const StepStats s = other.step(g);
    EXPECT_TRUE(std::isfinite(s.grad_norm));
    EXPECT_GT(s.grad_norm, 3e38);
  }
  Weights fewer = make_grads(w, 20);
  fewer.pop_back();
  expect_refused(std::move(fewer), "expected 3 gradients");
  Weights renamed = make_grads(w, 21);
  renamed[1].first = "model.norm.bias";
  expect_refused(std::move(renamed), "model.norm.bias");
  Weights reshaped = make_grads(w, 22);
  reshaped[0].second = Tensor(DType::kF32, {8, 17});
  expect_refused(std::move(reshaped), "shape [8, 17]");
  Weights bf = make_grads(w, 23);
  bf[0].second = Tensor(DType::kBF16, {17, 8});
  expect_refused(std::move(bf), "must be f32");
}

}  // namespace
}  // namespace lockstep::engine
