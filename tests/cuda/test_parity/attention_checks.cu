// GPU parity of the CUDA attention ops (lockstep::cuda::attention_*, src/cuda/attention*.cu) with
// the CPU reference ops (lockstep::cpu::attention_*), bit for bit (docs/contract.md §A): packed
// varlen prefill (odd lengths, GQA ratios, head dims 32..512, kv_chunk 64/128/1024, default and
// custom softmax_scale), paged decode (page sizes 1/16/37/64, shuffled pages, NaN garbage in unused
// slots, junk table entries), chunked prefill, split-KV (several num_splits), cascade (shared
// prefixes, shared_len multiple / non-multiple of kv_chunk), chunk states + merge, NaN/inf in q/k/v
// (A.6), kv_cache_write (-1 slots, i32/i64, device slots), strided / unaligned views, device
// metadata, GPU invariance across modes (the same row in every mode, memcmp), bad arguments.
// One section of the GPU parity program test_parity (tests/cuda/test_parity.cu: seed, --quick and
// the pass/fail counts come from cuda/gpu_harness.h), beside the op-case table's cases.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_ck.h"      // CK
#include "cuda/gpu_harness.h"  // report, g_rng, g_quick
#include "lockstep/cuda/attention.h"
#include "lockstep/dtype.h"
#include "lockstep/ops/attention.h"

using lockstep::AttentionChunkStates;
using lockstep::AttentionConfig;
using lockstep::bf16;
using lockstep::Device;
using lockstep::DType;
using lockstep::PagedKv;
using lockstep::SharedPrefix;
using lockstep::TensorView;
namespace cpu = lockstep::cpu;
namespace gpu = lockstep::cuda;

