// `lockstep-score`: `lockstep score` as its own executable, without the baseline backend (so it
// needs no OpenBLAS at run time: used on the GPU machine by scripts/hf_parity.sh). Same flags,
// same parser, same exit codes (tools/cli.h).
#include <cstdio>
#include <memory>

#include "tools/cli.h"
#include "tools/score_cmd.h"

int main(int argc, char** argv) {
  using namespace lockstep::tools;
  try {
    CLI::App app{
        "lockstep-score: per-token log-probs of token sequences (the packed training "
        "forward)",
        "lockstep-score"};
    app.footer(kScoreFooter);
    auto o = std::make_shared<ScoreCommandLine>();
    add_score_options(app, *o);
    return run_cli(app, {{&app, [o] { return run_score(*o); }}}, argc, argv);
  } catch (...) {
    std::fprintf(stderr, "lockstep-score: error: could not set up the command line\n");
    return kExitUsage;
  }
}
