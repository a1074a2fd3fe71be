// CPU attention backward (docs/contract.md §B.9): a literal transcription of §B.9 (bitwise, every
// head_dim / GQA ratio / length class, special values), a sequence's dq / dk / dv alone vs packed
// with 1 / 3 / 17 other sequences at other offsets with other contents, strided views, empty
// sequences and thread counts (bitwise), accuracy against an fp64 softmax-attention gradient (with
// a finite-difference check of that oracle), determinism, documented special-value results,
// poisoned outputs and bad arguments.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/math.h"
#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/backward.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::bitwise_equal;

// Hq / Hkv query / kv heads, D head_dim.
struct Dims {
  int64_t Hq, Hkv, D;
  int64_t G() const { return Hq / Hkv; }
};

// One sequence's forward inputs and upstream gradient at positions 0 .. len-1.
struct Seq {
  int64_t len = 0;
  Tensor q, k, v, dout;  // [len, Hq, D], [len, Hkv, D], [len, Hkv, D], [len, Hq, D]
};

Seq make_seq(const Dims& d, int64_t len, std::mt19937_64& g, float qscale = 1.0f) {
  Seq s;
  s.len = len;
  s.q = test::random_bf16({len, d.Hq, d.D}, g, qscale);
  s.k = test::random_bf16({len, d.Hkv, d.D}, g);
  s.v = test::random_bf16({len, d.Hkv, d.D}, g);
  s.dout = test::random_bf16({len, d.Hq, d.D}, g);
  return s;
}

// A [T, H, D] buffer seen through a view whose rows hold `extra` more heads (a strided, fused
// layout when extra > 0).
struct Buf {
  Tensor t;
  TensorView v;
};
Buf make_buf(DType dt, int64_t T, int64_t H, int64_t D, int64_t extra, uint8_t fill) {
  Buf b{Tensor(dt, {T, H + extra, D}), {}};
  std::memset(b.t.data(), fill, size_t(b.t.nbytes()));
  b.v = b.t.view();
  b.v.shape[1] = H;
  return b;
}

// A packed micro-batch: the sequences in the given order, the forward's out / lse on it, and the
// backward's outputs (poisoned with `fill` before the op).
struct Packed {
  Dims d;
  int64_t T = 0;
  std::vector<int32_t> cu{0};
  Buf q, k, v, dout, out, dq, dk, dv;
  Tensor lse, cut;
};

Packed pack(const std::vector<const Seq*>& seqs, const Dims& d, const AttentionConfig& cfg,
            int64_t extra = 0, uint8_t fill = 0xA5) {
  Packed p;
  p.d = d;
  for (const Seq* s : seqs) {
    p.T += s->len;
    p.cu.push_back(int32_t(p.T));
  }
  const int64_t T = p.T, D = d.D;
  p.q = make_buf(DType::kBF16, T, d.Hq, D, extra, 0x7F);
  p.k = make_buf(DType::kBF16, T, d.Hkv, D, extra, 0x7F);
  p.v = make_buf(DType::kBF16, T, d.Hkv, D, extra, 0x7F);
  p.dout = make_buf(DType::kBF16, T, d.Hq, D, extra, 0x7F);
  p.out = make_buf(DType::kBF16, T, d.Hq, D, extra, 0x7F);
  p.dq = make_buf(DType::kF32, T, d.Hq, D, extra, fill);
  p.dk = make_buf(DType::kF32, T, d.Hkv, D, extra, fill);
  p.dv = make_buf(DType::kF32, T, d.Hkv, D, extra, fill);
  p.lse = Tensor(DType::kF32, {T, d.Hq});
  int64_t t = 0;
  for (const Seq* s : seqs) {
    for (int64_t i = 0; i < s->len; ++i, ++t) {
      for (int64_t h = 0; h < d.Hq; ++h) {
        std::memcpy(p.q.v.ptr<bf16>() + t * p.q.v.stride[0] + h * D,
                    s->q.ptr<bf16>() + (i * d.Hq + h) * D, size_t(D) * 2);
        std::memcpy(p.dout.v.ptr<bf16>() + t * p.dout.v.stride[0] + h * D,
                    s->dout.ptr<bf16>() + (i * d.Hq + h) * D, size_t(D) * 2);
      }
      for (int64_t h = 0; h < d.Hkv; ++h) {
        std::memcpy(p.k.v.ptr<bf16>() + t * p.k.v.stride[0] + h * D,
                    s->k.ptr<bf16>() + (i * d.Hkv + h) * D, size_t(D) * 2);
        std::memcpy(p.v.v.ptr<bf16>() + t * p.v.v.stride[0] + h * D,
                    s->v.ptr<bf16>() + (i * d.Hkv + h) * D, size_t(D) * 2);
      }
    }
  }
  p.cut = Tensor(DType::kI32, {int64_t(p.cu.size())});
  std::memcpy(p.cut.data(), p.cu.data(), p.cu.size() * 4);
  const PackedSeqs ps = PackedSeqs::validate("test", p.cut.view(), T);
  cpu::attention_prefill_varlen(p.q.v, p.k.v, p.v.v, ps, cfg, p.out.v, p.lse.view());
  return p;
}

