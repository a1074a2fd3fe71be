// Moving a call's tensors to the backend's device (docs/engine-model.md "Devices"). The engine's
// rule: metadata (token ids, cu_seqlens, positions, block tables, targets, ...) is always given on
// the host, validated there once per call, then uploaded with ONE copy per call and used by every
// layer as device views; activations and outputs (hidden states, log-probs, sampled ids) may live
// on the host or on the backend's device, and a host one is staged through a device temporary.
// With a CPU backend every helper here hands back the caller's views unchanged: no copy at all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "lockstep/tensor.h"

namespace lockstep::engine {

class DeviceStage {
 public:
  explicit DeviceStage(const OpsBackend& ops) : ops_(ops) {}
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  bool on_host_backend() const { return ops_.device() == Device::kCPU; }
  Device device() const { return ops_.device(); }

  // Host metadata views (any strides) -> views the backend can read, in the same order. CPU
  // backend: the same views. Device backend: packed contiguously into one host buffer, uploaded
  // with one copy, returned as contiguous device views. `op` names the caller in errors.
  std::vector<TensorView> upload(const char* op, const std::vector<const char*>& names,
                                 const std::vector<TensorView>& host);

  // An activation input on the host or on the device: itself if on the backend's device, else a
  // device copy (kept alive by this object).
  TensorView input(const TensorView& v);
  // An output on the host or on the device: itself if on the backend's device, else a device
  // temporary that finish() copies back.
  TensorView output(const TensorView& v);
  // A view readable on the host: itself if on the host, else a host copy (waiting for it; kept
  // alive by this object).
  TensorView host_copy(const TensorView& v);
  // Copies the staged outputs back (in order) and, if there were any, synchronizes so the host
  // views hold the results on return.
  void finish();

 private:
  const OpsBackend& ops_;
  std::vector<Tensor> keep_;                             // uploads and temporaries
  std::vector<std::pair<TensorView, TensorView>> back_;  // (host dst, device src)
};

// The paged metadata of one call over views (OpsBackend's view-based attention entry points; the
// engine's forward_step builds its meta itself, once per step): q_seq, q_pos, seq_lens,
// shared_len and seq_group on the backend's device are copied back to the host (waiting for
// them), block tables on the device stay there (trusted); the host tables are validated
// (PagedMeta::validate against kv's caches) and uploaded with one copy as the device copies.
// `stage` keeps every copy alive.
PagedMeta paged_meta_for_views(DeviceStage& stage, const char* op, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const SharedPrefix* prefix, const AttentionConfig& cfg);

// Slab r of a contiguous [n, ...] tensor (any device): its [...] view.
TensorView slab(const Tensor& t, int64_t r);

// Copies `t` (any device, last dim contiguous) into a new contiguous host tensor, waiting for it.
Tensor to_host(const OpsBackend& ops, const TensorView& t);

}  // namespace lockstep::engine
