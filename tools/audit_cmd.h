// `lockstep audit`: the main job. Rollout under one configuration, training forward under another,
// every generated token's log-prob compared bit for bit. Flags: `lockstep audit --help`
// (tools/engine_options.h).
#pragma once

#include "tools/cli.h"

namespace lockstep::tools {

// Exit status of its run: 0 all log-probs agree, 1 some differ, 2 bad usage or an error.
Command add_audit_command(CLI::App& top);

}  // namespace lockstep::tools
