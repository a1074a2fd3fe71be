// RMSNorm backward (docs/contract.md §B.4): dx / ds and dweight against a literal transcription of
// §B.4 (its own 32-lane layout and butterfly, its own 16-token trees), per-head [T, heads, D]
// rows, dweight invariance to micro-batch splits, packing (shuffled rows, garbage padding rows)
// and thread count, dx row invariance, strided and in-place views, accuracy vs an fp64 oracle
// (itself checked by finite differences), special values, and bad arguments.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/elementwise_test_util.h"
#include "cpu/token_order_test_util.h"
#include "lockstep/ops/backward.h"
#include "lockstep/ops/norm.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::expect_error;
using test::f;

constexpr uint32_t kCanonNanF32 = 0x7FC00000u;
const RmsNormConfig kCfg{1e-6f};

uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

TensorView v(const Tensor& t) { return t.view(); }

// A 3-D [T, heads, D] view of a contiguous [T, heads·D] tensor.
TensorView view3(const Tensor& t, int64_t heads) {
  const int64_t T = t.shape()[0], D = t.shape()[1] / heads;
  return TensorView::contiguous(t.data(), t.dtype(), {T, heads, D});
}

// ---- §B.4 written out literally --------------------------------------------------------------

// §E.1 steps 2-3 on a row of fp32 terms: the row padded with +0 to a multiple of 256, lane j owns
// groups j, j + 32, ... of 8 elements and adds them to +0 in order, then all 32 lanes do
// v_j = v_j + v_{j xor o} for o = 16 … 1.
float lane_sum(const std::vector<float>& q) {
  const int64_t H = int64_t(q.size()), padded = (H + 255) / 256 * 256;
  float lane[32];
  for (int j = 0; j < 32; ++j) {
    float acc = 0.0f;
    for (int64_t g = j; g * 8 < padded; g += 32)
      for (int e = 0; e < 8; ++e) {
        const int64_t k = g * 8 + e;
        acc = acc + (k < H ? q[size_t(k)] : 0.0f);
      }
    lane[j] = acc;
  }
  for (int o : {16, 8, 4, 2, 1}) {
    float next[32];
    for (int j = 0; j < 32; ++j) next[j] = lane[j] + lane[j ^ o];
    std::copy(next, next + 32, lane);
  }
  return lane[0];
}

float literal_r(const bf16* s, int64_t H, float eps) {
  std::vector<float> q(static_cast<size_t>(H));
  for (int64_t k = 0; k < H; ++k) q[size_t(k)] = f(s[k]) * f(s[k]);
  return 1.0f / std::sqrt(lane_sum(q) / float(H) + eps);
}

float canon(float x) { return std::isnan(x) ? f32_from_bits(kCanonNanF32) : x; }

// dx (or ds with gres) of one row, steps 1-4 and the residual rule.
void literal_row(const bf16* s, const bf16* w, const float* gy, const float* gres, int64_t H,
                 float eps, float* out) {
  const float r = literal_r(s, H, eps);
  std::vector<float> gt(static_cast<size_t>(H)), q(static_cast<size_t>(H));
  for (int64_t k = 0; k < H; ++k) {
    gt[size_t(k)] = gy[k] * f(w[k]);
    q[size_t(k)] = gt[size_t(k)] * f(s[k]);
  }
  const float dot = lane_sum(q);
  const float c3 = ((r * r) * r) / float(H);
  const float coef = dot * c3;
  for (int64_t k = 0; k < H; ++k) {
    const float dx = (gt[size_t(k)] * r) - (f(s[k]) * coef);
    out[k] = canon(gres ? gres[k] + dx : dx);
  }
}

// §2's tree: tree(v_0 … v_{n-1}) = tree(left half) + tree(right half).
float tree(const float* v, int n) {
  return n == 1 ? v[0] : tree(v, n / 2) + tree(v + n / 2, n / 2);
}

