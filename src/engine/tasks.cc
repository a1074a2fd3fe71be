// Reward tasks (see tasks.h): the built-in digit tasks and the plug-in reward command, run as
// /bin/sh -c in its own process group with pipes for stdin / stdout / stderr, a deadline, and the
// whole group killed (SIGKILL) and reaped on timeout or on any error, so nothing is left behind.
#include "engine/tasks.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "lockstep/error.h"

extern char** environ;

namespace lockstep::engine {
namespace {

constexpr int32_t kBos = 1, kDigit0 = 3, kSep = 13, kPlus = 14;
constexpr int64_t kMaxDigits = 1024;
constexpr double kMaxTimeoutS = 1e6;  // the deadline stays far inside steady_clock's range

// NOTE: not std::uniform_int_distribution, whose algorithm differs between standard libraries: a
// rejection draw over the raw 64-bit outputs gives the same digits everywhere.
int32_t draw_digit(std::mt19937_64& g) {
  constexpr uint64_t kLimit = UINT64_MAX - UINT64_MAX % 10;  // a multiple of 10
  uint64_t v = g();
  while (v >= kLimit) v = g();
  return int32_t(v % 10);
}

enum class Kind { kCopy, kReverse, kSort, kAdd };

class BuiltinTask final : public Task {
 public:
  BuiltinTask(std::string name, Kind kind, int64_t digits)
      : name_(std::move(name)), kind_(kind), digits_(digits) {}

  std::string name() const override { return name_; }

  TaskPrompt make_prompt(std::mt19937_64& g) const override {
    TaskPrompt p;
    p.prompt.push_back(kBos);
    if (kind_ == Kind::kAdd) {
      std::vector<int32_t> a = draw_number(g), b = draw_number(g);
      for (int32_t d : a) p.prompt.push_back(kDigit0 + d);
      p.prompt.push_back(kPlus);
      for (int32_t d : b) p.prompt.push_back(kDigit0 + d);
      for (int32_t d : add_digits(a, b)) p.answer.push_back(kDigit0 + d);
    } else {
      std::vector<int32_t> d(static_cast<size_t>(digits_));
      for (int32_t& x : d) x = draw_digit(g);
      for (int32_t x : d) p.prompt.push_back(kDigit0 + x);
      if (kind_ == Kind::kReverse) std::reverse(d.begin(), d.end());
      if (kind_ == Kind::kSort) std::sort(d.begin(), d.end());
      for (int32_t x : d) p.answer.push_back(kDigit0 + x);
    }
    p.prompt.push_back(kSep);
    return p;
  }

  std::vector<double> score(const std::vector<Sample>& samples) const override {
    std::vector<double> rewards;
    rewards.reserve(samples.size());
    for (const Sample& s : samples) {
      LS_CHECK(!s.answer.empty(), "task " + name_, "sample ", s.id, " has no answer");
      size_t matched = 0;
      for (size_t i = 0; i < s.answer.size() && i < s.completion.size(); ++i)
        matched += s.completion[i] == s.answer[i] ? 1 : 0;
      rewards.push_back(double(matched) / double(s.answer.size()));
    }
    return rewards;
  }

  // The longest answer (add: one carry digit more) and its EOS.
  int64_t max_new_tokens() const override { return digits_ + (kind_ == Kind::kAdd ? 2 : 1); }

 private:
  // A number of exactly digits_ digits, most significant first (no leading zero unless 1 digit).
  std::vector<int32_t> draw_number(std::mt19937_64& g) const {
    std::vector<int32_t> d(static_cast<size_t>(digits_));
    for (int32_t& x : d) x = draw_digit(g);
    if (digits_ > 1)
      while (d[0] == 0) d[0] = draw_digit(g);
    return d;
  }

  // Schoolbook addition of two equally long digit strings, most significant first.
  static std::vector<int32_t> add_digits(const std::vector<int32_t>& a,
                                         const std::vector<int32_t>& b) {
    std::vector<int32_t> sum(a.size() + 1);
    int32_t carry = 0;
    for (size_t i = a.size(); i-- > 0;) {
      const int32_t v = a[i] + b[i] + carry;
      sum[i + 1] = v % 10;
      carry = v / 10;
    }
    sum[0] = carry;
    if (sum[0] == 0 && sum.size() > 1) sum.erase(sum.begin());
    return sum;
  }

