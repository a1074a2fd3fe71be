// Persistent fork-join pool: workers sleep on a condition variable between calls.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "lockstep/error.h"

namespace lockstep {
namespace {

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return int(workers_.size()) + 1; }

  void resize(int n) {
    stop();
    stopping_ = false;
    for (int i = 0; i + 1 < n; ++i) workers_.emplace_back([this] { loop(); });
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    int64_t tasks = std::min<int64_t>(size(), (n + grain - 1) / std::max<int64_t>(grain, 1));
    if (tasks <= 1 || in_pool_) {
      fn(0, n);
      return;
    }
    std::unique_lock<std::mutex> call_lock(call_mutex_);
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = &fn;
      n_ = n;
      tasks_ = tasks;
      next_.store(0);
      pending_ = tasks;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [this] { return pending_ == 0 && active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    in_pool_ = true;
    for (;;) {
      int64_t t = next_.fetch_add(1);
      if (t >= tasks_) break;
      int64_t begin = n_ * t / tasks_, end = n_ * (t + 1) / tasks_;
      try {
        (*fn_)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(m_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
    in_pool_ = false;
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        if (fn_ == nullptr) continue;
        ++active_;
      }
      work();
      std::lock_guard<std::mutex> lk(m_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex m_, call_mutex_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, tasks_ = 0, pending_ = 0, active_ = 0;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  static thread_local bool in_pool_;
};

thread_local bool Pool::in_pool_ = false;

Pool& pool() {
  static Pool p(std::max(1u, std::thread::hardware_concurrency()));
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  LS_CHECK(n >= 1, "set_num_threads", "expected n >= 1, got ", n);
  if (n != pool().size()) pool().resize(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  pool().run(n, grain, fn);
}

}  // namespace lockstep
