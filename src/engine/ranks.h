// How one side's tensor-parallel ranks run (the audit's --rollout-ranks / --train-ranks, grpo's
// --train-ranks), and the check that the ranks of a launched job agree. Every mode gives the
// simulated TP's bits: collectives move bytes only and every combine runs in rank order
// (docs/dist.md).
#pragma once

#include <string>

#include "lockstep/dist/communicator.h"

namespace lockstep::engine {

enum class RankMode {
  kSimulated,  // one model holds and runs every rank's shards, in this process
  kThreads,    // one rank-local model per rank, each on a thread of this process (thread transport)
  kLaunch,     // this process is ONE rank of a job (`lockstep launch`, one process per rank): one
               // rank-local model over the job's communicator (process transport)
};

// "simulated", "threads", "launch".
const char* rank_mode_name(RankMode m);

// A collective over `job`: returns when every rank passed the same `sha256` (64 hex digits, e.g.
// of the records it computed); otherwise throws the same Error on every rank, naming `what` and
// the ranks whose digest differs from rank 0's. How a launched job checks that its ranks computed
// the same result (the thread mode compares the results in memory).
void check_same_sha256_on_every_rank(dist::Communicator& job, const std::string& sha256,
                                     const std::string& what);

}  // namespace lockstep::engine
