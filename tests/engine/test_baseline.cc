// The baseline backend (ordinary, non-invariant kernels): every op is correct math (matches an
// fp64 oracle within a stated tolerance), and its non-invariance is real and visible: a GEMM row
// alone (sgemv) differs from the same row in a batch (sgemm), decode attention differs from
// prefill, TP partials summed in rank order differ from TP = 1, a small-batch RMSNorm differs from
// a large one, and end to end the rollout's log-probs differ from training's — where the invariant
// backend gives identical bits. Also determinism (same call, same bits) and clear errors.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "baseline/cpu/backend.h"
#include "core/thread_pool.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/rollout_test_util.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

using test::bitwise_equal;

constexpr double kBf16Rel = 1.0 / 256;  // 2^-8: twice the bf16 RNE half-ulp (relative)

std::unique_ptr<OpsBackend> baseline(int threads = 2) { return make_baseline_backend(threads); }

double f(bf16 v) { return double(bf16_to_f32(v)); }

int64_t count_diff(const void* a, const void* b, int64_t n, DType t) {
  const int64_t es = dtype_size(t);
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i)
    c += std::memcmp(static_cast<const char*>(a) + i * es, static_cast<const char*>(b) + i * es,
                     size_t(es)) != 0;
  return c;
}

template <typename Fn>
void expect_error(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected a lockstep::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

TensorView i32_view(std::vector<int32_t>& v) {
  return TensorView::contiguous(v.data(), DType::kI32, {int64_t(v.size())});
}

// --- GEMM ---

// Tolerance of an fp32 sum of K products vs the exact value: (K + 2)·2^-24·Σ|x·w| (sequential
// fp32 summation bound), plus the bf16 rounding of the output when y is bf16.
TEST(Baseline, GemmMatchesFp64) {
  auto g = test::rng(1);
  auto b = baseline();
  for (int64_t M : {1, 3, 17, 70})
    for (int64_t N : {1, 33, 111})
      for (int64_t K : {1, 16, 200, 1024}) {
        // x rows strided (row stride K + 5), w contiguous.
        Tensor xs = test::random_bf16({M, K + 5}, g);
        TensorView x = xs.view();
        x.shape[1] = K;
        Tensor w = test::random_bf16({N, K}, g);
        for (DType dt : {DType::kBF16, DType::kF32}) {
          Tensor y = test::poisoned(dt, {M, N});
          b->gemm(x, w.view(), GemmConfig{}, y.view());
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double ref = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = f(xs.ptr<bf16>()[m * (K + 5) + k]) * f(w.ptr<bf16>()[n * K + k]);
                ref += p;
                mag += std::abs(p);
              }
              const double got = test::element_as_float(y.data(), dt, m * N + n);
              const double tol = double(K + 2) * 0x1p-24 * mag +
                                 (dt == DType::kBF16 ? kBf16Rel * std::abs(ref) : 0.0);
              ASSERT_LE(std::abs(got - ref), tol)
                  << "M=" << M << " N=" << N << " K=" << K << " (" << m << ", " << n << ")";
            }
        }
      }
  // Empty sizes: K == 0 gives zeros, M == 0 writes nothing.
  Tensor x0(DType::kBF16, {3, 0}), w0(DType::kBF16, {4, 0});
  Tensor y0 = test::poisoned(DType::kF32, {3, 4});
  b->gemm(x0.view(), w0.view(), GemmConfig{}, y0.view());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(y0.ptr<float>()[i], 0.0f);
  Tensor xe(DType::kBF16, {0, 8}), we = test::random_bf16({4, 8}, g);
  Tensor ye(DType::kF32, {0, 4});
  b->gemm(xe.view(), we.view(), GemmConfig{}, ye.view());
}

TEST(Baseline, GemmTensorParallelMatchesFp64) {
  auto g = test::rng(2);
  auto b = baseline();
  const int64_t M = 9, N = 37, K = 1000;
  GemmConfig cfg{4};
  Tensor x = test::random_bf16({M, K}, g), w = test::random_bf16({N, K}, g);
  for (int tp : {1, 2, 4}) {
    std::vector<Tensor> parts;
    std::vector<TensorView> views;
    for (int r = 0; r < tp; ++r) {
      const GemmKRange kr = gemm_tp_k_range(cfg, K, tp, r);
      TensorView xs = x.view(), ws = w.view();
      xs.data = x.ptr<bf16>() + kr.begin;
      xs.shape[1] = kr.end - kr.begin;
      ws.data = w.ptr<bf16>() + kr.begin;
      ws.shape[1] = kr.end - kr.begin;
      parts.push_back(test::poisoned(DType::kF32, {M, N}));
      views.push_back(parts.back().view());
      b->gemm_partial(xs, ws, K, tp, r, cfg, views.back());
    }
    Tensor y = test::poisoned(DType::kF32, {M, N});
    b->gemm_combine(views, y.view());
    // In place into partial 0 gives the same bits.
    b->gemm_combine(views, views[0]);
    EXPECT_TRUE(bitwise_equal(y.data(), views[0].data, M * N, DType::kF32));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = f(x.ptr<bf16>()[m * K + k]) * f(w.ptr<bf16>()[n * K + k]);
          ref += p;
          mag += std::abs(p);
        }
        ASSERT_LE(std::abs(y.ptr<float>()[m * N + n] - ref), double(K + 8) * 0x1p-24 * mag)
            << "tp " << tp;
      }
  }
}

// (a) A decode row (M = 1: sgemv) differs from the same row inside a prefill batch (M = 64:
// sgemm); the invariant GEMM gives the same bits.
TEST(Baseline, GemmRowAloneDiffersFromRowInBatch) {
  auto g = test::rng(3);
  auto b = baseline();
  auto inv = make_invariant_backend();
  int64_t mismatches = 0, total = 0;
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t K = trial % 2 ? 2048 : 1024, N = trial < 2 ? 256 : 1000, M = 64;
    Tensor x = test::random_bf16({M, K}, g), w = test::random_bf16({N, K}, g);
    for (const OpsBackend* be : {b.get(), inv.get()}) {
      Tensor one(DType::kF32, {1, N}), all(DType::kF32, {M, N});
      be->gemm(x.view().rows(0, 1), w.view(), GemmConfig{}, one.view());
      be->gemm(x.view(), w.view(), GemmConfig{}, all.view());
      const int64_t d = count_diff(one.data(), all.data(), N, DType::kF32);
      if (be == inv.get()) {
        EXPECT_EQ(d, 0) << "invariant backend";
      } else {
        mismatches += d;
        total += N;
      }
    }
  }
  std::printf("[baseline] gemm row alone vs in batch of 64: %lld of %lld outputs differ\n",
              (long long)mismatches, (long long)total);
  EXPECT_GT(mismatches, 0);
}

// (c) Row-parallel TP = 2 / 4 (fp32 partials summed in rank order) differs from TP = 1; the
// invariant tree gives the same bits.
TEST(Baseline, TensorParallelSumDiffersFromTp1) {
  auto g = test::rng(4);
  auto b = baseline();
  auto inv = make_invariant_backend();
  const int64_t M = 16, N = 128, K = 1024;
  GemmConfig cfg{4};
  Tensor x = test::random_bf16({M, K}, g), w = test::random_bf16({N, K}, g);
  for (const OpsBackend* be : {b.get(), inv.get()}) {
    Tensor y1(DType::kF32, {M, N});
    be->gemm(x.view(), w.view(), cfg, y1.view());
    for (int tp : {2, 4}) {
      std::vector<Tensor> parts;
      std::vector<TensorView> views;
      for (int r = 0; r < tp; ++r) {
        const GemmKRange kr = gemm_tp_k_range(cfg, K, tp, r);
        TensorView xs = x.view(), ws = w.view();
        xs.data = x.ptr<bf16>() + kr.begin;
        xs.shape[1] = kr.end - kr.begin;
        ws.data = w.ptr<bf16>() + kr.begin;
        ws.shape[1] = kr.end - kr.begin;
        parts.emplace_back(DType::kF32, std::vector<int64_t>{M, N});
        views.push_back(parts.back().view());
        be->gemm_partial(xs, ws, K, tp, r, cfg, views.back());
      }
      Tensor yt(DType::kF32, {M, N});
      be->gemm_combine(views, yt.view());
      const int64_t d = count_diff(y1.data(), yt.data(), M * N, DType::kF32);
      if (be == inv.get()) {
        EXPECT_EQ(d, 0) << "invariant tp " << tp;
      } else {
        std::printf("[baseline] gemm tp=%d vs tp=1: %lld of %lld outputs differ\n", tp,
                    (long long)d, (long long)(M * N));
        EXPECT_GT(d, 0) << "tp " << tp;
      }
    }
  }
}

