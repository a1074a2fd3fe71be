// Paged KV-cache bookkeeping: page pool with refcounts, block tables, copy-on-write of a shared
// partial page. Integer bookkeeping only; see kv_cache.h.
#include "engine/kv_cache.h"

#include <cstring>
#include <sstream>

#include "lockstep/error.h"

namespace lockstep::engine {

void KvCacheConfig::validate() const {
  LS_CHECK(page_size >= 1 && page_size <= (1 << 20), "KvCacheConfig",
           "page_size must be in [1, 2^20], got ", page_size);
  LS_CHECK(num_pages >= 1 && num_pages <= (int64_t(1) << 30), "KvCacheConfig",
           "num_pages must be in [1, 2^30], got ", num_pages);
}

std::string KvCacheConfig::to_string() const {
  std::ostringstream os;
  os << "kv: page_size=" << page_size << " num_pages=" << num_pages;
  return os.str();
}

PageAllocator::PageAllocator(int64_t num_pages) {
  LS_CHECK(num_pages >= 1 && num_pages <= (int64_t(1) << 30), "PageAllocator",
           "num_pages must be in [1, 2^30], got ", num_pages);
  refcount_.assign(size_t(num_pages), 0);
  free_.reserve(size_t(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

void PageAllocator::check_id(int32_t page, const char* what) const {
  LS_CHECK(page >= 0 && page < num_pages(), "PageAllocator", what, ": page ", page,
           " out of range [0, ", num_pages(), ")");
}

int32_t PageAllocator::allocate() {
  LS_CHECK(!free_.empty(), "PageAllocator", "allocate: all ", num_pages(), " pages are in use");
  int32_t p = free_.back();
  free_.pop_back();
  refcount_[size_t(p)] = 1;
  return p;
}

void PageAllocator::retain(int32_t page) {
  check_id(page, "retain");
  LS_CHECK(refcount_[size_t(page)] > 0, "PageAllocator", "retain: page ", page, " is free");
  ++refcount_[size_t(page)];
}

void PageAllocator::release(int32_t page) {
  check_id(page, "release");
  LS_CHECK(refcount_[size_t(page)] > 0, "PageAllocator", "release: page ", page,
           " is already free");
  if (--refcount_[size_t(page)] == 0) free_.push_back(page);
}

int32_t PageAllocator::refcount(int32_t page) const {
  check_id(page, "refcount");
  return refcount_[size_t(page)];
}

KvCacheManager::KvCacheManager(const KvCacheConfig& cfg)
    : cfg_((cfg.validate(), cfg)), alloc_(cfg.num_pages) {}

const KvCacheManager::Seq& KvCacheManager::get(int64_t seq) const {
  auto it = seqs_.find(seq);
  LS_CHECK(it != seqs_.end(), "KvCacheManager", "unknown sequence ", seq);
  return it->second;
}
KvCacheManager::Seq& KvCacheManager::get(int64_t seq) {
  auto it = seqs_.find(seq);
  LS_CHECK(it != seqs_.end(), "KvCacheManager", "unknown sequence ", seq);
  return it->second;
}

void KvCacheManager::add(int64_t seq) {
  LS_CHECK(!has(seq), "KvCacheManager", "sequence ", seq, " already holds KV");
  seqs_.emplace(seq, Seq{});
}

int64_t KvCacheManager::length(int64_t seq) const { return get(seq).length; }

const std::vector<int32_t>& KvCacheManager::block_table(int64_t seq) const {
  return get(seq).table;
}

int64_t KvCacheManager::pages_needed(int64_t seq, int64_t new_len) const {
  const Seq& s = get(seq);
  if (new_len <= s.length) return 0;
  const int64_t P = cfg_.page_size;
  int64_t need = cfg_.pages_for(new_len) - int64_t(s.table.size());
  // The growth writes position s.length; if that lies inside an existing shared page, copy it.
  if (s.length % P != 0 && alloc_.refcount(s.table[size_t(s.length / P)]) > 1) ++need;
  return need;
}

bool KvCacheManager::grow(int64_t seq, int64_t new_len, std::vector<PageCopy>* copies) {
  Seq& s = get(seq);
  if (new_len <= s.length) return true;
  if (pages_needed(seq, new_len) > alloc_.num_free()) return false;
  const int64_t P = cfg_.page_size;
  if (s.length % P != 0) {
    int32_t& last = s.table[size_t(s.length / P)];
    if (alloc_.refcount(last) > 1) {
      int32_t copy = alloc_.allocate();
      copies->push_back(PageCopy{last, copy, s.length % P});
      alloc_.release(last);
      last = copy;
    }
  }
  while (int64_t(s.table.size()) < cfg_.pages_for(new_len)) s.table.push_back(alloc_.allocate());
  s.length = new_len;
  return true;
}

void KvCacheManager::fork(int64_t parent, int64_t child) {
  LS_CHECK(!has(child), "KvCacheManager", "fork: sequence ", child, " already holds KV");
  Seq copy = get(parent);
  for (int32_t p : copy.table) alloc_.retain(p);
  seqs_.emplace(child, std::move(copy));
}

void KvCacheManager::free(int64_t seq) {
  Seq& s = get(seq);
  // Release in reverse so that a sequence's pages return to the LIFO free list in table order.
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) alloc_.release(*it);
  seqs_.erase(seq);
}

void KvCacheManager::check_invariants() const {
  std::vector<int32_t> refs(size_t(alloc_.num_pages()), 0);
  for (const auto& [id, s] : seqs_) {
    LS_CHECK(int64_t(s.table.size()) == cfg_.pages_for(s.length), "KvCacheManager", "sequence ", id,
             " has ", s.table.size(), " pages for length ", s.length);
    for (int32_t p : s.table) {
      LS_CHECK(p >= 0 && p < alloc_.num_pages(), "KvCacheManager", "sequence ", id, " names page ",
               p, " out of range");
      ++refs[size_t(p)];
    }
  }
  int64_t free_count = 0;
  for (int64_t p = 0; p < alloc_.num_pages(); ++p) {
    LS_CHECK(refs[size_t(p)] == alloc_.refcount(int32_t(p)), "KvCacheManager", "page ", p,
             " has refcount ", alloc_.refcount(int32_t(p)), " but ", refs[size_t(p)],
             " block-table references");
    free_count += refs[size_t(p)] == 0;
  }
  LS_CHECK(free_count == alloc_.num_free(), "KvCacheManager", free_count,
           " pages unreferenced but the free list holds ", alloc_.num_free());
}

KvCacheStorage::KvCacheStorage(const OpsBackend& ops, int64_t layers, int64_t kv_heads,
                               int64_t head_dim, const KvCacheConfig& cfg)
    : ops_(ops), cfg_((cfg.validate(), cfg)) {
  const std::vector<int64_t> shape = {cfg.num_pages, cfg.page_size, kv_heads, head_dim};
  for (int64_t l = 0; l < layers; ++l) {
    k_.push_back(ops.empty(DType::kBF16, shape));
    v_.push_back(ops.empty(DType::kBF16, shape));
  }
  if (layers == 0) return;
  if (ops.device() == Device::kCPU) {
    for (auto* list : {&k_, &v_})
      for (Tensor& t : *list) std::memset(t.data(), 0xFF, size_t(t.nbytes()));
    return;
  }
  // Device: one upload of a NaN-filled host layer, then device-to-device copies.
  Tensor nan(DType::kBF16, shape);
  std::memset(nan.data(), 0xFF, size_t(nan.nbytes()));
  ops.copy(k_[0].view(), nan.view());
  for (auto* list : {&k_, &v_})
    for (Tensor& t : *list)
      if (&t != &k_[0]) ops.copy(t.view(), k_[0].view());
  ops.synchronize();
}

std::vector<TensorView> KvCacheStorage::k_views() const {
  std::vector<TensorView> out;
  for (const Tensor& t : k_) out.push_back(t.view());
  return out;
}

std::vector<TensorView> KvCacheStorage::v_views() const {
  std::vector<TensorView> out;
  for (const Tensor& t : v_) out.push_back(t.view());
  return out;
}

void KvCacheStorage::copy_pages(const std::vector<PageCopy>& copies) const {
  for (const PageCopy& c : copies) {
    LS_CHECK(c.src >= 0 && c.src < cfg_.num_pages && c.dst >= 0 && c.dst < cfg_.num_pages &&
                 c.src != c.dst && c.slots >= 0 && c.slots <= cfg_.page_size,
             "KvCacheStorage", "bad page copy: src ", c.src, " dst ", c.dst, " slots ", c.slots);
    if (c.slots == 0) continue;
    for (auto* list : {&k_, &v_})
      for (const Tensor& t : *list) {
        // Slots [0, slots) of a page: one contiguous run of slots·Hkv·D elements.
        const int64_t row = t.shape()[2] * t.shape()[3];
        const TensorView page_rows = TensorView::contiguous(
            t.data(), DType::kBF16, {cfg_.num_pages * cfg_.page_size, row}, t.device());
        ops_.copy(page_rows.rows(c.dst * cfg_.page_size, c.dst * cfg_.page_size + c.slots),
                  page_rows.rows(c.src * cfg_.page_size, c.src * cfg_.page_size + c.slots));
      }
  }
}

int64_t KvCacheStorage::bytes() const {
  int64_t b = 0;
  for (auto* list : {&k_, &v_})
    for (const Tensor& t : *list) b += t.nbytes();
  return b;
}

}  // namespace lockstep::engine
