// CPU attention (docs/contract.md §A): an independent from-the-text implementation of the
// canonical order (bitwise); invariance of packed prefill, paged decode, chunked prefill, split-KV
// and cascade across batches, page sizes, chunk sizes and split counts (bitwise); accuracy vs an
// fp64 oracle; NaN garbage in the cache; bad inputs. Thread counts, determinism and poison (and
// every mode == packed prefill again): the op-case table's attention cases (tests/ops,
// tests/cpu/test_op_cases.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "core/math.h"
#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "lockstep/ops/attention.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

using test::bitwise_equal;

struct Dims {
  int64_t Hq, Hkv, D;
};

// One sequence's q/k/v at positions 0 .. len-1.
struct Seq {
  int64_t len = 0;
  Tensor q, k, v;  // [len, Hq, D], [len, Hkv, D], [len, Hkv, D]
};

Seq make_seq(const Dims& d, int64_t len, std::mt19937_64& g, float qscale = 1.0f) {
  Seq s;
  s.len = len;
  s.q = test::random_bf16({len, d.Hq, d.D}, g, qscale);
  s.k = test::random_bf16({len, d.Hkv, d.D}, g);
  s.v = test::random_bf16({len, d.Hkv, d.D}, g);
  return s;
}

struct Result {
  Tensor out, lse;  // [N, Hq, D] bf16, [N, Hq] f32
};

// Outputs poisoned with a pattern that changes from one allocation to the next, so an element
// that an op fails to write differs between any two results that are compared.
Result alloc_result(int64_t N, const Dims& d, int poison = -1) {
  static int counter = 0;
  if (poison < 0) poison = (++counter % 2) ? 0xA5 : 0x5A;
  Result r{Tensor(DType::kBF16, {N, d.Hq, d.D}), Tensor(DType::kF32, {N, d.Hq})};
  std::memset(r.out.data(), poison, size_t(r.out.nbytes()));
  std::memset(r.lse.data(), poison, size_t(r.lse.nbytes()));
  return r;
}

// Rows [a0, a0+n) of a equal rows [b0, b0+n) of b, out and lse, bit for bit.
::testing::AssertionResult rows_equal(const Result& a, int64_t a0, const Result& b, int64_t b0,
                                      int64_t n, const Dims& d) {
  const int64_t ro = d.Hq * d.D;
  auto o =
      bitwise_equal(a.out.ptr<bf16>() + a0 * ro, b.out.ptr<bf16>() + b0 * ro, n * ro, DType::kBF16);
  if (!o) return o << " (out, rows " << a0 << " / " << b0 << " + " << n << ")";
  auto l = bitwise_equal(a.lse.ptr<float>() + a0 * d.Hq, b.lse.ptr<float>() + b0 * d.Hq, n * d.Hq,
                         DType::kF32);
  if (!l) return l << " (lse, rows " << a0 << " / " << b0 << " + " << n << ")";
  return ::testing::AssertionSuccess();
}

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t(DType::kI32, {int64_t(v.size())});
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}

// Packed varlen prefill of the sequences, in the given order.
Result prefill(const std::vector<const Seq*>& seqs, const Dims& d, const AttentionConfig& cfg,
               int poison = -1) {
  int64_t T = 0;
  std::vector<int32_t> cu{0};
  for (const Seq* s : seqs) {
    T += s->len;
    cu.push_back(int32_t(T));
  }
  Tensor q(DType::kBF16, {T, d.Hq, d.D}), k(DType::kBF16, {T, d.Hkv, d.D}),
      v(DType::kBF16, {T, d.Hkv, d.D});
  int64_t t = 0;
  for (const Seq* s : seqs) {
    std::memcpy(q.ptr<bf16>() + t * d.Hq * d.D, s->q.data(), size_t(s->q.nbytes()));
    std::memcpy(k.ptr<bf16>() + t * d.Hkv * d.D, s->k.data(), size_t(s->k.nbytes()));
    std::memcpy(v.ptr<bf16>() + t * d.Hkv * d.D, s->v.data(), size_t(s->v.nbytes()));
    t += s->len;
  }
  Result r = alloc_result(T, d, poison);
  Tensor cut = i32_tensor(cu);
  cpu::attention_prefill_varlen(q.view(), k.view(), v.view(), cut.view(), cfg, r.out.view(),
                                r.lse.view());
  return r;
}

Result prefill_one(const Seq& s, const Dims& d, const AttentionConfig& cfg) {
  return prefill({&s}, d, cfg);
}

// A paged cache: every slot starts as NaN garbage; pages of each sequence in a shuffled order;
// block-table entries past a sequence's pages hold junk (never read).
struct Cache {
  int64_t P = 0, NP = 0, MP = 0;
  Tensor k, v;   // [NP, P, Hkv, D]
  Tensor table;  // [S, MP] i32
  Tensor lens;   // [S] i32
  PagedKv view() const { return PagedKv{k.view(), v.view(), table.view(), lens.view()}; }
  int32_t* tab(int64_t s) const { return table.ptr<int32_t>() + s * MP; }
};

void fill_nan(Tensor& t) {
  bf16* p = t.ptr<bf16>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16{uint16_t(i % 3 ? 0x7fc1 : 0xffff)};
}

Cache make_cache(const Dims& d, const std::vector<int64_t>& caps, int64_t P, std::mt19937_64& g,
                 int64_t extra_pages = 3) {
  Cache c;
  c.P = P;
  int64_t need = 0;
  for (int64_t cap : caps) {
    c.MP = std::max(c.MP, (cap + P - 1) / P);
    need += (cap + P - 1) / P;
  }
  c.MP += 1;  // one spare column of junk
  c.NP = need + extra_pages;
  c.k = Tensor(DType::kBF16, {c.NP, P, d.Hkv, d.D});
  c.v = Tensor(DType::kBF16, {c.NP, P, d.Hkv, d.D});
  fill_nan(c.k);
  fill_nan(c.v);
  std::vector<int32_t> pages(size_t(c.NP));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), g);
  const int64_t S = int64_t(caps.size());
  c.table = Tensor(DType::kI32, {S, c.MP});
  c.lens = Tensor(DType::kI32, {S});
  int64_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t np = (caps[size_t(s)] + P - 1) / P;
    for (int64_t i = 0; i < c.MP; ++i)
      c.tab(s)[i] = i < np ? pages[size_t(next++)] : 1000000 + int32_t(i);
    c.lens.ptr<int32_t>()[s] = 0;
  }
  return c;
}

// Writes positions [from, to) of seq into sequence s of the cache (through kv_cache_write) and
// sets its length to `to`.
void write_tokens(Cache& c, int64_t s, const Seq& seq, int64_t from, int64_t to) {
  Tensor slots(DType::kI64, {to - from});
  for (int64_t p = from; p < to; ++p) {
    slots.ptr<int64_t>()[p - from] = int64_t(c.tab(s)[p / c.P]) * c.P + p % c.P;
  }
  cpu::kv_cache_write(seq.k.view().rows(from, to), seq.v.view().rows(from, to), slots.view(),
                      c.k.view(), c.v.view());
  c.lens.ptr<int32_t>()[s] = int32_t(to);
}