// --- elementwise ---

// RMSNorm tolerance: y = bf16(bf16(x·r)·w) has two bf16 roundings: |y − x·r·w| <= 2^-7·|x·r·w|
// (+ 1e-6 relative for the fp32 r).
TEST(Baseline, RmsNormMatchesFp64BothPaths) {
  auto g = test::rng(5);
  BaselineConfig c = default_baseline_config(4);  // T < 4: split path
  auto b = make_baseline_backend(c);
  RmsNormConfig cfg;
  for (int64_t T : {1, 3, 17})
    for (int64_t H : {1, 64, 111, 4096}) {
      Tensor x = test::random_bf16({T, H}, g, 3.0f), wt = test::random_bf16({H}, g);
      Tensor res = test::random_bf16({T, H}, g);
      Tensor y = test::poisoned(DType::kBF16, {T, H}), y2 = test::poisoned(DType::kBF16, {T, H});
      Tensor ro = test::poisoned(DType::kBF16, {T, H});
      b->rmsnorm(x.view(), wt.view(), cfg, y.view());
      b->rmsnorm_residual(x.view(), res.view(), wt.view(), cfg, ro.view(), y2.view());
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(static_cast<size_t>(H));
        for (int pass = 0; pass < 2; ++pass) {
          double ss = 0;
          for (int64_t k = 0; k < H; ++k) {
            double v = f(x.ptr<bf16>()[t * H + k]);
            if (pass == 1) {
              v += f(res.ptr<bf16>()[t * H + k]);
              const double ro_v = f(ro.ptr<bf16>()[t * H + k]);
              ASSERT_LE(std::abs(ro_v - v), kBf16Rel * std::abs(v)) << "residual_out";
              v = ro_v;  // the norm reads the rounded residual stream
            }
            s[size_t(k)] = v;
            ss += v * v;
          }
          const double r = 1.0 / std::sqrt(ss / double(H) + double(cfg.eps));
          const Tensor& out = pass == 0 ? y : y2;
          for (int64_t k = 0; k < H; ++k) {
            const double ref = s[size_t(k)] * r * f(wt.ptr<bf16>()[k]);
            ASSERT_LE(std::abs(f(out.ptr<bf16>()[t * H + k]) - ref),
                      (2 * kBf16Rel + 1e-6) * std::abs(ref) + 1e-30)
                << "T=" << T << " H=" << H << " pass " << pass;
          }
        }
      }
      // In place (y == x) and per-head [T, heads, D] give the same bits as the 2-D call.
      Tensor xi(DType::kBF16, {T, H});
      std::copy_n(x.ptr<bf16>(), T * H, xi.ptr<bf16>());
      b->rmsnorm(xi.view(), wt.view(), cfg, xi.view());
      EXPECT_TRUE(bitwise_equal(xi.data(), y.data(), T * H, DType::kBF16));
    }
  // Per-head: [T, heads, D] with strided heads (a view into a wider buffer).
  const int64_t T = 5, heads = 3, D = 32;
  Tensor buf = test::random_bf16({T, heads * D + 16}, g), wd = test::random_bf16({D}, g);
  TensorView xh;
  xh.data = buf.data();
  xh.dtype = DType::kBF16;
  xh.ndim = 3;
  xh.shape[0] = T;
  xh.shape[1] = heads;
  xh.shape[2] = D;
  xh.stride[0] = heads * D + 16;
  xh.stride[1] = D;
  xh.stride[2] = 1;
  Tensor yh = test::poisoned(DType::kBF16, {T, heads, D});
  b->rmsnorm(xh, wd.view(), cfg, yh.view());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const bf16* xr = buf.ptr<bf16>() + t * (heads * D + 16) + h * D;
      double ss = 0;
      for (int64_t k = 0; k < D; ++k) ss += f(xr[k]) * f(xr[k]);
      const double r = 1.0 / std::sqrt(ss / double(D) + double(cfg.eps));
      for (int64_t k = 0; k < D; ++k) {
        const double ref = f(xr[k]) * r * f(wd.ptr<bf16>()[k]);
        EXPECT_LE(std::abs(f(yh.ptr<bf16>()[(t * heads + h) * D + k]) - ref),
                  (2 * kBf16Rel + 1e-6) * std::abs(ref) + 1e-30);
      }
    }
}

// The small-batch split reduction (T < num_threads) is visible: the same rows normalized one
// call per row differ from one batched call.
TEST(Baseline, RmsNormSmallBatchDiffersFromLargeBatch) {
  auto g = test::rng(6);
  auto b = make_baseline_backend(default_baseline_config(8));
  const int64_t T = 256, H = 4096;
  Tensor x = test::random_bf16({T, H}, g), wt = test::random_bf16({H}, g);
  Tensor all(DType::kBF16, {T, H}), alone(DType::kBF16, {T, H});
  b->rmsnorm(x.view(), wt.view(), RmsNormConfig{}, all.view());
  for (int64_t t = 0; t < T; ++t)
    b->rmsnorm(x.view().rows(t, t + 1), wt.view(), RmsNormConfig{}, alone.view().rows(t, t + 1));
  const int64_t d = count_diff(all.data(), alone.data(), T * H, DType::kBF16);
  std::printf("[baseline] rmsnorm row alone vs in batch of %lld: %lld of %lld outputs differ\n",
              (long long)T, (long long)d, (long long)(T * H));
  EXPECT_GT(d, 0);
}

// RoPE tolerance: the fp32 angle float(pos)·inv_freq has an absolute error up to about
// 2·pos·2^-24 rad (fp32 inv_freq and product), so |y − ref| <= (2^-8 + 4·pos·2^-24 + 1e-6)·(|x1| +
// |x2|): exact near 0, a few 1e-3 at pos ~ 40000 — the known fp32-RoPE imprecision.
TEST(Baseline, RopeMatchesFp64) {
  auto g = test::rng(7);
  auto b = baseline();
  for (int64_t D : {2, 64, 128}) {
    RopeConfig rc;
    rc.head_dim = D;
    rc.theta = 1e6;
    rc.max_positions = 40960;
    const RopeTable table = RopeTable::build(rc);
    const int64_t T = 17, heads = 3, half = D / 2;
    Tensor x = test::random_bf16({T, heads, D}, g);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    std::uniform_int_distribution<int32_t> dp(0, 40959);
    for (auto& p : pos) p = dp(g);
    pos[0] = 0;
    pos[1] = 1;
    Tensor y = test::poisoned(DType::kBF16, {T, heads, D});
    b->rope(x.view(), i32_view(pos), table, y.view());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double inv = std::pow(1e6, -double(2 * i) / double(D));
          const double a = double(pos[size_t(t)]) * inv;
          const double x1 = f(x.ptr<bf16>()[(t * heads + h) * D + i]);
          const double x2 = f(x.ptr<bf16>()[(t * heads + h) * D + i + half]);
          const double r1 = x1 * std::cos(a) - x2 * std::sin(a);
          const double r2 = x2 * std::cos(a) + x1 * std::sin(a);
          const double tol =
              (kBf16Rel + 4.0 * pos[size_t(t)] * 0x1p-24 + 1e-6) * (std::abs(x1) + std::abs(x2));
          ASSERT_LE(std::abs(f(y.ptr<bf16>()[(t * heads + h) * D + i]) - r1), tol);
          ASSERT_LE(std::abs(f(y.ptr<bf16>()[(t * heads + h) * D + i + half]) - r2), tol);
        }
    // In place gives the same bits.
    b->rope(x.view(), i32_view(pos), table, x.view());
    EXPECT_TRUE(bitwise_equal(x.data(), y.data(), T * heads * D, DType::kBF16));
  }
}

