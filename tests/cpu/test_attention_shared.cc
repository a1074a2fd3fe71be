// Attention over shared-prompt groups (docs/contract.md §B.11): attention_prefill_shared gives
// every row the bits of the unshared packing (prompt + completion as one sequence of
// attention_prefill_varlen); attention_backward_shared gives a completion's rows and keys the
// unshared bits, a prompt's rows their unshared dq, a prompt's keys the sum over its rows and all
// its completions' (one chain per element: with one completion and a prompt length that is a
// multiple of 16 every bit is the unshared one; otherwise within a stated tolerance of the sum of
// the unshared parts); the bits do not depend on the packing of the groups, the other groups or
// the thread count; bad metadata is refused with a clear lockstep::Error.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/backward.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

// Hq / Hkv query / kv heads, D head_dim.
struct Dims {
  int64_t Hq, Hkv, D;
};

// Rows of one segment: q, dout [n, Hq, D], k, v [n, Hkv, D].
struct Rows {
  int64_t n = 0;
  Tensor q, k, v, dout;
};

Rows make_rows(const Dims& d, int64_t n, std::mt19937_64& g) {
  return Rows{n, test::random_bf16({n, d.Hq, d.D}, g), test::random_bf16({n, d.Hkv, d.D}, g),
              test::random_bf16({n, d.Hkv, d.D}, g), test::random_bf16({n, d.Hq, d.D}, g)};
}

struct Group {
  Rows prompt;
  std::vector<Rows> completions;
};

Group make_group(const Dims& d, int64_t P, const std::vector<int64_t>& C, std::mt19937_64& g) {
  Group gr{make_rows(d, P, g), {}};
  for (int64_t c : C) gr.completions.push_back(make_rows(d, c, g));
  return gr;
}

// A packed call: the inputs, the forward's out / lse and the backward's dq / dk / dv.
struct Call {
  Dims d;
  int64_t T = 0;
  std::vector<int32_t> cu{0}, prompt_of;
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
  void alloc() {
    q = Tensor(DType::kBF16, {T, d.Hq, d.D});
    dout = Tensor(DType::kBF16, {T, d.Hq, d.D});
    k = Tensor(DType::kBF16, {T, d.Hkv, d.D});
    v = Tensor(DType::kBF16, {T, d.Hkv, d.D});
    out = test::poisoned(DType::kBF16, {T, d.Hq, d.D});
    lse = test::poisoned(DType::kF32, {T, d.Hq});
    dq = test::poisoned(DType::kF32, {T, d.Hq, d.D});
    dk = test::poisoned(DType::kF32, {T, d.Hkv, d.D});
    dv = test::poisoned(DType::kF32, {T, d.Hkv, d.D});
  }
  // Copies rows [0, r.n) of r to packed rows [row, row + r.n); zero_dout: dout +0 instead.
  void put(const Rows& r, int64_t row, bool zero_dout = false) {
    auto copy = [&](Tensor& dst, const Tensor& src) {
      const int64_t rb = dst.nbytes() / std::max<int64_t>(T, 1);
      std::memcpy(static_cast<char*>(dst.data()) + row * rb, src.data(), size_t(r.n * rb));
    };
    copy(q, r.q);
    copy(k, r.k);
    copy(v, r.v);
    if (zero_dout)
      std::memset(static_cast<char*>(dout.data()) + row * d.Hq * d.D * 2, 0,
                  size_t(r.n * d.Hq * d.D * 2));
    else
      copy(dout, r.dout);
  }
  TensorView cu_view() {
    return TensorView::contiguous(cu.data(), DType::kI32, {int64_t(cu.size())});
  }
  TensorView prompt_view() {
    return TensorView::contiguous(prompt_of.data(), DType::kI32, {int64_t(prompt_of.size())});
  }
};

// Where a group's segments sit in a shared call.
struct Placed {
  int64_t prompt_row = 0;
  std::vector<int64_t> completion_rows;
};

