// `lockstep bench-engine`: rollout tokens/s and training-forward tokens/s of the invariant and the
// baseline backends on one device, same requests and same schedule, in one run.
#pragma once

namespace lockstep::tools {

// argv[0] is "bench-engine". Exit status 0, or 2 on bad usage / error.
int run_bench_engine_command(int argc, char** argv);

}  // namespace lockstep::tools