// SiLU-and-mul tolerance: one bf16 rounding plus libm exp (< 1 ulp): 2^-8 relative.
TEST(Baseline, SiluMulMatchesFp64) {
  auto g = test::rng(8);
  auto b = baseline();
  const int64_t T = 17, I = 111;
  Tensor gu = test::random_bf16({T, 2 * I}, g, 4.0f);
  TensorView gate = gu.view(), up = gu.view();
  gate.shape[1] = I;
  up.shape[1] = I;
  up.data = gu.ptr<bf16>() + I;
  Tensor out = test::poisoned(DType::kBF16, {T, I});
  b->silu_mul(gate, up, out.view());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      const double gv = f(gu.ptr<bf16>()[t * 2 * I + i]), uv = f(gu.ptr<bf16>()[t * 2 * I + I + i]);
      const double ref = gv / (1.0 + std::exp(-gv)) * uv;
      ASSERT_LE(std::abs(f(out.ptr<bf16>()[t * I + i]) - ref), kBf16Rel * std::abs(ref) + 1e-30);
    }
}

TEST(Baseline, EmbeddingExactAndVocabParallel) {
  auto g = test::rng(9);
  auto b = baseline();
  const int64_t V = 101, H = 48, T = 33;
  Tensor table = test::random_bf16({V, H}, g);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (auto& i : ids) i = int32_t(g() % V);
  ids[0] = 0;
  ids[1] = int32_t(V - 1);
  Tensor out = test::poisoned(DType::kBF16, {T, H});
  b->embedding(i32_view(ids), table.view(), out.view());
  for (int64_t t = 0; t < T; ++t)
    ASSERT_TRUE(bitwise_equal(out.ptr<bf16>() + t * H, table.ptr<bf16>() + ids[size_t(t)] * H, H,
                              DType::kBF16));
  for (int tp : {1, 2, 3, 4}) {
    std::vector<Tensor> parts;
    std::vector<TensorView> views;
    for (int r = 0; r < tp; ++r) {
      const VocabShard sh = vocab_shard(V, r, tp);
      parts.push_back(test::poisoned(DType::kBF16, {T, H}));
      views.push_back(parts.back().view());
      b->embedding_vocab_parallel(i32_view(ids), table.view().rows(sh.begin, sh.end), sh, V,
                                  views.back());
    }
    Tensor comb = test::poisoned(DType::kBF16, {T, H});
    b->embedding_combine(views, comb.view());
    // Random data holds no -0: the +0 fill and sum are exact.
    EXPECT_TRUE(bitwise_equal(comb.data(), out.data(), T * H, DType::kBF16)) << "tp " << tp;
  }
}

// --- attention ---

struct Seq {
  int64_t len;
  Tensor q, k, v;  // [len, Hq, D], [len, Hkv, D], [len, Hkv, D]
};

// fp64 causal attention of token i of a sequence (all keys 0..i), head h.
void attn_oracle(const Seq& s, int64_t i, int64_t h, int64_t Hq, int64_t Hkv, int64_t D,
                 std::vector<double>* out, double* lse) {
  const int64_t hk = h / (Hq / Hkv);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> sc(static_cast<size_t>(i + 1));
  double m = -1e300;
  for (int64_t j = 0; j <= i; ++j) {
    double d = 0;
    for (int64_t e = 0; e < D; ++e)
      d += f(s.q.ptr<bf16>()[(i * Hq + h) * D + e]) * f(s.k.ptr<bf16>()[(j * Hkv + hk) * D + e]);
    sc[size_t(j)] = d * scale;
    m = std::max(m, sc[size_t(j)]);
  }
  double l = 0;
  for (double& x : sc) l += (x = std::exp(x - m));
  out->assign(size_t(D), 0.0);
  for (int64_t j = 0; j <= i; ++j)
    for (int64_t e = 0; e < D; ++e)
      (*out)[size_t(e)] += sc[size_t(j)] / l * f(s.v.ptr<bf16>()[(j * Hkv + hk) * D + e]);
  *lse = m + std::log(l);
}

// Attention tolerance: |out − ref| <= 2^-8·|ref| + 1e-4·max|v| (bf16 rounding, fp32 scores and
// sums); |lse − ref| <= 1e-4·(1 + |ref|).
::testing::AssertionResult attn_close(const bf16* got, float got_lse,
                                      const std::vector<double>& ref, double ref_lse, double vmax) {
  for (size_t e = 0; e < ref.size(); ++e) {
    const double err = std::abs(f(got[e]) - ref[e]);
    if (err > kBf16Rel * std::abs(ref[e]) + 1e-4 * vmax)
      return ::testing::AssertionFailure()
             << "element " << e << ": " << f(got[e]) << " vs " << ref[e];
  }
  if (std::abs(double(got_lse) - ref_lse) > 1e-4 * (1 + std::abs(ref_lse)))
    return ::testing::AssertionFailure() << "lse " << got_lse << " vs " << ref_lse;
  return ::testing::AssertionSuccess();
}

std::vector<Seq> make_seqs(const std::vector<int64_t>& lens, int64_t Hq, int64_t Hkv, int64_t D,
                           std::mt19937_64& g) {
  std::vector<Seq> s;
  for (int64_t n : lens)
    s.push_back(Seq{n, test::random_bf16({n, Hq, D}, g), test::random_bf16({n, Hkv, D}, g),
                    test::random_bf16({n, Hkv, D}, g)});
  return s;
}

// Packs sequences and runs the baseline prefill: out [T, Hq, D], lse [T, Hq].
void run_prefill(const OpsBackend& be, const std::vector<Seq>& seqs, int64_t Hq, int64_t Hkv,
                 int64_t D, Tensor* out, Tensor* lse) {
  int64_t T = 0;
  std::vector<int32_t> cu{0};
  for (const Seq& s : seqs) cu.push_back(int32_t(T += s.len));
  Tensor q(DType::kBF16, {T, Hq, D}), k(DType::kBF16, {T, Hkv, D}), v(DType::kBF16, {T, Hkv, D});
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::copy_n(seqs[i].q.ptr<bf16>(), seqs[i].len * Hq * D, q.ptr<bf16>() + cu[i] * Hq * D);
    std::copy_n(seqs[i].k.ptr<bf16>(), seqs[i].len * Hkv * D, k.ptr<bf16>() + cu[i] * Hkv * D);
    std::copy_n(seqs[i].v.ptr<bf16>(), seqs[i].len * Hkv * D, v.ptr<bf16>() + cu[i] * Hkv * D);
  }
  *out = test::poisoned(DType::kBF16, {T, Hq, D});
  *lse = test::poisoned(DType::kF32, {T, Hq});
  be.attention_prefill_varlen(q.view(), k.view(), v.view(), i32_view(cu), AttentionConfig{},
                              out->view(), lse->view());
}

// A paged cache holding the sequences' K/V in random pages of size P.
struct Paged {
  Tensor kc, vc, bt, lens;
  PagedKv kv() { return PagedKv{kc.view(), vc.view(), bt.view(), lens.view()}; }
};

Paged make_paged(const std::vector<Seq>& seqs, int64_t Hkv, int64_t D, int64_t P,
                 std::mt19937_64& g) {
  int64_t pages = 0, mp = 1;
  for (const Seq& s : seqs) {
    pages += (s.len + P - 1) / P;
    mp = std::max(mp, (s.len + P - 1) / P);
  }
  Paged p;
  const int64_t S = int64_t(seqs.size());
  p.kc = test::poisoned(DType::kBF16, {pages + 2, P, Hkv, D});
  p.vc = test::poisoned(DType::kBF16, {pages + 2, P, Hkv, D});
  p.bt = Tensor(DType::kI32, {S, mp});
  p.lens = Tensor(DType::kI32, {S});
  std::vector<int32_t> order(static_cast<size_t>(pages + 2));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), g);
  int64_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    p.lens.ptr<int32_t>()[s] = int32_t(seqs[size_t(s)].len);
    for (int64_t j = 0; j < mp; ++j)
      p.bt.ptr<int32_t>()[s * mp + j] = j * P < seqs[size_t(s)].len ? order[size_t(next++)] : -1;
    for (int64_t j = 0; j < seqs[size_t(s)].len; ++j) {
      const int64_t page = p.bt.ptr<int32_t>()[s * mp + j / P];
      for (int64_t h = 0; h < Hkv; ++h) {
        std::copy_n(seqs[size_t(s)].k.ptr<bf16>() + (j * Hkv + h) * D, D,
                    p.kc.ptr<bf16>() + ((page * P + j % P) * Hkv + h) * D);
        std::copy_n(seqs[size_t(s)].v.ptr<bf16>() + (j * Hkv + h) * D, D,
                    p.vc.ptr<bf16>() + ((page * P + j % P) * Hkv + h) * D);
      }
    }
  }
  return p;
}

