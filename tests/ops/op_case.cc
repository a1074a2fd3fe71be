// The op-case table's machinery: data kinds, backend memory, the bitwise comparison, and the CPU
// backends (reference fast path and the scalar spec).
#include "ops/op_case.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/thread_pool.h"
#include "lockstep/error.h"
#include "lockstep/ops/activation.h"

namespace lockstep::cases {

const char* data_kind_name(DataKind k) {
  switch (k) {
    case DataKind::kNormal:
      return "normal";
    case DataKind::kLarge:
      return "large";
    case DataKind::kSmall:
      return "small";
    case DataKind::kSpecials:
      return "specials";
    case DataKind::kTies:
      return "ties";
  }
  return "?";
}

namespace {

// A random sign and mantissa at an exponent drawn from [elo, ehi] (unbiased, normal numbers).
uint32_t random_exp_f32_bits(std::mt19937_64& g, int elo, int ehi) {
  std::uniform_int_distribution<int> e(elo, ehi), s(0, 1);
  std::uniform_int_distribution<uint32_t> f(0, (1u << 23) - 1);
  return (uint32_t(s(g)) << 31) | (uint32_t(e(g) + 127) << 23) | f(g);
}

float draw(DataKind kind, std::mt19937_64& g, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  auto normal = [&] {
    float v = nd(g);
    return v == 0.0f ? scale * 0.001f : v;
  };
  switch (kind) {
    case DataKind::kNormal:
      return normal();
    case DataKind::kLarge:
      return f32_from_bits(random_exp_f32_bits(g, 20, 60));
    case DataKind::kSmall:
      return f32_from_bits(random_exp_f32_bits(g, -126, -90));
    case DataKind::kSpecials: {
      std::uniform_int_distribution<int> pick(0, 99);
      const int r = pick(g);
      if (r < 2) return INFINITY;
      if (r < 4) return -INFINITY;
      if (r < 5) return NAN;
      if (r < 7) return 0.0f;
      if (r < 9) return -0.0f;
      if (r < 11) return f32_from_bits(uint32_t(1 + pick(g)) << 16);  // bf16 subnormal
      if (r < 13) return f32_from_bits(0x80000000u | (uint32_t(1 + pick(g)) << 16));  // -subnormal
      return normal();
    }
    case DataKind::kTies: {
      const float v = std::round(nd(g) * 4.0f) / 4.0f;  // multiples of 1/4: many equal values
      return v == 0.0f ? 0.25f * scale : v;
    }
  }
  return 0.0f;
}

}  // namespace

void fill_bf16(bf16* p, int64_t n, DataKind kind, std::mt19937_64& g, float scale) {
  for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(draw(kind, g, scale));
}
void fill_f32(float* p, int64_t n, DataKind kind, std::mt19937_64& g, float scale) {
  for (int64_t i = 0; i < n; ++i) p[i] = draw(kind, g, scale);
}

HostArg host_arg(Tensor t) {
  HostArg a;
  a.view = t.view();
  a.buf = std::move(t);
  return a;
}

HostArg host_rows(DType dt, int64_t rows, int64_t cols, int64_t ld, int64_t col0) {
  LS_CHECK(ld >= col0 + cols, "host_rows", "ld ", ld, " < col0 + cols ", col0 + cols);
  HostArg a;
  a.buf = Tensor(dt, {rows, ld});
  std::memset(a.buf.data(), 0xA5, size_t(a.buf.nbytes()));
  a.view = TensorView::contiguous(static_cast<char*>(a.buf.data()) + col0 * dtype_size(dt), dt,
                                  {rows, cols});
  a.view.stride[0] = ld;
  return a;
}

// ---- Mem ---------------------------------------------------------------------------------------

Mem::~Mem() = default;

void Mem::release_all() {
  for (const Block& b : blocks_) free_raw(b.base);
  blocks_.clear();
}

void* Mem::alloc(size_t bytes) {
  char* p = static_cast<char*>(alloc_raw(bytes ? bytes : 16));
  blocks_.push_back({p, bytes});
  return p;
}

const Mem::Block& Mem::block_of(const void* p) const {
  const char* c = static_cast<const char*>(p);
  // NOTE: the end is exclusive: device allocations can be adjacent, and a view starting at the
  // next block's base must not be taken for the end of this one (an empty block holds only its
  // base).
  for (const Block& b : blocks_)
    if (c == b.base || (c > b.base && c < b.base + b.bytes)) return b;
  LS_CHECK(false, "Mem::read", "the view is not inside an allocation of this backend");
  return blocks_.front();
}

TensorView Mem::in(const HostArg& a) {
  const size_t bytes = size_t(a.buf.nbytes());
  char* d = static_cast<char*>(alloc(bytes));
  if (bytes) put(d, a.buf.data(), bytes);
  TensorView v = a.view;
  v.device = device();
  v.data = d + (static_cast<const char*>(a.view.data) - static_cast<const char*>(a.buf.data()));
  return v;
}

TensorView Mem::out(DType dt, std::vector<int64_t> shape, int64_t row_pad) {
  int64_t inner = 1;
  for (size_t i = 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t ld = inner + row_pad;
  void* p = alloc(size_t(rows * ld * dtype_size(dt)));
  TensorView v = TensorView::contiguous(p, dt, shape, device());
  if (!shape.empty() && row_pad) v.stride[0] = ld;
  return v;
}

Output Mem::read(const std::string& name, const TensorView& v) {
  const Block& b = block_of(v.data);
  Output o;
  o.name = name;
  o.dtype = v.dtype;
  o.rows = v.ndim ? v.shape[0] : 1;
  o.row_elems = 1;
  for (int i = 1; i < v.ndim; ++i) o.row_elems *= v.shape[i];
  o.ld = v.ndim ? v.stride[0] : 1;
  o.offset = (static_cast<const char*>(v.data) - b.base) / dtype_size(v.dtype);
  o.bytes.resize(b.bytes);
  if (b.bytes) get(o.bytes.data(), b.base, b.bytes);
  return o;
}

namespace {

class CpuMem final : public Mem {
 public:
  explicit CpuMem(uint8_t poison) : poison_(poison) {}
  ~CpuMem() override { release_all(); }
  Device device() const override { return Device::kCPU; }

 protected:
  void* alloc_raw(size_t bytes) override {
    void* p = std::malloc(bytes);
    LS_CHECK(p != nullptr, "CpuMem", "out of memory (", bytes, " bytes)");
    std::memset(p, poison_, bytes);
    return p;
  }
  void free_raw(void* p) override { std::free(p); }
  void put(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void get(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }

 private:
  uint8_t poison_;
};

class CpuOps : public Ops {
 public:
  std::string name() const override { return "cpu"; }
  void gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const GemmConfig& cfg,
            const TensorView& y) override {
    cpu::gemm_bf16_nt(x, w, bias, cfg, y);
  }
  void gemm_partial(const TensorView& x, const TensorView& w, int64_t k_total, int tp, int rank,
                    const GemmConfig& cfg, const TensorView& y) override {
    cpu::gemm_bf16_nt_partial(x, w, k_total, tp, rank, cfg, y);
  }
  void gemm_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                    const TensorView& y) override {
    cpu::gemm_tree_combine(partials, bias, y);
  }
  void rmsnorm(const TensorView& x, const TensorView& w, const RmsNormConfig& cfg,
               const TensorView& y) override {
    cpu::rmsnorm(x, w, cfg, y);
  }
  void rmsnorm_residual(const TensorView& x, const TensorView& res, const TensorView& w,
                        const RmsNormConfig& cfg, const TensorView& res_out,
                        const TensorView& y) override {
    cpu::rmsnorm_residual(x, res, w, cfg, res_out, y);
  }
  void rope(const TensorView& x, const TensorView& pos, const RopeTable& table,
            const TensorView& y) override {
    cpu::rope(x, pos, table, y);
  }
  void silu_mul(const TensorView& g, const TensorView& u, const TensorView& out) override {
    cpu::silu_mul(g, u, out);
  }
  void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override {
    cpu::embedding(ids, table, out);
  }
  void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                const VocabShard& shard, int64_t vocab,
                                const TensorView& out) override {
    cpu::embedding_vocab_parallel(ids, table, shard, vocab, out);
  }
  void embedding_combine(const std::vector<TensorView>& partials, const TensorView& out) override {
    cpu::embedding_combine(partials, out);
  }
  void attention_prefill_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& cu, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse) override {
    cpu::attention_prefill_varlen(q, k, v, cu, cfg, out, lse);
  }
  void attention_paged(const TensorView& q, const TensorView& q_seq, const TensorView& q_pos,
                       const PagedKv& kv, const AttentionConfig& cfg, const TensorView& out,
                       const TensorView& lse) override {
    cpu::attention_paged(q, q_seq, q_pos, kv, cfg, out, lse);
  }
  void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq,
                                const TensorView& q_pos, const PagedKv& kv,
                                const AttentionConfig& cfg, int splits, const TensorView& out,
                                const TensorView& lse) override {
    cpu::attention_paged_split_kv(q, q_seq, q_pos, kv, cfg, splits, out, lse);
  }
  void attention_paged_cascade(const TensorView& q, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const SharedPrefix& prefix, const AttentionConfig& cfg,
                               const TensorView& out, const TensorView& lse) override {
    cpu::attention_paged_cascade(q, q_seq, q_pos, kv, prefix, cfg, out, lse);
  }
  void attention_paged_chunk_states(const TensorView& q, const TensorView& q_seq,
                                    const TensorView& q_pos, const PagedKv& kv,
                                    const AttentionConfig& cfg, int64_t chunk_begin,
                                    const AttentionChunkStates& states) override {
    cpu::attention_paged_chunk_states(q, q_seq, q_pos, kv, cfg, chunk_begin, states);
  }
  void attention_merge_chunk_states(const AttentionChunkStates& states, const TensorView& q_pos,
                                    const AttentionConfig& cfg, const TensorView& out,
                                    const TensorView& lse) override {
    cpu::attention_merge_chunk_states(states, q_pos, cfg, out, lse);
  }
  void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slots,
                      const TensorView& k_cache, const TensorView& v_cache) override {
    cpu::kv_cache_write(k, v, slots, k_cache, v_cache);
  }
  void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                      const LogprobParams& p, const ContractConfig& cfg, const TensorView& logp,
                      const TensorView& lse, const TensorView& entropy) override {
    cpu::linear_logprob(h, w, targets, p, cfg, logp, lse, entropy);
  }
  void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                              const TensorView& targets, const LogprobParams& p,
                              const ContractConfig& cfg, const LogprobShard& shard,
                              const TensorView& state) override {
    cpu::linear_logprob_partial(h, w_shard, targets, p, cfg, shard, state);
  }
  void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                              const LogprobParams& p, const ContractConfig& cfg, int64_t vocab,
                              const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) override {
    cpu::linear_logprob_combine(states, targets, p, cfg, vocab, logp, lse, entropy);
  }
  void sample(const TensorView& h, const TensorView& w, std::span<const SamplingParams> params,
              const TensorView& request_ids, const TensorView& positions, const ContractConfig& cfg,
              const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
              const TensorView& entropy) override {
    cpu::sample(h, w, params, request_ids, positions, cfg, token_ids, logp, lse, entropy);
  }
  void gemm_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
               const TensorView& dx) override {
    cpu::gemm_bf16_dx(dy, w, cfg, dx);
  }
  void gemm_dx_partial(const TensorView& dy_shard, const TensorView& w_shard, int64_t n_total,
                       int tp, int rank, const GemmConfig& cfg,
                       const TensorView& dx_partial) override {
    cpu::gemm_bf16_dx_partial(dy_shard, w_shard, n_total, tp, rank, cfg, dx_partial);
  }
  void gemm_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
               const TensorView& dw) override {
    cpu::gemm_bf16_dw(dy, x, order, dw);
  }
  void rmsnorm_backward(const TensorView& s, const TensorView& w, const RmsNormConfig& cfg,
                        const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                        const TensorView* dweight) override {
    cpu::rmsnorm_backward(s, w, cfg, gy, dx, order, dweight);
  }
  void rmsnorm_residual_backward(const TensorView& s, const TensorView& w, const RmsNormConfig& cfg,
                                 const TensorView& gy, const TensorView& gres, const TensorView& ds,
                                 const TokenOrder* order, const TensorView* dweight) override {
    cpu::rmsnorm_residual_backward(s, w, cfg, gy, gres, ds, order, dweight);
  }
  void rope_backward(const TensorView& gy, const TensorView& pos, const RopeTable& table,
                     const TensorView& dx) override {
    cpu::rope_backward(gy, pos, table, dx);
  }
  void silu_mul_backward(const TensorView& gate_up, const TensorView& ga,
                         const TensorView& dgu) override {
    cpu::silu_mul_backward(gate_up, ga, dgu);
  }
  void embedding_backward(const TensorView& ids, const TensorView& gh, const TokenOrder& order,
                          const TensorView& dtable) override {
    cpu::embedding_backward(ids, gh, order, dtable);
  }
  void linear_logprob_backward(const TensorView& h, const TensorView& w, const TensorView& targets,
                               const LogprobParams& p, const ContractConfig& cfg,
                               const TensorView& lse, const TensorView& entropy,
                               const TensorView& g_lp, const TensorView* g_ent,
                               const TensorView& dh, const TokenOrder& order,
                               const TensorView& dw) override {
    cpu::linear_logprob_backward(h, w, targets, p, cfg, lse, entropy, g_lp, g_ent, dh, order, dw);
  }
  void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse,
                                 const TensorView& dout, const TensorView& cu,
                                 const AttentionConfig& cfg, const TensorView& dq,
                                 const TensorView& dk, const TensorView& dv) override {
    const PackedSeqs seqs = PackedSeqs::validate("attention_backward_varlen", cu, q.shape[0]);
    cpu::attention_backward_varlen(q, k, v, out, lse, dout, seqs, cfg, dq, dk, dv);
  }
  void attention_prefill_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& cu, const TensorView& prompt_of,
                                const AttentionConfig& cfg, const TensorView& out,
                                const TensorView& lse) override {
    const SharedPromptSeqs segs =
        SharedPromptSeqs::validate("attention_prefill_shared", cu, prompt_of, q.shape[0]);
    cpu::attention_prefill_shared(q, k, v, segs, cfg, out, lse);
  }
  void attention_backward_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const TensorView& lse,
                                 const TensorView& dout, const TensorView& cu,
                                 const TensorView& prompt_of, const AttentionConfig& cfg,
                                 const TensorView& dq, const TensorView& dk,
                                 const TensorView& dv) override {
    const SharedPromptSeqs segs =
        SharedPromptSeqs::validate("attention_backward_shared", cu, prompt_of, q.shape[0]);
    cpu::attention_backward_shared(q, k, v, out, lse, dout, segs, cfg, dq, dk, dv);
  }
};

