// The op-case table (after ggml's test-backend-ops): one case = op + shapes + contract settings +
// data kind + layout. A case builds its host inputs from a seed, runs on any backend (the CPU
// reference, the CPU scalar spec where one exists, CUDA), and returns its output buffers whole
// (padding cells included: every output starts poisoned with 0xA5, so an unwritten element shows).
// The same table drives the CPU tests (tests/cpu/test_op_cases.cc: invariance relations, fast ==
// spec, determinism) and the GPU parity program (tests/cuda/test_parity.cu: CUDA == CPU, bitwise).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "lockstep/contract.h"
#include "lockstep/dtype.h"
#include "lockstep/ops/attention.h"
#include "lockstep/ops/backward.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/gemm.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/rope.h"
#include "lockstep/ops/sampling.h"
#include "lockstep/tensor.h"

namespace lockstep::cases {

// ---- Data kinds ----------------------------------------------------------------------------

// What the floating-point inputs of a case hold. Never all zeros.
enum class DataKind {
  kNormal,    // N(0, scale), never exactly zero
  kLarge,     // random sign/mantissa, exponents 2^20 .. 2^60 (overflowing sums, huge products)
  kSmall,     // exponents 2^-126 .. 2^-90 (subnormal squares and products)
  kSpecials,  // mostly N(0, scale) with ±0, ±subnormals, ±inf and NaN sprinkled in
  kTies,      // few distinct values (N(0, scale) rounded to a coarse grid): many exact ties
};
const char* data_kind_name(DataKind k);

void fill_bf16(bf16* p, int64_t n, DataKind kind, std::mt19937_64& g, float scale = 1.0f);
void fill_f32(float* p, int64_t n, DataKind kind, std::mt19937_64& g, float scale = 1.0f);

// ---- Memory of a backend --------------------------------------------------------------------

// A host buffer and a view into it (strided / offset views: the buffer is larger than the view).
struct HostArg {
  Tensor buf;
  TensorView view;
};
HostArg host_arg(Tensor t);  // the whole tensor, contiguous
// A [rows, cols] bf16/f32/int view inside a [rows, ld] buffer at column `col0` (ld >= col0+cols).
HostArg host_rows(DType dt, int64_t rows, int64_t cols, int64_t ld, int64_t col0 = 0);

// One output buffer as it came back from the backend: all bytes of its allocation.
struct Output {
  std::string name;
  DType dtype = DType::kF32;
  int64_t rows = 0;       // dim 0 of the view (tokens, rows)
  int64_t row_elems = 0;  // elements of one row the op writes
  int64_t ld = 0;         // elements between rows in `bytes`
  int64_t offset = 0;     // elements before row 0 in `bytes`
  std::vector<uint8_t> bytes;
  int64_t numel() const { return int64_t(bytes.size()) / dtype_size(dtype); }
  // Bytes of row r (row_elems elements).
  const uint8_t* row(int64_t r) const {
    return bytes.data() + size_t((offset + r * ld) * dtype_size(dtype));
  }
};
using Outputs = std::vector<Output>;

// Device memory of a backend: allocations poisoned (0xA5 unless told otherwise: two runs with
// different poison bytes agree on every element an op writes), copies, whole-buffer reads.
class Mem {
 public:
  virtual ~Mem();
  virtual Device device() const = 0;
  // Uploads the whole buffer of `a`; returns `a.view` rebased onto the copy.
  TensorView in(const HostArg& a);
  // Metadata that the op reads on the host on every backend (block tables, cu_seqlens, ...).
  TensorView host(const HostArg& a) { return a.view; }
  // A poisoned [shape] output whose rows (dim 0) are `row_pad` elements wider than needed.
  TensorView out(DType dt, std::vector<int64_t> shape, int64_t row_pad = 0);
  // Reads back the whole allocation holding v (a view returned by in() or out()).
  Output read(const std::string& name, const TensorView& v);

 protected:
  virtual void* alloc_raw(size_t bytes) = 0;  // filled with the backend's poison byte
  virtual void free_raw(void* p) = 0;
  virtual void put(void* dst, const void* src, size_t bytes) = 0;
  virtual void get(void* dst, const void* src, size_t bytes) = 0;
  void release_all();

