// GEMM nt: bitwise against a plain re-implementation of the contract (scalar MMA model, explicit
// trees), fast path vs scalar path on extreme/special inputs, accuracy vs an fp64 oracle, and bad
// inputs. Invariance (row alone vs in batches, strides, threads, every TP degree, determinism)
// is checked on the op-case table's GEMM cases (tests/ops, tests/cpu/test_op_cases.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "lockstep/ops/gemm.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::bitwise_equal;

// ---- The contract written plainly (independent of src/cpu/gemm.cc) -------------------------

// One output: x_row, w_row of length K; S segments of the zero-padded K; tree; bias; no rounding.
float naive_output(const bf16* xr, const bf16* wr, int64_t K, int S, bool has_bias, float bias) {
  int64_t unit = 16 * S;
  int64_t kp = (K + unit - 1) / unit * unit;
  int64_t len = kp / S;
  std::vector<bf16> xp(size_t(kp), bf16{0}), wp(size_t(kp), bf16{0});
  std::copy(xr, xr + K, xp.begin());
  std::copy(wr, wr + K, wp.begin());
  float p[8];
  for (int s = 0; s < S; ++s) {
    float c = 0.0f;
    for (int64_t k = s * len; k < (s + 1) * len; k += 16)
      c = mma_kblock_bf16(xp.data() + k, wp.data() + k, c);
    p[s] = c;
  }
  float t;
  switch (S) {
    case 1:
      t = p[0];
      break;
    case 2:
      t = p[0] + p[1];
      break;
    case 4:
      t = (p[0] + p[1]) + (p[2] + p[3]);
      break;
    default:
      t = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
      break;
  }
  if (has_bias) t = t + bias;
  return t;
}

enum class BiasKind { kNone, kBF16, kF32 };

struct Case {
  int64_t M, N, K;
  int S;
  BiasKind bias;
  DType out;
};

std::string name(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " S=" + std::to_string(c.S) + " bias=" + std::to_string(int(c.bias)) +
         " out=" + dtype_name(c.out);
}

// Inputs for one case, bias as a Tensor (maybe empty) plus its fp32 values.
struct Inputs {
  Tensor x, w, bias;
  std::vector<float> bias_f;
  const TensorView* bias_view() const { return bias.numel() ? &bias_v : nullptr; }
  TensorView bias_v;
};

Inputs make_inputs(const Case& c, std::mt19937_64& g) {
  Inputs in;
  in.x = test::random_bf16({c.M, c.K}, g);
  in.w = test::random_bf16({c.N, c.K}, g, 0.1f);
  if (c.bias != BiasKind::kNone) {
    in.bias = c.bias == BiasKind::kBF16 ? test::random_bf16({c.N}, g) : test::random_f32({c.N}, g);
    in.bias_v = in.bias.view();
    for (int64_t n = 0; n < c.N; ++n)
      in.bias_f.push_back(test::element_as_float(in.bias.data(), in.bias.dtype(), n));
  }
  return in;
}

Tensor naive_gemm(const Case& c, const Inputs& in) {
  Tensor y(c.out, {c.M, c.N});
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      float v = naive_output(in.x.ptr<bf16>() + m * c.K, in.w.ptr<bf16>() + n * c.K, c.K, c.S,
                             c.bias != BiasKind::kNone, in.bias_f.empty() ? 0.0f : in.bias_f[n]);
      if (c.out == DType::kBF16) {
        y.ptr<bf16>()[m * c.N + n] = f32_to_bf16(v);
      } else {
        y.ptr<float>()[m * c.N + n] = v;
      }
    }
  return y;
}

GemmConfig seg(int s) { return GemmConfig{s}; }

// ---- Contract vs the plain re-implementation -----------------------------------------------

