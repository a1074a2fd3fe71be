// The CUDA baseline backend (make_cuda_baseline_backend, src/engine/cuda/baseline_backend.cc)
// through the OpsBackend interface: every op against the CPU invariant ops (lockstep::cpu::*)
// within bf16-level tolerances (the baseline is ordinary arithmetic, not the contract), device
// metadata == host metadata bit for bit, determinism (same call twice: same bits), the split-KV
// count changing with the batch and changing a row's bits (the point of a baseline), and argument
// errors. Then (unless --quick or --no-bench) timings next to the invariant CUDA GEMM.
//
// Tolerances (per element; ref = the CPU invariant value, computed in fp32 by the contract):
//   GEMM f32        |Δ| <= (K + 2)·2^-24·Σ|x·w|          (+ 2^-7·|ref| when y is bf16)
//   RMSNorm         |Δ| <= 2^-6·|ref| + 2^-20            (two bf16 roundings on each side)
//   RoPE            |Δ| <= 2^-7·|ref| + 2e-3·(|x_i| + |x_i+D/2|)   (fp32 angle, positions < 4096)
//   SiLU·mul        |Δ| <= 2^-7·|ref| + 2^-30
//   attention out   |Δ| <= 2^-7·|ref| + 2^-7·max|v|      (P rounded to bf16 on both sides)
//   attention lse   |Δ| <= 2^-14·(1 + |ref|)
//   log-probs       |Δ| <= 2^-12·(1 + |ref|) for logp, lse and entropy
//   embedding, kv_cache_write, residual_out: bit-exact (value equality, ±0 equal).
// Usage: test_baseline_cuda [--quick] [--no-bench] [seed]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "baseline/cuda/kernels.h"
#include "cuda/gpu_harness.h"
#include "engine/backend.h"
#include "engine/cuda/backends.h"
#include "engine/device.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/runtime.h"
#include "lockstep/ops/activation.h"

using namespace lockstep;
using engine::OpsBackend;

namespace {

using gpu_test::g_quick;
using gpu_test::g_rng;
using gpu_test::report;
const OpsBackend* g_be = nullptr;

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Host data and device copies.

float randn() { return std::normal_distribution<float>(0.0f, 1.0f)(g_rng); }
int64_t randint(int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(g_rng);
}

Tensor host(DType t, std::vector<int64_t> shape) { return Tensor::empty(t, std::move(shape)); }

void fill_bf16(const Tensor& t, float scale = 1.0f) {
  bf16* p = t.ptr<bf16>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(randn() * scale);
}

Tensor to_dev(const TensorView& h) {
  std::vector<int64_t> shape(h.shape, h.shape + h.ndim);
  Tensor d = g_be->empty(h.dtype, shape);
  g_be->copy(d.view(), h);
  return d;
}

Tensor to_host(const TensorView& d) {
  std::vector<int64_t> shape(d.shape, d.shape + d.ndim);
  Tensor h = host(d.dtype, shape);
  g_be->copy(h.view(), d);
  g_be->synchronize();
  return h;
}

// Columns [c0, c1) of the last dimension of a view (a strided sub-view).
TensorView cols(TensorView v, int64_t c0, int64_t c1) {
  v.data = static_cast<char*>(v.data) + c0 * dtype_size(v.dtype);
  v.shape[v.ndim - 1] = c1 - c0;
  return v;
}

// [a, b·c] viewed as [a, b, c].
TensorView split_last(TensorView v, int64_t b, int64_t c) {
  TensorView r = v;
  r.ndim = v.ndim + 1;
  r.shape[v.ndim - 1] = b;
  r.shape[v.ndim] = c;
  r.stride[v.ndim - 1] = c;
  r.stride[v.ndim] = 1;
  return r;
}

// Walks the logical elements of a view of rank <= 4 (any strides), calling f(flat index, offset).
void for_each(const TensorView& v, const std::function<void(int64_t, int64_t)>& f) {
  int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
  for (int d = 0; d < v.ndim; ++d) {
    sh[4 - v.ndim + d] = v.shape[d];
    st[4 - v.ndim + d] = v.stride[d];
  }
  int64_t n = 0;
  for (int64_t a = 0; a < sh[0]; ++a)
    for (int64_t b = 0; b < sh[1]; ++b)
      for (int64_t c = 0; c < sh[2]; ++c)
        for (int64_t d = 0; d < sh[3]; ++d) f(n++, a * st[0] + b * st[1] + c * st[2] + d * st[3]);
}

std::vector<float> values(const TensorView& v) {  // host view -> logical fp32 values
  std::vector<float> out(size_t(v.numel()));
  for_each(v, [&](int64_t i, int64_t off) {
    out[size_t(i)] =
        v.dtype == DType::kBF16 ? bf16_to_f32(v.ptr<const bf16>()[off]) : v.ptr<const float>()[off];
  });
  return out;
}

// got vs ref with a per-element tolerance; reports count, max error and the first failure.
void expect_close(const std::string& what, const std::vector<float>& got,
                  const std::vector<float>& ref, const std::function<double(size_t)>& tol) {
  int64_t bad = 0, first = -1;
  double max_err = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    const bool both_nan = std::isnan(g) && std::isnan(r);
    const double err = both_nan ? 0.0 : std::fabs(g - r);
    if (!(err <= tol(i))) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
    if (!std::isnan(err)) max_err = std::max(max_err, err);
  }
  std::string s = fmt("%s: %zu values, max |err| %.3g", what.c_str(), ref.size(), max_err);
  if (bad)
    s += fmt(", %lld outside tolerance, first [%lld] gpu=%.9g ref=%.9g tol=%.3g", (long long)bad,
             (long long)first, double(got[size_t(first)]), double(ref[size_t(first)]),
             tol(size_t(first)));
  report(bad == 0, s);
}

// Bitwise equality of two host tensors' bytes.
bool same_bits(const Tensor& a, const Tensor& b, int64_t* first = nullptr) {
  if (a.nbytes() != b.nbytes()) return false;
  const size_t es = size_t(dtype_size(a.dtype()));
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(static_cast<const char*>(a.data()) + i * es,
                    static_cast<const char*>(b.data()) + i * es, es) != 0) {
      if (first) *first = i;
      return false;
    }
  return true;
}

int64_t count_diff(const Tensor& a, const Tensor& b) {
  const size_t es = size_t(dtype_size(a.dtype()));
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    n += std::memcmp(static_cast<const char*>(a.data()) + i * es,
                     static_cast<const char*>(b.data()) + i * es, es) != 0;
  return n;
}

template <typename F>
void expect_error(const std::string& what, const std::string& needle, F&& f) {
  gpu_test::expect_error(what, f, needle.c_str());
}

// ---------------------------------------------------------------------------------------------
// GEMM, partials, combine.

// Σ_k |x[m,k]·w[n,k]| per output (the scale of the fp32 rounding bound).
std::vector<double> abs_dot(const Tensor& x, const Tensor& w) {
  const int64_t M = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
  std::vector<double> s(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double a = 0;
      for (int64_t k = 0; k < K; ++k)
        a += std::fabs(double(bf16_to_f32(x.ptr<bf16>()[m * K + k])) *
                       double(bf16_to_f32(w.ptr<bf16>()[n * K + k])));
      s[size_t(m * N + n)] = a;
    }
  return s;
}