double max_abs_v(const std::vector<Seq>& seqs) {
  double m = 0;
  for (const Seq& s : seqs)
    for (int64_t i = 0; i < s.v.numel(); ++i) m = std::max(m, std::abs(f(s.v.ptr<bf16>()[i])));
  return m;
}

TEST(Baseline, AttentionPrefillMatchesFp64) {
  auto g = test::rng(10);
  auto b = baseline();
  for (int64_t D : {32, 64}) {
    const int64_t Hq = 4, Hkv = 2;
    auto seqs = make_seqs({1, 3, 17, 70}, Hq, Hkv, D, g);
    Tensor out, lse;
    run_prefill(*b, seqs, Hq, Hkv, D, &out, &lse);
    const double vmax = max_abs_v(seqs);
    int64_t t0 = 0;
    for (const Seq& s : seqs) {
      for (int64_t i = 0; i < s.len; ++i)
        for (int64_t h = 0; h < Hq; ++h) {
          std::vector<double> ref;
          double rl;
          attn_oracle(s, i, h, Hq, Hkv, D, &ref, &rl);
          ASSERT_TRUE(attn_close(out.ptr<bf16>() + ((t0 + i) * Hq + h) * D,
                                 lse.ptr<float>()[(t0 + i) * Hq + h], ref, rl, vmax))
              << "D=" << D << " token " << t0 + i << " head " << h;
        }
      t0 += s.len;
    }
  }
}

// Decode rows, chunked-prefill rows, split-KV and cascade (a shared prefix) vs the fp64 oracle.
TEST(Baseline, AttentionPagedMatchesFp64) {
  auto g = test::rng(11);
  auto b = baseline();
  const int64_t Hq = 4, Hkv = 1, D = 32, P = 3;
  auto seqs = make_seqs({1, 5, 40, 130, 300}, Hq, Hkv, D, g);
  Paged pc = make_paged(seqs, Hkv, D, P, g);
  const double vmax = max_abs_v(seqs);
  // Rows: the last token of every sequence (decode) and a chunk of 7 rows of sequence 3.
  std::vector<int32_t> qs, qp;
  for (int32_t s = 0; s < int32_t(seqs.size()); ++s) {
    qs.push_back(s);
    qp.push_back(int32_t(seqs[size_t(s)].len - 1));
  }
  for (int32_t p = 60; p < 67; ++p) {
    qs.push_back(3);
    qp.push_back(p);
  }
  const int64_t N = int64_t(qs.size());
  Tensor q(DType::kBF16, {N, Hq, D});
  for (int64_t r = 0; r < N; ++r)
    std::copy_n(seqs[size_t(qs[size_t(r)])].q.ptr<bf16>() + qp[size_t(r)] * Hq * D, Hq * D,
                q.ptr<bf16>() + r * Hq * D);
  auto check = [&](const Tensor& out, const Tensor& lse, const char* what) {
    for (int64_t r = 0; r < N; ++r)
      for (int64_t h = 0; h < Hq; ++h) {
        std::vector<double> ref;
        double rl;
        attn_oracle(seqs[size_t(qs[size_t(r)])], qp[size_t(r)], h, Hq, Hkv, D, &ref, &rl);
        ASSERT_TRUE(attn_close(out.ptr<bf16>() + (r * Hq + h) * D, lse.ptr<float>()[r * Hq + h],
                               ref, rl, vmax))
            << what << " row " << r << " head " << h;
      }
  };
  PagedKv kv = pc.kv();
  for (int which = 0; which < 4; ++which) {
    Tensor out = test::poisoned(DType::kBF16, {N, Hq, D}),
           lse = test::poisoned(DType::kF32, {N, Hq});
    // Rows of one sequence only (1 sequence: 8 splits, 32-key blocks) for which == 3.
    if (which == 0) {
      b->attention_paged(q.view(), i32_view(qs), i32_view(qp), kv, AttentionConfig{}, out.view(),
                         lse.view());
      check(out, lse, "paged");
    } else if (which == 1) {
      b->attention_paged_split_kv(q.view(), i32_view(qs), i32_view(qp), kv, AttentionConfig{}, 3,
                                  out.view(), lse.view());
      check(out, lse, "split_kv 3");
    } else if (which == 2) {
      // Cascade: sequences 3 and 4 share the first 40 positions of a group whose pages hold
      // sequence 4's prefix; rows of sequence 3 (not in the group) read their own pages.
      Tensor pbt(DType::kI32, {1, pc.bt.shape()[1]}), sl(DType::kI32, {1}), sg(DType::kI32, {5});
      const int64_t mp = pc.bt.shape()[1];
      std::copy_n(pc.bt.ptr<int32_t>() + 4 * mp, mp, pbt.ptr<int32_t>());
      sl.ptr<int32_t>()[0] = 40;
      for (int64_t s = 0; s < 5; ++s) sg.ptr<int32_t>()[s] = s == 4 ? 0 : -1;
      // Sequence 4's own pages below 40 are never read: break them.
      Tensor bt2(DType::kI32, {5, mp});
      std::copy_n(pc.bt.ptr<int32_t>(), 5 * mp, bt2.ptr<int32_t>());
      for (int64_t j = 0; j < 40 / P; ++j) bt2.ptr<int32_t>()[4 * mp + j] = -1;
      PagedKv kv2{pc.kc.view(), pc.vc.view(), bt2.view(), pc.lens.view()};
      b->attention_paged_cascade(q.view(), i32_view(qs), i32_view(qp), kv2,
                                 SharedPrefix{pbt.view(), sl.view(), sg.view()}, AttentionConfig{},
                                 out.view(), lse.view());
      check(out, lse, "cascade");
    } else {
      std::vector<int32_t> s1(qs.end() - 7, qs.end()), p1(qp.end() - 7, qp.end());
      Tensor o1 = test::poisoned(DType::kBF16, {7, Hq, D}),
             l1 = test::poisoned(DType::kF32, {7, Hq});
      b->attention_paged(q.view().rows(N - 7, N), i32_view(s1), i32_view(p1), kv, AttentionConfig{},
                         o1.view(), l1.view());
      for (int64_t r = 0; r < 7; ++r)
        for (int64_t h = 0; h < Hq; ++h) {
          std::vector<double> ref;
          double rl;
          attn_oracle(seqs[3], p1[size_t(r)], h, Hq, Hkv, D, &ref, &rl);
          ASSERT_TRUE(attn_close(o1.ptr<bf16>() + (r * Hq + h) * D, l1.ptr<float>()[r * Hq + h],
                                 ref, rl, vmax))
              << "one-sequence chunk row " << r;
        }
    }
  }
  // lse may be left out.
  Tensor out = test::poisoned(DType::kBF16, {N, Hq, D});
  b->attention_paged(q.view(), i32_view(qs), i32_view(qp), kv, AttentionConfig{}, out.view(),
                     TensorView{});
}

