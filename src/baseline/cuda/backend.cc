// The CUDA "baseline" OpsBackend: what an ordinary GPU inference / training stack computes for the
// same op set (docs/baseline.md, "GPU"): cuBLAS GEMMs (cuBLAS picks its kernel and split-K from
// M, N, K), row-parallel partials summed in rank order, one-pass RMSNorm / RoPE / SiLU kernels
// with warp-shuffle reductions and __expf, flash-attention prefill, flash-decoding paged attention
// whose split-KV count is chosen from the batch size, and log-probs / sampling over materialized
// fp32 logits in bounded row blocks. Correct math within bf16-level tolerances
// (tests/cuda/test_baseline_cuda.cu), but a token's bits depend on its batch: the performance peer
// of the invariant CUDA backend, and the source of the mismatches `lockstep audit --baseline`
// shows on the GPU.
//
// Argument checks: the contract's (src/contract/checks.h, same messages as the cpu ops) with
// Device::kCUDA on the real views. Index views (ids, positions, targets) are device views, as the
// invariant CUDA backend takes them (the engine uploads its index views): dtype and shape are
// checked, the contents trusted (the kernels clamp or skip what would read out of bounds).
// Sampling's Philox counters may also be host views (values checked by the contract, then
// uploaded). Attention takes the step's validated PagedMeta / PackedSeqs (host metadata) and its
// kernels read their device copies; kv_cache_write is the invariant backend's copy.
#include <algorithm>
#include <cstring>
#include <vector>

#include "baseline/backend_base.h"
#include "baseline/cuda/kernels.h"
#include "contract/checks.h"
#include "engine/cuda/backends.h"
#include "engine/cuda/device_backend.h"
#include "lockstep/cuda/attention.h"
#include "lockstep/cuda/runtime.h"
#include "lockstep/ops/embedding.h"

namespace lockstep::engine {

namespace {

using namespace contract;
namespace base = cuda::baseline;

// Token rows per logits GEMM in LogP (fp32 [rows, V] scratch) and in sampling (plus sort buffers).
constexpr int64_t kLogitsRows = 256;
constexpr int64_t kSampleRows = 64;

// A 1-D i32/i64 device view as a kernel Index.
base::Index index_of(const TensorView& v) { return {v.data, v.stride[0], v.dtype == DType::kI64}; }

// Device copies of host metadata, alive for one call (stream-ordered frees after the kernels).
class Uploads {
 public:
  explicit Uploads(void* stream) : stream_(stream) {}
  // A 1-D i32/i64 view as a device Index (host: packed and uploaded; device: in place).
  base::Index index(const TensorView& v) {
    if (v.device == Device::kCUDA) return index_of(v);
    return {put_dense(v), 1, v.dtype == DType::kI64};
  }
  // An i32 view of 1 or 2 dims as (device pointer, row stride, element stride).
  struct I32 {
    const int32_t* p = nullptr;
    int64_t s0 = 0, s_last = 1;
  };
  I32 i32(const TensorView& v) {
    if (v.device == Device::kCUDA)
      return {static_cast<const int32_t*>(v.data), v.ndim == 2 ? v.stride[0] : 0,
              v.ndim == 1 ? v.stride[0] : 1};
    return {static_cast<const int32_t*>(put_dense(v)), v.shape[v.ndim - 1], 1};
  }
  // A 1-D or 2-D host view packed row-major, uploaded.
  const void* put_dense(const TensorView& v) {
    const int64_t rows = v.ndim == 2 ? v.shape[0] : 1, cols = v.shape[v.ndim - 1];
    const int64_t es = dtype_size(v.dtype), s0 = v.ndim == 2 ? v.stride[0] : 0,
                  s1 = v.stride[v.ndim - 1];
    std::vector<char> host(size_t(std::max<int64_t>(rows * cols, 1) * es));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        std::memcpy(host.data() + (i * cols + j) * es,
                    static_cast<const char*>(v.data) + (i * s0 + j * s1) * es, size_t(es));
    return put(host.data(), size_t(rows * cols * es));
  }
  void* put(const void* host, size_t bytes) {
    bufs_.emplace_back(std::max<size_t>(bytes, 16), stream_);
    base::upload(bufs_.back().get(), host, bytes, stream_);
    return bufs_.back().get();
  }

