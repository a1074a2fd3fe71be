// `lockstep score` (and the standalone lockstep-score): per-token log-probs of token sequences by
// the packed training forward. Flags: `lockstep score --help`.
#pragma once

#include <string>

#include "lockstep/contract.h"
#include "tools/cli.h"

namespace lockstep::tools {

struct ScoreCommandLine {
  std::string model_dir, tokens_path, out_path;  // out_path empty: stdout
  bool strict = false;                           // --strict
  int tp = 1, threads = 0;
  float temperature = 1.0f;
  ContractConfig contract;  // add_score_options starts it at default_contract()
};

// The flags, on a subcommand or on lockstep-score's own App.
void add_score_options(CLI::App& app, ScoreCommandLine& o);
// Exit status 0, or throws lockstep::Error on bad input or a failed write (run_cli: exit 2).
int run_score(const ScoreCommandLine& o);
extern const char* const kScoreFooter;
Command add_score_command(CLI::App& top);

}  // namespace lockstep::tools
