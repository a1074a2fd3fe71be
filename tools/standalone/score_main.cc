// `lockstep-score`: `lockstep score` as its own executable, without the baseline backend (so it
// needs no OpenBLAS at run time: used on the GPU machine by scripts/hf_parity.sh).
#include <cstdio>

#include "lockstep/error.h"
#include "tools/score_cmd.h"

int main(int argc, char** argv) {
  try {
    return lockstep::tools::run_score_command(argc, argv);
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "lockstep-score: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-score: error: %s\n", e.what());
    return 1;
  }
}
