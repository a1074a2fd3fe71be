// Linear log-prob backward (docs/contract.md §B.8): §B.8 written out literally (the forward's
// logits by the GEMM's scalar spec, G, dh as per-segment chains + tree, dW as one k-block per
// token block in canonical order), equal bit for bit to the op — including vocab segments whose
// length is 8 mod 16; vocab-parallel ranks' dh partials (rank-local GEMM partials over whole
// segments, tree-combined) == dh; the token chunk size, thread count and reruns change nothing; a
// sequence's dh alone == inside micro-batches; dW identical for micro-batch splits and shuffled
// packing; fp64 gradient check (with / without g_ent, τ ≠ 1, ignored targets) and a finite-
// difference check of that oracle; special values, poisoned outputs and argument errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/math.h"
#include "core/mma_model.h"
#include "core/thread_pool.h"
#include "cpu/backward/logprob_internal.h"
#include "cpu/elementwise_test_util.h"
#include "lockstep/ops/backward.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

constexpr uint32_t kCanonNanF32 = 0x7FC00000u;
float canon(float v) { return std::isnan(v) ? f32_from_bits(kCanonNanF32) : v; }

ContractConfig make_cfg(int tile, int vseg, int gseg = 1) {
  ContractConfig c;
  c.vocab_tile = tile;
  c.vocab_segments = vseg;
  c.gemm_segments = gseg;
  return c;
}

// One problem: T tokens, H hidden, V vocab, with the forward's lse / entropy.
struct Problem {
  int64_t T = 0, H = 0, V = 0;
  Tensor h, w;
  std::vector<int64_t> targets;
  LogprobParams params;
  ContractConfig cfg;
  std::vector<float> lse, entropy, g_lp, g_ent;
  bool with_ent = true;
};

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t(DType::kI64, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.ptr<int64_t>());
  return t;
}
TensorView f32_view(std::vector<float>& v) {
  return TensorView::contiguous(v.data(), DType::kF32, {int64_t(v.size())});
}

// Runs the forward to fill lse / entropy (the bits the backward receives).
void run_forward(Problem& p) {
  Tensor tg = i64_tensor(p.targets);
  Tensor logp(DType::kF32, {p.T}), lse(DType::kF32, {p.T}), ent(DType::kF32, {p.T});
  cpu::linear_logprob(p.h.view(), p.w.view(), tg.view(), p.params, p.cfg, logp.view(), lse.view(),
                      ent.view());
  p.lse.assign(lse.ptr<float>(), lse.ptr<float>() + p.T);
  p.entropy.assign(ent.ptr<float>(), ent.ptr<float>() + p.T);
}

Problem make_problem(int64_t T, int64_t H, int64_t V, const ContractConfig& cfg, float tau,
                     bool with_ent, std::mt19937_64& g, float scale = 1.0f) {
  Problem p;
  p.T = T;
  p.H = H;
  p.V = V;
  p.cfg = cfg;
  p.params.temperature = tau;
  p.with_ent = with_ent;
  p.h = test::random_bf16({T, H}, g, scale);
  p.w = test::random_bf16({V, H}, g, scale);
  p.targets.resize(size_t(T));
  for (int64_t t = 0; t < T; ++t)
    p.targets[size_t(t)] = t % 5 == 3 ? p.params.ignore_index : int64_t(g() % uint64_t(V));
  p.g_lp.resize(size_t(T));
  p.g_ent.resize(size_t(T));
  test::fill_f32(p.g_lp.data(), T, g);
  test::fill_f32(p.g_ent.data(), T, g, 0.5f);
  run_forward(p);
  return p;
}

struct Grads {
  std::vector<float> dh, dw;
};

// The op (no chunking: the public entry point). dw starts from dw0.
using cpu::logprob_backward_detail::Chunking;
Grads run_op(Problem& p, const TokenOrder& order, const std::vector<float>& dw0,
             const Chunking* chunking = nullptr) {
  Tensor tg = i64_tensor(p.targets);
  Tensor dh = test::poisoned(DType::kF32, {p.T, p.H});
  Grads r;
  r.dw = dw0;
  TensorView dwv = TensorView::contiguous(r.dw.data(), DType::kF32, {p.V, p.H});
  TensorView ge = f32_view(p.g_ent);
  if (!chunking)
    cpu::linear_logprob_backward(p.h.view(), p.w.view(), tg.view(), p.params, p.cfg,
                                 f32_view(p.lse), f32_view(p.entropy), f32_view(p.g_lp),
                                 p.with_ent ? &ge : nullptr, dh.view(), order, dwv);
  else
    cpu::logprob_backward_detail::linear_logprob_backward_chunked(
        p.h.view(), p.w.view(), tg.view(), p.params, p.cfg, f32_view(p.lse), f32_view(p.entropy),
        f32_view(p.g_lp), p.with_ent ? &ge : nullptr, dh.view(), order, dwv, *chunking);
  r.dh.assign(dh.ptr<float>(), dh.ptr<float>() + p.T * p.H);
  return r;
}

// ---- §B.8 written out from its text ------------------------------------------------------------

// G [T, V_pad] (bf16; entries v >= V are +0) from the forward's logits z = §L.4 (the GEMM's scalar
// spec, fp32 out) and the §B.8 formulas.
std::vector<bf16> stated_G(const Problem& p, int64_t V_pad) {
  std::vector<float> z(size_t(p.T * p.V));
  cpu::gemm_bf16_nt_scalar(p.h.view(), p.w.view(), logprob_logits_gemm(p.cfg),  // 1 segment (0.3)
                           TensorView::contiguous(z.data(), DType::kF32, {p.T, p.V}));
  const float tau = p.params.temperature;
  std::vector<bf16> G(size_t(p.T * V_pad), bf16{0});
  for (int64_t t = 0; t < p.T; ++t) {
    const bool ignored = p.targets[size_t(t)] == p.params.ignore_index;
    const float lse = p.lse[size_t(t)];
    const float mu = lse - p.entropy[size_t(t)];
    for (int64_t v = 0; v < p.V; ++v) {
      const float y = z[size_t(t * p.V + v)] / tau;
      const float prob = ls_expf(y - lse);
      const float ind = (!ignored && v == p.targets[size_t(t)]) ? 1.0f : 0.0f;
      // An ignored target's logp is the constant +0: a = +0 (§B.8).
      const float a = ignored ? 0.0f : p.g_lp[size_t(t)] * (ind - prob);
      float gy = a;
      if (p.with_ent) {
        const float b = p.g_ent[size_t(t)] * (prob * (mu - y));
        gy = a + b;
      }
      G[size_t(t * V_pad + v)] = f32_to_bf16(gy / tau);
    }
  }
  return G;
}