// dweight over the token blocks of `seqs` (sorted by step index here): per token the heads'
// gy·t summed in head order, per block a tree of 16 (padding +0), blocks chained into dw.
// s [rows, heads·D] bf16, gy [rows, heads·D] f32 contiguous.
void literal_dweight(const Tensor& s, const Tensor& gy, int64_t heads, std::vector<TokenSeq> seqs,
                     float eps, std::vector<float>& dw) {
  const int64_t D = s.shape()[1] / heads;
  std::sort(seqs.begin(), seqs.end(),
            [](const TokenSeq& a, const TokenSeq& b) { return a.step_index < b.step_index; });
  for (const TokenSeq& q : seqs)
    for (int64_t p0 = 0; p0 < q.len; p0 += 16) {
      std::vector<float> c(size_t(16 * D), 0.0f);
      for (int64_t i = 0; i < 16 && p0 + i < q.len; ++i)
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t off = (q.row + p0 + i) * heads * D + h * D;
          const bf16* sr = s.ptr<bf16>() + off;
          const float r = literal_r(sr, D, eps);
          for (int64_t k = 0; k < D; ++k) {
            const float t = f(f32_to_bf16(f(sr[k]) * r));
            const float g = gy.ptr<float>()[off + k] * t;
            c[size_t(i * D + k)] = h == 0 ? g : c[size_t(i * D + k)] + g;
          }
        }
      for (int64_t k = 0; k < D; ++k) {
        float col[16];
        for (int i = 0; i < 16; ++i) col[i] = c[size_t(i * D + k)];
        dw[size_t(k)] = canon(dw[size_t(k)] + tree(col, 16));
      }
    }
}

// bf16 values with special values mixed in (rarely, so that most rows stay finite).
void sprinkle_specials(bf16* p, int64_t n, std::mt19937_64& g) {
  for (int64_t i = 0; i < n; ++i) {
    switch (g() % 500) {
      case 0:
        p[i] = bf16{0x7fc0};
        break;
      case 1:
        p[i] = bf16{0xff80};
        break;
      case 2:
        p[i] = bf16{0x0003};  // subnormal
        break;
      case 3:
        p[i] = bf16{0x8000};
        break;
      case 4:
        p[i] = f32_to_bf16(std::ldexp(1.5f, 70));  // square overflows
        break;
      default:
        break;
    }
  }
}

// ---- Literal transcription -------------------------------------------------------------------

TEST(RmsNormBackward, MatchesLiteralTranscription) {
  auto g = test::rng(1);
  for (int64_t H : {1, 3, 8, 17, 64, 111, 136, 256, 1000}) {
    for (int64_t heads : {1, 3}) {
      for (bool residual : {false, true}) {
        const int64_t T = H % 3 == 0 ? 1 : H % 3 == 1 ? 17 : 33, W = heads * H;
        SCOPED_TRACE("H=" + std::to_string(H) + " heads=" + std::to_string(heads) +
                     (residual ? " residual" : "") + " T=" + std::to_string(T));
        const std::vector<TokenSeq> seqs = {{3, T / 3, std::max<int64_t>(1, T - T / 3 - 1)},
                                            {1, 0, T / 3}};
        Tensor s = test::random_bf16({T, W}, g), w = test::random_bf16({H}, g);
        Tensor gy = test::random_f32({T, W}, g), gres = test::random_f32({T, W}, g);
        sprinkle_specials(s.ptr<bf16>(), s.numel(), g);
        if (T > 1) gy.ptr<float>()[(T / 2) * W] = NAN;
        Tensor out = test::poisoned(DType::kF32, {T, W});
        const TokenOrder order = TokenOrder::make("t", seqs, T);
        std::vector<float> dw(static_cast<size_t>(H)), ref_dw(static_cast<size_t>(H));
        test::fill_f32(dw.data(), H, g);
        ref_dw = dw;
        TensorView dwv = TensorView::contiguous(dw.data(), DType::kF32, {H});
        const TensorView sv = heads == 1 ? v(s) : view3(s, heads);
        const TensorView gyv = heads == 1 ? v(gy) : view3(gy, heads);
        const TensorView outv = heads == 1 ? v(out) : view3(out, heads);
        if (residual) {
          const TensorView gresv = heads == 1 ? v(gres) : view3(gres, heads);
          cpu::rmsnorm_residual_backward(sv, v(w), kCfg, gyv, gresv, outv, &order, &dwv);
        } else {
          cpu::rmsnorm_backward(sv, v(w), kCfg, gyv, outv, &order, &dwv);
        }
        Tensor ref(DType::kF32, {T, W});
        for (int64_t row = 0; row < T * heads; ++row)
          literal_row(s.ptr<bf16>() + row * H, w.ptr<bf16>(), gy.ptr<float>() + row * H,
                      residual ? gres.ptr<float>() + row * H : nullptr, H, kCfg.eps,
                      ref.ptr<float>() + row * H);
        EXPECT_BITWISE_EQ(out.data(), ref.data(), out.numel(), DType::kF32);
        literal_dweight(s, gy, heads, seqs, kCfg.eps, ref_dw);
        EXPECT_BITWISE_EQ(dw.data(), ref_dw.data(), H, DType::kF32);
      }
    }
  }
}

