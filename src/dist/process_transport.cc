// The process transport (process_transport.h). The segment is
//   Header | joined[world] arrived[world] exited[world] (one byte a rank) | RankState[world] |
//   world slots of slot_bytes
// Everything in it is guarded by the header's robust mutex except the futex word `wake` (atomic)
// and the slots: between two rendezvous a slot belongs to its rank (staging) or to every reader.
// A collective is, per chunk, two rendezvous: each rank stages its chunk, meets the others (at the
// first chunk it posts its call and the last to arrive checks that the calls agree), copies what
// it receives out of the slots, and meets them again, so no slot is refilled before everyone has
// read it. A rank that waits sleeps on `wake` in short slices and, between them, looks at the
// other ranks' processes: a dead rank wakes no one.
#include "dist/process_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <thread>
#include <utility>

#include "dist/collective.h"

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kMagic = 0x31706574736b636cull;  // "lckstep1": the creator has set everything up
constexpr size_t kTextBytes = 2048;                 // a failure text in the segment (cut beyond)
// How often a waiting rank looks at the other ranks' processes.
constexpr milliseconds kWatchSlice{20};
// How often a rank looks for rank 0's segment while joining.
constexpr milliseconds kOpenRetry{5};
// How long a rank waits for the segment's mutex beyond its call's deadline. The mutex is only held
// for short bookkeeping, so a rank whose deadline has passed still takes it (to fail the job with
// a clear message); only a holder that is stopped or hung makes this run out.
constexpr milliseconds kLockGrace{10'000};

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex word must be a plain 32-bit word");

struct Header {
  std::atomic<uint64_t> magic;  // kMagic once the fields below are set up (release / acquire)
  int32_t world;
  int64_t slot_bytes;
  uint64_t total_bytes;
  int32_t creator_pid;  // rank 0, to tell a stale segment of a dead job
  uint64_t creator_start;
  pthread_mutex_t mu;          // robust, process-shared
  std::atomic<uint32_t> wake;  // bumped, and its sleepers woken, at every change a waiter awaits
  // Guarded by mu:
  int32_t holder;            // the rank holding mu, or -1 (names a rank that died holding it)
  int32_t joined;            // ranks joined so far
  uint64_t generation;       // completed rendezvous
  int32_t count;             // ranks arrived at the current one
  int32_t failed;            // 1 once the job has failed
  char failure[kTextBytes];  // why: "rank 2 failed: ..." or "rank 2 (pid 123) died"
  char verdict[kTextBytes];  // check_agree's error at the last first rendezvous, or ""
};

// A call as the other ranks see it (its views' data pointers mean nothing to them).
struct CallDesc {
  int32_t op, dtype, ndim, root;
  int64_t shape[kMaxDims];
};

struct RankState {
  int32_t pid;          // 0 until the rank joins
  uint64_t start_time;  // process_start_time(pid): tells a reused pid
  CallDesc call;        // posted at a collective's first rendezvous
};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Where things are in a segment of `world` ranks.
struct Layout {
  size_t flags, ranks, slots, total;
  Layout(int world, int64_t slot_bytes) {
    flags = round_up(sizeof(Header), 64);
    ranks = round_up(flags + 3 * size_t(world), 64);
    slots = round_up(ranks + size_t(world) * sizeof(RankState), 4096);
    total = slots + size_t(world) * size_t(slot_bytes);
  }
};

// A MAP_SHARED mapping of a file, unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(int fd, size_t size, const std::string& what) : size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    LS_CHECK(p != MAP_FAILED, what, "mmap of ", size, " bytes: ", std::strerror(errno));
    base_ = static_cast<char*>(p);
  }
  Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), size_(o.size_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~Mapping() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  char* base() const { return base_; }
  Header& header() const { return *reinterpret_cast<Header*>(base_); }

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
};

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void copy_text(char (&dst)[kTextBytes], const std::string& s) {
  std::string t = s.size() < kTextBytes ? s : s.substr(0, kTextBytes - 4) + "...";
  std::memcpy(dst, t.c_str(), t.size() + 1);
}