// A query row: sequence s of the cache at position pos, with q taken from seq.
struct QRow {
  int64_t s;
  const Seq* seq;
  int64_t pos;
};

struct QBatch {
  Tensor q, q_seq, q_pos;
};

QBatch make_queries(const std::vector<QRow>& rows, const Dims& d) {
  const int64_t N = int64_t(rows.size());
  QBatch b{Tensor(DType::kBF16, {N, d.Hq, d.D}), Tensor(DType::kI32, {N}),
           Tensor(DType::kI32, {N})};
  for (int64_t r = 0; r < N; ++r) {
    const QRow& qr = rows[size_t(r)];
    std::memcpy(b.q.ptr<bf16>() + r * d.Hq * d.D, qr.seq->q.ptr<bf16>() + qr.pos * d.Hq * d.D,
                size_t(d.Hq * d.D) * 2);
    b.q_seq.ptr<int32_t>()[r] = int32_t(qr.s);
    b.q_pos.ptr<int32_t>()[r] = int32_t(qr.pos);
  }
  return b;
}

Result paged(const Cache& c, const std::vector<QRow>& rows, const Dims& d,
             const AttentionConfig& cfg, int splits = 0, int poison = -1) {
  QBatch b = make_queries(rows, d);
  Result r = alloc_result(int64_t(rows.size()), d, poison);
  if (splits == 0) {
    cpu::attention_paged(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg, r.out.view(),
                         r.lse.view());
  } else {
    cpu::attention_paged_split_kv(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg, splits,
                                  r.out.view(), r.lse.view());
  }
  return r;
}

AttentionConfig cfg_chunk(int kv_chunk) {
  AttentionConfig c;
  c.kv_chunk = kv_chunk;
  return c;
}

// ---------------------------------------------------------------------------------------------
// The contract, transcribed literally (one row and head at a time, no tiling, no shortcuts): the
// op must equal it bit for bit.
void spec_row(const bf16* q, const std::vector<const bf16*>& krow,
              const std::vector<const bf16*>& vrow, int64_t D, float scale, int64_t kv_chunk,
              bf16* out, float* lse) {
  const int64_t n = int64_t(krow.size());  // keys 0 .. n-1 are the valid ones
  auto mx = [](float a, float b) {
    float m = b > a ? b : a;  // NaN ignored
    return m == 0.0f ? 0.0f : m;
  };
  float M = 0, L = 0;
  std::vector<float> ACC(static_cast<size_t>(D)), acc(static_cast<size_t>(D));
  for (int64_t c = 0; c * kv_chunk < n; ++c) {
    float m = -INFINITY, l = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j0 = c * kv_chunk; j0 < std::min(n, (c + 1) * kv_chunk); j0 += 64) {
      float x[64], p[64];
      bf16 pb[64];
      float mb = -INFINITY;
      for (int j = 0; j < 64; ++j) {
        if (j0 + j < n) {
          x[j] = mma_chain_bf16(q, krow[size_t(j0 + j)], D, 0.0f) * scale;
          mb = mx(mb, x[j]);
        }
      }
      const float m_new = mx(m, mb);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      for (int j = 0; j < 64; ++j) {
        p[j] = j0 + j < n ? ls_ex2_sfu(x[j] - m_use) : 0.0f;
        pb[j] = f32_to_bf16(p[j]);
      }
      for (int w = 32; w >= 1; w /= 2) {
        for (int i = 0; i < w; ++i) p[i] = p[i] + p[i + w];
      }
      const float alpha = ls_ex2_sfu(m - m_use);  // exp2(-inf) = 0 on the first block
      l = alpha * l + p[0];
      for (int64_t dd = 0; dd < D; ++dd) {
        float cc = alpha * acc[size_t(dd)];
        for (int kb = 0; kb < 4; ++kb) {
          bf16 vb[16];
          for (int i = 0; i < 16; ++i) {
            const int64_t j = j0 + kb * 16 + i;
            vb[i] = j < n ? vrow[size_t(j)][dd] : bf16{0};
          }
          cc = mma_kblock_bf16(pb + kb * 16, vb, cc);
        }
        acc[size_t(dd)] = cc;
      }
      m = m_new;
    }
    if (c == 0) {
      M = m;
      L = l;
      ACC = acc;
    } else {
      const float Mn = mx(M, m);
      const float Mu = Mn == -INFINITY ? 0.0f : Mn;
      const float a = ls_ex2_sfu(M - Mu), b = ls_ex2_sfu(m - Mu);
      L = a * L + b * l;
      for (int64_t dd = 0; dd < D; ++dd)
        ACC[size_t(dd)] = a * ACC[size_t(dd)] + b * acc[size_t(dd)];
      M = Mn;
    }
  }
  const float inv = 1.0f / L;
  for (int64_t dd = 0; dd < D; ++dd) out[dd] = f32_to_bf16(ACC[size_t(dd)] * inv);
  *lse = (M + ls_log2f(L)) * 0x1.62e43p-1f;
}

TEST(AttentionConfig, PrintsAndValidates) {
  AttentionConfig c;
  EXPECT_EQ(c.to_string(), "attention: kv_chunk=1024 block=64 softmax_scale=1/sqrt(head_dim)");
  c.softmax_scale = 0.125;
  EXPECT_EQ(c.to_string(), "attention: kv_chunk=1024 block=64 softmax_scale=0.125 (0x1p-3)");
  EXPECT_EQ(c.scale_log2(64), float(0.125 * 1.4426950408889634));
  c.softmax_scale = 0.0;
  EXPECT_EQ(c.scale_log2(128), float((1.0 / std::sqrt(128.0)) * 1.4426950408889634));
  ContractConfig cc;
  cc.kv_chunk = 256;
  EXPECT_EQ(AttentionConfig::from_contract(cc).kv_chunk, 256);
  for (int bad : {0, 32, 100, -64}) {
    AttentionConfig b;
    b.kv_chunk = bad;
    try {
      b.validate();
      ADD_FAILURE() << "kv_chunk " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kv_chunk"), std::string::npos) << e.what();
    }
  }
  AttentionConfig b;
  b.softmax_scale = -1.0;
  EXPECT_THROW(b.validate(), Error);
  b.softmax_scale = NAN;
  EXPECT_THROW(b.validate(), Error);
}

