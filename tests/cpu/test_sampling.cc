// Sampling: the row uniform and the baseline's noise (Philox known answers), the target, the
// choice as the contract writes it, determinism and thread-count independence, row invariance
// inside batches, the recorded logp/lse/entropy equal to linear_logprob, the distribution
// (chi-square vs softmax, also after filters), top-k/top-p/min-p sets on hand-built logits, ties
// to the lowest index, greedy, and bad inputs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/math.h"
#include "core/philox.h"
#include "core/sample_choice.h"
#include "core/thread_pool.h"
#include "lockstep/contract.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/sampling.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::bitwise_equal;

// T, H, V: tokens, hidden, vocab.
struct Result {
  std::vector<int64_t> ids;
  std::vector<float> logp, lse, entropy;
};

struct Rows {
  std::vector<SamplingParams> params;
  std::vector<int64_t> request_ids, positions;
};

// Runs `sample_fn(request_ids, positions, ids, logp, lse, entropy)` (a sample or sample_logits
// call over T rows) on fresh buffers and collects what it wrote.
template <typename F>
Result run_rows(int64_t T, const Rows& rows, F&& sample_fn) {
  Tensor rid(DType::kI64, {T}), pos(DType::kI64, {T});
  std::copy(rows.request_ids.begin(), rows.request_ids.end(), rid.ptr<int64_t>());
  std::copy(rows.positions.begin(), rows.positions.end(), pos.ptr<int64_t>());
  Tensor ids = test::poisoned(DType::kI64, {T}), lp = test::poisoned(DType::kF32, {T}),
         ls = test::poisoned(DType::kF32, {T}), en = test::poisoned(DType::kF32, {T});
  sample_fn(rid.view(), pos.view(), ids.view(), lp.view(), ls.view(), en.view());
  Result r;
  r.ids.assign(ids.ptr<int64_t>(), ids.ptr<int64_t>() + T);
  r.logp.assign(lp.ptr<float>(), lp.ptr<float>() + T);
  r.lse.assign(ls.ptr<float>(), ls.ptr<float>() + T);
  r.entropy.assign(en.ptr<float>(), en.ptr<float>() + T);
  return r;
}

Result run(const TensorView& h, const TensorView& w, const Rows& rows, const ContractConfig& cfg) {
  return run_rows(h.size(0), rows, [&](auto rid, auto pos, auto ids, auto lp, auto ls, auto en) {
    cpu::sample(h, w, rows.params, rid, pos, cfg, ids, lp, ls, en);
  });
}

::testing::AssertionResult results_equal(const Result& a, const Result& b) {
  if (a.ids != b.ids) return ::testing::AssertionFailure() << "sampled ids differ";
  auto r = bitwise_equal(a.logp, b.logp);
  if (!r) return r << " (logp)";
  r = bitwise_equal(a.lse, b.lse);
  if (!r) return r << " (lse)";
  r = bitwise_equal(a.entropy, b.entropy);
  if (!r) return r << " (entropy)";
  return ::testing::AssertionSuccess();
}

Result row_of(const Result& r, int64_t t) {
  size_t i = size_t(t);
  return Result{{r.ids[i]}, {r.logp[i]}, {r.lse[i]}, {r.entropy[i]}};
}

ContractConfig config(int vocab_tile, int vocab_segments, int gemm_segments = 1) {
  ContractConfig c;
  c.vocab_tile = vocab_tile;
  c.vocab_segments = vocab_segments;
  c.gemm_segments = gemm_segments;
  return c;
}

SamplingParams params(uint64_t seed, float temperature, int64_t top_k = 0, float top_p = 1.0f,
                      float min_p = 0.0f) {
  SamplingParams p;
  p.seed = seed;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

// Random per-row settings covering greedy, plain and filtered sampling.
SamplingParams random_params(std::mt19937_64& g) {
  static const float kTemps[] = {0.0f, 0.6f, 1.0f, 1.7f};
  SamplingParams p = params(g(), kTemps[g() % 4]);
  switch (g() % 4) {
    case 0:
      break;
    case 1:
      p.top_k = int64_t(1 + g() % 50);
      break;
    case 2:
      p.top_p = 0.5f + 0.1f * float(g() % 5);
      break;
    case 3:
      p.min_p = 0.05f * float(1 + g() % 5);
      break;
  }
  return p;
}

Rows random_rows(int64_t T, std::mt19937_64& g) {
  Rows r;
  for (int64_t t = 0; t < T; ++t) {
    r.params.push_back(random_params(g));
    r.request_ids.push_back(int64_t(g()));
    r.positions.push_back(int64_t(g() % 100000));
  }
  return r;
}

// h = e_0 (one-hot) so z[v] = W[v, 0] exactly: hand-built logits in bf16.
void one_hot_problem(const std::vector<float>& logits, int64_t T, Tensor* h, Tensor* w) {
  const int64_t H = 16, V = int64_t(logits.size());
  *h = Tensor(DType::kBF16, {T, H});
  *w = Tensor(DType::kBF16, {V, H});
  for (int64_t i = 0; i < T * H; ++i) h->ptr<bf16>()[i] = f32_to_bf16(i % H == 0 ? 1.0f : 0.0f);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t k = 0; k < H; ++k)
      w->ptr<bf16>()[v * H + k] = f32_to_bf16(k == 0 ? logits[size_t(v)] : 0.0f);
}

// lse of a row as the LogP op computes it (tile of 8, one segment, padding -inf).
float row_lse(std::vector<float> y) {
  while (y.size() % 8) y.push_back(-INFINITY);
  std::vector<LogprobState> tiles;
  for (size_t i = 0; i < y.size(); i += 8) tiles.push_back(logprob_tile_state(y.data() + i, 8));
  LogprobState st;
  for (const auto& t : tiles) st = logprob_merge(st, t);
  float lse, ent;
  logprob_finish(st, &lse, &ent);
  return lse;
}

