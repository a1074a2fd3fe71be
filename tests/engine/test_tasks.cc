// Reward tasks: each built-in task's prompt, answer and reward on hand-made completions (full,
// partial, empty, overlong), determinism in the generator, and the reward command on small shell
// commands, each failure (wrong count, non-number, NaN, exit status, signal, timeout) with its
// own error, no child left behind (no zombie, no orphan still running).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>

#include "engine/tasks.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

using Tokens = std::vector<int32_t>;

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
  }
}

// The operand digits (0..9) of a prompt between BOS and the token `end`, from position `from`.
std::vector<int> digits_of(const Tokens& p, size_t from, int32_t end, size_t* next) {
  std::vector<int> d;
  size_t i = from;
  for (; i < p.size() && p[i] != end; ++i) {
    EXPECT_TRUE(p[i] >= 3 && p[i] <= 12) << "token " << p[i] << " at " << i;
    d.push_back(p[i] - 3);
  }
  *next = i + 1;
  return d;
}

Tokens tokens_of(const std::vector<int>& digits) {
  Tokens t;
  for (int d : digits) t.push_back(3 + d);
  return t;
}

TEST(BuiltinTasks, PromptsAndAnswers) {
  EXPECT_EQ(builtin_task_names(), (std::vector<std::string>{"copy", "reverse", "sort", "add"}));
  std::mt19937_64 g(7);
  for (int64_t digits : {1, 3, 9}) {
    for (const char* name : {"copy", "reverse", "sort"}) {
      const auto task = make_builtin_task(name, digits, 2048);
      EXPECT_EQ(task->name(), name);
      EXPECT_EQ(task->max_new_tokens(), digits + 1);
      for (int k = 0; k < 50; ++k) {
        const TaskPrompt p = task->make_prompt(g);
        ASSERT_EQ(p.prompt.size(), size_t(digits + 2));
        EXPECT_EQ(p.prompt.front(), 1);
        EXPECT_EQ(p.prompt.back(), 13);
        size_t next = 0;
        std::vector<int> d = digits_of(p.prompt, 1, 13, &next);
        if (std::string(name) == "reverse") std::reverse(d.begin(), d.end());
        if (std::string(name) == "sort") std::sort(d.begin(), d.end());
        EXPECT_EQ(p.answer, tokens_of(d)) << name;
      }
    }
    const auto add = make_builtin_task("add", digits, 2048);
    EXPECT_EQ(add->max_new_tokens(), digits + 2);
    for (int k = 0; k < 200; ++k) {
      const TaskPrompt p = add->make_prompt(g);
      ASSERT_EQ(p.prompt.size(), size_t(2 * digits + 3));
      EXPECT_EQ(p.prompt.front(), 1);
      EXPECT_EQ(p.prompt.back(), 13);
      size_t next = 0;
      const std::vector<int> a = digits_of(p.prompt, 1, 14, &next);
      const std::vector<int> b = digits_of(p.prompt, next, 13, &next);
      ASSERT_EQ(a.size(), size_t(digits));
      ASSERT_EQ(b.size(), size_t(digits));
      if (digits > 1) {
        EXPECT_TRUE(a[0] != 0 && b[0] != 0) << "no leading zero";
      }
      uint64_t x = 0, y = 0;
      for (int v : a) x = 10 * x + uint64_t(v);
      for (int v : b) y = 10 * y + uint64_t(v);
      std::vector<int> sum;
      for (char c : std::to_string(x + y)) sum.push_back(c - '0');
      EXPECT_EQ(p.answer, tokens_of(sum)) << x << " + " << y;
    }
  }
}

TEST(BuiltinTasks, DeterministicInTheGenerator) {
  for (const std::string& name : builtin_task_names()) {
    const auto task = make_builtin_task(name, 5, 2048);
    std::mt19937_64 g1(123), g2(123);
    for (int k = 0; k < 20; ++k) {
      const TaskPrompt a = task->make_prompt(g1), b = task->make_prompt(g2);
      EXPECT_EQ(a.prompt, b.prompt);
      EXPECT_EQ(a.answer, b.answer);
    }
  }
  // Pinned: the digits come from raw mt19937_64 outputs (no library distribution), so these are
  // the same on every platform and standard library (first outputs of mt19937_64(42) mod 10).
  std::mt19937_64 g(42);
  const TaskPrompt p = make_builtin_task("copy", 6, 2048)->make_prompt(g);
  EXPECT_EQ(p.prompt, (Tokens{1, 9, 7, 3, 5, 4, 11, 13}));
}