// The op equals the literal transcription of the contract, for GQA ratios 1/2/4/8, D = 64/128,
// kv_chunk 64 (many chunks) and 1024 (one chunk), with peaked and flat softmaxes.
TEST(Attention, MatchesContractTranscription) {
  auto g = test::rng(1);
  struct Case {
    Dims d;
    int kv_chunk;
    int64_t len;
    float qscale;
    double scale;
  };
  const Case cases[] = {
      {{2, 2, 64}, 64, 150, 1.0f, 0.0},  {{4, 2, 64}, 128, 97, 4.0f, 0.0},
      {{4, 1, 128}, 64, 140, 1.0f, 0.0}, {{8, 1, 64}, 1024, 70, 2.0f, 0.3},
      {{2, 1, 128}, 64, 129, 8.0f, 0.0}, {{3, 3, 16}, 64, 66, 1.0f, 0.0},
  };
  for (const Case& cs : cases) {
    const Dims& d = cs.d;
    AttentionConfig cfg = cfg_chunk(cs.kv_chunk);
    cfg.softmax_scale = cs.scale;
    Seq s = make_seq(d, cs.len, g, cs.qscale);
    Result r = prefill_one(s, d, cfg);
    const float scale = cfg.scale_log2(d.D);
    const int64_t G = d.Hq / d.Hkv;
    std::vector<bf16> o(size_t(d.D));
    for (int64_t p = 0; p < cs.len; p += (p < 70 ? 1 : 5)) {
      for (int64_t h = 0; h < d.Hq; ++h) {
        std::vector<const bf16*> kr, vr;
        for (int64_t j = 0; j <= p; ++j) {
          kr.push_back(s.k.ptr<bf16>() + (j * d.Hkv + h / G) * d.D);
          vr.push_back(s.v.ptr<bf16>() + (j * d.Hkv + h / G) * d.D);
        }
        float lse;
        spec_row(s.q.ptr<bf16>() + (p * d.Hq + h) * d.D, kr, vr, d.D, scale, cs.kv_chunk, o.data(),
                 &lse);
        ASSERT_TRUE(
            bitwise_equal(o.data(), r.out.ptr<bf16>() + (p * d.Hq + h) * d.D, d.D, DType::kBF16))
            << "D=" << d.D << " Hq=" << d.Hq << " Hkv=" << d.Hkv << " kv_chunk=" << cs.kv_chunk
            << " pos " << p << " head " << h;
        ASSERT_TRUE(bitwise_equal(&lse, r.lse.ptr<float>() + p * d.Hq + h, 1, DType::kF32))
            << "lse pos " << p << " head " << h;
      }
    }
  }
}

// Accuracy vs fp64 softmax attention of the same bf16 inputs. Stated tolerance (v ~ N(0,1)):
// |out - ref| <= 2^-7 + 2^-7 |ref| (P is rounded to bf16 before the PV product, the MMA truncates,
// and out is rounded to bf16); |lse - ref| <= 2^-16 (1 + |ref|).
TEST(Attention, AccuracyVsFp64Oracle) {
  auto g = test::rng(2);
  const Dims dims[] = {{4, 4, 64}, {4, 2, 128}, {8, 1, 64}, {8, 2, 128}};
  double worst_o = 0, worst_l = 0;
  for (const Dims& d : dims) {
    for (float qscale : {1.0f, 3.0f}) {
      const int64_t len = 260;
      Seq s = make_seq(d, len, g, qscale);
      AttentionConfig cfg = cfg_chunk(128);
      Result r = prefill_one(s, d, cfg);
      const double scale = 1.0 / std::sqrt(double(d.D));
      const int64_t G = d.Hq / d.Hkv;
      for (int64_t p = 0; p < len; p += 3) {
        for (int64_t h = 0; h < d.Hq; ++h) {
          std::vector<double> sc(size_t(p + 1));
          double mxs = -INFINITY;
          for (int64_t j = 0; j <= p; ++j) {
            double acc = 0;
            for (int64_t e = 0; e < d.D; ++e) {
              acc += double(bf16_to_f32(s.q.ptr<bf16>()[(p * d.Hq + h) * d.D + e])) *
                     double(bf16_to_f32(s.k.ptr<bf16>()[(j * d.Hkv + h / G) * d.D + e]));
            }
            sc[size_t(j)] = acc * scale;
            mxs = std::max(mxs, sc[size_t(j)]);
          }
          double sum = 0;
          for (double& x : sc) {
            x = std::exp(x - mxs);
            sum += x;
          }
          const double lse_ref = mxs + std::log(sum);
          const double lse = r.lse.ptr<float>()[p * d.Hq + h];
          const double el = std::fabs(lse - lse_ref) / (1 + std::fabs(lse_ref));
          worst_l = std::max(worst_l, el);
          EXPECT_LE(el, 0x1p-16) << "lse pos " << p << " head " << h;
          for (int64_t e = 0; e < d.D; ++e) {
            double o = 0;
            for (int64_t j = 0; j <= p; ++j) {
              o += sc[size_t(j)] *
                   double(bf16_to_f32(s.v.ptr<bf16>()[(j * d.Hkv + h / G) * d.D + e]));
            }
            o /= sum;
            const double got = bf16_to_f32(r.out.ptr<bf16>()[(p * d.Hq + h) * d.D + e]);
            const double err = std::fabs(got - o);
            worst_o = std::max(worst_o, err / (1 + std::fabs(o)));
            ASSERT_LE(err, 0x1p-7 + 0x1p-7 * std::fabs(o))
                << "D=" << d.D << " pos " << p << " head " << h << " dim " << e;
          }
        }
      }
    }
  }
  std::printf("[attention] worst |out-ref|/(1+|ref|) = %.3g, worst lse rel err = %.3g\n", worst_o,
              worst_l);
}

// A sequence's rows are the same alone and packed with others (other lengths, positions, and
// contents), for odd lengths around block and chunk edges.
TEST(Attention, VarlenPackedEqualsAlone) {
  auto g = test::rng(3);
  const Dims d{4, 2, 64};
  const AttentionConfig cfg = cfg_chunk(64);
  const int64_t lens[] = {1, 3, 17, 111, 64, 65, 200, 128};
  std::vector<Seq> seqs;
  for (int64_t len : lens) seqs.push_back(make_seq(d, len, g));
  std::vector<Result> alone;
  for (const Seq& s : seqs) alone.push_back(prefill_one(s, d, cfg));
  // All together, in two different orders; then with the others' contents replaced.
  std::vector<const Seq*> order;
  for (const Seq& s : seqs) order.push_back(&s);
  std::vector<Seq> others;
  others.push_back(make_seq(d, 5, g));
  others.push_back(make_seq(d, 90, g));
  for (int pass = 0; pass < 3; ++pass) {
    if (pass == 1) std::reverse(order.begin(), order.end());
    if (pass == 2) order = {&others[0], &seqs[3], &others[1], &seqs[0]};  // fresh neighbours
    Result packed = prefill(order, d, cfg);
    int64_t t = 0;
    for (const Seq* s : order) {
      for (size_t idx = 0; idx < seqs.size(); ++idx) {
        if (s != &seqs[idx]) continue;
        EXPECT_TRUE(rows_equal(alone[idx], 0, packed, t, s->len, d))
            << "sequence " << idx << " len " << s->len << " at offset " << t << " pass " << pass;
      }
      t += s->len;
    }
  }
  // Empty sequences in the batch change nothing.
  Seq empty;
  empty.len = 0;
  empty.q = Tensor(DType::kBF16, {0, d.Hq, d.D});
  empty.k = Tensor(DType::kBF16, {0, d.Hkv, d.D});
  empty.v = Tensor(DType::kBF16, {0, d.Hkv, d.D});
  Result with_empty = prefill({&empty, &seqs[2], &empty}, d, cfg);
  EXPECT_TRUE(rows_equal(alone[2], 0, with_empty, 0, seqs[2].len, d));
}