// The t the backward recomputes is the forward's t (rmsnorm with weight 1 writes round(t·1) = t),
// seen through dweight of a single token with gy = 1: dweight = +0 + tree(t, +0, …) = t.
TEST(RmsNormBackward, RecomputesTheForwardsT) {
  auto g = test::rng(2);
  for (int64_t H : {5, 136, 4096}) {
    Tensor s = test::random_bf16({1, H}, g, 7.0f), ones(DType::kBF16, {H});
    for (int64_t k = 0; k < H; ++k) ones.ptr<bf16>()[k] = f32_to_bf16(1.0f);
    Tensor t(DType::kBF16, {1, H});
    cpu::rmsnorm(v(s), v(ones), kCfg, v(t));
    Tensor gy(DType::kF32, {1, H}), dx(DType::kF32, {1, H});
    for (int64_t k = 0; k < H; ++k) gy.ptr<float>()[k] = 1.0f;
    std::vector<float> dw(static_cast<size_t>(H), 0.0f);
    TensorView dwv = TensorView::contiguous(dw.data(), DType::kF32, {H});
    const TokenOrder order = TokenOrder::make("t", {{0, 0, 1}}, 1);
    cpu::rmsnorm_backward(v(s), v(ones), kCfg, v(gy), v(dx), &order, &dwv);
    for (int64_t k = 0; k < H; ++k)
      ASSERT_EQ(bits(dw[size_t(k)]), bits(f(t.ptr<bf16>()[k]))) << "H=" << H << " k=" << k;
  }
}

// ---- Invariance ------------------------------------------------------------------------------

struct NormStep {
  test::Step step;
  Tensor s, gy;  // [tokens, heads·D]
  int64_t heads, D;
  NormStep(std::vector<int64_t> lens, int64_t heads_, int64_t D_, std::mt19937_64& g)
      : step(std::move(lens)), heads(heads_), D(D_) {
    s = test::random_bf16({step.tokens, heads * D}, g);
    gy = test::random_f32({step.tokens, heads * D}, g);
  }
};

// dweight after the micro-batches (lists of step indices) in order, from `init`; also checks
// every micro-batch's dx rows against dx of the whole step in one call.
std::vector<float> dweight_of(const NormStep& n, const Tensor& w,
                              const std::vector<std::vector<int64_t>>& batches,
                              const std::vector<float>& init, std::mt19937_64& g, bool shuffle,
                              int max_pad, const Tensor* dx_all) {
  std::vector<float> dw = init;
  TensorView dwv = TensorView::contiguous(dw.data(), DType::kF32, {n.D});
  GradStep gs;
  for (const auto& ids : batches) {
    const test::Packing p = test::pack(n.step, ids, g, shuffle, max_pad);
    gs.accept(p.order);
    Tensor s = test::packed_rows(n.s, p, g), gy = test::packed_rows(n.gy, p, g);
    Tensor dx = test::poisoned(DType::kF32, gy.shape());
    const TensorView sv = n.heads == 1 ? v(s) : view3(s, n.heads);
    cpu::rmsnorm_backward(sv, v(w), kCfg, n.heads == 1 ? v(gy) : view3(gy, n.heads),
                          n.heads == 1 ? v(dx) : view3(dx, n.heads), &p.order, &dwv);
    if (dx_all == nullptr) continue;
    const int64_t W = n.heads * n.D;
    for (size_t r = 0; r < p.src.size(); ++r) {
      if (p.src[r] < 0) continue;
      EXPECT_BITWISE_EQ(dx.ptr<float>() + int64_t(r) * W, dx_all->ptr<float>() + p.src[r] * W, W,
                        DType::kF32)
          << "token " << p.src[r];
    }
  }
  return dw;
}

