// Helpers for the communicator tests that run on both transports (test_dist.cc) and on processes
// only (test_dist_process.cc): memory the ranks share with the test (MAP_SHARED, mapped before
// the ranks fork, so what a rank process writes there the test reads after it has ended), and the
// transport as a test parameter. A rank's body reports a failed check by throwing, never with
// EXPECT_* (in a child process that would be lost).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/process_transport.h"
#include "dist/thread_transport.h"
#include "util/test_util.h"

namespace lockstep::test {

// A CPU tensor over shared anonymous memory (threads see it as any memory).
inline Tensor shared_tensor(DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = std::max<size_t>(size_t(n * dtype_size(dtype)), 1);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error("shared_tensor: mmap failed");
  std::shared_ptr<void> storage(p, [bytes](void* q) { ::munmap(q, bytes); });
  return Tensor::adopt(dtype, std::move(shape), std::move(storage), Device::kCPU);
}
inline Tensor shared_poisoned(DType dtype, std::vector<int64_t> shape) {
  Tensor t = shared_tensor(dtype, std::move(shape));
  poison(t.data(), t.nbytes());
  return t;
}

// An int every rank and the test see (an atomic in shared memory).
class SharedCounter {
 public:
  SharedCounter() : t_(shared_tensor(DType::kI32, {1})) { *t_.ptr<int32_t>() = 0; }
  int add(int v = 1) { return ref().fetch_add(v) + v; }
  int get() const { return ref().load(); }
  // Returns once the count reaches `value` or after `bound` (a hang's stand-in in a rank body).
  void wait_for(int value, std::chrono::seconds bound = std::chrono::seconds(60)) const {
    const auto end = std::chrono::steady_clock::now() + bound;
    while (get() < value && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

 private:
  std::atomic_ref<int32_t> ref() const { return std::atomic_ref<int32_t>(*t_.ptr<int32_t>()); }
  Tensor t_;
};

// One string a rank (each its own index), read by the test afterwards.
class SharedStrings {
 public:
  static constexpr int64_t kBytes = 4096;
  explicit SharedStrings(int n) : n_(n), t_(shared_tensor(DType::kU8, {n, kBytes})) {
    std::memset(t_.data(), 0, size_t(t_.nbytes()));
  }
  void set(int i, const std::string& s) {
    const size_t len = std::min(s.size(), size_t(kBytes - 1));
    std::memcpy(at(i), s.data(), len);
    at(i)[len] = '\0';
  }
  std::vector<std::string> all() const {
    std::vector<std::string> v;
    for (int i = 0; i < n_; ++i) v.emplace_back(at(i));
    return v;
  }

 private:
  char* at(int i) const { return t_.ptr<char>() + i * kBytes; }
  int n_;
  Tensor t_;
};

// Throws lockstep::Error (what = bitwise_equal's message) unless a and b hold the same bits.
inline void require_bitwise_equal(const void* a, const void* b, int64_t n, DType t,
                                  const std::string& what) {
  const ::testing::AssertionResult r = bitwise_equal(a, b, n, t);
  if (!r) throw Error(what + ": " + r.message());
}

enum class Transport { kThreads, kProcesses };

inline std::string transport_name(Transport t) {
  return t == Transport::kThreads ? "threads" : "processes";
}

// run_ranks or run_rank_processes.
inline void run_on(Transport t, int n, const std::function<void(dist::Communicator&)>& body,
                   const dist::CommOptions& options = {}) {
  if (t == Transport::kThreads)
    dist::run_ranks(n, body, options);
  else
    dist::run_rank_processes(n, body, options);
}

inline dist::CommOptions timeout_ms(int ms) {
  dist::CommOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace lockstep::test