std::vector<float> logs(const std::vector<double>& probs) {
  std::vector<float> y;
  for (double p : probs) y.push_back(p > 0 ? float(std::log(p)) : -INFINITY);
  return y;
}

// The per-entry Gumbel noise (the baseline backend's sampler; the contract's choice until 0.5).
TEST(SamplingNoise, MappingMatchesPhiloxKnownAnswers) {
  // seed 0, request 0, position 0: counter (0, 0, 0, 0), key (0, 0) -> Random123's vector.
  const uint32_t kat[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  for (int v = 0; v < 4; ++v) EXPECT_EQ(sampling_noise_word(0, 0, 0, v), kat[v]) << v;
  // All words: counter (v >> 2, position, rid lo, rid hi), key (seed lo, seed hi), word v & 3.
  const uint64_t seed = 0x299f31d0a4093822ull, rid = 0x03707344'13198a2eull;
  const uint32_t pos = 0x85a308d3u;
  const uint32_t kat2[4] = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
  const int64_t v0 = int64_t(0x243f6a88u) * 4;
  for (int j = 0; j < 4; ++j) EXPECT_EQ(sampling_noise_word(seed, rid, pos, v0 + j), kat2[j]);
  // g = -log(-log(u)), u from the top 23 bits.
  for (int v = 0; v < 4; ++v) {
    double u = (double(kat[v] >> 9) + 0.5) / 8388608.0;
    EXPECT_NEAR(sampling_gumbel(0, 0, 0, v), -std::log(-std::log(u)), 2e-6);
    EXPECT_EQ(f32_bits(sampling_gumbel(0, 0, 0, v)),
              f32_bits(-ls_logf(-ls_logf(philox_uniform(kat[v])))));
  }
}

TEST(SamplingNoise, DifferentKeysAndCountersGiveDifferentNoise) {
  auto g = test::rng(1);
  const uint64_t seed = g(), rid = g();
  const uint32_t pos = uint32_t(g() % 1000000);
  struct Variant {
    const char* what;
    uint64_t seed, rid;
    uint32_t pos;
  };
  const Variant variants[] = {{"seed+1", seed + 1, rid, pos},
                              {"seed high word", seed ^ (1ull << 40), rid, pos},
                              {"request+1", seed, rid + 1, pos},
                              {"request high word", seed, rid ^ (1ull << 33), pos},
                              {"position+1", seed, rid, pos + 1}};
  const int64_t V = 4000;
  for (const Variant& var : variants) {
    int64_t same = 0;
    for (int64_t v = 0; v < V; ++v)
      same += sampling_noise_word(seed, rid, pos, v) ==
              sampling_noise_word(var.seed, var.rid, var.pos, v);
    EXPECT_LE(same, 2) << var.what;
  }
  // Neighbouring vocab entries differ too (4 words of one Philox call, then the next call).
  std::set<uint32_t> words;
  for (int64_t v = 0; v < V; ++v) words.insert(sampling_noise_word(seed, rid, pos, v));
  EXPECT_GE(int64_t(words.size()), V - 2);
}

TEST(SamplingUniform, OnePhiloxCallPerRow) {
  auto g = test::rng(21);
  for (int i = 0; i < 50; ++i) {
    const uint64_t seed = g(), rid = g();
    const uint32_t pos = uint32_t(g());
    const Philox4 w = philox4x32_10(Philox4{{0xffffffffu, pos, uint32_t(rid), uint32_t(rid >> 32)}},
                                    uint32_t(seed), uint32_t(seed >> 32));
    EXPECT_EQ(sampling_uniform(seed, rid, pos), (uint64_t(w.v[0]) << 32) | w.v[1]);
    // Each input moves it (high words included).
    EXPECT_NE(sampling_uniform(seed, rid, pos), sampling_uniform(seed ^ (1ull << 40), rid, pos));
    EXPECT_NE(sampling_uniform(seed, rid, pos), sampling_uniform(seed, rid ^ (1ull << 33), pos));
    EXPECT_NE(sampling_uniform(seed, rid, pos), sampling_uniform(seed, rid, pos + 1));
  }
}

TEST(SamplingUniform, TargetIsTheHighWordOfTheProduct) {
  const uint64_t kMax = ~uint64_t(0);
  for (uint64_t q : {uint64_t(1), uint64_t(7), uint64_t(1) << 32, (uint64_t(1) << 40) + 3, kMax}) {
    EXPECT_EQ(sampling_target(0, q), 0u) << q;
    EXPECT_EQ(sampling_target(kMax, q), q - 1) << q;  // always below Q
  }
  EXPECT_EQ(sampling_target(uint64_t(1) << 63, 3), 1u);
  EXPECT_EQ(sampling_target(uint64_t(1) << 63, 4), 2u);
  auto g = test::rng(22);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t u = g(), q = i % 2 ? g() : g() >> 29;
    EXPECT_EQ(sampling_target(u, q), uint64_t((unsigned __int128)u * q >> 64)) << u << " " << q;
  }
}