// (b) Attention through the paged decode path (every token of a sequence as a query row of its
// own sequence: 32-key blocks, 8 splits) differs from the prefill path, and from the same rows
// inside a call holding 6 sequences (128-key blocks, 1 split); the invariant backend gives
// identical bits (checked on each sequence's last token).
TEST(Baseline, DecodeAttentionDiffersFromPrefill) {
  auto g = test::rng(12);
  auto b = baseline();
  auto inv = make_invariant_backend();
  const int64_t Hq = 4, Hkv = 2, D = 64, P = 16;
  auto seqs = make_seqs({200, 333, 600, 97, 150, 410}, Hq, Hkv, D, g);
  const int64_t S = int64_t(seqs.size());
  Paged pc = make_paged(seqs, Hkv, D, P, g);
  // Query rows: every token of every sequence (rows in packed order), or only the last tokens.
  for (const OpsBackend* be : {b.get(), inv.get()}) {
    const bool all_rows = be == b.get();
    Tensor pre, pre_lse;
    run_prefill(*be, seqs, Hq, Hkv, D, &pre, &pre_lse);
    std::vector<int32_t> qs, qp;
    std::vector<int64_t> row_of;  // packed row of each query row
    int64_t t0 = 0;
    for (int32_t s = 0; s < int32_t(S); ++s) {
      for (int64_t i = all_rows ? 0 : seqs[size_t(s)].len - 1; i < seqs[size_t(s)].len; ++i) {
        qs.push_back(s);
        qp.push_back(int32_t(i));
        row_of.push_back(t0 + i);
      }
      t0 += seqs[size_t(s)].len;
    }
    const int64_t N = int64_t(qs.size());
    Tensor q(DType::kBF16, {N, Hq, D});
    for (int64_t r = 0; r < N; ++r)
      std::copy_n(seqs[size_t(qs[size_t(r)])].q.ptr<bf16>() + qp[size_t(r)] * Hq * D, Hq * D,
                  q.ptr<bf16>() + r * Hq * D);
    Tensor batch(DType::kBF16, {N, Hq, D}), batch_lse(DType::kF32, {N, Hq});
    be->attention_paged(q.view(), i32_view(qs), i32_view(qp), pc.kv(), AttentionConfig{},
                        batch.view(), batch_lse.view());
    Tensor alone(DType::kBF16, {N, Hq, D}), alone_lse(DType::kF32, {N, Hq});
    for (int64_t r0 = 0; r0 < N;) {  // one call per sequence
      int64_t r1 = r0;
      while (r1 < N && qs[size_t(r1)] == qs[size_t(r0)]) ++r1;
      std::vector<int32_t> s1(qs.begin() + r0, qs.begin() + r1),
          p1(qp.begin() + r0, qp.begin() + r1);
      be->attention_paged(q.view().rows(r0, r1), i32_view(s1), i32_view(p1), pc.kv(),
                          AttentionConfig{}, alone.view().rows(r0, r1),
                          alone_lse.view().rows(r0, r1));
      r0 = r1;
    }
    int64_t out_pre = 0, lse_pre = 0;
    for (int64_t r = 0; r < N; ++r) {
      out_pre += count_diff(alone.ptr<bf16>() + r * Hq * D,
                            pre.ptr<bf16>() + row_of[size_t(r)] * Hq * D, Hq * D, DType::kBF16);
      lse_pre += count_diff(alone_lse.ptr<float>() + r * Hq,
                            pre_lse.ptr<float>() + row_of[size_t(r)] * Hq, Hq, DType::kF32);
    }
    const int64_t out_batch = count_diff(alone.data(), batch.data(), N * Hq * D, DType::kBF16);
    const int64_t lse_batch = count_diff(alone_lse.data(), batch_lse.data(), N * Hq, DType::kF32);
    if (!all_rows) {
      EXPECT_EQ(out_pre + lse_pre + out_batch + lse_batch, 0) << "invariant backend";
      continue;
    }
    std::printf(
        "[baseline] attention, %lld query rows: decode path vs prefill: %lld of %lld outputs and "
        "%lld of %lld lse differ; one sequence per call vs 6 per call: %lld outputs, %lld lse\n",
        (long long)N, (long long)out_pre, (long long)(N * Hq * D), (long long)lse_pre,
        (long long)(N * Hq), (long long)out_batch, (long long)lse_batch);
    EXPECT_GT(out_pre, 0);
    EXPECT_GT(lse_pre, 0);
    EXPECT_GT(out_batch, 0);
    EXPECT_GT(lse_batch, 0);
  }
}

// --- heads ---

// fp64 log-softmax statistics of the tempered logits of row t.
struct LogpRef {
  std::vector<double> y;
  double lse, entropy;
};

LogpRef logp_oracle(const Tensor& h, const Tensor& w, int64_t t, double temperature) {
  const int64_t H = h.shape()[1], V = w.shape()[0];
  LogpRef r;
  r.y.resize(size_t(V));
  double m = -1e300;
  for (int64_t v = 0; v < V; ++v) {
    double z = 0;
    for (int64_t k = 0; k < H; ++k) z += f(h.ptr<bf16>()[t * H + k]) * f(w.ptr<bf16>()[v * H + k]);
    r.y[size_t(v)] = z / temperature;
    m = std::max(m, r.y[size_t(v)]);
  }
  double s = 0, sy = 0;
  for (double y : r.y) s += std::exp(y - m);
  for (double y : r.y) sy += std::exp(y - m) / s * y;
  r.lse = m + std::log(s);
  r.entropy = r.lse - sy;
  return r;
}

// Log-prob tolerance: logits carry an fp32 sum error <= (H + 2)·2^-24·Σ|h·w|/temperature (here
// <= ~1e-5), the sums over V about V·2^-24 relative: |err| <= 1e-4·(1 + |ref|).
bool close_lp(double got, double ref) { return std::abs(got - ref) <= 1e-4 * (1 + std::abs(ref)); }

TEST(Baseline, LinearLogprobMatchesFp64) {
  auto g = test::rng(13);
  BaselineConfig c = default_baseline_config(2);
  c.logits_token_block = 16;  // several token blocks, a 1-row (sgemv) last block for T = 17
  c.logits_vocab_chunk = 100;
  auto b = make_baseline_backend(c);
  ContractConfig cc;
  cc.vocab_tile = 64;
  cc.vocab_segments = 4;
  for (int64_t T : {1, 17, 40})
    for (int64_t V : {1, 97, 1000}) {
      const int64_t H = 64;
      Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g, 0.5f);
      std::vector<int32_t> tg(static_cast<size_t>(T));
      for (auto& x : tg) x = int32_t(g() % V);
      tg[0] = -1;  // ignored
      LogprobParams lp;
      lp.temperature = 0.7f;
      Tensor a = test::poisoned(DType::kF32, {T}), l = test::poisoned(DType::kF32, {T}),
             e = test::poisoned(DType::kF32, {T});
      b->linear_logprob(h.view(), w.view(), i32_view(tg), lp, cc, a.view(), l.view(), e.view());
      // Vocab-parallel over R ranks (aligned subtrees of the 4 segments).
      std::vector<std::vector<float>> tp_out;
      for (int R : {1, 2, 4}) {
        const LogprobVocabLayout lay = logprob_vocab_layout(cc, V);
        const int per = cc.vocab_segments / R;
        Tensor st = test::poisoned(DType::kF32, {R, T, 4});
        for (int r = 0; r < R; ++r) {
          const int64_t v0 = std::min(V, int64_t(r * per) * lay.segment_len);
          const int64_t v1 = std::min(V, int64_t((r + 1) * per) * lay.segment_len);
          TensorView sv = TensorView::contiguous(st.ptr<float>() + r * T * 4, DType::kF32, {T, 4});
          b->linear_logprob_partial(h.view(), w.view().rows(v0, v1), i32_view(tg), lp, cc,
                                    LogprobShard{V, r * per, per}, sv);
        }
        Tensor a2(DType::kF32, {T}), l2(DType::kF32, {T}), e2(DType::kF32, {T});
        b->linear_logprob_combine(st.view(), i32_view(tg), lp, cc, V, a2.view(), l2.view(),
                                  e2.view());
        std::vector<float> o(a2.ptr<float>(), a2.ptr<float>() + T);
        o.insert(o.end(), l2.ptr<float>(), l2.ptr<float>() + T);
        o.insert(o.end(), e2.ptr<float>(), e2.ptr<float>() + T);
        tp_out.push_back(o);
      }
      for (int64_t t = 0; t < T; ++t) {
        const LogpRef ref = logp_oracle(h, w, t, 0.7);
        const double ref_lp = tg[size_t(t)] < 0 ? 0.0 : ref.y[size_t(tg[size_t(t)])] - ref.lse;
        SCOPED_TRACE("T=" + std::to_string(T) + " V=" + std::to_string(V) +
                     " t=" + std::to_string(t));
        EXPECT_TRUE(close_lp(a.ptr<float>()[t], ref_lp)) << a.ptr<float>()[t] << " vs " << ref_lp;
        EXPECT_TRUE(close_lp(l.ptr<float>()[t], ref.lse));
        EXPECT_TRUE(close_lp(e.ptr<float>()[t], ref.entropy))
            << e.ptr<float>()[t] << " vs " << ref.entropy;
        if (tg[size_t(t)] < 0) {
          EXPECT_EQ(f32_bits(a.ptr<float>()[t]), 0u);
        }
        for (const auto& o : tp_out) {
          EXPECT_TRUE(close_lp(o[size_t(t)], ref_lp));
          EXPECT_TRUE(close_lp(o[size_t(T + t)], ref.lse));
          EXPECT_TRUE(close_lp(o[size_t(2 * T + t)], ref.entropy));
        }
      }
    }
}

