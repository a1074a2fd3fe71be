// The process transport: one rank per process on one host, over a shared-memory segment named
// after the job (the file /dev/shm/lockstep.<job id>). Each rank stages its bytes in its own slot
// of the segment and every rank memcpy's them out (no arithmetic); a payload larger than a slot
// goes through in slot-sized chunks. The ranks meet on a robust process-shared mutex and a futex
// word; a wait also watches the other ranks' processes, so a rank that throws, closes its
// communicator, or dies (killed, crashed, exited) ends every other rank's wait promptly, and the
// deadline (CommOptions::timeout) bounds the rest. Host memory only; the ranks share a PID
// namespace (each watches the others' pids). The segment's name is unlinked as soon as every rank
// has joined (and by run_rank_processes / `lockstep launch` when the job ends).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/dist/communicator.h"

namespace lockstep::dist {

// Where a rank process joins its job. A value: print it with to_string().
struct ProcessGroupSpec {
  static constexpr int kMaxWorld = 1024;
  static constexpr int64_t kDefaultSlotBytes = int64_t(1) << 20;

  int rank = 0;        // in [0, world_size)
  int world_size = 1;  // in [1, kMaxWorld]
  // Names the job's segment (job_segment_path): 1..200 characters of [A-Za-z0-9._-]. Every rank of
  // a job has the same one, and no two live jobs: `lockstep launch` makes a fresh one
  // (make_job_id()).
  std::string job_id;
  CommOptions options;  // bounds every collective
  // How long a rank waits for the others to join (rank 0 creates the segment; the others wait for
  // it). Separate from options.timeout: starting processes can take longer than a collective.
  std::chrono::milliseconds join_timeout{60'000};
  // Each rank's staging area in the segment, in [64, 2^30]; the same on every rank. A larger
  // payload goes through in chunks (a broadcast uses every rank's slot for one chunk).
  int64_t slot_bytes = kDefaultSlotBytes;

  void validate() const;  // throws lockstep::Error on a bad field
  // "process group: rank 1 of 4, job ab12, slot 1048576 B, join 60000ms, comm: timeout=60000ms"
  std::string to_string() const;

  // From torchrun-style variables: RANK and WORLD_SIZE (required, decimal); LOCAL_RANK and
  // LOCAL_WORLD_SIZE when set must equal them (the segment lives on one host); the job id from
  // LOCKSTEP_JOB_ID, else from MASTER_ADDR and MASTER_PORT ("master-<addr>-<port>", characters
  // outside [A-Za-z0-9.-] of the address as '_'). Throws lockstep::Error naming the variable for
  // a missing, malformed or out-of-range value. `getenv` is the lookup (nullptr: unset); tests
  // pass their own.
  static ProcessGroupSpec from_env(const std::function<const char*(const char*)>& getenv = {});
};

// A fresh job id, unique on this host: "<pid>-<16 random hex digits>".
std::string make_job_id();
// Where a job's segment is: "/dev/shm/lockstep.<job id>" (what shm_open("/lockstep.<job id>")
// opens).
std::string job_segment_path(const std::string& job_id);
// Unlinks the job's segment name if it is still there (its ranks unlink it once all have joined;
// a rank that died before that leaves it). For whoever started the job, once it has ended.
void remove_job_segment(const std::string& job_id);

// A rank's communicator over the job's segment. Closing it (the destructor) tells the other ranks
// this rank has left: their collectives still waiting for it throw ("rank 2 returned without
// calling barrier"); destroyed while an exception unwinds, it fails the job instead.
class ProcessCommunicator : public Communicator {
 public:
  // Fails the job with `what`: every other rank's pending and later collectives throw
  // ("rank 2 failed: <what>"). For an error of this rank outside a collective. Never throws.
  virtual void fail(const std::string& what) = 0;
};

// Joins the job: rank 0 creates the segment (replacing a stale one left by a dead job of the same
// id), the others open it; returns once every rank has joined. Throws lockstep::Error on a bad
// spec, a job id in use by a live job, or after spec.join_timeout ("join: rank 0 timed out after
// 60000 ms waiting for ranks [2] (arrived: [0, 1])"); a rank whose spec differs from the job's
// (world size, slot bytes), a rank that joins twice or dies while joining fails the join of every
// rank.
std::unique_ptr<ProcessCommunicator> join_process_group(const ProcessGroupSpec& spec);

// How one rank process of fork_rank_processes ended.
struct RankProcessResult {
  int rank = 0;
  pid_t pid = -1;
  int status = 0;        // as waitpid reports it
  std::string error;     // what the rank's body (or its join) threw, "" if nothing
  int error_order = -1;  // 0 for the first rank to throw, 1 for the next, ...; -1 if none
  bool ok() const;       // exited with status 0 and threw nothing
  // "rank 2 (pid 123) failed: <error>", "rank 2 (pid 123) was killed by signal 9 (Killed)", ...
  std::string describe() const;
};
// "exited with status 3", "was killed by signal 9 (Killed)"
std::string describe_wait_status(int status);

// True while process `pid` runs (not gone, not a zombie) and is the one that started at
// `start_time` (process_start_time's value; 0: any). A dead child not yet reaped answers kill(pid,
// 0) but is dead here.
bool process_running(pid_t pid, uint64_t start_time = 0);
// When `pid` started (clock ticks since boot, /proc/<pid>/stat), or 0 when it is gone.
uint64_t process_start_time(pid_t pid);

// Forks n rank processes of a fresh job; rank r joins it (join_process_group with `options` and
// `slot_bytes`), runs body(comm) and _exits: 0 when the body returned, 1 when it threw (its message
// goes back to the parent and fails the job, like ProcessCommunicator::fail). Waits for all of
// them, unlinks the job's segment, and returns how each ended, in rank order. Children die with the
// calling thread (PR_SET_PDEATHSIG). Call it from a single-threaded process (a test binary): the
// children run body after fork.
std::vector<RankProcessResult> fork_rank_processes(
    int n, const std::function<void(Communicator&)>& body, const CommOptions& options = {},
    int64_t slot_bytes = ProcessGroupSpec::kDefaultSlotBytes);
// fork_rank_processes, then throws lockstep::Error describing the first failure: a rank that ended
// without reporting an error (killed, crashed, exited non-zero) first, else the rank that threw
// first in time ("rank 2 (pid 123) failed: ..."). The process twin of run_ranks.
void run_rank_processes(int n, const std::function<void(Communicator&)>& body,
                        const CommOptions& options = {},
                        int64_t slot_bytes = ProcessGroupSpec::kDefaultSlotBytes);

}  // namespace lockstep::dist
