// Shared by the communicator tests (tests/cpu/test_dist.cc, tests/cuda/test_dist_nccl.cu; no
// GoogleTest: the GPU machine has none): run a body on every rank and keep each rank's error.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lockstep/dist/communicator.h"
#include "lockstep/error.h"

namespace lockstep::test {

// Runs body on n ranks through run(n, wrapped_body) (dist::run_ranks, or a runner that hands each
// rank another transport's communicator) and returns each rank's lockstep::Error message ("" for
// a rank that did not throw one).
template <typename Run>
std::vector<std::string> rank_errors(const Run& run, int n,
                                     const std::function<void(dist::Communicator&)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  run(n, [&](dist::Communicator& c) {
    try {
      body(c);
    } catch (const Error& e) {
      errors[size_t(c.rank())] = e.what();
    }
  });
  return errors;
}

}  // namespace lockstep::test