// The scalar spec: GEMM through gemm_bf16_nt_scalar (one output at a time through the MMA model).
class CpuScalarOps final : public CpuOps {
 public:
  std::string name() const override { return "cpu-scalar-spec"; }
  void gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const GemmConfig& cfg,
            const TensorView& y) override {
    cpu::gemm_bf16_nt_scalar(x, w, bias, cfg, y);
  }
};

}  // namespace

std::unique_ptr<Mem> cpu_mem(uint8_t poison) { return std::make_unique<CpuMem>(poison); }
std::unique_ptr<Ops> cpu_ops() { return std::make_unique<CpuOps>(); }
std::unique_ptr<Ops> cpu_scalar_ops() { return std::make_unique<CpuScalarOps>(); }

// ---- Comparison ------------------------------------------------------------------------------

namespace {
std::string value_string(const void* p, DType dt, int64_t i) {
  std::ostringstream os;
  const int64_t es = dtype_size(dt);
  uint64_t u = 0;
  std::memcpy(&u, static_cast<const char*>(p) + i * es, size_t(es));
  switch (dt) {
    case DType::kF32:
      os << static_cast<const float*>(p)[i];
      break;
    case DType::kBF16:
      os << bf16_to_f32(static_cast<const bf16*>(p)[i]);
      break;
    case DType::kI32:
      os << static_cast<const int32_t*>(p)[i];
      break;
    case DType::kI64:
      os << static_cast<const int64_t*>(p)[i];
      break;
    case DType::kU8:
      os << int(static_cast<const uint8_t*>(p)[i]);
      break;
  }
  os << " (0x" << std::hex << u << ")";
  return os.str();
}
}  // namespace