void backward(const Packed& p, const AttentionConfig& cfg) {
  const PackedSeqs ps = PackedSeqs::validate("test", p.cut.view(), p.T);
  cpu::attention_backward_varlen(p.q.v, p.k.v, p.v.v, p.out.v, p.lse.view(), p.dout.v, ps, cfg,
                                 p.dq.v, p.dk.v, p.dv.v);
}

// One sequence's gradients, contiguous: dq [len, Hq, D], dk / dv [len, Hkv, D].
struct Grads {
  std::vector<float> dq, dk, dv;
};

std::vector<float> rows_of(const TensorView& t, int64_t t0, int64_t len) {
  const int64_t H = t.shape[1], D = t.shape[2];
  std::vector<float> r(size_t(len * H * D));
  for (int64_t i = 0; i < len; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      std::memcpy(r.data() + (i * H + h) * D, t.ptr<float>() + (t0 + i) * t.stride[0] + h * D,
                  size_t(D) * 4);
    }
  }
  return r;
}

Grads grads_of(const Packed& p, int64_t seq) {
  const int64_t t0 = p.cu[size_t(seq)], len = p.cu[size_t(seq + 1)] - t0;
  return {rows_of(p.dq.v, t0, len), rows_of(p.dk.v, t0, len), rows_of(p.dv.v, t0, len)};
}

::testing::AssertionResult grads_equal(const Grads& a, const Grads& b) {
  if (auto r = bitwise_equal(a.dq, b.dq); !r) return r << " (dq)";
  if (auto r = bitwise_equal(a.dk, b.dk); !r) return r << " (dk)";
  if (auto r = bitwise_equal(a.dv, b.dv); !r) return r << " (dv)";
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// §B.9 written out literally: per element, one mma_kblock_bf16 per 16 products, from the text
// alone. Inputs: one sequence (rows 0 .. L-1 of contiguous [L, H, D] arrays) with the forward's
// out and lse.

float literal_delta(const bf16* dout, const bf16* out, int64_t D) {
  int64_t Dp = 1;
  while (Dp < D) Dp *= 2;
  std::vector<float> t(size_t(Dp), 0.0f);
  for (int64_t d = 0; d < D; ++d) t[size_t(d)] = bf16_to_f32(dout[d]) * bf16_to_f32(out[d]);
  for (int64_t w = Dp / 2; w >= 1; w /= 2) {
    for (int64_t j = 0; j < w; ++j) t[size_t(j)] = t[size_t(j)] + t[size_t(j + w)];
  }
  return t[0];
}

Grads literal_backward(const Dims& dm, int64_t L, const bf16* q, const bf16* k, const bf16* v,
                       const bf16* out, const float* lse, const bf16* dout,
                       const AttentionConfig& cfg) {
  const int64_t Hq = dm.Hq, Hkv = dm.Hkv, D = dm.D, G = dm.G();
  const double scale = cfg.softmax_scale != 0.0 ? cfg.softmax_scale : 1.0 / std::sqrt(double(D));
  const float sigma = float(scale * 1.4426950408889634074);
  const float scale_f = float(scale);
  const float log2e_f = 0x1.715476p+0f;
  auto Q = [&](int64_t i, int64_t h) { return q + (i * Hq + h) * D; };
  auto K = [&](int64_t j, int64_t g) { return k + (j * Hkv + g) * D; };
  auto V = [&](int64_t j, int64_t g) { return v + (j * Hkv + g) * D; };
  auto DO = [&](int64_t i, int64_t h) { return dout + (i * Hq + h) * D; };
  // Pb, dSb [Hq][L][L] (test only).
  std::vector<bf16> Pb(size_t(Hq * L * L), bf16{0}), dSb(size_t(Hq * L * L), bf16{0});
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / G;
    for (int64_t i = 0; i < L; ++i) {
      const float delta = literal_delta(DO(i, h), out + (i * Hq + h) * D, D);
      const float lambda = lse[i * Hq + h] * log2e_f;
      for (int64_t j = 0; j <= i; ++j) {
        const float x = mma_chain_bf16(Q(i, h), K(j, g), D, 0.0f) * sigma;
        const float P = ls_ex2_sfu(x - lambda);
        const float dP = mma_chain_bf16(DO(i, h), V(j, g), D, 0.0f);
        const float dS = P * (dP - delta);
        Pb[size_t((h * L + i) * L + j)] = f32_to_bf16(P);
        dSb[size_t((h * L + i) * L + j)] = f32_to_bf16(dS);
      }
    }
  }
  auto pb = [&](int64_t h, int64_t i, int64_t j) {
    return (i < L && j < L) ? Pb[size_t((h * L + i) * L + j)] : bf16{0};
  };
  auto dsb = [&](int64_t h, int64_t i, int64_t j) {
    return (i < L && j < L) ? dSb[size_t((h * L + i) * L + j)] : bf16{0};
  };
  Grads r;
  r.dq.resize(size_t(L * Hq * D));
  r.dk.resize(size_t(L * Hkv * D));
  r.dv.resize(size_t(L * Hkv * D));
  bf16 a[16], b[16];
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        float c = 0.0f;
        for (int64_t j0 = 0; j0 < 64 * (i / 64) + 64; j0 += 16) {
          for (int t = 0; t < 16; ++t) {
            const int64_t j = j0 + t;
            a[t] = dsb(h, i, j);                      // +0 for j > i
            b[t] = j < L ? K(j, h / G)[d] : bf16{0};  // +0 past the end
          }
          c = mma_kblock_bf16(a, b, c);
        }
        r.dq[size_t((i * Hq + h) * D + d)] = canonical_f32(c * scale_f);
      }
    }
  }
  const int64_t Lp = (L + 15) / 16 * 16;
  for (int64_t j = 0; j < L; ++j) {
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t d = 0; d < D; ++d) {
        float cv = 0.0f, ck = 0.0f;
        for (int64_t h = g * G; h < (g + 1) * G; ++h) {
          for (int64_t i0 = 64 * (j / 64); i0 < Lp; i0 += 16) {
            for (int t = 0; t < 16; ++t) {
              const int64_t i = i0 + t;
              a[t] = pb(h, i, j);
              b[t] = i < L ? DO(i, h)[d] : bf16{0};
            }
            cv = mma_kblock_bf16(a, b, cv);
            for (int t = 0; t < 16; ++t) {
              const int64_t i = i0 + t;
              a[t] = dsb(h, i, j);
              b[t] = i < L ? Q(i, h)[d] : bf16{0};
            }
            ck = mma_kblock_bf16(a, b, ck);
          }
        }
        r.dv[size_t((j * Hkv + g) * D + d)] = canonical_f32(cv);
        r.dk[size_t((j * Hkv + g) * D + d)] = canonical_f32(ck * scale_f);
      }
    }
  }
  return r;
}