namespace {

using lockstep::gpu_test::g_quick;
using lockstep::gpu_test::g_rng;
using lockstep::gpu_test::report;

// ---- buffers -------------------------------------------------------------------------------

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  Dev() = default;
  explicit Dev(size_t n) : bytes(n) { CK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(Dev&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  Dev(const Dev&) = delete;
};

template <typename T>
Dev to_dev(const std::vector<T>& h) {
  Dev d(h.size() * sizeof(T));
  if (!h.empty()) CK(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> from_dev(const Dev& d, size_t n) {
  std::vector<T> h(n);
  if (n) CK(cudaMemcpy(h.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

TensorView view(void* p, DType t, std::initializer_list<int64_t> shape, Device dev) {
  return TensorView::contiguous(p, t, shape, dev);
}

uint16_t rbf16(std::normal_distribution<float>& nd, float scale) {
  return lockstep::f32_to_bf16(nd(g_rng) * scale).bits;
}
std::vector<uint16_t> random_bf16(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = rbf16(nd, scale);
  return v;
}

float bf(uint16_t b) { return lockstep::bf16_to_f32(bf16{b}); }

// Bitwise comparison; names the first differing element and both values.
bool same_bits(const std::string& what, const void* a, const void* b, size_t n, DType t) {
  const size_t es = size_t(lockstep::dtype_size(t));
  if (std::memcmp(a, b, n * es) == 0) return true;
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(static_cast<const uint8_t*>(a) + i * es,
                    static_cast<const uint8_t*>(b) + i * es, es) != 0) {
      if (first == n) first = i;
      ++bad;
    }
  if (t == DType::kBF16) {
    const uint16_t x = static_cast<const uint16_t*>(a)[first],
                   y = static_cast<const uint16_t*>(b)[first];
    std::printf("  %s: %zu of %zu differ; first [%zu]: 0x%04x (%g) vs 0x%04x (%g)\n", what.c_str(),
                bad, n, first, x, bf(x), y, bf(y));
  } else {
    uint32_t x, y;
    std::memcpy(&x, static_cast<const uint8_t*>(a) + first * 4, 4);
    std::memcpy(&y, static_cast<const uint8_t*>(b) + first * 4, 4);
    float fx, fy;
    std::memcpy(&fx, &x, 4);
    std::memcpy(&fy, &y, 4);
    std::printf("  %s: %zu of %zu differ; first [%zu]: 0x%08x (%g) vs 0x%08x (%g)\n", what.c_str(),
                bad, n, first, x, fx, y, fy);
  }
  return false;
}

// ---- problems --------------------------------------------------------------------------------

struct Dims {
  int64_t Hq, Hkv, D;
};

struct Seq {
  int64_t len = 0;
  std::vector<uint16_t> q, k, v;  // [len, Hq, D], [len, Hkv, D] x2
};

Seq make_seq(const Dims& d, int64_t len, float qscale = 1.0f) {
  Seq s;
  s.len = len;
  s.q = random_bf16(size_t(len * d.Hq * d.D), qscale);
  s.k = random_bf16(size_t(len * d.Hkv * d.D));
  s.v = random_bf16(size_t(len * d.Hkv * d.D));
  return s;
}

// Outputs of one op run: out [N, Hq, D] bf16 and lse [N, Hq] f32 (host copies).
struct Out {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

bool compare(const std::string& what, const Out& g, const Out& c) {
  bool ok = same_bits(what + " out", g.out.data(), c.out.data(), g.out.size(), DType::kBF16);
  ok = same_bits(what + " lse", g.lse.data(), c.lse.data(), g.lse.size(), DType::kF32) && ok;
  report(ok, what);
  return ok;
}

struct DevOut {
  Dev out, lse;
  int64_t N, Hq, D;
  DevOut(int64_t n, const Dims& d)
      : out(size_t(n * d.Hq * d.D) * 2),
        lse(static_cast<size_t>(n * d.Hq) * 4),
        N(n),
        Hq(d.Hq),
        D(d.D) {
    CK(cudaMemset(out.p, 0xA5, out.bytes));
    CK(cudaMemset(lse.p, 0xA5, lse.bytes));
  }
  TensorView o() const { return view(out.p, DType::kBF16, {N, Hq, D}, Device::kCUDA); }
  TensorView l() const { return view(lse.p, DType::kF32, {N, Hq}, Device::kCUDA); }
  Out host() const {
    CK(cudaDeviceSynchronize());
    return Out{from_dev<uint16_t>(out, size_t(N * Hq * D)), from_dev<float>(lse, size_t(N * Hq))};
  }
};
struct HostOut {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  int64_t N, Hq, D;
  HostOut(int64_t n, const Dims& d)
      : out(size_t(n * d.Hq * d.D), 0x5A5A),
        lse(static_cast<size_t>(n * d.Hq)),
        N(n),
        Hq(d.Hq),
        D(d.D) {
    std::memset(lse.data(), 0x5A, lse.size() * 4);
  }
  TensorView o() { return view(out.data(), DType::kBF16, {N, Hq, D}, Device::kCPU); }
  TensorView l() { return view(lse.data(), DType::kF32, {N, Hq}, Device::kCPU); }
  Out host() const { return Out{out, lse}; }
};

// The GPU result rows of every (sequence, position) seen so far: invariance across modes.
struct RowStore {
  std::map<std::pair<int64_t, int64_t>, std::pair<std::vector<uint16_t>, std::vector<float>>> rows;
  int64_t Hq = 0, D = 0;
  int checked = 0, bad = 0;
  std::string first_bad;
  void put(int64_t seq, int64_t pos, const Out& o, int64_t r, const std::string& mode) {
    std::vector<uint16_t> a(o.out.begin() + r * Hq * D, o.out.begin() + (r + 1) * Hq * D);
    std::vector<float> l(o.lse.begin() + r * Hq, o.lse.begin() + (r + 1) * Hq);
    auto it = rows.find({seq, pos});
    if (it == rows.end()) {
      rows[{seq, pos}] = {a, l};
      return;
    }
    ++checked;
    if (std::memcmp(a.data(), it->second.first.data(), a.size() * 2) != 0 ||
        std::memcmp(l.data(), it->second.second.data(), l.size() * 4) != 0) {
      if (bad++ == 0)
        first_bad = mode + " seq " + std::to_string(seq) + " pos " + std::to_string(pos);
    }
  }
};

// A paged cache over sequences: pages shuffled, NaN garbage everywhere unused, junk table entries
// past each sequence's pages. stored[s] positions of sequence s are written (seq_len).
struct Cache {
  int64_t P = 0, NP = 0, MP = 0, S = 0;
  Dims d{};
  std::vector<uint16_t> k, v;  // [NP, P, Hkv, D]
  std::vector<int32_t> table;  // [S, MP]
  std::vector<int32_t> lens;   // [S]
};

Cache make_cache(const Dims& d, const std::vector<const Seq*>& seqs,
                 const std::vector<int64_t>& stored, int64_t P, int extra_pages = 3) {
  Cache c;
  c.d = d;
  c.P = P;
  c.S = int64_t(seqs.size());
  int64_t need = 0, mp = 1;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t pages = (stored[s] + P - 1) / P;
    need += pages;
    mp = std::max(mp, pages);
  }
  c.MP = mp + 2;
  c.NP = need + extra_pages;
  const int64_t row = d.Hkv * d.D;
  c.k.assign(size_t(c.NP * P * row), 0x7fc1);
  c.v.assign(size_t(c.NP * P * row), 0xffff);
  for (size_t i = 0; i < c.k.size(); i += 3) c.k[i] = 0xff81;  // NaN variety
  std::vector<int32_t> perm(static_cast<size_t>(c.NP));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g_rng);
  c.table.assign(size_t(c.S * c.MP), 0);
  for (auto& t : c.table) t = int32_t(g_rng() % 1000000) - 500000;  // junk (never read)
  c.lens.assign(size_t(c.S), 0);
  int64_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t pages = (stored[s] + P - 1) / P;
    for (int64_t i = 0; i < pages; ++i) c.table[s * c.MP + i] = perm[size_t(next++)];
    c.lens[s] = int32_t(stored[s]);
    for (int64_t j = 0; j < stored[s]; ++j) {
      const int64_t page = c.table[s * c.MP + j / P], slot = j % P;
      std::memcpy(&c.k[size_t((page * P + slot) * row)], &seqs[s]->k[size_t(j * row)],
                  size_t(row) * 2);
      std::memcpy(&c.v[size_t((page * P + slot) * row)], &seqs[s]->v[size_t(j * row)],
                  size_t(row) * 2);
    }
  }
  return c;
}

struct DevCache {
  Dev k, v, table, lens;
  const Cache* c;
  explicit DevCache(const Cache& cc)
      : k(to_dev(cc.k)), v(to_dev(cc.v)), table(to_dev(cc.table)), lens(to_dev(cc.lens)), c(&cc) {}
  // Block table / lens on the device (dev_meta) or as host views.
  PagedKv kv(bool dev_meta) const {
    const Dims& d = c->d;
    PagedKv p;
    p.k_cache = view(k.p, DType::kBF16, {c->NP, c->P, d.Hkv, d.D}, Device::kCUDA);
    p.v_cache = view(v.p, DType::kBF16, {c->NP, c->P, d.Hkv, d.D}, Device::kCUDA);
    if (dev_meta) {
      p.block_table = view(table.p, DType::kI32, {c->S, c->MP}, Device::kCUDA);
      p.seq_lens = view(lens.p, DType::kI32, {c->S}, Device::kCUDA);
    } else {
      p.block_table =
          view(const_cast<int32_t*>(c->table.data()), DType::kI32, {c->S, c->MP}, Device::kCPU);
      p.seq_lens = view(const_cast<int32_t*>(c->lens.data()), DType::kI32, {c->S}, Device::kCPU);
    }
    return p;
  }
};

PagedKv host_kv(Cache& c) {
  const Dims& d = c.d;
  return PagedKv{view(c.k.data(), DType::kBF16, {c.NP, c.P, d.Hkv, d.D}, Device::kCPU),
                 view(c.v.data(), DType::kBF16, {c.NP, c.P, d.Hkv, d.D}, Device::kCPU),
                 view(c.table.data(), DType::kI32, {c.S, c.MP}, Device::kCPU),
                 view(c.lens.data(), DType::kI32, {c.S}, Device::kCPU)};
}

// Query rows (sequence, position) gathered from the sequences' q.
struct Rows {
  std::vector<int32_t> seq, pos;
  std::vector<uint16_t> q;  // [N, Hq, D]
  int64_t N() const { return int64_t(seq.size()); }
};
Rows make_rows(const Dims& d, const std::vector<const Seq*>& seqs,
               const std::vector<std::pair<int, int64_t>>& rp) {
  Rows r;
  const int64_t row = d.Hq * d.D;
  for (auto [s, p] : rp) {
    r.seq.push_back(s);
    r.pos.push_back(int32_t(p));
    r.q.insert(r.q.end(), seqs[size_t(s)]->q.begin() + p * row,
               seqs[size_t(s)]->q.begin() + (p + 1) * row);
  }
  return r;
}

std::string cfg_str(const Dims& d, const AttentionConfig& cfg) {
  char b[160];
  std::snprintf(b, sizeof b, "Hq=%lld Hkv=%lld D=%lld K=%d scale=%s", (long long)d.Hq,
                (long long)d.Hkv, (long long)d.D, cfg.kv_chunk,
                cfg.softmax_scale == 0 ? "default" : "custom");
  return b;
}

// ---- the per-configuration suite ---------------------------------------------------------------

struct Config {
  Dims d;
  int kv_chunk;
  double scale;
  std::vector<int64_t> lens;
  int64_t page;
};

void run_config(const Config& cf) {
  const Dims& d = cf.d;
  AttentionConfig cfg;
  cfg.kv_chunk = cf.kv_chunk;
  cfg.softmax_scale = cf.scale;
  const std::string tag = cfg_str(d, cfg);
  std::vector<Seq> seqs;
  for (size_t i = 0; i < cf.lens.size(); ++i)
    seqs.push_back(make_seq(d, cf.lens[i], i % 2 ? 3.0f : 1.0f));
  std::vector<const Seq*> sp;
  for (auto& s : seqs) sp.push_back(&s);
  const int64_t S = int64_t(seqs.size());
  RowStore store;
  store.Hq = d.Hq;
  store.D = d.D;

  // A. Packed varlen prefill: all sequences in a shuffled order, plus an empty one.
  {
    std::vector<int> order(static_cast<size_t>(S));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), g_rng);
    std::vector<int32_t> cu{0};
    std::vector<uint16_t> q, k, v;
    std::vector<std::pair<int, int64_t>> tok;  // (seq, pos) of each token
    for (size_t i = 0; i < order.size(); ++i) {
      const Seq& s = seqs[size_t(order[i])];
      q.insert(q.end(), s.q.begin(), s.q.end());
      k.insert(k.end(), s.k.begin(), s.k.end());
      v.insert(v.end(), s.v.begin(), s.v.end());
      for (int64_t p = 0; p < s.len; ++p) tok.push_back({order[i], p});
      cu.push_back(int32_t(cu.back() + s.len));
      if (i == 0) cu.push_back(cu.back());  // an empty sequence
    }
    const int64_t T = cu.back();
    HostOut ho(T, d);
    cpu::attention_prefill_varlen(view(q.data(), DType::kBF16, {T, d.Hq, d.D}, Device::kCPU),
                                  view(k.data(), DType::kBF16, {T, d.Hkv, d.D}, Device::kCPU),
                                  view(v.data(), DType::kBF16, {T, d.Hkv, d.D}, Device::kCPU),
                                  view(cu.data(), DType::kI32, {int64_t(cu.size())}, Device::kCPU),
                                  cfg, ho.o(), ho.l());
    Dev dq = to_dev(q), dk = to_dev(k), dv = to_dev(v), dcu = to_dev(cu);
    DevOut go(T, d);
    gpu::attention_prefill_varlen(view(dq.p, DType::kBF16, {T, d.Hq, d.D}, Device::kCUDA),
                                  view(dk.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA),
                                  view(dv.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA),
                                  view(cu.data(), DType::kI32, {int64_t(cu.size())}, Device::kCPU),
                                  cfg, go.o(), go.l());
    const Out g = go.host();
    compare("prefill " + tag + " T=" + std::to_string(T), g, ho.host());
    for (int64_t t = 0; t < T; ++t)
      store.put(tok[size_t(t)].first, tok[size_t(t)].second, g, t, "prefill");

    // Same, with cu_seqlens on the device and without lse.
    DevOut go2(T, d);
    gpu::attention_prefill_varlen(view(dq.p, DType::kBF16, {T, d.Hq, d.D}, Device::kCUDA),
                                  view(dk.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA),
                                  view(dv.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA),
                                  view(dcu.p, DType::kI32, {int64_t(cu.size())}, Device::kCUDA),
                                  cfg, go2.o(), TensorView{});
    const Out g2 = go2.host();
    report(same_bits("prefill device cu_seqlens", g2.out.data(), g.out.data(), g.out.size(),
                     DType::kBF16),
           "prefill device cu_seqlens, no lse " + tag);
  }

  // B + C. Paged decode (one row per sequence, shuffled order) and split-KV.
  const int64_t P = cf.page;
  {
    std::vector<int64_t> stored;
    for (auto& s : seqs) stored.push_back(s.len);
    Cache c = make_cache(d, sp, stored, P);
    DevCache dc(c);
    std::vector<std::pair<int, int64_t>> rp;
    for (int s = 0; s < int(S); ++s) rp.push_back({s, seqs[size_t(s)].len - 1});
    std::shuffle(rp.begin(), rp.end(), g_rng);
    Rows r = make_rows(d, sp, rp);
    const int64_t N = r.N();
    HostOut ho(N, d);
    cpu::attention_paged(view(r.q.data(), DType::kBF16, {N, d.Hq, d.D}, Device::kCPU),
                         view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                         view(r.pos.data(), DType::kI32, {N}, Device::kCPU), host_kv(c), cfg,
                         ho.o(), ho.l());
    Dev dq = to_dev(r.q), dseq = to_dev(r.seq), dpos = to_dev(r.pos);
    for (int dm = 0; dm < 2; ++dm) {
      DevOut go(N, d);
      const TensorView qs = dm ? view(dseq.p, DType::kI32, {N}, Device::kCUDA)
                               : view(r.seq.data(), DType::kI32, {N}, Device::kCPU);
      const TensorView qp = dm ? view(dpos.p, DType::kI32, {N}, Device::kCUDA)
                               : view(r.pos.data(), DType::kI32, {N}, Device::kCPU);
      gpu::attention_paged(view(dq.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA), qs, qp,
                           dc.kv(dm != 0), cfg, go.o(), go.l());
      const Out g = go.host();
      compare("paged decode " + tag + " P=" + std::to_string(P) + (dm ? " device meta" : ""), g,
              ho.host());
      for (int64_t i = 0; i < N; ++i) store.put(r.seq[size_t(i)], r.pos[size_t(i)], g, i, "decode");
    }
    for (int ns : {1, 2, 3, 7}) {
      DevOut go(N, d);
      gpu::attention_paged_split_kv(view(dq.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA),
                                    view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                                    view(r.pos.data(), DType::kI32, {N}, Device::kCPU),
                                    dc.kv(false), cfg, ns, go.o(), go.l());
      const Out g = go.host();
      compare("split-KV num_splits=" + std::to_string(ns) + " " + tag, g, ho.host());
      for (int64_t i = 0; i < N; ++i) store.put(r.seq[size_t(i)], r.pos[size_t(i)], g, i, "split");
    }

    // E. Chunk states (all chunks, then a middle range) + merge.
    int64_t cmax = 1;
    for (int64_t i = 0; i < N; ++i)
      cmax = std::max<int64_t>(cmax, r.pos[size_t(i)] / cfg.kv_chunk + 1);
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t cb = pass == 0 ? 0 : std::min<int64_t>(1, cmax - 1);
      const int64_t C = pass == 0 ? cmax : cmax - cb + 1;  // one chunk past every row's last
      const size_t nst = size_t(N * d.Hq * C);
      std::vector<float> hm(nst), hl(nst), ha(nst * size_t(d.D));
      AttentionChunkStates hs{view(hm.data(), DType::kF32, {N, d.Hq, C}, Device::kCPU),
                              view(hl.data(), DType::kF32, {N, d.Hq, C}, Device::kCPU),
                              view(ha.data(), DType::kF32, {N, d.Hq, C, d.D}, Device::kCPU)};
      cpu::attention_paged_chunk_states(
          view(r.q.data(), DType::kBF16, {N, d.Hq, d.D}, Device::kCPU),
          view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
          view(r.pos.data(), DType::kI32, {N}, Device::kCPU), host_kv(c), cfg, cb, hs);
      Dev gm(nst * 4), gl(nst * 4), ga(nst * size_t(d.D) * 4);
      CK(cudaMemset(gm.p, 0xA5, gm.bytes));
      CK(cudaMemset(gl.p, 0xA5, gl.bytes));
      CK(cudaMemset(ga.p, 0xA5, ga.bytes));
      AttentionChunkStates gs{view(gm.p, DType::kF32, {N, d.Hq, C}, Device::kCUDA),
                              view(gl.p, DType::kF32, {N, d.Hq, C}, Device::kCUDA),
                              view(ga.p, DType::kF32, {N, d.Hq, C, d.D}, Device::kCUDA)};
      gpu::attention_paged_chunk_states(view(dq.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA),
                                        view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                                        view(r.pos.data(), DType::kI32, {N}, Device::kCPU),
                                        dc.kv(false), cfg, cb, gs);
      CK(cudaDeviceSynchronize());
      auto gmh = from_dev<float>(gm, nst), glh = from_dev<float>(gl, nst),
           gah = from_dev<float>(ga, nst * size_t(d.D));
      auto canon = [](std::vector<float>& v) {
        for (auto& x : v) x = lockstep::canonical_f32(x);
      };
      canon(hm);
      canon(hl);
      canon(ha);
      const std::string w =
          "chunk states [" + std::to_string(cb) + ", +" + std::to_string(C) + ") " + tag;
      bool ok = same_bits(w + " m", gmh.data(), hm.data(), nst, DType::kF32);
      ok = same_bits(w + " l", glh.data(), hl.data(), nst, DType::kF32) && ok;
      ok = same_bits(w + " acc", gah.data(), ha.data(), nst * size_t(d.D), DType::kF32) && ok;
      report(ok, w);
      if (pass == 0) {
        DevOut go(N, d);
        gpu::attention_merge_chunk_states(gs, view(r.pos.data(), DType::kI32, {N}, Device::kCPU),
                                          cfg, go.o(), go.l());
        compare("merge chunk states " + tag, go.host(), ho.host());
      }
    }
  }

  // D. Chunked prefill: the longest sequence's keys up to p0 + c written (garbage past it), rows
  // p0 .. p0+c-1; several (p0, c), also rows of two sequences interleaved (short runs).
  {
    int ls = 0;
    for (int s = 0; s < int(S); ++s)
      if (seqs[size_t(s)].len > seqs[size_t(ls)].len) ls = s;
    const int64_t L = seqs[size_t(ls)].len;
    std::vector<std::pair<int64_t, int64_t>> chunks = {
        {0, std::min<int64_t>(L, 17)},
        {L / 3, std::min<int64_t>(L - L / 3, 70)},
        {std::max<int64_t>(0, L - 3), std::min<int64_t>(L, 3)},
        {L > 50 ? 50 : 0, std::min<int64_t>(L - (L > 50 ? 50 : 0), 30)}};
    for (auto [p0, cn] : chunks) {
      if (cn <= 0) continue;
      std::vector<int64_t> stored(static_cast<size_t>(S), 1);
      for (int s = 0; s < int(S); ++s) stored[size_t(s)] = seqs[size_t(s)].len;
      stored[size_t(ls)] = p0 + cn;
      Cache c = make_cache(d, sp, stored, P == 1 ? 16 : P);
      DevCache dc(c);
      std::vector<std::pair<int, int64_t>> rp;
      for (int64_t p = p0; p < p0 + cn; ++p) rp.push_back({ls, p});
      if (cn == 3) {  // interleave decode rows of other sequences: runs of one row
        std::vector<std::pair<int, int64_t>> mix;
        for (size_t i = 0; i < rp.size(); ++i) {
          mix.push_back(rp[i]);
          const int o = int((ls + 1 + i) % S);
          if (o != ls) mix.push_back({o, seqs[size_t(o)].len - 1});
        }
        rp = mix;
      }
      Rows r = make_rows(d, sp, rp);
      const int64_t N = r.N();
      HostOut ho(N, d);
      cpu::attention_paged(view(r.q.data(), DType::kBF16, {N, d.Hq, d.D}, Device::kCPU),
                           view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                           view(r.pos.data(), DType::kI32, {N}, Device::kCPU), host_kv(c), cfg,
                           ho.o(), ho.l());
      Dev dq = to_dev(r.q);
      DevOut go(N, d);
      gpu::attention_paged(view(dq.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA),
                           view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                           view(r.pos.data(), DType::kI32, {N}, Device::kCPU), dc.kv(false), cfg,
                           go.o(), go.l());
      const Out g = go.host();
      compare("chunked prefill p0=" + std::to_string(p0) + " c=" + std::to_string(cn) + " " + tag,
              g, ho.host());
      for (int64_t i = 0; i < N; ++i)
        store.put(r.seq[size_t(i)], r.pos[size_t(i)], g, i, "chunked");
    }
  }

  // F. Cascade: groups of sequences sharing a prompt prefix (shared_len multiple and non-multiple
  // of kv_chunk, and 0), one ungrouped sequence; rows: decode rows, and a row inside the prefix.
  {
    const int64_t K = cfg.kv_chunk;
    std::vector<int64_t> shl = {K, K + 37, 5, 0};
    if (!g_quick) shl.push_back(2 * K + 1);
    const int per_group = 3;
    std::vector<Seq> cs;  // full sequences (prefix + own)
    std::vector<int> group_of;
    for (size_t g = 0; g < shl.size(); ++g) {
      Seq pre = make_seq(d, shl[g]);
      for (int i = 0; i < per_group; ++i) {
        const int64_t own = 1 + int64_t(g_rng() % 90);
        Seq s = make_seq(d, shl[g] + own, i % 2 ? 3.0f : 1.0f);
        std::copy(pre.k.begin(), pre.k.end(), s.k.begin());
        std::copy(pre.v.begin(), pre.v.end(), s.v.begin());
        cs.push_back(std::move(s));
        group_of.push_back(int(g));
      }
    }
    cs.push_back(make_seq(d, 150));
    group_of.push_back(-1);
    const int64_t CS = int64_t(cs.size()), GR = int64_t(shl.size());
    std::vector<const Seq*> csp;
    for (auto& s : cs) csp.push_back(&s);
    // Cascade layout: prefix pages per group, own pages from page floor(shared_len / P).
    const int64_t row = d.Hkv * d.D;
    int64_t maxlen = 0, maxsh = 0;
    for (auto& s : cs) maxlen = std::max(maxlen, s.len);
    for (auto l : shl) maxsh = std::max(maxsh, l);
    const int64_t MP = (maxlen + P - 1) / P + 1, MPs = std::max<int64_t>(1, (maxsh + P - 1) / P);
    int64_t NP = 0;
    for (auto l : shl) NP += (l + P - 1) / P;
    for (int64_t s = 0; s < CS; ++s) NP += (cs[size_t(s)].len + P - 1) / P;
    NP += 2;
    std::vector<uint16_t> kc(static_cast<size_t>(NP * P * row), 0x7fc1),
        vc(static_cast<size_t>(NP * P * row), 0xff90);
    std::vector<int32_t> perm(static_cast<size_t>(NP));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g_rng);
    int64_t next = 0;
    std::vector<int32_t> ptab(static_cast<size_t>(GR * MPs), -7),
        own(static_cast<size_t>(CS * MP), -3), lens(static_cast<size_t>(CS));
    std::vector<int32_t> shared_len(static_cast<size_t>(GR)), seq_group(static_cast<size_t>(CS));
    auto put = [&](int64_t page, int64_t slot, const Seq& s, int64_t j) {
      std::memcpy(&kc[size_t((page * P + slot) * row)], &s.k[size_t(j * row)], size_t(row) * 2);
      std::memcpy(&vc[size_t((page * P + slot) * row)], &s.v[size_t(j * row)], size_t(row) * 2);
    };
    for (int64_t g = 0; g < GR; ++g) {
      shared_len[size_t(g)] = int32_t(shl[size_t(g)]);
      const Seq* first = nullptr;
      for (int64_t s = 0; s < CS; ++s)
        if (group_of[size_t(s)] == g) {
          first = &cs[size_t(s)];
          break;
        }
      for (int64_t i = 0; i < (shl[size_t(g)] + P - 1) / P; ++i) {
        ptab[size_t(g * MPs + i)] = perm[size_t(next++)];
        for (int64_t sl = 0; sl < P && i * P + sl < shl[size_t(g)]; ++sl)
          put(ptab[size_t(g * MPs + i)], sl, *first, i * P + sl);
      }
    }
    for (int64_t s = 0; s < CS; ++s) {
      const int g = group_of[size_t(s)];
      const int64_t sh = g >= 0 ? shl[size_t(g)] : 0;
      seq_group[size_t(s)] = g;
      lens[size_t(s)] = int32_t(cs[size_t(s)].len);
      for (int64_t i = sh / P; i < (cs[size_t(s)].len + P - 1) / P; ++i) {
        own[size_t(s * MP + i)] = perm[size_t(next++)];
        for (int64_t sl = 0; sl < P; ++sl) {
          const int64_t j = i * P + sl;
          if (j >= sh && j < cs[size_t(s)].len) put(own[size_t(s * MP + i)], sl, cs[size_t(s)], j);
        }
      }
    }
    std::vector<std::pair<int, int64_t>> rp;
    for (int s = 0; s < int(CS); ++s) rp.push_back({s, cs[size_t(s)].len - 1});
    for (int64_t g = 0; g < GR; ++g)
      if (shl[size_t(g)] > 0)
        for (int s = 0; s < int(CS); ++s)
          if (group_of[size_t(s)] == g) {
            rp.push_back({s, shl[size_t(g)] - 1});
            break;
          }
    std::shuffle(rp.begin(), rp.end(), g_rng);
    Rows r = make_rows(d, csp, rp);
    const int64_t N = r.N();
    auto hv = [&](std::vector<int32_t>& v, std::initializer_list<int64_t> sh) {
      return view(v.data(), DType::kI32, sh, Device::kCPU);
    };
    PagedKv hkv{view(kc.data(), DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCPU),
                view(vc.data(), DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCPU), hv(own, {CS, MP}),
                hv(lens, {CS})};
    SharedPrefix hpx{hv(ptab, {GR, MPs}), hv(shared_len, {GR}), hv(seq_group, {CS})};
    HostOut ho(N, d);
    cpu::attention_paged_cascade(view(r.q.data(), DType::kBF16, {N, d.Hq, d.D}, Device::kCPU),
                                 view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                                 view(r.pos.data(), DType::kI32, {N}, Device::kCPU), hkv, hpx, cfg,
                                 ho.o(), ho.l());
    Dev dk = to_dev(kc), dv = to_dev(vc), dq = to_dev(r.q);
    PagedKv gkv = hkv;
    gkv.k_cache = view(dk.p, DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCUDA);
    gkv.v_cache = view(dv.p, DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCUDA);
    DevOut go(N, d);
    gpu::attention_paged_cascade(view(dq.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA),
                                 view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                                 view(r.pos.data(), DType::kI32, {N}, Device::kCPU), gkv, hpx, cfg,
                                 go.o(), go.l());
    const Out g = go.host();
    compare("cascade " + tag + " P=" + std::to_string(P), g, ho.host());
    // The same rows by paged attention over per-sequence full tables (another page size).
    std::vector<int64_t> stored;
    for (auto& s : cs) stored.push_back(s.len);
    Cache full = make_cache(d, csp, stored, P == 64 ? 37 : 64);
    DevCache dfull(full);
    DevOut go2(N, d);
    gpu::attention_paged(view(dq.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA),
                         view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                         view(r.pos.data(), DType::kI32, {N}, Device::kCPU), dfull.kv(true), cfg,
                         go2.o(), go2.l());
    const Out g2 = go2.host();
    bool ok =
        same_bits("cascade vs paged out", g.out.data(), g2.out.data(), g.out.size(), DType::kBF16);
    ok =
        same_bits("cascade vs paged lse", g.lse.data(), g2.lse.data(), g.lse.size(), DType::kF32) &&
        ok;
    report(ok, "GPU invariance: cascade == paged over full tables " + tag);
  }