  std::string name_;
  Kind kind_;
  int64_t digits_;
};

// ---- the reward command ------------------------------------------------------------------------

void append_array(std::string& out, const std::vector<int32_t>& v) {
  out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(v[i]);
  }
  out += ']';
}

std::string samples_jsonl(const std::vector<Sample>& samples) {
  std::string out;
  for (const Sample& s : samples) {
    out += "{\"id\":" + std::to_string(s.id) + ",\"prompt\":";
    append_array(out, s.prompt);
    out += ",\"completion\":";
    append_array(out, s.completion);
    out += ",\"answer\":";
    append_array(out, s.answer);
    out += ",\"weight_version\":" + std::to_string(s.weight_version) + "}\n";
  }
  return out;
}

// What the command printed (or an error naming its line).
std::vector<double> parse_rewards(const std::string& out, size_t expected, const std::string& op) {
  std::vector<double> rewards;
  size_t pos = 0, line = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    const std::string text = out.substr(pos, end - pos);
    pos = end + 1;
    line += 1;
    const char* ws = " \t\r\v\f";
    const size_t b = text.find_first_not_of(ws);
    const size_t e = text.find_last_not_of(ws);
    double v = 0;
    bool ok = b != std::string::npos;
    if (ok) {
      const char* first = text.data() + b + (text[b] == '+' ? 1 : 0);
      const char* last = text.data() + e + 1;
      // from_chars: locale-independent, and the whole trimmed line must be the number.
      const auto [ptr, ec] = std::from_chars(first, last, v);
      ok = ec == std::errc() && ptr == last && first != last;
    }
    LS_CHECK(ok, op, "line ", line, ": '", text, "' is not a number");
    LS_CHECK(std::isfinite(v), op, "line ", line, ": '", text, "' is not finite");
    rewards.push_back(v);
  }
  LS_CHECK(rewards.size() == expected, op, "expected ", expected, " rewards, got ", rewards.size());
  return rewards;
}

// The child's pid and its process group (the same id); kills the group and reaps the child when
// it ends or on destruction, whatever happened.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) kill_and_reap();
  }
  void kill_and_reap() {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);  // the group exists (both sides call setpgid); this is belt and braces
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  // Reaps the child if it has ended (true, *status set). Leftovers of its group (background jobs)
  // are killed first, while the unreaped leader still reserves the group id.
  bool try_reap(int* status) {
    siginfo_t info{};
    int r;
    do r = ::waitid(P_PID, id_t(pid_), &info, WEXITED | WNOHANG | WNOWAIT);
    while (r < 0 && errno == EINTR);
    if (r < 0) {  // ECHILD: reaped elsewhere (SIGCHLD ignored by the host), status unknown
      pid_ = -1;
      *status = 0;
      return true;
    }
    if (info.si_pid != pid_) return false;
    ::kill(-pid_, SIGKILL);
    pid_t w;
    do w = ::waitpid(pid_, status, 0);
    while (w < 0 && errno == EINTR);
    pid_ = -1;
    return true;
  }

 private:
  pid_t pid_;
};

struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

void make_pipe(Fd& r, Fd& w, const std::string& op) {
  int p[2];
  LS_CHECK(::pipe2(p, O_CLOEXEC) == 0, op, "pipe: ", std::strerror(errno));
  r.fd = p[0];
  w.fd = p[1];
}

// NOTE: SIGPIPE is blocked in this thread while we write (a child that exits without reading its
// stdin must not kill the trainer); a SIGPIPE raised by our writes is consumed before unblocking.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeBlock() {
    if (raised_ && !was_pending_) {
      const timespec zero{0, 0};
      while (sigtimedwait(&set_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  void raised() { raised_ = true; }
  const sigset_t& old_mask() const { return old_; }

 private:
  sigset_t set_, old_;
  bool was_pending_ = false, raised_ = false;
};

std::string tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

struct RunResult {
  std::string out, err;
  int status = 0;
};

RunResult run_command(const std::string& command, const std::string& input, double timeout_s,
                      const std::string& op) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  Fd in_r, in_w, out_r, out_w, err_r, err_w;
  make_pipe(in_r, in_w, op);
  make_pipe(out_r, out_w, op);
  make_pipe(err_r, err_w, op);

  SigpipeBlock sigpipe;
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  const pid_t pid = ::fork();
  LS_CHECK(pid >= 0, op, "fork: ", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::sigaction(SIGPIPE, &dfl, nullptr);
    pthread_sigmask(SIG_SETMASK, &sigpipe.old_mask(), nullptr);
    // Our pipe ends may themselves be 0..2 (a caller with closed stdio): move them above 2 first,
    // so no dup2 overwrites another or keeps a close-on-exec flag.
    int ends[3] = {in_r.fd, out_w.fd, err_w.fd};
    for (int& fd : ends)
      if (fd < 3 && (fd = ::fcntl(fd, F_DUPFD, 3)) < 0) _exit(127);
    for (int i = 0; i < 3; ++i)
      if (::dup2(ends[i], i) < 0) _exit(127);
    ::execve("/bin/sh", const_cast<char* const*>(argv), environ);
    _exit(127);
  }
  Child child(pid);
  ::setpgid(pid, pid);  // also here, so the group exists before any kill (EACCES after exec: ok)
  in_r.reset();
  out_w.reset();
  err_w.reset();
  for (int fd : {in_w.fd, out_r.fd, err_r.fd})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  RunResult res;
  size_t written = 0;
  if (input.empty()) in_w.reset();
  auto timed_out = [&] {
    child.kill_and_reap();
    throw Error(detail::concat(op, ": ", "did not answer within ", timeout_s, " s"));
  };
  char buf[65536];
  while (in_w.fd >= 0 || out_r.fd >= 0 || err_r.fd >= 0) {
    pollfd fds[3];
    int n = 0;
    if (in_w.fd >= 0) fds[n++] = {in_w.fd, POLLOUT, 0};
    if (out_r.fd >= 0) fds[n++] = {out_r.fd, POLLIN, 0};
    if (err_r.fd >= 0) fds[n++] = {err_r.fd, POLLIN, 0};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) timed_out();
    const int rc = ::poll(fds, nfds_t(n), int(std::min<int64_t>(left.count(), 1 << 30)));
    if (rc < 0 && errno == EINTR) continue;
    LS_CHECK(rc >= 0, op, "poll: ", std::strerror(errno));
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == in_w.fd) {
        const ssize_t w = ::write(in_w.fd, input.data() + written, input.size() - written);
        if (w >= 0) {
          written += size_t(w);
          if (written == input.size()) in_w.reset();  // EOF for the child
        } else if (errno == EPIPE) {
          sigpipe.raised();  // the child stopped reading: fine if it answered anyway
          in_w.reset();
        } else if (errno != EAGAIN && errno != EINTR) {
          throw Error(detail::concat(op, ": ", "write: ", std::strerror(errno)));
        }
      } else {
        Fd& src = fds[i].fd == out_r.fd ? out_r : err_r;
        std::string& dst = fds[i].fd == out_r.fd ? res.out : res.err;
        const ssize_t r = ::read(src.fd, buf, sizeof buf);
        if (r > 0) {
          dst.append(buf, size_t(r));
          if (&dst == &res.err && dst.size() > 2 * sizeof buf) dst = tail(dst, sizeof buf);
        } else if (r == 0) {
          src.reset();
        } else if (errno != EAGAIN && errno != EINTR) {
          throw Error(detail::concat(op, ": ", "read: ", std::strerror(errno)));
        }
      }
    }
  }
  // stdout and stderr are closed: wait for the exit (a child may close them and keep running).
  int status = 0;
  for (auto nap = std::chrono::microseconds(100); !child.try_reap(&status);
       nap = std::min(nap * 2, std::chrono::microseconds(20000))) {
    if (Clock::now() >= deadline) timed_out();
    std::this_thread::sleep_for(nap);
  }
  res.status = status;
  return res;
}

