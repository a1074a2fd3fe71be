// The Qwen3 model on the invariant backend: a token's hidden state and log-prob have the same bits
// whether it is computed alone or packed with others, by token-by-token decode through a paged
// cache (any page size, split-KV, cascade), by chunked prefill (any schedule), at tp = 1, 2, 4, or
// with any thread count; accuracy vs an fp64 oracle of the plain Qwen3 math; clear errors.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "dist/thread_transport.h"
#include "engine/default_model.h"
#include "engine/model.h"
#include "engine/rollout_test_util.h"
#include "engine/safetensors.h"
#include "lockstep/dist/communicator.h"
#include "lockstep/error.h"
#include "lockstep/ops/gemm.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

using test::bitwise_equal;

// --- test models ---

// V=300 H=64 I=96 L=2 Hq=4 Hkv=2 D=16, untied (tests/engine/rollout_test_util.h).
Qwen3Config small_config() { return test_util::small_untied_config(); }

// V=257 H=48 I=80 L=2 Hq=8 Hkv=1 D=32, tied: one kv head replicated on every tp rank.
Qwen3Config gqa_config() {
  Qwen3Config c = small_config();
  c.vocab_size = 257;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 1;
  c.head_dim = 32;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  return c;
}

ContractConfig test_contract() {
  ContractConfig k;
  k.gemm_segments = 4;
  k.kv_chunk = 64;  // short chunks so test sequences span several
  k.vocab_tile = 64;
  k.vocab_segments = 4;
  return k;
}

struct TestModel {
  Qwen3Config cfg;
  Weights weights;
  std::map<std::string, TensorView> views;
};

TestModel make_weights(const Qwen3Config& cfg, uint64_t seed) {
  TestModel m;
  m.cfg = cfg;
  m.weights = random_qwen3_weights(cfg, seed);
  for (auto& [name, t] : m.weights) m.views[name] = t.view();
  return m;
}

std::unique_ptr<Model> make_model(const TestModel& tm, int tp = 1,
                                  ContractConfig contract = test_contract()) {
  ModelOptions opt;
  opt.contract = contract;
  opt.tp = tp;
  return std::make_unique<Model>(tm.cfg, tm.views, opt, make_invariant_backend());
}

std::vector<int32_t> random_tokens(int64_t n, int64_t V, std::mt19937_64& g) {
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(g);
  return t;
}

TensorView i32_view(std::vector<int32_t>& v) {
  return TensorView::contiguous(v.data(), DType::kI32, {int64_t(v.size())});
}

// Hidden states of sequences packed in the given order: result[s] = [len_s, H] of sequence s.
std::vector<std::vector<bf16>> packed_hidden(const Model& m,
                                             const std::vector<std::vector<int32_t>>& seqs,
                                             const std::vector<int>& order) {
  const int64_t H = m.config().hidden_size;
  std::vector<int32_t> tokens, cu{0};
  for (int s : order) {
    tokens.insert(tokens.end(), seqs[size_t(s)].begin(), seqs[size_t(s)].end());
    cu.push_back(int32_t(tokens.size()));
  }
  Tensor out = test::poisoned(DType::kBF16, {int64_t(tokens.size()), H});
  m.forward_packed(i32_view(tokens), i32_view(cu), out.view());
  std::vector<std::vector<bf16>> res(seqs.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const bf16* p = out.ptr<bf16>() + int64_t(cu[i]) * H;
    res[size_t(order[i])].assign(p, p + (cu[i + 1] - cu[i]) * H);
  }
  return res;
}

// --- a paged cache driven like a rollout engine ---

struct PagedCache {
  int64_t NP, P, MP, S;
  std::vector<Tensor> k, v;
  Tensor block_table, seq_lens;
  std::vector<int32_t> free_pages;
  // prefix sharing
  std::optional<Tensor> pbt, shared_len, seq_group;

  // kv_heads: the heads per layer the model's cache holds (-1: all, cfg.num_key_value_heads).
  PagedCache(const Qwen3Config& cfg, int64_t num_pages, int64_t page, int64_t max_pages,
             int64_t seqs, std::mt19937_64& g, int64_t kv_heads = -1)
      : NP(num_pages), P(page), MP(max_pages), S(seqs) {
    const int64_t Hkv = kv_heads < 0 ? cfg.num_key_value_heads : kv_heads;
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      // NaN-poisoned: a read of an unwritten slot shows up as NaN in the hidden states.
      k.push_back(test::poisoned(DType::kBF16, {NP, P, Hkv, cfg.head_dim}));
      v.push_back(test::poisoned(DType::kBF16, {NP, P, Hkv, cfg.head_dim}));
    }
    block_table = Tensor(DType::kI32, {S, MP});
    std::fill_n(block_table.ptr<int32_t>(), S * MP, -1);
    seq_lens = Tensor(DType::kI32, {S});
    std::fill_n(seq_lens.ptr<int32_t>(), S, 0);
    free_pages.resize(size_t(NP));
    std::iota(free_pages.begin(), free_pages.end(), 0);
    std::shuffle(free_pages.begin(), free_pages.end(), g);  // pages in random physical order
  }
  int32_t alloc() {
    EXPECT_FALSE(free_pages.empty());
    int32_t p = free_pages.back();
    free_pages.pop_back();
    return p;
  }
  // Group g of GR shares the first `len` positions (pages allocated now).
  void set_prefix(int64_t GR, const std::vector<int32_t>& group_of_seq,
                  const std::vector<int32_t>& lens) {
    const int64_t MPs = MP;
    pbt = Tensor(DType::kI32, {GR, MPs});
    shared_len = Tensor(DType::kI32, {GR});
    seq_group = Tensor(DType::kI32, {S});
    std::fill_n(pbt->ptr<int32_t>(), GR * MPs, -1);
    for (int64_t gr = 0; gr < GR; ++gr) {
      shared_len->ptr<int32_t>()[gr] = lens[size_t(gr)];
      for (int64_t j = 0; j * P < lens[size_t(gr)]; ++j)
        pbt->ptr<int32_t>()[gr * MPs + j] = alloc();
    }
    for (int64_t s = 0; s < S; ++s) seq_group->ptr<int32_t>()[s] = group_of_seq[size_t(s)];
  }
  // Makes room for new tokens (seq, pos) and sets seq_lens to cover them.
  void prepare(const std::vector<int32_t>& seq, const std::vector<int32_t>& pos) {
    for (size_t i = 0; i < seq.size(); ++i) {
      if (seq[i] < 0 || seq[i] >= S || pos[i] < 0 || pos[i] / P >= MP) continue;  // bad-input tests
      int32_t* row = block_table.ptr<int32_t>() + seq[i] * MP;
      if (row[pos[i] / P] < 0) row[pos[i] / P] = alloc();
      int32_t& len = seq_lens.ptr<int32_t>()[seq[i]];
      len = std::max(len, pos[i] + 1);
    }
  }
  KvCacheView view() {
    KvCacheView c;
    for (auto& t : k) c.k.push_back(t.view());
    for (auto& t : v) c.v.push_back(t.view());
    c.block_table = block_table.view();
    c.seq_lens = seq_lens.view();
    if (pbt) c.prefix = SharedPrefix{pbt->view(), shared_len->view(), seq_group->view()};
    return c;
  }
};

// One engine step: token rows (seq, pos, token); returns hidden [N, H].
std::vector<bf16> run_step(const Model& m, PagedCache& cache, std::vector<int32_t> seq,
                           std::vector<int32_t> pos, std::vector<int32_t> tok,
                           const StepOptions& so) {
  cache.prepare(seq, pos);
  const int64_t N = int64_t(seq.size()), H = m.config().hidden_size;
  Tensor out = test::poisoned(DType::kBF16, {N, H});
  KvCacheView cv = cache.view();
  m.forward_step(i32_view(tok), i32_view(seq), i32_view(pos), cv, so, out.view());
  return std::vector<bf16>(out.ptr<bf16>(), out.ptr<bf16>() + N * H);
}