// The groups packed in `order` (prompt rows once, then each completion's), forward and backward.
Call run_shared(const Dims& d, const std::vector<const Group*>& groups, const AttentionConfig& cfg,
                std::vector<Placed>* placed) {
  Call c;
  c.d = d;
  for (const Group* g : groups) {
    c.T += g->prompt.n;
    for (const Rows& r : g->completions) c.T += r.n;
  }
  c.alloc();
  placed->assign(groups.size(), {});
  int64_t row = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = *groups[i];
    const int32_t ps = int32_t(c.prompt_of.size());
    (*placed)[i].prompt_row = row;
    c.put(g.prompt, row);
    row += g.prompt.n;
    c.cu.push_back(int32_t(row));
    c.prompt_of.push_back(-1);
    for (const Rows& r : g.completions) {
      (*placed)[i].completion_rows.push_back(row);
      c.put(r, row);
      row += r.n;
      c.cu.push_back(int32_t(row));
      c.prompt_of.push_back(ps);
    }
  }
  const SharedPromptSeqs segs =
      SharedPromptSeqs::validate("test", c.cu_view(), c.prompt_view(), c.T);
  cpu::attention_prefill_shared(c.q.view(), c.k.view(), c.v.view(), segs, cfg, c.out.view(),
                                c.lse.view());
  cpu::attention_backward_shared(c.q.view(), c.k.view(), c.v.view(), c.out.view(), c.lse.view(),
                                 c.dout.view(), segs, cfg, c.dq.view(), c.dk.view(), c.dv.view());
  return c;
}

// The unshared sequence prompt + completion `ci` of g alone (prompt rows 0 .. P-1, completion
// rows P ..), forward and backward; prompt_dout: the prompt rows carry the prompt's dout (else +0).
Call run_unshared(const Dims& d, const Group& g, size_t ci, const AttentionConfig& cfg,
                  bool prompt_dout) {
  Call c;
  c.d = d;
  c.T = g.prompt.n + g.completions[ci].n;
  c.alloc();
  c.put(g.prompt, 0, !prompt_dout);
  c.put(g.completions[ci], g.prompt.n);
  c.cu.push_back(int32_t(c.T));
  cpu::attention_prefill_varlen(c.q.view(), c.k.view(), c.v.view(), c.cu_view(), cfg, c.out.view(),
                                c.lse.view());
  const PackedSeqs seqs = PackedSeqs::validate("test", c.cu_view(), c.T);
  cpu::attention_backward_varlen(c.q.view(), c.k.view(), c.v.view(), c.out.view(), c.lse.view(),
                                 c.dout.view(), seqs, cfg, c.dq.view(), c.dk.view(), c.dv.view());
  return c;
}

// Rows [r0, r0 + n) of a contiguous tensor, as raw bytes.
std::vector<uint8_t> rows(const Tensor& t, int64_t r0, int64_t n) {
  const int64_t rb = t.nbytes() / std::max<int64_t>(t.shape()[0], 1);
  const auto* p = static_cast<const uint8_t*>(t.data()) + r0 * rb;
  return std::vector<uint8_t>(p, p + n * rb);
}

::testing::AssertionResult same_rows(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb,
                                     int64_t n) {
  const std::vector<uint8_t> x = rows(a, ra, n), y = rows(b, rb, n);
  const int64_t elems = int64_t(x.size()) / dtype_size(a.dtype());
  return test::bitwise_equal(x.data(), y.data(), elems, a.dtype());
}

struct Case {
  Dims d;
  int64_t P;
  std::vector<int64_t> C;
  int kv_chunk;
  AttentionConfig cfg() const {
    AttentionConfig a;
    a.kv_chunk = kv_chunk;
    return a;
  }
};

