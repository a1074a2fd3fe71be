// Internal entry points of the CUDA GEMM (src/cuda/gemm/), for the log-prob producer, tests and
// benchmarks. Plain C++ (the stream is an opaque cudaStream_t passed as void*).
#pragma once

#include <cstdint>

#include "cuda/gemm/plan.h"
#include "lockstep/contract/backward.h"  // TokenOrder
#include "lockstep/ops/gemm.h"
#include "lockstep/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace lockstep::cuda::detail {

struct GemmParams;

// The problem cuda::gemm_bf16_nt / gemm_bf16_nt_partial plan for these arguments (sizes,
// segments, TMA compatibility of the operands). Arguments are not checked here.
GemmProblem gemm_problem(const TensorView& x, const TensorView& w, const GemmConfig& cfg);
GemmProblem gemm_partial_problem(const TensorView& x_shard, const TensorView& w_shard,
                                 int64_t k_total, int tp_size, const GemmConfig& cfg);

// cuda::gemm_bf16_nt / gemm_bf16_nt_partial running `plan` instead of plan_gemm's: the same
// argument checks, then lockstep::Error unless the plan is one of gemm_legal_plans(problem).
// Same bits for every legal plan (what test_gemm_parity checks).
void gemm_bf16_nt_with_plan(const TensorView& x, const TensorView& w, const TensorView* bias,
                            const GemmConfig& cfg, const TensorView& y, const GemmPlan& plan,
                            void* stream = nullptr);
void gemm_bf16_nt_partial_with_plan(const TensorView& x_shard, const TensorView& w_shard,
                                    int64_t k_total, int tp_size, int tp_rank,
                                    const GemmConfig& cfg, const TensorView& y_partial,
                                    const GemmPlan& plan, void* stream = nullptr);

// x [M, K] (rows ldx apart) and w [N, K] (rows ldw apart) are TMA-compatible (16-byte aligned
// bases, row strides a multiple of 8 covering K, K >= 1, sizes below 2^31): a function of the
// pointers' alignment, strides and sizes only. The fused log-prob producer needs it.
bool gemm_operands_tma_ok(const void* x, int64_t M, int64_t ldx, const void* w, int64_t N,
                          int64_t ldw, int64_t K);

// The TN layout (dW, plan.h, docs/cuda-gemm.md "Backward"): y[M, N] (f32, rows ldy apart) +=
// a[K, M]ᵀ · b[K, N] in accumulate mode: every output's chain over the k-blocks of 16 of [0, K)
// (zero fill past K) starts from y's current value; the fp32 result is stored (canonical NaN).
// a, b: bf16, MN-major (row k holds token slot k), rows lda / ldb apart, TMA-readable (an
// internal error otherwise). Runs `plan` (lockstep::Error unless one of gemm_legal_plans of
// gemm_tn_problem) or plan_gemm's. M, N or K = 0: y untouched. Arguments are not checked beyond
// the sizes.
GemmProblem gemm_tn_problem(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                            int64_t M, int64_t N, int64_t K);
void gemm_bf16_tn_accumulate(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                             int64_t M, int64_t N, int64_t K, float* y, int64_t ldy,
                             const GemmPlan* plan = nullptr, void* stream = nullptr);

// The blocked TN layout (dW on token blocks read in place; mainloop_sm90.cuh Sm90BlockedParams):
// y[M, N] (f32, rows ldy apart) += the chain over nblocks k-blocks of 16 token slots, block j's
// rows being rows blocks[j], ... + 15 of a [rows, M] / b [rows, N] (MN-major, rows lda / ldb
// apart) when blocks[j] >= 0, else rows 16·(−blocks[j] − 1) ... + 15 of a_tail [tail_rows, M] /
// b_tail [tail_rows, N] (rows lda_tail / ldb_tail apart; the zero-padded partial blocks). blocks
// is device memory with (ceil(nblocks / 4) + 1) · 4 entries (the padding: any valid entry). Every
// operand TMA-readable; the plan one of gemm_legal_plans(gemm_tn_problem(a, lda, b, ldb, M, N,
// 16 · nblocks)) or plan_gemm's. The same bits as gemm_bf16_tn_accumulate on the gathered blocks.
void gemm_bf16_tn_accumulate_blocked(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                                     int64_t rows, const uint16_t* a_tail, int64_t lda_tail,
                                     const uint16_t* b_tail, int64_t ldb_tail, int64_t tail_rows,
                                     const int32_t* blocks, int64_t nblocks, int64_t M, int64_t N,
                                     float* y, int64_t ldy, const GemmPlan* plan = nullptr,
                                     void* stream = nullptr);