// Runs sequences through forward_step with a random schedule: each step takes, from a random
// subset of the unfinished sequences, a chunk of 1..max_chunk next tokens (max_chunk 1: decode).
// Sequences start at random steps (continuous batching). Returns hidden per sequence.
std::vector<std::vector<bf16>> rollout_hidden(const Model& m,
                                              const std::vector<std::vector<int32_t>>& seqs,
                                              int64_t page, int max_chunk, const StepOptions& so,
                                              std::mt19937_64& g) {
  const int64_t H = m.config().hidden_size, S = int64_t(seqs.size());
  int64_t max_len = 0, total_pages = 0;
  for (auto& s : seqs) {
    max_len = std::max<int64_t>(max_len, int64_t(s.size()));
    total_pages += (int64_t(s.size()) + page - 1) / page;
  }
  PagedCache cache(m.config(), total_pages + 3, page, (max_len + page - 1) / page + 1, S, g,
                   m.cache_kv_heads());
  std::vector<std::vector<bf16>> res(static_cast<size_t>(S));
  std::vector<int64_t> done(size_t(S), 0);
  std::uniform_int_distribution<int> chunk(1, max_chunk);
  for (;;) {
    std::vector<int32_t> seq, pos, tok;
    bool any_left = false;
    for (int64_t s = 0; s < S; ++s) {
      if (done[size_t(s)] == int64_t(seqs[size_t(s)].size())) continue;
      any_left = true;
      if (g() % 3 == 0) continue;  // sits this step out
      int64_t n = std::min<int64_t>(chunk(g), int64_t(seqs[size_t(s)].size()) - done[size_t(s)]);
      for (int64_t j = 0; j < n; ++j) {
        seq.push_back(int32_t(s));
        pos.push_back(int32_t(done[size_t(s)] + j));
        tok.push_back(seqs[size_t(s)][size_t(done[size_t(s)] + j)]);
      }
      done[size_t(s)] += n;
    }
    if (!any_left) break;
    if (seq.empty()) continue;
    // Shuffle the rows of the step: row order must not matter either.
    std::vector<size_t> perm(seq.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    std::vector<int32_t> s2, p2, t2;
    for (size_t i : perm) {
      s2.push_back(seq[i]);
      p2.push_back(pos[i]);
      t2.push_back(tok[i]);
    }
    std::vector<bf16> h = run_step(m, cache, s2, p2, t2, so);
    for (size_t i = 0; i < s2.size(); ++i) {
      auto& r = res[size_t(s2[i])];
      r.resize(seqs[size_t(s2[i])].size() * size_t(H));
      std::copy_n(h.begin() + int64_t(i) * H, H, r.begin() + int64_t(p2[i]) * H);
    }
  }
  return res;
}

::testing::AssertionResult same_hidden(const std::vector<std::vector<bf16>>& a,
                                       const std::vector<std::vector<bf16>>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sequence counts differ";
  for (size_t s = 0; s < a.size(); ++s) {
    if (a[s].size() != b[s].size())
      return ::testing::AssertionFailure() << "sequence " << s << ": sizes differ";
    auto r = bitwise_equal(a[s].data(), b[s].data(), int64_t(a[s].size()), DType::kBF16);
    if (!r) return r << " (sequence " << s << ")";
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::vector<int32_t>> random_seqs(const std::vector<int64_t>& lens, int64_t V,
                                              std::mt19937_64& g) {
  std::vector<std::vector<int32_t>> s;
  for (int64_t n : lens) s.push_back(random_tokens(n, V, g));
  return s;
}

std::vector<int> iota_order(size_t n) {
  std::vector<int> o(n);
  std::iota(o.begin(), o.end(), 0);
  return o;
}

// --- tests ---

TEST(Model, PackedAloneEqualsPackedWithOthers) {
  auto g = test::rng(1);
  for (const Qwen3Config& cfg : {small_config(), gqa_config()}) {
    TestModel tm = make_weights(cfg, 11);
    auto m = make_model(tm);
    auto seqs = random_seqs({1, 3, 17, 70, 111, 2}, cfg.vocab_size, g);
    std::vector<std::vector<bf16>> alone(seqs.size());
    for (size_t s = 0; s < seqs.size(); ++s) alone[s] = packed_hidden(*m, {seqs[s]}, {0})[0];
    EXPECT_TRUE(same_hidden(alone, packed_hidden(*m, seqs, iota_order(seqs.size()))));
    std::vector<int> order = {5, 2, 0, 4, 1, 3};
    EXPECT_TRUE(same_hidden(alone, packed_hidden(*m, seqs, order)));
    // Neighbours' contents changed: same sequence 2 inside other random sequences.
    auto others = random_seqs({40, 17, 9}, cfg.vocab_size, g);
    others[1] = seqs[2];
    EXPECT_TRUE(same_hidden({alone[2]}, {packed_hidden(*m, others, {0, 1, 2})[1]}));
    // i64 token ids and a strided hidden_out give the same bits.
    {
      const int64_t H = cfg.hidden_size, T = int64_t(seqs[3].size());
      std::vector<int64_t> t64(seqs[3].begin(), seqs[3].end());
      std::vector<int32_t> cu = {0, int32_t(T)};
      Tensor wide = test::poisoned(DType::kBF16, {T, H + 5});
      TensorView out = TensorView::contiguous(wide.data(), DType::kBF16, {T, H});
      out.stride[0] = H + 5;
      m->forward_packed(TensorView::contiguous(t64.data(), DType::kI64, {T}), i32_view(cu), out);
      std::vector<bf16> got;
      for (int64_t t = 0; t < T; ++t)
        got.insert(got.end(), wide.ptr<bf16>() + t * (H + 5), wide.ptr<bf16>() + t * (H + 5) + H);
      EXPECT_TRUE(same_hidden({alone[3]}, {got}));
    }
    // Empty sequences in the packing are allowed.
    std::vector<std::vector<int32_t>> with_empty = {{}, seqs[1], {}};
    EXPECT_TRUE(same_hidden({alone[1]}, {packed_hidden(*m, with_empty, {0, 1, 2})[1]}));
  }
}

TEST(Model, DecodeThroughPagedCacheEqualsPacked) {
  auto g = test::rng(2);
  for (const Qwen3Config& cfg : {small_config(), gqa_config()}) {
    TestModel tm = make_weights(cfg, 12);
    auto m = make_model(tm);
    auto seqs = random_seqs({1, 5, 70, 130}, cfg.vocab_size, g);
    auto packed = packed_hidden(*m, seqs, iota_order(seqs.size()));
    for (int64_t page : {1, 3, 16}) {
      SCOPED_TRACE("page size " + std::to_string(page));
      StepOptions so;
      EXPECT_TRUE(same_hidden(packed, rollout_hidden(*m, seqs, page, 1, so, g)));
    }
    StepOptions split;
    split.kv_splits = 3;
    EXPECT_TRUE(same_hidden(packed, rollout_hidden(*m, seqs, 7, 1, split, g)));
  }
}

TEST(Model, ChunkedPrefillAnyScheduleEqualsPacked) {
  auto g = test::rng(3);
  TestModel tm = make_weights(small_config(), 13);
  auto m = make_model(tm);
  auto seqs = random_seqs({3, 17, 66, 129, 40}, tm.cfg.vocab_size, g);
  auto packed = packed_hidden(*m, seqs, iota_order(seqs.size()));
  for (int max_chunk : {2, 7, 64, 200}) {
    SCOPED_TRACE("max chunk " + std::to_string(max_chunk));
    StepOptions so;
    so.kv_splits = max_chunk % 2 ? 2 : 1;
    EXPECT_TRUE(same_hidden(packed, rollout_hidden(*m, seqs, 5, max_chunk, so, g)));
  }
}

// GRPO group: a leader prefills the shared prompt into the group's pages (in chunks); then every
// member decodes its own completion with cascade attention. Equals the packed forward of
// prompt + completion for every member.
TEST(Model, PrefixSharedCascadeEqualsPacked) {
  auto g = test::rng(4);
  TestModel tm = make_weights(small_config(), 14);
  const int64_t V = tm.cfg.vocab_size, H = tm.cfg.hidden_size;
  for (int tp : {1, 2, 4}) {
    auto m = make_model(tm, tp);
    for (int64_t prompt_len : {int64_t(70), int64_t(13)}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " prompt " + std::to_string(prompt_len));
      const int64_t members = 3, P = 6;
      std::vector<int32_t> prompt = random_tokens(prompt_len, V, g);
      std::vector<std::vector<int32_t>> full;
      std::vector<int64_t> comp_len = {9, 1, 20};
      for (int64_t j = 0; j < members; ++j) {
        std::vector<int32_t> s = prompt;
        auto c = random_tokens(comp_len[size_t(j)], V, g);
        s.insert(s.end(), c.begin(), c.end());
        full.push_back(s);
      }
      // One extra, ungrouped sequence decodes alongside (seq_group -1).
      full.push_back(random_tokens(30, V, g));
      auto packed = packed_hidden(*m, full, iota_order(full.size()));

      PagedCache cache(tm.cfg, 64, P, 16, members + 1, g);
      cache.set_prefix(1, {0, 0, 0, -1}, {int32_t(prompt_len)});
      // The leader's own row holds the group's prefix pages (it writes the prompt's K/V there).
      for (int64_t j = 0; j * P < prompt_len; ++j)
        cache.block_table.ptr<int32_t>()[1 * cache.MP + j] = cache.pbt->ptr<int32_t>()[j];
      StepOptions prefill, so;
      so.cascade = true;
      std::vector<std::vector<bf16>> got(full.size());
      for (size_t s = 0; s < full.size(); ++s) got[s].resize(full[s].size() * size_t(H));
      // Leader (member 1) prefills the prompt in chunks of 11.
      for (int64_t p0 = 0; p0 < prompt_len; p0 += 11) {
        std::vector<int32_t> seq, pos, tok;
        for (int64_t p = p0; p < std::min(prompt_len, p0 + 11); ++p) {
          seq.push_back(1);
          pos.push_back(int32_t(p));
          tok.push_back(prompt[size_t(p)]);
        }
        auto h = run_step(*m, cache, seq, pos, tok, prefill);  // seq_lens < shared_len: no cascade
        for (size_t i = 0; i < seq.size(); ++i)
          std::copy_n(h.begin() + int64_t(i) * H, H, got[1].begin() + int64_t(pos[i]) * H);
      }
      // Every member's prompt rows equal the leader's (same tokens, same positions).
      for (int64_t j : {0, 2}) std::copy_n(got[1].begin(), prompt_len * H, got[size_t(j)].begin());
      // Decode all (members from prompt_len on, the extra sequence from 0) one token per step.
      std::vector<int64_t> next = {prompt_len, prompt_len, prompt_len, 0};
      for (;;) {
        std::vector<int32_t> seq, pos, tok;
        for (size_t s = 0; s < full.size(); ++s) {
          if (next[s] == int64_t(full[s].size())) continue;
          seq.push_back(int32_t(s));
          pos.push_back(int32_t(next[s]));
          tok.push_back(full[s][size_t(next[s])]);
          ++next[s];
        }
        if (seq.empty()) break;
        auto h = run_step(*m, cache, seq, pos, tok, so);
        for (size_t i = 0; i < seq.size(); ++i)
          std::copy_n(h.begin() + int64_t(i) * H, H,
                      got[size_t(seq[i])].begin() + int64_t(pos[i]) * H);
      }
      EXPECT_TRUE(same_hidden(packed, got));
    }
  }
}

TEST(Model, TensorParallelDegreesBitIdentical) {
  auto g = test::rng(5);
  for (const Qwen3Config& cfg : {small_config(), gqa_config()}) {
    SCOPED_TRACE(cfg.to_string());
    TestModel tm = make_weights(cfg, 15);
    auto seqs = random_seqs({1, 33, 77}, cfg.vocab_size, g);
    const int64_t H = cfg.hidden_size;
    std::vector<std::vector<bf16>> ref_packed, ref_step;
    std::vector<float> ref_lp;
    for (int tp : {1, 2, 4}) {
      SCOPED_TRACE("tp " + std::to_string(tp));
      auto m = make_model(tm, tp);
      auto packed = packed_hidden(*m, seqs, iota_order(seqs.size()));
      StepOptions so;
      auto step = rollout_hidden(*m, seqs, 4, 5, so, g);
      EXPECT_TRUE(same_hidden(packed, step));
      // Log-probs of the next tokens (last row: no target) at two temperatures.
      std::vector<float> lps;
      for (size_t s = 0; s < seqs.size(); ++s) {
        const int64_t T = int64_t(seqs[s].size());
        std::vector<int32_t> tgt(seqs[s].begin() + 1, seqs[s].end());
        tgt.push_back(-1);
        Tensor lp = test::poisoned(DType::kF32, {T}), lse = test::poisoned(DType::kF32, {T}),
               ent = test::poisoned(DType::kF32, {T});
        TensorView h = TensorView::contiguous(packed[s].data(), DType::kBF16, {T, H});
        for (float temp : {1.0f, 0.7f}) {
          m->logprob(h, i32_view(tgt), temp, lp.view(), lse.view(), ent.view());
          for (const Tensor* t : {&lp, &lse, &ent})
            lps.insert(lps.end(), t->ptr<float>(), t->ptr<float>() + T);
        }
      }
      if (tp == 1) {
        ref_packed = packed;
        ref_step = step;
        ref_lp = lps;
      } else {
        EXPECT_TRUE(same_hidden(ref_packed, packed));
        EXPECT_TRUE(same_hidden(ref_step, step));
        EXPECT_TRUE(bitwise_equal(ref_lp, lps));
      }
    }
  }
}

// The recorded rollout log-prob (sample) equals the training recompute (logprob on the packed
// forward) bit for bit, at every tp; sampled ids agree across tp.
TEST(Model, SampleLogprobEqualsTrainingLogprob) {
  auto g = test::rng(6);
  TestModel tm = make_weights(small_config(), 16);
  const int64_t H = tm.cfg.hidden_size;
  auto seqs = random_seqs({20, 45, 3}, tm.cfg.vocab_size, g);
  std::vector<int64_t> ref_ids;
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    auto m = make_model(tm, tp);
    StepOptions so;
    auto step = rollout_hidden(*m, seqs, 8, 3, so, g);
    auto packed = packed_hidden(*m, seqs, {2, 0, 1});
    std::vector<int64_t> ids_all;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t T = int64_t(seqs[s].size());
      std::vector<SamplingParams> params(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        params[size_t(t)].seed = 1234 + s;
        params[size_t(t)].temperature = t % 3 == 0 ? 0.0f : (t % 3 == 1 ? 1.0f : 0.6f);
        params[size_t(t)].top_k = t % 4 == 1 ? 20 : 0;
        params[size_t(t)].top_p = t % 5 == 2 ? 0.9f : 1.0f;
      }
      Tensor req(DType::kI64, {T}), posn(DType::kI32, {T}), ids(DType::kI64, {T});
      for (int64_t t = 0; t < T; ++t) {
        req.ptr<int64_t>()[t] = int64_t(s) * 7 + 1;
        posn.ptr<int32_t>()[t] = int32_t(t);
      }
      Tensor lp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
      TensorView hs = TensorView::contiguous(step[s].data(), DType::kBF16, {T, H});
      m->sample(hs, params, req.view(), posn.view(), ids.view(), lp.view(), lse.view(), ent.view());
      ids_all.insert(ids_all.end(), ids.ptr<int64_t>(), ids.ptr<int64_t>() + T);
      // Training side: logprob of the sampled ids on the packed hidden, row by row at the row's
      // temperature (rows are independent).
      TensorView hp = TensorView::contiguous(packed[s].data(), DType::kBF16, {T, H});
      for (int64_t t = 0; t < T; ++t) {
        float a[3];
        m->logprob(hp.rows(t, t + 1), ids.view().rows(t, t + 1),
                   params[size_t(t)].logprob_temperature(),
                   TensorView::contiguous(&a[0], DType::kF32, {1}),
                   TensorView::contiguous(&a[1], DType::kF32, {1}),
                   TensorView::contiguous(&a[2], DType::kF32, {1}));
        EXPECT_TRUE(bitwise_equal(&a[0], lp.ptr<float>() + t, 1, DType::kF32)) << "row " << t;
        EXPECT_TRUE(bitwise_equal(&a[1], lse.ptr<float>() + t, 1, DType::kF32)) << "row " << t;
        EXPECT_TRUE(bitwise_equal(&a[2], ent.ptr<float>() + t, 1, DType::kF32)) << "row " << t;
      }
    }
    if (tp == 1)
      ref_ids = ids_all;
    else
      EXPECT_EQ(ref_ids, ids_all);
  }
}

