// The decomposition the CUDA linear log-prob backward uses (src/cuda/backward/logprob.cu,
// docs/contract.md §B.8 "CUDA form"), written with the CPU ops, equals cpu::linear_logprob_backward
// bit for bit: token chunks of consecutive canonical blocks (sequences cut between blocks, each
// chunk with its own TokenOrder, rows gathered), per vocab segment and slice (a multiple of 16
// entries) the forward's logits GEMM on [rows × columns] blocks, dh's segment value as B.3's
// weight-gradient chain with the entries as tokens (gemm_bf16_dw on Gᵀ and W's rows, from +0,
// continued slice by slice), dW by gemm_bf16_dw per slice, dh = gemm_tree_combine of the segment
// values. Negative control: slices that are not a multiple of 16 change dh.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/math.h"
#include "lockstep/ops/backward.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

struct Piece {
  int64_t src, n;
  bool in_order;
  int64_t seq;
};
struct Chunk {
  std::vector<Piece> pieces;
  int64_t rows = 0;
};

// As the CUDA launcher: canonical blocks, then uncovered rows in runs of <= 16, cut into chunks.
std::vector<Chunk> make_chunks(const TokenOrder& order, int64_t T, int64_t max_rows) {
  std::vector<Piece> blocks;
  std::vector<char> covered(static_cast<size_t>(T), 0);
  const auto seqs = order.seqs();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const TokenSeq& s = seqs[i];
    for (int64_t p = 0; p < s.len; p += kTokenBlock)
      blocks.push_back({s.row + p, std::min<int64_t>(kTokenBlock, s.len - p), true, int64_t(i)});
    std::fill(covered.begin() + s.row, covered.begin() + s.row + s.len, char(1));
  }
  for (int64_t r = 0; r < T;) {
    if (covered[size_t(r)]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < T && !covered[size_t(e)] && e - r < kTokenBlock) ++e;
    blocks.push_back({r, e - r, false, -1});
    r = e;
  }
  std::vector<Chunk> chunks;
  for (const Piece& b : blocks) {
    if (chunks.empty() || chunks.back().rows + b.n > max_rows) chunks.push_back({});
    Chunk& c = chunks.back();
    Piece* last = c.pieces.empty() ? nullptr : &c.pieces.back();
    if (last && last->in_order == b.in_order && last->seq == b.seq && last->src + last->n == b.src)
      last->n += b.n;
    else
      c.pieces.push_back(b);
    c.rows += b.n;
  }
  return chunks;
}

struct Problem {
  int64_t T = 0, H = 0, V = 0;
  ContractConfig cfg;
  LogprobParams params;
  std::vector<bf16> h, w;
  std::vector<int64_t> tg;
  std::vector<float> g_lp, g_ent, lse, ent, dw0;
  std::vector<TokenSeq> seqs;
};

