// Communicator: the ranks of one tensor-parallel job and the collectives they run together
// (all_gather, broadcast, barrier). The collectives move bytes only: no transport adds, reduces
// or converts anything, so every received element has its sender's bits (NaN payloads included).
// Combining row-parallel fp32 partials stays the caller's job: all_gather them, then run the
// canonical tree of docs/contract.md §G.4-G.5 (OpsBackend::gemm_combine) on every rank. That, and
// never an NCCL reduction, is what makes multi-rank results equal the in-process simulated TP bit
// for bit.
#pragma once

#include <chrono>
#include <string>

#include "lockstep/tensor.h"

namespace lockstep::dist {

// Settings of a communicator (a value: print it with to_string()).
struct CommOptions {
  // How long a blocking call waits for the other ranks before it throws lockstep::Error naming
  // the op, this rank and the ranks that had not arrived.
  std::chrono::milliseconds timeout{60'000};

  void validate() const;          // throws lockstep::Error on a bad setting
  std::string to_string() const;  // "comm: timeout=60000ms"
};

// One rank's handle. Every rank calls the same collectives in the same order (like NCCL). Rules
// common to all calls:
// - Blocking: a call returns once every rank has called it and its bytes are in place; it throws
//   lockstep::Error after options().timeout, or as soon as another rank of the job has failed
//   ("rank 2 failed: ..."), instead of hanging.
// - Arguments are checked on each rank (views contiguous, on a device the transport supports,
//   recv shaped as below) and across ranks (same op, same dtype and shape, same root): a mismatch
//   throws the same Error on every rank, never a hang or a partial copy.
// - After any error the job is broken: every later call on every rank throws.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // in [0, size())
  virtual int size() const = 0;
  virtual const CommOptions& options() const = 0;

  // recv[r] = rank r's send, for r in rank order, copied byte for byte.
  //   send  [d0, ..., dk]       any dtype; the same dtype and shape on every rank
  //   recv  [size(), d0, ..., dk]  same dtype; must not overlap send, except exactly in place
  //                             (send is recv[rank()], as NCCL allows)
  virtual void all_gather(const TensorView& send, const TensorView& recv) = 0;
  // buf on every rank = buf of rank `root`, byte for byte (same dtype, shape and root everywhere).
  virtual void broadcast(const TensorView& buf, int root) = 0;
  // Returns once every rank has called it: writes before it on any rank happen before reads
  // after it on every rank (for the thread transport, host memory).
  virtual void barrier() = 0;
};

}  // namespace lockstep::dist