TEST(Model, ThreadCountsAndDeterminism) {
  auto g = test::rng(7);
  TestModel tm = make_weights(gqa_config(), 17);
  auto m = make_model(tm, 2);
  auto seqs = random_seqs({50, 7, 90}, tm.cfg.vocab_size, g);
  const int saved = num_threads();
  set_num_threads(1);
  auto a = packed_hidden(*m, seqs, {0, 1, 2});
  std::mt19937_64 g1(99), g2(99);
  StepOptions so;
  auto sa = rollout_hidden(*m, seqs, 5, 4, so, g1);
  set_num_threads(3);
  auto b = packed_hidden(*m, seqs, {0, 1, 2});
  auto sb = rollout_hidden(*m, seqs, 5, 4, so, g2);
  auto c = packed_hidden(*m, seqs, {0, 1, 2});
  set_num_threads(saved);
  EXPECT_TRUE(same_hidden(a, b));
  EXPECT_TRUE(same_hidden(b, c));
  EXPECT_TRUE(same_hidden(sa, sb));
  EXPECT_TRUE(same_hidden(a, sa));
}

// The trace names every op boundary, in the same order on both paths, with equal rows.
TEST(Model, TraceIsTheSameOnBothPathsAndAllTp) {
  auto g = test::rng(8);
  TestModel tm = make_weights(small_config(), 18);
  auto seq = random_tokens(9, tm.cfg.vocab_size, g);
  struct Rec {
    std::string op;
    int layer;
    std::vector<uint8_t> bytes;
  };
  auto capture = [](Model& m, std::vector<Rec>* out) {
    m.set_trace([out](const std::string& op, int layer, const TensorView& t) {
      ASSERT_TRUE(t.is_contiguous());
      // attention's lse: the packed path's only (for the backward), checked below.
      if (op == "attn_lse") return;
      const uint8_t* p = static_cast<const uint8_t*>(t.data);
      out->push_back({op, layer, std::vector<uint8_t>(p, p + t.numel() * dtype_size(t.dtype))});
    });
  };
  {
    auto m = make_model(tm, 2);
    std::vector<int> lse_layers;
    m->set_trace([&](const std::string& op, int layer, const TensorView& t) {
      if (op != "attn_lse") return;
      EXPECT_EQ(t.dtype, DType::kF32);
      EXPECT_EQ(t.numel(), int64_t(seq.size()) * tm.cfg.num_attention_heads);
      lse_layers.push_back(layer);
    });
    packed_hidden(*m, {seq}, {0});
    std::vector<int> want(size_t(tm.cfg.num_hidden_layers));
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(lse_layers, want);
  }
  std::vector<Rec> ref;
  for (int tp : {1, 2, 4}) {
    auto m = make_model(tm, tp);
    std::vector<Rec> packed;
    capture(*m, &packed);
    packed_hidden(*m, {seq}, {0});
    // Step path: the whole sequence in one chunk (same rows, same order).
    std::vector<Rec> step;
    capture(*m, &step);
    std::mt19937_64 gg(5);
    PagedCache cache(tm.cfg, 8, 4, 4, 1, gg);
    std::vector<int32_t> s(seq.size(), 0), p(seq.size());
    std::iota(p.begin(), p.end(), 0);
    run_step(*m, cache, s, p, seq, StepOptions{});
    ASSERT_EQ(packed.size(), step.size());
    // 1 embed + per layer 17 + 2 final; layer 0 has no input_residual.
    EXPECT_EQ(packed.size(), size_t(1 + 17 * tm.cfg.num_hidden_layers - 1 + 2));
    for (size_t i = 0; i < packed.size(); ++i) {
      EXPECT_EQ(packed[i].op, step[i].op);
      EXPECT_EQ(packed[i].layer, step[i].layer);
      EXPECT_TRUE(packed[i].bytes == step[i].bytes) << packed[i].op << " layer " << packed[i].layer;
    }
    if (tp == 1) {
      ref = packed;
      EXPECT_EQ(ref.front().op, "embed");
      EXPECT_EQ(ref.back().op, "final_norm");
    } else {
      ASSERT_EQ(ref.size(), packed.size());
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_TRUE(ref[i].bytes == packed[i].bytes)
            << "tp " << tp << ": " << ref[i].op << " layer " << ref[i].layer;
    }
  }
}