// The value of segment k of dh[t, j]: one chain from +0 over the segment's entries in k-blocks of
// 16 ascending, the segment zero-padded at its end to a multiple of 16.
float segment_chain(const Problem& p, const std::vector<bf16>& G, int64_t V_pad, int64_t seg_len,
                    int k, int64_t t, int64_t j) {
  float c = 0.0f;
  for (int64_t b0 = 0; b0 < seg_len; b0 += 16) {
    bf16 a[16], b[16];
    for (int i = 0; i < 16; ++i) {
      const int64_t e = b0 + i, v = k * seg_len + e;
      const bool real = e < seg_len && v < p.V;
      a[i] = e < seg_len ? G[size_t(t * V_pad + v)] : bf16{0};
      b[i] = real ? p.w.ptr<bf16>()[v * p.H + j] : bf16{0};
    }
    c = mma_kblock_bf16(a, b, c);
  }
  return c;
}

// tree(§2) over n values, n a power of two.
float tree(std::vector<float> x) {
  for (size_t len = x.size(); len > 1; len /= 2)
    for (size_t i = 0; i < len / 2; ++i) x[i] = x[2 * i] + x[2 * i + 1];
  return x[0];
}

// The canonical token blocks of `order`: (rows of the block, in position order).
std::vector<std::vector<int64_t>> canonical_blocks(const TokenOrder& order) {
  std::vector<TokenSeq> seqs(order.seqs().begin(), order.seqs().end());
  std::sort(seqs.begin(), seqs.end(),
            [](const TokenSeq& a, const TokenSeq& b) { return a.step_index < b.step_index; });
  std::vector<std::vector<int64_t>> blocks;
  for (const TokenSeq& s : seqs)
    for (int64_t p0 = 0; p0 < s.len; p0 += 16) {
      std::vector<int64_t> rows;
      for (int64_t q = p0; q < std::min(s.len, p0 + 16); ++q) rows.push_back(s.row + q);
      blocks.push_back(rows);
    }
  return blocks;
}

Grads stated(const Problem& p, const TokenOrder& order, const std::vector<float>& dw0) {
  const LogprobVocabLayout lay = logprob_vocab_layout(p.cfg, p.V);
  const std::vector<bf16> G = stated_G(p, lay.padded);
  Grads r;
  r.dh.resize(size_t(p.T * p.H));
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t j = 0; j < p.H; ++j) {
      std::vector<float> seg(size_t(lay.segments));
      for (int k = 0; k < lay.segments; ++k)
        seg[size_t(k)] = segment_chain(p, G, lay.padded, lay.segment_len, k, t, j);
      r.dh[size_t(t * p.H + j)] = canon(tree(seg));
    }
  // dW: B.3 with dy := G: per token block in canonical order, one k-block over its 16 rows
  // (rows past the sequence end are zero), c = the buffer's value, stored canonically.
  r.dw = dw0;
  for (const std::vector<int64_t>& rows : canonical_blocks(order))
    for (int64_t v = 0; v < p.V; ++v)
      for (int64_t j = 0; j < p.H; ++j) {
        bf16 a[16], b[16];
        for (size_t i = 0; i < 16; ++i) {
          a[i] = i < rows.size() ? G[size_t(rows[i] * lay.padded + v)] : bf16{0};
          b[i] = i < rows.size() ? p.h.ptr<bf16>()[rows[i] * p.H + j] : bf16{0};
        }
        float& d = r.dw[size_t(v * p.H + j)];
        d = canon(mma_kblock_bf16(a, b, d));
      }
  return r;
}

::testing::AssertionResult grads_equal(const Grads& a, const Grads& b) {
  auto r = test::bitwise_equal(a.dh, b.dh);
  if (!r) return r << " (dh)";
  r = test::bitwise_equal(a.dw, b.dw);
  if (!r) return r << " (dw)";
  return r;
}

std::vector<float> random_dw(const Problem& p, std::mt19937_64& g) {
  std::vector<float> d(size_t(p.V * p.H));
  test::fill_f32(d.data(), int64_t(d.size()), g, 0.1f);
  return d;
}

// Sequences of the given lengths packed in order from row `first_row`, padding rows between
// them (`gap`) and at the end; step indices from first_step.
TokenOrder pack(const std::vector<int64_t>& lens, int64_t first_step, int64_t gap,
                int64_t first_row, int64_t* rows_out) {
  std::vector<TokenSeq> seqs;
  int64_t row = first_row;
  for (size_t i = 0; i < lens.size(); ++i) {
    seqs.push_back({first_step + int64_t(i), row, lens[i]});
    row += lens[i] + gap;
  }
  *rows_out = row;
  return TokenOrder::make("test", seqs, row);
}

struct Shape {
  int64_t V, H;
  int tile, vseg, gseg;
};

// Layouts: seg_len 8 mod 16 (77 / 8 / 2, 1000 / 24 / 4, 77 / 40 / 2), 16, multiples of 16, V
// a multiple of the unit, H not a multiple of 16, gemm_segments > 1.
const std::vector<Shape> kShapes = {
    {77, 17, 8, 2, 1},  {1000, 40, 24, 4, 2}, {77, 33, 40, 2, 1},
    {128, 16, 8, 8, 1}, {300, 24, 64, 1, 4},  {61, 9, 8, 4, 8},
};

TEST(LogprobBackward, MatchesTheStatedText) {
  int n = 0;
  for (const Shape& s : kShapes)
    for (int64_t T : {1, 17, 33})
      for (bool ent : {true, false}) {
        const float tau = (n % 3 == 0) ? 1.0f : (n % 3 == 1 ? 0.7f : 1.9f);
        auto g = test::rng(1000 + uint64_t(n++));
        Problem p = make_problem(T, s.H, s.V, make_cfg(s.tile, s.vseg, s.gseg), tau, ent, g);
        // T > 1: two sequences (step indices 6, 5: the later one packed first), padding rows
        // 0 and 9.
        TokenOrder order = T == 1 ? TokenOrder::make("test", {{0, 0, 1}}, 1)
                                  : TokenOrder::make("test", {{6, 1, 8}, {5, 10, T - 10}}, T);
        const std::vector<float> dw0 = random_dw(p, g);
        EXPECT_TRUE(grads_equal(run_op(p, order, dw0), stated(p, order, dw0)))
            << "V=" << s.V << " H=" << s.H << " L=" << s.tile << " S=" << s.vseg
            << " gemm_segments=" << s.gseg << " T=" << T << " g_ent=" << ent << " tau=" << tau;
      }
}

