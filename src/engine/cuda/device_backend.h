// The memory half shared by the engine's CUDA backends (invariant_backend.cc, baseline_backend.cc):
// device tensors from lockstep::cuda::empty, copies and waits on one stream — the legacy default
// stream, so every op and copy of the backend is ordered with every other CUDA call. Its op clock
// records CUDA events on that stream.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/runtime.h"

namespace lockstep::engine {

class CudaDeviceBackend : public OpsBackend {
 public:
  Device device() const override { return Device::kCUDA; }
  Tensor empty(DType dtype, std::vector<int64_t> shape) const override {
    return cuda::empty(dtype, std::move(shape));
  }
  void copy(const TensorView& dst, const TensorView& src) const override {
    cuda::copy(dst, src, stream_);
  }
  void synchronize() const override { cuda::synchronize(stream_); }
  void round_bf16(const TensorView& src, const TensorView& dst) const override {
    cuda::round_bf16(src, dst, stream_);
  }
  void fill_zero(const TensorView& dst) const override { cuda::fill_zero(dst, stream_); }
  std::unique_ptr<OpClock> make_op_clock() const override {
    return std::make_unique<EventClock>(stream_);
  }

 protected:
  void* stream_ = nullptr;  // the legacy default stream

 private:
  class EventClock final : public OpClock {
   public:
    explicit EventClock(void* stream) : stream_(stream) {}
    int mark() override { return events_.record(stream_); }
    double seconds(int a, int b) override { return events_.seconds(a, b); }
    void clear() override { events_.clear(); }
    int keep_only(int mark) override { return events_.keep_only(mark); }

   private:
    void* stream_;
    cuda::EventPool events_;
  };
};

}  // namespace lockstep::engine
