// The `lockstep` command line. The main job is `lockstep audit`: rollout vs training log-probs of
// a model, compared bit for bit. `lockstep selfcheck` runs the contract's invariances on every CPU
// op in seconds; `lockstep contract` prints the default settings.
#include <cstdio>
#include <cstring>
#include <string>

#include "lockstep/contract.h"
#include "lockstep/error.h"
#include "tools/audit_cmd.h"
#include "tools/bench_engine_cmd.h"
#include "tools/score_cmd.h"
#include "tools/selfcheck.h"

int main(int argc, char** argv) {
  try {
    std::string cmd = argc > 1 ? argv[1] : "help";
    if (cmd == "audit") return lockstep::tools::run_audit_command(argc - 1, argv + 1);
    if (cmd == "bench-engine") return lockstep::tools::run_bench_engine_command(argc - 1, argv + 1);
    if (cmd == "score") return lockstep::tools::run_score_command(argc - 1, argv + 1);
    if (cmd == "contract") {
      lockstep::ContractConfig cfg;
      cfg.validate();
      std::printf("%s\n", cfg.to_string().c_str());
      return 0;
    }
    if (cmd == "selfcheck") {
      bool json = argc > 2 && std::strcmp(argv[2], "--json") == 0;
      return lockstep::tools::run_selfcheck(json);
    }
    std::printf(
        "usage: lockstep <command>\n"
        "  audit [flags]       the main job: rollout vs training log-probs, bit for bit\n"
        "                      (lockstep audit --help for the flags)\n"
        "  bench-engine [flags]  rollout and training-forward tokens/s, invariant vs baseline\n"
        "                      backends (takes the audit flags, e.g. --device cuda)\n"
        "  score [flags]       per-token log-probs of token sequences (training forward)\n"
        "                      (lockstep score --help for the flags)\n"
        "  selfcheck [--json]  run the contract's invariance checks on every CPU op\n"
        "  contract            print the default contract settings\n");
    return cmd == "help" || cmd == "--help" ? 0 : 2;
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "lockstep: error: %s\n", e.what());
    return 1;
  }
}