// Negative control: where a segment is 8 mod 16, the GEMM's own equal-segment K layout over the
// unpadded [T, V_pad] G (padding K to 16·S, not each segment) is a different reduction: the
// op's dh must not equal it (it equals the per-segment layout above).
TEST(LogprobBackward, SegmentPaddingIsPerSegment) {
  auto g = test::rng(7);
  Problem p = make_problem(9, 40, 1000, make_cfg(24, 4), 1.0f, true, g);
  const LogprobVocabLayout lay = logprob_vocab_layout(p.cfg, p.V);
  ASSERT_EQ(lay.segment_len % 16, 8);
  TokenOrder order = TokenOrder::make("test", {{0, 0, p.T}}, p.T);
  const Grads op = run_op(p, order, std::vector<float>(size_t(p.V * p.H), 0.0f));
  std::vector<bf16> G = stated_G(p, lay.padded);
  std::vector<bf16> wt(size_t(p.H * lay.padded), bf16{0});
  for (int64_t v = 0; v < p.V; ++v)
    for (int64_t j = 0; j < p.H; ++j) wt[size_t(j * lay.padded + v)] = p.w.ptr<bf16>()[v * p.H + j];
  std::vector<float> other(size_t(p.T * p.H));
  cpu::gemm_bf16_nt(TensorView::contiguous(G.data(), DType::kBF16, {p.T, lay.padded}),
                    TensorView::contiguous(wt.data(), DType::kBF16, {p.H, lay.padded}),
                    GemmConfig{lay.segments},
                    TensorView::contiguous(other.data(), DType::kF32, {p.T, p.H}));
  EXPECT_FALSE(test::bitwise_equal(op.dh, other));
}

// Vocab-parallel TP: rank r of R owns segments [r·S/R, (r+1)·S/R) and only their W rows; it
// computes the GEMM partial of its subtree over its columns of the segment-padded layout
// (cpu::gemm_bf16_nt_partial), and gemm_tree_combine finishes the tree: == the op's dh, every R.
TEST(LogprobBackward, VocabParallelRanksGiveTheSameDh) {
  for (const Shape& s : kShapes) {
    if (s.vseg == 1) continue;
    auto g = test::rng(20 + uint64_t(s.V));
    Problem p = make_problem(19, s.H, s.V, make_cfg(s.tile, s.vseg, s.gseg), 1.3f, true, g);
    TokenOrder order = TokenOrder::make("test", {{0, 0, p.T}}, p.T);
    const Grads op = run_op(p, order, std::vector<float>(size_t(p.V * p.H), 0.0f));
    const LogprobVocabLayout lay = logprob_vocab_layout(p.cfg, p.V);
    const std::vector<bf16> G = stated_G(p, lay.padded);
    const int64_t seg_pad = (lay.segment_len + 15) / 16 * 16, K = seg_pad * lay.segments;
    for (int R = 1; R <= s.vseg; R *= 2) {
      std::vector<std::vector<float>> partial(size_t(R), std::vector<float>(size_t(p.T * p.H)));
      std::vector<TensorView> views;
      for (int r = 0; r < R; ++r) {
        const int k0 = r * s.vseg / R, k1 = (r + 1) * s.vseg / R;
        const int64_t Kr = seg_pad * (k1 - k0);
        // The rank's columns: its segments, each padded; its W rows only.
        std::vector<bf16> gr(size_t(p.T * Kr), bf16{0}), wr(size_t(p.H * Kr), bf16{0});
        for (int k = k0; k < k1; ++k)
          for (int64_t e = 0; e < lay.segment_len; ++e) {
            const int64_t v = k * lay.segment_len + e, c = (k - k0) * seg_pad + e;
            for (int64_t t = 0; t < p.T; ++t)
              gr[size_t(t * Kr + c)] = G[size_t(t * lay.padded + v)];
            if (v < p.V)
              for (int64_t j = 0; j < p.H; ++j)
                wr[size_t(j * Kr + c)] = p.w.ptr<bf16>()[v * p.H + j];
          }
        TensorView y = TensorView::contiguous(partial[size_t(r)].data(), DType::kF32, {p.T, p.H});
        cpu::gemm_bf16_nt_partial(TensorView::contiguous(gr.data(), DType::kBF16, {p.T, Kr}),
                                  TensorView::contiguous(wr.data(), DType::kBF16, {p.H, Kr}), K, R,
                                  r, GemmConfig{s.vseg}, y);
        views.push_back(y);
      }
      std::vector<float> dh(size_t(p.T * p.H));
      cpu::gemm_tree_combine(views, nullptr,
                             TensorView::contiguous(dh.data(), DType::kF32, {p.T, p.H}));
      EXPECT_TRUE(test::bitwise_equal(dh, op.dh)) << "V=" << s.V << " S=" << s.vseg << " R=" << R;
    }
  }
}