// The literal transcription for sequence `seq` of a packed batch (with its forward's out / lse).
Grads literal_of(const Packed& p, int64_t seq, const Seq& s, const AttentionConfig& cfg) {
  const Dims& d = p.d;
  const int64_t t0 = p.cu[size_t(seq)], L = s.len;
  std::vector<bf16> out(size_t(L * d.Hq * d.D));
  std::vector<float> lse(size_t(L * d.Hq));
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      std::memcpy(out.data() + (i * d.Hq + h) * d.D,
                  p.out.v.ptr<bf16>() + (t0 + i) * p.out.v.stride[0] + h * d.D, size_t(d.D) * 2);
      lse[size_t(i * d.Hq + h)] = p.lse.ptr<float>()[(t0 + i) * d.Hq + h];
    }
  }
  return literal_backward(d, L, s.q.ptr<bf16>(), s.k.ptr<bf16>(), s.v.ptr<bf16>(), out.data(),
                          lse.data(), s.dout.ptr<bf16>(), cfg);
}

struct LiteralCase {
  Dims d;
  std::vector<int64_t> lens;
  double softmax_scale;
};

TEST(AttentionBackward, LiteralTranscription) {
  const std::vector<LiteralCase> cases = {
      {{1, 1, 16}, {1, 15, 16, 17, 63, 64, 65, 130}, 0.0},
      {{4, 2, 32}, {1, 15, 16, 17, 63, 64, 65, 130}, 0.0},
      {{4, 1, 64}, {1, 17, 64, 65, 130}, 0.0},
      {{2, 1, 128}, {16, 63, 130}, 0.3},
      {{2, 2, 48}, {17, 70}, 0.0},  // D not a power of two: δ's tree pads to 64
  };
  auto g = test::rng(1);
  for (const LiteralCase& c : cases) {
    AttentionConfig cfg;
    cfg.kv_chunk = 64;
    cfg.softmax_scale = c.softmax_scale;
    std::vector<Seq> seqs;
    for (int64_t len : c.lens) seqs.push_back(make_seq(c.d, len, g, 2.0f));
    std::vector<const Seq*> ptrs;
    for (const Seq& s : seqs) ptrs.push_back(&s);
    const Packed p = pack(ptrs, c.d, cfg);
    backward(p, cfg);
    for (size_t b = 0; b < seqs.size(); ++b) {
      EXPECT_TRUE(grads_equal(grads_of(p, int64_t(b)), literal_of(p, int64_t(b), seqs[b], cfg)))
          << "Hq " << c.d.Hq << " Hkv " << c.d.Hkv << " D " << c.d.D << " len " << seqs[b].len;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Invariance: a sequence's gradients alone vs packed with others.

TEST(AttentionBackward, SequenceAloneEqualsPacked) {
  const Dims d{4, 2, 32};
  AttentionConfig cfg;
  auto g = test::rng(2);
  for (int64_t len : {1, 17, 64, 130}) {
    const Seq target = make_seq(d, len, g);
    Packed alone = pack({&target}, d, cfg);
    backward(alone, cfg);
    const Grads ref = grads_of(alone, 0);
    for (int others : {1, 3, 17}) {
      std::uniform_int_distribution<int64_t> ol(0, 40);
      std::vector<Seq> other;
      for (int o = 0; o < others; ++o) other.push_back(make_seq(d, ol(g), g));
      // The target at a varying place among them, padding-like empty sequences around it.
      std::vector<const Seq*> ptrs;
      const Seq empty = make_seq(d, 0, g);
      const int at = int(g() % uint64_t(others + 1));
      for (int o = 0; o <= others; ++o) {
        if (o == at) {
          ptrs.push_back(&empty);
          ptrs.push_back(&target);
          ptrs.push_back(&empty);
        }
        if (o < others) ptrs.push_back(&other[size_t(o)]);
      }
      const int64_t idx =
          std::find(ptrs.begin(), ptrs.end(), &target) - ptrs.begin();  // index of the target
      Packed p = pack(ptrs, d, cfg, others == 3 ? 1 : 0, 0x5A);         // strided views once
      backward(p, cfg);
      EXPECT_TRUE(grads_equal(grads_of(p, idx), ref)) << "len " << len << " others " << others;
    }
  }
}

TEST(AttentionBackward, ThreadsAndDeterminism) {
  const Dims d{8, 4, 32};
  AttentionConfig cfg;
  auto g = test::rng(3);
  std::vector<Seq> seqs;
  for (int64_t len : {200, 5, 0, 77, 130, 1, 64}) seqs.push_back(make_seq(d, len, g));
  std::vector<const Seq*> ptrs;
  for (const Seq& s : seqs) ptrs.push_back(&s);
  const int saved = num_threads();
  std::vector<Grads> runs;
  for (int threads : {1, 3, 3}) {
    set_num_threads(threads);
    Packed p = pack(ptrs, d, cfg, 0, runs.size() % 2 ? 0x5A : 0xA5);
    backward(p, cfg);
    runs.push_back(
        Grads{rows_of(p.dq.v, 0, p.T), rows_of(p.dk.v, 0, p.T), rows_of(p.dv.v, 0, p.T)});
  }
  set_num_threads(saved);
  EXPECT_TRUE(grads_equal(runs[0], runs[1])) << "threads 1 vs 3";
  EXPECT_TRUE(grads_equal(runs[1], runs[2])) << "rerun (other poison)";
}

TEST(AttentionBackward, EmptyBatchAndEmptySequences) {
  const Dims d{2, 1, 16};
  AttentionConfig cfg;
  auto g = test::rng(4);
  const Seq empty = make_seq(d, 0, g);
  Packed none = pack({}, d, cfg);
  backward(none, cfg);  // T = 0: a no-op
  Packed only_empty = pack({&empty, &empty}, d, cfg);
  backward(only_empty, cfg);
  EXPECT_EQ(only_empty.T, 0);
}

// ---------------------------------------------------------------------------------------------
// Accuracy: the fp64 gradient of softmax attention on the same bf16 inputs.

struct GradsD {
  std::vector<double> dq, dk, dv;
};

// Causal GQA attention of one sequence in double ([L, H, D] arrays), its loss Σ dout·O and the
// analytic gradient: P = softmax(scale·q·k), dP = dout·v, δ = Σ_d dout·O, dS = P·(dP − δ),
// dq = scale·Σ_j dS·k, dk = scale·Σ_i dS·q, dv = Σ_i P·dout.
double oracle(const Dims& dm, int64_t L, const double* q, const double* k, const double* v,
              const double* dout, double scale, GradsD* gr) {
  const int64_t Hq = dm.Hq, Hkv = dm.Hkv, D = dm.D, G = dm.G();
  if (gr != nullptr) {
    gr->dq.assign(size_t(L * Hq * D), 0.0);
    gr->dk.assign(size_t(L * Hkv * D), 0.0);
    gr->dv.assign(size_t(L * Hkv * D), 0.0);
  }
  double loss = 0;
  std::vector<double> s(static_cast<size_t>(L)), o(static_cast<size_t>(D));
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / G;
    for (int64_t i = 0; i < L; ++i) {
      const double* qi = q + (i * Hq + h) * D;
      const double* di = dout + (i * Hq + h) * D;
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double acc = 0;
        for (int64_t e = 0; e < D; ++e) acc += qi[e] * k[(j * Hkv + g) * D + e];
        s[size_t(j)] = scale * acc;
        m = std::max(m, s[size_t(j)]);
      }
      double l = 0;
      for (int64_t j = 0; j <= i; ++j) l += std::exp(s[size_t(j)] - m);
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(s[size_t(j)] - m) / l;
        for (int64_t e = 0; e < D; ++e) o[size_t(e)] += p * v[(j * Hkv + g) * D + e];
      }
      double delta = 0;
      for (int64_t e = 0; e < D; ++e) delta += di[e] * o[size_t(e)];
      loss += delta;
      if (gr == nullptr) continue;
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(s[size_t(j)] - m) / l;
        double dp = 0;
        for (int64_t e = 0; e < D; ++e) dp += di[e] * v[(j * Hkv + g) * D + e];
        const double ds = p * (dp - delta);
        for (int64_t e = 0; e < D; ++e) {
          gr->dq[size_t((i * Hq + h) * D + e)] += scale * ds * k[(j * Hkv + g) * D + e];
          gr->dk[size_t((j * Hkv + g) * D + e)] += scale * ds * qi[e];
          gr->dv[size_t((j * Hkv + g) * D + e)] += p * di[e];
        }
      }
    }
  }
  return loss;
}

