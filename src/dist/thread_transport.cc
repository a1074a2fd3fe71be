// The thread transport (thread_transport.h). A collective is one or two rendezvous of all ranks on
// the group's mutex: at the first, each rank posts its CollectiveCall and the last to arrive
// checks that the calls agree and snapshots them; then each rank copies what it receives straight
// from the senders' views; at the second, no rank leaves (and may free or rewrite its send
// buffer) before every rank has finished reading it.
#include "dist/thread_transport.h"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/collective.h"

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

// The state the n ranks share. Every member below the mutex is guarded by it.
class Group {
 public:
  Group(int n, const CommOptions& options)
      : n_(n), options_(options), calls_(size_t(n)), arrived_(size_t(n)), exited_(size_t(n)) {}
  int size() const { return n_; }
  const CommOptions& options() const { return options_; }

  // All ranks' calls as posted at the last completed first rendezvous; stable until the next one
  // completes, which needs the caller too.
  const std::vector<CollectiveCall>& snapshot() const { return snapshot_; }

  // First rendezvous of a collective: posts `call`, returns when every rank has posted its own,
  // throws lockstep::Error when the job has failed, a rank it waits for has returned, the calls
  // disagree, or the deadline passes.
  void arrive(int rank, const CollectiveCall& call, Clock::time_point deadline) {
    const char* op = collective_name(call.op);
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_rank_ >= 0) throw_failed(op, rank);
    const uint64_t gen = generation_;
    calls_[size_t(rank)] = call;
    arrived_[size_t(rank)] = 1;
    if (++count_ == n_) {
      snapshot_ = calls_;
      verdict_.clear();
      try {
        check_agree(snapshot_);
      } catch (const Error& e) {
        verdict_ = e.what();
        fail_locked(rank, verdict_);
      }
      complete();
    } else {
      const bool woken = cv_.wait_until(lock, deadline, [&] {
        return generation_ != gen || failed_rank_ >= 0 ||
               missing_and_exited(arrived_, exited_) >= 0;
      });
      if (generation_ == gen) {
        if (failed_rank_ >= 0) throw_failed(op, rank);
        const int returned = woken ? missing_and_exited(arrived_, exited_) : -1;
        const std::string msg = returned >= 0
                                    ? returned_message(op, rank, returned)
                                    : timeout_message(op, rank, options_.timeout, arrived_);
        fail_locked(rank, msg);
        throw Error(msg);
      }
    }
    if (!verdict_.empty()) throw Error(verdict_);
  }

  // Second rendezvous: every rank has finished reading the others' views. It cannot fail (all
  // ranks passed the first one and copying cannot throw), so it has no timeout.
  void depart() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++count_ == n_) {
      complete();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

  // A rank's body ended: with an error (`what` set) it fails the job.
  void exit(int rank, const std::string* what) {
    std::lock_guard<std::mutex> lock(mu_);
    exited_[size_t(rank)] = 1;
    if (what != nullptr) fail_locked(rank, *what);
    cv_.notify_all();
  }

  // Fails the job (the first failure is the one every later call reports).
  void fail(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(rank, what);
  }

  int failed_rank() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_rank_;
  }

 private:
  void complete() {
    count_ = 0;
    arrived_.assign(size_t(n_), 0);
    ++generation_;
    cv_.notify_all();
  }
  void fail_locked(int rank, const std::string& what) {
    if (failed_rank_ < 0) {
      failed_rank_ = rank;
      failed_what_ = what;
    }
    cv_.notify_all();
  }
  [[noreturn]] void throw_failed(const char* op, int rank) const {
    throw Error(
        detail::concat(op, ": rank ", rank, ": rank ", failed_rank_, " failed: ", failed_what_));
  }

  const int n_;
  const CommOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // completed rendezvous
  int count_ = 0;            // ranks arrived at the current one
  std::vector<CollectiveCall> calls_, snapshot_;
  std::string verdict_;                    // check_agree's error on snapshot_, or empty
  std::vector<uint8_t> arrived_, exited_;  // one flag a rank (collective.h)
  int failed_rank_ = -1;
  std::string failed_what_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(Group& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  const CommOptions& options() const override { return group_.options(); }

  void all_gather(const TensorView& send, const TensorView& recv) override {
    const Clock::time_point deadline = Clock::now() + options().timeout;
    run(CollectiveCall{CollectiveOp::kAllGather, send, recv, 0}, deadline, [&] {
      const int64_t n = view_bytes(send);
      auto* out = static_cast<char*>(recv.data);
      for (int r = 0; r < size(); ++r) {
        const void* src = group_.snapshot()[size_t(r)].send.data;
        if (n > 0 && src != out + r * n) std::memcpy(out + r * n, src, size_t(n));
      }
    });
  }

  void broadcast(const TensorView& buf, int root) override {
    const Clock::time_point deadline = Clock::now() + options().timeout;
    run(CollectiveCall{CollectiveOp::kBroadcast, buf, TensorView{}, root}, deadline, [&] {
      const int64_t n = view_bytes(buf);
      if (rank_ != root && n > 0)
        std::memcpy(buf.data, group_.snapshot()[size_t(root)].send.data, size_t(n));
    });
  }

  void barrier() override {
    const Clock::time_point deadline = Clock::now() + options().timeout;
    group_.arrive(rank_, CollectiveCall{}, deadline);
  }

 private:
  template <typename Copy>
  void run(const CollectiveCall& call, Clock::time_point deadline, const Copy& copy) {
    try {
      check_local(call, rank_, size(), Device::kCPU, "thread");
    } catch (const Error& e) {
      group_.fail(rank_, e.what());  // the other ranks must not wait for this call
      throw;
    }
    group_.arrive(rank_, call, deadline);
    copy();
    group_.depart();
  }

  Group& group_;
  const int rank_;
};

}  // namespace

void run_ranks(int n, const std::function<void(Communicator&)>& body, const CommOptions& options) {
  LS_CHECK(n >= 1, "run_ranks", "n: expected >= 1 ranks, got ", n);
  options.validate();
  Group group(n, options);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  auto rank_main = [&](int r) {
    ThreadCommunicator comm(group, r);
    try {
      body(comm);
      group.exit(r, nullptr);
    } catch (const std::exception& e) {
      errors[size_t(r)] = std::current_exception();
      const std::string what = e.what();
      group.exit(r, &what);
    } catch (...) {
      errors[size_t(r)] = std::current_exception();
      const std::string what = "unknown exception";
      group.exit(r, &what);
    }
  };
  try {
    for (int r = 0; r < n; ++r) threads.emplace_back(rank_main, r);
  } catch (...) {
    // Could not start every thread: the ranks that started see rank `threads.size()` fail.
    const std::string what = "could not start its thread";
    group.exit(int(threads.size()), &what);
    for (std::thread& t : threads) t.join();
    throw;
  }
  for (std::thread& t : threads) t.join();
  const int first = group.failed_rank();
  if (first >= 0 && errors[size_t(first)]) std::rethrow_exception(errors[size_t(first)]);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace lockstep::dist
