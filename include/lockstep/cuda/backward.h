// CUDA backward ops (docs/contract.md §B): the same bits as the lockstep::cpu ops of the same name
// (include/lockstep/ops/backward.h). Activation gradients are f32 device views written whole;
// weight gradients are f32 device buffers the ops ADD to, over the token blocks of a host-side
// TokenOrder in canonical order (§B.1). No atomics: every output element is one fixed chain.
// Plain C++ header: device pointers live in TensorViews with device == Device::kCUDA; `stream`
// is an opaque cudaStream_t (nullptr = the default stream). Arguments are checked on the host
// before the launch with the CPU op's contract checks (lockstep::Error naming the op and the
// argument); launches are asynchronous and a launch error throws. Workspace (token-block tables,
// gathered operands) is allocated stream-ordered and freed in stream order.
#pragma once

#include "lockstep/contract/attention.h"
#include "lockstep/contract/backward.h"
#include "lockstep/contract/gemm.h"
#include "lockstep/contract/logprob.h"
#include "lockstep/contract/norm.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda {

// ---- B.3 GEMM (forward y = x·wᵀ, x [T, K], w [N, K]) ------------------------------------------
void gemm_bf16_dx(const TensorView& dy, const TensorView& w, const GemmConfig& cfg,
                  const TensorView& dx, void* stream = nullptr);
void gemm_bf16_dx_partial(const TensorView& dy_shard, const TensorView& w_shard, int64_t n_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& dx_partial, void* stream = nullptr);
void gemm_bf16_dw(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                  const TensorView& dw, void* stream = nullptr);

// ---- B.4 RMSNorm ----------------------------------------------------------------------------
void rmsnorm_backward(const TensorView& s, const TensorView& weight, const RmsNormConfig& cfg,
                      const TensorView& gy, const TensorView& dx, const TokenOrder* order,
                      const TensorView* dweight, void* stream = nullptr);
void rmsnorm_residual_backward(const TensorView& s, const TensorView& weight,
                               const RmsNormConfig& cfg, const TensorView& gy,
                               const TensorView& gres, const TensorView& ds,
                               const TokenOrder* order, const TensorView* dweight,
                               void* stream = nullptr);

// ---- B.5 RoPE (cos / sin: device views of RopeTable::cos / ::sin, as the forward) -----------
void rope_backward(const TensorView& gy, const TensorView& positions, const TensorView& cos,
                   const TensorView& sin, const TensorView& dx, void* stream = nullptr);

// ---- B.6 SiLU-and-mul -----------------------------------------------------------------------
void silu_mul_backward(const TensorView& gate_up, const TensorView& ga, const TensorView& dgu,
                       void* stream = nullptr);

// ---- B.7 Embedding --------------------------------------------------------------------------
void embedding_backward(const TensorView& ids, const TensorView& gh, const TokenOrder& order,
                        const TensorView& dtable, void* stream = nullptr);

// ---- B.8 Linear log-prob --------------------------------------------------------------------
void linear_logprob_backward(const TensorView& h, const TensorView& w, const TensorView& targets,
                             const LogprobParams& params, const ContractConfig& cfg,
                             const TensorView& lse, const TensorView& entropy,
                             const TensorView& g_lp, const TensorView* g_ent, const TensorView& dh,
                             const TokenOrder& order, const TensorView& dw, void* stream = nullptr);
// The same backward from a given lse / entropy that also writes the forward's outputs of the same
// inputs (logp_out, lse_out, entropy_out: [T] f32 device views, the bits linear_logprob writes;
// §B.8 "The forward from the backward"): one pass over the vocabulary where the rows are in place
// (the order's token blocks, then the rows no sequence covers, are rows 0 .. T − 1) and
// vocab_tile is a multiple of 16, else linear_logprob then linear_logprob_backward (the same bits).
// A caller holding the forward's lse already (an on-policy step: the rollout's) compares the given
// values with the returned ones afterwards: where they differ, the gradients were taken at a
// wrong lse. Returns true iff the one pass ran.
bool linear_logprob_backward_recompute(const TensorView& h, const TensorView& w,
                                       const TensorView& targets, const LogprobParams& params,
                                       const ContractConfig& cfg, const TensorView& lse,
                                       const TensorView& entropy, const TensorView& g_lp,
                                       const TensorView* g_ent, const TensorView& dh,
                                       const TokenOrder& order, const TensorView& dw,
                                       const TensorView& logp_out, const TensorView& lse_out,
                                       const TensorView& entropy_out, void* stream = nullptr);

// ---- B.9 Attention (packed varlen, causal, GQA) ---------------------------------------------
// seqs: validated on the host (its host boundaries plan the launch; a device copy, if it has
// one, may be used by the kernels).
void attention_backward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const PackedSeqs& seqs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               void* stream = nullptr);

// ---- B.11 Attention over shared-prompt groups ------------------------------------------------
// segs: validated on the host (its host segments plan the launch). The tensors as
// attention_backward_varlen; a prompt key's dk / dv sum its prompt's and every completion's rows
// in one chain per element (§B.11).
void attention_backward_shared(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& lse, const TensorView& dout,
                               const SharedPromptSeqs& segs, const AttentionConfig& cfg,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               void* stream = nullptr);

// ---- The backward's glue (src/cuda/backward/cast.cu) ------------------------------------------
// dst = round_bf16(src) (RNE, canonical NaN, §B.0: the tensor-core operand); src f32, dst bf16,
// the same 2-D shape, rows may be strided (last dim contiguous); dst must not overlap src.
void round_bf16(const TensorView& src, const TensorView& dst, void* stream = nullptr);
// Every element of a 1-D or 2-D f32 / bf16 view (rows may be strided) set to +0.
void fill_zero(const TensorView& dst, void* stream = nullptr);

}  // namespace lockstep::cuda