// A token's log-prob alone (1 row: sgemv) differs from the same token inside a batch of 64
// (sgemm), and vocab-parallel TP = 4 differs from TP = 1; invariant: identical.
TEST(Baseline, LogprobDependsOnBatchAndTp) {
  auto g = test::rng(14);
  auto b = baseline();
  auto inv = make_invariant_backend();
  const int64_t T = 64, H = 1024, V = 512;
  ContractConfig cc;
  cc.vocab_tile = 64;
  cc.vocab_segments = 4;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g, 0.1f);
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (auto& x : tg) x = int32_t(g() % V);
  LogprobParams lp;
  for (const OpsBackend* be : {b.get(), inv.get()}) {
    Tensor a(DType::kF32, {T}), l(DType::kF32, {T}), e(DType::kF32, {T});
    be->linear_logprob(h.view(), w.view(), i32_view(tg), lp, cc, a.view(), l.view(), e.view());
    std::vector<float> alone(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      float o[3];
      be->linear_logprob(h.view().rows(t, t + 1), w.view(),
                         TensorView::contiguous(&tg[size_t(t)], DType::kI32, {1}), lp, cc,
                         TensorView::contiguous(&o[0], DType::kF32, {1}),
                         TensorView::contiguous(&o[1], DType::kF32, {1}),
                         TensorView::contiguous(&o[2], DType::kF32, {1}));
      alone[size_t(t)] = o[0];
    }
    const int64_t d_batch = count_diff(alone.data(), a.data(), T, DType::kF32);
    // Vocab-parallel, 4 ranks of one segment each.
    const LogprobVocabLayout lay = logprob_vocab_layout(cc, V);
    Tensor st(DType::kF32, {4, T, 4});
    for (int r = 0; r < 4; ++r) {
      const int64_t v0 = std::min(V, int64_t(r) * lay.segment_len);
      const int64_t v1 = std::min(V, int64_t(r + 1) * lay.segment_len);
      be->linear_logprob_partial(
          h.view(), w.view().rows(v0, v1), i32_view(tg), lp, cc, LogprobShard{V, r, 1},
          TensorView::contiguous(st.ptr<float>() + r * T * 4, DType::kF32, {T, 4}));
    }
    Tensor a4(DType::kF32, {T}), l4(DType::kF32, {T}), e4(DType::kF32, {T});
    be->linear_logprob_combine(st.view(), i32_view(tg), lp, cc, V, a4.view(), l4.view(), e4.view());
    const int64_t d_tp = count_diff(a4.data(), a.data(), T, DType::kF32) +
                         count_diff(e4.data(), e.data(), T, DType::kF32);
    if (be == inv.get()) {
      EXPECT_EQ(d_batch, 0);
      EXPECT_EQ(d_tp, 0);
    } else {
      std::printf(
          "[baseline] logp alone vs in a batch of %lld: %lld of %lld differ; tp=4 vs tp=1 (logp "
          "and entropy): %lld of %lld differ\n",
          (long long)T, (long long)d_batch, (long long)T, (long long)d_tp, (long long)(2 * T));
      EXPECT_GT(d_batch, 0);
      EXPECT_GT(d_tp, 0);
    }
  }
}

// Sampling: greedy and top_k = 1 rows pick the fp64 argmax, unfiltered rows the fp64 argmax of
// y + g with g = sampling_gumbel(...) (the invariant sampler's noise), top_k = 20 rows an id of
// the fp64 top 20 — each checked where the fp64 margin (> 1e-3) exceeds the logits' error. The
// recorded logp / lse / entropy are bit-equal to the baseline's own linear_logprob of the sampled
// ids over the same batch.
TEST(Baseline, SampleMatchesOracleAndOwnLogprob) {
  auto g = test::rng(15);
  auto b = baseline();
  const int64_t T = 24, H = 64, V = 300;
  ContractConfig cc;
  Tensor h = test::random_bf16({T, H}, g), w = test::random_bf16({V, H}, g, 0.5f);
  std::vector<SamplingParams> params(static_cast<size_t>(T));
  Tensor req(DType::kI64, {T}), pos(DType::kI32, {T}), ids = test::poisoned(DType::kI64, {T});
  for (int64_t t = 0; t < T; ++t) {
    SamplingParams& p = params[size_t(t)];
    p.seed = 77 + uint64_t(t % 3);
    p.temperature = t % 4 == 0 ? 0.0f : 0.8f;
    p.top_k = t % 4 == 1 ? 1 : (t % 4 == 2 ? 20 : 0);
    p.top_p = t % 8 == 7 ? 0.9f : 1.0f;
    req.ptr<int64_t>()[t] = 1000 + t;
    pos.ptr<int32_t>()[t] = int32_t(5 * t);
  }
  Tensor a = test::poisoned(DType::kF32, {T}), l = test::poisoned(DType::kF32, {T}),
         e = test::poisoned(DType::kF32, {T});
  b->sample(h.view(), w.view(), params, req.view(), pos.view(), cc, ids.view(), a.view(), l.view(),
            e.view());
  int64_t checked = 0;
  for (int64_t t = 0; t < T; ++t) {
    const SamplingParams& p = params[size_t(t)];
    const LogpRef ref = logp_oracle(h, w, t, p.logprob_temperature());
    const int64_t id = ids.ptr<int64_t>()[t];
    ASSERT_TRUE(id >= 0 && id < V);
    std::vector<double> score = ref.y;
    const bool noise = p.temperature > 0 && p.top_k != 1 && p.top_p == 1.0f;
    if (noise && p.top_k == 0)
      for (int64_t v = 0; v < V; ++v)
        score[size_t(v)] += double(sampling_gumbel(p.seed, uint64_t(1000 + t), uint32_t(5 * t), v));
    std::vector<int64_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t x, int64_t y) { return score[size_t(x)] > score[size_t(y)]; });
    if (p.top_k == 20) {
      if (score[size_t(order[19])] - score[size_t(order[20])] > 1e-3) {
        EXPECT_TRUE(std::find(order.begin(), order.begin() + 20, id) != order.begin() + 20)
            << "row " << t;
        ++checked;
      }
    } else if (p.top_p == 1.0f && score[size_t(order[0])] - score[size_t(order[1])] > 1e-3) {
      EXPECT_EQ(id, order[0]) << "row " << t;
      ++checked;
    }
    EXPECT_TRUE(close_lp(a.ptr<float>()[t], ref.y[size_t(id)] - ref.lse)) << "row " << t;
    EXPECT_TRUE(close_lp(l.ptr<float>()[t], ref.lse)) << "row " << t;
    EXPECT_TRUE(close_lp(e.ptr<float>()[t], ref.entropy)) << "row " << t;
  }
  EXPECT_GT(checked, T / 2);
  // The baseline's own LogP of the sampled ids, same batch, at each row's temperature.
  for (float temp : {1.0f, 0.8f}) {
    LogprobParams lp;
    lp.temperature = temp;
    Tensor a2(DType::kF32, {T}), l2(DType::kF32, {T}), e2(DType::kF32, {T});
    b->linear_logprob(h.view(), w.view(), ids.view(), lp, cc, a2.view(), l2.view(), e2.view());
    for (int64_t t = 0; t < T; ++t) {
      if (params[size_t(t)].logprob_temperature() != temp) continue;
      EXPECT_TRUE(bitwise_equal(a2.ptr<float>() + t, a.ptr<float>() + t, 1, DType::kF32));
      EXPECT_TRUE(bitwise_equal(l2.ptr<float>() + t, l.ptr<float>() + t, 1, DType::kF32));
      EXPECT_TRUE(bitwise_equal(e2.ptr<float>() + t, e.ptr<float>() + t, 1, DType::kF32));
    }
  }
  // A row of NaN logits cannot be sampled: an Error, and no output is written.
  Tensor hn = test::random_bf16({T, H}, g);
  hn.ptr<bf16>()[3 * H] = bf16{kCanonicalNanBf16};
  Tensor ids2 = test::poisoned(DType::kI64, {T});
  expect_error(
      [&] {
        b->sample(hn.view(), w.view(), params, req.view(), pos.view(), cc, ids2.view(), a.view(),
                  l.view(), e.view());
      },
      "row 3");
  EXPECT_EQ(uint64_t(ids2.ptr<int64_t>()[0]), 0xA5A5A5A5A5A5A5A5ull);
}

