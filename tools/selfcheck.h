// `lockstep selfcheck`: a short, self-contained run of the contract's invariances on every CPU op.
#pragma once

#include "lockstep/contract.h"
#include "tools/cli.h"

namespace lockstep::tools {

// Prints a table (or one JSON object); returns 0 when every check agrees bit for bit, else 1.
int run_selfcheck(bool json, const ContractConfig& contract);
// `lockstep selfcheck [--json] [contract flags]`.
Command add_selfcheck_command(CLI::App& top);

}  // namespace lockstep::tools
