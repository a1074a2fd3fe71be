// `lockstep selfcheck`: a short, self-contained run of the contract's invariances on every CPU op
// (fixed seed, seconds on 2 cores). Each check computes the same rows two ways that the contract
// says must agree bit for bit, and counts mismatching elements with memcmp.
#include "tools/selfcheck.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/thread_pool.h"
#include "lockstep/contract.h"
#include "lockstep/ops/activation.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"
#include "lockstep/ops/sampling.h"

namespace lockstep::tools {
namespace {

// Portable generator (Philox), so every machine draws the same inputs.
struct Gen {
  uint64_t key;
  uint64_t n = 0;
  uint32_t next() {
    return philox4x32_10(Philox4{{uint32_t(n++), 0, 0, 0}}, uint32_t(key), 7).v[0];
  }
  // Irwin-Hall(4) approximation of N(0, 1): no libm, identical everywhere.
  float normal() {
    float s = 0;
    for (int i = 0; i < 4; ++i) s += philox_uniform(next());
    return (s - 2.0f) * 1.7320508f;
  }
  void bf16s(Tensor& t, float scale = 1.0f) {
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<bf16>()[i] = f32_to_bf16(normal() * scale);
  }
};

struct Report {
  struct Row {
    std::string op, check;
    int64_t compared, mismatches;
  };
  std::vector<Row> rows;
  void add(const std::string& op, const std::string& check, const void* a, const void* b, int64_t n,
           int64_t esize) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i)
      bad += std::memcmp(static_cast<const char*>(a) + i * esize,
                         static_cast<const char*>(b) + i * esize, size_t(esize)) != 0;
    rows.push_back({op, check, n, bad});
  }
  void add(const std::string& op, const std::string& check, const Tensor& a, const Tensor& b) {
    add(op, check, a.data(), b.data(), a.numel(), dtype_size(a.dtype()));
  }
};

Tensor like(const Tensor& t) { return Tensor(t.dtype(), t.shape()); }

// Copies rows [r, r+1) of a [R, ...] tensor into a fresh [1, ...] tensor.
Tensor row_of(const Tensor& t, int64_t r) {
  std::vector<int64_t> shape = t.shape();
  int64_t row_bytes = t.nbytes() / shape[0];
  shape[0] = 1;
  Tensor out(t.dtype(), shape);
  std::memcpy(out.data(), static_cast<const char*>(t.data()) + r * row_bytes, size_t(row_bytes));
  return out;
}

void check_gemm(Report& rep, Gen& g, const ContractConfig& cc) {
  const int64_t M = 17, K = 200, N = 96;  // K not a multiple of 16·S: zero-padded per contract
  // A row-parallel layer's GEMM: the contract's K segments (the column-parallel one is S = 1).
  GemmConfig cfg = GemmConfig::for_layer(cc, LayerRole::kRowParallel);
  Tensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K});
  g.bf16s(x), g.bf16s(w, 0.1f);
  Tensor y(DType::kF32, {M, N});
  cpu::gemm_bf16_nt(x.view(), w.view(), cfg, y.view());
  for (int64_t r : {0, 8, 16}) {
    Tensor xr = row_of(x, r), yr(DType::kF32, {1, N});
    cpu::gemm_bf16_nt(xr.view(), w.view(), cfg, yr.view());
    rep.add("gemm_bf16_nt", "row " + std::to_string(r) + " alone vs in batch of 17", yr.data(),
            static_cast<char*>(y.data()) + r * N * 4, N, 4);
  }
  for (int tp = 2; tp <= cfg.segments; tp *= 2) {
    std::vector<Tensor> xs, ws, parts;
    std::vector<TensorView> views;
    for (int rank = 0; rank < tp; ++rank) {
      GemmKRange kr = gemm_tp_k_range(cfg, K, tp, rank);
      int64_t kk = kr.end - kr.begin;
      Tensor xs_r(DType::kBF16, {M, kk}), ws_r(DType::kBF16, {N, kk}), p(DType::kF32, {M, N});
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < kk; ++k)
          xs_r.ptr<bf16>()[m * kk + k] =
              kr.begin + k < K ? x.ptr<bf16>()[m * K + kr.begin + k] : bf16{0};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < kk; ++k)
          ws_r.ptr<bf16>()[n * kk + k] =
              kr.begin + k < K ? w.ptr<bf16>()[n * K + kr.begin + k] : bf16{0};
      cpu::gemm_bf16_nt_partial(xs_r.view(), ws_r.view(), K, tp, rank, cfg, p.view());
      views.push_back(p.view());
      xs.push_back(xs_r), ws.push_back(ws_r), parts.push_back(p);
    }
    Tensor ytp(DType::kF32, {M, N});
    cpu::gemm_tree_combine(views, nullptr, ytp.view());
    rep.add("gemm_bf16_nt", "TP=" + std::to_string(tp) + " shards vs TP=1", ytp, y);
  }
  set_num_threads(1);
  Tensor y1(DType::kF32, {M, N});
  cpu::gemm_bf16_nt(x.view(), w.view(), cfg, y1.view());
  set_num_threads(2);
  rep.add("gemm_bf16_nt", "1 thread vs 2 threads", y1, y);
}