  report(store.bad == 0, "GPU invariance across prefill/decode/split/chunked (" +
                             std::to_string(store.checked) + " rows) " + tag +
                             (store.bad ? " first: " + store.first_bad : ""));
}

// ---- NaN / inf (A.6) ---------------------------------------------------------------------------

void run_specials(const Dims& d, int kv_chunk) {
  AttentionConfig cfg;
  cfg.kv_chunk = kv_chunk;
  const std::string tag = cfg_str(d, cfg);
  const int64_t L = g_quick ? 140 : 300;
  Seq s = make_seq(d, L);
  std::uniform_int_distribution<int64_t> pd(0, L - 1);
  const int64_t row_kv = d.Hkv * d.D, row_q = d.Hq * d.D;
  // NaN in one q row (one head), in k at one position, NaN and +inf in v at positions inside a
  // 64-key block shared by rows with different limits (the slow path).
  s.q[size_t(pd(g_rng) * row_q + 3)] = 0x7fc0;
  s.k[size_t(pd(g_rng) * row_kv + 5)] = 0xffc1;
  const int64_t jv = 70 + int64_t(g_rng() % 20);
  s.v[size_t(jv * row_kv + 7)] = 0x7f81;
  s.v[size_t((jv + 3) * row_kv + 1)] = 0x7f80;
  s.v[size_t(130 * row_kv + 2)] = 0xff80;  // -inf in the third block
  Seq t = make_seq(d, 90);
  std::vector<int32_t> cu{0, int32_t(L), int32_t(L + 90)};
  std::vector<uint16_t> q = s.q, k = s.k, v = s.v;
  q.insert(q.end(), t.q.begin(), t.q.end());
  k.insert(k.end(), t.k.begin(), t.k.end());
  v.insert(v.end(), t.v.begin(), t.v.end());
  const int64_t T = L + 90;
  HostOut ho(T, d);
  cpu::attention_prefill_varlen(view(q.data(), DType::kBF16, {T, d.Hq, d.D}, Device::kCPU),
                                view(k.data(), DType::kBF16, {T, d.Hkv, d.D}, Device::kCPU),
                                view(v.data(), DType::kBF16, {T, d.Hkv, d.D}, Device::kCPU),
                                view(cu.data(), DType::kI32, {3}, Device::kCPU), cfg, ho.o(),
                                ho.l());
  Dev dq = to_dev(q), dk = to_dev(k), dv = to_dev(v);
  DevOut go(T, d);
  gpu::attention_prefill_varlen(view(dq.p, DType::kBF16, {T, d.Hq, d.D}, Device::kCUDA),
                                view(dk.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA),
                                view(dv.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA),
                                view(cu.data(), DType::kI32, {3}, Device::kCPU), cfg, go.o(),
                                go.l());
  compare("NaN/inf q,k,v prefill " + tag, go.host(), ho.host());
  // Chunked prefill over the same sequence (rows 60..99 and 1..3 + a decode row), paged.
  std::vector<const Seq*> sp{&s, &t};
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<std::pair<int, int64_t>> rp;
    if (variant == 0) {
      for (int64_t p = 60; p < 100; ++p) rp.push_back({0, p});
    } else {
      for (int64_t p = jv - 2; p < jv + 2; ++p) rp.push_back({0, p});
      rp.push_back({1, 89});
      rp.push_back({0, jv + 5});
    }
    int64_t maxp = 0;
    for (auto& x : rp)
      if (x.first == 0) maxp = std::max(maxp, x.second);
    Cache c = make_cache(d, sp, {maxp + 1, 90}, 16);
    DevCache dc(c);
    Rows r = make_rows(d, sp, rp);
    const int64_t N = r.N();
    HostOut hp(N, d);
    cpu::attention_paged(view(r.q.data(), DType::kBF16, {N, d.Hq, d.D}, Device::kCPU),
                         view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                         view(r.pos.data(), DType::kI32, {N}, Device::kCPU), host_kv(c), cfg,
                         hp.o(), hp.l());
    Dev dqr = to_dev(r.q);
    DevOut gp(N, d);
    gpu::attention_paged(view(dqr.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA),
                         view(r.seq.data(), DType::kI32, {N}, Device::kCPU),
                         view(r.pos.data(), DType::kI32, {N}, Device::kCPU), dc.kv(false), cfg,
                         gp.o(), gp.l());
    compare(std::string("NaN/inf chunked ") + (variant ? "(short runs) " : "") + tag, gp.host(),
            hp.host());
  }
}

