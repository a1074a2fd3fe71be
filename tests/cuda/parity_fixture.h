// The GPU harness (cuda/gpu_harness.h) under the names the parity programs that predate it use
// (report, DevPool, download, view, bitwise, expect_error, g_pass / g_fail / g_quick / g_rng,
// unqualified). New programs include cuda/gpu_harness.h and call gpu_test::start / finish.
#pragma once

#include "cuda/gpu_harness.h"

namespace {

using lockstep::Device;
using lockstep::DType;
using lockstep::TensorView;
using lockstep::gpu_test::bitwise;
using lockstep::gpu_test::DevPool;
using lockstep::gpu_test::download;
using lockstep::gpu_test::expect_error;
using lockstep::gpu_test::g_fail;
using lockstep::gpu_test::g_pass;
using lockstep::gpu_test::g_quick;
using lockstep::gpu_test::g_rng;
using lockstep::gpu_test::report;
using lockstep::gpu_test::view;

}  // namespace