// The sampler kernels' short forms (sample_expf_normal: the exponent added, not two products;
// sample_q32: a 32-bit conversion below 2^32) give ls_expf's and sample_mass_q32's bits: every
// 251st float of [−86, 88] here, every float of it once by dev/sample_mass_sweep.cc.
TEST(SamplingMass, ShortFormsAreTheSpecsBits) {
  int64_t checked = 0, bad = 0;
  float first_bad = 0.0f;
  auto check = [&](uint32_t u) {
    const float d = f32_from_bits(u);
    const bool same_p = f32_bits(sample_expf_normal(d)) == f32_bits(ls_expf(d));
    const bool same_q =
        !(d >= -23.0f && d <= 22.0f) || sample_q32(sample_expf_normal(d)) == sample_mass_q32(d);
    ++checked;
    if (!(same_p && same_q) && bad++ == 0) first_bad = d;
  };
  for (uint64_t u = 0x80000000u; u <= 0xc2ac0000u; u += 251) check(uint32_t(u));  // −0 .. −86
  for (uint64_t u = 0; u <= 0x42b00000u; u += 251) check(uint32_t(u));            // +0 .. 88
  for (float d : {0.0f, -0.0f, -23.0f, -0x1p-24f, -0x1p-30f, -86.0f, 88.0f, 22.0f})
    check(f32_bits(d));
  EXPECT_GT(checked, 8'000'000);
  EXPECT_EQ(bad, 0) << "first at d = " << first_bad;
  EXPECT_EQ(sample_q32(1.0f), uint64_t(1) << 32);
  EXPECT_EQ(sample_q32(0.0f), 0u);
  EXPECT_EQ(sample_mass_q32(0.0f), uint64_t(1) << 32);
}

// §S.7 written out: masses of the candidates (ascending ids), the row's target, the first id
// whose inclusive prefix exceeds it; against cpu::sample end to end on hand-built rows.
TEST(SamplingChoice, IdIsTheTargetsMassInterval) {
  auto g = test::rng(23);
  const int64_t N = 400;
  for (int64_t V : {3, 9, 40}) {
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = bf16_to_f32(f32_to_bf16(float(int(g() % 200) - 100) / 16.0f));
    logits[size_t(V / 2)] = -INFINITY;
    Tensor h, w;
    one_hot_problem(logits, N, &h, &w);
    for (SamplingParams p :
         {params(g(), 1.0f), params(g(), 0.4f), params(g(), 1.0f, 2), params(g(), 1.3f, 0, 0.7f),
          params(g(), 1.0f, 0, 1.0f, 0.1f), params(g(), 2.0f, 5, 0.9f, 0.02f)}) {
      std::vector<float> y(logits.size());
      for (size_t v = 0; v < y.size(); ++v) y[v] = logits[v] / p.temperature;
      const float lse = row_lse(y);
      const std::vector<int64_t> cand = sampling_candidates(y.data(), V, lse, p);
      auto mass = [&](int64_t v) { return uint64_t(ls_expf(y[size_t(v)] - lse) * 0x1p32f); };
      uint64_t total = 0;
      for (int64_t v : cand) total += mass(v);
      Rows rows;
      std::vector<int64_t> want;
      for (int64_t i = 0; i < N; ++i) {
        rows.params.push_back(p);
        rows.request_ids.push_back(int64_t(g()));
        rows.positions.push_back(int64_t(g() % 100000));
        const uint64_t target =
            sampling_target(sampling_uniform(p.seed, uint64_t(rows.request_ids.back()),
                                             uint32_t(rows.positions.back())),
                            total);
        uint64_t cum = 0;
        for (int64_t v : cand) {
          cum += mass(v);
          if (cum > target) {
            want.push_back(v);
            break;
          }
        }
      }
      Result r = run(h.view(), w.view(), rows, config(8, 1));
      EXPECT_EQ(r.ids, want) << p.to_string() << " V=" << V;
    }
  }
}

TEST(SamplingDeterminism, SameSeedSameIdsAnyThreadCount) {
  auto g = test::rng(2);
  const int64_t T = 23, H = 32, V = 500;
  Tensor h = test::random_bf16({T, H}, g, 1.5f), w = test::random_bf16({V, H}, g);
  Rows rows = random_rows(T, g);
  const ContractConfig cfg = config(64, 2, 2);
  const int saved = num_threads();
  set_num_threads(1);
  Result one = run(h.view(), w.view(), rows, cfg);
  set_num_threads(3);
  Result three = run(h.view(), w.view(), rows, cfg);
  Result again = run(h.view(), w.view(), rows, cfg);
  set_num_threads(saved);
  EXPECT_TRUE(results_equal(one, three));
  EXPECT_TRUE(results_equal(three, again));
  // A single row (its GEMM and tiles spread over the pool) vs the same row with 1 thread.
  Rows r0{{rows.params[0]}, {rows.request_ids[0]}, {rows.positions[0]}};
  set_num_threads(3);
  Result a = run(h.view().rows(0, 1), w.view(), r0, cfg);
  set_num_threads(1);
  Result b = run(h.view().rows(0, 1), w.view(), r0, cfg);
  set_num_threads(saved);
  EXPECT_TRUE(results_equal(a, b));
  EXPECT_TRUE(results_equal(a, row_of(one, 0)));
}

