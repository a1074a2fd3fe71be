// The invariant CPU backend: each OpsBackend call is the lockstep::cpu op of the same name, whose
// bits are fixed by docs/contract.md. No state, no arithmetic of its own.
#include "engine/backend.h"

#include <chrono>
#include <cstring>

#include "engine/device.h"
#include "lockstep/ops/activation.h"

namespace lockstep::engine {

Tensor OpsBackend::empty(DType dtype, std::vector<int64_t> shape) const {
  LS_CHECK(device() == Device::kCPU, "OpsBackend", "backend '", name(),
           "' must override empty() for device ", device_name(device()));
  return Tensor::empty(dtype, std::move(shape));
}

void OpsBackend::qk_norm_rope(const TensorView& qk, int64_t nq, const TensorView& q_weight,
                              const TensorView& k_weight, const RmsNormConfig& cfg,
                              const TensorView& positions, const RopeTable& table) const {
  LS_CHECK(qk.ndim == 3 && nq >= 0 && nq <= qk.shape[1], "OpsBackend::qk_norm_rope",
           "qk must be [T, heads, D] with 0 <= nq <= heads, got ", qk.describe(), " and nq = ", nq);
  TensorView q = qk, k = qk;
  q.shape[1] = nq;
  k.data = static_cast<char*>(qk.data) + nq * qk.stride[1] * int64_t(dtype_size(qk.dtype));
  k.shape[1] = qk.shape[1] - nq;
  rmsnorm(q, q_weight, cfg, q);
  rmsnorm(k, k_weight, cfg, k);
  rope(qk, positions, table, qk);
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

namespace {
class HostClock final : public OpClock {
 public:
  int mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return int(marks_.size()) - 1;
  }
  double seconds(int a, int b) override {
    LS_CHECK(a >= 0 && b >= 0 && size_t(a) < marks_.size() && size_t(b) < marks_.size(),
             "OpClock::seconds", "marks ", a, " and ", b, " are not both recorded");
    return std::chrono::duration<double>(marks_[size_t(b)] - marks_[size_t(a)]).count();
  }
  void clear() override { marks_.clear(); }
  int keep_only(int mark) override {
    LS_CHECK(mark >= 0 && size_t(mark) < marks_.size(), "OpClock::keep_only", "mark ", mark,
             " is not recorded");
    marks_ = {marks_[size_t(mark)]};
    return 0;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};
}  // namespace

std::unique_ptr<OpClock> OpsBackend::make_op_clock() const { return std::make_unique<HostClock>(); }

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

// --- backward: a backend without one says so ---

namespace {
[[noreturn]] void no_backward(const OpsBackend& b, const char* op) {
  LS_CHECK(false, op, "the '", b.name(),
           "' backend has no backward yet (the invariant CPU and CUDA backends have one)");
  throw;  // unreachable
}
[[noreturn]] void no_shared(const OpsBackend& b, const char* op) {
  LS_CHECK(false, op, "not implemented on the '", b.name(), "' backend (", device_name(b.device()),
           "): shared-prompt training runs on the invariant backends (docs/contract.md §B.11)");
  throw;  // unreachable
}
[[noreturn]] void no_vocab_parallel_sampling(const OpsBackend& b, const char* op) {
  LS_CHECK(false, op, "not implemented on the '", b.name(), "' backend (", device_name(b.device()),
           "): vocab-parallel sampling (a rank-local model's sample) runs on the invariant "
           "backends and the CPU baseline");
  throw;  // unreachable
}
}  // namespace

void OpsBackend::lm_head_logits(const TensorView&, const TensorView&, const ContractConfig&,
                                const TensorView&) const {
  no_vocab_parallel_sampling(*this, "lm_head_logits");
}
void OpsBackend::sample_logits(const TensorView&, std::span<const SamplingParams>,
                               const TensorView&, const TensorView&, const ContractConfig&,
                               const TensorView&, const TensorView&, const TensorView&,
                               const TensorView&) const {
  no_vocab_parallel_sampling(*this, "sample_logits");
}

void OpsBackend::round_bf16(const TensorView& src, const TensorView& dst) const {
  const char* op = "OpsBackend::round_bf16";
  LS_CHECK(device() == Device::kCPU, op, "the '", name(), "' backend does not implement it");
  LS_CHECK(src.dtype == DType::kF32 && dst.dtype == DType::kBF16 && src.ndim == 2 &&
               dst.ndim == 2 && src.shape[0] == dst.shape[0] && src.shape[1] == dst.shape[1] &&
               (src.shape[1] <= 1 || (src.stride[1] == 1 && dst.stride[1] == 1)),
           op, "expected f32 src and bf16 dst of one 2-D shape with contiguous rows, got ",
           src.shape_string(), " -> ", dst.shape_string());
  for (int64_t r = 0; r < src.shape[0]; ++r) {
    const float* s = static_cast<const float*>(src.data) + r * src.stride[0];
    bf16* d = static_cast<bf16*>(dst.data) + r * dst.stride[0];
    for (int64_t c = 0; c < src.shape[1]; ++c) d[c] = f32_to_bf16(s[c]);
  }
}

void OpsBackend::fill_zero(const TensorView& dst) const {
  const char* op = "OpsBackend::fill_zero";
  LS_CHECK(device() == Device::kCPU, op, "the '", name(), "' backend does not implement it");
  LS_CHECK((dst.ndim == 1 && (dst.shape[0] <= 1 || dst.stride[0] == 1)) ||
               (dst.ndim == 2 && (dst.shape[1] <= 1 || dst.stride[1] == 1)),
           op, "expected a 1-D contiguous or 2-D row view, got ", dst.shape_string());
  const int64_t rows = dst.ndim == 1 ? 1 : dst.shape[0];
  const int64_t cols = dst.ndim == 1 ? dst.shape[0] : dst.shape[1];
  const int64_t ld = dst.ndim == 1 ? cols : dst.stride[0], es = dtype_size(dst.dtype);
  for (int64_t r = 0; r < rows; ++r)
    std::memset(static_cast<char*>(dst.data) + r * ld * es, 0, size_t(cols * es));
}

void OpsBackend::gemm_dx(const TensorView&, const TensorView&, const GemmConfig&,
                         const TensorView&) const {
  no_backward(*this, "gemm_dx");
}
void OpsBackend::gemm_dw(const TensorView&, const TensorView&, const TokenOrder&,
                         const TensorView&) const {
  no_backward(*this, "gemm_dw");
}
void OpsBackend::rmsnorm_backward(const TensorView&, const TensorView&, const RmsNormConfig&,
                                  const TensorView&, const TensorView&, const TokenOrder*,
                                  const TensorView*) const {
  no_backward(*this, "rmsnorm_backward");
}
void OpsBackend::rmsnorm_residual_backward(const TensorView&, const TensorView&,
                                           const RmsNormConfig&, const TensorView&,
                                           const TensorView&, const TensorView&, const TokenOrder*,
                                           const TensorView*) const {
  no_backward(*this, "rmsnorm_residual_backward");
}
void OpsBackend::rope_backward(const TensorView&, const TensorView&, const RopeTable&,
                               const TensorView&) const {
  no_backward(*this, "rope_backward");
}
void OpsBackend::silu_mul_backward(const TensorView&, const TensorView&, const TensorView&) const {
  no_backward(*this, "silu_mul_backward");
}
void OpsBackend::embedding_backward(const TensorView&, const TensorView&, const TokenOrder&,
                                    const TensorView&) const {
  no_backward(*this, "embedding_backward");
}
void OpsBackend::linear_logprob_backward(const TensorView&, const TensorView&, const TensorView&,
                                         const LogprobParams&, const ContractConfig&,
                                         const TensorView&, const TensorView&, const TensorView&,
                                         const TensorView*, const TensorView&, const TokenOrder&,
                                         const TensorView&) const {
  no_backward(*this, "linear_logprob_backward");
}
void OpsBackend::linear_logprob_backward_recompute(
    const TensorView& h, const TensorView& w, const TensorView& targets,
    const LogprobParams& params, const ContractConfig& cfg, const TensorView& lse,
    const TensorView& entropy, const TensorView& g_lp, const TensorView* g_ent,
    const TensorView& dh, const TokenOrder& order, const TensorView& dw, const TensorView& logp_out,
    const TensorView& lse_out, const TensorView& entropy_out) const {
  linear_logprob(h, w, targets, params, cfg, logp_out, lse_out, entropy_out);
  linear_logprob_backward(h, w, targets, params, cfg, lse, entropy, g_lp, g_ent, dh, order, dw);
}
void OpsBackend::attention_backward_varlen(const TensorView&, const TensorView&, const TensorView&,
                                           const TensorView&, const TensorView&, const TensorView&,
                                           const PackedSeqs&, const AttentionConfig&,
                                           const TensorView&, const TensorView&,
                                           const TensorView&) const {
  no_backward(*this, "attention_backward_varlen");
}
void OpsBackend::linear_logprob_backward_partial(const TensorView&, const TensorView&,
                                                 const TensorView&, const LogprobParams&,
                                                 const ContractConfig&, const LogprobShard&,
                                                 const TensorView&, const TensorView&,
                                                 const TensorView&, const TensorView*,
                                                 const TensorView&, const TokenOrder&,
                                                 const TensorView&) const {
  LS_CHECK(false, "OpsBackend::linear_logprob_backward_partial", "the '", name(),
           "' backend does not implement linear_logprob_backward_partial (vocab-parallel "
           "rank-local training runs on the invariant CPU backend only)");
}
void OpsBackend::attention_prefill_shared(const TensorView&, const TensorView&, const TensorView&,
                                          const SharedPromptSeqs&, const AttentionConfig&,
                                          const TensorView&, const TensorView&) const {
  no_shared(*this, "attention_prefill_shared");
}
void OpsBackend::attention_backward_shared(const TensorView&, const TensorView&, const TensorView&,
                                           const TensorView&, const TensorView&, const TensorView&,
                                           const SharedPromptSeqs&, const AttentionConfig&,
                                           const TensorView&, const TensorView&,
                                           const TensorView&) const {
  no_shared(*this, "attention_backward_shared");
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
  void rope_backward(const TensorView& gy, const TensorView& positions, const RopeTable& table,
                     const TensorView& dx) const override {
    cpu::rope_backward(gy, positions, table, dx);
  }
  void linear_logprob_backward_partial(const TensorView& h, const TensorView& w_shard,
                                       const TensorView& targets, const LogprobParams& params,
                                       const ContractConfig& cfg, const LogprobShard& shard,
                                       const TensorView& lse, const TensorView& entropy,
                                       const TensorView& g_lp, const TensorView* g_ent,
                                       const TensorView& dh_partial, const TokenOrder& order,
                                       const TensorView& dw_shard) const override {
    cpu::linear_logprob_backward_partial(h, w_shard, targets, params, cfg, shard, lse, entropy,
                                         g_lp, g_ent, dh_partial, order, dw_shard);
  }
};

}  // namespace

std::unique_ptr<OpsBackend> make_invariant_backend() {
  return std::make_unique<InvariantBackend>();
}

}  // namespace lockstep::engine