 private:
  void* stream_;
  std::vector<base::DeviceBuffer> bufs_;
};

base::Index offset(base::Index ix, int64_t r0) {
  ix.p = static_cast<const char*>(ix.p) + r0 * ix.stride * (ix.i64 ? 8 : 4);
  return ix;
}

base::Rows rows_of(const TensorView& v) {
  base::Rows r;
  r.p = v.data;
  r.s0 = v.ndim >= 1 ? v.stride[0] : 0;
  if (v.ndim == 3) {
    r.s1 = v.stride[1];
    r.inner = std::max<int64_t>(1, v.shape[1]);
  }
  return r;
}

// Row stride of a 2-D operand as cuBLAS needs it (>= the row length; any value for one row).
int64_t lead(const char* op, const char* arg, const TensorView& t) {
  const int64_t cols = t.shape[1];
  if (t.shape[0] <= 1) return std::max<int64_t>(cols, 1);
  LS_CHECK(t.stride[0] >= cols, op, "argument '", arg, "': cuBLAS needs a row stride >= ", cols,
           ", got ", t.describe());
  return t.stride[0];
}

float* f32p(const TensorView& t) { return static_cast<float*>(t.data); }

// A [rows, heads, D] view's pointer and strides, as the kernels take them.
template <typename T>
base::Heads<T> heads(const TensorView& v) {
  return {static_cast<T*>(v.data), v.stride[0], v.stride[1]};
}

// Attention's lse [N, Hq]: none or empty is not written (a null pointer).
base::Heads<float> lse_heads(const TensorView& lse) {
  return wants_lse(lse) ? heads<float>(lse) : base::Heads<float>{};
}

base::Cache cache(const TensorView& c) { return {c.data, c.stride[0], c.stride[1], c.stride[2]}; }

// The log-prob ops' [T] outputs from row r0 on.
base::RowOutputs row_outputs(const TensorView& logp, const TensorView& lse, const TensorView& ent,
                             int64_t r0) {
  return {f32p(logp) + r0 * logp.stride[0], logp.stride[0],
          f32p(lse) + r0 * lse.stride[0],   lse.stride[0],
          f32p(ent) + r0 * ent.stride[0],   ent.stride[0]};
}

// Base pointers and row strides of a combine's 1 to kMaxParts partials.
struct Parts {
  std::vector<const void*> p;
  std::vector<int64_t> ld;
  Parts(const char* op, const std::vector<TensorView>& partials) {
    LS_CHECK(!partials.empty() && partials.size() <= size_t(base::kMaxParts), op,
             "argument 'partials' must hold 1 to ", base::kMaxParts, " views, got ",
             partials.size());
    for (const TensorView& t : partials) {
      p.push_back(t.data);
      ld.push_back(t.stride[0]);
    }
  }
};

class CudaBaselineBackend final : public BaselineOps<CudaDeviceBackend> {
 public:
  std::string name() const override { return "baseline"; }

  // --- GEMM ---

  void gemm(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
            const TensorView& y) const override {
    const char* op = "baseline gemm";
    check_baseline_gemm(op, Device::kCUDA, x, w, cfg, y);
    gemm_nt(op, x, "x", w, "w", y, "y");
  }

  void gemm_partial(const TensorView& x, const TensorView& w, int64_t k_total, int tp_size,
                    int tp_rank, const GemmConfig& cfg, const TensorView& y) const override {
    const char* op = "baseline gemm_partial";
    check_gemm_partial(op, Device::kCUDA, x, w, k_total, tp_size, tp_rank, cfg, y);
    gemm_nt(op, x, "x_shard", w, "w_shard", y, "y_partial");
  }

