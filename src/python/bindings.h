// The registration functions of the module lockstep._C, one per bindings file.
#pragma once

#include <nanobind/nanobind.h>

namespace lockstep::python {

void bind_forward(nanobind::module_& m);   // bind_forward.cc: lockstep/ops/*.h
void bind_backward(nanobind::module_& m);  // bind_backward.cc: lockstep/ops/backward.h
void bind_engine(nanobind::module_& m);    // bind_engine.cc: lockstep.Engine (src/engine)

}  // namespace lockstep::python