void check_elementwise(Report& rep, Gen& g) {
  const int64_t T = 17, H = 136, heads = 2, D = 64, I = 120, V = 500;
  Tensor x(DType::kBF16, {T, H}), res(DType::kBF16, {T, H}), wt(DType::kBF16, {H});
  g.bf16s(x), g.bf16s(res), g.bf16s(wt);
  RmsNormConfig ncfg;
  Tensor res_out(DType::kBF16, {T, H}), y(DType::kBF16, {T, H});
  cpu::rmsnorm_residual(x.view(), res.view(), wt.view(), ncfg, res_out.view(), y.view());
  Tensor x5 = row_of(x, 5), r5 = row_of(res, 5), ro5 = like(r5), y5 = like(x5);
  cpu::rmsnorm_residual(x5.view(), r5.view(), wt.view(), ncfg, ro5.view(), y5.view());
  rep.add("rmsnorm_residual", "row alone vs in batch of 17", y5.data(),
          static_cast<char*>(y.data()) + 5 * H * 2, H, 2);

  RopeTable table = RopeTable::build(RopeConfig{D, 1e6, 4096});
  Tensor q(DType::kBF16, {T, heads, D}), pos(DType::kI32, {T}), qo(DType::kBF16, {T, heads, D});
  g.bf16s(q);
  for (int64_t t = 0; t < T; ++t) pos.ptr<int32_t>()[t] = int32_t(g.next() % 4096);
  cpu::rope(q.view(), pos.view(), table, qo.view());
  Tensor q3 = row_of(q, 3), p3 = row_of(pos, 3), qo3 = like(q3);
  cpu::rope(q3.view(), p3.view(), table, qo3.view());
  rep.add("rope", "token alone vs in batch of 17", qo3.data(),
          static_cast<char*>(qo.data()) + 3 * heads * D * 2, heads * D, 2);

  Tensor gu(DType::kBF16, {T, 2 * I}), act(DType::kBF16, {T, I});
  g.bf16s(gu, 3.0f);
  cpu::silu_and_mul(gu.view(), act.view());
  Tensor gu9 = row_of(gu, 9), act9(DType::kBF16, {1, I});
  cpu::silu_and_mul(gu9.view(), act9.view());
  rep.add("silu_and_mul", "row alone vs in batch of 17", act9.data(),
          static_cast<char*>(act.data()) + 9 * I * 2, I, 2);

  Tensor emb(DType::kBF16, {V, H}), ids(DType::kI64, {T}), e1(DType::kBF16, {T, H});
  g.bf16s(emb);
  for (int64_t t = 0; t < T; ++t) ids.ptr<int64_t>()[t] = int64_t(g.next() % V);
  cpu::embedding(ids.view(), emb.view(), e1.view());
  std::vector<Tensor> parts;
  std::vector<TensorView> views;
  for (int rank = 0; rank < 4; ++rank) {
    VocabShard sh = vocab_shard(V, rank, 4);
    Tensor p(DType::kBF16, {T, H});
    cpu::embedding_vocab_parallel(ids.view(), emb.view().rows(sh.begin, sh.end), sh, V, p.view());
    parts.push_back(p);
    views.push_back(p.view());
  }
  Tensor e4(DType::kBF16, {T, H});
  cpu::embedding_combine(views, e4.view());
  rep.add("embedding", "vocab-parallel TP=4 vs TP=1", e4, e1);
}

