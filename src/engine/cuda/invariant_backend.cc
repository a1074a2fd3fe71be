// The invariant CUDA backend: each OpsBackend call is the lockstep::cuda op of the same name
// (include/lockstep/cuda/*.h), whose bits are the contract's (docs/contract.md) and therefore the
// CPU invariant backend's. No arithmetic of its own; every op is issued on the legacy default
// stream, in call order. Memory: lockstep::cuda::empty / copy / synchronize (runtime.h).
// RoPE: the cuda op takes the table's cos/sin as device views; each distinct RopeTable is uploaded
// once (exact fp32 bits, host-built in double as the contract says) and kept for the backend's
// lifetime.
#include <map>
#include <mutex>
#include <tuple>

#include "engine/cuda/backends.h"
#include "engine/cuda/device_backend.h"
#include "lockstep/cuda/attention.h"
#include "lockstep/cuda/backward.h"
#include "lockstep/cuda/elementwise.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/cuda/logprob.h"
#include "lockstep/cuda/runtime.h"

namespace lockstep::engine {

namespace {

namespace ops = lockstep::cuda;

// The cuda:: attention ops plan their launches from the host-side values that PackedSeqs and
// PagedMeta carry: nothing is copied back. Every op runs on the cuda ops' default stream, the
// legacy default stream: stream_.
#include "engine/invariant_ops.inc"

class CudaInvariantBackend final : public InvariantOps<CudaDeviceBackend> {
 public:
  std::string name() const override { return "invariant"; }

  void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
            const TensorView& y) const override {
    const DeviceTable& t = device_table(table);
    cuda::rope(x, positions, t.cos.view(), t.sin.view(), y, stream_);
  }
  // The fused kernel where it applies (head_dim 128, aligned rows), else the three ops.
  void qk_norm_rope(const TensorView& qk, int64_t nq, const TensorView& q_weight,
                    const TensorView& k_weight, const RmsNormConfig& cfg,
                    const TensorView& positions, const RopeTable& table) const override {
    if (!cuda::qk_norm_rope_supported(qk)) {
      OpsBackend::qk_norm_rope(qk, nq, q_weight, k_weight, cfg, positions, table);
      return;
    }
    const DeviceTable& t = device_table(table);
    cuda::qk_norm_rope(qk, nq, q_weight, k_weight, cfg, positions, t.cos.view(), t.sin.view(),
                       stream_);
  }
  void rope_backward(const TensorView& gy, const TensorView& positions, const RopeTable& table,
                     const TensorView& dx) const override {
    const DeviceTable& t = device_table(table);
    cuda::rope_backward(gy, positions, t.cos.view(), t.sin.view(), dx, stream_);
  }
  // cuda::linear_logprob_backward_recompute: one pass over the vocab where it applies (rows in
  // place, vocab_tile a multiple of 16), else the forward then the backward.
  void linear_logprob_backward_recompute(const TensorView& h, const TensorView& w,
                                         const TensorView& targets, const LogprobParams& params,
                                         const ContractConfig& cfg, const TensorView& lse,
                                         const TensorView& entropy, const TensorView& g_lp,
                                         const TensorView* g_ent, const TensorView& dh,
                                         const TokenOrder& order, const TensorView& dw,
                                         const TensorView& logp_out, const TensorView& lse_out,
                                         const TensorView& entropy_out) const override {
    cuda::linear_logprob_backward_recompute(h, w, targets, params, cfg, lse, entropy, g_lp, g_ent,
                                            dh, order, dw, logp_out, lse_out, entropy_out, stream_);
  }

 private:
  struct DeviceTable {
    Tensor cos, sin;
  };
  // The device copy of a RoPE table. Keyed by the host table's storage and config: a table is a
  // pure function of its config (RopeTable::build), and the model keeps its table alive for as
  // long as it issues ops, so a (storage, config) key names one set of bits.
  const DeviceTable& device_table(const RopeTable& table) const {
    const auto key = std::make_tuple(
        static_cast<const void*>(table.cos.data()), static_cast<const void*>(table.sin.data()),
        table.config.head_dim, table.config.max_positions, table.config.theta);
    std::lock_guard<std::mutex> g(mu_);
    auto it = tables_.find(key);
    if (it != tables_.end()) return it->second;
    table.config.validate();
    const int64_t P = table.config.max_positions, half = table.half_dim();
    LS_CHECK(int64_t(table.cos.size()) == P * half && int64_t(table.sin.size()) == P * half,
             "cuda invariant rope", "table holds ", table.cos.size(), " cos and ", table.sin.size(),
             " sin entries, expected ", P * half);
    DeviceTable t{cuda::empty(DType::kF32, {P, half}), cuda::empty(DType::kF32, {P, half})};
    cuda::copy(t.cos.view(), table.cos_view(), stream_);
    cuda::copy(t.sin.view(), table.sin_view(), stream_);
    cuda::synchronize(stream_);
    return tables_.emplace(key, std::move(t)).first->second;
  }

  mutable std::mutex mu_;
  mutable std::map<std::tuple<const void*, const void*, int64_t, int64_t, double>, DeviceTable>
      tables_;
};

}  // namespace

std::unique_ptr<OpsBackend> make_cuda_invariant_backend() {
  return std::make_unique<CudaInvariantBackend>();
}

}  // namespace lockstep::engine
