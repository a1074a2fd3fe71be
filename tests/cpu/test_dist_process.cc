// The process transport's own cases (src/dist/process_transport.h); the cases both transports
// share are test_dist.cc. A rank process killed (between collectives, or mid-collective while it
// holds the segment's lock or not) or exiting without closing its communicator fails every other
// rank promptly, naming it and its pid; payloads chunk through a tiny slot byte for byte; joining
// checks the job (world size, slot bytes, duplicate ranks, a live job of the same id, rank 0
// missing) and replaces a stale segment of a dead job; the segment is unlinked once every rank has
// joined; from_env reads torchrun's variables with clear errors.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "util/dist_test_util.h"

namespace lockstep {
namespace {

using dist::Communicator;
using dist::fork_rank_processes;
using dist::ProcessGroupSpec;
using dist::RankProcessResult;
using test::expect_error_mentioning;
using test::seconds_since;
using test::timeout_ms;

std::string needle_died(const RankProcessResult& r) {
  return "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") died";
}

// Every rank but `dead` threw an error naming it as dead; `dead` ended without one.
void expect_others_saw_death(const std::vector<RankProcessResult>& results, int dead) {
  for (const RankProcessResult& r : results) {
    if (r.rank == dead) continue;
    EXPECT_NE(r.error.find(needle_died(results[size_t(dead)])), std::string::npos) << r.describe();
  }
  EXPECT_EQ(results[size_t(dead)].error, "");
}

TEST(DistProcess, KilledRankFailsTheOthersPromptly) {
  // Rank 2 is SIGKILLed between two collectives. The parent reaps rank 0 first, so rank 2 stays
  // a zombie meanwhile: the others must still see it dead.
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<RankProcessResult> results = fork_rank_processes(
      4,
      [](Communicator& c) {
        float v = float(c.rank()), all[4];
        c.all_gather(TensorView::contiguous(&v, DType::kF32, {1}),
                     TensorView::contiguous(all, DType::kF32, {4, 1}));
        if (c.rank() == 2) ::raise(SIGKILL);
        c.all_gather(TensorView::contiguous(&v, DType::kF32, {1}),
                     TensorView::contiguous(all, DType::kF32, {4, 1}));
      },
      timeout_ms(60000));
  EXPECT_LT(seconds_since(t0), 20.0);  // the timeout is 60 s
  ASSERT_TRUE(WIFSIGNALED(results[2].status)) << results[2].describe();
  EXPECT_EQ(WTERMSIG(results[2].status), SIGKILL);
  expect_others_saw_death(results, 2);
  EXPECT_NE(results[0].error.find("all_gather: rank 0: "), std::string::npos) << results[0].error;
  // run_rank_processes names the killed rank first: it is the cause.
  expect_error_mentioning(
      [] {
        dist::run_rank_processes(2, [](Communicator& c) {
          if (c.rank() == 1) ::raise(SIGKILL);
          c.barrier();
        });
      },
      ") was killed by signal 9 (Killed)");
}

TEST(DistProcess, RankKilledMidCollectiveFailsTheOthers) {
  // Rank 1 is killed by a thread of its own while every rank streams a payload through a 64-byte
  // slot (hundreds of rendezvous a call): it may die holding the segment's lock or not.
  const int n = 3;
  const int64_t len = 4096;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<RankProcessResult> results = fork_rank_processes(
      n,
      [&](Communicator& c) {
        if (c.rank() == 1)
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            ::kill(::getpid(), SIGKILL);
          }).detach();
        std::vector<float> send(len, float(c.rank())), recv(n * len);
        for (int i = 0; i < 2000; ++i)
          c.all_gather(TensorView::contiguous(send.data(), DType::kF32, {len}),
                       TensorView::contiguous(recv.data(), DType::kF32, {n, len}));
        throw Error("rank 1 was never killed");
      },
      timeout_ms(60000), 64);
  EXPECT_LT(seconds_since(t0), 20.0);
  ASSERT_TRUE(WIFSIGNALED(results[1].status)) << results[1].describe();
  expect_others_saw_death(results, 1);
}

