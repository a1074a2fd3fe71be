// What a rank brings to a collective (CollectiveCall) and the checks every transport runs on it:
// check_local on the rank's own views before it waits, check_agree on all ranks' calls once every
// rank has arrived (each rank runs it on the same calls, so all throw the same Error or none).
#pragma once

#include <span>
#include <string>

#include "lockstep/tensor.h"

namespace lockstep::dist {

enum class CollectiveOp { kAllGather, kBroadcast, kBarrier };
const char* collective_name(CollectiveOp op);  // "all_gather", ...

struct CollectiveCall {
  CollectiveOp op = CollectiveOp::kBarrier;
  TensorView send;  // all_gather: send; broadcast: buf; barrier: empty
  TensorView recv;  // all_gather: recv; otherwise empty
  int root = 0;     // broadcast only
};

// Throws lockstep::Error ("all_gather: rank 1: recv: ...") on a bad view of this rank: not
// contiguous, not on `device`, recv not [size, send's shape] of send's dtype, recv overlapping send
// other than exactly in place, root outside [0, size).
void check_local(const CollectiveCall& call, int rank, int size, Device device,
                 const char* transport);
// Throws lockstep::Error naming the first rank whose call differs from rank 0's (op, dtype,
// shape, root).
void check_agree(std::span<const CollectiveCall> calls);

}  // namespace lockstep::dist
