// The backward ops: the CPU reference (the executable spec of docs/contract.md §B). Activation
// gradients are f32 views; weight gradients are f32 buffers the ops ADD to, in the canonical token
// order of a TokenOrder (lockstep/contract/backward.h). Every argument is checked before anything
// is written (lockstep::Error naming the op and the argument).
#pragma once

#include "lockstep/contract/attention.h"
#include "lockstep/contract/backward.h"
#include "lockstep/contract/gemm.h"
#include "lockstep/contract/logprob.h"
#include "lockstep/contract/norm.h"
#include "lockstep/contract/rope.h"
#include "lockstep/tensor.h"

namespace lockstep::cpu {

// ---- B.3 GEMM (forward y = x·wᵀ, x [T, K], w [N, K]) ------------------------------------------

// dx = dy·w by the GEMM contract over N with cfg.segments segments (dx_segments(role)).
//   dy [T, N] bf16 (the caller's round_bf16 of the f32 gradient), w [N, K] bf16, dx [T, K] f32
//   or bf16; rows may be strided (last dim contiguous).
void gemm_bf16_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
                  const TensorView& dx);

// A column-parallel layer's dX under tensor parallelism (B.2; §G.5 with N in place of K): rank
// tp_rank of tp_size holds the N range gemm_tp_k_range(cfg, n_total, tp_size, tp_rank) of dy and
// w and computes the fp32 subtree of its S/t N-segments; gemm_tree_combine over the ranks'
// partials (rank order) gives gemm_bf16_dx's bits.
//   dy_shard [T, Nr] bf16, w_shard [Nr, K] bf16 (that range's rows), dx_partial [T, K] f32
void gemm_bf16_dx_partial(const TensorView& dy_shard, const TensorView& w_shard, int64_t n_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& dx_partial);

// dw += dyᵀ·x over the token blocks of `order` in canonical order (one MMA k-block per block,
// c = dw's current value).  dy [rows, N] bf16, x [rows, K] bf16 (rows = order.rows()),
// dw [N, K] f32 in/out.
void gemm_bf16_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                  const TensorView& dw);

// ---- B.4 RMSNorm ----------------------------------------------------------------------------

// s: the forward's norm input ([T, H] or [T, heads, D] bf16), weight [last dim] bf16, gy the
// gradient of y (f32, s's shape), dx (f32, s's shape; may be the same view as gy). With `dweight`
// ([last dim] f32 in/out) and `order` (rows = T) also accumulates the weight gradient.
void rmsnorm_backward(const TensorView& s, const TensorView& weight, const RmsNormConfig& cfg,
                      const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                      const TensorView* dweight);

// The fused residual form: s = the forward's residual_out; gres the gradient arriving for
// residual_out (f32); ds = gres + dnorm (f32), the gradient of both x and residual.
void rmsnorm_residual_backward(const TensorView& s, const TensorView& weight,
                               const RmsNormConfig& cfg, const TensorView& gy,
                               const TensorView& gres, const TensorView& ds,
                               const TokenOrder* order, const TensorView* dweight);

// ---- B.5 RoPE -------------------------------------------------------------------------------

// gy, dx [T, heads, D] f32 (dx may be the same view as gy); positions as the forward.
void rope_backward(const TensorView& gy, const TensorView& positions, const RopeTable& table,
                   const TensorView& dx);

// ---- B.6 SiLU-and-mul -----------------------------------------------------------------------

// gate_up [T, 2I] bf16 (the forward's input), ga [T, I] f32 (gradient of the output),
// dgu [T, 2I] f32 (dg columns then du columns).
void silu_mul_backward(const TensorView& gate_up, const TensorView& ga, const TensorView& dgu);

// ---- B.7 Embedding --------------------------------------------------------------------------

// dtable [V, H] f32 in/out += gh rows by id, tokens in canonical order.  ids [rows] i32/i64,
// gh [rows, H] f32.
void embedding_backward(const TensorView& ids, const TensorView& gh, const TokenOrder& order,
                        const TensorView& dtable);

// ---- B.8 Linear log-prob --------------------------------------------------------------------

// From the forward's lse / entropy ([T] f32) and the upstream gradients g_lp [T] f32 and (or
// nullptr) g_ent [T] f32: dh [T, H] f32 (written) and dw [V, H] f32 (in/out, token order `order`).
void linear_logprob_backward(const TensorView& h, const TensorView& w, const TensorView& targets,
                             const LogprobParams& params, const ContractConfig& cfg,
                             const TensorView& lse, const TensorView& entropy,
                             const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh,
                             const TokenOrder& order, const TensorView& dw);

// Vocab-parallel (§B.8): the op over the vocab segments of `shard` (an aligned subtree, as
// linear_logprob_partial's): w_shard [v1 − v0, H] bf16 holds their rows, targets are ids of the
// whole vocab (shard.vocab_size), lse / entropy are the whole vocab's (the forward's combine).
// dh_partial [T, H] f32 (written) = the shard's subtree of dh's segment tree: gemm_tree_combine of
// the ranks' partials in rank order gives linear_logprob_backward's dh; dw_shard [v1 − v0, H] f32
// (in/out) gets dw's rows [v0, v1), the same bits.
void linear_logprob_backward_partial(const TensorView& h, const TensorView& w_shard,
                                     const TensorView& targets, const LogprobParams& params,
                                     const ContractConfig& cfg, const LogprobShard& shard,
                                     const TensorView& lse, const TensorView& entropy,
                                     const TensorView& g_lp, const TensorView* g_ent,
                                     const TensorView& dh_partial, const TokenOrder& order,
                                     const TensorView& dw_shard);

// ---- B.9 Attention (packed varlen, causal, GQA) ---------------------------------------------

// q [T, Hq, D], k, v [T, Hkv, D], out [T, Hq, D], dout [T, Hq, D] bf16; lse [T, Hq] f32 (the
// forward's); dq [T, Hq, D], dk, dv [T, Hkv, D] f32 (written).
void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const PackedSeqs& seqs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv);

// ---- B.11 Attention over shared-prompt groups ------------------------------------------------

// The backward of attention_prefill_shared (docs/contract.md §B.11): the tensors as
// attention_backward_varlen over the packed segments of `segs`. A prompt key's dk / dv sum the
// prompt's own rows and every completion's rows in one chain per element (heads ascending; per
// head the prompt's rows, then each completion's in ascending segment order); a completion's rows
// and keys get the bits of the unshared packing (prompt + completion as one sequence) for finite
// inputs.
void attention_backward_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv);

}  // namespace lockstep::cpu