// Decoding token by token over a paged cache gives each position the prefill row's bits, for page
// sizes 1, 3, 16, 64, 256 (NaN garbage in every unused slot); batched decode of several
// sequences gives each row its solo bits.
TEST(Attention, PagedDecodeEqualsPrefillEveryPageSize) {
  auto g = test::rng(4);
  const Dims d{4, 2, 64};
  const AttentionConfig cfg = cfg_chunk(64);
  Seq s = make_seq(d, 150, g);
  Result ref = prefill_one(s, d, cfg);
  for (int64_t P : {1, 3, 16, 64, 256}) {
    Cache c = make_cache(d, {s.len}, P, g);
    for (int64_t p = 0; p < s.len; ++p) {
      write_tokens(c, 0, s, p, p + 1);
      Result r = paged(c, {{0, &s, p}}, d, cfg);
      ASSERT_TRUE(rows_equal(ref, p, r, 0, 1, d)) << "page size " << P << " position " << p;
    }
  }
  // Continuous batching: a row's bits alone equal its bits inside decode batches of 1, 3, 17 and
  // 256 rows of other sequences (other lengths, random order).
  std::vector<Seq> many;
  std::vector<int64_t> caps;
  for (int i = 0; i < 256; ++i) {
    many.push_back(make_seq(d, 1 + int64_t(g() % (i < 8 ? 300 : 90)), g));
    caps.push_back(many.back().len);
  }
  Cache c = make_cache(d, caps, 16, g);
  std::vector<QRow> all;
  std::vector<Result> solo;
  for (int64_t i = 0; i < 256; ++i) {
    write_tokens(c, i, many[size_t(i)], 0, many[size_t(i)].len);
    all.push_back({i, &many[size_t(i)], many[size_t(i)].len - 1});
    solo.push_back(paged(c, {all.back()}, d, cfg));
  }
  for (int i = 0; i < 8; i += 3) {  // a few solo decodes against packed prefill
    Result pre = prefill_one(many[size_t(i)], d, cfg);
    EXPECT_TRUE(rows_equal(pre, many[size_t(i)].len - 1, solo[size_t(i)], 0, 1, d)) << i;
  }
  for (size_t n : {1, 3, 17, 256}) {
    std::vector<QRow> rows = all;
    std::shuffle(rows.begin(), rows.end(), g);
    rows.resize(n);
    Result batch = paged(c, rows, d, cfg);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_TRUE(rows_equal(solo[size_t(rows[i].s)], 0, batch, int64_t(i), 1, d))
          << "batch of " << n << ", row " << i << " (sequence " << rows[i].s << ")";
    }
  }
}

// Chunked prefill (write the chunk's keys, then attend) with chunk sizes 1, 7, 64, 100 and the
// whole sequence equals packed prefill; page sizes 3 and 16; GQA ratio 4, D = 128.
TEST(Attention, ChunkedPrefillAnyChunkSizeEqualsPrefill) {
  auto g = test::rng(5);
  const Dims d{4, 1, 128};
  const AttentionConfig cfg = cfg_chunk(128);
  Seq s = make_seq(d, 230, g);
  Result ref = prefill_one(s, d, cfg);
  for (int64_t P : {3, 16}) {
    for (int64_t chunk : {1, 7, 64, 100, 230}) {
      if (P == 3 && (chunk == 1 || chunk == 64)) continue;  // keep the run short
      Cache c = make_cache(d, {s.len}, P, g);
      for (int64_t p0 = 0; p0 < s.len; p0 += chunk) {
        const int64_t p1 = std::min(s.len, p0 + chunk);
        write_tokens(c, 0, s, p0, p1);
        std::vector<QRow> rows;
        for (int64_t p = p0; p < p1; ++p) rows.push_back({0, &s, p});
        Result r = paged(c, rows, d, cfg);
        ASSERT_TRUE(rows_equal(ref, p0, r, 0, p1 - p0, d))
            << "page size " << P << " chunk " << chunk << " at " << p0;
      }
    }
  }
}

// Split-KV with 1 .. many splits, and chunk states computed in pieces (as context-parallel ranks
// would) then merged, equal attention_paged.
TEST(Attention, SplitKvAndChunkStatesEqualPaged) {
  auto g = test::rng(6);
  const Dims d{4, 2, 64};
  const AttentionConfig cfg = cfg_chunk(64);
  std::vector<Seq> seqs;
  std::vector<int64_t> caps = {600, 1, 130, 64, 321};
  for (int64_t len : caps) seqs.push_back(make_seq(d, len, g));
  Cache c = make_cache(d, caps, 16, g);
  std::vector<QRow> rows;
  for (int64_t i = 0; i < int64_t(seqs.size()); ++i) {
    write_tokens(c, i, seqs[size_t(i)], 0, caps[size_t(i)]);
    rows.push_back({i, &seqs[size_t(i)], caps[size_t(i)] - 1});
  }
  rows.push_back({0, &seqs[0], 255});  // a small chunked-prefill tile of sequence 0
  rows.push_back({0, &seqs[0], 256});
  Result ref = paged(c, rows, d, cfg);
  const int64_t N = int64_t(rows.size());
  for (int splits : {1, 2, 3, 5, 10, 100}) {
    Result r = paged(c, rows, d, cfg, splits);
    EXPECT_TRUE(rows_equal(ref, 0, r, 0, N, d)) << splits << " splits";
  }
  // Chunk states in three pieces: chunks [0, 2), [2, 5), [5, 10) into one states tensor.
  QBatch b = make_queries(rows, d);
  const int64_t C = 10;
  Tensor m(DType::kF32, {N, d.Hq, C}), l(DType::kF32, {N, d.Hq, C}),
      acc(DType::kF32, {N, d.Hq, C, d.D});
  test::poison(m.data(), m.nbytes());
  test::poison(l.data(), l.nbytes());
  test::poison(acc.data(), acc.nbytes());
  const int64_t cuts[] = {0, 2, 5, 10};
  for (int i = 0; i < 3; ++i) {
    const int64_t c0 = cuts[i], c1 = cuts[i + 1];
    AttentionChunkStates part;
    // Views of chunks [c0, c1): same strides, offset pointer, shape C' = c1 - c0.
    part.m = m.view();
    part.l = l.view();
    part.acc = acc.view();
    part.m.data = m.ptr<float>() + c0;
    part.l.data = l.ptr<float>() + c0;
    part.acc.data = acc.ptr<float>() + c0 * d.D;
    part.m.shape[2] = part.l.shape[2] = part.acc.shape[2] = c1 - c0;
    cpu::attention_paged_chunk_states(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg, c0,
                                      part);
  }
  // Row 1 (length 1) has one chunk: its other chunks are written empty.
  EXPECT_EQ(m.ptr<float>()[(1 * d.Hq + 0) * C + 3], -INFINITY);
  EXPECT_EQ(l.ptr<float>()[(1 * d.Hq + 0) * C + 3], 0.0f);
  Result merged = alloc_result(N, d);
  cpu::attention_merge_chunk_states({m.view(), l.view(), acc.view()}, b.q_pos.view(), cfg,
                                    merged.out.view(), merged.lse.view());
  EXPECT_TRUE(rows_equal(ref, 0, merged, 0, N, d));

  // States are outputs: a NaN (here from a negative, non-canonical NaN in row 0's q) is stored
  // as the canonical 0x7FC00000, like every other op's (contract §4; the GPU stores it so too).
  b.q.ptr<bf16>()[3] = bf16{0xffc1};
  cpu::attention_paged_chunk_states(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg, 0,
                                    {m.view(), l.view(), acc.view()});
  int64_t nans = 0;
  for (const Tensor* t : {&m, &l, &acc}) {
    for (int64_t i = 0; i < t->numel(); ++i) {
      const float x = t->ptr<float>()[i];
      if (x != x) {
        ++nans;
        ASSERT_EQ(f32_bits(x), 0x7fc00000u) << "state element " << i;
      }
    }
  }
  EXPECT_GT(nans, 0);
}

