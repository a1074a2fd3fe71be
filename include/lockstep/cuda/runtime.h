// Device memory and streams for the CUDA backend, behind a plain C++ header (no CUDA types).
// Allocation failures and CUDA errors throw lockstep::Error with the CUDA error string.
#pragma once

#include <string>
#include <vector>

#include "lockstep/tensor.h"

namespace lockstep::cuda {

bool available();              // a CUDA device is present and usable
std::string device_summary();  // "NVIDIA H200 (sm_90, 139 GiB), driver 13.0"
// The calling thread's current device (cudaGetDevice / cudaSetDevice): ops launch on it, so a
// caller holding tensors of another device switches to it first (e.g. the Python bindings,
// which follow each tensor's DLPack device id).
int current_device();
void set_device(int ordinal);

// A contiguous device tensor (cudaMalloc; freed when the last copy goes away). Its view() has
// device == Device::kCUDA.
Tensor empty(DType dtype, std::vector<int64_t> shape);

// Copies between any two views of the same dtype and shape (host or device, strided rows allowed
// where the last dim is contiguous), asynchronously on `stream`; host memory must stay valid until
// the stream is synchronized.
void copy(const TensorView& dst, const TensorView& src, void* stream = nullptr);
void synchronize(void* stream = nullptr);  // waits, then throws on any pending CUDA error

// Timing events (cudaEvent_t behind indices): record() puts the next event of the pool on
// `stream`, ordered after everything issued there before, and returns its index; seconds(a, b) is
// the device time from event a to event b, valid once the stream was synchronized after both
// (resolution about 0.5 us). clear() restarts the indices at 0 and keeps the events for reuse. One
// thread at a time; the pool must be destroyed on the device it recorded on.
class EventPool {
 public:
  EventPool() = default;
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  int record(void* stream = nullptr);
  double seconds(int a, int b) const;
  void clear() { used_ = 0; }
  // Forgets every event but number i, which becomes event 0 (it keeps its recorded time); returns
  // 0. i must be recorded.
  int keep_only(int i);
  int size() const { return used_; }  // events recorded since the last clear()

 private:
  std::vector<void*> events_;  // cudaEvent_t, created on first use
  int used_ = 0;
};

}  // namespace lockstep::cuda
