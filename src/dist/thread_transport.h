// The thread transport: n ranks as n threads of one process, each with its own Communicator over
// shared host memory (one mutex, one condition variable, a generation counter per rendezvous).
// It exists so that multi-rank code runs on the CPU and in CI with the interface the NCCL
// transport will have. Collectives copy bytes with memcpy (no arithmetic); host tensors only.
#pragma once

#include <functional>

#include "lockstep/dist/communicator.h"

namespace lockstep::dist {

// Runs body(comm) on n threads, rank r's comm having rank() == r, joins them all, then rethrows
// the exception of the rank that failed first (in time), if any. When a rank's body throws, the
// other ranks' pending and later collectives throw promptly ("rank 2 failed: ...") instead of
// waiting for the timeout; when a rank's body returns, collectives still waiting for it throw
// ("rank 2 returned without calling all_gather").
void run_ranks(int n, const std::function<void(Communicator&)>& body,
               const CommOptions& options = {});

}  // namespace lockstep::dist