timespec to_timespec(Clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  return timespec{time_t(ns / 1'000'000'000), long(ns % 1'000'000'000)};
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, Clock::duration d) {
  const timespec ts = to_timespec(std::max(d, Clock::duration::zero()));
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void bump(Header& h) {
  h.wake.fetch_add(1, std::memory_order_release);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&h.wake), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

bool read_proc_stat(pid_t pid, char* state, uint64_t* start) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  const Fd f(::open(path, O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) return false;
  char buf[1024];
  ssize_t n;
  do n = ::read(f.fd, buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  buf[n] = '\0';
  // "pid (comm) state ppid ... starttime(22) ...": comm may hold spaces and parentheses.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') return false;
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  *start = std::strtoull(p, nullptr, 10);
  return true;
}

std::string died_text(int rank, pid_t pid) {
  return detail::concat("rank ", rank, " (pid ", pid, ") died");
}
std::string failed_text(int rank, const std::string& what) {
  return detail::concat("rank ", rank, " failed: ", what);
}

CallDesc describe(const CollectiveCall& c) {
  CallDesc d{int32_t(c.op), int32_t(c.send.dtype), int32_t(c.send.ndim), int32_t(c.root), {}};
  std::copy(c.send.shape, c.send.shape + kMaxDims, d.shape);
  return d;
}

CollectiveCall call_of(const CallDesc& d) {
  CollectiveCall c;
  c.op = CollectiveOp(d.op);
  c.send.dtype = DType(d.dtype);
  c.send.ndim = d.ndim;
  std::copy(d.shape, d.shape + kMaxDims, c.send.shape);
  c.root = d.root;
  return c;
}

void sleep_until_at_most(Clock::time_point deadline, milliseconds nap) {
  std::this_thread::sleep_until(std::min(deadline, Clock::now() + nap));
}

// NOTE: a segment is a file of /dev/shm (where shm_open keeps them on Linux) so that rank 0 can
// set it up under a temporary name and link() it into place: under the job's name there is only
// ever a whole segment, so a segment there whose rank 0 is gone is stale, never half-made.

// The header of the segment in file `fd`, mapped (nothing mapped when the file is too short).
Mapping map_header(int fd, const std::string& op) {
  struct stat st {};
  const bool whole = ::fstat(fd, &st) == 0 && size_t(st.st_size) >= sizeof(Header);
  return whole ? Mapping(fd, sizeof(Header), op) : Mapping();
}
// The segment's header when rank 0 has set it up and still runs, else nullptr (none, or stale).
const Header* live_header(const Mapping& m) {
  if (m.base() == nullptr) return nullptr;
  const Header& h = m.header();
  if (h.magic.load(std::memory_order_acquire) != kMagic) return nullptr;
  return process_running(h.creator_pid, h.creator_start) ? &h : nullptr;
}

// Unlinks a path (if any) when it goes out of scope.
struct UnlinkAtExit {
  std::string path;
  ~UnlinkAtExit() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

// Rank 0: a new segment for the job, replacing a stale one of a dead job of the same id. It is set
// up as a nameless file (O_TMPFILE; where /dev/shm lacks it, under a temporary name) and then
// linked under the job's name, so a rank 0 killed on the way leaves nothing behind.
Mapping create_segment(const ProcessGroupSpec& s, const Layout& l) {
  const std::string op = "join: rank 0", path = job_segment_path(s.job_id);
  UnlinkAtExit temp;
  int fd = ::open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    temp.path = path + ".new-" + make_job_id();
    fd = ::open(temp.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  }
  const Fd f(fd);
  LS_CHECK(f.fd >= 0, op, "creating the job's segment in /dev/shm: ", std::strerror(errno));
  auto check = [&](int err, const std::string& what) {
    LS_CHECK(err == 0, op, what, ": ", std::strerror(err));
  };
  check(::ftruncate(f.fd, off_t(l.total)) == 0 ? 0 : errno, "ftruncate");
  // Reserve the memory now: a full /dev/shm is an error here instead of a SIGBUS later.
  check(::posix_fallocate(f.fd, 0, off_t(l.total)),
        detail::concat("reserving the job's segment (", l.total, " bytes of /dev/shm)"));
  Mapping m(f.fd, l.total, op);
  Header* h = new (m.base()) Header{};
  h->world = s.world_size;
  h->slot_bytes = s.slot_bytes;
  h->total_bytes = l.total;
  h->creator_pid = ::getpid();
  h->creator_start = process_start_time(::getpid());
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(&h->mu, &attr);
  pthread_mutexattr_destroy(&attr);
  check(rc, "pthread_mutex_init");
  h->holder = -1;
  h->magic.store(kMagic, std::memory_order_release);
  const std::string self = "/proc/self/fd/" + std::to_string(f.fd);
  auto link_it = [&] {
    return temp.path.empty()
               ? ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW)
               : ::link(temp.path.c_str(), path.c_str());
  };
  for (int attempt = 0; link_it() != 0; ++attempt) {
    check(errno == EEXIST && attempt < 3 ? 0 : errno, "linking the job's segment to " + path);
    // The name is taken: by a live job (an error) or by a dead one's segment (replaced).
    const Fd old(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (old.fd >= 0) {
      const Mapping om = map_header(old.fd, op);
      if (const Header* oh = live_header(om))
        throw Error(detail::concat(op, ": job id '", s.job_id,
                                   "' is in use by a live job (its rank 0 is pid ", oh->creator_pid,
                                   "): give every job its own id"));
    }
    ::unlink(path.c_str());
  }
  return m;
}

// Ranks 1..: rank 0's segment (a stale one of a dead job is waited past: rank 0 replaces it).
Mapping open_segment(const ProcessGroupSpec& s, Clock::time_point deadline) {
  const std::string op = detail::concat("join: rank ", s.rank), path = job_segment_path(s.job_id);
  bool saw_stale = false;
  while (true) {
    const Fd f(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    LS_CHECK(f.fd >= 0 || errno == ENOENT, op, "opening ", path, ": ", std::strerror(errno));
    if (f.fd >= 0) {
      const Mapping m = map_header(f.fd, op);
      if (const Header* h = live_header(m))
        return Mapping(f.fd, h->total_bytes, op);  // join checks that it is this rank's job
      saw_stale = true;
    }
    if (Clock::now() >= deadline)
      throw Error(detail::concat(op, " timed out after ", s.join_timeout.count(),
                                 " ms waiting for rank 0 to create the job's segment ", path,
                                 saw_stale ? " (the one there is a stale one of a dead job)" : ""));
    sleep_until_at_most(deadline, kOpenRetry);
  }
}

class ShmCommunicator final : public ProcessCommunicator {
 public:
  explicit ShmCommunicator(const ProcessGroupSpec& s)
      : rank_(s.rank), world_(s.world_size), options_(s.options), slot_bytes_(s.slot_bytes) {
    const Clock::time_point deadline = Clock::now() + s.join_timeout;
    map_ = rank_ == 0 ? create_segment(s, Layout(world_, slot_bytes_)) : open_segment(s, deadline);
    // Where things are in the job's segment: join checks that this rank's spec matches it.
    const Layout l(header().world, header().slot_bytes);
    joined_ = reinterpret_cast<uint8_t*>(map_.base() + l.flags);
    arrived_ = joined_ + world_;
    exited_ = arrived_ + world_;
    ranks_ = reinterpret_cast<RankState*>(map_.base() + l.ranks);
    slots_ = map_.base() + l.slots;
    try {
      join(s, deadline);
    } catch (...) {
      remove_job_segment(s.job_id);  // the job has failed: no one else may join it
      throw;
    }
    uncaught_ = std::uncaught_exceptions();
  }

  ~ShmCommunicator() override {
    // Tell the others this rank has left (or, unwinding an exception, failed); never throws.
    try {
      Lock lock(*this, "close", Clock::now());
      if (std::uncaught_exceptions() > uncaught_)
        fail_locked(failed_text(rank_, "its communicator was closed by an exception"));
      exited_[rank_] = 1;
      bump(header());
    } catch (...) {
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const CommOptions& options() const override { return options_; }

  void fail(const std::string& what) override {
    try {
      Lock lock(*this, "fail", Clock::now());
      fail_locked(failed_text(rank_, what));
    } catch (...) {
    }
  }

  void all_gather(const TensorView& send, const TensorView& recv) override {
    const Clock::time_point deadline = Clock::now() + options_.timeout;
    const CollectiveCall call{CollectiveOp::kAllGather, send, recv, 0};
    check(call);
    const int64_t n = view_bytes(send);
    const auto* src = static_cast<const char*>(send.data);
    auto* out = static_cast<char*>(recv.data);
    chunked(
        call, deadline, n, slot_bytes_,
        [&](int64_t off, int64_t len) { std::memcpy(slot(rank_), src + off, size_t(len)); },
        [&](int64_t off, int64_t len) {
          for (int r = 0; r < world_; ++r) {
            const char* from = r == rank_ ? src + off : slot(r);
            char* to = out + r * n + off;
            if (from != to) std::memcpy(to, from, size_t(len));  // in place: already there
          }
        });
  }

  void broadcast(const TensorView& buf, int root) override {
    const Clock::time_point deadline = Clock::now() + options_.timeout;
    const CollectiveCall call{CollectiveOp::kBroadcast, buf, TensorView{}, root};
    check(call);
    auto* bytes = static_cast<char*>(buf.data);
    // One chunk fills every rank's slot: only the root stages.
    chunked(
        call, deadline, view_bytes(buf), world_ * slot_bytes_,
        [&](int64_t off, int64_t len) {
          if (rank_ == root) std::memcpy(slots_, bytes + off, size_t(len));
        },
        [&](int64_t off, int64_t len) {
          if (rank_ != root) std::memcpy(bytes + off, slots_, size_t(len));
        });
  }

  void barrier() override {
    const CollectiveCall call{};
    rendezvous(call, Clock::now() + options_.timeout, true);
  }

 private:
  // The segment's mutex, taken by the constructor and released by the destructor, waiting at most
  // kLockGrace past `deadline`. A rank that died holding it fails the job (EOWNERDEAD).
  class Lock {
   public:
    Lock(ShmCommunicator& c, const char* op, Clock::time_point deadline)
        : c_(c), op_(op), deadline_(deadline) {
      lock();
    }
    ~Lock() {
      if (held_) unlock();
    }
    void lock() {
      Header& h = c_.header();
      const Clock::time_point until = std::max(deadline_, Clock::now()) + kLockGrace;
      const timespec abs = to_timespec(until.time_since_epoch());
      const int rc = pthread_mutex_clocklock(&h.mu, CLOCK_MONOTONIC, &abs);
      if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&h.mu);
        held_ = true;
        c_.fail_locked(c_.dead_holder(h.holder));
      } else {
        LS_CHECK(rc != ETIMEDOUT, op_, "rank ", c_.rank_, " could not take the job's lock: rank ",
                 h.holder, " has held it for over ", kLockGrace.count(), " ms (stopped?)");
        LS_CHECK(rc == 0, op_, "rank ", c_.rank_, ": the job's lock: ", std::strerror(rc));
        held_ = true;
      }
      h.holder = c_.rank_;
    }
    void unlock() {
      c_.header().holder = -1;
      held_ = false;
      pthread_mutex_unlock(&c_.header().mu);
    }

   private:
    ShmCommunicator& c_;
    const char* op_;
    Clock::time_point deadline_;
    bool held_ = false;
  };

  Header& header() const { return map_.header(); }

  // Registers this rank and waits for every other one.
  void join(const ProcessGroupSpec& s, Clock::time_point deadline) {
    const char* op = "join";
    Header& h = header();
    Lock lock(*this, op, deadline);
    if (h.failed) throw_failed(op);
    const std::string mine = detail::concat(op, ": rank ", rank_, ": ");
    const std::string theirs =
        detail::concat(", but the job's rank 0 (pid ", h.creator_pid, ") has ");
    if (h.world != world_)
      fail_and_throw(detail::concat(mine, "world size ", world_, theirs, h.world));
    if (h.slot_bytes != slot_bytes_)
      fail_and_throw(detail::concat(mine, "slot_bytes ", slot_bytes_, theirs, h.slot_bytes));
    RankState& me = ranks_[rank_];
    if (me.pid != 0)
      fail_and_throw(detail::concat(op, ": rank ", rank_, ": rank ", rank_,
                                    " has already joined (pid ", me.pid,
                                    "): every process of a job needs its own RANK"));
    me.pid = ::getpid();
    me.start_time = process_start_time(me.pid);
    if (me.start_time == 0)
      fail_and_throw(detail::concat(mine,
                                    "cannot read /proc/self/stat (the ranks watch each "
                                    "other's processes through /proc)"));
    joined_[rank_] = 1;
    if (++h.joined == world_) remove_job_segment(s.job_id);  // every rank has it mapped
    bump(h);
    await(lock, op, deadline, s.join_timeout, joined_, [&] { return h.joined == world_; });
  }
  char* slot(int r) const { return slots_ + size_t(r) * size_t(slot_bytes_); }

  // Why the job fails when the lock's holder died: it set `holder`, unless it died right after
  // taking the lock; then the first rank whose process is gone (the kernel hands the lock on
  // while the dead process is still exiting: give /proc a moment to show it).
  std::string dead_holder(int holder) const {
    const int world = header().world;  // the segment's (a joining rank's may differ)
    if (holder >= 0 && holder < world) return died_text(holder, ranks_[holder].pid);
    for (int tries = 0; tries < 2000; ++tries) {
      for (int r = 0; r < world; ++r)
        if (ranks_[r].pid != 0 && !process_running(ranks_[r].pid, ranks_[r].start_time))
          return died_text(r, ranks_[r].pid);
      std::this_thread::sleep_for(milliseconds(1));
    }
    return "a rank died holding the job's lock";
  }

  void fail_locked(const std::string& reason) {
    Header& h = header();
    if (!h.failed) {
      h.failed = 1;
      copy_text(h.failure, reason);
    }
    bump(h);
  }
  [[noreturn]] void throw_failed(const char* op) const {
    throw Error(detail::concat(op, ": rank ", rank_, ": ", header().failure));
  }
  [[noreturn]] void fail_and_throw(const std::string& msg) {
    fail_locked(failed_text(rank_, msg));
    throw Error(msg);
  }

  void check(const CollectiveCall& call) {
    try {
      check_local(call, rank_, world_, Device::kCPU, "process");
    } catch (const Error& e) {
      fail(e.what());  // the other ranks must not wait for this call
      throw;
    }
  }

  // With the lock held, waits until done() (checked with the lock held). Throws, failing the job,
  // when it has failed meanwhile, a rank not `present` has left, a rank that joined has died, or
  // the deadline passes. Sleeps on the futex word with the lock released.
  template <typename Done>
  void await(Lock& lock, const char* op, Clock::time_point deadline, milliseconds timeout,
             const uint8_t* present, const Done& done) {
    Header& h = header();
    Clock::time_point watched = Clock::now();
    while (!done()) {
      if (h.failed) throw_failed(op);
      const Clock::time_point now = Clock::now();
      if (now - watched >= kWatchSlice) {
        watched = now;
        for (int r = 0; r < world_; ++r) {
          if (r == rank_) continue;
          if (exited_[r]) {
            if (!present[r]) fail_and_throw(returned_message(op, rank_, r));
          } else if (ranks_[r].pid != 0 && !process_running(ranks_[r].pid, ranks_[r].start_time)) {
            const std::string why = died_text(r, ranks_[r].pid);
            fail_locked(why);
            throw Error(detail::concat(op, ": rank ", rank_, ": ", why));
          }
        }
      }
      if (now >= deadline)
        fail_and_throw(timeout_message(op, rank_, timeout, {present, size_t(world_)}));
      const uint32_t seen = h.wake.load(std::memory_order_acquire);
      lock.unlock();
      futex_wait(h.wake, seen, std::min<Clock::duration>(kWatchSlice, deadline - now));
      lock.lock();
    }
  }

  // Every rank meets here; `post`: the first rendezvous of `call` (it is posted, and the last to
  // arrive checks that all ranks' calls agree).
  void rendezvous(const CollectiveCall& call, Clock::time_point deadline, bool post) {
    const char* op = collective_name(call.op);
    Header& h = header();
    Lock lock(*this, op, deadline);
    if (h.failed) throw_failed(op);
    const uint64_t gen = h.generation;
    if (post) ranks_[rank_].call = describe(call);
    arrived_[rank_] = 1;
    if (++h.count == world_) {
      h.verdict[0] = '\0';
      if (post) {
        std::vector<CollectiveCall> calls;
        for (int r = 0; r < world_; ++r) calls.push_back(call_of(ranks_[r].call));
        try {
          check_agree(calls);
        } catch (const Error& e) {
          copy_text(h.verdict, e.what());
          fail_locked(failed_text(rank_, e.what()));
        }
      }
      h.count = 0;
      std::fill(arrived_, arrived_ + world_, 0);
      ++h.generation;
      bump(h);
    } else {
      await(lock, op, deadline, options_.timeout, arrived_, [&] { return h.generation != gen; });
    }
    if (h.verdict[0] != '\0') throw Error(h.verdict);
  }

  // A collective of `total` bytes in chunks of at most `chunk`: stage(off, len), meet, unstage(off,
  // len), meet. Empty: one rendezvous (the calls are still checked).
  template <typename Stage, typename Unstage>
  void chunked(const CollectiveCall& call, Clock::time_point deadline, int64_t total, int64_t chunk,
               const Stage& stage, const Unstage& unstage) {
    int64_t off = 0;
    do {
      const int64_t len = std::min(chunk, total - off);
      if (len > 0) stage(off, len);
      rendezvous(call, deadline, off == 0);
      if (len == 0) return;
      unstage(off, len);
      rendezvous(call, deadline, false);
      off += len;
    } while (off < total);
  }

  const int rank_, world_;
  const CommOptions options_;
  const int64_t slot_bytes_;
  Mapping map_;
  uint8_t *joined_ = nullptr, *arrived_ = nullptr, *exited_ = nullptr;
  RankState* ranks_ = nullptr;
  char* slots_ = nullptr;
  int uncaught_ = 0;
};

bool valid_job_id(const std::string& id) {
  if (id.empty() || id.size() > 200) return false;
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

// A decimal integer in [lo, hi] from variable `name`, or an Error naming it.
int env_int(const char* name, const char* text, int64_t lo, int64_t hi, const std::string& range) {
  const char* op = "ProcessGroupSpec::from_env";
  LS_CHECK(text != nullptr, op, name,
           " is not set (lockstep launch and torchrun set RANK, WORLD_SIZE, LOCAL_RANK, "
           "LOCAL_WORLD_SIZE)");
  const std::string s = text;
  bool digits = !s.empty() && s.size() <= 9;
  for (char c : s) digits = digits && c >= '0' && c <= '9';
  LS_CHECK(digits, op, name, ": expected a decimal integer, got '", s, "'");
  const int64_t v = std::stoll(s);
  LS_CHECK(v >= lo && v <= hi, op, name, ": expected ", range, ", got ", v);
  return int(v);
}

}  // namespace

void ProcessGroupSpec::validate() const {
  const char* op = "ProcessGroupSpec";
  LS_CHECK(world_size >= 1 && world_size <= kMaxWorld, op, "world_size: expected in [1, ",
           kMaxWorld, "], got ", world_size);
  LS_CHECK(rank >= 0 && rank < world_size, op, "rank: expected in [0, ", world_size, "), got ",
           rank);
  LS_CHECK(valid_job_id(job_id), op, "job_id: expected 1..200 characters of [A-Za-z0-9._-], got '",
           job_id, "'");
  LS_CHECK(slot_bytes >= 64 && slot_bytes <= (int64_t(1) << 30), op,
           "slot_bytes: expected in [64, 2^30], got ", slot_bytes);
  LS_CHECK(join_timeout.count() > 0, op, "join_timeout: expected > 0 ms, got ",
           join_timeout.count(), " ms");
  options.validate();
}

std::string ProcessGroupSpec::to_string() const {
  return detail::concat("process group: rank ", rank, " of ", world_size, ", job ", job_id,
                        ", slot ", slot_bytes, " B, join ", join_timeout.count(), "ms, ",
                        options.to_string());
}

ProcessGroupSpec ProcessGroupSpec::from_env(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) -> const char* {
    return getenv ? getenv(name) : std::getenv(name);
  };
  const char* op = "ProcessGroupSpec::from_env";
  ProcessGroupSpec s;
  s.world_size = env_int("WORLD_SIZE", get("WORLD_SIZE"), 1, kMaxWorld,
                         detail::concat("in [1, ", kMaxWorld, "]"));
  s.rank = env_int("RANK", get("RANK"), 0, s.world_size - 1,
                   detail::concat("in [0, ", s.world_size, ") (WORLD_SIZE=", s.world_size, ")"));
  const char* one_host =
      " (the shared-memory process group runs on one host: one rank per process of this machine)";
  if (const char* v = get("LOCAL_WORLD_SIZE"))
    LS_CHECK(env_int("LOCAL_WORLD_SIZE", v, 1, kMaxWorld, "in [1, 1024]") == s.world_size, op,
             "LOCAL_WORLD_SIZE=", v, " differs from WORLD_SIZE=", s.world_size, one_host);
  if (const char* v = get("LOCAL_RANK"))
    LS_CHECK(env_int("LOCAL_RANK", v, 0, kMaxWorld - 1, "in [0, 1024)") == s.rank, op,
             "LOCAL_RANK=", v, " differs from RANK=", s.rank, one_host);
  if (const char* id = get("LOCKSTEP_JOB_ID")) {
    s.job_id = id;
    LS_CHECK(valid_job_id(s.job_id), op,
             "LOCKSTEP_JOB_ID: expected 1..200 characters of [A-Za-z0-9._-], got '", s.job_id, "'");
    return s;
  }
  const char* addr = get("MASTER_ADDR");
  const char* port = get("MASTER_PORT");
  LS_CHECK(addr != nullptr && port != nullptr && *addr != '\0', op,
           "no job id: set LOCKSTEP_JOB_ID (lockstep launch does), or MASTER_ADDR and MASTER_PORT");
  const int p = env_int("MASTER_PORT", port, 1, 65535, "a port in [1, 65535]");
  std::string a = addr;
  for (char& c : a)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-')) c = '_';
  s.job_id = detail::concat("master-", a.substr(0, 150), "-", p);
  return s;
}

std::string make_job_id() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof r, 0) != ssize_t(sizeof r))
    r = uint64_t(Clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d-%016llx", int(::getpid()), (unsigned long long)r);
  return buf;
}

std::string job_segment_path(const std::string& job_id) { return "/dev/shm/lockstep." + job_id; }

void remove_job_segment(const std::string& job_id) { ::unlink(job_segment_path(job_id).c_str()); }

std::unique_ptr<ProcessCommunicator> join_process_group(const ProcessGroupSpec& spec) {
  spec.validate();
  return std::make_unique<ShmCommunicator>(spec);
}

uint64_t process_start_time(pid_t pid) {
  char state = 0;
  uint64_t start = 0;
  return read_proc_stat(pid, &state, &start) ? start : 0;
}

bool process_running(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state = 0;
  uint64_t start = 0;
  // A zombie (Z) or dying (X) process still answers kill(pid, 0).
  if (!read_proc_stat(pid, &state, &start) || state == 'Z' || state == 'X') return false;
  return start_time == 0 || start == start_time;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return detail::concat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return detail::concat("was killed by signal ", WTERMSIG(status), " (",
                          strsignal(WTERMSIG(status)), ")");
  return detail::concat("ended with wait status ", status);
}

bool RankProcessResult::ok() const {
  return error.empty() && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string RankProcessResult::describe() const {
  const std::string who = detail::concat("rank ", rank, " (pid ", pid, ") ");
  return who + (error.empty() ? describe_wait_status(status) : "failed: " + error);
}

namespace {

// What the rank processes tell the parent: anonymous shared memory, mapped before fork.
class Reports {
 public:
  static constexpr size_t kWhatBytes = 8192;
  struct Report {
    int order;  // -1: nothing reported
    char what[kWhatBytes];
  };
  explicit Reports(int n) : bytes_(sizeof(Report) * size_t(n + 1)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    LS_CHECK(p != MAP_FAILED, "fork_rank_processes", "mmap: ", std::strerror(errno));
    // reports_[0].order counts the reports so far; reports_[1 + r] is rank r's.
    reports_ = static_cast<Report*>(p);
    for (int r = 0; r < n; ++r) reports_[1 + r].order = -1;
  }
  Reports(const Reports&) = delete;
  Reports& operator=(const Reports&) = delete;
  ~Reports() { ::munmap(reports_, bytes_); }
  const Report& of(int r) const { return reports_[1 + r]; }
  void put(int r, const std::string& what) {
    Report& mine = reports_[1 + r];
    const size_t len = std::min(what.size(), kWhatBytes - 1);
    std::memcpy(mine.what, what.data(), len);
    mine.what[len] = '\0';
    mine.order = std::atomic_ref<int>(reports_[0].order).fetch_add(1);
  }

 private:
  size_t bytes_;
  Report* reports_;
};

[[noreturn]] void rank_process(const ProcessGroupSpec& spec,
                               const std::function<void(Communicator&)>& body, Reports& reports) {
  std::string error;
  {
    std::unique_ptr<ProcessCommunicator> comm;
    try {
      comm = join_process_group(spec);
      body(*comm);
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    if (!error.empty()) {
      reports.put(spec.rank, error);
      if (comm) comm->fail(error);
    }
  }
  std::fflush(nullptr);
  ::_exit(error.empty() ? 0 : 1);
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 0;
  return status;
}

}  // namespace

std::vector<RankProcessResult> fork_rank_processes(int n,
                                                   const std::function<void(Communicator&)>& body,
                                                   const CommOptions& options, int64_t slot_bytes) {
  const char* op = "fork_rank_processes";
  LS_CHECK(n >= 1, op, "n: expected >= 1 ranks, got ", n);
  LS_CHECK(n <= ProcessGroupSpec::kMaxWorld, op, "n: expected <= ", ProcessGroupSpec::kMaxWorld,
           " ranks, got ", n);
  ProcessGroupSpec spec;
  spec.world_size = n;
  spec.job_id = make_job_id();
  spec.options = options;
  spec.slot_bytes = slot_bytes;
  spec.validate();
  Reports reports(n);

  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t parent = ::getpid();
  std::vector<RankProcessResult> results(static_cast<size_t>(n));
  int started = 0;
  for (; started < n; ++started) {
    const pid_t pid = ::fork();
    if (pid < 0) break;
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      spec.rank = started;
      rank_process(spec, body, reports);
    }
    results[size_t(started)].rank = started;
    results[size_t(started)].pid = pid;
  }
  const int fork_errno = errno;
  if (started < n)
    for (int r = 0; r < started; ++r) ::kill(results[size_t(r)].pid, SIGKILL);
  for (int r = 0; r < started; ++r) {
    RankProcessResult& res = results[size_t(r)];
    res.status = wait_for(res.pid);
    if (reports.of(r).order >= 0) {
      res.error = reports.of(r).what;
      res.error_order = reports.of(r).order;
    }
  }
  remove_job_segment(spec.job_id);  // if a rank died before every rank joined
  LS_CHECK(started == n, op, "fork of rank ", started, ": ", std::strerror(fork_errno));
  return results;
}

void run_rank_processes(int n, const std::function<void(Communicator&)>& body,
                        const CommOptions& options, int64_t slot_bytes) {
  const std::vector<RankProcessResult> results = fork_rank_processes(n, body, options, slot_bytes);
  const RankProcessResult* first = nullptr;
  for (const RankProcessResult& r : results) {
    if (r.ok()) continue;
    const bool silent = r.error.empty();  // killed, crashed or exited: the likely cause
    if (first == nullptr || (silent && !first->error.empty()) ||
        (!silent && !first->error.empty() && r.error_order < first->error_order))
      first = &r;
  }
  if (first != nullptr) throw Error(first->describe());
}

}  // namespace lockstep::dist
