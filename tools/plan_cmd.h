// `lockstep plan`: the kernels a forward of a model runs under a contract — the CUDA GEMM plan of
// every layer GEMM for a range of row counts, the attention and log-prob layouts (and, in a CUDA
// build, their launch plans). A pure function of the model shape, the contract and the TP degree.
#pragma once

#include "tools/cli.h"

namespace lockstep::tools {

Command add_plan_command(CLI::App& top);

}  // namespace lockstep::tools