Verdict compare_bits(const void* got, const void* want, int64_t n, DType dt) {
  const int64_t es = dtype_size(dt);
  if (n == 0 || std::memcmp(got, want, size_t(n * es)) == 0) return {};
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(static_cast<const char*>(got) + i * es, static_cast<const char*>(want) + i * es,
                    size_t(es)) != 0) {
      if (first < 0) first = i;
      ++count;
    }
  std::ostringstream os;
  os << count << " of " << n << " elements differ; first at index " << first << ": got "
     << value_string(got, dt, first) << " want " << value_string(want, dt, first);
  return {false, os.str()};
}

Verdict compare_outputs(const Output& got, const Output& want) {
  if (got.bytes.size() != want.bytes.size() || got.dtype != want.dtype)
    return {false, got.name + ": buffer sizes differ (" + std::to_string(got.bytes.size()) +
                       " vs " + std::to_string(want.bytes.size()) + " bytes)"};
  Verdict v = compare_bits(got.bytes.data(), want.bytes.data(), got.numel(), got.dtype);
  if (!v.ok) v.message = got.name + ": " + v.message;
  return v;
}

Verdict compare_written(const Output& got, const Output& want) {
  if (got.rows == 0 || want.rows == 0) return compare_outputs(got, want);
  if (got.rows != want.rows || got.row_elems != want.row_elems || got.dtype != want.dtype)
    return {false, got.name + ": shapes differ"};
  for (int64_t r = 0; r < got.rows; ++r) {
    Verdict v = compare_bits(got.row(r), want.row(r), got.row_elems, got.dtype);
    if (!v.ok) {
      v.message = got.name + " row " + std::to_string(r) + ": " + v.message;
      return v;
    }
  }
  return {};
}

