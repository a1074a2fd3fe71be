// The sampling contract (docs/contract.md §S): settings, the row uniform, the baseline's noise,
// argument checks.
#include "lockstep/contract/sampling.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "contract/checks.h"
#include "core/math.h"
#include "core/philox.h"
#include "core/sample_choice.h"

namespace lockstep {

void SamplingParams::validate() const {
  LS_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "SamplingParams",
           "temperature must be finite and >= 0 (0: greedy), got ", temperature);
  LS_CHECK(top_k >= 0, "SamplingParams", "top_k must be >= 0 (0: off), got ", top_k);
  LS_CHECK(top_p > 0.0f && top_p <= 1.0f, "SamplingParams",
           "top_p must be in (0, 1] (1: off), got ", top_p);
  LS_CHECK(min_p >= 0.0f && min_p <= 1.0f, "SamplingParams",
           "min_p must be in [0, 1] (0: off), got ", min_p);
}

std::string SamplingParams::to_string() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "sampling: seed=%llu temperature=%a (%.9g) top_k=%lld top_p=%a (%.9g) min_p=%a "
                "(%.9g)",
                (unsigned long long)seed, double(temperature), double(temperature),
                (long long)top_k, double(top_p), double(top_p), double(min_p), double(min_p));
  return buf;
}

uint64_t sampling_uniform(uint64_t seed, uint64_t request_id, uint32_t position) {
  return sample_row_uniform(seed, request_id, position);
}

uint64_t sampling_target(uint64_t u, uint64_t total) { return sample_target(u, total); }

uint32_t sampling_noise_word(uint64_t seed, uint64_t request_id, uint32_t position, int64_t v) {
  Philox4 ctr{{uint32_t(v >> 2), position, uint32_t(request_id), uint32_t(request_id >> 32)}};
  return philox4x32_10(ctr, uint32_t(seed), uint32_t(seed >> 32)).v[v & 3];
}

float sampling_gumbel(uint64_t seed, uint64_t request_id, uint32_t position, int64_t v) {
  float u = philox_uniform(sampling_noise_word(seed, request_id, position, v));
  return -ls_logf(-ls_logf(u));
}

}  // namespace lockstep

namespace lockstep::contract {

namespace {

// What sample and sample_logits check past their logits' inputs: T valid params entries, the
// Philox counters, the [T] outputs.
void check_sample_rows(const char* op, Device dev, int64_t T, int64_t V,
                       std::span<const SamplingParams> params, const TensorView& request_ids,
                       const TensorView& positions, const TensorView& token_ids,
                       const TensorView& logp, const TensorView& lse, const TensorView& entropy,
                       const char* vocab_arg) {
  LS_CHECK(V >= 1 && V < kSampleMaxVocab, op, "argument '", vocab_arg,
           "': vocab size must be in [1, 2^21), got ", V);
  LS_CHECK(int64_t(params.size()) == T, op, "argument 'params': expected ", T,
           " entries (one per row), got ", params.size());
  for (int64_t t = 0; t < T; ++t) {
    try {
      params[size_t(t)].validate();
    } catch (const Error& e) {
      throw Error(detail::concat(op, ": argument 'params[", t, "]': ", e.what()));
    }
  }
  // The Philox counters may be host views (checked here) or views on `dev` (used as they are).
  check_tensor(op, "request_ids", request_ids, DType::kI64, {T}, host_or(dev, request_ids));
  check_tensor_dtypes(op, "positions", positions, {DType::kI32, DType::kI64}, {T},
                      host_or(dev, positions));
  for (int64_t t = 0; positions.device == Device::kCPU && t < T; ++t) {
    int64_t pos = index_at(positions, t);
    LS_CHECK(pos >= 0 && pos <= int64_t(UINT32_MAX), op, "argument 'positions': positions[", t,
             "] = ", pos, " is outside [0, 2^32)");
  }
  check_tensor_dtypes(op, "token_ids", token_ids, {DType::kI32, DType::kI64}, {T}, dev);
  check_tensor(op, "logp", logp, DType::kF32, {T}, dev);
  check_tensor(op, "lse", lse, DType::kF32, {T}, dev);
  check_tensor(op, "entropy", entropy, DType::kF32, {T}, dev);
}

}  // namespace

void check_sample(const char* op, Device dev, const TensorView& h, const TensorView& w,
                  std::span<const SamplingParams> params, const TensorView& request_ids,
                  const TensorView& positions, const ContractConfig& cfg,
                  const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
                  const TensorView& entropy) {
  cfg.validate();
  check_h_w(op, dev, h, w, cfg);
  check_sample_rows(op, dev, h.size(0), w.size(0), params, request_ids, positions, token_ids, logp,
                    lse, entropy, "w");
}

void check_lm_head_logits(const char* op, Device dev, const TensorView& h, const TensorView& w,
                          const ContractConfig& cfg, const TensorView& z) {
  cfg.validate();
  check_h_w(op, dev, h, w, cfg);
  check_view(op, "z", z, DType::kF32, {h.size(0), w.size(0)}, dev);
}

void check_sample_logits(const char* op, Device dev, const TensorView& z,
                         std::span<const SamplingParams> params, const TensorView& request_ids,
                         const TensorView& positions, const ContractConfig& cfg,
                         const TensorView& token_ids, const TensorView& logp, const TensorView& lse,
                         const TensorView& entropy) {
  cfg.validate();
  LS_CHECK(z.ndim == 2, op, "argument 'z' expected shape [T, V], got ", z.shape_string());
  check_view(op, "z", z, DType::kF32, {-1, -1}, dev);
  check_sample_rows(op, dev, z.size(0), z.size(1), params, request_ids, positions, token_ids, logp,
                    lse, entropy, "z");
}

}  // namespace lockstep::contract