// Contract 0.3 (§G.5): at gemm_segments = 4 the column-parallel projections (q, k, v, gate, up)
// are one-segment GEMMs of their traced inputs and the row-parallel ones (o_proj, down) are
// 4-segment GEMMs, at tp 1 and 2 alike. (The traced q / k / v / gate / up are the HF-order slices
// of the fused per-rank outputs.) The shapes are large enough that the other segment count gives
// different bf16 outputs, which the test also asserts: otherwise it could not tell them apart.
TEST(Model, ColumnParallelGemmsUseOneSegment) {
  auto g = test::rng(21);
  Qwen3Config cfg = small_config();
  cfg.hidden_size = 256;
  cfg.intermediate_size = 512;
  cfg.head_dim = 64;
  cfg.num_key_value_heads = 4;  // v as wide as q: enough elements for S=1 and S=4 to differ
  TestModel tm = make_weights(cfg, 23);
  auto seq = random_tokens(256, tm.cfg.vocab_size, g);
  for (int tp : {1, 2}) {
    auto m = make_model(tm, tp);  // test_contract(): gemm_segments = 4
    std::map<std::string, Tensor> tr;
    m->set_trace([&](const std::string& op, int layer, const TensorView& t) {
      if (layer != 1) return;
      Tensor c(t.dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim));
      const TensorView cv = c.view();
      std::memcpy(cv.data, t.data, size_t(t.numel()) * dtype_size(t.dtype));
      tr[op] = std::move(c);
    });
    packed_hidden(*m, {seq}, {0});
    auto expect_gemm = [&](const char* x, const char* y, const std::string& w, int S) {
      ASSERT_TRUE(tr.count(x) && tr.count(y)) << x << " " << y;
      auto gemm = [&](int segments) {
        Tensor out(DType::kBF16, tr.at(y).shape());
        cpu::gemm_bf16_nt(tr.at(x).view(), tm.views.at("model.layers.1." + w), GemmConfig{segments},
                          out.view());
        return out;
      };
      const Tensor want = gemm(S), other = gemm(S == 1 ? 4 : 1);
      EXPECT_TRUE(test::bitwise_equal(tr.at(y).data(), want.data(), want.numel(), DType::kBF16))
          << y << " tp=" << tp << " S=" << S;
      const bool differs =
          !test::bitwise_equal(want.data(), other.data(), want.numel(), DType::kBF16);
      EXPECT_TRUE(differs) << y << ": S=1 and S=4 agree on this input, the check is blind";
    };
    expect_gemm("input_norm", "q", "self_attn.q_proj.weight", 1);
    expect_gemm("input_norm", "k", "self_attn.k_proj.weight", 1);
    expect_gemm("input_norm", "v", "self_attn.v_proj.weight", 1);
    expect_gemm("post_norm", "gate", "mlp.gate_proj.weight", 1);
    expect_gemm("post_norm", "up", "mlp.up_proj.weight", 1);
    expect_gemm("attn", "o_proj", "self_attn.o_proj.weight", 4);
    expect_gemm("act", "down", "mlp.down_proj.weight", 4);
  }
}

// --- fp64 oracle of Qwen3ForCausalLM (transformers modeling_qwen3.py, eager attention) ---

struct Oracle {
  const TestModel& tm;
  std::vector<double> w(const std::string& name) const {
    for (auto& [n, t] : tm.weights)
      if (n == name) {
        std::vector<double> v(size_t(t.numel()));
        for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = bf16_to_f32(t.ptr<bf16>()[i]);
        return v;
      }
    ADD_FAILURE() << "no weight " << name;
    return {};
  }
  static void rms(double* x, int64_t n, const std::vector<double>& wt, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double r = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * wt[size_t(i)];
  }
  // y[T, N] = x[T, K] · w[N, K]ᵀ
  static std::vector<double> mm(const std::vector<double>& x, const std::vector<double>& w,
                                int64_t T, int64_t K, int64_t N) {
    std::vector<double> y(size_t(T * N));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += x[size_t(t * K + k)] * w[size_t(n * K + k)];
        y[size_t(t * N + n)] = s;
      }
    return y;
  }
  // Final-normed hidden [T, H] of one sequence.
  std::vector<double> hidden(const std::vector<int32_t>& tok) const {
    const Qwen3Config& c = tm.cfg;
    const int64_t T = int64_t(tok.size()), H = c.hidden_size, I = c.intermediate_size;
    const int64_t D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
    const double eps = c.rms_norm_eps;
    auto emb = w("model.embed_tokens.weight");
    std::vector<double> h(size_t(T * H));
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(emb.begin() + tok[size_t(t)] * H, H, h.begin() + t * H);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<double> x = h;
      auto in_w = w(p + "input_layernorm.weight");
      for (int64_t t = 0; t < T; ++t) rms(&x[size_t(t * H)], H, in_w, eps);
      auto q = mm(x, w(p + "self_attn.q_proj.weight"), T, H, Hq * D);
      auto k = mm(x, w(p + "self_attn.k_proj.weight"), T, H, Hkv * D);
      auto v = mm(x, w(p + "self_attn.v_proj.weight"), T, H, Hkv * D);
      auto qn = w(p + "self_attn.q_norm.weight"), kn = w(p + "self_attn.k_norm.weight");
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t hh = 0; hh < Hq; ++hh) rms(&q[size_t((t * Hq + hh) * D)], D, qn, eps);
        for (int64_t hh = 0; hh < Hkv; ++hh) rms(&k[size_t((t * Hkv + hh) * D)], D, kn, eps);
      }
      auto rope = [&](double* r, int64_t pos) {
        for (int64_t i = 0; i < D / 2; ++i) {
          const double inv = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(D));
          const double a = double(pos) * inv, cs = std::cos(a), sn = std::sin(a);
          const double x0 = r[i], x1 = r[i + D / 2];
          r[i] = x0 * cs - x1 * sn;
          r[i + D / 2] = x1 * cs + x0 * sn;
        }
      };
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t hh = 0; hh < Hq; ++hh) rope(&q[size_t((t * Hq + hh) * D)], t);
        for (int64_t hh = 0; hh < Hkv; ++hh) rope(&k[size_t((t * Hkv + hh) * D)], t);
      }
      std::vector<double> att(size_t(T * Hq * D), 0.0);
      const double scale = 1.0 / std::sqrt(double(D));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t hh = 0; hh < Hq; ++hh) {
          const int64_t kh = hh / (Hq / Hkv);
          std::vector<double> sc(size_t(t + 1));
          double mx = -1e300;
          for (int64_t j = 0; j <= t; ++j) {
            double s = 0;
            for (int64_t d = 0; d < D; ++d)
              s += q[size_t((t * Hq + hh) * D + d)] * k[size_t((j * Hkv + kh) * D + d)];
            sc[size_t(j)] = s * scale;
            mx = std::max(mx, sc[size_t(j)]);
          }
          double z = 0;
          for (auto& s : sc) z += (s = std::exp(s - mx));
          for (int64_t j = 0; j <= t; ++j)
            for (int64_t d = 0; d < D; ++d)
              att[size_t((t * Hq + hh) * D + d)] +=
                  sc[size_t(j)] / z * v[size_t((j * Hkv + kh) * D + d)];
        }
      auto o = mm(att, w(p + "self_attn.o_proj.weight"), T, Hq * D, H);
      for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
      x = h;
      auto post_w = w(p + "post_attention_layernorm.weight");
      for (int64_t t = 0; t < T; ++t) rms(&x[size_t(t * H)], H, post_w, eps);
      auto gt = mm(x, w(p + "mlp.gate_proj.weight"), T, H, I);
      auto up = mm(x, w(p + "mlp.up_proj.weight"), T, H, I);
      for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1.0 + std::exp(-gt[i])) * up[i];
      auto dn = mm(gt, w(p + "mlp.down_proj.weight"), T, I, H);
      for (size_t i = 0; i < h.size(); ++i) h[i] += dn[i];
    }
    auto nw = w("model.norm.weight");
    for (int64_t t = 0; t < T; ++t) rms(&h[size_t(t * H)], H, nw, eps);
    return h;
  }
};