void check_attention(Report& rep, Gen& g, const ContractConfig& cc) {
  // Three sequences, GQA 4:2, D=64; every token's output computed by packed prefill, by paged
  // attention (page sizes 16 and 7: decode/chunked-prefill path) and by split-KV.
  const int64_t Hq = 4, Hkv = 2, D = 64;
  const std::vector<int32_t> lens = {37, 150, 200};
  int64_t T = 0;
  for (int32_t l : lens) T += l;
  AttentionConfig cfg = AttentionConfig::from_contract(cc);
  Tensor q(DType::kBF16, {T, Hq, D}), k(DType::kBF16, {T, Hkv, D}), v(DType::kBF16, {T, Hkv, D});
  g.bf16s(q), g.bf16s(k), g.bf16s(v);
  Tensor cu(DType::kI32, {int64_t(lens.size()) + 1});
  cu.ptr<int32_t>()[0] = 0;
  for (size_t s = 0; s < lens.size(); ++s)
    cu.ptr<int32_t>()[s + 1] = cu.ptr<int32_t>()[s] + lens[s];
  Tensor out(DType::kBF16, {T, Hq, D}), lse(DType::kF32, {T, Hq});
  cpu::attention_prefill_varlen(q.view(), k.view(), v.view(), cu.view(), cfg, out.view(),
                                lse.view());

  Tensor qseq(DType::kI32, {T}), qpos(DType::kI32, {T});
  for (size_t s = 0, t = 0; s < lens.size(); ++s)
    for (int32_t p = 0; p < lens[s]; ++p, ++t)
      qseq.ptr<int32_t>()[t] = int32_t(s), qpos.ptr<int32_t>()[t] = p;
  for (int64_t page : {16, 7}) {
    int64_t max_pages = (200 + page - 1) / page, NP = int64_t(lens.size()) * max_pages;
    Tensor kc(DType::kBF16, {NP, page, Hkv, D}), vc(DType::kBF16, {NP, page, Hkv, D});
    std::memset(kc.data(), 0xff, size_t(kc.nbytes()));  // NaN garbage in unused slots
    std::memset(vc.data(), 0xff, size_t(vc.nbytes()));
    Tensor bt(DType::kI32, {int64_t(lens.size()), max_pages}),
        sl(DType::kI32, {int64_t(lens.size())});
    Tensor slots(DType::kI64, {T});
    // Pages handed out in reverse order, so storage order differs from position order.
    for (int64_t s = 0; s < int64_t(lens.size()); ++s)
      for (int64_t p = 0; p < max_pages; ++p)
        bt.ptr<int32_t>()[s * max_pages + p] = int32_t(NP - 1 - (s * max_pages + p));
    for (int64_t t = 0; t < T; ++t) {
      int32_t s = qseq.ptr<int32_t>()[t], p = qpos.ptr<int32_t>()[t];
      slots.ptr<int64_t>()[t] =
          int64_t(bt.ptr<int32_t>()[s * max_pages + p / page]) * page + p % page;
    }
    for (size_t s = 0; s < lens.size(); ++s) sl.ptr<int32_t>()[s] = lens[s];
    cpu::kv_cache_write(k.view(), v.view(), slots.view(), kc.view(), vc.view());
    PagedKv kv{kc.view(), vc.view(), bt.view(), sl.view()};
    Tensor out_p(DType::kBF16, {T, Hq, D}), lse_p(DType::kF32, {T, Hq});
    cpu::attention_paged(q.view(), qseq.view(), qpos.view(), kv, cfg, out_p.view(), lse_p.view());
    std::string ps = "page size " + std::to_string(page);
    rep.add("attention", "paged (" + ps + ") vs packed prefill: out", out_p, out);
    rep.add("attention", "paged (" + ps + ") vs packed prefill: lse", lse_p, lse);
    Tensor out_s(DType::kBF16, {T, Hq, D}), lse_s(DType::kF32, {T, Hq});
    cpu::attention_paged_split_kv(q.view(), qseq.view(), qpos.view(), kv, cfg, 3, out_s.view(),
                                  lse_s.view());
    rep.add("attention", "split-KV x3 (" + ps + ") vs packed prefill", out_s, out);
  }

  // Shared prompts (§B.11): sequences 1 and 2 given the same first 100 rows, packed as that prompt
  // once and the two completions (rows 100 .. of each): every row's out / lse vs packed prefill.
  const int64_t P = 100, t1 = lens[0], t2 = lens[0] + lens[1];
  Tensor q2 = like(q), k2 = like(k), v2 = like(v);
  for (auto [dst, src] : {std::pair{&q2, &q}, {&k2, &k}, {&v2, &v}}) {
    std::memcpy(dst->data(), src->data(), size_t(src->nbytes()));
    const int64_t rb = src->nbytes() / T;
    std::memcpy(static_cast<char*>(dst->data()) + t2 * rb,
                static_cast<char*>(src->data()) + t1 * rb, size_t(P * rb));
  }
  Tensor ref(DType::kBF16, {T, Hq, D}), ref_lse(DType::kF32, {T, Hq});
  cpu::attention_prefill_varlen(q2.view(), k2.view(), v2.view(), cu.view(), cfg, ref.view(),
                                ref_lse.view());
  // Segments: sequence 0, the prompt (rows t1 .. t1+P), completion 1 (t1+P .. t2), completion 2
  // (t2+P .. T); the shared call sees the rows without sequence 2's copy of the prompt.
  const std::vector<std::pair<int64_t, int64_t>> runs = {
      {0, t1}, {t1, t1 + P}, {t1 + P, t2}, {t2 + P, T}};
  const int64_t Ts = T - P;
  Tensor qs(DType::kBF16, {Ts, Hq, D}), ks(DType::kBF16, {Ts, Hkv, D}),
      vs(DType::kBF16, {Ts, Hkv, D});
  Tensor ref_s(DType::kBF16, {Ts, Hq, D}), ref_ls(DType::kF32, {Ts, Hq});
  Tensor cus(DType::kI32, {5}), prompt_of(DType::kI32, {4});
  cus.ptr<int32_t>()[0] = 0;
  int64_t at = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [a, b] = runs[r];
    for (auto [dst, src] :
         {std::pair{&qs, &q2}, {&ks, &k2}, {&vs, &v2}, {&ref_s, &ref}, {&ref_ls, &ref_lse}}) {
      const int64_t rb = src->nbytes() / T;
      std::memcpy(static_cast<char*>(dst->data()) + at * rb,
                  static_cast<char*>(src->data()) + a * rb, size_t((b - a) * rb));
    }
    at += b - a;
    cus.ptr<int32_t>()[r + 1] = int32_t(at);
    prompt_of.ptr<int32_t>()[r] = r >= 2 ? 1 : -1;
  }
  const SharedPromptSeqs segs =
      SharedPromptSeqs::validate("selfcheck", cus.view(), prompt_of.view(), Ts);
  Tensor out_sh(DType::kBF16, {Ts, Hq, D}), lse_sh(DType::kF32, {Ts, Hq});
  cpu::attention_prefill_shared(qs.view(), ks.view(), vs.view(), segs, cfg, out_sh.view(),
                                lse_sh.view());
  rep.add("attention", "shared prompt vs packed prefill: out", out_sh, ref_s);
  rep.add("attention", "shared prompt vs packed prefill: lse", lse_sh, ref_ls);
}

