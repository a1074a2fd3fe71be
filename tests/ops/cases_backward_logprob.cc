// PLACEHOLDER (being written): the op-case table's backward cases of §B.8 linear log-prob.
#include "ops/cases.h"

namespace lockstep::cases {

void add_backward_logprob_cases(CaseList&) {}

}  // namespace lockstep::cases
