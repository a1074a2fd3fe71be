// The baseline OpsBackend: ordinary, non-invariant kernels. GEMMs go through OpenBLAS (sgemv for
// one row, sgemm otherwise; row-parallel TP partials summed in rank order), reductions are plain
// sequential loops whose split depends on the batch (RMSNorm for small batches, paged attention's
// key blocks and split-KV), RoPE's cos/sin come from fp32 libm, softmax and log_softmax use libm
// exp/log. Correct math (fp64-tested), but a token's bits depend on its batch, path and TP degree.
// NOTE: libm std::exp/std::log/std::cos/std::sin are used here on purpose (the project's own
// primitives are for the invariant ops): the baseline stands for what stacks run today.
// What each op mirrors: docs/baseline.md.
#include "baseline/cpu/backend.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include "baseline/backend_base.h"
#include "contract/checks.h"
#include "core/math.h"
#include "core/philox.h"
#include "core/thread_pool.h"

namespace lockstep::engine {

void BaselineConfig::validate() const {
  const char* op = "BaselineConfig";
  LS_CHECK(num_threads >= 1, op, "num_threads must be >= 1, got ", num_threads);
  LS_CHECK(kv_block_small >= 1 && kv_block_large >= 1, op, "kv blocks must be >= 1, got ",
           kv_block_small, " and ", kv_block_large);
  LS_CHECK(kv_block_switch >= 0, op, "kv_block_switch must be >= 0, got ", kv_block_switch);
  LS_CHECK(kv_split_budget >= 1, op, "kv_split_budget must be >= 1, got ", kv_split_budget);
  LS_CHECK(logits_token_block >= 1 && logits_vocab_chunk >= 1, op,
           "logits blocks must be >= 1, got ", logits_token_block, " and ", logits_vocab_chunk);
}

std::string BaselineConfig::to_string() const {
  std::ostringstream os;
  os << "baseline: num_threads=" << num_threads << " kv_block=" << kv_block_small << "/"
     << kv_block_large << " (large above " << kv_block_switch
     << " seqs) kv_split_budget=" << kv_split_budget << " logits_token_block=" << logits_token_block
     << " logits_vocab_chunk=" << logits_vocab_chunk << " (OpenBLAS sgemm/sgemv, libm exp/log)";
  return os.str();
}

BaselineConfig default_baseline_config(int num_threads) {
  LS_CHECK(num_threads >= 0, "default_baseline_config", "num_threads must be >= 0, got ",
           num_threads);
  BaselineConfig c;
  c.num_threads = num_threads == 0 ? lockstep::num_threads() : num_threads;
  return c;
}

namespace {

// The argument checks are the cpu ops' own (same messages); only what the baseline does
// differently (BLAS int range, gemm_combine's rank count, rope's table) is checked here.
using namespace contract;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Small helpers.

float& f32_at(const TensorView& t, int64_t i) { return t.ptr<float>()[i * t.stride[0]]; }

const bf16* row_bf16(const TensorView& t, int64_t r) {
  return t.ptr<const bf16>() + r * t.stride[0];
}

// fn(i) for every row i in [0, n), rows of `width` elements, in parallel chunks of about 16384
// elements.
template <typename Fn>
void for_rows(int64_t n, int64_t width, const Fn& fn) {
  parallel_for(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)),
               [&](int64_t a, int64_t b) {
                 for (int64_t i = a; i < b; ++i) fn(i);
               });
}

// Σ x[k]² over k in [k0, k1) of bf16 x, in fp32, in order.
float sum_squares(const bf16* x, int64_t k0, int64_t k1) {
  float acc = 0.0f;
  for (int64_t k = k0; k < k1; ++k) {
    const float v = bf16_to_f32(x[k]);
    acc = acc + v * v;
  }
  return acc;
}

// Rows [r0, r1) of a 2-D bf16 view (last dim contiguous) as dense fp32 [r1 - r0, C].
void to_f32(const TensorView& t, int64_t r0, int64_t r1, float* out) {
  const int64_t C = t.size(1);
  for_rows(r1 - r0, C, [&](int64_t i) {
    const bf16* s = row_bf16(t, r0 + i);
    float* d = out + i * C;
    for (int64_t k = 0; k < C; ++k) d[k] = bf16_to_f32(s[k]);
  });
}

void check_blas_dims(const char* op, int64_t M, int64_t N, int64_t K) {
  LS_CHECK(M < INT_MAX && N < INT_MAX && K < INT_MAX, op, "sizes M=", M, " N=", N, " K=", K,
           " exceed the BLAS int range");
}

// y[m·ldy + n] = Σ_k x[m·K + k]·w[n·K + k] (dense fp32) by OpenBLAS: one row is a matrix-vector
// product (sgemv, the decode kernel), more rows a matrix product (sgemm). The two kernels, and
// sgemm's own small-matrix paths, sum K in different orders: a row's bits depend on M.
void blas_nt(const float* x, const float* w, int64_t M, int64_t N, int64_t K, float* y,
             int64_t ldy) {
  if (M == 0 || N == 0) return;
  for (int64_t m = 0; m < M; ++m) std::fill(y + m * ldy, y + m * ldy + N, 0.0f);
  if (K == 0) return;
  if (M == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, blasint(N), blasint(K), 1.0f, w, blasint(K), x, 1,
                0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(N), blasint(K), 1.0f,
                x, blasint(K), w, blasint(K), 0.0f, y, blasint(ldy));
  }
}

