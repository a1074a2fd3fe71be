// `lockstep launch` and `lockstep dist-selftest` (tools/launch_cmd.h). The launcher forks each
// rank into its own process group (so stopping a rank stops what it started), gives it /dev/null
// as stdin and a pipe for each of stdout and stderr, and polls the pipes and the ranks in one loop:
// whole lines go out labelled, a rank that ends is reaped (what is left of its group is killed, so
// its pipes close), and the first failure, the --timeout or a SIGINT/SIGTERM/SIGHUP stops the
// others. The job's shared-memory name is unlinked at the end whatever happened.
#include "tools/launch_cmd.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/collective.h"
#include "dist/process_transport.h"

extern char** environ;

namespace lockstep::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kStopGrace = std::chrono::seconds(5);   // SIGTERM, then SIGKILL
constexpr auto kDrainLimit = std::chrono::seconds(2);  // output still open after every rank ended
constexpr size_t kMaxLine = 64 * 1024;                 // a longer line goes out in labelled pieces

// Throws lockstep::Error(concat(what...)) unless ok (run_cli prefixes "lockstep launch: error: ").
template <typename... Args>
void require(bool ok, const Args&... what) {
  if (!ok) throw Error(detail::concat(what...));
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

// Sets the launcher's signal dispositions for its lifetime: SIGINT/SIGTERM/SIGHUP stop the job
// (no SA_RESTART: poll returns EINTR), SIGPIPE is ignored (a closed stdout is an error we report),
// SIGCHLD is the default (an inherited SIG_IGN would reap the ranks behind our back).
class SignalSetup {
 public:
  SignalSetup() {
    g_signal = 0;
    struct sigaction stop {};
    stop.sa_handler = on_signal;
    sigemptyset(&stop.sa_mask);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < kSignals.size(); ++i)
      ::sigaction(kSignals[i], i < 3 ? &stop : i == 3 ? &ign : &dfl, &old_[i]);
  }
  SignalSetup(const SignalSetup&) = delete;
  SignalSetup& operator=(const SignalSetup&) = delete;
  ~SignalSetup() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }

 private:
  static constexpr std::array<int, 5> kSignals = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD};
  std::array<struct sigaction, 5> old_{};
};

// A close-on-exec descriptor above 2 (so that a child's dup2 onto 0..2 never hits it), or throws.
int fd_above_stdio(int fd, const char* what) {
  require(fd >= 0, what, ": ", std::strerror(errno));
  if (fd > 2) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  const int err = errno;
  ::close(fd);
  require(moved >= 0, what, ": ", std::strerror(err));
  return moved;
}

struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int p[2];
    require(::pipe2(p, O_CLOEXEC) == 0, "pipe: ", std::strerror(errno));
    read = fd_above_stdio(p[0], "pipe");
    write = fd_above_stdio(p[1], "pipe");
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  ~Pipe() {
    close_read();
    close_write();
  }
  int take_read() { return std::exchange(read, -1); }
  void close_read() {
    if (read >= 0) ::close(std::exchange(read, -1));
  }
  void close_write() {
    if (write >= 0) ::close(std::exchange(write, -1));
  }
};

// One output stream of a rank: its pipe's read end and the partial line read so far.
struct Stream {
  int fd = -1;   // -1 once closed
  int sink = 1;  // where its lines go: 1 stdout, 2 stderr
  std::string pending;
};

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool stopped = false;  // signalled by the launcher (not a failure of its own)
  int status = 0;
  Stream out, err;
  // "rank 2 (pid 123) exited with status 3"
  std::string describe_end() const {
    dist::RankProcessResult r;
    r.rank = rank;
    r.pid = pid;
    r.status = status;
    return r.describe();
  }
};

struct LaunchFlags {
  int nproc = 0;
  float timeout_s = 0;  // 0: no limit
  std::vector<std::string> command;
};

