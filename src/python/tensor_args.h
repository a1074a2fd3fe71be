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

// An argument's view with its DLPack device id (the CUDA ordinal; 0 on the CPU): a TensorView
// wherever an op takes one, and what place() reads.
struct ArgView : TensorView {
  int device_id = 0;
};

// The view of `a` (argument `arg` of `op`). Throws lockstep::Error for what a TensorView cannot
// describe.
ArgView view_of(const char* op, const char* arg, const Array& a);
// An empty view (ndim 0) for None.
ArgView view_of(const char* op, const char* arg, const OptArray& a);

// Where an op runs: every data view's device (they must agree, CUDA ones on one device id), and
// the CUDA stream (an integer cudaStream_t, 0 = the legacy default stream) for a CUDA device.
struct Placement {
  Device device = Device::kCPU;
  int device_id = 0;  // the CUDA device ordinal (DLPack device_id)
  void* stream = nullptr;
};

// The device of `views` (ndim-0 views are skipped). Throws lockstep::Error when they differ, and,
// for CUDA views, when this build cannot run them (a CPU build: "CUDA tensors need a CUDA build").
Placement place(const char* op, std::initializer_list<const ArgView*> views, uint64_t stream = 0);

// Runs `fn` without the GIL (the library's ops are pure C++; other Python threads go on).
template <typename Fn>
void released(Fn&& fn) {
  nb::gil_scoped_release unlocked;
  std::forward<Fn>(fn)();
}

#ifdef LOCKSTEP_PYTHON_CUDA
// Makes `ordinal` the calling thread's CUDA device for its lifetime (the previous one after).
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};
#endif

// Runs an op where `at` says, without the GIL: on_cpu() for host tensors, on_cuda(stream) on the
// views' CUDA device for device tensors (a generic lambda: a CPU build never instantiates it, and
// place() has refused CUDA tensors there).
template <typename CpuFn, typename CudaFn>
void run_on(const Placement& at, CpuFn&& on_cpu, CudaFn&& on_cuda) {
  nb::gil_scoped_release unlocked;
  if (at.device == Device::kCPU) {
    on_cpu();
    return;
  }
#ifdef LOCKSTEP_PYTHON_CUDA
  const DeviceScope scope(at.device_id);
  on_cuda(at.stream);
#else
  (void)on_cuda;
#endif
}

// The metadata views the library reads on the host (cu_seqlens, step_indices, sampling settings):
// a CUDA tensor there is refused with a message naming the argument.
void check_host(const char* op, const char* arg, const TensorView& v);

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

// The same table's cos / sin on CUDA device `device_id` (uploaded once per configuration and
// device, then kept for the process's life), for the CUDA rope ops.
struct DeviceRopeTable {
  TensorView cos, sin;
};
DeviceRopeTable device_rope_table(int64_t head_dim, double theta, int64_t max_positions,
                                  int device_id);

// The contract's settings from the bindings' plain arguments (validated by the library's ops).
ContractConfig contract_config(int gemm_segments, int kv_chunk, int vocab_tile, int vocab_segments);

}  // namespace lockstep::python