// Vocab-parallel sampling: the logits of row ranges of the lm_head (shards of any sizes, one
// empty), placed side by side in a strided [T, V] buffer, sample to sample()'s ids and values.
TEST(SamplingVocabParallel, ShardLogitsSideBySideSampleLikeTheWholeHead) {
  auto g = test::rng(12);
  const int64_t T = 19, H = 48, V = 611;
  Tensor h = test::random_bf16({T, H}, g, 1.5f), w = test::random_bf16({V, H}, g);
  Rows rows = random_rows(T, g);
  const ContractConfig cfg = config(64, 4, 2);
  const Result want = run(h.view(), w.view(), rows, cfg);
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, V}, {0, 256, 512, V}, {0, 1, 300, 300, V}}) {
    Tensor zbuf = test::poisoned(DType::kF32, {T, V + 5});  // row stride V + 5
    TensorView z = zbuf.view();
    z.shape[1] = V;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      TensorView zs = z;
      zs.data = z.ptr<float>() + cuts[i];
      zs.shape[1] = cuts[i + 1] - cuts[i];
      cpu::lm_head_logits(h.view(), w.view().rows(cuts[i], cuts[i + 1]), cfg, zs);
    }
    const Result got =
        run_rows(T, rows, [&](auto rid, auto pos, auto ids, auto lp, auto ls, auto en) {
          cpu::sample_logits(z, rows.params, rid, pos, cfg, ids, lp, ls, en);
        });
    EXPECT_TRUE(results_equal(want, got)) << cuts.size() - 1 << " shards";
  }
  // Bad arguments.
  Tensor z(DType::kF32, {T, V}), zbad(DType::kF32, {T, V - 1}), rid(DType::kI64, {T}),
      pos(DType::kI64, {T}), ids(DType::kI64, {T}), lp(DType::kF32, {T}), ls(DType::kF32, {T}),
      en(DType::kF32, {T});
  test::expect_error_mentioning([&] { cpu::lm_head_logits(h.view(), w.view(), cfg, zbad.view()); },
                                "'z'");
  test::expect_error_mentioning(
      [&] {
        cpu::sample_logits(z.view(), std::span<const SamplingParams>(rows.params).first(3),
                           rid.view(), pos.view(), cfg, ids.view(), lp.view(), ls.view(),
                           en.view());
      },
      "expected 19 entries");
  Tensor z3(DType::kF32, {T, 2, 3});
  test::expect_error_mentioning(
      [&] {
        cpu::sample_logits(z3.view(), rows.params, rid.view(), pos.view(), cfg, ids.view(),
                           lp.view(), ls.view(), en.view());
      },
      "expected shape [T, V]");
}

TEST(SamplingInvariance, I32IdsAndStridedViews) {
  // i32 positions / token ids, row-strided h and W, strided outputs: same result as the plain
  // contiguous i64 call.
  auto g = test::rng(11);
  const int64_t T = 11, H = 32, V = 257;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g);
  Rows rows = random_rows(T, g);
  const ContractConfig cfg = config(16, 2);
  Result ref = run(h.view(), w.view(), rows, cfg);
  Tensor hb = test::random_bf16({T, H + 16}, g), wb = test::random_bf16({V, H + 8}, g);
  for (int64_t t = 0; t < T; ++t)
    std::copy(h.ptr<bf16>() + t * H, h.ptr<bf16>() + (t + 1) * H, hb.ptr<bf16>() + t * (H + 16));
  for (int64_t v = 0; v < V; ++v)
    std::copy(w.ptr<bf16>() + v * H, w.ptr<bf16>() + (v + 1) * H, wb.ptr<bf16>() + v * (H + 8));
  TensorView hv = hb.view(), wv = wb.view();
  hv.shape[1] = H;
  wv.shape[1] = H;
  Tensor rid(DType::kI64, {T}), pos(DType::kI32, {T}), ids = test::poisoned(DType::kI32, {2 * T});
  Tensor out = test::poisoned(DType::kF32, {3, 2 * T});
  for (int64_t t = 0; t < T; ++t) {
    rid.ptr<int64_t>()[t] = rows.request_ids[size_t(t)];
    pos.ptr<int32_t>()[t] = int32_t(rows.positions[size_t(t)]);
  }
  TensorView idv = ids.view(), ov[3];
  idv.shape[0] = T;
  idv.stride[0] = 2;
  for (int i = 0; i < 3; ++i) {
    ov[i] = TensorView::contiguous(out.ptr<float>() + i * 2 * T, DType::kF32, {T});
    ov[i].stride[0] = 2;
  }
  cpu::sample(hv, wv, rows.params, rid.view(), pos.view(), cfg, idv, ov[0], ov[1], ov[2]);
  Result r;
  for (int64_t t = 0; t < T; ++t) {
    r.ids.push_back(ids.ptr<int32_t>()[2 * t]);
    r.logp.push_back(out.ptr<float>()[2 * t]);
    r.lse.push_back(out.ptr<float>()[2 * T + 2 * t]);
    r.entropy.push_back(out.ptr<float>()[4 * T + 2 * t]);
    EXPECT_EQ(uint32_t(ids.ptr<int32_t>()[2 * t + 1]), 0xA5A5A5A5u);
  }
  EXPECT_TRUE(results_equal(r, ref));
}

TEST(SamplingInvariance, RowAloneVsInsideBatches) {
  auto g = test::rng(3);
  const int64_t H = 32, V = 300;
  const ContractConfig cfg = config(32, 4, 2);
  Tensor w = test::random_bf16({V, H}, g);
  for (SamplingParams p : {params(g(), 0.8f), params(g(), 1.0f, 5), params(g(), 1.2f, 0, 0.7f),
                           params(g(), 0.0f), params(g(), 1.0f, 0, 1.0f, 0.1f)}) {
    Tensor x = test::random_bf16({1, H}, g, 1.5f);
    const int64_t rid = int64_t(g()), pos = int64_t(g() % 4096);
    Result alone = run(x.view(), w.view(), Rows{{p}, {rid}, {pos}}, cfg);
    for (int64_t T : {1, 3, 17, 256}) {
      for (int64_t at : {int64_t(0), T - 1}) {
        Tensor h = test::random_bf16({T, H}, g, 1.5f);
        std::copy(x.ptr<bf16>(), x.ptr<bf16>() + H, h.ptr<bf16>() + at * H);
        Rows rows = random_rows(T, g);
        rows.params[size_t(at)] = p;
        rows.request_ids[size_t(at)] = rid;
        rows.positions[size_t(at)] = pos;
        Result r = run(h.view(), w.view(), rows, cfg);
        EXPECT_TRUE(results_equal(row_of(r, at), alone)) << p.to_string() << " T=" << T;
      }
    }
  }
}