// The default kv_chunk (1024) past one chunk: decode at 1100 keys with 1, 2, 7 splits and the
// contract transcription agree.
TEST(Attention, DefaultChunkLongContextDecode) {
  auto g = test::rng(13);
  const Dims d{2, 1, 128};
  AttentionConfig cfg;
  ASSERT_EQ(cfg.kv_chunk, 1024);
  Seq s = make_seq(d, 1100, g, 2.0f);
  Cache c = make_cache(d, {s.len}, 256, g);
  write_tokens(c, 0, s, 0, s.len);
  std::vector<QRow> rows = {{0, &s, 1099}, {0, &s, 1023}, {0, &s, 1024}};
  Result ref = paged(c, rows, d, cfg, 1);
  for (int splits : {0, 2, 7}) {
    Result r = paged(c, rows, d, cfg, splits);
    EXPECT_TRUE(rows_equal(ref, 0, r, 0, 3, d)) << splits << " splits";
  }
  std::vector<bf16> o(static_cast<size_t>(d.D));
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      std::vector<const bf16*> kr, vr;
      for (int64_t j = 0; j <= rows[i].pos; ++j) {
        kr.push_back(s.k.ptr<bf16>() + j * d.D);
        vr.push_back(s.v.ptr<bf16>() + j * d.D);
      }
      float lse;
      spec_row(s.q.ptr<bf16>() + (rows[i].pos * d.Hq + h) * d.D, kr, vr, d.D, cfg.scale_log2(d.D),
               cfg.kv_chunk, o.data(), &lse);
      EXPECT_TRUE(
          bitwise_equal(o.data(), ref.out.ptr<bf16>() + (i * d.Hq + h) * d.D, d.D, DType::kBF16))
          << "row " << i << " head " << h;
      EXPECT_EQ(f32_bits(lse), f32_bits(ref.lse.ptr<float>()[i * d.Hq + h]));
    }
  }
}

// Prefix-shared (cascade) attention equals the non-shared paged computation, with the shared
// prefix ending inside a chunk and inside a page, at a chunk boundary, below one chunk, and empty.
TEST(Attention, CascadeEqualsNonShared) {
  auto g = test::rng(7);
  const Dims d{4, 2, 64};
  const AttentionConfig cfg = cfg_chunk(64);
  const int64_t P = 16;
  // Groups: shared_len 150 (chunk 2 straddles, page 9 partial), 128 (chunk-aligned), 40 (below
  // one chunk), 0 (nothing shared).
  const std::vector<int64_t> shared = {150, 128, 40, 0};
  const std::vector<int64_t> samples = {4, 3, 2, 2};
  struct Sample {
    int64_t group;
    Seq seq;  // whole sequence: prefix (copied from the group's) + own suffix
  };
  std::vector<Sample> all;
  for (size_t gi = 0; gi < shared.size(); ++gi) {
    Seq prompt = make_seq(d, shared[gi], g);
    for (int64_t i = 0; i < samples[gi]; ++i) {
      const int64_t suffix = 1 + int64_t(g() % 100);
      Seq s = make_seq(d, shared[gi] + suffix, g);
      // The prefix's k/v (and q) are the group's.
      std::memcpy(s.k.data(), prompt.k.data(), size_t(prompt.k.nbytes()));
      std::memcpy(s.v.data(), prompt.v.data(), size_t(prompt.v.nbytes()));
      std::memcpy(s.q.data(), prompt.q.data(), size_t(prompt.q.nbytes()));
      all.push_back({int64_t(gi), std::move(s)});
    }
  }
  Seq lone = make_seq(d, 77, g);  // a sequence in no group
  const int64_t S = int64_t(all.size()) + 1;

  // Non-shared reference: every sequence has its own pages for everything.
  std::vector<int64_t> caps;
  for (const Sample& a : all) caps.push_back(a.seq.len);
  caps.push_back(lone.len);
  Cache full = make_cache(d, caps, P, g);
  for (int64_t i = 0; i < S - 1; ++i) write_tokens(full, i, all[size_t(i)].seq, 0, caps[size_t(i)]);
  write_tokens(full, S - 1, lone, 0, lone.len);

  // Shared layout: group prefixes stored once (as "sequences" S .. S+GR-1 of the cache), each
  // sample's own pages hold positions >= shared_len only (its boundary page's lower slots and its
  // table entries below the prefix are garbage).
  std::vector<int64_t> caps2 = caps;
  for (int64_t sl : shared) caps2.push_back(std::max<int64_t>(sl, 1));
  Cache sh = make_cache(d, caps2, P, g);
  const int64_t GR = int64_t(shared.size());
  Tensor ptab(DType::kI32, {GR, sh.MP}), plen(DType::kI32, {GR}), sgroup(DType::kI32, {S});
  for (int64_t gi = 0; gi < GR; ++gi) {
    // Write the prompt through sample 0 of the group (its first shared[gi] positions).
    const Seq* first = nullptr;
    for (const Sample& a : all) {
      if (a.group == gi) {
        first = &a.seq;
        break;
      }
    }
    if (shared[size_t(gi)] > 0) write_tokens(sh, S + gi, *first, 0, shared[size_t(gi)]);
    std::memcpy(ptab.ptr<int32_t>() + gi * sh.MP, sh.tab(S + gi), size_t(sh.MP) * 4);
    plen.ptr<int32_t>()[gi] = int32_t(shared[size_t(gi)]);
  }
  for (int64_t i = 0; i < S - 1; ++i) {
    const int64_t sl = shared[size_t(all[size_t(i)].group)];
    write_tokens(sh, i, all[size_t(i)].seq, sl, caps[size_t(i)]);
    for (int64_t pg = 0; pg < sl / P; ++pg) sh.tab(i)[pg] = -1;  // never read
    sgroup.ptr<int32_t>()[i] = int32_t(all[size_t(i)].group);
  }
  write_tokens(sh, S - 1, lone, 0, lone.len);
  sgroup.ptr<int32_t>()[S - 1] = -1;
  // The prefix "sequences" themselves are not queried.
  std::vector<QRow> rows;
  for (int64_t i = 0; i < S - 1; ++i) {
    const Seq& s = all[size_t(i)].seq;
    rows.push_back({i, &s, s.len - 1});  // decode
  }
  rows.push_back({S - 1, &lone, lone.len - 1});
  rows.push_back({0, &all[0].seq, 100});  // inside the prefix
  rows.push_back({0, &all[0].seq, 149});
  rows.push_back({0, &all[0].seq, 150});  // first own token
  Result ref = paged(full, rows, d, cfg);
  for (size_t i = 0; i < rows.size(); ++i) {
    Result solo = prefill_one(*rows[i].seq, d, cfg);
    ASSERT_TRUE(rows_equal(solo, rows[i].pos, ref, int64_t(i), 1, d)) << "row " << i;
  }
  QBatch b = make_queries(rows, d);
  const int64_t N = int64_t(rows.size());
  Tensor sgroup2(DType::kI32, {S + GR});
  std::memcpy(sgroup2.data(), sgroup.data(), size_t(S) * 4);
  for (int64_t gi = 0; gi < GR; ++gi) sgroup2.ptr<int32_t>()[S + gi] = -1;
  Result r = alloc_result(N, d);
  SharedPrefix pre{ptab.view(), plen.view(), sgroup2.view()};
  cpu::attention_paged_cascade(b.q.view(), b.q_seq.view(), b.q_pos.view(), sh.view(), pre, cfg,
                               r.out.view(), r.lse.view());
  EXPECT_TRUE(rows_equal(ref, 0, r, 0, N, d));
  // Thread count does not matter for the cascade either.
  const int saved = num_threads();
  set_num_threads(1);
  Result r1 = alloc_result(N, d, 0x5A);
  cpu::attention_paged_cascade(b.q.view(), b.q_seq.view(), b.q_pos.view(), sh.view(), pre, cfg,
                               r1.out.view(), r1.lse.view());
  set_num_threads(saved);
  EXPECT_TRUE(rows_equal(ref, 0, r1, 0, N, d));
}