TEST(RmsNormBackward, DweightIsInvariantToSplitsPackingAndThreads) {
  auto g = test::rng(3);
  for (auto [heads, D] : std::vector<std::pair<int64_t, int64_t>>{{1, 136}, {4, 64}, {2, 17}}) {
    SCOPED_TRACE("heads=" + std::to_string(heads) + " D=" + std::to_string(D));
    NormStep n({1, 17, 33, 5, 40, 16, 3}, heads, D, g);
    Tensor w = test::random_bf16({D}, g);
    std::vector<float> init(static_cast<size_t>(D));
    test::fill_f32(init.data(), D, g, 1e-2f);
    // The whole step in one call, in step order: the reference dx.
    const test::Packing all = test::pack_all(n.step);
    Tensor dx_all(DType::kF32, {n.step.tokens, heads * D});
    std::vector<float> scratch = init;
    TensorView sv = TensorView::contiguous(scratch.data(), DType::kF32, {D});
    cpu::rmsnorm_backward(heads == 1 ? v(n.s) : view3(n.s, heads), v(w), kCfg,
                          heads == 1 ? v(n.gy) : view3(n.gy, heads),
                          heads == 1 ? v(dx_all) : view3(dx_all, heads), &all.order, &sv);
    const std::vector<float> one =
        dweight_of(n, w, {test::id_range(0, 7)}, init, g, false, 0, &dx_all);
    EXPECT_TRUE(test::bitwise_equal(one, scratch));
    EXPECT_TRUE(test::bitwise_equal(
        one, dweight_of(n, w, {{0, 1}, {2, 3, 4}, {5, 6}}, init, g, true, 4, &dx_all)));
    std::vector<std::vector<int64_t>> each;
    for (int64_t i = 0; i < 7; ++i) each.push_back({i});
    EXPECT_TRUE(test::bitwise_equal(one, dweight_of(n, w, each, init, g, true, 5, &dx_all)));
    const int saved = num_threads();
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      EXPECT_TRUE(test::bitwise_equal(
          one, dweight_of(n, w, {test::id_range(0, 7)}, init, g, true, 6, &dx_all)))
          << "threads=" << threads;
    }
    set_num_threads(saved);
  }
}

// More token blocks than one pass of block sums (64) in a micro-batch.
TEST(RmsNormBackward, DweightAcrossBlockChunks) {
  auto g = test::rng(10);
  NormStep n({700, 3, 500}, 2, 8, g);  // 44 + 1 + 32 blocks
  Tensor w = test::random_bf16({8}, g);
  std::vector<float> init(8);
  test::fill_f32(init.data(), 8, g);
  const test::Packing p = test::pack(n.step, test::id_range(0, 3), g, true, 3);
  Tensor s = test::packed_rows(n.s, p, g), gy = test::packed_rows(n.gy, p, g);
  Tensor dx(DType::kF32, gy.shape());
  std::vector<float> dw = init, ref = init;
  TensorView dwv = TensorView::contiguous(dw.data(), DType::kF32, {8});
  cpu::rmsnorm_backward(view3(s, 2), v(w), kCfg, view3(gy, 2), view3(dx, 2), &p.order, &dwv);
  literal_dweight(s, gy, 2, std::vector<TokenSeq>(p.order.seqs().begin(), p.order.seqs().end()),
                  kCfg.eps, ref);
  EXPECT_TRUE(test::bitwise_equal(dw, ref));
  EXPECT_TRUE(
      test::bitwise_equal(dw, dweight_of(n, w, {{0}, {1}, {2}}, init, g, true, 2, nullptr)));
}

TEST(RmsNormBackward, DxOfARowIsTheSameAloneOrInABatchForAnyThreadCount) {
  auto g = test::rng(9);
  for (auto [heads, D] : std::vector<std::pair<int64_t, int64_t>>{{1, 111}, {4, 64}}) {
    const int64_t W = heads * D;
    Tensor w = test::random_bf16({D}, g);
    Tensor s1 = test::random_bf16({1, W}, g), gy1 = test::random_f32({1, W}, g);
    Tensor dx1 = test::poisoned(DType::kF32, {1, W});
    cpu::rmsnorm_backward(heads == 1 ? v(s1) : view3(s1, heads), v(w), kCfg,
                          heads == 1 ? v(gy1) : view3(gy1, heads),
                          heads == 1 ? v(dx1) : view3(dx1, heads), nullptr, nullptr);
    const int saved = num_threads();
    for (int64_t T : {1, 3, 17, 256})
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        Tensor s = test::random_bf16({T, W}, g), gy = test::random_f32({T, W}, g);
        const int64_t at = int64_t(g() % uint64_t(T));
        std::memcpy(s.ptr<bf16>() + at * W, s1.data(), size_t(W) * 2);
        std::memcpy(gy.ptr<float>() + at * W, gy1.data(), size_t(W) * 4);
        Tensor dx = test::poisoned(DType::kF32, {T, W});
        cpu::rmsnorm_backward(heads == 1 ? v(s) : view3(s, heads), v(w), kCfg,
                              heads == 1 ? v(gy) : view3(gy, heads),
                              heads == 1 ? v(dx) : view3(dx, heads), nullptr, nullptr);
        EXPECT_BITWISE_EQ(dx.ptr<float>() + at * W, dx1.data(), W, DType::kF32)
            << "heads=" << heads << " T=" << T << " threads=" << threads;
      }
    set_num_threads(saved);
  }
}

