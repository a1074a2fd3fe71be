// `lockstep grpo`: GRPO on a model (the built-in one by default) with a verifiable task, every
// step's rollout log-probs compared with the trainer's bit for bit (engine/grpo.h).
#pragma once

#include "tools/cli.h"

namespace lockstep::tools {

Command add_grpo_command(CLI::App& top);

}  // namespace lockstep::tools
