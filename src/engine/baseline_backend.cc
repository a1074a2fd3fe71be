// The baseline OpsBackend: ordinary, non-invariant kernels. GEMMs go through OpenBLAS (sgemv for
// one row, sgemm otherwise; row-parallel TP partials summed in rank order), reductions are plain
// sequential loops whose split depends on the batch (RMSNorm for small batches, paged attention's
// key blocks and split-KV), RoPE's cos/sin come from fp32 libm, softmax and log_softmax use libm
// exp/log. Correct math (fp64-tested), but a token's bits depend on its batch, path and TP degree.
// NOTE: libm std::exp/std::log/std::cos/std::sin are used here on purpose (the project's own
// primitives are for the invariant ops): the baseline stands for what stacks run today.
// What each op mirrors: docs/baseline.md.
#include "engine/baseline_backend.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Small helpers.

int64_t read_index(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kI32) return t.ptr<const int32_t>()[i * t.stride[0]];
  return t.ptr<const int64_t>()[i * t.stride[0]];
}

float& f32_at(const TensorView& t, int64_t i) { return t.ptr<float>()[i * t.stride[0]]; }

const bf16* row_bf16(const TensorView& t, int64_t r) {
  return t.ptr<const bf16>() + r * t.stride[0];
}

bool has_view(const TensorView& t) { return t.ndim != 0 || t.data != nullptr; }

bool overlaps(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto span = [](const TensorView& t, const char*& lo, const char*& hi) {
    int64_t last = 0;
    for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.stride[i];
    lo = static_cast<const char*>(t.data);
    hi = lo + (last + 1) * dtype_size(t.dtype);
  };
  const char *alo, *ahi, *blo, *bhi;
  span(a, alo, ahi);
  span(b, blo, bhi);
  return alo < bhi && blo < ahi;
}

// Rows [r0, r1) of a 2-D bf16 view (last dim contiguous) as dense fp32 [r1 - r0, C].
void to_f32(const TensorView& t, int64_t r0, int64_t r1, float* out) {
  const int64_t C = t.size(1);
  parallel_for(r1 - r0, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)),
               [&](int64_t a, int64_t b) {
                 for (int64_t i = a; i < b; ++i) {
                   const bf16* s = row_bf16(t, r0 + i);
                   float* d = out + i * C;
                   for (int64_t k = 0; k < C; ++k) d[k] = bf16_to_f32(s[k]);
                 }
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

// Stores a dense fp32 [M, N] block into y (bf16 rounded RNE, or f32 as is).
void store_rows(const float* v, int64_t M, int64_t N, const TensorView& y) {
  parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)), [&](int64_t a, int64_t b) {
    for (int64_t m = a; m < b; ++m) {
      const float* s = v + m * N;
      if (y.dtype == DType::kBF16) {
        bf16* d = y.ptr<bf16>() + m * y.stride[0];
        for (int64_t n = 0; n < N; ++n) d[n] = f32_to_bf16(s[n]);
      } else {
        std::memcpy(y.ptr<float>() + m * y.stride[0], s, size_t(N) * sizeof(float));
      }
    }
  });
}

void check_xw(const char* op, const TensorView& x, const TensorView& w) {
  check_tensor(op, "x", x, DType::kBF16, {-1, -1});
  check_tensor(op, "w", w, DType::kBF16, {-1, -1});
  check_inner_contiguous(op, "x", x);
  check_inner_contiguous(op, "w", w);
  LS_CHECK(x.size(1) == w.size(1), op, "x and w must have the same K: x is ", x.shape_string(),
           ", w is ", w.shape_string());
}

void check_segments(const char* op, const GemmConfig& cfg) {
  LS_CHECK(cfg.segments == 1 || cfg.segments == 2 || cfg.segments == 4 || cfg.segments == 8, op,
           "cfg.segments must be 1, 2, 4 or 8, got ", cfg.segments);
}

// x·wᵀ in fp32 (dense [M, N]): bf16 inputs converted to fp32, then OpenBLAS.
std::vector<float> matmul_nt(const TensorView& x, const TensorView& w) {
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  std::vector<float> xf(static_cast<size_t>(M * K)), wf(static_cast<size_t>(N * K)),
      y(static_cast<size_t>(M * N));
  to_f32(x, 0, M, xf.data());
  to_f32(w, 0, N, wf.data());
  blas_nt(xf.data(), wf.data(), M, N, K, y.data(), N);
  return y;
}

// ---------------------------------------------------------------------------------------------
// Elementwise checks (as the cpu ops).

void check_rows_like(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  if (x.ndim == 2) {
    check_tensor(op, arg, t, DType::kBF16, {x.shape[0], x.shape[1]});
  } else {
    check_tensor(op, arg, t, DType::kBF16, {x.shape[0], x.shape[1], x.shape[2]});
  }
  check_inner_contiguous(op, arg, t);
}