// Strided views: q/k/v inside one fused qkv buffer, out/lse inside wider buffers, and a combined
// [NP, 2, P, Hkv, D] cache, equal the contiguous results.
TEST(Attention, StridedViews) {
  auto g = test::rng(9);
  const Dims d{4, 2, 64};
  const AttentionConfig cfg = cfg_chunk(64);
  Seq s = make_seq(d, 90, g);
  Result ref = prefill_one(s, d, cfg);
  const int64_t T = s.len, W = d.Hq + 2 * d.Hkv;
  Tensor qkv(DType::kBF16, {T, W, d.D});
  for (int64_t t = 0; t < T; ++t) {
    bf16* row = qkv.ptr<bf16>() + t * W * d.D;
    std::memcpy(row, s.q.ptr<bf16>() + t * d.Hq * d.D, size_t(d.Hq * d.D) * 2);
    std::memcpy(row + d.Hq * d.D, s.k.ptr<bf16>() + t * d.Hkv * d.D, size_t(d.Hkv * d.D) * 2);
    std::memcpy(row + (d.Hq + d.Hkv) * d.D, s.v.ptr<bf16>() + t * d.Hkv * d.D,
                size_t(d.Hkv * d.D) * 2);
  }
  auto sub = [&](int64_t h0, int64_t nh) {
    TensorView v = qkv.view();
    v.data = qkv.ptr<bf16>() + h0 * d.D;
    v.shape[1] = nh;
    return v;
  };
  Tensor wide(DType::kBF16, {T, d.Hq, 2 * d.D}), lse_wide(DType::kF32, {d.Hq, T});
  TensorView out = wide.view();
  out.shape[2] = d.D;
  TensorView lse = lse_wide.view();
  std::swap(lse.shape[0], lse.shape[1]);
  std::swap(lse.stride[0], lse.stride[1]);
  Tensor cu = i32_tensor({0, int32_t(T)});
  cpu::attention_prefill_varlen(sub(0, d.Hq), sub(d.Hq, d.Hkv), sub(d.Hq + d.Hkv, d.Hkv), cu.view(),
                                cfg, out, lse);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      ASSERT_TRUE(bitwise_equal(ref.out.ptr<bf16>() + (t * d.Hq + h) * d.D,
                                wide.ptr<bf16>() + (t * d.Hq + h) * 2 * d.D, d.D, DType::kBF16));
      ASSERT_EQ(f32_bits(ref.lse.ptr<float>()[t * d.Hq + h]),
                f32_bits(lse_wide.ptr<float>()[h * T + t]));
    }
  }
  // Combined cache: k and v as views of one [NP, 2, P, Hkv, D] buffer.
  const int64_t P = 16, NP = 8;
  Tensor kvbuf(DType::kBF16, {NP, 2, P, d.Hkv, d.D});
  fill_nan(kvbuf);
  auto half = [&](int which) {
    TensorView v;
    v.data = kvbuf.ptr<bf16>() + which * P * d.Hkv * d.D;
    v.dtype = DType::kBF16;
    v.ndim = 4;
    const int64_t sh[4] = {NP, P, d.Hkv, d.D};
    const int64_t st[4] = {2 * P * d.Hkv * d.D, d.Hkv * d.D, d.D, 1};
    for (int i = 0; i < 4; ++i) {
      v.shape[i] = sh[i];
      v.stride[i] = st[i];
    }
    return v;
  };
  Tensor table = i32_tensor({5, 2, 7, 0, 3, 1});
  table = [&] {
    Tensor t(DType::kI32, {1, 6});
    std::memcpy(t.data(), table.data(), 24);
    return t;
  }();
  Tensor slots(DType::kI32, {T});
  for (int64_t p = 0; p < T; ++p) slots.ptr<int32_t>()[p] = table.ptr<int32_t>()[p / P] * P + p % P;
  cpu::kv_cache_write(s.k.view(), s.v.view(), slots.view(), half(0), half(1));
  Tensor lens = i32_tensor({int32_t(T)});
  std::vector<QRow> rows;
  for (int64_t p = 0; p < T; p += 7) rows.push_back({0, &s, p});
  QBatch b = make_queries(rows, d);
  Result r = alloc_result(int64_t(rows.size()), d);
  cpu::attention_paged(b.q.view(), b.q_seq.view(), b.q_pos.view(),
                       PagedKv{half(0), half(1), table.view(), lens.view()}, cfg, r.out.view(),
                       r.lse.view());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_TRUE(rows_equal(ref, rows[i].pos, r, int64_t(i), 1, d)) << "row " << i;
  }
  // lse is optional.
  Result r2 = alloc_result(int64_t(rows.size()), d);
  cpu::attention_paged(b.q.view(), b.q_seq.view(), b.q_pos.view(),
                       PagedKv{half(0), half(1), table.view(), lens.view()}, cfg, r2.out.view(),
                       TensorView{});
  EXPECT_TRUE(bitwise_equal(r.out.data(), r2.out.data(), r.out.numel(), DType::kBF16));
}