// Accuracy: lockstep (bf16 storage, rounding at every op boundary, bf16 P in attention) vs the
// fp64 math on the same bf16 weights, 80 tokens, 2 layers. Stated tolerances, relative to the
// scale of the values: hidden max |err| <= 0.15·rms(hidden); log-probs of every vocab entry:
// max |err| <= 0.03·rms(logp) and rms err <= 0.005·rms(logp). Typical measured values (printed):
// hidden max 0.04-0.065 at rms 1; logp max 0.035-0.10, rms 0.010-0.020 at rms(logp) ~7.
TEST(Model, AccuracyVsFp64Oracle) {
  auto g = test::rng(9);
  for (const Qwen3Config& cfg : {small_config(), gqa_config()}) {
    SCOPED_TRACE(cfg.to_string());
    TestModel tm = make_weights(cfg, 19);
    auto m = make_model(tm);
    Oracle orc{tm};
    auto seq = random_tokens(80, cfg.vocab_size, g);
    const int64_t T = 80, H = cfg.hidden_size, V = cfg.vocab_size;
    auto got = packed_hidden(*m, {seq}, {0})[0];
    auto ref = orc.hidden(seq);
    double max_err = 0, ss = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_err = std::max(max_err, std::abs(double(bf16_to_f32(got[i])) - ref[i]));
      ss += ref[i] * ref[i];
    }
    const double rms = std::sqrt(ss / double(ref.size()));
    std::printf("[accuracy] hidden: max |err| %.3g, rms(hidden) %.3g\n", max_err, rms);
    EXPECT_LT(max_err, 0.15 * rms);
    // Log-probs of every vocab entry of a few rows: logits from the fp64 hidden and lm_head.
    auto lm = orc.w(cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    double max_lp = 0, ss_lp = 0, ss_z = 0;
    int64_t n_lp = 0;
    for (int64_t t : {int64_t(0), int64_t(1), int64_t(40), T - 1}) {
      std::vector<double> z(static_cast<size_t>(V));
      double mx = -1e300;
      for (int64_t v = 0; v < V; ++v) {
        double s = 0;
        for (int64_t k = 0; k < H; ++k) s += ref[size_t(t * H + k)] * lm[size_t(v * H + k)];
        z[size_t(v)] = s;
        mx = std::max(mx, s);
      }
      double se = 0;
      for (double s : z) se += std::exp(s - mx);
      const double lse = mx + std::log(se);
      // All V targets of row t at once: V copies of the row's hidden.
      Tensor hv(DType::kBF16, {V, H});
      for (int64_t v = 0; v < V; ++v) std::copy_n(got.begin() + t * H, H, hv.ptr<bf16>() + v * H);
      std::vector<int32_t> tg(static_cast<size_t>(V));
      std::iota(tg.begin(), tg.end(), 0);
      Tensor lp(DType::kF32, {V}), ls(DType::kF32, {V}), en(DType::kF32, {V});
      m->logprob(hv.view(), i32_view(tg), 1.0f, lp.view(), ls.view(), en.view());
      for (int64_t v = 0; v < V; ++v) {
        const double e = double(lp.ptr<float>()[v]) - (z[size_t(v)] - lse);
        max_lp = std::max(max_lp, std::abs(e));
        ss_lp += e * e;
        ss_z += (z[size_t(v)] - lse) * (z[size_t(v)] - lse);
        ++n_lp;
      }
    }
    std::printf(
        "[accuracy] logp (all %lld entries of 4 rows): max |err| %.3g, rms err %.3g, "
        "rms logp %.3g\n",
        (long long)V, max_lp, std::sqrt(ss_lp / double(n_lp)), std::sqrt(ss_z / double(n_lp)));
    const double rms_logp = std::sqrt(ss_z / double(n_lp));
    EXPECT_LT(max_lp, 0.03 * rms_logp);
    EXPECT_LT(std::sqrt(ss_lp / double(n_lp)), 0.005 * rms_logp);
  }
}

// Loading: from a safetensors checkpoint (bf16 zero-copy; f32 rounded once) equals the map form.
TEST(Model, CheckpointLoadEqualsWeightMap) {
  namespace fs = std::filesystem;
  auto g = test::rng(10);
  TestModel tm = make_weights(small_config(), 20);
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("lockstep_model_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_model_files(dir.string(), serialize_qwen3_model(tm.cfg, tm.weights));
  Checkpoint ck = Checkpoint::open(dir.string());
  ModelOptions opt;
  opt.contract = test_contract();
  opt.tp = 2;
  Model from_ckpt(ck.config(), ck, opt, make_invariant_backend());
  auto seqs = random_seqs({25, 4}, tm.cfg.vocab_size, g);
  auto a = packed_hidden(from_ckpt, seqs, {0, 1});
  auto b = packed_hidden(*make_model(tm, 2), seqs, {0, 1});
  EXPECT_TRUE(same_hidden(a, b));

  // f32 weights (values off the bf16 grid) load as their RNE bf16 rounding.
  Weights f32w;
  std::map<std::string, TensorView> rounded;
  std::vector<Tensor> keep;
  for (auto& [name, t] : tm.weights) {
    Tensor f(DType::kF32, t.shape()), r(DType::kBF16, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float x = bf16_to_f32(t.ptr<bf16>()[i]) * 1.001f;
      f.ptr<float>()[i] = x;
      r.ptr<bf16>()[i] = f32_to_bf16(x);
    }
    f32w.emplace_back(name, f);
    rounded[name] = r.view();
    keep.push_back(r);
  }
  const fs::path dir32 = dir.string() + "_f32";
  fs::remove_all(dir32);
  Qwen3Config c32 = tm.cfg;
  c32.torch_dtype = "float32";
  write_model_files(dir32.string(), serialize_qwen3_model(c32, f32w));
  Checkpoint ck32 = Checkpoint::open(dir32.string());
  Model m32(tm.cfg, ck32, opt, make_invariant_backend());
  Model mr(tm.cfg, rounded, opt, make_invariant_backend());
  EXPECT_TRUE(same_hidden(packed_hidden(m32, seqs, {0, 1}), packed_hidden(mr, seqs, {0, 1})));
  fs::remove_all(dir);
  fs::remove_all(dir32);
}

void expect_error(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << what << "'";
  }
}

