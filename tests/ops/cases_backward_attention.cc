// PLACEHOLDER (being written): the op-case table's backward cases of §B.9 attention.
#include "ops/cases.h"

namespace lockstep::cases {

void add_backward_attention_cases(CaseList&) {}

}  // namespace lockstep::cases