void test_gemm() {
  struct C {
    int64_t M, N, K, pad;
  };
  std::vector<C> cases = {{1, 1, 1, 0}, {3, 17, 16, 5}, {17, 111, 333, 0}, {64, 256, 1024, 8}};
  if (!g_quick) cases.push_back({300, 1000, 2048, 0});
  for (const C& c : cases) {
    Tensor x = host(DType::kBF16, {c.M, c.K}), w = host(DType::kBF16, {c.N, c.K});
    fill_bf16(x);
    fill_bf16(w);
    Tensor ref = host(DType::kF32, {c.M, c.N});
    cpu::gemm_bf16_nt(x.view(), w.view(), nullptr, GemmConfig{1}, ref.view());
    const std::vector<double> s = abs_dot(x, w);
    // x in a padded device buffer (row stride K + pad).
    Tensor xb = g_be->empty(DType::kBF16, {c.M, c.K + c.pad});
    const TensorView xd = cols(xb.view(), 0, c.K);
    g_be->copy(xd, x.view());
    Tensor wd = to_dev(w.view());
    for (DType yt : {DType::kF32, DType::kBF16}) {
      Tensor yd = g_be->empty(yt, {c.M, c.N});
      g_be->gemm(xd, wd.view(), GemmConfig{1}, yd.view());
      const std::vector<float> got = values(to_host(yd.view()).view());
      const std::vector<float> r = values(ref.view());
      expect_close(fmt("gemm M=%lld N=%lld K=%lld y=%s", (long long)c.M, (long long)c.N,
                       (long long)c.K, dtype_name(yt)),
                   got, r, [&](size_t i) {
                     return (c.K + 2) * std::ldexp(s[i], -24) +
                            (yt == DType::kBF16 ? std::ldexp(std::fabs(r[i]), -7) : 0.0);
                   });
    }
  }
  // A row alone (M = 1) vs inside M = 64: cuBLAS may pick another kernel (informational).
  {
    const int64_t M = 64, N = 512, K = 4096;
    Tensor x = host(DType::kBF16, {M, K}), w = host(DType::kBF16, {N, K});
    fill_bf16(x);
    fill_bf16(w);
    Tensor xd = to_dev(x.view()), wd = to_dev(w.view());
    Tensor yb = g_be->empty(DType::kF32, {M, N}), y1 = g_be->empty(DType::kF32, {1, N});
    g_be->gemm(xd.view(), wd.view(), GemmConfig{1}, yb.view());
    g_be->gemm(xd.view().rows(5, 6), wd.view(), GemmConfig{1}, y1.view());
    Tensor hb = to_host(yb.view()), h1 = to_host(y1.view());
    int64_t diff = 0;
    for (int64_t n = 0; n < N; ++n)
      diff += std::memcmp(h1.ptr<float>() + n, hb.ptr<float>() + 5 * N + n, 4) != 0;
    std::printf(
        "info gemm row 5 alone (M=1) vs in M=64, K=%lld: %lld of %lld fp32 outputs differ\n",
        (long long)K, (long long)diff, (long long)N);
  }
}

