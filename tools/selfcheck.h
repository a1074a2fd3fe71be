// `lockstep selfcheck`: the contract's invariances on every CPU op, in seconds.
#pragma once

namespace lockstep::tools {

// Prints a table (or one JSON object) and returns 0 when every check agrees bit for bit.
int run_selfcheck(bool json);

}  // namespace lockstep::tools
