// The argument checks of every op, one definition for every backend (CPU reference, CUDA, the
// baseline): `dev` is the device the op runs on, and every data tensor must live there. Each check
// is defined in the op's contract file (src/contract/gemm.cc, norm.cc, attention.cc, ...) and
// throws lockstep::Error naming `op`.
// NOTE: contents. Index views (ids, positions, targets) live on `dev` like the data; on the host
// their values are checked here, on a GPU the kernel guards them (an out-of-range id gives a
// canonical-NaN row, ...). Paged metadata that the attention ops plan with (q_seq, q_pos,
// seq_lens, prefix lengths and groups, cu_seqlens) is always a host view, checked here; block
// tables are host views (checked page by page) or views on `dev` (trusted: the kernels read an
// entry outside the table or the cache as a zero key).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <vector>

#include "lockstep/contract.h"
#include "lockstep/contract/backward.h"
#include "lockstep/tensor.h"

namespace lockstep::contract {

// The i-th element of a 1-d i32 host view.
int32_t read_i32(const TensorView& t, int64_t i);
// The i-th element of a 1-d i32 or i64 host view.
int64_t index_at(const TensorView& t, int64_t i);

// The device a block table (or sampling's Philox counters) must have: the host (contents
// checked), or `dev` (trusted).
inline Device host_or(Device dev, const TensorView& t) {
  return t.device == Device::kCPU ? Device::kCPU : dev;
}

// A view whose contents the check reads: must be a host view.
void check_host_view(const char* op, const char* arg, const TensorView& t);

// check_tensor, then check_inner_contiguous (stride 1 in the last dimension).
void check_view(const char* op, const char* arg, const TensorView& t, DType dtype,
                std::initializer_list<int64_t> shape, Device dev = Device::kCPU);

// --- gemm.cc -----------------------------------------------------------------------------------

// Whether the memory spans of two views intersect (empty views never do).
bool overlaps(const TensorView& a, const TensorView& b);

// bias [n] bf16 or f32 (any stride), or null.
void check_bias(const char* op, Device dev, const TensorView* bias, int64_t n);

// cfg.segments is 1, 2, 4 or 8.
void check_segments(const char* op, Device dev, const GemmConfig& cfg);

// x [M, K] and w [N, K]: bf16, last dim contiguous, the same K.
void check_xw(const char* op, Device dev, const TensorView& x, const TensorView& w);

// Everything gemm_bf16_nt checks: cfg.segments, x and w (check_xw), bias [N] (may be null), y
// [M, N] bf16/f32 (last dim contiguous) not overlapping x, w or bias.
void check_gemm(const char* op, Device dev, const TensorView& x, const TensorView& w,
                const TensorView* bias, const GemmConfig& cfg, const TensorView& y);

// Everything gemm_bf16_nt_partial checks: cfg.segments, k_total, tp_size / tp_rank, x_shard and
// w_shard holding rank tp_rank's K columns, y_partial [M, N] f32 not overlapping the inputs.
void check_gemm_partial(const char* op, Device dev, const TensorView& x_shard,
                        const TensorView& w_shard, int64_t k_total, int tp_size, int tp_rank,
                        const GemmConfig& cfg, const TensorView& y_partial);

// partials[i] [M, N] f32, bias [N] (may be null), y [M, N] bf16/f32 overlapping no partial except
// as an exact alias of an f32 one, nor the bias. The number of partials (at least one) is the
// caller's to check.
void check_gemm_combine(const char* op, Device dev, const std::vector<TensorView>& partials,
                        const TensorView* bias, const TensorView& y);

// --- norm.cc -----------------------------------------------------------------------------------

// t has exactly x's shape ([T, H] or [T, heads, D]) and `dtype`, last dim contiguous.
void check_norm_rows(const char* op, Device dev, const char* arg, const TensorView& t,
                     const TensorView& x, DType dtype);

// x (argument `arg`): [T, H] or [T, heads, D] bf16 on `dev`, last dim >= 1 and contiguous.
void check_norm_input(const char* op, Device dev, const char* arg, const TensorView& x);

// Everything rmsnorm checks (cfg too): x [T, H] or [T, heads, D] bf16 on the CPU, weight [H],
// y x's shape, all last dim contiguous. Returns H (x's last dimension).
int64_t check_rmsnorm(const char* op, Device dev, const TensorView& x, const TensorView& weight,
                      const RmsNormConfig& cfg, const TensorView& y);

// Everything rmsnorm_residual checks: as check_rmsnorm, plus residual and residual_out of x's
// shape, and residual_out and y not the same memory. Returns H.
int64_t check_rmsnorm_residual(const char* op, Device dev, const TensorView& x,
                               const TensorView& residual, const TensorView& weight,
                               const RmsNormConfig& cfg, const TensorView& residual_out,
                               const TensorView& y);

// --- activation.cc -----------------------------------------------------------------------------

// gate, up, out: [T, I] bf16 with I >= 1, last dim contiguous.
void check_silu_mul(const char* op, Device dev, const TensorView& gate, const TensorView& up,
                    const TensorView& out);

// silu_and_mul's operands: gate_up [T, 2I] bf16 (I >= 1) split into its gate and up halves (views
// of gate_up), out [T, I] bf16; silu_and_mul is silu_mul of the halves on every device.
struct GateUpHalves {
  TensorView gate, up;
};
GateUpHalves split_gate_up(const char* op, Device dev, const TensorView& gate_up,
                           const TensorView& out);

// --- rope.cc -----------------------------------------------------------------------------------

// x, y [T, heads, D] bf16 (last dim contiguous), positions [T] i32/i64 each in [0, P).
void check_rope_args(const char* op, Device dev, const TensorView& x, const TensorView& positions,
                     int64_t D, int64_t P, const TensorView& y);

// --- embedding.cc ------------------------------------------------------------------------------

// Checks ids, table and out of a gather; returns T. table_rows is the table's first extent.
int64_t check_gather(const char* op, Device dev, const TensorView& ids, const TensorView& table,
                     int64_t table_rows, int64_t vocab, const TensorView& out);

// partials (at least one) and out: [T, H] bf16 with H >= 1, last dim contiguous.
void check_embedding_combine(const char* op, Device dev, const std::vector<TensorView>& partials,
                             const TensorView& out);

// --- attention.cc ------------------------------------------------------------------------------

struct QShape {
  int64_t N, Hq, D;
};

// A KV cache [NP, P, Hkv, D] bf16 on `dev`, last dim contiguous.
void check_cache(const char* op, Device dev, const char* arg, const TensorView& c, int64_t D);

// out [N, Hq, D] bf16 (last dim contiguous); lse [N, Hq] f32 when given (an empty view is none).
void check_attn_outputs(const char* op, Device dev, const QShape& s, const TensorView& out,
                        const TensorView& lse);

// Everything attention_prefill_varlen checks (cfg too) on a validated PackedSeqs, in O(1): q
// [T, Hq, D] with its T, k / v [T, Hkv, D], out, lse; returns q's shape.
QShape check_prefill_call(const char* op, Device dev, const TensorView& q, const TensorView& k,
                          const TensorView& v, const PackedSeqs& seqs, const AttentionConfig& cfg,
                          const TensorView& out, const TensorView& lse);

// The view-based attention_prefill_varlen's checks (cfg, q, k, v, then cu_seqlens, a host view:
// PackedSeqs::validate, then out and lse). Returns the validated sequences.
PackedSeqs check_prefill_varlen(const char* op, Device dev, const TensorView& q,
                                const TensorView& k, const TensorView& v,
                                const TensorView& cu_seqlens, const AttentionConfig& cfg,
                                const TensorView& out, const TensorView& lse);

// The paged problem of one call: q's shape, the caches' geometry and the meta's tables (spans
// into a PagedMeta, which must outlive it).
struct Paged {
  QShape qs;
  int64_t Hkv = 0, NP = 0, P = 0, S = 0, MP = 0;
  std::span<const int64_t> pos, seq;    // per row
  std::span<const int64_t> group;       // per sequence: prefix group or -1
  std::span<const int64_t> shared_len;  // per group
  int64_t num_seqs = 0;                 // distinct sequences among the rows
};

// Checks one call of a paged op against a meta validated for every chunk, in O(1): cfg, q
// [N, Hq, D] with the meta's N, k_cache / v_cache [NP, P, Hkv, D] with the meta's NP and P,
// Hq % Hkv, the meta's block tables usable on `dev` (device copies on `dev`; a GPU op also takes
// host copies, which it uploads), a prefix in the meta iff `cascade`, out and lse.
Paged check_paged_call(const char* op, Device dev, const TensorView& q, const PagedMeta& meta,
                       const TensorView& k_cache, const TensorView& v_cache,
                       const AttentionConfig& cfg, bool cascade, const TensorView& out,
                       const TensorView& lse);

// The view-based paged entry points' checks: cfg, q, the caches, then the metadata
// (PagedMeta::validate for kv chunks [c_lo, c_hi), block tables on the host or on `dev`).
// Returns the validated meta (its device copies are the given views).
constexpr int64_t kAllChunks = kAttnAllChunks;
PagedMeta check_paged(const char* op, Device dev, const TensorView& q, const TensorView& q_seq,
                      const TensorView& q_pos, const PagedKv& kv, const SharedPrefix* prefix,
                      const AttentionConfig& cfg, int64_t c_lo, int64_t c_hi);

// The problem of q over the caches k_cache and a meta (no checks: after check_paged).
Paged paged_problem(const TensorView& q, const TensorView& k_cache, const PagedMeta& meta);

// attention_paged_chunk_states' state views: m, l [N, Hq, C] f32, acc [N, Hq, C, D] f32 (last dim
// contiguous), for the call's paged problem p and C chunks.
void check_chunk_states(const char* op, Device dev, const Paged& p, int64_t C,
                        const AttentionChunkStates& states);

// Everything attention_merge_chunk_states checks (cfg too): states [N, Hq, C(, D)] f32, q_pos [N]
// i32 (a host view: read here) with every row's chunks held by the states, out and lse. Returns
// q_pos's values and the states' shape.
struct MergeShape {
  QShape qs;
  int64_t C = 0;
  std::vector<int64_t> pos;
};
MergeShape check_merge_states(const char* op, Device dev, const AttentionChunkStates& states,
                              const TensorView& q_pos, const AttentionConfig& cfg,
                              const TensorView& out, const TensorView& lse);

// Everything kv_cache_write checks: k, v [T, Hkv, D] bf16, the caches [NP, P, Hkv, D] bf16 on
// `dev`, slot_mapping [T] i32/i64. A host slot_mapping's values are read here (each -1 or in
// [0, NP·P), no slot twice) and returned; a device one (GPU ops) is the kernel's to guard and an
// empty vector is returned.
struct KvWrite {
  int64_t T = 0, Hkv = 0, D = 0, NP = 0, P = 0;
  std::vector<int64_t> slots;  // host slot_mapping's values
};
KvWrite check_kv_write(const char* op, Device dev, const TensorView& k, const TensorView& v,
                       const TensorView& slot_mapping, const TensorView& k_cache,
                       const TensorView& v_cache);

// --- logprob.cc --------------------------------------------------------------------------------

// h [T, H] with H >= 1 and w [V, H]: bf16, last dim contiguous (V is the caller's to check).
void check_h_w(const char* op, Device dev, const TensorView& h, const TensorView& w,
               const ContractConfig& cfg);

// Everything linear_logprob checks (cfg and params too).
void check_linear_logprob(const char* op, Device dev, const TensorView& h, const TensorView& w,
                          const TensorView& targets, const LogprobParams& params,
                          const ContractConfig& cfg, const TensorView& logp, const TensorView& lse,
                          const TensorView& entropy);

// The vocab rows [v0, v1) a shard holds, and the layout of the whole vocab.
struct ShardRows {
  LogprobVocabLayout lay;
  int64_t v0 = 0, v1 = 0;
};

// A vocab shard: an aligned power-of-two subtree of cfg.vocab_segments (cfg validated by the
// caller); its rows and the whole vocab's layout.
ShardRows check_logprob_shard(const char* op, const ContractConfig& cfg, const LogprobShard& shard);

// Everything linear_logprob_partial checks (cfg and params too).
ShardRows check_linear_logprob_partial(const char* op, Device dev, const TensorView& h,
                                       const TensorView& w_shard, const TensorView& targets,
                                       const LogprobParams& params, const ContractConfig& cfg,
                                       const LogprobShard& shard, const TensorView& state);

// Everything linear_logprob_combine checks (cfg and params too); returns the vocab layout.
LogprobVocabLayout check_linear_logprob_combine(const char* op, Device dev,
                                                const TensorView& states, const TensorView& targets,
                                                const LogprobParams& params,
                                                const ContractConfig& cfg, int64_t vocab_size,
                                                const TensorView& logp, const TensorView& lse,
                                                const TensorView& entropy);

// --- sampling.cc -------------------------------------------------------------------------------

// Everything sample checks (cfg too): h, w (V in [1, 2^21)), one valid params entry per row,
// request_ids, positions in [0, 2^32), and the [T] outputs.
void check_sample(const char* op, Device dev, const TensorView& h, const TensorView& w,
                  std::span<const SamplingParams> params, const TensorView& request_ids,
                  const TensorView& positions, const ContractConfig& cfg,
                  const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
                  const TensorView& entropy);
// lm_head_logits: h, w as sample's; z [T, N] f32 (N = w's rows), last dim contiguous.
void check_lm_head_logits(const char* op, Device dev, const TensorView& h, const TensorView& w,
                          const ContractConfig& cfg, const TensorView& z);
// sample_logits: z [T, V] f32 (V in [1, 2^21)), last dim contiguous, and sample's other arguments.
void check_sample_logits(const char* op, Device dev, const TensorView& z,
                         std::span<const SamplingParams> params, const TensorView& request_ids,
                         const TensorView& positions, const ContractConfig& cfg,
                         const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
                         const TensorView& entropy);

// --- backward (docs/contract.md §B): one file per area ------------------------------------------

// --- backward_gemm.cc, backward_norm.cc, backward_embedding.cc (GEMM dX/dW, RMSNorm, embedding)

// gemm_bf16_dx (B.3): cfg.segments; dy [T, N] and w [N, K] bf16, last dim contiguous; dx [T, K]
// bf16 or f32, last dim contiguous, not overlapping dy or w.
void check_gemm_dx(const char* op, Device dev, const TensorView& dy, const TensorView& w,
                   const GemmConfig& cfg, const TensorView& dx);

// gemm_bf16_dx_partial (B.2, B.3): cfg.segments, n_total, tp_size / tp_rank, dy_shard [T, Nr]
// and w_shard [Nr, K] holding rank tp_rank's N range (gemm_tp_k_range over N), dx_partial
// [T, K] f32 not overlapping them.
void check_gemm_dx_partial(const char* op, Device dev, const TensorView& dy_shard,
                           const TensorView& w_shard, int64_t n_total, int tp_size, int tp_rank,
                           const GemmConfig& cfg, const TensorView& dx_partial);

// gemm_bf16_dw (B.3): dy [rows, N] and x [rows, K] bf16 with rows = order.rows(), last dim
// contiguous; dw [N, K] f32, last dim contiguous, not overlapping dy or x.
void check_gemm_dw(const char* op, Device dev, const TensorView& dy, const TensorView& x,
                   const TokenOrder& order, const TensorView& dw);

// rmsnorm_backward / rmsnorm_residual_backward (B.4), cfg too: s [T, H] or [T, heads, D] bf16,
// weight [H] bf16, gy, gres (may be null: no residual) and dx f32 of s's shape, all last dim
// contiguous; dx not overlapping s or weight, and either the same view as gy (or gres) or not
// overlapping it; order and dweight both null or both given: order.rows() == T, dweight [H] f32
// not overlapping any other argument. Returns H.
int64_t check_rmsnorm_backward(const char* op, Device dev, const TensorView& s,
                               const TensorView& weight, const RmsNormConfig& cfg,
                               const TensorView& gy, const TensorView* gres, const TensorView& dx,
                               const TokenOrder* order, const TensorView* dweight);

// embedding_backward (B.7): ids [rows] i32/i64 (any stride) with rows = order.rows(), gh
// [rows, H] f32 and dtable [V, H] f32 (H >= 1, last dim contiguous, dtable not overlapping ids or
// gh). Host ids: the id of every row a sequence of `order` covers is in [0, V) (padding rows are
// never read); device ids are the kernel's to guard. Returns V.
int64_t check_embedding_backward(const char* op, Device dev, const TensorView& ids,
                                 const TensorView& gh, const TokenOrder& order,
                                 const TensorView& dtable);

// --- backward_logprob.cc, backward_elementwise.cc (linear log-prob, RoPE, SiLU-and-mul)

// rope_backward (§B.5): the table's size, gy [T, heads, D] f32 (last dim contiguous), positions
// [T] i32/i64 each in [0, P), dx gy's shape f32 (last dim contiguous), either the same view as gy
// or overlapping it nowhere.
void check_rope_backward(const char* op, Device dev, const TensorView& gy,
                         const TensorView& positions, const RopeTable& table, const TensorView& dx);

// silu_mul_backward (§B.6): gate_up [T, 2I] bf16 with I >= 1, ga [T, I] f32, dgu [T, 2I] f32
// (last dims contiguous), dgu overlapping neither input. Returns I.
int64_t check_silu_mul_backward(const char* op, Device dev, const TensorView& gate_up,
                                const TensorView& ga, const TensorView& dgu);

// linear_logprob_backward (§B.8): everything linear_logprob checks on h, w, targets, params and
// cfg; lse, entropy, g_lp and g_ent (may be null) [T] f32 (any stride); order.rows() == T; dh
// [T, H] f32 and dw [V, H] f32 (last dims contiguous), overlapping no input nor each other.
// Returns the vocab layout.
LogprobVocabLayout check_linear_logprob_backward(const char* op, Device dev, const TensorView& h,
                                                 const TensorView& w, const TensorView& targets,
                                                 const LogprobParams& params,
                                                 const ContractConfig& cfg, const TensorView& lse,
                                                 const TensorView& entropy, const TensorView& g_lp,
                                                 const TensorView* g_ent, const TensorView& dh,
                                                 const TokenOrder& order, const TensorView& dw);
// The same for linear_logprob_backward_partial: w_shard and dw_shard hold the shard's vocab rows
// [v0, v1) of a vocab of shard.vocab_size (targets are ids of that whole vocab), dh_partial [T, H]
// f32. Returns the shard's rows and the whole vocab's layout.
ShardRows check_linear_logprob_backward_partial(
    const char* op, Device dev, const TensorView& h, const TensorView& w_shard,
    const TensorView& targets, const LogprobParams& params, const ContractConfig& cfg,
    const LogprobShard& shard, const TensorView& lse, const TensorView& entropy,
    const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh_partial,
    const TokenOrder& order, const TensorView& dw_shard);

// --- backward_attention.cc (packed varlen attention)

// Everything attention_backward_varlen checks (cfg too) on a validated PackedSeqs, in O(1): q, k,
// v, out as the forward (check_prefill_call), lse [T, Hq] f32 (required), dout [T, Hq, D] bf16,
// dq [T, Hq, D] and dk / dv [T, Hkv, D] f32 (last dims contiguous), the three outputs overlapping
// no input and each other. Returns q's shape.
QShape check_attention_backward(const char* op, Device dev, const TensorView& q,
                                const TensorView& k, const TensorView& v, const TensorView& out,
                                const TensorView& lse, const TensorView& dout,
                                const PackedSeqs& seqs, const AttentionConfig& cfg,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv);

}  // namespace lockstep::contract