Problem make_problem() {
  Problem p;
  std::mt19937_64 g(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  p.H = 37;
  p.V = 1000;
  p.cfg.vocab_tile = 24;  // seg_len = 264 = 8 mod 16
  p.cfg.vocab_segments = 4;
  p.cfg.gemm_segments = 2;
  p.params.temperature = 0.7f;
  const std::vector<int64_t> lens = {5, 40, 1, 17, 33, 2, 12};
  int64_t row = 2;
  for (int i : {3, 0, 6, 1, 5, 2, 4}) {  // shuffled packing, padding rows between
    p.seqs.push_back({int64_t(i), row, lens[size_t(i)]});
    row += lens[size_t(i)] + 1 + i % 3;
  }
  p.T = row + 3;
  const size_t T = size_t(p.T);
  p.h.resize(T * size_t(p.H));
  p.w.resize(size_t(p.V * p.H));
  for (auto& x : p.h) x = f32_to_bf16(nd(g));
  for (auto& x : p.w) x = f32_to_bf16(0.2f * nd(g));
  p.tg.resize(T);
  p.g_lp.resize(T);
  p.g_ent.resize(T);
  for (size_t t = 0; t < T; ++t) {
    p.tg[t] = g() % 9 == 0 ? p.params.ignore_index : int64_t(g() % uint64_t(p.V));
    p.g_lp[t] = nd(g);
    p.g_ent[t] = nd(g);
  }
  p.lse.resize(T);
  p.ent.resize(T);
  std::vector<float> logp(T);
  cpu::linear_logprob(TensorView::contiguous(p.h.data(), DType::kBF16, {p.T, p.H}),
                      TensorView::contiguous(p.w.data(), DType::kBF16, {p.V, p.H}),
                      TensorView::contiguous(p.tg.data(), DType::kI64, {p.T}), p.params, p.cfg,
                      TensorView::contiguous(logp.data(), DType::kF32, {p.T}),
                      TensorView::contiguous(p.lse.data(), DType::kF32, {p.T}),
                      TensorView::contiguous(p.ent.data(), DType::kF32, {p.T}));
  p.dw0.resize(size_t(p.V * p.H));
  for (auto& x : p.dw0) x = 0.1f * nd(g);
  return p;
}

struct Grads {
  std::vector<float> dh, dw;
};

Grads run_op(const Problem& p, bool with_ent) {
  Grads r{std::vector<float>(size_t(p.T * p.H)), p.dw0};
  const TensorView ge =
      TensorView::contiguous(const_cast<float*>(p.g_ent.data()), DType::kF32, {p.T});
  auto vec = [&](const std::vector<float>& v) {
    return TensorView::contiguous(const_cast<float*>(v.data()), DType::kF32, {p.T});
  };
  cpu::linear_logprob_backward(
      TensorView::contiguous(const_cast<bf16*>(p.h.data()), DType::kBF16, {p.T, p.H}),
      TensorView::contiguous(const_cast<bf16*>(p.w.data()), DType::kBF16, {p.V, p.H}),
      TensorView::contiguous(const_cast<int64_t*>(p.tg.data()), DType::kI64, {p.T}), p.params,
      p.cfg, vec(p.lse), vec(p.ent), vec(p.g_lp), with_ent ? &ge : nullptr,
      TensorView::contiguous(r.dh.data(), DType::kF32, {p.T, p.H}),
      TokenOrder::make("test", p.seqs, p.T),
      TensorView::contiguous(r.dw.data(), DType::kF32, {p.V, p.H}));
  return r;
}

// G of one entry: §B.8 (the CUDA kernel's arithmetic).
bf16 entry(const Problem& p, float z, int64_t v, int64_t t, bool with_ent) {
  const float tau = p.params.temperature, lse = p.lse[size_t(t)];
  const float mu = lse - p.ent[size_t(t)];
  const bool ignored = p.tg[size_t(t)] == p.params.ignore_index;
  const float y = z / tau;
  const float pr = ls_expf(y - lse);
  const float a = ignored ? 0.0f : p.g_lp[size_t(t)] * ((v == p.tg[size_t(t)] ? 1.0f : 0.0f) - pr);
  const float gy = with_ent ? a + p.g_ent[size_t(t)] * (pr * (mu - y)) : a;
  return f32_to_bf16(gy / tau);
}

// The CUDA form with chunks of R rows, vocab slices of `slice` entries, logits blocks of zc.
Grads cuda_form(const Problem& p, bool with_ent, int64_t R, int64_t slice, int64_t zc) {
  const int64_t H = p.H, V = p.V;
  const LogprobVocabLayout lay = logprob_vocab_layout(p.cfg, V);
  const int S = lay.segments;
  const int64_t seg_len = lay.segment_len;
  const TensorView wv = TensorView::contiguous(const_cast<bf16*>(p.w.data()), DType::kBF16, {V, H});
  Grads r{std::vector<float>(size_t(p.T * H), -7.0f), p.dw0};
  const TensorView dwv = TensorView::contiguous(r.dw.data(), DType::kF32, {V, H});
  const TokenOrder order = TokenOrder::make("test", p.seqs, p.T);
  for (const Chunk& c : make_chunks(order, p.T, R)) {
    const int64_t rows = c.rows;
    std::vector<int64_t> rm;
    for (const Piece& q : c.pieces)
      for (int64_t i = 0; i < q.n; ++i) rm.push_back(q.src + i);
    std::vector<bf16> hx(size_t(rows * H));
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(&hx[size_t(i * H)], &p.h[size_t(rm[size_t(i)] * H)], size_t(H) * 2);
    const TensorView hxv = TensorView::contiguous(hx.data(), DType::kBF16, {rows, H});
    std::vector<TokenSeq> cs;
    int64_t at = 0;
    for (const Piece& q : c.pieces) {
      if (q.in_order) cs.push_back({int64_t(cs.size()), at, q.n});
      at += q.n;
    }
    const TokenOrder corder = TokenOrder::make("test", cs, rows);
    std::vector<std::vector<float>> parts(size_t(S), std::vector<float>(size_t(rows * H), 0.0f));
    for (int k = 0; k < S; ++k) {
      const int64_t nk = std::clamp<int64_t>(V - k * seg_len, 0, seg_len), v_seg = k * seg_len;
      const TensorView part =
          TensorView::contiguous(parts[size_t(k)].data(), DType::kF32, {rows, H});
      for (int64_t s0 = 0; s0 < nk; s0 += slice) {
        const int64_t ns = std::min(slice, nk - s0), v0 = v_seg + s0;
        std::vector<bf16> G(size_t(rows * slice)), Gt(size_t(slice * rows));
        for (int64_t e0 = 0; e0 < ns; e0 += zc) {
          const int64_t nc = std::min(zc, ns - e0);
          std::vector<float> z(size_t(rows * nc));
          cpu::gemm_bf16_nt(hxv, wv.rows(v0 + e0, v0 + e0 + nc), logprob_logits_gemm(p.cfg),
                            TensorView::contiguous(z.data(), DType::kF32, {rows, nc}));
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < nc; ++j) {
              const bf16 b = entry(p, z[size_t(i * nc + j)], v0 + e0 + j, rm[size_t(i)], with_ent);
              G[size_t(i * slice + e0 + j)] = b;
              Gt[size_t((e0 + j) * rows + i)] = b;
            }
        }
        cpu::gemm_bf16_dw(TensorView::contiguous(Gt.data(), DType::kBF16, {ns, rows}),
                          wv.rows(v0, v0 + ns), TokenOrder::make("test", {{0, 0, ns}}, ns), part);
        if (!corder.empty()) {
          TensorView dy = TensorView::contiguous(G.data(), DType::kBF16, {rows, ns});
          dy.stride[0] = slice;
          cpu::gemm_bf16_dw(dy, hxv, corder, dwv.rows(v0, v0 + ns));
        }
      }
    }
    std::vector<float> out(size_t(rows * H));
    std::vector<TensorView> pv;
    for (auto& q : parts) pv.push_back(TensorView::contiguous(q.data(), DType::kF32, {rows, H}));
    if (S > 1)
      cpu::gemm_tree_combine(pv, nullptr,
                             TensorView::contiguous(out.data(), DType::kF32, {rows, H}));
    else
      out = parts[0];
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(&r.dh[size_t(rm[size_t(i)] * H)], &out[size_t(i * H)], size_t(H) * 4);
  }
  return r;
}

