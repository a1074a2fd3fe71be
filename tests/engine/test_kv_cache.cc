// KV page allocator and block-table manager: refcounts, LIFO free list, exhaustion, fork sharing,
// copy-on-write of a shared partial page, and that a failed grow changes nothing.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "lockstep/error.h"
#include "util/test_util.h"

namespace lockstep::engine {
namespace {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PageAllocator, HandsOutLowestFirstAndReusesLastFreed) {
  PageAllocator a(5);
  EXPECT_EQ(a.num_pages(), 5);
  EXPECT_EQ(a.num_free(), 5);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), 1);
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(a.num_free(), 2);
  a.release(1);
  EXPECT_EQ(a.refcount(1), 0);
  EXPECT_EQ(a.allocate(), 1);  // LIFO
  EXPECT_EQ(a.allocate(), 3);
}

TEST(PageAllocator, RefcountsKeepSharedPagesAlive) {
  PageAllocator a(3);
  int32_t p = a.allocate();
  a.retain(p);
  a.retain(p);
  EXPECT_EQ(a.refcount(p), 3);
  a.release(p);
  a.release(p);
  EXPECT_EQ(a.refcount(p), 1);
  EXPECT_EQ(a.num_free(), 2);
  a.release(p);
  EXPECT_EQ(a.refcount(p), 0);
  EXPECT_EQ(a.num_free(), 3);
}