// The op's own vocab-parallel form: rank r of R runs linear_logprob_backward_partial on its
// segments' W rows; the dh partials combined in rank order == the op's dh, and each rank's dw rows
// == the op's dw rows (from a nonzero dw, padding rows and several sequences in the order), for
// every R, every layout, with and without g_ent, in hidden chunks too; a rank whose segments lie
// past V holds no rows.
TEST(LogprobBackward, PartialOpRanksGiveTheOpsBits) {
  for (const Shape& s : kShapes) {
    for (bool with_ent : {true, false}) {
      auto g = test::rng(40 + uint64_t(s.V) + (with_ent ? 1 : 0));
      Problem p = make_problem(37, s.H, s.V, make_cfg(s.tile, s.vseg, s.gseg), 0.9f, with_ent, g);
      int64_t rows = 0;
      TokenOrder order = pack({3, 17, 9}, 4, 2, 1, &rows);
      ASSERT_LE(rows, p.T);
      order = TokenOrder::make(
          "test", std::vector<TokenSeq>(order.seqs().begin(), order.seqs().end()), p.T);
      const std::vector<float> dw0 = random_dw(p, g);
      const Grads op = run_op(p, order, dw0);
      Tensor tg(DType::kI64, {p.T});
      for (int64_t t = 0; t < p.T; ++t) tg.ptr<int64_t>()[t] = p.targets[size_t(t)];
      TensorView ge = f32_view(p.g_ent);
      for (int R = 1; R <= s.vseg; R *= 2) {
        const int per = s.vseg / R;
        std::vector<std::vector<float>> partial(static_cast<size_t>(R));
        std::vector<TensorView> views;
        std::vector<float> dw(dw0);
        for (int r = 0; r < R; ++r) {
          const LogprobShard sh{p.V, r * per, per};
          const LogprobVocabLayout lay = logprob_vocab_layout(p.cfg, p.V);
          const int64_t v0 = std::min(p.V, int64_t(r * per) * lay.segment_len);
          const int64_t v1 = std::min(p.V, int64_t((r + 1) * per) * lay.segment_len);
          partial[size_t(r)].assign(size_t(p.T * p.H), std::nanf(""));
          TensorView y = TensorView::contiguous(partial[size_t(r)].data(), DType::kF32, {p.T, p.H});
          TensorView dws =
              TensorView::contiguous(dw.data() + v0 * p.H, DType::kF32, {v1 - v0, p.H});
          Chunking ch;
          ch.chunk_blocks = 1 + r;
          ch.wt_budget_bytes = r % 2 ? 0 : ch.wt_budget_bytes;
          ch.hidden_chunk = 7;
          cpu::logprob_backward_detail::linear_logprob_backward_partial_chunked(
              p.h.view(), p.w.view().rows(v0, v1), tg.view(), p.params, p.cfg, sh, f32_view(p.lse),
              f32_view(p.entropy), f32_view(p.g_lp), with_ent ? &ge : nullptr, y, order, dws, ch);
          views.push_back(y);
        }
        std::vector<float> dh(size_t(p.T * p.H));
        cpu::gemm_tree_combine(views, nullptr,
                               TensorView::contiguous(dh.data(), DType::kF32, {p.T, p.H}));
        const std::string what = "V=" + std::to_string(s.V) + " S=" + std::to_string(s.vseg) +
                                 " R=" + std::to_string(R) + " g_ent=" + std::to_string(with_ent);
        EXPECT_TRUE(test::bitwise_equal(dh, op.dh)) << what;
        EXPECT_TRUE(test::bitwise_equal(dw, op.dw)) << what;
      }
    }
  }
}

// The partial form's argument errors name the shard and its rows.
TEST(LogprobBackward, PartialOpErrors) {
  auto g = test::rng(44);
  Problem p = make_problem(5, 9, 61, make_cfg(8, 4, 8), 1.0f, false, g);
  TokenOrder order = TokenOrder::make("test", {{0, 0, p.T}}, p.T);
  Tensor tg(DType::kI64, {p.T});
  for (int64_t t = 0; t < p.T; ++t) tg.ptr<int64_t>()[t] = p.targets[size_t(t)];
  Tensor dh(DType::kF32, {p.T, p.H}), dw(DType::kF32, {p.V, p.H});
  const LogprobVocabLayout lay = logprob_vocab_layout(p.cfg, p.V);
  const int64_t n = std::min(p.V, 2 * lay.segment_len);
  auto run = [&](LogprobShard sh, int64_t w_rows, int64_t dw_rows) {
    cpu::linear_logprob_backward_partial(p.h.view(), p.w.view().rows(0, w_rows), tg.view(),
                                         p.params, p.cfg, sh, f32_view(p.lse), f32_view(p.entropy),
                                         f32_view(p.g_lp), nullptr, dh.view(), order,
                                         dw.view().rows(0, dw_rows));
  };
  test::expect_error_mentioning(
      [&] {
        run({p.V, 1, 2}, n, n);
      },
      "not an aligned power-of-two subtree");
  test::expect_error_mentioning(
      [&] {
        run({p.V, 0, 3}, n, n);
      },
      "not an aligned power-of-two subtree");
  test::expect_error_mentioning([&] { run({p.V, 0, 2}, n - 1, n); }, "argument 'w_shard' has");
  test::expect_error_mentioning([&] { run({p.V, 0, 2}, n, n + 1); }, "dw_shard");
  EXPECT_NO_THROW(run({p.V, 0, 2}, n, n));
}

// The chunk of token blocks the op materializes (1, 2, 3, 4, all), Wᵀ built once or in hidden
// chunks of 64 / 17 / 1 columns change no bit; nor do the thread count (1 vs 3) and reruns.
TEST(LogprobBackward, ChunkingThreadsAndRerunsChangeNothing) {
  auto g = test::rng(9);
  Problem p = make_problem(150, 100, 300, make_cfg(16, 2, 2), 0.8f, true, g);
  int64_t rows = 0;
  TokenOrder order = pack({1, 16, 17, 33, 5, 40}, 0, 3, 2, &rows);
  ASSERT_LE(rows, p.T);
  order = TokenOrder::make("test", std::vector<TokenSeq>(order.seqs().begin(), order.seqs().end()),
                           p.T);
  const std::vector<float> dw0 = random_dw(p, g);
  const Grads ref = run_op(p, order, dw0);
  for (int64_t cb : {1, 2, 3, 4, 1000}) {
    Chunking ch;
    ch.chunk_blocks = cb;
    EXPECT_TRUE(grads_equal(run_op(p, order, dw0, &ch), ref)) << "chunk_blocks=" << cb;
  }
  for (int64_t hc : {64, 17, 1}) {
    Chunking ch;
    ch.wt_budget_bytes = 0;
    ch.hidden_chunk = hc;
    EXPECT_TRUE(grads_equal(run_op(p, order, dw0, &ch), ref)) << "hidden_chunk=" << hc;
  }
  EXPECT_TRUE(grads_equal(run_op(p, order, dw0), ref));
  const int saved = num_threads();
  for (int n : {1, 3}) {
    set_num_threads(n);
    EXPECT_TRUE(grads_equal(run_op(p, order, dw0), ref)) << n << " threads";
  }
  set_num_threads(saved);
}

// Copies token rows (h row, target, g_lp, g_ent, lse, entropy) from one problem to another.
void copy_token(const Problem& src, int64_t s, Problem& dst, int64_t d) {
  std::memcpy(dst.h.ptr<bf16>() + d * dst.H, src.h.ptr<bf16>() + s * src.H, size_t(src.H) * 2);
  dst.targets[size_t(d)] = src.targets[size_t(s)];
  dst.g_lp[size_t(d)] = src.g_lp[size_t(s)];
  dst.g_ent[size_t(d)] = src.g_ent[size_t(s)];
}