void check_norm_x(const char* op, const TensorView& x) {
  LS_CHECK(x.ndim == 2 || x.ndim == 3, op,
           "argument 'x' expected shape [T, H] or [T, heads, D], got ", x.shape_string());
  LS_CHECK(x.dtype == DType::kBF16, op, "argument 'x' expected dtype bf16, got ",
           dtype_name(x.dtype));
  LS_CHECK(x.device == Device::kCPU, op, "argument 'x' expected device cpu, got ",
           device_name(x.device));
  LS_CHECK(x.shape[x.ndim - 1] >= 1, op, "argument 'x' expected a last dimension >= 1, got ",
           x.shape_string());
  check_rows_like(op, "x", x, x);
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

struct QShape {
  int64_t N, Hq, D;
};

QShape check_q(const char* op, const TensorView& q) {
  LS_CHECK(q.ndim == 3, op, "argument 'q' expected shape [N, Hq, D], got ", q.shape_string());
  check_tensor(op, "q", q, DType::kBF16, {-1, -1, -1});
  check_inner_contiguous(op, "q", q);
  const int64_t D = q.shape[2];
  LS_CHECK(D >= kAttnMmaK && D <= kAttnMaxHeadDim && D % kAttnMmaK == 0, op,
           "argument 'q' head_dim must be a multiple of ", kAttnMmaK, " in [", kAttnMmaK, ", ",
           kAttnMaxHeadDim, "], got ", D);
  LS_CHECK(q.shape[1] >= 1, op, "argument 'q' expected at least one head, got ", q.shape_string());
  return {q.shape[0], q.shape[1], D};
}

void check_heads(const char* op, int64_t Hq, int64_t Hkv) {
  LS_CHECK(Hkv >= 1 && Hq % Hkv == 0, op, "query heads Hq=", Hq,
           " must be a multiple of kv heads Hkv=", Hkv);
}

void check_attn_outputs(const char* op, const QShape& s, const TensorView& out,
                        const TensorView& lse) {
  check_tensor(op, "out", out, DType::kBF16, {s.N, s.Hq, s.D});
  check_inner_contiguous(op, "out", out);
  if (has_view(lse)) check_tensor(op, "lse", lse, DType::kF32, {s.N, s.Hq});
}

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
  if (has_view(lse) && lse.numel() > 0)
    lse.ptr<float>()[r * lse.stride[0] + h * lse.stride[1]] = lse_value;
}

// The validated paged problem and the key/value addressing of one sequence.
struct Paged {
  QShape qs;
  int64_t Hkv = 0, NP = 0, P = 0, S = 0, MP = 0;
  std::vector<int64_t> pos, seq;
  std::vector<int64_t> group;       // per sequence: prefix group or -1
  std::vector<int64_t> shared_len;  // per group
  int64_t num_seqs = 0;             // distinct sequences among the rows
};

void check_cache(const char* op, const char* arg, const TensorView& c, int64_t D) {
  LS_CHECK(c.ndim == 4, op, "argument '", arg, "' expected shape [NP, P, Hkv, D], got ",
           c.shape_string());
  check_tensor(op, arg, c, DType::kBF16, {-1, -1, -1, D});
  check_inner_contiguous(op, arg, c);
}

int64_t read_i32(const TensorView& t, int64_t i) { return t.ptr<const int32_t>()[i * t.stride[0]]; }