TEST(Gemm, MatchesNaiveForEverySegmentCountShapeBiasAndOutput) {
  auto g = test::rng(1);
  const int64_t shapes[][3] = {{1, 1, 1},     {3, 17, 16},  {17, 3, 15},
                               {1, 111, 333}, {111, 1, 64}, {3, 3, 129},
                               {17, 111, 48}, {5, 33, 200}, {2, 40, 1000}};
  int cases = 0;
  for (auto& sh : shapes)
    for (int S : {1, 2, 4, 8})
      for (BiasKind b : {BiasKind::kNone, BiasKind::kBF16, BiasKind::kF32})
        for (DType out : {DType::kBF16, DType::kF32}) {
          Case c{sh[0], sh[1], sh[2], S, b, out};
          Inputs in = make_inputs(c, g);
          Tensor want = naive_gemm(c, in);
          Tensor y = test::poisoned(out, {c.M, c.N});
          cpu::gemm_bf16_nt(in.x.view(), in.w.view(), in.bias_view(), seg(S), y.view());
          ASSERT_TRUE(bitwise_equal(y.data(), want.data(), y.numel(), out)) << name(c);
          Tensor ys = test::poisoned(out, {c.M, c.N});
          cpu::gemm_bf16_nt_scalar(in.x.view(), in.w.view(), in.bias_view(), seg(S), ys.view());
          ASSERT_TRUE(bitwise_equal(ys.data(), want.data(), y.numel(), out)) << name(c);
          ++cases;
        }
  EXPECT_EQ(cases, 9 * 4 * 3 * 2);
}

// Zero padding adds nothing: K padded explicitly with zeros (to the contract's padded K) gives the
// same bits; for S = 1, any number of extra zero k-blocks gives the same bits.
TEST(Gemm, ZeroPaddingIsExact) {
  auto g = test::rng(2);
  for (int S : {1, 2, 4, 8})
    for (int64_t K : {1, 7, 31, 100, 257}) {
      int64_t M = 5, N = 19;
      GemmKLayout l = gemm_k_layout(seg(S), K);
      ASSERT_EQ(l.padded % (16 * S), 0);
      ASSERT_GE(l.padded, K);
      ASSERT_LT(l.padded - K, 16 * S);
      int64_t extra = S == 1 ? l.padded + 48 : l.padded;
      Tensor x = test::random_bf16({M, K}, g), w = test::random_bf16({N, K}, g);
      Tensor xp(DType::kBF16, {M, extra}), wp(DType::kBF16, {N, extra});
      std::memset(xp.data(), 0, size_t(xp.nbytes()));
      std::memset(wp.data(), 0, size_t(wp.nbytes()));
      for (int64_t m = 0; m < M; ++m)
        std::memcpy(xp.ptr<bf16>() + m * extra, x.ptr<bf16>() + m * K, size_t(K) * 2);
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(wp.ptr<bf16>() + n * extra, w.ptr<bf16>() + n * K, size_t(K) * 2);
      Tensor y = test::poisoned(DType::kF32, {M, N}), yp = test::poisoned(DType::kF32, {M, N});
      cpu::gemm_bf16_nt(x.view(), w.view(), seg(S), y.view());
      cpu::gemm_bf16_nt(xp.view(), wp.view(), seg(S), yp.view());
      ASSERT_TRUE(bitwise_equal(y.data(), yp.data(), y.numel(), DType::kF32))
          << "S=" << S << " K=" << K << " padded to " << extra;
    }
}

// ---- Fast path vs the scalar model on hard inputs -----------------------------------------

// A bf16 with a random sign, mantissa and an exponent drawn from [elo, ehi] (unbiased).
bf16 random_exp_bf16(std::mt19937_64& g, int elo, int ehi) {
  std::uniform_int_distribution<int> e(elo, ehi), f(0, 127), s(0, 1);
  return bf16{uint16_t((s(g) << 15) | ((e(g) + 127) << 7) | f(g))};
}

enum class Fill { kSpread, kWide, kZeros, kSpecial, kMaxMant, kTiny, kHuge, kEdge };

