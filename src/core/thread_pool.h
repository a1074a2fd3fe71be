// A persistent worker pool for the CPU backend. parallel_for splits [0, n) into contiguous
// ranges; every op writes each output from exactly one range with a fixed inner order, so
// results never depend on the thread count (tests check this).
#pragma once

#include <cstdint>
#include <functional>

namespace lockstep {

// Number of threads the CPU backend uses (default: hardware concurrency).
int num_threads();
// Set it (>= 1). Not thread-safe with respect to running parallel_for calls.
void set_num_threads(int n);

// Calls fn(begin, end) over disjoint ranges covering [0, n). `grain` is the smallest range
// worth a task. Exceptions thrown by fn are rethrown (the first one) on the calling thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace lockstep