// cuda::gemm_bf16_dw without the blocked form (a benchmark / test hook): token runs that are not
// one run of consecutive rows are row-gathered into token-major copies, window by window, even
// where TMA could read them in place. The same bits as cuda::gemm_bf16_dw.
void gemm_bf16_dw_gathered(const TensorView& dy, const TensorView& x, const TokenOrder& order,
                           const TensorView& dw, void* stream = nullptr);

// The NN layout's accumulate mode (the log-prob backward's dh, §B.8, without a transposed G):
// y[M, N] (f32, rows ldy apart) += a[M, K] · b[K, N], a K-major (rows lda apart), b MN-major
// (rows ldb apart): every output's chain over the k-blocks of 16 of [0, K) (zero fill past K)
// starts from y's current value; the fp32 result is stored (canonical NaN) — the bits of
// gemm_bf16_tn_accumulate on aᵀ. Plans: those of the tn layout (gemm_nn_accumulate_problem's
// gemm_legal_plans: the same tiles); TMA-readable operands (an internal error otherwise).
GemmProblem gemm_nn_accumulate_problem(const uint16_t* a, int64_t lda, const uint16_t* b,
                                       int64_t ldb, int64_t M, int64_t N, int64_t K);
void gemm_bf16_nn_accumulate(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                             int64_t M, int64_t N, int64_t K, float* y, int64_t ldy,
                             const GemmPlan* plan = nullptr, void* stream = nullptr);

// The NN layout (dX = dY · W with W read in place, plan.h): y [M, N] = the GEMM contract of cfg
// (§G: segments over K, tree, one rounding to y's dtype) of x [M, K] and w [K, N] (MN-major, rows
// w.stride[0] apart): the bits of cuda::gemm_bf16_nt(x, wᵀ, cfg). The partial: a TP rank's f32
// subtree of its cfg.segments / tp_size segments of the k_total layout (gemm_bf16_nt_partial's
// bits on wᵀ's shard). Needs TMA-readable operands (gemm_nn_problem(...).tma_ok; lockstep::Error
// otherwise); runs `plan` (one of gemm_legal_plans) or plan_gemm's. Arguments are not checked:
// the caller has (contract::check_gemm_dx / _partial).
GemmProblem gemm_nn_problem(const TensorView& x, const TensorView& w, const GemmConfig& cfg);
GemmProblem gemm_nn_partial_problem(const TensorView& x_shard, const TensorView& w_shard,
                                    int64_t k_total, int tp_size, const GemmConfig& cfg);
void gemm_bf16_nn(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
                  const TensorView& y, const GemmPlan* plan = nullptr, void* stream = nullptr);
void gemm_bf16_nn_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, const GemmConfig& cfg, const TensorView& y_partial,
                          const GemmPlan* plan = nullptr, void* stream = nullptr);

// The small-M launch (launch_small_m.cu) of a plan whose main loop is a small-M kind; throws if
// no kernel of that tile is compiled or its launch fails.
void run_small_m(const GemmParams& p, const GemmPlan& plan, cudaStream_t stream);
// 0 iff the compiled small-M kernels are exactly plan.cc's tiles (a test checks it).
int small_m_kernels_missing();

}  // namespace lockstep::cuda::detail