std::vector<double> to_double(const Tensor& t) {
  std::vector<double> r(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) r[size_t(i)] = bf16_to_f32(t.ptr<bf16>()[i]);
  return r;
}

TEST(AttentionBackward, OracleMatchesFiniteDifferences) {
  const Dims d{2, 1, 16};
  const int64_t L = 5;
  auto g = test::rng(5);
  const Seq s = make_seq(d, L, g);
  std::vector<double> q = to_double(s.q), k = to_double(s.k), v = to_double(s.v),
                      dout = to_double(s.dout);
  const double scale = 0.25;
  GradsD an;
  oracle(d, L, q.data(), k.data(), v.data(), dout.data(), scale, &an);
  const double eps = 1e-5;
  double worst = 0;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double lp = oracle(d, L, q.data(), k.data(), v.data(), dout.data(), scale, nullptr);
      x[i] = x0 - eps;
      const double lm = oracle(d, L, q.data(), k.data(), v.data(), dout.data(), scale, nullptr);
      x[i] = x0;
      const double fd = (lp - lm) / (2 * eps);
      worst = std::max(worst, std::abs(fd - grad[i]) / (1 + std::abs(grad[i])));
    }
  };
  check(q, an.dq);
  check(k, an.dk);
  check(v, an.dv);
  std::printf("[oracle] worst |fd - analytic| / (1 + |analytic|): %.3g\n", worst);
  EXPECT_LT(worst, 1e-8);
}