TEST(Model, BadWeightsAndOptionsGiveClearErrors) {
  TestModel tm = make_weights(small_config(), 21);
  ModelOptions opt;
  opt.contract = test_contract();
  auto build = [&](const std::map<std::string, TensorView>& w, const ModelOptions& o) {
    Model m(tm.cfg, w, o, make_invariant_backend());
  };
  {
    auto w = tm.views;
    w.erase("model.layers.1.mlp.up_proj.weight");
    expect_error([&] { build(w, opt); }, "missing weight model.layers.1.mlp.up_proj.weight");
  }
  {
    auto w = tm.views;
    TensorView bad = w.at("model.layers.0.self_attn.k_proj.weight");
    bad.shape[0] = 16;  // [16, 64] instead of [32, 64]
    w["model.layers.0.self_attn.k_proj.weight"] = bad;
    expect_error([&] { build(w, opt); }, "has shape [16, 64], the config expects [32, 64]");
  }
  {
    auto w = tm.views;
    TensorView bad = w.at("model.norm.weight");
    bad.dtype = DType::kI32;
    w["model.norm.weight"] = bad;
    expect_error([&] { build(w, opt); }, "model.norm.weight has dtype i32");
  }
  {
    auto w = tm.views;
    w["model.layers.9.mlp.up_proj.weight"] = w.at("model.layers.1.mlp.up_proj.weight");
    expect_error([&] { build(w, opt); }, "model.layers.9.mlp.up_proj.weight is not part");
  }
  {
    ModelOptions o = opt;
    o.tp = 4;
    o.contract.gemm_segments = 2;
    expect_error([&] { build(tm.views, o); }, "gemm_segments");
    o.contract.gemm_segments = 4;
    o.contract.vocab_segments = 2;
    expect_error([&] { build(tm.views, o); }, "vocab_segments");
    o.tp = 3;
    expect_error([&] { build(tm.views, o); }, "options.tp must be 1, 2, 4 or 8");
  }
  {
    // Hq·D = 64 with gemm_segments=8 pads K to 128: tp=2 would cut o_proj inside a head range.
    ModelOptions o = opt;
    o.tp = 2;
    o.contract.gemm_segments = 8;
    expect_error([&] { build(tm.views, o); }, "o_proj K range");
  }
  {
    Qwen3Config c = small_config();
    c.num_key_value_heads = 4;
    c.num_attention_heads = 12;  // Hq=12 not divisible by tp=8... use tp=4 / Hkv=4 ok; Hq%8
    TestModel t2 = make_weights(c, 3);
    ModelOptions o = opt;
    o.tp = 8;
    o.contract.gemm_segments = 8;
    o.contract.vocab_segments = 8;
    expect_error([&] { Model m(c, t2.views, o, make_invariant_backend()); },
                 "num_attention_heads=12 is not divisible by tp=8");
  }
  // Missing tensor in a checkpoint.
  {
    namespace fs = std::filesystem;
    const fs::path dir =
        fs::path(::testing::TempDir()) / ("lockstep_model_bad_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    write_model_files(dir.string(), serialize_qwen3_model(tm.cfg, tm.weights));
    Checkpoint ck = Checkpoint::open(dir.string());
    Qwen3Config more = tm.cfg;
    more.num_hidden_layers = 3;  // the checkpoint has 2 layers
    expect_error([&] { Model m(more, ck, opt, make_invariant_backend()); },
                 "has no tensor model.layers.2.");
    Qwen3Config wider = tm.cfg;
    wider.intermediate_size = 128;
    expect_error([&] { Model m(wider, ck, opt, make_invariant_backend()); },
                 "model.layers.0.mlp.gate_proj.weight has shape [96, 64], the config expects "
                 "[128, 64]");
    fs::remove_all(dir);
  }
}

TEST(Model, BadInputsGiveClearErrors) {
  auto g = test::rng(11);
  TestModel tm = make_weights(small_config(), 22);
  ModelOptions opt;
  opt.contract = test_contract();
  opt.max_positions = 40;  // small RoPE table
  Model m(tm.cfg, tm.views, opt, make_invariant_backend());
  const int64_t H = tm.cfg.hidden_size;
  std::vector<int32_t> tok = random_tokens(10, tm.cfg.vocab_size, g), cu = {0, 4, 10};
  Tensor out(DType::kBF16, {10, H});
  {
    auto bad = tok;
    bad[7] = 300;
    expect_error([&] { m.forward_packed(i32_view(bad), i32_view(cu), out.view()); },
                 "tokens[7] = 300 is outside the vocabulary [0, 300)");
    bad[7] = -2;
    expect_error([&] { m.forward_packed(i32_view(bad), i32_view(cu), out.view()); },
                 "tokens[7] = -2");
  }
  {
    std::vector<int32_t> c2 = {0, 6, 5, 10};
    expect_error([&] { m.forward_packed(i32_view(tok), i32_view(c2), out.view()); },
                 "non-decreasing");
    std::vector<int32_t> c3 = {0, 9};
    expect_error([&] { m.forward_packed(i32_view(tok), i32_view(c3), out.view()); },
                 "end at T = 10");
    Tensor small(DType::kBF16, {9, H});
    expect_error([&] { m.forward_packed(i32_view(tok), i32_view(cu), small.view()); },
                 "hidden_out");
  }
  {
    auto long_seq = random_tokens(41, tm.cfg.vocab_size, g);
    std::vector<int32_t> c = {0, 41};
    Tensor o(DType::kBF16, {41, H});
    expect_error([&] { m.forward_packed(i32_view(long_seq), i32_view(c), o.view()); },
                 "sequence 0 has 41 tokens, more than the model's max positions (40)");
  }
  // forward_step
  PagedCache cache(tm.cfg, 8, 4, 12, 2, g);
  auto step = [&](std::vector<int32_t> seq, std::vector<int32_t> pos, std::vector<int32_t> t) {
    cache.prepare(seq, pos);
    Tensor o(DType::kBF16, {int64_t(seq.size()), H});
    KvCacheView cv = cache.view();
    m.forward_step(i32_view(t), i32_view(seq), i32_view(pos), cv, StepOptions{}, o.view());
  };
  expect_error([&] { step({0}, {0}, {999}); }, "tokens[0] = 999");
  expect_error([&] { step({2}, {0}, {1}); }, "seq[0] = 2 is not a row");
  expect_error([&] { step({0}, {40}, {1}); }, "pos[0] = 40 >= the model's max positions (40)");
  {
    // pos beyond seq_lens (prepare not called for it).
    Tensor o(DType::kBF16, {1, H});
    std::vector<int32_t> s = {1}, p = {3}, t = {5};
    KvCacheView cv = cache.view();
    expect_error(
        [&] { m.forward_step(i32_view(t), i32_view(s), i32_view(p), cv, StepOptions{}, o.view()); },
        "pos[0] = 3 outside [0, cache.seq_lens[1] = 0)");
    StepOptions casc;
    casc.cascade = true;
    expect_error([&] { m.forward_step(i32_view(t), i32_view(s), i32_view(p), cv, casc, o.view()); },
                 "cache.prefix is not set");
    cv.k.pop_back();
    expect_error(
        [&] { m.forward_step(i32_view(t), i32_view(s), i32_view(p), cv, StepOptions{}, o.view()); },
        "cache holds 1 k and 2 v layers");
  }
  // The same (seq, pos) twice in one step writes one slot twice.
  expect_error([&] { step({0, 0}, {1, 1}, {3, 4}); }, "more than once");
  // Page index out of the cache.
  {
    cache.block_table.ptr<int32_t>()[1 * 12 + 0] = 77;
    expect_error([&] { step({1}, {0}, {3}); }, "cache.block_table[1][0] = 77 is not a page");
  }
  // Heads: bad targets.
  {
    Tensor h(DType::kBF16, {2, H});
    test::fill_bf16(h.ptr<bf16>(), 2 * H, g, 0.5f);
    std::vector<int32_t> tg = {5, 300};
    Tensor lp(DType::kF32, {2}), ls(DType::kF32, {2}), en(DType::kF32, {2});
    expect_error([&] { m.logprob(h.view(), i32_view(tg), 1.0f, lp.view(), ls.view(), en.view()); },
                 "300");
    ModelOptions o2 = opt;
    o2.tp = 2;
    Model m2(tm.cfg, tm.views, o2, make_invariant_backend());
    expect_error([&] { m2.logprob(h.view(), i32_view(tg), 1.0f, lp.view(), ls.view(), en.view()); },
                 "300");
  }
}

// The built-in default model, loaded from its files: decode == packed at tp 1 and 4, and the
// speed of both paths (printed, not asserted).
TEST(Model, DefaultModelDecodeEqualsPackedAndSpeed) {
  namespace fs = std::filesystem;
  auto g = test::rng(12);
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("lockstep_model_default_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ensure_default_model(dir.string());
  Checkpoint ck = Checkpoint::open(dir.string());
  auto seqs = random_seqs({100, 60, 37, 90}, ck.config().vocab_size, g);
  int64_t total = 0;
  for (auto& s : seqs) total += int64_t(s.size());
  std::vector<std::vector<bf16>> ref;
  for (int tp : {1, 4}) {
    ModelOptions opt;
    opt.contract.gemm_segments = 4;
    opt.contract.vocab_segments = 4;
    opt.tp = tp;
    Model m(ck.config(), ck, opt, make_invariant_backend());
    auto t0 = std::chrono::steady_clock::now();
    auto packed = packed_hidden(m, seqs, iota_order(seqs.size()));
    auto t1 = std::chrono::steady_clock::now();
    auto step = rollout_hidden(m, seqs, 16, 1, StepOptions{}, g);
    auto t2 = std::chrono::steady_clock::now();
    const double sp = std::chrono::duration<double>(t1 - t0).count();
    const double sd = std::chrono::duration<double>(t2 - t1).count();
    std::printf(
        "[speed] default model tp=%d, %d threads: packed %lld tokens %.3f s (%.0f tok/s); "
        "decode %.3f s (%.0f tok/s)\n",
        tp, num_threads(), (long long)total, sp, double(total) / sp, sd, double(total) / sd);
    EXPECT_TRUE(same_hidden(packed, step));
    if (tp == 1)
      ref = packed;
    else
      EXPECT_TRUE(same_hidden(ref, packed));
  }
  fs::remove_all(dir);
}

TEST(Model, OptionsPrint) {
  ModelOptions o;
  o.contract = test_contract();
  o.tp = 2;
  EXPECT_NE(o.to_string().find("tp=2"), std::string::npos);
  EXPECT_NE(o.to_string().find("gemm_segments=4"), std::string::npos);
  StepOptions s;
  s.kv_splits = 3;
  EXPECT_EQ(s.to_string(), "step: kv_splits=3 cascade=off");
}

// PagedMeta / PackedSeqs: validated once; the ops taking them give the view-based ops' bits and
// check only the call's own tensors against them.
TEST(Model, StepMetadataValidatedOnceGivesTheSameBits) {
  std::mt19937_64 g(7);
  const int64_t NP = 6, P = 5, Hkv = 2, Hq = 4, D = 32, N = 5;
  Tensor kc = test::random_bf16({NP, P, Hkv, D}, g), vc = test::random_bf16({NP, P, Hkv, D}, g);
  Tensor q = test::random_bf16({N, Hq, D}, g);
  // Two sequences of 13 and 9 keys; rows: 3 of sequence 0 (chunked prefill), 2 decode rows.
  std::vector<int32_t> bt = {4, 0, 2, 5, 1, 3}, lens = {13, 9}, qs = {0, 0, 0, 1, 1},
                       qp = {10, 11, 12, 7, 8};
  const TensorView btv = TensorView::contiguous(bt.data(), DType::kI32, {2, 3});
  const PagedKv kv{kc.view(), vc.view(), btv, i32_view(lens)};
  const AttentionConfig cfg;
  PagedTables t;
  t.q_seq = i32_view(qs);
  t.q_pos = i32_view(qp);
  t.block_table = btv;
  t.seq_lens = i32_view(lens);
  const PagedMeta meta = PagedMeta::validate("test", t, NP, P, cfg);
  EXPECT_EQ(meta.N(), N);
  EXPECT_EQ(meta.num_seqs(), 2);
  EXPECT_TRUE(meta.all_chunks() && meta.tables_checked() && !meta.has_prefix());
  Tensor o1(DType::kBF16, {N, Hq, D}), o2(DType::kBF16, {N, Hq, D});
  Tensor l1(DType::kF32, {N, Hq}), l2(DType::kF32, {N, Hq});
  cpu::attention_paged(q.view(), i32_view(qs), i32_view(qp), kv, cfg, o1.view(), l1.view());
  cpu::attention_paged(q.view(), meta, kc.view(), vc.view(), cfg, o2.view(), l2.view());
  EXPECT_TRUE(test::bitwise_equal(o1.ptr<bf16>(), o2.ptr<bf16>(), N * Hq * D, DType::kBF16));
  EXPECT_TRUE(test::bitwise_equal(l1.ptr<float>(), l2.ptr<float>(), N * Hq, DType::kF32));
  cpu::attention_paged_split_kv(q.view(), meta, kc.view(), vc.view(), cfg, 3, o2.view(), l2.view());
  EXPECT_TRUE(test::bitwise_equal(o1.ptr<bf16>(), o2.ptr<bf16>(), N * Hq * D, DType::kBF16));
  // The backends' meta overloads, with the meta built once for several calls.
  for (const auto& be : {std::shared_ptr<OpsBackend>(make_invariant_backend())}) {
    be->attention_paged(q.view(), meta, kc.view(), vc.view(), cfg, o2.view(), l2.view());
    EXPECT_TRUE(test::bitwise_equal(o1.ptr<bf16>(), o2.ptr<bf16>(), N * Hq * D, DType::kBF16));
  }

  // Per-call checks against the meta (O(1)): rows, cache geometry, prefix presence, chunk range.
  Tensor q4 = test::random_bf16({4, Hq, D}, g);
  expect_error(
      [&] { cpu::attention_paged(q4.view(), meta, kc.view(), vc.view(), cfg, o2.view(), {}); },
      "argument 'q' has 4 rows, the step's metadata 5");
  Tensor kc7 = test::random_bf16({NP + 1, P, Hkv, D}, g);
  expect_error(
      [&] {
        cpu::attention_paged(q.view(), meta, kc7.view(), kc7.view(), cfg, o2.view(), l2.view());
      },
      "argument 'kv.k_cache'");
  expect_error(
      [&] {
        cpu::attention_paged_cascade(q.view(), meta, kc.view(), vc.view(), cfg, o2.view(), {});
      },
      "no prefix tables");
  const PagedMeta part = PagedMeta::validate("test", t, NP, P, cfg, 0, 1);
  EXPECT_FALSE(part.all_chunks());
  expect_error(
      [&] { cpu::attention_paged(q.view(), part, kc.view(), vc.view(), cfg, o2.view(), {}); },
      "validated for kv chunks [0, 1) only");
  // Validation keeps the view-based ops' messages.
  qp[4] = 9;
  expect_error([&] { PagedMeta::validate("test", t, NP, P, cfg); },
               "test: q_pos[4] = 9 outside [0, seq_len = 9) of sequence 1");
  qp[4] = 8;
  bt[1] = NP;
  expect_error([&] { PagedMeta::validate("test", t, NP, P, cfg); },
               "kv.block_table[0][1] = 6 is not a page of the cache (NP = 6)");
  bt[1] = 0;
  // Device copies must match the validated tables' shapes.
  PagedTables wrong = t;
  wrong.q_pos = i32_view(lens);
  expect_error([&] { PagedMeta(meta).with_device_copies(Device::kCPU, wrong); }, "q_pos");

  // PackedSeqs: two sequences of 2 and 3 tokens.
  const int64_t T = 5;
  std::vector<int32_t> cu = {0, 2, 5};
  Tensor k = test::random_bf16({T, Hkv, D}, g), v = test::random_bf16({T, Hkv, D}, g);
  const PackedSeqs seqs = PackedSeqs::validate("test", i32_view(cu), T);
  EXPECT_EQ(seqs.B(), 2);
  cpu::attention_prefill_varlen(q.view(), k.view(), v.view(), i32_view(cu), cfg, o1.view(), {});
  cpu::attention_prefill_varlen(q.view(), k.view(), v.view(), seqs, cfg, o2.view(), {});
  EXPECT_TRUE(test::bitwise_equal(o1.ptr<bf16>(), o2.ptr<bf16>(), T * Hq * D, DType::kBF16));
  Tensor k4 = test::random_bf16({4, Hkv, D}, g), o4(DType::kBF16, {4, Hq, D});
  expect_error(
      [&] {
        cpu::attention_prefill_varlen(q4.view(), k4.view(), k4.view(), seqs, cfg, o4.view(), {});
      },
      "argument 'q' has 4 tokens, cu_seqlens packs 5");
  cu[1] = 3;
  cu[2] = 2;
  expect_error([&] { PackedSeqs::validate("test", i32_view(cu), T); },
               "cu_seqlens must be non-decreasing");
}

// --- rank-local models (issue 15): one model per rank over a communicator ---

std::unique_ptr<Model> make_rank_model(const TestModel& tm, int tp, dist::Communicator& comm,
                                       std::shared_ptr<OpsBackend> ops = make_invariant_backend()) {
  ModelOptions opt;
  opt.contract = test_contract();
  opt.tp = tp;
  return std::make_unique<Model>(tm.cfg, tm.views, opt, std::move(ops), &comm);
}

template <typename T>
void append_bytes(std::vector<uint8_t>* out, const T* p, int64_t n) {
  const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
  out->insert(out->end(), b, b + n * int64_t(sizeof(T)));
}

// Everything a model computes on a fixed workload, as bytes, one entry per output: packed hidden,
// a shared-prompt forward, a chunked paged rollout, the trace of a packed forward, log-probs at two
// temperatures and sampled ids with their values. The rollout schedule comes from `seed` alone,
// so every rank of a rank-local job (and any model) drives the same steps.
std::vector<std::pair<std::string, std::vector<uint8_t>>> workload_bytes(
    Model& m, const std::vector<std::vector<int32_t>>& seqs, uint64_t seed) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  const int64_t H = m.config().hidden_size;
  auto packed = packed_hidden(m, seqs, iota_order(seqs.size()));
  for (size_t s = 0; s < seqs.size(); ++s)
    append_bytes(&out.emplace_back("packed", std::vector<uint8_t>{}).second, packed[s].data(),
                 int64_t(packed[s].size()));
  {  // one prompt (seqs[0]) shared by completions seqs[1] and seqs[2]
    std::vector<int32_t> tokens, cu{0}, prompt_of{-1, 0, 0};
    for (size_t s = 0; s < 3; ++s) {
      tokens.insert(tokens.end(), seqs[s].begin(), seqs[s].end());
      cu.push_back(int32_t(tokens.size()));
    }
    Tensor h = test::poisoned(DType::kBF16, {int64_t(tokens.size()), H});
    m.forward_packed_shared(i32_view(tokens), i32_view(cu), i32_view(prompt_of), h.view());
    append_bytes(&out.emplace_back("shared", std::vector<uint8_t>{}).second, h.ptr<bf16>(),
                 h.numel());
  }
  std::mt19937_64 g(seed);
  auto step = rollout_hidden(m, seqs, 4, 5, StepOptions{}, g);
  EXPECT_TRUE(same_hidden(packed, step)) << "rank " << m.rank();
  for (size_t s = 0; s < seqs.size(); ++s)
    append_bytes(&out.emplace_back("step", std::vector<uint8_t>{}).second, step[s].data(),
                 int64_t(step[s].size()));
  {
    std::vector<uint8_t>& tr = out.emplace_back("trace", std::vector<uint8_t>{}).second;
    m.set_trace([&](const std::string& op, int layer, const TensorView& t) {
      append_bytes(&tr, op.data(), int64_t(op.size()));
      append_bytes(&tr, &layer, 1);
      append_bytes(&tr, static_cast<const uint8_t*>(t.data), t.numel() * dtype_size(t.dtype));
    });
    packed_hidden(m, {seqs[1]}, {0});
    m.set_trace(nullptr);
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t T = int64_t(seqs[s].size());
    TensorView h = TensorView::contiguous(packed[s].data(), DType::kBF16, {T, H});
    std::vector<int32_t> tgt(seqs[s].begin() + 1, seqs[s].end());
    tgt.push_back(-1);
    for (float temp : {1.0f, 0.7f}) {
      Tensor lp = test::poisoned(DType::kF32, {T}), lse = test::poisoned(DType::kF32, {T}),
             ent = test::poisoned(DType::kF32, {T});
      m.logprob(h, i32_view(tgt), temp, lp.view(), lse.view(), ent.view());
      std::vector<uint8_t>& b = out.emplace_back("logprob", std::vector<uint8_t>{}).second;
      for (const Tensor* t : {&lp, &lse, &ent}) append_bytes(&b, t->ptr<float>(), T);
    }
    std::vector<SamplingParams> params(static_cast<size_t>(T));
    Tensor req(DType::kI64, {T}), posn(DType::kI32, {T}), ids(DType::kI64, {T});
    for (int64_t t = 0; t < T; ++t) {
      params[size_t(t)].seed = 77 + s;
      params[size_t(t)].temperature = t % 3 == 0 ? 0.0f : (t % 3 == 1 ? 1.0f : 0.6f);
      params[size_t(t)].top_k = t % 4 == 1 ? 20 : 0;
      params[size_t(t)].top_p = t % 5 == 2 ? 0.9f : 1.0f;
      params[size_t(t)].min_p = t % 7 == 3 ? 0.05f : 0.0f;
      req.ptr<int64_t>()[t] = int64_t(s) * 3 + 2;
      posn.ptr<int32_t>()[t] = int32_t(t);
    }
    Tensor lp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
    m.sample(h, params, req.view(), posn.view(), ids.view(), lp.view(), lse.view(), ent.view());
    std::vector<uint8_t>& b = out.emplace_back("sample", std::vector<uint8_t>{}).second;
    append_bytes(&b, ids.ptr<int64_t>(), T);
    for (const Tensor* t : {&lp, &lse, &ent}) append_bytes(&b, t->ptr<float>(), T);
  }
  return out;
}

::testing::AssertionResult same_workload(
    const std::vector<std::pair<std::string, std::vector<uint8_t>>>& a,
    const std::vector<std::pair<std::string, std::vector<uint8_t>>>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "output counts differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || a[i].second.size() != b[i].second.size())
      return ::testing::AssertionFailure()
             << "output " << i << " (" << a[i].first << ") differs in kind or size";
    if (!a[i].second.empty() &&
        std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size()) != 0)
      return ::testing::AssertionFailure()
             << "output " << i << " (" << a[i].first << ") differs in its bits";
  }
  return ::testing::AssertionSuccess();
}