class Launcher {
 public:
  explicit Launcher(const LaunchFlags& f) : f_(f), job_id_(dist::make_job_id()) {}

  int run() {
    const SignalSetup signals;
    prepare_exec();
    ranks_.resize(size_t(f_.nproc));
    try {
      for (int r = 0; r < f_.nproc; ++r) start(r);
    } catch (...) {
      stop(SIGKILL);
      while (any_running()) reap(true);
      finish_streams();
      dist::remove_job_segment(job_id_);
      throw;
    }
    const Clock::time_point t0 = Clock::now();
    Clock::time_point kill_at = Clock::time_point::max(), drain_until = Clock::time_point::max();
    while (any_running() || any_stream_open()) {
      const Clock::time_point now = Clock::now();
      if (g_signal != 0 && interrupted_ == 0) {
        interrupted_ = g_signal;
        if (stopping_)
          kill_at = now;  // asked again while stopping: no grace
        else
          kill_at = stop_all("got signal " + std::to_string(int(g_signal)) + " (" +
                             strsignal(g_signal) + ")");
      } else if (!stopping_ && f_.timeout_s > 0 &&
                 now - t0 >= std::chrono::duration<double>(f_.timeout_s)) {
        timed_out_ = true;
        kill_at = stop_all(detail::concat("the job ran past --timeout ", f_.timeout_s, " s"));
      } else if (now >= kill_at) {
        stop(SIGKILL);
        kill_at = Clock::time_point::max();
      }
      if (!any_running() && drain_until == Clock::time_point::max())
        drain_until = now + kDrainLimit;
      if (now >= drain_until) break;  // something outside the ranks' groups holds a pipe
      pump(50);
      reap(false);
      if (first_failure_ >= 0 && !stopping_)
        kill_at = stop_all(ranks_[size_t(first_failure_)].describe_end());
    }
    finish_streams();
    dist::remove_job_segment(job_id_);
    return report();
  }

 private:
  // The environment and argv every rank's exec gets (built before any fork).
  void prepare_exec() {
    const char* ours[] = {
        "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "LOCKSTEP_JOB_ID="};
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      bool replaced = false;
      for (const char* o : ours) replaced = replaced || std::strncmp(*e, o, std::strlen(o)) == 0;
      if (!replaced) env_.emplace_back(*e);
    }
    for (const std::string& a : f_.command) argv_.push_back(const_cast<char*>(a.c_str()));
    argv_.push_back(nullptr);
  }

  void start(int r) {
    RankProcess& p = ranks_[size_t(r)];
    p.rank = r;
    std::vector<std::string> env = env_;
    const std::string n = std::to_string(f_.nproc), rs = std::to_string(r);
    for (const std::string& v : {"RANK=" + rs, "WORLD_SIZE=" + n, "LOCAL_RANK=" + rs,
                                 "LOCAL_WORLD_SIZE=" + n, "LOCKSTEP_JOB_ID=" + job_id_})
      env.push_back(v);
    std::vector<char*> envp;
    for (std::string& v : env) envp.push_back(v.data());
    envp.push_back(nullptr);
    Pipe out, err, exec_status;
    const int devnull = fd_above_stdio(::open("/dev/null", O_RDONLY | O_CLOEXEC), "/dev/null");
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Only async-signal-safe calls from here on.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::sigaction(SIGPIPE, &dfl, nullptr);
      if (::dup2(devnull, 0) < 0 || ::dup2(out.write, 1) < 0 || ::dup2(err.write, 2) < 0)
        ::_exit(127);
      ::execvpe(argv_[0], argv_.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] const ssize_t w = ::write(exec_status.write, &e, sizeof e);
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(devnull);
    require(pid > 0, "fork of rank ", r, ": ", std::strerror(fork_errno));
    ::setpgid(pid, pid);  // also here, so the group exists before any stop (EACCES after exec: ok)
    p.pid = pid;
    p.running = true;
    out.close_write();
    err.close_write();
    exec_status.close_write();
    p.out = Stream{out.take_read(), 1, {}};
    p.err = Stream{err.take_read(), 2, {}};
    // The status pipe closes at a successful exec; a failed one sends its errno.
    int e = 0;
    ssize_t got;
    do got = ::read(exec_status.read, &e, sizeof e);
    while (got < 0 && errno == EINTR);
    require(got <= 0, "cannot run '", f_.command[0], "': ", std::strerror(e));
  }

