// `lockstep audit`: the main job. Rollout under one configuration, training forward under another,
// every generated token's log-prob compared bit for bit. Flags: `lockstep audit --help`.
#pragma once

namespace lockstep::tools {

// argv[0] is "audit". Returns the exit status: 0 all log-probs agree, 1 some differ, 2 bad usage
// or an error (message on stderr).
int run_audit_command(int argc, char** argv);

}  // namespace lockstep::tools
