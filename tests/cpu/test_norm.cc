// RMSNorm (+ fused residual): the stated lane layout re-implemented literally, strided / in-place /
// per-head 3-D views, accuracy vs an fp64 oracle, NaN/inf/overflow behaviour and argument errors.
// Row invariance (alone vs batches of 1/3/17/256), thread counts and determinism: the op-case
// table's RMSNorm cases (tests/ops, tests/cpu/test_op_cases.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "lockstep/ops/norm.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::f;

const std::vector<int64_t> kHidden = {1, 3, 8, 17, 64, 111, 136, 256, 1000, 4096};

// ---- The contract, written out literally: 32 lanes, each holding its own accumulator; group g
// (elements 8g..8g+7) belongs to lane g % 32; the row is padded with +0 to a multiple of 256
// (the contract says missing elements add +0, which changes nothing); then a full 32-lane
// xor-butterfly where every lane computes own + partner.
float lane_layout_inv_rms(const std::vector<float>& s, float eps) {
  const int64_t H = int64_t(s.size());
  const int64_t padded = (H + 255) / 256 * 256;
  float lane[32];
  for (int j = 0; j < 32; ++j) {
    float acc = 0.0f;
    for (int64_t g = j; g * 8 < padded; g += 32) {
      for (int e = 0; e < 8; ++e) {
        const int64_t k = g * 8 + e;
        const float v = k < H ? s[size_t(k)] : 0.0f;
        const float sq = v * v;
        acc = acc + sq;
      }
    }
    lane[j] = acc;
  }
  for (int o : {16, 8, 4, 2, 1}) {
    float next[32];
    for (int j = 0; j < 32; ++j) next[j] = lane[j] + lane[j ^ o];
    std::copy(next, next + 32, lane);
  }
  for (int j = 1; j < 32; ++j) {  // every lane ends with the same bits (+ is commutative)
    if (!std::isnan(lane[0])) {
      EXPECT_EQ(f32_bits(lane[j]), f32_bits(lane[0])) << "lane " << j;
    }
  }
  const float mean = lane[0] / float(H);
  const float denom = std::sqrt(mean + eps);
  return 1.0f / denom;
}

bf16 canon(float v) { return std::isnan(v) ? bf16{test::kCanonNan} : f32_to_bf16(v); }

// Reference for one row; fills y (and s_out when a residual is given).
void reference_row(const bf16* x, const bf16* res, const bf16* w, int64_t H, float eps, bf16* y,
                   bf16* s_out) {
  std::vector<float> s(static_cast<size_t>(H));
  for (int64_t k = 0; k < H; ++k) {
    if (res) {
      const bf16 sk = canon(f(x[k]) + f(res[k]));
      s_out[k] = sk;
      s[size_t(k)] = f(sk);
    } else {
      s[size_t(k)] = f(x[k]);
    }
  }
  const float r = lane_layout_inv_rms(s, eps);
  for (int64_t k = 0; k < H; ++k) {
    const float t = f(f32_to_bf16(s[size_t(k)] * r));
    y[k] = canon(t * f(w[k]));
  }
}

struct Case {
  Tensor x, res, w;
};

Case make_case(int64_t T, int64_t H, uint64_t salt, float scale = 1.0f) {
  auto g = test::rng(salt);
  return {test::random_bf16({T, H}, g, scale), test::random_bf16({T, H}, g, scale),
          test::random_bf16({H}, g, 1.0f)};
}

// Plain left-to-right sum of squares: NOT the contract; used to show the layout test has teeth.
float sequential_inv_rms(const std::vector<float>& s, float eps) {
  float acc = 0.0f;
  for (float v : s) acc = acc + v * v;
  return 1.0f / std::sqrt(acc / float(s.size()) + eps);
}

// The comparison below can tell reduction orders apart: over many rows of H = 4096 the
// sequential order changes r, and with it some output bits.
TEST(RmsNorm, LaneLayoutTestDistinguishesOrders) {
  const int64_t T = 64, H = 4096;
  Case c = make_case(T, H, 4242);
  int r_differs = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> s(static_cast<size_t>(H));
    for (int64_t k = 0; k < H; ++k) s[size_t(k)] = f(c.x.ptr<bf16>()[t * H + k]);
    r_differs += f32_bits(lane_layout_inv_rms(s, 1e-6f)) != f32_bits(sequential_inv_rms(s, 1e-6f));
  }
  EXPECT_GT(r_differs, 0) << "the two orders agree on every row; the layout test proves nothing";
  std::printf("[rmsnorm] sequential vs lane-layout r differs on %d of %lld rows\n", r_differs,
              (long long)T);
}

