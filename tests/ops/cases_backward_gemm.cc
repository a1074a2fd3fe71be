// PLACEHOLDER (being written): the op-case table's backward cases of §B.3 GEMM dX / dW.
#include "ops/cases.h"

namespace lockstep::cases {

void add_backward_gemm_cases(CaseList&) {}

}  // namespace lockstep::cases