void test_gemm_tp() {
  const int64_t M = g_quick ? 7 : 33, N = 200, K = 1024;
  Tensor x = host(DType::kBF16, {M, K}), w = host(DType::kBF16, {N, K});
  fill_bf16(x);
  fill_bf16(w);
  Tensor ref = host(DType::kF32, {M, N});
  cpu::gemm_bf16_nt(x.view(), w.view(), nullptr, GemmConfig{4}, ref.view());
  const std::vector<double> s = abs_dot(x, w);
  Tensor xd = to_dev(x.view()), wd = to_dev(w.view());
  const GemmConfig cfg{4};
  Tensor tp1;
  for (int tp : {1, 2, 4}) {
    std::vector<Tensor> parts;
    std::vector<TensorView> pv;
    for (int r = 0; r < tp; ++r) {
      const GemmKRange kr = gemm_tp_k_range(cfg, K, tp, r);
      parts.push_back(g_be->empty(DType::kF32, {M, N}));
      g_be->gemm_partial(cols(xd.view(), kr.begin, kr.end), cols(wd.view(), kr.begin, kr.end), K,
                         tp, r, cfg, parts.back().view());
      pv.push_back(parts.back().view());
    }
    Tensor y = g_be->empty(DType::kF32, {M, N});
    g_be->gemm_combine(pv, y.view());
    Tensor yh = to_host(y.view());
    expect_close(fmt("gemm_partial + gemm_combine tp=%d K=%lld", tp, (long long)K),
                 values(yh.view()), values(ref.view()),
                 [&](size_t i) { return (K + 2 + tp) * std::ldexp(s[i], -24); });
    if (tp == 1) {
      tp1 = std::move(yh);
    } else {
      std::printf("info tp=%d vs tp=1 (rank-order sum): %lld of %lld fp32 outputs differ\n", tp,
                  (long long)count_diff(tp1, yh), (long long)(M * N));
    }
    if (tp == 2) {  // in place into partial 0, bf16 output from the same partials
      Tensor yb = g_be->empty(DType::kBF16, {M, N});
      g_be->gemm_combine(pv, yb.view());
      g_be->gemm_combine(pv, pv[0]);
      Tensor a = to_host(pv[0]), b = to_host(yb.view());
      int64_t bad = 0;
      for (int64_t i = 0; i < M * N; ++i)
        bad += f32_to_bf16(a.ptr<float>()[i]).bits != b.ptr<bf16>()[i].bits;
      report(bad == 0 && same_bits(a, yh),
             fmt("gemm_combine in place (y = partials[0]) and bf16 = round(f32): %lld differ",
                 (long long)bad));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise.

void test_rmsnorm() {
  struct C {
    int64_t T, heads, D;  // heads == 0: [T, D] rows
  };
  std::vector<C> cases = {{1, 0, 16}, {3, 0, 100}, {17, 0, 1024}, {5, 8, 128}};
  if (!g_quick) cases.push_back({300, 0, 4096});
  const RmsNormConfig cfg{1e-6f};
  for (const C& c : cases) {
    const int64_t H = c.D, R = c.heads ? c.heads : 1;
    // x as a strided view: [T, R·D + 8] buffer, the first R·D columns.
    Tensor xh = host(DType::kBF16, {c.T, R * H}), rh = host(DType::kBF16, {c.T, R * H}),
           wh = host(DType::kBF16, {H});
    fill_bf16(xh, 3.0f);
    fill_bf16(rh, 2.0f);
    fill_bf16(wh);
    auto shaped = [&](const TensorView& v) { return c.heads ? split_last(v, c.heads, H) : v; };
    Tensor xb = g_be->empty(DType::kBF16, {c.T, R * H + 8});
    g_be->copy(cols(xb.view(), 0, R * H), xh.view());
    const TensorView xd = shaped(cols(xb.view(), 0, R * H));
    Tensor rd = to_dev(rh.view()), wd = to_dev(wh.view());
    Tensor yd = g_be->empty(DType::kBF16, {c.T, R * H}),
           rod = g_be->empty(DType::kBF16, {c.T, R * H});
    // CPU references.
    Tensor yref = host(DType::kBF16, {c.T, R * H}), roref = host(DType::kBF16, {c.T, R * H}),
           y2ref = host(DType::kBF16, {c.T, R * H});
    cpu::rmsnorm(shaped(xh.view()), wh.view(), cfg, shaped(yref.view()));
    cpu::rmsnorm_residual(shaped(xh.view()), shaped(rh.view()), wh.view(), cfg,
                          shaped(roref.view()), shaped(y2ref.view()));
    auto tol = [&](const std::vector<float>& r) {
      return [&r](size_t i) { return std::ldexp(std::fabs(r[i]), -6) + 0x1p-20; };
    };
    const std::string shape =
        c.heads ? fmt("[%lld, %lld, %lld]", (long long)c.T, (long long)c.heads, (long long)c.D)
                : fmt("[%lld, %lld]", (long long)c.T, (long long)c.D);
    g_be->rmsnorm(xd, wd.view(), cfg, shaped(yd.view()));
    const std::vector<float> r1 = values(yref.view());
    expect_close("rmsnorm " + shape, values(to_host(yd.view()).view()), r1, tol(r1));
    g_be->rmsnorm_residual(xd, shaped(rd.view()), wd.view(), cfg, shaped(rod.view()),
                           shaped(yd.view()));
    const std::vector<float> r2 = values(y2ref.view());
    expect_close("rmsnorm_residual y " + shape, values(to_host(yd.view()).view()), r2, tol(r2));
    report(same_bits(to_host(rod.view()), roref), "rmsnorm_residual residual_out bitwise " + shape);
    // In place: y = x, residual_out = residual.
    g_be->rmsnorm_residual(xd, shaped(rd.view()), wd.view(), cfg, shaped(rd.view()), xd);
    Tensor xin = host(DType::kBF16, {c.T, R * H});
    g_be->copy(xin.view(), cols(xb.view(), 0, R * H));
    g_be->synchronize();
    expect_close("rmsnorm_residual in place " + shape, values(xin.view()), r2, tol(r2));
    report(same_bits(to_host(rd.view()), roref), "rmsnorm_residual in place residual " + shape);
  }
}

void test_rope() {
  for (int64_t D : {int64_t(64), int64_t(128)}) {
    const int64_t T = g_quick ? 9 : 257, heads = 5;
    const RopeTable table = RopeTable::build(RopeConfig{D, 1e6, 4096});
    // x = the first heads·D columns of a fused [T, (heads + 2)·D] buffer.
    Tensor xh = host(DType::kBF16, {T, heads * D});
    fill_bf16(xh, 2.0f);
    for (DType pt : {DType::kI32, DType::kI64}) {
      Tensor pos = host(pt, {T});
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = t == 0 ? 4095 : randint(0, 4095);
        if (pt == DType::kI32) {
          pos.ptr<int32_t>()[t] = int32_t(p);
        } else {
          pos.ptr<int64_t>()[t] = p;
        }
      }
      Tensor ref = host(DType::kBF16, {T, heads * D});
      cpu::rope(split_last(xh.view(), heads, D), pos.view(), table,
                split_last(ref.view(), heads, D));
      Tensor buf = g_be->empty(DType::kBF16, {T, (heads + 2) * D});
      const TensorView xd = split_last(cols(buf.view(), 0, heads * D), heads, D);
      g_be->copy(cols(buf.view(), 0, heads * D), xh.view());
      Tensor yd = g_be->empty(DType::kBF16, {T, heads * D});
      Tensor posd = to_dev(pos.view());
      g_be->rope(xd, posd.view(), table, split_last(yd.view(), heads, D));
      const std::vector<float> r = values(ref.view()), xv = values(xh.view());
      auto tol = [&](size_t i) {
        const size_t row = i / size_t(D), j = i % size_t(D), h = size_t(D / 2);
        const size_t a = row * size_t(D) + (j < h ? j : j - h);
        return std::ldexp(std::fabs(r[i]), -7) + 2e-3 * (std::fabs(xv[a]) + std::fabs(xv[a + h]));
      };
      Tensor got = to_host(yd.view());
      expect_close(fmt("rope D=%lld positions %s", (long long)D, dtype_name(pt)),
                   values(got.view()), r, tol);
      // In place (y = x): same bits.
      g_be->rope(xd, posd.view(), table, xd);
      Tensor inplace = host(DType::kBF16, {T, heads * D});
      g_be->copy(inplace.view(), cols(buf.view(), 0, heads * D));
      g_be->synchronize();
      report(same_bits(inplace, got), fmt("rope D=%lld in place == out of place", (long long)D));
      g_be->copy(cols(buf.view(), 0, heads * D), xh.view());
    }
  }
}

void test_silu_embedding() {
  {
    const int64_t T = g_quick ? 5 : 129, I = 333;
    Tensor gu = host(DType::kBF16, {T, 2 * I});
    fill_bf16(gu, 3.0f);
    Tensor ref = host(DType::kBF16, {T, I});
    cpu::silu_mul(cols(gu.view(), 0, I), cols(gu.view(), I, 2 * I), ref.view());
    Tensor gud = to_dev(gu.view()), out = g_be->empty(DType::kBF16, {T, I});
    g_be->silu_mul(cols(gud.view(), 0, I), cols(gud.view(), I, 2 * I), out.view());
    const std::vector<float> r = values(ref.view());
    expect_close("silu_mul (gate, up = halves of one buffer)", values(to_host(out.view()).view()),
                 r, [&](size_t i) { return std::ldexp(std::fabs(r[i]), -7) + 0x1p-30; });
  }
  const int64_t V = 1000, H = 96, T = g_quick ? 7 : 300;
  Tensor table = host(DType::kBF16, {V, H});
  fill_bf16(table);
  Tensor td = to_dev(table.view());
  for (DType it : {DType::kI32, DType::kI64}) {
    Tensor ids = host(it, {T});
    for (int64_t t = 0; t < T; ++t) {
      const int64_t v = t == 0 ? V - 1 : randint(0, V - 1);
      if (it == DType::kI32) {
        ids.ptr<int32_t>()[t] = int32_t(v);
      } else {
        ids.ptr<int64_t>()[t] = v;
      }
    }
    Tensor ref = host(DType::kBF16, {T, H});
    cpu::embedding(ids.view(), table.view(), ref.view());
    Tensor out = g_be->empty(DType::kBF16, {T, H});
    Tensor idd = to_dev(ids.view());
    g_be->embedding(idd.view(), td.view(), out.view());
    report(same_bits(to_host(out.view()), ref), fmt("embedding ids %s bitwise", dtype_name(it)));
    // Vocab parallel over 3 ranks, combined in rank order.
    std::vector<Tensor> parts;
    std::vector<TensorView> pv;
    for (int r = 0; r < 3; ++r) {
      const VocabShard sh = vocab_shard(V, r, 3);
      parts.push_back(g_be->empty(DType::kBF16, {T, H}));
      g_be->embedding_vocab_parallel(idd.view(), td.view().rows(sh.begin, sh.end), sh, V,
                                     parts.back().view());
      pv.push_back(parts.back().view());
    }
    Tensor comb = g_be->empty(DType::kBF16, {T, H});
    g_be->embedding_combine(pv, comb.view());
    const std::vector<float> got = values(to_host(comb.view()).view()), r = values(ref.view());
    expect_close(fmt("embedding_vocab_parallel x3 + embedding_combine ids %s", dtype_name(it)), got,
                 r, [](size_t) { return 0.0; });
  }
}

void test_kv_write() {
  const int64_t NP = 9, P = 7, Hkv = 3, D = 64, T = 40;
  Tensor k = host(DType::kBF16, {T, Hkv, D}), v = host(DType::kBF16, {T, Hkv, D});
  fill_bf16(k);
  fill_bf16(v);
  std::vector<int64_t> slots(size_t(NP * P));
  for (int64_t i = 0; i < NP * P; ++i) slots[size_t(i)] = i;
  std::shuffle(slots.begin(), slots.end(), g_rng);
  Tensor sm = host(DType::kI64, {T});
  for (int64_t t = 0; t < T; ++t) sm.ptr<int64_t>()[t] = t % 5 == 3 ? -1 : slots[size_t(t)];
  Tensor kc = host(DType::kBF16, {NP, P, Hkv, D}), vc = host(DType::kBF16, {NP, P, Hkv, D});
  fill_bf16(kc);
  fill_bf16(vc);
  Tensor kcd = to_dev(kc.view()), vcd = to_dev(vc.view());
  cpu::kv_cache_write(k.view(), v.view(), sm.view(), kc.view(), vc.view());
  g_be->kv_cache_write(to_dev(k.view()).view(), to_dev(v.view()).view(), sm.view(), kcd.view(),
                       vcd.view());
  report(same_bits(to_host(kcd.view()), kc) && same_bits(to_host(vcd.view()), vc),
         "kv_cache_write (slots shuffled, some -1) bitwise incl. untouched slots");
}

// ---------------------------------------------------------------------------------------------
// Attention.

struct AttnTol {
  float vmax;
  std::function<double(size_t)> out(const std::vector<float>& r) const {
    const float vm = vmax;
    return [&r, vm](size_t i) { return std::ldexp(std::fabs(r[i]), -7) + std::ldexp(vm, -7); };
  }
  static std::function<double(size_t)> lse(const std::vector<float>& r) {
    return [&r](size_t i) { return std::ldexp(1.0 + std::fabs(r[i]), -14); };
  }
};

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (float x : values(t.view())) m = std::max(m, std::fabs(x));
  return m;
}

void test_prefill() {
  struct C {
    int64_t Hq, Hkv, D;
    std::vector<int32_t> lens;
  };
  std::vector<C> cases = {{8, 2, 128, {0, 1, 17, 64, 65, 300}},
                          {4, 4, 64, {3, 100, 0, 129}},
                          {2, 1, 256, {70, 5}},
                          {3, 1, 80, {33}}};
  if (!g_quick) cases.push_back({16, 4, 128, {1000, 1, 511, 200}});
  const AttentionConfig cfg;
  for (const C& c : cases) {
    const int64_t B = int64_t(c.lens.size());
    Tensor cu = host(DType::kI32, {B + 1});
    cu.ptr<int32_t>()[0] = 0;
    for (int64_t b = 0; b < B; ++b) cu.ptr<int32_t>()[b + 1] = cu.ptr<int32_t>()[b] + c.lens[b];
    const int64_t T = cu.ptr<int32_t>()[B], W = (c.Hq + 2 * c.Hkv) * c.D;
    Tensor qkv = host(DType::kBF16, {T, W});
    fill_bf16(qkv);
    auto parts = [&](const TensorView& v) {
      struct {
        TensorView q, k, v;
      } r;
      r.q = split_last(cols(v, 0, c.Hq * c.D), c.Hq, c.D);
      r.k = split_last(cols(v, c.Hq * c.D, (c.Hq + c.Hkv) * c.D), c.Hkv, c.D);
      r.v = split_last(cols(v, (c.Hq + c.Hkv) * c.D, W), c.Hkv, c.D);
      return r;
    };
    const auto h = parts(qkv.view());
    Tensor oref = host(DType::kBF16, {T, c.Hq, c.D}), lref = host(DType::kF32, {T, c.Hq});
    cpu::attention_prefill_varlen(h.q, h.k, h.v, cu.view(), cfg, oref.view(), lref.view());
    Tensor qkvd = to_dev(qkv.view());
    const auto d = parts(qkvd.view());
    Tensor od = g_be->empty(DType::kBF16, {T, c.Hq, c.D}), ld = g_be->empty(DType::kF32, {T, c.Hq});
    g_be->attention_prefill_varlen(d.q, d.k, d.v, cu.view(), cfg, od.view(), ld.view());
    Tensor og = to_host(od.view()), lg = to_host(ld.view());
    const std::string name = fmt("prefill Hq=%lld Hkv=%lld D=%lld T=%lld B=%lld", (long long)c.Hq,
                                 (long long)c.Hkv, (long long)c.D, (long long)T, (long long)B);
    const std::vector<float> r = values(oref.view()), rl = values(lref.view());
    AttnTol tol{max_abs(qkv)};
    expect_close(name + " out", values(og.view()), r, tol.out(r));
    expect_close(name + " lse", values(lg.view()), rl, AttnTol::lse(rl));
    // Device cu_seqlens and no lse: the same bits.
    Tensor cud = to_dev(cu.view());
    Tensor od2 = g_be->empty(DType::kBF16, {T, c.Hq, c.D});
    g_be->attention_prefill_varlen(d.q, d.k, d.v, cud.view(), cfg, od2.view(), TensorView{});
    report(same_bits(to_host(od2.view()), og), name + " device cu_seqlens, no lse: same bits");
  }
}

// A paged KV cache with shuffled pages holding S sequences (lengths lens), filled from k/v.
struct PagedCase {
  int64_t Hq, Hkv, D, P, NP, MP;
  std::vector<int32_t> lens;
  Tensor kc, vc, table, seq_lens;
};

PagedCase make_paged(int64_t Hq, int64_t Hkv, int64_t D, int64_t P, std::vector<int32_t> lens) {
  PagedCase c;
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.D = D;
  c.P = P;
  c.lens = lens;
  const int64_t S = int64_t(lens.size());
  int64_t pages = 0;
  c.MP = 1;
  for (int32_t l : lens) {
    pages += (l + P - 1) / P;
    c.MP = std::max<int64_t>(c.MP, (l + P - 1) / P);
  }
  c.NP = pages + 3;
  c.kc = host(DType::kBF16, {c.NP, P, Hkv, D});
  c.vc = host(DType::kBF16, {c.NP, P, Hkv, D});
  fill_bf16(c.kc);
  fill_bf16(c.vc);
  std::vector<int32_t> perm(size_t(c.NP));
  for (int64_t i = 0; i < c.NP; ++i) perm[size_t(i)] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), g_rng);
  c.table = host(DType::kI32, {S, c.MP});
  c.seq_lens = host(DType::kI32, {S});
  int64_t next = 0;
  for (int64_t s = 0; s < S; ++s) {
    c.seq_lens.ptr<int32_t>()[s] = lens[size_t(s)];
    for (int64_t i = 0; i < c.MP; ++i)
      c.table.ptr<int32_t>()[s * c.MP + i] =
          i < (lens[size_t(s)] + P - 1) / P ? perm[size_t(next++)] : -1;
  }
  return c;
}