  // The usual all-reduce: ((p0 + p1) + p2) + ... in rank order, one rounding.
  void gemm_combine(const std::vector<TensorView>& partials, const TensorView& y) const override {
    const char* op = "baseline gemm_combine";
    const Parts p(op, partials);
    check_gemm_combine(op, Device::kCUDA, partials, nullptr, y);
    const int64_t M = partials[0].size(0), N = partials[0].size(1);
    if (M == 0 || N == 0) return;
    base::sum_parts(p.p.data(), false, p.ld.data(), int(p.p.size()), M, N, y.data, y.stride[0],
                    y.dtype == DType::kF32, stream_);
  }

  // --- elementwise ---

  void rmsnorm(const TensorView& x, const TensorView& w, const RmsNormConfig& cfg,
               const TensorView& y) const override {
    const char* op = "baseline rmsnorm";
    const int64_t H = check_rmsnorm(op, Device::kCUDA, x, w, cfg, y);
    const int64_t rows = x.numel() / H;
    base::rmsnorm(rows_of(x), base::Rows{}, w.data, base::Rows{}, rows_of(y), rows, H, cfg.eps,
                  stream_);
  }

  void rmsnorm_residual(const TensorView& x, const TensorView& r, const TensorView& w,
                        const RmsNormConfig& cfg, const TensorView& ro,
                        const TensorView& y) const override {
    const char* op = "baseline rmsnorm_residual";
    const int64_t H = check_rmsnorm_residual(op, Device::kCUDA, x, r, w, cfg, ro, y);
    const int64_t rows = x.numel() / H;
    base::rmsnorm(rows_of(x), rows_of(r), w.data, rows_of(ro), rows_of(y), rows, H, cfg.eps,
                  stream_);
  }

  // cos/sin of pos · inv_freq in fp32 on the device (the table is not read, so not checked).
  void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
            const TensorView& y) const override {
    const char* op = "baseline rope";
    table.config.validate();
    const int64_t D = table.config.head_dim, P = table.config.max_positions;
    check_rope_args(op, Device::kCUDA, x, positions, D, P, y);
    const int64_t T = x.shape[0], heads = x.shape[1];
    if (T == 0 || heads == 0) return;
    base::rope(rows_of(x), index_of(positions), rows_of(y), T, heads, D, float(table.config.theta),
               stream_);
  }

  void silu_mul(const TensorView& g, const TensorView& u, const TensorView& o) const override {
    const char* op = "baseline silu_mul";
    check_silu_mul(op, Device::kCUDA, g, u, o);
    base::silu_mul(g.data, g.stride[0], u.data, u.stride[0], o.data, o.stride[0], g.shape[0],
                   g.shape[1], stream_);
  }

  // --- embedding ---

  void embedding_combine(const std::vector<TensorView>& partials,
                         const TensorView& out) const override {
    const char* op = "baseline embedding_combine";
    const Parts p(op, partials);
    check_embedding_combine(op, Device::kCUDA, partials, out);
    base::sum_parts(p.p.data(), true, p.ld.data(), int(p.p.size()), out.shape[0], out.shape[1],
                    out.data, out.stride[0], false, stream_);
  }

  // --- attention ---

  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const PackedSeqs& seqs, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) const override {
    const char* op = "baseline attention_prefill_varlen";
    const QShape qs = check_prefill_call(op, Device::kCUDA, q, k, v, seqs, cfg, out, lse);
    if (qs.N == 0) return;
    // The kernel reads the device copy (a host copy is uploaded for this call).
    Uploads up(stream_);
    const Uploads::I32 cu = up.i32(seqs.device_copy());
    base::PrefillArgs a{};
    a.q = heads<const void>(q);
    a.k = heads<const void>(k);
    a.v = heads<const void>(v);
    a.cu_seqlens = cu.p;
    a.cu_s = cu.s_last;
    a.B = seqs.B();
    a.T = qs.N;
    a.Hq = qs.Hq;
    a.Hkv = k.shape[1];
    a.D = qs.D;
    a.scale_log2 = cfg.scale_log2(qs.D);
    a.out = heads<void>(out);
    a.lse = lse_heads(lse);
    base::attention_prefill(a, stream_);
  }