// A case's group, packed after `before` (other groups) in one shared call.
struct CaseRun {
  Group gr;
  std::vector<Placed> at;
  Call s;
  const Placed& placed() const { return at.back(); }
};
CaseRun run_case(const Case& cs, std::mt19937_64& g, const std::vector<const Group*>& before = {}) {
  CaseRun r{make_group(cs.d, cs.P, cs.C, g), {}, {}};
  std::vector<const Group*> all = before;
  all.push_back(&r.gr);
  r.s = run_shared(cs.d, all, cs.cfg(), &r.at);
  return r;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{8, 2, 64}, 100, {1, 15, 70}, 64}, {{4, 4, 32}, 17, {3}, 1024},
      {{2, 1, 16}, 1, {64, 5, 130}, 64},  {{4, 2, 128}, 130, {17, 64}, 128},
      {{8, 4, 48}, 64, {1, 1, 1, 1}, 64}, {{2, 2, 16}, 200, {33}, 64},
      {{2, 1, 16}, 0, {5, 70}, 64},      // an empty prompt: its completions stand alone
      {{4, 2, 32}, 40, {7, 0, 19}, 64},  // an empty completion
  };
  return c;
}

TEST(AttentionShared, ForwardRowsAreTheUnsharedRows) {
  auto g = test::rng(1);
  for (const Case& cs : cases()) {
    const Group other = make_group(cs.d, 23, {9, 40}, g);
    const CaseRun r = run_case(cs, g, {&other});
    const Placed& at = r.placed();
    for (size_t c = 0; c < cs.C.size(); ++c) {
      const Call u = run_unshared(cs.d, r.gr, c, cs.cfg(), true);
      SCOPED_TRACE("P=" + std::to_string(cs.P) + " completion " + std::to_string(c));
      EXPECT_TRUE(same_rows(r.s.out, at.prompt_row, u.out, 0, cs.P)) << "prompt out";
      EXPECT_TRUE(same_rows(r.s.lse, at.prompt_row, u.lse, 0, cs.P)) << "prompt lse";
      EXPECT_TRUE(same_rows(r.s.out, at.completion_rows[c], u.out, cs.P, cs.C[c]))
          << "completion out";
      EXPECT_TRUE(same_rows(r.s.lse, at.completion_rows[c], u.lse, cs.P, cs.C[c]))
          << "completion lse";
    }
  }
}

TEST(AttentionShared, BackwardOfOneCompletionIsUnsharedWhenThePromptFillsKBlocks) {
  auto g = test::rng(2);
  for (const Dims& d : {Dims{8, 2, 64}, Dims{4, 4, 32}, Dims{6, 2, 16}}) {
    for (int64_t P : {16, 64, 80, 128}) {
      for (int64_t C : {1, 17, 70}) {
        AttentionConfig cfg;
        cfg.kv_chunk = 64;
        const Group gr = make_group(d, P, {C}, g);
        std::vector<Placed> at;
        const Call s = run_shared(d, {&gr}, cfg, &at);
        const Call u = run_unshared(d, gr, 0, cfg, true);
        SCOPED_TRACE("P=" + std::to_string(P) + " C=" + std::to_string(C));
        EXPECT_TRUE(same_rows(s.dq, 0, u.dq, 0, P + C)) << "dq";
        EXPECT_TRUE(same_rows(s.dk, 0, u.dk, 0, P + C)) << "dk";
        EXPECT_TRUE(same_rows(s.dv, 0, u.dv, 0, P + C)) << "dv";
      }
    }
  }
}

TEST(AttentionShared, CompletionRowsAndKeysAndPromptDqAreUnshared) {
  auto g = test::rng(3);
  for (const Case& cs : cases()) {
    const CaseRun run = run_case(cs, g);
    const Call& s = run.s;
    for (size_t c = 0; c < cs.C.size(); ++c) {
      SCOPED_TRACE("P=" + std::to_string(cs.P) + " completion " + std::to_string(c));
      const Call u = run_unshared(cs.d, run.gr, c, cs.cfg(), true);
      const int64_t r = run.placed().completion_rows[c];
      EXPECT_TRUE(same_rows(s.dq, r, u.dq, cs.P, cs.C[c])) << "completion dq";
      EXPECT_TRUE(same_rows(s.dk, r, u.dk, cs.P, cs.C[c])) << "completion dk";
      EXPECT_TRUE(same_rows(s.dv, r, u.dv, cs.P, cs.C[c])) << "completion dv";
      EXPECT_TRUE(same_rows(s.dq, 0, u.dq, 0, cs.P)) << "prompt dq";
    }
  }
}