// Same call, same bits; and the same bits for any size of the lockstep thread pool (the kernels'
// choices come from BaselineConfig, never from the pool; OpenBLAS splits no reduction).
TEST(Baseline, DeterministicAndPoolSizeIndependent) {
  auto g = test::rng(16);
  auto b = baseline(4);
  const int64_t Hq = 4, Hkv = 2, D = 32;
  auto seqs = make_seqs({50, 130, 7}, Hq, Hkv, D, g);
  Paged pc = make_paged(seqs, Hkv, D, 5, g);
  Tensor x = test::random_bf16({3, 700}, g), w = test::random_bf16({90, 700}, g);
  Tensor q = test::random_bf16({3, Hq, D}, g), wn = test::random_bf16({700}, g);
  std::vector<int32_t> qs{0, 1, 2}, qp{49, 129, 6}, tg{1, 2, 89};
  auto run = [&]() {
    std::vector<uint8_t> bytes;
    auto eat = [&](const Tensor& t) {
      const auto* p = static_cast<const uint8_t*>(t.data());
      bytes.insert(bytes.end(), p, p + t.nbytes());
    };
    Tensor y(DType::kBF16, {3, 90});
    b->gemm(x.view(), w.view(), GemmConfig{}, y.view());
    eat(y);
    Tensor yn(DType::kBF16, {3, 700});
    b->rmsnorm(x.view(), wn.view(), RmsNormConfig{}, yn.view());
    eat(yn);
    Tensor o(DType::kBF16, {3, Hq, D}), ls(DType::kF32, {3, Hq});
    b->attention_paged(q.view(), i32_view(qs), i32_view(qp), pc.kv(), AttentionConfig{}, o.view(),
                       ls.view());
    eat(o);
    eat(ls);
    Tensor pre, pre_lse;
    run_prefill(*b, seqs, Hq, Hkv, D, &pre, &pre_lse);
    eat(pre);
    eat(pre_lse);
    Tensor a(DType::kF32, {3}), l(DType::kF32, {3}), e(DType::kF32, {3});
    b->linear_logprob(x.view(), w.view(), i32_view(tg), LogprobParams{}, ContractConfig{}, a.view(),
                      l.view(), e.view());
    eat(a);
    eat(l);
    eat(e);
    return bytes;
  };
  const int saved = num_threads();
  set_num_threads(1);
  const auto r1 = run();
  set_num_threads(3);
  const auto r3 = run();
  const auto r3b = run();
  set_num_threads(saved);
  ASSERT_EQ(r1.size(), r3.size());
  EXPECT_TRUE(bitwise_equal(r1.data(), r3.data(), int64_t(r1.size()), DType::kU8));
  EXPECT_TRUE(bitwise_equal(r3.data(), r3b.data(), int64_t(r3.size()), DType::kU8));
}

TEST(Baseline, BadInputsGiveClearErrors) {
  auto g = test::rng(17);
  auto b = baseline();
  Tensor x = test::random_bf16({4, 32}, g), w = test::random_bf16({8, 32}, g);
  Tensor xf(DType::kF32, {4, 32}), w16 = test::random_bf16({8, 16}, g);
  Tensor y(DType::kBF16, {4, 8}), y_bad(DType::kBF16, {4, 9});
  expect_error([&] { b->gemm(xf.view(), w.view(), GemmConfig{}, y.view()); }, "'x'");
  expect_error([&] { b->gemm(x.view(), w16.view(), GemmConfig{}, y.view()); }, "same K");
  expect_error([&] { b->gemm(x.view(), w.view(), GemmConfig{}, y_bad.view()); }, "'y'");
  expect_error([&] { b->gemm(x.view(), w.view(), GemmConfig{3}, y.view()); }, "segments");
  Tensor part(DType::kF32, {4, 8});
  expect_error([&] { b->gemm_partial(x.view(), w.view(), 32, 2, 1, GemmConfig{4}, part.view()); },
               "owns K columns");
  expect_error([&] { b->gemm_partial(x.view(), w.view(), 32, 2, 2, GemmConfig{4}, part.view()); },
               "tp_rank");
  Tensor part2(DType::kF32, {4, 7});
  expect_error([&] { b->gemm_combine({part.view(), part2.view()}, y.view()); }, "partials[1]");
  expect_error([&] { b->gemm_combine({}, y.view()); }, "partials");
  // Elementwise.
  Tensor wn = test::random_bf16({31}, g), yn(DType::kBF16, {4, 32});
  expect_error([&] { b->rmsnorm(x.view(), wn.view(), RmsNormConfig{}, yn.view()); }, "'weight'");
  expect_error(
      [&] { b->rmsnorm(x.view(), test::random_bf16({32}, g).view(), RmsNormConfig{}, y.view()); },
      "'y'");
  RopeConfig rc;
  rc.head_dim = 16;
  rc.max_positions = 10;
  const RopeTable table = RopeTable::build(rc);
  Tensor xr = test::random_bf16({2, 3, 16}, g);
  std::vector<int32_t> bad_pos{0, 10};
  expect_error([&] { b->rope(xr.view(), i32_view(bad_pos), table, xr.view()); }, "'positions'");
  Tensor up(DType::kBF16, {4, 31});
  expect_error([&] { b->silu_mul(x.view(), up.view(), yn.view()); }, "'up'");
  // Embedding.
  std::vector<int32_t> ids{0, 8};
  Tensor eo(DType::kBF16, {2, 32});
  expect_error([&] { b->embedding(i32_view(ids), w.view(), eo.view()); }, "'ids'");
  expect_error(
      [&] {
        b->embedding_vocab_parallel(i32_view(ids), w.view(), VocabShard{0, 8}, 4, eo.view());
      },
      "'shard'");
  // Attention.
  const int64_t D = 16;
  Tensor q = test::random_bf16({5, 2, D}, g), k = test::random_bf16({5, 1, D}, g);
  Tensor o(DType::kBF16, {5, 2, D});
  std::vector<int32_t> cu_bad{0, 3, 2, 5}, cu{0, 5};
  expect_error(
      [&] {
        b->attention_prefill_varlen(q.view(), k.view(), k.view(), i32_view(cu_bad),
                                    AttentionConfig{}, o.view(), TensorView{});
      },
      "non-decreasing");
  Tensor q3 = test::random_bf16({5, 3, D}, g), o3(DType::kBF16, {5, 3, D});
  Tensor k2 = test::random_bf16({5, 2, D}, g);
  expect_error(
      [&] {
        b->attention_prefill_varlen(q3.view(), k2.view(), k2.view(), i32_view(cu),
                                    AttentionConfig{}, o3.view(), TensorView{});
      },
      "multiple of kv heads");
  auto seqs = make_seqs({10}, 2, 1, D, g);
  Paged pc = make_paged(seqs, 1, D, 4, g);
  Tensor q1 = test::random_bf16({1, 2, D}, g), o1(DType::kBF16, {1, 2, D});
  std::vector<int32_t> s0{0}, p_bad{10}, p_ok{9}, s_bad{1};
  expect_error(
      [&] {
        b->attention_paged(q1.view(), i32_view(s0), i32_view(p_bad), pc.kv(), AttentionConfig{},
                           o1.view(), TensorView{});
      },
      "q_pos[0]");
  expect_error(
      [&] {
        b->attention_paged(q1.view(), i32_view(s_bad), i32_view(p_ok), pc.kv(), AttentionConfig{},
                           o1.view(), TensorView{});
      },
      "q_seq[0]");
  pc.bt.ptr<int32_t>()[1] = 999;
  expect_error(
      [&] {
        b->attention_paged(q1.view(), i32_view(s0), i32_view(p_ok), pc.kv(), AttentionConfig{},
                           o1.view(), TensorView{});
      },
      "kv.block_table[0][1]");
  expect_error(
      [&] {
        b->attention_paged_split_kv(q1.view(), i32_view(s0), i32_view(p_ok), pc.kv(),
                                    AttentionConfig{}, 0, o1.view(), TensorView{});
      },
      "num_splits");
  // Heads.
  std::vector<int32_t> tg{1, 2, 3, 8};
  Tensor lp(DType::kF32, {4}), ls(DType::kF32, {4}), en(DType::kF32, {4});
  expect_error(
      [&] {
        b->linear_logprob(x.view(), w.view(), i32_view(tg), LogprobParams{}, ContractConfig{},
                          lp.view(), ls.view(), en.view());
      },
      "'targets'");
  LogprobParams zero_t;
  zero_t.temperature = 0.0f;
  std::vector<int32_t> tg_ok{1, 2, 3, 7};
  expect_error(
      [&] {
        b->linear_logprob(x.view(), w.view(), i32_view(tg_ok), zero_t, ContractConfig{}, lp.view(),
                          ls.view(), en.view());
      },
      "temperature");
  std::vector<SamplingParams> sp(3);
  Tensor req(DType::kI64, {4}), pos(DType::kI32, {4}), sid(DType::kI64, {4});
  std::fill_n(req.ptr<int64_t>(), 4, 0);
  std::fill_n(pos.ptr<int32_t>(), 4, 0);
  expect_error(
      [&] {
        b->sample(x.view(), w.view(), sp, req.view(), pos.view(), ContractConfig{}, sid.view(),
                  lp.view(), ls.view(), en.view());
      },
      "'params'");
  sp.resize(4);
  sp[2].top_p = 0.0f;
  expect_error(
      [&] {
        b->sample(x.view(), w.view(), sp, req.view(), pos.view(), ContractConfig{}, sid.view(),
                  lp.view(), ls.view(), en.view());
      },
      "params[2]");
  BaselineConfig c;
  c.num_threads = 0;
  expect_error([&] { make_baseline_backend(c); }, "num_threads");
}