TEST(RmsNorm, MatchesTheStatedLaneLayout) {
  RmsNormConfig cfg{1e-6f};
  for (int64_t H : kHidden) {
    for (float scale : {1.0f, 1e-3f, 30.0f}) {
      const int64_t T = 5;
      Case c = make_case(T, H, uint64_t(H) * 7 + uint64_t(scale * 1000), scale);
      Tensor y = test::poisoned(DType::kBF16, {T, H});
      Tensor y2 = test::poisoned(DType::kBF16, {T, H});
      Tensor s2 = test::poisoned(DType::kBF16, {T, H});
      cpu::rmsnorm(c.x.view(), c.w.view(), cfg, y.view());
      cpu::rmsnorm_residual(c.x.view(), c.res.view(), c.w.view(), cfg, s2.view(), y2.view());
      Tensor ry(DType::kBF16, {T, H}), ry2(DType::kBF16, {T, H}), rs2(DType::kBF16, {T, H});
      for (int64_t t = 0; t < T; ++t) {
        reference_row(c.x.ptr<bf16>() + t * H, nullptr, c.w.ptr<bf16>(), H, cfg.eps,
                      ry.ptr<bf16>() + t * H, nullptr);
        reference_row(c.x.ptr<bf16>() + t * H, c.res.ptr<bf16>() + t * H, c.w.ptr<bf16>(), H,
                      cfg.eps, ry2.ptr<bf16>() + t * H, rs2.ptr<bf16>() + t * H);
      }
      EXPECT_BITWISE_EQ(y.data(), ry.data(), T * H, DType::kBF16) << "H=" << H;
      EXPECT_BITWISE_EQ(y2.data(), ry2.data(), T * H, DType::kBF16) << "residual H=" << H;
      EXPECT_BITWISE_EQ(s2.data(), rs2.data(), T * H, DType::kBF16) << "residual_out H=" << H;
    }
  }
}

// Strided rows (padding between rows) and in-place calls give the contiguous result.
TEST(RmsNorm, StridedAndInPlaceEqualContiguous) {
  RmsNormConfig cfg{1e-6f};
  const int64_t T = 17, H = 136, ld = 200;
  Case c = make_case(T, H, 7);
  Tensor y = test::poisoned(DType::kBF16, {T, H}), s = test::poisoned(DType::kBF16, {T, H});
  Tensor yr = test::poisoned(DType::kBF16, {T, H});
  cpu::rmsnorm(c.x.view(), c.w.view(), cfg, y.view());
  cpu::rmsnorm_residual(c.x.view(), c.res.view(), c.w.view(), cfg, s.view(), yr.view());

  auto g = test::rng(8);
  Tensor xb = test::random_bf16({T, ld}, g), rb = test::random_bf16({T, ld}, g);
  Tensor yb = test::poisoned(DType::kBF16, {T, ld}), sb = test::poisoned(DType::kBF16, {T, ld});
  for (int64_t t = 0; t < T; ++t) {
    std::copy(c.x.ptr<bf16>() + t * H, c.x.ptr<bf16>() + (t + 1) * H, xb.ptr<bf16>() + t * ld + 9);
    std::copy(c.res.ptr<bf16>() + t * H, c.res.ptr<bf16>() + (t + 1) * H,
              rb.ptr<bf16>() + t * ld + 9);
  }
  cpu::rmsnorm(test::strided_view(xb, T, H, ld, 9), c.w.view(), cfg,
               test::strided_view(yb, T, H, ld, 3));
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(yb.ptr<bf16>() + t * ld + 3, y.ptr<bf16>() + t * H, H, DType::kBF16) << t;
  }
  cpu::rmsnorm_residual(test::strided_view(xb, T, H, ld, 9), test::strided_view(rb, T, H, ld, 9),
                        c.w.view(), cfg, test::strided_view(sb, T, H, ld, 3),
                        test::strided_view(yb, T, H, ld, 3));
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(yb.ptr<bf16>() + t * ld + 3, yr.ptr<bf16>() + t * H, H, DType::kBF16) << t;
    ASSERT_BITWISE_EQ(sb.ptr<bf16>() + t * ld + 3, s.ptr<bf16>() + t * H, H, DType::kBF16) << t;
  }

  // In place: y is x; and the vLLM fused form (residual updated in place, x overwritten by y).
  Tensor xi(DType::kBF16, {T, H}), ri(DType::kBF16, {T, H});
  std::memcpy(xi.data(), c.x.data(), size_t(xi.nbytes()));
  cpu::rmsnorm(xi.view(), c.w.view(), cfg, xi.view());
  EXPECT_BITWISE_EQ(xi.data(), y.data(), T * H, DType::kBF16);
  std::memcpy(xi.data(), c.x.data(), size_t(xi.nbytes()));
  std::memcpy(ri.data(), c.res.data(), size_t(ri.nbytes()));
  cpu::rmsnorm_residual(xi.view(), ri.view(), c.w.view(), cfg, ri.view(), xi.view());
  EXPECT_BITWISE_EQ(xi.data(), yr.data(), T * H, DType::kBF16);
  EXPECT_BITWISE_EQ(ri.data(), s.data(), T * H, DType::kBF16);
}

