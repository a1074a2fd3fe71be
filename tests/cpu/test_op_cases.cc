// The op-case table (tests/ops) on the CPU: for every case, each invariance relation of the case
// (batches of 1/3/17/256 at other positions with other rows changed, thread counts, page sizes,
// split counts, TP degrees, modes == packed prefill), determinism (rerun: the same bits, padding
// untouched), every element written (runs poisoned with 0xA5 and 0x5A agree on what the op
// writes), and, where the CPU has a scalar spec (GEMM), fast path == spec. One GoogleTest case per
// (check, table entry), named after the entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "ops/op_case.h"
#include "util/test_util.h"

namespace lockstep::cases {
namespace {

const std::vector<std::unique_ptr<OpCase>>& table() {
  static const std::vector<std::unique_ptr<OpCase>> t = op_cases();
  return t;
}

std::vector<size_t> all_cases() {
  std::vector<size_t> v;
  for (size_t i = 0; i < table().size(); ++i) v.push_back(i);
  return v;
}
std::vector<size_t> spec_cases() {
  std::vector<size_t> v;
  for (size_t i = 0; i < table().size(); ++i)
    if (table()[i]->has_scalar_spec()) v.push_back(i);
  return v;
}

// GoogleTest names allow letters, digits and '_' only.
std::string test_name(const ::testing::TestParamInfo<size_t>& info) {
  std::string s = table()[info.param]->name();
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// The case built from the binary's seed (printed once; LOCKSTEP_TEST_SEED replays it).
OpCase& built(size_t i) {
  OpCase& c = *table()[i];
  c.build(test::test_seed() + i);
  return c;
}

void expect_same(const Outputs& got, const Outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < got.size(); ++o) {
    const Verdict v = compare_outputs(got[o], want[o]);
    EXPECT_TRUE(v.ok) << what << ": " << v.message;
  }
}

class OpCaseTest : public ::testing::TestWithParam<size_t> {};
class OpCaseSpecTest : public ::testing::TestWithParam<size_t> {};

TEST_P(OpCaseTest, Invariance) {
  OpCase& c = built(GetParam());
  auto ops = cpu_ops();
  auto mem = cpu_mem();
  const Outputs base = c.run(*ops, *mem);
  const std::vector<Relation> rel = c.relations();
  ASSERT_FALSE(rel.empty()) << c.name() << " has no invariance relation";
  int checks = 0;
  for (const Relation& r : rel) {
    auto m = cpu_mem();
    r.run(*ops, *m, base, [&](const std::string& what, const Verdict& v) {
      ++checks;
      EXPECT_TRUE(v.ok) << r.name << ": " << what << ": " << v.message;
    });
  }
  EXPECT_GT(checks, 0) << c.name();
}

TEST_P(OpCaseTest, RerunSameBitsEveryElementWrittenPaddingUntouched) {
  OpCase& c = built(GetParam());
  auto ops = cpu_ops();
  auto m1 = cpu_mem(), m2 = cpu_mem(), m3 = cpu_mem(0x5A);
  const Outputs a = c.run(*ops, *m1);
  expect_same(c.run(*ops, *m2), a, "rerun");
  for (const Output& o : a) {
    const Verdict v = padding_untouched(o);
    EXPECT_TRUE(v.ok) << v.message;
  }
  const Outputs p = c.run(*ops, *m3);
  ASSERT_EQ(p.size(), a.size());
  for (size_t o = 0; o < a.size(); ++o) {
    const Verdict v = compare_written(p[o], a[o]);
    EXPECT_TRUE(v.ok) << "poison 0x5A vs 0xA5: " << v.message;
  }
}

TEST_P(OpCaseSpecTest, FastPathEqualsScalarSpec) {
  OpCase& c = built(GetParam());
  auto fast = cpu_ops(), spec = cpu_scalar_ops();
  auto m1 = cpu_mem(), m2 = cpu_mem();
  expect_same(c.run(*fast, *m1), c.run(*spec, *m2), "fast vs scalar spec");
}

INSTANTIATE_TEST_SUITE_P(Table, OpCaseTest, ::testing::ValuesIn(all_cases()), test_name);
INSTANTIATE_TEST_SUITE_P(Table, OpCaseSpecTest, ::testing::ValuesIn(spec_cases()), test_name);

// Table sanity: unique names, every op of the brief present.
TEST(OpCaseTable, NamesAreUniqueAndEveryOpIsCovered) {
  std::vector<std::string> names, ops;
  for (const auto& c : table()) {
    names.push_back(c->name());
    ops.push_back(c->op());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "duplicate name";
  for (const char* op :
       {"gemm", "gemm_tp", "rmsnorm", "rmsnorm_residual", "rope", "silu_mul", "embedding",
        "embedding_tp", "attention_prefill_varlen", "attention_paged_decode",
        "attention_paged_chunked_prefill", "attention_paged_split_kv", "attention_paged_cascade",
        "attention_chunk_states_merge", "kv_cache_write", "linear_logprob", "linear_logprob_tp",
        "sample", "attention_shared"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
}

}  // namespace
}  // namespace lockstep::cases
