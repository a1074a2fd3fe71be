// The bindings' argument layer: DLPack arrays (nanobind's nb::ndarray: torch, numpy, ... tensors)
// as lockstep TensorViews, the device (and stream) an op runs on, and the host-side objects the
// ops take (TokenOrder, PackedSeqs, RopeTable) built from plain arguments. Nothing here computes:
// every check of the data is the library's (lockstep::Error naming the op and the argument); this
// layer only refuses what a TensorView cannot describe (an unknown dtype or device, negative or
// zero strides, too many dimensions).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>

#include "lockstep/contract.h"
#include "lockstep/contract/backward.h"
#include "lockstep/tensor.h"

namespace lockstep::python {

namespace nb = nanobind;

// Any DLPack array; no conversion, no copy: the op reads and writes the caller's memory.
using Array = nb::ndarray<>;
using OptArray = std::optional<Array>;

// The view of `a` (argument `arg` of `op`). Throws lockstep::Error for what a TensorView cannot
// describe.
TensorView view_of(const char* op, const char* arg, const Array& a);
// An empty view (ndim 0) for None.
TensorView view_of(const char* op, const char* arg, const OptArray& a);

// Where an op runs: every data view's device (they must agree), and the CUDA stream (an integer
// cudaStream_t, 0 = the default stream) for a CUDA device.
struct Placement {
  Device device = Device::kCPU;
  void* stream = nullptr;
};

// The device of `views` (ndim-0 views are skipped). Throws lockstep::Error when they differ, and,
// for CUDA views, when this build cannot run them (a CPU build: "CUDA tensors need a CUDA build").
Placement place(const char* op, std::initializer_list<const TensorView*> views,
                uint64_t stream = 0);

// Runs `fn` without the GIL (the library's ops are pure C++; other Python threads go on).
template <typename Fn>
void released(Fn&& fn) {
  nb::gil_scoped_release unlocked;
  std::forward<Fn>(fn)();
}

// The canonical token order of `rows` packed rows (B.1): sequence b at rows
// [cu_seqlens[b], cu_seqlens[b+1]) with step index step_indices[b] (default: b); without
// cu_seqlens, one sequence of all rows. cu_seqlens [B+1] i32 and step_indices [B] i64 are host
// views.
TokenOrder token_order(const char* op, const OptArray& cu_seqlens, const OptArray& step_indices,
                       int64_t rows);

// The validated packed sequences of a varlen attention call (host cu_seqlens [B+1] i32).
PackedSeqs packed_seqs(const char* op, const Array& cu_seqlens, int64_t T);

// The RoPE table of (head_dim, theta, max_positions), built once per process and kept (a few
// recent configurations): the table is a pure function of its config.
std::shared_ptr<const RopeTable> rope_table(int64_t head_dim, double theta, int64_t max_positions);

// The contract's settings from the bindings' plain arguments (validated by the library's ops).
ContractConfig contract_config(int gemm_segments, int kv_chunk, int vocab_tile, int vocab_segments);

}  // namespace lockstep::python