// NaN in the inputs: a NaN query makes its own row NaN (canonical 0x7FC0 / 0x7FC00000) and no
// other; a NaN key makes exactly the rows that can see it NaN.
TEST(Attention, NanInputsStayInTheirRows) {
  auto g = test::rng(10);
  const Dims d{2, 1, 64};
  const AttentionConfig cfg = cfg_chunk(64);
  Seq s = make_seq(d, 100, g);
  Result ref = prefill_one(s, d, cfg);
  Seq s2 = make_seq(d, 100, g);
  std::memcpy(s2.q.data(), s.q.data(), size_t(s.q.nbytes()));
  std::memcpy(s2.k.data(), s.k.data(), size_t(s.k.nbytes()));
  std::memcpy(s2.v.data(), s.v.data(), size_t(s.v.nbytes()));
  s2.q.ptr<bf16>()[(40 * d.Hq + 1) * d.D + 5] = bf16{0x7fc0};   // q of row 40, head 1
  s2.k.ptr<bf16>()[(70 * d.Hkv + 0) * d.D + 9] = bf16{0xffc1};  // key 70
  Result r = prefill_one(s2, d, cfg);
  for (int64_t p = 0; p < s.len; ++p) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      const bool nan_row = (p == 40 && h == 1) || p >= 70;
      const bf16* o = r.out.ptr<bf16>() + (p * d.Hq + h) * d.D;
      if (nan_row) {
        for (int64_t e = 0; e < d.D; ++e) ASSERT_EQ(o[e].bits, 0x7fc0) << p << " " << h;
        ASSERT_EQ(f32_bits(r.lse.ptr<float>()[p * d.Hq + h]), 0x7fc00000u);
      } else {
        ASSERT_TRUE(bitwise_equal(o, ref.out.ptr<bf16>() + (p * d.Hq + h) * d.D, d.D, DType::kBF16))
            << "row " << p << " head " << h;
      }
    }
  }
  // A NaN in v (key 30, dim 9) reaches exactly out[., 9] of the rows at positions >= 30, and not
  // the rows 16 .. 29 computed in the same 16-row tile, for which key 30 is masked.
  std::memcpy(s2.q.data(), s.q.data(), size_t(s.q.nbytes()));
  std::memcpy(s2.k.data(), s.k.data(), size_t(s.k.nbytes()));
  s2.v.ptr<bf16>()[(30 * d.Hkv + 0) * d.D + 9] = bf16{0x7fc0};
  Result rv = prefill_one(s2, d, cfg);
  EXPECT_TRUE(bitwise_equal(rv.lse.data(), ref.lse.data(), ref.lse.numel(), DType::kF32));
  for (int64_t p = 0; p < s.len; ++p) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      for (int64_t e = 0; e < d.D; ++e) {
        const int64_t i = (p * d.Hq + h) * d.D + e;
        if (p >= 30 && e == 9) {
          ASSERT_EQ(rv.out.ptr<bf16>()[i].bits, 0x7fc0) << p << " " << h;
        } else {
          ASSERT_EQ(rv.out.ptr<bf16>()[i].bits, ref.out.ptr<bf16>()[i].bits)
              << "row " << p << " head " << h << " dim " << e;
        }
      }
    }
  }
}