void hard_fill(bf16* p, int64_t n, Fill f, std::mt19937_64& g) {
  std::uniform_int_distribution<int> pick(0, 99);
  for (int64_t i = 0; i < n; ++i) {
    switch (f) {
      case Fill::kSpread:
        p[i] = random_exp_bf16(g, -20, 20);
        break;
      case Fill::kWide:
        p[i] = random_exp_bf16(g, -60, 60);
        break;
      case Fill::kZeros:
        p[i] = pick(g) < 40 ? bf16{uint16_t(pick(g) < 50 ? 0x0000 : 0x8000)}
                            : random_exp_bf16(g, -8, 8);
        break;
      case Fill::kSpecial: {
        int r = pick(g);
        if (r < 2)
          p[i] = bf16{0x7f80};  // +inf
        else if (r < 4)
          p[i] = bf16{0xff80};  // -inf
        else if (r < 5)
          p[i] = bf16{0x7fc1};  // NaN
        else if (r < 9)
          p[i] = bf16{uint16_t(1 + r)};  // subnormal
        else if (r < 12)
          p[i] = bf16{uint16_t(0x8000 | r)};  // negative subnormal
        else
          p[i] = random_exp_bf16(g, -4, 4);
        break;
      }
      case Fill::kMaxMant:  // all the same sign and mantissa 1.1111111b: sums near 2^31 units
        p[i] = bf16{uint16_t(((127 + (pick(g) < 90 ? 0 : -1)) << 7) | 0x7f)};
        break;
      case Fill::kTiny:
        p[i] = random_exp_bf16(g, -126, -40);
        break;
      case Fill::kHuge:
        p[i] = random_exp_bf16(g, 30, 127);
        break;
      case Fill::kEdge: {  // products at exponents -100 and +90: the fast kernel's range limits
        const int e[4] = {-50, 45, 0, -20};
        int v = e[pick(g) % 4];
        p[i] = random_exp_bf16(g, v, v);
        break;
      }
    }
  }
}

TEST(Gemm, FastPathEqualsScalarModelOnHardInputs) {
  auto g = test::rng(3);
  const Fill fills[] = {Fill::kSpread,  Fill::kWide, Fill::kZeros, Fill::kSpecial,
                        Fill::kMaxMant, Fill::kTiny, Fill::kHuge,  Fill::kEdge};
  std::uniform_int_distribution<int> dim(1, 70), kd(1, 300), sd(0, 3), fd(0, 7);
  for (int iter = 0; iter < 120; ++iter) {
    int64_t M = dim(g), N = dim(g), K = kd(g);
    int S = 1 << sd(g);
    Tensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K});
    // Rows get different fills, so clean and special rows meet in one tile.
    for (int64_t m = 0; m < M; ++m) hard_fill(x.ptr<bf16>() + m * K, K, fills[fd(g)], g);
    for (int64_t n = 0; n < N; ++n) hard_fill(w.ptr<bf16>() + n * K, K, fills[fd(g)], g);
    for (DType out : {DType::kF32, DType::kBF16}) {
      Tensor y = test::poisoned(out, {M, N}), ys = test::poisoned(out, {M, N});
      cpu::gemm_bf16_nt(x.view(), w.view(), seg(S), y.view());
      cpu::gemm_bf16_nt_scalar(x.view(), w.view(), seg(S), ys.view());
      ASSERT_TRUE(bitwise_equal(y.data(), ys.data(), y.numel(), out))
          << "iter " << iter << " M=" << M << " N=" << N << " K=" << K << " S=" << S;
    }
  }
}

