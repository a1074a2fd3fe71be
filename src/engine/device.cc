// DeviceStage: one upload per call for host metadata, staging of host activations. See device.h.
#include "engine/device.h"

#include <cstring>

#include "lockstep/error.h"

namespace lockstep::engine {

namespace {

// Copies a view (any strides) into contiguous bytes at dst, row-major.
void pack_view(const TensorView& v, char* dst) {
  const int64_t es = dtype_size(v.dtype), n = v.numel();
  if (n == 0) return;
  if (v.is_contiguous()) {
    std::memcpy(dst, v.data, size_t(n * es));
    return;
  }
  std::vector<int64_t> idx(size_t(v.ndim), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (int d = 0; d < v.ndim; ++d) off += idx[size_t(d)] * v.stride[d];
    std::memcpy(dst + e * es, static_cast<const char*>(v.data) + off * es, size_t(es));
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < v.shape[d]) break;
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace

std::vector<TensorView> DeviceStage::upload(const char* op, const std::vector<const char*>& names,
                                            const std::vector<TensorView>& host) {
  for (size_t i = 0; i < host.size(); ++i)
    LS_CHECK(host[i].device == Device::kCPU, op, "argument '", names[i],
             "' must be a host view (metadata is validated on the host and uploaded once per "
             "call), got ",
             host[i].describe());
  if (on_host_backend()) return host;
  constexpr int64_t kAlign = 16;
  std::vector<int64_t> offset(host.size());
  int64_t total = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    offset[i] = total;
    total += (host[i].numel() * dtype_size(host[i].dtype) + kAlign - 1) / kAlign * kAlign;
  }
  std::vector<TensorView> out(host.size());
  if (total == 0) {
    for (size_t i = 0; i < host.size(); ++i) {
      out[i] = host[i];
      out[i].device = ops_.device();
    }
    return out;
  }
  Tensor staging(DType::kU8, {total});
  for (size_t i = 0; i < host.size(); ++i) pack_view(host[i], staging.ptr<char>() + offset[i]);
  Tensor dev = ops_.empty(DType::kU8, {total});
  ops_.copy(dev.view(), staging.view());
  for (size_t i = 0; i < host.size(); ++i) {
    std::vector<int64_t> shape(host[i].shape, host[i].shape + host[i].ndim);
    out[i] =
        TensorView::contiguous(dev.ptr<char>() + offset[i], host[i].dtype, shape, dev.device());
  }
  keep_.push_back(std::move(staging));  // host memory stays valid until the call ends
  keep_.push_back(std::move(dev));
  return out;
}

TensorView DeviceStage::input(const TensorView& v) {
  if (v.device == ops_.device() || (v.ndim == 0 && v.data == nullptr)) return v;
  Tensor t = ops_.empty(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.ndim));
  ops_.copy(t.view(), v);
  TensorView d = t.view();
  keep_.push_back(std::move(t));
  return d;
}

TensorView DeviceStage::output(const TensorView& v) {
  if (v.device == ops_.device() || (v.ndim == 0 && v.data == nullptr)) return v;
  Tensor t = ops_.empty(v.dtype, std::vector<int64_t>(v.shape, v.shape + v.ndim));
  TensorView d = t.view();
  back_.emplace_back(v, d);
  keep_.push_back(std::move(t));
  return d;
}

TensorView DeviceStage::host_copy(const TensorView& v) {
  if (v.device == Device::kCPU || (v.ndim == 0 && v.data == nullptr)) return v;
  Tensor h = to_host(ops_, v);
  TensorView hv = h.view();
  keep_.push_back(std::move(h));
  return hv;
}

void DeviceStage::finish() {
  for (const auto& [dst, src] : back_) ops_.copy(dst, src);
  if (!back_.empty()) ops_.synchronize();
  back_.clear();
}

PagedMeta paged_meta_for_views(DeviceStage& stage, const char* op, const TensorView& q_seq,
                               const TensorView& q_pos, const PagedKv& kv,
                               const SharedPrefix* prefix, const AttentionConfig& cfg) {
  LS_CHECK(kv.k_cache.ndim == 4, op, "argument 'kv.k_cache' expected shape [NP, P, Hkv, D], got ",
           kv.k_cache.shape_string());
  // Dtype and rank before a device view is copied back (the copy reads its bytes).
  for (auto [v, arg] : {std::pair{&q_seq, "q_seq"}, std::pair{&q_pos, "q_pos"},
                        std::pair{&kv.seq_lens, "kv.seq_lens"}})
    check_tensor(op, arg, *v, DType::kI32, {-1}, v->device);
  if (prefix != nullptr) {
    check_tensor(op, "prefix.shared_len", prefix->shared_len, DType::kI32, {-1},
                 prefix->shared_len.device);
    check_tensor(op, "prefix.seq_group", prefix->seq_group, DType::kI32, {-1},
                 prefix->seq_group.device);
  }
  PagedTables h;
  h.q_seq = stage.host_copy(q_seq);
  h.q_pos = stage.host_copy(q_pos);
  h.block_table = kv.block_table;
  h.seq_lens = stage.host_copy(kv.seq_lens);
  if (prefix != nullptr) {
    h.prefix_block_table = prefix->block_table;
    h.shared_len = stage.host_copy(prefix->shared_len);
    h.seq_group = stage.host_copy(prefix->seq_group);
  }
  PagedMeta meta = PagedMeta::validate(op, h, kv.k_cache.shape[0], kv.k_cache.shape[1], cfg);
  if (stage.on_host_backend()) return meta;
  // One upload of the host tables; tables already on the device are used in place.
  std::vector<TensorView*> slots;
  PagedTables d = h;
  for (TensorView* v : {&d.q_seq, &d.q_pos, &d.block_table, &d.seq_lens, &d.prefix_block_table,
                        &d.shared_len, &d.seq_group})
    if (v->device == Device::kCPU && (v->ndim != 0 || v->data != nullptr)) slots.push_back(v);
  std::vector<const char*> names(slots.size(), "paged metadata");
  std::vector<TensorView> host;
  for (TensorView* v : slots) host.push_back(*v);
  const std::vector<TensorView> up = stage.upload(op, names, host);
  for (size_t i = 0; i < slots.size(); ++i) *slots[i] = up[i];
  return std::move(meta).with_device_copies(stage.device(), d);
}

Tensor to_host(const OpsBackend& ops, const TensorView& t) {
  Tensor h(t.dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim));
  ops.copy(h.view(), t);
  ops.synchronize();
  return h;
}

TensorView slab(const Tensor& t, int64_t r) {
  const TensorView v = t.view();
  const std::vector<int64_t> shape(v.shape + 1, v.shape + v.ndim);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return TensorView::contiguous(static_cast<char*>(v.data) + r * n * dtype_size(v.dtype), v.dtype,
                                shape, v.device);
}

}  // namespace lockstep::engine