  // Reads what the pipes have (waiting up to timeout_ms) and writes out the whole lines.
  void pump(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    for (RankProcess& p : ranks_)
      for (Stream* s : {&p.out, &p.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
    if (fds.empty()) {
      ::poll(nullptr, 0, timeout_ms);
      return;
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // EINTR: the loop looks again
    char buf[65536];
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Stream& s = *streams[i];
      const ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n > 0) {
        s.pending.append(buf, size_t(n));
        emit(rank_of(s), s, false);
      } else {
        emit(rank_of(s), s, true);
        ::close(std::exchange(s.fd, -1));
      }
    }
  }

  const RankProcess& rank_of(const Stream& s) const {
    for (const RankProcess& p : ranks_)
      if (&p.out == &s || &p.err == &s) return p;
    return ranks_.front();
  }

  // Writes the complete lines of s.pending (all of it at the end of the stream), labelled.
  void emit(const RankProcess& p, Stream& s, bool eof) {
    const std::string label = "[rank " + std::to_string(p.rank) + "] ";
    size_t begin = 0;
    while (true) {
      size_t end = s.pending.find('\n', begin);
      if (end == std::string::npos) {
        if (s.pending.size() - begin >= kMaxLine || (eof && begin < s.pending.size()))
          end = s.pending.size();
        else
          break;
      }
      const std::string line = label + s.pending.substr(begin, end - begin) + "\n";
      write_out(s.sink, line);
      begin = std::min(end + 1, s.pending.size());
    }
    s.pending.erase(0, begin);
  }

  void write_out(int fd, const std::string& s) {
    if (fd == 1 && !write_error_.empty()) return;
    size_t done = 0;
    while (done < s.size()) {
      const ssize_t w = ::write(fd, s.data() + done, s.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (fd == 1 && write_error_.empty())
          write_error_ = std::string("writing standard output: ") + std::strerror(errno);
        return;
      }
      done += size_t(w);
    }
  }

  void finish_streams() {
    for (RankProcess& p : ranks_)
      for (Stream* s : {&p.out, &p.err})
        if (s->fd >= 0) {
          emit(p, *s, true);
          ::close(std::exchange(s->fd, -1));
        }
  }

  // Reaps the ranks that ended (blocking: every running one). The first that failed on its own
  // becomes first_failure_.
  void reap(bool block) {
    for (RankProcess& p : ranks_) {
      if (!p.running) continue;
      siginfo_t info{};
      int rc;
      do rc = ::waitid(P_PID, id_t(p.pid), &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
      while (rc < 0 && errno == EINTR);
      if (rc < 0) {  // reaped elsewhere (ECHILD): its status is unknown
        p.running = false;
        continue;
      }
      if (info.si_pid != p.pid) continue;
      // What is left of its group goes too (while the unreaped leader still holds the group id),
      // so that its pipes close.
      ::kill(-p.pid, SIGKILL);
      pid_t w;
      do w = ::waitpid(p.pid, &p.status, 0);
      while (w < 0 && errno == EINTR);
      p.running = false;
      const bool failed = !(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0);
      if (failed && !p.stopped && first_failure_ < 0 && !stopping_) first_failure_ = p.rank;
    }
  }

  // Signals every running rank's group; returns when to escalate to SIGKILL.
  Clock::time_point stop_all(const std::string& why) {
    stopping_ = true;
    std::string running;
    for (const RankProcess& p : ranks_)
      if (p.running) running += (running.empty() ? "" : ", ") + std::to_string(p.rank);
    std::fprintf(stderr, "lockstep launch: %s: stopping ranks [%s]\n", why.c_str(),
                 running.c_str());
    stop(SIGTERM);
    return Clock::now() + kStopGrace;
  }

  void stop(int sig) {
    for (RankProcess& p : ranks_)
      if (p.running) {
        p.stopped = true;
        ::kill(-p.pid, sig);
        ::kill(p.pid, sig);  // in case its group was never made
      }
  }

  bool any_running() const {
    return std::any_of(ranks_.begin(), ranks_.end(),
                       [](const RankProcess& p) { return p.running; });
  }
  bool any_stream_open() const {
    return std::any_of(ranks_.begin(), ranks_.end(),
                       [](const RankProcess& p) { return p.out.fd >= 0 || p.err.fd >= 0; });
  }

  std::string stopped_list() const {
    std::vector<uint8_t> stopped;
    for (const RankProcess& p : ranks_) stopped.push_back(p.stopped ? 1 : 0);
    return dist::rank_list(stopped, true);
  }

  int report() const {
    if (first_failure_ >= 0) {
      std::fprintf(stderr,
                   "lockstep launch: failed: %s (the first rank to fail); stopped ranks %s\n",
                   ranks_[size_t(first_failure_)].describe_end().c_str(), stopped_list().c_str());
      return kExitCheckFailed;
    }
    if (timed_out_) {
      std::fprintf(stderr,
                   "lockstep launch: failed: the job ran past --timeout %g s; stopped ranks %s\n",
                   double(f_.timeout_s), stopped_list().c_str());
      return kExitCheckFailed;
    }
    if (interrupted_ != 0) {
      std::fprintf(stderr, "lockstep launch: interrupted by signal %d (%s); stopped ranks %s\n",
                   int(interrupted_), strsignal(interrupted_), stopped_list().c_str());
      return kExitUsage;
    }
    if (!write_error_.empty()) {
      std::fprintf(stderr, "lockstep launch: error: %s\n", write_error_.c_str());
      return kExitUsage;
    }
    return kExitOk;
  }

  const LaunchFlags& f_;
  const std::string job_id_;
  std::vector<std::string> env_;
  std::vector<char*> argv_;
  std::vector<RankProcess> ranks_;
  int first_failure_ = -1;
  bool stopping_ = false, timed_out_ = false;
  int interrupted_ = 0;
  std::string write_error_;
};

// ----- lockstep dist-selftest -----

// The bytes rank `rank` sends in collective `round`: a splitmix64 stream, so any rank can tell what
// every other one sent. f32 payloads start with NaN payloads and other special values.
void fill_pattern(void* p, DType dt, int64_t bytes, int rank, int round) {
  uint64_t state = (uint64_t(round) << 32) ^ (uint64_t(rank) * 0xD1B54A32D192ED03ull);
  auto* b = static_cast<unsigned char*>(p);
  for (int64_t i = 0; i < bytes; i += 8) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(b + i, &z, size_t(std::min<int64_t>(8, bytes - i)));
  }
  const uint32_t special[] = {0x7F800001u, 0xFFC12345u, 0x7FFFFFFFu, 0x80000000u, 0xFF800000u};
  if (dt == DType::kF32)
    for (int64_t i = 0; i < 5 && (i + 1) * 4 <= bytes; ++i)
      std::memcpy(b + 4 * i, &special[(i + rank) % 5], 4);
}

class Selftest {
 public:
  Selftest(dist::Communicator& c, int64_t slot_bytes) : c_(c), slot_(slot_bytes) {}

