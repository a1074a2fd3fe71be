// The flags of the engine's commands (`lockstep audit` and `lockstep bench-engine` take the same
// set): model, workload, rollout side, training side, contract, devices, run. Defined once here on
// a CLI11 App; resolve_engine_options applies the rules between flags and validates.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine/audit_workload.h"
#include "tools/cli.h"

namespace lockstep::tools {

struct EngineCommandLine {
  engine::AuditConfig cfg;  // the contract starts as default_contract()
  ModelFlags model;
  // Where each side runs: "cpu" or "cuda" (--device sets both).
  std::string rollout_device = "cpu", train_device = "cpu";
  bool baseline_only = false;  // --baseline
  bool no_baseline = false;    // --no-baseline
  bool json = false, quiet = false;
  int threads = 0;           // 0: all cores
  bool cascade_set = false;  // --cascade given (else it follows --prefix-sharing)
  std::string steps_csv;     // bench-engine --steps-csv
  bool profile_ops = false;  // bench-engine --profile-ops
};

// Adds every flag to `app`, bound to `o` (which must outlive the parse).
void add_engine_options(CLI::App& app, EngineCommandLine& o);
// After the parse: cascade follows prefix sharing unless set, then the checks between flags and
// AuditConfig::validate. Throws lockstep::Error naming the flags.
void resolve_engine_options(EngineCommandLine& o);
// Parse + resolve of `args` (without the program and command names) for tests: throws
// CLI::ParseError or lockstep::Error; --help throws CLI::CallForHelp.
EngineCommandLine parse_engine_args(const std::vector<std::string>& args);

}  // namespace lockstep::tools
