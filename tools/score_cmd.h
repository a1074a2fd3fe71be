// `lockstep score`: the training forward as a tool — per-token log-probs of given token sequences
// under a checkpoint (Hugging Face Qwen3 layout), through the invariant backend.
#pragma once

namespace lockstep::tools {

// argv[0] is "score". Returns the process exit status.
int run_score_command(int argc, char** argv);

}  // namespace lockstep::tools
