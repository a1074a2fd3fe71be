// The NCCL transport: one rank per GPU (a thread or a process each), its collectives moving the
// bytes of device memory with ncclAllGather / ncclBroadcast on ncclUint8 (never an NCCL reduction:
// lockstep combines partials itself, docs/contract.md §G.4-G.5). Every call first all-gathers a
// fixed-size descriptor of each rank's call (op, dtype, shape, root, and the rank's own argument
// error if any), so a bad or mismatched call throws the same Error on every rank instead of
// hanging or moving the wrong bytes. The communicator is non-blocking: each call polls NCCL and
// its stream until done or CommOptions::timeout passes, then aborts it (ncclCommAbort) and throws.
// Built into lockstep_dist_nccl (CUDA on and NCCL found); compiled, not yet run on a GPU here.
#pragma once

#include <memory>
#include <string>

#include "lockstep/dist/communicator.h"

namespace lockstep::dist {

// Joins the NCCL communicator of bootstrap's ranks: rank bootstrap.rank() of bootstrap.size(),
// on CUDA device `cuda_device` (one device per rank). Every rank of bootstrap calls it (it is a
// collective on bootstrap: rank 0 creates the ncclUniqueId, one bootstrap.broadcast hands it to
// the others). Bootstrap may be any transport (the thread transport in tests); it is not used
// afterwards. Calls disable_nccl_nvls() first.
// Throws lockstep::Error on a bad device, an NCCL error, or when the communicator is not up after
// options.timeout (then it is aborted).
//
// The communicator it returns, beyond Communicator's rules:
// - Views must be contiguous device memory of `cuda_device` (Device::kCUDA; a host view or
//   another device's memory throws).
// - Ordering: its stream is a blocking stream of `cuda_device`, so a call starts after every
//   operation issued before it on that device's legacy default stream (where lockstep's CUDA ops
//   run) and returns once its bytes are in place. Work on other non-blocking streams must be
//   synchronized by the caller first.
// - A rank whose arguments are bad (locally or against the others) makes every rank throw at once.
//   A rank that never calls is seen only at the timeout: NCCL cannot tell a slow rank from a dead
//   one. After a timeout or an NCCL / CUDA error the communicator is aborted; after any error the
//   job is broken and every later call throws.
// - One thread at a time per communicator; the destructor finalizes it (waiting for the other
//   ranks up to the timeout, then aborting) and never throws.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device,
                                                     const CommOptions& options = {});

// Sets NCCL_NVLS_ENABLE=0 (overriding any other value), once per process; make_nccl_communicator
// calls it, and so must any code that creates an NCCL communicator of its own (the benchmark's
// all-reduce baseline) before its first NCCL call. nccl_transport.cc says why.
void disable_nccl_nvls();

// "NCCL 2.28.9 (built with 2.28.9)": the library loaded at run time, which may differ from the
// headers the transport was compiled with.
std::string nccl_version();

}  // namespace lockstep::dist