Verdict padding_untouched(const Output& o, uint8_t poison) {
  if (o.rows == 0) return {};
  std::vector<bool> written(o.bytes.size(), false);
  const int64_t es = dtype_size(o.dtype);
  for (int64_t r = 0; r < o.rows; ++r) {
    const size_t b0 = size_t((o.offset + r * o.ld) * es);
    for (size_t b = b0; b < b0 + size_t(o.row_elems * es) && b < written.size(); ++b)
      written[b] = true;
  }
  for (size_t b = 0; b < o.bytes.size(); ++b)
    if (!written[b] && o.bytes[b] != poison)
      return {false, o.name + ": byte " + std::to_string(b) + " outside the rows was written"};
  return {};
}

Relation thread_counts_relation(std::function<Outputs(Ops& ops, Mem& mem)> run, bool written_only) {
  return {
      "thread counts 1 and 3", [run = std::move(run), written_only](
                                   Ops& ops, Mem& mem, const Outputs& base, const Check& check) {
        const int saved = num_threads();
        for (int n : {1, 3}) {
          set_num_threads(n);
          const Outputs got = run(ops, mem);
          for (size_t o = 0; o < got.size(); ++o)
            check(
                got[o].name + " threads=" + std::to_string(n),
                written_only ? compare_written(got[o], base[o]) : compare_outputs(got[o], base[o]));
        }
        set_num_threads(saved);
      }};
}

}  // namespace lockstep::cases