// Stated tolerance (q, k, v, dout ~ N(0, 1), q up to 3× larger, D 32 … 128, 70 … 200 keys, GQA
// 1 … 2), per tensor (dq, dk, dv of one case): max |grad − ref| ≤ 2^-6 · max |ref|. Measured
// worst over 12 seeds: 3.8e-3 … 5.5e-3 (the bf16 roundings of P, dS and of the forward's out,
// which δ reads).
TEST(AttentionBackward, AccuracyVsFp64) {
  struct Case {
    Dims d;
    int64_t len;
    float qscale;
  };
  const std::vector<Case> cases = {{{4, 2, 32}, 200, 1.0f},
                                   {{2, 1, 64}, 130, 3.0f},
                                   {{2, 2, 128}, 70, 1.0f},
                                   {{8, 4, 32}, 150, 2.0f}};
  auto g = test::rng(6);
  AttentionConfig cfg;
  const char* names[3] = {"dq", "dk", "dv"};
  double worst = 0;
  for (const Case& c : cases) {
    const Seq s = make_seq(c.d, c.len, g, c.qscale);
    Packed p = pack({&s}, c.d, cfg);
    backward(p, cfg);
    const Grads got = grads_of(p, 0);
    GradsD ref;
    oracle(c.d, c.len, to_double(s.q).data(), to_double(s.k).data(), to_double(s.v).data(),
           to_double(s.dout).data(), 1.0 / std::sqrt(double(c.d.D)), &ref);
    const std::vector<float>* gv[3] = {&got.dq, &got.dk, &got.dv};
    const std::vector<double>* rv[3] = {&ref.dq, &ref.dk, &ref.dv};
    for (int t = 0; t < 3; ++t) {
      double err = 0, mag = 0;
      for (size_t i = 0; i < rv[t]->size(); ++i) {
        err = std::max(err, std::abs(double((*gv[t])[i]) - (*rv[t])[i]));
        mag = std::max(mag, std::abs((*rv[t])[i]));
      }
      EXPECT_LE(err, 0x1p-6 * mag) << names[t] << " D " << c.d.D << " len " << c.len;
      worst = std::max(worst, err / mag);
    }
  }
  std::printf("[accuracy] worst max|grad - ref| / max|ref|: %.3g (tolerance %.3g)\n", worst,
              0x1p-6);
}