TEST(RmsNormBackward, StridedAndInPlaceViewsGiveTheContiguousBits) {
  auto g = test::rng(4);
  const int64_t T = 17, H = 136, ld = 150;
  Tensor s = test::random_bf16({T, H}, g), w = test::random_bf16({H}, g);
  Tensor gy = test::random_f32({T, H}, g), gres = test::random_f32({T, H}, g);
  Tensor dx(DType::kF32, {T, H}), ds(DType::kF32, {T, H});
  cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), nullptr, nullptr);
  cpu::rmsnorm_residual_backward(v(s), v(w), kCfg, v(gy), v(gres), v(ds), nullptr, nullptr);
  // Strided rows for every argument.
  Tensor sb = test::random_bf16({T, ld}, g), gyb = test::random_f32({T, ld}, g);
  Tensor grb = test::random_f32({T, ld}, g), ob = test::poisoned(DType::kF32, {T, ld});
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(sb.ptr<bf16>() + t * ld + 7, s.ptr<bf16>() + t * H, size_t(H) * 2);
    std::memcpy(gyb.ptr<float>() + t * ld + 5, gy.ptr<float>() + t * H, size_t(H) * 4);
    std::memcpy(grb.ptr<float>() + t * ld + 1, gres.ptr<float>() + t * H, size_t(H) * 4);
  }
  auto fview = [&](const Tensor& b, int64_t off) {
    TensorView r = TensorView::contiguous(b.ptr<float>() + off, DType::kF32, {T, H});
    r.stride[0] = ld;
    return r;
  };
  const TensorView ssv = test::strided_view(sb, T, H, ld, 7);
  cpu::rmsnorm_backward(ssv, v(w), kCfg, fview(gyb, 5), fview(ob, 3), nullptr, nullptr);
  for (int64_t t = 0; t < T; ++t)
    ASSERT_BITWISE_EQ(ob.ptr<float>() + t * ld + 3, dx.ptr<float>() + t * H, H, DType::kF32);
  cpu::rmsnorm_residual_backward(ssv, v(w), kCfg, fview(gyb, 5), fview(grb, 1), fview(ob, 3),
                                 nullptr, nullptr);
  for (int64_t t = 0; t < T; ++t)
    ASSERT_BITWISE_EQ(ob.ptr<float>() + t * ld + 3, ds.ptr<float>() + t * H, H, DType::kF32);
  // In place: dx is gy; ds is gres; ds is gy.
  Tensor gi = test::clone(gy);
  cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gi), v(gi), nullptr, nullptr);
  EXPECT_BITWISE_EQ(gi.data(), dx.data(), T * H, DType::kF32);
  Tensor ri = test::clone(gres);
  cpu::rmsnorm_residual_backward(v(s), v(w), kCfg, v(gy), v(ri), v(ri), nullptr, nullptr);
  EXPECT_BITWISE_EQ(ri.data(), ds.data(), T * H, DType::kF32);
  gi = test::clone(gy);
  cpu::rmsnorm_residual_backward(v(s), v(w), kCfg, v(gi), v(gres), v(gi), nullptr, nullptr);
  EXPECT_BITWISE_EQ(gi.data(), ds.data(), T * H, DType::kF32);
  // In place with a weight gradient (read before dx overwrites gy).
  std::vector<float> dw1(static_cast<size_t>(H), 0.0f), dw2(static_cast<size_t>(H), 0.0f);
  TensorView d1 = TensorView::contiguous(dw1.data(), DType::kF32, {H});
  TensorView d2 = TensorView::contiguous(dw2.data(), DType::kF32, {H});
  const TokenOrder order = TokenOrder::make("t", {{0, 0, T}}, T);
  cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &order, &d1);
  gi = test::clone(gy);
  cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gi), v(gi), &order, &d2);
  EXPECT_TRUE(test::bitwise_equal(dw1, dw2));
}

// ---- Accuracy --------------------------------------------------------------------------------