// M <= 4 (decode) takes its own kernel (w decoded in registers): the same hard inputs, plus x
// rows with large exponents (> 2^27) where w is zero and tiny products elsewhere, a case that
// path must route to the scalar chain.
TEST(Gemm, FastPathEqualsScalarModelForSmallM) {
  auto g = test::rng(15);
  const Fill fills[] = {Fill::kSpread,  Fill::kWide, Fill::kZeros, Fill::kSpecial,
                        Fill::kMaxMant, Fill::kTiny, Fill::kHuge,  Fill::kEdge};
  std::uniform_int_distribution<int> nd(1, 100), kd(1, 400), sd(0, 3), fd(0, 7), big(0, 3);
  for (int iter = 0; iter < 60; ++iter)
    for (int64_t M = 1; M <= 5; ++M) {
      const int64_t N = nd(g), K = kd(g);
      const int S = 1 << sd(g);
      Tensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K});
      for (int64_t m = 0; m < M; ++m) {
        if (big(g) == 0) {  // x up to 2^40 where w (below) is zero, tiny where w is not
          for (int64_t k = 0; k < K; ++k)
            x.ptr<bf16>()[m * K + k] =
                k % 3 ? random_exp_bf16(g, 28, 40) : random_exp_bf16(g, -50, -45);
        } else {
          hard_fill(x.ptr<bf16>() + m * K, K, fills[fd(g)], g);
        }
      }
      for (int64_t n = 0; n < N; ++n) {
        if (big(g) == 0) {
          for (int64_t k = 0; k < K; ++k)  // products near 2^-100; zeros, and a zero k-block
            w.ptr<bf16>()[n * K + k] = k % 3 == 0 && (k < 16 || k >= 32)
                                           ? random_exp_bf16(g, -50, -45)
                                           : bf16{uint16_t(k % 2 ? 0x8000 : 0)};
        } else {
          hard_fill(w.ptr<bf16>() + n * K, K, fills[fd(g)], g);
        }
      }
      Tensor y = test::poisoned(DType::kF32, {M, N}), ys = test::poisoned(DType::kF32, {M, N});
      cpu::gemm_bf16_nt(x.view(), w.view(), seg(S), y.view());
      cpu::gemm_bf16_nt_scalar(x.view(), w.view(), seg(S), ys.view());
      ASSERT_TRUE(bitwise_equal(y.data(), ys.data(), y.numel(), DType::kF32))
          << "iter " << iter << " M=" << M << " N=" << N << " K=" << K << " S=" << S;
    }
}

// The same per fill kind, with every row of that kind (long K: long chains).
TEST(Gemm, FastPathEqualsScalarModelPerFillKind) {
  auto g = test::rng(4);
  for (Fill f : {Fill::kSpread, Fill::kWide, Fill::kZeros, Fill::kSpecial, Fill::kMaxMant,
                 Fill::kTiny, Fill::kHuge, Fill::kEdge})
    for (Fill fw : {Fill::kSpread, Fill::kMaxMant, Fill::kZeros, Fill::kEdge}) {
      int64_t M = 9, N = 40, K = 512;
      Tensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K});
      hard_fill(x.ptr<bf16>(), M * K, f, g);
      hard_fill(w.ptr<bf16>(), N * K, fw, g);
      Tensor y = test::poisoned(DType::kF32, {M, N}), ys = test::poisoned(DType::kF32, {M, N});
      cpu::gemm_bf16_nt(x.view(), w.view(), seg(2), y.view());
      cpu::gemm_bf16_nt_scalar(x.view(), w.view(), seg(2), ys.view());
      ASSERT_TRUE(bitwise_equal(y.data(), ys.data(), y.numel(), DType::kF32))
          << "fill " << int(f) << " / " << int(fw);
    }
}

// inf/NaN/subnormal elements whose exponents alone would look "in range" to the fast kernel
// (e.g. inf·2^-40: exponent field sum 88): the special-value detection must route them.
TEST(Gemm, SpecialValuesWithInRangeExponentsGoThroughTheModel) {
  auto g = test::rng(14);
  const uint16_t specials[] = {0x7f80, 0xff80, 0x7fc1, 0x0001, 0x8005, 0x0040};
  for (uint16_t sp : specials)
    for (int trial = 0; trial < 4; ++trial) {
      const bool subnormal = (sp & 0x7f80) == 0;
      const int64_t M = 6, N = 37, K = 80;
      Tensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K});
      // Subnormal x (exponent -126) is in range against w exponents in [27, 40]; inf/NaN
      // (exponent field 255) against w exponents in [-45, -40].
      for (int64_t i = 0; i < M * K; ++i)
        x.ptr<bf16>()[i] = subnormal ? random_exp_bf16(g, -40, 40) : random_exp_bf16(g, -45, -40);
      for (int64_t i = 0; i < N * K; ++i)
        w.ptr<bf16>()[i] = subnormal ? random_exp_bf16(g, 27, 40) : random_exp_bf16(g, -45, -40);
      std::uniform_int_distribution<int64_t> pos(0, K - 1);
      for (int64_t m = 1; m < M; m += 2) x.ptr<bf16>()[m * K + pos(g)] = bf16{sp};
      // Now and then make the special products the largest in their blocks: for a subnormal,
      // every x element subnormal (exponent -126, no hidden bit); for inf/NaN, tiny neighbours.
      std::uniform_int_distribution<int> mant(1, 0x7f), sign(0, 1);
      if (trial % 2)
        for (int64_t i = 0; i < M * K; ++i)
          if (x.ptr<bf16>()[i].bits != sp)
            x.ptr<bf16>()[i] = subnormal ? bf16{uint16_t(sign(g) << 15 | mant(g))}
                                         : random_exp_bf16(g, -126, -120);
      for (DType out : {DType::kF32, DType::kBF16}) {
        Tensor y = test::poisoned(out, {M, N}), ys = test::poisoned(out, {M, N});
        cpu::gemm_bf16_nt(x.view(), w.view(), seg(1), y.view());
        cpu::gemm_bf16_nt_scalar(x.view(), w.view(), seg(1), ys.view());
        ASSERT_TRUE(bitwise_equal(y.data(), ys.data(), y.numel(), out))
            << "special 0x" << std::hex << sp << std::dec << " trial " << trial;
      }
    }
}