 private:
  struct Block {
    char* base;
    size_t bytes;
  };
  std::vector<Block> blocks_;
  void* alloc(size_t bytes);
  const Block& block_of(const void* p) const;
};

// ---- Backends --------------------------------------------------------------------------------

// Every op of the table with the CPU op's arguments; each backend maps them onto its own entry
// points (the CUDA one adds the table upload for RoPE and a synchronize after every op).
class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;
  virtual void gemm(const TensorView& x, const TensorView& w, const TensorView* bias,
                    const GemmConfig& cfg, const TensorView& y) = 0;
  virtual void gemm_partial(const TensorView& x, const TensorView& w, int64_t k_total, int tp,
                            int rank, const GemmConfig& cfg, const TensorView& y) = 0;
  virtual void gemm_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                            const TensorView& y) = 0;
  virtual void rmsnorm(const TensorView& x, const TensorView& w, const RmsNormConfig& cfg,
                       const TensorView& y) = 0;
  virtual void rmsnorm_residual(const TensorView& x, const TensorView& res, const TensorView& w,
                                const RmsNormConfig& cfg, const TensorView& res_out,
                                const TensorView& y) = 0;
  virtual void rope(const TensorView& x, const TensorView& pos, const RopeTable& table,
                    const TensorView& y) = 0;
  virtual void silu_mul(const TensorView& g, const TensorView& u, const TensorView& out) = 0;
  virtual void embedding(const TensorView& ids, const TensorView& table, const TensorView& out) = 0;
  virtual void embedding_vocab_parallel(const TensorView& ids, const TensorView& table,
                                        const VocabShard& shard, int64_t vocab,
                                        const TensorView& out) = 0;
  virtual void embedding_combine(const std::vector<TensorView>& partials,
                                 const TensorView& out) = 0;
  virtual void attention_prefill_varlen(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const TensorView& cu,
                                        const AttentionConfig& cfg, const TensorView& out,
                                        const TensorView& lse) = 0;
  virtual void attention_paged(const TensorView& q, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const AttentionConfig& cfg, const TensorView& out,
                               const TensorView& lse) = 0;
  virtual void attention_paged_split_kv(const TensorView& q, const TensorView& q_seq,
                                        const TensorView& q_pos, const PagedKv& kv,
                                        const AttentionConfig& cfg, int splits,
                                        const TensorView& out, const TensorView& lse) = 0;
  virtual void attention_paged_cascade(const TensorView& q, const TensorView& q_seq,
                                       const TensorView& q_pos, const PagedKv& kv,
                                       const SharedPrefix& prefix, const AttentionConfig& cfg,
                                       const TensorView& out, const TensorView& lse) = 0;
  virtual void attention_paged_chunk_states(const TensorView& q, const TensorView& q_seq,
                                            const TensorView& q_pos, const PagedKv& kv,
                                            const AttentionConfig& cfg, int64_t chunk_begin,
                                            const AttentionChunkStates& states) = 0;
  virtual void attention_merge_chunk_states(const AttentionChunkStates& states,
                                            const TensorView& q_pos, const AttentionConfig& cfg,
                                            const TensorView& out, const TensorView& lse) = 0;
  virtual void kv_cache_write(const TensorView& k, const TensorView& v, const TensorView& slots,
                              const TensorView& k_cache, const TensorView& v_cache) = 0;
  virtual void linear_logprob(const TensorView& h, const TensorView& w, const TensorView& targets,
                              const LogprobParams& p, const ContractConfig& cfg,
                              const TensorView& logp, const TensorView& lse,
                              const TensorView& entropy) = 0;
  virtual void linear_logprob_partial(const TensorView& h, const TensorView& w_shard,
                                      const TensorView& targets, const LogprobParams& p,
                                      const ContractConfig& cfg, const LogprobShard& shard,
                                      const TensorView& state) = 0;
  virtual void linear_logprob_combine(const TensorView& states, const TensorView& targets,
                                      const LogprobParams& p, const ContractConfig& cfg,
                                      int64_t vocab, const TensorView& logp, const TensorView& lse,
                                      const TensorView& entropy) = 0;
  virtual void sample(const TensorView& h, const TensorView& w,
                      std::span<const SamplingParams> params, const TensorView& request_ids,
                      const TensorView& positions, const ContractConfig& cfg,
                      const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
                      const TensorView& entropy) = 0;

  // ---- Backward (docs/contract.md §B): the cpu:: signatures of include/lockstep/ops/backward.h
  // (attention takes the forward's cu_seqlens view; every backend validates it the same way).
  virtual void gemm_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
                       const TensorView& dx) = 0;
  virtual void gemm_dx_partial(const TensorView& dy_shard, const TensorView& w_shard,
                               int64_t n_total, int tp, int rank, const GemmConfig& cfg,
                               const TensorView& dx_partial) = 0;
  virtual void gemm_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                       const TensorView& dw) = 0;
  virtual void rmsnorm_backward(const TensorView& s, const TensorView& w, const RmsNormConfig& cfg,
                                const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                                const TensorView* dweight) = 0;
  virtual void rmsnorm_residual_backward(const TensorView& s, const TensorView& w,
                                         const RmsNormConfig& cfg, const TensorView& gy,
                                         const TensorView& gres, const TensorView& ds,
                                         const TokenOrder* order, const TensorView* dweight) = 0;
  virtual void rope_backward(const TensorView& gy, const TensorView& pos, const RopeTable& table,
                             const TensorView& dx) = 0;
  virtual void silu_mul_backward(const TensorView& gate_up, const TensorView& ga,
                                 const TensorView& dgu) = 0;
  virtual void embedding_backward(const TensorView& ids, const TensorView& gh,
                                  const TokenOrder& order, const TensorView& dtable) = 0;
  virtual void linear_logprob_backward(const TensorView& h, const TensorView& w,
                                       const TensorView& targets, const LogprobParams& p,
                                       const ContractConfig& cfg, const TensorView& lse,
                                       const TensorView& entropy, const TensorView& g_lp,
                                       const TensorView* g_ent, const TensorView& dh,
                                       const TokenOrder& order, const TensorView& dw) = 0;
  // The backward from a given lse / entropy that also writes the forward's logp / lse / entropy
  // (§B.8 "The forward from the backward"). This default is the definition: linear_logprob, then
  // linear_logprob_backward; the CUDA ops run the one pass where it applies.
  virtual void linear_logprob_backward_recompute(
      const TensorView& h, const TensorView& w, const TensorView& targets, const LogprobParams& p,
      const ContractConfig& cfg, const TensorView& lse, const TensorView& entropy,
      const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh,
      const TokenOrder& order, const TensorView& dw, const TensorView& logp_out,
      const TensorView& lse_out, const TensorView& entropy_out) {
    linear_logprob(h, w, targets, p, cfg, logp_out, lse_out, entropy_out);
    linear_logprob_backward(h, w, targets, p, cfg, lse, entropy, g_lp, g_ent, dh, order, dw);
  }
  virtual void attention_backward_varlen(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& dout,
                                         const TensorView& cu, const AttentionConfig& cfg,
                                         const TensorView& dq, const TensorView& dk,
                                         const TensorView& dv) = 0;

  // ---- Shared-prompt groups (docs/contract.md §B.11): the cpu:: forward and backward over the
  // forward's cu_seqlens and prompt_of host views (every backend validates them the same way).
  virtual void attention_prefill_shared(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const TensorView& cu,
                                        const TensorView& prompt_of, const AttentionConfig& cfg,
                                        const TensorView& out, const TensorView& lse) = 0;
  virtual void attention_backward_shared(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& dout,
                                         const TensorView& cu, const TensorView& prompt_of,
                                         const AttentionConfig& cfg, const TensorView& dq,
                                         const TensorView& dk, const TensorView& dv) = 0;
};

