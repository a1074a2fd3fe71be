// `lockstep launch --nproc N [--timeout S] -- COMMAND [ARGS...]`: the ranks of one job as N
// processes of COMMAND on this host, each with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
// one fresh LOCKSTEP_JOB_ID (dist::ProcessGroupSpec::from_env reads them), every line they print
// labelled "[rank R] ". When a rank fails (non-zero exit, a signal) or the job outlives --timeout,
// the other ranks' process groups are stopped (SIGTERM, then SIGKILL) and it exits 1 naming the
// rank and how it ended. `lockstep dist-selftest` is a rank that checks the collectives' bytes.
#pragma once

#include "tools/cli.h"

namespace lockstep::tools {

Command add_launch_command(CLI::App& top);
// `lockstep dist-selftest [--timeout MS] [--slot-bytes N]`: joins the job from the environment
// (run it under `lockstep launch`) and checks all_gather, broadcast and barrier byte for byte.
Command add_dist_selftest_command(CLI::App& top);

}  // namespace lockstep::tools