TEST(BuiltinTasks, Rewards) {
  const auto task = make_builtin_task("reverse", 4, 2048);
  const Tokens answer = {6, 5, 4, 3};
  auto reward = [&](Tokens completion) {
    return task->score({Sample{0, {1, 3, 4, 5, 6, 13}, completion, answer}})[0];
  };
  EXPECT_EQ(reward({6, 5, 4, 3, 2}), 1.0);        // the answer and EOS
  EXPECT_EQ(reward({6, 5, 4, 3}), 1.0);           // no EOS: still every position
  EXPECT_EQ(reward({6, 5, 4, 3, 7, 7, 7}), 1.0);  // overlong: not penalized past the answer
  EXPECT_EQ(reward({6, 9, 4, 9, 2}), 0.5);        // partial
  EXPECT_EQ(reward({6, 5, 2}), 0.5);              // short: missing positions are wrong
  EXPECT_EQ(reward({}), 0.0);                     // empty
  EXPECT_EQ(reward({2, 6, 5, 4, 3}), 0.0);        // shifted by one: nothing matches
  const std::vector<double> batch =
      task->score({Sample{0, {}, {6}, answer}, Sample{1, {}, {6, 5, 4}, answer}});
  EXPECT_EQ(batch, (std::vector<double>{0.25, 0.75}));
  EXPECT_TRUE(task->score({}).empty());
  expect_error([&] { task->score({Sample{9, {1}, {3}, {}}}); }, {"sample 9 has no answer"});
}

TEST(BuiltinTasks, BadArguments) {
  expect_error([] { make_builtin_task("mul", 3, 2048); }, {"unknown task 'mul'"});
  expect_error([] { make_builtin_task("copy", 0, 2048); }, {"digits must be in [1, 1024], got 0"});
  expect_error([] { make_builtin_task("copy", 3, 13); }, {"needs a vocabulary of >= 14"});
  expect_error([] { make_builtin_task("add", 3, 14); }, {"needs a vocabulary of >= 15"});
  EXPECT_NO_THROW(make_builtin_task("sort", 3, 14));
}

// ---- the reward command ------------------------------------------------------------------------

std::unique_ptr<Task> command(const std::string& cmd, double timeout_s = 10.0) {
  return make_command_task(make_builtin_task("copy", 3, 2048), cmd, timeout_s);
}

std::vector<Sample> samples(size_t n) {
  std::vector<Sample> s;
  for (size_t i = 0; i < n; ++i)
    s.push_back(Sample{int64_t(i), {1, 3, 4, 5, 13}, {3, 4, int32_t(5 + i % 2), 2}, {3, 4, 5}});
  return s;
}

// Every child was reaped: this process has none left (no zombie either).
void expect_no_children() {
  int status = 0;
  errno = 0;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(CommandTask, Rewards) {
  const auto task = command("cat >/dev/null; printf '1\\n0.5\\n'");
  EXPECT_EQ(task->name(), "copy+command");
  EXPECT_EQ(task->max_new_tokens(), 4);
  EXPECT_EQ(task->score(samples(2)), (std::vector<double>{1.0, 0.5}));
  // Whitespace around a number is fine, and the last newline is optional.
  EXPECT_EQ(command("printf ' 0.25 \\r\\n+1e-1\\t\\n-3'")->score(samples(3)),
            (std::vector<double>{0.25, 0.1, -3.0}));
  EXPECT_TRUE(command("exit 1")->score({}).empty());  // nothing to score: not run
  expect_no_children();
}

TEST(CommandTask, SeesTheSamplesAsJsonl) {
  const std::string path = ::testing::TempDir() + "lockstep_test_tasks.jsonl";
  const auto task = command("cat >'" + path + "'; printf '0\\n0\\n'");
  std::vector<Sample> s = samples(2);
  s[1].id = 41;
  s[1].completion = {};
  s[1].weight_version = 7;
  task->score(s);
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text,
            "{\"id\":0,\"prompt\":[1,3,4,5,13],\"completion\":[3,4,5,2],\"answer\":[3,4,5],"
            "\"weight_version\":0}\n"
            "{\"id\":41,\"prompt\":[1,3,4,5,13],\"completion\":[],\"answer\":[3,4,5],"
            "\"weight_version\":7}\n");
  std::remove(path.c_str());
}

