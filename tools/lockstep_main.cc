// The `lockstep` command line. The main job is `lockstep audit`: rollout vs training log-probs of
// a model, compared bit for bit. `lockstep selfcheck` runs the contract's invariances on every CPU
// op in seconds; `lockstep contract` prints the contract every subcommand starts from. Each
// subcommand is one add_*_command (tools/cli.h says how to add one); `lockstep plan` prints the
// kernels a forward runs; `lockstep launch` runs a command as the ranks of one job (docs/dist.md);
// exit codes: tools/cli.h.
#include <cstdio>
#include <memory>
#include <vector>

#include "tools/audit_cmd.h"
#include "tools/bench_engine_cmd.h"
#include "tools/cli.h"
#include "tools/grpo_cmd.h"
#include "tools/launch_cmd.h"
#include "tools/plan_cmd.h"
#include "tools/score_cmd.h"
#include "tools/selfcheck.h"

namespace lockstep::tools {
namespace {

Command add_contract_command(CLI::App& top) {
  auto c = std::make_shared<ContractConfig>(default_contract());
  CLI::App* sub = top.add_subcommand(
      "contract", "prints the default contract (with the contract flags applied)");
  sub->footer("Every subcommand starts from this contract; its contract flags override it.");
  add_contract_options(*sub, *c);
  return {sub, [c] {
            c->validate();
            std::printf("%s\n", c->to_string().c_str());
            flush_stdout();
            return int(kExitOk);
          }};
}

int lockstep_main(int argc, char** argv) {
  CLI::App app{
      "lockstep: LLM RL rollout and training log-probs, bit for bit.\n"
      "Exit status of every command: 0 ok, 1 a check failed (log-probs or invariances differ), "
      "2 bad usage, bad input or an error.",
      "lockstep"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {
      add_audit_command(app),     add_bench_engine_command(app), add_score_command(app),
      add_selfcheck_command(app), add_contract_command(app),     add_plan_command(app),
      add_grpo_command(app),      add_launch_command(app),       add_dist_selftest_command(app),
  };
  return run_cli(app, commands, argc, argv);
}

}  // namespace
}  // namespace lockstep::tools

int main(int argc, char** argv) {
  try {
    return lockstep::tools::lockstep_main(argc, argv);
  } catch (...) {
    // Only building the parser can throw here (run_cli catches everything else).
    std::fprintf(stderr, "lockstep: error: could not set up the command line\n");
    return lockstep::tools::kExitUsage;
  }
}