// A micro-batch built from `src`'s tokens: sequence i (rows [starts[i], starts[i] + lens[i]) of
// src) placed at `rows_at[i]`; padding rows random. The forward is rerun on the new batch.
Problem repack(const Problem& src, const std::vector<int64_t>& starts,
               const std::vector<int64_t>& lens, const std::vector<int64_t>& rows_at, int64_t T,
               std::mt19937_64& g) {
  Problem p = make_problem(T, src.H, src.V, src.cfg, src.params.temperature, src.with_ent, g);
  std::memcpy(p.w.data(), src.w.data(), size_t(src.w.nbytes()));
  for (size_t i = 0; i < starts.size(); ++i)
    for (int64_t q = 0; q < lens[i]; ++q) copy_token(src, starts[i] + q, p, rows_at[i] + q);
  run_forward(p);
  return p;
}

// A sequence's dh alone == inside micro-batches of 1/3/17 other sequences (other contents) at
// other row offsets with padding rows (bitwise).
TEST(LogprobBackward, SequenceAloneEqualsInsideMicroBatches) {
  auto g = test::rng(11);
  const int64_t len = 21;
  Problem base = make_problem(len, 20, 200, make_cfg(8, 4, 2), 1.4f, true, g);
  TokenOrder alone_order = TokenOrder::make("test", {{0, 0, len}}, len);
  const Grads alone = run_op(base, alone_order, std::vector<float>(size_t(base.V * base.H), 0));
  for (int others : {1, 3, 17}) {
    std::vector<int64_t> lens(size_t(others) + 1);
    for (auto& l : lens) l = 1 + int64_t(g() % 20);
    const size_t at = size_t(others) / 2;
    lens[at] = len;
    std::vector<TokenSeq> seqs;
    std::vector<int64_t> starts, rows_at;
    int64_t row = 3;  // padding rows first
    for (size_t i = 0; i < lens.size(); ++i) {
      seqs.push_back({int64_t(i), row, lens[i]});
      rows_at.push_back(row);
      starts.push_back(0);
      row += lens[i] + int64_t(i % 2);
    }
    const int64_t T = row + 2;
    Problem mb = make_problem(T, base.H, base.V, base.cfg, base.params.temperature, true, g);
    std::memcpy(mb.w.data(), base.w.data(), size_t(base.w.nbytes()));
    for (int64_t q = 0; q < len; ++q) copy_token(base, q, mb, rows_at[at] + q);
    run_forward(mb);
    const Grads got =
        run_op(mb, TokenOrder::make("test", seqs, T), std::vector<float>(size_t(mb.V * mb.H), 0));
    ASSERT_BITWISE_EQ(got.dh.data() + rows_at[at] * base.H, alone.dh.data(), len * base.H,
                      DType::kF32);
  }
}

// dW of a step of 7 sequences: one micro-batch == consecutive micro-batches applied in order to
// the same buffer == one micro-batch packed in shuffled order with padding rows (bitwise); the
// tokens' dh are the same everywhere.
TEST(LogprobBackward, WeightGradientIndependentOfMicroBatchingAndPacking) {
  auto g = test::rng(13);
  const std::vector<int64_t> lens = {5, 16, 1, 17, 33, 2, 12};
  std::vector<int64_t> starts(lens.size());
  int64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    starts[i] = total;
    total += lens[i];
  }
  Problem step = make_problem(total, 24, 150, make_cfg(8, 2, 1), 0.9f, true, g);
  const std::vector<float> dw0 = random_dw(step, g);
  std::vector<TokenSeq> all;
  for (size_t i = 0; i < lens.size(); ++i) all.push_back({int64_t(i), starts[i], lens[i]});
  const Grads one = run_op(step, TokenOrder::make("test", all, total), dw0);

  // Consecutive micro-batches {0, 1, 2}, {3}, {4, 5, 6}, each packed with padding.
  const std::vector<std::vector<size_t>> splits = {{0, 1, 2}, {3}, {4, 5, 6}};
  std::vector<float> dw = dw0;
  GradStep gs;
  for (const auto& mbs : splits) {
    std::vector<int64_t> st, ln, at;
    std::vector<TokenSeq> seqs;
    int64_t row = 1;
    for (size_t i : mbs) {
      st.push_back(starts[i]);
      ln.push_back(lens[i]);
      at.push_back(row);
      seqs.push_back({int64_t(i), row, lens[i]});
      row += lens[i] + 2;
    }
    Problem mb = repack(step, st, ln, at, row, g);
    TokenOrder order = TokenOrder::make("test", seqs, row);
    gs.accept(order);
    const Grads r = run_op(mb, order, dw);
    dw = r.dw;
    for (size_t q = 0; q < mbs.size(); ++q)
      ASSERT_BITWISE_EQ(r.dh.data() + at[q] * step.H, one.dh.data() + st[q] * step.H,
                        ln[q] * step.H, DType::kF32);
  }
  EXPECT_TRUE(test::bitwise_equal(dw, one.dw)) << "micro-batch splits";

  // One micro-batch, sequences packed in shuffled order, padding rows between them.
  std::vector<size_t> perm(lens.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  std::vector<int64_t> st, ln, at;
  std::vector<TokenSeq> seqs;
  int64_t row = 0;
  for (size_t i : perm) {
    row += int64_t(g() % 3);
    st.push_back(starts[i]);
    ln.push_back(lens[i]);
    at.push_back(row);
    seqs.push_back({int64_t(i), row, lens[i]});
    row += lens[i];
  }
  Problem mb = repack(step, st, ln, at, row + 1, g);
  const Grads r = run_op(mb, TokenOrder::make("test", seqs, row + 1), dw0);
  EXPECT_TRUE(test::bitwise_equal(r.dw, one.dw)) << "shuffled packing";
}

// ---- fp64 oracle
// ---------------------------------------------------------------------------------

// The plain math in double on the same bf16 h, W: y = (h·Wᵀ)/τ, softmax p, lse, μ = E_p[y],
// gy = g_lp·(ind − p) + g_ent·p·(μ − y) (no g_lp term for an ignored target), G = gy/τ,
// dh = G·W, dW = Gᵀ·h over the order's rows. Also the magnitudes A (Σ|G·W|, Σ|G·h|) for the
// tolerance, and the forward value f = Σ g_lp·logp + g_ent·entropy (for finite differences).
// bdh, bdw: the same sums with |G| replaced by the bound on G's error from p and μ: the op's
// p = exp(y ⊖ lse) and μ = lse ⊖ entropy use fp32 y and the forward's lse / entropy (§L.10:
// within 4e-6·(1 + |ref|)), an absolute error ε = 4e-6·(2 + |lse| + |entropy| + |y|) in the
// exponent and in μ, so |ΔG| ≲ ε·p·(|g_lp| + |g_ent|·(1 + |μ − y|))/τ. It dominates where
// the target's 1 − p cancels (a peaked row).
struct Oracle {
  std::vector<double> dh, dw, adh, adw, bdh, bdw;
  double f = 0;
};