// The CPU backends: the reference (fast path) and the scalar spec (GEMM only: the other ops have
// one CPU implementation; has_scalar_spec() of a case says whether the spec differs).
std::unique_ptr<Mem> cpu_mem(uint8_t poison = 0xA5);
std::unique_ptr<Ops> cpu_ops();
std::unique_ptr<Ops> cpu_scalar_ops();

// ---- Comparison -----------------------------------------------------------------------------

// Bitwise comparison (memcmp) of n elements; on a difference, the message names how many differ,
// the first differing index and both values with their bit patterns.
struct Verdict {
  bool ok = true;
  std::string message;
};
Verdict compare_bits(const void* got, const void* want, int64_t n, DType dt);
Verdict compare_outputs(const Output& got, const Output& want);  // whole buffers, sizes too
// Only the elements the op writes (the rows of a per-token output; a whole other output), so two
// runs with different poison bytes can be compared.
Verdict compare_written(const Output& got, const Output& want);
// Every byte of a per-token output's allocation outside its rows still holds `poison` (row gaps
// and padding untouched); whole outputs (rows == 0) pass.
Verdict padding_untouched(const Output& o, uint8_t poison = 0xA5);

// ---- Cases ----------------------------------------------------------------------------------

// Records one bitwise comparison of a relation: "what" names it.
using Check = std::function<void(const std::string& what, const Verdict& v)>;

// An invariance relation: another way of computing (some of) the base outputs on the same
// backend, which must give the same bits (DESIGN.md §5.1).
struct Relation {
  std::string name;
  std::function<void(Ops& ops, Mem& mem, const Outputs& base, const Check& check)> run;
};

// "thread counts 1 and 3": `run` (a case's op on a backend) with 1 and with 3 CPU threads gives the
// base outputs, compared whole (written_only: the elements the op writes, compare_written).
Relation thread_counts_relation(std::function<Outputs(Ops& ops, Mem& mem)> run,
                                bool written_only = false);

class OpCase {
 public:
  virtual ~OpCase() = default;
  // "gemm/M17_N111_K989_S4_bias-f32_out-bf16/strided/normal"
  virtual std::string name() const = 0;
  virtual std::string op() const = 0;  // "gemm", "rmsnorm", ... (per-op counts)
  // The host inputs, from a seed (the same seed gives the same inputs).
  virtual void build(uint64_t seed) = 0;
  // The op on a backend; every output buffer, read back whole.
  virtual Outputs run(Ops& ops, Mem& mem) const = 0;
  // True where the CPU scalar spec computes this case by another path than the fast one.
  virtual bool has_scalar_spec() const { return false; }
  // Invariance relations checked on the CPU (batching, positions, splits, page sizes, TP, ...).
  virtual std::vector<Relation> relations() const { return {}; }
  // Cheap enough for --quick (compute-sanitizer) runs.
  virtual bool quick() const { return true; }
};

// The table: every case of every op. Cases are built lazily (build(seed) before run()).
std::vector<std::unique_ptr<OpCase>> op_cases();

}  // namespace lockstep::cases
