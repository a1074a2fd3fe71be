// Paged KV-cache bookkeeping for the rollout engine: a fixed pool of pages, one block table per
// sequence, a free list and per-page reference counts. Pure integer bookkeeping: where a key lives
// never changes a bit of any result (attention reads by absolute position, contract A.1), so
// every placement/sharing/preemption choice here is free of numerics.
//
// Prefix sharing (GRPO groups) — the choice made: a forked sequence shares ALL of its parent's
// pages, including the partially filled last one; the first write into a shared page copies it
// (copy-on-write of the partial page: slots [0, len % P) of every layer's K and V, exact bf16
// copies). Whole pages stay shared for the group's lifetime.
//
// KvCacheStorage holds the pages themselves, allocated through the OpsBackend on its device.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/backend.h"
#include "lockstep/tensor.h"

namespace lockstep::engine {

// Dimension names: NP pages in the pool, P keys per page.
struct KvCacheConfig {
  int64_t page_size = 16;   // P >= 1
  int64_t num_pages = 256;  // NP >= 1

  void validate() const;          // throws lockstep::Error
  std::string to_string() const;  // "kv: page_size=16 num_pages=256"
  // Pages holding positions [0, tokens).
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size - 1) / page_size; }
};

// A fixed pool of page ids [0, NP) with reference counts. Free pages live on a LIFO free list
// (initially NP-1 .. 0 so that page 0 is handed out first).
class PageAllocator {
 public:
  explicit PageAllocator(int64_t num_pages);

  int64_t num_pages() const { return int64_t(refcount_.size()); }
  int64_t num_free() const { return int64_t(free_.size()); }
  // Takes a free page (refcount 1). Error when none is free.
  int32_t allocate();
  // Adds a reference to a page in use. Error for a free page or an id out of range.
  void retain(int32_t page);
  // Drops a reference; the page returns to the free list at 0. Error for a free page.
  void release(int32_t page);
  int32_t refcount(int32_t page) const;  // 0 = free

 private:
  void check_id(int32_t page, const char* what) const;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;
};

// Copy slots [0, slots) of page `src` into page `dst`, for every layer's K and V. The engine
// performs a step's copies in order, before the step's forward pass writes any key.
struct PageCopy {
  int32_t src = -1;
  int32_t dst = -1;
  int64_t slots = 0;
};

// Block tables of the sequences that hold KV. A sequence's `length` is the number of positions
// with a reserved slot (positions [0, length)); position j lives in page table[j / P], slot j % P.
class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  int64_t num_free_pages() const { return alloc_.num_free(); }
  int32_t refcount(int32_t page) const { return alloc_.refcount(page); }
  int64_t num_sequences() const { return int64_t(seqs_.size()); }

  bool has(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Registers a sequence with no pages (length 0). Error if it exists.
  void add(int64_t seq);
  int64_t length(int64_t seq) const;
  const std::vector<int32_t>& block_table(int64_t seq) const;

  // Free pages that grow(seq, new_len) would take: new pages past the table, plus one for the
  // copy of a shared, partially filled last page that the growth writes into.
  int64_t pages_needed(int64_t seq, int64_t new_len) const;
  // Reserves slots for positions [length, new_len). If the page holding position `length` is
  // shared (refcount > 1) and partially filled, it is replaced by a private copy (appended to
  // *copies). Returns false and changes nothing when the pool lacks pages.
  bool grow(int64_t seq, int64_t new_len, std::vector<PageCopy>* copies);
  // Registers `child` holding every page of `parent` (refcounts + 1), same length.
  void fork(int64_t parent, int64_t child);
  // Releases every page of `seq` and forgets it.
  void free(int64_t seq);

  // Throws Error unless every page's refcount equals the number of block-table entries naming it
  // and the free pages are exactly those with refcount 0 (tests).
  void check_invariants() const;

 private:
  struct Seq {
    std::vector<int32_t> table;
    int64_t length = 0;
  };
  const Seq& get(int64_t seq) const;
  Seq& get(int64_t seq);

  KvCacheConfig cfg_;
  PageAllocator alloc_;
  std::unordered_map<int64_t, Seq> seqs_;
};

// The pool's storage: per layer K and V [NP, P, Hkv, D] bf16 on the backend's device. Filled with
// NaN (0xFFFF) at creation so a read of a slot nobody wrote poisons the result instead of passing
// silently.
class KvCacheStorage {
 public:
  KvCacheStorage(const OpsBackend& ops, int64_t layers, int64_t kv_heads, int64_t head_dim,
                 const KvCacheConfig& cfg);

  std::vector<TensorView> k_views() const;
  std::vector<TensorView> v_views() const;
  // Performs the copies in order (every layer's K and V): exact bytes, ordered on the device
  // before any later op of the backend.
  void copy_pages(const std::vector<PageCopy>& copies) const;
  int64_t bytes() const;  // device bytes of all pages

 private:
  const OpsBackend& ops_;
  KvCacheConfig cfg_;
  std::vector<Tensor> k_, v_;
};

}  // namespace lockstep::engine