TEST(SamplingRecordedLogp, EqualsLinearLogprobOfSampledIds) {
  // The rollout records (logp, lse, entropy) of the sampled token; training recomputes them with
  // linear_logprob(targets = sampled ids, temperature = logprob_temperature()): same bits.
  auto g = test::rng(4);
  const int64_t T = 41, H = 48, V = 1000;
  for (ContractConfig cfg : {config(256, 1), config(64, 2, 2), config(32, 8, 4)}) {
    Tensor h = test::random_bf16({T, H}, g, 1.5f), w = test::random_bf16({V, H}, g);
    Rows rows = random_rows(T, g);
    Result s = run(h.view(), w.view(), rows, cfg);
    Tensor targets(DType::kI64, {T});
    std::copy(s.ids.begin(), s.ids.end(), targets.ptr<int64_t>());
    std::map<float, int> seen;
    for (int64_t t = 0; t < T; ++t) {
      const float temp = rows.params[size_t(t)].logprob_temperature();
      if (seen.count(temp)) continue;
      seen[temp] = 1;
      Tensor lp(DType::kF32, {T}), ls(DType::kF32, {T}), en(DType::kF32, {T});
      cpu::linear_logprob(h.view(), w.view(), targets.view(), LogprobParams{temp}, cfg, lp.view(),
                          ls.view(), en.view());
      for (int64_t u = 0; u < T; ++u) {
        if (rows.params[size_t(u)].logprob_temperature() != temp) continue;
        EXPECT_EQ(f32_bits(s.logp[size_t(u)]), f32_bits(lp.ptr<float>()[u])) << "row " << u;
        EXPECT_EQ(f32_bits(s.lse[size_t(u)]), f32_bits(ls.ptr<float>()[u])) << "row " << u;
        EXPECT_EQ(f32_bits(s.entropy[size_t(u)]), f32_bits(en.ptr<float>()[u])) << "row " << u;
      }
    }
  }
}

// Contract 0.3: the sampler's logits are one K segment whatever gemm_segments (§L.4, the lm_head
// is vocab-parallel): ids and recorded values are the same bits for gemm_segments 1/2/4/8.
TEST(SamplingContract, GemmSegmentsDoNotChangeTheSample) {
  auto g = test::rng(9);
  const int64_t T = 23, H = 200, V = 900;
  Tensor h = test::random_bf16({T, H}, g, 1.5f), w = test::random_bf16({V, H}, g);
  Rows rows = random_rows(T, g);
  const Result ref = run(h.view(), w.view(), rows, config(64, 2, 1));
  for (int S : {2, 4, 8}) {
    const Result got = run(h.view(), w.view(), rows, config(64, 2, S));
    EXPECT_EQ(got.ids, ref.ids) << "gemm_segments=" << S;
    EXPECT_TRUE(test::bitwise_equal(got.logp, ref.logp)) << "gemm_segments=" << S;
    EXPECT_TRUE(test::bitwise_equal(got.lse, ref.lse)) << "gemm_segments=" << S;
    EXPECT_TRUE(test::bitwise_equal(got.entropy, ref.entropy)) << "gemm_segments=" << S;
  }
}

// Pearson chi-square of `counts` against probabilities `p` (only cells with p > 0).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "cell " << i << " has probability 0";
      continue;
    }
    double e = p[i] * double(n);
    x2 += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
  }
  return x2;
}

TEST(SamplingDistribution, MassChoiceMatchesSoftmax) {
  // V = 8 hand-built logits, N samples at distinct positions. Chi-square with 7 (or fewer)
  // degrees of freedom; thresholds at a false-alarm rate of 1e-7 (df 7: 45.7, df 2: 32.2,
  // df 3: 35.4).
  auto g = test::rng(5);
  const std::vector<float> logits = {0.5f, -1.0f, 1.25f, 0.0f, -0.5f, 2.0f, 0.25f, -2.0f};
  const int64_t N = 40000, V = 8;
  Tensor h, w;
  one_hot_problem(logits, N, &h, &w);
  struct Case {
    SamplingParams p;
    std::vector<double> prob;  // expected, from the plain math
    double threshold;
  };
  auto softmax = [&](float temp, const std::vector<int>& keep) {
    std::vector<double> p(size_t(V), 0.0);
    double s = 0;
    for (int v : keep) s += std::exp(double(logits[size_t(v)]) / temp);
    for (int v : keep) p[size_t(v)] = std::exp(double(logits[size_t(v)]) / temp) / s;
    return p;
  };
  const uint64_t seed = g();
  // Sorted by logit: 5 (2.0), 2 (1.25), 0 (0.5), 6 (0.25), 3 (0), 4, 1, 7.
  std::vector<Case> cases = {
      {params(seed, 1.0f), softmax(1.0f, {0, 1, 2, 3, 4, 5, 6, 7}), 45.7},
      {params(seed, 0.7f), softmax(0.7f, {0, 1, 2, 3, 4, 5, 6, 7}), 45.7},
      {params(seed, 1.6f, 3), softmax(1.6f, {5, 2, 0}), 32.2},
      // p at T=1: 5: .464, 2: .219, 0: .104, 6: .081 (cum .464, .683, .787, .868): top-p 0.8
      // keeps {5, 2, 0, 6}.
      {params(seed, 1.0f, 0, 0.8f), softmax(1.0f, {5, 2, 0, 6}), 35.4},
      // min-p 0.2: keep p >= 0.093 -> {5, 2, 0}.
      {params(seed, 1.0f, 0, 1.0f, 0.2f), softmax(1.0f, {5, 2, 0}), 32.2},
  };
  for (const Case& c : cases) {
    Rows rows;
    for (int64_t i = 0; i < N; ++i) {
      rows.params.push_back(c.p);
      rows.request_ids.push_back(77);
      rows.positions.push_back(i);
    }
    Result r = run(h.view(), w.view(), rows, config(8, 1));
    std::vector<int64_t> counts(size_t(V), 0);
    for (int64_t id : r.ids) counts[size_t(id)]++;
    double x2 = chi_square(counts, c.prob, N);
    EXPECT_LT(x2, c.threshold) << c.p.to_string();
    std::printf("[lockstep] chi-square %.2f for %s\n", x2, c.p.to_string().c_str());
  }
}