struct PagedRun {
  Tensor out, lse;
};

void test_paged() {
  const AttentionConfig cfg{256, 0.0};
  struct C {
    int64_t Hq, Hkv, D, P;
    std::vector<int32_t> lens;
  };
  std::vector<C> cases = {{8, 2, 128, 16, {1, 17, 300, 1025}},
                          {4, 1, 64, 7, {50, 3, 129}},
                          {6, 6, 256, 5, {90}},
                          {16, 2, 128, 16, {700, 65}}};
  if (!g_quick) cases.push_back({32, 8, 128, 16, {3000, 2000, 1, 4100}});
  for (const C& cc : cases) {
    PagedCase c = make_paged(cc.Hq, cc.Hkv, cc.D, cc.P, cc.lens);
    const int64_t S = int64_t(cc.lens.size());
    // Rows: each sequence's decode row (pos = len - 1) and a chunk of up to 5 earlier positions.
    std::vector<int32_t> rs, rp;
    for (int64_t s = 0; s < S; ++s) {
      const int32_t len = cc.lens[size_t(s)];
      for (int32_t p = std::max(0, len - 6); p < len; ++p) {
        rs.push_back(int32_t(s));
        rp.push_back(p);
      }
    }
    const int64_t N = int64_t(rs.size());
    Tensor qs = host(DType::kI32, {N}), qp = host(DType::kI32, {N});
    std::memcpy(qs.data(), rs.data(), size_t(N) * 4);
    std::memcpy(qp.data(), rp.data(), size_t(N) * 4);
    Tensor q = host(DType::kBF16, {N, cc.Hq, cc.D});
    fill_bf16(q);
    PagedKv kvh{c.kc.view(), c.vc.view(), c.table.view(), c.seq_lens.view()};
    Tensor oref = host(DType::kBF16, {N, cc.Hq, cc.D}), lref = host(DType::kF32, {N, cc.Hq});
    cpu::attention_paged(q.view(), qs.view(), qp.view(), kvh, cfg, oref.view(), lref.view());
    Tensor kcd = to_dev(c.kc.view()), vcd = to_dev(c.vc.view()), qd = to_dev(q.view());
    PagedKv kvd{kcd.view(), vcd.view(), c.table.view(), c.seq_lens.view()};
    const std::string name = fmt("paged Hq=%lld Hkv=%lld D=%lld P=%lld rows=%lld", (long long)cc.Hq,
                                 (long long)cc.Hkv, (long long)cc.D, (long long)cc.P, (long long)N);
    const std::vector<float> r = values(oref.view()), rl = values(lref.view());
    AttnTol tol{max_abs(c.vc)};
    auto run = [&](int splits, const PagedKv& kv, const TensorView& s, const TensorView& p) {
      PagedRun pr{g_be->empty(DType::kBF16, {N, cc.Hq, cc.D}),
                  g_be->empty(DType::kF32, {N, cc.Hq})};
      if (splits == 0) {
        g_be->attention_paged(qd.view(), s, p, kv, cfg, pr.out.view(), pr.lse.view());
      } else {
        g_be->attention_paged_split_kv(qd.view(), s, p, kv, cfg, splits, pr.out.view(),
                                       pr.lse.view());
      }
      return PagedRun{to_host(pr.out.view()), to_host(pr.lse.view())};
    };
    const PagedRun base = run(0, kvd, qs.view(), qp.view());
    expect_close(name + " out", values(base.out.view()), r, tol.out(r));
    expect_close(name + " lse", values(base.lse.view()), rl, AttnTol::lse(rl));
    for (int sp : {1, 3, 7}) {
      const PagedRun f = run(sp, kvd, qs.view(), qp.view());
      expect_close(fmt("%s split_kv=%d out", name.c_str(), sp), values(f.out.view()), r,
                   tol.out(r));
      expect_close(fmt("%s split_kv=%d lse", name.c_str(), sp), values(f.lse.view()), rl,
                   AttnTol::lse(rl));
    }
    // Device metadata: same bits as host metadata; and a rerun: same bits.
    Tensor td = to_dev(c.table.view()), sld = to_dev(c.seq_lens.view()), qsd = to_dev(qs.view()),
           qpd = to_dev(qp.view());
    const PagedRun dv =
        run(0, PagedKv{kcd.view(), vcd.view(), td.view(), sld.view()}, qsd.view(), qpd.view());
    report(same_bits(dv.out, base.out) && same_bits(dv.lse, base.lse),
           name + " device metadata == host metadata (bits)");
    const PagedRun again = run(0, kvd, qs.view(), qp.view());
    report(same_bits(again.out, base.out) && same_bits(again.lse, base.lse),
           name + " deterministic (same call twice: same bits)");
  }
}