class CommandTask final : public Task {
 public:
  CommandTask(std::unique_ptr<Task> base, std::string command, double timeout_s)
      : base_(std::move(base)), command_(std::move(command)), timeout_s_(timeout_s) {}

  std::string name() const override { return base_->name() + "+command"; }
  TaskPrompt make_prompt(std::mt19937_64& g) const override { return base_->make_prompt(g); }
  int64_t max_new_tokens() const override { return base_->max_new_tokens(); }

  std::vector<double> score(const std::vector<Sample>& samples) const override {
    if (samples.empty()) return {};
    const std::string op = "reward command '" + command_ + "'";
    const RunResult r = run_command(command_, samples_jsonl(samples), timeout_s_, op);
    const std::string err = r.err.empty() ? std::string() : "; its stderr: " + tail(r.err, 2000);
    if (WIFSIGNALED(r.status)) {
      const int sig = WTERMSIG(r.status);
      throw Error(
          detail::concat(op, ": ", "killed by signal ", sig, " (", strsignal(sig), ")", err));
    }
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0)
      throw Error(detail::concat(op, ": ", "exited with status ", WEXITSTATUS(r.status), err));
    return parse_rewards(r.out, samples.size(), op);
  }

 private:
  std::unique_ptr<Task> base_;
  std::string command_;
  double timeout_s_;
};

}  // namespace

std::vector<std::string> builtin_task_names() { return {"copy", "reverse", "sort", "add"}; }

std::unique_ptr<Task> make_builtin_task(const std::string& name, int64_t digits,
                                        int64_t vocab_size) {
  Kind kind;
  if (name == "copy")
    kind = Kind::kCopy;
  else if (name == "reverse")
    kind = Kind::kReverse;
  else if (name == "sort")
    kind = Kind::kSort;
  else if (name == "add")
    kind = Kind::kAdd;
  else
    throw Error("make_builtin_task: unknown task '" + name + "' (copy, reverse, sort, add)");
  LS_CHECK(digits >= 1 && digits <= kMaxDigits, "make_builtin_task", "digits must be in [1, ",
           kMaxDigits, "], got ", digits);
  const int64_t need = kind == Kind::kAdd ? kPlus + 1 : kSep + 1;
  LS_CHECK(vocab_size >= need, "make_builtin_task", "task '", name,
           "' needs a vocabulary of >= ", need, " tokens, got ", vocab_size);
  return std::make_unique<BuiltinTask>(name, kind, digits);
}

std::unique_ptr<Task> make_command_task(std::unique_ptr<Task> base, const std::string& command,
                                        double timeout_s) {
  LS_CHECK(base != nullptr, "make_command_task", "no base task");
  LS_CHECK(!command.empty(), "make_command_task", "empty command");
  LS_CHECK(std::isfinite(timeout_s) && timeout_s > 0 && timeout_s <= kMaxTimeoutS,
           "make_command_task", "timeout_s must be in (0, ", kMaxTimeoutS, "], got ", timeout_s);
  return std::make_unique<CommandTask>(std::move(base), command, timeout_s);
}

}  // namespace lockstep::engine