TEST(PageAllocator, ExhaustionAndMisuseAreClearErrors) {
  PageAllocator a(2);
  a.allocate();
  a.allocate();
  EXPECT_NE(error_of([&] { a.allocate(); }).find("all 2 pages are in use"), std::string::npos);
  PageAllocator b(2);
  EXPECT_NE(error_of([&] { b.release(0); }).find("already free"), std::string::npos);
  EXPECT_NE(error_of([&] { b.retain(1); }).find("is free"), std::string::npos);
  EXPECT_NE(error_of([&] { b.retain(7); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { b.refcount(-1); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([] { PageAllocator c(0); }).find("num_pages"), std::string::npos);
}

TEST(KvCacheConfig, ValidatesAndPrints) {
  KvCacheConfig c{3, 10};
  c.validate();
  EXPECT_EQ(c.to_string(), "kv: page_size=3 num_pages=10");
  EXPECT_EQ(c.pages_for(0), 0);
  EXPECT_EQ(c.pages_for(1), 1);
  EXPECT_EQ(c.pages_for(3), 1);
  EXPECT_EQ(c.pages_for(4), 2);
  EXPECT_NE(error_of([] { KvCacheConfig{0, 10}.validate(); }).find("page_size"), std::string::npos);
  EXPECT_NE(error_of([] { KvCacheConfig{4, 0}.validate(); }).find("num_pages"), std::string::npos);
}

TEST(KvCacheManager, GrowAllocatesPagesByPosition) {
  KvCacheManager m(KvCacheConfig{4, 8});
  m.add(7);
  std::vector<PageCopy> copies;
  EXPECT_EQ(m.pages_needed(7, 9), 3);
  ASSERT_TRUE(m.grow(7, 9, &copies));
  EXPECT_EQ(m.length(7), 9);
  EXPECT_EQ(m.block_table(7).size(), 3u);
  EXPECT_EQ(m.num_free_pages(), 5);
  ASSERT_TRUE(m.grow(7, 12, &copies));  // fills page 2: no new page
  EXPECT_EQ(m.block_table(7).size(), 3u);
  ASSERT_TRUE(m.grow(7, 5, &copies));  // shrinking is a no-op
  EXPECT_EQ(m.length(7), 12);
  EXPECT_TRUE(copies.empty());
  m.check_invariants();
  m.free(7);
  EXPECT_FALSE(m.has(7));
  EXPECT_EQ(m.num_free_pages(), 8);
  m.check_invariants();
}

TEST(KvCacheManager, FailedGrowChangesNothing) {
  KvCacheManager m(KvCacheConfig{2, 3});
  m.add(1);
  m.add(2);
  std::vector<PageCopy> copies;
  ASSERT_TRUE(m.grow(1, 4, &copies));
  EXPECT_FALSE(m.grow(2, 3, &copies));  // needs 2 pages, 1 free
  EXPECT_EQ(m.length(2), 0);
  EXPECT_TRUE(m.block_table(2).empty());
  EXPECT_EQ(m.num_free_pages(), 1);
  ASSERT_TRUE(m.grow(2, 2, &copies));
  EXPECT_EQ(m.num_free_pages(), 0);
  m.check_invariants();
}

TEST(KvCacheManager, ForkSharesPagesAndCopiesThePartialPageOnWrite) {
  const int64_t P = 4;
  KvCacheManager m(KvCacheConfig{P, 16});
  m.add(0);
  std::vector<PageCopy> copies;
  ASSERT_TRUE(m.grow(0, 10, &copies));  // pages: 2 full + 1 holding positions 8, 9
  const std::vector<int32_t> parent = m.block_table(0);
  m.fork(0, 1);
  m.fork(0, 2);
  EXPECT_EQ(m.block_table(1), parent);
  EXPECT_EQ(m.length(2), 10);
  for (int32_t p : parent) EXPECT_EQ(m.refcount(p), 3);
  EXPECT_EQ(m.num_free_pages(), 13);
  m.check_invariants();

  // Child 1 writes position 10 (inside the shared partial page): private copy of slots [0, 2).
  EXPECT_EQ(m.pages_needed(1, 11), 1);
  ASSERT_TRUE(m.grow(1, 11, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, parent[2]);
  EXPECT_EQ(copies[0].slots, 2);
  EXPECT_EQ(m.block_table(1)[2], copies[0].dst);
  EXPECT_NE(copies[0].dst, parent[2]);
  EXPECT_EQ(m.block_table(1)[0], parent[0]);  // whole pages stay shared
  EXPECT_EQ(m.refcount(parent[2]), 2);
  EXPECT_EQ(m.refcount(parent[0]), 3);

  // Child 2 grows past the page: still copies the partial page, then new pages.
  copies.clear();
  EXPECT_EQ(m.pages_needed(2, 17), 1 + 2);
  ASSERT_TRUE(m.grow(2, 17, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(m.block_table(2).size(), 5u);

  // The parent is now the only holder of its partial page: writes go in place.
  copies.clear();
  EXPECT_EQ(m.refcount(parent[2]), 1);
  ASSERT_TRUE(m.grow(0, 12, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(m.block_table(0), parent);
  m.check_invariants();

  m.free(0);
  EXPECT_EQ(m.refcount(parent[0]), 2);
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.num_free_pages(), 16);
  m.check_invariants();
}

TEST(KvCacheManager, PageAlignedForkNeedsNoCopy) {
  KvCacheManager m(KvCacheConfig{3, 8});
  m.add(0);
  std::vector<PageCopy> copies;
  ASSERT_TRUE(m.grow(0, 6, &copies));
  m.fork(0, 1);
  EXPECT_EQ(m.pages_needed(1, 7), 1);
  ASSERT_TRUE(m.grow(1, 7, &copies));
  EXPECT_TRUE(copies.empty());
  m.check_invariants();
}

TEST(KvCacheManager, CopyOnWriteCanFailForLackOfPages) {
  KvCacheManager m(KvCacheConfig{4, 2});
  m.add(0);
  std::vector<PageCopy> copies;
  ASSERT_TRUE(m.grow(0, 6, &copies));  // both pages
  m.fork(0, 1);
  EXPECT_EQ(m.pages_needed(1, 7), 1);
  EXPECT_FALSE(m.grow(1, 7, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(m.length(1), 6);
  m.free(0);  // now child 1 is the only holder: no copy needed
  EXPECT_EQ(m.pages_needed(1, 7), 0);
  ASSERT_TRUE(m.grow(1, 7, &copies));
  EXPECT_TRUE(copies.empty());
  m.check_invariants();
}

TEST(KvCacheManager, UnknownAndDuplicateSequencesAreErrors) {
  KvCacheManager m(KvCacheConfig{4, 4});
  m.add(3);
  EXPECT_NE(error_of([&] { m.add(3); }).find("already holds KV"), std::string::npos);
  EXPECT_NE(error_of([&] { m.length(9); }).find("unknown sequence 9"), std::string::npos);
  EXPECT_NE(error_of([&] { m.fork(9, 10); }).find("unknown sequence 9"), std::string::npos);
  EXPECT_NE(error_of([&] { m.fork(3, 3); }).find("already holds KV"), std::string::npos);
  EXPECT_NE(error_of([&] { m.free(9); }).find("unknown sequence"), std::string::npos);
}

// Random operations against a shadow model of the refcounts; invariants after each.
TEST(KvCacheManager, RandomOperationsKeepInvariants) {
  auto g = test::rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t P = 1 + int64_t(g() % 5), NP = 4 + int64_t(g() % 20);
    KvCacheManager m(KvCacheConfig{P, NP});
    std::vector<int64_t> live;
    int64_t next_id = 0;
    std::vector<PageCopy> copies;
    for (int op = 0; op < 300; ++op) {
      const int kind = int(g() % 4);
      if (kind == 0 || live.empty()) {
        m.add(next_id);
        live.push_back(next_id++);
      } else if (kind == 1) {
        const int64_t s = live[g() % live.size()];
        const int64_t len = m.length(s) + 1 + int64_t(g() % (2 * P));
        const int64_t free_before = m.num_free_pages(), need = m.pages_needed(s, len);
        const bool ok = m.grow(s, len, &copies);
        EXPECT_EQ(ok, need <= free_before);
        if (ok) {
          EXPECT_EQ(m.num_free_pages(), free_before - need);
        }
      } else if (kind == 2) {
        const int64_t s = live[g() % live.size()];
        m.fork(s, next_id);
        live.push_back(next_id++);
      } else {
        const size_t i = g() % live.size();
        m.free(live[i]);
        live.erase(live.begin() + int64_t(i));
      }
      m.check_invariants();
    }
    for (int64_t s : live) m.free(s);
    EXPECT_EQ(m.num_free_pages(), NP);
  }
}

}  // namespace
}  // namespace lockstep::engine