  int run() {
    const int n = c_.size();
    const int64_t big = 5 * slot_ / 8 + 3;  // f32 elements: 2.5 slots of bytes
    c_.barrier();
    ++calls_;
    for (const auto& [dt, shape] :
         std::vector<std::pair<DType, std::vector<int64_t>>>{{DType::kF32, {0}},
                                                             {DType::kBF16, {1}},
                                                             {DType::kF32, {3, 17}},
                                                             {DType::kU8, {1001}},
                                                             {DType::kBF16, {2, 3, 4}},
                                                             {DType::kF32, {big}}})
      all_gather(dt, shape, false);
    all_gather(DType::kF32, {2, 257}, true);
    for (int root = 0; root < n; ++root) broadcast(DType::kBF16, {7}, root);
    broadcast(DType::kF32, {int64_t(n) * big + 5}, n - 1);  // more than one chunk (every slot)
    c_.barrier();
    ++calls_;
    for (const std::string& m : mismatches_)
      std::printf("dist-selftest: rank %d: %s\n", c_.rank(), m.c_str());
    const std::string verdict = mismatches_.empty()
                                    ? "every byte as sent"
                                    : std::to_string(mismatches_.size()) + " payloads differ";
    std::printf("dist-selftest: rank %d of %d (pid %d): %d collectives, %lld bytes received, %s\n",
                c_.rank(), n, int(::getpid()), calls_, (long long)received_, verdict.c_str());
    flush_stdout();
    return mismatches_.empty() ? kExitOk : kExitCheckFailed;
  }

