// The op-case table: every case of every op (GEMM incl. TP partial + combine, RMSNorm (+residual),
// RoPE, SiLU-and-mul, embedding (+ vocab-parallel combine), attention in every mode,
// kv_cache_write, linear log-prob (+ partial / combine), sampling). Sizes are the odd ones (1, 3,
// 17, 111, 989) next to real model widths; layouts are contiguous or strided (rows wider than the
// view, q/k inside a fused qkv buffer, column shards). The cases and their relations are in
// tests/ops/cases_*.cc.
#include <memory>
#include <vector>

#include "ops/cases.h"
#include "ops/op_case.h"

namespace lockstep::cases {

std::vector<std::unique_ptr<OpCase>> op_cases() {
  std::vector<std::unique_ptr<OpCase>> t;
  using DK = DataKind;
  const DType bf = DType::kBF16, f32 = DType::kF32;

  // GEMM: public entry, every segment count, bias kinds, both outputs, odd sizes, data kinds.
  for (int S : {1, 2, 4, 8}) {
    t.push_back(gemm_case(GemmShape{17, 111, 989, S, Bias::kNone, bf, false, DK::kNormal}));
    t.push_back(gemm_case(GemmShape{3, 64, 257, S, Bias::kF32, f32, true, DK::kNormal}));
  }
  t.push_back(gemm_case(GemmShape{1, 1, 1, 1, Bias::kBF16, bf, false, DK::kNormal}));
  t.push_back(gemm_case(GemmShape{111, 17, 3, 2, Bias::kBF16, f32, true, DK::kNormal}));
  t.push_back(gemm_case(GemmShape{64, 256, 512, 1, Bias::kNone, bf, false, DK::kNormal}));
  t.push_back(gemm_case(GemmShape{130, 136, 1000, 4, Bias::kF32, bf, true, DK::kNormal}));
  t.push_back(gemm_case(GemmShape{17, 64, 512, 2, Bias::kBF16, f32, true, DK::kNormal}));
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials}) {
    t.push_back(gemm_case(GemmShape{17, 40, 300, 2, Bias::kNone, f32, false, k}));
    t.push_back(gemm_case(GemmShape{3, 33, 111, 1, Bias::kBF16, bf, true, k}));
  }
  // Shapes of the row / thread / rerun / stride checks (were tests in test_gemm.cc).
  for (int S : {1, 4})
    for (int64_t K : {64, 333})
      t.push_back(gemm_case(GemmShape{17, 111, K, S, Bias::kNone, bf, false, DK::kNormal}));
  t.push_back(gemm_case(GemmShape{17, 33, 100, 2, Bias::kNone, bf, true, DK::kNormal}));
  for (int64_t M : {1, 67})
    t.push_back(gemm_case(GemmShape{M, 1029, 300, 4, Bias::kNone, f32, false, DK::kNormal}));
  t.push_back(gemm_case(GemmShape{40, 70, 200, 8, Bias::kF32, bf, false, DK::kNormal}));
  // Every TP degree t <= S (a relation of every GEMM case): the decode (M = 1) and packed (13)
  // kernels, K with padding-only ranks (37), both outputs.
  for (int S : {1, 2, 4, 8})
    for (int64_t K : {128, 200, 1000, 37})
      for (int64_t M : {1, 13})
        for (DType out : {bf, f32})
          t.push_back(gemm_case(GemmShape{M, 45, K, S, Bias::kBF16, out, false, DK::kNormal}));
  // GEMM row-parallel TP entry points (partial per rank + tree combine) as cases of their own.
  for (int tp : {2, 4, 8})
    t.push_back(gemm_case(GemmShape{17, 111, 989, 8, Bias::kF32, bf, false, DK::kNormal}, tp));
  t.push_back(gemm_case(GemmShape{3, 64, 100, 4, Bias::kNone, f32, true, DK::kNormal}, 2));
  t.push_back(gemm_case(GemmShape{5, 19, 17, 8, Bias::kBF16, bf, false, DK::kNormal}, 4));

  // RMSNorm (+ residual): odd widths, magnitudes from subnormal squares to overflow, specials.
  for (int64_t H : {1, 3, 17, 111, 128, 989, 4096}) {
    t.push_back(rmsnorm_case(17, H, false, H % 2 == 1, DK::kNormal));
    t.push_back(rmsnorm_case(3, H, true, H % 2 == 0, DK::kNormal));
  }
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials}) {
    t.push_back(rmsnorm_case(17, 136, false, false, k));
    t.push_back(rmsnorm_case(17, 136, true, true, k));
  }
  for (int64_t H : {64, 136, 1000}) {
    t.push_back(rmsnorm_case(17, H, false, false, DK::kNormal));
    t.push_back(rmsnorm_case(17, H, true, false, DK::kNormal));
  }
  t.push_back(rmsnorm_case(300, 1000, true, false, DK::kNormal));
  t.push_back(rmsnorm_case(5, 64, false, true, DK::kNormal, 1e-20f));
  t.push_back(rmsnorm_case(5, 64, true, false, DK::kNormal, 1e19f));

  // RoPE: head dims 2 .. 128, i32 / i64 positions, q inside a fused qkv buffer.
  t.push_back(rope_case(111, 8, 128, DType::kI64, false, DK::kNormal));
  t.push_back(rope_case(17, 3, 2, DType::kI32, true, DK::kNormal));
  t.push_back(rope_case(17, 5, 6, DType::kI32, false, DK::kNormal));
  t.push_back(rope_case(3, 16, 64, DType::kI64, true, DK::kNormal));
  t.push_back(rope_case(17, 4, 128, DType::kI64, false, DK::kNormal));
  t.push_back(rope_case(257, 8, 128, DType::kI64, false, DK::kNormal));
  t.push_back(rope_case(17, 4, 128, DType::kI32, true, DK::kSpecials));
  t.push_back(rope_case(17, 4, 128, DType::kI64, false, DK::kLarge));

  // SiLU-and-mul: fused gate_up halves and separate strided views, odd widths, specials.
  for (int64_t I : {1, 3, 17, 111, 989, 3072})
    t.push_back(silu_case(17, I, I % 2 == 1, DK::kNormal));
  t.push_back(silu_case(17, 136, true, DK::kNormal));
  t.push_back(silu_case(300, 1000, true, DK::kNormal));
  for (DK k : {DK::kLarge, DK::kSmall, DK::kSpecials})
    t.push_back(silu_case(17, 136, k != DK::kSmall, k));

  // Embedding (+ vocab-parallel partials and combine, TP = 2, 3, 4, 8).
  t.push_back(embedding_case(111, 1000, 136, DType::kI32, true, 1));
  t.push_back(embedding_case(17, 989, 17, DType::kI64, false, 1));
  t.push_back(embedding_case(1, 3, 1, DType::kI64, false, 1));
  t.push_back(embedding_case(500, 1000, 64, DType::kI64, false, 1));
  for (int64_t H : {3, 64, 136}) t.push_back(embedding_case(257, 1000, H, DType::kI64, false, 1));
  for (int w : {2, 3, 4, 8}) t.push_back(embedding_case(37, 1000, 136, DType::kI64, w % 2 == 1, w));

  // Linear log-prob (+ vocab-parallel partial / combine).
  t.push_back(logprob_case(17, 64, 989, logprob_contract(256, 1), 1.0f, DType::kI64, false,
                           DK::kNormal, 1));
  t.push_back(logprob_case(3, 136, 1000, logprob_contract(128, 4), 0.7f, DType::kI32, true,
                           DK::kNormal, 1));
  t.push_back(logprob_case(111, 32, 3001, logprob_contract(256, 8), 1.3f, DType::kI64, false,
                           DK::kNormal, 1));
  t.push_back(logprob_case(17, 64, 500, logprob_contract(64, 2), 1.0f, DType::kI64, true,
                           DK::kSpecials, 1));
  t.push_back(
      logprob_case(17, 64, 500, logprob_contract(64, 2), 0.5f, DType::kI32, false, DK::kLarge, 1));
  // Shapes of the token / TP / thread / rerun checks (were tests in test_logprob.cc).
  for (ContractConfig c : {logprob_contract(64, 1), logprob_contract(32, 2, 2)})
    t.push_back(logprob_case(17, 40, 300, c, 0.8f, DType::kI64, false, DK::kNormal, 1));
  for (int S : {1, 2, 4, 8})
    t.push_back(logprob_case(13, 32, 700, logprob_contract(64, S), 1.3f, DType::kI64, false,
                             DK::kNormal, 1));
  for (int64_t T : {1, 40})
    t.push_back(logprob_case(T, 32, 777, logprob_contract(32, 2, 2), 0.9f, DType::kI64, false,
                             DK::kNormal, 1));
  t.push_back(logprob_case(33, 48, 513, logprob_contract(128, 4, 2), 0.6f, DType::kI64, false,
                           DK::kNormal, 1));
  for (int w : {2, 4, 8})
    t.push_back(logprob_case(17, 64, 3001, logprob_contract(128, 8), 0.9f, DType::kI64, false,
                             DK::kNormal, w));

  // Sampling: plain, filters, greedy; exactly tied logits (ties go to the lowest index).
  {
    SamplingParams plain;
    plain.seed = 7;
    plain.temperature = 0.8f;
    t.push_back(sample_case(17, 64, 989, plain, false, DK::kNormal, "temp0.8"));
    SamplingParams filt = plain;
    filt.top_k = 50;
    filt.top_p = 0.9f;
    filt.min_p = 0.05f;
    t.push_back(sample_case(17, 64, 1000, filt, false, DK::kNormal, "topk50_topp0.9_minp0.05"));
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    t.push_back(sample_case(17, 64, 1000, greedy, true, DK::kTies, "greedy"));
    t.push_back(sample_case(3, 64, 111, plain, true, DK::kTies, "temp0.8"));
    SamplingParams k1 = plain;
    k1.top_k = 1;
    t.push_back(sample_case(17, 32, 300, k1, true, DK::kTies, "topk1"));
  }

  // Attention: every mode, GQA ratios, head dims, kv_chunk 64 / 128 / 1024, page sizes.
  const std::vector<int64_t> lens = {1, 3, 17, 111, 65, 130};
  const AttnDims d64{8, 4, 64}, d128{4, 2, 128}, d32{8, 4, 32};
  for (AttnMode m : {AttnMode::kPrefill, AttnMode::kDecode, AttnMode::kChunked,
                     AttnMode::kChunkStates, AttnMode::kKvWrite}) {
    t.push_back(attention_case(m, d64, 64, 0.0, lens, 16));
    t.push_back(attention_case(m, d128, 128, 0.0, lens, 37));
  }
  t.push_back(attention_case(AttnMode::kPrefill, d32, 64, 0.3, lens, 16));
  // GQA ratio 4 (the shapes of the former CPU test ThreadCountDeterminismAndPoison): threads,
  // rerun, poison, decode rows == prefill; one long row alone (its chunks split over threads).
  const AttnDims d82{8, 2, 64};
  t.push_back(
      attention_case(AttnMode::kPrefill, d82, 64, 0.0, std::vector<int64_t>{333, 17, 3}, 64));
  t.push_back(
      attention_case(AttnMode::kDecode, d82, 64, 0.0, std::vector<int64_t>{333, 17, 3}, 64));
  t.push_back(attention_case(AttnMode::kDecode, d82, 64, 0.0, std::vector<int64_t>{333}, 64));
  t.push_back(attention_case(AttnMode::kPrefill, AttnDims{2, 1, 512}, 64, 0.0,
                             std::vector<int64_t>{1, 17, 65}, 16));
  t.push_back(attention_case(AttnMode::kPrefill, AttnDims{12, 4, 80}, 64, 0.0, lens, 16));
  t.push_back(
      attention_case(AttnMode::kDecode, d64, 1024, 0.0, std::vector<int64_t>{1100, 17}, 64));
  t.push_back(attention_case(AttnMode::kPrefill, d64, 64, 0.0, lens, 16, 1, 1, 0, DK::kSpecials));
  t.push_back(attention_case(AttnMode::kDecode, d64, 64, 0.0, lens, 1, 1, 1, 0, DK::kLarge));
  for (int splits : {2, 3, 7})
    t.push_back(attention_case(AttnMode::kSplitKv, d64, 64, 0.0,
                               std::vector<int64_t>{300, 17, 129, 1}, 16, splits));
  t.push_back(
      attention_case(AttnMode::kSplitKv, d64, 256, 0.0, std::vector<int64_t>{1100, 700}, 64, 3));
  // The Hopper prefill kernel (head_dim 128, src/cuda/attention_wg.cuh): tiles of 128 rows over
  // several blocks and chunks (kv_chunk 64 / 192 / 1024), GQA 4, specials (non-finite V inside
  // the diagonal blocks), large values.
  const AttnDims d128g4{8, 2, 128};
  t.push_back(attention_case(AttnMode::kPrefill, d128g4, 64, 0.0,
                             std::vector<int64_t>{333, 17, 130, 1, 256}, 64));
  t.push_back(
      attention_case(AttnMode::kPrefill, d128g4, 1024, 0.0, std::vector<int64_t>{1100, 129}, 64));
  t.push_back(attention_case(AttnMode::kPrefill, d128, 128, 0.0, lens, 16, 1, 1, 0, DK::kSpecials));
  t.push_back(attention_case(AttnMode::kPrefill, AttnDims{4, 1, 128}, 192, 0.0,
                             std::vector<int64_t>{700, 64, 65}, 16, 1, 1, 0, DK::kLarge));
  // Cascade: groups of 3 sharing 130 (not a multiple of kv_chunk) and 128 (a multiple) tokens.
  t.push_back(attention_case(AttnMode::kCascade, d64, 64, 0.0,
                             std::vector<int64_t>{200, 131, 300, 150, 129, 140}, 16, 1, 3, 130));
  t.push_back(attention_case(AttnMode::kCascade, d128, 128, 0.0,
                             std::vector<int64_t>{128, 300, 257, 200}, 37, 1, 2, 128));
  // The backward ops (§B).
  add_backward_gemm_cases(t);
  add_backward_elementwise_cases(t);
  add_backward_logprob_cases(t);
  add_backward_attention_cases(t);
  add_shared_attention_cases(t);
  return t;
}

}  // namespace lockstep::cases