TEST(Baseline, ConfigPrints) {
  auto b = baseline(3);
  EXPECT_EQ(b->name(), "baseline");
  EXPECT_EQ(default_baseline_config(0).num_threads, num_threads());
  const std::string s = default_baseline_config(3).to_string();
  std::printf("[baseline] %s\n", s.c_str());
  EXPECT_NE(s.find("num_threads=3"), std::string::npos);
  EXPECT_NE(s.find("kv_split_budget=8"), std::string::npos);
}

// --- end to end ---

// V=300 H=64 I=96 L=2 Hq=4 Hkv=2 D=16, untied (tests/engine/rollout_test_util.h).
Qwen3Config tiny_config() { return test_util::small_untied_config(); }

// Training side (one packed forward + logprob) vs rollout side (chunked prefill of the prompts,
// then one decode step per token for all sequences, logprob per step) on a tiny random model:
// the log-probs of the tokens after the prompt. Returns (mismatches, compared).
std::pair<int64_t, int64_t> train_vs_rollout(std::shared_ptr<OpsBackend> ops, int tp_train,
                                             int tp_roll) {
  const Qwen3Config cfg = tiny_config();
  Weights weights = random_qwen3_weights(cfg, 21);
  std::map<std::string, TensorView> views;
  for (auto& [name, t] : weights) views[name] = t.view();
  ModelOptions opt;
  opt.contract.gemm_segments = 4;
  opt.contract.kv_chunk = 64;
  opt.contract.vocab_tile = 64;
  opt.contract.vocab_segments = 4;
  opt.tp = tp_train;
  Model train(cfg, views, opt, ops);
  opt.tp = tp_roll;
  Model roll(cfg, views, opt, ops);
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  const std::vector<int64_t> lens = {30, 45, 60, 37}, prompt = {10, 20, 5, 12};
  const int64_t S = int64_t(lens.size());
  std::mt19937_64 g(99);
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t n : lens) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (auto& t : s) t = int32_t(g() % uint64_t(V));
    seqs.push_back(s);
  }
  // Training: all sequences packed; targets = next token (-1 at a sequence's end).
  std::vector<int32_t> tokens, cu{0}, tg;
  for (const auto& s : seqs) {
    tokens.insert(tokens.end(), s.begin(), s.end());
    cu.push_back(int32_t(tokens.size()));
    for (size_t i = 0; i < s.size(); ++i) tg.push_back(i + 1 < s.size() ? s[i + 1] : -1);
  }
  const int64_t T = int64_t(tokens.size());
  Tensor hid(DType::kBF16, {T, H}), lp(DType::kF32, {T}), ls(DType::kF32, {T}),
      en(DType::kF32, {T});
  train.forward_packed(i32_view(tokens), i32_view(cu), hid.view());
  train.logprob(hid.view(), i32_view(tg), 1.0f, lp.view(), ls.view(), en.view());
  std::vector<std::vector<float>> train_lp(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s)
    train_lp[size_t(s)].assign(lp.ptr<float>() + cu[size_t(s)],
                               lp.ptr<float>() + cu[size_t(s + 1)]);

  // Rollout: a paged cache, sequence s in pages [s·MP, (s+1)·MP).
  const int64_t P = 8, MP = 8, NP = S * MP;
  std::vector<Tensor> kc, vc;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    kc.push_back(test::poisoned(DType::kBF16, {NP, P, cfg.num_key_value_heads, cfg.head_dim}));
    vc.push_back(test::poisoned(DType::kBF16, {NP, P, cfg.num_key_value_heads, cfg.head_dim}));
  }
  Tensor bt(DType::kI32, {S, MP}), sl(DType::kI32, {S});
  for (int64_t i = 0; i < S * MP; ++i) bt.ptr<int32_t>()[i] = int32_t(i);
  std::fill_n(sl.ptr<int32_t>(), S, 0);
  KvCacheView cache;
  for (auto& t : kc) cache.k.push_back(t.view());
  for (auto& t : vc) cache.v.push_back(t.view());
  cache.block_table = bt.view();
  cache.seq_lens = sl.view();
  std::vector<std::vector<float>> roll_lp(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) roll_lp[size_t(s)].assign(size_t(lens[size_t(s)]), 0.0f);
  std::vector<int64_t> done(static_cast<size_t>(S), 0);
  for (bool first = true;; first = false) {
    std::vector<int32_t> st, sq, sp, stg;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t n =
          first ? prompt[size_t(s)] : std::min<int64_t>(1, lens[size_t(s)] - done[size_t(s)]);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = done[size_t(s)] + j;
        st.push_back(seqs[size_t(s)][size_t(p)]);
        sq.push_back(int32_t(s));
        sp.push_back(int32_t(p));
        stg.push_back(p + 1 < lens[size_t(s)] ? seqs[size_t(s)][size_t(p + 1)] : -1);
      }
      done[size_t(s)] += n;
      sl.ptr<int32_t>()[s] = int32_t(done[size_t(s)]);
    }
    if (st.empty()) break;
    const int64_t N = int64_t(st.size());
    Tensor h(DType::kBF16, {N, H}), a(DType::kF32, {N}), l(DType::kF32, {N}), e(DType::kF32, {N});
    StepOptions so;
    roll.forward_step(i32_view(st), i32_view(sq), i32_view(sp), cache, so, h.view());
    roll.logprob(h.view(), i32_view(stg), 1.0f, a.view(), l.view(), e.view());
    for (int64_t i = 0; i < N; ++i)
      roll_lp[size_t(sq[size_t(i)])][size_t(sp[size_t(i)])] = a.ptr<float>()[i];
  }
  int64_t mism = 0, compared = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t p = prompt[size_t(s)] - 1; p + 1 < lens[size_t(s)]; ++p) {
      ++compared;
      mism += f32_bits(train_lp[size_t(s)][size_t(p)]) != f32_bits(roll_lp[size_t(s)][size_t(p)]);
    }
  return {mism, compared};
}

TEST(Baseline, EndToEndRolloutVsTrainingMismatchesWhereInvariantDoesNot) {
  for (auto [tp_train, tp_roll] : {std::pair{1, 1}, std::pair{1, 2}}) {
    auto [bm, bn] = train_vs_rollout(std::shared_ptr<OpsBackend>(baseline()), tp_train, tp_roll);
    auto [im, in] =
        train_vs_rollout(std::shared_ptr<OpsBackend>(make_invariant_backend()), tp_train, tp_roll);
    std::printf(
        "[baseline] end to end (training tp=%d, rollout tp=%d): baseline %lld of %lld log-probs "
        "differ, invariant %lld of %lld\n",
        tp_train, tp_roll, (long long)bm, (long long)bn, (long long)im, (long long)in);
    EXPECT_GT(bm, 0);
    EXPECT_EQ(im, 0);
    EXPECT_EQ(bn, in);
  }
}

}  // namespace
}  // namespace lockstep::engine
