// The GRPO loop's GPU (engine/cuda/grpo_device.h).
#include "engine/cuda/grpo_device.h"

#include <memory>
#include <utility>

#include "engine/cuda/backends.h"
#include "engine/cuda/optim.h"
#include "lockstep/cuda/runtime.h"
#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

class CudaOptimizer final : public GrpoOptimizer {
 public:
  explicit CudaOptimizer(CudaAdamW adam) : adam_(std::move(adam)) {}
  StepStats step(const Weights& grads) override { return adam_.step(grads); }
  const Weights& bf16_weights() const override { return adam_.bf16_weights(); }
  Weights bf16_weights_host() const override { return adam_.bf16_weights_host(); }
  Weights state() const override { return adam_.state(); }

 private:
  CudaAdamW adam_;
};

}  // namespace

GrpoDevice cuda_grpo_device() {
  LS_CHECK(cuda::available(), "grpo", "device cuda: no usable CUDA device on this machine");
  GrpoDevice d;
  d.device = Device::kCUDA;
  d.backend = [](bool baseline) {
    return std::shared_ptr<OpsBackend>(baseline ? make_cuda_baseline_backend()
                                                : make_cuda_invariant_backend());
  };
  d.adamw = [](const Weights& w, const AdamWConfig& c) -> std::unique_ptr<GrpoOptimizer> {
    return std::make_unique<CudaOptimizer>(CudaAdamW(w, c));
  };
  d.adamw_from_state = [](const Weights& st,
                          const AdamWConfig& c) -> std::unique_ptr<GrpoOptimizer> {
    return std::make_unique<CudaOptimizer>(CudaAdamW::from_state(st, c));
  };
  return d;
}

}  // namespace lockstep::engine
