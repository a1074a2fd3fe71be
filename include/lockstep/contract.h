// The whole contract (docs/contract.md): the model-level settings and every op's types, layouts
// and canonical formulas. The CPU reference ops are in lockstep/ops/*.h, the CUDA ones in
// lockstep/cuda/*.h; both implement exactly what these headers define.
#pragma once

#include "lockstep/contract/attention.h"
#include "lockstep/contract/config.h"
#include "lockstep/contract/embedding.h"
#include "lockstep/contract/gemm.h"
#include "lockstep/contract/logprob.h"
#include "lockstep/contract/norm.h"
#include "lockstep/contract/rope.h"
#include "lockstep/contract/sampling.h"