// A k-block whose exact sum exceeds 2^31 units of 2^(E-25): 16 products of 1.9921875² at E = 0 on
// top of c = ±1.5 (from the first block). The fast kernel must leave int32 here.
TEST(Gemm, FastPathHandlesSumsBeyondInt32) {
  for (int sign : {1, -1}) {
    const int64_t M = 3, N = 35, K = 32;
    Tensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K});
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        float v = k == 0 ? 1.0f : k < 16 ? 0.0f : 1.9921875f;
        x.ptr<bf16>()[m * K + k] = f32_to_bf16(sign * v);
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        float v = k == 0 ? 1.5f : k < 16 ? 0.0f : 1.9921875f;
        w.ptr<bf16>()[n * K + k] = f32_to_bf16(v);
      }
    Tensor y = test::poisoned(DType::kF32, {M, N}), ys = test::poisoned(DType::kF32, {M, N});
    cpu::gemm_bf16_nt(x.view(), w.view(), seg(1), y.view());
    cpu::gemm_bf16_nt_scalar(x.view(), w.view(), seg(1), ys.view());
    ASSERT_TRUE(bitwise_equal(y.data(), ys.data(), y.numel(), DType::kF32)) << "sign " << sign;
    // 1.5 + 16·1.9921875² = 64.998... rounded toward zero to fp32 at E = 0 (units of 2^-25, then
    // 24 bits): the exact value is representable, so it is the answer.
    EXPECT_EQ(y.ptr<float>()[0], float(sign * (1.5 + 16 * 1.9921875 * 1.9921875)));
  }
}

// ---- Invariance -----------------------------------------------------------------------------

TEST(Gemm, TpRangesTileThePaddedK) {
  // K=200, S=4: padded 256, segments of 64; t=2 -> [0,128), [128,200).
  GemmKRange a = gemm_tp_k_range(seg(4), 200, 2, 0), b = gemm_tp_k_range(seg(4), 200, 2, 1);
  EXPECT_EQ(a.begin, 0);
  EXPECT_EQ(a.end, 128);
  EXPECT_EQ(b.begin, 128);
  EXPECT_EQ(b.end, 200);
  // K=40, S=4, t=4: segments of 16; rank 3 owns only padding.
  GemmKRange c = gemm_tp_k_range(seg(4), 40, 4, 3);
  EXPECT_EQ(c.begin, 40);
  EXPECT_EQ(c.end, 40);
  EXPECT_EQ(GemmConfig{4}.to_string(), "gemm: segments=4");
}

// ---- Accuracy vs fp64 ------------------------------------------------------------------------