void test_cascade() {
  const AttentionConfig cfg{256, 0.0};
  const int64_t Hq = 8, Hkv = 2, D = 128, P = 16;
  // Two groups: prefix lengths 100 and 37, 3 + 2 sequences, plus one unshared sequence.
  const std::vector<int32_t> shared = {100, 37};
  const std::vector<int32_t> group = {0, 0, 0, 1, 1, -1};
  const std::vector<int32_t> lens = {130, 101, 300, 37, 90, 64};
  const int64_t S = int64_t(lens.size()), GR = 2;
  // Full per-sequence table (reference, cpu::attention_paged) and the cascade tables.
  PagedCase c = make_paged(Hq, Hkv, D, P, lens);
  // Sequences of a group copy the group leader's prefix pages' contents into... simpler: the
  // prefix pages are the leader's pages; members' own pages below shared_len are set to -1 and
  // the reference table points them at the leader's pages.
  Tensor ptab = host(DType::kI32, {GR, c.MP}), sl = host(DType::kI32, {GR}),
         sg = host(DType::kI32, {S});
  Tensor own = host(DType::kI32, {S, c.MP}), full = host(DType::kI32, {S, c.MP});
  std::memcpy(own.data(), c.table.data(), size_t(own.nbytes()));
  std::memcpy(full.data(), c.table.data(), size_t(full.nbytes()));
  const int64_t leader[2] = {0, 3};
  for (int64_t g = 0; g < GR; ++g) {
    sl.ptr<int32_t>()[g] = shared[size_t(g)];
    for (int64_t i = 0; i < c.MP; ++i)
      ptab.ptr<int32_t>()[g * c.MP + i] = c.table.ptr<int32_t>()[leader[g] * c.MP + i];
  }
  for (int64_t s = 0; s < S; ++s) {
    sg.ptr<int32_t>()[s] = group[size_t(s)];
    const int32_t g = group[size_t(s)];
    if (g < 0) continue;
    // Pages wholly below shared_len: own entry -1 (never read), full entry = the prefix page.
    // The page holding position shared_len (if shared by both) must have the prefix contents
    // below shared_len: copy the leader's page contents into the member's own page there.
    const int64_t slen = shared[size_t(g)];
    for (int64_t i = 0; i < c.MP; ++i) {
      if ((i + 1) * P <= slen) {
        own.ptr<int32_t>()[s * c.MP + i] = -1;
        full.ptr<int32_t>()[s * c.MP + i] = ptab.ptr<int32_t>()[g * c.MP + i];
      } else if (i * P < slen && s != leader[g]) {
        const int64_t dst = c.table.ptr<int32_t>()[s * c.MP + i],
                      src = ptab.ptr<int32_t>()[g * c.MP + i];
        for (int64_t off = 0; off < slen - i * P; ++off) {
          const size_t n = size_t(Hkv * D) * sizeof(bf16);
          std::memcpy(c.kc.ptr<bf16>() + (dst * P + off) * Hkv * D,
                      c.kc.ptr<bf16>() + (src * P + off) * Hkv * D, n);
          std::memcpy(c.vc.ptr<bf16>() + (dst * P + off) * Hkv * D,
                      c.vc.ptr<bf16>() + (src * P + off) * Hkv * D, n);
        }
      }
    }
  }
  std::vector<int32_t> rs, rp;
  for (int64_t s = 0; s < S; ++s)
    for (int32_t p : {lens[size_t(s)] - 1, lens[size_t(s)] / 2}) {
      rs.push_back(int32_t(s));
      rp.push_back(p);
    }
  const int64_t N = int64_t(rs.size());
  Tensor qs = host(DType::kI32, {N}), qp = host(DType::kI32, {N}),
         q = host(DType::kBF16, {N, Hq, D});
  std::memcpy(qs.data(), rs.data(), size_t(N) * 4);
  std::memcpy(qp.data(), rp.data(), size_t(N) * 4);
  fill_bf16(q);
  Tensor oref = host(DType::kBF16, {N, Hq, D}), lref = host(DType::kF32, {N, Hq});
  cpu::attention_paged(q.view(), qs.view(), qp.view(),
                       PagedKv{c.kc.view(), c.vc.view(), full.view(), c.seq_lens.view()}, cfg,
                       oref.view(), lref.view());
  Tensor kcd = to_dev(c.kc.view()), vcd = to_dev(c.vc.view()), qd = to_dev(q.view());
  Tensor od = g_be->empty(DType::kBF16, {N, Hq, D}), ld = g_be->empty(DType::kF32, {N, Hq});
  const SharedPrefix pre{ptab.view(), sl.view(), sg.view()};
  g_be->attention_paged_cascade(qd.view(), qs.view(), qp.view(),
                                PagedKv{kcd.view(), vcd.view(), own.view(), c.seq_lens.view()}, pre,
                                cfg, od.view(), ld.view());
  const std::vector<float> r = values(oref.view()), rl = values(lref.view());
  AttnTol tol{max_abs(c.vc)};
  expect_close("cascade (2 groups + 1 unshared) out", values(to_host(od.view()).view()), r,
               tol.out(r));
  expect_close("cascade lse", values(to_host(ld.view()).view()), rl, AttnTol::lse(rl));
}

// The point of a baseline: the split-KV count follows the batch, and so do a row's bits. Every
// row of a 64-row decode batch is computed again alone (more splits); the bits must differ
// somewhere (bf16 outputs or fp32 lse), and both results must still be correct attention.
void test_batch_dependence() {
  const AttentionConfig cfg{1024, 0.0};
  const int64_t Hq = 8, Hkv = 2, D = 128, P = 16, ctx = g_quick ? 1500 : 3000, Nb = 64;
  // One sequence's pages, shared by all Nb rows' tables (any table may point at any page).
  PagedCase c = make_paged(Hq, Hkv, D, P, {int32_t(ctx)});
  Tensor table = host(DType::kI32, {Nb, c.MP}), sl = host(DType::kI32, {Nb});
  Tensor q = host(DType::kBF16, {Nb, Hq, D});
  fill_bf16(q);
  Tensor qs = host(DType::kI32, {Nb}), qp = host(DType::kI32, {Nb});
  for (int64_t i = 0; i < Nb; ++i) {
    std::memcpy(table.ptr<int32_t>() + i * c.MP, c.table.ptr<int32_t>(), size_t(c.MP) * 4);
    sl.ptr<int32_t>()[i] = int32_t(ctx);
    qs.ptr<int32_t>()[i] = int32_t(i);
    qp.ptr<int32_t>()[i] = int32_t(ctx - 1);
  }
  Tensor kcd = to_dev(c.kc.view()), vcd = to_dev(c.vc.view()), qd = to_dev(q.view());
  const PagedKv kv{kcd.view(), vcd.view(), table.view(), sl.view()};
  Tensor ob = g_be->empty(DType::kBF16, {Nb, Hq, D}), lb = g_be->empty(DType::kF32, {Nb, Hq});
  g_be->attention_paged(qd.view(), qs.view(), qp.view(), kv, cfg, ob.view(), lb.view());
  Tensor o1 = g_be->empty(DType::kBF16, {Nb, Hq, D}), l1 = g_be->empty(DType::kF32, {Nb, Hq});
  for (int64_t r = 0; r < Nb; ++r)
    g_be->attention_paged(qd.view().rows(r, r + 1), qs.view().rows(r, r + 1),
                          qp.view().rows(r, r + 1), kv, cfg, o1.view().rows(r, r + 1),
                          l1.view().rows(r, r + 1));
  Tensor hb = to_host(ob.view()), hlb = to_host(lb.view()), h1 = to_host(o1.view()),
         hl1 = to_host(l1.view());
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int s1 = cuda::baseline::paged_num_splits(1, Hkv, Hq / Hkv, c.MP * P, sms);
  const int sb = cuda::baseline::paged_num_splits(Nb, Hkv, Hq / Hkv, c.MP * P, sms);
  const int64_t dout = count_diff(h1, hb), dlse = count_diff(hl1, hlb);
  int64_t rows = 0;
  for (int64_t r = 0; r < Nb; ++r) {
    bool differs =
        std::memcmp(h1.ptr<bf16>() + r * Hq * D, hb.ptr<bf16>() + r * Hq * D, size_t(Hq * D) * 2) !=
            0 ||
        std::memcmp(hl1.ptr<float>() + r * Hq, hlb.ptr<float>() + r * Hq, size_t(Hq) * 4) != 0;
    rows += differs;
  }
  report(s1 != sb && dlse + dout > 0,
         fmt("batch dependence: each of %lld decode rows (ctx %lld) alone: %d splits, in the "
             "batch: %d splits; %lld rows differ (%lld of %lld bf16 outputs, %lld of %lld fp32 "
             "lse)",
             (long long)Nb, (long long)ctx, s1, sb, (long long)rows, (long long)dout,
             (long long)(Nb * Hq * D), (long long)dlse, (long long)(Nb * Hq)));
  // Both are still correct attention (row 17 against the CPU).
  const int64_t r = 17;
  Tensor oref = host(DType::kBF16, {1, Hq, D}), lref = host(DType::kF32, {1, Hq});
  cpu::attention_paged(q.view().rows(r, r + 1), qs.view().rows(r, r + 1), qp.view().rows(r, r + 1),
                       PagedKv{c.kc.view(), c.vc.view(), table.view(), sl.view()}, cfg, oref.view(),
                       lref.view());
  const std::vector<float> rr = values(oref.view()), rl = values(lref.view());
  AttnTol tol{max_abs(c.vc)};
  std::vector<float> alone(size_t(Hq * D)), in_batch(size_t(Hq * D));
  for (int64_t i = 0; i < Hq * D; ++i) {
    alone[size_t(i)] = bf16_to_f32(h1.ptr<bf16>()[r * Hq * D + i]);
    in_batch[size_t(i)] = bf16_to_f32(hb.ptr<bf16>()[r * Hq * D + i]);
  }
  expect_close("batch dependence: row 17 alone vs cpu", alone, rr, tol.out(rr));
  expect_close("batch dependence: row 17 in the batch vs cpu", in_batch, rr, tol.out(rr));
}