// The plain math in fp64: y_k = s_k·r·w_k, r = (Σ s²/H + eps)^-1/2, L = Σ gy_k·y_k.
double loss64(const std::vector<double>& s, const std::vector<double>& w,
              const std::vector<double>& gy, double eps) {
  double ss = 0;
  for (double x : s) ss += x * x;
  const double r = 1.0 / std::sqrt(ss / double(s.size()) + eps);
  double l = 0;
  for (size_t k = 0; k < s.size(); ++k) l += gy[k] * s[k] * r * w[k];
  return l;
}
// Its analytic gradient dL/ds_j = gy_j w_j r − (r³/H) s_j Σ gy_k w_k s_k, and the magnitude
// |gy_j w_j r| + (r³/H)|s_j| Σ|gy_k w_k s_k| that bounds the fp32 rounding errors.
void grad64(const std::vector<double>& s, const std::vector<double>& w,
            const std::vector<double>& gy, double eps, std::vector<double>& g,
            std::vector<double>& mag) {
  const double H = double(s.size());
  double ss = 0, dot = 0, adot = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    ss += s[k] * s[k];
    dot += gy[k] * w[k] * s[k];
    adot += std::fabs(gy[k] * w[k] * s[k]);
  }
  const double r = 1.0 / std::sqrt(ss / H + eps);
  g.resize(s.size());
  mag.resize(s.size());
  for (size_t j = 0; j < s.size(); ++j) {
    g[j] = gy[j] * w[j] * r - r * r * r / H * s[j] * dot;
    mag[j] = std::fabs(gy[j] * w[j] * r) + r * r * r / H * std::fabs(s[j]) * adot;
  }
}

TEST(RmsNormBackward, Fp64OracleAgreesWithFiniteDifferences) {
  auto g = test::rng(5);
  for (int64_t H : {3, 17, 136}) {
    std::vector<double> s(static_cast<size_t>(H)), w(static_cast<size_t>(H)),
        gy(static_cast<size_t>(H)), grad, mag;
    std::normal_distribution<double> d;
    for (int64_t k = 0; k < H; ++k) {
      s[size_t(k)] = d(g);
      w[size_t(k)] = d(g);
      gy[size_t(k)] = d(g);
    }
    grad64(s, w, gy, 1e-6, grad, mag);
    for (int64_t j = 0; j < H; ++j) {
      const double h = 1e-6;
      std::vector<double> sp = s, sm = s;
      sp[size_t(j)] += h;
      sm[size_t(j)] -= h;
      const double fd = (loss64(sp, w, gy, 1e-6) - loss64(sm, w, gy, 1e-6)) / (2 * h);
      EXPECT_NEAR(fd, grad[size_t(j)], 1e-6 * (1 + mag[size_t(j)])) << "H=" << H << " j=" << j;
    }
  }
}

TEST(RmsNormBackward, AccuracyAgainstFp64Oracle) {
  auto g = test::rng(6);
  double worst_dx = 0, worst_dw = 0;
  for (int64_t H : {64, 136, 1000, 4096}) {
    const int64_t T = 40;
    Tensor s = test::random_bf16({T, H}, g, 3.0f), w = test::random_bf16({H}, g);
    Tensor gy = test::random_f32({T, H}, g), dx(DType::kF32, {T, H});
    std::vector<float> dw(static_cast<size_t>(H), 0.0f);
    TensorView dwv = TensorView::contiguous(dw.data(), DType::kF32, {H});
    const TokenOrder order = TokenOrder::make("t", {{0, 0, 7}, {1, 7, 33}}, T);
    cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &order, &dwv);
    // t as the forward computes it: rmsnorm with weight 1 writes round(t·1) = t.
    Tensor ones(DType::kBF16, {H}), t(DType::kBF16, {T, H});
    for (int64_t k = 0; k < H; ++k) ones.ptr<bf16>()[k] = f32_to_bf16(1.0f);
    cpu::rmsnorm(v(s), v(ones), kCfg, v(t));
    std::vector<double> ref_dw(size_t(H), 0.0), abs_dw(size_t(H), 0.0);
    for (int64_t row = 0; row < T; ++row) {
      std::vector<double> sr(static_cast<size_t>(H)), wr(static_cast<size_t>(H)),
          gr(static_cast<size_t>(H)), grad, mag;
      for (int64_t k = 0; k < H; ++k) {
        sr[size_t(k)] = f(s.ptr<bf16>()[row * H + k]);
        wr[size_t(k)] = f(w.ptr<bf16>()[k]);
        gr[size_t(k)] = gy.ptr<float>()[row * H + k];
        const double c = gr[size_t(k)] * f(t.ptr<bf16>()[row * H + k]);
        ref_dw[size_t(k)] += c;
        abs_dw[size_t(k)] += std::fabs(c);
      }
      grad64(sr, wr, gr, double(kCfg.eps), grad, mag);
      // The lane sums add up to H/32 + 5 terms in sequence; r, r³ and the final ops a few more.
      const double bound = (double(H) / 32 + 16) * std::ldexp(1.0, -24);
      for (int64_t k = 0; k < H; ++k) {
        const double err = std::fabs(double(dx.ptr<float>()[row * H + k]) - grad[size_t(k)]);
        ASSERT_LE(err, bound * mag[size_t(k)]) << "H=" << H << " row " << row << " k=" << k;
        worst_dx = std::max(worst_dx, err / (bound * mag[size_t(k)]));
      }
    }
    // dweight: 3 blocks chained after trees of 16: (3 + 4 + 1) roundings.
    for (int64_t k = 0; k < H; ++k) {
      const double bound = 8 * std::ldexp(1.0, -24) * abs_dw[size_t(k)];
      const double err = std::fabs(double(dw[size_t(k)]) - ref_dw[size_t(k)]);
      ASSERT_LE(err, bound) << "H=" << H << " k=" << k;
      worst_dw = std::max(worst_dw, err / bound);
    }
  }
  std::printf("[rmsnorm backward] worst error / bound: dx %.3g, dweight %.3g\n", worst_dx,
              worst_dw);
}