 private:
  void all_gather(DType dt, std::vector<int64_t> shape, bool in_place) {
    const int n = c_.size(), round = calls_++;
    const Tensor probe(dt, shape);
    const int64_t bytes = probe.nbytes();
    shape.insert(shape.begin(), n);
    Tensor recv(dt, shape);
    std::memset(recv.data(), 0xA5, size_t(recv.nbytes()));
    char* mine = recv.ptr<char>() + c_.rank() * bytes;
    Tensor send(dt, probe.shape());
    fill_pattern(in_place ? mine : send.data(), dt, bytes, c_.rank(), round);
    TensorView s = in_place ? TensorView::contiguous(mine, dt, probe.shape()) : send.view();
    c_.all_gather(s, recv.view());
    for (int r = 0; r < n; ++r)
      compare(recv.ptr<char>() + r * bytes, dt, bytes, r, round,
              detail::concat(in_place ? "all_gather in place " : "all_gather ", dtype_name(dt),
                             probe.view().shape_string(), ": the bytes from rank ", r));
  }

  void broadcast(DType dt, const std::vector<int64_t>& shape, int root) {
    const int round = calls_++;
    Tensor buf(dt, shape);
    if (c_.rank() == root)
      fill_pattern(buf.data(), dt, buf.nbytes(), root, round);
    else
      std::memset(buf.data(), 0xA5, size_t(buf.nbytes()));
    c_.broadcast(buf.view(), root);
    if (c_.rank() != root)
      compare(buf.data(), dt, buf.nbytes(), root, round,
              detail::concat("broadcast ", dtype_name(dt), buf.view().shape_string(), " from rank ",
                             root));
  }

  void compare(const void* got, DType dt, int64_t bytes, int sender, int round,
               const std::string& what) {
    std::vector<unsigned char> want(static_cast<size_t>(bytes));
    fill_pattern(want.data(), dt, bytes, sender, round);
    received_ += bytes;
    if (bytes == 0 || std::memcmp(got, want.data(), size_t(bytes)) == 0) return;
    const auto* g = static_cast<const unsigned char*>(got);
    int64_t i = 0;
    while (g[i] == want[size_t(i)]) ++i;
    char buf[96];
    std::snprintf(buf, sizeof buf, " differ first at byte %lld (0x%02x, sent 0x%02x)", (long long)i,
                  g[i], want[size_t(i)]);
    mismatches_.push_back(what + buf);
  }

  dist::Communicator& c_;
  const int64_t slot_;
  int calls_ = 0;
  int64_t received_ = 0;
  std::vector<std::string> mismatches_;
};

}  // namespace