// ---------------------------------------------------------------------------------------------
// Log-probs and sampling.

std::function<double(size_t)> lp_tol(const std::vector<float>& r) {
  return [&r](size_t i) { return std::ldexp(1.0 + std::fabs(r[i]), -12); };
}

void test_logprob() {
  struct C {
    int64_t T, H, V;
    float temperature;
  };
  std::vector<C> cases = {{1, 64, 17, 1.0f}, {37, 256, 1000, 0.7f}, {300, 128, 5003, 1.3f}};
  if (!g_quick) cases.push_back({600, 512, 32000, 1.0f});
  ContractConfig cc;
  cc.vocab_segments = 4;
  for (const C& c : cases) {
    Tensor h = host(DType::kBF16, {c.T, c.H}), w = host(DType::kBF16, {c.V, c.H});
    fill_bf16(h, 1.0f);
    fill_bf16(w, 3.0f / std::sqrt(float(c.H)));
    Tensor tg = host(DType::kI64, {c.T});
    for (int64_t t = 0; t < c.T; ++t)
      tg.ptr<int64_t>()[t] = t % 7 == 3 ? -100 : randint(0, c.V - 1);
    const LogprobParams params{c.temperature, -100};
    Tensor lp = host(DType::kF32, {c.T}), ls = host(DType::kF32, {c.T}),
           en = host(DType::kF32, {c.T});
    cpu::linear_logprob(h.view(), w.view(), tg.view(), params, cc, lp.view(), ls.view(), en.view());
    Tensor hd = to_dev(h.view()), wd = to_dev(w.view()), tgd = to_dev(tg.view());
    // Strided outputs: every other element of a [2T] buffer.
    Tensor ob = g_be->empty(DType::kF32, {3, 2 * c.T});
    auto strided = [&](int i) {
      TensorView v = ob.view();
      v.data = static_cast<float*>(v.data) + i * 2 * c.T;
      v.ndim = 1;
      v.shape[0] = c.T;
      v.stride[0] = 2;
      return v;
    };
    g_be->linear_logprob(hd.view(), wd.view(), tgd.view(), params, cc, strided(0), strided(1),
                         strided(2));
    Tensor obh = to_host(ob.view());
    auto col = [&](int i) {
      std::vector<float> r(size_t(c.T));
      for (int64_t t = 0; t < c.T; ++t) r[size_t(t)] = obh.ptr<float>()[i * 2 * c.T + 2 * t];
      return r;
    };
    const std::string name = fmt("linear_logprob T=%lld H=%lld V=%lld temp=%g", (long long)c.T,
                                 (long long)c.H, (long long)c.V, double(c.temperature));
    const std::vector<float> rl = values(lp.view()), rs = values(ls.view()), re = values(en.view());
    expect_close(name + " logp", col(0), rl, lp_tol(rl));
    expect_close(name + " lse", col(1), rs, lp_tol(rs));
    expect_close(name + " entropy", col(2), re, lp_tol(re));
    // A rerun: the same bits.
    g_be->linear_logprob(hd.view(), wd.view(), tgd.view(), params, cc, strided(0), strided(1),
                         strided(2));
    report(same_bits(to_host(ob.view()), obh), name + " rerun: same bits");
    // Vocab parallel: R ranks' partial states, combined in rank order.
    for (int R : {1, 2, 4}) {
      const LogprobVocabLayout lay = logprob_vocab_layout(cc, c.V);
      Tensor st = g_be->empty(DType::kF32, {R, c.T, 4});
      for (int r = 0; r < R; ++r) {
        const LogprobShard sh{c.V, r * 4 / R, 4 / R};
        const int64_t v0 = std::min(c.V, int64_t(sh.seg_begin) * lay.segment_len),
                      v1 = std::min(c.V, int64_t(sh.seg_begin + sh.seg_count) * lay.segment_len);
        TensorView sv = st.view();
        sv.data = static_cast<float*>(sv.data) + r * c.T * 4;
        sv.ndim = 2;
        sv.shape[0] = c.T;
        sv.shape[1] = 4;
        sv.stride[0] = 4;
        sv.stride[1] = 1;
        g_be->linear_logprob_partial(hd.view(), wd.view().rows(v0, v1), tgd.view(), params, cc, sh,
                                     sv);
      }
      Tensor out = g_be->empty(DType::kF32, {3 * c.T});
      auto part = [&](int i) {
        TensorView v = out.view();
        v.data = static_cast<float*>(v.data) + i * c.T;
        v.shape[0] = c.T;
        return v;
      };
      g_be->linear_logprob_combine(st.view(), tgd.view(), params, cc, c.V, part(0), part(1),
                                   part(2));
      Tensor oh = to_host(out.view());
      auto slice = [&](int i) {
        return std::vector<float>(oh.ptr<float>() + i * c.T, oh.ptr<float>() + (i + 1) * c.T);
      };
      expect_close(fmt("%s vocab-parallel R=%d logp", name.c_str(), R), slice(0), rl, lp_tol(rl));
      expect_close(fmt("%s vocab-parallel R=%d lse", name.c_str(), R), slice(1), rs, lp_tol(rs));
      expect_close(fmt("%s vocab-parallel R=%d entropy", name.c_str(), R), slice(2), re,
                   lp_tol(re));
    }
  }
}