// ---------------------------------------------------------------------------------------------
// Special values.

bool all_nan_canonical(const std::vector<float>& x) {
  for (float f : x) {
    if (f != f && f32_bits(f) != kCanonicalNanF32) return false;
  }
  return true;
}

// Specials sprinkled into q, k, v and dout: the op equals the literal transcription bit for bit
// and stores only the canonical NaN.
TEST(AttentionBackward, SpecialValuesFollowTheText) {
  const Dims d{2, 1, 32};
  AttentionConfig cfg;
  auto g = test::rng(7);
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8003, 0x007F, 0x7F80,
                               0xFF80, 0x7FC0, 0xFFC1, 0x7F7F, 0x0080, 0x3F80};
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<Seq> seqs;
    for (int64_t len : {17, 80}) seqs.push_back(make_seq(d, len, g));
    for (Seq& s : seqs) {
      for (Tensor* t : {&s.q, &s.k, &s.v, &s.dout}) {
        bf16* x = t->ptr<bf16>();
        const int n = trial == 0 ? 1 : 3;  // trial 0: one special per tensor
        for (int c = 0; c < n; ++c) x[g() % uint64_t(t->numel())].bits = specials[g() % 12];
        // Subnormals and signed zeros in bulk.
        for (int c = 0; c < 8; ++c) x[g() % uint64_t(t->numel())].bits = specials[g() % 5];
      }
    }
    const Packed p = pack({&seqs[0], &seqs[1]}, d, cfg);
    backward(p, cfg);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const Grads got = grads_of(p, int64_t(b));
      EXPECT_TRUE(grads_equal(got, literal_of(p, int64_t(b), seqs[b], cfg)))
          << "trial " << trial << " seq " << b;
      EXPECT_TRUE(all_nan_canonical(got.dq) && all_nan_canonical(got.dk) &&
                  all_nan_canonical(got.dv));
    }
  }
}

// dout = ±0 everywhere: every gradient is +0 (dP = +0, δ = ±0, dS = P ⊗ 0, chains of zeros).
TEST(AttentionBackward, ZeroUpstreamGivesPlusZero) {
  const Dims d{4, 2, 16};
  AttentionConfig cfg;
  auto g = test::rng(8);
  Seq s = make_seq(d, 70, g);
  for (int64_t i = 0; i < s.dout.numel(); ++i) s.dout.ptr<bf16>()[i].bits = (i % 3) ? 0 : 0x8000;
  const Packed p = pack({&s}, d, cfg);
  backward(p, cfg);
  const Grads got = grads_of(p, 0);
  for (const std::vector<float>* x : {&got.dq, &got.dk, &got.dv}) {
    for (float f : *x) ASSERT_EQ(f32_bits(f), 0u);
  }
}

// NaN in v_j: dv stays finite everywhere (it reads P and dout only); dq is NaN exactly for the
// rows i ≥ j (their dP_ij and, through out, δ_i); all NaN canonical.
TEST(AttentionBackward, NanInValue) {
  const Dims d{2, 1, 32};
  AttentionConfig cfg;
  auto g = test::rng(9);
  const int64_t L = 100, j = 70;
  Seq s = make_seq(d, L, g);
  s.v.ptr<bf16>()[j * d.D + 5].bits = 0x7FC1;
  const Packed p = pack({&s}, d, cfg);
  backward(p, cfg);
  const Grads got = grads_of(p, 0);
  for (float f : got.dv) ASSERT_TRUE(std::isfinite(f));
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t e = 0; e < d.Hq * d.D; ++e) {
      const float f = got.dq[size_t(i * d.Hq * d.D + e)];
      ASSERT_EQ(std::isnan(f), i >= j) << "row " << i;
    }
  }
  EXPECT_TRUE(all_nan_canonical(got.dq) && all_nan_canonical(got.dk));
}