TEST(SamplingFilters, HandBuiltSets) {
  // Probabilities by index: 0: .05, 1: .4, 2: .1, 3: .3, 4: .15 (sorted: 1, 3, 4, 2, 0).
  const std::vector<float> y = logs({0.05, 0.4, 0.1, 0.3, 0.15});
  const float lse = row_lse(y);
  const int64_t V = 5;
  using Set = std::vector<int64_t>;
  auto cand = [&](SamplingParams p) { return sampling_candidates(y.data(), V, lse, p); };
  EXPECT_EQ(cand(params(0, 1.0f)), (Set{0, 1, 2, 3, 4}));
  EXPECT_EQ(cand(params(0, 1.0f, 5)), (Set{0, 1, 2, 3, 4}));  // k >= V: off
  EXPECT_EQ(cand(params(0, 1.0f, 99)), (Set{0, 1, 2, 3, 4}));
  EXPECT_EQ(cand(params(0, 1.0f, 1)), (Set{1}));
  EXPECT_EQ(cand(params(0, 1.0f, 2)), (Set{1, 3}));
  EXPECT_EQ(cand(params(0, 1.0f, 3)), (Set{1, 3, 4}));
  EXPECT_EQ(cand(params(0, 1.0f, 0, 0.39f)), (Set{1}));          // .4 >= .39
  EXPECT_EQ(cand(params(0, 1.0f, 0, 0.5f)), (Set{1, 3}));        // .4 < .5 <= .7
  EXPECT_EQ(cand(params(0, 1.0f, 0, 0.8f)), (Set{1, 3, 4}));     // .7 < .8 <= .85
  EXPECT_EQ(cand(params(0, 1.0f, 0, 0.9f)), (Set{1, 2, 3, 4}));  // .85 < .9 <= .95
  EXPECT_EQ(cand(params(0, 1.0f, 0, 0.97f)), (Set{0, 1, 2, 3, 4}));
  // top-p after top-k is relative to the top-k mass: {1, 3} has .7, 0.5·.7 = .35 <= .4.
  EXPECT_EQ(cand(params(0, 1.0f, 2, 0.5f)), (Set{1}));
  EXPECT_EQ(cand(params(0, 1.0f, 3, 0.6f)), (Set{1, 3}));  // .85·.6 = .51: .4 < .51 <= .7
  // min-p: p >= min_p · p_max.
  EXPECT_EQ(cand(params(0, 1.0f, 0, 1.0f, 0.3f)), (Set{1, 3, 4}));  // >= .12
  EXPECT_EQ(cand(params(0, 1.0f, 0, 1.0f, 0.5f)), (Set{1, 3}));     // >= .2
  EXPECT_EQ(cand(params(0, 1.0f, 0, 1.0f, 1.0f)), (Set{1}));
  EXPECT_EQ(cand(params(0, 1.0f, 0, 1.0f, 0.1f)), (Set{0, 1, 2, 3, 4}));  // >= .04
  // All three: top-k 4 {1, 3, 4, 2}, top-p .9 of .95 = .855 -> {1, 3, 4, 2}, min-p .3 -> {1, 3, 4}.
  EXPECT_EQ(cand(params(0, 1.0f, 4, 0.9f, 0.3f)), (Set{1, 3, 4}));
  // -inf logits are candidates of probability 0 only when a filter reaches them.
  const std::vector<float> yi = {0.0f, -INFINITY, 1.0f, -INFINITY};
  EXPECT_EQ(sampling_candidates(yi.data(), 4, row_lse(yi), params(0, 1.0f, 0, 0.99f)), (Set{0, 2}));
}

