// Shared parts of the op-case table's packed-attention cases
// (tests/ops/cases_backward_attention.cc, cases_shared_attention.cc): the rows of one sequence or
// segment, their packing into [T, H, D] inputs (contiguous or strided), the forward + backward of a
// packing on a backend, and a row-range comparison of outputs.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ops/cases.h"
#include "ops/op_case.h"

namespace lockstep::cases {

// The rows of one packed sequence (or segment): q, dout [len, Hq, D], k, v [len, Hkv, D] bf16.
struct AttnRows {
  int64_t len = 0;
  Tensor q, k, v, dout;
};
AttnRows make_attn_rows(const AttnDims& d, int64_t len, DataKind kind, std::mt19937_64& g);
// a's rows, then b's: one sequence (e.g. a prompt and one of its completions).
AttnRows join_rows(const AttnDims& d, const AttnRows& a, const AttnRows& b);

// The rows of `pack` packed in order, forward then backward on one backend: {out, lse, dq, dk,
// dv}. prompt_of empty: attention_prefill_varlen / attention_backward_varlen over the sequences;
// else the shared-prompt ops (§B.11) with prompt_of [B] over the packed segments. strided: every
// input and output in rows wider than the view.
Outputs run_attention_pack(Ops& ops, Mem& mem, const AttnDims& d, const AttentionConfig& cfg,
                           const std::vector<const AttnRows*>& pack,
                           const std::vector<int32_t>& prompt_of, bool strided);

// Rows [t_got, t_got + n) of outputs `which` of `got` == rows [t_want, t_want + n) of `want`
// (which empty: every output).
void check_rows(const Check& check, const std::string& what, const Outputs& got, int64_t t_got,
                const Outputs& want, int64_t t_want, int64_t n,
                const std::vector<size_t>& which = {});

}  // namespace lockstep::cases