// Every output of a rank-local job, on every rank, has the bits of the simulated-TP model of the
// same degree and of tp = 1: split kv heads (small) and one kv head replicated on all ranks (gqa,
// tied embeddings: the embedding and lm_head shards are different row ranges of one table).
TEST(ModelRanks, RankLocalEqualsSimulatedTpAndTp1) {
  auto g = test::rng(31);
  for (const Qwen3Config& cfg : {small_config(), gqa_config()}) {
    SCOPED_TRACE(cfg.to_string());
    TestModel tm = make_weights(cfg, 41);
    auto seqs = random_seqs({23, 9, 31}, cfg.vocab_size, g);
    const auto ref = workload_bytes(*make_model(tm, 1), seqs, 5);
    for (int tp : {1, 2, 4}) {
      SCOPED_TRACE("tp " + std::to_string(tp));
      EXPECT_TRUE(same_workload(ref, workload_bytes(*make_model(tm, tp), seqs, 5)));
      std::vector<std::vector<std::pair<std::string, std::vector<uint8_t>>>> got;
      got.resize(size_t(tp));
      dist::run_ranks(tp, [&](dist::Communicator& comm) {
        auto m = make_rank_model(tm, tp, comm);
        EXPECT_EQ(m->rank(), comm.rank());
        got[size_t(comm.rank())] = workload_bytes(*m, seqs, 5);
      });
      for (int r = 0; r < tp; ++r) EXPECT_TRUE(same_workload(ref, got[size_t(r)])) << "rank " << r;
    }
  }
}