void check_logprob(Report& rep, Gen& g, const ContractConfig& cc) {
  const int64_t T = 17, H = 64, V = 1000;  // V not a multiple of tile·segments: padded
  Tensor h(DType::kBF16, {T, H}), w(DType::kBF16, {V, H}), tgt(DType::kI64, {T});
  g.bf16s(h), g.bf16s(w, 0.3f);
  for (int64_t t = 0; t < T; ++t) tgt.ptr<int64_t>()[t] = int64_t(g.next() % V);
  LogprobParams lp;
  lp.temperature = 0.7f;
  Tensor logp(DType::kF32, {T}), lse(DType::kF32, {T}), ent(DType::kF32, {T});
  cpu::linear_logprob(h.view(), w.view(), tgt.view(), lp, cc, logp.view(), lse.view(), ent.view());
  Tensor h4 = row_of(h, 4), t4 = row_of(tgt, 4), l4(DType::kF32, {1}), s4(DType::kF32, {1}),
         e4(DType::kF32, {1});
  cpu::linear_logprob(h4.view(), w.view(), t4.view(), lp, cc, l4.view(), s4.view(), e4.view());
  rep.add("linear_logprob", "token alone vs in batch of 17", l4.data(), logp.ptr<float>() + 4, 1,
          4);

  // Vocab-parallel TP = vocab_segments: each rank owns one vocab segment and computes its states;
  // the combine finishes the segment tree.
  const int R = cc.vocab_segments;
  if (R > 1) {
    LogprobVocabLayout lay = logprob_vocab_layout(cc, V);
    Tensor states(DType::kF32, {R, T, 4});
    for (int r = 0; r < R; ++r) {
      LogprobShard shard{V, r, 1};
      int64_t v0 = std::min<int64_t>(V, r * lay.segment_len);
      int64_t v1 = std::min<int64_t>(V, (r + 1) * lay.segment_len);
      cpu::linear_logprob_partial(
          h.view(), w.view().rows(v0, v1), tgt.view(), lp, cc, shard,
          TensorView::contiguous(states.ptr<float>() + r * T * 4, DType::kF32, {T, 4}));
    }
    Tensor logpr(DType::kF32, {T}), lser(DType::kF32, {T}), entr(DType::kF32, {T});
    cpu::linear_logprob_combine(states.view(), tgt.view(), lp, cc, V, logpr.view(), lser.view(),
                                entr.view());
    const std::string tp = "vocab-parallel TP=" + std::to_string(R) + " vs TP=1: ";
    rep.add("linear_logprob", tp + "logp", logpr, logp);
    rep.add("linear_logprob", tp + "entropy", entr, ent);
  }

  // Sampling records the LogP op's value: sample, then recompute with targets = sampled ids.
  std::vector<SamplingParams> sp(static_cast<size_t>(T));
  Tensor rid(DType::kI64, {T}), spos(DType::kI64, {T}), ids(DType::kI64, {T});
  for (int64_t t = 0; t < T; ++t) {
    sp[size_t(t)].seed = 42;
    sp[size_t(t)].temperature = 0.7f;
    sp[size_t(t)].top_p = t % 2 ? 0.9f : 1.0f;
    rid.ptr<int64_t>()[t] = t / 4;
    spos.ptr<int64_t>()[t] = t;
  }
  Tensor slogp(DType::kF32, {T}), slse(DType::kF32, {T}), sent(DType::kF32, {T});
  cpu::sample(h.view(), w.view(), sp, rid.view(), spos.view(), cc, ids.view(), slogp.view(),
              slse.view(), sent.view());
  Tensor rlogp(DType::kF32, {T}), rlse(DType::kF32, {T}), rent(DType::kF32, {T});
  cpu::linear_logprob(h.view(), w.view(), ids.view(), lp, cc, rlogp.view(), rlse.view(),
                      rent.view());
  rep.add("sample", "recorded logp vs linear_logprob(sampled ids)", slogp, rlogp);
}

}  // namespace