// y = x·wᵀ (x [M, K], w [N, K] bf16): converted to fp32, OpenBLAS, then stored into y (bf16
// rounded RNE, or f32 as is).
void gemm_rows(const char* op, const TensorView& x, const TensorView& w, const TensorView& y) {
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  check_blas_dims(op, M, N, K);
  if (M == 0 || N == 0) return;
  std::vector<float> xf(static_cast<size_t>(M * K)), wf(static_cast<size_t>(N * K)),
      v(static_cast<size_t>(M * N));
  to_f32(x, 0, M, xf.data());
  to_f32(w, 0, N, wf.data());
  blas_nt(xf.data(), wf.data(), M, N, K, v.data(), N);
  for_rows(M, N, [&](int64_t m) {
    const float* s = v.data() + m * N;
    if (y.dtype == DType::kBF16) {
      bf16* d = y.ptr<bf16>() + m * y.stride[0];
      for (int64_t n = 0; n < N; ++n) d[n] = f32_to_bf16(s[n]);
    } else {
      std::memcpy(y.ptr<float>() + m * y.stride[0], s, size_t(N) * sizeof(float));
    }
  });
}

// Row r of the flattened [R, C] rows of a [T, C] or [T, B, C] view (last dim contiguous).
template <typename T>
T* flat_row(const TensorView& v, int64_t r) {
  if (v.ndim == 3) {
    return v.ptr<T>() + (r / v.shape[1]) * v.stride[0] + (r % v.shape[1]) * v.stride[1];
  }
  return v.ptr<T>() + r * v.stride[0];
}

// ---------------------------------------------------------------------------------------------
// Attention helpers.

// Plain fp32 dot product of two bf16 vectors (one mul and one add per element, in order).
float dot_bf16(const bf16* a, const bf16* b, int64_t D) {
  float acc = 0.0f;
  for (int64_t d = 0; d < D; ++d) acc = acc + bf16_to_f32(a[d]) * bf16_to_f32(b[d]);
  return acc;
}

void write_attn_row(const float* o, int64_t D, const TensorView& out, int64_t r, int64_t h,
                    const TensorView& lse, float lse_value) {
  bf16* dst = out.ptr<bf16>() + r * out.stride[0] + h * out.stride[1];
  for (int64_t d = 0; d < D; ++d) dst[d] = f32_to_bf16(o[d]);
  if (wants_lse(lse)) lse.ptr<float>()[r * lse.stride[0] + h * lse.stride[1]] = lse_value;
}

// Where key position j of one sequence lives: the group's prefix pages below shared_len, the
// sequence's own pages from there on.
struct KvRow {
  const bf16 *k = nullptr, *v = nullptr;
  int64_t k_s0 = 0, k_s1 = 0, k_sh = 0, v_s0 = 0, v_s1 = 0, v_sh = 0, P = 1;
  const int32_t* own = nullptr;
  const int32_t* shared = nullptr;
  int64_t shared_len = 0;

  int64_t page(int64_t j) const { return j < shared_len ? shared[j / P] : own[j / P]; }
  const bf16* key(int64_t j, int64_t h) const {
    return k + page(j) * k_s0 + (j % P) * k_s1 + h * k_sh;
  }
  const bf16* value(int64_t j, int64_t h) const {
    return v + page(j) * v_s0 + (j % P) * v_s1 + h * v_sh;
  }
};