// ---- Special values --------------------------------------------------------------------------

TEST(RmsNormBackward, SpecialValues) {
  auto g = test::rng(7);
  const int64_t T = 4, H = 40;
  Tensor s = test::random_bf16({T, H}, g), w = test::random_bf16({H}, g);
  Tensor gy = test::random_f32({T, H}, g), dx = test::poisoned(DType::kF32, {T, H});
  s.ptr<bf16>()[0 * H + 3] = bf16{0xffc1};                  // row 0: a NaN in s
  s.ptr<bf16>()[1 * H + 9] = bf16{0x7f80};                  // row 1: +inf in s
  gy.ptr<float>()[2 * H + 1] = f32_from_bits(0xffc00001u);  // row 2: a NaN in gy
  std::vector<float> dw(static_cast<size_t>(H), 0.0f);
  TensorView dwv = TensorView::contiguous(dw.data(), DType::kF32, {H});
  const TokenOrder order = TokenOrder::make("t", {{0, 3, 1}, {1, 0, 1}}, T);  // rows 3 and 0
  cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &order, &dwv);
  // Rows 0, 1, 2: every dx element is the canonical NaN (the dot product is NaN; for row 1
  // r = +0 and dot·r³ = inf·0 = NaN). Row 3 is finite.
  for (int64_t row = 0; row < 3; ++row)
    for (int64_t k = 0; k < H; ++k)
      ASSERT_EQ(bits(dx.ptr<float>()[row * H + k]), kCanonNanF32) << row << " " << k;
  for (int64_t k = 0; k < H; ++k) EXPECT_TRUE(std::isfinite(dx.ptr<float>()[3 * H + k]));
  // dweight includes row 0, whose t is NaN everywhere: every element canonical NaN.
  for (int64_t k = 0; k < H; ++k) EXPECT_EQ(bits(dw[size_t(k)]), kCanonNanF32) << k;
  // Only row 3 (finite): finite.
  std::fill(dw.begin(), dw.end(), 0.0f);
  const TokenOrder only3 = TokenOrder::make("t", {{0, 3, 1}}, T);
  cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &only3, &dwv);
  for (int64_t k = 0; k < H; ++k) EXPECT_TRUE(std::isfinite(dw[size_t(k)])) << k;
  // A finite row whose squares overflow: r = +0, coef = +0, dx = ±0.
  Tensor big = test::random_bf16({1, H}, g, 1.0f), dbig = test::poisoned(DType::kF32, {1, H});
  for (int64_t k = 0; k < H; ++k)
    big.ptr<bf16>()[k] = f32_to_bf16(std::ldexp(f(big.ptr<bf16>()[k]), 70));
  cpu::rmsnorm_backward(v(big), v(w), kCfg, v(gy).rows(3, 4), v(dbig), nullptr, nullptr);
  for (int64_t k = 0; k < H; ++k) EXPECT_EQ(dbig.ptr<float>()[k], 0.0f) << k;
  // An all-zero row: r = 1/sqrt(eps), dot = 0, dx = gy·w·r exactly; eps = 0 gives r = inf:
  // gt·inf − 0·(0·inf) = NaN.
  Tensor z(DType::kBF16, {1, H}), dz(DType::kF32, {1, H});
  std::memset(z.data(), 0, size_t(z.nbytes()));
  cpu::rmsnorm_backward(v(z), v(w), kCfg, v(gy).rows(3, 4), v(dz), nullptr, nullptr);
  const float r = 1.0f / std::sqrt(0.0f / float(H) + kCfg.eps);
  for (int64_t k = 0; k < H; ++k)
    EXPECT_EQ(bits(dz.ptr<float>()[k]),
              bits((gy.ptr<float>()[3 * H + k] * f(w.ptr<bf16>()[k])) * r - 0.0f * 0.0f));
  cpu::rmsnorm_backward(v(z), v(w), RmsNormConfig{0.0f}, v(gy).rows(3, 4), v(dz), nullptr, nullptr);
  for (int64_t k = 0; k < H; ++k) EXPECT_EQ(bits(dz.ptr<float>()[k]), kCanonNanF32);
}