// A rank-local model holds its shards only: over the ranks every weight byte is held once, but
// the norms, which every rank keeps. Its cache holds the rank's kv heads (a simulated model's all).
TEST(ModelRanks, EachRankHoldsOnlyItsShards) {
  const Qwen3Config cfg = small_config();  // untied, Hkv = 2: no replicated heads at tp 2
  TestModel tm = make_weights(cfg, 42);
  const int tp = 2;
  const int64_t L = cfg.num_hidden_layers, H = cfg.hidden_size, D = cfg.head_dim;
  const int64_t norm_bytes = ((2 * L + 1) * H + 2 * L * D) * 2;
  const int64_t simulated = make_model(tm, tp)->weight_bytes();
  std::vector<int64_t> bytes(tp), heads(tp);
  dist::run_ranks(tp, [&](dist::Communicator& comm) {
    auto m = make_rank_model(tm, tp, comm);
    bytes[size_t(comm.rank())] = m->weight_bytes();
    heads[size_t(comm.rank())] = m->cache_kv_heads();
  });
  EXPECT_EQ(bytes[0] + bytes[1], simulated + (tp - 1) * norm_bytes);
  EXPECT_LT(bytes[0], simulated * 3 / 4);
  EXPECT_LT(bytes[1], simulated * 3 / 4);
  EXPECT_EQ(heads, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(make_model(tm, tp)->cache_kv_heads(), 2);
  EXPECT_EQ(make_model(tm, tp)->rank(), -1);
}

// Per-rank checkpoint loading: a rank-local model built from a checkpoint reads its shard's
// blocks only (bf16 in place, f32 blocks rounded alone) with the bits of the weight-map model, and
// scans only its own blocks: a NaN in rank 1's o_proj columns fails rank 1, not rank 0.
TEST(ModelRanks, CheckpointShardsLoadAloneAndAreChecked) {
  namespace fs = std::filesystem;
  auto g = test::rng(45);
  TestModel tm = make_weights(small_config(), 46);
  auto seqs = random_seqs({17, 6}, tm.cfg.vocab_size, g);
  const auto want = packed_hidden(*make_model(tm, 2), seqs, {0, 1});
  const std::string base =
      (fs::path(::testing::TempDir()) / ("lockstep_ranks_" + std::to_string(::getpid()))).string();
  ModelOptions opt;
  opt.contract = test_contract();
  opt.tp = 2;
  // bf16 and f32 files (f32: the bf16 values widened, so the blocks round back exactly).
  for (const char* dtype : {"bfloat16", "float32"}) {
    SCOPED_TRACE(dtype);
    Qwen3Config c = tm.cfg;
    c.torch_dtype = dtype;
    Weights w;
    for (auto& [name, t] : tm.weights) {
      if (std::string(dtype) == "bfloat16") {
        w.emplace_back(name, t);
        continue;
      }
      Tensor f(DType::kF32, t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) f.ptr<float>()[i] = bf16_to_f32(t.ptr<bf16>()[i]);
      w.emplace_back(name, f);
    }
    const std::string dir = base + "_" + dtype;
    fs::remove_all(dir);
    write_model_files(dir, serialize_qwen3_model(c, w));
    const Checkpoint ck = Checkpoint::open(dir);
    std::vector<std::vector<std::vector<bf16>>> got(2);
    dist::run_ranks(2, [&](dist::Communicator& comm) {
      Model m(tm.cfg, ck, opt, make_invariant_backend(), &comm);
      got[size_t(comm.rank())] = packed_hidden(m, seqs, {0, 1});
    });
    EXPECT_TRUE(same_hidden(want, got[0]));
    EXPECT_TRUE(same_hidden(want, got[1]));
    fs::remove_all(dir);
  }
  // A NaN in the last o_proj column of layer 1: rank 1's K range.
  Weights bad;
  const std::string wo = "model.layers.1.self_attn.o_proj.weight";
  for (auto& [name, t] : tm.weights) {
    if (name != wo) {
      bad.emplace_back(name, t);
      continue;
    }
    Tensor c(DType::kBF16, t.shape());
    std::copy_n(t.ptr<bf16>(), t.numel(), c.ptr<bf16>());
    c.ptr<bf16>()[t.shape()[1] - 1] = bf16{0x7fc0};  // row 0, last column
    bad.emplace_back(name, c);
  }
  const std::string dir = base + "_nan";
  fs::remove_all(dir);
  write_model_files(dir, serialize_qwen3_model(tm.cfg, bad));
  const Checkpoint ck = Checkpoint::open(dir);
  std::vector<std::string> outcome(2, "loaded");
  EXPECT_THROW(dist::run_ranks(2,
                               [&](dist::Communicator& comm) {
                                 try {
                                   Model m(tm.cfg, ck, opt, make_invariant_backend(), &comm);
                                 } catch (const Error& e) {
                                   outcome[size_t(comm.rank())] = e.what();
                                   throw;
                                 }
                               }),
               Error);
  EXPECT_EQ(outcome[0], "loaded");
  EXPECT_NE(outcome[1].find("tensor " + wo), std::string::npos) << outcome[1];
  EXPECT_NE(outcome[1].find("non-finite weight at index 63 [0, 63]"), std::string::npos)
      << outcome[1];
  expect_error([&] { Model m(tm.cfg, ck, opt, make_invariant_backend()); }, "non-finite weight");
  fs::remove_all(dir);
}

TEST(ModelRanks, BadJobsGiveClearErrors) {
  TestModel tm = make_weights(small_config(), 43);
  auto g = test::rng(44);
  auto seq = random_tokens(12, tm.cfg.vocab_size, g);
  // A communicator of another size than options.tp.
  dist::run_ranks(2, [&](dist::Communicator& comm) {
    expect_error([&] { make_rank_model(tm, 4, comm); },
                 "a rank-local model needs a communicator of options.tp = 4 ranks, got one of 2");
  });
  // Ranks that do not make the same call: a clear error on every rank, not a hang.
  dist::CommOptions quick;
  quick.timeout = std::chrono::milliseconds(20'000);
  std::vector<std::string> errors(2);
  EXPECT_THROW(dist::run_ranks(
                   2,
                   [&](dist::Communicator& comm) {
                     auto m = make_rank_model(tm, 2, comm);
                     const int64_t n = comm.rank() == 0 ? 12 : 7;
                     std::vector<int32_t> t(seq.begin(), seq.begin() + n), cu{0, int32_t(n)};
                     Tensor h(DType::kBF16, {n, tm.cfg.hidden_size});
                     try {
                       m->forward_packed(i32_view(t), i32_view(cu), h.view());
                     } catch (const Error& e) {
                       errors[size_t(comm.rank())] = e.what();
                       throw;
                     }
                   },
                   quick),
               Error);
  for (const std::string& e : errors) EXPECT_NE(e.find("all_gather"), std::string::npos) << e;
}

}  // namespace
}  // namespace lockstep::engine
