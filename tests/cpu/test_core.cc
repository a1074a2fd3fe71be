// Core: bf16 rounding, TensorView checks, Philox known answers, thread pool coverage.
#include <atomic>
#include <cmath>
#include <vector>

#include "core/philox.h"
#include "core/thread_pool.h"
#include "lockstep/contract.h"
#include "lockstep/contract/backward.h"
#include "lockstep/tensor.h"
#include "util/test_util.h"

namespace lockstep {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between 1 and 1+2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f).bits, 0x3f81);
  EXPECT_EQ(f32_to_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(f32_to_bf16(INFINITY).bits, 0x7f80);
  EXPECT_EQ(f32_to_bf16(3.4e38f).bits, 0x7f80);  // rounds past the largest bf16
  // Every NaN, whatever its sign or payload, is stored as the canonical 0x7FC0.
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu, 0x7fffffffu})
    EXPECT_EQ(f32_to_bf16(f32_from_bits(nan)).bits, kCanonicalNanBf16) << std::hex << nan;
  EXPECT_EQ(f32_bits(canonical_f32(f32_from_bits(0xffc00001u))), kCanonicalNanF32);
  EXPECT_EQ(f32_bits(canonical_f32(-0.0f)), 0x80000000u);
}

TEST(Bf16, RoundTripIsExactForEveryBf16) {
  for (uint32_t b = 0; b < 65536; ++b) {
    bf16 h{uint16_t(b)};
    float f = bf16_to_f32(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f).bits, b);
  }
}

TEST(Tensor, ChecksNameTheProblem) {
  Tensor t(DType::kBF16, {3, 4});
  EXPECT_NO_THROW(check_tensor("op", "x", t.view(), DType::kBF16, {3, -1}));
  try {
    check_tensor("myop", "x", t.view(), DType::kF32, {3, 4});
    FAIL() << "expected throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "myop: argument 'x' expected dtype f32, got bf16");
  }
  try {
    check_tensor("myop", "w", t.view(), DType::kBF16, {3, 5});
    FAIL() << "expected throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "myop: argument 'w' expected shape [3, 5], got [3, 4]");
  }
  EXPECT_TRUE(t.view().is_contiguous());
  TensorView r = t.view().rows(1, 3);
  EXPECT_EQ(r.size(0), 2);
  EXPECT_THROW(t.view().rows(2, 5), Error);
}

TEST(Philox, KnownAnswers) {
  // Random123 known-answer vectors for philox4x32-10.
  Philox4 r = philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = philox4x32_10(Philox4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                    0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = philox4x32_10(Philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                    0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Philox, UniformIsOpenInterval) {
  EXPECT_EQ(philox_uniform(0), 0x1p-24f);
  EXPECT_EQ(philox_uniform(0xffffffffu), 1.0f - 0x1p-24f);
  EXPECT_EQ(philox_uniform(0x80000000u), 0.5f + 0x1p-24f);
}

TEST(ThreadPool, CoversEveryIndexOnceForAnyThreadCount) {
  for (int threads : {1, 2, 3, 7}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << i;
    }
  }
  set_num_threads(2);
}

TEST(ThreadPool, RethrowsWorkerErrors) {
  set_num_threads(3);
  EXPECT_THROW(parallel_for(100, 1,
                            [](int64_t b, int64_t) {
                              if (b > 0) throw Error("boom");
                            }),
               Error);
  set_num_threads(2);
}

TEST(Contract, ValidatesAndPrints) {
  ContractConfig c;
  EXPECT_NO_THROW(c.validate());
  c.gemm_segments = 3;
  EXPECT_THROW(c.validate(), Error);
  EXPECT_NE(ContractConfig().to_string().find("contract 0.6"), std::string::npos);
}

// Contract 0.3 (§G.5): only a row-parallel layer's forward GEMM takes the contract's K segments;
// the backward's dX takes them over N only for a column-parallel layer (B.2).
TEST(Contract, GemmSegmentsByLayerRole) {
  for (int S : {1, 2, 4, 8}) {
    ContractConfig c;
    c.gemm_segments = S;
    EXPECT_EQ(GemmConfig::for_layer(c, LayerRole::kRowParallel).segments, S);
    EXPECT_EQ(GemmConfig::for_layer(c, LayerRole::kColumnParallel).segments, 1);
    EXPECT_EQ(dx_segments(c, LayerRole::kColumnParallel), S);
    EXPECT_EQ(dx_segments(c, LayerRole::kRowParallel), 1);
  }
}

}  // namespace
}  // namespace lockstep
