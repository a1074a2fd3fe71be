// The op-case table's case constructors (tests/ops/cases_*.cc), one per op family, and their
// parameter types; tests/ops/op_cases.cc lists the table with them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/op_case.h"

namespace lockstep::cases {

enum class Bias { kNone, kBF16, kF32 };

struct GemmShape {
  int64_t M, N, K;
  int S;
  Bias bias;
  DType out;
  bool strided;
  DataKind kind;
};

// y = x·wᵀ (+ bias) through the public entry (tp == 1) or the row-parallel TP entry points.
std::unique_ptr<OpCase> gemm_case(const GemmShape& s, int tp = 1);

// strided: rows wider than the views (RMSNorm, embedding), q inside a fused qkv buffer (RoPE),
// the two halves of a fused gate_up buffer (SiLU).
std::unique_ptr<OpCase> rmsnorm_case(int64_t T, int64_t H, bool residual, bool strided,
                                     DataKind kind, float scale = 1.0f);
std::unique_ptr<OpCase> rope_case(int64_t T, int64_t heads, int64_t D, DType pos_dt, bool qkv,
                                  DataKind kind);
std::unique_ptr<OpCase> silu_case(int64_t T, int64_t I, bool fused, DataKind kind);
// world > 1: vocab-parallel partials of `world` ranks + combine.
std::unique_ptr<OpCase> embedding_case(int64_t T, int64_t V, int64_t H, DType ids_dt, bool strided,
                                       int world);

ContractConfig logprob_contract(int vocab_tile, int vocab_segments, int gemm_segments = 1);
// world > 1: vocab-parallel (partial per rank + combine); world divides vocab_segments.
std::unique_ptr<OpCase> logprob_case(int64_t T, int64_t H, int64_t V, ContractConfig cfg,
                                     float temperature, DType tgt_dt, bool strided, DataKind kind,
                                     int world);
// dup_rows: every other w row repeats the one before it (exactly tied logits).
std::unique_ptr<OpCase> sample_case(int64_t T, int64_t H, int64_t V, SamplingParams p,
                                    bool dup_rows, DataKind kind, std::string label);

struct AttnDims {
  int64_t Hq, Hkv, D;
};

enum class AttnMode { kPrefill, kDecode, kChunked, kSplitKv, kCascade, kChunkStates, kKvWrite };
// Sequences of `lens` in groups of `group` sharing a `prefix`-token prompt, paged with `page`.
std::unique_ptr<OpCase> attention_case(AttnMode mode, AttnDims d, int kv_chunk, double scale,
                                       std::vector<int64_t> lens, int64_t page, int splits = 1,
                                       int64_t group = 1, int64_t prefix = 0,
                                       DataKind kind = DataKind::kNormal);

// ---- Backward (docs/contract.md §B): each family appends its cases
// (tests/ops/cases_backward_*.cc).
using CaseList = std::vector<std::unique_ptr<OpCase>>;
void add_backward_gemm_cases(CaseList& t);         // B.3: dX (+ TP partials), dW
void add_backward_elementwise_cases(CaseList& t);  // B.4-B.7: RMSNorm, RoPE, SiLU, embedding
void add_backward_logprob_cases(CaseList& t);      // B.8
void add_backward_attention_cases(CaseList& t);    // B.9

// B.11: a GRPO group's prompt and completion lengths (no completions: an unshared sequence).
struct SharedGroup {
  int64_t prompt;
  std::vector<int64_t> completions;
};
void add_shared_attention_cases(CaseList& t);  // B.11: attention over shared-prompt groups

}  // namespace lockstep::cases