// inf in dout of row 65: the dv chains of the keys j of the 64-block [64, 128) start at row 64,
// so keys 66 … 79 (masked for row 65: Pb = +0) get +0 · inf = NaN in column 0, keys ≤ 65 get
// inf; the other columns stay finite (the 64-key extent of §B.9, as a 64-tiled kernel does).
TEST(AttentionBackward, InfInUpstreamFollowsBlockExtent) {
  const Dims d{1, 1, 16};
  AttentionConfig cfg;
  auto g = test::rng(10);
  const int64_t L = 80;
  Seq s = make_seq(d, L, g);
  s.dout.ptr<bf16>()[65 * d.D + 0].bits = 0x7F80;
  const Packed p = pack({&s}, d, cfg);
  backward(p, cfg);
  const Grads got = grads_of(p, 0);
  for (int64_t j = 0; j < L; ++j) {
    const float c0 = got.dv[size_t(j * d.D)];
    if (j <= 65) {
      EXPECT_TRUE(std::isinf(c0) && c0 > 0) << "key " << j << ": " << c0;
    } else {
      EXPECT_EQ(f32_bits(c0), kCanonicalNanF32) << "key " << j;
    }
    for (int64_t e = 1; e < d.D; ++e) ASSERT_TRUE(std::isfinite(got.dv[size_t(j * d.D + e)]));
  }
}

// inf in column 3 of k_70: the dq chains of the rows 64 … 69 run over the keys of their 64-block,
// where key 70 is masked (dSb = +0) but keeps its real k: +0 · inf = NaN in column 3 only. Rows
// 0 … 63 never reach key 70 and stay finite.
TEST(AttentionBackward, InfInMaskedKeyFollowsBlockExtent) {
  const Dims d{1, 1, 16};
  AttentionConfig cfg;
  auto g = test::rng(13);
  const int64_t L = 100;
  Seq s = make_seq(d, L, g);
  s.k.ptr<bf16>()[70 * d.D + 3].bits = 0x7F80;
  const Packed p = pack({&s}, d, cfg);
  backward(p, cfg);
  const Grads got = grads_of(p, 0);
  for (int64_t i = 0; i < 70; ++i) {
    for (int64_t e = 0; e < d.D; ++e) {
      const float f = got.dq[size_t(i * d.D + e)];
      if (i >= 64 && e == 3) {
        EXPECT_EQ(f32_bits(f), kCanonicalNanF32) << "row " << i;
      } else {
        ASSERT_TRUE(std::isfinite(f)) << "row " << i << " column " << e;
      }
    }
  }
}