// ---- strided / unaligned views ------------------------------------------------------------------

void run_strided(const Dims& d, int kv_chunk, bool unaligned) {
  AttentionConfig cfg;
  cfg.kv_chunk = kv_chunk;
  const std::vector<int64_t> lens = {70, 5, 129};
  const int64_t T = 70 + 5 + 129;
  // Fused [T, Hq + 2 Hkv, D] (+ pad) buffer: q, k, v are views into it.
  const int64_t W = (d.Hq + 2 * d.Hkv) * d.D + (unaligned ? 3 : 0);
  std::vector<uint16_t> buf = random_bf16(size_t(T * W + 8));
  const int64_t off0 = unaligned ? 1 : 0;
  auto mk = [&](void* base, int64_t off, int64_t H, Device dev) {
    TensorView t = view(static_cast<uint16_t*>(base) + off0 + off, DType::kBF16, {T, H, d.D}, dev);
    t.stride[0] = W;
    return t;
  };
  std::vector<int32_t> cu{0, 70, 75, int32_t(T)};
  HostOut ho(T, d);
  cpu::attention_prefill_varlen(
      mk(buf.data(), 0, d.Hq, Device::kCPU), mk(buf.data(), d.Hq * d.D, d.Hkv, Device::kCPU),
      mk(buf.data(), (d.Hq + d.Hkv) * d.D, d.Hkv, Device::kCPU),
      view(cu.data(), DType::kI32, {4}, Device::kCPU), cfg, ho.o(), ho.l());
  Dev db = to_dev(buf);
  DevOut go(T, d);
  gpu::attention_prefill_varlen(
      mk(db.p, 0, d.Hq, Device::kCUDA), mk(db.p, d.Hq * d.D, d.Hkv, Device::kCUDA),
      mk(db.p, (d.Hq + d.Hkv) * d.D, d.Hkv, Device::kCUDA),
      view(cu.data(), DType::kI32, {4}, Device::kCPU), cfg, go.o(), go.l());
  compare(std::string("prefill fused-qkv views") + (unaligned ? " (unaligned)" : "") + " " +
              cfg_str(d, cfg),
          go.host(), ho.host());
}