// Qwen3 q/k norm: [T, heads, D] views inside a fused qkv buffer equal the 2-D op on the rows.
TEST(RmsNorm, PerHeadViewsInsideQkvBuffer) {
  RmsNormConfig cfg{1e-6f};
  const int64_t T = 9, Hq = 4, Hkv = 2, D = 128, W = (Hq + 2 * Hkv) * D;
  auto g = test::rng(21);
  Tensor qkv = test::random_bf16({T, W}, g);
  Tensor wq = test::random_bf16({D}, g);
  TensorView q = TensorView::contiguous(qkv.data(), DType::kBF16, {T, Hq, D});
  q.stride[0] = W;
  TensorView k = q;
  k.shape[1] = Hkv;
  k.data = qkv.ptr<bf16>() + Hq * D;

  Tensor yq = test::poisoned(DType::kBF16, {T, Hq, D});
  Tensor yk = test::poisoned(DType::kBF16, {T, Hkv, D});
  cpu::rmsnorm(q, wq.view(), cfg, yq.view());
  cpu::rmsnorm(k, wq.view(), cfg, yk.view());

  // The same rows gathered contiguously, normed as [T*heads, D].
  Tensor rows_q(DType::kBF16, {T * Hq, D}), rows_k(DType::kBF16, {T * Hkv, D});
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(rows_q.ptr<bf16>() + t * Hq * D, qkv.ptr<bf16>() + t * W, size_t(Hq * D) * 2);
    std::memcpy(rows_k.ptr<bf16>() + t * Hkv * D, qkv.ptr<bf16>() + t * W + Hq * D,
                size_t(Hkv * D) * 2);
  }
  Tensor ref_q = test::poisoned(DType::kBF16, {T * Hq, D});
  Tensor ref_k = test::poisoned(DType::kBF16, {T * Hkv, D});
  cpu::rmsnorm(rows_q.view(), wq.view(), cfg, ref_q.view());
  cpu::rmsnorm(rows_k.view(), wq.view(), cfg, ref_k.view());
  EXPECT_BITWISE_EQ(yq.data(), ref_q.data(), T * Hq * D, DType::kBF16);
  EXPECT_BITWISE_EQ(yk.data(), ref_k.data(), T * Hkv * D, DType::kBF16);

  // In place inside the qkv buffer (what the attention block does).
  Tensor qkv2(DType::kBF16, {T, W});
  std::memcpy(qkv2.data(), qkv.data(), size_t(qkv.nbytes()));
  TensorView q2 = q;
  q2.data = qkv2.data();
  cpu::rmsnorm(q2, wq.view(), cfg, q2);
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(qkv2.ptr<bf16>() + t * W, ref_q.ptr<bf16>() + t * Hq * D, Hq * D,
                      DType::kBF16);
    ASSERT_BITWISE_EQ(qkv2.ptr<bf16>() + t * W + Hq * D, qkv.ptr<bf16>() + t * W + Hq * D,
                      2 * Hkv * D, DType::kBF16);  // k, v untouched
  }
}