// ---- Errors ----------------------------------------------------------------------------------

TEST(RmsNormBackward, BadArgumentsThrowNamingTheArgument) {
  auto g = test::rng(8);
  const int64_t T = 4, H = 8;
  Tensor s = test::random_bf16({T, H}, g), w = test::random_bf16({H}, g);
  Tensor gy = test::random_f32({T, H}, g), dx(DType::kF32, {T, H}), dw(DType::kF32, {H});
  const TokenOrder order = TokenOrder::make("t", {{0, 0, T}}, T);
  const TokenOrder order5 = TokenOrder::make("t", {{0, 0, T}}, T + 1);
  TensorView dwv = v(dw);
  const char* op = "rmsnorm_backward";
  Tensor sf(DType::kF32, {T, H}), w7 = test::random_bf16({7}, g), gyb(DType::kBF16, {T, H});
  expect_error([&] { cpu::rmsnorm_backward(v(sf), v(w), kCfg, v(gy), v(dx), nullptr, nullptr); },
               {op, "'s'"});
  expect_error([&] { cpu::rmsnorm_backward(v(s), v(w7), kCfg, v(gy), v(dx), nullptr, nullptr); },
               {op, "'weight'"});
  expect_error([&] { cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gyb), v(dx), nullptr, nullptr); },
               {op, "'gy'"});
  Tensor dx3(DType::kF32, {T, H + 1});
  expect_error([&] { cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx3), nullptr, nullptr); },
               {op, "'dx'"});
  expect_error(
      [&] {
        cpu::rmsnorm_backward(v(s), v(w), RmsNormConfig{-1.0f}, v(gy), v(dx), nullptr, nullptr);
      },
      {"eps"});
  expect_error([&] { cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &order, nullptr); },
               {op, "'order'", "'dweight'"});
  expect_error([&] { cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &order5, &dwv); },
               {op, "'order'"});
  TensorView dw_bad = TensorView::contiguous(dx.data(), DType::kF32, {H});  // inside dx
  expect_error([&] { cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &order, &dw_bad); },
               {op, "'dweight'", "overlap"});
  Tensor dw9(DType::kF32, {H + 1});
  TensorView dw9v = v(dw9);
  expect_error([&] { cpu::rmsnorm_backward(v(s), v(w), kCfg, v(gy), v(dx), &order, &dw9v); },
               {op, "'dweight'"});
  TensorView shifted = v(gy).rows(1, T);  // dx overlapping gy but not the same view
  TensorView gy_head = v(gy).rows(0, T - 1);
  Tensor s3 = test::random_bf16({T - 1, H}, g);
  expect_error(
      [&] { cpu::rmsnorm_backward(v(s3), v(w), kCfg, gy_head, shifted, nullptr, nullptr); },
      {op, "'dx'", "gy"});
  Tensor gres(DType::kF32, {T, H + 2});
  expect_error(
      [&] {
        cpu::rmsnorm_residual_backward(v(s), v(w), kCfg, v(gy), v(gres), v(dx), nullptr, nullptr);
      },
      {"rmsnorm_residual_backward", "'gres'"});
  Tensor s1(DType::kBF16, {T});
  expect_error([&] { cpu::rmsnorm_backward(v(s1), v(w), kCfg, v(gy), v(dx), nullptr, nullptr); },
               {op, "'s'"});
  // T = 0 is valid and does nothing.
  Tensor s0(DType::kBF16, {0, H}), g0(DType::kF32, {0, H});
  const TokenOrder order0 = TokenOrder::make("t", {}, 0);
  std::vector<float> before(dw.ptr<float>(), dw.ptr<float>() + H);
  cpu::rmsnorm_backward(v(s0), v(w), kCfg, v(g0), v(g0), &order0, &dwv);
  EXPECT_BITWISE_EQ(dw.data(), before.data(), H, DType::kF32);
}

}  // namespace
}  // namespace lockstep
