// The `lockstep` command line. Until the engine lands (issue 3), `lockstep selfcheck` runs a
// short contract self-check; `lockstep contract` prints the contract settings.
#include <cstdio>
#include <cstring>
#include <string>

#include "lockstep/contract.h"
#include "lockstep/error.h"

int main(int argc, char** argv) {
  try {
    std::string cmd = argc > 1 ? argv[1] : "help";
    if (cmd == "contract") {
      lockstep::ContractConfig cfg;
      cfg.validate();
      std::printf("%s\n", cfg.to_string().c_str());
      return 0;
    }
    std::printf("usage: lockstep contract\n");
    return cmd == "help" || cmd == "--help" ? 0 : 2;
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "lockstep: error: %s\n", e.what());
    return 1;
  }
}