TEST(KvCacheWrite, WritesSlotsSkipsPaddingAndChecks) {
  auto g = test::rng(11);
  const int64_t T = 5, Hkv = 2, D = 32, NP = 3, P = 4;
  Tensor k = test::random_bf16({T, Hkv, D}, g), v = test::random_bf16({T, Hkv, D}, g);
  Tensor kc(DType::kBF16, {NP, P, Hkv, D}), vc(DType::kBF16, {NP, P, Hkv, D});
  fill_nan(kc);
  fill_nan(vc);
  Tensor before_k(DType::kBF16, {NP, P, Hkv, D});
  std::memcpy(before_k.data(), kc.data(), size_t(kc.nbytes()));
  Tensor slots = i32_tensor({11, -1, 0, 4, 7});
  cpu::kv_cache_write(k.view(), v.view(), slots.view(), kc.view(), vc.view());
  const int32_t sl[] = {11, -1, 0, 4, 7};
  std::vector<uint8_t> written(size_t(NP * P), 0);
  for (int64_t t = 0; t < T; ++t) {
    if (sl[t] < 0) continue;
    written[size_t(sl[t])] = 1;
    EXPECT_TRUE(bitwise_equal(kc.ptr<bf16>() + sl[t] * Hkv * D, k.ptr<bf16>() + t * Hkv * D,
                              Hkv * D, DType::kBF16));
    EXPECT_TRUE(bitwise_equal(vc.ptr<bf16>() + sl[t] * Hkv * D, v.ptr<bf16>() + t * Hkv * D,
                              Hkv * D, DType::kBF16));
  }
  for (int64_t s = 0; s < NP * P; ++s) {
    if (!written[size_t(s)]) {
      EXPECT_TRUE(bitwise_equal(kc.ptr<bf16>() + s * Hkv * D, before_k.ptr<bf16>() + s * Hkv * D,
                                Hkv * D, DType::kBF16))
          << "slot " << s << " changed";
    }
  }
  auto expect_err = [&](const TensorView& sm, const char* what) {
    try {
      cpu::kv_cache_write(k.view(), v.view(), sm, kc.view(), vc.view());
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Tensor oob = i32_tensor({0, 1, 2, 3, 12});
  expect_err(oob.view(), "slot_mapping[4] = 12");
  Tensor neg = i32_tensor({0, 1, 2, 3, -2});
  expect_err(neg.view(), "slot_mapping[4] = -2");
  Tensor dup = i32_tensor({0, 1, 5, 3, 5});
  expect_err(dup.view(), "slot 5 more than once");
  Tensor wrong = i32_tensor({0, 1, 2});
  expect_err(wrong.view(), "slot_mapping");
  Tensor f(DType::kF32, {T});
  expect_err(f.view(), "slot_mapping");
  Tensor kc_bad(DType::kBF16, {NP, P, Hkv + 1, D});
  EXPECT_THROW(cpu::kv_cache_write(k.view(), v.view(), slots.view(), kc_bad.view(), vc.view()),
               Error);
}

// Bad inputs give a lockstep::Error naming the problem.
TEST(Attention, BadInputsThrowClearErrors) {
  auto g = test::rng(12);
  const Dims d{4, 2, 64};
  const AttentionConfig cfg = cfg_chunk(64);
  Seq s = make_seq(d, 20, g);
  Cache c = make_cache(d, {20, 20}, 8, g);
  write_tokens(c, 0, s, 0, 20);
  write_tokens(c, 1, s, 0, 20);
  auto expect_msg = [](const std::function<void()>& fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << what << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << what << "'";
    }
  };
  QBatch b = make_queries({{0, &s, 19}, {1, &s, 5}}, d);
  Result r = alloc_result(2, d);
  auto run_paged = [&](const PagedKv& kv, const QBatch& qb) {
    cpu::attention_paged(qb.q.view(), qb.q_seq.view(), qb.q_pos.view(), kv, cfg, r.out.view(),
                         r.lse.view());
  };
  EXPECT_NO_THROW(run_paged(c.view(), b));
  // Page index out of range (read), while junk past the needed pages is fine.
  {
    Cache c2 = c;
    c2.table = Tensor(DType::kI32, {2, c.MP});
    std::memcpy(c2.table.data(), c.table.data(), size_t(c.table.nbytes()));
    c2.table.ptr<int32_t>()[1] = int32_t(c.NP);
    expect_msg([&] { run_paged(c2.view(), b); }, "kv.block_table[0][1]");
    c2.table.ptr<int32_t>()[1] = -3;
    expect_msg([&] { run_paged(c2.view(), b); }, "is not a page of the cache");
  }
  // Block table too short for the length.
  {
    Cache c2 = c;
    c2.lens = i32_tensor({int32_t(c.MP * c.P + 1), 20});
    expect_msg([&] { run_paged(c2.view(), b); }, "needs more pages than kv.block_table has");
  }
  // Context length 0 for a sequence with queries; position >= length; bad sequence index.
  {
    Cache c2 = c;
    c2.lens = i32_tensor({20, 0});
    expect_msg([&] { run_paged(c2.view(), b); }, "context length must be >= 1");
    c2.lens = i32_tensor({19, 20});
    expect_msg([&] { run_paged(c2.view(), b); }, "q_pos[0] = 19 outside [0, seq_len = 19)");
    QBatch b2 = make_queries({{0, &s, 3}, {1, &s, 5}}, d);
    b2.q_seq.ptr<int32_t>()[1] = 2;
    expect_msg([&] { run_paged(c.view(), b2); }, "q_seq[1] = 2");
    b2.q_seq.ptr<int32_t>()[1] = 1;
    b2.q_pos.ptr<int32_t>()[0] = -1;
    expect_msg([&] { run_paged(c.view(), b2); }, "q_pos[0] = -1");
  }
  // Heads not dividing, wrong dtypes and shapes.
  {
    Tensor q3(DType::kBF16, {2, 3, d.D});
    test::fill_bf16(q3.ptr<bf16>(), q3.numel(), g);
    Result r3 = alloc_result(2, Dims{3, 2, d.D});
    expect_msg(
        [&] {
          cpu::attention_paged(q3.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg,
                               r3.out.view(), r3.lse.view());
        },
        "must be a multiple of kv heads Hkv=2");
    Tensor qf(DType::kF32, {2, d.Hq, d.D});
    expect_msg(
        [&] {
          cpu::attention_paged(qf.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg,
                               r.out.view(), r.lse.view());
        },
        "argument 'q' expected dtype bf16, got f32");
    Tensor q40(DType::kBF16, {2, d.Hq, 40});
    expect_msg(
        [&] {
          cpu::attention_paged(q40.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg,
                               r.out.view(), r.lse.view());
        },
        "head_dim must be a multiple of 16");
    Tensor bad_out(DType::kBF16, {2, d.Hq, d.D + 16});
    expect_msg(
        [&] {
          cpu::attention_paged(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg,
                               bad_out.view(), r.lse.view());
        },
        "argument 'out' expected shape");
    Tensor bad_lse(DType::kBF16, {2, d.Hq});
    expect_msg(
        [&] {
          cpu::attention_paged(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg,
                               r.out.view(), bad_lse.view());
        },
        "argument 'lse' expected dtype f32");
    Tensor pos64(DType::kI64, {2});
    expect_msg(
        [&] {
          cpu::attention_paged(b.q.view(), b.q_seq.view(), pos64.view(), c.view(), cfg,
                               r.out.view(), r.lse.view());
        },
        "argument 'q_pos' expected dtype i32");
    PagedKv kv = c.view();
    Tensor vsmall(DType::kBF16, {c.NP, c.P, 1, d.D});
    kv.v_cache = vsmall.view();
    expect_msg([&] { run_paged(kv, b); }, "argument 'kv.v_cache' expected shape");
    kv = c.view();
    Tensor kd(DType::kBF16, {c.NP, c.P, d.Hkv, 128});
    kv.k_cache = kd.view();
    expect_msg([&] { run_paged(kv, b); }, "argument 'kv.k_cache' expected shape");
    expect_msg(
        [&] {
          cpu::attention_paged_split_kv(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), cfg,
                                        0, r.out.view(), r.lse.view());
        },
        "num_splits must be >= 1");
    AttentionConfig bad = cfg;
    bad.kv_chunk = 96;
    expect_msg(
        [&] {
          cpu::attention_paged(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), bad,
                               r.out.view(), r.lse.view());
        },
        "kv_chunk must be a positive multiple of 64");
  }
  // Chunk states: too few chunks for a row in the merge; negative chunk_begin.
  {
    Tensor m(DType::kF32, {2, d.Hq, 0}), l(DType::kF32, {2, d.Hq, 0}),
        acc(DType::kF32, {2, d.Hq, 0, d.D});
    AttentionChunkStates st{m.view(), l.view(), acc.view()};
    expect_msg(
        [&] {
          cpu::attention_merge_chunk_states(st, b.q_pos.view(), cfg, r.out.view(), r.lse.view());
        },
        "q_pos[0] = 19 needs 1 chunks, but states hold C = 0");
    expect_msg(
        [&] {
          cpu::attention_paged_chunk_states(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(),
                                            cfg, -1, st);
        },
        "chunk_begin must be >= 0");
  }
  // Varlen: cu_seqlens not ending at T, decreasing, not starting at 0; k/v shape mismatch.
  {
    Result rp = alloc_result(20, d);
    auto run_pre = [&](const TensorView& cu, const TensorView& k) {
      cpu::attention_prefill_varlen(s.q.view(), k, s.v.view(), cu, cfg, rp.out.view(),
                                    rp.lse.view());
    };
    Tensor cu1 = i32_tensor({0, 10, 19});
    expect_msg([&] { run_pre(cu1.view(), s.k.view()); }, "cu_seqlens[B] must equal T = 20");
    Tensor cu2 = i32_tensor({0, 12, 10, 20});
    expect_msg([&] { run_pre(cu2.view(), s.k.view()); }, "non-decreasing");
    Tensor cu3 = i32_tensor({1, 20});
    expect_msg([&] { run_pre(cu3.view(), s.k.view()); }, "cu_seqlens[0] must be 0");
    Tensor cu4 = i32_tensor({0, 20});
    Tensor k19(DType::kBF16, {19, d.Hkv, d.D});
    expect_msg([&] { run_pre(cu4.view(), k19.view()); }, "argument 'k' expected shape [20, *, 64]");
    Tensor k3(DType::kBF16, {20, 3, d.D});
    expect_msg([&] { run_pre(cu4.view(), k3.view()); }, "must be a multiple of kv heads Hkv=3");
  }
  // Cascade: a sample shorter than its group's prefix; group index out of range.
  {
    Tensor ptab = i32_tensor({0, 1, 2});
    Tensor ptab2(DType::kI32, {1, 3});
    std::memcpy(ptab2.data(), ptab.data(), 12);
    Tensor plen = i32_tensor({21});
    Tensor grp = i32_tensor({0, -1});
    auto run_cas = [&](const SharedPrefix& pre) {
      cpu::attention_paged_cascade(b.q.view(), b.q_seq.view(), b.q_pos.view(), c.view(), pre, cfg,
                                   r.out.view(), r.lse.view());
    };
    expect_msg(
        [&] {
          run_cas({ptab2.view(), plen.view(), grp.view()});
        },
        "is shorter than the shared prefix");
    plen = i32_tensor({16});
    grp = i32_tensor({0, 1});
    expect_msg(
        [&] {
          run_cas({ptab2.view(), plen.view(), grp.view()});
        },
        "prefix.seq_group[1] = 1");
    plen = i32_tensor({25});
    expect_msg(
        [&] {
          run_cas({ptab2.view(), plen.view(), grp.view()});
        },
        "prefix block table too short");
  }
}

}  // namespace
}  // namespace lockstep