// fp64 oracle: y = s / sqrt(mean(s^2) + eps) * w. Two bf16 roundings (x·r, then ·w) bound the
// error by 2^-8 + 2^-8 relative (half a bf16 ulp each) plus fp32 noise: tolerance 2^-7 * 1.01.
TEST(RmsNorm, AccuracyVsFp64Oracle) {
  double worst = 0, worst_ulps = 0;
  for (int64_t H : {64, 136, 1000, 4096}) {
    for (float eps : {1e-6f, 1e-2f}) {
      RmsNormConfig cfg{eps};
      const int64_t T = 8;
      Case c = make_case(T, H, 300 + uint64_t(H), 3.0f);
      Tensor y = test::poisoned(DType::kBF16, {T, H}), s = test::poisoned(DType::kBF16, {T, H});
      cpu::rmsnorm_residual(c.x.view(), c.res.view(), c.w.view(), cfg, s.view(), y.view());
      for (int64_t t = 0; t < T; ++t) {
        const bf16* xr = c.x.ptr<bf16>() + t * H;
        const bf16* rr = c.res.ptr<bf16>() + t * H;
        const bf16* sr = s.ptr<bf16>() + t * H;
        double ss = 0;
        for (int64_t k = 0; k < H; ++k) {
          const double sk = double(f(xr[k])) + double(f(rr[k]));
          // the residual stream: one rounding of the exact sum
          ASSERT_EQ(sr[k].bits, f32_to_bf16(float(sk)).bits);
          ss += double(f(sr[k])) * double(f(sr[k]));
        }
        const double r = 1.0 / std::sqrt(ss / double(H) + double(eps));
        for (int64_t k = 0; k < H; ++k) {
          const double ref = double(f(sr[k])) * r * double(f(c.w.ptr<bf16>()[k]));
          const double got = f(y.ptr<bf16>()[t * H + k]);
          const double rel = std::fabs(got - ref) / std::max(std::fabs(ref), 1e-30);
          worst = std::max(worst, rel);
          worst_ulps = std::max(worst_ulps, test::bf16_ulps(float(got), ref));
          ASSERT_LE(std::fabs(got - ref), 0x1p-7 * 1.01 * std::fabs(ref) + 1e-38)
              << "H=" << H << " t=" << t << " k=" << k << " got " << got << " ref " << ref;
        }
      }
    }
  }
  std::printf("[rmsnorm] max rel error vs fp64: %.3g (%.3f bf16 ulp)\n", worst, worst_ulps);
}

// Documented special values: a NaN anywhere makes the whole row the canonical NaN; +-inf makes
// r = 1/sqrt(inf) = 0, so finite elements become signed zeros and the inf becomes NaN; squares
// that overflow fp32 (|x| >= 2^64) likewise give r = 0; an all-zero row gives y = +-0.
TEST(RmsNorm, NanInfOverflowAndZeroRows) {
  RmsNormConfig cfg{1e-6f};
  const int64_t T = 5, H = 136;
  Case c = make_case(T, H, 77);
  bf16* x = c.x.ptr<bf16>();
  x[0 * H + 17] = bf16{0x7f81};            // row 0: signalling-NaN pattern
  x[1 * H + 100] = f32_to_bf16(INFINITY);  // row 1: +inf
  x[2 * H + 5] = f32_to_bf16(0x1p70f);     // row 2: square overflows
  for (int64_t k = 0; k < H; ++k) x[3 * H + k] = bf16{uint16_t(k % 2 ? 0x8000 : 0)};  // row 3: +-0
  Tensor y = test::poisoned(DType::kBF16, {T, H});
  cpu::rmsnorm(c.x.view(), c.w.view(), cfg, y.view());
  const bf16* yy = y.ptr<bf16>();
  const bf16* w = c.w.ptr<bf16>();
  for (int64_t k = 0; k < H; ++k) {
    EXPECT_EQ(yy[0 * H + k].bits, test::kCanonNan) << k;
    for (int row : {1, 2}) {
      const bf16 v = yy[row * H + k];
      if (row == 1 && k == 100) {
        EXPECT_EQ(v.bits, test::kCanonNan);  // inf * 0
      } else {
        EXPECT_EQ(v.bits & 0x7fff, 0) << "row " << row << " k " << k;  // +-0
        const bool neg = (x[row * H + k].bits >> 15) != (w[k].bits >> 15);
        EXPECT_EQ(v.bits >> 15, neg ? 1 : 0) << "row " << row << " k " << k;
      }
    }
    const bf16 z = yy[3 * H + k];
    EXPECT_EQ(z.bits & 0x7fff, 0);
    EXPECT_EQ(z.bits >> 15, (x[3 * H + k].bits >> 15) ^ (w[k].bits >> 15));
  }
  // Row 4 is untouched by its neighbours' specials.
  Tensor y4 = test::poisoned(DType::kBF16, {1, H});
  cpu::rmsnorm(c.x.view().rows(4, 5), c.w.view(), cfg, y4.view());
  EXPECT_BITWISE_EQ(yy + 4 * H, y4.data(), H, DType::kBF16);

  // Residual: x + r overflowing bf16 gives inf in the stream; NaN is stored canonically.
  Case d = make_case(2, H, 78);
  d.x.ptr<bf16>()[3] = f32_to_bf16(3e38f);
  d.res.ptr<bf16>()[3] = f32_to_bf16(3e38f);
  d.x.ptr<bf16>()[H + 4] = bf16{0xffff};  // negative NaN with payload
  Tensor s = test::poisoned(DType::kBF16, {2, H}), yr = test::poisoned(DType::kBF16, {2, H});
  cpu::rmsnorm_residual(d.x.view(), d.res.view(), d.w.view(), cfg, s.view(), yr.view());
  EXPECT_EQ(s.ptr<bf16>()[3].bits, 0x7f80);
  EXPECT_EQ(s.ptr<bf16>()[H + 4].bits, test::kCanonNan);
  EXPECT_EQ(yr.ptr<bf16>()[H + 7].bits, test::kCanonNan);
}