Oracle oracle(const Problem& p, const std::vector<double>& hd, const std::vector<double>& wd,
              const std::vector<char>& in_order) {
  Oracle o;
  o.dh.assign(size_t(p.T * p.H), 0);
  o.adh.assign(size_t(p.T * p.H), 0);
  o.dw.assign(size_t(p.V * p.H), 0);
  o.adw.assign(size_t(p.V * p.H), 0);
  o.bdh.assign(size_t(p.T * p.H), 0);
  o.bdw.assign(size_t(p.V * p.H), 0);
  const double tau = p.params.temperature;
  std::vector<double> y(size_t(p.V)), G(size_t(p.V)), dG(size_t(p.V));
  for (int64_t t = 0; t < p.T; ++t) {
    double m = -INFINITY;
    for (int64_t v = 0; v < p.V; ++v) {
      double z = 0;
      for (int64_t k = 0; k < p.H; ++k) z += hd[size_t(t * p.H + k)] * wd[size_t(v * p.H + k)];
      y[size_t(v)] = z / tau;
      m = std::max(m, y[size_t(v)]);
    }
    double s = 0, sy = 0;
    for (int64_t v = 0; v < p.V; ++v) {
      const double e = std::exp(y[size_t(v)] - m);
      s += e;
      sy += e * y[size_t(v)];
    }
    const double lse = m + std::log(s), mu = sy / s;
    const bool ignored = p.targets[size_t(t)] == p.params.ignore_index;
    const double glp = p.g_lp[size_t(t)], gent = p.with_ent ? p.g_ent[size_t(t)] : 0.0;
    if (!ignored) o.f += glp * (y[size_t(p.targets[size_t(t)])] - lse);
    o.f += gent * (lse - mu);
    for (int64_t v = 0; v < p.V; ++v) {
      const double pr = std::exp(y[size_t(v)] - lse);
      const double ind = (!ignored && v == p.targets[size_t(t)]) ? 1.0 : 0.0;
      const double gy = (ignored ? 0.0 : glp * (ind - pr)) + gent * pr * (mu - y[size_t(v)]);
      G[size_t(v)] = gy / tau;
      const double eps =
          4e-6 * (2 + std::fabs(lse) + std::fabs(lse - mu) + std::fabs(y[size_t(v)]));
      dG[size_t(v)] =
          eps * pr * (std::fabs(glp) + std::fabs(gent) * (1 + std::fabs(mu - y[size_t(v)]))) / tau;
    }
    for (int64_t v = 0; v < p.V; ++v)
      for (int64_t k = 0; k < p.H; ++k) {
        const double gw = G[size_t(v)] * wd[size_t(v * p.H + k)];
        o.dh[size_t(t * p.H + k)] += gw;
        o.adh[size_t(t * p.H + k)] += std::fabs(gw);
        o.bdh[size_t(t * p.H + k)] += dG[size_t(v)] * std::fabs(wd[size_t(v * p.H + k)]);
        if (in_order[size_t(t)]) {
          const double gh = G[size_t(v)] * hd[size_t(t * p.H + k)];
          o.dw[size_t(v * p.H + k)] += gh;
          o.adw[size_t(v * p.H + k)] += std::fabs(gh);
          o.bdw[size_t(v * p.H + k)] += dG[size_t(v)] * std::fabs(hd[size_t(t * p.H + k)]);
        }
      }
  }
  return o;
}

std::vector<double> as_double(const Tensor& t) {
  std::vector<double> d(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) d[size_t(i)] = bf16_to_f32(t.ptr<bf16>()[i]);
  return d;
}

// G is rounded to bf16 (half an ulp: relative 2^-8) before both GEMMs (whose own error is
// ~2^-20·A); p and μ carry the error bounded by B (Oracle). Tolerance:
// |got − ref| <= (1 + 2^-8)·2^-8·A + B,
// A = Σ|G·W| (dh) or Σ|G·h| (dW), B the same sums over the bound on G's error.
TEST(LogprobBackward, GradientCheckVsFp64Oracle) {
  double worst_dh = 0, worst_dw = 0, worst_b = 0;
  int n = 0;
  for (float tau : {0.7f, 1.0f, 1.9f})
    for (bool ent : {true, false})
      for (float scale : {0.3f, 1.0f}) {
        auto g = test::rng(300 + uint64_t(n++));
        Problem p = make_problem(23, 40, 333, make_cfg(24, 2, 2), tau, ent, g, scale);
        // Sequence rows [2, 20); rows 0, 1, 20, 21, 22 are padding (dh only).
        TokenOrder order = TokenOrder::make("test", {{0, 2, 10}, {1, 12, 8}}, p.T);
        std::vector<char> in_order(size_t(p.T), 0);
        for (int64_t t = 2; t < 20; ++t) in_order[size_t(t)] = 1;
        const Grads got = run_op(p, order, std::vector<float>(size_t(p.V * p.H), 0.0f));
        const Oracle ref = oracle(p, as_double(p.h), as_double(p.w), in_order);
        for (size_t i = 0; i < got.dh.size(); ++i) {
          const double err = std::fabs(got.dh[i] - ref.dh[i]);
          ASSERT_LE(err, 0x1.01p-8 * ref.adh[i] + ref.bdh[i] + 1e-30)
              << "dh[" << i << "] tau=" << tau << " g_ent=" << ent << ": " << got.dh[i] << " vs "
              << ref.dh[i];
          worst_b = std::max(worst_b, err / (0x1.01p-8 * ref.adh[i] + ref.bdh[i] + 1e-30));
          if (ref.bdh[i] < 0x1p-12 * ref.adh[i]) worst_dh = std::max(worst_dh, err / ref.adh[i]);
        }
        for (size_t i = 0; i < got.dw.size(); ++i) {
          const double err = std::fabs(got.dw[i] - ref.dw[i]);
          ASSERT_LE(err, 0x1.01p-8 * ref.adw[i] + ref.bdw[i] + 1e-30)
              << "dw[" << i << "] tau=" << tau << " g_ent=" << ent << ": " << got.dw[i] << " vs "
              << ref.dw[i];
          worst_b = std::max(worst_b, err / (0x1.01p-8 * ref.adw[i] + ref.bdw[i] + 1e-30));
          if (ref.bdw[i] < 0x1p-12 * ref.adw[i]) worst_dw = std::max(worst_dw, err / ref.adw[i]);
        }
      }
  std::printf(
      "[linear_logprob_backward] max |got - ref| / A where B < 2^-12 A: dh %.3g (2^%.2f), dw %.3g "
      "(2^%.2f); max |got - ref| / (1.004 2^-8 A + B) = %.3g\n",
      worst_dh, std::log2(worst_dh), worst_dw, std::log2(worst_dw), worst_b);
}