// The filters written the plain way (full sort, then the contract's definitions).
std::vector<int64_t> reference_candidates(const std::vector<float>& y, float lse,
                                          const SamplingParams& p) {
  const int64_t V = int64_t(y.size());
  std::vector<int64_t> order(y.size());
  for (int64_t v = 0; v < V; ++v) order[size_t(v)] = v;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return y[size_t(a)] > y[size_t(b)] || (y[size_t(a)] == y[size_t(b)] && a < b);
  });
  auto prob = [&](int64_t v) { return ls_expf(y[size_t(v)] - lse); };
  int64_t n = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  if (p.top_p < 1.0f) {
    uint64_t total = 0;
    for (int64_t i = 0; i < n; ++i) total += uint64_t(prob(order[size_t(i)]) * 0x1p32f);
    const uint64_t thr = uint64_t(std::ceil(double(p.top_p) * double(total)));
    uint64_t cum = 0;
    int64_t keep = 0;
    while (keep < n && (keep == 0 || cum < thr))
      cum += uint64_t(prob(order[size_t(keep++)]) * 0x1p32f);
    n = keep;
  }
  std::vector<int64_t> kept(order.begin(), order.begin() + n);
  if (p.min_p > 0.0f) {
    const float thr = p.min_p * prob(order[0]);
    std::erase_if(kept, [&](int64_t v) { return !(prob(v) >= thr); });
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(SamplingFilters, MatchPlainDefinitionOnRandomRows) {
  // Long top-p prefixes (beyond the first partially sorted block), ties from bf16-like rounding.
  auto g = test::rng(10);
  for (float scale : {0.05f, 1.0f, 4.0f}) {
    for (int64_t V : {7, 1000, 5000}) {
      std::vector<float> y(static_cast<size_t>(V));
      test::fill_f32(y.data(), V, g, scale);
      for (float& v : y) v = bf16_to_f32(f32_to_bf16(v));  // many exact ties
      const float lse = row_lse(y);
      for (SamplingParams p : {params(0, 1.0f, 0, 0.9f), params(0, 1.0f, 0, 0.3f),
                               params(0, 1.0f, 40, 0.95f), params(0, 1.0f, 0, 1.0f, 0.3f),
                               params(0, 1.0f, 3000, 0.99f, 0.01f), params(0, 1.0f, 1)}) {
        EXPECT_EQ(sampling_candidates(y.data(), V, lse, p), reference_candidates(y, lse, p))
            << p.to_string() << " V=" << V << " scale=" << scale;
      }
    }
  }
}

TEST(SamplingFilters, TiesGoToTheLowestIndex) {
  // Equal logits at 1, 2, 4 (the max) and at 0, 3.
  const std::vector<float> y = {1.0f, 3.0f, 3.0f, 1.0f, 3.0f};
  const float lse = row_lse(y);
  using Set = std::vector<int64_t>;
  EXPECT_EQ(sampling_candidates(y.data(), 5, lse, params(0, 1.0f, 1)), (Set{1}));
  EXPECT_EQ(sampling_candidates(y.data(), 5, lse, params(0, 1.0f, 2)), (Set{1, 2}));
  EXPECT_EQ(sampling_candidates(y.data(), 5, lse, params(0, 1.0f, 4)), (Set{0, 1, 2, 4}));
  // Uniform row: top-p 0.4 needs two entries (.25 < .4 <= .5): the two lowest indices.
  const std::vector<float> u = {0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(sampling_candidates(u.data(), 4, row_lse(u), params(0, 1.0f, 0, 0.4f)), (Set{0, 1}));
  // Greedy (temperature 0) and top-k = 1 pick the lowest of the tied maxima, end to end.
  Tensor h, w;
  one_hot_problem({1.0f, 3.0f, 3.0f, 1.0f, 3.0f}, 4, &h, &w);
  Rows rows{{params(1, 0.0f), params(2, 1.0f, 1), params(3, 0.5f, 1), params(4, 2.0f, 1)},
            {1, 2, 3, 4},
            {0, 1, 2, 3}};
  Result r = run(h.view(), w.view(), rows, config(8, 1));
  EXPECT_EQ(r.ids, (std::vector<int64_t>{1, 1, 1, 1}));
}

TEST(SamplingFilters, SampledIdsStayInTheCandidateSet) {
  // End to end over many positions: every sampled id is a candidate, every candidate shows up.
  const std::vector<float> logits = {0.0f, 2.0f, -1.0f, 1.5f, 0.5f, 1.75f, -3.0f, 1.0f, 0.25f};
  const int64_t N = 3000;
  Tensor h, w;
  one_hot_problem(logits, N, &h, &w);
  auto g = test::rng(6);
  for (SamplingParams p : {params(g(), 1.0f, 3), params(g(), 1.0f, 0, 0.6f),
                           params(g(), 1.0f, 0, 1.0f, 0.4f), params(g(), 0.5f, 4, 0.9f, 0.05f)}) {
    std::vector<float> y(logits.size());
    for (size_t v = 0; v < y.size(); ++v) y[v] = logits[v] / p.temperature;
    std::vector<int64_t> want = sampling_candidates(y.data(), int64_t(y.size()), row_lse(y), p);
    Rows rows;
    for (int64_t i = 0; i < N; ++i) {
      rows.params.push_back(p);
      rows.request_ids.push_back(5);
      rows.positions.push_back(i);
    }
    Result r = run(h.view(), w.view(), rows, config(8, 1));
    std::set<int64_t> got(r.ids.begin(), r.ids.end());
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want) << p.to_string();
  }
}

TEST(SamplingGreedy, TopK1EqualsGreedy) {
  auto g = test::rng(7);
  const int64_t T = 30, H = 32, V = 800;
  Tensor h = test::random_bf16({T, H}, g, 1.5f), w = test::random_bf16({V, H}, g);
  const ContractConfig cfg = config(128, 2);
  Rows greedy, topk1, topk1_hot;
  for (int64_t t = 0; t < T; ++t) {
    greedy.params.push_back(params(g(), 0.0f));
    topk1.params.push_back(params(g(), 1.0f, 1));
    // z/T is monotone in z: the argmax only moves if two top logits round to the same z/T.
    topk1_hot.params.push_back(params(g(), 0.7f, 1));
    for (Rows* r : {&greedy, &topk1, &topk1_hot}) {
      r->request_ids.push_back(t);
      r->positions.push_back(t);
    }
  }
  Result a = run(h.view(), w.view(), greedy, cfg);
  Result b = run(h.view(), w.view(), topk1, cfg);
  Result c = run(h.view(), w.view(), topk1_hot, cfg);
  EXPECT_TRUE(results_equal(a, b));  // both at logprob temperature 1
  EXPECT_EQ(a.ids, c.ids);
  // Greedy is the argmax of the logits, and its logp is the max log-prob of the row.
  for (int64_t t = 0; t < T; ++t) EXPECT_LE(a.logp[size_t(t)], 0.0f);
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

TEST(SamplingBadInputs, ClearErrors) {
  auto g = test::rng(8);
  const int64_t T = 3, H = 16, V = 40;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g);
  Rows ok = random_rows(T, g);
  const ContractConfig cfg = config(8, 1);
  auto with = [&](int64_t row, SamplingParams p) {
    Rows r = ok;
    r.params[size_t(row)] = p;
    return r;
  };
  expect_error([&] { run(h.view(), w.view(), with(1, params(0, -1.0f)), cfg); },
               {"sample", "params[1]", "temperature"});
  expect_error([&] { run(h.view(), w.view(), with(2, params(0, NAN)), cfg); }, {"temperature"});
  expect_error([&] { run(h.view(), w.view(), with(0, params(0, 1.0f, -1)), cfg); }, {"top_k"});
  for (float tp : {0.0f, 1.5f, NAN})
    expect_error([&] { run(h.view(), w.view(), with(0, params(0, 1.0f, 0, tp)), cfg); }, {"top_p"});
  for (float mp : {-0.1f, 1.5f, NAN})
    expect_error([&] { run(h.view(), w.view(), with(0, params(0, 1.0f, 0, 1.0f, mp)), cfg); },
                 {"min_p"});
  Rows short_rows = ok;
  short_rows.params.pop_back();
  expect_error([&] { run(h.view(), w.view(), short_rows, cfg); }, {"'params'", "3", "2"});
  Rows neg = ok;
  neg.positions[1] = -1;
  expect_error([&] { run(h.view(), w.view(), neg, cfg); }, {"positions[1] = -1"});
  neg.positions[1] = int64_t(1) << 32;
  expect_error([&] { run(h.view(), w.view(), neg, cfg); }, {"positions[1]"});
  Tensor hf(DType::kF32, {T, H});
  expect_error([&] { run(hf.view(), w.view(), ok, cfg); }, {"'h'", "bf16"});
  Tensor w2 = test::random_bf16({V, 32}, g);
  expect_error([&] { run(h.view(), w2.view(), ok, cfg); }, {"'w'"});
  // Wrong dtypes of the id tensors.
  Tensor rid32(DType::kI32, {T}), pos(DType::kI64, {T}), ids(DType::kI64, {T}),
      idsf(DType::kF32, {T}), f(DType::kF32, {T});
  for (int64_t t = 0; t < T; ++t) pos.ptr<int64_t>()[t] = t;
  expect_error(
      [&] {
        cpu::sample(h.view(), w.view(), ok.params, rid32.view(), pos.view(), cfg, ids.view(),
                    f.view(), f.view(), f.view());
      },
      {"'request_ids'", "i64"});
  Tensor rid(DType::kI64, {T});
  expect_error(
      [&] {
        cpu::sample(h.view(), w.view(), ok.params, rid.view(), pos.view(), cfg, idsf.view(),
                    f.view(), f.view(), f.view());
      },
      {"'token_ids'"});
  // NaN in h: nothing to sample; the error names the row.
  Tensor hn = test::random_bf16({T, H}, g);
  hn.ptr<bf16>()[2 * H + 3] = f32_to_bf16(NAN);
  expect_error([&] { run(hn.view(), w.view(), ok, cfg); }, {"sample", "row 2", "logsumexp"});
  // ... and no output is written.
  Tensor out = test::poisoned(DType::kF32, {3, T}), out_ids = test::poisoned(DType::kI64, {T});
  TensorView ov[3];
  for (int i = 0; i < 3; ++i)
    ov[i] = TensorView::contiguous(out.ptr<float>() + i * T, DType::kF32, {T});
  for (int64_t t = 0; t < T; ++t) rid.ptr<int64_t>()[t] = t;
  EXPECT_THROW(cpu::sample(hn.view(), w.view(), ok.params, rid.view(), pos.view(), cfg,
                           out_ids.view(), ov[0], ov[1], ov[2]),
               Error);
  for (int64_t i = 0; i < 3 * T; ++i) EXPECT_EQ(f32_bits(out.ptr<float>()[i]), 0xA5A5A5A5u);
  for (int64_t t = 0; t < T; ++t)
    EXPECT_EQ(uint64_t(out_ids.ptr<int64_t>()[t]), 0xA5A5A5A5A5A5A5A5u);
  // Empty batch: no error.
  Tensor h0(DType::kBF16, {0, H});
  EXPECT_NO_THROW(run(h0.view(), w.view(), Rows{}, cfg));
  // sampling_candidates' own checks.
  const std::vector<float> y = {0.0f, 1.0f};
  expect_error([&] { sampling_candidates(y.data(), 2, NAN, params(0, 1.0f)); }, {"lse"});
  expect_error([&] { sampling_candidates(y.data(), 2, 1.0f, params(0, 0.0f)); }, {"greedy"});
}

TEST(SamplingRealVocab, Qwen3VocabMatchesLogprob) {
  auto g = test::rng(9);
  const int64_t T = 2, H = 64, V = 151936;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g, 0.3f);
  Rows rows{{params(g(), 1.0f, 0, 0.9f), params(g(), 0.8f, 50)}, {1, 2}, {10, 20}};
  const ContractConfig cfg = config(256, 8);
  auto t0 = std::chrono::steady_clock::now();
  Result s = run(h.view(), w.view(), rows, cfg);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[lockstep] sample T=%lld H=%lld V=%lld: %.1f ms\n", (long long)T, (long long)H,
              (long long)V, ms);
  for (int64_t t = 0; t < T; ++t) {
    Tensor tg(DType::kI64, {1}), lp(DType::kF32, {1}), ls(DType::kF32, {1}), en(DType::kF32, {1});
    tg.ptr<int64_t>()[0] = s.ids[size_t(t)];
    cpu::linear_logprob(h.view().rows(t, t + 1), w.view(), tg.view(),
                        LogprobParams{rows.params[size_t(t)].temperature}, cfg, lp.view(),
                        ls.view(), en.view());
    EXPECT_EQ(f32_bits(s.logp[size_t(t)]), f32_bits(lp.ptr<float>()[0]));
    EXPECT_EQ(f32_bits(s.lse[size_t(t)]), f32_bits(ls.ptr<float>()[0]));
    EXPECT_EQ(f32_bits(s.entropy[size_t(t)]), f32_bits(en.ptr<float>()[0]));
  }
}

}  // namespace
}  // namespace lockstep