// ---- kv_cache_write -------------------------------------------------------------------------

void run_kv_write(const Dims& d) {
  const int64_t T = 37, P = 16, NP = 5;
  std::vector<uint16_t> k = random_bf16(size_t(T * d.Hkv * d.D)),
                        v = random_bf16(size_t(T * d.Hkv * d.D));
  std::vector<int64_t> perm(static_cast<size_t>(NP * P));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g_rng);
  for (int it = 0; it < 3; ++it) {
    std::vector<int32_t> s32(static_cast<size_t>(T));
    std::vector<int64_t> s64(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      s64[size_t(t)] = (t % 5 == 3) ? -1 : perm[size_t(t)];
      s32[size_t(t)] = int32_t(s64[size_t(t)]);
    }
    const size_t cn = size_t(NP * P * d.Hkv * d.D);
    std::vector<uint16_t> kc(cn), vc(cn);
    for (size_t i = 0; i < cn; ++i) {
      kc[i] = uint16_t(i * 7);
      vc[i] = uint16_t(i * 13);
    }
    Dev dk = to_dev(k), dv = to_dev(v), dkc = to_dev(kc), dvc = to_dev(vc), ds32 = to_dev(s32),
        ds64 = to_dev(s64);
    TensorView slot = it == 0   ? view(s32.data(), DType::kI32, {T}, Device::kCPU)
                      : it == 1 ? view(s64.data(), DType::kI64, {T}, Device::kCPU)
                                : view(ds32.p, DType::kI32, {T}, Device::kCUDA);
    cpu::kv_cache_write(view(k.data(), DType::kBF16, {T, d.Hkv, d.D}, Device::kCPU),
                        view(v.data(), DType::kBF16, {T, d.Hkv, d.D}, Device::kCPU),
                        view(s64.data(), DType::kI64, {T}, Device::kCPU),
                        view(kc.data(), DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCPU),
                        view(vc.data(), DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCPU));
    gpu::kv_cache_write(view(dk.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA),
                        view(dv.p, DType::kBF16, {T, d.Hkv, d.D}, Device::kCUDA), slot,
                        view(dkc.p, DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCUDA),
                        view(dvc.p, DType::kBF16, {NP, P, d.Hkv, d.D}, Device::kCUDA));
    CK(cudaDeviceSynchronize());
    auto gk = from_dev<uint16_t>(dkc, cn), gv = from_dev<uint16_t>(dvc, cn);
    bool ok = same_bits("kv_cache_write k", gk.data(), kc.data(), cn, DType::kBF16);
    ok = same_bits("kv_cache_write v", gv.data(), vc.data(), cn, DType::kBF16) && ok;
    report(ok, std::string("kv_cache_write slots ") + (it == 0   ? "i32 host"
                                                       : it == 1 ? "i64 host"
                                                                 : "i32 device"));
  }
}