// Bound (docs/contract.md §G): with A = sum_k |x_k w_k| + |bias| and B = K_padded/16 blocks,
//   f32 out:  |y - exact| <= (B + log2(S) + 2) * 2^-20 * A
//   bf16 out: |y - exact| <= 2^-8 * |exact| + (B + log2(S) + 2) * 2^-19 * A
TEST(Gemm, AccuracyAgainstFp64Oracle) {
  auto g = test::rng(10);
  for (int S : {1, 8})
    for (DType out : {DType::kF32, DType::kBF16}) {
      int64_t M = 7, N = 50, K = 777;
      Tensor x = test::random_bf16({M, K}, g), w = test::random_bf16({N, K}, g, 0.05f);
      Tensor b = test::random_f32({N}, g, 0.1f);
      TensorView bv = b.view();
      Tensor y = test::poisoned(out, {M, N});
      cpu::gemm_bf16_nt(x.view(), w.view(), &bv, seg(S), y.view());
      double blocks = double(gemm_k_layout(seg(S), K).padded / 16);
      double worst = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double exact = b.ptr<float>()[n], a = std::fabs(exact);
          for (int64_t k = 0; k < K; ++k) {
            double p = double(bf16_to_f32(x.ptr<bf16>()[m * K + k])) *
                       double(bf16_to_f32(w.ptr<bf16>()[n * K + k]));
            exact += p;
            a += std::fabs(p);
          }
          double got = test::element_as_float(y.data(), out, m * N + n);
          double lvl = std::log2(double(S));
          double tol = out == DType::kF32 ? (blocks + lvl + 2) * std::ldexp(a, -20)
                                          : std::ldexp(std::fabs(exact), -8) +
                                                (blocks + lvl + 2) * std::ldexp(a, -19);
          ASSERT_LE(std::fabs(got - exact), tol) << "m=" << m << " n=" << n << " S=" << S;
          worst = std::max(worst, std::fabs(got - exact) / tol);
        }
      std::printf("[gemm accuracy] S=%d out=%s worst error / bound = %.3g\n", S, dtype_name(out),
                  worst);
    }
}

// ---- Documented results and bad inputs --------------------------------------------------------

TEST(Gemm, NanRowGivesNanOutputsAndLeavesOtherRowsAlone) {
  auto g = test::rng(11);
  int64_t M = 5, N = 20, K = 64;
  Tensor x = test::random_bf16({M, K}, g), w = test::random_bf16({N, K}, g);
  x.ptr<bf16>()[2 * K + 7] = bf16{0x7fc0};
  Tensor y = test::poisoned(DType::kBF16, {M, N}), ys = test::poisoned(DType::kBF16, {M, N});
  cpu::gemm_bf16_nt(x.view(), w.view(), seg(1), y.view());
  cpu::gemm_bf16_nt_scalar(x.view(), w.view(), seg(1), ys.view());
  EXPECT_TRUE(bitwise_equal(y.data(), ys.data(), y.numel(), DType::kBF16));
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(y.ptr<bf16>()[2 * N + n].bits, kCanonicalNanBf16);
  // f32 output and TP partials store the canonical NaN too.
  Tensor yf = test::poisoned(DType::kF32, {M, N}), yp = test::poisoned(DType::kF32, {M, N});
  cpu::gemm_bf16_nt(x.view(), w.view(), seg(1), yf.view());
  cpu::gemm_bf16_nt_partial(x.view(), w.view(), K, 1, 0, seg(1), yp.view());
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(f32_bits(yf.ptr<float>()[2 * N + n]), kCanonicalNanF32);
    EXPECT_EQ(f32_bits(yp.ptr<float>()[2 * N + n]), kCanonicalNanF32);
  }
  Tensor row = test::poisoned(DType::kBF16, {1, N});
  cpu::gemm_bf16_nt(x.view().rows(1, 2), w.view(), seg(1), row.view());
  EXPECT_TRUE(bitwise_equal(row.data(), y.ptr<bf16>() + N, N, DType::kBF16));
}

TEST(Gemm, EmptyShapes) {
  auto g = test::rng(12);
  Tensor x0(DType::kBF16, {0, 8}), w = test::random_bf16({4, 8}, g), y0(DType::kF32, {0, 4});
  EXPECT_NO_THROW(cpu::gemm_bf16_nt(x0.view(), w.view(), seg(1), y0.view()));
  Tensor x = test::random_bf16({3, 8}, g), w0(DType::kBF16, {0, 8}), y1(DType::kF32, {3, 0});
  EXPECT_NO_THROW(cpu::gemm_bf16_nt(x.view(), w0.view(), seg(1), y1.view()));
  // K = 0: y = bias (or +0).
  Tensor xk(DType::kBF16, {3, 0}), wk(DType::kBF16, {4, 0});
  Tensor b = test::random_bf16({4}, g);
  TensorView bv = b.view();
  Tensor y = test::poisoned(DType::kF32, {3, 4}), yn = test::poisoned(DType::kF32, {3, 4});
  cpu::gemm_bf16_nt(xk.view(), wk.view(), &bv, seg(2), y.view());
  cpu::gemm_bf16_nt(xk.view(), wk.view(), seg(2), yn.view());
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(y.ptr<float>()[i], bf16_to_f32(b.ptr<bf16>()[i % 4]));
    EXPECT_EQ(f32_bits(yn.ptr<float>()[i]), 0u);
  }
}