TEST(DistProcess, RankThatExitsWithoutClosingFailsTheOthers) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<RankProcessResult> results = fork_rank_processes(
      3,
      [](Communicator& c) {
        c.barrier();
        if (c.rank() == 0) ::_exit(0);  // no destructor: the others see a dead process
        c.barrier();
      },
      timeout_ms(60000));
  EXPECT_LT(seconds_since(t0), 20.0);
  EXPECT_TRUE(results[0].ok()) << results[0].describe();
  expect_others_saw_death(results, 0);
  EXPECT_NE(results[1].error.find("barrier: rank 1: rank 0 (pid "), std::string::npos)
      << results[1].error;
}

TEST(DistProcess, ChunksThroughATinySlotByteForByte) {
  // 64-byte slots: a bf16[1001] all_gather is 32 chunks; a broadcast's chunk is 3 slots.
  const int n = 3;
  const int64_t len = 1001;
  auto g = test::rng(11);
  std::vector<Tensor> send, recv, in_place, bcast;
  std::vector<Tensor> roots;  // what each root broadcasts
  for (int r = 0; r < n; ++r) {
    send.push_back(test::random_bf16({len}, g));
    recv.push_back(test::shared_poisoned(DType::kBF16, {n, len}));
    in_place.push_back(test::shared_poisoned(DType::kBF16, {n, len}));
    std::memcpy(in_place.back().ptr<bf16>() + r * len, send.back().data(),
                size_t(send.back().nbytes()));
    roots.push_back(test::random_f32({777}, g));
    bcast.push_back(test::shared_poisoned(DType::kF32, {n, 777}));  // [root]
  }
  dist::run_rank_processes(
      n,
      [&](Communicator& c) {
        const size_t r = size_t(c.rank());
        c.all_gather(send[r].view(), recv[r].view());
        c.all_gather(TensorView::contiguous(in_place[r].ptr<bf16>() + r * len, DType::kBF16, {len}),
                     in_place[r].view());
        for (int root = 0; root < n; ++root) {
          float* buf = bcast[r].ptr<float>() + root * 777;
          if (c.rank() == root) std::memcpy(buf, roots[size_t(root)].data(), 777 * sizeof(float));
          c.broadcast(TensorView::contiguous(buf, DType::kF32, {777}), root);
        }
      },
      timeout_ms(60000), 64);
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s) {
      EXPECT_BITWISE_EQ(recv[size_t(r)].ptr<bf16>() + s * len, send[size_t(s)].data(), len,
                        DType::kBF16)
          << "rank " << r << " from " << s;
      EXPECT_BITWISE_EQ(in_place[size_t(r)].ptr<bf16>() + s * len, send[size_t(s)].data(), len,
                        DType::kBF16)
          << "in place: rank " << r << " from " << s;
      EXPECT_BITWISE_EQ(bcast[size_t(r)].ptr<float>() + s * 777, roots[size_t(s)].data(), 777,
                        DType::kF32)
          << "broadcast: rank " << r << " root " << s;
    }
  }
}

// ----- joining, on threads of this process (the transport does not care; no fork needed) -----

ProcessGroupSpec spec_of(const std::string& job, int rank, int world, int join_ms = 60000) {
  ProcessGroupSpec s;
  s.job_id = job;
  s.rank = rank;
  s.world_size = world;
  s.join_timeout = std::chrono::milliseconds(join_ms);
  return s;
}