TEST(RmsNorm, BadInputsThrowNamingTheArgument) {
  RmsNormConfig cfg{1e-6f};
  const int64_t T = 3, H = 64;
  Case c = make_case(T, H, 9);
  Tensor y(DType::kBF16, {T, H}), s(DType::kBF16, {T, H});
  Tensor xf(DType::kF32, {T, H});
  test::expect_error([&] { cpu::rmsnorm(xf.view(), c.w.view(), cfg, y.view()); },
                     {"rmsnorm", "'x'", "bf16", "f32"});
  Tensor w2(DType::kBF16, {H + 1});
  test::expect_error([&] { cpu::rmsnorm(c.x.view(), w2.view(), cfg, y.view()); },
                     {"'weight'", "[64]", "[65]"});
  Tensor y2(DType::kBF16, {T + 1, H});
  test::expect_error([&] { cpu::rmsnorm(c.x.view(), c.w.view(), cfg, y2.view()); }, {"'y'"});
  Tensor x1(DType::kBF16, {H});
  test::expect_error([&] { cpu::rmsnorm(x1.view(), c.w.view(), cfg, y.view()); },
                     {"'x'", "[T, H] or [T, heads, D]"});
  TensorView xs = c.x.view();
  xs.stride[1] = 2;
  xs.shape[1] = H / 2;
  test::expect_error([&] { cpu::rmsnorm(xs, c.w.view(), cfg, y.view()); }, {"'x'", "stride 1"});
  Tensor x0(DType::kBF16, {T, 0}), w0(DType::kBF16, {0});
  test::expect_error([&] { cpu::rmsnorm(x0.view(), w0.view(), cfg, x0.view()); }, {"'x'", ">= 1"});
  for (float bad : {-1.0f, NAN, INFINITY}) {
    test::expect_error([&] { cpu::rmsnorm(c.x.view(), c.w.view(), RmsNormConfig{bad}, y.view()); },
                       {"eps"});
  }
  test::expect_error(
      [&] { cpu::rmsnorm_residual(c.x.view(), c.res.view(), c.w.view(), cfg, y.view(), y.view()); },
      {"'residual_out'", "'y'"});
  Tensor r2(DType::kBF16, {T, H + 8});
  test::expect_error(
      [&] { cpu::rmsnorm_residual(c.x.view(), r2.view(), c.w.view(), cfg, s.view(), y.view()); },
      {"'residual'"});
  // Empty batch: nothing to do, no error.
  Tensor xe(DType::kBF16, {0, H}), ye(DType::kBF16, {0, H});
  EXPECT_NO_THROW(cpu::rmsnorm(xe.view(), c.w.view(), cfg, ye.view()));
}

TEST(RmsNorm, ConfigPrints) {
  const std::string s = RmsNormConfig{1e-6f}.to_string();
  EXPECT_NE(s.find("eps=0x1.0c6f7ap-20"), std::string::npos) << s;
  EXPECT_NE(s.find("lanes=32 group=8"), std::string::npos) << s;
}

}  // namespace
}  // namespace lockstep