// The fp64 oracle's dh / dW against central differences of its own forward value
// f = Σ_t g_lp·logp_t + g_ent·entropy_t (h and W perturbed in double): relative 1e-6. The
// difference quotient is Richardson-extrapolated from steps 1e-3 and 5e-4 (truncation O(step⁴),
// rounding ~1e-16·|f| / step): worst 4e-8 over test seeds 1 … 200. A single central difference at
// step 1e-5 (rounding ~1e-16·|f| / 1e-5, against the 1e-3 floor) reached 1.2e-6 for one seed in 60.
TEST(LogprobBackward, OracleMatchesFiniteDifferences) {
  auto g = test::rng(17);
  Problem p = make_problem(6, 12, 50, make_cfg(8, 2), 0.8f, true, g);
  std::vector<char> in_order(size_t(p.T), 1);
  std::vector<double> hd = as_double(p.h), wd = as_double(p.w);
  const Oracle ref = oracle(p, hd, wd, in_order);
  double worst = 0;
  auto check = [&](std::vector<double>& x, size_t i, double analytic) {
    const double save = x[i];
    auto central = [&](double step) {
      x[i] = save + step;
      const double fp = oracle(p, hd, wd, in_order).f;
      x[i] = save - step;
      const double fm = oracle(p, hd, wd, in_order).f;
      x[i] = save;
      return (fp - fm) / (2 * step);
    };
    const double fd = (4 * central(5e-4) - central(1e-3)) / 3;
    const double err = std::fabs(fd - analytic) / (std::fabs(analytic) + 1e-3);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-6) << "fd " << fd << " analytic " << analytic;
  };
  for (size_t i = 0; i < hd.size(); i += 5) check(hd, i, ref.dh[i]);
  for (size_t i = 0; i < wd.size(); i += 37) check(wd, i, ref.dw[i]);
  std::printf("[linear_logprob_backward] oracle vs central differences: max rel error %.3g\n",
              worst);
}

// ---- special values, outputs, errors -----------------------------------------------------------

// A NaN in h row t: that row's dh is canonical NaN, the other rows' dh are unchanged (bitwise vs
// the same batch with row t finite), and dW is NaN everywhere (its block's G row is NaN). An
// ignored target's g_lp is not used (NaN there changes nothing). All-zero upstream gradients give
// dh = +0 and leave nonzero dW entries unchanged.
TEST(LogprobBackward, SpecialValues) {
  auto g = test::rng(19);
  Problem p = make_problem(17, 16, 100, make_cfg(8, 2), 1.0f, true, g);
  TokenOrder order = TokenOrder::make("test", {{0, 0, p.T}}, p.T);
  const std::vector<float> dw0 = random_dw(p, g);
  const Grads ref = run_op(p, order, dw0);

  Problem q = p;
  q.h = Tensor(DType::kBF16, {p.T, p.H});
  std::memcpy(q.h.data(), p.h.data(), size_t(p.h.nbytes()));
  q.h.ptr<bf16>()[5 * p.H + 3] = bf16{0x7fc1};
  run_forward(q);
  const Grads nan = run_op(q, order, dw0);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t j = 0; j < p.H; ++j) {
      const float got = nan.dh[size_t(t * p.H + j)];
      if (t == 5)
        ASSERT_EQ(f32_bits(got), kCanonNanF32) << j;
      else
        ASSERT_EQ(f32_bits(got), f32_bits(ref.dh[size_t(t * p.H + j)])) << t << " " << j;
    }
  for (float d : nan.dw) ASSERT_EQ(f32_bits(d), kCanonNanF32);

  // Ignored target (row 3 of make_problem): NaN g_lp there == 0 there.
  ASSERT_EQ(p.targets[3], p.params.ignore_index);
  Problem r = p;
  r.g_lp[3] = std::nanf("");
  EXPECT_TRUE(grads_equal(run_op(r, order, dw0), ref));

  // No upstream gradient: dh = +0, dW unchanged.
  Problem z = p;
  std::fill(z.g_lp.begin(), z.g_lp.end(), 0.0f);
  std::fill(z.g_ent.begin(), z.g_ent.end(), 0.0f);
  const Grads zero = run_op(z, order, dw0);
  for (float d : zero.dh) ASSERT_EQ(f32_bits(d), 0u);
  EXPECT_TRUE(test::bitwise_equal(zero.dw, dw0));
}