  // A KV-cache write is a copy: every stack does the same thing, so the baseline runs the
  // invariant backend's (host slot mappings checked like the cpu op's, then uploaded).
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slot_mapping,
                      const TensorView& k_cache, const TensorView& v_cache) const override {
    cuda::kv_cache_write(k, v, slot_mapping, k_cache, v_cache, stream_);
  }

  // --- heads ---

  // Logits [rows, V] fp32 per block of kLogitsRows tokens by cuBLAS, then a plain log-softmax.
  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                      const LogprobParams& params, const ContractConfig& cfg,
                      const TensorView& logp, const TensorView& lse,
                      const TensorView& ent) const override {
    const char* op = "baseline linear_logprob";
    check_linear_logprob(op, Device::kCUDA, h, w, targets, params, cfg, logp, lse, ent);
    const int64_t T = h.size(0), V = w.size(0);
    if (T == 0) return;
    const base::Index tg = index_of(targets);
    for_logit_blocks(op, h, w, "w", V, kLogitsRows, [&](int64_t r0, int64_t rows, float* z) {
      base::StatsArgs a{};
      a.z = z;
      a.ldz = V;
      a.rows = rows;
      a.V = V;
      a.temperature = params.temperature;
      a.targets = offset(tg, r0);
      a.ignore_index = params.ignore_index;
      a.out = row_outputs(logp, lse, ent, r0);
      base::logprob_rows(a, stream_);
    });
  }

  // A rank's (m, s, w, y_target) over its vocab rows (w relative to m, as the contract's state).
  void linear_logprob_partial(const TensorView& h, const TensorView& w, const TensorView& targets,
                              const LogprobParams& params, const ContractConfig& cfg,
                              const LogprobShard& shard, const TensorView& state) const override {
    const char* op = "baseline linear_logprob_partial";
    const ShardRows sr =
        check_linear_logprob_partial(op, Device::kCUDA, h, w, targets, params, cfg, shard, state);
    const int64_t T = h.size(0), Vs = sr.v1 - sr.v0;
    if (T == 0) return;
    const base::Index tg = index_of(targets);
    for_logit_blocks(op, h, w, "w_shard", Vs, kLogitsRows, [&](int64_t r0, int64_t rows, float* z) {
      base::PartialArgs a{};
      a.z = z;
      a.ldz = std::max<int64_t>(Vs, 1);
      a.rows = rows;
      a.Vs = Vs;
      a.v0 = sr.v0;
      a.temperature = params.temperature;
      a.targets = offset(tg, r0);
      a.ignore_index = params.ignore_index;
      a.state = f32p(state) + r0 * state.stride[0];
      a.ld_state = state.stride[0];
      base::logprob_partial_rows(a, stream_);
    });
  }

  void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                              const LogprobParams& params, const ContractConfig& cfg,
                              int64_t vocab_size, const TensorView& logp, const TensorView& lse,
                              const TensorView& ent) const override {
    const char* op = "baseline linear_logprob_combine";
    const LogprobVocabLayout lay = check_linear_logprob_combine(
        op, Device::kCUDA, states, targets, params, cfg, vocab_size, logp, lse, ent);
    const int64_t R = states.size(0), T = states.size(1);
    if (T == 0) return;
    base::CombineArgs a{};
    a.states = static_cast<const float*>(states.data);
    a.st_sR = states.stride[0];
    a.st_sT = states.stride[1];
    a.R = R;
    a.T = T;
    a.rank_len = lay.segment_len * (cfg.vocab_segments / R);
    a.V = vocab_size;
    a.targets = index_of(targets);
    a.ignore_index = params.ignore_index;
    a.out = row_outputs(logp, lse, ent, 0);
    base::logprob_combine(a, stream_);
  }

  // Logits blocks of kSampleRows rows by cuBLAS, plain log-softmax, greedy / Gumbel-max with the
  // invariant sampler's noise, top-k / top-p / min-p on a sorted copy of filtered rows. A row
  // whose lse is not finite is an Error (found after the kernels: this call synchronizes).
  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
              const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
              const TensorView& ids, const TensorView& logp, const TensorView& lse,
              const TensorView& ent) const override {
    const char* op = "baseline sample";
    // Philox counters (request_ids, positions) may be host views (values checked) or device
    // views (trusted): the contract's check takes either.
    check_sample(op, Device::kCUDA, h, w, params, request_ids, positions, cfg, ids, logp, lse, ent);
    const int64_t T = h.size(0), V = w.size(0);
    if (T == 0) return;
    Uploads up(stream_);
    const base::Index rid = up.index(request_ids), pos = up.index(positions);
    std::vector<base::SampleRow> rows_host(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const SamplingParams& p = params[size_t(t)];
      base::SampleRow& r = rows_host[size_t(t)];
      r.seed = p.seed;
      r.top_k = p.top_k;
      r.temperature = p.temperature;
      r.top_p = p.top_p;
      r.min_p = p.min_p;
      r.filtered = p.temperature > 0.0f &&
                   ((p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f);
    }
    const auto* rows_dev = static_cast<const base::SampleRow*>(
        up.put(rows_host.data(), rows_host.size() * sizeof(base::SampleRow)));
    base::DeviceBuffer bad(sizeof(uint32_t), stream_);
    base::fill_bytes(bad.get(), 0xff, sizeof(uint32_t), stream_);
    std::vector<int32_t> filtered;
    const size_t id_size = size_t(dtype_size(ids.dtype));
    for_logit_blocks(op, h, w, "w", V, kSampleRows, [&](int64_t r0, int64_t rows, float* z) {
      filtered.clear();
      for (int64_t i = 0; i < rows; ++i)
        if (rows_host[size_t(r0 + i)].filtered) filtered.push_back(int32_t(i));
      base::SampleArgs a{};
      a.z = z;
      a.ldz = V;
      a.rows = rows;
      a.V = V;
      a.params = rows_dev + r0;
      a.request_ids = offset(rid, r0);
      a.positions = offset(pos, r0);
      a.token_ids = static_cast<char*>(ids.data) + size_t(r0 * ids.stride[0]) * id_size;
      a.s_ids = ids.stride[0];
      a.ids_i64 = ids.dtype == DType::kI64;
      a.out = row_outputs(logp, lse, ent, r0);
      a.bad_row = bad.as<uint32_t>();
      a.row_offset = uint32_t(r0);
      base::sample_rows(a, filtered.data(), int64_t(filtered.size()), stream_);
    });
    uint32_t bad_row = 0;
    base::download(&bad_row, bad.get(), sizeof(uint32_t), stream_);
    base::stream_synchronize(stream_, op);
    LS_CHECK(bad_row == 0xffffffffu, op, "row ", bad_row,
             ": logsumexp is not finite (NaN or +inf logits, or every logit -inf): nothing to "
             "sample");
  }

 private:
  // y = x·wᵀ by cuBLAS (arg names for the row-stride errors).
  void gemm_nt(const char* op, const TensorView& x, const char* x_arg, const TensorView& w,
               const char* w_arg, const TensorView& y, const char* y_arg) const {
    const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
    if (M == 0 || N == 0) return;
    base::gemm(ctx_, x.data, lead(op, x_arg, x), w.data, lead(op, w_arg, w), y.data,
               lead(op, y_arg, y), y.dtype == DType::kF32, M, N, K, stream_);
  }

  void gather(const char* op, const TensorView& ids, const TensorView& table,
              const VocabShard& shard, int64_t vocab, const TensorView& out) const override {
    const int64_t T = check_gather(op, Device::kCUDA, ids, table, shard.size(), vocab, out);
    if (T == 0) return;
    base::embedding(index_of(ids), table.data, table.stride[0], shard.begin, shard.size(), out.data,
                    out.stride[0], T, table.shape[1], stream_);
  }

  // Logits z [rows, Vn] fp32 (row stride max(Vn, 1)) of h's token blocks of `block` rows against
  // the first Vn rows of w by cuBLAS, handed to fn(r0, rows, z) block by block.
  template <typename Fn>
  void for_logit_blocks(const char* op, const TensorView& h, const TensorView& w, const char* w_arg,
                        int64_t Vn, int64_t block, const Fn& fn) const {
    const int64_t T = h.size(0), ldz = std::max<int64_t>(Vn, 1), tb = std::min(T, block);
    base::DeviceBuffer z(size_t(tb * ldz) * sizeof(float), stream_);
    for (int64_t r0 = 0; r0 < T; r0 += tb) {
      const int64_t rows = std::min(tb, T - r0);
      const TensorView hb = h.rows(r0, r0 + rows);
      if (Vn > 0)
        base::gemm(ctx_, hb.data, lead(op, "h", hb), w.data, lead(op, w_arg, w), z.get(), ldz, true,
                   rows, Vn, h.size(1), stream_);
      fn(r0, rows, z.as<float>());
    }
  }

  void paged(const char* op, const TensorView& q, const PagedMeta& meta, const TensorView& k_cache,
             const TensorView& v_cache, bool cascade, const AttentionConfig& cfg, int forced_splits,
             const TensorView& out, const TensorView& lse) const override {
    const Paged p =
        check_paged_call(op, Device::kCUDA, q, meta, k_cache, v_cache, cfg, cascade, out, lse);
    if (p.qs.N == 0) return;
    // The kernels read the meta's device copies (host copies are uploaded for this call).
    const PagedTables& t = meta.device_copies();
    Uploads up(stream_);
    base::PagedArgs a{};
    a.q = heads<const void>(q);
    a.k_cache = cache(k_cache);
    a.v_cache = cache(v_cache);
    const Uploads::I32 table = up.i32(t.block_table);
    a.block_table = table.p;
    a.bt_s0 = table.s0;
    a.S = p.S;
    a.MP = p.MP;
    a.NP = p.NP;
    a.P = p.P;
    const Uploads::I32 seq = up.i32(t.q_seq), pos = up.i32(t.q_pos);
    a.q_seq = seq.p;
    a.qseq_s = seq.s_last;
    a.q_pos = pos.p;
    a.qpos_s = pos.s_last;
    if (cascade) {
      const Uploads::I32 pt = up.i32(t.prefix_block_table), sh = up.i32(t.shared_len),
                         sg = up.i32(t.seq_group);
      a.prefix_table = pt.p;
      a.pt_s0 = pt.s0;
      a.GR = t.prefix_block_table.shape[0];
      a.MPs = t.prefix_block_table.shape[1];
      a.shared_len = sh.p;
      a.sl_s = sh.s_last;
      a.seq_group = sg.p;
      a.sg_s = sg.s_last;
    }
    a.N = p.qs.N;
    a.Hq = p.qs.Hq;
    a.Hkv = p.Hkv;
    a.D = p.qs.D;
    a.scale_log2 = cfg.scale_log2(p.qs.D);
    // NOTE: the split count depends on the batch (rows) and on the table's capacity MP·P, never
    // on where the metadata lives: host and device metadata give the same bits.
    a.splits = forced_splits > 0 ? forced_splits
                                 : base::paged_num_splits(p.qs.N, p.Hkv, p.qs.Hq / p.Hkv,
                                                          p.MP * p.P, ctx_.num_sms());
    a.out = heads<void>(out);
    a.lse = lse_heads(lse);
    base::attention_paged(a, stream_);
  }

  base::Context ctx_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_cuda_baseline_backend() {
  return std::make_unique<CudaBaselineBackend>();
}

}  // namespace lockstep::engine