void test_sample() {
  const int64_t T = g_quick ? 24 : 120, H = 256, V = g_quick ? 3001 : 20011;
  ContractConfig cc;
  Tensor h = host(DType::kBF16, {T, H}), w = host(DType::kBF16, {V, H});
  fill_bf16(h);
  fill_bf16(w, 4.0f / std::sqrt(float(H)));
  std::vector<SamplingParams> params(static_cast<size_t>(T));
  Tensor rid = host(DType::kI64, {T}), pos = host(DType::kI32, {T});
  for (int64_t t = 0; t < T; ++t) {
    SamplingParams& p = params[size_t(t)];
    p.seed = g_rng();
    switch (t % 6) {
      case 0:
        p.temperature = 0.0f;
        break;
      case 1:
        p.temperature = 0.8f;
        break;
      case 2:
        p.temperature = 1.0f;
        p.top_k = 20;
        break;
      case 3:
        p.temperature = 0.9f;
        p.top_p = 0.9f;
        break;
      case 4:
        p.temperature = 1.2f;
        p.min_p = 0.05f;
        break;
      case 5:
        p.temperature = 0.7f;
        p.top_k = 50;
        p.top_p = 0.8f;
        p.min_p = 0.02f;
        break;
    }
    rid.ptr<int64_t>()[t] = int64_t(g_rng() >> 1);
    pos.ptr<int32_t>()[t] = int32_t(randint(0, 100000));
  }
  Tensor ids = host(DType::kI64, {T}), lp = host(DType::kF32, {T}), ls = host(DType::kF32, {T}),
         en = host(DType::kF32, {T});
  cpu::sample(h.view(), w.view(), params, rid.view(), pos.view(), cc, ids.view(), lp.view(),
              ls.view(), en.view());
  Tensor hd = to_dev(h.view()), wd = to_dev(w.view());
  Tensor idd = g_be->empty(DType::kI32, {T}), lpd = g_be->empty(DType::kF32, {T}),
         lsd = g_be->empty(DType::kF32, {T}), end = g_be->empty(DType::kF32, {T});
  g_be->sample(hd.view(), wd.view(), params, rid.view(), pos.view(), cc, idd.view(), lpd.view(),
               lsd.view(), end.view());
  Tensor ig = to_host(idd.view()), lg = to_host(lpd.view()), sg = to_host(lsd.view()),
         eg = to_host(end.view());
  // The baseline's rule on the CPU: Gumbel-max (sampling_gumbel's noise) over the row's
  // candidates of the contract's logits (the invariant spec chooses by exact masses since
  // contract 0.6, §S.7, so cpu::sample's ids are not the baseline's). The GPU's id must be that
  // id or a near tie under its scores (the baseline's logits are cuBLAS's).
  Tensor z = host(DType::kF32, {T, V});
  cpu::gemm_bf16_nt(h.view(), w.view(), nullptr, GemmConfig{1}, z.view());
  int64_t same = 0, bad = 0, first_bad = -1;
  std::vector<float> glp, clp;  // the GPU's logp of its id, and the CPU's (y[id] − lse)
  for (int64_t t = 0; t < T; ++t) {
    const SamplingParams& p = params[size_t(t)];
    std::vector<float> y(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v)
      y[size_t(v)] = z.ptr<float>()[t * V + v] / p.logprob_temperature();
    auto score = [&](int64_t v) {
      return p.temperature == 0.0f
                 ? double(y[size_t(v)])
                 : double(y[size_t(v)]) + sampling_gumbel(p.seed, uint64_t(rid.ptr<int64_t>()[t]),
                                                          uint32_t(pos.ptr<int32_t>()[t]), v);
    };
    std::vector<int64_t> cand;
    if (p.temperature > 0.0f) {
      cand = sampling_candidates(y.data(), V, ls.ptr<float>()[t], p);
    } else {
      cand.resize(size_t(V));
      for (int64_t v = 0; v < V; ++v) cand[size_t(v)] = v;
    }
    int64_t cid = -1;  // the largest score, the lowest id among equal ones
    for (int64_t v : cand)
      if (cid < 0 || score(v) > score(cid)) cid = v;
    const int64_t gid = ig.ptr<int32_t>()[t];
    if (gid >= 0 && gid < V) {
      glp.push_back(lg.ptr<float>()[t]);
      clp.push_back(y[size_t(gid)] - ls.ptr<float>()[t]);
    }
    if (gid == cid) {
      ++same;
      continue;
    }
    const bool ok = gid >= 0 && gid < V && std::fabs(score(gid) - score(cid)) <= 1e-3 &&
                    std::binary_search(cand.begin(), cand.end(), gid);
    if (!ok) {
      ++bad;
      if (first_bad < 0) first_bad = t;
    }
  }
  report(bad == 0,
         fmt("sample: %lld of %lld rows pick the CPU's Gumbel-max id, %lld others are near ties; "
             "%lld bad (first row %lld)",
             (long long)same, (long long)T, (long long)(T - same - bad), (long long)bad,
             (long long)first_bad));
  const std::vector<float> rl = values(ls.view()), re = values(en.view());
  expect_close("sample lse", values(sg.view()), rl, lp_tol(rl));
  expect_close("sample entropy", values(eg.view()), re, lp_tol(re));
  expect_close("sample logp (of the GPU's id)", glp, clp, lp_tol(clp));
  // Device request ids / positions: same bits.
  Tensor ridd = to_dev(rid.view()), posd = to_dev(pos.view());
  Tensor id2 = g_be->empty(DType::kI32, {T});
  g_be->sample(hd.view(), wd.view(), params, ridd.view(), posd.view(), cc, id2.view(), lpd.view(),
               lsd.view(), end.view());
  report(same_bits(to_host(id2.view()), ig), "sample device request_ids/positions: same ids");
  // A row with NaN logits cannot be sampled: Error.
  Tensor hn = host(DType::kBF16, {2, H});
  fill_bf16(hn);
  hn.ptr<bf16>()[H + 3].bits = 0x7fc0;
  Tensor hnd = to_dev(hn.view());
  std::vector<SamplingParams> p2(2);
  expect_error("sample NaN row", "row 1", [&] {
    g_be->sample(hnd.view(), wd.view(), p2, rid.view().rows(0, 2), pos.view().rows(0, 2), cc,
                 idd.view().rows(0, 2), lpd.view().rows(0, 2), lsd.view().rows(0, 2),
                 end.view().rows(0, 2));
  });
}

// ---------------------------------------------------------------------------------------------
// Argument errors.

void test_errors() {
  Tensor x = g_be->empty(DType::kBF16, {4, 32}), w = g_be->empty(DType::kBF16, {8, 32}),
         y = g_be->empty(DType::kF32, {4, 8});
  Tensor xh = host(DType::kBF16, {4, 32});
  expect_error("gemm host x", "baseline gemm: argument 'x' expected device cuda",
               [&] { g_be->gemm(xh.view(), w.view(), GemmConfig{1}, y.view()); });
  expect_error("gemm K mismatch", "baseline gemm",
               [&] { g_be->gemm(x.view(), cols(w.view(), 0, 16), GemmConfig{1}, y.view()); });
  expect_error("gemm y overlaps x", "overlap", [&] {
    TensorView yy = x.view();
    yy.dtype = DType::kF32;
    yy.shape[1] = 8;
    yy.stride[0] = 16;
    g_be->gemm(x.view(), w.view(), GemmConfig{1}, yy);
  });
  expect_error("gemm_combine 17 partials", "1 to 16", [&] {
    std::vector<TensorView> p(17, y.view());
    g_be->gemm_combine(p, y.view());
  });
  Tensor ids = host(DType::kI32, {2});
  ids.ptr<int32_t>()[0] = 1;
  ids.ptr<int32_t>()[1] = 8;
  Tensor out = g_be->empty(DType::kBF16, {2, 32});
  // Index views are device views (their contents trusted: the kernels guard them).
  expect_error("embedding host ids", "argument 'ids' expected device cuda",
               [&] { g_be->embedding(ids.view(), w.view(), out.view()); });
  expect_error("rmsnorm weight shape", "baseline rmsnorm", [&] {
    g_be->rmsnorm(x.view(), cols(x.view().rows(0, 1), 0, 16), RmsNormConfig{}, x.view());
  });
  const RopeTable table = RopeTable::build(RopeConfig{32, 1e4, 16});
  Tensor pos = host(DType::kI32, {4});
  for (int i = 0; i < 4; ++i) pos.ptr<int32_t>()[i] = i == 2 ? 16 : 0;
  expect_error("rope host positions", "argument 'positions' expected device cuda", [&] {
    g_be->rope(split_last(x.view(), 1, 32), pos.view(), table, split_last(x.view(), 1, 32));
  });
  // Paged: q_pos beyond seq_len, and num_splits 0.
  PagedCase c = make_paged(2, 1, 32, 4, {5});
  Tensor kcd = to_dev(c.kc.view()), vcd = to_dev(c.vc.view());
  Tensor q = g_be->empty(DType::kBF16, {1, 2, 32}), o = g_be->empty(DType::kBF16, {1, 2, 32});
  Tensor qs = host(DType::kI32, {1}), qp = host(DType::kI32, {1});
  qs.ptr<int32_t>()[0] = 0;
  qp.ptr<int32_t>()[0] = 5;
  const PagedKv kv{kcd.view(), vcd.view(), c.table.view(), c.seq_lens.view()};
  expect_error("paged q_pos >= seq_len", "q_pos[0] = 5", [&] {
    g_be->attention_paged(q.view(), qs.view(), qp.view(), kv, AttentionConfig{}, o.view(),
                          TensorView{});
  });
  qp.ptr<int32_t>()[0] = 4;
  expect_error("paged num_splits 0", "num_splits", [&] {
    g_be->attention_paged_split_kv(q.view(), qs.view(), qp.view(), kv, AttentionConfig{}, 0,
                                   o.view(), TensorView{});
  });
  Tensor qsd = to_dev(qs.view());
  expect_error("paged device q_seq of the wrong dtype", "q_seq", [&] {
    TensorView bad = qsd.view();
    bad.dtype = DType::kI64;
    g_be->attention_paged(q.view(), bad, qp.view(), kv, AttentionConfig{}, o.view(), TensorView{});
  });
  Tensor sm = host(DType::kI32, {2});
  sm.ptr<int32_t>()[0] = 3;
  sm.ptr<int32_t>()[1] = 3;
  Tensor kk = g_be->empty(DType::kBF16, {2, 1, 32});
  expect_error("kv_cache_write duplicate slot", "more than once", [&] {
    g_be->kv_cache_write(kk.view(), kk.view(), sm.view(), kcd.view(), vcd.view());
  });
  Tensor tgt = host(DType::kI32, {4});
  for (int i = 0; i < 4; ++i) tgt.ptr<int32_t>()[i] = i == 1 ? 8 : 0;
  Tensor l4 = g_be->empty(DType::kF32, {4});
  // Host targets are checked value by value, as by the invariant CUDA op (contract host_or).
  expect_error("linear_logprob host targets", "targets[1] = 8 is outside [0, 8)", [&] {
    g_be->linear_logprob(x.view(), w.view(), tgt.view(), LogprobParams{}, ContractConfig{},
                         l4.view(), l4.view(), l4.view());
  });
  std::vector<SamplingParams> sp(3);
  Tensor r4 = host(DType::kI64, {4}), p4 = host(DType::kI32, {4});
  expect_error("sample params count", "params", [&] {
    g_be->sample(x.view(), w.view(), sp, r4.view(), p4.view(), ContractConfig{}, l4.view(),
                 l4.view(), l4.view(), l4.view());
  });
}