// ---- bad arguments -----------------------------------------------------------------------------

template <typename F>
void expect_error(const std::string& what, F f, const char* needle = nullptr) {
  try {
    f();
  } catch (const lockstep::Error& e) {
    const bool ok = needle == nullptr || std::strstr(e.what(), needle) != nullptr;
    if (!ok) std::printf("  message: %s\n", e.what());
    report(ok, "error: " + what);
    return;
  }
  report(false, "error: " + what + " (no exception)");
}

void run_errors() {
  const Dims d{8, 4, 64};
  AttentionConfig cfg;
  cfg.kv_chunk = 64;
  Seq s = make_seq(d, 20);
  std::vector<const Seq*> sp{&s};
  Cache c = make_cache(d, sp, {20}, 16);
  DevCache dc(c);
  Dev dq = to_dev(s.q), dk = to_dev(s.k), dv = to_dev(s.v);
  DevOut go(20, d);
  std::vector<int32_t> seq1{0}, pos1{19}, posbad{20}, seqbad{1};
  auto qv = [&](int64_t N) { return view(dq.p, DType::kBF16, {N, d.Hq, d.D}, Device::kCUDA); };
  auto hi = [](std::vector<int32_t>& v) {
    return view(v.data(), DType::kI32, {int64_t(v.size())}, Device::kCPU);
  };
  DevOut o1(1, d);
  expect_error(
      "q_pos >= seq_len",
      [&] { gpu::attention_paged(qv(1), hi(seq1), hi(posbad), dc.kv(false), cfg, o1.o(), o1.l()); },
      "q_pos[0]");
  expect_error(
      "q_seq outside",
      [&] { gpu::attention_paged(qv(1), hi(seqbad), hi(pos1), dc.kv(false), cfg, o1.o(), o1.l()); },
      "q_seq[0]");
  {
    Cache bad = c;
    bad.table[1] = int32_t(bad.NP + 5);
    DevCache db(bad);
    expect_error(
        "page index outside the cache",
        [&] { gpu::attention_paged(qv(1), hi(seq1), hi(pos1), db.kv(false), cfg, o1.o(), o1.l()); },
        "kv.block_table[0][1]");
  }
  expect_error(
      "num_splits = 0",
      [&] {
        gpu::attention_paged_split_kv(qv(1), hi(seq1), hi(pos1), dc.kv(false), cfg, 0, o1.o(),
                                      o1.l());
      },
      "num_splits");
  AttentionConfig bcfg;
  bcfg.kv_chunk = 100;
  expect_error(
      "kv_chunk not a multiple of 64",
      [&] { gpu::attention_paged(qv(1), hi(seq1), hi(pos1), dc.kv(false), bcfg, o1.o(), o1.l()); },
      "kv_chunk");
  std::vector<int32_t> cu{0, 20}, cubad{0, 19};
  auto kvv = [&](void* p) { return view(p, DType::kBF16, {20, d.Hkv, d.D}, Device::kCUDA); };
  expect_error(
      "cu_seqlens not ending at T",
      [&] {
        gpu::attention_prefill_varlen(qv(20), kvv(dk.p), kvv(dv.p), hi(cubad), cfg, go.o(), go.l());
      },
      "cu_seqlens");
  expect_error(
      "q on the host",
      [&] {
        gpu::attention_prefill_varlen(view(s.q.data(), DType::kBF16, {20, d.Hq, d.D}, Device::kCPU),
                                      kvv(dk.p), kvv(dv.p), hi(cu), cfg, go.o(), go.l());
      },
      "'q'");
  expect_error(
      "Hq % Hkv",
      [&] {
        gpu::attention_prefill_varlen(view(dq.p, DType::kBF16, {20, 6, d.D}, Device::kCUDA),
                                      kvv(dk.p), kvv(dv.p), hi(cu), cfg, go.o(), go.l());
      },
      "Hkv");
  expect_error(
      "head_dim not a multiple of 16",
      [&] {
        gpu::attention_prefill_varlen(view(dq.p, DType::kBF16, {20, d.Hq, 40}, Device::kCUDA),
                                      view(dk.p, DType::kBF16, {20, d.Hkv, 40}, Device::kCUDA),
                                      view(dv.p, DType::kBF16, {20, d.Hkv, 40}, Device::kCUDA),
                                      hi(cu), cfg, go.o(), go.l());
      },
      "head_dim");
  expect_error(
      "out dtype",
      [&] {
        gpu::attention_prefill_varlen(qv(20), kvv(dk.p), kvv(dv.p), hi(cu), cfg,
                                      view(go.lse.p, DType::kF32, {20, d.Hq, d.D}, Device::kCUDA),
                                      go.l());
      },
      "'out'");
  std::vector<int32_t> dup{3, 5, 3};
  expect_error(
      "duplicate slots",
      [&] {
        gpu::kv_cache_write(view(dk.p, DType::kBF16, {3, d.Hkv, d.D}, Device::kCUDA),
                            view(dv.p, DType::kBF16, {3, d.Hkv, d.D}, Device::kCUDA), hi(dup),
                            dc.kv(false).k_cache, dc.kv(false).v_cache);
      },
      "more than once");
  std::vector<int32_t> oob{3, 5, int32_t(c.NP * c.P)};
  expect_error(
      "slot outside the cache",
      [&] {
        gpu::kv_cache_write(view(dk.p, DType::kBF16, {3, d.Hkv, d.D}, Device::kCUDA),
                            view(dv.p, DType::kBF16, {3, d.Hkv, d.D}, Device::kCUDA), hi(oob),
                            dc.kv(false).k_cache, dc.kv(false).v_cache);
      },
      "slot_mapping[2]");
  // Merge: states too short for a row's chunks.
  Dev sm(4 * 8), sl(4 * 8), sa(4 * 8 * 64);
  AttentionChunkStates st{view(sm.p, DType::kF32, {1, d.Hq, 1}, Device::kCUDA),
                          view(sl.p, DType::kF32, {1, d.Hq, 1}, Device::kCUDA),
                          view(sa.p, DType::kF32, {1, d.Hq, 1, d.D}, Device::kCUDA)};
  std::vector<int32_t> p70{70};
  expect_error(
      "merge: states hold too few chunks",
      [&] { gpu::attention_merge_chunk_states(st, hi(p70), cfg, o1.o(), o1.l()); }, "chunks");
  // N = 0 is a no-op.
  bool ok = true;
  try {
    std::vector<int32_t> e0;
    gpu::attention_paged(view(dq.p, DType::kBF16, {0, d.Hq, d.D}, Device::kCUDA),
                         view(e0.data(), DType::kI32, {0}, Device::kCPU),
                         view(e0.data(), DType::kI32, {0}, Device::kCPU), dc.kv(false), cfg,
                         view(go.out.p, DType::kBF16, {0, d.Hq, d.D}, Device::kCUDA), TensorView{});
  } catch (const lockstep::Error& e) {
    std::printf("  %s\n", e.what());
    ok = false;
  }
  report(ok, "N = 0 is a no-op");
}