// A prompt key's dk / dv = the prompt rows' part (the unshared sequence 0 with the prompt's dout)
// plus each other completion's part (unshared sequences with the prompt's dout +0): the same sum in
// one chain, so equal within the chain's truncation (measured ~1e-6 of the largest value; the
// bound 2^-16 is far below the bf16 roundings of P and dS that §B.9's 2^-6 accuracy covers).
TEST(AttentionShared, PromptKeysSumTheCompletionsParts) {
  auto g = test::rng(4);
  double worst = 0;
  for (const Case& cs : cases()) {
    if (cs.C.size() < 2 || cs.P == 0) continue;
    const CaseRun run = run_case(cs, g);
    const Call& s = run.s;
    const int64_t n = cs.P * cs.d.Hkv * cs.d.D;
    std::vector<double> sk(size_t(n), 0.0), sv(size_t(n), 0.0);
    for (size_t c = 0; c < cs.C.size(); ++c) {
      const Call u = run_unshared(cs.d, run.gr, c, cs.cfg(), c == 0);
      for (int64_t i = 0; i < n; ++i) {
        sk[size_t(i)] += double(u.dk.ptr<float>()[i]);
        sv[size_t(i)] += double(u.dv.ptr<float>()[i]);
      }
    }
    for (auto [got, ref, name] :
         {std::tuple{s.dk.ptr<float>(), &sk, "dk"}, std::tuple{s.dv.ptr<float>(), &sv, "dv"}}) {
      double mx = 0, err = 0;
      for (int64_t i = 0; i < n; ++i) {
        mx = std::max(mx, std::fabs((*ref)[size_t(i)]));
        err = std::max(err, std::fabs(double(got[i]) - (*ref)[size_t(i)]));
      }
      ASSERT_GT(mx, 0.0);
      EXPECT_LT(err / mx, 0x1p-16) << name << " P=" << cs.P;
      worst = std::max(worst, err / mx);
    }
  }
  std::printf("[shared attention] prompt keys vs the sum of the unshared parts: %.3g\n", worst);
  EXPECT_GT(worst, 0.0) << "the sums should round differently from the unshared parts";
}

TEST(AttentionShared, GroupPackingOtherGroupsAndThreadsDoNotChangeBits) {
  auto g = test::rng(5);
  const Dims d{8, 2, 32};
  AttentionConfig cfg;
  cfg.kv_chunk = 64;
  const Group a = make_group(d, 77, {5, 64, 20}, g);
  const Group b = make_group(d, 16, {100}, g);
  const Group c = make_group(d, 3, {1, 2}, g);
  const int saved = num_threads();
  std::vector<Call> runs;
  std::vector<std::vector<Placed>> where;
  const std::vector<std::vector<const Group*>> packings = {{&a}, {&b, &a, &c}, {&c, &a}, {&a}};
  for (size_t i = 0; i < packings.size(); ++i) {
    set_num_threads(i == 1 ? 1 : 3);
    where.emplace_back();
    runs.push_back(run_shared(d, packings[i], cfg, &where.back()));
  }
  set_num_threads(saved);
  const int64_t rows_a = 77 + 5 + 64 + 20;
  const std::vector<size_t> pos_a = {0, 1, 1, 0};  // a's index in each packing
  for (size_t i = 1; i < runs.size(); ++i) {
    const int64_t r = where[i][pos_a[i]].prompt_row;
    SCOPED_TRACE("packing " + std::to_string(i));
    for (auto [x, y] : {std::pair{&runs[0].out, &runs[i].out},
                        {&runs[0].lse, &runs[i].lse},
                        {&runs[0].dq, &runs[i].dq},
                        {&runs[0].dk, &runs[i].dk},
                        {&runs[0].dv, &runs[i].dv}})
      EXPECT_TRUE(same_rows(*x, 0, *y, r, rows_a));
  }
}