// ---------------------------------------------------------------------------------------------
// Timings (informational): the baseline next to the invariant CUDA GEMM where one exists.

double time_ms(const std::function<void()>& f, int iters) {
  f();
  g_be->synchronize();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / iters;
}

void bench() {
  std::printf("--- timings (H200; informational) ---\n");
  for (int64_t M : {int64_t(1), int64_t(64), int64_t(4096)}) {
    const int64_t N = 4096, K = 4096;
    Tensor x = g_be->empty(DType::kBF16, {M, K}), w = g_be->empty(DType::kBF16, {N, K}),
           y = g_be->empty(DType::kBF16, {M, N});
    Tensor xh = host(DType::kBF16, {M, K}), wh = host(DType::kBF16, {N, K});
    fill_bf16(xh);
    fill_bf16(wh);
    g_be->copy(x.view(), xh.view());
    g_be->copy(w.view(), wh.view());
    const double tb = time_ms([&] { g_be->gemm(x.view(), w.view(), GemmConfig{1}, y.view()); }, 20);
    const double ti = time_ms(
        [&] { cuda::gemm_bf16_nt(x.view(), w.view(), nullptr, GemmConfig{1}, y.view()); }, 20);
    const double fl = 2.0 * M * N * K;
    std::printf(
        "gemm M=%5lld N=K=4096: baseline (cuBLAS) %8.3f ms %7.1f TFLOP/s | invariant "
        "cuda::gemm_bf16_nt %8.3f ms %7.1f TFLOP/s | invariant/baseline %.2f\n",
        (long long)M, tb, fl / tb * 1e-9, ti, fl / ti * 1e-9, ti / tb);
  }
  {
    const int64_t T = 8192, Hq = 32, Hkv = 8, D = 128;
    Tensor qkv = g_be->empty(DType::kBF16, {T, (Hq + 2 * Hkv) * D});
    Tensor hq = host(DType::kBF16, {T, (Hq + 2 * Hkv) * D});
    fill_bf16(hq);
    g_be->copy(qkv.view(), hq.view());
    Tensor cu = host(DType::kI32, {2});
    cu.ptr<int32_t>()[0] = 0;
    cu.ptr<int32_t>()[1] = int32_t(T);
    Tensor cud = to_dev(cu.view());
    Tensor o = g_be->empty(DType::kBF16, {T, Hq, D});
    const TensorView q = split_last(cols(qkv.view(), 0, Hq * D), Hq, D),
                     k = split_last(cols(qkv.view(), Hq * D, (Hq + Hkv) * D), Hkv, D),
                     v = split_last(cols(qkv.view(), (Hq + Hkv) * D, (Hq + 2 * Hkv) * D), Hkv, D);
    const double t = time_ms(
        [&] {
          g_be->attention_prefill_varlen(q, k, v, cud.view(), AttentionConfig{}, o.view(),
                                         TensorView{});
        },
        5);
    const double fl = 4.0 * double(T) * double(T) / 2 * Hq * D;
    std::printf(
        "prefill T=%lld (one sequence) Hq=%lld Hkv=%lld D=%lld: %.3f ms, %.1f TFLOP/s "
        "(causal)\n",
        (long long)T, (long long)Hq, (long long)Hkv, (long long)D, t, fl / t * 1e-9);
  }
  for (int64_t N : {int64_t(1), int64_t(64)}) {
    const int64_t Hq = 32, Hkv = 8, D = 128, P = 16, ctx = 4096;
    const int64_t MP = ctx / P, NP = N * MP;
    Tensor kc = g_be->empty(DType::kBF16, {NP, P, Hkv, D}),
           vc = g_be->empty(DType::kBF16, {NP, P, Hkv, D});
    cudaMemset(kc.data(), 0x3c, size_t(kc.nbytes()));
    cudaMemset(vc.data(), 0x3c, size_t(vc.nbytes()));
    Tensor table = host(DType::kI32, {N, MP}), sl = host(DType::kI32, {N}),
           qs = host(DType::kI32, {N}), qp = host(DType::kI32, {N});
    for (int64_t i = 0; i < N * MP; ++i) table.ptr<int32_t>()[i] = int32_t(i);
    for (int64_t i = 0; i < N; ++i) {
      sl.ptr<int32_t>()[i] = int32_t(ctx);
      qs.ptr<int32_t>()[i] = int32_t(i);
      qp.ptr<int32_t>()[i] = int32_t(ctx - 1);
    }
    Tensor td = to_dev(table.view()), sld = to_dev(sl.view()), qsd = to_dev(qs.view()),
           qpd = to_dev(qp.view());
    Tensor q = g_be->empty(DType::kBF16, {N, Hq, D}), o = g_be->empty(DType::kBF16, {N, Hq, D});
    cudaMemset(q.data(), 0x3c, size_t(q.nbytes()));
    const PagedKv kv{kc.view(), vc.view(), td.view(), sld.view()};
    // The step's meta, built once (as the engine does per step), outside the timed calls.
    engine::DeviceStage stage(*g_be);
    const PagedMeta meta = engine::paged_meta_for_views(stage, "bench", qsd.view(), qpd.view(), kv,
                                                        nullptr, AttentionConfig{});
    const double t = time_ms(
        [&] {
          g_be->attention_paged(q.view(), meta, kc.view(), vc.view(), AttentionConfig{}, o.view(),
                                TensorView{});
        },
        20);
    const double bytes = double(N) * ctx * Hkv * D * 2 * 2;
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    std::printf(
        "decode N=%lld ctx=%lld Hq=%lld Hkv=%lld D=%lld (%d splits): %.3f ms, %.0f GB/s "
        "of KV\n",
        (long long)N, (long long)ctx, (long long)Hq, (long long)Hkv, (long long)D,
        cuda::baseline::paged_num_splits(N, Hkv, Hq / Hkv, MP * P, sms), t, bytes / t * 1e-6);
  }
  {
    const int64_t T = 256, H = 4096, V = 151936;
    Tensor h = g_be->empty(DType::kBF16, {T, H}), w = g_be->empty(DType::kBF16, {V, H});
    cudaMemset(h.data(), 0x3c, size_t(h.nbytes()));
    cudaMemset(w.data(), 0x3c, size_t(w.nbytes()));
    Tensor tg = host(DType::kI32, {T});
    for (int64_t t = 0; t < T; ++t) tg.ptr<int32_t>()[t] = int32_t(t);
    Tensor tgd = to_dev(tg.view());
    Tensor out = g_be->empty(DType::kF32, {3, T});
    TensorView o0 = out.view(), o1 = out.view(), o2 = out.view();
    for (TensorView* v : {&o0, &o1, &o2}) {
      v->ndim = 1;
      v->shape[0] = T;
      v->stride[0] = 1;
    }
    o1.data = static_cast<float*>(out.data()) + T;
    o2.data = static_cast<float*>(out.data()) + 2 * T;
    const double t = time_ms(
        [&] {
          g_be->linear_logprob(h.view(), w.view(), tgd.view(), LogprobParams{}, ContractConfig{},
                               o0, o1, o2);
        },
        5);
    std::printf("linear_logprob T=%lld H=%lld V=%lld: %.3f ms (%.1f TFLOP/s incl. softmax)\n",
                (long long)T, (long long)H, (long long)V, t, 2.0 * T * H * V / t * 1e-9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool no_bench = false;
  if (!gpu_test::start("test_baseline_cuda", argc, argv, {{"--no-bench", &no_bench}})) return 2;
  try {
    const std::unique_ptr<OpsBackend> be = engine::make_cuda_baseline_backend();
    g_be = be.get();
    std::printf("backend '%s' on %s; %s\n", be->name().c_str(), device_name(be->device()),
                cuda::baseline::Context().summary().c_str());
    const auto t0 = std::chrono::steady_clock::now();
    test_gemm();
    test_gemm_tp();
    test_rmsnorm();
    test_rope();
    test_silu_embedding();
    test_kv_write();
    test_prefill();
    test_paged();
    test_cascade();
    test_batch_dependence();
    test_logprob();
    test_sample();
    test_errors();
    be->synchronize();
    std::printf("checks took %.1f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!g_quick && !no_bench) bench();
  } catch (const std::exception& e) {
    report(false, std::string("unexpected exception: ") + e.what());
  }
  return gpu_test::finish("test_baseline_cuda");
}