// Every output element is written: two runs over outputs poisoned differently agree.
TEST(AttentionBackward, PoisonedOutputsAreOverwritten) {
  const Dims d{4, 4, 16};
  AttentionConfig cfg;
  auto g = test::rng(11);
  std::vector<Seq> seqs;
  for (int64_t len : {3, 0, 66, 16}) seqs.push_back(make_seq(d, len, g));
  std::vector<const Seq*> ptrs;
  for (const Seq& s : seqs) ptrs.push_back(&s);
  Packed a = pack(ptrs, d, cfg, 0, 0xA5), b = pack(ptrs, d, cfg, 0, 0x5A);
  backward(a, cfg);
  backward(b, cfg);
  EXPECT_TRUE(
      grads_equal({rows_of(a.dq.v, 0, a.T), rows_of(a.dk.v, 0, a.T), rows_of(a.dv.v, 0, a.T)},
                  {rows_of(b.dq.v, 0, b.T), rows_of(b.dk.v, 0, b.T), rows_of(b.dv.v, 0, b.T)}));
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: lockstep::Error naming the op and the argument, nothing written.

const auto expect_error = test::expect_error_mentioning;

TEST(AttentionBackward, BadArguments) {
  const Dims d{4, 2, 16};
  AttentionConfig cfg;
  auto g = test::rng(12);
  const Seq s1 = make_seq(d, 5, g), s2 = make_seq(d, 3, g);
  const Packed p = pack({&s1, &s2}, d, cfg);
  const PackedSeqs ps = PackedSeqs::validate("test", p.cut.view(), p.T);
  const int64_t T = p.T;
  Tensor f32q(DType::kF32, {T, d.Hq, d.D}), bf_q(DType::kBF16, {T, d.Hq, d.D}),
      bf_kv(DType::kBF16, {T, d.Hkv, d.D}), f32kv(DType::kF32, {T, d.Hkv, d.D}),
      d24(DType::kBF16, {T, d.Hq, 24}), k3(DType::kBF16, {T, 3, d.D}),
      short_k(DType::kBF16, {T - 1, d.Hkv, d.D}), lse_bf(DType::kBF16, {T, d.Hq}),
      lse_short(DType::kF32, {T, d.Hkv}), big(DType::kF32, {2, T, d.Hq, d.D});
  struct Args {
    TensorView q, k, v, out, lse, dout, dq, dk, dv;
    AttentionConfig cfg;
  };
  const Args ok{p.q.v, p.k.v, p.v.v, p.out.v, p.lse.view(), p.dout.v, p.dq.v, p.dk.v, p.dv.v, cfg};
  auto run = [&](Args a) {
    return [a, &ps] {
      cpu::attention_backward_varlen(a.q, a.k, a.v, a.out, a.lse, a.dout, ps, a.cfg, a.dq, a.dk,
                                     a.dv);
    };
  };
  auto with = [&](std::function<void(Args&)> edit) {
    Args a = ok;
    edit(a);
    return run(a);
  };
  TensorView strided_dout = bf_q.view();
  strided_dout.shape[2] = d.D / 2;
  strided_dout.stride[2] = 2;
  TensorView strided_dq = f32q.view();
  strided_dq.shape[2] = d.D / 2;
  strided_dq.stride[2] = 2;
  TensorView dq_in_big = big.view();  // dq and dk inside one buffer, overlapping
  dq_in_big.ndim = 3;
  for (int i = 0; i < 3; ++i) {
    dq_in_big.shape[i] = big.view().shape[i + 1];
    dq_in_big.stride[i] = big.view().stride[i + 1];
  }
  TensorView dk_in_big = dq_in_big;
  dk_in_big.shape[1] = d.Hkv;
  TensorView dv_over_q = p.q.v;  // f32 view of q's memory (shape fits inside the buffer)
  dv_over_q.dtype = DType::kF32;
  dv_over_q.shape[1] = d.Hkv;
  dv_over_q.stride[0] = p.q.v.stride[0] / 2;

  expect_error(with([&](Args& a) { a.q = f32q.view(); }), "argument 'q'");
  expect_error(with([&](Args& a) { a.q = d24.view(); }), "head_dim");
  expect_error(with([&](Args& a) { a.k = short_k.view(); }), "argument 'k'");
  expect_error(with([&](Args& a) { a.k = k3.view(); }), "kv heads");
  expect_error(with([&](Args& a) { a.v = f32kv.view(); }), "argument 'v'");
  expect_error(with([&](Args& a) { a.out = d24.view(); }), "argument 'out'");
  expect_error(with([&](Args& a) { a.lse = TensorView{}; }), "argument 'lse' is required");
  expect_error(with([&](Args& a) { a.lse = lse_bf.view(); }), "argument 'lse'");
  expect_error(with([&](Args& a) { a.lse = lse_short.view(); }), "argument 'lse'");
  expect_error(with([&](Args& a) { a.dout = f32q.view(); }), "argument 'dout'");
  expect_error(with([&](Args& a) { a.dout = bf_kv.view(); }), "argument 'dout'");
  expect_error(with([&](Args& a) { a.dout = strided_dout; }), "argument 'dout'");
  expect_error(with([&](Args& a) { a.dq = bf_q.view(); }), "argument 'dq'");
  expect_error(with([&](Args& a) { a.dq = f32kv.view(); }), "argument 'dq'");
  expect_error(with([&](Args& a) { a.dq = strided_dq; }), "argument 'dq'");
  expect_error(with([&](Args& a) { a.dk = f32q.view(); }), "argument 'dk'");
  expect_error(with([&](Args& a) { a.dv = bf_kv.view(); }), "argument 'dv'");
  expect_error(with([&](Args& a) {
                 a.dq = dq_in_big;
                 a.dk = dk_in_big;
               }),
               "argument 'dq' overlaps 'dk'");
  expect_error(with([&](Args& a) { a.dv = dv_over_q; }), "argument 'dv' overlaps 'q'");
  expect_error(with([&](Args& a) { a.cfg.kv_chunk = 100; }), "kv_chunk");
  expect_error(with([&](Args& a) { a.cfg.softmax_scale = -1.0; }), "softmax_scale");
  {
    // q with more tokens than the packed sequences.
    const Tensor cut = [] {
      Tensor t(DType::kI32, {2});
      t.ptr<int32_t>()[0] = 0;
      t.ptr<int32_t>()[1] = 7;
      return t;
    }();
    const PackedSeqs seven = PackedSeqs::validate("test", cut.view(), 7);
    expect_error(
        [&] {
          cpu::attention_backward_varlen(p.q.v, p.k.v, p.v.v, p.out.v, p.lse.view(), p.dout.v,
                                         seven, cfg, p.dq.v, p.dk.v, p.dv.v);
        },
        "cu_seqlens");
  }
  expect_error(with([&](Args& a) { a.dq = f32kv.view(); }), "attention_backward_varlen");
  // Nothing was written by the failed calls: the outputs still hold their poison.
  const std::vector<float> dq = rows_of(p.dq.v, 0, T);
  uint32_t poison;
  std::memset(&poison, 0xA5, 4);
  for (float f : dq) ASSERT_EQ(f32_bits(f), poison);
}

}  // namespace
}  // namespace lockstep