// Runs one section; an exception (a GPU op rejecting valid arguments, a launch failure) is a
// failure of that section and the next one still runs.
template <typename F>
void guard(const std::string& name, F f) {
  try {
    f();
  } catch (const std::exception& e) {
    report(false, name + ": exception: " + e.what());
    cudaGetLastError();
  }
  std::fflush(stdout);
}

}  // namespace

// The scenario checks of test_parity's attention section (argument checks, device metadata,
// special values, strided views, GPU invariance across modes, kv_cache_write).
void run_attention_checks() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Config> cfgs;
  const std::vector<int64_t> lens_full = {1, 3, 17, 63, 64, 65, 130, 1100};
  const std::vector<int64_t> lens_mid = {1, 3, 17, 63, 64, 65, 130, 300};
  const std::vector<int64_t> lens_quick = {1, 3, 17, 64, 65, 130};
  if (g_quick) {
    cfgs.push_back({{8, 4, 64}, 64, 0.0, lens_quick, 16});
    cfgs.push_back({{4, 4, 128}, 128, 0.0, lens_quick, 37});
    cfgs.push_back({{8, 4, 32}, 64, 0.3, lens_quick, 1});
  } else {
    cfgs.push_back({{8, 4, 64}, 64, 0.0, lens_full, 16});
    cfgs.push_back({{16, 8, 128}, 1024, 0.0, lens_full, 37});
    cfgs.push_back({{4, 4, 128}, 128, 0.0, lens_mid, 1});
    cfgs.push_back({{32, 8, 128}, 128, 0.0, lens_full, 64});
    cfgs.push_back({{16, 4, 64}, 1024, 0.0883883, lens_full, 16});
    cfgs.push_back({{8, 4, 32}, 64, 0.3, lens_mid, 37});
    cfgs.push_back({{12, 4, 80}, 64, 0.0, lens_mid, 16});
    cfgs.push_back({{4, 2, 256}, 128, 0.0, lens_mid, 64});
    cfgs.push_back({{2, 1, 512}, 64, 0.0, {1, 17, 65, 130}, 16});
    cfgs.push_back({{16, 1, 64}, 64, 0.0, lens_mid, 16});
  }
  for (const Config& c : cfgs) {
    const auto a = std::chrono::steady_clock::now();
    const std::string name = cfg_str(c.d, AttentionConfig{c.kv_chunk, c.scale});
    guard(name, [&] { run_config(c); });
    std::printf("  config %s: %.1f s\n", name.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  guard("specials 64", [] { run_specials({8, 4, 64}, 64); });
  guard("specials 128", [] { run_specials({4, 2, 128}, 128); });
  if (!g_quick) guard("specials 96", [] { run_specials({8, 8, 96}, 64); });
  guard("strided", [] { run_strided({8, 4, 64}, 64, false); });
  guard("strided unaligned", [] { run_strided({8, 4, 128}, 128, true); });
  guard("kv_cache_write", [] { run_kv_write({8, 4, 64}); });
  guard("errors", [] { run_errors(); });
  std::printf("attention checks: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}