// The checks of the cpu paged ops: shapes, dtypes, q_seq / q_pos / seq_lens ranges, and every
// page index a row's keys 0 .. q_pos will be read from.
Paged check_paged(const char* op, const TensorView& q, const TensorView& q_seq,
                  const TensorView& q_pos, const PagedKv& kv, const SharedPrefix* prefix,
                  const AttentionConfig& cfg) {
  cfg.validate();
  Paged p;
  p.qs = check_q(op, q);
  const int64_t N = p.qs.N, D = p.qs.D;
  check_cache(op, "kv.k_cache", kv.k_cache, D);
  check_cache(op, "kv.v_cache", kv.v_cache, D);
  check_tensor(op, "kv.v_cache", kv.v_cache, DType::kBF16,
               {kv.k_cache.shape[0], kv.k_cache.shape[1], kv.k_cache.shape[2], D});
  p.NP = kv.k_cache.shape[0];
  p.P = kv.k_cache.shape[1];
  p.Hkv = kv.k_cache.shape[2];
  LS_CHECK(p.P >= 1, op, "argument 'kv.k_cache' page size must be >= 1, got ",
           kv.k_cache.shape_string());
  check_heads(op, p.qs.Hq, p.Hkv);
  LS_CHECK(kv.block_table.ndim == 2, op, "argument 'kv.block_table' expected shape [S, MP], got ",
           kv.block_table.shape_string());
  check_tensor(op, "kv.block_table", kv.block_table, DType::kI32, {-1, -1});
  check_inner_contiguous(op, "kv.block_table", kv.block_table);
  p.S = kv.block_table.shape[0];
  p.MP = kv.block_table.shape[1];
  check_tensor(op, "kv.seq_lens", kv.seq_lens, DType::kI32, {p.S});
  check_tensor(op, "q_seq", q_seq, DType::kI32, {N});
  check_tensor(op, "q_pos", q_pos, DType::kI32, {N});

  const int32_t* ptab = nullptr;
  int64_t GR = 0, MPs = 0, ptab_s0 = 0;
  p.group.assign(size_t(p.S), -1);
  if (prefix != nullptr) {
    LS_CHECK(prefix->block_table.ndim == 2, op,
             "argument 'prefix.block_table' expected shape [GR, MPs], got ",
             prefix->block_table.shape_string());
    check_tensor(op, "prefix.block_table", prefix->block_table, DType::kI32, {-1, -1});
    check_inner_contiguous(op, "prefix.block_table", prefix->block_table);
    GR = prefix->block_table.shape[0];
    MPs = prefix->block_table.shape[1];
    ptab = prefix->block_table.ptr<const int32_t>();
    ptab_s0 = prefix->block_table.stride[0];
    check_tensor(op, "prefix.shared_len", prefix->shared_len, DType::kI32, {GR});
    check_tensor(op, "prefix.seq_group", prefix->seq_group, DType::kI32, {p.S});
    p.shared_len.resize(size_t(GR));
    for (int64_t g = 0; g < GR; ++g) {
      const int64_t len = read_i32(prefix->shared_len, g);
      LS_CHECK(len >= 0 && len <= MPs * p.P, op, "prefix.shared_len[", g, "] = ", len,
               " outside [0, MPs * P = ", MPs * p.P, "] (prefix block table too short)");
      p.shared_len[size_t(g)] = len;
    }
    for (int64_t s = 0; s < p.S; ++s) {
      const int64_t g = read_i32(prefix->seq_group, s);
      LS_CHECK(g >= -1 && g < GR, op, "prefix.seq_group[", s, "] = ", g, " outside [-1, ", GR, ")");
      p.group[size_t(s)] = g;
    }
  }

  const int32_t* bt = kv.block_table.ptr<const int32_t>();
  const int64_t bt_s0 = kv.block_table.stride[0];
  p.pos.resize(size_t(N));
  p.seq.resize(size_t(N));
  std::vector<int64_t> reach(static_cast<size_t>(p.S), -1);  // furthest position read per sequence
  for (int64_t r = 0; r < N; ++r) {
    const int64_t s = read_i32(q_seq, r);
    LS_CHECK(s >= 0 && s < p.S, op, "q_seq[", r, "] = ", s, " outside [0, S = ", p.S, ")");
    const int64_t len = read_i32(kv.seq_lens, s);
    LS_CHECK(len >= 1, op, "kv.seq_lens[", s, "] = ", len,
             ": context length must be >= 1 for a sequence with queries (row ", r, ")");
    LS_CHECK(len <= p.MP * p.P, op, "kv.seq_lens[", s, "] = ", len,
             " needs more pages than kv.block_table has (MP = ", p.MP, ", P = ", p.P, ")");
    const int64_t pos = read_i32(q_pos, r);
    LS_CHECK(pos >= 0 && pos < len, op, "q_pos[", r, "] = ", pos, " outside [0, seq_len = ", len,
             ") of sequence ", s);
    const int64_t g = p.group[size_t(s)];
    if (g >= 0) {
      LS_CHECK(len >= p.shared_len[size_t(g)], op, "kv.seq_lens[", s, "] = ", len,
               " is shorter than the shared prefix of its group ", g, " (", p.shared_len[size_t(g)],
               ")");
    }
    p.pos[size_t(r)] = pos;
    p.seq[size_t(r)] = s;
    if (reach[size_t(s)] < 0) ++p.num_seqs;
    reach[size_t(s)] = std::max(reach[size_t(s)], pos);
  }
  auto check_pages = [&](const int32_t* row, const char* what, int64_t which, int64_t j_lo,
                         int64_t j_hi) {
    if (j_hi <= j_lo) return;
    for (int64_t i = j_lo / p.P; i <= (j_hi - 1) / p.P; ++i) {
      const int64_t page = row[i];
      LS_CHECK(page >= 0 && page < p.NP, op, what, "[", which, "][", i, "] = ", page,
               " is not a page of the cache (NP = ", p.NP, ")");
    }
  };
  for (int64_t s = 0; s < p.S; ++s) {
    if (reach[size_t(s)] < 0) continue;
    const int64_t j_hi = reach[size_t(s)] + 1;
    const int64_t g = p.group[size_t(s)];
    const int64_t split = g >= 0 ? p.shared_len[size_t(g)] : 0;
    check_pages(bt + s * bt_s0, "kv.block_table", s, split, j_hi);
    if (g >= 0) check_pages(ptab + g * ptab_s0, "prefix.block_table", g, 0, std::min(j_hi, split));
  }
  return p;
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

KvRow kv_row(const PagedKv& kv, const Paged& p, int64_t s, const SharedPrefix* prefix) {
  KvRow r;
  r.k = kv.k_cache.ptr<const bf16>();
  r.v = kv.v_cache.ptr<const bf16>();
  r.k_s0 = kv.k_cache.stride[0];
  r.k_s1 = kv.k_cache.stride[1];
  r.k_sh = kv.k_cache.stride[2];
  r.v_s0 = kv.v_cache.stride[0];
  r.v_s1 = kv.v_cache.stride[1];
  r.v_sh = kv.v_cache.stride[2];
  r.P = p.P;
  r.own = kv.block_table.ptr<const int32_t>() + s * kv.block_table.stride[0];
  const int64_t g = p.group[size_t(s)];
  if (prefix != nullptr && g >= 0) {
    r.shared = prefix->block_table.ptr<const int32_t>() + g * prefix->block_table.stride[0];
    r.shared_len = p.shared_len[size_t(g)];
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// LogP / sampling helpers.

void check_h(const char* op, const TensorView& h) {
  check_tensor(op, "h", h, DType::kBF16, {-1, -1});
  check_inner_contiguous(op, "h", h);
  LS_CHECK(h.size(1) >= 1, op, "argument 'h': hidden size (dim 1) must be >= 1, got ", h.size(1));
}

void check_targets(const char* op, const TensorView& targets, int64_t T, int64_t V,
                   int64_t ignore_index) {
  check_tensor_dtypes(op, "targets", targets, {DType::kI32, DType::kI64}, {T});
  for (int64_t t = 0; t < T; ++t) {
    const int64_t g = read_index(targets, t);
    LS_CHECK(g == ignore_index || (g >= 0 && g < V), op, "argument 'targets': targets[", t,
             "] = ", g, " is outside [0, ", V, ") and is not ignore_index (", ignore_index, ")");
  }
}

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

constexpr int64_t kMaxSampleVocab = int64_t(1) << 21;

// ---------------------------------------------------------------------------------------------

class BaselineBackend final : public OpsBackend {
 public:
  explicit BaselineBackend(const BaselineConfig& c) : c_(c) { c_.validate(); }

  std::string name() const override { return "baseline"; }

  // --- GEMM ---

  void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
            const TensorView& y) const override {
    const char* op = "baseline gemm";
    check_segments(op, cfg);
    check_xw(op, x, w);
    const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
    check_tensor_dtypes(op, "y", y, {DType::kBF16, DType::kF32}, {M, N});
    check_inner_contiguous(op, "y", y);
    LS_CHECK(!overlaps(y, x) && !overlaps(y, w), op, "argument 'y' must not overlap x or w");
    check_blas_dims(op, M, N, K);
    if (M == 0 || N == 0) return;
    store_rows(matmul_nt(x, w).data(), M, N, y);
  }

  void gemm_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                    int tp_size, int tp_rank, const GemmConfig& cfg,
                    const TensorView& y_partial) const override {
    const char* op = "baseline gemm_partial";
    check_segments(op, cfg);
    LS_CHECK(k_total >= 0, op, "k_total must be >= 0, got ", k_total);
    LS_CHECK(tp_size >= 1 && (tp_size & (tp_size - 1)) == 0 && tp_size <= cfg.segments, op,
             "tp_size must be a power of two <= segments (", cfg.segments, "), got ", tp_size);
    LS_CHECK(tp_rank >= 0 && tp_rank < tp_size, op, "tp_rank must be in [0, ", tp_size, "), got ",
             tp_rank);
    check_xw(op, x_shard, w_shard);
    const GemmKRange r = gemm_tp_k_range(cfg, k_total, tp_size, tp_rank);
    LS_CHECK(x_shard.size(1) == r.end - r.begin, op, "rank ", tp_rank, " of ", tp_size,
             " owns K columns [", r.begin, ", ", r.end, ") of ", k_total, " (", r.end - r.begin,
             " columns), but x_shard is ", x_shard.shape_string());
    const int64_t M = x_shard.size(0), N = w_shard.size(0);
    check_tensor(op, "y_partial", y_partial, DType::kF32, {M, N});
    check_inner_contiguous(op, "y_partial", y_partial);
    LS_CHECK(!overlaps(y_partial, x_shard) && !overlaps(y_partial, w_shard), op,
             "argument 'y_partial' must not overlap x_shard or w_shard");
    check_blas_dims(op, M, N, x_shard.size(1));
    if (M == 0 || N == 0) return;
    store_rows(matmul_nt(x_shard, w_shard).data(), M, N, y_partial);
  }

  // The usual all-reduce: ((p0 + p1) + p2) + ... in rank order, then one rounding.
  void gemm_combine(const std::vector<TensorView>& partials, const TensorView& y) const override {
    const char* op = "baseline gemm_combine";
    LS_CHECK(!partials.empty(), op, "argument 'partials' must hold at least one view");
    check_tensor(op, "partials[0]", partials[0], DType::kF32, {-1, -1});
    const int64_t M = partials[0].size(0), N = partials[0].size(1);
    for (size_t i = 0; i < partials.size(); ++i) {
      const std::string name = "partials[" + std::to_string(i) + "]";
      check_tensor(op, name.c_str(), partials[i], DType::kF32, {M, N});
      check_inner_contiguous(op, name.c_str(), partials[i]);
    }
    check_tensor_dtypes(op, "y", y, {DType::kBF16, DType::kF32}, {M, N});
    check_inner_contiguous(op, "y", y);
    for (size_t i = 0; i < partials.size(); ++i) {
      const bool same = partials[i].data == y.data && y.dtype == DType::kF32 &&
                        (M <= 1 || partials[i].stride[0] == y.stride[0]);
      LS_CHECK(same || !overlaps(y, partials[i]), op, "argument 'y' overlaps partials[", i,
               "] (only an exact alias of an f32 partial is allowed)");
    }
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
    const char* op = "baseline rmsnorm";
    cfg.validate();
    check_norm_x(op, x);
    const int64_t H = x.shape[x.ndim - 1];
    check_tensor(op, "weight", weight, DType::kBF16, {H});
    check_inner_contiguous(op, "weight", weight);
    check_rows_like(op, "y", y, x);
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
    const char* op = "baseline rmsnorm_residual";
    cfg.validate();
    check_norm_x(op, x);
    const int64_t H = x.shape[x.ndim - 1];
    check_rows_like(op, "residual", residual, x);
    check_tensor(op, "weight", weight, DType::kBF16, {H});
    check_inner_contiguous(op, "weight", weight);
    check_rows_like(op, "residual_out", residual_out, x);
    check_rows_like(op, "y", y, x);
    LS_CHECK(residual_out.data != y.data || x.numel() == 0, op,
             "outputs 'residual_out' and 'y' must not be the same memory");
    const int64_t rows = x.numel() / H;
    if (rows == 0) return;
    // s = bf16(x + residual), the new residual stream (buffered: outputs may alias inputs).
    std::vector<bf16> s(static_cast<size_t>(rows * H));
    parallel_for(rows, std::max<int64_t>(1, 16384 / H), [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) {
        const bf16* xr = flat_row<const bf16>(x, i);
        const bf16* rr = flat_row<const bf16>(residual, i);
        for (int64_t k = 0; k < H; ++k)
          s[size_t(i * H + k)] = f32_to_bf16(bf16_to_f32(xr[k]) + bf16_to_f32(rr[k]));
      }
    });
    parallel_for(rows, std::max<int64_t>(1, 16384 / H), [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i)
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
    check_tensor(op, "x", x, DType::kBF16, {-1, -1, D});
    check_inner_contiguous(op, "x", x);
    const int64_t T = x.shape[0], heads = x.shape[1];
    check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T});
    check_tensor(op, "y", y, DType::kBF16, {T, heads, D});
    check_inner_contiguous(op, "y", y);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = read_index(positions, t);
      LS_CHECK(p >= 0 && p < P, op, "argument 'positions' element ", t, " = ", p,
               " is outside the table's range [0, ", P, ")");
    }
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
        const float pos = float(read_index(positions, t));
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
    const char* op = "baseline silu_mul";
    check_tensor(op, "gate", gate, DType::kBF16, {-1, -1});
    check_inner_contiguous(op, "gate", gate);
    const int64_t T = gate.shape[0], I = gate.shape[1];
    LS_CHECK(I >= 1, op, "argument 'gate' expected a last dimension >= 1, got ",
             gate.shape_string());
    check_tensor(op, "up", up, DType::kBF16, {T, I});
    check_inner_contiguous(op, "up", up);
    check_tensor(op, "out", out, DType::kBF16, {T, I});
    check_inner_contiguous(op, "out", out);
    if (T == 0) return;
    parallel_for(T, std::max<int64_t>(1, 16384 / I), [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        const bf16* g = row_bf16(gate, t);
        const bf16* u = row_bf16(up, t);
        bf16* o = out.ptr<bf16>() + t * out.stride[0];
        for (int64_t i = 0; i < I; ++i) {
          const float gv = bf16_to_f32(g[i]);
          o[i] = f32_to_bf16(gv / (1.0f + std::exp(-gv)) * bf16_to_f32(u[i]));
        }
      }
    });
  }

  // --- embedding ---

  void embedding(const TensorView& ids, const TensorView& table,
                 const TensorView& out) const override {
    const char* op = "baseline embedding";
    check_tensor(op, "table", table, DType::kBF16, {-1, -1});
    const int64_t V = table.shape[0];
    const int64_t T = check_gather(op, ids, table, V, V, out);
    const int64_t H = table.shape[1];
    parallel_for(T, std::max<int64_t>(1, 16384 / H), [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        std::memcpy(out.ptr<bf16>() + t * out.stride[0], row_bf16(table, read_index(ids, t)),
                    size_t(H) * sizeof(bf16));
    });
  }

  // Megatron's VocabParallelEmbedding: rows outside the shard are zeroed (+0), then all-reduced.
  void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                const VocabShard& shard, int64_t vocab,
                                const TensorView& out) const override {
    const char* op = "baseline embedding_vocab_parallel";
    LS_CHECK(vocab >= 1 && shard.begin >= 0 && shard.begin <= shard.end && shard.end <= vocab, op,
             "argument 'shard' ", shard.to_string(), " is not inside the vocabulary [0, ", vocab,
             ")");
    const int64_t T = check_gather(op, ids, table, shard.size(), vocab, out);
    const int64_t H = table.shape[1];
    parallel_for(T, std::max<int64_t>(1, 16384 / H), [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        const int64_t id = read_index(ids, t);
        bf16* o = out.ptr<bf16>() + t * out.stride[0];
        if (id >= shard.begin && id < shard.end) {
          std::memcpy(o, row_bf16(table, id - shard.begin), size_t(H) * sizeof(bf16));
        } else {
          std::fill(o, o + H, bf16{0});
        }
      }
    });
  }

  void embedding_combine(const std::vector<TensorView>& partials,
                         const TensorView& out) const override {
    const char* op = "baseline embedding_combine";
    LS_CHECK(!partials.empty(), op, "argument 'partials' must hold at least one view");
    check_tensor(op, "out", out, DType::kBF16, {-1, -1});
    check_inner_contiguous(op, "out", out);
    const int64_t T = out.shape[0], H = out.shape[1];
    LS_CHECK(H >= 1, op, "argument 'out' expected a hidden size >= 1, got ", out.shape_string());
    for (size_t r = 0; r < partials.size(); ++r) {
      const std::string name = "partials[" + std::to_string(r) + "]";
      check_tensor(op, name.c_str(), partials[r], DType::kBF16, {T, H});
      check_inner_contiguous(op, name.c_str(), partials[r]);
    }
    if (T == 0) return;
    parallel_for(T, std::max<int64_t>(1, 16384 / H), [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        bf16* o = out.ptr<bf16>() + t * out.stride[0];
        for (int64_t k = 0; k < H; ++k) {
          float acc = bf16_to_f32(row_bf16(partials[0], t)[k]);
          for (size_t r = 1; r < partials.size(); ++r)
            acc = acc + bf16_to_f32(row_bf16(partials[r], t)[k]);
          o[k] = f32_to_bf16(acc);
        }
      }
    });
  }

  // --- attention ---

  // Plain (math-backend) attention per (token, head): all scores of the row in fp32, max,
  // exp, sum, P = e / sum (kept fp32), then P·V in fp32, one rounding.
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& cu_seqlens, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const override {
    const char* op = "baseline attention_prefill_varlen";
    cfg.validate();
    const QShape qs = check_q(op, q);
    const int64_t T = qs.N, D = qs.D, Hq = qs.Hq;
    LS_CHECK(k.ndim == 3, op, "argument 'k' expected shape [T, Hkv, D], got ", k.shape_string());
    check_tensor(op, "k", k, DType::kBF16, {T, -1, D});
    check_inner_contiguous(op, "k", k);
    const int64_t Hkv = k.shape[1];
    check_heads(op, Hq, Hkv);
    check_tensor(op, "v", v, DType::kBF16, {T, Hkv, D});
    check_inner_contiguous(op, "v", v);
    LS_CHECK(cu_seqlens.ndim == 1 && cu_seqlens.shape[0] >= 1, op,
             "argument 'cu_seqlens' expected shape [B+1] with B >= 0, got ",
             cu_seqlens.shape_string());
    check_tensor(op, "cu_seqlens", cu_seqlens, DType::kI32, {-1});
    const int64_t B = cu_seqlens.shape[0] - 1;
    LS_CHECK(read_i32(cu_seqlens, 0) == 0, op, "cu_seqlens[0] must be 0, got ",
             read_i32(cu_seqlens, 0));
    for (int64_t b = 0; b < B; ++b) {
      LS_CHECK(read_i32(cu_seqlens, b + 1) >= read_i32(cu_seqlens, b), op,
               "cu_seqlens must be non-decreasing: cu_seqlens[", b + 1,
               "] = ", read_i32(cu_seqlens, b + 1), " < cu_seqlens[", b,
               "] = ", read_i32(cu_seqlens, b));
    }
    LS_CHECK(read_i32(cu_seqlens, B) == T, op, "cu_seqlens[B] must equal T = ", T, ", got ",
             read_i32(cu_seqlens, B));
    check_attn_outputs(op, qs, out, lse);
    if (T == 0) return;
    std::vector<int64_t> start(static_cast<size_t>(T));  // first token of each token's sequence
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = read_i32(cu_seqlens, b); t < read_i32(cu_seqlens, b + 1); ++t)
        start[size_t(t)] = read_i32(cu_seqlens, b);
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

  void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                       const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) const override {
    paged("baseline attention_paged", q, q_seq, q_pos, kv, nullptr, cfg, 0, out, lse);
  }

  void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq,
                                const TensorView& q_pos, const PagedKv& kv,
                                const AttentionConfig& cfg, int num_splits, const TensorView& out,
                                const TensorView& lse) const override {
    const char* op = "baseline attention_paged_split_kv";
    LS_CHECK(num_splits >= 1, op, "num_splits must be >= 1, got ", num_splits);
    paged(op, q, q_seq, q_pos, kv, nullptr, cfg, num_splits, out, lse);
  }

  // Without cascade kernels: the ordinary paged path reading the shared pages through the
  // prefix table.
  void attention_paged_cascade(const TensorView& q, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const SharedPrefix& prefix, const AttentionConfig& cfg,
                               const TensorView& out, const TensorView& lse) const override {
    paged("baseline attention_paged_cascade", q, q_seq, q_pos, kv, &prefix, cfg, 0, out, lse);
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
    cfg.validate();
    params.validate();
    check_h(op, h);
    const int64_t T = h.size(0), H = h.size(1);
    check_tensor(op, "w", w, DType::kBF16, {-1, H});
    check_inner_contiguous(op, "w", w);
    const int64_t V = w.size(0);
    LS_CHECK(V >= 1, op, "argument 'w': vocab size (dim 0) must be >= 1, got ", V);
    check_targets(op, targets, T, V, params.ignore_index);
    check_tensor(op, "logp", logp, DType::kF32, {T});
    check_tensor(op, "lse", lse, DType::kF32, {T});
    check_tensor(op, "entropy", entropy, DType::kF32, {T});
    check_blas_dims(op, c_.logits_token_block, V, H);
    const float temperature = params.temperature;
    for_logit_blocks(h, w, 0, V, [&](int64_t r0, int64_t rows, float* z) {
      parallel_for(rows, 1, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          const int64_t t = r0 + i;
          float* y = z + i * V;
          for (int64_t v = 0; v < V; ++v) y[v] = y[v] / temperature;
          const RowStats st = row_stats(y, V);
          const int64_t g = read_index(targets, t);
          f32_at(logp, t) = g == params.ignore_index ? 0.0f : y[g] - st.lse;
          f32_at(lse, t) = st.lse;
          f32_at(entropy, t) = st.entropy;
        }
      });
    });
  }

  // A rank's (m, s, Σ exp(y − m)·y, y_target) over its vocab rows, plain loops.
  void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                              const TensorView& targets, const LogprobParams& params,
                              const ContractConfig& cfg, const LogprobShard& shard,
                              const TensorView& state) const override {
    const char* op = "baseline linear_logprob_partial";
    cfg.validate();
    params.validate();
    check_h(op, h);
    const int64_t T = h.size(0), H = h.size(1);
    LS_CHECK(shard.vocab_size >= 1, op, "shard.vocab_size must be >= 1, got ", shard.vocab_size);
    const bool pow2 = shard.seg_count == 1 || shard.seg_count == 2 || shard.seg_count == 4 ||
                      shard.seg_count == 8;
    LS_CHECK(pow2 && cfg.vocab_segments % shard.seg_count == 0 && shard.seg_begin >= 0 &&
                 shard.seg_begin % shard.seg_count == 0 &&
                 shard.seg_begin + shard.seg_count <= cfg.vocab_segments,
             op, "shard: segments [", shard.seg_begin, ", ", shard.seg_begin + shard.seg_count,
             ") are not an aligned power-of-two subtree of vocab_segments=", cfg.vocab_segments);
    const LogprobVocabLayout lay = logprob_vocab_layout(cfg, shard.vocab_size);
    const int64_t v0 = std::min(shard.vocab_size, int64_t(shard.seg_begin) * lay.segment_len);
    const int64_t v1 =
        std::min(shard.vocab_size, int64_t(shard.seg_begin + shard.seg_count) * lay.segment_len);
    check_tensor(op, "w_shard", w_shard, DType::kBF16, {v1 - v0, H});
    check_inner_contiguous(op, "w_shard", w_shard);
    check_targets(op, targets, T, shard.vocab_size, params.ignore_index);
    check_tensor(op, "state", state, DType::kF32, {T, 4});
    check_inner_contiguous(op, "state", state);
    check_blas_dims(op, c_.logits_token_block, v1 - v0, H);
    if (T == 0) return;
    const float nan = f32_from_bits(kCanonicalNanF32);
    const int64_t Vs = v1 - v0;
    if (Vs == 0) {  // an all-padding shard: empty state
      for (int64_t t = 0; t < T; ++t) {
        float* o = state.ptr<float>() + t * state.stride[0];
        o[0] = kNegInf;
        o[1] = 0.0f;
        o[2] = 0.0f;
        o[3] = nan;
      }
      return;
    }
    const float temperature = params.temperature;
    for_logit_blocks(h, w_shard, 0, Vs, [&](int64_t r0, int64_t rows, float* z) {
      parallel_for(rows, 1, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          const int64_t t = r0 + i;
          float* y = z + i * Vs;
          for (int64_t v = 0; v < Vs; ++v) y[v] = y[v] / temperature;
          float m = kNegInf, s = 0.0f, wy = 0.0f;
          for (int64_t v = 0; v < Vs; ++v)
            if (y[v] > m) m = y[v];
          for (int64_t v = 0; v < Vs; ++v) {
            const float e = std::exp(y[v] - m);
            s = s + e;
            wy = wy + e * y[v];
          }
          const int64_t g = read_index(targets, t);
          float* o = state.ptr<float>() + t * state.stride[0];
          o[0] = m;
          o[1] = s;
          o[2] = wy;
          o[3] = (g != params.ignore_index && g >= v0 && g < v1) ? y[g - v0] : nan;
        }
      });
    });
  }

  // Plain sequential combine over ranks: M = max m_r; S = Σ s_r·exp(m_r − M);
  // Σ p·y = (Σ w_r·exp(m_r − M)) / S; lse = M + log S; entropy = lse − Σ p·y.
  void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                              const LogprobParams& params, const ContractConfig& cfg,
                              int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) const override {
    const char* op = "baseline linear_logprob_combine";
    cfg.validate();
    params.validate();
    check_tensor(op, "states", states, DType::kF32, {-1, -1, 4});
    check_inner_contiguous(op, "states", states);
    const int64_t R = states.size(0), T = states.size(1);
    LS_CHECK((R == 1 || R == 2 || R == 4 || R == 8) && cfg.vocab_segments % R == 0, op,
             "argument 'states': rank count (dim 0) must be a power of two dividing "
             "vocab_segments=",
             cfg.vocab_segments, ", got ", R);
    const LogprobVocabLayout lay = logprob_vocab_layout(cfg, vocab_size);
    check_targets(op, targets, T, vocab_size, params.ignore_index);
    check_tensor(op, "logp", logp, DType::kF32, {T});
    check_tensor(op, "lse", lse, DType::kF32, {T});
    check_tensor(op, "entropy", entropy, DType::kF32, {T});
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
        const int64_t g = read_index(targets, t);
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
    cfg.validate();
    check_h(op, h);
    const int64_t T = h.size(0), H = h.size(1);
    check_tensor(op, "w", w, DType::kBF16, {-1, H});
    check_inner_contiguous(op, "w", w);
    const int64_t V = w.size(0);
    LS_CHECK(V >= 1 && V < kMaxSampleVocab, op,
             "argument 'w': vocab size (dim 0) must be in [1, 2^21), got ", V);
    LS_CHECK(int64_t(params.size()) == T, op, "argument 'params': expected ", T,
             " entries (one per row of h), got ", params.size());
    for (int64_t t = 0; t < T; ++t) {
      try {
        params[size_t(t)].validate();
      } catch (const Error& e) {
        throw Error(detail::concat(op, ": argument 'params[", t, "]': ", e.what()));
      }
    }
    check_tensor(op, "request_ids", request_ids, DType::kI64, {T});
    check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T});
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = read_index(positions, t);
      LS_CHECK(pos >= 0 && pos <= int64_t(UINT32_MAX), op, "argument 'positions': positions[", t,
               "] = ", pos, " is outside [0, 2^32)");
    }
    check_tensor_dtypes(op, "token_ids", token_ids, {DType::kI32, DType::kI64}, {T});
    check_tensor(op, "logp", logp, DType::kF32, {T});
    check_tensor(op, "lse", lse, DType::kF32, {T});
    check_tensor(op, "entropy", entropy, DType::kF32, {T});
    check_blas_dims(op, c_.logits_token_block, V, H);
    if (T == 0) return;
    // Results go to [T] buffers first: a row that cannot be sampled throws before any output.
    std::vector<int64_t> out_id(static_cast<size_t>(T));
    std::vector<float> out_logp(static_cast<size_t>(T)), out_lse(static_cast<size_t>(T)),
        out_entropy(static_cast<size_t>(T));
    for_logit_blocks(h, w, 0, V, [&](int64_t r0, int64_t rows, float* z) {
      parallel_for(rows, 1, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          const int64_t t = r0 + i;
          float* y = z + i * V;
          const SamplingParams& p = params[size_t(t)];
          const float temperature = p.logprob_temperature();
          for (int64_t v = 0; v < V; ++v) y[v] = y[v] / temperature;
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
            const uint64_t rid = uint64_t(read_index(request_ids, t));
            const uint32_t pos = uint32_t(read_index(positions, t));
            if (filtered) {
              const std::vector<int64_t> kept = sampling_candidates(y, V, st.lse, p);
              id = gumbel_argmax(y, V, &kept, p.seed, rid, pos);
            } else {
              id = gumbel_argmax(y, V, nullptr, p.seed, rid, pos);
            }
          }
          out_id[size_t(t)] = id;
          out_logp[size_t(t)] = y[id] - st.lse;
          out_lse[size_t(t)] = st.lse;
          out_entropy[size_t(t)] = st.entropy;
        }
      });
    });
    for (int64_t t = 0; t < T; ++t) {
      if (token_ids.dtype == DType::kI32) {
        token_ids.ptr<int32_t>()[t * token_ids.stride[0]] = int32_t(out_id[size_t(t)]);
      } else {
        token_ids.ptr<int64_t>()[t * token_ids.stride[0]] = out_id[size_t(t)];
      }
      f32_at(logp, t) = out_logp[size_t(t)];
      f32_at(lse, t) = out_lse[size_t(t)];
      f32_at(entropy, t) = out_entropy[size_t(t)];
    }
  }

 private:
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
          const bf16* x = row(r);
          float acc = 0.0f;
          for (int64_t k = H * p / parts; k < H * (p + 1) / parts; ++k) {
            const float v = bf16_to_f32(x[k]);
            acc = acc + v * v;
          }
          partial[size_t(i)] = acc;
        }
      });
      for (int64_t r = 0; r < rows; ++r) {
        float acc = partial[size_t(r * parts)];
        for (int64_t p = 1; p < parts; ++p) acc = acc + partial[size_t(r * parts + p)];
        sum[size_t(r)] = acc;
      }
    } else {
      parallel_for(rows, std::max<int64_t>(1, 16384 / H), [&](int64_t a, int64_t b) {
        for (int64_t r = a; r < b; ++r) {
          const bf16* x = row(r);
          float acc = 0.0f;
          for (int64_t k = 0; k < H; ++k) {
            const float v = bf16_to_f32(x[k]);
            acc = acc + v * v;
          }
          sum[size_t(r)] = acc;
        }
      });
    }
    for (float& s : sum) s = 1.0f / std::sqrt(s / float(H) + eps);
    return sum;
  }

  // y = bf16(bf16(x·r)·w) (HF order), row by row; y may alias the rows read.
  template <typename RowFn>
  void normalize(int64_t rows, int64_t H, const std::vector<float>& r, const TensorView& weight,
                 const RowFn& row, const TensorView& y) const {
    const bf16* w = weight.ptr<const bf16>();
    parallel_for(rows, std::max<int64_t>(1, 16384 / H), [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) {
        const bf16* x = row(i);
        bf16* o = flat_row<bf16>(y, i);
        for (int64_t k = 0; k < H; ++k) {
          const bf16 t = f32_to_bf16(bf16_to_f32(x[k]) * r[size_t(i)]);
          o[k] = f32_to_bf16(bf16_to_f32(t) * bf16_to_f32(w[k]));
        }
      }
    });
  }

  // Checks ids, table and out of a gather; returns T.
  static int64_t check_gather(const char* op, const TensorView& ids, const TensorView& table,
                              int64_t table_rows, int64_t vocab, const TensorView& out) {
    check_tensor_dtypes(op, "ids", ids, {DType::kI32, DType::kI64}, {-1});
    const int64_t T = ids.shape[0];
    check_tensor(op, "table", table, DType::kBF16, {table_rows, -1});
    check_inner_contiguous(op, "table", table);
    const int64_t H = table.shape[1];
    LS_CHECK(H >= 1, op, "argument 'table' expected a hidden size >= 1, got ",
             table.shape_string());
    check_tensor(op, "out", out, DType::kBF16, {T, H});
    check_inner_contiguous(op, "out", out);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = read_index(ids, t);
      LS_CHECK(id >= 0 && id < vocab, op, "argument 'ids' element ", t, " = ", id,
               " is outside the vocabulary [0, ", vocab, ")");
    }
    return T;
  }

  // Paged attention (decode and chunked prefill) the flash-decoding way: each (row, head) cuts
  // its keys [0, ctx) into `splits` ranges [ctx·i/splits, ctx·(i+1)/splits); each range runs an
  // online softmax over key blocks of kv_block keys (from the range's first key); the ranges'
  // (m, l, acc) merge in order. splits and the block size depend on the batch.
  void paged(const char* op, const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
             const PagedKv& kv, const SharedPrefix* prefix, const AttentionConfig& cfg,
             int forced_splits, const TensorView& out, const TensorView& lse) const {
    const Paged p = check_paged(op, q, q_seq, q_pos, kv, prefix, cfg);
    check_attn_outputs(op, p.qs, out, lse);
    const int64_t N = p.qs.N, Hq = p.qs.Hq, D = p.qs.D, G = Hq / p.Hkv;
    if (N == 0) return;
    const int64_t block = p.num_seqs > c_.kv_block_switch ? c_.kv_block_large : c_.kv_block_small;
    const int64_t splits =
        forced_splits > 0 ? forced_splits : std::max<int64_t>(1, c_.kv_split_budget / p.num_seqs);
    const float scale = float(cfg.resolved_scale(D));
    std::vector<KvRow> rows;
    rows.reserve(size_t(N));
    for (int64_t r = 0; r < N; ++r) rows.push_back(kv_row(kv, p, p.seq[size_t(r)], prefix));
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

  // Logits of every token block against vocab rows [v0, v1) of w: z [rows, v1 - v0] fp32 by
  // OpenBLAS (bf16 converted to fp32; W converted logits_vocab_chunk rows at a time), handed to
  // fn(r0, rows, z). Token blocks of logits_token_block rows (the last one shorter; one row is a
  // sgemv), so a token's logits depend on where the batch cuts it.
  template <typename Fn>
  void for_logit_blocks(const TensorView& h, const TensorView& w, int64_t v0, int64_t v1,
                        const Fn& fn) const {
    const int64_t T = h.size(0), H = h.size(1), Vn = v1 - v0;
    const int64_t tb = std::min<int64_t>(c_.logits_token_block, std::max<int64_t>(T, 1));
    std::vector<float> hf(static_cast<size_t>(tb * H)), z(static_cast<size_t>(tb * Vn)), wf;
    for (int64_t r0 = 0; r0 < T; r0 += tb) {
      const int64_t rows = std::min(tb, T - r0);
      to_f32(h, r0, r0 + rows, hf.data());
      for (int64_t c0 = v0; c0 < v1; c0 += c_.logits_vocab_chunk) {
        const int64_t c1 = std::min(v1, c0 + c_.logits_vocab_chunk);
        wf.resize(size_t((c1 - c0) * H));
        to_f32(w, c0, c1, wf.data());
        blas_nt(hf.data(), wf.data(), rows, c1 - c0, H, z.data() + (c0 - v0), Vn);
      }
      fn(r0, rows, z.data());
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