// Strided views (h, W, dh, dW rows inside wider buffers; targets / lse / g_lp with stride 2), i32
// targets: the same bits; dh's gaps untouched; every dh element written (poisoned before).
TEST(LogprobBackward, StridedViewsAndI32Targets) {
  auto g = test::rng(23);
  Problem p = make_problem(33, 24, 90, make_cfg(16, 2, 2), 1.2f, true, g);
  TokenOrder order = TokenOrder::make("test", {{1, 0, 20}, {0, 21, 12}}, p.T);
  const std::vector<float> dw0 = random_dw(p, g);
  const Grads ref = run_op(p, order, dw0);
  const int64_t T = p.T, H = p.H, V = p.V, ld = H + 8;
  Tensor hb = test::random_bf16({T, ld}, g), wb = test::random_bf16({V, ld}, g);
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(hb.ptr<bf16>() + t * ld, p.h.ptr<bf16>() + t * H, size_t(H) * 2);
  for (int64_t v = 0; v < V; ++v)
    std::memcpy(wb.ptr<bf16>() + v * ld, p.w.ptr<bf16>() + v * H, size_t(H) * 2);
  auto strided = [](void* data, DType dt, int64_t r, int64_t c, int64_t s) {
    TensorView v = TensorView::contiguous(data, dt, {r, c});
    v.stride[0] = s;
    return v;
  };
  auto every2 = [](std::vector<float>& src, std::vector<float>& buf) {
    buf.assign(src.size() * 2, -7.0f);
    for (size_t i = 0; i < src.size(); ++i) buf[2 * i] = src[i];
    TensorView v = TensorView::contiguous(buf.data(), DType::kF32, {int64_t(src.size())});
    v.stride[0] = 2;
    return v;
  };
  std::vector<float> b1, b2, b3, b4;
  Tensor t32(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) t32.ptr<int32_t>()[t] = int32_t(p.targets[size_t(t)]);
  Tensor dhb = test::poisoned(DType::kF32, {T, ld});
  std::vector<float> dwb(size_t(V * ld), 5.0f);
  for (int64_t v = 0; v < V; ++v) std::copy_n(dw0.data() + v * H, H, dwb.data() + v * ld);
  TensorView ge = every2(p.g_ent, b4);
  cpu::linear_logprob_backward(strided(hb.data(), DType::kBF16, T, H, ld),
                               strided(wb.data(), DType::kBF16, V, H, ld), t32.view(), p.params,
                               p.cfg, every2(p.lse, b1), every2(p.entropy, b2), every2(p.g_lp, b3),
                               &ge, strided(dhb.data(), DType::kF32, T, H, ld), order,
                               strided(dwb.data(), DType::kF32, V, H, ld));
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_BITWISE_EQ(dhb.ptr<float>() + t * ld, ref.dh.data() + t * H, H, DType::kF32);
    for (int64_t j = H; j < ld; ++j) ASSERT_EQ(f32_bits(dhb.ptr<float>()[t * ld + j]), 0xA5A5A5A5u);
  }
  for (int64_t v = 0; v < V; ++v) {
    ASSERT_BITWISE_EQ(dwb.data() + v * ld, ref.dw.data() + v * H, H, DType::kF32);
    for (int64_t j = H; j < ld; ++j) ASSERT_EQ(dwb[size_t(v * ld + j)], 5.0f);
  }
}

TEST(LogprobBackward, Errors) {
  auto g = test::rng(29);
  Problem p = make_problem(4, 8, 30, make_cfg(8, 2), 1.0f, true, g);
  const int64_t T = p.T, H = p.H, V = p.V;
  TokenOrder order = TokenOrder::make("test", {{0, 0, T}}, T);
  Tensor tg = i64_tensor(p.targets);
  Tensor dh = test::poisoned(DType::kF32, {T, H});
  Tensor dw = test::poisoned(DType::kF32, {V, H});
  TensorView lse = f32_view(p.lse), ent = f32_view(p.entropy), glp = f32_view(p.g_lp),
             gent = f32_view(p.g_ent);
  struct Args {
    TensorView h, w, targets, lse, entropy, g_lp, dh, dw;
    const TensorView* g_ent;
    LogprobParams params;
    ContractConfig cfg;
    TokenOrder order;
  };
  const Args good{p.h.view(), p.w.view(), tg.view(), lse,      ent,   glp,
                  dh.view(),  dw.view(),  &gent,     p.params, p.cfg, order};
  auto call = [](const Args& a) {
    cpu::linear_logprob_backward(a.h, a.w, a.targets, a.params, a.cfg, a.lse, a.entropy, a.g_lp,
                                 a.g_ent, a.dh, a.order, a.dw);
  };
  const char* op = "linear_logprob_backward";
  Tensor h_f32(DType::kF32, {T, H}), w_bad(DType::kBF16, {V, H + 1}), dh_bad(DType::kF32, {T, 3});
  Tensor dw_bf(DType::kBF16, {V, H}), short_f(DType::kF32, {T - 1});
  Tensor bad_tg = i64_tensor({0, 30, 1, 2});
  Args a = good;
  a.h = h_f32.view();
  test::expect_error([&] { call(a); }, {op, "'h'"});
  a = good;
  a.w = w_bad.view();
  test::expect_error([&] { call(a); }, {op, "'w'"});
  a = good;
  a.targets = bad_tg.view();
  test::expect_error([&] { call(a); }, {op, "targets[1] = 30"});
  a = good;
  a.lse = short_f.view();
  test::expect_error([&] { call(a); }, {op, "'lse'"});
  a = good;
  a.entropy = short_f.view();
  test::expect_error([&] { call(a); }, {op, "'entropy'"});
  a = good;
  a.g_lp = short_f.view();
  test::expect_error([&] { call(a); }, {op, "'g_lp'"});
  TensorView sf = short_f.view();
  a = good;
  a.g_ent = &sf;
  test::expect_error([&] { call(a); }, {op, "'g_ent'"});
  a = good;
  a.dh = dh_bad.view();
  test::expect_error([&] { call(a); }, {op, "'dh'"});
  a = good;
  a.dw = dw_bf.view();
  test::expect_error([&] { call(a); }, {op, "'dw'"});
  a = good;
  a.order = TokenOrder::make("test", {{0, 0, T}}, T + 1);
  test::expect_error([&] { call(a); }, {op, "'order'"});
  a = good;
  a.params.temperature = 0.0f;
  test::expect_error([&] { call(a); }, {"temperature"});
  a = good;
  a.cfg.vocab_segments = 3;
  test::expect_error([&] { call(a); }, {"vocab_segments"});
  a = good;
  a.dh = TensorView::contiguous(p.h.data(), DType::kF32, {T, H});
  a.dh.stride[0] = 0;  // a [T, H] f32 view over the first H·4 bytes of h
  test::expect_error([&] { call(a); }, {op, "'dh' overlaps 'h'"});
  a = good;
  a.dw = TensorView::contiguous(dh.data(), DType::kF32, {V, H});
  a.dw.stride[0] = 0;
  test::expect_error([&] { call(a); }, {op, "'dh' overlaps 'dw'"});
  for (int64_t i = 0; i < dh.numel(); ++i) ASSERT_EQ(f32_bits(dh.ptr<float>()[i]), 0xA5A5A5A5u);
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_EQ(f32_bits(dw.ptr<float>()[i]), 0xA5A5A5A5u);
  // T = 0: nothing to do.
  Tensor h0(DType::kBF16, {0, H}), t0(DType::kI64, {0}), f0(DType::kF32, {0}),
      dh0(DType::kF32, {0, H});
  a = good;
  a.h = h0.view();
  a.targets = t0.view();
  a.lse = a.entropy = a.g_lp = f0.view();
  TensorView f0v = f0.view();
  a.g_ent = &f0v;
  a.dh = dh0.view();
  a.order = TokenOrder::make("test", {}, 0);
  call(a);
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_EQ(f32_bits(dw.ptr<float>()[i]), 0xA5A5A5A5u);
}

}  // namespace
}  // namespace lockstep
