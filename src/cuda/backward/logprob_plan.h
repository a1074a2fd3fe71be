// Host-side pieces of the CUDA linear log-prob backward (src/cuda/backward/logprob.cu): the dh
// path as an option, the chunk plan and its workspace (benchmarks and audits print them).
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/contract.h"
#include "lockstep/contract/backward.h"
#include "lockstep/contract/logprob.h"
#include "lockstep/ops/logprob.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda::detail {

// How dh's segment values are computed (both give the same bits: each is one MMA chain of the
// segment's k-blocks from +0; the benchmark compares them):
//   kDwForm: dh_k[r, j] = Σ_e Gᵀ_k[e, r]·W[v_seg + e, j] is B.3's weight-gradient chain with the
//            segment's entries as the "tokens" (one sequence of n_k entries from +0):
//            cuda::gemm_bf16_dw(Gᵀ_k, W_k, that order, dh_k). W is read in place: no Wᵀ.
//   kWtGemm: cuda::gemm_bf16_nt(G_k, Wᵀ_k, one segment) over K = seg_pad, Wᵀ_k re-laid out on the
//            device (in hidden-column slices when it passes the budget).
//   kDxForm: the same chain as kDwForm from G_k itself (K-major) and W's rows in place (MN-major):
//            gemm_bf16_nn_accumulate (src/cuda/gemm/internal.h), no Gᵀ; W must be TMA-readable
//            (16-byte aligned, row stride a multiple of 8), else lockstep::Error.
//   kDxFused: kDxForm with G straight from the logits GEMM's epilogue
//   (backward/logprob_epilogue.cuh:
//            no fp32 logits in memory, one launch per slice instead of GEMM + G kernel per logits
//            block; with recompute also the forward's tile states there). Needs h and W
//            TMA-readable (gemm_operands_tma_ok) and, with recompute, vocab_tile 256.
//   kAuto:   kDxFused where it applies, else kDxForm where W is TMA-readable, else kDwForm.
enum class LogprobBwdPath : int { kAuto = 0, kDwForm, kWtGemm, kDxForm, kDxFused };
const char* logprob_bwd_path_name(LogprobBwdPath p);

// The workspace budget of one call (G and Gᵀ or Wᵀ, logits, segment partials, gathered rows):
// with dh itself ([T, H] f32) it keeps the training shape T = 8192, H = 4096, V = 151936 under
// 0.5 GiB beyond the lm_head's fp32 gradient, with room for the GEMMs' own workspace. Larger chunks
// of rows mean fewer read-modify-write passes over dw (one per chunk) and fewer passes over W;
// wider vocab slices mean fewer passes over dh's partials.
constexpr int64_t kLogprobBwdWorkspaceBudget = int64_t(352) << 20;

// The chunk plan of cuda::linear_logprob_backward: a pure function of T (only as a cap on the
// chunk), H, the vocab layout, the path and whether the rows are read in place; it never changes a
// bit.
struct LogprobBwdPlan {
  LogprobBwdPath path = LogprobBwdPath::kDwForm;
  int64_t rows = 0;      // token rows per chunk (a multiple of 16)
  int64_t seg_pad = 0;   // segment width of G_k / Wᵀ_k (seg_len rounded up to 16)
  int64_t slice = 0;     // vocab entries of G_k per pass (a multiple of 16; kWtGemm: seg_pad)
  int64_t zcols = 0;     // logits columns per GEMM call (<= slice)
  int64_t hc = 0;        // kWtGemm: hidden columns of Wᵀ_k per re-layout
  bool wt_once = false;  // kWtGemm: every segment's Wᵀ_k built once per call
  int64_t g_bytes = 0;   // G_k (+ Gᵀ_k for kDwForm)
  int64_t z_bytes = 0, wt_bytes = 0, partial_bytes = 0, gather_bytes = 0;
  // recompute (LogprobRecompute): the chunk's tile states [rows, tiles] and target logits [rows];
  // slice and zcols are then multiples of vocab_tile.
  int64_t states_bytes = 0;
  int64_t total_bytes() const {
    return g_bytes + z_bytes + wt_bytes + partial_bytes + gather_bytes + states_bytes;
  }
};
// in_place: every chunk's rows are consecutive rows of h whatever the chunk size (see
// logprob_rows_in_place), so the plan reserves no gather buffers and gives their bytes to wider
// vocab slices (fewer passes over dh's partials).
LogprobBwdPlan logprob_backward_plan(const LogprobVocabLayout& lay, int64_t H, int64_t T,
                                     LogprobBwdPath path = LogprobBwdPath::kAuto,
                                     bool in_place = false, bool recompute = false);
// True iff the canonical token blocks of `order` followed by the rows no sequence covers are rows
// 0, 1, ..., T − 1 in that order (sequences packed in step order with no gaps: the training
// forward's micro-batches): then no chunk of any size gathers.
bool logprob_rows_in_place(const TokenOrder& order, int64_t T);
// The plan in words (benchmarks, audits).
std::string logprob_backward_plan_string(const ContractConfig& cfg, int64_t T, int64_t H, int64_t V,
                                         LogprobBwdPath path = LogprobBwdPath::kAuto,
                                         bool in_place = false, bool recompute = false);

// The forward's outputs recomputed by the backward (docs/contract.md §B.8, "the forward from the
// backward"): logp, lse, entropy ([T] f32 device views) of every row, the bits of
// cuda::linear_logprob(h, w, targets, params, cfg) — from the logits the backward computes anyway
// (the tile-state kernel and the fold of the forward's unfused producer, logprob.cuh), so a
// caller that holds the forward's lse already (the rollout's, on an on-policy step) skips the
// forward and checks the given lse bit for bit afterwards: where they differ the gradients were
// taken at a wrong lse and must be recomputed from the returned one. Needs the rows in place
// (logprob_rows_in_place) and vocab_tile a multiple of 16; lockstep::Error otherwise.
struct LogprobRecompute {
  TensorView logp, lse, entropy;
};

// cuda::linear_logprob_backward with the dh path as an option (kAuto: what the public function
// runs) and, for self-checks, the chunk plan's sizes forced (`force`: rows and slice multiples of
// 16, 1 <= zcols <= slice; kWtGemm needs slice == seg_pad and hc >= 1; path taken from it; with
// `recompute`, slice and zcols multiples of vocab_tile). The bits never depend on either. Returns
// the path that ran.
LogprobBwdPath linear_logprob_backward_with_path(
    const TensorView& h, const TensorView& w, const TensorView& targets,
    const LogprobParams& params, const ContractConfig& cfg, const TensorView& lse,
    const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
    const TensorView& dh, const TokenOrder& order, const TensorView& dw, LogprobBwdPath path,
    void* stream = nullptr, const LogprobBwdPlan* force = nullptr,
    const LogprobRecompute* recompute = nullptr);

}  // namespace lockstep::cuda::detail
