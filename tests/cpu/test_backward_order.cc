// The backward's shared contract types (docs/contract.md §B.1, B.2): TokenOrder validation and
// canonical sorting, TokenOrder::packed, GradStep's refusal of out-of-order micro-batches, and
// dx_segments.
#include <string>
#include <vector>

#include "cpu/elementwise_test_util.h"
#include "lockstep/contract/backward.h"

namespace lockstep {
namespace {

using test::expect_error;

TEST(TokenOrder, SortsByStepIndexAndKeepsRows) {
  const TokenOrder o = TokenOrder::make("op", {{7, 0, 3}, {2, 10, 4}, {5, 3, 0}, {4, 4, 6}}, 14);
  ASSERT_EQ(o.seqs().size(), 4u);
  const int64_t want[4][3] = {{2, 10, 4}, {4, 4, 6}, {5, 3, 0}, {7, 0, 3}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(o.seqs()[i].step_index, want[i][0]);
    EXPECT_EQ(o.seqs()[i].row, want[i][1]);
    EXPECT_EQ(o.seqs()[i].len, want[i][2]);
  }
  EXPECT_EQ(o.rows(), 14);
  EXPECT_FALSE(o.empty());
  EXPECT_EQ(o.first_step_index(), 2);
  EXPECT_EQ(o.last_step_index(), 7);
}

TEST(TokenOrder, EmptyOrders) {
  const TokenOrder a;
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.rows(), 0);
  EXPECT_EQ(a.first_step_index(), -1);
  EXPECT_EQ(a.last_step_index(), -1);
  const TokenOrder b = TokenOrder::make("op", {}, 5);  // only padding rows
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.rows(), 5);
}

TEST(TokenOrder, ZeroLengthSequencesMayShareARow) {
  const TokenOrder o = TokenOrder::make("op", {{0, 2, 0}, {1, 2, 3}, {2, 5, 0}}, 5);
  EXPECT_EQ(o.seqs().size(), 3u);
}

TEST(TokenOrder, RefusesBadSequencesNamingTheOp) {
  expect_error(
      [] {
        TokenOrder::make("myop", {{-1, 0, 2}}, 4);
      },
      {"myop", "step index -1", "must be >= 0"});
  expect_error([] { TokenOrder::make("myop", {{0, 0, -1}}, 4); }, {"myop", "sequence 0"});
  expect_error(
      [] {
        TokenOrder::make("myop", {{0, 0, 2}, {1, 3, 2}}, 4);
      },
      {"myop", "sequence 1", "step index 1", "[3, 5)", "4 rows"});
  expect_error([] { TokenOrder::make("myop", {{0, -1, 1}}, 4); }, {"myop", "sequence 0"});
  expect_error(
      [] {
        TokenOrder::make("myop", {{3, 0, 1}, {3, 1, 1}}, 4);
      },
      {"myop", "step index 3", "twice"});
  expect_error(
      [] {
        TokenOrder::make("myop", {{0, 0, 3}, {1, 2, 2}}, 4);
      },
      {"myop", "step indices 0 and 1", "overlap"});
  expect_error(
      [] {
        TokenOrder::make("myop", {{5, 2, 2}, {1, 0, 3}}, 4);
      },
      {"myop", "step indices 1 and 5", "overlap"});
  expect_error([] { TokenOrder::make("myop", {}, -1); }, {"myop", "rows"});
}

TEST(TokenOrder, PackedFromCuSeqlens) {
  const std::vector<int64_t> cu = {0, 3, 3, 10};
  const TokenOrder o = TokenOrder::packed(cu, 20);
  ASSERT_EQ(o.seqs().size(), 3u);
  EXPECT_EQ(o.rows(), 10);
  EXPECT_EQ(o.seqs()[0].step_index, 20);
  EXPECT_EQ(o.seqs()[1].len, 0);
  EXPECT_EQ(o.seqs()[2].row, 3);
  EXPECT_EQ(o.seqs()[2].len, 7);
  EXPECT_EQ(o.last_step_index(), 22);
  const std::vector<int64_t> none = {0};
  EXPECT_TRUE(TokenOrder::packed(none, 0).empty());
  expect_error([] { TokenOrder::packed({}, 0); }, {"TokenOrder::packed", "cu_seqlens"});
  const std::vector<int64_t> bad = {0, 5, 3};
  expect_error([&] { TokenOrder::packed(bad, 0); }, {"TokenOrder::packed"});
  expect_error([&] { TokenOrder::packed(cu, -2); }, {"TokenOrder::packed", "step index -2"});
}

TEST(GradStep, AcceptsConsecutiveRunsAndRefusesGoingBack) {
  GradStep s;
  EXPECT_EQ(s.last_step_index(), -1);
  s.accept(TokenOrder::make("op", {{1, 5, 2}, {0, 0, 5}}, 7));
  EXPECT_EQ(s.last_step_index(), 1);
  s.accept(TokenOrder::make("op", {}, 3));  // an empty micro-batch changes nothing
  EXPECT_EQ(s.last_step_index(), 1);
  expect_error(
      [&] {
        s.accept(TokenOrder::make("op", {{1, 0, 1}}, 1));
      },
      {"GradStep", "out of canonical order", "starts at step index 1",
       "step index 1 was already accumulated"});
  expect_error(
      [&] {
        s.accept(TokenOrder::make("op", {{0, 0, 1}, {9, 1, 1}}, 2));
      },
      {"GradStep", "starts at step index 0"});
  EXPECT_EQ(s.last_step_index(), 1);  // a refused micro-batch is not recorded
  s.accept(TokenOrder::make("op", {{2, 0, 1}, {3, 1, 1}}, 2));
  EXPECT_EQ(s.last_step_index(), 3);
  s.accept(TokenOrder::make("op", {{10, 0, 1}}, 1));  // a gap is allowed
  EXPECT_EQ(s.last_step_index(), 10);
  s.reset();  // the next step starts again from 0
  EXPECT_EQ(s.last_step_index(), -1);
  s.accept(TokenOrder::make("op", {{0, 0, 1}}, 1));
  EXPECT_EQ(s.last_step_index(), 0);
}

TEST(DxSegments, ColumnParallelUsesTheGemmSegmentsRowParallelOne) {
  for (int S : {1, 2, 4, 8}) {
    ContractConfig c;
    c.gemm_segments = S;
    EXPECT_EQ(dx_segments(c, LayerRole::kColumnParallel), S);
    EXPECT_EQ(dx_segments(c, LayerRole::kRowParallel), 1);
  }
}

}  // namespace
}  // namespace lockstep