int run_selfcheck(bool json, const ContractConfig& cc) {
  auto t0 = std::chrono::steady_clock::now();
  cc.validate();
  Gen g{20261129};
  Report rep;
  set_num_threads(2);
  check_gemm(rep, g, cc);
  check_elementwise(rep, g);
  check_attention(rep, g, cc);
  check_logprob(rep, g, cc);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t compared = 0, bad = 0;
  for (auto& r : rep.rows) compared += r.compared, bad += r.mismatches;
  if (json) {
    std::printf(
        "{\"contract\": \"%s\", \"checks\": %zu, \"elements_compared\": %lld, \"mismatches\": "
        "%lld}\n",
        cc.to_string().c_str(), rep.rows.size(), (long long)compared, (long long)bad);
  } else {
    std::printf("lockstep selfcheck  (%s)\n\n", cc.to_string().c_str());
    std::printf("%-18s %-46s %10s %10s\n", "op", "check (must agree bit for bit)", "elements",
                "mismatch");
    for (auto& r : rep.rows)
      std::printf("%-18s %-46s %10lld %10lld\n", r.op.c_str(), r.check.c_str(),
                  (long long)r.compared, (long long)r.mismatches);
    std::printf("\n%s: %lld mismatches in %lld elements compared (%.1f s)\n", bad ? "FAIL" : "PASS",
                (long long)bad, (long long)compared, secs);
  }
  flush_stdout();
  return bad ? kExitCheckFailed : kExitOk;
}

Command add_selfcheck_command(CLI::App& top) {
  struct Flags {
    bool json = false;
    ContractConfig contract = default_contract();
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = top.add_subcommand(
      "selfcheck", "the contract's invariance checks on every CPU op (fixed seed, seconds)");
  sub->footer("Exit status: 0 every check agrees bit for bit, 1 a mismatch, 2 bad usage.");
  sub->add_flag("--json", f->json, "print one JSON object instead of the table");
  add_contract_options(*sub, f->contract);
  return {sub, [f] { return run_selfcheck(f->json, f->contract); }};
}

}  // namespace lockstep::tools
