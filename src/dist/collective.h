// What a rank brings to a collective (CollectiveCall) and the checks every transport runs on it:
// check_local on the rank's own views before it waits, check_agree on all ranks' calls once every
// rank has arrived (each rank runs it on the same calls, so all throw the same Error or none).
#pragma once

#include <chrono>
#include <cstdint>
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

int64_t view_bytes(const TensorView& t);  // numel · dtype size

// The waits' words, shared so that every transport says the same thing. Per-rank flags are one
// byte a rank (1 = set) so that they fit shared memory as well as a std::vector.
// "[1, 3]": the ranks r with flags[r] == value.
std::string rank_list(std::span<const uint8_t> flags, bool value);
// The first rank that has not arrived and has left the job (exited[r]), or -1.
int missing_and_exited(std::span<const uint8_t> arrived, std::span<const uint8_t> exited);
// "barrier: rank 0 timed out after 250 ms waiting for ranks [1] (arrived: [0, 2])"
std::string timeout_message(const char* op, int rank, std::chrono::milliseconds timeout,
                            std::span<const uint8_t> arrived);
// "broadcast: rank 0: rank 2 returned without calling broadcast"
std::string returned_message(const char* op, int rank, int returned);

}  // namespace lockstep::dist