// A Python scorer reading the JSON gives the built-in reward, bit for bit.
TEST(CommandTask, PythonScorerMatchesBuiltin) {
  if (std::system("python3 -c pass >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  const auto task = command(R"(python3 -c '
import json, sys
for line in sys.stdin:
    s = json.loads(line)
    a, c = s["answer"], s["completion"]
    print(sum(1 for i in range(len(a)) if i < len(c) and c[i] == a[i]) / len(a))
')");
  const auto builtin = make_builtin_task("copy", 7, 2048);
  std::mt19937_64 g(5);
  std::vector<Sample> s;
  for (int i = 0; i < 40; ++i) {
    const TaskPrompt p = builtin->make_prompt(g);
    Tokens c = p.answer;
    for (size_t k = 0; k < c.size(); ++k)
      if (g() % 3 == 0) c[k] = 3 + int32_t(g() % 10);
    c.resize(g() % (c.size() + 2));
    s.push_back(Sample{i, p.prompt, c, p.answer});
  }
  EXPECT_EQ(task->score(s), builtin->score(s));
  expect_no_children();
}

TEST(CommandTask, Errors) {
  expect_error([] { command("cat >/dev/null; printf '1\\n'")->score(samples(2)); },
               {"reward command 'cat >/dev/null; printf '1\\n''", "expected 2 rewards, got 1"});
  expect_error([] { command("printf '1\\n0.5\\nabc\\n'")->score(samples(3)); },
               {"line 3: 'abc' is not a number"});
  expect_error([] { command("printf '1\\n\\n1\\n'")->score(samples(3)); },
               {"line 2: '' is not a number"});
  expect_error([] { command("printf '0.5x\\n'")->score(samples(1)); },
               {"line 1: '0.5x' is not a number"});
  expect_error([] { command("printf 'nan\\n'")->score(samples(1)); },
               {"line 1: 'nan' is not finite"});
  expect_error([] { command("printf '1\\n-inf\\n'")->score(samples(2)); },
               {"line 2: '-inf' is not finite"});
  expect_error([] { command("cat >/dev/null; echo broken >&2; exit 3")->score(samples(1)); },
               {"exited with status 3", "its stderr: broken"});
  expect_error([] { command("kill -SEGV $$")->score(samples(1)); }, {"killed by signal 11"});
  expect_error([] { command("/nonexistent/scorer")->score(samples(1)); },
               {"exited with status 127"});
  expect_no_children();

  expect_error([] { make_command_task(nullptr, "true", 1.0); }, {"no base task"});
  expect_error([] { make_command_task(make_builtin_task("copy", 3, 2048), "", 1.0); },
               {"empty command"});
  for (double t : {0.0, -1.0, 2e6, double(NAN), double(INFINITY)})
    expect_error([t] { make_command_task(make_builtin_task("copy", 3, 2048), "true", t); },
                 {"timeout_s must be in (0, 1e+06]"});
}

// A caller with its stdin closed: the pipe ends land on fd 0 and must still reach the command.
TEST(CommandTask, CallerWithClosedStdin) {
  const int saved = ::dup(0);
  ASSERT_GE(saved, 0);
  ::close(0);
  std::vector<double> got;
  try {
    got = command("wc -l | tr -d ' '")->score(samples(1));
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  ::dup2(saved, 0);
  ::close(saved);
  EXPECT_EQ(got, std::vector<double>{1.0});  // one JSONL line read
  expect_no_children();
}

// A command that never reads its (large) stdin: the writes hit EPIPE, which must neither kill
// this process (SIGPIPE) nor hide the command's real answer.
TEST(CommandTask, CommandThatIgnoresItsInput) {
  std::vector<Sample> s = samples(20000);
  for (Sample& x : s) x.prompt.resize(64, 7);
  std::vector<double> want(s.size(), 1.0);
  std::string ones = "yes 1 | head -n " + std::to_string(s.size());
  EXPECT_EQ(command("exec 0<&-; " + ones)->score(s), want);
  expect_error([&] { command("exec 0<&-; printf '1\\n'")->score(s); },
               {"expected 20000 rewards, got 1"});
  expect_no_children();
}

// True when the process is dead: gone, or a zombie. A killed grandchild is an orphan; whoever
// adopts it (init, or a container's PID 1 that may never reap) holds it as a zombie until it
// reaps, and kill(pid, 0) succeeds on a zombie, so the state letter in /proc decides.
bool process_dead_now(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;    // vanished between the two looks
  const std::size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

bool process_gone(pid_t pid) {
  for (int i = 0; i < 200; ++i) {  // give the kill up to 2 s to land
    if (process_dead_now(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

pid_t read_pid(const std::string& path) {
  std::ifstream f(path);
  pid_t pid = 0;
  f >> pid;
  return pid;
}

TEST(CommandTask, TimeoutKillsTheWholeGroup) {
  const std::string path = ::testing::TempDir() + "lockstep_test_tasks.pid";
  std::remove(path.c_str());
  // The shell starts a background sleep (a grandchild of ours) and waits on it.
  const auto task = command("sleep 30 & echo $! >'" + path + "'; wait", 0.5);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { task->score(samples(2)); }, {"did not answer within 0.5 s"});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 3.0);
  EXPECT_GE(took, 0.45);
  expect_no_children();
  const pid_t grandchild = read_pid(path);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(process_gone(grandchild)) << "sleep " << grandchild << " still runs";
  std::remove(path.c_str());

  // A command that answers and exits but leaves a background job: the job is killed too.
  const auto leaves_job = command("sleep 30 >/dev/null 2>&1 & echo $! >'" + path + "'; echo 1");
  EXPECT_EQ(leaves_job->score(samples(1)), std::vector<double>{1.0});
  const pid_t job = read_pid(path);
  ASSERT_GT(job, 0);
  EXPECT_TRUE(process_gone(job)) << "background sleep " << job << " still runs";
  std::remove(path.c_str());

  // Closing stdout and stderr and then hanging is a timeout too, not a hang of ours.
  expect_error([] { command("exec >&- 2>&-; sleep 30", 0.5)->score(samples(1)); },
               {"did not answer within 0.5 s"});
  // Answers, but never exits.
  expect_error([] { command("printf '1\\n'; exec >&- 2>&-; sleep 30", 0.5)->score(samples(1)); },
               {"did not answer within 0.5 s"});
  expect_no_children();
}

}  // namespace
}  // namespace lockstep::engine