template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected lockstep::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Gemm, BadInputsThrowClearErrors) {
  auto g = test::rng(13);
  Tensor x = test::random_bf16({3, 32}, g), w = test::random_bf16({5, 32}, g);
  Tensor y(DType::kF32, {3, 5});
  Tensor w31 = test::random_bf16({5, 31}, g), xf = test::random_f32({3, 32}, g);
  Tensor y_bad(DType::kF32, {3, 4}), y_i32(DType::kI32, {3, 5});
  Tensor b_bad(DType::kF32, {4}), b_i32(DType::kI32, {5});
  TensorView bb = b_bad.view(), bi = b_i32.view();
  auto c1 = seg(1);
  expect_error([&] { cpu::gemm_bf16_nt(x.view(), w31.view(), c1, y.view()); }, "same K");
  expect_error([&] { cpu::gemm_bf16_nt(xf.view(), w.view(), c1, y.view()); }, "'x'");
  expect_error([&] { cpu::gemm_bf16_nt(x.view(), xf.view(), c1, y.view()); }, "'w'");
  expect_error([&] { cpu::gemm_bf16_nt(x.view(), w.view(), seg(3), y.view()); }, "segments");
  expect_error([&] { cpu::gemm_bf16_nt(x.view(), w.view(), c1, y_bad.view()); }, "'y'");
  expect_error([&] { cpu::gemm_bf16_nt(x.view(), w.view(), c1, y_i32.view()); }, "'y'");
  expect_error([&] { cpu::gemm_bf16_nt(x.view(), w.view(), &bb, c1, y.view()); }, "'bias'");
  expect_error([&] { cpu::gemm_bf16_nt(x.view(), w.view(), &bi, c1, y.view()); }, "'bias'");
  // Output aliasing an input.
  Tensor xy(DType::kF32, {3, 32});
  TensorView xyv = xy.view();
  xyv.dtype = DType::kBF16;  // x in the first half of the buffer
  TensorView yv = TensorView::contiguous(xy.data(), DType::kF32, {3, 5});
  expect_error([&] { cpu::gemm_bf16_nt(xyv, w.view(), c1, yv); }, "overlap");
  // Non-contiguous last dimension.
  TensorView xs = x.view();
  xs.stride[1] = 2;
  xs.shape[1] = 16;
  TensorView ws = w.view();
  ws.shape[1] = 16;
  expect_error([&] { cpu::gemm_bf16_nt(xs, ws, c1, y.view()); }, "'x'");
  // TP: bad degree, bad rank, wrong shard width, bad combine.
  Tensor p(DType::kF32, {3, 5});
  expect_error([&] { cpu::gemm_bf16_nt_partial(x.view(), w.view(), 64, 4, 0, seg(2), p.view()); },
               "tp_size");
  expect_error([&] { cpu::gemm_bf16_nt_partial(x.view(), w.view(), 64, 2, 2, seg(2), p.view()); },
               "tp_rank");
  expect_error([&] { cpu::gemm_bf16_nt_partial(x.view(), w.view(), 100, 2, 0, seg(2), p.view()); },
               "x_shard");
  std::vector<TensorView> three = {p.view(), p.view(), p.view()};
  expect_error([&] { cpu::gemm_tree_combine(three, nullptr, y.view()); }, "partials");
  std::vector<TensorView> mism = {p.view(), y_bad.view()};
  expect_error([&] { cpu::gemm_tree_combine(mism, nullptr, y.view()); }, "partials[1]");
  EXPECT_THROW(gemm_tp_k_range(seg(8), 100, 16, 0), Error);
  EXPECT_THROW(GemmConfig{0}.validate(), Error);
}

}  // namespace
}  // namespace lockstep