// shm_open's view of it (the transport opens the file /dev/shm/lockstep.<job>).
bool segment_exists(const std::string& job) {
  const int fd = ::shm_open(("/lockstep." + job).c_str(), O_RDONLY, 0);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

// Joins each spec on its own thread and runs body(comm) there; returns each one's Error text.
std::vector<std::string> join_on_threads(
    const std::vector<ProcessGroupSpec>& specs,
    const std::function<void(dist::ProcessCommunicator&)>& body = {}) {
  std::vector<std::string> errors(specs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < specs.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        const std::unique_ptr<dist::ProcessCommunicator> c = dist::join_process_group(specs[i]);
        if (body) body(*c);
      } catch (const Error& e) {
        errors[i] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

TEST(DistProcess, JoinUnlinksTheSegmentOnceEveryRankIsIn) {
  const std::string job = dist::make_job_id();
  bool seen_before = false;
  const std::vector<std::string> errors =
      join_on_threads({spec_of(job, 0, 2), spec_of(job, 1, 2)}, [&](Communicator& c) {
        c.barrier();
        if (c.rank() == 0) seen_before = segment_exists(job);
        c.barrier();
      });
  EXPECT_EQ(errors, std::vector<std::string>(2));
  EXPECT_FALSE(seen_before);
  EXPECT_FALSE(segment_exists(job));
  EXPECT_NE(dist::make_job_id(), job);
}

TEST(DistProcess, JoinChecksTheJob) {
  // A rank whose spec differs from the job's fails the join of every rank.
  const std::string a = dist::make_job_id();
  std::vector<std::string> errors = join_on_threads({spec_of(a, 0, 2), spec_of(a, 1, 3)});
  EXPECT_NE(errors[1].find("join: rank 1: world size 3, but the job's rank 0 (pid "),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0].find("join: rank 0: rank 1 failed: join: rank 1: world size 3"),
            std::string::npos)
      << errors[0];
  EXPECT_FALSE(segment_exists(a));

  ProcessGroupSpec small = spec_of(a, 1, 2);
  small.slot_bytes = 4096;
  errors = join_on_threads({spec_of(a, 0, 2), small});
  for (const std::string& e : errors)
    EXPECT_NE(e.find("slot_bytes 4096, but the job's rank 0 (pid "), std::string::npos) << e;

  // Two processes that both think they are rank 1.
  errors = join_on_threads({spec_of(a, 0, 3), spec_of(a, 1, 3), spec_of(a, 1, 3)});
  for (const std::string& e : errors)
    EXPECT_NE(e.find("rank 1 has already joined (pid "), std::string::npos) << e;

  // A rank that never comes, and a rank 0 that never comes.
  errors = join_on_threads({spec_of(a, 0, 2, 300)});
  EXPECT_NE(errors[0].find("join: rank 0 timed out after 300 ms waiting for ranks [1] "
                           "(arrived: [0])"),
            std::string::npos)
      << errors[0];
  errors = join_on_threads({spec_of(a, 1, 2, 300)});
  EXPECT_NE(errors[0].find("join: rank 1 timed out after 300 ms waiting for rank 0 to create the "
                           "job's segment " +
                           dist::job_segment_path(a)),
            std::string::npos)
      << errors[0];
  EXPECT_FALSE(segment_exists(a));
}

TEST(DistProcess, JobIdOfALiveJobIsRefused) {
  const std::string job = dist::make_job_id();
  std::vector<std::string> first;
  std::thread t([&] { first = join_on_threads({spec_of(job, 0, 2)}); });
  // Under the job's name there is only ever a whole segment: once it is there, the job is live.
  while (!segment_exists(job)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string second = join_on_threads({spec_of(job, 0, 2, 2000)})[0];
  // A rank 1 of another world size ends the first job's wait.
  const std::string third = join_on_threads({spec_of(job, 1, 3, 2000)})[0];
  t.join();
  EXPECT_NE(
      second.find("join: rank 0: job id '" + job + "' is in use by a live job (its rank 0 is pid " +
                  std::to_string(::getpid()) + ")"),
      std::string::npos)
      << second;
  EXPECT_NE(third.find("world size 3, but"), std::string::npos) << third;
  EXPECT_NE(first[0].find("rank 1 failed: join: rank 1: world size 3"), std::string::npos)
      << first[0];
  EXPECT_FALSE(segment_exists(job));
}

TEST(DistProcess, StaleSegmentOfADeadJobIsReplaced) {
  const std::string job = dist::make_job_id();
  // A job whose rank 0 was killed while it waited for rank 1 leaves its segment behind.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      dist::join_process_group(spec_of(job, 0, 2));
    } catch (...) {
    }
    ::_exit(0);
  }
  while (!segment_exists(job)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(segment_exists(job));
  // The next job of that id works (its rank 1 may open the stale segment first: it waits).
  const std::vector<std::string> errors =
      join_on_threads({spec_of(job, 1, 2), spec_of(job, 0, 2)}, [](Communicator& c) {
        int v = c.rank(), all[2] = {-1, -1};
        c.all_gather(TensorView::contiguous(&v, DType::kI32, {1}),
                     TensorView::contiguous(all, DType::kI32, {2, 1}));
        if (all[0] != 0 || all[1] != 1) throw Error("wrong bytes");
      });
  EXPECT_EQ(errors, std::vector<std::string>(2));
  EXPECT_FALSE(segment_exists(job));

  // A segment too short to hold a header (a rank 0 that died setting it up) is replaced too.
  const int fd = ::open(dist::job_segment_path(job).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ(join_on_threads({spec_of(job, 0, 2), spec_of(job, 1, 2)}), std::vector<std::string>(2));
  EXPECT_FALSE(segment_exists(job));
}

TEST(DistProcess, CommunicatorClosedByAnExceptionFailsTheJob) {
  const std::string job = dist::make_job_id();
  std::string other;
  std::thread t([&] {
    try {
      dist::join_process_group(spec_of(job, 0, 2))->barrier();
    } catch (const Error& e) {
      other = e.what();
    }
  });
  try {
    const auto comm = dist::join_process_group(spec_of(job, 1, 2));
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  t.join();
  EXPECT_NE(other.find("barrier: rank 0: rank 1 failed: its communicator was closed by an "
                       "exception"),
            std::string::npos)
      << other;
}

TEST(DistProcess, SpecChecksAndPrints) {
  ProcessGroupSpec s = spec_of("job-1", 1, 4);
  EXPECT_EQ(s.to_string(),
            "process group: rank 1 of 4, job job-1, slot 1048576 B, join 60000ms, comm: "
            "timeout=60000ms");
  auto bad = [](ProcessGroupSpec s, const std::string& needle) {
    expect_error_mentioning([&] { dist::join_process_group(s); }, needle);
  };
  bad(spec_of("j", 4, 4), "rank: expected in [0, 4), got 4");
  bad(spec_of("j", 0, 0), "world_size: expected in [1, 1024], got 0");
  bad(spec_of("a/b", 0, 1), "job_id: expected 1..200 characters of [A-Za-z0-9._-], got 'a/b'");
  bad(spec_of("", 0, 1), "job_id");
  s.slot_bytes = 63;
  bad(s, "slot_bytes: expected in [64, 2^30], got 63");
  bad(spec_of("j", 0, 1, 0), "join_timeout: expected > 0 ms");
  expect_error_mentioning([] { dist::run_rank_processes(0, [](Communicator&) {}); },
                          "n: expected >= 1 ranks, got 0");
  expect_error_mentioning(
      [] {
        dist::run_rank_processes(
            1, [](Communicator&) {}, {}, 16);
      },
      "slot_bytes");
  // A world of one needs no one else.
  const std::string job = dist::make_job_id();
  const auto alone = dist::join_process_group(spec_of(job, 0, 1));
  alone->barrier();
  EXPECT_FALSE(segment_exists(job));
}

TEST(DistProcess, RankResultsDescribeHowTheyEnded) {
  RankProcessResult r;
  r.rank = 2;
  r.pid = 77;
  r.status = 3 << 8;  // exited with status 3
  EXPECT_EQ(r.describe(), "rank 2 (pid 77) exited with status 3");
  EXPECT_FALSE(r.ok());
  r.status = SIGKILL;
  EXPECT_EQ(r.describe(), "rank 2 (pid 77) was killed by signal 9 (Killed)");
  r.status = 0;
  EXPECT_TRUE(r.ok());
  r.error = "boom";
  EXPECT_EQ(r.describe(), "rank 2 (pid 77) failed: boom");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(dist::process_running(::getpid()));
  EXPECT_TRUE(dist::process_running(::getpid(), dist::process_start_time(::getpid())));
  EXPECT_FALSE(dist::process_running(::getpid(), dist::process_start_time(::getpid()) + 1));
  // A child that has exited but is not reaped yet is a zombie: not running.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(0);
  bool gone = false;
  for (int i = 0; i < 2000 && !gone; ++i) {
    gone = !dist::process_running(pid);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(gone);
  EXPECT_EQ(::waitpid(pid, nullptr, 0), pid);
  EXPECT_EQ(dist::process_start_time(pid), 0u);
}

// ----- from_env -----

ProcessGroupSpec from(const std::map<std::string, std::string>& env) {
  return ProcessGroupSpec::from_env([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string from_error(const std::map<std::string, std::string>& env) {
  try {
    from(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(DistProcess, FromEnvReadsTorchrunVariables) {
  ProcessGroupSpec s = from({{"RANK", "2"},
                             {"WORLD_SIZE", "4"},
                             {"LOCAL_RANK", "2"},
                             {"LOCAL_WORLD_SIZE", "4"},
                             {"LOCKSTEP_JOB_ID", "abc.1-x"}});
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.world_size, 4);
  EXPECT_EQ(s.job_id, "abc.1-x");
  s = from(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(s.job_id, "master-10.0.0.1-29500");
  EXPECT_EQ(from({{"RANK", "0"},
                  {"WORLD_SIZE", "1"},
                  {"MASTER_ADDR", "fe80::1%eth0"},
                  {"MASTER_PORT", "1"}})
                .job_id,
            "master-fe80__1_eth0-1");
  // LOCKSTEP_JOB_ID wins over MASTER_*.
  EXPECT_EQ(from({{"RANK", "0"},
                  {"WORLD_SIZE", "1"},
                  {"LOCKSTEP_JOB_ID", "j"},
                  {"MASTER_ADDR", "h"},
                  {"MASTER_PORT", "1"}})
                .job_id,
            "j");
}

TEST(DistProcess, FromEnvErrorsNameTheVariable) {
  const std::map<std::string, std::string> ok = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCKSTEP_JOB_ID", "j"}};
  auto with = [&](const std::string& k, const std::string& v) {
    std::map<std::string, std::string> e = ok;
    e[k] = v;
    return from_error(e);
  };
  auto without = [&](const std::string& k) {
    std::map<std::string, std::string> e = ok;
    e.erase(k);
    return from_error(e);
  };
  auto has = [](const std::string& got, const std::string& needle) {
    EXPECT_NE(got.find(needle), std::string::npos) << got;
  };
  has(without("RANK"), "RANK is not set");
  has(without("WORLD_SIZE"), "WORLD_SIZE is not set");
  has(with("RANK", "x1"), "RANK: expected a decimal integer, got 'x1'");
  has(with("RANK", "-1"), "RANK: expected a decimal integer, got '-1'");
  has(with("RANK", ""), "RANK: expected a decimal integer, got ''");
  has(with("RANK", "1 "), "got '1 '");
  has(with("RANK", "99999999999999999999"), "RANK: expected a decimal integer");
  has(with("RANK", "2"), "RANK: expected in [0, 2) (WORLD_SIZE=2), got 2");
  has(with("WORLD_SIZE", "0"), "WORLD_SIZE: expected in [1, 1024], got 0");
  has(with("WORLD_SIZE", "1025"), "WORLD_SIZE: expected in [1, 1024], got 1025");
  has(with("LOCAL_RANK", "0"),
      "LOCAL_RANK=0 differs from RANK=1 (the shared-memory process "
      "group runs on one host");
  has(with("LOCAL_RANK", "z"), "LOCAL_RANK: expected a decimal integer, got 'z'");
  has(with("LOCAL_WORLD_SIZE", "1"), "LOCAL_WORLD_SIZE=1 differs from WORLD_SIZE=2");
  has(with("LOCKSTEP_JOB_ID", "a b"),
      "LOCKSTEP_JOB_ID: expected 1..200 characters of [A-Za-z0-9._-], got 'a b'");
  has(with("LOCKSTEP_JOB_ID", std::string(201, 'a')), "LOCKSTEP_JOB_ID: expected 1..200");
  has(without("LOCKSTEP_JOB_ID"),
      "no job id: set LOCKSTEP_JOB_ID (lockstep launch does), or MASTER_ADDR and MASTER_PORT");
  std::map<std::string, std::string> m = {
      {"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}};
  has(from_error(m), "MASTER_PORT: expected a port in [1, 65535], got 0");
  m["MASTER_PORT"] = "http";
  has(from_error(m), "MASTER_PORT: expected a decimal integer, got 'http'");
  m.erase("MASTER_PORT");
  has(from_error(m), "no job id");
}

}  // namespace
}  // namespace lockstep
