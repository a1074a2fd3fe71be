// The invariant CPU backend: each OpsBackend call is the lockstep::cpu op of the same name, whose
// bits are fixed by docs/contract.md. No state, no arithmetic of its own.
#include "engine/backend.h"

#include <cstring>

#include "engine/device.h"
#include "lockstep/ops/activation.h"

namespace lockstep::engine {

Tensor OpsBackend::empty(DType dtype, std::vector<int64_t> shape) const {
  LS_CHECK(device() == Device::kCPU, "OpsBackend", "backend '", name(),
           "' must override empty() for device ", device_name(device()));
  return Tensor::empty(dtype, std::move(shape));
}

void OpsBackend::copy(const TensorView& dst, const TensorView& src) const {
  LS_CHECK(dst.device == Device::kCPU && src.device == Device::kCPU, "OpsBackend", "backend '",
           name(), "' must override copy() for device views");
  LS_CHECK(dst.dtype == src.dtype && dst.ndim == src.ndim, "OpsBackend::copy", "dst ",
           dst.describe(), " and src ", src.describe(), " differ in dtype or rank");
  for (int d = 0; d < src.ndim; ++d)
    LS_CHECK(dst.shape[d] == src.shape[d], "OpsBackend::copy", "dst ", dst.describe(), " and src ",
             src.describe(), " differ in shape");
  LS_CHECK(src.inner_contiguous() && dst.inner_contiguous(), "OpsBackend::copy",
           "last dimension must be contiguous");
  if (src.numel() == 0) return;
  // Rows of the last dimension, walked over every outer index.
  const int64_t inner = src.ndim == 0 ? 1 : src.shape[src.ndim - 1];
  const int64_t rows = src.numel() / inner;
  const size_t bytes = size_t(inner) * dtype_size(src.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, so = 0, dof = 0;
    for (int d = src.ndim - 2; d >= 0; --d) {
      const int64_t i = rem % src.shape[d];
      rem /= src.shape[d];
      so += i * src.stride[d];
      dof += i * dst.stride[d];
    }
    std::memcpy(static_cast<char*>(dst.data) + dof * dtype_size(dst.dtype),
                static_cast<const char*>(src.data) + so * dtype_size(src.dtype), bytes);
  }
}

void OpsBackend::attention_prefill_varlen(const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& cu_seqlens,
                                          const AttentionConfig& cfg, const TensorView& out,
                                          const TensorView& lse) const {
  const char* op = "attention_prefill_varlen";
  DeviceStage stage(*this);
  check_tensor(op, "cu_seqlens", cu_seqlens, DType::kI32, {-1}, cu_seqlens.device);
  const TensorView cu = stage.host_copy(cu_seqlens);
  LS_CHECK(q.ndim == 3, op, "argument 'q' expected shape [T, Hq, D], got ", q.shape_string());
  PackedSeqs seqs = PackedSeqs::validate(op, cu, q.shape[0]);
  const TensorView cu_dev = stage.upload(op, {"cu_seqlens"}, {cu})[0];
  attention_prefill_varlen(q, k, v, std::move(seqs).with_device_copy(device(), cu_dev), cfg, out,
                           lse);
}

void OpsBackend::attention_paged(const TensorView& q, const TensorView& q_seq,
                                 const TensorView& q_pos, const PagedKv& kv,
                                 const AttentionConfig& cfg, const TensorView& out,
                                 const TensorView& lse) const {
  DeviceStage stage(*this);
  const PagedMeta meta =
      paged_meta_for_views(stage, "attention_paged", q_seq, q_pos, kv, nullptr, cfg);
  attention_paged(q, meta, kv.k_cache, kv.v_cache, cfg, out, lse);
}

void OpsBackend::attention_paged_split_kv(const TensorView& q, const TensorView& q_seq,
                                          const TensorView& q_pos, const PagedKv& kv,
                                          const AttentionConfig& cfg, int num_splits,
                                          const TensorView& out, const TensorView& lse) const {
  LS_CHECK(num_splits >= 1, "attention_paged_split_kv", "num_splits must be >= 1, got ",
           num_splits);
  DeviceStage stage(*this);
  const PagedMeta meta =
      paged_meta_for_views(stage, "attention_paged_split_kv", q_seq, q_pos, kv, nullptr, cfg);
  attention_paged_split_kv(q, meta, kv.k_cache, kv.v_cache, cfg, num_splits, out, lse);
}

void OpsBackend::attention_paged_cascade(const TensorView& q, const TensorView& q_seq,
                                         const TensorView& q_pos, const PagedKv& kv,
                                         const SharedPrefix& prefix, const AttentionConfig& cfg,
                                         const TensorView& out, const TensorView& lse) const {
  DeviceStage stage(*this);
  const PagedMeta meta =
      paged_meta_for_views(stage, "attention_paged_cascade", q_seq, q_pos, kv, &prefix, cfg);
  attention_paged_cascade(q, meta, kv.k_cache, kv.v_cache, cfg, out, lse);
}

namespace {

namespace ops = lockstep::cpu;

#include "engine/invariant_ops.inc"

class InvariantBackend final : public InvariantOps<OpsBackend> {
 public:
  std::string name() const override { return "invariant"; }

  void rope(const TensorView& x, const TensorView& positions, const RopeTable& table,
            const TensorView& y) const override {
    cpu::rope(x, positions, table, y);
  }
};

}  // namespace

std::unique_ptr<OpsBackend> make_invariant_backend() {
  return std::make_unique<InvariantBackend>();
}

}  // namespace lockstep::engine