KvRow kv_row(const TensorView& k_cache, const TensorView& v_cache, const PagedTables& t,
             const Paged& p, int64_t s, bool prefix) {
  KvRow r;
  r.k = k_cache.ptr<const bf16>();
  r.v = v_cache.ptr<const bf16>();
  r.k_s0 = k_cache.stride[0];
  r.k_s1 = k_cache.stride[1];
  r.k_sh = k_cache.stride[2];
  r.v_s0 = v_cache.stride[0];
  r.v_s1 = v_cache.stride[1];
  r.v_sh = v_cache.stride[2];
  r.P = p.P;
  r.own = t.block_table.ptr<const int32_t>() + s * t.block_table.stride[0];
  const int64_t g = p.group[size_t(s)];
  if (prefix && g >= 0) {
    r.shared = t.prefix_block_table.ptr<const int32_t>() + g * t.prefix_block_table.stride[0];
    r.shared_len = p.shared_len[size_t(g)];
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// LogP / sampling helpers.

// Plain softmax statistics of one row y[0 .. n): m = max (sequential), s = Σ exp(y − m)
// (sequential, libm exp), lse = m + log(s), and the entropy as verl computes it:
// lse − Σ softmax(y)·y, softmax = exp(y − m) / s.
struct RowStats {
  float m, s, lse, entropy;
};

RowStats row_stats(const float* y, int64_t n) {
  RowStats r;
  r.m = kNegInf;
  for (int64_t v = 0; v < n; ++v)
    if (y[v] > r.m) r.m = y[v];
  r.s = 0.0f;
  for (int64_t v = 0; v < n; ++v) r.s = r.s + std::exp(y[v] - r.m);
  r.lse = r.m + std::log(r.s);
  float py = 0.0f;
  for (int64_t v = 0; v < n; ++v) py = py + (std::exp(y[v] - r.m) / r.s) * y[v];
  r.entropy = r.lse - py;
  return r;
}

// The Gumbel-max choice over ids (all when `kept` is null), the invariant sampler's noise:
// g = −log(−log u), u from Philox4x32-10 (one call per 4 consecutive ids), ties to the lowest id.
int64_t gumbel_argmax(const float* y, int64_t V, const std::vector<int64_t>* kept, uint64_t seed,
                      uint64_t request_id, uint32_t position) {
  int64_t best = -1;
  float best_score = 0.0f;
  int64_t group = -1;
  Philox4 words{};
  const int64_t n = kept ? int64_t(kept->size()) : V;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = kept ? (*kept)[size_t(i)] : i;
    if (y[v] == kNegInf) continue;
    if ((v >> 2) != group) {
      group = v >> 2;
      words = philox4x32_10(
          Philox4{{uint32_t(group), position, uint32_t(request_id), uint32_t(request_id >> 32)}},
          uint32_t(seed), uint32_t(seed >> 32));
    }
    const float u = philox_uniform(words.v[v & 3]);
    const float score = y[v] + -ls_logf(-ls_logf(u));
    if (best < 0 || score > best_score) {
      best = v;
      best_score = score;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------

class BaselineBackend final : public BaselineOps<OpsBackend> {
 public:
  explicit BaselineBackend(const BaselineConfig& c) : c_(c) { c_.validate(); }

  std::string name() const override { return "baseline"; }

  // --- GEMM ---

  void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
            const TensorView& y) const override {
    const char* op = "baseline gemm";
    check_baseline_gemm(op, Device::kCPU, x, w, cfg, y);
    gemm_rows(op, x, w, y);
  }

  void gemm_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                    int tp_size, int tp_rank, const GemmConfig& cfg,
                    const TensorView& y_partial) const override {
    const char* op = "baseline gemm_partial";
    check_gemm_partial(op, Device::kCPU, x_shard, w_shard, k_total, tp_size, tp_rank, cfg,
                       y_partial);
    gemm_rows(op, x_shard, w_shard, y_partial);
  }

  // The usual all-reduce: ((p0 + p1) + p2) + ... in rank order, then one rounding.
  void gemm_combine(const std::vector<TensorView>& partials, const TensorView& y) const override {
    const char* op = "baseline gemm_combine";
    // NOTE: any number of ranks (the cpu op's tree takes 1, 2, 4 or 8), and no bias.
    LS_CHECK(!partials.empty(), op, "argument 'partials' must hold at least one view");
    check_gemm_combine(op, Device::kCPU, partials, nullptr, y);
    const int64_t M = partials[0].size(0), N = partials[0].size(1);
    if (M == 0 || N == 0) return;
    parallel_for(M, 16, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          float acc = partials[0].ptr<const float>()[m * partials[0].stride[0] + n];
          for (size_t i = 1; i < partials.size(); ++i)
            acc = acc + partials[i].ptr<const float>()[m * partials[i].stride[0] + n];
          if (y.dtype == DType::kBF16) {
            y.ptr<bf16>()[m * y.stride[0] + n] = f32_to_bf16(acc);
          } else {
            y.ptr<float>()[m * y.stride[0] + n] = acc;
          }
        }
      }
    });
  }

  // --- elementwise ---

  void rmsnorm(const TensorView& x, const TensorView& weight, const RmsNormConfig& cfg,
               const TensorView& y) const override {
    const int64_t H = check_rmsnorm("baseline rmsnorm", Device::kCPU, x, weight, cfg, y);
    const int64_t rows = x.numel() / H;
    if (rows == 0) return;
    const std::vector<float> r = inv_rms(x.shape[0], rows, H, cfg.eps,
                                         [&](int64_t i) { return flat_row<const bf16>(x, i); });
    normalize(
        rows, H, r, weight, [&](int64_t i) { return flat_row<const bf16>(x, i); }, y);
  }

  void rmsnorm_residual(const TensorView& x, const TensorView& residual, const TensorView& weight,
                        const RmsNormConfig& cfg, const TensorView& residual_out,
                        const TensorView& y) const override {
    const int64_t H = check_rmsnorm_residual("baseline rmsnorm_residual", Device::kCPU, x, residual,
                                             weight, cfg, residual_out, y);
    const int64_t rows = x.numel() / H;
    if (rows == 0) return;
    // s = bf16(x + residual), the new residual stream (buffered: outputs may alias inputs).
    std::vector<bf16> s(static_cast<size_t>(rows * H));
    for_rows(rows, H, [&](int64_t i) {
      const bf16* xr = flat_row<const bf16>(x, i);
      const bf16* rr = flat_row<const bf16>(residual, i);
      for (int64_t k = 0; k < H; ++k)
        s[size_t(i * H + k)] = f32_to_bf16(bf16_to_f32(xr[k]) + bf16_to_f32(rr[k]));
    });
    for_rows(rows, H, [&](int64_t i) {
      std::memcpy(flat_row<bf16>(residual_out, i), s.data() + i * H, size_t(H) * sizeof(bf16));
    });
    auto row = [&](int64_t i) -> const bf16* { return s.data() + i * H; };
    const std::vector<float> r = inv_rms(x.shape[0], rows, H, cfg.eps, row);
    normalize(rows, H, r, weight, row, y);
  }

  void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
            const TensorView& y) const override {
    const char* op = "baseline rope";
    table.config.validate();
    const int64_t D = table.config.head_dim, half = D / 2, P = table.config.max_positions;
    // NOTE: table.cos / table.sin are not read (cos/sin come from libm), so not checked.
    check_rope_args(op, Device::kCPU, x, positions, D, P, y);
    const int64_t T = x.shape[0], heads = x.shape[1];
    if (T == 0 || heads == 0) return;
    // HF's inv_freq in fp32: 1 / theta^(2i / D) with a float base and exponent.
    std::vector<float> inv_freq(static_cast<size_t>(half));
    const float theta = float(table.config.theta);
    for (int64_t i = 0; i < half; ++i)
      inv_freq[size_t(i)] = 1.0f / std::pow(theta, float(2 * i) / float(D));
    parallel_for(T, std::max<int64_t>(1, 16384 / (D * heads)), [&](int64_t a, int64_t b) {
      std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
      for (int64_t t = a; t < b; ++t) {
        // cos/sin on the fly in fp32 libm, as many fused RoPE kernels do.
        const float pos = float(index_at(positions, t));
        for (int64_t i = 0; i < half; ++i) {
          const float angle = pos * inv_freq[size_t(i)];
          c[size_t(i)] = std::cos(angle);
          s[size_t(i)] = std::sin(angle);
        }
        for (int64_t h = 0; h < heads; ++h) {
          const bf16* xr = x.ptr<const bf16>() + t * x.stride[0] + h * x.stride[1];
          bf16* yr = y.ptr<bf16>() + t * y.stride[0] + h * y.stride[1];
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = bf16_to_f32(xr[i]), x2 = bf16_to_f32(xr[i + half]);
            const float ci = c[size_t(i)], si = s[size_t(i)];
            yr[i] = f32_to_bf16(x1 * ci - x2 * si);
            yr[i + half] = f32_to_bf16(x2 * ci + x1 * si);
          }
        }
      }
    });
  }

  void silu_mul(const TensorView& gate, const TensorView& up,
                const TensorView& out) const override {
    check_silu_mul("baseline silu_mul", Device::kCPU, gate, up, out);
    const int64_t T = gate.shape[0], I = gate.shape[1];
    if (T == 0) return;
    for_rows(T, I, [&](int64_t t) {
      const bf16* g = row_bf16(gate, t);
      const bf16* u = row_bf16(up, t);
      bf16* o = out.ptr<bf16>() + t * out.stride[0];
      for (int64_t i = 0; i < I; ++i) {
        const float gv = bf16_to_f32(g[i]);
        o[i] = f32_to_bf16(gv / (1.0f + std::exp(-gv)) * bf16_to_f32(u[i]));
      }
    });
  }

  // --- embedding ---

  void embedding_combine(const std::vector<TensorView>& partials,
                         const TensorView& out) const override {
    check_embedding_combine("baseline embedding_combine", Device::kCPU, partials, out);
    const int64_t T = out.shape[0], H = out.shape[1];
    if (T == 0) return;
    for_rows(T, H, [&](int64_t t) {
      bf16* o = out.ptr<bf16>() + t * out.stride[0];
      for (int64_t k = 0; k < H; ++k) {
        float acc = bf16_to_f32(row_bf16(partials[0], t)[k]);
        for (size_t r = 1; r < partials.size(); ++r)
          acc = acc + bf16_to_f32(row_bf16(partials[r], t)[k]);
        o[k] = f32_to_bf16(acc);
      }
    });
  }

  // --- attention ---

  // Plain (math-backend) attention per (token, head): all scores of the row in fp32, max,
  // exp, sum, P = e / sum (kept fp32), then P·V in fp32, one rounding.
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const PackedSeqs& seqs, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const override {
    const QShape qs = check_prefill_call("baseline attention_prefill_varlen", Device::kCPU, q, k, v,
                                         seqs, cfg, out, lse);
    const int64_t T = qs.N, D = qs.D, Hq = qs.Hq, Hkv = k.shape[1], B = seqs.B();
    if (T == 0) return;
    const std::span<const int64_t> cu = seqs.cu();
    std::vector<int64_t> start(static_cast<size_t>(T));  // first token of each token's sequence
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = cu[size_t(b)]; t < cu[size_t(b + 1)]; ++t) start[size_t(t)] = cu[size_t(b)];
    const int64_t G = Hq / Hkv;
    const float scale = float(cfg.resolved_scale(D));
    parallel_for(T * Hq, 1, [&](int64_t a, int64_t b) {
      std::vector<float> sc, o(static_cast<size_t>(D));
      for (int64_t i = a; i < b; ++i) {
        const int64_t t = i / Hq, h = i % Hq, hk = h / G, t0 = start[size_t(t)];
        const int64_t n = t - t0 + 1;
        const bf16* qr = q.ptr<const bf16>() + t * q.stride[0] + h * q.stride[1];
        sc.resize(size_t(n));
        float m = kNegInf;
        for (int64_t j = 0; j < n; ++j) {
          const bf16* kr = k.ptr<const bf16>() + (t0 + j) * k.stride[0] + hk * k.stride[1];
          sc[size_t(j)] = dot_bf16(qr, kr, D) * scale;
          if (sc[size_t(j)] > m) m = sc[size_t(j)];
        }
        float l = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          sc[size_t(j)] = std::exp(sc[size_t(j)] - m);
          l = l + sc[size_t(j)];
        }
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float pj = sc[size_t(j)] / l;
          const bf16* vr = v.ptr<const bf16>() + (t0 + j) * v.stride[0] + hk * v.stride[1];
          for (int64_t d = 0; d < D; ++d) o[size_t(d)] = o[size_t(d)] + pj * bf16_to_f32(vr[d]);
        }
        write_attn_row(o.data(), D, out, t, h, lse, m + std::log(l));
      }
    });
  }

  // A KV-cache write is a copy: every stack does the same thing.
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                      const TensorView& k_cache, const TensorView& v_cache) const override {
    cpu::kv_cache_write(k, v, slot_mapping, k_cache, v_cache);
  }

  // --- heads ---

  // logits [T_block, V] by sgemm, /temperature, plain log_softmax, gather.
  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                      const LogprobParams& params, const ContractConfig& cfg,
                      const TensorView& logp, const TensorView& lse,
                      const TensorView& entropy) const override {
    const char* op = "baseline linear_logprob";
    check_linear_logprob(op, Device::kCPU, h, w, targets, params, cfg, logp, lse, entropy);
    const int64_t V = w.size(0);
    const auto temperature = [&](int64_t) { return params.temperature; };
    for_logit_rows(op, h, w, V, temperature, [&](int64_t t, const float* y) {
      const RowStats st = row_stats(y, V);
      const int64_t g = index_at(targets, t);
      f32_at(logp, t) = g == params.ignore_index ? 0.0f : y[g] - st.lse;
      f32_at(lse, t) = st.lse;
      f32_at(entropy, t) = st.entropy;
    });
  }

  // A rank's (m, s, Σ exp(y − m)·y, y_target) over its vocab rows, plain loops.
  void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                              const TensorView& targets, const LogprobParams& params,
                              const ContractConfig& cfg, const LogprobShard& shard,
                              const TensorView& state) const override {
    const char* op = "baseline linear_logprob_partial";
    const ShardRows sr = check_linear_logprob_partial(op, Device::kCPU, h, w_shard, targets, params,
                                                      cfg, shard, state);
    const int64_t T = h.size(0), v0 = sr.v0, v1 = sr.v1;
    if (T == 0) return;
    const float nan = f32_from_bits(kCanonicalNanF32);
    // NOTE: an all-padding shard (Vs == 0) gets the empty state (-inf, 0, 0, NaN) from the loop.
    const int64_t Vs = v1 - v0;
    const auto temperature = [&](int64_t) { return params.temperature; };
    for_logit_rows(op, h, w_shard, Vs, temperature, [&](int64_t t, const float* y) {
      float m = kNegInf, s = 0.0f, wy = 0.0f;
      for (int64_t v = 0; v < Vs; ++v)
        if (y[v] > m) m = y[v];
      for (int64_t v = 0; v < Vs; ++v) {
        const float e = std::exp(y[v] - m);
        s = s + e;
        wy = wy + e * y[v];
      }
      const int64_t g = index_at(targets, t);
      float* o = state.ptr<float>() + t * state.stride[0];
      o[0] = m;
      o[1] = s;
      o[2] = wy;
      o[3] = (g != params.ignore_index && g >= v0 && g < v1) ? y[g - v0] : nan;
    });
  }

  // Plain sequential combine over ranks: M = max m_r; S = Σ s_r·exp(m_r − M);
  // Σ p·y = (Σ w_r·exp(m_r − M)) / S; lse = M + log S; entropy = lse − Σ p·y.
  void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                              const LogprobParams& params, const ContractConfig& cfg,
                              int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) const override {
    const LogprobVocabLayout lay =
        check_linear_logprob_combine("baseline linear_logprob_combine", Device::kCPU, states,
                                     targets, params, cfg, vocab_size, logp, lse, entropy);
    const int64_t R = states.size(0), T = states.size(1);
    const int64_t rank_len = lay.segment_len * (cfg.vocab_segments / R);
    auto at = [&](int64_t r, int64_t t) {
      return states.ptr<const float>() + r * states.stride[0] + t * states.stride[1];
    };
    parallel_for(T, 256, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        float M = kNegInf;
        for (int64_t r = 0; r < R; ++r)
          if (at(r, t)[0] > M) M = at(r, t)[0];
        float S = 0.0f, W = 0.0f;
        for (int64_t r = 0; r < R; ++r) {
          if (at(r, t)[1] == 0.0f) continue;  // an empty rank adds nothing
          const float f = std::exp(at(r, t)[0] - M);
          S = S + at(r, t)[1] * f;
          W = W + at(r, t)[2] * f;
        }
        const float l = M + std::log(S);
        const int64_t g = index_at(targets, t);
        f32_at(lse, t) = l;
        f32_at(entropy, t) = l - W / S;
        f32_at(logp, t) = g == params.ignore_index ? 0.0f : at(g / rank_len, t)[3] - l;
      }
    });
  }

  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
              const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
              const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
              const TensorView& entropy) const override {
    const char* op = "baseline sample";
    check_sample(op, Device::kCPU, h, w, params, request_ids, positions, cfg, token_ids, logp, lse,
                 entropy);
    const int64_t T = h.size(0), V = w.size(0);
    if (T == 0) return;
    // Results go to [T] buffers first: a row that cannot be sampled throws before any output.
    std::vector<Sampled> out(static_cast<size_t>(T));
    const auto temperature = [&](int64_t t) { return params[size_t(t)].logprob_temperature(); };
    for_logit_rows(op, h, w, V, temperature, [&](int64_t t, const float* y) {
      out[size_t(t)] = sample_row(op, t, y, V, params[size_t(t)], request_ids, positions);
    });
    write_samples(out, token_ids, logp, lse, entropy);
  }

  // Vocab-parallel sampling: the same logits and decisions as sample(), in two steps.
  void lm_head_logits(const TensorView& h, const TensorView& w_rows, const ContractConfig& cfg,
                      const TensorView& z) const override {
    const char* op = "baseline lm_head_logits";
    check_lm_head_logits(op, Device::kCPU, h, w_rows, cfg, z);
    const int64_t N = w_rows.size(0);
    if (h.size(0) == 0 || N == 0) return;
    for_logit_rows(
        op, h, w_rows, N, [](int64_t) { return 1.0f; },
        [&](int64_t t, const float* y) { std::copy(y, y + N, z.ptr<float>() + t * z.stride[0]); });
  }
  void sample_logits(const TensorView& z, std::span<const SamplingParams> params,
                     const TensorView& request_ids, const TensorView& positions,
                     const ContractConfig& cfg, const TensorView& token_ids, const TensorView& logp,
                     const TensorView& lse, const TensorView& entropy) const override {
    const char* op = "baseline sample_logits";
    check_sample_logits(op, Device::kCPU, z, params, request_ids, positions, cfg, token_ids, logp,
                        lse, entropy);
    const int64_t T = z.size(0), V = z.size(1);
    std::vector<Sampled> out(static_cast<size_t>(T));
    parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> y(static_cast<size_t>(V));
      for (int64_t t = t0; t < t1; ++t) {
        const float temp = params[size_t(t)].logprob_temperature();
        const float* row = z.ptr<const float>() + t * z.stride[0];
        for (int64_t v = 0; v < V; ++v) y[size_t(v)] = row[v] / temp;
        out[size_t(t)] = sample_row(op, t, y.data(), V, params[size_t(t)], request_ids, positions);
      }
    });
    write_samples(out, token_ids, logp, lse, entropy);
  }

 private:
  // One sampled row: the id and the values recorded with it.
  struct Sampled {
    int64_t id = 0;
    float logp = 0.0f, lse = 0.0f, entropy = 0.0f;
  };
  // Row t from its tempered logits y [V].
  static Sampled sample_row(const char* op, int64_t t, const float* y, int64_t V,
                            const SamplingParams& p, const TensorView& request_ids,
                            const TensorView& positions) {
    const RowStats st = row_stats(y, V);
    LS_CHECK(std::isfinite(st.lse), op, "row ", t, ": logsumexp is ", st.lse,
             " (NaN or +inf logits, or every logit -inf): nothing to sample");
    int64_t id;
    if (p.temperature == 0.0f) {
      id = 0;  // greedy: argmax, lowest index among ties
      for (int64_t v = 1; v < V; ++v)
        if (y[v] > y[id]) id = v;
    } else {
      const bool filtered = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f;
      const uint64_t rid = uint64_t(index_at(request_ids, t));
      const uint32_t pos = uint32_t(index_at(positions, t));
      if (filtered) {
        const std::vector<int64_t> kept = sampling_candidates(y, V, st.lse, p);
        id = gumbel_argmax(y, V, &kept, p.seed, rid, pos);
      } else {
        id = gumbel_argmax(y, V, nullptr, p.seed, rid, pos);
      }
    }
    return Sampled{id, y[id] - st.lse, st.lse, st.entropy};
  }
  static void write_samples(const std::vector<Sampled>& out, const TensorView& token_ids,
                            const TensorView& logp, const TensorView& lse,
                            const TensorView& entropy) {
    for (int64_t t = 0; t < int64_t(out.size()); ++t) {
      const Sampled& r = out[size_t(t)];
      if (token_ids.dtype == DType::kI32) {
        token_ids.ptr<int32_t>()[t * token_ids.stride[0]] = int32_t(r.id);
      } else {
        token_ids.ptr<int64_t>()[t * token_ids.stride[0]] = r.id;
      }
      f32_at(logp, t) = r.logp;
      f32_at(lse, t) = r.lse;
      f32_at(entropy, t) = r.entropy;
    }
  }

  void gather(const char* op, const TensorView& ids, const TensorView& table,
              const VocabShard& shard, int64_t vocab, const TensorView& out) const override {
    const int64_t T = check_gather(op, Device::kCPU, ids, table, shard.size(), vocab, out);
    const int64_t H = table.shape[1];
    for_rows(T, H, [&](int64_t t) {
      const int64_t id = index_at(ids, t);
      bf16* o = out.ptr<bf16>() + t * out.stride[0];
      if (id >= shard.begin && id < shard.end) {
        std::memcpy(o, row_bf16(table, id - shard.begin), size_t(H) * sizeof(bf16));
      } else {
        std::fill(o, o + H, bf16{0});
      }
    });
  }

  // Per-row 1 / sqrt(mean(x²) + eps) of `rows` rows of H elements. The kernel depends on the
  // batch: a call with T < num_threads tokens splits each row into num_threads consecutive parts
  // (one per thread) whose partial sums are added in order; otherwise each row is one loop.
  template <typename RowFn>
  std::vector<float> inv_rms(int64_t T, int64_t rows, int64_t H, float eps,
                             const RowFn& row) const {
    std::vector<float> sum(static_cast<size_t>(rows));
    const int64_t parts = c_.num_threads;
    if (T < parts) {
      std::vector<float> partial(static_cast<size_t>(rows * parts));
      parallel_for(rows * parts, 1, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          const int64_t r = i / parts, p = i % parts;
          partial[size_t(i)] = sum_squares(row(r), H * p / parts, H * (p + 1) / parts);
        }
      });
      for (int64_t r = 0; r < rows; ++r) {
        float acc = partial[size_t(r * parts)];
        for (int64_t p = 1; p < parts; ++p) acc = acc + partial[size_t(r * parts + p)];
        sum[size_t(r)] = acc;
      }
    } else {
      for_rows(rows, H, [&](int64_t r) { sum[size_t(r)] = sum_squares(row(r), 0, H); });
    }
    for (float& s : sum) s = 1.0f / std::sqrt(s / float(H) + eps);
    return sum;
  }

  // y = bf16(bf16(x·r)·w) (HF order), row by row; y may alias the rows read.
  template <typename RowFn>
  void normalize(int64_t rows, int64_t H, const std::vector<float>& r, const TensorView& weight,
                 const RowFn& row, const TensorView& y) const {
    const bf16* w = weight.ptr<const bf16>();
    for_rows(rows, H, [&](int64_t i) {
      const bf16* x = row(i);
      bf16* o = flat_row<bf16>(y, i);
      for (int64_t k = 0; k < H; ++k) {
        const bf16 t = f32_to_bf16(bf16_to_f32(x[k]) * r[size_t(i)]);
        o[k] = f32_to_bf16(bf16_to_f32(t) * bf16_to_f32(w[k]));
      }
    });
  }

  // Paged attention (decode and chunked prefill) the flash-decoding way: each (row, head) cuts
  // its keys [0, ctx) into `splits` ranges [ctx·i/splits, ctx·(i+1)/splits); each range runs an
  // online softmax over key blocks of kv_block keys (from the range's first key); the ranges'
  // (m, l, acc) merge in order. splits and the block size depend on the batch.
  void paged(const char* op, const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
             const TensorView& v_cache, bool cascade, const AttentionConfig& cfg, int forced_splits,
             const TensorView& out, const TensorView& lse) const override {
    const Paged p =
        check_paged_call(op, Device::kCPU, q, meta, k_cache, v_cache, cfg, cascade, out, lse);
    const int64_t N = p.qs.N, Hq = p.qs.Hq, D = p.qs.D, G = Hq / p.Hkv;
    if (N == 0) return;
    const int64_t block = p.num_seqs > c_.kv_block_switch ? c_.kv_block_large : c_.kv_block_small;
    const int64_t splits =
        forced_splits > 0 ? forced_splits : std::max<int64_t>(1, c_.kv_split_budget / p.num_seqs);
    const float scale = float(cfg.resolved_scale(D));
    std::vector<KvRow> rows;
    rows.reserve(size_t(N));
    for (int64_t r = 0; r < N; ++r)
      rows.push_back(kv_row(k_cache, v_cache, meta.device_copies(), p, p.seq[size_t(r)], cascade));
    parallel_for(N * Hq, 1, [&](int64_t a, int64_t b) {
      std::vector<float> sc(static_cast<size_t>(block)), acc(static_cast<size_t>(D)),
          all_acc(static_cast<size_t>(D));
      for (int64_t i = a; i < b; ++i) {
        const int64_t r = i / Hq, h = i % Hq, hk = h / G;
        const KvRow& src = rows[size_t(r)];
        const bf16* qr = q.ptr<const bf16>() + r * q.stride[0] + h * q.stride[1];
        const int64_t ctx = p.pos[size_t(r)] + 1;
        // Split states, merged in order as they are produced.
        float M = kNegInf, L = 0.0f;
        std::fill(all_acc.begin(), all_acc.end(), 0.0f);
        bool first = true;
        for (int64_t sp = 0; sp < splits; ++sp) {
          const int64_t lo = ctx * sp / splits, hi = ctx * (sp + 1) / splits;
          if (hi <= lo) continue;
          float m = kNegInf, l = 0.0f;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t b0 = lo; b0 < hi; b0 += block) {
            const int64_t b1 = std::min(hi, b0 + block);
            float bm = m;
            for (int64_t j = b0; j < b1; ++j) {
              const float s = dot_bf16(qr, src.key(j, hk), D) * scale;
              sc[size_t(j - b0)] = s;
              if (s > bm) bm = s;
            }
            const float corr = std::exp(m - bm);
            l = l * corr;
            for (int64_t d = 0; d < D; ++d) acc[size_t(d)] = acc[size_t(d)] * corr;
            for (int64_t j = b0; j < b1; ++j) {
              const float e = std::exp(sc[size_t(j - b0)] - bm);
              l = l + e;
              const bf16* vr = src.value(j, hk);
              for (int64_t d = 0; d < D; ++d)
                acc[size_t(d)] = acc[size_t(d)] + e * bf16_to_f32(vr[d]);
            }
            m = bm;
          }
          if (first) {  // the first split's state is taken as is
            M = m;
            L = l;
            all_acc = acc;
            first = false;
            continue;
          }
          // Merge (M, L, A) with (m, l, acc): the usual flash-decoding combine.
          const float nm = std::max(M, m);
          const float fa = std::exp(M - nm), fb = std::exp(m - nm);
          L = L * fa + l * fb;
          for (int64_t d = 0; d < D; ++d)
            all_acc[size_t(d)] = all_acc[size_t(d)] * fa + acc[size_t(d)] * fb;
          M = nm;
        }
        for (int64_t d = 0; d < D; ++d) all_acc[size_t(d)] = all_acc[size_t(d)] / L;
        write_attn_row(all_acc.data(), D, out, r, h, lse, M + std::log(L));
      }
    });
  }

  // fn(t, y) for every token t (a block's rows in parallel), y its logits against the first Vn
  // rows of w divided by temperature(t): fp32 by OpenBLAS (bf16 converted to fp32; W converted
  // logits_vocab_chunk rows at a time; sizes checked against BLAS's int range), per token block of
  // logits_token_block rows (the last one shorter; one row is a sgemv), so a token's logits depend
  // on where the batch cuts it.
  template <typename TempFn, typename Fn>
  void for_logit_rows(const char* op, const TensorView& h, const TensorView& w, int64_t Vn,
                      const TempFn& temperature, const Fn& fn) const {
    const int64_t T = h.size(0), H = h.size(1);
    check_blas_dims(op, c_.logits_token_block, Vn, H);
    const int64_t tb = std::min<int64_t>(c_.logits_token_block, std::max<int64_t>(T, 1));
    std::vector<float> hf(static_cast<size_t>(tb * H)), z(static_cast<size_t>(tb * Vn)), wf;
    for (int64_t r0 = 0; r0 < T; r0 += tb) {
      const int64_t rows = std::min(tb, T - r0);
      to_f32(h, r0, r0 + rows, hf.data());
      for (int64_t c0 = 0; c0 < Vn; c0 += c_.logits_vocab_chunk) {
        const int64_t c1 = std::min(Vn, c0 + c_.logits_vocab_chunk);
        wf.resize(size_t((c1 - c0) * H));
        to_f32(w, c0, c1, wf.data());
        blas_nt(hf.data(), wf.data(), rows, c1 - c0, H, z.data() + c0, Vn);
      }
      parallel_for(rows, 1, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          float* y = z.data() + i * Vn;
          const float temp = temperature(r0 + i);
          for (int64_t v = 0; v < Vn; ++v) y[v] = y[v] / temp;
          fn(r0 + i, static_cast<const float*>(y));
        }
      });
    }
  }

  BaselineConfig c_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_baseline_backend(int num_threads) {
  return std::make_unique<BaselineBackend>(default_baseline_config(num_threads));
}

std::unique_ptr<OpsBackend> make_baseline_backend(const BaselineConfig& config) {
  return std::make_unique<BaselineBackend>(config);
}

}  // namespace lockstep::engine