TEST(LogprobBackwardCudaForm, ChunksSlicesAndTheWeightGradientFormOfDhGiveTheOpsBits) {
  const Problem p = make_problem();
  ASSERT_EQ(logprob_vocab_layout(p.cfg, p.V).segment_len % 16, 8);
  for (bool with_ent : {true, false}) {
    const Grads want = run_op(p, with_ent);
    for (int64_t R : {16, 48, 1024})
      for (int64_t slice : {16, 48, 272})
        for (int64_t zc : {16, 40}) {
          const Grads got = cuda_form(p, with_ent, R, slice, zc);
          EXPECT_TRUE(test::bitwise_equal(got.dh, want.dh))
              << "dh: g_ent=" << with_ent << " rows=" << R << " slice=" << slice << " zc=" << zc;
          EXPECT_TRUE(test::bitwise_equal(got.dw, want.dw))
              << "dw: g_ent=" << with_ent << " rows=" << R << " slice=" << slice << " zc=" << zc;
        }
  }
}

// Negative control: a slice of 24 entries restarts k-blocks off the 16-grid: dh differs.
TEST(LogprobBackwardCudaForm, SlicesOffTheKBlockGridChangeDh) {
  const Problem p = make_problem();
  const Grads want = run_op(p, true);
  const Grads got = cuda_form(p, true, 1024, 24, 16);
  EXPECT_FALSE(test::bitwise_equal(got.dh, want.dh));
  EXPECT_TRUE(test::bitwise_equal(got.dw, want.dw));
}

}  // namespace
}  // namespace lockstep
