// PLACEHOLDER (being written): the op-case table's backward cases of §B.4-B.7 RMSNorm, RoPE,
// SiLU-and-mul, embedding.
#include "ops/cases.h"

namespace lockstep::cases {

void add_backward_elementwise_cases(CaseList&) {}

}  // namespace lockstep::cases