Command add_dist_selftest_command(CLI::App& top) {
  struct Flags {
    int timeout_ms = 60'000;
    int64_t slot_bytes = dist::ProcessGroupSpec::kDefaultSlotBytes;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = top.add_subcommand(
      "dist-selftest",
      "one rank of a job (under lockstep launch): all_gather, broadcast and barrier, byte checked");
  sub->add_option("--timeout", f->timeout_ms, "each collective's timeout, in ms")
      ->transform(int_in(1, 86'400'000))
      ->type_name("MS")
      ->capture_default_str();
  sub->add_option("--slot-bytes", f->slot_bytes,
                  "each rank's staging area in the job's segment (larger payloads go in chunks)")
      ->transform(int_in(64, int64_t(1) << 30))
      ->type_name("N")
      ->capture_default_str();
  sub->footer(
      "Joins the job from RANK, WORLD_SIZE and LOCKSTEP_JOB_ID (or MASTER_ADDR/MASTER_PORT), as "
      "lockstep launch sets them; every rank must be given the same flags.\n"
      "Exit status: 0 every byte arrived as sent, 1 some differ, 2 bad usage or a failed job.\n"
      "Example: lockstep launch --nproc 4 -- lockstep dist-selftest");
  return {sub, [f] {
            dist::ProcessGroupSpec spec = dist::ProcessGroupSpec::from_env();
            spec.options.timeout = std::chrono::milliseconds(f->timeout_ms);
            spec.slot_bytes = f->slot_bytes;
            const std::unique_ptr<dist::ProcessCommunicator> comm = dist::join_process_group(spec);
            try {
              return Selftest(*comm, spec.slot_bytes).run();
            } catch (const std::exception& e) {
              comm->fail(e.what());  // the other ranks stop waiting for this one
              throw;
            }
          }};
}

Command add_launch_command(CLI::App& top) {
  auto f = std::make_shared<LaunchFlags>();
  CLI::App* sub = top.add_subcommand(
      "launch", "runs a command as the N ranks of one job on this host (torchrun-style variables)");
  sub->add_option("--nproc", f->nproc, "how many ranks (processes)")
      ->transform(int_in(1, dist::ProcessGroupSpec::kMaxWorld))
      ->type_name("N")
      ->required();
  sub->add_option("--timeout", f->timeout_s,
                  "stop every rank and fail when the job runs longer [no limit]")
      ->transform(float_in(0, 1e7f, true))
      ->type_name("S");
  sub->add_option("command", f->command, "what each rank runs, after --")
      ->type_name("-- COMMAND [ARGS...]")
      ->required();
  sub->footer(
      "Rank r runs COMMAND with RANK=r, WORLD_SIZE=N, LOCAL_RANK=r, LOCAL_WORLD_SIZE=N and one "
      "fresh LOCKSTEP_JOB_ID (its shared-memory job), stdin /dev/null, each line of its stdout "
      "and stderr labelled \"[rank r] \". When a rank fails or --timeout passes, the other ranks' "
      "process groups get SIGTERM, then SIGKILL 5 s later.\n"
      "Exit status: 0 every rank exited with status 0; 1 a rank failed (a non-zero exit or a "
      "signal) or the job ran past --timeout; 2 bad usage, a command that cannot run, or an "
      "interruption (SIGINT, SIGTERM, SIGHUP).\n"
      "Example: lockstep launch --nproc 4 -- lockstep dist-selftest");
  return {sub, [f, sub] {
            // Without "--", a flag meant for the command would be taken as launch's own.
            const std::vector<std::string> rest = sub->remaining();
            require(std::find(rest.begin(), rest.end(), "--") != rest.end(),
                    "put the command after '--': lockstep launch --nproc N -- COMMAND [ARGS...]");
            return Launcher(*f).run();
          }};
}

}  // namespace lockstep::tools
