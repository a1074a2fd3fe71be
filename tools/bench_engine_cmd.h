// `lockstep bench-engine`: rollout tokens/s and training-forward tokens/s of the invariant and the
// baseline backends on one device, same requests and same schedule, in one run. Takes the flags of
// `lockstep audit` (tools/engine_options.h).
#pragma once

#include "tools/cli.h"

namespace lockstep::tools {

// Exit status of its run: 0, or 2 on bad usage / error.
Command add_bench_engine_command(CLI::App& top);

}  // namespace lockstep::tools