const auto expect_error = test::expect_error_mentioning;

TEST(AttentionShared, BadMetadataIsRefused) {
  std::vector<int32_t> cu = {0, 4, 6, 9};
  auto cu_v = TensorView::contiguous(cu.data(), DType::kI32, {4});
  auto check = [&](std::vector<int32_t> po, const std::string& needle) {
    auto v = TensorView::contiguous(po.data(), DType::kI32, {int64_t(po.size())});
    expect_error([&] { SharedPromptSeqs::validate("op_x", cu_v, v, 9); }, needle);
    expect_error([&] { SharedPromptSeqs::validate("op_x", cu_v, v, 9); }, "op_x");
  };
  check({-1, 0, 3}, "prompt_of[2] = 3 is outside [-1, B = 3)");
  check({-1, -2, 0}, "prompt_of[1] = -2 is outside");
  check({-1, 1, 0}, "prompt_of[1] = 1: a segment cannot be its own prompt");
  check({-1, 0, 1}, "prompt_of[2] = 1 names a completion (prompt_of[1] = 0)");
  check({-1, 0}, "argument 'prompt_of'");
  std::vector<int64_t> wide = {-1, 0, 0};
  expect_error(
      [&] {
        SharedPromptSeqs::validate("op_x", cu_v,
                                   TensorView::contiguous(wide.data(), DType::kI64, {3}), 9);
      },
      "prompt_of");
  std::vector<int32_t> ok = {-1, 0, 0};
  auto ok_v = TensorView::contiguous(ok.data(), DType::kI32, {3});
  expect_error([&] { SharedPromptSeqs::validate("op_x", cu_v, ok_v, 10); }, "cu_seqlens[B]");
  std::vector<int32_t> bad_cu = {0, 5, 4, 9};
  expect_error(
      [&] {
        SharedPromptSeqs::validate("op_x", TensorView::contiguous(bad_cu.data(), DType::kI32, {4}),
                                   ok_v, 9);
      },
      "non-decreasing");
  // The ops check their tensors against the validated segments.
  const SharedPromptSeqs segs = SharedPromptSeqs::validate("test", cu_v, ok_v, 9);
  EXPECT_EQ(segs.first_position(2), 4);
  EXPECT_EQ(segs.completions(0).size(), 2u);
  auto g = test::rng(6);
  const Tensor q = test::random_bf16({9, 4, 16}, g), k = test::random_bf16({9, 2, 16}, g);
  const Tensor q8 = test::random_bf16({8, 4, 16}, g);
  Tensor out(DType::kBF16, {9, 4, 16}), lse(DType::kF32, {9, 4});
  AttentionConfig cfg;
  expect_error(
      [&] {
        cpu::attention_prefill_shared(q8.view(), k.view(), k.view(), segs, cfg, out.view(),
                                      lse.view());
      },
      "attention_prefill_shared");
  cpu::attention_prefill_shared(q.view(), k.view(), k.view(), segs, cfg, out.view(), lse.view());
  Tensor dq(DType::kF32, {9, 4, 16}), dk(DType::kF32, {9, 2, 16}), dv(DType::kF32, {9, 2, 16});
  Tensor dk_bad(DType::kF32, {9, 4, 16});
  expect_error(
      [&] {
        cpu::attention_backward_shared(q.view(), k.view(), k.view(), out.view(), lse.view(),
                                       q.view(), segs, cfg, dq.view(), dk_bad.view(), dv.view());
      },
      "attention_backward_shared");
  expect_error(
      [&] {
        cpu::attention_backward_shared(q.view(), k.view(), k.view(), out.view(), TensorView{},
                                       q.view(), segs, cfg, dq.view(), dk.view(), dv.view());
      },
      "'lse' is required");
}

}  // namespace
}  // namespace lockstep
